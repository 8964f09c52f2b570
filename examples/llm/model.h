/* model.h — a llama-architecture decoder (SmolLM2-135M) in plain C, f32 on the CPU.

   Per layer: x += Wo·attn(rope(Wq·n), rope(Wk·n), Wv·n) with n = rmsnorm(x)·g1;
              x += Wdown·(silu(Wgate·m) * (Wup·m))   with m = rmsnorm(x)·g2.
   Then logits = Wout·(rmsnorm(x)·g), Wout = token_embd when the file has no output.weight.
   Weights are dequantized to f32 once at load (135M params -> ~540 MB).

   Attention and the KV cache are delegated to a kv_backend (kv_backend.h). Tokens can be
   run in batches (the matmuls see the whole batch, so each weight is read once per batch),
   but attention is always done token by token through the backend, in position order, so
   a batch of n tokens produces exactly what n single-token decode steps would. */
#ifndef LLM_MODEL_H
#define LLM_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "capture.h"
#include "gguf.h"
#include "kv_backend.h"

typedef struct model_config {
    int32_t num_layers, dim, ffn_dim, num_heads, num_kv_heads, head_dim, vocab_size;
    int32_t context_length; /* llama.context_length (training context) */
    float rope_theta;       /* llama.rope.freq_base */
    float rms_eps;          /* llama.attention.layer_norm_rms_epsilon */
    int tied_output;        /* 1: logits use token_embd (no output.weight in the file) */
} model_config;

/* RoPE pairing. llama.cpp's converter permutes the rows of Wq and Wk so that GGUF llama
   models use NORM: rotate dims (2i, 2i+1) by pos·theta^(-2i/D). NEOX rotates (i, i+D/2),
   the Hugging Face layout; on this file it is wrong (kept for the check in the README). */
typedef enum rope_style { ROPE_NORM = 0, ROPE_NEOX = 1 } rope_style;

typedef struct layer_weights {
    const float *attn_norm, *wq, *wk, *wv, *wo, *ffn_norm, *w_gate, *w_up, *w_down;
} layer_weights;

typedef struct model {
    model_config cfg;
    rope_style rope;
    float *arena;              /* all f32 weights */
    const float *token_embd;   /* [vocab][dim] */
    const float *output;       /* [vocab][dim], == token_embd when tied */
    const float *output_norm;
    layer_weights *layers;
    int32_t max_batch;
    float *x, *xn, *q, *k, *v, *att, *h1, *h2; /* scratch for max_batch tokens */
    qkv_capture_fn capture;
    void *capture_user;
} model;

/* Load from an open GGUF (the file may be closed afterwards). max_batch: the most tokens
   one model_forward call takes. NULL + error sentence on failure. */
model *model_load(const gguf_file *f, int32_t max_batch, char *err, size_t errlen);
void model_free(model *m);

/* kv_shape for a backend that holds max_tokens tokens of this model. */
kv_shape model_kv_shape(const model *m, int32_t max_tokens);

/* Run n (1..max_batch) tokens at positions pos0..pos0+n-1 through the model; kv already
   holds positions 0..pos0-1. logits: [n][vocab] when all_logits, else [vocab] for the last
   token; may be NULL (no output projection). Returns 0, or -1 if the backend failed. */
int model_forward(model *m, kv_backend *kv, const int32_t *tokens, int32_t n, int64_t pos0,
                  float *logits, int all_logits);

#endif
