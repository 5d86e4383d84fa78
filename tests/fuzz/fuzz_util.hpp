// Shared by the libFuzzer targets: the input as a file (the parsers read paths).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

// Writes the input to a per-process file named `name` under a per-process folder in /dev/shm and
// returns its path ("" if it cannot be written).
inline std::string fuzz_input_file(const uint8_t* data, size_t size, const std::string& name) {
  static const std::string dir = [] {
    const std::string d = "/dev/shm/specdec_fuzz_" + std::to_string(::getpid());
    std::remove(d.c_str());
    (void)::mkdir(d.c_str(), 0700);
    return d;
  }();
  const std::string path = dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return "";
  std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}
