/* tokenizer.h — GPT-2 style byte-level BPE, built from a GGUF file's metadata
   (tokenizer.ggml.model = "gpt2": tokens, token_type, merges).

   Encoding follows llama.cpp for tokenizer.ggml.pre = "smollm" (the same as the model's
   Hugging Face tokenizer: Digits(individual) then ByteLevel):
     1. optional: split out special tokens (token_type CONTROL or USER_DEFINED) written in
        the text, e.g. "<|im_start|>";
     2. split every Unicode number codepoint (\p{N}) into its own piece;
     3. split each piece with the GPT-2 regex
          's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
     4. map each piece's bytes through GPT-2's bytes_to_unicode and apply the merges,
        lowest rank first (leftmost on ties).
   Decoding maps the token strings back to bytes, so decode(encode(s)) == s for any text
   whose bytes all have a token. SmolLM2's vocabulary has no token for 21 bytes (0x04 0x06
   0x13 0x14 0x16 0x1D 0xC0 0xC1 0xF1 0xF2 0xF5..0xFF); like llama.cpp and HF, the encoder
   drops them. Valid UTF-8 text without those control characters round-trips exactly. */
#ifndef LLM_TOKENIZER_H
#define LLM_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"

typedef struct tokenizer tokenizer;

/* Build from the GGUF metadata. Returns NULL and an error sentence on failure. */
tokenizer *tokenizer_load(const gguf_file *f, char *err, size_t errlen);
void tokenizer_free(tokenizer *t);

int32_t tokenizer_vocab_size(const tokenizer *t);
int32_t tokenizer_bos(const tokenizer *t);  /* -1 if the file names none */
int32_t tokenizer_eos(const tokenizer *t);
int tokenizer_is_special(const tokenizer *t, int32_t id);
/* Id of the token whose text is exactly s, or -1. */
int32_t tokenizer_find(const tokenizer *t, const char *s);

/* Encode len bytes of text. *out is malloc'd (free it); *n_out tokens. With parse_special,
   special-token texts in the input become their ids; otherwise they are plain text.
   Returns 0, or -1 on out-of-memory. */
int tokenizer_encode(const tokenizer *t, const char *text, size_t len, int parse_special,
                     int32_t **out, size_t *n_out);

/* The raw bytes of one token (special tokens: their text). NULL for a bad id. */
const char *tokenizer_token_bytes(const tokenizer *t, int32_t id, size_t *len);

/* Decode n tokens into a malloc'd NUL-terminated buffer (*len excludes the NUL). -1 on a bad
   id or out-of-memory. */
int tokenizer_decode(const tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len);

#endif
