// Reading GGUF files (llama.cpp's format): metadata, tensor infos, block-quantized tensors.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace specdec {

// A metadata value. Integers of every width are held in `i` (unsigned ones that do not fit in an
// int64 are refused), floats in `f`. An array is validated when the file is opened but its elements
// stay in the file until GgufFile::get_strings / get_ints / get_floats reads them: a 50,000-token
// vocabulary and its merges cost nothing to a reader that does not ask for them (the model loader).
struct GgufValue {
  enum class Type : uint32_t {
    kUint8 = 0,
    kInt8 = 1,
    kUint16 = 2,
    kInt16 = 3,
    kUint32 = 4,
    kInt32 = 5,
    kFloat32 = 6,
    kBool = 7,
    kString = 8,
    kArray = 9,
    kUint64 = 10,
    kInt64 = 11,
    kFloat64 = 12
  };
  Type type = Type::kUint8;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  Type array_type = Type::kUint8;  // element type when type == kArray
  uint64_t array_size = 0;         // elements when type == kArray
  uint64_t array_offset = 0;       // where the first element starts, from the start of the file
  bool is_integer() const;
  bool is_float() const { return type == Type::kFloat32 || type == Type::kFloat64; }
};

// ggml's tensor types that this reader dequantizes.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30
};
// "F32", "Q4_1", ...; "type N" for an id this reader does not know.
std::string ggml_type_name(uint32_t type);
// Elements per block and bytes per block of `type`; throws specdec::Error for unknown types.
int64_t ggml_block_elements(GgmlType type);
int64_t ggml_block_bytes(GgmlType type);
// The dtype a tensor of `type` loads as without a conversion: float32, float16 or bfloat16 for
// F32, F16 and BF16, float32 (dequantized) for the block types.
at::ScalarType ggml_dtype(GgmlType type);
// Dequantizes `n` elements (a multiple of the block size) stored as `type` at `src` into `dst`.
void ggml_dequantize(GgmlType type, const uint8_t* src, float* dst, int64_t n);
// Quantizes `n` floats (a multiple of 32) into Q8_0, Q4_0 or Q4_1 blocks at `dst` with ggml's
// reference quantizers (quantize_row_*_ref); throws specdec::Error for other types.
void ggml_quantize(GgmlType type, const float* src, uint8_t* dst, int64_t n);

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch order (outermost first): GGUF's ne[] reversed
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // from the start of the data section
  uint64_t bytes = 0;
  int64_t numel = 1;
};

// A memory-mapped GGUF file (versions 2 and 3, little-endian) with validated metadata and tensor
// infos. Every count, length, dimension product and offset is checked against the file size with
// overflow-safe arithmetic before it is used. Construction throws specdec::Error naming the file
// and the field or tensor for: a missing, short or truncated file, wrong magic, an unsupported
// version, absurd counts (limits that bound memory: 2^23 metadata keys and array values in all,
// 2^20 tensors), a string or array past the end, an unknown value or tensor type, a dimension
// product that overflows, a shape that does not divide into blocks, a misaligned offset, tensor
// data past the end, overlapping tensor data, duplicate keys or tensor names.
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const std::map<std::string, GgufTensorInfo>& tensors() const { return tensors_; }

  bool has(const std::string& key) const { return metadata_.count(key) != 0; }
  // Typed accessors: throw specdec::Error naming the file and key when the key is missing (for the
  // first form) or has another type.
  const GgufValue& value(const std::string& key) const;
  std::string get_string(const std::string& key) const;
  int64_t get_int(const std::string& key) const;
  double get_float(const std::string& key) const;  // floats, or integers
  bool get_bool(const std::string& key) const;
  std::vector<std::string> get_strings(const std::string& key) const;
  std::vector<int64_t> get_ints(const std::string& key) const;
  std::vector<double> get_floats(const std::string& key) const;
  std::optional<std::string> find_string(const std::string& key) const;
  std::optional<int64_t> find_int(const std::string& key) const;
  std::optional<double> find_float(const std::string& key) const;
  std::optional<bool> find_bool(const std::string& key) const;

  // The stored bytes of a tensor (inside the mapping, valid while this object lives).
  const uint8_t* data(const GgufTensorInfo& info) const { return data_ + info.offset; }
  // Reads the tensor's stored bytes into `dst` (info.bytes of them) from the file, not through
  // the mapping, so none of its pages become this process's memory.
  void read(const GgufTensorInfo& info, void* dst) const;
  // The tensor as `dtype` on `device`: its bytes as stored when `dtype` is its own type, else
  // dequantized to float32 (1 MiB of the file at a time) and converted.
  at::Tensor load(const std::string& name, at::ScalarType dtype, c10::Device device) const;

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t file_offset(const GgufTensorInfo& info) const;
  // Calls f(GgufValue) for each element of the array `v` (metadata `key`), read from the mapping.
  template <typename F>
  void for_each_element(const GgufValue& v, const std::string& key, F&& f) const;
  int fd_ = -1;  // open while the mapping lives: read() reads tensors through it
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;
  std::map<std::string, GgufValue> metadata_;
  std::map<std::string, GgufTensorInfo> tensors_;
};

// True when `path` names a GGUF file, or a folder holding exactly one *.gguf file; `resolved`
// receives that file. A folder with several is an error naming them.
bool find_gguf(const std::string& path, std::string* resolved = nullptr);

}  // namespace specdec
