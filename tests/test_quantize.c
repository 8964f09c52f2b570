/* tests/test_quantize.c -- the write path: rotate -> clip -> INT2 -> pack.
   CPU reference against hand-computed cases (packing order, ties, clip
   index, constant rows, eps, Lloyd-Max thresholds and levels), validation,
   and the GPU kernel against the CPU reference: bit-identical codes and
   scales without rotation and with an exact (signed permutation) rotation,
   near-identical with a dense orthogonal rotation, the round-trip error, a
   multi-layer demotion that must write exactly its slots, and a V-absorbed
   prefill whose K / V grid split the clip's side costs decide. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"

static oscar_ctx *cpu_ctx(void) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    return ctx;
}

/* quantize one row through the reference and return its packed bytes */
static void ref_row(const float *in, int D, int GS, int ci, int lm, uint8_t *packed, float *scale, float *zero,
                    float *mn) {
    float y[256];
    uint8_t code[256];
    memcpy(y, in, sizeof(float) * (size_t)D);
    oscar__cpu_quantize_row(y, D, GS, ci, lm, code, scale, zero, mn);
    oscar__cpu_pack_row(code, D, packed);
}

Test(quantize_cpu, packing_order) {
    float y[64], s, z, m;
    uint8_t packed[16];
    int d;
    for (d = 0; d < 64; d++) y[d] = (float)(d / 16); /* quarter index: 0,1,2,3 */
    ref_row(y, 64, 64, -1, 0, packed, &s, &z, &m);
    cr_assert_float_eq(s, 1.0f, 0);
    cr_assert_float_eq(z, 0.0f, 0);
    for (d = 0; d < 16; d++) cr_assert_eq(packed[d], 0xE4, "byte %d = 0x%02x; quarters 0..3 in bits 1:0..7:6", d, packed[d]);
    for (d = 0; d < 64; d++) y[d] = (float)(d % 4);
    ref_row(y, 64, 64, -1, 0, packed, &s, &z, &m);
    for (d = 0; d < 16; d++) cr_assert_eq(packed[d], (d % 4) * 0x55, "byte %d", d);
}

Test(quantize_cpu, round_half_up_at_ties) {
    float y[64], s, z, m;
    uint8_t code[64];
    int d;
    for (d = 0; d < 64; d++) y[d] = 0.0f;
    y[1] = 3.0f;  /* min 0, max 3: scale 1, zero 0 */
    y[2] = 0.5f;  /* 0.5 + 0.5 = 1.0 -> 1 */
    y[3] = 1.5f;  /* 2.0 -> 2 */
    y[4] = 2.49f; /* 2.99 -> 2 */
    y[5] = 2.5f;  /* 3.0 -> 3 */
    y[6] = 0.49f; /* 0.99 -> 0 */
    oscar__cpu_quantize_row(y, 64, 64, -1, 0, code, &s, &z, &m);
    cr_assert_eq(code[0], 0);
    cr_assert_eq(code[1], 3);
    cr_assert_eq(code[2], 1);
    cr_assert_eq(code[3], 2);
    cr_assert_eq(code[4], 2);
    cr_assert_eq(code[5], 3);
    cr_assert_eq(code[6], 0);
}

Test(quantize_cpu, clip_index_and_threshold) {
    float y[128], s, z, m;
    uint8_t code[128];
    int d, clamped = 0;
    cr_assert_eq(oscar__clip_index(0.96f, 64), 61);
    cr_assert_eq(oscar__clip_index(0.92f, 64), 58);
    cr_assert_eq(oscar__clip_index(0.96f, 128), 122);
    cr_assert_eq(oscar__clip_index(0.92f, 128), 117);
    cr_assert_eq(oscar__clip_index(0.96f, 256), 245);
    cr_assert_eq(oscar__clip_index(0.92f, 256), 235);
    cr_assert_eq(oscar__clip_index(0.0f, 128), -1);
    cr_assert_eq(oscar__clip_index(1.0f, 128), 127);
    /* |y| = 1..128 with alternating signs: tau = sorted[122] = 123, so the
       sort path clamps exactly 5 values (124..128) */
    for (d = 0; d < 128; d++) y[d] = (float)((d % 2) ? -(d + 1) : (d + 1));
    oscar__cpu_quantize_row(y, 128, 128, 122, 0, code, &s, &z, &m);
    for (d = 0; d < 128; d++) clamped += fabsf(y[d]) == 123.0f && d + 1 != 123;
    cr_assert_eq(clamped, 5);
    cr_assert_float_eq(m, -123.0f, 0, "min after clipping");
    cr_assert_float_eq(s, 246.0f / 3.0f, 0);
}

Test(quantize_cpu, constant_row_and_eps) {
    float y[64], s, z, m, back;
    uint8_t code[64];
    int d;
    for (d = 0; d < 64; d++) y[d] = 2.5f;
    oscar__cpu_quantize_row(y, 64, 64, -1, 0, code, &s, &z, &m);
    cr_assert_float_eq(s, 1e-8f / 3.0f, 0, "eps on the range");
    for (d = 0; d < 64; d++) cr_assert_eq(code[d], 0);
    back = (0.0f - z) * s;
    cr_assert_float_eq(back, 2.5f, 1e-6f, "constant row dequantizes to its value: %g", back);
    cr_assert_float_eq(m, 2.5f, 0, "f16 layout stores the min itself");
    /* a range below eps uses eps */
    for (d = 0; d < 64; d++) y[d] = 1.0f + (d % 2 ? 1e-9f : 0.0f);
    oscar__cpu_quantize_row(y, 64, 64, -1, 0, code, &s, &z, &m);
    cr_assert_float_eq(s, 1e-8f / 3.0f, 0);
}

Test(quantize_cpu, lloyd_max_thresholds_and_levels) {
    float y[64], s, z, m;
    uint8_t code[64];
    int d;
    for (d = 0; d < 64; d++) y[d] = (d % 2) ? 1.0f : -1.0f; /* mean 0, var 1 */
    y[0] = 0.5f, y[1] = -0.5f;                               /* keeps mean 0 */
    y[2] = 0.98f, y[3] = -0.98f;                             /* just inside the outer cells */
    oscar__cpu_quantize_row(y, 64, 64, -1, 1, code, &s, &z, &m);
    cr_assert_eq(code[0], 2, "z = +0.5 -> level 2");
    cr_assert_eq(code[1], 1, "z = -0.5 -> level 1");
    cr_assert_eq(code[5], 3, "z ~ +1.0 >= 0.98107 -> 3");
    cr_assert_eq(code[4], 0, "z ~ -1.0 -> 0");
    {
        /* std is a little under 1 here: recompute it to check the levels */
        double mean = 0, var = 0;
        for (d = 0; d < 64; d++) mean += y[d];
        mean /= 64;
        for (d = 0; d < 64; d++) var += (y[d] - mean) * (y[d] - mean);
        var = sqrt(var / 64 + 1e-8);
        cr_assert(fabs(s - 1.1673919518788656 * var) < 1e-5, "scale %g", s);
        cr_assert(fabs(z - (1.5 - mean / s)) < 1e-5);
        /* reconstruction levels mean + (code - 1.5) * scale = +-0.58370, +-1.75109 sigma */
        cr_assert(fabs((3 - z) * s / var - 1.75109) < 1e-4);
        cr_assert(fabs((2 - z) * s / var - 0.58370) < 1e-4);
    }
}

/* ---- shared setup for API-level tests ------------------------------------- */
typedef struct qcase {
    int D, GS, H, pages, page_size, T, layers;
    oscar_scale_layout scale_layout;
    oscar_kv_layout kv_layout;
    oscar_dtype src_dtype;
    float k_ratio, v_ratio;
    oscar_quant_mode mode;
    int rotation; /* 0 none, 1 signed permutation (exact), 2 dense orthogonal */
    int v_absorbed;
    int demotion; /* sources gathered from a paged bf16 cache */
    int hard;     /* rows of edge cases (rand_elem_hard) instead of random ones */
    int pow2_rows; /* bf16: each row times its own power of two, 2^-40..2^70 */
} qcase;

/* The tile forced on GPU launches (NULL: the heuristic's). */
static const oscar__quant_tile *g_tile;
/* GPU launches with prepared rotation images: 0 none, 1 images for the
   source dtype (checked against the CPU backend's image), 2 foreign images
   (prepared for the other dtype: every CTA must fall back to the f32 matrix) */
static int g_prepared;
static const void **g_kprep, **g_vprep; /* the images of a GPU run, [layers] (NULL entries: none) */

typedef struct qdata {
    size_t code_bytes, scale_bytes, src_elems;
    uint8_t **codes_k, **codes_v, **sc_k, **sc_v;   /* per layer, host */
    uint16_t **src_k, **src_v;                       /* per layer, host */
    float **rk, **rv;
    int32_t *src_slots, *dst_slots;
} qdata;

/* Random rows with outlier channels (x20) and rare spikes (x100). */
static uint16_t rand_elem(tu_rng *r, int d, oscar_dtype dt) {
    double x = tu_normal(r);
    if (d % 17 == 3) x *= 20.0;
    if (tu_uniform(r) < 0.002) x *= 100.0;
    return oscar__from_f32((float)x, oscar__k_dtype16(dt));
}

/* Rows that stress the exact parts of the kernel, by row (all values of a
   row drawn the same way): the code thresholds (values on a coarse grid, so
   many sit exactly on a threshold, and symmetric ranges whose middle
   threshold is at zero), the clip search (many ties of |y|, one huge spike,
   constant rows), range (tiny values, near-overflow f16 values, bf16 values
   of 2^121 and more) and signs
   (all positive, all negative). No exact zeros: the sign of a zero min is a
   documented difference (quantize.cuh). */
static uint16_t rand_elem_hard(tu_rng *r, int64_t row, int d, oscar_dtype dt) {
    double x = tu_normal(r);
    /* every fourth block of 64 rows is of the last kind, so that whole warp
       steps (16 or 32 rows) are or are not: a warp takes the clip's integer
       search (exact, slower) where any of its rows needs it */
    int kind = (row / 64) % 4 == 3 ? 9 : (int)(row % 9);
    switch (kind) {
    case 0: x = (floor(x * 4) + 0.5) / 4; break;                  /* grid of 1/4, no zero */
    case 1: x = (d % 2 ? 1 : -1) * (1 + (d % 8)) * 0.375; break;  /* symmetric, exact ties */
    case 2: x = 3.0 + (d == 5 ? 0.5 : 0.0); break;                /* constant but one */
    case 3: x = -1.5; break;                                      /* constant */
    case 4: x = fabs(x) + 0.25; break;                            /* all positive */
    case 5: x = -fabs(x) - 0.25; break;                           /* all negative */
    case 6: x = d == 7 ? 3e4 : x * 1e-3; break;                   /* one huge spike */
    case 7: x = x * 1e-30; if (dt == OSCAR_DTYPE_F16) x = x * 1e26; break; /* tiny (f16: subnormal) */
    case 8: x = x * (dt == OSCAR_DTYPE_F16 ? 5e3 : 1e30); break; /* huge (f16: below 65504) */
    default: x = x * (dt == OSCAR_DTYPE_F16 ? 5e3 : 1e36); break; /* bf16: many |y| >= 2^121, not f16-domain
                                                                      numbers (the clip's integer search) */
    }
    if (x == 0) x = 0.5;
    return oscar__from_f32((float)x, oscar__k_dtype16(dt));
}

/* Orthogonal matrices: a signed permutation (products exact in any
   precision) or a dense one (product of Householder reflections). */
static void make_rotation(tu_rng *r, int D, int kind, float *R) {
    int i, j, k;
    if (kind == 1) {
        int64_t perm[256];
        tu_permutation(r, perm, D);
        memset(R, 0, sizeof(float) * (size_t)D * D);
        for (i = 0; i < D; i++) R[i * D + perm[i]] = tu_uniform(r) < 0.5 ? -1.0f : 1.0f;
        return;
    }
    {
        double *M = malloc(sizeof(double) * (size_t)D * D), v[256];
        for (i = 0; i < D; i++)
            for (j = 0; j < D; j++) M[i * D + j] = i == j;
        for (k = 0; k < 4; k++) {
            double n = 0;
            for (i = 0; i < D; i++) v[i] = tu_normal(r), n += v[i] * v[i];
            n = sqrt(n);
            for (i = 0; i < D; i++) v[i] /= n;
            for (i = 0; i < D; i++) { /* M = M (I - 2 v v^T) */
                double dot = 0;
                for (j = 0; j < D; j++) dot += M[i * D + j] * v[j];
                for (j = 0; j < D; j++) M[i * D + j] -= 2 * dot * v[j];
            }
        }
        for (i = 0; i < D * D; i++) R[i] = (float)M[i];
        free(M);
    }
}

static void qcase_pool(const qcase *qc, oscar_int2_pool_desc *pool) {
    memset(pool, 0, sizeof *pool);
    pool->head_dim = qc->D;
    pool->num_kv_heads = qc->H;
    pool->num_pages = qc->pages;
    pool->page_size = qc->page_size;
    pool->group_size = qc->GS;
    pool->scale_layout = qc->scale_layout;
    pool->layout = qc->kv_layout;
}

static void *xcalloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    cr_assert(p);
    return p;
}

static void qdata_make(tu_rng *r, const qcase *qc, qdata *q, oscar_ctx *cpu) {
    oscar_int2_pool_desc pool;
    int l, i;
    int64_t t, nslots = (int64_t)qc->pages * qc->page_size, *perm;
    /* demotion sources: a paged bf16 cache of 3x the tokens, page size 16,
       allocated in whole pages (HND: a slot of the last page with head > 0
       lies past src_rows * H * D elements; with 3T rows that read past the
       host and device buffers -- different garbage, false mismatches) */
    int64_t src_rows = qc->demotion ? 3 * (int64_t)qc->T : qc->T;
    int64_t alloc_rows = qc->demotion ? (src_rows + 15) / 16 * 16 : src_rows;
    qcase_pool(qc, &pool);
    TU_OK(cpu, oscar_int2_pool_bytes(cpu, &pool, &q->code_bytes, &q->scale_bytes));
    q->src_elems = (size_t)alloc_rows * qc->H * qc->D;
    q->codes_k = xcalloc(sizeof(void *) * (size_t)qc->layers), q->codes_v = xcalloc(sizeof(void *) * (size_t)qc->layers);
    q->sc_k = xcalloc(sizeof(void *) * (size_t)qc->layers), q->sc_v = xcalloc(sizeof(void *) * (size_t)qc->layers);
    q->src_k = xcalloc(sizeof(void *) * (size_t)qc->layers), q->src_v = xcalloc(sizeof(void *) * (size_t)qc->layers);
    q->rk = xcalloc(sizeof(void *) * (size_t)qc->layers), q->rv = xcalloc(sizeof(void *) * (size_t)qc->layers);
    for (l = 0; l < qc->layers; l++) {
        q->codes_k[l] = tu_xmalloc(q->code_bytes), q->codes_v[l] = tu_xmalloc(q->code_bytes);
        q->sc_k[l] = tu_xmalloc(q->scale_bytes), q->sc_v[l] = tu_xmalloc(q->scale_bytes);
        memset(q->codes_k[l], 0xA5, q->code_bytes), memset(q->codes_v[l], 0xA5, q->code_bytes); /* poison */
        memset(q->sc_k[l], 0xA5, q->scale_bytes), memset(q->sc_v[l], 0xA5, q->scale_bytes);
        q->src_k[l] = tu_xmalloc(q->src_elems * 2), q->src_v[l] = tu_xmalloc(q->src_elems * 2);
        for (i = 0; i < (int)q->src_elems; i++) {
            if (qc->hard) {
                q->src_k[l][i] = rand_elem_hard(r, i / qc->D, i % qc->D, qc->src_dtype);
                q->src_v[l][i] = rand_elem_hard(r, i / qc->D + 4, (i + 5) % qc->D, qc->src_dtype);
                continue;
            }
            q->src_k[l][i] = rand_elem(r, i % qc->D, qc->src_dtype);
            q->src_v[l][i] = rand_elem(r, (i + 5) % qc->D, qc->src_dtype);
        }
        if (qc->pow2_rows) /* exact: the exponent field moves, normal values stay normal */
            for (i = 0; i < (int)q->src_elems; i += qc->D) {
                int side, d;
                for (side = 0; side < 2; side++) {
                    uint16_t *row = (side ? q->src_v[l] : q->src_k[l]) + i;
                    const int j = (int)tu_int(r, 111) - 40;
                    for (d = 0; d < qc->D; d++) {
                        const int e = (row[d] >> 7) & 0xff;
                        if (e > 0 && e < 255 && e + j > 0 && e + j < 255) row[d] = (uint16_t)(row[d] + j * 128);
                    }
                }
            }
        if (qc->rotation) {
            q->rk[l] = tu_xmalloc(sizeof(float) * (size_t)qc->D * qc->D);
            make_rotation(r, qc->D, qc->rotation, q->rk[l]);
            if (!qc->v_absorbed) {
                q->rv[l] = tu_xmalloc(sizeof(float) * (size_t)qc->D * qc->D);
                make_rotation(r, qc->D, qc->rotation, q->rv[l]);
            }
        }
    }
    /* destination: distinct random slots (fewer tokens than slots) */
    perm = tu_xmalloc(sizeof(int64_t) * (size_t)nslots);
    tu_permutation(r, perm, nslots);
    q->dst_slots = tu_xmalloc(sizeof(int32_t) * (size_t)qc->T);
    q->src_slots = tu_xmalloc(sizeof(int32_t) * (size_t)qc->T);
    for (t = 0; t < qc->T; t++) {
        q->dst_slots[t] = (int32_t)perm[t];
        q->src_slots[t] = (int32_t)tu_int(r, src_rows);
    }
    free(perm);
}

static void qdata_free(const qcase *qc, qdata *q) {
    int l;
    for (l = 0; l < qc->layers; l++) {
        free(q->codes_k[l]), free(q->codes_v[l]), free(q->sc_k[l]), free(q->sc_v[l]);
        free(q->src_k[l]), free(q->src_v[l]), free(q->rk[l]), free(q->rv[l]);
    }
    free(q->codes_k), free(q->codes_v), free(q->sc_k), free(q->sc_v), free(q->src_k), free(q->src_v), free(q->rk),
        free(q->rv), free(q->src_slots), free(q->dst_slots);
}

/* Runs oscar_quantize_kv on ctx with the pointers in `layers` (host or device). */
static oscar_status run_quantize(oscar_ctx *ctx, const qcase *qc, oscar_quantize_layer_desc *layers,
                                 const void *src_slots, const void *dst_slots) {
    oscar_int2_pool_desc pool;
    oscar_quantize_desc d = {0};
    qcase_pool(qc, &pool);
    pool.k_codes = layers[0].k_codes, pool.v_codes = layers[0].v_codes;
    pool.k_scales = layers[0].k_scales, pool.v_scales = layers[0].v_scales;
    d.pool = &pool;
    d.num_layers = qc->layers;
    d.layers = layers;
    d.src_dtype = qc->src_dtype;
    d.num_tokens = qc->T;
    if (qc->demotion) {
        /* the engine's bf16 cache: pages of 16 tokens, HND, padded head stride */
        d.src_slots = src_slots;
        d.src_page_size = 16;
        d.src_token_stride = qc->D;
        d.src_head_stride = 16 * qc->D;
        d.src_page_stride = 16 * (int64_t)qc->D * qc->H;
    }
    d.dst_slots = dst_slots;
    d.k_clip_ratio = qc->k_ratio;
    d.v_clip_ratio = qc->v_ratio;
    d.mode = qc->mode;
    if (ctx->backend == OSCAR_BACKEND_CUDA && g_prepared)
        d.k_rotation_prepared = g_kprep, d.v_rotation_prepared = g_vprep;
    return oscar__quantize_kv_tiled(ctx, &d, NULL, ctx->backend == OSCAR_BACKEND_CUDA ? g_tile : NULL);
}

static const char *tile_name(void) {
    static char buf[64];
    if (!g_tile) return "heuristic";
    snprintf(buf, sizeof buf, "rows %d x warps %d", g_tile->rows_per_warp, g_tile->warps_per_cta);
    return buf;
}

/* CPU reference on host copies, GPU on device copies; pools compared byte
   for byte (written rows and the poison everywhere else). Returns the
   fraction of differing code bytes (0 expected unless rotation == 2). */
static double gpu_vs_cpu(oscar_ctx *gpu, oscar_ctx *cpu, tu_rng *r, const qcase *qc, double *scale_rel_err) {
    qdata q;
    oscar_quantize_layer_desc *hl = xcalloc(sizeof *hl * (size_t)qc->layers), *dl = xcalloc(sizeof *dl * (size_t)qc->layers);
    void *d_src_slots, *d_dst_slots;
    size_t diff_codes = 0, i, scales_seen = 0, scales_off = 0;
    double worst = 0;
    int l;
    qdata_make(r, qc, &q, cpu);
    g_kprep = xcalloc(sizeof(void *) * (size_t)qc->layers), g_vprep = xcalloc(sizeof(void *) * (size_t)qc->layers);
    for (l = 0; l < qc->layers; l++) {
        hl[l].src_k = q.src_k[l], hl[l].src_v = q.src_v[l];
        hl[l].k_rotation = q.rk[l], hl[l].v_rotation = q.rv[l];
        dl[l].src_k = tu_dev_upload(q.src_k[l], q.src_elems * 2), dl[l].src_v = tu_dev_upload(q.src_v[l], q.src_elems * 2);
        dl[l].k_rotation = q.rk[l] ? tu_dev_upload(q.rk[l], sizeof(float) * (size_t)qc->D * qc->D) : NULL;
        dl[l].v_rotation = q.rv[l] ? tu_dev_upload(q.rv[l], sizeof(float) * (size_t)qc->D * qc->D) : NULL;
        if (g_prepared) {
            int kv;
            for (kv = 0; kv < 2; kv++) {
                const float *hr = kv ? q.rv[l] : q.rk[l], *dr = kv ? dl[l].v_rotation : dl[l].k_rotation;
                oscar_rotation_prepare_desc pd = {0};
                const size_t nb = oscar_rotation_prepared_bytes(qc->D);
                void *img;
                if (!hr) continue;
                img = tu_dev_alloc(nb);
                pd.head_dim = qc->D, pd.rotation = dr, pd.out = img, pd.out_bytes = nb;
                pd.src_dtype = g_prepared == 1 ? qc->src_dtype
                               : qc->src_dtype == OSCAR_DTYPE_F16 ? OSCAR_DTYPE_BF16 : OSCAR_DTYPE_F16;
                TU_OK(gpu, oscar_prepare_rotation(gpu, &pd, NULL));
                if (g_prepared == 1) { /* the device image = the CPU backend's */
                    uint8_t *gi = tu_xmalloc(nb), *ci = tu_xmalloc(nb);
                    oscar_rotation_prepare_desc cd = pd;
                    cd.rotation = hr, cd.out = ci;
                    TU_OK(cpu, oscar_prepare_rotation(cpu, &cd, NULL));
                    TU_CUDA(cudaDeviceSynchronize());
                    tu_dev_download(gi, img, nb);
                    cr_assert(memcmp(gi, ci, nb) == 0, "D=%d: the GPU's prepared image differs from the CPU's", qc->D);
                    free(gi), free(ci);
                }
                if (kv) g_vprep[l] = img;
                else g_kprep[l] = img;
            }
        }
        dl[l].k_codes = tu_dev_upload(q.codes_k[l], q.code_bytes), dl[l].v_codes = tu_dev_upload(q.codes_v[l], q.code_bytes);
        dl[l].k_scales = tu_dev_upload(q.sc_k[l], q.scale_bytes), dl[l].v_scales = tu_dev_upload(q.sc_v[l], q.scale_bytes);
        hl[l].k_codes = q.codes_k[l], hl[l].v_codes = q.codes_v[l];
        hl[l].k_scales = q.sc_k[l], hl[l].v_scales = q.sc_v[l];
    }
    d_src_slots = tu_dev_upload(q.src_slots, sizeof(int32_t) * (size_t)qc->T);
    d_dst_slots = tu_dev_upload(q.dst_slots, sizeof(int32_t) * (size_t)qc->T);
    TU_OK(cpu, run_quantize(cpu, qc, hl, q.src_slots, q.dst_slots));
    TU_OK(gpu, run_quantize(gpu, qc, dl, d_src_slots, d_dst_slots));
    TU_CUDA(cudaDeviceSynchronize());
    for (l = 0; l < qc->layers; l++) {
        uint8_t *gc = tu_xmalloc(q.code_bytes), *gs = tu_xmalloc(q.scale_bytes);
        int kv;
        for (kv = 0; kv < 2; kv++) {
            const uint8_t *rc = kv ? q.codes_v[l] : q.codes_k[l], *rs = kv ? q.sc_v[l] : q.sc_k[l];
            tu_dev_download(gc, kv ? dl[l].v_codes : dl[l].k_codes, q.code_bytes);
            tu_dev_download(gs, kv ? dl[l].v_scales : dl[l].k_scales, q.scale_bytes);
            for (i = 0; i < q.code_bytes; i++) {
                if (gc[i] == rc[i]) continue;
                cr_assert(qc->rotation == 2 && rc[i] != 0xA5 && gc[i] != 0xA5,
                          "D=%d G=%d P=%d %s layer %d %s tile %s: code byte %zu (row %zu) gpu 0x%02x cpu 0x%02x", qc->D,
                          qc->GS, qc->page_size, qc->src_dtype == OSCAR_DTYPE_F16 ? "f16" : "bf16", l, kv ? "V" : "K",
                          tile_name(), i, i / (size_t)(qc->D / 4), gc[i], rc[i]);
                diff_codes++;
            }
            if (qc->rotation != 2) {
                if (memcmp(gs, rs, q.scale_bytes) != 0) {
                    size_t b = 0;
                    while (gs[b] == rs[b]) b++;
                    cr_assert(0, "D=%d G=%d %s layer %d %s tile %s mode %d clip %.2f/%.2f: scales differ from byte %zu",
                              qc->D, qc->GS, qc->src_dtype == OSCAR_DTYPE_F16 ? "f16" : "bf16", l, kv ? "V" : "K",
                              tile_name(), (int)qc->mode, qc->k_ratio, qc->v_ratio, b);
                }
            } else if (qc->scale_layout == OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO) {
                for (i = 0; i + 8 <= q.scale_bytes; i += 8) {
                    float a, b;
                    if (rs[i] == 0xA5 && rs[i + 1] == 0xA5 && rs[i + 2] == 0xA5) {
                        cr_assert(memcmp(gs + i, rs + i, 8) == 0, "poison overwritten at scale byte %zu", i);
                        continue;
                    }
                    memcpy(&a, gs + i, 4), memcpy(&b, rs + i, 4);
                    worst = fmax(worst, fabs((double)a - b) / fmax(fabs((double)b), 1e-30));
                    scales_seen++;
                    scales_off += fabs((double)a - b) > 1e-2 * fabs((double)b);
                }
            }
        }
        free(gc), free(gs);
        cudaFree((void *)g_kprep[l]), cudaFree((void *)g_vprep[l]);
        cudaFree((void *)dl[l].src_k), cudaFree((void *)dl[l].src_v), cudaFree((void *)dl[l].k_rotation),
            cudaFree((void *)dl[l].v_rotation), cudaFree(dl[l].k_codes), cudaFree(dl[l].v_codes),
            cudaFree(dl[l].k_scales), cudaFree(dl[l].v_scales);
    }
    cudaFree(d_src_slots), cudaFree(d_dst_slots);
    if (scale_rel_err) *scale_rel_err = worst;
    /* a bf16 neighbour flip at a row's min/max or at its clip threshold moves
       that row's scale a little; more than 1% is allowed in 1 row of 1000 */
    cr_assert(scales_off <= scales_seen / 1000, "%zu of %zu scales differ by more than 1%%", scales_off, scales_seen);
    qdata_free(qc, &q);
    free(hl), free(dl), free(g_kprep), free(g_vprep);
    g_kprep = g_vprep = NULL;
    return (double)diff_codes / (double)(2 * qc->layers * (size_t)qc->T * qc->H * (qc->D / 4));
}

Test(quantize_gpu, bit_exact_codes_and_scales, .timeout = 900) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    static const int dims[] = {64, 128, 256}, groups[] = {32, 64, 128, 256};
    int di, gi, variant, cases = 0;
    for (di = 0; di < 3; di++)
        for (gi = 0; gi < 4; gi++) {
            if (groups[gi] > dims[di]) continue;
            for (variant = 0; variant < 6; variant++) {
                qcase qc = {0};
                qc.D = dims[di], qc.GS = groups[gi], qc.H = 3, qc.layers = 1;
                qc.page_size = variant % 3 == 0 ? 1 : variant % 3 == 1 ? 16 : 5;
                qc.pages = 600 / qc.page_size + 3;
                qc.T = 500;
                qc.scale_layout = variant % 2 ? OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO : OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
                qc.kv_layout = variant / 3 ? OSCAR_KV_LAYOUT_HND : OSCAR_KV_LAYOUT_NHD;
                qc.src_dtype = variant == 4 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16;
                qc.k_ratio = variant >= 2 ? 0.96f : 0.0f;
                qc.v_ratio = variant >= 2 ? 0.92f : 0.0f;
                qc.mode = (variant == 5 && qc.GS == qc.D) ? OSCAR_QUANT_MODE_LLOYD_MAX : OSCAR_QUANT_MODE_UNIFORM;
                qc.rotation = variant == 3 ? 1 : 0; /* signed permutation: exact on tensor cores */
                cr_assert_eq(gpu_vs_cpu(gpu, cpu, &r, &qc, NULL), 0.0);
                cases++;
            }
        }
    cr_log_info("quantize: %d GPU cases bit-identical to the CPU reference (codes, scales, untouched slots)", cases);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

Test(quantize_gpu, dense_rotation_matches_reference, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    static const int dims[] = {64, 128, 256};
    int di;
    for (di = 0; di < 3; di++) {
        qcase qc = {0};
        double frac, scale_err;
        qc.D = dims[di], qc.GS = dims[di], qc.H = 4, qc.layers = 2, qc.page_size = 16, qc.pages = 40, qc.T = 600;
        qc.scale_layout = OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO;
        qc.src_dtype = OSCAR_DTYPE_BF16;
        qc.k_ratio = 0.96f, qc.v_ratio = 0.92f;
        qc.rotation = 2;
        frac = gpu_vs_cpu(gpu, cpu, &r, &qc, &scale_err);
        /* the tensor-core f32 sum and the float64 reference can round the
           rotated value to different bf16 neighbours: rare, and then a code
           moves by one step at most */
        cr_log_info("D=%d dense rotation: %.2e of code bytes differ from the float64-rotation reference, worst "
                    "scale rel. diff %.2e",
                    qc.D, frac, scale_err);
        cr_assert(frac < 2e-3, "D=%d: %.3e of code bytes differ", qc.D, frac);
    }
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* Every compiled tile candidate (the autotuner's choices) on every head
   dim, both dtypes, clip on and off, uniform and Lloyd-Max: bit-identical
   to the CPU reference, with CTA counts of 1 (each warp walks many steps,
   the slot-id ring wraps) and of the heuristic. */
Test(quantize_gpu, every_tile_candidate_bit_exact, .timeout = 900) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    static const int dims[] = {64, 128, 256};
    int di, ri, wi, v, cases = 0;
    for (di = 0; di < 3; di++)
        for (ri = 0; ri < OSCAR__NUM_QUANT_ROWS; ri++)
            for (wi = 0; wi < OSCAR__NUM_QUANT_WARPS; wi++) {
                oscar__quant_tile t;
                t.rows_per_warp = oscar__quant_rows_candidates[ri], t.warps_per_cta = oscar__quant_warps_candidates[wi];
                if (!oscar__quant_tile_valid(gpu, dims[di], t.rows_per_warp, t.warps_per_cta, 1)) continue;
                for (v = 0; v < 4; v++) {
                    qcase qc = {0};
                    qc.D = dims[di], qc.GS = v == 1 ? dims[di] : 32, qc.H = 5, qc.layers = 2;
                    qc.page_size = v == 2 ? 1 : 16, qc.pages = 700 / qc.page_size + 3, qc.T = 677;
                    qc.scale_layout = v % 2 ? OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO : OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
                    qc.kv_layout = v / 2 ? OSCAR_KV_LAYOUT_HND : OSCAR_KV_LAYOUT_NHD;
                    qc.src_dtype = v == 3 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16;
                    qc.k_ratio = v == 2 ? 0.0f : 0.96f, qc.v_ratio = v == 2 ? 0.0f : 0.5f;
                    qc.mode = v == 1 ? OSCAR_QUANT_MODE_LLOYD_MAX : OSCAR_QUANT_MODE_UNIFORM;
                    qc.rotation = 1, qc.v_absorbed = v == 3;
                    qc.demotion = v == 1;
                    t.ctas = v % 2 ? 1 : 0;
                    g_tile = &t;
                    cr_assert_eq(gpu_vs_cpu(gpu, cpu, &r, &qc, NULL), 0.0);
                    g_tile = NULL;
                    cases++;
                }
            }
    cr_log_info("quantize: %d cases over every valid tile candidate bit-identical to the CPU reference", cases);
    cr_assert(cases >= 4 * 8, "at least the 8 tile candidates of head dims 64/128 ran (%d cases)", cases);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* Edge-case rows (rand_elem_hard: values on code thresholds, ties of |y| at
   the clip, constant rows, tiny and huge values, one-signed rows) through
   the heuristic's tiles: bit-identical codes and scales. */
Test(quantize_gpu, hard_rows_bit_exact, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    static const int dims[] = {64, 128, 256};
    static const float ratios[] = {0.96f, 0.5f, 0.01f, 0.0f};
    int di, v, cases = 0;
    for (di = 0; di < 3; di++)
        for (v = 0; v < 8; v++) {
            qcase qc = {0};
            qc.D = dims[di], qc.GS = v % 2 ? dims[di] : 32, qc.H = 3, qc.layers = 1, qc.page_size = 16;
            qc.T = v < 4 ? 300 : 2500;
            qc.pages = qc.T / 16 + 3;
            qc.scale_layout = v % 4 < 2 ? OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO : OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
            qc.src_dtype = v % 4 == 3 ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16;
            qc.k_ratio = ratios[v % 4], qc.v_ratio = ratios[(v + 1) % 4];
            qc.mode = v == 5 ? OSCAR_QUANT_MODE_LLOYD_MAX : OSCAR_QUANT_MODE_UNIFORM;
            qc.rotation = v % 3 == 0 ? 0 : 1;
            qc.hard = 1;
            {
                /* the second half on the prefill tile (one lane per row), the
                   first on the heuristic's (16 rows, two lanes per row, here) */
                oscar__quant_tile t;
                t.rows_per_warp = qc.D == 256 ? 16 : 32, t.warps_per_cta = 8, t.ctas = 0;
                g_tile = v >= 4 && oscar__quant_tile_valid(gpu, qc.D, t.rows_per_warp, t.warps_per_cta, 1) ? &t : NULL;
                cr_assert_eq(gpu_vs_cpu(gpu, cpu, &r, &qc, NULL), 0.0);
                g_tile = NULL;
            }
            cases++;
        }
    cr_log_info("quantize: %d edge-case runs bit-identical to the CPU reference", cases);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* The clip threshold at m = D - clip_index = 1, 8, 9, 16, 17 (the edges of
   v6's sorting networks, not kept: every m now takes the bisection) on
   edge-case rows, both dtypes, every head dim, one and two lanes per row:
   bit-identical to the reference's sort threshold. */
Test(quantize_gpu, clip_selection_edges_bit_exact, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    static const int dims[] = {64, 128, 256}, ms[] = {1, 8, 9, 16, 17};
    int di, mi, v, cases = 0;
    for (di = 0; di < 3; di++)
        for (mi = 0; mi < 5; mi++)
            for (v = 0; v < 2; v++) {
                qcase qc = {0};
                oscar__quant_tile t;
                qc.D = dims[di], qc.GS = qc.D, qc.H = 3, qc.layers = 1, qc.page_size = 16, qc.T = 400;
                qc.pages = qc.T / 16 + 3;
                qc.scale_layout = OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
                qc.src_dtype = v ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16;
                qc.k_ratio = (float)(qc.D - ms[mi]) / (float)qc.D, qc.v_ratio = (float)(qc.D - ms[(mi + 1) % 5]) / (float)qc.D;
                qc.rotation = v, qc.hard = 1;
                /* one lane per row (32 rows per warp) for bf16, two for f16 */
                t.rows_per_warp = qc.D == 256 || v ? 16 : 32, t.warps_per_cta = 8, t.ctas = 0;
                g_tile = oscar__quant_tile_valid(gpu, qc.D, t.rows_per_warp, t.warps_per_cta, 1) ? &t : NULL;
                cr_assert_eq(gpu_vs_cpu(gpu, cpu, &r, &qc, NULL), 0.0, "D=%d m=%d", qc.D, ms[mi]);
                g_tile = NULL;
                cases++;
            }
    cr_log_info("quantize: %d clip-selection edge runs bit-identical to the CPU reference", cases);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* quantize.cuh v8 takes the code thresholds of a bf16 group clipped at both
   ends from a per-CTA table by tau's mantissa, shifted by its exponent, where
   each warp has several steps (one CTA here). Rows times powers of two from
   2^-40 to 2^70 put tau inside and outside the table's exponent range, group =
   head dim (almost every group clipped at both ends) and 32 (few), clip
   ratios with m = 6/11 and 64, both scale layouts, with and without a
   rotation: bit-identical to the CPU reference. */
Test(quantize_gpu, clipped_threshold_table_bit_exact, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    static const int dims[] = {64, 128, 256};
    int di, v, cases = 0;
    for (di = 0; di < 3; di++)
        for (v = 0; v < 6; v++) {
            qcase qc = {0};
            oscar__quant_tile t;
            qc.D = dims[di], qc.GS = v == 5 ? 32 : qc.D, qc.H = 3, qc.layers = 2, qc.page_size = 16, qc.T = 900;
            qc.pages = qc.T / 16 + 3;
            qc.scale_layout = v % 2 ? OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO : OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
            qc.src_dtype = OSCAR_DTYPE_BF16;
            qc.k_ratio = v == 4 ? 0.5f : 0.96f, qc.v_ratio = v == 4 ? 0.5f : 0.92f;
            qc.rotation = v == 2 || v == 3 ? 1 : v == 1 ? 2 : 0;
            qc.pow2_rows = v != 3;
            qc.hard = v == 3;
            t.rows_per_warp = qc.D == 256 ? 16 : 32, t.warps_per_cta = 8, t.ctas = 1;
            g_tile = oscar__quant_tile_valid(gpu, qc.D, t.rows_per_warp, t.warps_per_cta, 1) ? &t : NULL;
            if (qc.rotation == 2) {
                /* a dense rotation rounds some values to other bf16 neighbours than
                   the float64 reference: compare as dense_rotation_matches_reference */
                double frac = gpu_vs_cpu(gpu, cpu, &r, &qc, NULL);
                cr_assert(frac < 2e-3, "D=%d: %.3e of code bytes differ", qc.D, frac);
            } else {
                cr_assert_eq(gpu_vs_cpu(gpu, cpu, &r, &qc, NULL), 0.0, "D=%d variant %d", qc.D, v);
            }
            g_tile = NULL;
            cases++;
        }
    cr_log_info("quantize: %d clipped-group table runs bit-identical to the CPU reference", cases);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* 32 requests x 8 tokens x 36 layers demoted in one launch from a paged bf16
   cache: exactly the destination slots change, bit-identical to the CPU. */
/* 32 requests x 8 tokens x 36 layers gathered from a paged bf16 cache, K
   rotated (a signed permutation: exact), V absorbed, clipped .96 / .92 */
static qcase demotion_case(void) {
    qcase qc = {0};
    qc.D = 128, qc.GS = 128, qc.H = 8, qc.layers = 36, qc.page_size = 8, qc.pages = 200, qc.T = 32 * 8;
    qc.scale_layout = OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
    qc.src_dtype = OSCAR_DTYPE_BF16;
    qc.k_ratio = 0.96f, qc.v_ratio = 0.92f;
    qc.rotation = 1, qc.v_absorbed = 1;
    qc.demotion = 1;
    return qc;
}

Test(quantize_gpu, multi_layer_demotion_writes_only_its_slots, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    qcase qc = demotion_case();
    cr_assert_eq(gpu_vs_cpu(gpu, cpu, &r, &qc, NULL), 0.0);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* The kernel trace (desc.trace_records) over the 36-layer demotion: the
   traced build's codes, scales and untouched slots equal the CPU reference's
   as the plain build's do, and every CTA that entered (at least one per layer
   and side) marks ENTRY, WAITED (R and the threshold table staged) and DONE in
   that order; nothing else is traced. */
Test(quantize_gpu, kernel_trace_marks_every_cta, .timeout = 600) {
    enum { CAP = 1 << 16 };
    oscar_ctx *gpu = tu_gpu_ctx_traced_or_skip(CAP), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    qcase qc = demotion_case();
    oscar_trace_record *rec = tu_xmalloc(sizeof(oscar_trace_record) * CAP);
    uint64_t t_min = UINT64_MAX, t_max = 0;
    int32_t count = 0, dropped = -1, i, waited = 0, k, ctas;
    TU_OK(gpu, oscar_trace_reset(gpu, NULL));
    cr_assert_eq(gpu_vs_cpu(gpu, cpu, &r, &qc, NULL), 0.0);
    TU_OK(gpu, oscar_trace_read(gpu, rec, CAP, &count, &dropped));
    cr_assert(count > 0 && count < CAP && dropped == 0, "%d marks, %d dropped", count, dropped);
    ctas = tu_trace_ctas(rec, count, OSCAR_TRACE_QUANTIZE, &t_min, &t_max);
    for (k = 1; k < OSCAR__TRACE_KERNEL_COUNT; k++)
        if (k != OSCAR_TRACE_QUANTIZE) cr_assert_eq(tu_trace_ctas(rec, count, k, &t_min, &t_max), 0);
    for (i = 0; i < count; i++) waited += rec[i].mark == OSCAR_TRACE_WAITED;
    cr_assert(ctas >= 2 * qc.layers, "%d quantize CTAs traced for %d layers", ctas, qc.layers);
    cr_assert_eq(waited, ctas, "every CTA staged its rotation");
    cr_assert_eq(count, 3 * ctas);
    cr_log_info("quantize trace: %d CTAs, span %.1f us", ctas, (double)(t_max - t_min) * 1e-3);
    free(rec);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* A V-absorbed clipped prefill big enough that the grid's K / V split is
   bound by the resident CTAs, where oscar__quant_side_cost's clipped costs
   (33 : 23) split differently from 4 : 3 -- on the H200 (132 SMs) 3 layers x
   2048 tokens x 8 heads take 52 + 36 CTAs per layer against 50 + 38 -- with
   every code, scale and untouched slot equal to the CPU reference's. */
Test(quantize_gpu, v_absorbed_clipped_split_bit_exact, .timeout = 600) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    qcase qc = {0};
    int32_t clipped[2], unclipped[2];
    oscar__quant_tile t;
    qc.D = 128, qc.GS = 128, qc.H = 8, qc.layers = 3, qc.page_size = 16, qc.T = 2048, qc.pages = 2048 / 16 + 3;
    qc.scale_layout = OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
    qc.src_dtype = OSCAR_DTYPE_BF16;
    qc.k_ratio = 0.96f, qc.v_ratio = 0.92f;
    qc.rotation = 1, qc.v_absorbed = 1;
    t = oscar__quant_choose(gpu, qc.D, (int64_t)qc.T * qc.H, 2 * qc.layers, 1);
    t.ctas = 0;
    oscar__quant_ctas(gpu, qc.D, &t, (int64_t)qc.T * qc.H, qc.layers, 1, 0, 1, 1, clipped);
    oscar__quant_ctas(gpu, qc.D, &t, (int64_t)qc.T * qc.H, qc.layers, 1, 0, 0, 0, unclipped);
    cr_log_info("quantize: V-absorbed clipped prefill, %d layers x %d tokens: %d + %d CTAs per layer (4 : 3 would take %d + %d)",
                qc.layers, qc.T, clipped[0], clipped[1], unclipped[0], unclipped[1]);
    cr_assert_eq(gpu_vs_cpu(gpu, cpu, &r, &qc, NULL), 0.0);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* rotate -> quantize -> dequantize -> inverse rotate: the INT2 error the
   reference's own test expects (mean per-row cosine > 0.85 at clip 0.99). */
Test(quantize_gpu, round_trip_error, .timeout = 300) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip();
    tu_rng r = tu_seed();
    enum { D = 128, H = 4, T = 512 };
    oscar_int2_pool_desc pool = {0};
    oscar_quantize_desc qd = {0};
    oscar_dequant_desc dq = {0};
    size_t code_bytes, scale_bytes, n = (size_t)T * H * D, i;
    uint16_t *x = tu_xmalloc(n * 2), *back = tu_xmalloc(n * 2);
    float *R = tu_xmalloc(sizeof(float) * D * D);
    int32_t *slots = tu_xmalloc(sizeof(int32_t) * T);
    void *dx, *dR, *dslots, *dk, *ds, *dout;
    double cos_sum = 0;
    int t, h, j, k;
    for (i = 0; i < n; i++) x[i] = oscar__f32_to_bf16((float)tu_normal(&r) * ((i % D) % 13 == 0 ? 8.0f : 1.0f));
    make_rotation(&r, D, 2, R);
    for (t = 0; t < T; t++) slots[t] = t;
    pool.head_dim = D, pool.num_kv_heads = H, pool.num_pages = T, pool.group_size = 32;
    TU_OK(gpu, oscar_int2_pool_bytes(gpu, &pool, &code_bytes, &scale_bytes));
    dx = tu_dev_upload(x, n * 2), dR = tu_dev_upload(R, sizeof(float) * D * D);
    dslots = tu_dev_upload(slots, sizeof(int32_t) * T);
    dk = tu_dev_alloc(code_bytes), ds = tu_dev_alloc(scale_bytes), dout = tu_dev_alloc(n * 2);
    pool.k_codes = pool.v_codes = dk, pool.k_scales = pool.v_scales = ds;
    qd.pool = &pool, qd.src_k = qd.src_v = dx, qd.k_rotation = qd.v_rotation = dR;
    qd.num_tokens = T, qd.dst_slots = dslots, qd.k_clip_ratio = qd.v_clip_ratio = 0.99f;
    TU_OK(gpu, oscar_quantize_kv(gpu, &qd, NULL));
    dq.slots = dslots, dq.num_tokens = T, dq.k_out = dout;
    TU_OK(gpu, oscar_dequantize_kv(gpu, &pool, &dq, NULL));
    TU_CUDA(cudaDeviceSynchronize());
    tu_dev_download(back, dout, n * 2);
    for (t = 0; t < T; t++)
        for (h = 0; h < H; h++) {
            const uint16_t *xr = x + ((size_t)t * H + h) * D, *br = back + ((size_t)t * H + h) * D;
            double dot = 0, nx = 0, nb = 0;
            for (j = 0; j < D; j++) { /* x_hat = y_hat @ R^T */
                double xh = 0;
                for (k = 0; k < D; k++) xh += (double)oscar__bf16_to_f32(br[k]) * R[j * D + k];
                dot += xh * oscar__bf16_to_f32(xr[j]);
                nx += (double)oscar__bf16_to_f32(xr[j]) * oscar__bf16_to_f32(xr[j]);
                nb += xh * xh;
            }
            cos_sum += dot / sqrt(nx * nb);
        }
    cr_log_info("INT2 round trip (D=128, group 32, clip 0.99, dense rotation): mean cosine %.4f", cos_sum / (T * H));
    cr_assert(cos_sum / (T * H) > 0.85, "mean cosine %.4f", cos_sum / (T * H));
    cudaFree(dx), cudaFree(dR), cudaFree(dslots), cudaFree(dk), cudaFree(ds), cudaFree(dout);
    free(x), free(back), free(R), free(slots);
    oscar_shutdown(gpu);
}

/* Prepared rotation images (oscar_prepare_rotation): codes and scales
   bit-identical to the CPU reference -- as without them -- for every head dim
   and source dtype, on the wgmma path (4- and 8-warp tiles, sm_90a) and the
   mma.sync path (2-warp tiles, head dim 256), dense and gathered; the device
   image byte-identical to the CPU backend's; and foreign images (prepared for
   the other dtype) ignored by every CTA, which then stages the f32 matrix. */
Test(quantize_gpu, prepared_rotation_bit_exact, .timeout = 900) {
    oscar_ctx *gpu = tu_gpu_ctx_or_skip(), *cpu = cpu_ctx();
    tu_rng r = tu_seed();
    static const int dims[] = {64, 128, 256};
    static const int tiles[][2] = {{0, 0}, {32, 8}, {16, 4}, {16, 2}};
    int di, dt, ti, prep, runs = 0;
    for (di = 0; di < 3; di++)
        for (dt = 0; dt < 2; dt++)
            for (ti = 0; ti < 4; ti++)
                for (prep = 1; prep <= 2; prep++) {
                    qcase qc = {0};
                    oscar__quant_tile t;
                    qc.D = dims[di], qc.GS = qc.D, qc.H = 3, qc.layers = 2, qc.page_size = 16, qc.T = 400;
                    qc.pages = qc.T / 16 + 3;
                    qc.src_dtype = dt ? OSCAR_DTYPE_F16 : OSCAR_DTYPE_BF16;
                    qc.k_ratio = 0.96f, qc.v_ratio = 0.92f;
                    qc.rotation = 1, qc.v_absorbed = ti == 2, qc.demotion = ti % 2;
                    t.rows_per_warp = qc.D == 256 ? 16 : tiles[ti][0], t.warps_per_cta = tiles[ti][1], t.ctas = 0;
                    if (ti && !oscar__quant_tile_valid(gpu, qc.D, t.rows_per_warp, t.warps_per_cta, 1)) continue;
                    g_tile = ti ? &t : NULL, g_prepared = prep;
                    cr_assert_eq(gpu_vs_cpu(gpu, cpu, &r, &qc, NULL), 0.0, "D=%d %s tile %s prepared %d", qc.D,
                                 dt ? "f16" : "bf16", tile_name(), prep);
                    g_tile = NULL, g_prepared = 0;
                    runs++;
                }
    cr_log_info("quantize: %d runs with prepared rotations bit-identical to the CPU reference", runs);
    cr_assert(runs >= 24, "runs %d", runs);
    oscar_shutdown(cpu);
    oscar_shutdown(gpu);
}

/* oscar_prepare_rotation on the CPU backend: the image's header and R's
   values at positions worked out by hand from the two layouts; bad
   descriptors rejected with the field named, the output untouched. */
Test(quantize_cpu, prepared_rotation_image_and_validation) {
    oscar_ctx *ctx = cpu_ctx();
    enum { D = 128 };
    static float R[D * D] __attribute__((aligned(16)));
    const size_t nb = oscar_rotation_prepared_bytes(D);
    uint8_t *img = tu_xmalloc(nb + 64);
    oscar_rotation_prepare_desc d = {0};
    uint32_t hdr[4];
    uint16_t v;
    size_t i;
    int k;
    cr_assert_eq(nb, 64 + 4 * D * D);
    cr_assert_eq(oscar_rotation_prepared_bytes(64), 64 + 4 * 64 * 64);
    cr_assert_eq(oscar_rotation_prepared_bytes(96), 0);
    for (k = 0; k < D * D; k++) R[k] = (float)k / 7.0f;
    d.head_dim = D, d.rotation = R, d.out = img, d.out_bytes = nb;
    TU_OK(ctx, oscar_prepare_rotation(ctx, &d, NULL));
    memcpy(hdr, img, sizeof hdr);
    cr_assert(hdr[0] == OSCAR_K_ROT_PREP_MAGIC && hdr[1] == OSCAR_K_ROT_PREP_VERSION && hdr[2] == D &&
              hdr[3] == OSCAR_K_DTYPE_BF16, "header %08x %u %u %u", hdr[0], hdr[1], hdr[2], hdr[3]);
    /* wgmma layout: chunk c = 9 of R^T row n = 5 at (9 / 8) 128 128 + 5 128 + ((9 % 8) ^ (5 % 8)) 16 = 17088; value
       e = 3 of it is R[8 9 + 3][5] */
    memcpy(&v, img + 64 + 17088 + 2 * 3, 2);
    cr_assert_eq(v, oscar__f32_to_bf16(R[75 * D + 5]));
    /* mma.sync layout: chunk c = 2 of R row 6 at 6 256 + (2 ^ rowswz(6)) 16, rowswz(6) at D 128 = (6 & 1) | (6 & 2) << 1
       | (6 & 4) >> 1 = 6, so 1536 + 4 16 = 1600; value e = 1 is R[6][17] */
    memcpy(&v, img + 64 + 2 * D * D + 1600 + 2 * 1, 2);
    cr_assert_eq(v, oscar__f32_to_bf16(R[6 * D + 17]));
    /* f16 rounds to f16 */
    d.src_dtype = OSCAR_DTYPE_F16;
    TU_OK(ctx, oscar_prepare_rotation(ctx, &d, NULL));
    memcpy(&v, img + 64 + 17088 + 2 * 3, 2);
    cr_assert_eq(v, oscar__f32_to_f16(R[75 * D + 5]));
    /* bad descriptors: named, nothing written */
    memset(img, 0x5A, nb + 64);
    d.head_dim = 96, d.out_bytes = 10, d.rotation = NULL;
    cr_assert_eq(oscar_prepare_rotation(ctx, &d, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "desc.head_dim = 96") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "desc.rotation = NULL") != NULL, "%s", oscar_last_error(ctx));
    d.head_dim = D, d.rotation = R, d.out = img + 8, d.out_bytes = nb - 1;
    cr_assert_eq(oscar_prepare_rotation(ctx, &d, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "expected 16-byte aligned") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "desc.out_bytes") != NULL, "%s", oscar_last_error(ctx));
    for (i = 0; i < nb + 64; i++) cr_assert_eq(img[i], 0x5A);
    free(img);
    oscar_shutdown(ctx);
}

/* A prepared image needs its f32 matrix and 16-byte alignment; the CPU
   backend (which stages nothing) ignores it. */
Test(quantize_cpu, prepared_rotation_desc_rules) {
    oscar_ctx *ctx = cpu_ctx();
    uint8_t codes[4096] __attribute__((aligned(16))), scales[1024] __attribute__((aligned(16)));
    uint16_t src[128 * 4] __attribute__((aligned(16)));
    static uint8_t image[64 + 4 * 128 * 128] __attribute__((aligned(16)));
    int32_t slot = 0;
    oscar_int2_pool_desc pool = {0};
    oscar_quantize_desc d = {0};
    size_t i;
    memset(codes, 0x5A, sizeof codes), memset(scales, 0x5A, sizeof scales), memset(src, 0, sizeof src);
    pool.head_dim = 128, pool.num_kv_heads = 1, pool.num_pages = 8, pool.group_size = 128;
    pool.k_codes = pool.v_codes = codes, pool.k_scales = pool.v_scales = scales;
    d.pool = &pool, d.src_k = d.src_v = src, d.num_tokens = 1, d.dst_slots = &slot;
    {
        const void *kp[1], *vp[1];
        kp[0] = image, vp[0] = image + 8;
        d.k_rotation_prepared = kp, d.v_rotation_prepared = vp;
        cr_assert_eq(oscar_quantize_kv(ctx, &d, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    }
    cr_assert(strstr(oscar_last_error(ctx), "desc.k_rotation_prepared[0]") != NULL &&
                  strstr(oscar_last_error(ctx), "without layer 0's k_rotation") != NULL,
              "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "expected 16-byte aligned") != NULL, "%s", oscar_last_error(ctx));
    for (i = 0; i < sizeof codes; i++) cr_assert_eq(codes[i], 0x5A);
    oscar_shutdown(ctx);
}

Test(quantize_cpu, validation_touches_nothing) {
    oscar_ctx *ctx = cpu_ctx();
    uint8_t codes[4096] __attribute__((aligned(16))), scales[1024] __attribute__((aligned(16)));
    uint16_t src[128 * 4] __attribute__((aligned(16)));
    int32_t slot = 0;
    oscar_int2_pool_desc pool = {0};
    oscar_quantize_desc d = {0};
    oscar_status st;
    size_t i;
    memset(codes, 0x5A, sizeof codes), memset(scales, 0x5A, sizeof scales), memset(src, 0, sizeof src);
    pool.head_dim = 128, pool.num_kv_heads = 1, pool.num_pages = 8, pool.group_size = 32;
    pool.k_codes = pool.v_codes = codes, pool.k_scales = pool.v_scales = scales;
    d.pool = &pool, d.src_k = d.src_v = src, d.num_tokens = 1, d.dst_slots = &slot;
    d.k_clip_ratio = 1.5f;
    d.mode = OSCAR_QUANT_MODE_LLOYD_MAX;
    d.src_token_stride = 100;
    st = oscar_quantize_kv(ctx, &d, NULL);
    cr_assert_eq(st, OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "desc.k_clip_ratio = 1.5") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "LLOYD_MAX with pool.group_size = 32") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "multiples of 8 elements") != NULL, "%s", oscar_last_error(ctx));
    for (i = 0; i < sizeof codes; i++) cr_assert_eq(codes[i], 0x5A);
    for (i = 0; i < sizeof scales; i++) cr_assert_eq(scales[i], 0x5A);
    oscar_shutdown(ctx);
}

/* The CPU backend through the API equals the row reference, slot by slot. */
Test(quantize_cpu, api_matches_row_reference) {
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    enum { D = 64, H = 2, T = 9, PS = 4, PAGES = 5 };
    uint8_t codes[PAGES * PS * H * D / 4] __attribute__((aligned(16)));
    uint8_t scales[PAGES * PS * H * 2 * 8] __attribute__((aligned(16)));
    uint16_t src[T * H * D] __attribute__((aligned(16)));
    int32_t slots[T];
    oscar_int2_pool_desc pool = {0};
    oscar_quantize_desc d = {0};
    int t, h, j;
    for (j = 0; j < T * H * D; j++) src[j] = oscar__f32_to_bf16((float)tu_normal(&r));
    for (t = 0; t < T; t++) slots[t] = (t * 7) % (PAGES * PS);
    pool.head_dim = D, pool.num_kv_heads = H, pool.num_pages = PAGES, pool.page_size = PS, pool.group_size = 32;
    pool.scale_layout = OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO;
    pool.k_codes = pool.v_codes = codes, pool.k_scales = pool.v_scales = scales;
    d.pool = &pool, d.src_k = d.src_v = src, d.num_tokens = T, d.dst_slots = slots, d.k_clip_ratio = d.v_clip_ratio = 0.9f;
    TU_OK(ctx, oscar_quantize_kv(ctx, &d, NULL));
    for (t = 0; t < T; t++)
        for (h = 0; h < H; h++) {
            float y[D], s[2], z[2], m[2];
            uint8_t packed[D / 4];
            size_t row = ((size_t)slots[t] * H + h);
            for (j = 0; j < D; j++) y[j] = oscar__bf16_to_f32(src[(t * H + h) * D + j]);
            ref_row(y, D, 32, oscar__clip_index(0.9f, D), 0, packed, s, z, m);
            cr_assert(memcmp(codes + row * (D / 4), packed, D / 4) == 0, "token %d head %d codes", t, h);
            cr_assert(memcmp(scales + row * 16, &s[0], 4) == 0 && memcmp(scales + row * 16 + 4, &z[0], 4) == 0);
            cr_assert(memcmp(scales + row * 16 + 8, &s[1], 4) == 0 && memcmp(scales + row * 16 + 12, &z[1], 4) == 0);
        }
    oscar_shutdown(ctx);
}
