// Small private helpers shared by the implementation files.
#pragma once

#include <c10/util/Exception.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

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

// Wall-clock seconds since `t` (steady clock): every timing of the engine and the tools.
using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The share of copies that go on after a match of x >= 1 tokens (the text continuing as it did
// after the earlier occurrence), in SmolLM2-135M-Instruct's greedy answers to chat, extraction and
// rewriting prompts: about 20% after 1 token, 50% after 2, 65% after 3, 80% after 5 to 7, 90% or
// more after 16 (benchmarks/lookup_replay.py prints the table for a workload). Prompt lookup and
// suffix speculation price their proposals with it.
inline double copy_goes_on(double x) { return (x - 0.8) / (x + 0.2); }

// Whole file as a string; throws specdec::Error naming the path when it cannot be read.
std::string read_text_file(const std::string& path);
bool file_exists(const std::string& path);
// The decoder layer a checkpoint's tensor belongs to, from its name: Hugging Face's
// "model.layers.3.", "transformer.h.3.", "decoder.block.3." ..., GGUF's "blk.3."; -1 for none (T5's
// encoder blocks included), INT64_MAX for an index of more than 9 digits.
int64_t decoder_layer_of(const std::string& name);
// A configuration's layer count (`field` of `source`) is from 1 to Limits::max_layers: checked
// before anything is built per layer.
void check_layer_limit(int64_t layers, const std::string& source, const std::string& field);
// Folders, through POSIX calls rather than std::filesystem: PyPI's libtorch 2.x exports its own
// std::filesystem symbols, which then replace the C++ library's and crash (remove_all).
bool path_exists(const std::string& path);  // a file or folder
bool dir_exists(const std::string& path);  // a folder (or a link to one)
void remove_tree(const std::string& path);  // rm -rf; nothing when absent; throws specdec::Error
void rename_path(const std::string& from, const std::string& to);  // throws specdec::Error
void hard_link(const std::string& from, const std::string& to);    // throws specdec::Error
// "a, b, c".
std::string join(const std::vector<std::string>& items);
// "1 token", "2 tokens" (a count and its noun, plural with an s where n != 1).
std::string count_of(int64_t n, const std::string& noun);
// `s` with every occurrence of `from` (not empty) replaced by `to`, left to right.
std::string replace_all(std::string s, const std::string& from, const std::string& to);
// A whole file mapped read-only, its descriptor kept open (the loaders read tensors through it).
struct MappedFile {
  int fd = -1;
  void* data = nullptr;
  size_t size = 0;
};
// Opens and maps `path`, a regular file of at least `min_size` bytes; `kind` ("GGUF file") and
// `min_what` (what the first `min_size` bytes hold) word the errors. Throws specdec::Error and then
// holds nothing open.
MappedFile map_file(const std::string& path, const std::string& kind, size_t min_size,
                    const std::string& min_what);
void unmap_file(const MappedFile& file);
// Reads `bytes` of file `fd` at `offset` into `dst` (pread; throws specdec::Error naming `path`).
// Loaders copy tensors this way rather than out of their mapping: mapped pages count as this
// process's memory, and the kernel maps whole page-cache folios (megabytes on ext4) around each
// touched page, so a copy through the mapping holds part of the tensor twice.
void read_at(int fd, uint64_t offset, void* dst, size_t bytes, const std::string& path);
// Gives the free pages of the C heap back to the system (glibc's malloc_trim; nothing elsewhere).
// Loading calls it between tensors: without it, the buffers freed while a model loads (fused
// parts, conversions) stay resident as holes, about a tenth of the weights on the 1.1B Q4_0 file.
void release_free_heap();
// Writes `data` to `path` through a temporary file in the same folder and a rename, so a reader
// never sees a half-written file.
void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write);
void write_file_atomic(const std::string& path, const std::string& data);

}  // namespace specdec
