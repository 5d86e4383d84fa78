// `specdec serve`: an OpenAI-compatible HTTP server (cpp-httplib) on a RequestEngine.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "specdec/specdec.hpp"

namespace specdec::serve {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8080;
  int64_t max_batch = 8;
  int64_t ctx = 2048;
  int64_t max_queue = 64;
  int64_t prefix_cache = 8;
  int64_t prefill_chunk = 256;
  std::string served_model_name;  // the model's id; "" = the --model file or folder's name
  std::string api_key;            // also SPECDEC_API_KEY
  std::string cors;               // the origin allowed, "" = no CORS headers
  std::string log_format = "text";
  int64_t max_body = 1 << 20;
  double shutdown_timeout = 30;
  int64_t http_threads = 0;  // 0: max_batch + max_queue + kSpareHttpThreads (at most 1024)
  static constexpr int64_t kSpareHttpThreads = 16;  // for /health, /metrics and the like
  // The connection threads: one per running or waiting request, and spare ones.
  int64_t connection_threads() const;
  int64_t idle_timeout = 5;
};

// What the server runs, loaded while it already answers /health with 503.
struct ServeModels {
  std::shared_ptr<const Model> target, draft;
  std::unique_ptr<Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat;
  GenerationConfig defaults;  // the generation flags, EOS ids filled in
  SuffixOptions suffix;       // suffix speculation's, shared by every request
  std::vector<int64_t> chat_eos;
  std::optional<int64_t> max_tokens;  // --max-new-tokens when given
  std::string model_id;
};

void add_serve_options(CLI::App* app, ServeOptions& o);
// Serves until SIGINT or SIGTERM; 0 after a clean shutdown, 1 when loading or binding failed.
int run_serve(const ServeOptions& o, const std::function<ServeModels()>& load);

}  // namespace specdec::serve
