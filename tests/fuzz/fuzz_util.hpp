// Shared by the libFuzzer targets: the input as a file (the parsers read paths).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include <vector>

// A per-process folder in /dev/shm for the files of one input.
inline const std::string& fuzz_dir() {
  static const std::string dir = [] {
    const std::string d = "/dev/shm/specdec_fuzz_" + std::to_string(::getpid());
    std::remove(d.c_str());
    (void)::mkdir(d.c_str(), 0700);
    return d;
  }();
  return dir;
}

// Writes the input to the file `name` in fuzz_dir() and returns its path ("" if it cannot be
// written).
inline std::string fuzz_input_file(const uint8_t* data, size_t size, const std::string& name) {
  const std::string path = fuzz_dir() + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return "";
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

// The input cut at NUL bytes into at most `n` parts (the last part keeps any further NULs).
inline std::vector<std::string> fuzz_split(const uint8_t* data, size_t size, size_t n) {
  const std::string all(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  size_t at = 0;
  while (parts.size() + 1 < n) {
    const size_t cut = all.find('\0', at);
    if (cut == std::string::npos) break;
    parts.push_back(all.substr(at, cut - at));
    at = cut + 1;
  }
  parts.push_back(all.substr(at));
  return parts;
}

// Writes `text` to `name` in fuzz_dir(), or removes that file when `present` is false.
inline void fuzz_put(const std::string& name, const std::string& text, bool present = true) {
  const std::string path = fuzz_dir() + "/" + name;
  if (!present) {
    std::remove(path.c_str());
    return;
  }
  fuzz_input_file(reinterpret_cast<const uint8_t*>(text.data()), text.size(), name);
}
