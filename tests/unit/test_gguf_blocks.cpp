// GGUF block formats: dequantizers (by hand, against the gguf package, the real file), quantizers.
#include <ATen/ATen.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "specdec/specdec.hpp"
#include "test_util.hpp"

using namespace specdec;
using namespace specdec::test;
using nlohmann::json;

namespace {

std::string f16_bytes(float v) {
  const uint16_t bits = c10::Half(v).x;
  return std::string(reinterpret_cast<const char*>(&bits), 2);
}

std::vector<float> dequantize(GgmlType type, const std::string& block) {
  const int64_t n =
      ggml_block_elements(type) * static_cast<int64_t>(block.size()) / ggml_block_bytes(type);
  std::vector<float> out(n);
  ggml_dequantize(type, reinterpret_cast<const uint8_t*>(block.data()), out.data(), n);
  return out;
}

}  // namespace

// --- dequantizers on hand-built blocks: values worked out by hand from ggml's block layouts ---

TEST(GgufDequant, Q8_0ByHand) {
  std::string b = f16_bytes(0.5f);
  for (int j = 0; j < 32; ++j) b += static_cast<char>(static_cast<int8_t>(j - 16));
  const auto y = dequantize(GgmlType::kQ8_0, b);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(y[j], 0.5f * (j - 16)) << j;
}

TEST(GgufDequant, Q4_0AndQ4_1ByHand) {
  // Byte j holds element j in its low nibble and element j + 16 in its high nibble.
  std::string q;
  for (int j = 0; j < 16; ++j) q += static_cast<char>((j & 0x0F) | ((15 - j) << 4));
  const auto a = dequantize(GgmlType::kQ4_0, f16_bytes(2.0f) + q);  // (q - 8) * d
  const auto b = dequantize(GgmlType::kQ4_1, f16_bytes(0.25f) + f16_bytes(-1.0f) + q);  // q * d + m
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(a[j], 2.0f * (j - 8));
    EXPECT_EQ(a[j + 16], 2.0f * (15 - j - 8));
    EXPECT_EQ(b[j], 0.25f * j - 1.0f);
    EXPECT_EQ(b[j + 16], 0.25f * (15 - j) - 1.0f);
  }
}

TEST(GgufDequant, Q5_0AndQ5_1ByHand) {
  // qh bit j is the fifth bit of element j: set it for the odd elements only.
  uint32_t qh = 0;
  for (int j = 1; j < 32; j += 2) qh |= 1u << j;
  std::string h(reinterpret_cast<const char*>(&qh), 4), q;
  for (int j = 0; j < 16; ++j) q += static_cast<char>(3 | (12 << 4));   // low nibble 3, high 12
  const auto a = dequantize(GgmlType::kQ5_0, f16_bytes(1.0f) + h + q);  // (q - 16) * d
  const auto b =
      dequantize(GgmlType::kQ5_1, f16_bytes(0.5f) + f16_bytes(2.0f) + h + q);  // q * d + m
  for (int j = 0; j < 32; ++j) {
    const int v = (j < 16 ? 3 : 12) + (j % 2 ? 16 : 0);
    EXPECT_EQ(a[j], static_cast<float>(v - 16)) << j;
    EXPECT_EQ(b[j], 0.5f * v + 2.0f) << j;
  }
}

TEST(GgufDequant, Q4_KByHand) {
  // Scales: sub-blocks 0-3 read 6 bits of bytes 0-3 (scale) and 4-7 (min); 4-7 combine the low
  // nibbles / high nibbles of bytes 8-11 with the top 2 bits of bytes 0-3 / 4-7.
  std::string b = f16_bytes(1.0f) + f16_bytes(0.5f);
  uint8_t sc[12] = {1, 2, 3, 4, 10, 20, 30, 40, 0x21, 0x43, 0x65, 0x87};
  sc[0] |= 0x40;  // sub-block 4's scale gets 1 << 4 from bits 6-7 of byte 0
  b.append(reinterpret_cast<const char*>(sc), 12);
  for (int j = 0; j < 128; ++j) b += static_cast<char>(5 | (9 << 4));  // low nibble 5, high 9
  const auto y = dequantize(GgmlType::kQ4_K, b);
  const int scale[8] = {1, 2, 3, 4, 1 + 16, 3, 5, 7};
  const int mins[8] = {10, 20, 30, 40, 2, 4, 6, 8};
  for (int s = 0; s < 8; ++s) {
    const int q = s % 2 == 0 ? 5 : 9;  // even sub-blocks take the low nibbles of their 32 bytes
    for (int l = 0; l < 32; ++l)
      EXPECT_EQ(y[s * 32 + l], 1.0f * scale[s] * q - 0.5f * mins[s]) << "sub-block " << s;
  }
}

TEST(GgufDequant, Q5_KByHand) {
  // The Q4_K scales above; qh bit 2c (first half of 64-element chunk c) and 2c + 1 (second half)
  // add 16. Only bit 0 is set: sub-block 0 reads 5 + 16, the others their nibble alone.
  std::string b = f16_bytes(1.0f) + f16_bytes(0.5f);
  uint8_t sc[12] = {1, 2, 3, 4, 10, 20, 30, 40, 0x21, 0x43, 0x65, 0x87};
  sc[0] |= 0x40;
  b.append(reinterpret_cast<const char*>(sc), 12);
  b += std::string(32, '\x01');                                        // qh
  for (int j = 0; j < 128; ++j) b += static_cast<char>(5 | (9 << 4));  // ql
  const auto y = dequantize(GgmlType::kQ5_K, b);
  const int scale[8] = {1, 2, 3, 4, 1 + 16, 3, 5, 7};
  const int mins[8] = {10, 20, 30, 40, 2, 4, 6, 8};
  for (int s = 0; s < 8; ++s) {
    const int q = (s % 2 == 0 ? 5 : 9) + (s == 0 ? 16 : 0);
    for (int l = 0; l < 32; ++l)
      EXPECT_EQ(y[s * 32 + l], 1.0f * scale[s] * q - 0.5f * mins[s]) << "sub-block " << s;
  }
}

TEST(GgufDequant, F16AndBF16ByHand) {
  // float16 0x3C00 = 1, 0xC000 = -2, 0x3555 = 0.333251953125; bfloat16 0x3F80 = 1, 0xC040 = -3.
  const std::string h("\x00\x3C\x00\xC0\x55\x35", 6), bf("\x80\x3F\x40\xC0", 4);
  EXPECT_EQ(dequantize(GgmlType::kF16, h), (std::vector<float>{1.0f, -2.0f, 0.333251953125f}));
  EXPECT_EQ(dequantize(GgmlType::kBF16, bf), (std::vector<float>{1.0f, -3.0f}));
}

TEST(GgufDequant, Q6_KByHand) {
  // ql low nibbles 1, high 2; qh 0: q = 1 or 2 minus 32; int8 scales 1..16; d = 0.5.
  std::string b(128, static_cast<char>(1 | (2 << 4)));
  b += std::string(64, '\0');
  for (int i = 0; i < 16; ++i) b += static_cast<char>(i + 1);
  b += f16_bytes(0.5f);
  const auto y = dequantize(GgmlType::kQ6_K, b);
  for (int n = 0; n < 2; ++n)
    for (int l = 0; l < 32; ++l) {
      const int is = 8 * n + l / 16;
      EXPECT_EQ(y[128 * n + l], 0.5f * (is + 1) * (1 - 32));
      EXPECT_EQ(y[128 * n + l + 32], 0.5f * (is + 3) * (1 - 32));
      EXPECT_EQ(y[128 * n + l + 64], 0.5f * (is + 5) * (2 - 32));
      EXPECT_EQ(y[128 * n + l + 96], 0.5f * (is + 7) * (2 - 32));
    }
}

// Quantizing blocks whose bytes can be worked out by hand.
TEST(GgufQuantize, HandBuiltBlocks) {
  auto quantize = [](GgmlType type, const std::vector<float>& x) {
    std::vector<uint8_t> out(ggml_block_bytes(type));
    ggml_quantize(type, x.data(), out.data(), 32);
    return out;
  };
  // Q8_0: the largest magnitude 127 gives d = 1 (float16 0x3C00), q = round(x).
  std::vector<float> x(32);
  for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16) + (j % 2 ? 0.4f : -0.4f);
  x[31] = 127.0f;
  auto q8 = quantize(GgmlType::kQ8_0, x);
  EXPECT_EQ(q8[0], 0x00);
  EXPECT_EQ(q8[1], 0x3C);
  for (int j = 0; j < 31; ++j) EXPECT_EQ(static_cast<int8_t>(q8[2 + j]), j - 16) << j;
  EXPECT_EQ(q8[33], 127);
  // Q4_0: the signed extreme -8 gives d = -8 / -8 = 1; q = x + 8 (0 for -8, 8 for 0); element j in
  // the low nibble of byte j, element j + 16 in its high nibble.
  std::vector<float> z(32, 0.0f);
  z[0] = -8.0f;
  z[17] = 3.0f;
  auto q4 = quantize(GgmlType::kQ4_0, z);
  EXPECT_EQ(q4[0], 0x00);
  EXPECT_EQ(q4[1], 0x3C);
  EXPECT_EQ(q4[2], 0x80);  // q[0] = 0, q[16] = 8
  EXPECT_EQ(q4[3], 0xB8);  // q[1] = 8, q[17] = 11
  for (int j = 2; j < 16; ++j) EXPECT_EQ(q4[2 + j], 0x88) << j;
  // Q4_1: values 0..15 twice: min 0 (m = 0), d = 15 / 15 = 1, q = x.
  std::vector<float> r(32);
  for (int j = 0; j < 32; ++j) r[j] = static_cast<float>(j % 16);
  auto q41 = quantize(GgmlType::kQ4_1, r);
  EXPECT_EQ(q41[0], 0x00);
  EXPECT_EQ(q41[1], 0x3C);
  EXPECT_EQ(q41[2], 0x00);
  EXPECT_EQ(q41[3], 0x00);
  for (int j = 0; j < 16; ++j) EXPECT_EQ(q41[4 + j], j | (j << 4)) << j;
  // Round trip: dequantizing gives the values back exactly where they are representable.
  EXPECT_EQ(dequantize(GgmlType::kQ4_1, std::string(q41.begin(), q41.end())), r);
  EXPECT_THROW(quantize(GgmlType::kQ6_K, x), Error);
  EXPECT_THROW(ggml_quantize(GgmlType::kQ8_0, x.data(), q8.data(), 31), Error);
}

// --- against the gguf Python package (scripts/gguf_reference_blocks.py) ---

namespace {
json gguf_reference() { return json::parse(std::ifstream(test_data("gguf_reference.json"))); }
std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}
}  // namespace

TEST(GgufDequant, EveryTypeMatchesTheGgufPackage) {
  const json ref = gguf_reference();
  ASSERT_EQ(ref["blocks"].size(), 11u);
  for (const json& b : ref["blocks"]) {
    const auto type = static_cast<GgmlType>(b["type_id"].get<uint32_t>());
    const auto y = dequantize(type, unhex(b["bytes"].get<std::string>()));
    const auto expected = b["values"].get<std::vector<float>>();
    ASSERT_EQ(y.size(), expected.size()) << b["type"];
    for (size_t i = 0; i < y.size(); ++i)
      ASSERT_NEAR(y[i], expected[i], 1e-6 * std::max(1.0f, std::fabs(expected[i])))
          << b["type"] << " element " << i;
  }
}

TEST(GgufQuantize, EveryTypeMatchesTheGgufPackage) {
  const json ref = gguf_reference();
  ASSERT_EQ(ref["quantized"].size(), 3u);
  for (const json& q : ref["quantized"]) {
    const auto type = static_cast<GgmlType>(q["type_id"].get<uint32_t>());
    const auto x = q["values"].get<std::vector<float>>();
    const std::string expected = unhex(q["bytes"].get<std::string>());
    std::string bytes(expected.size(), '\0');
    ggml_quantize(type, x.data(), reinterpret_cast<uint8_t*>(bytes.data()),
                  static_cast<int64_t>(x.size()));
    EXPECT_EQ(bytes, expected) << q["type"];
  }
}

TEST(GgufDequant, EveryTensorOfTheRealFileMatchesTheGgufPackage) {
  const std::string path = smollm2_path();
  if (path.empty()) GTEST_SKIP() << "models/smollm2 absent: run scripts/get_models.sh";
  const GgufFile f(path);
  const json ref = gguf_reference();
  ASSERT_EQ(f.tensors().size(), ref["tensors"].size());
  for (const json& r : ref["tensors"]) {
    const std::string name = r["name"];
    ASSERT_TRUE(f.tensors().count(name)) << name;
    const GgufTensorInfo& info = f.tensors().at(name);
    EXPECT_EQ(ggml_type_name(static_cast<uint32_t>(info.type)), r["type"].get<std::string>())
        << name;
    EXPECT_EQ(info.shape, r["shape"].get<std::vector<int64_t>>()) << name;
    const at::Tensor x =
        f.load(name, at::kFloat, c10::Device(c10::kCPU)).to(at::kDouble).reshape(-1);
    const double sum = r["sum"], sum_sq = r["sum_sq"];
    EXPECT_NEAR(x.sum().item<double>(), sum, 1e-6 * std::max(1.0, std::sqrt(sum_sq))) << name;
    EXPECT_NEAR((x * x).sum().item<double>(), sum_sq, 1e-9 * std::max(1.0, sum_sq)) << name;
    const auto head = r["head"].get<std::vector<double>>(),
               tail = r["tail"].get<std::vector<double>>();
    for (size_t i = 0; i < head.size(); ++i) {
      EXPECT_EQ(x[i].item<double>(), head[i]) << name;
      EXPECT_EQ(x[x.numel() - 8 + i].item<double>(), tail[i]) << name;
    }
  }
}
