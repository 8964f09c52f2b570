/* kv_backend_oscar.h — the model's KV cache through oscar.h, as an engine would run it.

   Per layer the backend owns, in the memory of the oscar context it is given (host memory
   for an OSCAR_BACKEND_CPU context, device memory through the CUDA runtime for a CUDA one):
     - the engine's own bf16 window cache, unrotated: `sink` slots for positions 0..sink-1
       and a ring of `recent + demote_interval` slots for the newest tokens (NHD, one token
       per page, so the window tier's page table lists slots);
     - an INT2 pool (oscar_int2_pool_desc: HND, pages of 16 tokens, f16 scale+min, one
       group per row unless group_size says otherwise) where position p >= sink lives in
       slot p - sink;
     - the layer's R_k and R_v (V rotation NOT absorbed: oscar_quantize_kv rotates V on its
       way into INT2 and oscar_decode_run brings the INT2 part of the output back with R_v^T).

   append(layer, pos, k, v) writes the bf16 rows into the window cache, then demotes
   `demote_interval` tokens at a time when they leave the recent window: the oldest
   `demote_interval` recent tokens go through ONE oscar_quantize_kv call (rotate by R_k /
   R_v, clip, INT2, pack; src_slots = their ring slots, dst_slots = their INT2 slots).
   The schedule is the one of kv_backend_sim_create (kv_backend.h): demotion happens when
   the not-yet-demoted tokens after the sink number recent + demote_interval, so after each
   append the recent part holds recent .. recent + demote_interval - 1 tokens.
   One call covers the layer whose append triggers the demotion and every later layer that
   already holds the rows (oscar_quantize_desc.layers): the rows are `recent` positions old,
   so in decode, and in a batched forward with batches of at most `recent` tokens, that is
   all layers in one call; with larger batches later layers quantize at their own turn.
   What a query reads follows a per-layer view (next position to demote, per layer): the
   model runs a batch layer by layer (a layer over the whole batch, then the next), and a
   later layer's queries at earlier positions of the batch must still read those rows from
   the window, exactly as their decode steps would.

   attend(layer, pos, q, out) is one oscar_decode_run: q (rounded to bf16) against the INT2
   tier (q rotated by R_k inside oscar) and the window tier (sink + live recent slots),
   merged exactly; the bf16 output is returned as f32.

   "No windows": sink = -1, recent = -1 (none) and demote_interval = 1: every row is
   quantized as soon as it is appended, the current token included, and the decode plan has
   no window tier at all (everything the query reads is INT2). */
#ifndef LLM_KV_BACKEND_OSCAR_H
#define LLM_KV_BACKEND_OSCAR_H

#include <stddef.h>
#include <stdint.h>

#include "kv_backend.h"
#include "oscar.h"

typedef struct kv_oscar_desc {
    oscar_ctx *ctx;            /* *must* be set: a CPU-backend or CUDA context */
    int32_t sink_tokens;       /* default 64; -1 for none */
    int32_t recent_tokens;     /* default 256; -1 for none */
    int32_t demote_interval;   /* default 8 */
    int32_t page_size;         /* INT2 pool page size, default 16 */
    int32_t group_size;        /* scale groups along head_dim: default head_dim (one per row); 32, 64, ... */
    float k_clip_ratio;        /* 0 = off */
    float v_clip_ratio;
    const float *k_rotations;  /* host [num_layers][head_dim][head_dim] f32, x' = x @ R; NULL = none */
    const float *v_rotations;  /* likewise; copied at create */
} kv_oscar_desc;

/* NULL on failure, with a sentence in err. The shape's head_dim must be 64, 128 or 256. */
kv_backend *kv_backend_oscar_create(kv_shape shape, const kv_oscar_desc *desc, char *err, size_t errlen);

typedef struct kv_oscar_stats {
    int64_t quantize_calls;    /* oscar_quantize_kv calls (one per demotion) */
    int64_t demoted_rows;      /* token x layer rows sent to INT2 */
    int64_t decode_calls;      /* oscar_decode_run calls */
    double quantize_s, decode_s; /* wall time in those calls, including copies and (CUDA) synchronisation */
} kv_oscar_stats;

/* Statistics since create (b must come from kv_backend_oscar_create). */
void kv_backend_oscar_stats(const kv_backend *b, kv_oscar_stats *out);
/* The sentence of the last failure of append/attend ("" if none). */
const char *kv_backend_oscar_error(const kv_backend *b);
/* Copies one layer's INT2 K and V codes (whole pool) to host buffers of *bytes each
   (call with k = v = NULL to get *bytes). 0 on success. */
int kv_backend_oscar_read_codes(kv_backend *b, int32_t layer, uint8_t *k, uint8_t *v, size_t *bytes);

/* ------------------------------------------------------------------------------------ */
/* Quantize -> dequantize through oscar (CPU-backend context), for kv_backend_sim_create:
   the rows go through oscar_quantize_kv (rotation, clip, INT2, f16 scale+min pool) and
   oscar_dequantize_kv (bf16), then back by R^T in float64. The same numbers the oscar
   backend attends to, up to the bf16 rounding of the dequantized values. */
typedef struct kv_oscar_qdq {
    oscar_ctx *ctx;            /* a CPU-backend context */
    const float *k_rotations;  /* borrowed, [num_layers][D][D] or NULL */
    const float *v_rotations;
    float k_clip_ratio, v_clip_ratio;
    int32_t group_size;        /* 0 = head_dim */
    int failed;                /* set when an oscar call failed; the rows are then left unchanged */
    char err[256];
    /* scratch, owned */
    int32_t cap_rows;
    uint16_t *src, *deq;
    int32_t *slots;
    uint8_t *codes, *codes_v, *scales, *scales_v;
} kv_oscar_qdq;

/* A kv_qdq_fn; user is a kv_oscar_qdq* (zero-initialised, with ctx and the options set). */
void kv_oscar_qdq_fn(void *user, int32_t layer, int is_v, int64_t pos0, int32_t n_tokens, float *rows,
                     int32_t num_kv_heads, int32_t head_dim);
void kv_oscar_qdq_free(kv_oscar_qdq *q);

#endif
