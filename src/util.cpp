#include "util.hpp"

#include <ftw.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>

#include "specdec/error.hpp"
#include "specdec/limits.hpp"

namespace specdec {

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string count_of(int64_t n, const std::string& noun) {
  return std::to_string(n) + " " + noun + (n == 1 ? "" : "s");
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t p = 0; (p = s.find(from, p)) != std::string::npos; p += to.size())
    s.replace(p, from.size(), to);
  return s;
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  SPECDEC_CHECK(in.good(), path, ": cannot open file: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

void check_layer_limit(int64_t layers, const std::string& source, const std::string& field) {
  SPECDEC_CHECK(layers > 0 && layers <= limits().max_layers, source, ": ", field,
                " must be from 1 to ", limits().max_layers, " (Limits::max_layers), got ", layers);
}

int64_t decoder_layer_of(const std::string& name) {
  if (name.rfind("encoder.", 0) == 0) return -1;
  for (const char* marker : {"layers.", "h.", "block.", "blk."}) {
    const size_t at = name.find(marker);
    if (at == std::string::npos || (at > 0 && name[at - 1] != '.')) continue;
    const size_t digits = at + std::strlen(marker);
    size_t end = digits;
    while (end < name.size() && std::isdigit(static_cast<unsigned char>(name[end]))) ++end;
    if (end > digits && end < name.size() && name[end] == '.')
      return end - digits > 9 ? std::numeric_limits<int64_t>::max()
                              : std::stoll(name.substr(digits, end - digits));
  }
  return -1;
}

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

bool dir_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void remove_tree(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;
  const auto remove = [](const char* p, const struct stat*, int, struct FTW*) {
    return ::remove(p);
  };
  SPECDEC_CHECK(::nftw(path.c_str(), remove, 16, FTW_DEPTH | FTW_PHYS) == 0, path,
                ": cannot remove: ", std::strerror(errno));
}

void rename_path(const std::string& from, const std::string& to) {
  SPECDEC_CHECK(std::rename(from.c_str(), to.c_str()) == 0, "cannot rename ", from, " to ", to,
                ": ", std::strerror(errno));
}

void hard_link(const std::string& from, const std::string& to) {
  SPECDEC_CHECK(::link(from.c_str(), to.c_str()) == 0, "cannot link ", from, " to ", to, ": ",
                std::strerror(errno));
}

void write_file_atomic(const std::string& path, const std::string& data) {
  write_file_atomic(path, [&](std::ostream& out) {
    out.write(data.data(), static_cast<std::streamsize>(data.size()));
  });
}

void write_file_atomic(const std::string& path, const std::function<void(std::ostream&)>& write) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    SPECDEC_CHECK(out.good(), tmp, ": cannot create file: ", std::strerror(errno));
    try {
      write(out);
    } catch (...) {
      out.close();
      std::remove(tmp.c_str());
      throw;
    }
    out.flush();
    if (!out.good()) {
      out.close();
      std::remove(tmp.c_str());
      throw Error(detail::concat(path, ": write failed (disk full?)"));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    throw Error(
        detail::concat(path, ": cannot rename temporary file into place: ", std::strerror(errno)));
  }
}

MappedFile map_file(const std::string& path, const std::string& kind, size_t min_size,
                    const std::string& min_what) {
  MappedFile f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  SPECDEC_CHECK(f.fd >= 0, path, ": cannot open ", kind, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(f.fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(f.fd);
    throw Error(path + ": not a regular file");
  }
  f.size = static_cast<size_t>(st.st_size);
  if (f.size < min_size) {
    ::close(f.fd);
    throw Error(detail::concat(path, ": truncated ", kind, ": ", f.size, " bytes, too short for ",
                               min_what, " (", min_size, " bytes)"));
  }
  f.data = ::mmap(nullptr, f.size, PROT_READ, MAP_PRIVATE, f.fd, 0);
  if (f.data == MAP_FAILED) {
    const int err = errno;
    ::close(f.fd);
    throw Error(detail::concat(path, ": mmap failed: ", std::strerror(err)));
  }
  return f;
}

void unmap_file(const MappedFile& file) {
  if (file.data != nullptr) ::munmap(file.data, file.size);
  if (file.fd >= 0) ::close(file.fd);
}

void read_at(int fd, uint64_t offset, void* dst, size_t bytes, const std::string& path) {
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::pread(fd, d + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      throw Error(
          detail::concat(path, ": read of ", bytes, " bytes at offset ", offset,
                         " failed: ", n == 0 ? "unexpected end of file" : std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
}

void release_free_heap() {
#ifdef __GLIBC__
  ::malloc_trim(0);
#endif
}

}  // namespace specdec
