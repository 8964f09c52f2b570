/* capture.h — record post-RoPE q, k, v of every token and layer (calibration input).

   The model calls a qkv_capture_fn for each (layer, token) just before handing k and v to
   the KV backend. Use it directly to accumulate statistics in memory (e.g. OSCAR's
   attention-aware covariances, OSCAR-SPEC.md §6.3), or use the file writer below.

   File format (little-endian), written by qkv_capture_open / qkv_capture_write:
     header, 64 bytes: char magic[8] = "QKVCAP1\0"; u32 num_layers, num_heads,
       num_kv_heads, head_dim, dtype (0 = f32, 1 = bf16); u32 reserved[3];
       u64 num_records (patched on close); u64 reserved2[2]
     then num_records records: u32 layer, u32 seq, i64 pos, then
       q [num_heads*head_dim], k [num_kv_heads*head_dim], v [num_kv_heads*head_dim]
       in dtype. `seq` numbers the sequences (eval windows); pos restarts at 0 in each.
   Records come in processing order (for a batch of tokens: layer-major). Dims are in RoPE
   NORM order (pairs 2i, 2i+1; see kv_backend.h). dev/read_capture.py reads it. */
#ifndef LLM_CAPTURE_H
#define LLM_CAPTURE_H

#include <stdint.h>
#include <stdio.h>

typedef void (*qkv_capture_fn)(void *user, int32_t layer, int64_t pos, const float *q,
                               const float *k, const float *v);

typedef struct qkv_capture {
    FILE *fp;
    int32_t num_layers, num_heads, num_kv_heads, head_dim;
    int dtype;              /* 0 f32, 1 bf16 */
    uint32_t seq;           /* set by the caller before each sequence */
    int64_t max_pos;        /* records with pos >= max_pos are skipped; <= 0: no limit */
    uint64_t num_records;
    int failed;             /* a write failed (disk full, ...) */
} qkv_capture;

/* Open path for writing. Returns 0 or -1 (errno set by fopen). */
int qkv_capture_open(qkv_capture *c, const char *path, int32_t num_layers, int32_t num_heads,
                     int32_t num_kv_heads, int32_t head_dim, int dtype);
/* A qkv_capture_fn; user is the qkv_capture*. */
void qkv_capture_write(void *user, int32_t layer, int64_t pos, const float *q, const float *k,
                       const float *v);
/* Patch num_records and close. Returns 0, or -1 if any write failed. */
int qkv_capture_close(qkv_capture *c);

#endif
