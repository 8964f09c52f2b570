/* bench/bench_decode_setup.h -- one decode benchmark problem on the current
   CUDA device, shared by the benchmark programs that time oscar's decode:
   the engine-side pools (INT2 history in pages of 16, HND; bf16 windows of
   64 sink + 256 recent tokens, NHD), shuffled page tables, the layer's
   rotations, the plan and its workspace, and the bytes one step must move.
   Inputs rotate over enough copies that the working set exceeds the L2, so a
   timed step reads from HBM as a real decode step does.
   Thread-safe: no global state (each problem has its own random stream);
   call it from the thread that owns the device (cudaSetDevice first).
   Needs oscar.h (with the implementation in the including file) and
   bench_util.h. */
#ifndef OSCAR_BENCH_DECODE_SETUP_H
#define OSCAR_BENCH_DECODE_SETUP_H

#include <math.h>
#include <stdio.h>
#include <stdint.h>

typedef struct bds_shape {
    int B;       /* requests */
    int64_t ctx; /* tokens per request: the last 320 (or all, if fewer) in the bf16 window, the rest INT2 */
    int D;       /* head dim */
} bds_shape;

/* --shape B:CTX:D (B, CTX >= 1, D in {64, 128, 256}) into *out; 0 when malformed (after saying so) */
static inline int bds_parse_shape(const char *arg, bds_shape *out) {
    long long c = 0;
    if (sscanf(arg, "%d:%lld:%d", &out->B, &c, &out->D) != 3 || out->B < 1 || c < 1 ||
        (out->D != 64 && out->D != 128 && out->D != 256)) {
        printf("--shape wants B:CTX:D with B, CTX >= 1 and D in {64, 128, 256}, got \"%s\"\n", arg);
        return 0;
    }
    out->ctx = c;
    return 1;
}

/* xorshift64: a stream per problem, so threads do not share a state */
typedef struct bds_rng {
    uint64_t s;
} bds_rng;
static inline uint64_t bds_next(bds_rng *r) {
    r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
    return r->s;
}
static inline double bds_normal(bds_rng *r) {
    double u = ((bds_next(r) >> 11) + 1) * (1.0 / 9007199254740993.0), v = (bds_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2 * log(u)) * cos(6.283185307179586 * v);
}

/* Device buffer of random contents: a host pattern of at most 16 MiB,
   repeated (making gigabytes of normals on the host is slow). kind 0:
   random bytes (codes), 1: bf16 normals, 2: f16 (scale, min) pairs. */
static inline void *bds_dev_fill(bds_rng *r, size_t bytes, int kind) {
    size_t n = bytes < ((size_t)16 << 20) ? bytes : ((size_t)16 << 20), i, off;
    uint8_t *h = (uint8_t *)malloc(n ? n : 16);
    void *d;
    if (!h) {
        fprintf(stderr, "bench: out of host memory\n");
        exit(1);
    }
    if (kind == 0)
        for (i = 0; i + 8 <= n; i += 8) {
            uint64_t x = bds_next(r);
            memcpy(h + i, &x, 8);
        }
    else if (kind == 1)
        for (i = 0; i + 2 <= n; i += 2) {
            uint16_t x = oscar__f32_to_bf16((float)bds_normal(r));
            memcpy(h + i, &x, 2);
        }
    else
        for (i = 0; i + 4 <= n; i += 4) {
            double range = 1.0 + 2.0 * fabs(bds_normal(r));
            uint16_t s = oscar__f32_to_f16((float)(range / 3)), m = oscar__f32_to_f16((float)(-range / 2));
            memcpy(h + i, &s, 2), memcpy(h + i + 2, &m, 2);
        }
    BU_CUDA(cudaMalloc(&d, bytes ? bytes : 16));
    for (off = 0; off < bytes; off += n)
        BU_CUDA(cudaMemcpy((char *)d + off, h, bytes - off < n ? bytes - off : n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

/* CSR tables: every request has len tokens in pages of ps, page ids shuffled
   (as an allocator hands them out over time). *num_pages: the pool's pages. */
static inline void bds_tables(bds_rng *r, int B, int64_t len, int ps, int32_t **d_ip, int32_t **d_idx, int32_t **d_last,
                              int32_t *num_pages) {
    int64_t np = (len + ps - 1) / ps, total = (int64_t)B * np, i;
    int32_t *ip = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B + 1));
    int32_t *idx = (int32_t *)malloc(sizeof(int32_t) * (size_t)(total + 1)), *last = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    int b;
    if (!ip || !idx || !last) {
        fprintf(stderr, "bench: out of host memory\n");
        exit(1);
    }
    for (i = 0; i < total; i++) idx[i] = (int32_t)i;
    for (i = total - 1; i > 0; i--) {
        int64_t j = (int64_t)(bds_next(r) % (uint64_t)(i + 1));
        int32_t t = idx[i];
        idx[i] = idx[j], idx[j] = t;
    }
    for (b = 0; b <= B; b++) ip[b] = (int32_t)(b * np);
    for (b = 0; b < B; b++) last[b] = np ? (int32_t)(len - (np - 1) * ps) : 1;
    BU_CUDA(cudaMalloc((void **)d_ip, sizeof(int32_t) * (size_t)(B + 1)));
    BU_CUDA(cudaMalloc((void **)d_idx, sizeof(int32_t) * (size_t)(total + 1)));
    BU_CUDA(cudaMalloc((void **)d_last, sizeof(int32_t) * (size_t)B));
    BU_CUDA(cudaMemcpy(*d_ip, ip, sizeof(int32_t) * (size_t)(B + 1), cudaMemcpyHostToDevice));
    BU_CUDA(cudaMemcpy(*d_idx, idx, sizeof(int32_t) * (size_t)(total + 1), cudaMemcpyHostToDevice));
    BU_CUDA(cudaMemcpy(*d_last, last, sizeof(int32_t) * (size_t)B, cudaMemcpyHostToDevice));
    *num_pages = (int32_t)(total + 1);
    free(ip), free(idx), free(last);
}

typedef struct bds_set { /* one copy of everything a step reads */
    void *kc, *vc, *ks, *vs, *wk, *wv, *q;
} bds_set;

/* One decode problem (one layer, 32 query / 8 KV heads) on one device. */
typedef struct bds_decode {
    oscar_ctx *ctx;
    bds_shape shape;
    int Hq, Hkv, int2_ps, wps;
    int64_t int2_tokens, window_tokens; /* per request */
    oscar_int2_pool_desc pool;
    oscar_window_pool_desc win;
    oscar_decode_plan_info plan;
    oscar_decode_run_desc rd;
    bds_set *sets;
    int nsets;
    int32_t *d_ip, *d_idx, *d_last, *d_wip, *d_widx, *d_wlast;
    void *ws, *o, *rk, *rv;
    cudaStream_t stream;  /* where steps run (0: the legacy default stream) */
    double bytes;         /* moved by one step: INT2 codes + scales, window K/V, q, page ids read; o written */
} bds_decode;

/* Sets up the problem on the current device for ctx (a context of that
   device). int2_layout: the INT2 pool's layout; int2_ps: its page size. */
static inline void bds_decode_setup(bds_decode *p, oscar_ctx *ctx, bds_shape S, oscar_kv_layout int2_layout, int int2_ps,
                                    uint64_t seed) {
    bds_rng r;
    size_t code_bytes, scale_bytes, win_bytes, q_bytes, set_bytes;
    int32_t int2_pages, win_pages;
    oscar_decode_plan_desc pd = {0};
    int k, x, y, D = S.D;
    float *R;
    memset(p, 0, sizeof *p);
    r.s = seed ? seed : 88172645463325252ULL;
    p->ctx = ctx, p->shape = S, p->Hq = 32, p->Hkv = 8, p->int2_ps = int2_ps, p->wps = 16;
    p->window_tokens = S.ctx < 320 ? S.ctx : 320;
    p->int2_tokens = S.ctx - p->window_tokens;
    bds_tables(&r, S.B, p->int2_tokens, int2_ps, &p->d_ip, &p->d_idx, &p->d_last, &int2_pages);
    bds_tables(&r, S.B, p->window_tokens, p->wps, &p->d_wip, &p->d_widx, &p->d_wlast, &win_pages);
    p->pool.head_dim = D, p->pool.num_kv_heads = p->Hkv, p->pool.num_pages = int2_pages, p->pool.page_size = int2_ps;
    p->pool.layout = int2_layout;
    BU_OK(ctx, oscar_int2_pool_bytes(ctx, &p->pool, &code_bytes, &scale_bytes));
    p->win.num_pages = win_pages, p->win.page_size = p->wps;
    win_bytes = (size_t)win_pages * p->wps * p->Hkv * D * 2;
    q_bytes = (size_t)S.B * p->Hq * D * 2;
    set_bytes = 2 * code_bytes + 2 * scale_bytes + 2 * win_bytes + q_bytes;
    p->nsets = (int)((256u << 20) / set_bytes) + 1; /* > 256 MB in all: several times the L2 */
    if (p->nsets > 48) p->nsets = 48;
    p->sets = (bds_set *)calloc((size_t)p->nsets, sizeof *p->sets);
    if (!p->sets) {
        fprintf(stderr, "bench: out of host memory\n");
        exit(1);
    }
    for (k = 0; k < p->nsets; k++) {
        bds_set *s = &p->sets[k];
        s->kc = bds_dev_fill(&r, code_bytes, 0), s->vc = bds_dev_fill(&r, code_bytes, 0);
        s->ks = bds_dev_fill(&r, scale_bytes, 2), s->vs = bds_dev_fill(&r, scale_bytes, 2);
        s->wk = bds_dev_fill(&r, win_bytes, 1), s->wv = bds_dev_fill(&r, win_bytes, 1), s->q = bds_dev_fill(&r, q_bytes, 1);
    }
    /* a normalised Walsh-Hadamard matrix stands in for the layer's rotations:
       the kernels' cost does not depend on the values */
    R = (float *)malloc(sizeof(float) * (size_t)D * D);
    if (!R) {
        fprintf(stderr, "bench: out of host memory\n");
        exit(1);
    }
    for (x = 0; x < D; x++)
        for (y = 0; y < D; y++) R[x * D + y] = (__builtin_popcount((unsigned)(x & y)) & 1 ? -1.0f : 1.0f) / sqrtf((float)D);
    BU_CUDA(cudaMalloc(&p->rk, sizeof(float) * (size_t)D * D));
    BU_CUDA(cudaMalloc(&p->rv, sizeof(float) * (size_t)D * D));
    BU_CUDA(cudaMemcpy(p->rk, R, sizeof(float) * (size_t)D * D, cudaMemcpyHostToDevice));
    BU_CUDA(cudaMemcpy(p->rv, R, sizeof(float) * (size_t)D * D, cudaMemcpyHostToDevice));
    free(R);
    pd.num_q_heads = p->Hq, pd.int2_pool = &p->pool, pd.window_pool = &p->win, pd.batch_size = S.B;
    pd.max_int2_tokens = p->int2_tokens, pd.max_window_tokens = (int32_t)p->window_tokens;
    BU_OK(ctx, oscar_decode_plan(ctx, &pd, &p->plan));
    BU_CUDA(cudaMalloc(&p->ws, p->plan.workspace_bytes ? p->plan.workspace_bytes : 16));
    BU_CUDA(cudaMalloc(&p->o, q_bytes));
    p->rd.int2_pool = &p->pool, p->rd.window_pool = &p->win;
    p->rd.int2_pages.indptr = p->d_ip, p->rd.int2_pages.indices = p->d_idx, p->rd.int2_pages.last_page_len = p->d_last;
    p->rd.window_pages.indptr = p->d_wip, p->rd.window_pages.indices = p->d_widx;
    p->rd.window_pages.last_page_len = p->d_wlast;
    p->rd.o = p->o, p->rd.k_rotation = (const float *)p->rk, p->rd.v_rotation = (const float *)p->rv;
    p->rd.sm_scale = 1.0f / sqrtf((float)D);
    p->rd.workspace = p->ws, p->rd.workspace_bytes = p->plan.workspace_bytes;
    {
        /* the bytes of one step, counted as bench_decode counts them */
        size_t int2_rows = (size_t)S.B * (size_t)((p->int2_tokens + int2_ps - 1) / int2_ps) * int2_ps * p->Hkv;
        size_t win_rows = (size_t)S.B * (size_t)((p->window_tokens + p->wps - 1) / p->wps) * p->wps * p->Hkv;
        size_t pages = (size_t)(S.B * ((p->int2_tokens + int2_ps - 1) / int2_ps)) * 4 + 16;
        p->bytes = 2.0 * (double)(int2_rows * (size_t)(D / 4)) + 2.0 * (double)(int2_rows * 4) +
                   2.0 * (double)(win_rows * (size_t)D * 2) + (double)q_bytes + (double)pages + (double)q_bytes;
    }
}

/* One decode step on copy rep % nsets, on p->stream. */
static inline void bds_decode_step(bds_decode *p, int rep) {
    bds_set *s = &p->sets[rep % p->nsets];
    p->pool.k_codes = s->kc, p->pool.v_codes = s->vc, p->pool.k_scales = s->ks, p->pool.v_scales = s->vs;
    p->win.k = s->wk, p->win.v = s->wv;
    p->rd.q = s->q;
    BU_OK(p->ctx, oscar_decode_run(p->ctx, &p->plan, &p->rd, (oscar_stream)p->stream));
}

/* Non-finite values in the last output (0 expected). */
static inline size_t bds_decode_nonfinite(const bds_decode *p) {
    size_t n = (size_t)p->shape.B * p->Hq * p->shape.D, j, bad = 0;
    uint16_t *h = (uint16_t *)malloc(n * 2);
    if (!h) return n;
    BU_CUDA(cudaMemcpy(h, p->o, n * 2, cudaMemcpyDeviceToHost));
    for (j = 0; j < n; j++) bad += (h[j] & 0x7F80) == 0x7F80;
    free(h);
    return bad;
}

static inline void bds_decode_free(bds_decode *p) {
    int k;
    for (k = 0; k < p->nsets; k++)
        cudaFree(p->sets[k].kc), cudaFree(p->sets[k].vc), cudaFree(p->sets[k].ks), cudaFree(p->sets[k].vs),
            cudaFree(p->sets[k].wk), cudaFree(p->sets[k].wv), cudaFree(p->sets[k].q);
    free(p->sets);
    cudaFree(p->ws), cudaFree(p->o), cudaFree(p->rk), cudaFree(p->rv);
    cudaFree(p->d_ip), cudaFree(p->d_idx), cudaFree(p->d_last), cudaFree(p->d_wip), cudaFree(p->d_widx), cudaFree(p->d_wlast);
    memset(p, 0, sizeof *p);
}

#endif
