// `specdec serve`'s own flags (the generation flags are the CLI's, tools/generation_options.hpp).
#include <algorithm>

#include "cli_range.hpp"
#include "serve/server.hpp"

namespace specdec::serve {

void add_serve_options(CLI::App* app, ServeOptions& o) {
  app->add_option("--host", o.host, "Address to bind (127.0.0.1: this machine only)")
      ->capture_default_str();
  app->add_option("--port", o.port, "TCP port (0: any free one, printed at start)")
      ->check(cli::in_range(0, 65535))
      ->capture_default_str();
  app->add_option("--max-batch", o.max_batch,
                  "Requests generated at once (rows of the running batch)")
      ->check(cli::in_range(int64_t{1}, int64_t{256}))
      ->capture_default_str();
  app->add_option("--ctx", o.ctx,
                  "Positions per request (prompt and answer); each row's caches hold this many")
      ->check(cli::in_range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();
  app->add_option("--max-queue", o.max_queue,
                  "Requests waiting for a row at most (then 429 with Retry-After)")
      ->check(cli::in_range(int64_t{0}, int64_t{1} << 20))
      ->capture_default_str();
  app->add_option("--prefix-cache", o.prefix_cache,
                  "Finished requests whose caches are kept (LRU): a request that begins with one "
                  "(a chat's next turn, a shared system prompt) computes only the rest; 0: off")
      ->check(cli::in_range(int64_t{0}, int64_t{4096}))
      ->capture_default_str();
  app->add_option(
         "--prefill-chunk", o.prefill_chunk,
         "Prompt tokens the joining requests put in per step, together, while others decode")
      ->check(cli::in_range(int64_t{1}, int64_t{1} << 20))
      ->capture_default_str();
  app->add_option("--served-model-name,--alias", o.served_model_name,
                  "The model's id in /v1/models, which requests name (default: the --model file or "
                  "folder's name)")
      ->check(cli::non_empty());
  app->add_option("--api-key", o.api_key,
                  "Require 'Authorization: Bearer KEY' on the OpenAI routes (with or without /v1), "
                  "/tokenize and /detokenize (default: $SPECDEC_API_KEY)")
      ->check(cli::non_empty());  // (an unset variable in --api-key "$KEY" must not serve keyless)
  app->add_option("--cors", o.cors,
                  "Allow this origin (Access-Control-Allow-Origin); none by default");
  app->add_option("--log-format", o.log_format, "One line per request: text or json")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  app->add_option("--max-body", o.max_body, "Largest request body in bytes (413 past it)")
      ->check(cli::in_range(int64_t{64}, int64_t{1} << 30))
      ->capture_default_str();
  app->add_option(
         "--shutdown-timeout", o.shutdown_timeout,
         "Seconds running requests get to finish after SIGINT/SIGTERM (then they are cancelled)")
      ->check(cli::in_range(0.0, 3600.0))
      ->capture_default_str();
  app->add_option("--http-threads", o.http_threads,
                  "Connections served at once (a request holds one until its answer ends); 0: "
                  "--max-batch + --max-queue + 16, so that a request past the queue gets its 429 "
                  "and /health its answer")
      ->check(cli::in_range(int64_t{0}, int64_t{1024}))
      ->capture_default_str();
  app->add_option("--idle-timeout", o.idle_timeout,
                  "Seconds an idle keep-alive connection stays open")
      ->check(cli::in_range(int64_t{1}, int64_t{3600}))
      ->capture_default_str();
}

int64_t ServeOptions::connection_threads() const {
  return http_threads > 0 ? http_threads
                          : std::min<int64_t>(max_batch + max_queue + kSpareHttpThreads, 1024);
}

}  // namespace specdec::serve
