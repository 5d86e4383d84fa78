#include "interrupt.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <system_error>

#include "util.hpp"

namespace specdec::cli {
namespace {

std::atomic<int> g_wake{-1};  // the write end of the live StopSignals' pipe
static_assert(std::atomic<int>::is_always_lock_free);

}  // namespace

StopSignals::StopSignals() {
  if (::pipe(pipe_) != 0) throw std::system_error(errno, std::generic_category(), "pipe");
  g_wake = pipe_[1];
  struct sigaction sa {};
  sa.sa_handler = [](int signal) {
    const int saved = errno;  // (the interrupted code's)
    const char c = static_cast<char>(signal);
    (void)!::write(g_wake.load(), &c, 1);  // async-signal-safe; the waiting thread does the rest
    errno = saved;
  };
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, &old_int_);
  ::sigaction(SIGTERM, &sa, &old_term_);
}

StopSignals::~StopSignals() {
  close();
  ::close(pipe_[0]);
}

int StopSignals::wait() {
  char signal = 0;
  ssize_t n = 0;
  while ((n = ::read(pipe_[0], &signal, 1)) < 0 && errno == EINTR) {
  }
  return n == 1 ? signal : 0;
}

void StopSignals::close() {
  if (closed_) return;
  closed_ = true;
  ::sigaction(SIGINT, &old_int_, nullptr);
  ::sigaction(SIGTERM, &old_term_, nullptr);
  g_wake = -1;
  ::close(pipe_[1]);  // (a wait() under way returns 0)
}

CleanupOnInterrupt::CleanupOnInterrupt(std::function<std::string()> cleanup)
    : cleanup_(std::move(cleanup)) {
  watcher_ = std::thread([this] {
    const int signal = signals_.wait();
    if (signal == 0) return;  // closed: the command finished
    const std::string what = cleanup_();
    std::fprintf(stderr, "\ninterrupted: %s\n", what.c_str());
    std::_Exit(128 + signal);
  });
}

CleanupOnInterrupt::~CleanupOnInterrupt() {
  signals_.close();
  watcher_.join();
}

namespace {
std::atomic<bool> g_answering{false}, g_stop{false};
static_assert(std::atomic<bool>::is_always_lock_free);

void stop_answer(int signal) {
  if (g_answering && !g_stop) {
    g_stop = true;
    return;
  }
  (void)!::write(STDERR_FILENO, "\n", 1);
  ::signal(signal, SIG_DFL);  // (async-signal-safe, as raise is: the parent sees the signal)
  ::raise(signal);
}
}  // namespace

StopAnswerOnInterrupt::StopAnswerOnInterrupt() {
  struct sigaction sa {};
  sa.sa_handler = stop_answer;
  sa.sa_flags = SA_RESTART;  // (a write to the terminal interrupted goes on)
  sigemptyset(&sa.sa_mask);
  installed_ = ::sigaction(SIGINT, nullptr, &was_) == 0 && was_.sa_handler != SIG_IGN &&
               ::sigaction(SIGINT, &sa, nullptr) == 0;
}

StopAnswerOnInterrupt::~StopAnswerOnInterrupt() {
  g_answering = false;
  if (installed_) ::sigaction(SIGINT, &was_, nullptr);
}

void StopAnswerOnInterrupt::answering(bool on) {
  if (on) g_stop = false;
  g_answering = on;
}

bool StopAnswerOnInterrupt::stop() const { return g_stop; }

bool remove_path(const std::string& path) {
  for (int attempt = 0; attempt < 50; ++attempt) {
    try {
      remove_tree(path);
    } catch (const Error&) {  // a file made meanwhile: again
    }
    if (!path_exists(path)) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

}  // namespace specdec::cli
