// C interface of libspecdec_spm, the small shared library that holds every call into SentencePiece.
//
// Debian's libsentencepiece exports its own bundled protobuf-lite 3.14, which clashes with the
// protobuf 3.21 that libtorch links: both in one process crash at start-up. libspecdec never links
// SentencePiece; it opens this shim with dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND), so the shim
// and SentencePiece resolve protobuf to their own copy and nothing of it reaches the global scope.
// Strings are UTF-8 with explicit lengths; buffers the shim returns are freed with
// specdec_spm_free_buffer. Functions that can fail return 0 on success, or -1 with *err set.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct specdec_spm specdec_spm;

// The version of this interface: a module of another (a stale install found first on the search
// path) is passed over. Raise it with any change below.
#define SPECDEC_SPM_INTERFACE 1
int specdec_spm_interface(void);

// Loads a serialized model (the bytes of tokenizer.model / spiece.model). add_dummy_prefix: -1
// keeps the model's setting, 0 or 1 overrides it (Hugging Face's non-legacy mode turns it off).
specdec_spm* specdec_spm_load(const char* data, size_t size, int add_dummy_prefix, char** err);
void specdec_spm_free(specdec_spm* sp);

int specdec_spm_size(const specdec_spm* sp);
// The piece of `id` (valid as long as the model), or NULL when out of range.
const char* specdec_spm_id_to_piece(const specdec_spm* sp, int id, size_t* len);
int specdec_spm_piece_to_id(const specdec_spm* sp, const char* piece, size_t len);
// 0 normal, 1 unknown, 2 control, 3 byte, 4 unused; -1 when `id` is out of range.
int specdec_spm_piece_type(const specdec_spm* sp, int id);
// unk, bos, eos, pad ids in that order (-1 when the model has none).
void specdec_spm_special_ids(const specdec_spm* sp, int out[4]);

int specdec_spm_encode(const specdec_spm* sp, const char* text, size_t len, int** ids, size_t* n,
                       char** err);
// Decodes pieces (strings, as Hugging Face's slow tokenizers pass them), not ids.
int specdec_spm_decode_pieces(const specdec_spm* sp, const char* const* pieces, const size_t* lens,
                              size_t n, char** out, size_t* out_len, char** err);
// Trains a model: `args` is SentencePiece's trainer command line ("--input=...
// --model_prefix=...").
int specdec_spm_train(const char* args, char** err);

void specdec_spm_free_buffer(void* p);

#ifdef __cplusplus
}
#endif
