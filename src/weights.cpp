#include "specdec/weights.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "json.hpp"
#include "specdec/error.hpp"
#include "specdec/limits.hpp"
#include "util.hpp"

namespace specdec {

using nlohmann::json;

namespace {

struct DtypeEntry {
  const char* name;
  at::ScalarType type;
  size_t size;
};
constexpr DtypeEntry kDtypes[] = {
    {"F32", at::kFloat, 4}, {"F16", at::kHalf, 2}, {"BF16", at::kBFloat16, 2}};

const DtypeEntry* find_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return &d;
  return nullptr;
}

const DtypeEntry* find_dtype(at::ScalarType type) {
  for (const auto& d : kDtypes)
    if (type == d.type) return &d;
  return nullptr;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const MappedFile file = map_file(path, "safetensors file", 8, "a safetensors header length");
  fd_ = file.fd;
  map_ = file.data;
  map_size_ = file.size;
  try {
    const auto* bytes = static_cast<const uint8_t*>(map_);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
    const Limits lim = limits();
    SPECDEC_CHECK(header_len <= static_cast<uint64_t>(lim.max_header_bytes), path,
                  ": header length ", header_len, " exceeds the limit of ", lim.max_header_bytes,
                  " bytes (Limits::max_header_bytes)");
    SPECDEC_CHECK(header_len <= map_size_ - 8, path, ": header length ", header_len,
                  " runs past the end of the file (", map_size_, " bytes)");
    const uint64_t data_size = map_size_ - 8 - header_len;
    data_ = bytes + 8 + header_len;
    json header;
    try {
      header =
          detail::parse_json_bounded(reinterpret_cast<const char*>(bytes) + 8,
                                     reinterpret_cast<const char*>(bytes) + 8 + header_len, path);
    } catch (const json::exception& e) {
      throw Error(
          detail::concat(path, ": invalid safetensors header JSON: ", detail::json_message(e)));
    }
    SPECDEC_CHECK(header.is_object(), path, ": safetensors header must be a JSON object");
    SPECDEC_CHECK(static_cast<int64_t>(header.size()) <= lim.max_tensors + 1, path, ": ",
                  header.size(), " header entries exceed the limit of ", lim.max_tensors,
                  " tensors (Limits::max_tensors)");
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    std::vector<std::string> range_names;
    for (auto it = header.begin(); it != header.end(); ++it) {
      if (it.key() == "__metadata__") {
        if (it->is_object())
          for (auto m = it->begin(); m != it->end(); ++m)
            if (m->is_string()) metadata_[m.key()] = m->get<std::string>();
        continue;
      }
      const std::string& name = it.key();
      const json& e = *it;
      SPECDEC_CHECK(
          e.is_object() && e.contains("dtype") && e.contains("shape") && e.contains("data_offsets"),
          path, ": tensor '", name, "' needs dtype, shape and data_offsets");
      TensorInfo info;
      // Non-negative integers only: a number like 1e43 must not reach an integer conversion.
      const auto naturals = [&](const json& a, const char* field) {
        SPECDEC_CHECK(a.is_array(), path, ": tensor '", name, "': ", field, " must be an array");
        std::vector<uint64_t> v;
        for (const json& x : a) {
          SPECDEC_CHECK(x.is_number_unsigned() && x.get<uint64_t>() <= uint64_t{1} << 62, path,
                        ": tensor '", name, "': ", field,
                        " must hold non-negative integers below 2^62, got ", x.dump());
          v.push_back(x.get<uint64_t>());
        }
        return v;
      };
      try {
        info.dtype = e["dtype"].get<std::string>();
        for (uint64_t d : naturals(e["shape"], "shape"))
          info.shape.push_back(static_cast<int64_t>(d));
        const auto off = naturals(e["data_offsets"], "data_offsets");
        SPECDEC_CHECK(off.size() == 2, path, ": tensor '", name, "': data_offsets needs 2 numbers");
        info.begin = off[0];
        info.end = off[1];
      } catch (const json::exception& ex) {
        throw Error(detail::concat(path, ": tensor '", name,
                                   "': malformed entry: ", detail::json_message(ex)));
      }
      const DtypeEntry* dt = find_dtype(info.dtype);
      SPECDEC_CHECK(dt != nullptr, path, ": tensor '", name, "' has unsupported dtype '",
                    info.dtype, "' (supported: F32, F16, BF16)");
      SPECDEC_CHECK(static_cast<int64_t>(info.shape.size()) <= lim.max_rank, path, ": tensor '",
                    name, "' has ", info.shape.size(), " dimensions, more than the limit of ",
                    lim.max_rank, " (Limits::max_rank)");
      uint64_t numel = 1;
      for (int64_t d : info.shape) {
        const auto u = static_cast<uint64_t>(d);
        SPECDEC_CHECK(u == 0 || numel <= (uint64_t{1} << 62) / u, path, ": tensor '", name,
                      "': the product of its dimensions overflows");
        numel *= u;
      }
      SPECDEC_CHECK(numel <= static_cast<uint64_t>(lim.max_tensor_elements), path, ": tensor '",
                    name, "' has ", numel, " elements, more than the limit of ",
                    lim.max_tensor_elements, " (Limits::max_tensor_elements)");
      SPECDEC_CHECK(info.begin <= info.end && info.end <= data_size, path, ": tensor '", name,
                    "' data_offsets [", info.begin, ", ", info.end,
                    ") lie outside the data section (", data_size, " bytes)");
      SPECDEC_CHECK(info.end - info.begin == numel * dt->size, path, ": tensor '", name, "' has ",
                    info.end - info.begin, " bytes but its shape and dtype need ",
                    numel * dt->size);
      ranges.emplace_back(info.begin, info.end);
      tensors_.emplace(name, std::move(info));
    }
    std::vector<size_t> order(ranges.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
    for (size_t i = 1; i < order.size(); ++i) {
      const auto& prev = ranges[order[i - 1]];
      const auto& cur = ranges[order[i]];
      SPECDEC_CHECK(
          cur.first >= prev.second || cur.first == cur.second || prev.first == prev.second, path,
          ": tensors overlap in the data section (bytes [", cur.first, ", ", prev.second,
          ") are claimed twice)");
    }
  } catch (...) {
    unmap_file(file);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() { unmap_file({fd_, map_, map_size_}); }

at::Tensor SafetensorsFile::load(const std::string& name, at::ScalarType dtype,
                                 c10::Device device) const {
  auto it = tensors_.find(name);
  SPECDEC_CHECK(it != tensors_.end(), path_, ": no tensor named '", name, "'");
  const TensorInfo& info = it->second;
  const DtypeEntry* dt = find_dtype(info.dtype);
  // Read from the file (read_at says why not through the mapping, which may be unaligned too).
  at::Tensor raw = at::empty(info.shape, at::TensorOptions().dtype(dt->type));
  read_at(fd_, static_cast<uint64_t>(data_ + info.begin - static_cast<const uint8_t*>(map_)),
          raw.data_ptr(), info.end - info.begin, path_);
  return raw.to(device, dtype);
}

WeightStore::WeightStore(const std::string& dir) : dir_(dir) {
  const std::string single = dir + "/model.safetensors";
  const std::string index = dir + "/model.safetensors.index.json";
  if (file_exists(single)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single));
    for (const auto& kv : files_[0]->tensors()) where_[kv.first] = 0;
    return;
  }
  SPECDEC_CHECK(file_exists(index), dir, ": no model.safetensors or model.safetensors.index.json");
  json j;
  try {
    j = detail::parse_json_bounded(read_text_file(index), index);
  } catch (const json::exception& e) {
    throw Error(detail::concat(index, ": invalid JSON: ", detail::json_message(e)));
  }
  SPECDEC_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index,
                ": missing object 'weight_map'");
  std::map<std::string, size_t> shard_index;
  for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
    SPECDEC_CHECK(it->is_string(), index, ": weight_map['", it.key(), "'] must be a file name");
    const std::string shard = it->get<std::string>();
    SPECDEC_CHECK(shard.find('/') == std::string::npos, index, ": shard name '", shard,
                  "' must be a plain file name");
    auto s = shard_index.find(shard);
    if (s == shard_index.end()) {
      files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + shard));
      s = shard_index.emplace(shard, files_.size() - 1).first;
    }
    SPECDEC_CHECK(files_[s->second]->contains(it.key()), index, ": tensor '", it.key(),
                  "' is mapped to ", shard, " but that file does not hold it");
    where_[it.key()] = s->second;
  }
  // Hugging Face loads every tensor of each shard the index names, whether it lists it or not.
  for (size_t f = 0; f < files_.size(); ++f)
    for (const auto& kv : files_[f]->tensors()) where_.emplace(kv.first, f);
}

const TensorInfo& WeightStore::info(const std::string& name) const {
  auto it = where_.find(name);
  SPECDEC_CHECK(it != where_.end(), dir_, ": checkpoint has no tensor named '", name, "'");
  return files_[it->second]->tensors().at(name);
}

at::Tensor WeightStore::load(const std::string& name, at::ScalarType dtype, c10::Device device,
                             const std::vector<int64_t>& expected_shape) const {
  auto it = where_.find(name);
  SPECDEC_CHECK(it != where_.end(), dir_, ": checkpoint has no tensor named '", name, "'");
  const SafetensorsFile& f = *files_[it->second];
  check_shape(f.path(), name, f.tensors().at(name).shape, expected_shape, "config.json");
  return f.load(name, dtype, device);
}

at::ScalarType WeightStore::stored_dtype(const std::string& name) const {
  const std::string& dt = info(name).dtype;
  return dt == "BF16" ? at::kBFloat16 : dt == "F16" ? at::kHalf : at::kFloat;
}

void check_shape(const std::string& source, const std::string& name,
                 const std::vector<int64_t>& actual, const std::vector<int64_t>& expected,
                 const std::string& implied_by) {
  if (expected.empty() || actual == expected) return;
  auto fmt = [](const std::vector<int64_t>& s) {
    std::string r = "[";
    for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
    return r + "]";
  };
  throw Error(detail::concat(source, ": tensor '", name, "' has shape ", fmt(actual), " but ",
                             implied_by, " implies ", fmt(expected)));
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> n;
  for (const auto& kv : where_) n.push_back(kv.first);
  return n;
}

void save_safetensors(const std::string& path, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<at::Tensor> cpu;
  for (const auto& kv : tensors) {
    const DtypeEntry* dt = find_dtype(kv.second.scalar_type());
    SPECDEC_CHECK(dt != nullptr, path, ": cannot save tensor '", kv.first, "' of dtype ",
                  kv.second.scalar_type());
    at::Tensor t = kv.second.to(at::kCPU).contiguous();
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * dt->size;
    header[kv.first] = {{"dtype", dt->name},
                        {"shape", t.sizes().vec()},
                        {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    cpu.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keep the data section 8-byte aligned
  write_file_atomic(path, [&](std::ostream& out) {
    const uint64_t n = text.size();
    char len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    out.write(len, 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : cpu)
      out.write(static_cast<const char*>(t.data_ptr()),
                static_cast<std::streamsize>(t.numel() * t.element_size()));
  });
}

at::ScalarType parse_dtype(const std::string& name) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  if (name == "float16" || name == "fp16") return at::kHalf;
  throw Error("unsupported dtype '" + name + "' (supported: float32, bfloat16, float16)");
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kBFloat16:
      return "bfloat16";
    case at::kHalf:
      return "float16";
    default:
      return std::string(c10::toString(dtype));
  }
}

}  // namespace specdec
