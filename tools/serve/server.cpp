#include "serve/server.hpp"

#include <httplib.h>
#include <signal.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <thread>
#include <vector>

#include "chat_html.hpp"
#include "cli/interrupt.hpp"
#include "serve/connection.hpp"
#include "serve/metrics.hpp"
#include "serve/protocol.hpp"
#include "serve/request_log.hpp"
#include "serve/responses.hpp"
#include "util.hpp"

namespace specdec::serve {

namespace {

using json = ojson;

using Clock = std::chrono::steady_clock;
double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// One request's output on its way from the engine's thread to its HTTP thread.
struct Job {
  std::mutex mutex;
  std::condition_variable ready;
  std::string text;                        // produced and not yet taken
  std::vector<json> logprobs;              // chat-style entries not yet taken
  bool finished = false, stopped = false;  // stopped: by a stop string
  int64_t tokens = 0;                      // generated so far
  size_t shown = 0;  // characters of them the client sees (engine's thread only)
  GenerationResult result;
  Clock::time_point arrived = Clock::now(), last;
  bool first = true;
};

thread_local LogFields t_log;

class Server {
 public:
  explicit Server(const ServeOptions& o) : o_(o) {
    if (o_.api_key.empty())
      if (const char* env = std::getenv("SPECDEC_API_KEY")) {
        if (*env == '\0')
          throw Error("SPECDEC_API_KEY is set but empty (unset it to serve without a key)");
        o_.api_key = env;
      }
  }

  int run(const std::function<ServeModels()>& load) {
    if (o_.connection_threads() <= o_.max_batch + o_.max_queue)
      note("warning: " + std::to_string(o_.connection_threads()) +
           " connection threads (--http-threads) for " + std::to_string(o_.max_batch) +
           " rows and a queue of " + std::to_string(o_.max_queue) +
           ": requests past them wait for a thread instead of getting 429");
    cli::StopSignals signals;    // the first drains, the second cancels (the waiter thread below)
    ::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal

    routes();
    // httplib's default also sets SO_REUSEPORT, with which a second server on a port in use would
    // start and take half of its connections: SO_REUSEADDR only, so that it fails to bind instead.
    socket_t listening = -1;  // the socket bound last (the one that listens)
    http_.set_socket_options([&listening](socket_t sock) {
      int yes = 1;
      ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
      listening = sock;
    });
    errno = 0;
    const int port = o_.port == 0 ? http_.bind_to_any_port(o_.host)
                                  : (http_.bind_to_port(o_.host, o_.port) ? o_.port : -1);
    if (port < 0) {
      const int err = errno;  // bind()'s, when it was the call that failed
      const std::string why =
          err == EADDRINUSE ? ": the port is in use (another server? --port 0 picks a free one)"
          : err == EACCES   ? ": permission denied (ports below 1024 need privileges)"
          : err == EADDRNOTAVAIL ? ": no interface of this machine has that address"
          : err != 0             ? std::string(": ") + std::strerror(err)
                                 : " (is --host an address of this machine?)";
      note("error: cannot listen on " + o_.host + ":" + std::to_string(o_.port) + why);
      return 1;
    }
    // httplib (Debian's build) listens with a backlog of 5: clients that connect at once while
    // the engine keeps both cores busy overflowed it, and each dropped connection waited a second
    // for TCP to try again. Listening again on a listening socket sets its backlog.
    ::listen(listening, SOMAXCONN);
    std::thread listener([&] {
      // The connection threads, which cpp-httplib starts on this thread, inherit a mask that
      // keeps SIGINT and SIGTERM off them: no call of theirs is interrupted by one (EINTR).
      sigset_t stop;
      sigemptyset(&stop);
      sigaddset(&stop, SIGINT);
      sigaddset(&stop, SIGTERM);
      pthread_sigmask(SIG_BLOCK, &stop, nullptr);
      http_.listen_after_bind();
    });
    const bool v6 = o_.host.find(':') != std::string::npos;  // a URL brackets an IPv6 address
    note("listening on http://" + (v6 ? "[" + o_.host + "]" : o_.host) + ":" +
         std::to_string(port) + " (loading the model)");
    std::thread waiter([&] {
      if (signals.wait() == 0) return;
      if (!ready_) std::_Exit(0);  // nothing is running yet
      {
        std::lock_guard<std::mutex> lock(shutdown_mutex_);
        shutdown_requested_ = true;
        shutdown_.notify_all();
      }
      // A second signal: the running requests are cancelled now, not at the deadline.
      if (signals.wait() == 0) return;
      note("second signal: cancelling the running requests");
      hurry_ = true;
    });
    try {
      models_ = load();
      start_engine();
    } catch (const std::exception& e) {
      note(std::string("error: ") + e.what());
      // Not http_.stop(): before the listener thread is in its accept loop it does nothing, and
      // joining the listener then waited forever. The HTTP and signal threads end with the process.
      std::_Exit(1);
    }
    ready_ = true;
    note("ready: " + models_.model_id + (models_.draft ? " with a draft" : "") +
         (models_.defaults.prompt_lookup_num_tokens > 0 ? ", prompt lookup" : "") +
         (models_.defaults.suffix_speculation ? ", suffix speculation" : "") + ", " +
         count_of(o_.max_batch, "row") + " of " + std::to_string(o_.ctx) + " positions");
    std::thread stopper([&] {
      {
        std::unique_lock<std::mutex> lock(shutdown_mutex_);
        shutdown_.wait(lock, [&] { return shutdown_requested_.load(); });
      }
      drain();  // new requests get 503 from here on
      // The responses still being written go out before the listener stops (cpp-httplib ends a
      // stream mid-response once stopped); a connection idle in keep-alive does not hold the
      // exit up (its thread would wait out --idle-timeout).
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (in_flight_ > 0 && Clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      http_.stop();
      engine_->stop();
    });
    // Every model call on this thread, the one that loaded the models: libgomp keeps a team of
    // OpenMP threads per thread that starts parallel regions, and a second team beside the
    // loader's left every pass waiting for sleeping workers (a batch of 8 took twice as long).
    engine_->run();
    stopper.join();
    waiter.detach();  // (waiting for a second signal that need not come)
    note("stopped");
    std::_Exit(0);  // the HTTP threads still waiting on idle connections end with the process
  }

 private:
  // The path pattern and method of each route (other methods get 405), and whether the API key
  // guards it.
  struct Route {
    std::regex path;
    std::string method;
    bool keyed;  // behind --api-key
  };

  void start_engine() {
    generator_ = std::make_unique<Generator>(models_.target, models_.draft);
    generator_->set_suffix_options(models_.suffix);
    RequestEngine::Options eo;
    eo.max_rows = o_.max_batch;
    eo.context = o_.ctx;
    eo.max_queue = o_.max_queue;
    eo.prefix_cache = o_.prefix_cache;
    eo.prefill_chunk = o_.prefill_chunk;
    engine_ = std::make_unique<RequestEngine>(*generator_, eo);
    ctx_.tokenizer = models_.tokenizer.get();
    ctx_.chat = models_.chat ? &*models_.chat : nullptr;
    ctx_.model_id = models_.model_id;
    ctx_.context = o_.ctx;
    ctx_.vocab_size = models_.target->config().vocab_size;
    ctx_.has_draft = models_.draft != nullptr;
    ctx_.defaults = models_.defaults;
    ctx_.chat_eos = models_.chat_eos;
    ctx_.max_tokens = models_.max_tokens;
    // One short request first, so that the first client does not pay for lazy initialisation.
    Request warm;
    warm.prompt = {0};
    warm.config = models_.defaults;
    warm.config.max_new_tokens = 1;
    warm.config.do_sample = false;
    engine_->submit(std::move(warm));
    while (engine_->step()) {
    }
  }

  // A line of the server's own (not a request's) in the log.
  void note(const std::string& text) const {
    write_log(server_log_line(o_.log_format, "specdec serve: " + text));
  }

  // Running requests finish up to the deadline, then the rest are cancelled.
  void drain() {
    draining_ = true;
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", o_.shutdown_timeout);
    note(std::string("shutting down (running requests get ") + seconds + " s)");
    const auto deadline = Clock::now() + std::chrono::duration<double>(o_.shutdown_timeout);
    while (Clock::now() < deadline && !hurry_) {
      const RequestEngine::Load l = engine_->load();
      if (l.waiting == 0 && l.running == 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    // Cancelled outside ids_mutex_: cancel() may run a queued request's on_finished, which takes
    // its job's mutex (the handlers take ids_mutex_ holding no job's mutex).
    std::vector<RequestEngine::Id> running;
    {
      std::lock_guard<std::mutex> lock(ids_mutex_);
      running.assign(ids_.begin(), ids_.end());
    }
    for (const RequestEngine::Id id : running) engine_->cancel(id);
  }

  void send_json(httplib::Response& res, int status, const json& body) {
    res.status = status;
    res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
  }

  void send_error(httplib::Response& res, const ApiError& e) {
    if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
    const json body = error_json(e.status, e.message, e.param, e.code);
    note_error(body);
    send_json(res, e.status, body);
  }
  // The log line says why a request failed (never the message, which may quote the request).
  static void note_error(const json& body) {
    const json& e = body["error"];
    serve::note_error(t_log, e[e["code"].is_string() ? "code" : "type"].get<std::string>(),
                      e["param"].is_string() ? e["param"].get<std::string>() : "");
  }

  // Runs a handler, answering its errors in OpenAI's shape.
  template <class F>
  void guarded(httplib::Response& res, bool generation, F&& f) {
    try {
      try {
        f();
      } catch (const QueueFull& e) {
        throw ApiError(429, e.what(), "", "queue_full");
      } catch (const ApiError&) {
        throw;
      } catch (const Error& e) {
        throw ApiError(400, e.what(), "", "invalid_value");
      } catch (const std::exception& e) {
        throw ApiError(500, e.what());
      }
    } catch (const ApiError& e) {
      // (A request that went into the engine was counted when it finished.)
      if (generation && t_log.prompt_tokens < 0) metrics_.refused(e.status);
      send_error(res, e);
    }
  }

  // Whether the request carries the API key, where one is set.
  bool authorized(const httplib::Request& req) const {
    if (o_.api_key.empty()) return true;
    const std::string auth = req.get_header_value("Authorization");
    // The scheme is case-insensitive (RFC 7235): "Bearer", "bearer", ...
    const bool bearer =
        auth.size() > 7 && auth[6] == ' ' && strncasecmp(auth.c_str(), "bearer", 6) == 0;
    return bearer && same_secret(auth.substr(7), o_.api_key);
  }
  void refuse_unauthorized(httplib::Response& res) {
    res.set_header("WWW-Authenticate", "Bearer");  // the scheme to use (RFC 6750)
    send_error(res, ApiError(401, "a valid API key is required (Authorization: Bearer KEY)", "",
                             "invalid_api_key"));
  }

  // An API route: the key checked (after the body is read, so that a refused request leaves no
  // bytes on a kept-alive connection), refused while loading or shutting down, errors answered
  // in OpenAI's shape (counted as refused requests for the generation routes).
  template <class F>
  void api_route(bool post, const char* path, bool generation, F f) {
    const auto handler = [this, generation, f](const httplib::Request& req,
                                               httplib::Response& res) {
      if (!authorized(req)) return refuse_unauthorized(res);
      if (!ready_ || draining_) {
        send_error(
            res, ApiError(503, draining_ ? "the server is shutting down" : "the model is loading"));
        // A client (or proxy) keeping the connection would send its next request here again.
        if (draining_) res.set_header("Connection", "close");
        return;
      }
      guarded(res, generation, [&] { f(req, res); });
    };
    if (post)
      http_.Post(path, handler);
    else
      http_.Get(path, handler);
    methods_.push_back({std::regex(path), post ? "POST" : "GET", true});
  }

  // A refusal of a request whose body is left unread: the connection ends after the answer (log()
  // ends every connection whose answer says Connection: close).
  void refuse_unread(httplib::Response& res, const ApiError& e) {
    send_error(res, e);
    if (e.status == 415) res.set_header("Accept-Encoding", "identity");  // (RFC 9110 15.5.16)
    res.set_header("Connection", "close");
  }

  // A request's start, before any handler answers it: its log line's clock, and in flight until
  // that line is written.
  void begin_request(httplib::Response& res) {
    t_log = {Clock::now(), -1, -1, false, true};
    ++in_flight_;
    if (!o_.cors.empty()) res.set_header("Access-Control-Allow-Origin", o_.cors);
  }

  // The route of a path, whatever its method; null where none.
  const Route* route_of(const std::string& path) const {
    for (const Route& r : methods_)
      if (std::regex_match(path, r.path)) return &r;
    return nullptr;
  }

  void get(const char* path, httplib::Server::Handler handler) {
    http_.Get(path, std::move(handler));
    methods_.push_back({std::regex(path), "GET", false});
  }

  void routes() {
    http_.new_task_queue = [n = o_.connection_threads()] {
      return new httplib::ThreadPool(static_cast<size_t>(n));
    };
    http_.set_payload_max_length(static_cast<size_t>(o_.max_body));
    http_.set_tcp_nodelay(true);  // each streamed event goes out at once (no Nagle wait for an ACK)
    http_.set_keep_alive_timeout(o_.idle_timeout);
    http_.set_keep_alive_max_count(1000);  // (cpp-httplib's default closes after 5 requests)
    http_.set_read_timeout(o_.idle_timeout);
    http_.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
      begin_request(res);
      // Range is ignored (RFC 9110 14.2 allows it): cpp-httplib would answer every range asked
      // for, "bytes=0-,0-,..." a copy each (a 8 KB request drew 23 MB), also of a 200 answer. The
      // request is cpp-httplib's own non-const object, handed over as const.
      const_cast<httplib::Request&>(req).ranges.clear();
      if (const std::optional<ApiError> refusal = framing_refusal(req)) {
        refuse_unread(res, *refusal);
        return httplib::Server::HandlerResponse::Handled;
      }
      return httplib::Server::HandlerResponse::Unhandled;
    });
    // A body announced with "Expect: 100-continue" that would be refused (framing_refusal, or
    // over --max-body) is refused before the client sends it: cpp-httplib's default answer, 100,
    // has it upload the body for nothing.
    http_.set_expect_100_continue_handler([this](const httplib::Request& req,
                                                 httplib::Response& res) {
      std::optional<ApiError> refusal = framing_refusal(req);
      if (!refusal && std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) >
                          static_cast<unsigned long long>(o_.max_body))
        refusal = ApiError(413, status_text(413), "", "body_too_large");
      if (!refusal) return 100;
      begin_request(res);  // (not routed; logged once the answer is out)
      refuse_unread(res, *refusal);
      return refusal->status;
    });
    // cpp-httplib adds its Keep-Alive header to a connection it keeps, also where the answer
    // ends the connection (see log()): a response says one thing.
    http_.set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
      if (res.get_header_value("Connection") != "close") return;
      res.headers.erase("Keep-Alive");
      res.headers.erase("Connection");  // (once: a request's own Connection: close added one)
      res.set_header("Connection", "close");
    });
    http_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      const Route* route = route_of(req.path);
      // Under /v1, and on a path the key guards, the key comes first, as it does on the routes:
      // without it, a client learns nothing of which paths exist.
      if ((res.status == 404 || res.status == 405) &&
          (req.path.rfind("/v1/", 0) == 0 || (route && route->keyed)) && !authorized(req))
        return refuse_unauthorized(res);
      std::string message = status_text(res.status);
      if (res.status == 404 && route) {
        res.status = 405;  // a route of another method
        res.set_header("Allow", route->method);
        message = req.path + " takes " + route->method + ", not " + req.method;
      } else if (res.status == 404) {
        message = "no route " + req.method + " " + req.path;
      } else if (res.status == 400 && t_log.counted && !req.is_multipart_form_data() &&
                 req.body.size() <
                     std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10)) {
        // The headers were read (the request was routed: counted) but not the whole body: the
        // connection ended or went idle first. (A multipart body goes to req.files, not req.body.)
        message = "the body ended before its Content-Length (" +
                  req.get_header_value("Content-Length") + " bytes) arrived";
      } else if (res.status == 413 &&
                 req.get_header_value("Content-Type")
                         .rfind("application/x-www-form-urlencoded", 0) == 0 &&
                 std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) <=
                     static_cast<unsigned long long>(o_.max_body)) {
        // cpp-httplib parses a form body, and refuses one over 8 KiB, before any route runs.
        message =
            "a body sent as application/x-www-form-urlencoded (curl -d without -H "
            "'Content-Type: application/json') is limited to 8192 bytes: send it as "
            "application/json";
      }
      // (An unknown route's code is null, as OpenAI's is.)
      const char* code = res.status == 405   ? "method_not_allowed"
                         : res.status == 413 ? "body_too_large"
                                             : "";
      const json body = error_json(res.status, message, "", code);
      note_error(body);
      res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace),
                      "application/json");
      // Every refusal of cpp-httplib's but an unknown route's (a bad request line, URI or Range,
      // headers over the limit, a body too large or that stalled) may leave the body, or part of
      // it, unread: the connection ends, or those bytes would be read as the next request.
      if (res.status != 404 && res.status != 405) res.set_header("Connection", "close");
    });
    http_.set_logger(
        [this](const httplib::Request& req, const httplib::Response& res) { log(req, res); });
    http_.Options(".*", [this](const httplib::Request& req, httplib::Response& res) {
      res.status = 204;
      // The methods of the path (RFC 9110 9.3.7), as a 405 names them.
      const Route* route = route_of(req.path);
      res.set_header("Allow", route ? route->method + ", OPTIONS" : "OPTIONS");
      if (!o_.cors.empty()) {
        res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
        // The headers the page asked for (OpenAI's JavaScript client sends X-Stainless-* ones);
        // a "*" would not cover Authorization.
        res.set_header("Access-Control-Allow-Headers",
                       allowed_headers(req.get_header_value("Access-Control-Request-Headers")));
        res.set_header("Access-Control-Max-Age", "600");
      }
    });
    get("/", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(kChatHtml, "text/html; charset=utf-8");
    });
    get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (draining_)
        send_json(res, 503, {{"status", "shutting down"}});
      else if (ready_)
        send_json(res, 200, {{"status", "ok"}});
      else
        send_json(res, 503, {{"status", "loading"}});
    });
    get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      const RequestEngine::Load l = ready_ ? engine_->load() : RequestEngine::Load{};
      res.set_content(metrics_.render(l.waiting, l.running), "text/plain; version=0.0.4");
    });
    const auto model = [this] {
      return json{{"id", ctx_.model_id},
                  {"object", "model"},
                  {"created", started_},
                  {"owned_by", "specdec"},
                  {"max_model_len", o_.ctx}};
    };
    api_route(false, "/(?:v1/)?models", false,
              [this, model](const httplib::Request&, httplib::Response& res) {
                send_json(res, 200, {{"object", "list"}, {"data", json::array({model()})}});
              });
    api_route(false, "/(?:v1/)?models/(.+)", false,
              [this, model](const httplib::Request& req, httplib::Response& res) {
                if (req.matches[1] != ctx_.model_id)
                  throw ApiError(404,
                                 "the model '" + req.matches[1].str() +
                                     "' does not exist (this server has '" + ctx_.model_id + "')",
                                 "model", "model_not_found");
                send_json(res, 200, model());
              });
    api_route(
        true, "/tokenize", false, [this](const httplib::Request& req, httplib::Response& res) {
          const TokenizeRequest t = parse_tokenize(parse_body(req.body), ctx_);
          json tokens = t.ids;
          if (t.with_pieces) {  // llama-server's: a piece that is no whole UTF-8 text as bytes
            tokens = json::array();
            for (const int64_t id : t.ids) {
              const std::string b = ctx_.tokenizer->token_bytes(id);
              tokens.push_back({{"id", id}, {"piece", valid_utf8(b) ? json(b) : bytes_of(b)}});
            }
          }
          send_json(res, 200,
                    {{"tokens", tokens}, {"count", t.ids.size()}, {"max_model_len", o_.ctx}});
        });
    api_route(true, "/detokenize", false,
              [this](const httplib::Request& req, httplib::Response& res) {
                const std::vector<int64_t> ids = parse_detokenize(parse_body(req.body), ctx_);
                send_json(res, 200, {{"content", ctx_.tokenizer->decode(ids, false)}});
              });
    api_route(
        true, "/(?:v1/)?completions", true,
        [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, false); });
    api_route(
        true, "/(?:v1/)?chat/completions", true,
        [this](const httplib::Request& req, httplib::Response& res) { generate(req, res, true); });
  }

  void log(const httplib::Request& req, const httplib::Response& res) {
    struct Done {
      std::atomic<int>& n;
      bool counted;
      ~Done() {
        if (counted) --n;
      }
    } done{in_flight_, t_log.counted};
    // (A request cpp-httplib refused before the pre-routing handler, which then ends its
    // connection itself: nothing of the thread's last request is its.)
    if (!done.counted) t_log = {Clock::now(), -1, -1, false, false};
    t_log.counted = false;
    // The response is written: a connection whose answer says it ends (a request body left
    // unread, a drain, an HTTP/1.0 stream) ends here, whatever cpp-httplib would do next (the
    // socket stays its to close; its next read sees the end).
    if (res.get_header_value("Connection") == "close")
      if (const int sock =
              connection_socket(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
          sock >= 0)
        end_connection(sock);
    const double ms = seconds_between(t_log.start, Clock::now()) * 1000;
    write_log(request_log_line(o_.log_format, req.method, req.path.empty() ? "-" : req.path,
                               res.status, ms, t_log));
  }

  void generate(const httplib::Request& req, httplib::Response& res, bool chat) {
    const ParsedRequest p = parse_request(parse_body(req.body), chat, ctx_);
    auto job = std::make_shared<Job>();
    job->arrived = t_log.start;  // time to first token counts from the request's arrival
    auto text = std::make_shared<TextStream>(*ctx_.tokenizer, p);
    Request r;
    r.prompt = p.prompt;
    r.config = p.config;
    r.top_logprobs = p.top_logprobs;
    const Tokenizer* tok = ctx_.tokenizer;
    // On the engine's thread: decode, hold back stop strings, hand over, never wait.
    r.on_tokens = [this, job, text, tok, legacy = !chat](const std::vector<int64_t>& ids,
                                                         const std::vector<TokenLogprob>& lps) {
      size_t taken = 0;  // the tokens after a stop string's end are not the answer's
      const std::string piece = text->push(ids, &taken);
      std::vector<json> entries;
      for (const TokenLogprob& t : lps) {
        if (entries.size() == taken) break;
        json entry = logprob_entry(*tok, t);
        if (legacy) {  // the characters shown before it (none for a token whose text is hidden)
          entry["text_offset"] = job->shown;
          if (text->shows(t.token)) job->shown += characters(entry["bytes"]);
        }
        entries.push_back(std::move(entry));
      }
      const auto now = Clock::now();
      {
        std::lock_guard<std::mutex> lock(job->mutex);
        if (job->first)
          metrics_.first_token(seconds_between(job->arrived, now));
        else
          for (size_t i = 0; i < taken; ++i)
            metrics_.inter_token(seconds_between(job->last, now) / static_cast<double>(taken));
        job->first = false;
        job->last = now;
        job->tokens += static_cast<int64_t>(taken);
        job->text += piece;
        for (json& e : entries) job->logprobs.push_back(std::move(e));
        job->stopped = text->stopped();
      }
      job->ready.notify_all();
      if (text->stopped()) throw Cancelled(taken);  // the answer ends where the stop string did
    };
    r.on_finished = [this, job, text](const GenerationResult& g) {
      std::string tail;
      GenerationResult result = g;
      try {
        tail = text->finish();
        // Counted before the client can see its answer (a scrape after it counts it).
        const std::string& why = g.stats.stop_reason;
        metrics_.finished(why == "error"                           ? "error"
                          : why == "cancelled" && !text->stopped() ? "cancelled"
                                                                   : "ok",
                          result.stats);
      } catch (const std::exception& e) {  // the handler waits for `finished` whatever happens
        result.stats.stop_reason = "error";
        result.error = e.what();
      }
      {
        std::lock_guard<std::mutex> lock(job->mutex);
        job->text += tail;
        job->stopped = text->stopped();  // (a stop string can end in the last token's text)
        job->result = std::move(result);
        job->finished = true;
      }
      job->ready.notify_all();
    };
    const RequestEngine::Id id = engine_->submit(std::move(r));
    {
      std::lock_guard<std::mutex> lock(ids_mutex_);
      ids_.insert(id);
    }
    t_log.prompt_tokens = static_cast<int64_t>(p.prompt.size());
    t_log.ignored = p.ignored;
    t_log.completion_tokens = 0;
    const std::string rid = (chat ? "chatcmpl-" : "cmpl-") + random_id();
    const auto created = static_cast<int64_t>(std::time(nullptr));
    json head = {{"id", rid},
                 {"object", chat ? (p.stream ? "chat.completion.chunk" : "chat.completion")
                                 : "text_completion"},
                 {"created", created},
                 {"model", ctx_.model_id},
                 {"system_fingerprint", nullptr}};  // (OpenAI's: its backend's configuration)
    const auto forget = [this, id] {
      std::lock_guard<std::mutex> lock(ids_mutex_);
      ids_.erase(id);
    };
    // A client that leaves before its answer's end cancels it (its row is freed at the next step):
    // seen when a write fails, and while nothing is written (waiting for a row, or for a
    // non-streamed answer) by looking at its socket.
    const int sock =
        connection_socket(req.remote_addr, req.remote_port, req.local_addr, req.local_port);
    if (!p.stream) {
      std::unique_lock<std::mutex> lock(job->mutex);
      while (
          !job->ready.wait_for(lock, std::chrono::milliseconds(100), [&] { return job->finished; }))
        if (!t_log.cancelled && client_left(sock)) {
          t_log.cancelled = true;
          lock.unlock();
          engine_->cancel(id);
          lock.lock();
        }
      lock.unlock();  // finished: the job no longer changes
      forget();
      const GenerationStats& s = job->result.stats;
      t_log.completion_tokens = s.new_tokens;
      if (s.stop_reason == "error") throw ApiError(500, "generation failed: " + job->result.error);
      const std::string finish = finish_reason(job->stopped, s.stop_reason);
      t_log.aborted = finish == "abort" && !t_log.cancelled;
      json out = head;
      out["choices"] = json::array(
          {choice(chat, job->text, p.logprobs ? &job->logprobs : nullptr, false, finish)});
      out["usage"] = usage(s);
      out["speculative"] = speculative(s);
      send_json(res, 200, out);
      return;
    }
    // Server-sent events: a chunk per group of verified tokens, the finish reason, the usage
    // (stream_options.include_usage), then [DONE].
    struct StreamState {
      bool sent_role = false;
    };
    auto st = std::make_shared<StreamState>();
    const bool logprobs = p.logprobs, include_usage = p.include_usage;
    if (include_usage) head["usage"] = nullptr;  // in every chunk but the last, as OpenAI's
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");  // nginx passes each event on at once
    const httplib::ContentProviderWithoutLength events = [this, job, st, head, chat, logprobs,
                                                          include_usage, id,
                                                          sock](size_t, httplib::DataSink& sink) {
      const auto leave = [&] {
        engine_->cancel(id);
        std::lock_guard<std::mutex> lock(job->mutex);
        t_log.completion_tokens = job->tokens;
        t_log.cancelled = true;
        return false;
      };
      const auto event = [&](const json& j) {
        const std::string line =
            "data: " + j.dump(-1, ' ', false, json::error_handler_t::replace) + "\n\n";
        return sink.write(line.data(), line.size());
      };
      if (chat && !st->sent_role) {
        json c = head;
        c["choices"] = json::array({{{"index", 0},
                                     {"delta", {{"role", "assistant"}, {"content", ""}}},
                                     {"logprobs", nullptr},
                                     {"finish_reason", nullptr}}});
        st->sent_role = true;
        if (!event(c)) return leave();
      }
      std::string piece;
      std::vector<json> entries;
      bool finished = false;
      {
        std::unique_lock<std::mutex> lock(job->mutex);
        job->ready.wait_for(lock, std::chrono::milliseconds(250), [&] {
          return !job->text.empty() || !job->logprobs.empty() || job->finished;
        });
        piece.swap(job->text);
        entries.swap(job->logprobs);
        finished = job->finished;
      }
      if (!piece.empty() || !entries.empty()) {
        json c = head;
        c["choices"] =
            json::array({choice(chat, piece, logprobs ? &entries : nullptr, true, nullptr)});
        if (!event(c)) return leave();
      }
      if (!finished) return !client_left(sock) || leave();
      const GenerationStats& s = job->result.stats;
      t_log.completion_tokens = s.new_tokens;
      if (s.stop_reason == "error") {
        const json failure = error_json(500, "generation failed: " + job->result.error);
        note_error(failure);
        event(failure);
      } else {
        const std::string finish = finish_reason(job->stopped, s.stop_reason);
        t_log.aborted = finish == "abort";
        json c = head;
        c["choices"] = json::array({choice(chat, "", nullptr, true, finish)});
        if (chat) c["choices"][0]["delta"] = json::object();
        event(c);
        if (include_usage) {
          json u = head;
          u["choices"] = json::array();
          u["usage"] = usage(s);
          u["speculative"] = speculative(s);
          event(u);
        }
      }
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      sink.done();
      return true;
    };
    const httplib::ContentProviderResourceReleaser released = [this, id, forget](bool) {
      engine_->cancel(id);  // a client that left: its row is freed at the next step
      forget();
    };
    // HTTP/1.0 has no chunked framing (RFC 9112 6.1): its stream ends where the connection does,
    // also where the client asked to keep it (log() ends it).
    if (req.version == "HTTP/1.0") {
      res.set_content_provider("text/event-stream", events, released);
      res.set_header("Connection", "close");
    } else {
      res.set_chunked_content_provider("text/event-stream", events, released);
    }
  }

  ServeOptions o_;
  httplib::Server http_;
  ServeModels models_;
  Context ctx_;
  std::unique_ptr<Generator> generator_;
  std::unique_ptr<RequestEngine> engine_;
  Metrics metrics_;
  std::atomic<bool> ready_{false}, draining_{false}, shutdown_requested_{false}, hurry_{false};
  std::atomic<int> in_flight_{0};  // requests whose response is not written yet
  std::mutex shutdown_mutex_;
  std::condition_variable shutdown_;
  std::mutex ids_mutex_;
  std::set<RequestEngine::Id> ids_;  // requests not answered yet (cancelled at the deadline)
  std::vector<Route> methods_;       // every route, as http_ has it
  const int64_t started_ = static_cast<int64_t>(std::time(nullptr));
};

}  // namespace

int run_serve(const ServeOptions& o, const std::function<ServeModels()>& load) {
  Server server(o);
  return server.run(load);
}

}  // namespace specdec::serve
