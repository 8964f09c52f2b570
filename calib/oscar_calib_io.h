/* calib/oscar_calib_io.h -- part of the oscar.h implementation (included by
   calib/oscar_calib.h): the file formats of rotations and activation dumps.

       zip       reader (stored entries, zip64, CRC-32 checked) and writer
       pickle    a small stack machine for the subset torch.save emits; it
                 never executes anything: the only callables it knows are
                 torch._utils._rebuild_tensor(_v2), _rebuild_parameter and
                 collections.OrderedDict, which it interprets itself
       torch     torch.save zip archives (<name>/data.pkl + <name>/data/<key>)
       json      a strict parser for safetensors headers
       safetensors reader and writer
       npy       reader (C order, little-endian floats)

   Every parser treats its input as untrusted: each read is bounds-checked
   against the buffer, every count is bounded by the input size (so memory
   stays O(input)), recursion depth is capped, and any violation returns
   OSCAR_STATUS_FORMAT_ERROR with a sentence naming the file part. */
#ifndef OSCAR_CALIB_IO_H_INCLUDED
#define OSCAR_CALIB_IO_H_INCLUDED

/* ---- element types of tensor files ------------------------------------------ */
enum {
    OSCAR__EL_F32 = 1,
    OSCAR__EL_F64,
    OSCAR__EL_F16,
    OSCAR__EL_BF16,
    OSCAR__EL_I8,
    OSCAR__EL_U8,
    OSCAR__EL_I16,
    OSCAR__EL_U16,
    OSCAR__EL_I32,
    OSCAR__EL_U32,
    OSCAR__EL_I64,
    OSCAR__EL_U64,
    OSCAR__EL_BOOL,
    OSCAR__EL_F8 /* float8 variants: sized, never converted */
};
OSCAR__PRIVATE size_t oscar__el_size(int32_t el) {
    switch (el) {
    case OSCAR__EL_F64: case OSCAR__EL_I64: case OSCAR__EL_U64: return 8;
    case OSCAR__EL_F32: case OSCAR__EL_I32: case OSCAR__EL_U32: return 4;
    case OSCAR__EL_F16: case OSCAR__EL_BF16: case OSCAR__EL_I16: case OSCAR__EL_U16: return 2;
    default: return 1;
    }
}
OSCAR__PRIVATE const char *oscar__el_name(int32_t el) {
    static const char *const names[] = {"?",   "f32", "f64", "f16", "bf16", "i8",   "u8", "i16",
                                        "u16", "i32", "u32", "i64", "u64",  "bool", "f8"};
    return el >= 0 && el <= OSCAR__EL_F8 ? names[el] : "?";
}
OSCAR__PRIVATE int oscar__el_is_float(int32_t el) {
    return el == OSCAR__EL_F32 || el == OSCAR__EL_F64 || el == OSCAR__EL_F16 || el == OSCAR__EL_BF16;
}
OSCAR__PRIVATE int oscar__el_is_int(int32_t el) {
    return el == OSCAR__EL_I32 || el == OSCAR__EL_I64 || el == OSCAR__EL_I16 || el == OSCAR__EL_U8 ||
           el == OSCAR__EL_I8 || el == OSCAR__EL_U16 || el == OSCAR__EL_U32;
}
/* One element as a double (unaligned-safe). Integer types beyond 2^53 lose bits. */
OSCAR__PRIVATE double oscar__el_get(const uint8_t *p, int32_t el) {
    switch (el) {
    case OSCAR__EL_F32: {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    case OSCAR__EL_F64: {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    case OSCAR__EL_F16: return oscar__f16_to_f32(OSCAR__CAST(uint16_t, p[0] | p[1] << 8));
    case OSCAR__EL_BF16: return oscar__bf16_to_f32(OSCAR__CAST(uint16_t, p[0] | p[1] << 8));
    case OSCAR__EL_I8: return OSCAR__CAST(int8_t, p[0]);
    case OSCAR__EL_U8: case OSCAR__EL_BOOL: return p[0];
    case OSCAR__EL_I16: return OSCAR__CAST(int16_t, OSCAR__CAST(uint16_t, p[0] | p[1] << 8));
    case OSCAR__EL_U16: return OSCAR__CAST(uint16_t, p[0] | p[1] << 8);
    case OSCAR__EL_I32: return OSCAR__CAST(int32_t, oscar__get_u32(p));
    case OSCAR__EL_U32: return oscar__get_u32(p);
    case OSCAR__EL_I64: return OSCAR__CAST(double, OSCAR__CAST(int64_t, oscar__get_u64(p)));
    case OSCAR__EL_U64: return OSCAR__CAST(double, oscar__get_u64(p));
    default: return 0.0;
    }
}
OSCAR__PRIVATE uint16_t oscar__get_u16(const uint8_t *p) { return OSCAR__CAST(uint16_t, p[0] | p[1] << 8); }

/* A strided view into a file's bytes, validated: every element
   base + (offset + Σ idx_i·stride_i)·el_size lies inside the buffer. */
#define OSCAR__MAX_NDIM 8
typedef struct oscar__tensor {
    int32_t el;
    int32_t ndim;
    int64_t shape[OSCAR__MAX_NDIM];
    int64_t stride[OSCAR__MAX_NDIM]; /* elements */
    int64_t offset;                  /* elements */
    const uint8_t *base;
} oscar__tensor;

OSCAR__PRIVATE int64_t oscar__tensor_numel(const oscar__tensor *t) {
    int64_t n = 1;
    int32_t i;
    for (i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
/* Element i (row-major order over the shape) as a double. */
OSCAR__PRIVATE double oscar__tensor_at(const oscar__tensor *t, int64_t i) {
    int64_t off = t->offset;
    int32_t d;
    for (d = t->ndim - 1; d >= 0; d--) {
        off += (i % t->shape[d]) * t->stride[d];
        i /= t->shape[d];
    }
    return oscar__el_get(t->base + OSCAR__CAST(size_t, off) * oscar__el_size(t->el), t->el);
}
/* Checks shape/stride/offset against `avail` elements; 0 if fine. Shapes
   and strides are capped at 2^40 so no product overflows. */
OSCAR__PRIVATE int oscar__tensor_check(const oscar__tensor *t, uint64_t avail) {
    const int64_t cap = OSCAR__CAST(int64_t, 1) << 40;
    int64_t last = t->offset, numel = 1;
    int32_t i;
    if (t->ndim < 0 || t->ndim > OSCAR__MAX_NDIM || t->offset < 0 || t->offset > cap) return -1;
    for (i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0 || t->shape[i] > cap || t->stride[i] < 0 || t->stride[i] > cap) return -1;
        if (t->shape[i] == 0) numel = 0;
    }
    if (numel == 0) return 0;
    for (i = 0; i < t->ndim; i++) {
        if (t->shape[i] - 1 > 0 && t->stride[i] > (INT64_MAX - last) / (t->shape[i] - 1)) return -1;
        last += (t->shape[i] - 1) * t->stride[i];
    }
    return OSCAR__CAST(uint64_t, last) < avail ? 0 : -1;
}
OSCAR__PRIVATE void oscar__tensor_contiguous(oscar__tensor *t) {
    int64_t s = 1;
    int32_t i;
    for (i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}
OSCAR__PRIVATE void oscar__shape_str(const oscar__tensor *t, char *out, size_t cap) {
    size_t len = 0;
    int32_t i;
    int k;
    out[0] = 0;
    k = snprintf(out, cap, "[");
    if (k > 0) len = OSCAR__MIN(OSCAR__CAST(size_t, k), cap - 1);
    for (i = 0; i < t->ndim && len + 2 < cap; i++) {
        k = snprintf(out + len, cap - len, "%s%lld", i ? ", " : "", OSCAR__CAST(long long, t->shape[i]));
        if (k > 0) len = OSCAR__MIN(len + OSCAR__CAST(size_t, k), cap - 1);
    }
    if (len + 1 < cap) snprintf(out + len, cap - len, "]");
}

/* ---- growable byte buffer ----------------------------------------------------- */
typedef struct oscar__bytes {
    const oscar_ctx *ctx;
    uint8_t *p;
    size_t n, cap;
    int oom;
} oscar__bytes;

OSCAR__PRIVATE void oscar__bytes_put(oscar__bytes *b, const void *data, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        uint8_t *grown;
        while (cap < b->n + n) cap *= 2;
        grown = OSCAR__CAST(uint8_t *, oscar__alloc(b->ctx, cap));
        if (!grown) {
            b->oom = 1;
            return;
        }
        if (b->n) memcpy(grown, b->p, b->n);
        oscar__free(b->ctx, b->p);
        b->p = grown;
        b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}
OSCAR__PRIVATE void oscar__bytes_u8(oscar__bytes *b, uint32_t v) {
    uint8_t c = OSCAR__CAST(uint8_t, v);
    oscar__bytes_put(b, &c, 1);
}
OSCAR__PRIVATE void oscar__bytes_u16(oscar__bytes *b, uint32_t v) {
    uint8_t c[2];
    c[0] = OSCAR__CAST(uint8_t, v);
    c[1] = OSCAR__CAST(uint8_t, v >> 8);
    oscar__bytes_put(b, c, 2);
}
OSCAR__PRIVATE void oscar__bytes_u32(oscar__bytes *b, uint32_t v) {
    uint8_t c[4];
    oscar__put_u32(c, v);
    oscar__bytes_put(b, c, 4);
}
OSCAR__PRIVATE void oscar__bytes_u64(oscar__bytes *b, uint64_t v) {
    uint8_t c[8];
    oscar__put_u64(c, v);
    oscar__bytes_put(b, c, 8);
}
OSCAR__PRIVATE void oscar__bytes_str(oscar__bytes *b, const char *s) { oscar__bytes_put(b, s, strlen(s)); }
OSCAR__PRIVATE void oscar__bytes_free(oscar__bytes *b) {
    oscar__free(b->ctx, b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ---- files ----------------------------------------------------------------------- */
OSCAR__PRIVATE oscar_status oscar__read_file(const oscar_ctx *ctx, const char *func, const char *path, uint8_t **out,
                                             size_t *out_size) {
    FILE *f;
    struct stat sb;
    uint8_t *buf;
    size_t size, got = 0;
    *out = NULL;
    *out_size = 0;
    if (!path) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "%s: path = NULL", func);
    f = fopen(path, "rb");
    if (!f) return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "%s: cannot open %s: %s", func, path, strerror(errno));
    if (fstat(fileno(f), &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < 0) {
        fclose(f);
        return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "%s: %s is not a regular file", func, path);
    }
    size = OSCAR__CAST(size_t, sb.st_size);
    buf = OSCAR__CAST(uint8_t *, oscar__alloc(ctx, size + 1));
    if (!buf) {
        fclose(f);
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory reading %s (%zu bytes)", func, path, size);
    }
    while (got < size) {
        size_t k = fread(buf + got, 1, size - got, f);
        if (k == 0) break;
        got += k;
    }
    fclose(f);
    if (got != size) {
        oscar__free(ctx, buf);
        return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "%s: short read of %s (%zu of %zu bytes)", func, path, got, size);
    }
    buf[size] = 0;
    *out = buf;
    *out_size = size;
    return OSCAR_OK;
}

OSCAR__PRIVATE oscar_status oscar__write_file_atomic(const oscar_ctx *ctx, const char *func, const char *path,
                                                     const uint8_t *data, size_t n) {
    char tmp[4200];
    int fd;
    if (!path || strlen(path) > 4000)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "%s: path is NULL or longer than 4000 bytes", func);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, OSCAR__CAST(long, getpid()));
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "%s: cannot create %s: %s", func, tmp, strerror(errno));
    if (oscar__write_all(fd, data, n) != 0 || fsync(fd) != 0) {
        int e = errno;
        close(fd);
        unlink(tmp);
        return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "%s: cannot write %s: %s", func, tmp, strerror(e));
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "%s: cannot rename %s to %s: %s", func, tmp, path, strerror(e));
    }
    return OSCAR_OK;
}

/* ---- CRC-32 (zip, reflected 0xEDB88320) ---------------------------------------------- */
OSCAR__PRIVATE uint32_t oscar__crc32(const uint8_t *p, size_t n) {
    uint32_t table[256], crc = 0xFFFFFFFFu, c, i, k;
    size_t j;
    for (i = 0; i < 256; i++) {
        c = i;
        for (k = 0; k < 8; k++) c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    for (j = 0; j < n; j++) crc = table[(crc ^ p[j]) & 0xFFu] ^ (crc >> 8);
    return crc ^ 0xFFFFFFFFu;
}

/* ---- zip reader ------------------------------------------------------------------------ */
typedef struct oscar__zip_entry {
    const uint8_t *name;
    size_t name_len;
    uint64_t local_offset;
    uint64_t size;  /* uncompressed */
    uint64_t csize; /* compressed */
    uint32_t crc;
    uint32_t method;
} oscar__zip_entry;

typedef struct oscar__zip {
    const oscar_ctx *ctx;
    const uint8_t *buf;
    size_t size;
    oscar__zip_entry *entries;
    size_t count;
} oscar__zip;

OSCAR__PRIVATE void oscar__zip_close(oscar__zip *z) {
    oscar__free(z->ctx, z->entries);
    z->entries = NULL;
    z->count = 0;
}

OSCAR__PRIVATE oscar_status oscar__zip_open(const oscar_ctx *ctx, const char *func, const uint8_t *buf, size_t size,
                                            oscar__zip *z) {
    size_t pos, lo, eocd = 0, p, end, i;
    uint64_t entries, cd_size, cd_off;
    int found = 0;
    memset(z, 0, sizeof *z);
    z->ctx = ctx;
    z->buf = buf;
    z->size = size;
    if (size < 22) return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: %zu bytes is too short for a zip archive", func, size);
    lo = size > 22 + 65535 ? size - 22 - 65535 : 0;
    for (pos = size - 22;; pos--) {
        if (oscar__get_u32(buf + pos) == 0x06054b50u && pos + 22 + oscar__get_u16(buf + pos + 20) <= size) {
            eocd = pos;
            found = 1;
            break;
        }
        if (pos == lo) break;
    }
    if (!found)
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                           "%s: no zip end-of-central-directory record (truncated or not a zip archive)", func);
    entries = oscar__get_u16(buf + eocd + 10);
    cd_size = oscar__get_u32(buf + eocd + 12);
    cd_off = oscar__get_u32(buf + eocd + 16);
    if (oscar__get_u16(buf + eocd + 4) != 0 && oscar__get_u16(buf + eocd + 4) != 0xFFFF)
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: multi-disk zip archives are not supported", func);
    if (entries == 0xFFFF || cd_size == 0xFFFFFFFFu || cd_off == 0xFFFFFFFFu) {
        uint64_t z64;
        if (eocd < 20 || oscar__get_u32(buf + eocd - 20) != 0x07064b50u)
            return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: zip64 locator missing", func);
        z64 = oscar__get_u64(buf + eocd - 20 + 8);
        if (size < 56 || z64 > size - 56 || oscar__get_u32(buf + z64) != 0x06064b50u)
            return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: zip64 end-of-central-directory record out of bounds",
                               func);
        entries = oscar__get_u64(buf + z64 + 32);
        cd_size = oscar__get_u64(buf + z64 + 40);
        cd_off = oscar__get_u64(buf + z64 + 48);
    }
    if (cd_off > size || cd_size > size - cd_off || entries > cd_size / 46)
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                           "%s: zip central directory (offset %llu, %llu bytes, %llu entries) does not fit in the %zu-byte "
                           "file (truncated?)",
                           func, OSCAR__CAST(unsigned long long, cd_off), OSCAR__CAST(unsigned long long, cd_size),
                           OSCAR__CAST(unsigned long long, entries), size);
    z->entries = OSCAR__CAST(oscar__zip_entry *,
                             oscar__calloc(ctx, sizeof(oscar__zip_entry) * OSCAR__CAST(size_t, entries + 1)));
    if (!z->entries) return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
    p = OSCAR__CAST(size_t, cd_off);
    end = OSCAR__CAST(size_t, cd_off + cd_size);
    for (i = 0; i < entries; i++) {
        oscar__zip_entry *e = &z->entries[i];
        size_t nlen, xlen, clen, x, xend;
        if (end - p < 46 || oscar__get_u32(buf + p) != 0x02014b50u) {
            oscar__zip_close(z);
            return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: zip central directory entry %zu is malformed", func, i);
        }
        e->method = oscar__get_u16(buf + p + 10);
        e->crc = oscar__get_u32(buf + p + 16);
        e->csize = oscar__get_u32(buf + p + 20);
        e->size = oscar__get_u32(buf + p + 24);
        nlen = oscar__get_u16(buf + p + 28);
        xlen = oscar__get_u16(buf + p + 30);
        clen = oscar__get_u16(buf + p + 32);
        e->local_offset = oscar__get_u32(buf + p + 42);
        if (end - p - 46 < nlen + xlen + clen) {
            oscar__zip_close(z);
            return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: zip central directory entry %zu overruns", func, i);
        }
        e->name = buf + p + 46;
        e->name_len = nlen;
        /* zip64 extra field: 64-bit values for the fields that hold 0xFFFFFFFF */
        x = p + 46 + nlen;
        xend = x + xlen;
        while (xend - x >= 4) {
            uint32_t id = oscar__get_u16(buf + x), sz = oscar__get_u16(buf + x + 2);
            size_t q = x + 4, qend;
            if (sz > xend - x - 4) break;
            qend = q + sz;
            if (id == 1) {
                if (e->size == 0xFFFFFFFFu && qend - q >= 8) e->size = oscar__get_u64(buf + q), q += 8;
                if (e->csize == 0xFFFFFFFFu && qend - q >= 8) e->csize = oscar__get_u64(buf + q), q += 8;
                if (e->local_offset == 0xFFFFFFFFu && qend - q >= 8) e->local_offset = oscar__get_u64(buf + q);
            }
            x = qend;
        }
        p += 46 + nlen + xlen + clen;
    }
    z->count = OSCAR__CAST(size_t, entries);
    return OSCAR_OK;
}

OSCAR__PRIVATE int oscar__zip_name_is(const oscar__zip_entry *e, const char *prefix, size_t plen, const char *suffix) {
    size_t slen = strlen(suffix);
    return e->name_len == plen + slen && memcmp(e->name, prefix, plen) == 0 && memcmp(e->name + plen, suffix, slen) == 0;
}
OSCAR__PRIVATE const oscar__zip_entry *oscar__zip_find(const oscar__zip *z, const char *prefix, size_t plen,
                                                       const char *suffix) {
    size_t i;
    for (i = 0; i < z->count; i++)
        if (oscar__zip_name_is(&z->entries[i], prefix, plen, suffix)) return &z->entries[i];
    return NULL;
}

/* The bytes of a stored entry, located through its local header and checked
   against its size and CRC-32. */
OSCAR__PRIVATE oscar_status oscar__zip_data(const oscar__zip *z, const char *func, const oscar__zip_entry *e,
                                            const uint8_t **out) {
    const uint8_t *b = z->buf;
    uint64_t lo = e->local_offset, data;
    int nlen = OSCAR__CAST(int, OSCAR__MIN(e->name_len, 200));
    if (e->method != 0)
        return oscar__fail(z->ctx, OSCAR_STATUS_FORMAT_ERROR,
                           "%s: zip entry %.*s is compressed (method %u); torch writes stored entries only", func, nlen,
                           OSCAR__RCAST(const char *, e->name), e->method);
    if (lo > z->size || z->size - lo < 30 || oscar__get_u32(b + lo) != 0x04034b50u)
        return oscar__fail(z->ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: zip local header of %.*s is missing or out of bounds",
                           func, nlen, OSCAR__RCAST(const char *, e->name));
    data = lo + 30 + oscar__get_u16(b + lo + 26) + oscar__get_u16(b + lo + 28);
    if (e->csize != e->size || data > z->size || e->size > z->size - data)
        return oscar__fail(z->ctx, OSCAR_STATUS_FORMAT_ERROR,
                           "%s: zip entry %.*s (%llu bytes) does not fit in the file (truncated?)", func, nlen,
                           OSCAR__RCAST(const char *, e->name), OSCAR__CAST(unsigned long long, e->size));
    if (oscar__crc32(b + data, OSCAR__CAST(size_t, e->size)) != e->crc)
        return oscar__fail(z->ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: zip entry %.*s fails its CRC-32 check (corrupted)", func,
                           nlen, OSCAR__RCAST(const char *, e->name));
    *out = b + data;
    return OSCAR_OK;
}

/* ---- zip writer (stored entries, data aligned to 64 bytes like torch.save) --------------- */
typedef struct oscar__zip_writer {
    oscar__bytes out, cdir;
    uint32_t count;
} oscar__zip_writer;

OSCAR__PRIVATE void oscar__zip_add(oscar__zip_writer *w, const char *name, const void *data, size_t n) {
    size_t nlen = strlen(name), off = w->out.n, pad;
    uint32_t crc = oscar__crc32(OSCAR__CAST(const uint8_t *, data), n);
    char zz[64];
    memset(zz, 'Z', sizeof zz);
    pad = (64 - (off + 30 + nlen + 4) % 64) % 64; /* an "FB" extra field pads the data to 64 bytes */
    oscar__bytes_u32(&w->out, 0x04034b50u);
    oscar__bytes_u16(&w->out, 20); /* version needed */
    oscar__bytes_u16(&w->out, 0);  /* flags */
    oscar__bytes_u16(&w->out, 0);  /* stored */
    oscar__bytes_u32(&w->out, 0);  /* time, date */
    oscar__bytes_u32(&w->out, crc);
    oscar__bytes_u32(&w->out, OSCAR__CAST(uint32_t, n));
    oscar__bytes_u32(&w->out, OSCAR__CAST(uint32_t, n));
    oscar__bytes_u16(&w->out, OSCAR__CAST(uint32_t, nlen));
    oscar__bytes_u16(&w->out, OSCAR__CAST(uint32_t, 4 + pad));
    oscar__bytes_put(&w->out, name, nlen);
    oscar__bytes_u16(&w->out, 0x4246); /* "FB" */
    oscar__bytes_u16(&w->out, OSCAR__CAST(uint32_t, pad));
    oscar__bytes_put(&w->out, zz, pad);
    oscar__bytes_put(&w->out, data, n);
    oscar__bytes_u32(&w->cdir, 0x02014b50u);
    oscar__bytes_u16(&w->cdir, 20); /* made by */
    oscar__bytes_u16(&w->cdir, 20); /* needed */
    oscar__bytes_u16(&w->cdir, 0);
    oscar__bytes_u16(&w->cdir, 0);
    oscar__bytes_u32(&w->cdir, 0);
    oscar__bytes_u32(&w->cdir, crc);
    oscar__bytes_u32(&w->cdir, OSCAR__CAST(uint32_t, n));
    oscar__bytes_u32(&w->cdir, OSCAR__CAST(uint32_t, n));
    oscar__bytes_u16(&w->cdir, OSCAR__CAST(uint32_t, nlen));
    oscar__bytes_u16(&w->cdir, 0); /* extra */
    oscar__bytes_u16(&w->cdir, 0); /* comment */
    oscar__bytes_u16(&w->cdir, 0); /* disk */
    oscar__bytes_u16(&w->cdir, 0); /* internal attributes */
    oscar__bytes_u32(&w->cdir, 0); /* external attributes */
    oscar__bytes_u32(&w->cdir, OSCAR__CAST(uint32_t, off));
    oscar__bytes_put(&w->cdir, name, nlen);
    w->count++;
}
OSCAR__PRIVATE void oscar__zip_finish(oscar__zip_writer *w) {
    size_t cd_off = w->out.n;
    oscar__bytes_put(&w->out, w->cdir.p, w->cdir.n);
    oscar__bytes_u32(&w->out, 0x06054b50u);
    oscar__bytes_u16(&w->out, 0);
    oscar__bytes_u16(&w->out, 0);
    oscar__bytes_u16(&w->out, w->count);
    oscar__bytes_u16(&w->out, w->count);
    oscar__bytes_u32(&w->out, OSCAR__CAST(uint32_t, w->cdir.n));
    oscar__bytes_u32(&w->out, OSCAR__CAST(uint32_t, cd_off));
    oscar__bytes_u16(&w->out, 0);
}

/* ---- pickle ------------------------------------------------------------------------------ */
enum {
    OSCAR__PV_NONE = 1,
    OSCAR__PV_BOOL,
    OSCAR__PV_INT,
    OSCAR__PV_FLOAT,
    OSCAR__PV_STR,
    OSCAR__PV_BYTES,
    OSCAR__PV_TUPLE,
    OSCAR__PV_LIST,
    OSCAR__PV_DICT,
    OSCAR__PV_GLOBAL,
    OSCAR__PV_STORAGE,
    OSCAR__PV_TENSOR
};

typedef struct oscar__pv {
    int32_t type;
    int32_t count;  /* entries of items (a dict holds count / 2 pairs) */
    int32_t cap;
    int32_t *items; /* value indices; dict: key, value, key, value, ... (later pairs win) */
    int64_t i;      /* INT/BOOL value; STORAGE element count; TENSOR index into the tensor table */
    double f;
    const char *s;  /* STR/BYTES bytes; GLOBAL module; STORAGE key */
    size_t n;
    const char *s2; /* GLOBAL name */
    size_t n2;
    int32_t el;     /* STORAGE element type */
} oscar__pv;

typedef struct oscar__ptensor {
    int32_t storage; /* value index */
    int32_t ndim;
    int64_t offset;
    int64_t shape[OSCAR__MAX_NDIM];
    int64_t stride[OSCAR__MAX_NDIM];
} oscar__ptensor;

typedef struct oscar__pickle {
    const oscar_ctx *ctx;
    oscar__pv *v;
    int32_t nv, capv;
    oscar__ptensor *t;
    int32_t nt, capt;
    int32_t root;
} oscar__pickle;

#define OSCAR__MAX_PICKLE_BYTES (OSCAR__CAST(size_t, 256) << 20)

OSCAR__PRIVATE void oscar__pickle_free(oscar__pickle *pk) {
    int32_t i;
    for (i = 0; i < pk->nv; i++) oscar__free(pk->ctx, pk->v[i].items);
    oscar__free(pk->ctx, pk->v);
    oscar__free(pk->ctx, pk->t);
    pk->v = NULL;
    pk->t = NULL;
    pk->nv = pk->nt = pk->capv = pk->capt = 0;
}

/* Grows an array of elem-sized records to hold need; 0 on success. */
OSCAR__PRIVATE int oscar__grow(const oscar_ctx *ctx, void **arr, int32_t *cap, int32_t need, size_t elem) {
    int32_t c = *cap ? *cap : 16;
    void *grown;
    if (need <= *cap) return 0;
    while (c < need) {
        if (c > INT32_MAX / 2) return -1;
        c *= 2;
    }
    grown = oscar__calloc(ctx, elem * OSCAR__CAST(size_t, c));
    if (!grown) return -1;
    if (*arr) memcpy(grown, *arr, elem * OSCAR__CAST(size_t, *cap));
    oscar__free(ctx, *arr);
    *arr = grown;
    *cap = c;
    return 0;
}

OSCAR__PRIVATE int32_t oscar__pv_new(oscar__pickle *pk, int32_t type) {
    if (oscar__grow(pk->ctx, OSCAR__RCAST(void **, &pk->v), &pk->capv, pk->nv + 1, sizeof(oscar__pv))) return -1;
    memset(&pk->v[pk->nv], 0, sizeof(oscar__pv));
    pk->v[pk->nv].type = type;
    return pk->nv++;
}
OSCAR__PRIVATE int oscar__pv_push_item(oscar__pickle *pk, int32_t container, int32_t item) {
    oscar__pv *c = &pk->v[container];
    if (oscar__grow(pk->ctx, OSCAR__RCAST(void **, &c->items), &c->cap, c->count + 1, sizeof(int32_t))) return -1;
    c->items[c->count++] = item;
    return 0;
}
OSCAR__PRIVATE int oscar__pv_str_is(const oscar__pickle *pk, int32_t i, const char *s) {
    const oscar__pv *v;
    if (i < 0 || i >= pk->nv) return 0;
    v = &pk->v[i];
    return v->type == OSCAR__PV_STR && v->n == strlen(s) && memcmp(v->s, s, v->n) == 0;
}
OSCAR__PRIVATE int oscar__pv_global_is(const oscar__pickle *pk, int32_t i, const char *module, const char *name) {
    const oscar__pv *v = &pk->v[i];
    return v->type == OSCAR__PV_GLOBAL && v->n == strlen(module) && memcmp(v->s, module, v->n) == 0 &&
           v->n2 == strlen(name) && memcmp(v->s2, name, v->n2) == 0;
}
/* Value of a string key in a dict (the last pair wins, as in Python), or -1. */
OSCAR__PRIVATE int32_t oscar__pv_dict_get(const oscar__pickle *pk, int32_t dict, const char *key) {
    const oscar__pv *d;
    int32_t i;
    if (dict < 0 || pk->v[dict].type != OSCAR__PV_DICT) return -1;
    d = &pk->v[dict];
    for (i = d->count / 2 - 1; i >= 0; i--)
        if (oscar__pv_str_is(pk, d->items[2 * i], key)) return d->items[2 * i + 1];
    return -1;
}

OSCAR__PRIVATE int32_t oscar__storage_el(const char *name, size_t n) {
    static const struct {
        const char *name;
        int32_t el;
    } map[] = {{"FloatStorage", OSCAR__EL_F32}, {"DoubleStorage", OSCAR__EL_F64}, {"HalfStorage", OSCAR__EL_F16},
               {"BFloat16Storage", OSCAR__EL_BF16}, {"IntStorage", OSCAR__EL_I32}, {"LongStorage", OSCAR__EL_I64},
               {"ShortStorage", OSCAR__EL_I16}, {"CharStorage", OSCAR__EL_I8}, {"ByteStorage", OSCAR__EL_U8},
               {"BoolStorage", OSCAR__EL_BOOL}};
    size_t i;
    for (i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strlen(map[i].name) == n && memcmp(map[i].name, name, n) == 0) return map[i].el;
    return 0;
}

/* Runs the pickle program; on success pk->root is the unpickled object. */
OSCAR__PRIVATE oscar_status oscar__pickle_run(oscar__pickle *pk, const char *func, const uint8_t *d, size_t len) {
    int32_t *stack = NULL, *marks = NULL, *memo = NULL;
    int32_t nstack = 0, capstack = 0, nmarks = 0, capmarks = 0, memo_cap = 0, memo_count = 0;
    size_t pos = 0, at = 0;
    oscar_status st = OSCAR_OK;
    const char *why = NULL;
    int32_t i, x, y;
    pk->root = -1;
    if (len > OSCAR__MAX_PICKLE_BYTES)
        return oscar__fail(pk->ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: pickle of %zu bytes is larger than the %zu-byte limit",
                           func, len, OSCAR__MAX_PICKLE_BYTES);
    memo_cap = OSCAR__CAST(int32_t, len + 1);
    memo = OSCAR__CAST(int32_t *, oscar__alloc(pk->ctx, sizeof(int32_t) * OSCAR__CAST(size_t, memo_cap)));
    if (!memo) return oscar__fail(pk->ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
    for (i = 0; i < memo_cap; i++) memo[i] = -1;

#define OSCAR__PK_FAIL(msg)                                                                                            \
    do {                                                                                                               \
        why = (msg);                                                                                                   \
        goto fail;                                                                                                     \
    } while (0)
#define OSCAR__PK_NEED(k)                                                                                              \
    do {                                                                                                               \
        if (len - pos < OSCAR__CAST(size_t, k)) OSCAR__PK_FAIL("truncated pickle");                                    \
    } while (0)
#define OSCAR__PK_PUSH(val)                                                                                            \
    do {                                                                                                               \
        int32_t oscar__pv_ = (val);                                                                                    \
        if (oscar__pv_ < 0) OSCAR__PK_FAIL("out of memory");                                                           \
        if (oscar__grow(pk->ctx, OSCAR__RCAST(void **, &stack), &capstack, nstack + 1, sizeof(int32_t)))               \
            OSCAR__PK_FAIL("out of memory");                                                                           \
        stack[nstack++] = oscar__pv_;                                                                                  \
    } while (0)
#define OSCAR__PK_POP(dst)                                                                                             \
    do {                                                                                                               \
        if (nstack <= (nmarks ? marks[nmarks - 1] : 0)) OSCAR__PK_FAIL("stack underflow");                             \
        (dst) = stack[--nstack];                                                                                       \
    } while (0)
#define OSCAR__PK_TOP(dst)                                                                                             \
    do {                                                                                                               \
        if (nstack <= (nmarks ? marks[nmarks - 1] : 0)) OSCAR__PK_FAIL("stack underflow");                             \
        (dst) = stack[nstack - 1];                                                                                     \
    } while (0)
#define OSCAR__PK_POP_MARK(dst)                                                                                        \
    do {                                                                                                               \
        if (nmarks == 0) OSCAR__PK_FAIL("no mark");                                                                    \
        (dst) = marks[--nmarks];                                                                                       \
    } while (0)

    for (;;) {
        uint8_t op;
        at = pos;
        OSCAR__PK_NEED(1);
        op = d[pos++];
        switch (op) {
        case 0x80: /* PROTO */
            OSCAR__PK_NEED(1);
            if (d[pos] > 5) OSCAR__PK_FAIL("unknown pickle protocol");
            pos++;
            break;
        case 0x95: /* FRAME */
            OSCAR__PK_NEED(8);
            pos += 8;
            break;
        case '.': /* STOP */
            OSCAR__PK_POP(pk->root);
            goto done;
        case '(': /* MARK */
            if (oscar__grow(pk->ctx, OSCAR__RCAST(void **, &marks), &capmarks, nmarks + 1, sizeof(int32_t)))
                OSCAR__PK_FAIL("out of memory");
            marks[nmarks++] = nstack;
            break;
        case '}': OSCAR__PK_PUSH(oscar__pv_new(pk, OSCAR__PV_DICT)); break;
        case ']': OSCAR__PK_PUSH(oscar__pv_new(pk, OSCAR__PV_LIST)); break;
        case ')': OSCAR__PK_PUSH(oscar__pv_new(pk, OSCAR__PV_TUPLE)); break;
        case 'N': OSCAR__PK_PUSH(oscar__pv_new(pk, OSCAR__PV_NONE)); break;
        case 0x88: case 0x89: /* NEWTRUE, NEWFALSE */
            x = oscar__pv_new(pk, OSCAR__PV_BOOL);
            if (x >= 0) pk->v[x].i = op == 0x88;
            OSCAR__PK_PUSH(x);
            break;
        case 'd': case 'l': case 't': { /* DICT, LIST, TUPLE from the mark */
            int32_t m, c;
            OSCAR__PK_POP_MARK(m);
            if (op == 'd' && (nstack - m) % 2) OSCAR__PK_FAIL("odd number of items for DICT");
            c = oscar__pv_new(pk, op == 'd' ? OSCAR__PV_DICT : op == 'l' ? OSCAR__PV_LIST : OSCAR__PV_TUPLE);
            if (c < 0) OSCAR__PK_FAIL("out of memory");
            for (i = m; i < nstack; i++)
                if (oscar__pv_push_item(pk, c, stack[i])) OSCAR__PK_FAIL("out of memory");
            nstack = m;
            OSCAR__PK_PUSH(c);
            break;
        }
        case 0x85: case 0x86: case 0x87: { /* TUPLE1..3 */
            int32_t k = op - 0x84, c, base;
            if (nstack - (nmarks ? marks[nmarks - 1] : 0) < k) OSCAR__PK_FAIL("stack underflow");
            c = oscar__pv_new(pk, OSCAR__PV_TUPLE);
            if (c < 0) OSCAR__PK_FAIL("out of memory");
            base = nstack - k;
            for (i = base; i < nstack; i++)
                if (oscar__pv_push_item(pk, c, stack[i])) OSCAR__PK_FAIL("out of memory");
            nstack = base;
            OSCAR__PK_PUSH(c);
            break;
        }
        case 's': /* SETITEM */
            OSCAR__PK_POP(y);
            OSCAR__PK_POP(x);
            {
                int32_t dct;
                OSCAR__PK_TOP(dct);
                if (pk->v[dct].type != OSCAR__PV_DICT) OSCAR__PK_FAIL("SETITEM on a non-dict");
                if (oscar__pv_push_item(pk, dct, x) || oscar__pv_push_item(pk, dct, y)) OSCAR__PK_FAIL("out of memory");
            }
            break;
        case 'u': case 'e': { /* SETITEMS, APPENDS */
            int32_t m, c;
            OSCAR__PK_POP_MARK(m);
            if (m < 1) OSCAR__PK_FAIL("SETITEMS/APPENDS with nothing below the mark");
            c = stack[m - 1];
            if (op == 'u' && (pk->v[c].type != OSCAR__PV_DICT || (nstack - m) % 2))
                OSCAR__PK_FAIL("SETITEMS on a non-dict or with an odd number of items");
            if (op == 'e' && pk->v[c].type != OSCAR__PV_LIST) OSCAR__PK_FAIL("APPENDS on a non-list");
            for (i = m; i < nstack; i++)
                if (oscar__pv_push_item(pk, c, stack[i])) OSCAR__PK_FAIL("out of memory");
            nstack = m;
            break;
        }
        case 'a': /* APPEND */
            OSCAR__PK_POP(y);
            OSCAR__PK_TOP(x);
            if (pk->v[x].type != OSCAR__PV_LIST) OSCAR__PK_FAIL("APPEND on a non-list");
            if (oscar__pv_push_item(pk, x, y)) OSCAR__PK_FAIL("out of memory");
            break;
        case 'q': case 'r': case 0x94: { /* BINPUT, LONG_BINPUT, MEMOIZE */
            uint32_t key;
            if (op == 'q') {
                OSCAR__PK_NEED(1);
                key = d[pos++];
            } else if (op == 'r') {
                OSCAR__PK_NEED(4);
                key = oscar__get_u32(d + pos);
                pos += 4;
            } else {
                key = OSCAR__CAST(uint32_t, memo_count);
            }
            OSCAR__PK_TOP(x);
            if (key >= OSCAR__CAST(uint32_t, memo_cap)) OSCAR__PK_FAIL("memo key out of range");
            if (memo[key] < 0) memo_count++;
            memo[key] = x;
            break;
        }
        case 'h': case 'j': { /* BINGET, LONG_BINGET */
            uint32_t key;
            if (op == 'h') {
                OSCAR__PK_NEED(1);
                key = d[pos++];
            } else {
                OSCAR__PK_NEED(4);
                key = oscar__get_u32(d + pos);
                pos += 4;
            }
            if (key >= OSCAR__CAST(uint32_t, memo_cap) || memo[key] < 0) OSCAR__PK_FAIL("memo key not set");
            OSCAR__PK_PUSH(memo[key]);
            break;
        }
        case 'K': case 'M': case 'J': case 0x8a: case 0x8b: { /* BININT1, BININT2, BININT, LONG1, LONG4 */
            int64_t val = 0;
            if (op == 'K') {
                OSCAR__PK_NEED(1);
                val = d[pos++];
            } else if (op == 'M') {
                OSCAR__PK_NEED(2);
                val = oscar__get_u16(d + pos);
                pos += 2;
            } else if (op == 'J') {
                OSCAR__PK_NEED(4);
                val = OSCAR__CAST(int32_t, oscar__get_u32(d + pos));
                pos += 4;
            } else {
                uint64_t n, u = 0, k;
                if (op == 0x8a) {
                    OSCAR__PK_NEED(1);
                    n = d[pos++];
                } else {
                    OSCAR__PK_NEED(4);
                    n = oscar__get_u32(d + pos);
                    pos += 4;
                }
                if (n > 8) OSCAR__PK_FAIL("integer wider than 64 bits");
                OSCAR__PK_NEED(n);
                for (k = 0; k < n; k++) u |= OSCAR__CAST(uint64_t, d[pos + k]) << (8 * k);
                if (n > 0 && n < 8 && (d[pos + n - 1] & 0x80)) u |= ~OSCAR__CAST(uint64_t, 0) << (8 * n); /* sign */
                memcpy(&val, &u, 8);
                pos += OSCAR__CAST(size_t, n);
            }
            x = oscar__pv_new(pk, OSCAR__PV_INT);
            if (x >= 0) pk->v[x].i = val;
            OSCAR__PK_PUSH(x);
            break;
        }
        case 'G': { /* BINFLOAT, big-endian */
            uint64_t u = 0;
            int k;
            OSCAR__PK_NEED(8);
            for (k = 0; k < 8; k++) u = u << 8 | d[pos + OSCAR__CAST(size_t, k)];
            pos += 8;
            x = oscar__pv_new(pk, OSCAR__PV_FLOAT);
            if (x >= 0) memcpy(&pk->v[x].f, &u, 8);
            OSCAR__PK_PUSH(x);
            break;
        }
        case 'X': case 0x8c: case 0x8d: case 'T': case 'U': case 'B': case 'C': case 0x8e: {
            /* BINUNICODE(4), SHORT_BINUNICODE(1), BINUNICODE8(8), BINSTRING(4), SHORT_BINSTRING(1),
               BINBYTES(4), SHORT_BINBYTES(1), BINBYTES8(8) */
            uint64_t n;
            int wide = (op == 'X' || op == 'T' || op == 'B') ? 4 : (op == 0x8d || op == 0x8e) ? 8 : 1;
            OSCAR__PK_NEED(wide);
            n = wide == 4 ? oscar__get_u32(d + pos) : wide == 8 ? oscar__get_u64(d + pos) : d[pos];
            pos += OSCAR__CAST(size_t, wide);
            if (n > len - pos) OSCAR__PK_FAIL("string runs past the end of the pickle");
            x = oscar__pv_new(pk, (op == 'B' || op == 'C' || op == 0x8e) ? OSCAR__PV_BYTES : OSCAR__PV_STR);
            if (x >= 0) {
                pk->v[x].s = OSCAR__RCAST(const char *, d + pos);
                pk->v[x].n = OSCAR__CAST(size_t, n);
            }
            pos += OSCAR__CAST(size_t, n);
            OSCAR__PK_PUSH(x);
            break;
        }
        case 'c': { /* GLOBAL "module\nname\n" */
            const uint8_t *nl1 = OSCAR__CAST(const uint8_t *, memchr(d + pos, '\n', len - pos)), *nl2;
            if (!nl1) OSCAR__PK_FAIL("unterminated GLOBAL");
            nl2 = OSCAR__CAST(const uint8_t *, memchr(nl1 + 1, '\n', OSCAR__CAST(size_t, d + len - nl1 - 1)));
            if (!nl2) OSCAR__PK_FAIL("unterminated GLOBAL");
            x = oscar__pv_new(pk, OSCAR__PV_GLOBAL);
            if (x >= 0) {
                pk->v[x].s = OSCAR__RCAST(const char *, d + pos);
                pk->v[x].n = OSCAR__CAST(size_t, nl1 - (d + pos));
                pk->v[x].s2 = OSCAR__RCAST(const char *, nl1 + 1);
                pk->v[x].n2 = OSCAR__CAST(size_t, nl2 - nl1 - 1);
            }
            pos = OSCAR__CAST(size_t, nl2 + 1 - d);
            OSCAR__PK_PUSH(x);
            break;
        }
        case 0x93: { /* STACK_GLOBAL */
            int32_t name, module, g;
            OSCAR__PK_POP(name);
            OSCAR__PK_POP(module);
            if (pk->v[name].type != OSCAR__PV_STR || pk->v[module].type != OSCAR__PV_STR)
                OSCAR__PK_FAIL("STACK_GLOBAL needs two strings");
            g = oscar__pv_new(pk, OSCAR__PV_GLOBAL);
            if (g >= 0) {
                pk->v[g].s = pk->v[module].s;
                pk->v[g].n = pk->v[module].n;
                pk->v[g].s2 = pk->v[name].s;
                pk->v[g].n2 = pk->v[name].n;
            }
            OSCAR__PK_PUSH(g);
            break;
        }
        case 'Q': { /* BINPERSID: ('storage', torch.XStorage, key, location, numel) */
            int32_t pid, s;
            const oscar__pv *tp;
            OSCAR__PK_POP(pid);
            tp = &pk->v[pid];
            if (tp->type != OSCAR__PV_TUPLE || tp->count < 5 || !oscar__pv_str_is(pk, tp->items[0], "storage") ||
                pk->v[tp->items[1]].type != OSCAR__PV_GLOBAL || pk->v[tp->items[2]].type != OSCAR__PV_STR ||
                pk->v[tp->items[4]].type != OSCAR__PV_INT || pk->v[tp->items[4]].i < 0)
                OSCAR__PK_FAIL("persistent id is not a torch storage ('storage', type, key, location, numel)");
            s = oscar__pv_new(pk, OSCAR__PV_STORAGE);
            if (s < 0) OSCAR__PK_FAIL("out of memory");
            tp = &pk->v[pid]; /* the table may have moved */
            pk->v[s].el = oscar__storage_el(pk->v[tp->items[1]].s2, pk->v[tp->items[1]].n2);
            if (!pk->v[s].el) OSCAR__PK_FAIL("unknown torch storage type");
            pk->v[s].s = pk->v[tp->items[2]].s;
            pk->v[s].n = pk->v[tp->items[2]].n;
            pk->v[s].i = pk->v[tp->items[4]].i;
            OSCAR__PK_PUSH(s);
            break;
        }
        case 'R': { /* REDUCE: only the callables torch.save uses, interpreted here */
            int32_t args, fn;
            const oscar__pv *a;
            OSCAR__PK_POP(args);
            OSCAR__PK_POP(fn);
            a = &pk->v[args];
            if (pk->v[fn].type != OSCAR__PV_GLOBAL || a->type != OSCAR__PV_TUPLE) OSCAR__PK_FAIL("REDUCE of a non-global");
            if (oscar__pv_global_is(pk, fn, "collections", "OrderedDict")) {
                if (a->count != 0) OSCAR__PK_FAIL("OrderedDict with arguments");
                OSCAR__PK_PUSH(oscar__pv_new(pk, OSCAR__PV_DICT));
            } else if (oscar__pv_global_is(pk, fn, "torch._utils", "_rebuild_tensor_v2") ||
                       oscar__pv_global_is(pk, fn, "torch._utils", "_rebuild_tensor")) {
                int32_t sz, sd, nd, tv;
                oscar__ptensor *t;
                if (a->count < 4 || pk->v[a->items[0]].type != OSCAR__PV_STORAGE ||
                    pk->v[a->items[1]].type != OSCAR__PV_INT || pk->v[a->items[2]].type != OSCAR__PV_TUPLE ||
                    pk->v[a->items[3]].type != OSCAR__PV_TUPLE)
                    OSCAR__PK_FAIL("_rebuild_tensor arguments are not (storage, offset, size, stride, ...)");
                sz = a->items[2];
                sd = a->items[3];
                nd = pk->v[sz].count;
                if (nd > OSCAR__MAX_NDIM || pk->v[sd].count != nd) OSCAR__PK_FAIL("tensor rank mismatch or above 8");
                if (oscar__grow(pk->ctx, OSCAR__RCAST(void **, &pk->t), &pk->capt, pk->nt + 1, sizeof(oscar__ptensor)))
                    OSCAR__PK_FAIL("out of memory");
                t = &pk->t[pk->nt];
                memset(t, 0, sizeof *t);
                t->storage = a->items[0];
                t->offset = pk->v[a->items[1]].i;
                t->ndim = nd;
                for (i = 0; i < nd; i++) {
                    int32_t e1 = pk->v[sz].items[i], e2 = pk->v[sd].items[i];
                    if (pk->v[e1].type != OSCAR__PV_INT || pk->v[e2].type != OSCAR__PV_INT)
                        OSCAR__PK_FAIL("tensor size/stride entries must be integers");
                    t->shape[i] = pk->v[e1].i;
                    t->stride[i] = pk->v[e2].i;
                }
                tv = oscar__pv_new(pk, OSCAR__PV_TENSOR);
                if (tv >= 0) pk->v[tv].i = pk->nt++;
                OSCAR__PK_PUSH(tv);
            } else if (oscar__pv_global_is(pk, fn, "torch._utils", "_rebuild_parameter")) {
                if (a->count < 1 || pk->v[a->items[0]].type != OSCAR__PV_TENSOR)
                    OSCAR__PK_FAIL("_rebuild_parameter of a non-tensor");
                OSCAR__PK_PUSH(a->items[0]);
            } else {
                OSCAR__PK_FAIL("call of a global that torch.save of tensors never emits (not executed)");
            }
            break;
        }
        case 'b': /* BUILD: the state of plain containers and tensors is ignored */
            OSCAR__PK_POP(y);
            OSCAR__PK_TOP(x);
            if (pk->v[x].type != OSCAR__PV_DICT && pk->v[x].type != OSCAR__PV_TENSOR)
                OSCAR__PK_FAIL("BUILD of an object");
            break;
        case '0': /* POP */
            if (nmarks && nstack == marks[nmarks - 1])
                nmarks--;
            else
                OSCAR__PK_POP(x);
            break;
        case '1': { /* POP_MARK */
            int32_t m;
            OSCAR__PK_POP_MARK(m);
            nstack = m;
            break;
        }
        case '2': /* DUP */
            OSCAR__PK_TOP(x);
            OSCAR__PK_PUSH(x);
            break;
        default: OSCAR__PK_FAIL("unsupported pickle opcode");
        }
    }
fail:
    st = oscar__fail(pk->ctx, strcmp(why, "out of memory") == 0 ? OSCAR_STATUS_OUT_OF_MEMORY : OSCAR_STATUS_FORMAT_ERROR,
                     "%s: pickle: %s (opcode 0x%02x at byte %zu of %zu)", func, why, at < len ? d[at] : 0, at, len);
done:
#undef OSCAR__PK_FAIL
#undef OSCAR__PK_NEED
#undef OSCAR__PK_PUSH
#undef OSCAR__PK_POP
#undef OSCAR__PK_TOP
#undef OSCAR__PK_POP_MARK
    oscar__free(pk->ctx, stack);
    oscar__free(pk->ctx, marks);
    oscar__free(pk->ctx, memo);
    return st;
}

/* ---- torch.save archives ------------------------------------------------------------------- */
typedef struct oscar__torch_file {
    oscar__zip zip;
    oscar__pickle pk;
    const char *prefix; /* "<name>/" inside the archive (points into the zip) */
    size_t prefix_len;
} oscar__torch_file;

OSCAR__PRIVATE void oscar__torch_close(oscar__torch_file *tf) {
    oscar__pickle_free(&tf->pk);
    oscar__zip_close(&tf->zip);
}

OSCAR__PRIVATE oscar_status oscar__torch_open(const oscar_ctx *ctx, const char *func, const uint8_t *buf, size_t size,
                                              oscar__torch_file *tf) {
    const oscar__zip_entry *pkl = NULL;
    const uint8_t *data;
    oscar_status st;
    size_t i;
    memset(tf, 0, sizeof *tf);
    tf->pk.ctx = ctx;
    st = oscar__zip_open(ctx, func, buf, size, &tf->zip);
    if (st != OSCAR_OK) return st;
    for (i = 0; i < tf->zip.count && !pkl; i++) {
        const oscar__zip_entry *e = &tf->zip.entries[i];
        if (e->name_len >= 8 && memcmp(e->name + e->name_len - 8, "data.pkl", 8) == 0 &&
            (e->name_len == 8 || e->name[e->name_len - 9] == '/')) {
            const uint8_t *slash = OSCAR__CAST(const uint8_t *, memchr(e->name, '/', e->name_len));
            /* only <name>/data.pkl (or a bare data.pkl) is the archive's root record */
            if (e->name_len == 8 || slash == e->name + e->name_len - 9) pkl = e;
        }
    }
    if (!pkl) {
        oscar__zip_close(&tf->zip);
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: zip archive has no <name>/data.pkl: not a torch.save file",
                           func);
    }
    tf->prefix = OSCAR__RCAST(const char *, pkl->name);
    tf->prefix_len = pkl->name_len - 8;
    st = oscar__zip_data(&tf->zip, func, pkl, &data);
    if (st == OSCAR_OK) st = oscar__pickle_run(&tf->pk, func, data, OSCAR__CAST(size_t, pkl->size));
    if (st != OSCAR_OK) oscar__torch_close(tf);
    return st;
}

/* Resolves a TENSOR value to a bounds-checked view of its storage record. */
OSCAR__PRIVATE oscar_status oscar__torch_tensor(const oscar__torch_file *tf, const char *func, int32_t value,
                                                const char *what, oscar__tensor *out) {
    const oscar__pv *v, *s;
    const oscar__ptensor *pt;
    const oscar__zip_entry *e = NULL;
    const uint8_t *data;
    oscar_status st;
    char key[96];
    size_t i, esz;
    memset(out, 0, sizeof *out);
    if (value < 0 || tf->pk.v[value].type != OSCAR__PV_TENSOR)
        return oscar__fail(tf->zip.ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: %s is not a tensor", func, what);
    v = &tf->pk.v[value];
    pt = &tf->pk.t[v->i];
    s = &tf->pk.v[pt->storage];
    if (s->n == 0 || s->n >= 64)
        return oscar__fail(tf->zip.ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: %s: bad storage key", func, what);
    snprintf(key, sizeof key, "data/%.*s", OSCAR__CAST(int, s->n), s->s);
    for (i = 0; i < tf->zip.count && !e; i++)
        if (oscar__zip_name_is(&tf->zip.entries[i], tf->prefix, tf->prefix_len, key)) e = &tf->zip.entries[i];
    if (!e)
        return oscar__fail(tf->zip.ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: %s: storage record %.*s%s is missing", func, what,
                           OSCAR__CAST(int, tf->prefix_len), tf->prefix, key);
    st = oscar__zip_data(&tf->zip, func, e, &data);
    if (st != OSCAR_OK) return st;
    esz = oscar__el_size(s->el);
    if (OSCAR__CAST(uint64_t, s->i) > e->size / esz)
        return oscar__fail(tf->zip.ctx, OSCAR_STATUS_FORMAT_ERROR,
                           "%s: %s: storage claims %lld elements but its record holds %llu bytes", func, what,
                           OSCAR__CAST(long long, s->i), OSCAR__CAST(unsigned long long, e->size));
    out->el = s->el;
    out->ndim = pt->ndim;
    out->offset = pt->offset;
    out->base = data;
    for (i = 0; i < OSCAR__CAST(size_t, pt->ndim); i++) {
        out->shape[i] = pt->shape[i];
        out->stride[i] = pt->stride[i];
    }
    if (oscar__tensor_check(out, OSCAR__CAST(uint64_t, s->i)) != 0)
        return oscar__fail(tf->zip.ctx, OSCAR_STATUS_FORMAT_ERROR,
                           "%s: %s: size/stride/offset reach outside its %lld-element storage", func, what,
                           OSCAR__CAST(long long, s->i));
    return OSCAR_OK;
}

/* ---- pickle writer (protocol 2, the opcodes torch.save uses) ------------------------------------ */
OSCAR__PRIVATE void oscar__pk_str(oscar__bytes *b, const char *s) {
    size_t n = strlen(s);
    oscar__bytes_u8(b, 'X');
    oscar__bytes_u32(b, OSCAR__CAST(uint32_t, n));
    oscar__bytes_put(b, s, n);
}
OSCAR__PRIVATE void oscar__pk_int(oscar__bytes *b, int64_t v) {
    if (v >= 0 && v < 256) {
        oscar__bytes_u8(b, 'K');
        oscar__bytes_u8(b, OSCAR__CAST(uint32_t, v));
    } else if (v >= 0 && v < 65536) {
        oscar__bytes_u8(b, 'M');
        oscar__bytes_u16(b, OSCAR__CAST(uint32_t, v));
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        oscar__bytes_u8(b, 'J');
        oscar__bytes_u32(b, OSCAR__CAST(uint32_t, OSCAR__CAST(int32_t, v)));
    } else {
        uint64_t u;
        memcpy(&u, &v, 8);
        oscar__bytes_u8(b, 0x8a);
        oscar__bytes_u8(b, 8);
        oscar__bytes_u64(b, u);
    }
}
OSCAR__PRIVATE void oscar__pk_global(oscar__bytes *b, const char *module, const char *name) {
    oscar__bytes_u8(b, 'c');
    oscar__bytes_str(b, module);
    oscar__bytes_u8(b, '\n');
    oscar__bytes_str(b, name);
    oscar__bytes_u8(b, '\n');
}
/* torch._utils._rebuild_tensor_v2(storage(torch.<storage>, key, numel), 0, shape, stride, False, OrderedDict()),
   as torch.save pickles a tensor; stride NULL: contiguous. */
OSCAR__PRIVATE void oscar__pk_tensor(oscar__bytes *b, int64_t key, const char *storage, const int64_t *shape,
                                     const int64_t *stride, int ndim, int64_t numel) {
    char k[32];
    int64_t contiguous[OSCAR__MAX_NDIM], s = 1;
    int i;
    for (i = ndim - 1; i >= 0; i--) {
        contiguous[i] = s;
        s *= shape[i];
    }
    snprintf(k, sizeof k, "%lld", OSCAR__CAST(long long, key));
    oscar__pk_global(b, "torch._utils", "_rebuild_tensor_v2");
    oscar__bytes_u8(b, '(');
    oscar__bytes_u8(b, '(');
    oscar__pk_str(b, "storage");
    oscar__pk_global(b, "torch", storage);
    oscar__pk_str(b, k);
    oscar__pk_str(b, "cpu");
    oscar__pk_int(b, numel);
    oscar__bytes_u8(b, 't');
    oscar__bytes_u8(b, 'Q');
    oscar__pk_int(b, 0);
    oscar__bytes_u8(b, '(');
    for (i = 0; i < ndim; i++) oscar__pk_int(b, shape[i]);
    oscar__bytes_u8(b, 't');
    oscar__bytes_u8(b, '(');
    for (i = 0; i < ndim; i++) oscar__pk_int(b, stride ? stride[i] : contiguous[i]);
    oscar__bytes_u8(b, 't');
    oscar__bytes_u8(b, 0x89);
    oscar__pk_global(b, "collections", "OrderedDict");
    oscar__bytes_u8(b, ')');
    oscar__bytes_u8(b, 'R');
    oscar__bytes_u8(b, 't');
    oscar__bytes_u8(b, 'R');
}

/* ---- JSON (safetensors headers) ---------------------------------------------------------------- */
enum { OSCAR__JV_OBJ = 1, OSCAR__JV_ARR, OSCAR__JV_STR, OSCAR__JV_NUM, OSCAR__JV_TRUE, OSCAR__JV_FALSE, OSCAR__JV_NULL };
typedef struct oscar__jv {
    int32_t type;
    int32_t first; /* first child (objects: key, value, key, value, ...), -1 if none */
    int32_t next;  /* next sibling, -1 if none */
    int32_t count; /* array items / object pairs */
    size_t start, end; /* strings: the raw bytes between the quotes; numbers: the literal */
    int32_t escaped;
} oscar__jv;
typedef struct oscar__json {
    const oscar_ctx *ctx;
    const char *text;
    size_t len, pos;
    oscar__jv *v;
    int32_t nv, cap;
    const char *why;
} oscar__json;

#define OSCAR__JSON_MAX_DEPTH 32

OSCAR__PRIVATE void oscar__json_ws(oscar__json *j) {
    while (j->pos < j->len &&
           (j->text[j->pos] == ' ' || j->text[j->pos] == '\t' || j->text[j->pos] == '\n' || j->text[j->pos] == '\r'))
        j->pos++;
}
OSCAR__PRIVATE int32_t oscar__json_new(oscar__json *j, int32_t type) {
    if (oscar__grow(j->ctx, OSCAR__RCAST(void **, &j->v), &j->cap, j->nv + 1, sizeof(oscar__jv))) {
        j->why = "out of memory";
        return -1;
    }
    memset(&j->v[j->nv], 0, sizeof(oscar__jv));
    j->v[j->nv].type = type;
    j->v[j->nv].first = j->v[j->nv].next = -1;
    return j->nv++;
}
OSCAR__PRIVATE int oscar__is_hex(char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
OSCAR__PRIVATE int32_t oscar__json_string(oscar__json *j) {
    int32_t s = oscar__json_new(j, OSCAR__JV_STR);
    if (s < 0) return -1;
    j->pos++; /* the opening quote */
    j->v[s].start = j->pos;
    while (j->pos < j->len && j->text[j->pos] != '"') {
        unsigned char c = OSCAR__CAST(unsigned char, j->text[j->pos]);
        if (c < 0x20) {
            j->why = "control character in a string";
            return -1;
        }
        if (c == '\\') {
            char e;
            j->v[s].escaped = 1;
            if (j->len - j->pos < 2) break;
            e = j->text[j->pos + 1];
            if (e == 'u') {
                int k;
                if (j->len - j->pos < 6) break;
                for (k = 2; k < 6; k++)
                    if (!oscar__is_hex(j->text[j->pos + OSCAR__CAST(size_t, k)])) {
                        j->why = "bad \\u escape";
                        return -1;
                    }
                j->pos += 6;
                continue;
            }
            if (e == 0 || !strchr("\"\\/bfnrt", e)) {
                j->why = "bad escape";
                return -1;
            }
            j->pos += 2;
            continue;
        }
        j->pos++;
    }
    if (j->pos >= j->len) {
        j->why = "unterminated string";
        return -1;
    }
    j->v[s].end = j->pos;
    j->pos++;
    return s;
}
OSCAR__PRIVATE int32_t oscar__json_value(oscar__json *j, int depth) {
    char c;
    int32_t v, last = -1, item;
    oscar__json_ws(j);
    if (j->pos >= j->len) {
        j->why = "unexpected end";
        return -1;
    }
    if (depth > OSCAR__JSON_MAX_DEPTH) {
        j->why = "nested too deeply";
        return -1;
    }
    c = j->text[j->pos];
    if (c == '"') return oscar__json_string(j);
    if (c == '{' || c == '[') {
        int obj = c == '{';
        v = oscar__json_new(j, obj ? OSCAR__JV_OBJ : OSCAR__JV_ARR);
        if (v < 0) return -1;
        j->pos++;
        oscar__json_ws(j);
        if (j->pos < j->len && j->text[j->pos] == (obj ? '}' : ']')) {
            j->pos++;
            return v;
        }
        for (;;) {
            if (obj) {
                int32_t key;
                oscar__json_ws(j);
                if (j->pos >= j->len || j->text[j->pos] != '"') {
                    j->why = "object key is not a string";
                    return -1;
                }
                key = oscar__json_string(j);
                if (key < 0) return -1;
                if (last < 0)
                    j->v[v].first = key;
                else
                    j->v[last].next = key;
                last = key;
                oscar__json_ws(j);
                if (j->pos >= j->len || j->text[j->pos] != ':') {
                    j->why = "expected ':'";
                    return -1;
                }
                j->pos++;
            }
            item = oscar__json_value(j, depth + 1);
            if (item < 0) return -1;
            if (last < 0)
                j->v[v].first = item;
            else
                j->v[last].next = item;
            last = item;
            j->v[v].count++;
            oscar__json_ws(j);
            if (j->pos < j->len && j->text[j->pos] == ',') {
                j->pos++;
                continue;
            }
            if (j->pos < j->len && j->text[j->pos] == (obj ? '}' : ']')) {
                j->pos++;
                return v;
            }
            j->why = obj ? "expected ',' or '}'" : "expected ',' or ']'";
            return -1;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        size_t p = j->pos;
        v = oscar__json_new(j, OSCAR__JV_NUM);
        if (v < 0) return -1;
        if (j->text[p] == '-') p++;
        if (p >= j->len || !(j->text[p] >= '0' && j->text[p] <= '9')) {
            j->why = "bad number";
            return -1;
        }
        while (p < j->len && ((j->text[p] >= '0' && j->text[p] <= '9') || j->text[p] == '.' || j->text[p] == 'e' ||
                              j->text[p] == 'E' || j->text[p] == '+' || j->text[p] == '-'))
            p++;
        j->v[v].start = j->pos;
        j->v[v].end = p;
        j->pos = p;
        return v;
    }
    if (j->len - j->pos >= 4 && memcmp(j->text + j->pos, "true", 4) == 0) {
        j->pos += 4;
        return oscar__json_new(j, OSCAR__JV_TRUE);
    }
    if (j->len - j->pos >= 5 && memcmp(j->text + j->pos, "false", 5) == 0) {
        j->pos += 5;
        return oscar__json_new(j, OSCAR__JV_FALSE);
    }
    if (j->len - j->pos >= 4 && memcmp(j->text + j->pos, "null", 4) == 0) {
        j->pos += 4;
        return oscar__json_new(j, OSCAR__JV_NULL);
    }
    j->why = "unexpected character";
    return -1;
}
/* Decodes a string value into out (NUL-terminated); -1 if it does not fit. */
OSCAR__PRIVATE int oscar__json_str(const oscar__json *j, int32_t s, char *out, size_t cap) {
    size_t p, n = 0;
    if (s < 0 || j->v[s].type != OSCAR__JV_STR || cap == 0) return -1;
    for (p = j->v[s].start; p < j->v[s].end; p++) {
        char c = j->text[p];
        if (n + 5 >= cap) return -1;
        if (c != '\\') {
            out[n++] = c;
            continue;
        }
        c = j->text[++p];
        if (c == 'u') {
            unsigned cp = 0;
            int k;
            for (k = 1; k <= 4; k++) {
                char h = j->text[p + OSCAR__CAST(size_t, k)];
                cp = cp * 16 + OSCAR__CAST(unsigned, h <= '9' ? h - '0' : (h | 32) - 'a' + 10);
            }
            p += 4;
            if (cp < 0x80)
                out[n++] = OSCAR__CAST(char, cp);
            else if (cp < 0x800) {
                out[n++] = OSCAR__CAST(char, 0xC0 | (cp >> 6));
                out[n++] = OSCAR__CAST(char, 0x80 | (cp & 0x3F));
            } else {
                out[n++] = OSCAR__CAST(char, 0xE0 | (cp >> 12));
                out[n++] = OSCAR__CAST(char, 0x80 | ((cp >> 6) & 0x3F));
                out[n++] = OSCAR__CAST(char, 0x80 | (cp & 0x3F));
            }
            continue;
        }
        out[n++] = c == 'b' ? '\b' : c == 'f' ? '\f' : c == 'n' ? '\n' : c == 'r' ? '\r' : c == 't' ? '\t' : c;
    }
    out[n] = 0;
    return OSCAR__CAST(int, n);
}
OSCAR__PRIVATE int oscar__json_str_is(const oscar__json *j, int32_t s, const char *want) {
    char buf[256];
    return oscar__json_str(j, s, buf, sizeof buf) >= 0 && strcmp(buf, want) == 0;
}
/* A non-negative integer literal (no sign, fraction or exponent) below 2^62. */
OSCAR__PRIVATE int oscar__json_u62(const oscar__json *j, int32_t v, int64_t *out) {
    size_t p;
    int64_t x = 0;
    if (v < 0 || j->v[v].type != OSCAR__JV_NUM || j->v[v].end == j->v[v].start) return -1;
    for (p = j->v[v].start; p < j->v[v].end; p++) {
        char c = j->text[p];
        if (c < '0' || c > '9' || x > (OSCAR__CAST(int64_t, 1) << 58)) return -1;
        x = x * 10 + (c - '0');
    }
    *out = x;
    return 0;
}
OSCAR__PRIVATE int32_t oscar__json_get(const oscar__json *j, int32_t obj, const char *key) {
    int32_t k;
    if (obj < 0 || j->v[obj].type != OSCAR__JV_OBJ) return -1;
    for (k = j->v[obj].first; k >= 0; k = j->v[j->v[k].next].next)
        if (oscar__json_str_is(j, k, key)) return j->v[k].next;
    return -1;
}
OSCAR__PRIVATE void oscar__json_escape(oscar__bytes *b, const char *s) {
    oscar__bytes_u8(b, '"');
    for (; *s; s++) {
        unsigned char c = OSCAR__CAST(unsigned char, *s);
        if (c == '"' || c == '\\') {
            oscar__bytes_u8(b, '\\');
            oscar__bytes_u8(b, c);
        } else if (c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", c);
            oscar__bytes_str(b, e);
        } else {
            oscar__bytes_u8(b, c);
        }
    }
    oscar__bytes_u8(b, '"');
}

/* ---- safetensors ------------------------------------------------------------------------------ */
#define OSCAR__ST_NAME_CAP 256
#define OSCAR__ST_MAX_HEADER (OSCAR__CAST(uint64_t, 100) << 20) /* the safetensors library's own limit */

typedef struct oscar__st_tensor {
    char name[OSCAR__ST_NAME_CAP];
    oscar__tensor t; /* contiguous */
    uint64_t nbytes;
} oscar__st_tensor;

typedef struct oscar__safetensors {
    const oscar_ctx *ctx;
    oscar__json json;
    int32_t metadata; /* json value of "__metadata__", or -1 */
    oscar__st_tensor *tensors;
    int32_t count;
} oscar__safetensors;

OSCAR__PRIVATE void oscar__st_close(oscar__safetensors *st) {
    oscar__free(st->ctx, st->json.v);
    oscar__free(st->ctx, st->tensors);
    st->json.v = NULL;
    st->tensors = NULL;
}

OSCAR__PRIVATE int32_t oscar__st_dtype(const char *s) {
    static const struct {
        const char *name;
        int32_t el;
    } map[] = {{"F32", OSCAR__EL_F32}, {"F64", OSCAR__EL_F64},   {"F16", OSCAR__EL_F16},   {"BF16", OSCAR__EL_BF16},
               {"I8", OSCAR__EL_I8},   {"U8", OSCAR__EL_U8},     {"I16", OSCAR__EL_I16},   {"U16", OSCAR__EL_U16},
               {"I32", OSCAR__EL_I32}, {"U32", OSCAR__EL_U32},   {"I64", OSCAR__EL_I64},   {"U64", OSCAR__EL_U64},
               {"BOOL", OSCAR__EL_BOOL}, {"F8_E5M2", OSCAR__EL_F8}, {"F8_E4M3", OSCAR__EL_F8}};
    size_t i;
    for (i = 0; i < sizeof map / sizeof map[0]; i++)
        if (strcmp(map[i].name, s) == 0) return map[i].el;
    return 0;
}

OSCAR__PRIVATE oscar_status oscar__st_open(const oscar_ctx *ctx, const char *func, const uint8_t *buf, size_t size,
                                           oscar__safetensors *st) {
    uint64_t hlen;
    size_t data_off, data_len;
    int32_t root, k;
    memset(st, 0, sizeof *st);
    st->ctx = ctx;
    st->metadata = -1;
    st->json.ctx = ctx;
    if (size < 10) return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: %zu bytes is too short for safetensors", func, size);
    hlen = oscar__get_u64(buf);
    if (hlen < 2 || hlen > OSCAR__ST_MAX_HEADER || hlen > size - 8)
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                           "%s: safetensors header length %llu does not fit the %zu-byte file (truncated?)", func,
                           OSCAR__CAST(unsigned long long, hlen), size);
    data_off = 8 + OSCAR__CAST(size_t, hlen);
    data_len = size - data_off;
    st->json.text = OSCAR__RCAST(const char *, buf + 8);
    st->json.len = OSCAR__CAST(size_t, hlen);
    root = oscar__json_value(&st->json, 0);
    if (root >= 0) {
        oscar__json_ws(&st->json);
        if (st->json.pos != st->json.len) {
            st->json.why = "trailing bytes after the header object";
            root = -1;
        } else if (st->json.v[root].type != OSCAR__JV_OBJ) {
            st->json.why = "header is not an object";
            root = -1;
        }
    }
    if (root < 0) {
        oscar_status e = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: safetensors header JSON: %s at byte %zu", func,
                                     st->json.why ? st->json.why : "malformed", st->json.pos);
        oscar__st_close(st);
        return e;
    }
    st->tensors = OSCAR__CAST(oscar__st_tensor *,
                              oscar__calloc(ctx, sizeof(oscar__st_tensor) * OSCAR__CAST(size_t, st->json.v[root].count + 1)));
    if (!st->tensors) {
        oscar__st_close(st);
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
    }
    for (k = st->json.v[root].first; k >= 0; k = st->json.v[st->json.v[k].next].next) {
        int32_t val = st->json.v[k].next, dt, shape, offs, e;
        oscar__st_tensor *t = &st->tensors[st->count];
        char dtype[32];
        int64_t begin = 0, endo = 0, numel = 1;
        const char *why = NULL;
        if (oscar__json_str(&st->json, k, t->name, sizeof t->name) < 0) {
            why = "tensor name longer than 255 bytes";
            goto bad;
        }
        if (strcmp(t->name, "__metadata__") == 0) {
            st->metadata = val;
            if (st->json.v[val].type != OSCAR__JV_OBJ) {
                why = "__metadata__ is not an object";
                goto bad;
            }
            continue;
        }
        dt = oscar__json_get(&st->json, val, "dtype");
        shape = oscar__json_get(&st->json, val, "shape");
        offs = oscar__json_get(&st->json, val, "data_offsets");
        if (dt < 0 || shape < 0 || offs < 0 || st->json.v[shape].type != OSCAR__JV_ARR ||
            st->json.v[offs].type != OSCAR__JV_ARR || st->json.v[offs].count != 2) {
            why = "entry lacks dtype, shape or data_offsets [begin, end]";
            goto bad;
        }
        if (oscar__json_str(&st->json, dt, dtype, sizeof dtype) < 0) dtype[0] = 0;
        t->t.el = oscar__st_dtype(dtype);
        if (t->t.el == 0) {
            why = "unknown dtype";
            goto bad;
        }
        if (st->json.v[shape].count > OSCAR__MAX_NDIM) {
            why = "rank above 8";
            goto bad;
        }
        t->t.ndim = st->json.v[shape].count;
        for (e = st->json.v[shape].first; e >= 0; e = st->json.v[e].next) {
            int64_t dim;
            int32_t i = 0, q;
            for (q = st->json.v[shape].first; q != e; q = st->json.v[q].next) i++;
            if (oscar__json_u62(&st->json, e, &dim) != 0 || dim > (OSCAR__CAST(int64_t, 1) << 40)) {
                why = "shape entry is not a non-negative integer";
                goto bad;
            }
            t->t.shape[i] = dim;
            if (dim && numel > (OSCAR__CAST(int64_t, 1) << 50) / dim) {
                why = "shape too large";
                goto bad;
            }
            numel *= dim;
        }
        if (oscar__json_u62(&st->json, st->json.v[offs].first, &begin) != 0 ||
            oscar__json_u62(&st->json, st->json.v[st->json.v[offs].first].next, &endo) != 0 || begin > endo ||
            OSCAR__CAST(uint64_t, endo) > data_len) {
            why = "data_offsets outside the data section";
            goto bad;
        }
        t->nbytes = OSCAR__CAST(uint64_t, endo - begin);
        if (t->nbytes != OSCAR__CAST(uint64_t, numel) * oscar__el_size(t->t.el)) {
            why = "data_offsets span differs from shape x dtype size";
            goto bad;
        }
        t->t.base = buf + data_off + begin;
        oscar__tensor_contiguous(&t->t);
        st->count++;
        continue;
    bad: {
        char name[64];
        oscar_status es;
        snprintf(name, sizeof name, "%.60s", t->name);
        es = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: safetensors tensor \"%s\": %s", func, name, why);
        oscar__st_close(st);
        return es;
    }
    }
    return OSCAR_OK;
}
OSCAR__PRIVATE const oscar__st_tensor *oscar__st_find(const oscar__safetensors *st, const char *name) {
    int32_t i;
    for (i = 0; i < st->count; i++)
        if (strcmp(st->tensors[i].name, name) == 0) return &st->tensors[i];
    return NULL;
}
/* A metadata string ("" if absent). */
OSCAR__PRIVATE void oscar__st_meta(const oscar__safetensors *st, const char *key, char *out, size_t cap) {
    int32_t v = oscar__json_get(&st->json, st->metadata, key);
    out[0] = 0;
    if (v >= 0 && oscar__json_str(&st->json, v, out, cap) < 0) out[0] = 0;
}

/* Writes a safetensors file of named tensors (data copied in order). */
typedef struct oscar__st_out {
    const char *name;
    const char *dtype; /* "F32", "I32" */
    int32_t ndim;
    int64_t shape[3];
    const void *data;
    size_t nbytes;
} oscar__st_out;

OSCAR__PRIVATE void oscar__st_write(oscar__bytes *out, const oscar__st_out *t, int n, const char *const *meta_kv,
                                    int nmeta) {
    oscar__bytes h;
    size_t off = 0, pad;
    int i, d;
    char num[64];
    memset(&h, 0, sizeof h);
    h.ctx = out->ctx;
    oscar__bytes_str(&h, "{\"__metadata__\":{");
    for (i = 0; i < nmeta; i++) {
        if (i) oscar__bytes_u8(&h, ',');
        oscar__json_escape(&h, meta_kv[2 * i]);
        oscar__bytes_u8(&h, ':');
        oscar__json_escape(&h, meta_kv[2 * i + 1]);
    }
    oscar__bytes_u8(&h, '}');
    for (i = 0; i < n; i++) {
        oscar__bytes_u8(&h, ',');
        oscar__json_escape(&h, t[i].name);
        oscar__bytes_str(&h, ":{\"dtype\":");
        oscar__json_escape(&h, t[i].dtype);
        oscar__bytes_str(&h, ",\"shape\":[");
        for (d = 0; d < t[i].ndim; d++) {
            snprintf(num, sizeof num, "%s%lld", d ? "," : "", OSCAR__CAST(long long, t[i].shape[d]));
            oscar__bytes_str(&h, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%zu,%zu]}", off, off + t[i].nbytes);
        oscar__bytes_str(&h, num);
        off += t[i].nbytes;
    }
    oscar__bytes_u8(&h, '}');
    pad = (8 - h.n % 8) % 8; /* keep the data 8-byte aligned */
    for (i = 0; i < OSCAR__CAST(int, pad); i++) oscar__bytes_u8(&h, ' ');
    oscar__bytes_u64(out, h.n);
    oscar__bytes_put(out, h.p, h.n);
    if (h.oom) out->oom = 1;
    oscar__bytes_free(&h);
    for (i = 0; i < n; i++) oscar__bytes_put(out, t[i].data, t[i].nbytes);
}

/* ---- npy --------------------------------------------------------------------------------------- */
/* Parses a .npy file (format 1.0-3.0): C order, descr <f2, <f4 or <f8. */
OSCAR__PRIVATE oscar_status oscar__npy_open(const oscar_ctx *ctx, const char *func, const uint8_t *buf, size_t size,
                                            oscar__tensor *out) {
    size_t hlen, hoff, p, end;
    const char *h;
    int have_descr = 0, have_shape = 0, fortran = 0;
    int64_t numel = 1;
    const char *why = NULL;
    memset(out, 0, sizeof *out);
    if (size < 10 || memcmp(buf, "\x93NUMPY", 6) != 0)
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: not a .npy file (no \\x93NUMPY magic)", func);
    if (buf[6] == 1) {
        hlen = oscar__get_u16(buf + 8);
        hoff = 10;
    } else if (buf[6] == 2 || buf[6] == 3) {
        if (size < 12) return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: truncated .npy header", func);
        hlen = oscar__get_u32(buf + 8);
        hoff = 12;
    } else {
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: .npy format version %d is not supported", func, buf[6]);
    }
    if (hlen > size - hoff) return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: truncated .npy header", func);
    h = OSCAR__RCAST(const char *, buf + hoff);
    end = hlen;
    /* the header is a Python dict literal: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), } */
    for (p = 0; p < end; p++) {
        if (h[p] != '\'' && h[p] != '"') continue;
        {
            char q = h[p];
            size_t k0 = p + 1, k1 = k0;
            while (k1 < end && h[k1] != q) k1++;
            if (k1 >= end) {
                why = "unterminated string";
                break;
            }
            p = k1 + 1;
            while (p < end && (h[p] == ' ' || h[p] == ':')) p++;
            if (k1 - k0 == 5 && memcmp(h + k0, "descr", 5) == 0) {
                size_t v0, v1;
                if (p >= end || (h[p] != '\'' && h[p] != '"')) {
                    why = "descr is not a string";
                    break;
                }
                v0 = p + 1;
                v1 = v0;
                while (v1 < end && h[v1] != h[p]) v1++;
                if (v1 >= end) {
                    why = "unterminated descr";
                    break;
                }
                if (v1 - v0 == 3 && memcmp(h + v0, "<f4", 3) == 0)
                    out->el = OSCAR__EL_F32;
                else if (v1 - v0 == 3 && memcmp(h + v0, "<f2", 3) == 0)
                    out->el = OSCAR__EL_F16;
                else if (v1 - v0 == 3 && memcmp(h + v0, "<f8", 3) == 0)
                    out->el = OSCAR__EL_F64;
                else {
                    why = "descr is not <f2, <f4 or <f8";
                    break;
                }
                have_descr = 1;
                p = v1;
            } else if (k1 - k0 == 13 && memcmp(h + k0, "fortran_order", 13) == 0) {
                fortran = end - p >= 4 && memcmp(h + p, "True", 4) == 0;
                p--;
            } else if (k1 - k0 == 5 && memcmp(h + k0, "shape", 5) == 0) {
                if (p >= end || h[p] != '(') {
                    why = "shape is not a tuple";
                    break;
                }
                p++;
                for (;;) {
                    int64_t dim = 0;
                    int digits = 0;
                    while (p < end && (h[p] == ' ' || h[p] == ',')) p++;
                    if (p < end && h[p] == ')') break;
                    while (p < end && h[p] >= '0' && h[p] <= '9' && dim < (OSCAR__CAST(int64_t, 1) << 40)) {
                        dim = dim * 10 + (h[p] - '0');
                        p++;
                        digits++;
                    }
                    if (!digits || out->ndim >= OSCAR__MAX_NDIM || dim >= (OSCAR__CAST(int64_t, 1) << 40)) {
                        why = "bad shape";
                        break;
                    }
                    out->shape[out->ndim++] = dim;
                }
                if (why) break;
                have_shape = 1;
            } else {
                p--;
            }
        }
    }
    if (!why && (!have_descr || !have_shape)) why = "header lacks descr or shape";
    if (!why && fortran) why = "fortran_order arrays are not supported (save with C order)";
    if (why) return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: .npy header: %s", func, why);
    for (p = 0; p < OSCAR__CAST(size_t, out->ndim); p++) {
        if (out->shape[p] && numel > (OSCAR__CAST(int64_t, 1) << 50) / out->shape[p])
            return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: .npy shape too large", func);
        numel *= out->shape[p];
    }
    if (OSCAR__CAST(uint64_t, numel) * oscar__el_size(out->el) > size - hoff - hlen)
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: .npy data is shorter than its shape (truncated?)", func);
    out->base = buf + hoff + hlen;
    oscar__tensor_contiguous(out);
    return OSCAR_OK;
}

/* ---- rotation files ---------------------------------------------------------------------------- */
typedef struct oscar__layer_src {
    int64_t id;
    oscar__tensor rot;
    oscar__tensor eig;
    int has_eig;
} oscar__layer_src;

/* Builds a rotation set from per-layer tensors (any order; ids checked). */
OSCAR__PRIVATE oscar_status oscar__set_from_layers(const oscar_ctx *ctx, const char *func, oscar__layer_src *src,
                                                   int32_t n, const char *objective, oscar_rotation_set **out) {
    oscar_rotation_set *s;
    oscar_status st;
    int32_t i, j, D, with_eig;
    size_t DD, k;
    char shape[96];
    if (n < 1) return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: the file holds no layers", func);
    for (i = 1; i < n; i++) { /* insertion sort by id: files hold tens of layers */
        oscar__layer_src cur = src[i];
        j = i - 1;
        while (j >= 0 && src[j].id > cur.id) {
            src[j + 1] = src[j];
            j--;
        }
        src[j + 1] = cur;
    }
    D = OSCAR__CAST(int32_t, src[0].rot.ndim == 2 ? src[0].rot.shape[0] : 0);
    with_eig = 1;
    for (i = 0; i < n; i++) {
        oscar__layer_src *l = &src[i];
        if (l->id < 0 || l->id > INT32_MAX)
            return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: layer id %lld is out of range", func,
                               OSCAR__CAST(long long, l->id));
        if (i > 0 && l->id == src[i - 1].id)
            return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: layer %lld appears twice", func,
                               OSCAR__CAST(long long, l->id));
        oscar__shape_str(&l->rot, shape, sizeof shape);
        if (l->rot.ndim != 2 || l->rot.shape[0] != l->rot.shape[1] || l->rot.shape[0] < 1 ||
            l->rot.shape[0] > OSCAR__MAX_ROTATION_DIM || !oscar__el_is_float(l->rot.el))
            return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                               "%s: layer %lld rotation is %s %s; expected a square float matrix of at most %d", func,
                               OSCAR__CAST(long long, l->id), oscar__el_name(l->rot.el), shape, OSCAR__MAX_ROTATION_DIM);
        if (l->rot.shape[0] != D)
            return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                               "%s: layer %lld rotation is %s but layer %lld's is %d x %d; one head dim per file", func,
                               OSCAR__CAST(long long, l->id), shape, OSCAR__CAST(long long, src[0].id), D, D);
        if (l->has_eig) {
            oscar__shape_str(&l->eig, shape, sizeof shape);
            if (l->eig.ndim != 1 || l->eig.shape[0] != D || !oscar__el_is_float(l->eig.el))
                return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                                   "%s: layer %lld eigenvalues are %s %s; expected %d floats", func,
                                   OSCAR__CAST(long long, l->id), oscar__el_name(l->eig.el), shape, D);
        } else {
            with_eig = 0; /* eigenvalues are kept only when every layer has them */
        }
    }
    st = oscar__rotation_set_new(ctx, func, n, D, with_eig, &s);
    if (st != OSCAR_OK) return st;
    DD = OSCAR__CAST(size_t, D) * OSCAR__CAST(size_t, D);
    for (i = 0; i < n; i++) {
        s->layer_ids[i] = OSCAR__CAST(int32_t, src[i].id);
        for (k = 0; k < DD; k++)
            s->rotations[OSCAR__CAST(size_t, i) * DD + k] =
                OSCAR__CAST(float, oscar__tensor_at(&src[i].rot, OSCAR__CAST(int64_t, k)));
        if (with_eig)
            for (k = 0; k < OSCAR__CAST(size_t, D); k++)
                s->eigenvalues[OSCAR__CAST(size_t, i) * OSCAR__CAST(size_t, D) + k] =
                    OSCAR__CAST(float, oscar__tensor_at(&src[i].eig, OSCAR__CAST(int64_t, k)));
    }
    oscar__set_objective(s, objective);
    *out = s;
    return OSCAR_OK;
}

/* A layer id from a dict key: an int, or a string of decimal digits. */
OSCAR__PRIVATE int oscar__pv_layer_id(const oscar__pickle *pk, int32_t key, int64_t *out) {
    const oscar__pv *k = &pk->v[key];
    size_t i;
    int64_t x = 0;
    if (k->type == OSCAR__PV_INT) {
        *out = k->i;
        return 0;
    }
    if (k->type != OSCAR__PV_STR || k->n == 0 || k->n > 10) return -1;
    for (i = 0; i < k->n; i++) {
        if (k->s[i] < '0' || k->s[i] > '9') return -1;
        x = x * 10 + (k->s[i] - '0');
    }
    *out = x;
    return 0;
}

OSCAR__PRIVATE oscar_status oscar__load_torch_rotations(const oscar_ctx *ctx, const char *func, const uint8_t *buf,
                                                        size_t size, oscar_rotation_set **out) {
    oscar__torch_file tf;
    oscar__layer_src *src = NULL;
    oscar_status st;
    int32_t layers, obj, i, n = 0;
    char objective[OSCAR__OBJECTIVE_CAP];
    st = oscar__torch_open(ctx, func, buf, size, &tf);
    if (st != OSCAR_OK) return st;
    objective[0] = 0;
    if (tf.pk.v[tf.pk.root].type != OSCAR__PV_DICT) {
        st = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: the checkpoint is not a dict (OSCAR-SPEC.md §6.2 schema)", func);
        goto out;
    }
    layers = oscar__pv_dict_get(&tf.pk, tf.pk.root, "layers");
    if (layers < 0 || tf.pk.v[layers].type != OSCAR__PV_DICT) {
        st = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                         "%s: the checkpoint has no \"layers\" dict (OSCAR-SPEC.md §6.2: {\"layers\": {id: "
                         "{\"rotation\": [D, D], ...}}})",
                         func);
        goto out;
    }
    obj = oscar__pv_dict_get(&tf.pk, tf.pk.root, "objective");
    if (obj >= 0 && tf.pk.v[obj].type == OSCAR__PV_STR)
        snprintf(objective, sizeof objective, "%.*s", OSCAR__CAST(int, OSCAR__MIN(tf.pk.v[obj].n, 63)), tf.pk.v[obj].s);
    src = OSCAR__CAST(oscar__layer_src *,
                      oscar__calloc(ctx, sizeof(oscar__layer_src) * OSCAR__CAST(size_t, tf.pk.v[layers].count / 2 + 1)));
    if (!src) {
        st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
        goto out;
    }
    for (i = 0; i < tf.pk.v[layers].count / 2; i++) {
        int32_t key = tf.pk.v[layers].items[2 * i], val = tf.pk.v[layers].items[2 * i + 1], rot, eig, lid;
        char what[96];
        oscar__layer_src *l = &src[n];
        if (oscar__pv_layer_id(&tf.pk, key, &l->id) != 0) {
            st = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: layers: key %d is not a layer id (int or digits)", func,
                             OSCAR__CAST(int, i));
            goto out;
        }
        if (tf.pk.v[val].type != OSCAR__PV_DICT) {
            st = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: layers[%lld] is not a dict", func,
                             OSCAR__CAST(long long, l->id));
            goto out;
        }
        lid = oscar__pv_dict_get(&tf.pk, val, "layer_id");
        if (lid >= 0 && (tf.pk.v[lid].type != OSCAR__PV_INT || tf.pk.v[lid].i != l->id)) {
            st = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: layers[%lld].layer_id differs from its key", func,
                             OSCAR__CAST(long long, l->id));
            goto out;
        }
        rot = oscar__pv_dict_get(&tf.pk, val, "rotation");
        snprintf(what, sizeof what, "layers[%lld].rotation", OSCAR__CAST(long long, l->id));
        st = oscar__torch_tensor(&tf, func, rot, what, &l->rot);
        if (st != OSCAR_OK) goto out;
        eig = oscar__pv_dict_get(&tf.pk, val, "eigenvalues");
        if (eig >= 0 && tf.pk.v[eig].type != OSCAR__PV_NONE) {
            snprintf(what, sizeof what, "layers[%lld].eigenvalues", OSCAR__CAST(long long, l->id));
            st = oscar__torch_tensor(&tf, func, eig, what, &l->eig);
            if (st != OSCAR_OK) goto out;
            l->has_eig = 1;
        }
        n++;
    }
    st = oscar__set_from_layers(ctx, func, src, n, objective, out);
out:
    oscar__free(ctx, src);
    oscar__torch_close(&tf);
    return st;
}

OSCAR__PRIVATE oscar_status oscar__load_st_rotations(const oscar_ctx *ctx, const char *func, const uint8_t *buf,
                                                     size_t size, oscar_rotation_set **out) {
    oscar__safetensors st;
    const oscar__st_tensor *rot, *ids, *eig;
    oscar__layer_src *src = NULL;
    oscar_status s;
    char objective[OSCAR__OBJECTIVE_CAP], shape[96];
    int32_t i, n = 0;
    s = oscar__st_open(ctx, func, buf, size, &st);
    if (s != OSCAR_OK) return s;
    oscar__st_meta(&st, "objective", objective, sizeof objective);
    rot = oscar__st_find(&st, "rotations");
    src = OSCAR__CAST(oscar__layer_src *, oscar__calloc(ctx, sizeof(oscar__layer_src) * OSCAR__CAST(size_t, st.count + 1)));
    if (!src) {
        s = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
        goto out;
    }
    if (rot) { /* stacked: rotations [L, D, D], layer_ids [L], eigenvalues [L, D] */
        int64_t L, D;
        oscar__shape_str(&rot->t, shape, sizeof shape);
        if (rot->t.ndim != 3 || rot->t.shape[0] < 1 || rot->t.shape[0] > INT32_MAX || rot->t.shape[1] != rot->t.shape[2]) {
            s = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: \"rotations\" is %s; expected [layers, D, D]", func, shape);
            goto out;
        }
        L = rot->t.shape[0];
        D = rot->t.shape[1];
        ids = oscar__st_find(&st, "layer_ids");
        eig = oscar__st_find(&st, "eigenvalues");
        if (ids && (ids->t.ndim != 1 || ids->t.shape[0] != L || !oscar__el_is_int(ids->t.el))) {
            s = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: \"layer_ids\" must be %lld integers", func,
                            OSCAR__CAST(long long, L));
            goto out;
        }
        if (eig && (eig->t.ndim != 2 || eig->t.shape[0] != L || eig->t.shape[1] != D)) {
            s = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: \"eigenvalues\" must be [%lld, %lld]", func,
                            OSCAR__CAST(long long, L), OSCAR__CAST(long long, D));
            goto out;
        }
        oscar__free(ctx, src);
        src = OSCAR__CAST(oscar__layer_src *, oscar__calloc(ctx, sizeof(oscar__layer_src) * OSCAR__CAST(size_t, L)));
        if (!src) {
            s = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
            goto out;
        }
        for (i = 0; i < L; i++) { /* per-layer views into the stacked tensors */
            oscar__layer_src *l = &src[i];
            l->id = ids ? OSCAR__CAST(int64_t, oscar__tensor_at(&ids->t, i)) : i;
            l->rot = rot->t;
            l->rot.ndim = 2;
            l->rot.shape[0] = l->rot.shape[1] = D;
            l->rot.stride[0] = D;
            l->rot.stride[1] = 1;
            l->rot.offset = OSCAR__CAST(int64_t, i) * D * D;
            if (eig) {
                l->eig = eig->t;
                l->eig.ndim = 1;
                l->eig.shape[0] = D;
                l->eig.stride[0] = 1;
                l->eig.offset = OSCAR__CAST(int64_t, i) * D;
                l->has_eig = 1;
            }
        }
        n = OSCAR__CAST(int32_t, L);
    } else { /* per layer: layers.<id>.rotation [D, D], layers.<id>.eigenvalues [D] */
        for (i = 0; i < st.count; i++) {
            const char *nm = st.tensors[i].name, *dot;
            char eig_name[OSCAR__ST_NAME_CAP + 16];
            int64_t id = 0;
            size_t k;
            if (strncmp(nm, "layers.", 7) != 0) continue;
            dot = strchr(nm + 7, '.');
            if (!dot || strcmp(dot, ".rotation") != 0 || dot == nm + 7 || dot - nm - 7 > 10) continue;
            for (k = 7; nm + k < dot; k++) {
                if (nm[k] < '0' || nm[k] > '9') break;
                id = id * 10 + (nm[k] - '0');
            }
            if (nm + k != dot) continue;
            src[n].id = id;
            src[n].rot = st.tensors[i].t;
            snprintf(eig_name, sizeof eig_name, "%.*s.eigenvalues", OSCAR__CAST(int, dot - nm), nm);
            eig = oscar__st_find(&st, eig_name);
            if (eig) {
                src[n].eig = eig->t;
                src[n].has_eig = 1;
            }
            n++;
        }
        if (n == 0) {
            s = oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                            "%s: no \"rotations\" [L, D, D] tensor and no \"layers.<id>.rotation\" tensors", func);
            goto out;
        }
    }
    s = oscar__set_from_layers(ctx, func, src, n, objective, out);
out:
    oscar__free(ctx, src);
    oscar__st_close(&st);
    return s;
}

OSCAR_API oscar_status oscar_rotation_set_load_memory(oscar_ctx *ctx, const void *data, size_t size,
                                                      oscar_rotation_set **out_set) {
    static const char *func = "oscar_rotation_set_load";
    const uint8_t *b = OSCAR__CAST(const uint8_t *, data);
    oscar__clear_error(ctx);
    if (!out_set || (!data && size))
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "%s: data and out_set must be non-NULL", func);
    *out_set = NULL;
    if (size >= 4 && b[0] == 'P' && b[1] == 'K' && ((b[2] == 3 && b[3] == 4) || (b[2] == 5 && b[3] == 6)))
        return oscar__load_torch_rotations(ctx, func, b, size, out_set);
    if (size >= 9 && b[8] == '{') return oscar__load_st_rotations(ctx, func, b, size, out_set);
    if (size >= 2 && b[0] == 0x80 && b[1] <= 5)
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                           "%s: a legacy (torch < 1.6, non-zip) torch.save file; re-save it with a current torch or "
                           "convert it to safetensors",
                           func);
    return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR,
                       "%s: neither a torch.save zip archive nor a safetensors file (%zu bytes)", func, size);
}

OSCAR_API oscar_status oscar_rotation_set_load(oscar_ctx *ctx, const char *path, oscar_rotation_set **out_set) {
    uint8_t *buf;
    size_t size;
    oscar_status st;
    oscar__clear_error(ctx);
    if (!out_set) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_rotation_set_load: out_set = NULL");
    *out_set = NULL;
    st = oscar__read_file(ctx, "oscar_rotation_set_load", path, &buf, &size);
    if (st != OSCAR_OK) return st;
    st = oscar_rotation_set_load_memory(ctx, buf, size, out_set);
    if (st != OSCAR_OK) {
        /* name the file in the sentence */
        char msg[OSCAR__ERROR_CAP];
        snprintf(msg, sizeof msg, "%s", oscar_last_error(ctx));
        st = oscar__fail(ctx, st, "%s (file %s)", msg, path);
    }
    oscar__free(ctx, buf);
    return st;
}

OSCAR__PRIVATE void oscar__torch_rotations_bytes(const oscar_rotation_set *set, const char *archive, oscar__bytes *out) {
    oscar__bytes pk;
    oscar__zip_writer w;
    char name[320], digits[48];
    size_t D = OSCAR__CAST(size_t, set->head_dim), L = OSCAR__CAST(size_t, set->num_layers), l;
    int64_t shape2[2], shape1[1];
    uint8_t digest[32];
    oscar__sha256 sh;
    int i;
    memset(&pk, 0, sizeof pk);
    memset(&w, 0, sizeof w);
    pk.ctx = w.out.ctx = w.cdir.ctx = out->ctx;
    shape2[0] = shape2[1] = shape1[0] = OSCAR__CAST(int64_t, D);
    oscar__bytes_u8(&pk, 0x80);
    oscar__bytes_u8(&pk, 2);
    oscar__bytes_u8(&pk, '}');
    oscar__bytes_u8(&pk, '(');
    oscar__pk_str(&pk, "format_version");
    oscar__pk_int(&pk, 1);
    oscar__pk_str(&pk, "objective");
    oscar__pk_str(&pk, set->objective);
    oscar__pk_str(&pk, "source_grouping");
    oscar__pk_str(&pk, "layer");
    oscar__pk_str(&pk, "layers");
    oscar__bytes_u8(&pk, '}');
    oscar__bytes_u8(&pk, '(');
    for (l = 0; l < L; l++) {
        oscar__pk_int(&pk, set->layer_ids[l]);
        oscar__bytes_u8(&pk, '}');
        oscar__bytes_u8(&pk, '(');
        oscar__pk_str(&pk, "layer_id");
        oscar__pk_int(&pk, set->layer_ids[l]);
        oscar__pk_str(&pk, "rotation");
        oscar__pk_tensor(&pk, OSCAR__CAST(int64_t, 2 * l), "FloatStorage", shape2, NULL, 2, shape2[0] * shape2[1]);
        if (set->eigenvalues) {
            oscar__pk_str(&pk, "eigenvalues");
            oscar__pk_tensor(&pk, OSCAR__CAST(int64_t, 2 * l + 1), "FloatStorage", shape1, NULL, 1, shape1[0]);
        }
        oscar__bytes_u8(&pk, 'u');
    }
    oscar__bytes_u8(&pk, 'u');
    oscar__bytes_u8(&pk, 'u');
    oscar__bytes_u8(&pk, '.');
    snprintf(name, sizeof name, "%s/data.pkl", archive);
    oscar__zip_add(&w, name, pk.p, pk.n);
    snprintf(name, sizeof name, "%s/.format_version", archive);
    oscar__zip_add(&w, name, "1", 1);
    snprintf(name, sizeof name, "%s/.storage_alignment", archive);
    oscar__zip_add(&w, name, "64", 2);
    snprintf(name, sizeof name, "%s/byteorder", archive);
    oscar__zip_add(&w, name, "little", 6);
    for (l = 0; l < L; l++) {
        snprintf(name, sizeof name, "%s/data/%zu", archive, 2 * l);
        oscar__zip_add(&w, name, set->rotations + l * D * D, sizeof(float) * D * D);
        if (set->eigenvalues) {
            snprintf(name, sizeof name, "%s/data/%zu", archive, 2 * l + 1);
            oscar__zip_add(&w, name, set->eigenvalues + l * D, sizeof(float) * D);
        }
    }
    snprintf(name, sizeof name, "%s/version", archive);
    oscar__zip_add(&w, name, "3\n", 2);
    oscar__sha256_init(&sh);
    oscar__sha256_update(&sh, pk.p, pk.n);
    oscar__sha256_final(&sh, digest);
    for (i = 0; i < 40; i++) digits[i] = OSCAR__CAST(char, '0' + digest[i % 32] % 10);
    digits[0] = digits[0] == '0' ? '1' : digits[0];
    snprintf(name, sizeof name, "%s/.data/serialization_id", archive);
    oscar__zip_add(&w, name, digits, 40);
    oscar__zip_finish(&w);
    if (pk.oom || w.out.oom || w.cdir.oom) out->oom = 1;
    oscar__bytes_put(out, w.out.p, w.out.n);
    oscar__bytes_free(&pk);
    oscar__bytes_free(&w.out);
    oscar__bytes_free(&w.cdir);
}

OSCAR__PRIVATE void oscar__st_rotations_bytes(const oscar_rotation_set *set, oscar__bytes *out) {
    oscar__st_out t[3];
    char dim[32], layers[32];
    const char *meta[12];
    size_t D = OSCAR__CAST(size_t, set->head_dim), L = OSCAR__CAST(size_t, set->num_layers);
    int n = 0;
    memset(t, 0, sizeof t);
    t[n].name = "rotations";
    t[n].dtype = "F32";
    t[n].ndim = 3;
    t[n].shape[0] = set->num_layers;
    t[n].shape[1] = t[n].shape[2] = set->head_dim;
    t[n].data = set->rotations;
    t[n].nbytes = sizeof(float) * L * D * D;
    n++;
    if (set->eigenvalues) {
        t[n].name = "eigenvalues";
        t[n].dtype = "F32";
        t[n].ndim = 2;
        t[n].shape[0] = set->num_layers;
        t[n].shape[1] = set->head_dim;
        t[n].data = set->eigenvalues;
        t[n].nbytes = sizeof(float) * L * D;
        n++;
    }
    t[n].name = "layer_ids";
    t[n].dtype = "I32";
    t[n].ndim = 1;
    t[n].shape[0] = set->num_layers;
    t[n].data = set->layer_ids;
    t[n].nbytes = sizeof(int32_t) * L;
    n++;
    snprintf(dim, sizeof dim, "%d", set->head_dim);
    snprintf(layers, sizeof layers, "%d", set->num_layers);
    meta[0] = "format";
    meta[1] = "oscar-rotations";
    meta[2] = "format_version";
    meta[3] = "1";
    meta[4] = "objective";
    meta[5] = set->objective;
    meta[6] = "source_grouping";
    meta[7] = "layer";
    meta[8] = "head_dim";
    meta[9] = dim;
    meta[10] = "num_layers";
    meta[11] = layers;
    oscar__st_write(out, t, n, meta, 6);
}

OSCAR_API oscar_status oscar_rotation_set_save(oscar_ctx *ctx, const oscar_rotation_set *set, const char *path,
                                               oscar_rotation_file_format format) {
    static const char *func = "oscar_rotation_set_save";
    oscar__bytes out;
    oscar_status st;
    oscar__clear_error(ctx);
    if (!set || !path) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "%s: set and path must be non-NULL", func);
    if (format < 0 || format >= OSCAR__ROTATION_FILE_COUNT)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "%s: format = %d; expected an oscar_rotation_file_format",
                           func, OSCAR__CAST(int, format));
    if (format == OSCAR_ROTATION_FILE_DEFAULT) {
        size_t n = strlen(path);
        format = (n >= 3 && strcmp(path + n - 3, ".pt") == 0) || (n >= 4 && strcmp(path + n - 4, ".pth") == 0)
                     ? OSCAR_ROTATION_FILE_TORCH
                     : OSCAR_ROTATION_FILE_SAFETENSORS;
    }
    memset(&out, 0, sizeof out);
    out.ctx = ctx;
    if (format == OSCAR_ROTATION_FILE_TORCH) {
        /* the archive's folder name is the file's stem, as torch.save does */
        char archive[128];
        const char *base = strrchr(path, '/');
        size_t i, n = 0;
        base = base ? base + 1 : path;
        for (i = 0; base[i] && base[i] != '.' && n + 1 < sizeof archive; i++) {
            char c = base[i];
            archive[n++] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                                   c == '-'
                               ? c
                               : '_';
        }
        archive[n] = 0;
        if (n == 0) snprintf(archive, sizeof archive, "archive");
        if (OSCAR__CAST(uint64_t, set->num_layers) * 2 + 8 > 65535 ||
            OSCAR__CAST(uint64_t, set->num_layers) * OSCAR__CAST(uint64_t, set->head_dim) *
                    OSCAR__CAST(uint64_t, set->head_dim) * 4 >
                (OSCAR__CAST(uint64_t, 1) << 31))
            return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED,
                               "%s: %d layers of %d x %d are too large for a non-zip64 archive; use safetensors", func,
                               set->num_layers, set->head_dim, set->head_dim);
        oscar__torch_rotations_bytes(set, archive, &out);
    } else {
        oscar__st_rotations_bytes(set, &out);
    }
    if (out.oom) {
        oscar__bytes_free(&out);
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
    }
    st = oscar__write_file_atomic(ctx, func, path, out.p, out.n);
    oscar__bytes_free(&out);
    return st;
}

#endif /* OSCAR_CALIB_IO_H_INCLUDED */
