// `specdec serve`: the models loaded as the server needs them (tools/serve runs it).
#include "cli.hpp"
#include "serve/protocol.hpp"

namespace specdec::cli {

int run_serve(RunOptions& o, const serve::ServeOptions& so, bool max_tokens_given) {
  o.serve = true;
  check_flags(o, false);  // a bad flag is refused before the server binds its port
  // The server's defaults are held to what a request may ask for.
  if (o.gen.temperature > serve::kMaxTemperature)
    throw Error("--temperature must be in [0, 2] (OpenAI's range, which requests are held to)");
  if (max_tokens_given && o.gen.max_new_tokens >= so.ctx)
    throw Error("--max-new-tokens " + std::to_string(o.gen.max_new_tokens) +
                " leaves no room for a prompt in --ctx " + std::to_string(so.ctx) +
                " positions: it must be less than --ctx");
  return serve::run_serve(so, [&o, &so, max_tokens_given] {
    Loaded l = load(o, false);
    const int64_t positions = l.target->config().max_position_embeddings;
    if (!l.target->config().is_encoder_decoder && so.ctx > positions)  // (T5: no such limit)
      throw Error("--ctx " + std::to_string(so.ctx) + " is more than the model's " +
                  std::to_string(positions) + " positions (max_position_embeddings)");
    serve::ServeModels m;
    m.target = l.target;
    m.draft = l.draft;
    m.tokenizer = std::move(l.tokenizer);
    m.chat = l.chat;
    if (l.end_of_turn) m.chat_eos.push_back(*l.end_of_turn);
    m.defaults = o.gen;
    m.suffix = o.suffix;
    if (max_tokens_given) m.max_tokens = o.gen.max_new_tokens;
    std::string name = o.model;
    while (name.size() > 1 && name.back() == '/') name.pop_back();
    m.model_id = so.served_model_name.empty() ? name.substr(name.find_last_of('/') + 1)
                                              : so.served_model_name;
    return m;
  });
}

}  // namespace specdec::cli
