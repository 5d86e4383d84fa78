// `specdec make-draft`: progress on stderr, a clean stop on Ctrl-C.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli.hpp"

namespace specdec::cli {

namespace {

std::atomic<bool> g_interrupted{false};

std::string duration_text(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  std::ostringstream o;
  if (t >= 3600) o << t / 3600 << "h";
  if (t >= 60) o << (t % 3600) / 60 << "m";
  o << t % 60 << "s";
  return o.str();
}

// Progress on stderr: a bar redrawn in place on a terminal, else one line every 10 s and at the end
// of each phase.
class ProgressPrinter {
 public:
  void operator()(const MakeDraftProgress& p) {
    const bool tty = isatty(STDERR_FILENO);
    const auto now = std::chrono::steady_clock::now();
    const bool end = p.done == p.total;
    if (!tty && !end && now - last_ < std::chrono::seconds(10)) return;
    last_ = now;
    const int width = 24;
    const int filled = p.total > 0 ? static_cast<int>(width * p.done / p.total) : 0;
    std::ostringstream line;
    line << (p.phase == "self-prompts" ? "writing prompts   "
             : p.phase == "generate"   ? "answering prompts "
             : p.phase == "label"      ? "labelling (target)"
             : p.phase == "evaluate"   ? "answering eval    "
                                       : "training          ")
         << " [" << std::string(static_cast<size_t>(filled), '#')
         << std::string(static_cast<size_t>(width - filled), '.') << "] " << p.done << "/"
         << p.total;
    if (p.phase == "train") line << "  kl " << std::fixed << std::setprecision(4) << p.loss;
    line << "  " << std::fixed << std::setprecision(0) << p.tokens_per_s << " tok/s  ETA "
         << duration_text(p.eta_s);
    std::cerr << (tty ? "\r\033[K" : "") << line.str() << (tty && !end ? "" : "\n") << std::flush;
  }

 private:
  std::chrono::steady_clock::time_point last_{};
};

std::string quality_text(const DraftQuality& q) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(3) << "kl " << q.kl << ", acceptance >= " << q.acceptance
    << ", greedy agreement " << q.greedy_agreement << " (" << q.positions << " positions)";
  return o.str();
}

}  // namespace

int run_make_draft(const MakeDraftOptions& o) {
  // Ctrl-C or SIGTERM asks for a clean stop (a checkpoint is written); a second one kills the
  // program.
  g_interrupted = false;
  for (const int signal : {SIGINT, SIGTERM})
    std::signal(signal, [](int) {
      g_interrupted = true;
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
    });
  ProgressPrinter printer;
  const MakeDraftResult r = make_draft(o, std::ref(printer), &g_interrupted);
  std::signal(SIGINT, SIG_DFL);
  std::signal(SIGTERM, SIG_DFL);
  if (r.interrupted && r.steps_done == 0 && !o.resume) {
    std::cerr << "\ninterrupted before the first checkpoint: nothing was written\n";
    return 130;
  }
  std::cerr << (o.resume ? "held-out, at the checkpoint resumed: " : "held-out, before training: ")
            << quality_text(r.before) << "\n"
            << "held-out, after " << r.steps_done << " steps: " << quality_text(r.after) << "\n";
  if (r.eval.positions > 0) std::cerr << "eval prompts' answers: " << quality_text(r.eval) << "\n";
  if (r.interrupted) {
    std::cerr << "interrupted: " << o.out << " holds the checkpoint of step " << r.steps_done
              << "; continue with the same command and --resume\n";
    return 130;
  }
  std::cerr << "wrote " << o.out << "\n";
  return 0;
}

void inherit_labelling(MakeDraftOptions& o, bool features_given, bool int8_given) {
  std::ifstream in(o.out + "/training/state.json");
  nlohmann::json state;
  try {
    state = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception&) {
    return;  // (not a run's folder: make_draft says so)
  }
  if (!state.is_object()) return;
  const auto flag = [&](const char* key, bool& value) {
    if (state.contains(key) && state[key].is_boolean()) value = state[key].get<bool>();
  };
  if (!features_given) flag("features", o.features);
  if (!int8_given) flag("int8_activations", o.int8_activations);
}

}  // namespace specdec::cli
