/* llm_common.h — what llm_generate, llm_eval and test_llm share: file reading, timing,
   model loading, and building a KV backend from command-line options. */
#ifndef LLM_COMMON_H
#define LLM_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "gguf.h"
#include "kv_backend.h"
#include "model.h"
#include "tokenizer.h"

/* Default model path, relative to the repository root (see fetch_model.sh). */
#define LLM_DEFAULT_MODEL "models/SmolLM2-135M-Instruct.Q4_1.gguf"

/* Whole file into a malloc'd NUL-terminated buffer; NULL on failure. */
char *read_file(const char *path, size_t *len);
double now_seconds(void);

/* Model + tokenizer from one GGUF file. */
typedef struct llm {
    gguf_file file;
    model *model;
    tokenizer *tok;
} llm;
int llm_open(llm *L, const char *path, int32_t max_batch, char *err, size_t errlen);
void llm_close(llm *L);

/* KV backend choice: "bf16" (default), "f32", "int2" (plain min-max INT2 of evicted rows),
   "int2-had" (Hadamard-rotated INT2), with the window and quantizer settings. */
typedef struct kv_options {
    const char *kind;
    kv_sim_desc sim;       /* sink / recent / demote interval (qdq filled by kv_create) */
    qdq_int2_desc int2;
} kv_options;

/* Parse one option at argv[*i] (advancing *i past its value). 1 if it was a KV option,
   0 if not, -1 on a bad value. Options: --kv KIND --sink N --recent N --demote N
   --group N --clip-k R --clip-v R */
int kv_parse_option(kv_options *o, int argc, char **argv, int *i);
const char *kv_options_usage(void);
kv_backend *kv_create(const kv_options *o, kv_shape shape);
/* One line describing the choice, e.g. "int2-had sink=64 recent=256 demote=8 group=64". */
void kv_describe(const kv_options *o, char *buf, size_t n);

#endif
