// `specdec chat`: an interactive conversation, streamed.
#include <unistd.h>

#include <cctype>
#include <iostream>
#include <optional>

#include "cli.hpp"
#include "interrupt.hpp"

namespace specdec::cli {

// One user turn from stdin: a line, or several where each but the last ends with a backslash
// (dropped; the line end is kept). False at the end of input with nothing read.
static bool read_turn(std::string& turn, bool tty) {
  turn.clear();
  std::string line;
  bool any = false;
  while (std::getline(std::cin, line)) {
    any = true;
    // A terminal in line mode passes at most 4095 bytes of a typed line and drops the rest.
    if (tty && line.size() == 4095)
      std::cerr << "(a terminal passes at most 4095 bytes of a typed line: the rest of it was "
                   "dropped; end lines with \\ to go on to the next, or pipe a long message in)\n";
    // Ctrl-D after some text sends it without a line end: the answer starts on a line of its own.
    if (tty && std::cin.eof()) std::cerr << "\n";
    if (!line.empty() && line.back() == '\r') line.pop_back();  // a Windows line end
    const bool more = !line.empty() && line.back() == '\\';
    if (more) line.back() = '\n';
    turn += line;
    if (!more) return true;
    if (tty) std::cerr << ". " << std::flush;
  }
  if (!turn.empty() && turn.back() == '\n') turn.pop_back();  // input ended after a backslash
  return any;
}

// Interactive conversation: a turn of stdin per user message, the answer streamed as it is
// verified. Each turn re-encodes the whole conversation; the prompt cache keeps the keys and values
// of the conversation so far, so a turn computes only what follows the previous turn's tokens.
int run_chat(RunOptions& o) {
  Loaded l = load(o, true);
  Generator gen(l.target, l.draft);
  gen.set_suffix_options(o.suffix);
  PromptCache cache;
  std::vector<ChatMessage> messages;
  const auto reset = [&] {
    cache.clear();
    messages.clear();
    if (o.system_given) messages.push_back({"system", o.system});
  };
  reset();
  const bool tty = isatty(STDIN_FILENO);
  // Ctrl-C while an answer streams stops that answer, and the conversation goes on; at the prompt
  // it ends the program.
  StopAnswerOnInterrupt interrupt;
  std::cerr << "specdec chat (" << l.chat->name() << (l.draft ? ", with a draft" : "")
            << (o.gen.prompt_lookup_num_tokens > 0 ? ", prompt lookup" : "")
            << (o.gen.suffix_speculation ? ", suffix speculation" : "")
            << "): type a message (end a line with \\ to go on to the next); /reset starts over, "
               "/stats shows the last answer's statistics, /exit or Ctrl-D ends; Ctrl-C stops an "
               "answer\n";
  std::optional<GenerationStats> last;
  int64_t total_tokens = 0;
  double total_seconds = 0;
  std::string line;
  while (true) {
    if (tty) std::cerr << "> " << std::flush;
    if (!read_turn(line, tty)) {
      if (tty) std::cerr << "\n";  // Ctrl-D: the shell's prompt starts on a line of its own
      break;
    }
    const size_t first = line.find_first_not_of(" \t\r\n");
    if (first == std::string::npos) continue;
    // A command as typed (spaces around it dropped), and in lower case ("/Exit ").
    const bool escaped = line.compare(first, 2, "//") == 0;
    const std::string typed = line[first] == '/' && !escaped
                                  ? line.substr(first, line.find_last_not_of(" \t\r\n") + 1 - first)
                                  : "";
    std::string command = typed;
    for (char& ch : command) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    if (command == "/exit" || command == "/quit") break;
    if (command == "/reset") {
      reset();
      std::cerr << "(conversation reset)\n";
      continue;
    }
    if (command == "/stats") {
      if (last)
        print_stats(*last, std::cerr);
      else
        std::cerr << "(no answer yet)\n";
      char session[96];
      std::snprintf(session, sizeof session, "session: %lld tokens in %.3f s (%.2f tok/s)\n",
                    static_cast<long long>(total_tokens), total_seconds,
                    total_seconds > 0 ? total_tokens / total_seconds : 0.0);
      std::cerr << session;
      continue;
    }
    if (escaped) {
      line.erase(first, 1);  // "//" sends a message that begins with "/"
    } else if (!command.empty()) {
      std::cerr << "unknown command " << typed
                << " (commands: /reset, /stats, /exit; begin with // to send a message that "
                   "begins with /)\n";
      continue;
    }
    messages.push_back({"user", line});
    StreamDecoder stream(*l.tokenizer, true);
    GenerationResult r;
    try {
      require_utf8_in(line, "your message");
      const std::vector<int64_t> prompt = encode_chat(l, messages);
      // --max-new-tokens is a cap per answer; a long conversation leaves less room in the context.
      GenerationConfig turn = o.gen;
      int64_t room = l.target->config().max_position_embeddings;
      if (l.draft) room = std::min(room, l.draft->config().max_position_embeddings);
      room -= static_cast<int64_t>(prompt.size());
      if (room < 1) throw Error("the conversation fills the model's context");
      turn.max_new_tokens = std::min(turn.max_new_tokens, room);
      interrupt.answering(true);
      // (the conversation's earlier turns come from the cache: the count would overstate it)
      PrefillNotice notice(0);
      r = gen.generate(prompt, turn, cache, [&](const std::vector<int64_t>& t) {
        notice.update(t);
        // Ctrl-C before these tokens (while the prompt went in): none of them is shown or kept.
        if (interrupt.stop()) throw Cancelled(0);
        if (!o.no_stream) std::cout << stream.push(t) << std::flush;
        if (interrupt.stop()) throw Cancelled();  // (the tokens shown so far are the answer)
      });
      interrupt.answering(false);
    } catch (const Error& e) {
      // E.g. the conversation outgrew the context: this turn is dropped.
      interrupt.answering(false);
      messages.pop_back();
      std::cerr << "specdec: error: " << e.what()
                << " (the conversation goes on without this turn; /reset starts over)\n";
      continue;
    }
    if (r.stats.stop_reason == "cancelled" && r.tokens.empty()) {
      messages.pop_back();
      std::cerr << "(stopped before the answer began: the conversation goes on without this "
                   "turn)\n";
      continue;
    }
    const std::string answer = l.tokenizer->decode(r.tokens, true);
    std::cout << (o.no_stream ? answer : stream.finish()) << "\n" << std::flush;
    if (r.stats.stop_reason == "cancelled")
      std::cerr << "(answer stopped: it stays in the conversation as it is)\n";
    messages.push_back({"assistant", answer});
    last = r.stats;
    total_tokens += r.stats.new_tokens;
    total_seconds += r.stats.total_seconds;
  }
  return 0;
}

}  // namespace specdec::cli
