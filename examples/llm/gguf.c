/* gguf.c — see gguf.h. Every read goes through the cursor `rd`, which checks the bytes
   that remain before touching them; counts are checked against the bytes that remain
   before anything is allocated, so a corrupt count cannot ask for gigabytes. */
#define _POSIX_C_SOURCE 200809L
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct rd {
    const uint8_t *p;
    size_t size;
    size_t pos;
    char *err;
    size_t errlen;
} rd;

static int fail(rd *r, const char *fmt, ...) {
    if (r->err && r->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(r->err, r->errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static size_t remaining(const rd *r) { return r->size - r->pos; }

static int rd_bytes(rd *r, void *dst, size_t n, const char *what) {
    if (n > remaining(r))
        return fail(r, "gguf: truncated file: %s needs %zu bytes at offset %zu, %zu left",
                    what, n, r->pos, remaining(r));
    memcpy(dst, r->p + r->pos, n);
    r->pos += n;
    return 0;
}

/* Little-endian readers (GGUF is little-endian; the host is assumed to be too, checked once). */
static int rd_u32(rd *r, uint32_t *v, const char *what) { return rd_bytes(r, v, 4, what); }
static int rd_u64(rd *r, uint64_t *v, const char *what) { return rd_bytes(r, v, 8, what); }

static int rd_str(rd *r, gguf_str *s, const char *what) {
    uint64_t len = 0;
    if (rd_u64(r, &len, what)) return -1;
    if (len > remaining(r))
        return fail(r, "gguf: %s: string length %llu at offset %zu exceeds the %zu bytes left",
                    what, (unsigned long long)len, r->pos - 8, remaining(r));
    s->ptr = (const char *)(r->p + r->pos);
    s->len = len;
    r->pos += (size_t)len;
    return 0;
}

static size_t scalar_size(uint32_t t) {
    switch (t) {
    case GGUF_VT_UINT8: case GGUF_VT_INT8: case GGUF_VT_BOOL: return 1;
    case GGUF_VT_UINT16: case GGUF_VT_INT16: return 2;
    case GGUF_VT_UINT32: case GGUF_VT_INT32: case GGUF_VT_FLOAT32: return 4;
    case GGUF_VT_UINT64: case GGUF_VT_INT64: case GGUF_VT_FLOAT64: return 8;
    default: return 0;
    }
}

/* Read one scalar of type t into kv->v. */
static int rd_scalar(rd *r, uint32_t t, gguf_kv *kv, const char *what) {
    uint8_t b[8] = {0};
    size_t n = scalar_size(t);
    if (rd_bytes(r, b, n, what)) return -1;
    switch (t) {
    case GGUF_VT_UINT8: kv->v.u64 = b[0]; break;
    case GGUF_VT_BOOL: kv->v.u64 = b[0] != 0; break;
    case GGUF_VT_INT8: kv->v.i64 = (int8_t)b[0]; break;
    case GGUF_VT_UINT16: { uint16_t x; memcpy(&x, b, 2); kv->v.u64 = x; } break;
    case GGUF_VT_INT16: { int16_t x; memcpy(&x, b, 2); kv->v.i64 = x; } break;
    case GGUF_VT_UINT32: { uint32_t x; memcpy(&x, b, 4); kv->v.u64 = x; } break;
    case GGUF_VT_INT32: { int32_t x; memcpy(&x, b, 4); kv->v.i64 = x; } break;
    case GGUF_VT_FLOAT32: { float x; memcpy(&x, b, 4); kv->v.f64 = x; } break;
    case GGUF_VT_UINT64: memcpy(&kv->v.u64, b, 8); break;
    case GGUF_VT_INT64: memcpy(&kv->v.i64, b, 8); break;
    case GGUF_VT_FLOAT64: memcpy(&kv->v.f64, b, 8); break;
    default: return fail(r, "gguf: %s: bad scalar type %u", what, t);
    }
    return 0;
}

static void print_key(char *buf, size_t n, gguf_str s) {
    size_t len = s.len < 80 ? (size_t)s.len : 80;
    size_t i;
    if (n == 0) return;
    if (len >= n) len = n - 1;
    for (i = 0; i < len; i++) {
        char c = s.ptr[i];
        buf[i] = (c >= 32 && c < 127) ? c : '?';
    }
    buf[len] = 0;
}

static int rd_kv(rd *r, gguf_kv *kv, uint64_t index) {
    char what[128];
    char key[96];
    snprintf(what, sizeof what, "metadata key #%llu", (unsigned long long)index);
    if (rd_str(r, &kv->key, what)) return -1;
    print_key(key, sizeof key, kv->key);
    snprintf(what, sizeof what, "metadata '%s'", key);
    if (rd_u32(r, &kv->type, what)) return -1;
    if (kv->type >= GGUF_VT_COUNT_)
        return fail(r, "gguf: %s: value type %u; expected 0..12", what, kv->type);
    if (kv->type == GGUF_VT_STRING) return rd_str(r, &kv->v.str, what);
    if (kv->type != GGUF_VT_ARRAY) return rd_scalar(r, kv->type, kv, what);

    if (rd_u32(r, &kv->v.arr.elem_type, what)) return -1;
    if (rd_u64(r, &kv->v.arr.n, what)) return -1;
    uint32_t et = kv->v.arr.elem_type;
    uint64_t n = kv->v.arr.n;
    kv->v.arr.data = r->p + r->pos;
    kv->v.arr.strs = NULL;
    if (et == GGUF_VT_ARRAY)
        return fail(r, "gguf: %s: nested arrays are not supported", what);
    if (et >= GGUF_VT_COUNT_)
        return fail(r, "gguf: %s: array element type %u; expected 0..12", what, et);
    if (et == GGUF_VT_STRING) {
        /* each string takes at least its 8-byte length: bound n before allocating */
        if (n > remaining(r) / 8)
            return fail(r, "gguf: %s: %llu strings cannot fit in the %zu bytes left", what,
                        (unsigned long long)n, remaining(r));
        kv->v.arr.strs = malloc((size_t)(n ? n : 1) * sizeof(gguf_str));
        if (!kv->v.arr.strs) return fail(r, "gguf: %s: out of memory", what);
        for (uint64_t i = 0; i < n; i++)
            if (rd_str(r, &kv->v.arr.strs[i], what)) return -1;
        return 0;
    }
    size_t es = scalar_size(et);
    if (n > remaining(r) / es)
        return fail(r, "gguf: %s: array of %llu x %zu-byte elements exceeds the %zu bytes left",
                    what, (unsigned long long)n, es, remaining(r));
    r->pos += (size_t)(n * es);
    return 0;
}

/* block size (elements) and bytes per block of a ggml type; 0 if unknown */
static void type_block(uint32_t t, uint64_t *blck, uint64_t *bytes) {
    static const struct { uint32_t t; uint32_t blck, bytes; } tab[] = {
        {GGML_T_F32, 1, 4},     {GGML_T_F16, 1, 2},     {GGML_T_BF16, 1, 2},
        {GGML_T_Q4_0, 32, 18},  {GGML_T_Q4_1, 32, 20},  {GGML_T_Q5_0, 32, 22},
        {GGML_T_Q5_1, 32, 24},  {GGML_T_Q8_0, 32, 34},  {GGML_T_Q2_K, 256, 84},
        {GGML_T_Q3_K, 256, 110}, {GGML_T_Q4_K, 256, 144}, {GGML_T_Q5_K, 256, 176},
        {GGML_T_Q6_K, 256, 210}, {GGML_T_Q8_K, 256, 292},
    };
    *blck = *bytes = 0;
    for (size_t i = 0; i < sizeof tab / sizeof tab[0]; i++)
        if (tab[i].t == t) { *blck = tab[i].blck; *bytes = tab[i].bytes; }
}

const char *ggml_type_name(uint32_t t) {
    switch (t) {
    case GGML_T_F32: return "F32"; case GGML_T_F16: return "F16"; case GGML_T_BF16: return "BF16";
    case GGML_T_Q4_0: return "Q4_0"; case GGML_T_Q4_1: return "Q4_1";
    case GGML_T_Q5_0: return "Q5_0"; case GGML_T_Q5_1: return "Q5_1";
    case GGML_T_Q8_0: return "Q8_0"; case GGML_T_Q8_1: return "Q8_1";
    case GGML_T_Q2_K: return "Q2_K"; case GGML_T_Q3_K: return "Q3_K";
    case GGML_T_Q4_K: return "Q4_K"; case GGML_T_Q5_K: return "Q5_K";
    case GGML_T_Q6_K: return "Q6_K"; case GGML_T_Q8_K: return "Q8_K";
    default: return "?";
    }
}

static int str_eq2(gguf_str a, gguf_str b) {
    return a.len == b.len && memcmp(a.ptr, b.ptr, (size_t)a.len) == 0;
}

static int rd_tensor(rd *r, gguf_tensor *t, uint64_t index) {
    char what[160];
    char name[96];
    snprintf(what, sizeof what, "tensor info #%llu", (unsigned long long)index);
    if (rd_str(r, &t->name, what)) return -1;
    print_key(name, sizeof name, t->name);
    snprintf(what, sizeof what, "tensor '%s'", name);
    if (rd_u32(r, &t->n_dims, what)) return -1;
    if (t->n_dims < 1 || t->n_dims > 4)
        return fail(r, "gguf: %s: n_dims = %u; expected 1..4", what, t->n_dims);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (rd_u64(r, &t->ne[d], what)) return -1;
        if (t->ne[d] == 0 || t->ne[d] > (UINT64_C(1) << 40) || nel > (UINT64_C(1) << 62) / t->ne[d])
            return fail(r, "gguf: %s: ne[%u] = %llu is zero or too large", what, d,
                        (unsigned long long)t->ne[d]);
        nel *= t->ne[d];
    }
    t->n_elements = nel;
    if (rd_u32(r, &t->type, what)) return -1;
    if (rd_u64(r, &t->offset, what)) return -1;
    uint64_t blck, bb;
    type_block(t->type, &blck, &bb);
    if (blck == 0)
        return fail(r, "gguf: %s: unknown ggml type %u", what, t->type);
    if (t->ne[0] % blck != 0)
        return fail(r, "gguf: %s: ne[0] = %llu is not a multiple of the %s block size %llu", what,
                    (unsigned long long)t->ne[0], ggml_type_name(t->type), (unsigned long long)blck);
    t->n_bytes = nel / blck * bb;
    return 0;
}

static int cmp_str(const void *a, const void *b) {
    const gguf_str *x = *(const gguf_str *const *)a, *y = *(const gguf_str *const *)b;
    size_t n = (size_t)(x->len < y->len ? x->len : y->len);
    int c = memcmp(x->ptr, y->ptr, n);
    return c ? c : (x->len < y->len ? -1 : x->len > y->len);
}

/* Sort pointers to the n strings found every `stride` bytes from `first`; fail on a repeat.
   O(n log n), so a file with millions of entries cannot stall the check. */
static int check_unique(rd *r, const gguf_str *first, size_t stride, uint64_t n, const char *what) {
    const gguf_str **v;
    int rc = 0;
    if (n < 2) return 0;
    v = malloc((size_t)n * sizeof *v);
    if (!v) return fail(r, "gguf: out of memory");
    for (uint64_t i = 0; i < n; i++) v[i] = (const gguf_str *)((const char *)first + i * stride);
    qsort(v, (size_t)n, sizeof *v, cmp_str);
    for (uint64_t i = 1; i < n && rc == 0; i++)
        if (str_eq2(*v[i - 1], *v[i])) {
            char name[96];
            print_key(name, sizeof name, *v[i]);
            rc = fail(r, "gguf: duplicate %s '%s'", what, name);
        }
    free(v);
    return rc;
}

static void free_tables(gguf_file *f) {
    if (f->kv)
        for (uint64_t i = 0; i < f->num_kv; i++)
            if (f->kv[i].type == GGUF_VT_ARRAY) free(f->kv[i].v.arr.strs);
    free(f->kv);
    free(f->tensors);
    f->kv = NULL;
    f->tensors = NULL;
    f->num_kv = f->num_tensors = 0;
}

static int parse(gguf_file *f, const void *bytes, size_t size_bytes, char *err, size_t errlen) {
    rd r = {(const uint8_t *)bytes, size_bytes, 0, err, errlen};
    uint32_t magic = 0;
    const uint32_t one = 1;
    memset(f, 0, sizeof *f);
    f->bytes = (const uint8_t *)bytes;
    f->size_bytes = size_bytes;
    if (err && errlen) err[0] = 0;
    if (*(const uint8_t *)&one != 1) return fail(&r, "gguf: big-endian hosts are not supported");

    if (!bytes) return fail(&r, "gguf: no data");
    if (rd_u32(&r, &magic, "magic")) return -1;
    if (memcmp(&magic, "GGUF", 4) != 0) return fail(&r, "gguf: bad magic (not a GGUF file)");
    if (rd_u32(&r, &f->version, "version")) return -1;
    if (f->version != 2 && f->version != 3)
        return fail(&r, "gguf: version %u; expected 2 or 3", f->version);
    if (rd_u64(&r, &f->num_tensors, "tensor count")) return -1;
    if (rd_u64(&r, &f->num_kv, "metadata count")) return -1;
    /* a key/value needs >= 13 bytes and a tensor info >= 28: bound counts before allocating */
    if (f->num_kv > remaining(&r) / 13)
        return fail(&r, "gguf: metadata count %llu cannot fit in a %zu-byte file",
                    (unsigned long long)f->num_kv, size_bytes);
    if (f->num_tensors > remaining(&r) / 28)
        return fail(&r, "gguf: tensor count %llu cannot fit in a %zu-byte file",
                    (unsigned long long)f->num_tensors, size_bytes);

    f->kv = calloc((size_t)(f->num_kv ? f->num_kv : 1), sizeof(gguf_kv));
    f->tensors = calloc((size_t)(f->num_tensors ? f->num_tensors : 1), sizeof(gguf_tensor));
    if (!f->kv || !f->tensors) return fail(&r, "gguf: out of memory");

    for (uint64_t i = 0; i < f->num_kv; i++) {
        if (rd_kv(&r, &f->kv[i], i)) { f->num_kv = i + 1; return -1; }
    }
    if (check_unique(&r, &f->kv[0].key, sizeof(gguf_kv), f->num_kv, "metadata key")) return -1;

    f->alignment = 32;
    const gguf_kv *al = gguf_find_kv(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_VT_UINT32 || al->v.u64 == 0 || (al->v.u64 & (al->v.u64 - 1)) != 0)
            return fail(&r, "gguf: general.alignment must be a power-of-two u32");
        f->alignment = al->v.u64;
    }

    for (uint64_t i = 0; i < f->num_tensors; i++)
        if (rd_tensor(&r, &f->tensors[i], i)) return -1;

    uint64_t data_off = ((uint64_t)r.pos + f->alignment - 1) / f->alignment * f->alignment;
    if (data_off > size_bytes)
        return fail(&r, "gguf: truncated file: tensor data section starts at %llu, file has %zu bytes",
                    (unsigned long long)data_off, size_bytes);
    f->data_offset = data_off;
    uint64_t data_size = size_bytes - data_off;

    for (uint64_t i = 0; i < f->num_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        char name[96];
        print_key(name, sizeof name, t->name);
        if (t->offset % f->alignment != 0)
            return fail(&r, "gguf: tensor '%s': offset %llu is not a multiple of the alignment %llu",
                        name, (unsigned long long)t->offset, (unsigned long long)f->alignment);
        if (t->offset > data_size || t->n_bytes > data_size - t->offset)
            return fail(&r, "gguf: truncated file: tensor '%s' needs bytes [%llu, %llu) of a %llu-byte data section",
                        name, (unsigned long long)t->offset, (unsigned long long)(t->offset + t->n_bytes),
                        (unsigned long long)data_size);
        t->data = f->bytes + data_off + t->offset;
    }
    if (check_unique(&r, &f->tensors[0].name, sizeof(gguf_tensor), f->num_tensors, "tensor name"))
        return -1;
    return 0;
}

int gguf_parse(gguf_file *f, const void *bytes, size_t size_bytes, char *err, size_t errlen) {
    if (parse(f, bytes, size_bytes, err, errlen) == 0) return 0;
    free_tables(f);
    return -1;
}

int gguf_open(gguf_file *f, const char *path, char *err, size_t errlen) {
    struct stat st;
    int fd;
    void *p;
    memset(f, 0, sizeof *f);
    if (err && errlen) err[0] = 0;
    fd = open(path, O_RDONLY);
    if (fd < 0) {
        if (err && errlen) snprintf(err, errlen, "gguf: cannot open '%s': %s", path, strerror(errno));
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
        if (err && errlen) snprintf(err, errlen, "gguf: '%s' is not a non-empty regular file", path);
        close(fd);
        return -1;
    }
    p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        if (err && errlen) snprintf(err, errlen, "gguf: cannot mmap '%s': %s", path, strerror(errno));
        return -1;
    }
    if (gguf_parse(f, p, (size_t)st.st_size, err, errlen) != 0) {
        munmap(p, (size_t)st.st_size);
        memset(f, 0, sizeof *f);
        return -1;
    }
    f->mapped = 1;
    return 0;
}

void gguf_close(gguf_file *f) {
    free_tables(f);
    if (f->mapped && f->bytes) munmap((void *)f->bytes, f->size_bytes);
    memset(f, 0, sizeof *f);
}

int gguf_str_eq(gguf_str a, const char *s) {
    size_t n = strlen(s);
    return a.len == n && memcmp(a.ptr, s, n) == 0;
}

const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->num_kv; i++)
        if (gguf_str_eq(f->kv[i].key, key)) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->num_tensors; i++)
        if (gguf_str_eq(f->tensors[i].name, name)) return &f->tensors[i];
    return NULL;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv) return -1;
    switch (kv->type) {
    case GGUF_VT_UINT8: case GGUF_VT_UINT16: case GGUF_VT_UINT32: case GGUF_VT_UINT64:
        if (kv->v.u64 > UINT32_MAX) return -1;
        *out = (uint32_t)kv->v.u64;
        return 0;
    case GGUF_VT_INT8: case GGUF_VT_INT16: case GGUF_VT_INT32: case GGUF_VT_INT64:
        if (kv->v.i64 < 0 || kv->v.i64 > (int64_t)UINT32_MAX) return -1;
        *out = (uint32_t)kv->v.i64;
        return 0;
    default: return -1;
    }
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || (kv->type != GGUF_VT_FLOAT32 && kv->type != GGUF_VT_FLOAT64)) return -1;
    *out = (float)kv->v.f64;
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_VT_BOOL) return -1;
    *out = kv->v.u64 != 0;
    return 0;
}

int gguf_get_str(const gguf_file *f, const char *key, gguf_str *out) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (!kv || kv->type != GGUF_VT_STRING) return -1;
    *out = kv->v.str;
    return 0;
}
