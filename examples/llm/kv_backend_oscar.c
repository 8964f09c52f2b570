/* kv_backend_oscar.c — the KV cache through oscar.h (kv_backend_oscar.h). */
#define _POSIX_C_SOURCE 200809L
#include "kv_backend_oscar.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef LLM_HAVE_CUDART
#include <cuda_runtime_api.h>
#endif

#include "quant.h"

/* ------------------------------------------------------------------ memory */

/* Host (CPU backend) or device (CUDA backend) memory, all through these. */
typedef struct mem {
    int on_device;
    char *err;
    size_t errlen;
} mem;

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static int mem_alloc(mem *m, void **p, size_t n) {
    *p = NULL;
    if (n == 0) n = 64;
    if (m->on_device) {
#ifdef LLM_HAVE_CUDART
        cudaError_t e = cudaMalloc(p, n);
        if (e != cudaSuccess) { *p = NULL; return fail(m->err, m->errlen, "cudaMalloc(%zu): %s", n, cudaGetErrorString(e)); }
        e = cudaMemset(*p, 0, n);
        if (e != cudaSuccess) return fail(m->err, m->errlen, "cudaMemset(%zu): %s", n, cudaGetErrorString(e));
        return 0;
#else
        return fail(m->err, m->errlen, "this build has no CUDA runtime (LLM_HAVE_CUDART unset)");
#endif
    }
    *p = aligned_alloc(256, (n + 255) & ~(size_t)255);
    if (!*p) return fail(m->err, m->errlen, "out of host memory (%zu bytes)", n);
    memset(*p, 0, n);
    return 0;
}

static void mem_free(mem *m, void *p) {
    if (!p) return;
#ifdef LLM_HAVE_CUDART
    if (m->on_device) { cudaFree(p); return; }
#endif
    free(p);
}

/* host -> backend memory */
static int mem_put(mem *m, void *dst, const void *src, size_t n) {
    if (n == 0) return 0;
    if (m->on_device) {
#ifdef LLM_HAVE_CUDART
        cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice);
        return e == cudaSuccess ? 0 : fail(m->err, m->errlen, "cudaMemcpy H2D (%zu bytes): %s", n, cudaGetErrorString(e));
#else
        return fail(m->err, m->errlen, "no CUDA runtime");
#endif
    }
    memcpy(dst, src, n);
    return 0;
}

/* backend memory -> host (for device memory this also waits for the work queued before) */
static int mem_get(mem *m, void *dst, const void *src, size_t n) {
    if (n == 0) return 0;
    if (m->on_device) {
#ifdef LLM_HAVE_CUDART
        cudaError_t e = cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
        return e == cudaSuccess ? 0 : fail(m->err, m->errlen, "cudaMemcpy D2H (%zu bytes): %s", n, cudaGetErrorString(e));
#else
        return fail(m->err, m->errlen, "no CUDA runtime");
#endif
    }
    memcpy(dst, src, n);
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------ backend state */

typedef struct okv_layer {
    void *k_codes, *v_codes, *k_scales, *v_scales; /* INT2 pool */
    void *win_k, *win_v;                           /* bf16 window cache [slots][H][D] */
    void *rot_k, *rot_v;                           /* [D][D] f32 or NULL */
} okv_layer;

typedef struct okv {
    kv_shape s;
    oscar_ctx *ctx;
    mem m;
    char err[512];
    int32_t sink, recent, interval, ring, win_slots, page_size, int2_pages;
    int has_window_tier;
    float k_clip, v_clip;
    okv_layer *layers;
    oscar_int2_pool_desc pool;      /* geometry (arrays set per call) */
    oscar_window_pool_desc win;     /* geometry */
    oscar_decode_plan_info plan;
    void *workspace;
    oscar_quantize_layer_desc *qlayers;
    /* page tables, host copies and backend copies */
    int32_t h_int2_ip[2], h_int2_last[1], h_win_ip[2], h_win_last[1];
    int32_t *h_win_idx;
    void *d_int2_ip, *d_int2_idx, *d_int2_last, *d_win_ip, *d_win_idx, *d_win_last;
    int64_t table_pos, table_int2; /* the state the uploaded tables describe */
    /* per-call staging */
    uint16_t *h_q, *h_o, *h_k, *h_v;
    void *d_q, *d_o;
    int32_t *h_src_slots, *h_dst_slots;
    void *d_src_slots, *d_dst_slots;
    /* sequence state */
    int64_t *n_tokens;     /* per layer: tokens appended */
    int64_t *next_demote;  /* per layer: first position its queries still read from the window */
    int64_t *quantized_upto; /* per layer: positions below this have their INT2 rows written */
    kv_oscar_stats st;
} okv;

static size_t row_elems(const kv_shape *s) { return (size_t)s->num_kv_heads * (size_t)s->head_dim; }

/* window-cache slot of position p */
static int32_t win_slot(const okv *o, int64_t p) {
    if (p < o->sink) return (int32_t)p;
    return o->sink + (int32_t)((p - o->sink) % o->ring);
}

static int oscar_fail(okv *o, oscar_status st, const char *what) {
    return fail(o->err, sizeof o->err, "%s: %s: %s", what, oscar_status_string(st), oscar_last_error(o->ctx));
}

static void okv_reset(kv_backend *b) {
    okv *o = b->impl;
    for (int32_t l = 0; l < o->s.num_layers; l++) {
        o->n_tokens[l] = 0;
        o->next_demote[l] = o->sink;
        o->quantized_upto[l] = o->sink;
    }
    o->table_pos = -1;
    o->table_int2 = -1;
}

/* Demote positions p0 .. p0+n-1 of layers l0 .. l0+nl-1 (one oscar_quantize_kv call). */
static int demote(okv *o, int32_t l0, int32_t nl, int64_t p0, int32_t n) {
    const double t0 = now_s();
    for (int32_t i = 0; i < n; i++) {
        o->h_src_slots[i] = win_slot(o, p0 + i);
        o->h_dst_slots[i] = (int32_t)(p0 + i - o->sink);
    }
    if (mem_put(&o->m, o->d_src_slots, o->h_src_slots, sizeof(int32_t) * (size_t)n) ||
        mem_put(&o->m, o->d_dst_slots, o->h_dst_slots, sizeof(int32_t) * (size_t)n))
        return -1;
    for (int32_t i = 0; i < nl; i++) {
        const okv_layer *L = &o->layers[l0 + i];
        oscar_quantize_layer_desc *q = &o->qlayers[i];
        q->src_k = L->win_k, q->src_v = L->win_v;
        q->k_rotation = L->rot_k, q->v_rotation = L->rot_v;
        q->k_codes = L->k_codes, q->v_codes = L->v_codes;
        q->k_scales = L->k_scales, q->v_scales = L->v_scales;
    }
    oscar_quantize_desc qd = {0};
    oscar_int2_pool_desc pool = o->pool;
    pool.k_codes = o->layers[l0].k_codes, pool.v_codes = o->layers[l0].v_codes;
    pool.k_scales = o->layers[l0].k_scales, pool.v_scales = o->layers[l0].v_scales;
    qd.pool = &pool;
    qd.num_layers = nl;
    qd.layers = o->qlayers;
    qd.src_dtype = OSCAR_DTYPE_BF16;
    qd.num_tokens = n;
    qd.src_slots = o->d_src_slots;
    qd.src_page_size = 1;
    qd.dst_slots = o->d_dst_slots;
    qd.slot_dtype = OSCAR_DTYPE_I32;
    qd.k_clip_ratio = o->k_clip;
    qd.v_clip_ratio = o->v_clip;
    oscar_status st = oscar_quantize_kv(o->ctx, &qd, NULL);
    if (st != OSCAR_OK) return oscar_fail(o, st, "oscar_quantize_kv");
#ifdef LLM_HAVE_CUDART
    if (o->m.on_device) {
        cudaError_t e = cudaDeviceSynchronize(); /* timing, and errors surface here */
        if (e != cudaSuccess) return fail(o->err, sizeof o->err, "after oscar_quantize_kv: %s", cudaGetErrorString(e));
    }
#endif
    o->st.quantize_calls++;
    o->st.demoted_rows += (int64_t)n * nl;
    o->st.quantize_s += now_s() - t0;
    return 0;
}

static int okv_append(kv_backend *b, int32_t layer, int64_t pos, const float *k, const float *v) {
    okv *o = b->impl;
    const kv_shape *s = &o->s;
    if (layer < 0 || layer >= s->num_layers || pos != o->n_tokens[layer] || pos >= s->max_tokens)
        return fail(o->err, sizeof o->err, "append(layer %d, pos %lld) out of order or beyond capacity %d", layer,
                    (long long)pos, s->max_tokens);
    const size_t re = row_elems(s);
    for (size_t i = 0; i < re; i++) o->h_k[i] = f32_to_bf16(k[i]), o->h_v[i] = f32_to_bf16(v[i]);
    const okv_layer *L = &o->layers[layer];
    const size_t off = (size_t)win_slot(o, pos) * re * sizeof(uint16_t);
    if (mem_put(&o->m, (char *)L->win_k + off, o->h_k, re * sizeof(uint16_t)) ||
        mem_put(&o->m, (char *)L->win_v + off, o->h_v, re * sizeof(uint16_t)))
        return -1;
    o->n_tokens[layer] = pos + 1;
    /* this layer's view: the rows that left its recent window */
    while (pos + 1 - o->recent - o->next_demote[layer] >= o->interval) {
        const int64_t p0 = o->next_demote[layer];
        if (o->quantized_upto[layer] < p0 + o->interval) {
            /* quantize this chunk for this layer and for every following layer that already
               holds it and has not quantized it yet: in decode (one token through all layers)
               that is all layers in one call; in a batched forward (layer-major) the later
               layers do not have the rows yet and demote at their own turn */
            int32_t nl = 1;
            while (layer + nl < s->num_layers && o->quantized_upto[layer + nl] == p0 &&
                   o->n_tokens[layer + nl] >= p0 + o->interval)
                nl++;
            if (demote(o, layer, nl, p0, o->interval)) return -1;
            for (int32_t l = layer; l < layer + nl; l++) o->quantized_upto[l] = p0 + o->interval;
        }
        o->next_demote[layer] = p0 + o->interval;
    }
    return 0;
}

/* Page tables for a query at pos of a layer whose first not-demoted position is nd. */
static int upload_tables(okv *o, int64_t pos, int64_t nd) {
    const int64_t n_int2 = nd - o->sink > 0 ? nd - o->sink : 0;
    if (o->table_pos == pos && o->table_int2 == n_int2) return 0;
    const int32_t np = (int32_t)((n_int2 + o->page_size - 1) / o->page_size);
    o->h_int2_ip[0] = 0, o->h_int2_ip[1] = np;
    o->h_int2_last[0] = np > 0 ? (int32_t)(n_int2 - (int64_t)(np - 1) * o->page_size) : 0;
    int32_t nw = 0;
    for (int64_t p = 0; p < o->sink && p <= pos; p++) o->h_win_idx[nw++] = (int32_t)p;
    for (int64_t p = nd > o->sink ? nd : o->sink; p <= pos; p++) o->h_win_idx[nw++] = win_slot(o, p);
    o->h_win_ip[0] = 0, o->h_win_ip[1] = nw;
    o->h_win_last[0] = 1;
    if (mem_put(&o->m, o->d_int2_ip, o->h_int2_ip, sizeof o->h_int2_ip) ||
        mem_put(&o->m, o->d_int2_last, o->h_int2_last, sizeof o->h_int2_last))
        return -1;
    if (o->has_window_tier &&
        (mem_put(&o->m, o->d_win_ip, o->h_win_ip, sizeof o->h_win_ip) ||
         mem_put(&o->m, o->d_win_last, o->h_win_last, sizeof o->h_win_last) ||
         mem_put(&o->m, o->d_win_idx, o->h_win_idx, sizeof(int32_t) * (size_t)(nw > 0 ? nw : 1))))
        return -1;
    if (!o->has_window_tier && nw > 0)
        return fail(o->err, sizeof o->err, "internal: %d window tokens but the plan has no window tier", nw);
    o->table_pos = pos;
    o->table_int2 = n_int2;
    return 0;
}

static int okv_attend(kv_backend *b, int32_t layer, int64_t pos, const float *q, float *out) {
    okv *o = b->impl;
    const kv_shape *s = &o->s;
    if (layer < 0 || layer >= s->num_layers || pos + 1 != o->n_tokens[layer])
        return fail(o->err, sizeof o->err, "attend(layer %d, pos %lld) without its append", layer, (long long)pos);
    const double t0 = now_s();
    if (upload_tables(o, pos, o->next_demote[layer])) return -1;
    const size_t nq = (size_t)s->num_heads * (size_t)s->head_dim;
    for (size_t i = 0; i < nq; i++) o->h_q[i] = f32_to_bf16(q[i]);
    if (mem_put(&o->m, o->d_q, o->h_q, nq * sizeof(uint16_t))) return -1;
    const okv_layer *L = &o->layers[layer];
    oscar_int2_pool_desc pool = o->pool;
    pool.k_codes = L->k_codes, pool.v_codes = L->v_codes, pool.k_scales = L->k_scales, pool.v_scales = L->v_scales;
    oscar_window_pool_desc win = o->win;
    win.k = L->win_k, win.v = L->win_v;
    oscar_decode_run_desc rd = {0};
    rd.int2_pool = &pool;
    rd.window_pool = o->has_window_tier ? &win : NULL;
    rd.int2_pages = (oscar_page_table){o->d_int2_ip, o->d_int2_idx, o->d_int2_last};
    rd.window_pages = (oscar_page_table){o->d_win_ip, o->d_win_idx, o->d_win_last};
    rd.q = o->d_q;
    rd.q_dtype = OSCAR_DTYPE_BF16;
    rd.o = o->d_o;
    rd.o_dtype = OSCAR_DTYPE_BF16;
    rd.k_rotation = L->rot_k;
    rd.v_rotation = L->rot_v;
    rd.sm_scale = 1.0f / sqrtf((float)s->head_dim);
    rd.workspace = o->workspace;
    rd.workspace_bytes = o->plan.workspace_bytes;
    oscar_status st = oscar_decode_run(o->ctx, &o->plan, &rd, NULL);
    if (st != OSCAR_OK) return oscar_fail(o, st, "oscar_decode_run");
    if (mem_get(&o->m, o->h_o, o->d_o, nq * sizeof(uint16_t))) return -1;
    for (size_t i = 0; i < nq; i++) out[i] = bf16_to_f32(o->h_o[i]);
    o->st.decode_calls++;
    o->st.decode_s += now_s() - t0;
    return 0;
}

static void okv_destroy(kv_backend *b) {
    if (!b) return;
    okv *o = b->impl;
    if (o) {
        if (o->layers)
            for (int32_t l = 0; l < o->s.num_layers; l++) {
                okv_layer *L = &o->layers[l];
                mem_free(&o->m, L->k_codes), mem_free(&o->m, L->v_codes);
                mem_free(&o->m, L->k_scales), mem_free(&o->m, L->v_scales);
                mem_free(&o->m, L->win_k), mem_free(&o->m, L->win_v);
                mem_free(&o->m, L->rot_k), mem_free(&o->m, L->rot_v);
            }
        mem_free(&o->m, o->workspace);
        mem_free(&o->m, o->d_int2_ip), mem_free(&o->m, o->d_int2_idx), mem_free(&o->m, o->d_int2_last);
        mem_free(&o->m, o->d_win_ip), mem_free(&o->m, o->d_win_idx), mem_free(&o->m, o->d_win_last);
        mem_free(&o->m, o->d_q), mem_free(&o->m, o->d_o);
        mem_free(&o->m, o->d_src_slots), mem_free(&o->m, o->d_dst_slots);
        free(o->layers), free(o->qlayers), free(o->h_win_idx);
        free(o->h_q), free(o->h_o), free(o->h_k), free(o->h_v), free(o->h_src_slots), free(o->h_dst_slots);
        free(o->n_tokens), free(o->next_demote), free(o->quantized_upto);
        free(o);
    }
    free(b);
}

kv_backend *kv_backend_oscar_create(kv_shape shape, const kv_oscar_desc *desc, char *err, size_t errlen) {
    char dummy[8];
    if (!err || !errlen) err = dummy, errlen = sizeof dummy;
    err[0] = 0;
    if (!desc || !desc->ctx) { fail(err, errlen, "kv_backend_oscar_create: desc.ctx *must* be set"); return NULL; }
    if (shape.num_layers <= 0 || shape.num_heads <= 0 || shape.num_kv_heads <= 0 || shape.max_tokens <= 0 ||
        shape.num_heads % shape.num_kv_heads != 0 ||
        !(shape.head_dim == 64 || shape.head_dim == 128 || shape.head_dim == 256)) {
        fail(err, errlen, "kv_backend_oscar_create: shape %d layers, %d/%d heads, head_dim %d, %d tokens is not supported",
             shape.num_layers, shape.num_heads, shape.num_kv_heads, shape.head_dim, shape.max_tokens);
        return NULL;
    }
    oscar_ctx_info info;
    if (oscar_query_ctx_info(desc->ctx, &info) != OSCAR_OK) { fail(err, errlen, "oscar_query_ctx_info failed"); return NULL; }
    kv_backend *b = calloc(1, sizeof *b);
    okv *o = calloc(1, sizeof *o);
    if (!b || !o) { free(b); free(o); fail(err, errlen, "out of memory"); return NULL; }
    b->impl = o;
    b->shape = shape;
    b->name = "oscar";
    b->reset = okv_reset;
    b->append = okv_append;
    b->attend = okv_attend;
    b->destroy = okv_destroy;
    o->s = shape;
    o->ctx = desc->ctx;
    o->m.on_device = info.backend == OSCAR_BACKEND_CUDA;
    o->m.err = o->err;
    o->m.errlen = sizeof o->err;
    if (o->m.on_device && info.compile_only) {
        fail(err, errlen, "kv_backend_oscar_create: the context is compile-only");
        okv_destroy(b);
        return NULL;
    }
    o->sink = desc->sink_tokens == 0 ? 64 : desc->sink_tokens < 0 ? 0 : desc->sink_tokens;
    o->recent = desc->recent_tokens == 0 ? 256 : desc->recent_tokens < 0 ? 0 : desc->recent_tokens;
    o->interval = desc->demote_interval <= 0 ? 8 : desc->demote_interval;
    o->page_size = desc->page_size <= 0 ? 16 : desc->page_size;
    o->k_clip = desc->k_clip_ratio;
    o->v_clip = desc->v_clip_ratio;
    o->ring = o->recent + o->interval;
    o->win_slots = o->sink + o->ring;
    /* sink 0, recent 0, demote 1: the query never sees a bf16 row */
    o->has_window_tier = !(o->sink == 0 && o->recent == 0 && o->interval == 1);
    const int64_t int2_tokens = shape.max_tokens > o->sink ? shape.max_tokens - o->sink : 1;
    o->int2_pages = (int32_t)((int2_tokens + o->page_size - 1) / o->page_size);
    const int32_t H = shape.num_kv_heads, D = shape.head_dim;
    const size_t re = row_elems(&shape);

    o->pool.head_dim = D;
    o->pool.num_kv_heads = H;
    o->pool.num_pages = o->int2_pages;
    o->pool.page_size = o->page_size;
    o->pool.group_size = desc->group_size > 0 ? desc->group_size : D;
    o->pool.scale_layout = OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
    o->pool.layout = OSCAR_KV_LAYOUT_HND;
    size_t code_bytes = 0, scale_bytes = 0;
    oscar_status st = oscar_int2_pool_bytes(o->ctx, &o->pool, &code_bytes, &scale_bytes);
    if (st != OSCAR_OK) { oscar_fail(o, st, "oscar_int2_pool_bytes"); goto bad; }
    o->win.dtype = OSCAR_DTYPE_BF16;
    o->win.num_pages = o->win_slots;
    o->win.page_size = 1;
    o->win.layout = OSCAR_KV_LAYOUT_NHD;

    o->layers = calloc((size_t)shape.num_layers, sizeof *o->layers);
    o->qlayers = calloc((size_t)shape.num_layers, sizeof *o->qlayers);
    o->h_win_idx = calloc((size_t)o->win_slots + 1, sizeof(int32_t));
    o->h_q = calloc((size_t)shape.num_heads * (size_t)D, sizeof(uint16_t));
    o->h_o = calloc((size_t)shape.num_heads * (size_t)D, sizeof(uint16_t));
    o->h_k = calloc(re, sizeof(uint16_t));
    o->h_v = calloc(re, sizeof(uint16_t));
    o->h_src_slots = calloc((size_t)o->interval, sizeof(int32_t));
    o->h_dst_slots = calloc((size_t)o->interval, sizeof(int32_t));
    o->n_tokens = calloc((size_t)shape.num_layers, sizeof(int64_t));
    o->next_demote = calloc((size_t)shape.num_layers, sizeof(int64_t));
    o->quantized_upto = calloc((size_t)shape.num_layers, sizeof(int64_t));
    if (!o->layers || !o->qlayers || !o->h_win_idx || !o->h_q || !o->h_o || !o->h_k || !o->h_v || !o->h_src_slots ||
        !o->h_dst_slots || !o->n_tokens || !o->next_demote || !o->quantized_upto) {
        fail(o->err, sizeof o->err, "out of host memory");
        goto bad;
    }
    for (int32_t l = 0; l < shape.num_layers; l++) {
        okv_layer *L = &o->layers[l];
        const size_t win_bytes = (size_t)o->win_slots * re * sizeof(uint16_t), rb = sizeof(float) * (size_t)D * (size_t)D;
        if (mem_alloc(&o->m, &L->k_codes, code_bytes) || mem_alloc(&o->m, &L->v_codes, code_bytes) ||
            mem_alloc(&o->m, &L->k_scales, scale_bytes) || mem_alloc(&o->m, &L->v_scales, scale_bytes) ||
            mem_alloc(&o->m, &L->win_k, win_bytes) || mem_alloc(&o->m, &L->win_v, win_bytes))
            goto bad;
        if (desc->k_rotations &&
            (mem_alloc(&o->m, &L->rot_k, rb) || mem_put(&o->m, L->rot_k, desc->k_rotations + (size_t)l * D * D, rb)))
            goto bad;
        if (desc->v_rotations &&
            (mem_alloc(&o->m, &L->rot_v, rb) || mem_put(&o->m, L->rot_v, desc->v_rotations + (size_t)l * D * D, rb)))
            goto bad;
    }
    {
        int32_t *idx = malloc(sizeof(int32_t) * (size_t)o->int2_pages);
        if (!idx) { fail(o->err, sizeof o->err, "out of host memory"); goto bad; }
        for (int32_t i = 0; i < o->int2_pages; i++) idx[i] = i;
        int rc = mem_alloc(&o->m, &o->d_int2_idx, sizeof(int32_t) * (size_t)o->int2_pages) ||
                 mem_put(&o->m, o->d_int2_idx, idx, sizeof(int32_t) * (size_t)o->int2_pages);
        free(idx);
        if (rc) goto bad;
    }
    if (mem_alloc(&o->m, &o->d_int2_ip, 2 * sizeof(int32_t)) || mem_alloc(&o->m, &o->d_int2_last, sizeof(int32_t)) ||
        mem_alloc(&o->m, &o->d_win_ip, 2 * sizeof(int32_t)) || mem_alloc(&o->m, &o->d_win_last, sizeof(int32_t)) ||
        mem_alloc(&o->m, &o->d_win_idx, sizeof(int32_t) * ((size_t)o->win_slots + 1)) ||
        mem_alloc(&o->m, &o->d_q, (size_t)shape.num_heads * (size_t)D * sizeof(uint16_t)) ||
        mem_alloc(&o->m, &o->d_o, (size_t)shape.num_heads * (size_t)D * sizeof(uint16_t)) ||
        mem_alloc(&o->m, &o->d_src_slots, sizeof(int32_t) * (size_t)o->interval) ||
        mem_alloc(&o->m, &o->d_dst_slots, sizeof(int32_t) * (size_t)o->interval))
        goto bad;

    {
        oscar_decode_plan_desc pd = {0};
        pd.num_q_heads = shape.num_heads;
        pd.int2_pool = &o->pool;
        pd.window_pool = o->has_window_tier ? &o->win : NULL;
        pd.batch_size = 1;
        pd.max_int2_tokens = shape.max_tokens > o->sink ? shape.max_tokens - o->sink : 0;
        pd.max_window_tokens = o->win_slots;
        st = oscar_decode_plan(o->ctx, &pd, &o->plan);
        if (st != OSCAR_OK) { oscar_fail(o, st, "oscar_decode_plan"); goto bad; }
        if (o->plan.workspace_bytes > 0 && mem_alloc(&o->m, &o->workspace, o->plan.workspace_bytes)) goto bad;
    }
    okv_reset(b);
    return b;
bad:
    snprintf(err, errlen, "%s", o->err);
    okv_destroy(b);
    return NULL;
}

void kv_backend_oscar_stats(const kv_backend *b, kv_oscar_stats *out) {
    const okv *o = b->impl;
    *out = o->st;
}

const char *kv_backend_oscar_error(const kv_backend *b) {
    const okv *o = b->impl;
    return o->err;
}

int kv_backend_oscar_read_codes(kv_backend *b, int32_t layer, uint8_t *k, uint8_t *v, size_t *bytes) {
    okv *o = b->impl;
    size_t code_bytes = 0, scale_bytes = 0;
    if (layer < 0 || layer >= o->s.num_layers) return -1;
    if (oscar_int2_pool_bytes(o->ctx, &o->pool, &code_bytes, &scale_bytes) != OSCAR_OK) return -1;
    *bytes = code_bytes;
    if (!k && !v) return 0;
    if (k && mem_get(&o->m, k, o->layers[layer].k_codes, code_bytes)) return -1;
    if (v && mem_get(&o->m, v, o->layers[layer].v_codes, code_bytes)) return -1;
    return 0;
}

/* ------------------------------------------------------------------ qdq through oscar */

static int qdq_reserve(kv_oscar_qdq *q, int32_t rows, int32_t H, int32_t D) {
    if (rows <= q->cap_rows) return 0;
    kv_oscar_qdq_free(q);
    const size_t n = (size_t)rows * (size_t)H * (size_t)D;
    q->src = aligned_alloc(64, ((n * 2) + 63) & ~(size_t)63);
    q->deq = aligned_alloc(64, ((n * 2) + 63) & ~(size_t)63);
    q->slots = malloc(sizeof(int32_t) * (size_t)rows);
    q->codes = aligned_alloc(64, ((n / 4) + 63) & ~(size_t)63);
    q->codes_v = aligned_alloc(64, ((n / 4) + 63) & ~(size_t)63);
    /* room for up to 8 groups per row of (f32 scale, f32 zero) */
    q->scales = aligned_alloc(64, ((size_t)rows * (size_t)H * 64 + 63) & ~(size_t)63);
    q->scales_v = aligned_alloc(64, ((size_t)rows * (size_t)H * 64 + 63) & ~(size_t)63);
    if (!q->src || !q->deq || !q->slots || !q->codes || !q->codes_v || !q->scales || !q->scales_v) {
        kv_oscar_qdq_free(q);
        return -1;
    }
    for (int32_t i = 0; i < rows; i++) q->slots[i] = i;
    q->cap_rows = rows;
    return 0;
}

void kv_oscar_qdq_free(kv_oscar_qdq *q) {
    free(q->src), free(q->deq), free(q->slots), free(q->codes), free(q->codes_v), free(q->scales), free(q->scales_v);
    q->src = q->deq = NULL, q->slots = NULL, q->codes = q->codes_v = q->scales = q->scales_v = NULL;
    q->cap_rows = 0;
}

void kv_oscar_qdq_fn(void *user, int32_t layer, int is_v, int64_t pos0, int32_t n_tokens, float *rows,
                     int32_t num_kv_heads, int32_t head_dim) {
    kv_oscar_qdq *q = user;
    const int32_t H = num_kv_heads, D = head_dim;
    const size_t n = (size_t)n_tokens * (size_t)H * (size_t)D;
    (void)pos0;
    if (q->failed || n_tokens <= 0) return;
    if (qdq_reserve(q, n_tokens, H, D)) {
        q->failed = 1;
        snprintf(q->err, sizeof q->err, "qdq: out of memory");
        return;
    }
    const float *R = is_v ? (q->v_rotations ? q->v_rotations + (size_t)layer * D * D : NULL)
                          : (q->k_rotations ? q->k_rotations + (size_t)layer * D * D : NULL);
    const float clip = is_v ? q->v_clip_ratio : q->k_clip_ratio;
    for (size_t i = 0; i < n; i++) q->src[i] = f32_to_bf16(rows[i]);
    oscar_int2_pool_desc pool = {0};
    pool.head_dim = D, pool.num_kv_heads = H, pool.num_pages = n_tokens, pool.page_size = 1;
    pool.group_size = q->group_size > 0 ? q->group_size : D;
    pool.k_codes = q->codes, pool.v_codes = q->codes_v, pool.k_scales = q->scales, pool.v_scales = q->scales_v;
    /* the row goes through both sides of the quantizer with the same rotation and clip; K's result is used */
    oscar_quantize_desc qd = {0};
    qd.pool = &pool;
    qd.src_k = q->src, qd.src_v = q->src;
    qd.k_rotation = R, qd.v_rotation = R;
    qd.num_tokens = n_tokens;
    qd.dst_slots = q->slots;
    qd.k_clip_ratio = clip, qd.v_clip_ratio = clip;
    oscar_status st = oscar_quantize_kv(q->ctx, &qd, NULL);
    oscar_dequant_desc dq = {0};
    dq.slots = q->slots;
    dq.num_tokens = n_tokens;
    dq.k_out = q->deq;
    dq.out_dtype = OSCAR_DTYPE_BF16;
    if (st == OSCAR_OK) st = oscar_dequantize_kv(q->ctx, &pool, &dq, NULL);
    if (st != OSCAR_OK) {
        q->failed = 1;
        snprintf(q->err, sizeof q->err, "qdq: %s", oscar_last_error(q->ctx));
        return;
    }
    for (size_t r = 0; r < (size_t)n_tokens * (size_t)H; r++) {
        const uint16_t *y = q->deq + r * (size_t)D;
        float *x = rows + r * (size_t)D;
        if (!R) {
            for (int32_t i = 0; i < D; i++) x[i] = bf16_to_f32(y[i]);
            continue;
        }
        double yd[256];
        for (int32_t j = 0; j < D; j++) yd[j] = bf16_to_f32(y[j]);
        for (int32_t i = 0; i < D; i++) { /* x = y R^T: x_i = sum_j y_j R[i][j] */
            const float *Ri = R + (size_t)i * D;
            double acc = 0.0;
            for (int32_t j = 0; j < D; j++) acc += yd[j] * (double)Ri[j];
            x[i] = (float)acc;
        }
    }
}
