// Ctrl-C in the commands: one that streams an answer (generate, chat) stops the answer; one that
// writes files in one long call (make-fixture, make-tokenizer) removes what it had written.
#pragma once

#include <signal.h>

#include <functional>
#include <string>
#include <thread>

namespace specdec::cli {

// While it lives, SIGINT and SIGTERM write their number to a pipe that wait() reads: the work goes
// on meanwhile, and the waiting thread decides what a signal does. (A handler, not a signal mask:
// threads that libraries start before main, OpenBLAS's among them, would not block them.) One at a
// time; the handlers it replaced are back when it ends.
class StopSignals {
 public:
  StopSignals();
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  int wait();    // the next signal's number; 0 once close() was called
  void close();  // signals are no longer caught, and wait() returns 0

 private:
  int pipe_[2] = {-1, -1};
  struct sigaction old_int_ {}, old_term_{};
  bool closed_ = false;
};

// While it lives, SIGINT and SIGTERM run `cleanup` on a thread of its own, print what it returns
// ("interrupted: " and that) and exit with 128 + the signal's number (the handler only wakes that
// thread, the work goes on meanwhile). Not for commands that stop at a point of their own choosing
// (make-draft, serve).
class CleanupOnInterrupt {
 public:
  explicit CleanupOnInterrupt(std::function<std::string()> cleanup);
  ~CleanupOnInterrupt();
  CleanupOnInterrupt(const CleanupOnInterrupt&) = delete;
  CleanupOnInterrupt& operator=(const CleanupOnInterrupt&) = delete;

 private:
  std::function<std::string()> cleanup_;
  StopSignals signals_;
  std::thread watcher_;
};

// While it lives, Ctrl-C (SIGINT) between answering(true) and answering(false) makes stop() true,
// so that the token callback throws Cancelled and the answer ends where it is; at any other time,
// or a second time before the answer stops, it ends the program as SIGINT does by default (after
// a line break). Where SIGINT is ignored (a background job of a script) it stays ignored.
class StopAnswerOnInterrupt {
 public:
  StopAnswerOnInterrupt();
  ~StopAnswerOnInterrupt();
  StopAnswerOnInterrupt(const StopAnswerOnInterrupt&) = delete;
  StopAnswerOnInterrupt& operator=(const StopAnswerOnInterrupt&) = delete;
  void answering(bool on);  // on: an answer starts (no stop asked for it yet)
  bool stop() const;        // a Ctrl-C came during this answer

 private:
  struct sigaction was_ {};
  bool installed_ = false;
};

// Removes `path` (a file, or a folder and what is in it) and returns whether it is gone; tries
// again while another thread may still be writing into it.
bool remove_path(const std::string& path);

}  // namespace specdec::cli
