#include "specdec/limits.hpp"

#include <mutex>

#include "specdec/error.hpp"

namespace specdec {
namespace {
std::mutex& mutex() {
  static std::mutex m;
  return m;
}
Limits& current() {
  static Limits l;
  return l;
}
}  // namespace

Limits limits() {
  std::lock_guard<std::mutex> lock(mutex());
  return current();
}

void set_limits(const Limits& l) {
  for (const int64_t v :
       {l.max_header_bytes, l.max_metadata_values, l.max_tensors, l.max_rank, l.max_tensor_elements,
        l.max_vocab_size, l.max_sequence_length, l.max_layers, l.max_head_dim, l.max_extra_ids})
    SPECDEC_CHECK(v > 0, "set_limits: every limit must be positive, got ", v);
  std::lock_guard<std::mutex> lock(mutex());
  current() = l;
}

}  // namespace specdec
