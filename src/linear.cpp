#include "linear.hpp"

#include <sys/mman.h>

#include <cstring>

#include "device.hpp"
#include "specdec/error.hpp"
#include "util.hpp"

namespace specdec {
namespace {

GgmlType dense_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return GgmlType::kF32;
    case at::kBFloat16:
      return GgmlType::kBF16;
    case at::kHalf:
      return GgmlType::kF16;
    default:
      throw Error("linear layer: unsupported weight dtype " + dtype_name(dtype));
  }
}

const std::pair<WeightFormat, const char*> kFormatNames[] = {
    {WeightFormat::kAsStored, "as-stored"}, {WeightFormat::kFloat32, "float32"},
    {WeightFormat::kBFloat16, "bfloat16"},  {WeightFormat::kFloat16, "float16"},
    {WeightFormat::kQ8_0, "q8_0"},          {WeightFormat::kQ4_0, "q4_0"},
    {WeightFormat::kQ4_1, "q4_1"},
};

}  // namespace

std::vector<std::string> weight_format_names() {
  std::vector<std::string> names;
  for (const auto& [f, n] : kFormatNames) names.push_back(n);
  return names;
}

WeightFormat parse_weight_format(const std::string& name) {
  for (const auto& [f, n] : kFormatNames)
    if (name == n) return f;
  throw Error("unknown weight format '" + name +
              "' (expected one of: " + join(weight_format_names()) + ")");
}

std::string weight_format_name(WeightFormat format) {
  for (const auto& [f, n] : kFormatNames)
    if (f == format) return n;
  return "unknown";
}

struct WeightArena::Chunk {
  uint8_t* base = nullptr;  // 2 MiB aligned
  size_t size = 0, used = 0;
  void* map = nullptr;
  size_t map_size = 0;
  ~Chunk() {
    if (map) ::munmap(map, map_size);
  }
};

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kChunk = size_t{256} << 20;
size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// A chunk's last huge page is resident whole once touched: give back its unwritten 4 KiB pages
// (nothing is written to the chunk afterwards).
void hand_back_tail(const WeightArena::Chunk& c) {
  const size_t from = round_up(c.used, 4096), to = std::min(round_up(c.used, kHugePage), c.size);
  if (to > from) ::madvise(c.base + from, to - from, MADV_DONTNEED);
}
}  // namespace

WeightArena::~WeightArena() {
  release_free_heap();  // the last matrix's source
  if (current_) hand_back_tail(*current_);
}

std::pair<at::Tensor, std::shared_ptr<WeightArena::Chunk>> WeightArena::copy(const at::Tensor& t,
                                                                             bool release_source) {
  const size_t bytes = t.nbytes();
  if (!current_ || current_->used + bytes > current_->size) {
    auto c = std::make_shared<Chunk>();
    c->size = std::max(kChunk, round_up(bytes, kHugePage));
    c->map_size = c->size + kHugePage;
    c->map = ::mmap(nullptr, c->map_size, PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (c->map == MAP_FAILED) return {t, nullptr};
    c->base = reinterpret_cast<uint8_t*>(round_up(reinterpret_cast<uintptr_t>(c->map), kHugePage));
#ifdef MADV_HUGEPAGE
    ::madvise(c->base, c->size,
              MADV_HUGEPAGE);  // no huge pages (THP "never", not Linux): small ones
#endif
    if (current_) hand_back_tail(*current_);
    current_ = std::move(c);
  }
  uint8_t* p = current_->base + current_->used;
  const auto* src = static_cast<const uint8_t*>(t.data_ptr());
  // In 2 MiB pieces, handing the source's whole pages back behind the copy when the caller gives
  // it up: loading never holds two copies of a matrix.
  uintptr_t released = round_up(reinterpret_cast<uintptr_t>(src), 4096);
  for (size_t off = 0; off < bytes; off += kHugePage) {
    const size_t n = std::min(kHugePage, bytes - off);
    std::memcpy(p + off, src + off, n);
    const uintptr_t to = (reinterpret_cast<uintptr_t>(src) + off + n) / 4096 * 4096;
    if (release_source && to > released) {
      ::madvise(reinterpret_cast<void*>(released), to - released, MADV_DONTNEED);
      released = to;
    }
  }
  current_->used = round_up(current_->used + bytes, 64);
  std::shared_ptr<Chunk> chunk = current_;
  return {at::from_blob(
              p, t.sizes(), [chunk](void*) {}, t.options()),
          current_};
}

Linear::Linear(at::Tensor w, at::Tensor b)
    : w_(w.contiguous()),
      b_(std::move(b)),
      type_(dense_type(w.scalar_type())),
      n_(w.size(0)),
      k_(w.size(1)) {
  row_bytes_ = k_ * static_cast<int64_t>(w_.element_size());
  if (w_.device().is_cpu()) kernel_ = kernels::linear_kernel(type_);
}

Linear::Linear(GgmlType type, at::Tensor bytes, int64_t k, at::Tensor b, bool int8_activations)
    : w_(std::move(bytes)),
      b_(std::move(b)),
      type_(type),
      n_(w_.size(0)),
      k_(k),
      row_bytes_(w_.size(1)) {
  SPECDEC_CHECK(k % ggml_block_elements(type) == 0 &&
                    k / ggml_block_elements(type) * ggml_block_bytes(type) == row_bytes_,
                "linear layer: ", row_bytes_, " bytes per row do not hold ", k, " ",
                ggml_type_name(static_cast<uint32_t>(type)), " values");
  kernel_ = kernels::linear_kernel(type_, int8_activations);
  // The kernel's layout, in place where this layer holds the only reference to the bytes (the
  // loaders hand theirs over), else in a copy (the caller's bytes stay as they are).
  if (kernel_.interleaved && (w_.use_count() > 1 || w_.storage().use_count() > 1)) w_ = w_.clone();
  w_ = w_.contiguous();
  kernels::prepare_weights(kernel_, type_, static_cast<uint8_t*>(w_.data_ptr()), n_, row_bytes_);
}

Linear Linear::cat(const std::vector<Linear>& parts) {
  SPECDEC_CHECK(!parts.empty(), "Linear::cat of nothing");
  bool same = true;
  const bool biased = parts[0].b_.defined();
  std::vector<at::Tensor> w, b;
  for (const Linear& p : parts) {
    // interleaved rows concatenate only in whole groups
    same = same && p.parts_.empty() && p.type_ == parts[0].type_ && p.k_ == parts[0].k_ &&
           p.w_.device() == parts[0].w_.device() &&
           p.kernel_.interleaved == parts[0].kernel_.interleaved &&
           (!p.kernel_.interleaved || p.n_ % kernels::kInterleave == 0);
    SPECDEC_CHECK(p.b_.defined() == biased, "Linear::cat: parts with and without bias");
    w.push_back(p.w_);
    if (biased) b.push_back(p.b_);
  }
  Linear out;
  out.n_ = 0;
  for (const Linear& p : parts) out.n_ += p.n_;
  out.k_ = parts[0].k_;
  out.type_ = parts[0].type_;
  bool arena = true, adjacent = true;  // all in parts[0]'s chunk; each right after the one before
  for (size_t i = 0; i < parts.size(); ++i) {
    arena = arena && parts[i].chunk_ && parts[i].chunk_ == parts[0].chunk_;
    adjacent = adjacent && (i == 0 || static_cast<const uint8_t*>(parts[i - 1].w_.data_ptr()) +
                                              parts[i - 1].w_.nbytes() ==
                                          parts[i].w_.data_ptr());
  }
  if (!same || (arena && !adjacent)) {
    out.parts_ = parts;
    return out;
  }
  if (arena) {  // one view of the parts' rows, which lie one after another
    std::vector<int64_t> shape = parts[0].w_.sizes().vec();
    shape[0] = 0;
    for (const Linear& p : parts) shape[0] += p.w_.size(0);
    std::shared_ptr<WeightArena::Chunk> chunk = parts[0].chunk_;
    out.w_ = at::from_blob(
        parts[0].w_.data_ptr(), shape, [chunk](void*) {}, parts[0].w_.options());
    out.chunk_ = chunk;
  } else {
    out.w_ = at::cat(w);  // the parts' tensors are released by the caller
  }
  if (biased) out.b_ = at::cat(b);
  out.row_bytes_ = parts[0].row_bytes_;
  out.kernel_ = parts[0].kernel_;
  return out;
}

void Linear::move_to(WeightArena& arena) {
  for (Linear& p : parts_) p.move_to(arena);
  if (!w_.defined() || !w_.device().is_cpu() || chunk_ || w_.use_count() > 1 ||
      w_.storage().use_count() > 1)
    return;
  // This layer holds the only reference: the source's pages go back as they are copied.
  std::tie(w_, chunk_) = arena.copy(w_.contiguous(), true);
}

int64_t Linear::bytes() const {
  int64_t total = (w_.defined() ? w_.nbytes() : 0) + (b_.defined() ? b_.nbytes() : 0);
  for (const Linear& p : parts_) total += p.bytes();
  return total;
}

std::vector<at::Tensor> Linear::tensors() const {
  std::vector<at::Tensor> out;
  if (w_.defined()) out.push_back(w_);
  if (b_.defined()) out.push_back(b_);
  for (const Linear& p : parts_) {
    const auto t = p.tensors();
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

at::Tensor Linear::operator()(const at::Tensor& x, const at::Tensor& residual) const {
  if (parts_.empty() && kernel_ && x.device().is_cpu() && x.scalar_type() == at::kFloat)
    return kernels::linear_packed(x, kernel_, static_cast<const uint8_t*>(w_.data_ptr()),
                                  row_bytes_, n_, k_, b_, residual);
  at::Tensor y;
  if (!parts_.empty()) {
    std::vector<at::Tensor> ys;
    for (const Linear& p : parts_) ys.push_back(p(x));
    y = at::cat(ys, -1);
  } else {
    SPECDEC_CHECK(w_.scalar_type() != at::kByte,
                  "linear layer: ", ggml_type_name(static_cast<uint32_t>(type_)),
                  " weights need float32 activations on the CPU");
    y = at::linear(x, w_, b_);
  }
  return residual.defined() ? residual + y : y;
}

at::Tensor Linear::rows(const at::Tensor& ids, at::ScalarType dtype) const {
  SPECDEC_CHECK(parts_.empty(), "embedding lookup in a fused layer");
  const at::Tensor flat = ids.reshape(-1).to(at::kCPU, at::kLong).contiguous();
  const int64_t* id = flat.data_ptr<int64_t>();
  for (int64_t i = 0; i < flat.numel(); ++i)
    SPECDEC_CHECK(id[i] >= 0 && id[i] < n_, "token id ", id[i], " is outside the vocabulary [0, ",
                  n_, ")");
  if (w_.scalar_type() != at::kByte && (w_.scalar_type() == dtype || !w_.device().is_cpu()))
    return w_.index_select(0, detail::to_device(flat, w_.device()))
        .to(dtype)
        .view({ids.size(0), ids.size(1), k_});
  at::Tensor out = at::empty({flat.numel(), k_}, at::kFloat);
  const uint8_t* w = static_cast<const uint8_t*>(w_.data_ptr());
  std::vector<uint8_t> row(row_bytes_);
  for (int64_t i = 0; i < flat.numel(); ++i) {
    kernels::stored_row(kernel_, type_, w, n_, row_bytes_, id[i], row.data());
    ggml_dequantize(type_, row.data(), out.data_ptr<float>() + i * k_, k_);
  }
  return out.to(dtype).view({ids.size(0), ids.size(1), k_});
}

WeightLoader::WeightLoader(const WeightSource& source, const LoadOptions& options)
    : source_(source), options_(options), packed_(packed_compute(options)) {}

at::Tensor WeightLoader::tensor(const std::string& name, const std::vector<int64_t>& shape) const {
  return source_.load(name, options_.dtype, options_.device, shape);
}

at::Tensor WeightLoader::stored(const std::string& name, const std::vector<int64_t>& shape) const {
  if (!packed_) return tensor(name, shape);
  return source_.load(name, source_.stored_dtype(name), c10::Device(c10::kCPU), shape);
}

Linear WeightLoader::linear(const std::string& name, const std::vector<int64_t>& shape,
                            at::Tensor bias) const {
  SPECDEC_CHECK(shape.size() == 2, "WeightLoader::linear: '", name, "' needs its [N, K] shape");
  release_free_heap();  // what the layers loaded so far freed (fused parts, conversions)
  at::Tensor bytes;
  GgmlType type = GgmlType::kF32;
  Linear out;
  if (packed_ && options_.weights == WeightFormat::kAsStored &&
      source_.load_blocks(name, shape, &bytes, &type))
    out = Linear(type, std::move(bytes), shape[1], std::move(bias), options_.int8_activations);
  else
    out = convert(name, stored(name, shape), std::move(bias));
  out.move_to(*arena_);
  return out;
}

Linear WeightLoader::make(const std::string& name, const at::Tensor& w, at::Tensor bias) const {
  Linear out = convert(name, w, std::move(bias));
  out.move_to(*arena_);
  return out;
}

Linear WeightLoader::convert(const std::string& name, const at::Tensor& w, at::Tensor bias) const {
  if (!packed_) return Linear(w.to(options_.device, options_.dtype), std::move(bias));
  switch (options_.weights) {
    case WeightFormat::kAsStored:
      return Linear(w, std::move(bias));
    case WeightFormat::kFloat32:
      return Linear(w.to(at::kFloat), std::move(bias));
    case WeightFormat::kBFloat16:
      return Linear(w.to(at::kBFloat16), std::move(bias));
    case WeightFormat::kFloat16:
      return Linear(w.to(at::kHalf), std::move(bias));
    case WeightFormat::kQ8_0:
    case WeightFormat::kQ4_0:
    case WeightFormat::kQ4_1: {
      const GgmlType type = options_.weights == WeightFormat::kQ8_0   ? GgmlType::kQ8_0
                            : options_.weights == WeightFormat::kQ4_0 ? GgmlType::kQ4_0
                                                                      : GgmlType::kQ4_1;
      const int64_t n = w.size(0), k = w.size(1);
      SPECDEC_CHECK(k % 32 == 0, source_.dir(), ": cannot hold '", name, "' [", n, ", ", k, "] as ",
                    weight_format_name(options_.weights), ": its ", k,
                    " columns are not a whole number of blocks of 32");
      const at::Tensor f = w.to(at::kFloat).contiguous();
      at::Tensor bytes = at::empty({n, k / 32 * ggml_block_bytes(type)}, at::kByte);
      ggml_quantize(type, f.data_ptr<float>(), bytes.data_ptr<uint8_t>(), n * k);
      return Linear(type, std::move(bytes), k, std::move(bias), options_.int8_activations);
    }
  }
  throw Error("unknown weight format");
}

}  // namespace specdec
