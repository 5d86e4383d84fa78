// Commands that write files in one long call (make-fixture, make-tokenizer): Ctrl-C or SIGTERM
// removes what they had written and ends the program.
#pragma once

#include <functional>
#include <string>
#include <thread>

namespace specdec::cli {

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
  int pipe_[2] = {-1, -1};
  std::thread watcher_;
};

// Removes `path` (a file, or a folder and what is in it) and returns whether it is gone; tries
// again while another thread may still be writing into it.
bool remove_path(const std::string& path);

}  // namespace specdec::cli
