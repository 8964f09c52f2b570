/* gguf.h — a bounds-checked reader for GGUF v2/v3 files (llama.cpp's model format).

   The file is untrusted input: every length, count, offset and type is checked against
   the bytes actually present, and a malformed file gives an error sentence, never a crash
   or an out-of-bounds read. Strings inside the file are NOT NUL-terminated; they are
   returned as (pointer, length) pairs that point into the file's bytes.

   Layout (GGUF v3): "GGUF" u32 version u64 n_tensors u64 n_kv, then n_kv key/value
   pairs, then n_tensors tensor infos (name, n_dims, ne[n_dims] u64, type u32, offset u64),
   then padding to `general.alignment` (default 32), then the tensor data. */
#ifndef LLM_GGUF_H
#define LLM_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* Metadata value types (GGUF spec numbering). */
enum gguf_value_type {
    GGUF_VT_UINT8 = 0, GGUF_VT_INT8 = 1, GGUF_VT_UINT16 = 2, GGUF_VT_INT16 = 3,
    GGUF_VT_UINT32 = 4, GGUF_VT_INT32 = 5, GGUF_VT_FLOAT32 = 6, GGUF_VT_BOOL = 7,
    GGUF_VT_STRING = 8, GGUF_VT_ARRAY = 9, GGUF_VT_UINT64 = 10, GGUF_VT_INT64 = 11,
    GGUF_VT_FLOAT64 = 12, GGUF_VT_COUNT_ = 13
};

/* ggml tensor types this reader can size (the ones that appear in common GGUF files).
   Only GGML_T_F32, GGML_T_Q4_1 and GGML_T_Q8_0 can be dequantized (quant.h). */
enum ggml_tensor_type {
    GGML_T_F32 = 0, GGML_T_F16 = 1, GGML_T_Q4_0 = 2, GGML_T_Q4_1 = 3,
    GGML_T_Q5_0 = 6, GGML_T_Q5_1 = 7, GGML_T_Q8_0 = 8, GGML_T_Q8_1 = 9,
    GGML_T_Q2_K = 10, GGML_T_Q3_K = 11, GGML_T_Q4_K = 12, GGML_T_Q5_K = 13,
    GGML_T_Q6_K = 14, GGML_T_Q8_K = 15, GGML_T_BF16 = 30
};

typedef struct gguf_str {
    const char *ptr; /* into the file bytes; not NUL-terminated */
    uint64_t len;
} gguf_str;

typedef struct gguf_kv {
    gguf_str key;
    uint32_t type; /* enum gguf_value_type */
    union {
        uint64_t u64;   /* UINT8/16/32/64 and BOOL */
        int64_t i64;    /* INT8/16/32/64 */
        double f64;     /* FLOAT32/64 */
        gguf_str str;   /* STRING */
        struct {
            uint32_t elem_type;  /* never ARRAY: nested arrays are rejected */
            uint64_t n;
            const uint8_t *data; /* first element (numeric arrays: packed little-endian) */
            gguf_str *strs;      /* STRING arrays only: n entries, owned by the gguf_file */
        } arr;
    } v;
} gguf_kv;

typedef struct gguf_tensor {
    gguf_str name;
    uint32_t n_dims;       /* 1..4 */
    uint64_t ne[4];        /* ne[0] is the contiguous dimension; unused dims are 1 */
    uint32_t type;         /* enum ggml_tensor_type */
    uint64_t offset;       /* relative to the start of the data section */
    uint64_t n_elements;
    uint64_t n_bytes;
    const uint8_t *data;   /* checked: data + n_bytes lies inside the file */
} gguf_tensor;

typedef struct gguf_file {
    const uint8_t *bytes;  /* the whole file */
    size_t size_bytes;
    int mapped;            /* 1: bytes is an mmap that gguf_close unmaps */
    uint32_t version;
    uint64_t num_kv;
    uint64_t num_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;  /* start of the tensor data section in bytes */
} gguf_file;

/* Map `path` read-only and parse it. Returns 0 on success; otherwise nonzero with a
   sentence in err (which is always NUL-terminated when errlen > 0). */
int gguf_open(gguf_file *f, const char *path, char *err, size_t errlen);

/* Parse a GGUF image already in memory. The caller keeps `bytes` alive and unchanged
   until gguf_close(f). Same return convention as gguf_open. */
int gguf_parse(gguf_file *f, const void *bytes, size_t size_bytes, char *err, size_t errlen);

/* Release everything gguf_open / gguf_parse allocated (safe on a zeroed struct). */
void gguf_close(gguf_file *f);

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name);

/* Typed getters: 0 on success, -1 if absent or of a type that does not convert exactly
   (e.g. a negative INT32 read as u32). */
int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out);
int gguf_get_f32(const gguf_file *f, const char *key, float *out);
int gguf_get_bool(const gguf_file *f, const char *key, int *out);
int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out);
/* 1 when the string equals the NUL-terminated s. */
int gguf_str_eq(gguf_str a, const char *s);

/* Name of a ggml tensor type ("Q4_1"), or "?" when unknown. */
const char *ggml_type_name(uint32_t type);

#endif
