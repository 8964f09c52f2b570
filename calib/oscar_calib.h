/* calib/oscar_calib.h -- part of the oscar.h implementation: calibration and
   rotation files (OSCAR-SPEC.md §6). Included last by oscar.h, so it can use
   src/, jit/ and cpu/.

   The accumulator keeps float64 sums per layer (layout in calib/oscar_calib_api.h):
       pass 1   S_Q[h] = Σ_t Σ_{j in group h} q_tj q_tjᵀ, tokens n (and Σ k kᵀ, Σ v vᵀ)
       pass 2   W[h] = Σ_t w_th, S_W[h] = Σ_t w_th v_th v_thᵀ, with w_th = k_th·C_qh·k_thᵀ
                and C_qh = S_Q[h] / (n · group) frozen at oscar_calib_begin_score_pass
   and finish forms the reference's targets (ROT/compute_kv_rotation.py):
       K   C_Q = mean_h S_Q[h] / (n · group)
       V   C_S = mean_h S_W[h] / max(W[h], 1e-12)     (= w normalised to mean 1)
   then eigendecomposes them (float64) and composes R = U·H·P_br.
   CPU backend: plain C on host memory. CUDA backend: oscar_kernels/calib.cuh. */
#ifndef OSCAR_CALIB_H_INCLUDED
#define OSCAR_CALIB_H_INCLUDED

#include "../oscar_kernels/calib_params.cuh"
#include "oscar_calib_math.h"
#include "oscar_calib_io.h"

/* ---- kernel registry ------------------------------------------------------------ */
static const int oscar__calib_head_dims[] = {64, 128, 256};

OSCAR__PRIVATE void oscar__name_calib(char *out, size_t cap, const char *kernel, int head_dim) {
    if (head_dim > 0)
        snprintf(out, cap, "oscar::%s<%d>", kernel, head_dim);
    else
        snprintf(out, cap, "oscar::%s", kernel);
}

OSCAR__PRIVATE void oscar__registry_build_calib(void) {
    char name[192];
    int d;
    for (d = 0; d < 3; d++) {
        oscar__name_calib(name, sizeof name, "calib_gram_kernel", oscar__calib_head_dims[d]);
        oscar__registry_add("calib.cuh", "%s", name);
        oscar__name_calib(name, sizeof name, "calib_reduce_kernel", oscar__calib_head_dims[d]);
        oscar__registry_add("calib.cuh", "%s", name);
        oscar__name_calib(name, sizeof name, "calib_weights_kernel", oscar__calib_head_dims[d]);
        oscar__registry_add("calib.cuh", "%s", name);
    }
    oscar__name_calib(name, sizeof name, "calib_sum_weights_kernel", 0);
    oscar__registry_add("calib.cuh", "%s", name);
}

/* ---- the accumulator ------------------------------------------------------------ */
#define OSCAR__CALIB_TILE 64
#define OSCAR__CALIB_TARGET_BLOCKS 512 /* gram blocks per launch: fixed, so results do not depend on the GPU */

struct oscar_calib {
    oscar_ctx *ctx;
    int32_t num_layers, head_dim, num_q_heads, num_kv_heads, group;
    int32_t skip_first_chunks, tensor_targets;
    int32_t *layer_ids;
    int32_t *chunks; /* non-empty calls per layer in the current pass */
    oscar_calib_pass pass;
    int64_t stride1, stride2; /* doubles per layer of pass-1 / pass-2 statistics */
    /* CPU backend */
    double *h_stats1, *h_stats2, *h_cq, *h_work;
    /* CUDA backend */
    oscar__CUdeviceptr d_stats1, d_stats2, d_cq, d_ws, d_w, d_stage;
    size_t ws_bytes, w_bytes, stage_bytes;
};

OSCAR__PRIVATE size_t oscar__calib_dd(const oscar_calib *c) {
    return OSCAR__CAST(size_t, c->head_dim) * OSCAR__CAST(size_t, c->head_dim);
}
OSCAR__PRIVATE int oscar__calib_on_device(const oscar_calib *c) { return c->ctx->backend == OSCAR_BACKEND_CUDA; }

/* Offsets (in doubles) inside one layer's statistics. */
OSCAR__PRIVATE size_t oscar__off_sq(const oscar_calib *c, int32_t h) {
    return 1 + OSCAR__CAST(size_t, h) * oscar__calib_dd(c);
}
OSCAR__PRIVATE size_t oscar__off_sk(const oscar_calib *c) {
    return 1 + OSCAR__CAST(size_t, c->num_kv_heads) * oscar__calib_dd(c);
}
OSCAR__PRIVATE size_t oscar__off_sv(const oscar_calib *c) { return oscar__off_sk(c) + oscar__calib_dd(c); }
OSCAR__PRIVATE size_t oscar__off_w(int32_t h) { return 1 + OSCAR__CAST(size_t, h); }
OSCAR__PRIVATE size_t oscar__off_sw(const oscar_calib *c, int32_t h) {
    return 1 + OSCAR__CAST(size_t, c->num_kv_heads) + OSCAR__CAST(size_t, h) * oscar__calib_dd(c);
}

/* Device allocation, zeroed; the caller holds no pushed context. */
OSCAR__PRIVATE oscar_status oscar__calib_dalloc(const oscar_calib *c, oscar__CUdeviceptr *out, size_t bytes) {
    const oscar_ctx *ctx = c->ctx;
    oscar__CUresult r;
    oscar_status st = oscar__push(ctx);
    if (st != OSCAR_OK) return st;
    r = ctx->cu.cuMemAlloc(out, bytes ? bytes : 8);
    if (r == 0) r = ctx->cu.cuMemsetD8Async(*out, 0, bytes ? bytes : 8, NULL);
    if (r == 0) r = ctx->cu.cuStreamSynchronize(NULL);
    oscar__pop(ctx);
    if (r != 0) {
        *out = 0;
        return oscar__cu_fail(ctx, r, "oscar_calib: cuMemAlloc of calibration statistics");
    }
    return OSCAR_OK;
}
OSCAR__PRIVATE void oscar__calib_dfree(const oscar_calib *c, oscar__CUdeviceptr *p) {
    if (!*p) return;
    if (oscar__push(c->ctx) == OSCAR_OK) {
        c->ctx->cu.cuMemFree(*p);
        oscar__pop(c->ctx);
    }
    *p = 0;
}
/* Grows a device workspace (after the stream has finished with it). */
OSCAR__PRIVATE oscar_status oscar__calib_ensure(oscar_calib *c, oscar__CUdeviceptr *buf, size_t *cap, size_t need,
                                                oscar_stream stream) {
    oscar__CUresult r;
    oscar_status st;
    if (*cap >= need) return OSCAR_OK;
    st = oscar__push(c->ctx);
    if (st != OSCAR_OK) return st;
    r = c->ctx->cu.cuStreamSynchronize(stream);
    oscar__pop(c->ctx);
    if (r != 0) return oscar__cu_fail(c->ctx, r, "oscar_calib: cuStreamSynchronize");
    oscar__calib_dfree(c, buf);
    *cap = 0;
    need += need / 4;
    st = oscar__calib_dalloc(c, buf, need);
    if (st == OSCAR_OK) *cap = need;
    return st;
}
OSCAR__PRIVATE oscar_status oscar__calib_d2h(const oscar_calib *c, void *dst, oscar__CUdeviceptr src, size_t bytes,
                                             oscar_stream stream) {
    oscar__CUresult r;
    oscar_status st = oscar__push(c->ctx);
    if (st != OSCAR_OK) return st;
    r = c->ctx->cu.cuStreamSynchronize(stream);
    if (r == 0 && bytes) r = c->ctx->cu.cuMemcpyDtoH(dst, src, bytes);
    oscar__pop(c->ctx);
    if (r != 0) return oscar__cu_fail(c->ctx, r, "oscar_calib: cuMemcpyDtoH");
    return OSCAR_OK;
}
/* Host to device, complete on return (later launches on any stream see it). */
OSCAR__PRIVATE oscar_status oscar__calib_h2d(const oscar_calib *c, oscar__CUdeviceptr dst, const void *src, size_t bytes,
                                             oscar_stream stream) {
    oscar__CUresult r;
    oscar_status st = oscar__push(c->ctx);
    if (st != OSCAR_OK) return st;
    r = c->ctx->cu.cuStreamSynchronize(stream);
    if (r == 0 && bytes) r = c->ctx->cu.cuMemcpyHtoD(dst, src, bytes);
    if (r == 0) r = c->ctx->cu.cuStreamSynchronize(NULL);
    oscar__pop(c->ctx);
    if (r != 0) return oscar__cu_fail(c->ctx, r, "oscar_calib: cuMemcpyHtoD");
    return OSCAR_OK;
}

OSCAR_API void oscar_calib_destroy(oscar_calib *c) {
    oscar_ctx *ctx;
    if (!c) return;
    ctx = c->ctx;
    oscar__calib_dfree(c, &c->d_stats1);
    oscar__calib_dfree(c, &c->d_stats2);
    oscar__calib_dfree(c, &c->d_cq);
    oscar__calib_dfree(c, &c->d_ws);
    oscar__calib_dfree(c, &c->d_w);
    oscar__calib_dfree(c, &c->d_stage);
    oscar__free(ctx, c->h_stats1);
    oscar__free(ctx, c->h_stats2);
    oscar__free(ctx, c->h_cq);
    oscar__free(ctx, c->h_work);
    oscar__free(ctx, c->layer_ids);
    oscar__free(ctx, c->chunks);
    oscar__free(ctx, c);
}

OSCAR_API oscar_status oscar_calib_create(oscar_ctx *ctx, const oscar_calib_desc *desc, oscar_calib **out_calib) {
    oscar__validator v;
    oscar_calib *c;
    oscar_status st;
    int32_t i, bad;
    size_t L, DD, stats1_bytes;
    int cuda;
    OSCAR__REQUIRE_CTX(ctx, "oscar_calib_create");
    if (!desc || !out_calib)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_calib_create: desc and out_calib must be non-NULL");
    *out_calib = NULL;
    cuda = ctx->backend == OSCAR_BACKEND_CUDA;
    oscar__validate_begin(&v, ctx, "oscar_calib_create");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, desc->num_layers >= 1, "desc.num_layers = %d; expected >= 1 (*must* be set)", desc->num_layers);
    if (cuda)
        OSCAR__VALIDATE(&v, desc->head_dim == 64 || desc->head_dim == 128 || desc->head_dim == 256,
                        "desc.head_dim = %d; expected 64, 128 or 256 on the CUDA backend", desc->head_dim);
    else
        OSCAR__VALIDATE(&v, oscar__is_pow2(desc->head_dim) && desc->head_dim >= 2 && desc->head_dim <= 1024,
                        "desc.head_dim = %d; expected a power of two in 2..1024 (the Hadamard needs one)", desc->head_dim);
    OSCAR__VALIDATE(&v, desc->num_q_heads >= 1 && desc->num_q_heads <= 4096, "desc.num_q_heads = %d; expected 1..4096",
                    desc->num_q_heads);
    OSCAR__VALIDATE(&v,
                    desc->num_kv_heads >= 1 && desc->num_kv_heads <= 1024 && desc->num_kv_heads <= desc->num_q_heads &&
                        desc->num_q_heads % desc->num_kv_heads == 0,
                    "desc.num_kv_heads = %d; expected 1..1024 dividing num_q_heads = %d", desc->num_kv_heads,
                    desc->num_q_heads);
    OSCAR__VALIDATE(&v, desc->skip_first_chunks >= 0, "desc.skip_first_chunks = %d; expected >= 0",
                    desc->skip_first_chunks);
    OSCAR__VALIDATE(&v, desc->tensor_targets == 0 || desc->tensor_targets == 1, "desc.tensor_targets = %d; expected 0 or 1",
                    desc->tensor_targets);
    if (desc->layer_ids && desc->num_layers >= 1) {
        bad = oscar__bad_layer_id(desc->layer_ids, desc->num_layers);
        OSCAR__VALIDATE(&v, bad < 0, "desc.layer_ids[%d] = %d; expected >= 0 and strictly ascending", bad,
                        bad >= 0 ? desc->layer_ids[bad] : 0);
    }
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;
    if (cuda && ctx->compile_only)
        return oscar__fail(ctx, OSCAR_STATUS_NEEDS_DEVICE,
                           "oscar_calib_create: the context is compile-only (sm_%d); calibration needs a device or the "
                           "CPU backend",
                           ctx->sm);

    c = OSCAR__CAST(oscar_calib *, oscar__calloc(ctx, sizeof *c));
    if (!c) return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_calib_create: out of memory");
    c->ctx = ctx;
    c->num_layers = desc->num_layers;
    c->head_dim = desc->head_dim;
    c->num_q_heads = desc->num_q_heads;
    c->num_kv_heads = desc->num_kv_heads;
    c->group = desc->num_q_heads / desc->num_kv_heads;
    c->skip_first_chunks = desc->skip_first_chunks;
    c->tensor_targets = desc->tensor_targets;
    c->pass = OSCAR_CALIB_PASS_QUERY;
    L = OSCAR__CAST(size_t, c->num_layers);
    DD = oscar__calib_dd(c);
    c->stride1 = OSCAR__CAST(int64_t, 1 + OSCAR__CAST(size_t, c->num_kv_heads) * DD + (c->tensor_targets ? 2 * DD : 0));
    c->stride2 = OSCAR__CAST(int64_t, 1 + OSCAR__CAST(size_t, c->num_kv_heads) * (1 + DD));
    c->layer_ids = OSCAR__CAST(int32_t *, oscar__alloc(ctx, sizeof(int32_t) * L));
    c->chunks = OSCAR__CAST(int32_t *, oscar__calloc(ctx, sizeof(int32_t) * L));
    if (!c->layer_ids || !c->chunks) {
        oscar_calib_destroy(c);
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_calib_create: out of memory");
    }
    for (i = 0; i < c->num_layers; i++) c->layer_ids[i] = desc->layer_ids ? desc->layer_ids[i] : i;
    stats1_bytes = sizeof(double) * L * OSCAR__CAST(size_t, c->stride1);
    if (cuda) {
        st = oscar__calib_dalloc(c, &c->d_stats1, stats1_bytes);
        if (st != OSCAR_OK) {
            oscar_calib_destroy(c);
            return st;
        }
    } else {
        c->h_stats1 = OSCAR__CAST(double *, oscar__calloc(ctx, stats1_bytes));
        /* one D×D partial and two blocks of 8 rows */
        c->h_work = OSCAR__CAST(double *, oscar__alloc(ctx, sizeof(double) * (DD + 16 * OSCAR__CAST(size_t, c->head_dim))));
        if (!c->h_stats1 || !c->h_work) {
            oscar_calib_destroy(c);
            return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY,
                               "oscar_calib_create: out of memory for %zu bytes of statistics", stats1_bytes);
        }
    }
    *out_calib = c;
    return OSCAR_OK;
}

/* ---- CPU backend -------------------------------------------------------------------- */
OSCAR__PRIVATE double oscar__calib_load(const void *x, int dtype, int64_t off) {
    if (dtype == OSCAR_K_DTYPE_F32) return OSCAR__CAST(const float *, x)[off];
    return oscar__to_f32(OSCAR__CAST(const uint16_t *, x)[off], dtype);
}

/* S[h] += Σ_rows (w·x) xᵀ for the rows of output head h (see calib_params.cuh),
   upper triangle in blocks of 8 rows, then mirrored: S stays exactly symmetric. */
OSCAR__PRIVATE void oscar__cpu_calib_gram(const oscar_calib *c, const void *x, int dtype, int64_t ts, int64_t hs,
                                          int64_t n, int32_t group, int32_t nheads, const double *w, double *S,
                                          int64_t S_head_stride) {
    const int32_t D = c->head_dim;
    const size_t Dz = OSCAR__CAST(size_t, D);
    double *T = c->h_work, *A = T + Dz * Dz, *B = A + 8 * Dz;
    const int64_t rows = n * group;
    int32_t h, a, b, rr;
    int64_t r0;
    for (h = 0; h < nheads; h++) {
        double *Sh = S + h * S_head_stride;
        memset(T, 0, sizeof(double) * Dz * Dz);
        for (r0 = 0; r0 < rows; r0 += 8) {
            for (rr = 0; rr < 8; rr++) {
                double *ar = A + OSCAR__CAST(size_t, rr) * Dz, *br = B + OSCAR__CAST(size_t, rr) * Dz;
                if (r0 + rr < rows) {
                    int64_t row = r0 + rr, t = row / group;
                    int64_t off = t * ts + (OSCAR__CAST(int64_t, h) * group + (row - t * group)) * hs;
                    double wt = w ? w[t * nheads + h] : 1.0;
                    for (a = 0; a < D; a++) {
                        double xv = oscar__calib_load(x, dtype, off + a);
                        ar[a] = wt * xv;
                        br[a] = xv;
                    }
                } else {
                    memset(ar, 0, sizeof(double) * Dz);
                    memset(br, 0, sizeof(double) * Dz);
                }
            }
            for (a = 0; a < D; a++) {
                const double a0 = A[a], a1 = A[Dz + OSCAR__CAST(size_t, a)], a2 = A[2 * Dz + OSCAR__CAST(size_t, a)],
                             a3 = A[3 * Dz + OSCAR__CAST(size_t, a)], a4 = A[4 * Dz + OSCAR__CAST(size_t, a)],
                             a5 = A[5 * Dz + OSCAR__CAST(size_t, a)], a6 = A[6 * Dz + OSCAR__CAST(size_t, a)],
                             a7 = A[7 * Dz + OSCAR__CAST(size_t, a)];
                double *Trow = T + OSCAR__CAST(size_t, a) * Dz;
                for (b = a; b < D; b++)
                    Trow[b] += a0 * B[b] + a1 * B[Dz + OSCAR__CAST(size_t, b)] + a2 * B[2 * Dz + OSCAR__CAST(size_t, b)] +
                               a3 * B[3 * Dz + OSCAR__CAST(size_t, b)] + a4 * B[4 * Dz + OSCAR__CAST(size_t, b)] +
                               a5 * B[5 * Dz + OSCAR__CAST(size_t, b)] + a6 * B[6 * Dz + OSCAR__CAST(size_t, b)] +
                               a7 * B[7 * Dz + OSCAR__CAST(size_t, b)];
            }
        }
        for (a = 0; a < D; a++)
            for (b = a; b < D; b++) {
                double t = T[OSCAR__CAST(size_t, a) * Dz + OSCAR__CAST(size_t, b)];
                Sh[OSCAR__CAST(size_t, a) * Dz + OSCAR__CAST(size_t, b)] += t;
                if (b != a) Sh[OSCAR__CAST(size_t, b) * Dz + OSCAR__CAST(size_t, a)] += t;
            }
    }
}

/* w[t][h] = k_th · C[h] · k_thᵀ (float64); wsum[h] += Σ_t w[t][h]. */
OSCAR__PRIVATE void oscar__cpu_calib_weights(const oscar_calib *c, const void *k, int dtype, int64_t ts, int64_t hs,
                                             int64_t n, const double *cq, double *w, double *wsum) {
    const int32_t D = c->head_dim, H = c->num_kv_heads;
    const size_t Dz = OSCAR__CAST(size_t, D);
    double *kd = c->h_work; /* D doubles */
    int64_t t;
    int32_t h, a, b;
    for (h = 0; h < H; h++) {
        const double *C = cq + OSCAR__CAST(size_t, h) * Dz * Dz;
        double sum = 0.0;
        for (t = 0; t < n; t++) {
            double acc = 0.0;
            int64_t off = t * ts + OSCAR__CAST(int64_t, h) * hs;
            for (a = 0; a < D; a++) kd[a] = oscar__calib_load(k, dtype, off + a);
            for (a = 0; a < D; a++) {
                double u = 0.0;
                const double *Crow = C + OSCAR__CAST(size_t, a) * Dz;
                for (b = 0; b < D; b++) u += Crow[b] * kd[b];
                acc += kd[a] * u;
            }
            w[t * H + h] = acc;
            sum += acc;
        }
        wsum[h] += sum;
    }
}

/* ---- CUDA backend -------------------------------------------------------------------- */
OSCAR__PRIVATE oscar_status oscar__cuda_calib_gram(oscar_calib *c, oscar_stream stream, uint64_t x, int dtype, int64_t ts,
                                                   int64_t hs, int64_t n, int32_t group, int32_t nheads,
                                                   uint64_t weights, uint64_t acc, uint64_t count) {
    oscar_calib_gram_params p;
    oscar__kernel *kg, *kr;
    char name[192];
    oscar_status st;
    const int32_t nb = c->head_dim / OSCAR__CALIB_TILE, nt = nb * (nb + 1) / 2;
    const int64_t rows = n * group, per_split = OSCAR__CAST(int64_t, nt) * nheads;
    int64_t splits = (OSCAR__CALIB_TARGET_BLOCKS + per_split - 1) / per_split, rps;
    size_t ws;
    splits = OSCAR__MAX(OSCAR__CAST(int64_t, 1), OSCAR__MIN(splits, OSCAR__CAST(int64_t, 64)));
    splits = OSCAR__MIN(splits, (rows + 63) / 64);
    if (splits < 1) splits = 1;
    rps = (rows + splits - 1) / splits;
    rps = (rps + 15) / 16 * 16;
    splits = (rows + rps - 1) / rps;
    ws = sizeof(double) * OSCAR__CAST(size_t, splits * per_split) * OSCAR__CALIB_TILE * OSCAR__CALIB_TILE;
    st = oscar__calib_ensure(c, &c->d_ws, &c->ws_bytes, ws, stream);
    if (st != OSCAR_OK) return st;
    memset(&p, 0, sizeof p);
    p.x = x;
    p.weights = weights;
    p.partials = c->d_ws;
    p.acc = acc;
    p.count = count;
    p.num_tokens = n;
    p.token_stride = ts;
    p.head_stride = hs;
    p.rows_per_split = rps;
    p.count_add = n;
    p.group = group;
    p.num_heads = nheads;
    p.num_splits = OSCAR__CAST(int32_t, splits);
    p.dtype = dtype;
    oscar__name_calib(name, sizeof name, "calib_gram_kernel", c->head_dim);
    st = oscar__jit_get(c->ctx, "calib.cuh", name, &kg);
    if (st != OSCAR_OK) return st;
    oscar__name_calib(name, sizeof name, "calib_reduce_kernel", c->head_dim);
    st = oscar__jit_get(c->ctx, "calib.cuh", name, &kr);
    if (st != OSCAR_OK) return st;
    st = oscar__launch3(c->ctx, kg, OSCAR__CAST(unsigned, nt), OSCAR__CAST(unsigned, nheads), OSCAR__CAST(unsigned, splits),
                       256, 0, stream, &p);
    if (st != OSCAR_OK) return st;
    return oscar__launch3(c->ctx, kr, OSCAR__CAST(unsigned, nt), OSCAR__CAST(unsigned, nheads), 1, 256, 0, stream, &p);
}

OSCAR__PRIVATE oscar_status oscar__cuda_calib_weights(oscar_calib *c, oscar_stream stream, uint64_t k, int dtype,
                                                      int64_t ts, int64_t hs, int64_t n, uint64_t cq, uint64_t wsum) {
    oscar_calib_weight_params p;
    oscar__kernel *kw, *ks;
    char name[192];
    oscar_status st;
    st = oscar__calib_ensure(c, &c->d_w, &c->w_bytes,
                             sizeof(double) * OSCAR__CAST(size_t, n) * OSCAR__CAST(size_t, c->num_kv_heads), stream);
    if (st != OSCAR_OK) return st;
    memset(&p, 0, sizeof p);
    p.k = k;
    p.cq = cq;
    p.weights = c->d_w;
    p.wsum = wsum;
    p.num_tokens = n;
    p.token_stride = ts;
    p.head_stride = hs;
    p.num_heads = c->num_kv_heads;
    p.dtype = dtype;
    oscar__name_calib(name, sizeof name, "calib_weights_kernel", c->head_dim);
    st = oscar__jit_get(c->ctx, "calib.cuh", name, &kw);
    if (st != OSCAR_OK) return st;
    oscar__name_calib(name, sizeof name, "calib_sum_weights_kernel", 0);
    st = oscar__jit_get(c->ctx, "calib.cuh", name, &ks);
    if (st != OSCAR_OK) return st;
    st = oscar__launch3(c->ctx, kw, OSCAR__CAST(unsigned, (n + 15) / 16), OSCAR__CAST(unsigned, c->num_kv_heads), 1, 256,
                       0, stream, &p);
    if (st != OSCAR_OK) return st;
    return oscar__launch3(c->ctx, ks, OSCAR__CAST(unsigned, c->num_kv_heads), 1, 1, 256, 0, stream, &p);
}

/* ---- accumulate ------------------------------------------------------------------------ */
typedef struct oscar__calib_src {
    const void *p;
    int64_t ts, hs;
    int32_t heads;
    const char *name;
} oscar__calib_src;

OSCAR__PRIVATE size_t oscar__calib_span(const oscar__calib_src *s, int64_t n, int32_t D, size_t esize) {
    return OSCAR__CAST(size_t, (n - 1) * s->ts + OSCAR__CAST(int64_t, s->heads - 1) * s->hs + D) * esize;
}

OSCAR_API oscar_status oscar_calib_accumulate(oscar_calib *c, const oscar_calib_batch_desc *batch, oscar_stream stream) {
    static const char *func = "oscar_calib_accumulate";
    oscar__validator v;
    oscar_calib_batch_desc b;
    oscar__calib_src src[3]; /* q, k, v */
    int need[3], i, dtype;
    int32_t li;
    size_t esize;
    oscar_status st;
    if (!c) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "%s: calib = NULL", func);
    oscar__clear_error(c->ctx);
    if (!batch) return oscar__fail(c->ctx, OSCAR_STATUS_INVALID_ARGUMENT, "%s: batch = NULL", func);
    b = *batch;
    b.dtype = oscar__def(b.dtype, OSCAR_DTYPE_BF16);
    li = oscar__find_layer_id(c->layer_ids, c->num_layers, b.layer_id);
    need[0] = c->pass == OSCAR_CALIB_PASS_QUERY;
    need[1] = need[2] = c->pass == OSCAR_CALIB_PASS_SCORE || c->tensor_targets;
    src[0].p = b.q, src[0].ts = oscar__def(b.q_token_stride, OSCAR__CAST(int64_t, c->num_q_heads) * c->head_dim);
    src[0].hs = oscar__def(b.q_head_stride, c->head_dim), src[0].heads = c->num_q_heads, src[0].name = "q";
    src[1].p = b.k, src[1].ts = oscar__def(b.k_token_stride, OSCAR__CAST(int64_t, c->num_kv_heads) * c->head_dim);
    src[1].hs = oscar__def(b.k_head_stride, c->head_dim), src[1].heads = c->num_kv_heads, src[1].name = "k";
    src[2].p = b.v, src[2].ts = oscar__def(b.v_token_stride, OSCAR__CAST(int64_t, c->num_kv_heads) * c->head_dim);
    src[2].hs = oscar__def(b.v_head_stride, c->head_dim), src[2].heads = c->num_kv_heads, src[2].name = "v";
    esize = b.dtype == OSCAR_DTYPE_F32 ? 4 : 2;

    oscar__validate_begin(&v, c->ctx, func);
    OSCAR__CHECK_CANARIES(&v, batch, "batch");
    OSCAR__VALIDATE(&v, li >= 0, "batch.layer_id = %d; not a layer of this accumulator (%d layers, ids %d..%d)",
                    b.layer_id, c->num_layers, c->layer_ids[0], c->layer_ids[c->num_layers - 1]);
    OSCAR__VALIDATE(&v, b.num_tokens >= 0, "batch.num_tokens = %lld; expected >= 0", OSCAR__CAST(long long, b.num_tokens));
    OSCAR__VALIDATE(&v, b.dtype == OSCAR_DTYPE_BF16 || b.dtype == OSCAR_DTYPE_F16 || b.dtype == OSCAR_DTYPE_F32,
                    "batch.dtype = %s; expected bf16, f16 or f32", oscar__dtype_name(b.dtype));
    OSCAR__VALIDATE(&v, b.host_memory == 0 || b.host_memory == 1, "batch.host_memory = %d; expected 0 or 1", b.host_memory);
    for (i = 0; i < 3; i++) {
        if (!need[i]) continue;
        OSCAR__VALIDATE(&v, src[i].p || b.num_tokens == 0, "batch.%s = NULL; *must* be set in pass %d%s", src[i].name,
                        OSCAR__CAST(int, c->pass), i && c->pass == OSCAR_CALIB_PASS_QUERY ? " with tensor_targets" : "");
        OSCAR__VALIDATE(&v, src[i].ts >= 0 && src[i].hs >= 0, "batch.%s_token_stride = %lld, %s_head_stride = %lld; expected >= 0",
                        src[i].name, OSCAR__CAST(long long, src[i].ts), src[i].name, OSCAR__CAST(long long, src[i].hs));
        OSCAR__VALIDATE(&v, OSCAR__RCAST(uintptr_t, src[i].p) % esize == 0, "batch.%s = %p; expected %zu-byte aligned",
                        src[i].name, src[i].p, esize);
    }
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK || b.num_tokens == 0) return st;
    if (++c->chunks[li] <= c->skip_first_chunks) return OSCAR_OK; /* the warm-up chunk(s) of this layer */
    dtype = b.dtype == OSCAR_DTYPE_F32 ? OSCAR_K_DTYPE_F32 : b.dtype == OSCAR_DTYPE_F16 ? OSCAR_K_DTYPE_F16 : OSCAR_K_DTYPE_BF16;

    if (!oscar__calib_on_device(c)) {
        double *s1 = c->h_stats1 + OSCAR__CAST(size_t, li) * OSCAR__CAST(size_t, c->stride1);
        if (c->pass == OSCAR_CALIB_PASS_QUERY) {
            oscar__cpu_calib_gram(c, b.q, dtype, src[0].ts, src[0].hs, b.num_tokens, c->group, c->num_kv_heads, NULL,
                                  s1 + 1, OSCAR__CAST(int64_t, oscar__calib_dd(c)));
            if (c->tensor_targets) {
                oscar__cpu_calib_gram(c, b.k, dtype, src[1].ts, src[1].hs, b.num_tokens, c->num_kv_heads, 1, NULL,
                                      s1 + oscar__off_sk(c), 0);
                oscar__cpu_calib_gram(c, b.v, dtype, src[2].ts, src[2].hs, b.num_tokens, c->num_kv_heads, 1, NULL,
                                      s1 + oscar__off_sv(c), 0);
            }
            s1[0] += OSCAR__CAST(double, b.num_tokens);
        } else {
            double *s2 = c->h_stats2 + OSCAR__CAST(size_t, li) * OSCAR__CAST(size_t, c->stride2);
            double *w = OSCAR__CAST(double *, oscar__alloc(c->ctx, sizeof(double) * OSCAR__CAST(size_t, b.num_tokens) *
                                                                      OSCAR__CAST(size_t, c->num_kv_heads)));
            if (!w) return oscar__fail(c->ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory for the score weights", func);
            oscar__cpu_calib_weights(c, b.k, dtype, src[1].ts, src[1].hs, b.num_tokens,
                                     c->h_cq + OSCAR__CAST(size_t, li) * OSCAR__CAST(size_t, c->num_kv_heads) *
                                                   oscar__calib_dd(c),
                                     w, s2 + 1);
            oscar__cpu_calib_gram(c, b.v, dtype, src[2].ts, src[2].hs, b.num_tokens, 1, c->num_kv_heads, w,
                                  s2 + oscar__off_sw(c, 0), OSCAR__CAST(int64_t, oscar__calib_dd(c)));
            oscar__free(c->ctx, w);
            s2[0] += OSCAR__CAST(double, b.num_tokens);
        }
        return OSCAR_OK;
    }

    {
        uint64_t addr[3];
        for (i = 0; i < 3; i++) addr[i] = OSCAR__RCAST(uint64_t, src[i].p);
        if (b.host_memory) { /* stage the needed tensors' spans on the device */
            size_t off[3], total = 0;
            for (i = 0; i < 3; i++) {
                off[i] = total;
                if (need[i]) total += (oscar__calib_span(&src[i], b.num_tokens, c->head_dim, esize) + 255) / 256 * 256;
            }
            st = oscar__calib_ensure(c, &c->d_stage, &c->stage_bytes, total, stream);
            for (i = 0; i < 3 && st == OSCAR_OK; i++) {
                if (!need[i]) continue;
                st = oscar__calib_h2d(c, c->d_stage + off[i], src[i].p,
                                      oscar__calib_span(&src[i], b.num_tokens, c->head_dim, esize), stream);
                addr[i] = c->d_stage + off[i];
            }
            if (st != OSCAR_OK) return st;
        }
        if (c->pass == OSCAR_CALIB_PASS_QUERY) {
            uint64_t s1 = c->d_stats1 + sizeof(double) * OSCAR__CAST(size_t, li) * OSCAR__CAST(size_t, c->stride1);
            st = oscar__cuda_calib_gram(c, stream, addr[0], dtype, src[0].ts, src[0].hs, b.num_tokens, c->group,
                                        c->num_kv_heads, 0, s1 + 8 * oscar__off_sq(c, 0), s1);
            if (st == OSCAR_OK && c->tensor_targets)
                st = oscar__cuda_calib_gram(c, stream, addr[1], dtype, src[1].ts, src[1].hs, b.num_tokens,
                                            c->num_kv_heads, 1, 0, s1 + 8 * oscar__off_sk(c), 0);
            if (st == OSCAR_OK && c->tensor_targets)
                st = oscar__cuda_calib_gram(c, stream, addr[2], dtype, src[2].ts, src[2].hs, b.num_tokens,
                                            c->num_kv_heads, 1, 0, s1 + 8 * oscar__off_sv(c), 0);
        } else {
            uint64_t s2 = c->d_stats2 + sizeof(double) * OSCAR__CAST(size_t, li) * OSCAR__CAST(size_t, c->stride2);
            uint64_t cq = c->d_cq + sizeof(double) * OSCAR__CAST(size_t, li) * OSCAR__CAST(size_t, c->num_kv_heads) *
                                        oscar__calib_dd(c);
            st = oscar__cuda_calib_weights(c, stream, addr[1], dtype, src[1].ts, src[1].hs, b.num_tokens, cq,
                                           s2 + 8 * oscar__off_w(0));
            if (st == OSCAR_OK)
                st = oscar__cuda_calib_gram(c, stream, addr[2], dtype, src[2].ts, src[2].hs, b.num_tokens, 1,
                                            c->num_kv_heads, c->d_w, s2 + 8 * oscar__off_sw(c, 0), s2);
        }
        return st;
    }
}

/* ---- passes, statistics ------------------------------------------------------------------- */

/* The pass-1 statistics on the host (a copy for the CUDA backend, to free with
   oscar__calib_host_free). */
OSCAR__PRIVATE oscar_status oscar__calib_host_stats(oscar_calib *c, int pass, oscar_stream stream, double **out) {
    size_t count = OSCAR__CAST(size_t, c->num_layers) * OSCAR__CAST(size_t, pass == 1 ? c->stride1 : c->stride2);
    double *h;
    oscar_status st;
    if (!oscar__calib_on_device(c)) {
        *out = pass == 1 ? c->h_stats1 : c->h_stats2;
        return OSCAR_OK;
    }
    h = OSCAR__CAST(double *, oscar__alloc(c->ctx, sizeof(double) * count));
    if (!h) return oscar__fail(c->ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_calib: out of memory for %zu statistics", count);
    st = oscar__calib_d2h(c, h, pass == 1 ? c->d_stats1 : c->d_stats2, sizeof(double) * count, stream);
    if (st != OSCAR_OK) {
        oscar__free(c->ctx, h);
        return st;
    }
    *out = h;
    return OSCAR_OK;
}
OSCAR__PRIVATE void oscar__calib_host_free(oscar_calib *c, double *h) {
    if (oscar__calib_on_device(c)) oscar__free(c->ctx, h);
}

OSCAR_API oscar_status oscar_calib_begin_score_pass(oscar_calib *c, oscar_stream stream) {
    static const char *func = "oscar_calib_begin_score_pass";
    size_t DD, L, H, l, h, a, b, cq_count, s2_count;
    double *s1 = NULL, *cq;
    oscar_status st;
    if (!c) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "%s: calib = NULL", func);
    oscar__clear_error(c->ctx);
    if (c->pass != OSCAR_CALIB_PASS_QUERY)
        return oscar__fail(c->ctx, OSCAR_STATUS_INVALID_ARGUMENT, "%s: the score pass has already begun", func);
    DD = oscar__calib_dd(c);
    L = OSCAR__CAST(size_t, c->num_layers);
    H = OSCAR__CAST(size_t, c->num_kv_heads);
    cq_count = L * H * DD;
    s2_count = L * OSCAR__CAST(size_t, c->stride2);
    st = oscar__calib_host_stats(c, 1, stream, &s1);
    if (st != OSCAR_OK) return st;
    cq = OSCAR__CAST(double *, oscar__alloc(c->ctx, sizeof(double) * cq_count));
    if (!cq) {
        oscar__calib_host_free(c, s1);
        return oscar__fail(c->ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
    }
    /* C_qh = S_Q[h] / (n · group), symmetrised, as the reference's Q_hᵀQ_h / (n·r) */
    for (l = 0; l < L; l++) {
        const double *S = s1 + l * OSCAR__CAST(size_t, c->stride1);
        double n = S[0], scale = n > 0 ? 1.0 / (n * c->group) : 0.0;
        for (h = 0; h < H; h++) {
            const double *Sh = S + 1 + h * DD;
            double *C = cq + (l * H + h) * DD;
            for (a = 0; a < OSCAR__CAST(size_t, c->head_dim); a++)
                for (b = 0; b < OSCAR__CAST(size_t, c->head_dim); b++)
                    C[a * OSCAR__CAST(size_t, c->head_dim) + b] =
                        0.5 * (Sh[a * OSCAR__CAST(size_t, c->head_dim) + b] + Sh[b * OSCAR__CAST(size_t, c->head_dim) + a]) *
                        scale;
        }
    }
    oscar__calib_host_free(c, s1);
    if (!oscar__calib_on_device(c)) {
        c->h_stats2 = OSCAR__CAST(double *, oscar__calloc(c->ctx, sizeof(double) * s2_count));
        if (!c->h_stats2) {
            oscar__free(c->ctx, cq);
            return oscar__fail(c->ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
        }
        c->h_cq = cq;
    } else {
        st = oscar__calib_dalloc(c, &c->d_cq, sizeof(double) * cq_count);
        if (st == OSCAR_OK) st = oscar__calib_h2d(c, c->d_cq, cq, sizeof(double) * cq_count, stream);
        if (st == OSCAR_OK) st = oscar__calib_dalloc(c, &c->d_stats2, sizeof(double) * s2_count);
        oscar__free(c->ctx, cq);
        if (st != OSCAR_OK) return st;
    }
    c->pass = OSCAR_CALIB_PASS_SCORE;
    memset(c->chunks, 0, sizeof(int32_t) * L);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_calib_stats_view(oscar_calib *c, oscar_calib_stats *out) {
    int p1;
    if (!c || !out)
        return oscar__fail(c ? c->ctx : NULL, OSCAR_STATUS_INVALID_ARGUMENT,
                           "oscar_calib_stats_view: calib and out_stats must be non-NULL");
    p1 = c->pass == OSCAR_CALIB_PASS_QUERY;
    out->pass = c->pass;
    out->count = OSCAR__CAST(int64_t, c->num_layers) * (p1 ? c->stride1 : c->stride2);
    out->on_device = oscar__calib_on_device(c);
    if (out->on_device)
        out->data = OSCAR__RCAST(double *, OSCAR__CAST(uintptr_t, p1 ? c->d_stats1 : c->d_stats2));
    else
        out->data = p1 ? c->h_stats1 : c->h_stats2;
    return OSCAR_OK;
}

OSCAR__PRIVATE oscar_status oscar__calib_copy_stats(oscar_calib *c, const char *func, double *dst, const double *src,
                                                    int64_t count, oscar_stream stream) {
    oscar_calib_stats view;
    oscar_calib_stats_view(c, &view);
    if ((!dst && !src) || count != view.count)
        return oscar__fail(c->ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                           "%s: count = %lld; expected %lld doubles (pass %d statistics) and a non-NULL buffer", func,
                           OSCAR__CAST(long long, count), OSCAR__CAST(long long, view.count), OSCAR__CAST(int, view.pass));
    if (!view.on_device) {
        if (dst)
            memcpy(dst, view.data, sizeof(double) * OSCAR__CAST(size_t, count));
        else if (src)
            memcpy(view.data, src, sizeof(double) * OSCAR__CAST(size_t, count));
        return OSCAR_OK;
    }
    if (dst)
        return oscar__calib_d2h(c, dst, OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, view.data)),
                                sizeof(double) * OSCAR__CAST(size_t, count), stream);
    return oscar__calib_h2d(c, OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, view.data)), src,
                            sizeof(double) * OSCAR__CAST(size_t, count), stream);
}
OSCAR_API oscar_status oscar_calib_export_stats(oscar_calib *c, double *host_dst, int64_t count, oscar_stream stream) {
    if (!c) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_calib_export_stats: calib = NULL");
    oscar__clear_error(c->ctx);
    return oscar__calib_copy_stats(c, "oscar_calib_export_stats", host_dst, NULL, host_dst ? count : -1, stream);
}
OSCAR_API oscar_status oscar_calib_import_stats(oscar_calib *c, const double *host_src, int64_t count, oscar_stream stream) {
    if (!c) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_calib_import_stats: calib = NULL");
    oscar__clear_error(c->ctx);
    return oscar__calib_copy_stats(c, "oscar_calib_import_stats", NULL, host_src, host_src ? count : -1, stream);
}

/* ---- finish ------------------------------------------------------------------------------ */
OSCAR__PRIVATE const char *oscar__target_name(oscar_calib_target t) {
    switch (t) {
    case OSCAR_CALIB_TARGET_QUERY: return "qqt";
    case OSCAR_CALIB_TARGET_KEY: return "ktk";
    case OSCAR_CALIB_TARGET_SCORE: return "sst";
    case OSCAR_CALIB_TARGET_VALUE: return "vtv";
    default: return "?";
    }
}

/* The covariance target of every layer (L D×D matrices), as the reference forms them. */
OSCAR__PRIVATE oscar_status oscar__calib_targets(oscar_calib *c, const char *func, oscar_calib_target target,
                                                 const double *s1, const double *s2, double *out) {
    size_t DD = oscar__calib_dd(c), D = OSCAR__CAST(size_t, c->head_dim), l, h, i;
    int32_t H = c->num_kv_heads, hh;
    for (l = 0; l < OSCAR__CAST(size_t, c->num_layers); l++) {
        const double *S1 = s1 + l * OSCAR__CAST(size_t, c->stride1);
        double *C = out + l * DD, n1 = S1[0];
        int need2 = target == OSCAR_CALIB_TARGET_SCORE;
        const double *S2 = need2 ? s2 + l * OSCAR__CAST(size_t, c->stride2) : NULL;
        double n = need2 ? S2[0] : n1;
        if (!(n > 0))
            return oscar__fail(c->ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                               "%s: layer %d received no tokens in pass %d (after skip_first_chunks = %d)", func,
                               c->layer_ids[l], need2 ? 2 : 1, c->skip_first_chunks);
        memset(C, 0, sizeof(double) * DD);
        switch (target) {
        case OSCAR_CALIB_TARGET_QUERY: /* C_Q = mean_h S_Q[h] / (n · group) */
            for (hh = 0; hh < H; hh++) {
                const double *Sh = S1 + oscar__off_sq(c, hh);
                for (i = 0; i < DD; i++) C[i] += Sh[i] / (n * c->group);
            }
            for (i = 0; i < DD; i++) C[i] /= H;
            break;
        case OSCAR_CALIB_TARGET_KEY:
        case OSCAR_CALIB_TARGET_VALUE: { /* mean_h K_hᵀK_h / n */
            const double *Sx = S1 + (target == OSCAR_CALIB_TARGET_KEY ? oscar__off_sk(c) : oscar__off_sv(c));
            for (i = 0; i < DD; i++) C[i] = Sx[i] / (n * H);
            break;
        }
        default: /* SCORE: C_S = mean_h S_W[h] / max(Σw, 1e-12) */
            for (hh = 0; hh < H; hh++) {
                const double *Sh = S2 + oscar__off_sw(c, hh);
                double wsum = OSCAR__MAX(S2[oscar__off_w(hh)], 1e-12);
                for (i = 0; i < DD; i++) C[i] += Sh[i] / wsum;
            }
            for (i = 0; i < DD; i++) C[i] /= H;
            break;
        }
        for (i = 0; i < D; i++) /* symmetrise, (C + Cᵀ)/2 */
            for (h = i + 1; h < D; h++) {
                double s = 0.5 * (C[i * D + h] + C[h * D + i]);
                C[i * D + h] = C[h * D + i] = s;
            }
    }
    return OSCAR_OK;
}

/* Eigendecomposes the targets and composes the rotation set. */
OSCAR__PRIVATE oscar_status oscar__calib_fit(oscar_calib *c, const char *func, const oscar_calib_finish_desc *d,
                                             oscar_calib_target target, double *mats, oscar_stream stream,
                                             oscar_rotation_set **out) {
    size_t DD = oscar__calib_dd(c), D = OSCAR__CAST(size_t, c->head_dim), L = OSCAR__CAST(size_t, c->num_layers), l, i;
    double *evals = NULL, *R = NULL, *work = NULL;
    int32_t *iwork = NULL;
    oscar_rotation_set *s = NULL;
    oscar_status st;
    char objective[OSCAR__OBJECTIVE_CAP];
    evals = OSCAR__CAST(double *, oscar__alloc(c->ctx, sizeof(double) * L * D));
    R = OSCAR__CAST(double *, oscar__alloc(c->ctx, sizeof(double) * (DD + 2 * D)));
    iwork = OSCAR__CAST(int32_t *, oscar__alloc(c->ctx, sizeof(int32_t) * 2 * D));
    if (!evals || !R || !iwork) {
        st = oscar__fail(c->ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
        goto out;
    }
    work = R + DD;
    /* data-free compositions (H, IDENTITY) ignore U but still report the spectrum */
    st = oscar__eigh(c->ctx, func, d->eigensolver, c->head_dim, c->num_layers, mats, evals, stream);
    if (st != OSCAR_OK) goto out;
    st = oscar__rotation_set_new(c->ctx, func, c->num_layers, c->head_dim, 1, &s);
    if (st != OSCAR_OK) goto out;
    for (l = 0; l < L; l++) {
        oscar__compose(c->head_dim, d->composition, mats + l * DD, evals + l * D, R, work, iwork);
        for (i = 0; i < DD; i++) s->rotations[l * DD + i] = OSCAR__CAST(float, R[i]);
        for (i = 0; i < D; i++) s->eigenvalues[l * D + i] = OSCAR__CAST(float, evals[l * D + i]);
        s->layer_ids[l] = c->layer_ids[l];
    }
    if (d->composition == OSCAR_ROTATION_H || d->composition == OSCAR_ROTATION_IDENTITY)
        snprintf(objective, sizeof objective, "%s", oscar__composition_name(d->composition));
    else
        snprintf(objective, sizeof objective, "%s_%s", oscar__target_name(target), oscar__composition_name(d->composition));
    oscar__set_objective(s, objective);
    *out = s;
out:
    oscar__free(c->ctx, evals);
    oscar__free(c->ctx, R);
    oscar__free(c->ctx, iwork);
    return st;
}

OSCAR_API oscar_status oscar_calib_finish(oscar_calib *c, const oscar_calib_finish_desc *desc,
                                          oscar_rotation_set **out_k, oscar_rotation_set **out_v, oscar_stream stream) {
    static const char *func = "oscar_calib_finish";
    oscar__validator v;
    oscar_calib_finish_desc d;
    double *s1 = NULL, *s2 = NULL, *mats = NULL;
    oscar_rotation_set *k = NULL, *vs = NULL;
    oscar_status st;
    if (!c) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "%s: calib = NULL", func);
    oscar__clear_error(c->ctx);
    if (out_k) *out_k = NULL;
    if (out_v) *out_v = NULL;
    if (!desc) return oscar__fail(c->ctx, OSCAR_STATUS_INVALID_ARGUMENT, "%s: desc = NULL", func);
    d = *desc;
    d.composition = oscar__def(d.composition, OSCAR_ROTATION_U_H_PBR);
    d.k_target = oscar__def(d.k_target, OSCAR_CALIB_TARGET_QUERY);
    d.v_target = oscar__def(d.v_target, OSCAR_CALIB_TARGET_SCORE);
    oscar__validate_begin(&v, c->ctx, func);
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, out_k || out_v, "out_k and out_v are both NULL; nothing to fit");
    OSCAR__VALIDATE(&v, d.composition > 0 && d.composition < OSCAR__ROTATION_COUNT,
                    "desc.composition = %d; expected an oscar_rotation_composition", OSCAR__CAST(int, d.composition));
    OSCAR__VALIDATE(&v, d.eigensolver >= 0 && d.eigensolver < OSCAR__EIGENSOLVER_COUNT,
                    "desc.eigensolver = %d; expected an oscar_eigensolver", OSCAR__CAST(int, d.eigensolver));
    OSCAR__VALIDATE(&v, d.k_target == OSCAR_CALIB_TARGET_QUERY || d.k_target == OSCAR_CALIB_TARGET_KEY,
                    "desc.k_target = %d; expected QUERY or KEY", OSCAR__CAST(int, d.k_target));
    OSCAR__VALIDATE(&v, d.v_target == OSCAR_CALIB_TARGET_SCORE || d.v_target == OSCAR_CALIB_TARGET_VALUE,
                    "desc.v_target = %d; expected SCORE or VALUE", OSCAR__CAST(int, d.v_target));
    OSCAR__VALIDATE(&v,
                    c->tensor_targets || !((out_k && d.k_target == OSCAR_CALIB_TARGET_KEY) ||
                                           (out_v && d.v_target == OSCAR_CALIB_TARGET_VALUE)),
                    "desc.k_target = KEY / v_target = VALUE need the accumulator created with tensor_targets = 1");
    OSCAR__VALIDATE(&v, !out_v || d.v_target != OSCAR_CALIB_TARGET_SCORE || c->pass == OSCAR_CALIB_PASS_SCORE,
                    "the V target needs the score pass: call oscar_calib_begin_score_pass, then accumulate K and V of "
                    "the same tokens");
    OSCAR__VALIDATE(&v, !oscar__composition_needs_pow2(d.composition) || oscar__is_pow2(c->head_dim),
                    "desc.composition = %s needs a power-of-two head_dim", oscar__composition_name(d.composition));
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;

    st = oscar__calib_host_stats(c, 1, stream, &s1);
    if (st == OSCAR_OK && out_v && d.v_target == OSCAR_CALIB_TARGET_SCORE) st = oscar__calib_host_stats(c, 2, stream, &s2);
    if (st != OSCAR_OK) goto out;
    mats = OSCAR__CAST(double *, oscar__alloc(c->ctx, sizeof(double) * OSCAR__CAST(size_t, c->num_layers) *
                                                          oscar__calib_dd(c)));
    if (!mats) {
        st = oscar__fail(c->ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
        goto out;
    }
    if (out_k) {
        st = oscar__calib_targets(c, func, d.k_target, s1, s2, mats);
        if (st == OSCAR_OK) st = oscar__calib_fit(c, func, &d, d.k_target, mats, stream, &k);
        if (st != OSCAR_OK) goto out;
    }
    if (out_v) {
        st = oscar__calib_targets(c, func, d.v_target, s1, s2, mats);
        if (st == OSCAR_OK) st = oscar__calib_fit(c, func, &d, d.v_target, mats, stream, &vs);
        if (st != OSCAR_OK) goto out;
    }
    if (out_k) *out_k = k;
    if (out_v) *out_v = vs;
    k = vs = NULL;
out:
    oscar_rotation_set_destroy(k);
    oscar_rotation_set_destroy(vs);
    oscar__free(c->ctx, mats);
    if (s1) oscar__calib_host_free(c, s1);
    if (s2) oscar__calib_host_free(c, s2);
    return st;
}

#endif /* OSCAR_CALIB_H_INCLUDED */
