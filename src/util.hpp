// Small private helpers shared by the implementation files.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "specdec/error.hpp"

namespace specdec {

// Runs `f`, turning libtorch's c10::Error into the specdec::Error the public API promises
// (`what` says which call failed).
template <typename F>
auto torch_errors_as_specdec(const char* what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const c10::Error& e) {
    throw Error(std::string(what) + ": " + e.what_without_backtrace());
  }
}

// Whole file as a string; throws specdec::Error naming the path when it cannot be read.
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);
// Folders, through POSIX calls rather than std::filesystem: PyPI's libtorch 2.x exports its own
// std::filesystem symbols, which then replace the C++ library's and crash (remove_all).
bool path_exists(const std::string& path);    // a file or folder
void remove_tree(const std::string& path);    // rm -rf; nothing when absent; throws specdec::Error
void rename_path(const std::string& from, const std::string& to);  // throws specdec::Error
void hard_link(const std::string& from, const std::string& to);    // throws specdec::Error
// "a, b, c".
std::string join(const std::vector<std::string>& items);
// Drops the whole pages of a read-only file mapping inside [begin, end) from this process's
// resident memory once their bytes have been copied out (they are read from the file again if
// touched), so that loading never holds a mapped tensor beside its converted copy.
void release_mapped(const void* begin, const void* end);
// Writes `data` to `path` through a temporary file in the same folder and a rename, so a reader
// never sees a half-written file.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write);
void write_file_atomic(const std::string& path, const std::string& data);

}  // namespace specdec
