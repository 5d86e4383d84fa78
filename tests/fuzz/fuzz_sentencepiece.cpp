// libFuzzer target: SentencePiece model bytes (tokenizer.model / spiece.model) through the shim's C
// interface, every call libspecdec makes: load (keeping and overriding the dummy prefix), the
// piece table, the special ids, encode and decode. Every input loads or returns an error.
//
// This target links the shim and SentencePiece directly, without libtorch: libspecdec opens the
// shim with RTLD_DEEPBIND (its protobuf clashes with libtorch's, see spm_shim.h), and the sanitizer
// runtimes refuse that flag.
#include <cstdint>
#include <string>
#include <vector>

#include "tokenizers/spm_shim.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (int dummy_prefix : {-1, 0}) {
    char* err = nullptr;
    specdec_spm* sp =
        specdec_spm_load(reinterpret_cast<const char*>(data), size, dummy_prefix, &err);
    specdec_spm_free_buffer(err);
    if (!sp) return 0;
    const int n = specdec_spm_size(sp);
    std::vector<std::string> pieces;
    for (int id = -1; id <= n; ++id) {
      size_t len = 0;
      const char* piece = specdec_spm_id_to_piece(sp, id, &len);
      (void)specdec_spm_piece_type(sp, id);
      if (!piece) continue;
      (void)specdec_spm_piece_to_id(sp, piece, len);
      if (pieces.size() < 64) pieces.emplace_back(piece, len);
    }
    int special[4];
    specdec_spm_special_ids(sp, special);
    for (const std::string& text :
         {std::string("Hello world"), std::string(" the hell\n\t \xc3\xa9 12"),
          std::string("a\0b", 3)}) {
      int* ids = nullptr;
      size_t count = 0;
      err = nullptr;
      if (specdec_spm_encode(sp, text.data(), text.size(), &ids, &count, &err) == 0) {
        for (size_t i = 0; i < count; ++i)
          if (ids[i] < 0 || ids[i] >= n) __builtin_trap();  // an id outside the model's own table
      }
      specdec_spm_free_buffer(ids);
      specdec_spm_free_buffer(err);
    }
    std::vector<const char*> ptrs;
    std::vector<size_t> lens;
    for (const auto& p : pieces) ptrs.push_back(p.data()), lens.push_back(p.size());
    char* out = nullptr;
    size_t out_len = 0;
    err = nullptr;
    (void)specdec_spm_decode_pieces(sp, ptrs.data(), lens.data(), ptrs.size(), &out, &out_len,
                                    &err);
    specdec_spm_free_buffer(out);
    specdec_spm_free_buffer(err);
    specdec_spm_free(sp);
  }
  return 0;
}
