/* tests/test_calib_cpu.c -- calibration on the CPU backend: the rotation
   algebra (Hadamard, bit-reversal permutation, compositions) against hand-
   built cases; the streaming float64 accumulator against a literal
   transcription of the reference's math (tests/calib_ref.h), for any
   chunking, with warm-up exclusion, GQA grouping and additive statistics;
   precision at 32K tokens against double-double sums; planted covariances
   recover their eigenbasis; every composition is orthogonal in fp32. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"
#include "calib_ref.h"

static oscar_ctx *cpu_ctx(void) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    return ctx;
}


/* ---- rotation algebra ------------------------------------------------------------ */

Test(calib_math, hadamard_is_sylvester_and_orthonormal) {
    int D, i, j, k;
    for (D = 1; D <= 256; D *= 2) {
        double *H = cr_dalloc((size_t)D * D), *x = cr_dalloc((size_t)D), *y = cr_dalloc((size_t)D);
        tu_rng r = tu_seed();
        oscar__hadamard(D, H);
        for (i = 0; i < D; i++)
            for (j = 0; j < D; j++) {
                double s = 0;
                for (k = 0; k < D; k++) s += H[i * D + k] * H[j * D + k];
                cr_assert(fabs(s - (i == j)) < 1e-12, "D=%d HHᵀ[%d][%d] = %g", D, i, j, s);
                cr_assert(fabs(fabs(H[i * D + j]) - 1 / sqrt(D)) < 1e-15);
            }
        if (D >= 2) /* H_{2n} = [[H_n, H_n], [H_n, -H_n]] / sqrt(2) */
        {
            int n = D / 2;
            double *Hn = cr_dalloc((size_t)n * n);
            oscar__hadamard(n, Hn);
            for (i = 0; i < D; i++)
                for (j = 0; j < D; j++) {
                    double want = Hn[(i % n) * n + (j % n)] / sqrt(2.0) * ((i >= n && j >= n) ? -1 : 1);
                    cr_assert(fabs(H[i * D + j] - want) < 1e-15, "Sylvester recursion D=%d (%d,%d)", D, i, j);
                }
            free(Hn);
        }
        /* the fast transform is x·H */
        for (i = 0; i < D; i++) x[i] = y[i] = tu_normal(&r);
        oscar__fwht_row(y, D);
        for (j = 0; j < D; j++) {
            double s = 0;
            for (i = 0; i < D; i++) s += x[i] * H[i * D + j];
            cr_assert(fabs(y[j] - s) < 1e-12, "FWHT D=%d entry %d: %g vs %g", D, j, y[j], s);
        }
        free(H), free(x), free(y);
    }
}

Test(calib_math, bit_reversal_permutation) {
    int32_t perm[128], sorted[128];
    double ev[128];
    int i;
    /* D = 4, ascending λ: sorted = [3, 2, 1, 0]; br = [0, 2, 1, 3]; perm[br(i)] = sorted[i] */
    for (i = 0; i < 4; i++) ev[i] = i + 1;
    oscar__pbr_perm(4, ev, perm, sorted);
    cr_assert(perm[0] == 3 && perm[1] == 1 && perm[2] == 2 && perm[3] == 0, "D=4 perm = %d %d %d %d", perm[0], perm[1],
              perm[2], perm[3]);
    /* D = 128 (website): largest -> 0, second -> 64, third -> 32, fourth -> 96 */
    for (i = 0; i < 128; i++) ev[i] = 0.5 * i + 1;
    oscar__pbr_perm(128, ev, perm, sorted);
    cr_assert_eq(perm[0], 127);
    cr_assert_eq(perm[64], 126);
    cr_assert_eq(perm[32], 125);
    cr_assert_eq(perm[96], 124);
    cr_assert_eq(perm[1], 127 - 64); /* br(64) = 1 */
    /* eigenvalues in any order: the permutation follows their sizes, not their indices */
    {
        double e8[8] = {5, 1, 7, 3, 2, 8, 4, 6}; /* descending: idx 5, 2, 7, 0, 6, 3, 4, 1 */
        int want[8];
        int order[8] = {5, 2, 7, 0, 6, 3, 4, 1};
        for (i = 0; i < 8; i++) want[oscar__bit_reverse(i, 3)] = order[i];
        oscar__pbr_perm(8, e8, perm, sorted);
        for (i = 0; i < 8; i++) cr_assert_eq(perm[i], want[i], "D=8 perm[%d] = %d, want %d", i, perm[i], want[i]);
    }
    /* no eigenvalues (data-free H·P): the order of distinct ascending eigenvalues */
    oscar__pbr_perm(4, NULL, perm, sorted);
    cr_assert(perm[0] == 3 && perm[1] == 1 && perm[2] == 2 && perm[3] == 0);
}

/* D = 2, fully by hand: U = [[c, -s], [s, c]], λ = [1, 2], H2 = [[1, 1], [1, -1]]/√2,
   P swaps the two columns (the larger eigenvalue's column goes first):
   U·H = [[c-s, c+s], [s+c, s-c]]/√2 and U·H·P = [[c+s, c-s], [s-c, s+c]]/√2. */
Test(calib_math, composition_by_hand_d2) {
    double c = cos(0.3), s = sin(0.3), U[4] = {c, -s, s, c}, ev[2] = {1, 2}, R[4], work[8];
    int32_t iwork[8];
    const double q = 1 / sqrt(2.0);
    oscar__compose(2, OSCAR_ROTATION_U_H_PBR, U, ev, R, work, iwork);
    cr_assert(fabs(R[0] - (c + s) * q) < 1e-15 && fabs(R[1] - (c - s) * q) < 1e-15 && fabs(R[2] - (s - c) * q) < 1e-15 &&
                  fabs(R[3] - (s + c) * q) < 1e-15,
              "U·H·P = [%g %g; %g %g]", R[0], R[1], R[2], R[3]);
    oscar__compose(2, OSCAR_ROTATION_U_H, U, ev, R, work, iwork);
    cr_assert(fabs(R[0] - (c - s) * q) < 1e-15 && fabs(R[1] - (c + s) * q) < 1e-15 && fabs(R[2] - (s + c) * q) < 1e-15 &&
              fabs(R[3] - (s - c) * q) < 1e-15);
    oscar__compose(2, OSCAR_ROTATION_U_PBR, U, ev, R, work, iwork);
    cr_assert(R[0] == -s && R[1] == c && R[2] == c && R[3] == s, "U·P swaps U's columns");
    oscar__compose(2, OSCAR_ROTATION_U, U, ev, R, work, iwork);
    cr_assert(memcmp(R, U, sizeof U) == 0);
    oscar__compose(2, OSCAR_ROTATION_H_PBR, U, ev, R, work, iwork);
    cr_assert(fabs(R[0] - q) < 1e-15 && fabs(R[1] - q) < 1e-15 && fabs(R[2] + q) < 1e-15 && fabs(R[3] - q) < 1e-15);
    oscar__compose(2, OSCAR_ROTATION_IDENTITY, U, ev, R, work, iwork);
    cr_assert(R[0] == 1 && R[1] == 0 && R[2] == 0 && R[3] == 1);
}

/* D = 8, random U and shuffled eigenvalues: each composition equals the
   explicit matrix product with P built from the hand-derived permutation. */
Test(calib_math, composition_order_d8) {
    enum { D = 8 };
    double U[D * D], H[D * D], ev[D] = {0.1, 0.3, 0.2, 0.9, 0.5, 0.4, 0.8, 0.7}, R[D * D], UH[D * D], work[2 * D];
    int32_t iwork[2 * D];
    int order[D] = {3, 6, 7, 4, 5, 1, 2, 0}; /* indices by descending eigenvalue */
    int perm[D], i, j, k;
    tu_rng r = tu_seed();
    random_orthogonal(&r, D, U);
    oscar__hadamard(D, H);
    for (i = 0; i < D; i++) perm[oscar__bit_reverse(i, 3)] = order[i];
    for (i = 0; i < D; i++)
        for (j = 0; j < D; j++) {
            double s = 0;
            for (k = 0; k < D; k++) s += U[i * D + k] * H[k * D + j];
            UH[i * D + j] = s;
        }
    oscar__compose(D, OSCAR_ROTATION_U_H_PBR, U, ev, R, work, iwork);
    for (i = 0; i < D; i++)
        for (j = 0; j < D; j++)
            cr_assert(fabs(R[i * D + j] - UH[i * D + perm[j]]) < 1e-14, "U·H·P (%d,%d): %g vs %g", i, j, R[i * D + j],
                      UH[i * D + perm[j]]);
    /* row-vector convention: x' = x @ R puts (x·U·H)[perm[j]] at position j */
    {
        double x[D], xp[D], xuh[D];
        for (i = 0; i < D; i++) x[i] = tu_normal(&r);
        for (j = 0; j < D; j++) {
            xp[j] = xuh[j] = 0;
            for (i = 0; i < D; i++) xp[j] += x[i] * R[i * D + j], xuh[j] += x[i] * UH[i * D + j];
        }
        for (j = 0; j < D; j++) cr_assert(fabs(xp[j] - xuh[perm[j]]) < 1e-13);
    }
    oscar__compose(D, OSCAR_ROTATION_U_H, U, ev, R, work, iwork);
    for (i = 0; i < D * D; i++) cr_assert(fabs(R[i] - UH[i]) < 1e-14);
    oscar__compose(D, OSCAR_ROTATION_H, U, ev, R, work, iwork);
    for (i = 0; i < D * D; i++) cr_assert(fabs(R[i] - H[i]) < 1e-15);
    oscar__compose(D, OSCAR_ROTATION_H_PBR, U, ev, R, work, iwork);
    for (i = 0; i < D; i++)
        for (j = 0; j < D; j++) cr_assert(fabs(R[i * D + j] - H[i * D + perm[j]]) < 1e-15);
    oscar__compose(D, OSCAR_ROTATION_U_PBR, U, ev, R, work, iwork);
    for (i = 0; i < D; i++)
        for (j = 0; j < D; j++) cr_assert(R[i * D + j] == U[i * D + perm[j]]);
}

/* ---- accumulation against the literal reference ------------------------------------ */

typedef struct calib_data {
    int64_t n;
    int Hq, Hkv, D;
    act_buf q, k, v;
} calib_data;

static calib_data make_data(tu_rng *r, int64_t n, int Hq, int Hkv, int D, oscar_dtype dtype) {
    calib_data d;
    double *Mq = cr_dalloc((size_t)D * D), *Mk = cr_dalloc((size_t)D * D);
    d.n = n, d.Hq = Hq, d.Hkv = Hkv, d.D = D;
    d.q = act_alloc((size_t)n * Hq * D, dtype);
    d.k = act_alloc((size_t)n * Hkv * D, dtype);
    d.v = act_alloc((size_t)n * Hkv * D, dtype);
    random_orthogonal(r, D, Mq);
    random_orthogonal(r, D, Mk);
    fill_structured(r, &d.q, n * Hq, D, Mq, 8.0, 1);
    fill_structured(r, &d.k, n * Hkv, D, Mk, 12.0, 5);
    fill_structured(r, &d.v, n * Hkv, D, NULL, 6.0, 9);
    free(Mq), free(Mk);
    return d;
}
static void free_data(calib_data *d) { act_free(&d->q), act_free(&d->k), act_free(&d->v); }

static oscar_calib *make_calib(oscar_ctx *ctx, const calib_data *d, int num_layers, const int32_t *ids, int skip,
                               int tensor_targets) {
    oscar_calib_desc desc = {0};
    oscar_calib *c = NULL;
    desc.num_layers = num_layers;
    desc.layer_ids = ids;
    desc.head_dim = d->D;
    desc.num_q_heads = d->Hq;
    desc.num_kv_heads = d->Hkv;
    desc.skip_first_chunks = skip;
    desc.tensor_targets = tensor_targets;
    TU_OK(ctx, oscar_calib_create(ctx, &desc, &c));
    return c;
}

/* Feeds tokens [t0, t1) of d in chunks of the given sizes (cycled). */
static void feed(oscar_calib *c, const calib_data *d, int32_t layer, int64_t t0, int64_t t1, const int64_t *chunks,
                 int nchunks) {
    size_t es = d->q.dtype == OSCAR_DTYPE_F32 ? 4 : 2;
    int64_t t = t0;
    int i = 0;
    while (t < t1) {
        oscar_calib_batch_desc b = {0};
        int64_t n = chunks[i++ % nchunks];
        if (n > t1 - t) n = t1 - t;
        b.layer_id = layer;
        b.num_tokens = n;
        b.dtype = d->q.dtype;
        b.q = (const char *)d->q.data + (size_t)t * d->Hq * d->D * es;
        b.k = (const char *)d->k.data + (size_t)t * d->Hkv * d->D * es;
        b.v = (const char *)d->v.data + (size_t)t * d->Hkv * d->D * es;
        TU_OK(NULL, oscar_calib_accumulate(c, &b, NULL));
        t += n;
    }
}

static double *export_stats(oscar_calib *c, int64_t *count) {
    oscar_calib_stats view = {0};
    double *s;
    TU_OK(NULL, oscar_calib_stats_view(c, &view));
    s = cr_dalloc((size_t)view.count);
    TU_OK(NULL, oscar_calib_export_stats(c, s, view.count, NULL));
    *count = view.count;
    return s;
}

Test(calib_cpu, targets_match_the_reference_math) {
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    static const oscar_dtype dtypes[3] = {OSCAR_DTYPE_BF16, OSCAR_DTYPE_F16, OSCAR_DTYPE_F32};
    static const int64_t chunks[4] = {1, 17, 82, 200};
    int di;
    for (di = 0; di < 3; di++) {
        calib_data d = make_data(&r, 301, 8, 2, 16, dtypes[di]);
        oscar_calib *c = make_calib(ctx, &d, 1, NULL, 0, 0);
        double *CQ = cr_dalloc(256), *CS = cr_dalloc(256), *got = cr_dalloc(256), dq, ds;
        ref_targets(d.n, d.Hq, d.Hkv, d.D, d.q.vals, d.k.vals, d.v.vals, CQ, CS);
        feed(c, &d, 0, 0, d.n, chunks, 4);
        TU_OK(ctx, oscar_calib_begin_score_pass(c, NULL));
        feed(c, &d, 0, 0, d.n, chunks + 1, 3);
        TU_OK(ctx, oscar__calib_targets(c, "t", OSCAR_CALIB_TARGET_QUERY, c->h_stats1, c->h_stats2, got));
        dq = rel_maxdiff(got, CQ, 256);
        TU_OK(ctx, oscar__calib_targets(c, "t", OSCAR_CALIB_TARGET_SCORE, c->h_stats1, c->h_stats2, got));
        ds = rel_maxdiff(got, CS, 256);
        cr_log_info("dtype %d: C_Q rel diff %.2e, C_S rel diff %.2e", di, dq, ds);
        cr_assert(dq < 1e-13, "dtype %d: C_Q differs by %g", di, dq);
        cr_assert(ds < 1e-12, "dtype %d: C_S differs by %g", di, ds);
        oscar_calib_destroy(c);
        free(CQ), free(CS), free(got);
        free_data(&d);
    }
    oscar_shutdown(ctx);
}

Test(calib_cpu, any_chunking_gives_the_same_statistics) {
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    calib_data d = make_data(&r, 517, 4, 4, 32, OSCAR_DTYPE_BF16);
    static const int64_t one[1] = {517}, odd[5] = {1, 2, 3, 64, 7}, sevens[1] = {7};
    oscar_calib *a = make_calib(ctx, &d, 1, NULL, 0, 1), *b = make_calib(ctx, &d, 1, NULL, 0, 1),
                *c = make_calib(ctx, &d, 1, NULL, 0, 1);
    double *sa, *sb, *sc;
    int64_t na, nb, nc;
    feed(a, &d, 0, 0, d.n, one, 1);
    feed(b, &d, 0, 0, d.n, odd, 5);
    feed(c, &d, 0, 0, d.n, sevens, 1);
    sa = export_stats(a, &na), sb = export_stats(b, &nb), sc = export_stats(c, &nc);
    cr_assert(na == nb && nb == nc && sa[0] == 517.0);
    cr_assert(rel_maxdiff(sb, sa, (size_t)na) < 1e-14, "chunked vs one call: %g", rel_maxdiff(sb, sa, (size_t)na));
    cr_assert(rel_maxdiff(sc, sa, (size_t)na) < 1e-14);
    free(sa), free(sb), free(sc);
    TU_OK(ctx, oscar_calib_begin_score_pass(a, NULL));
    TU_OK(ctx, oscar_calib_begin_score_pass(b, NULL));
    feed(a, &d, 0, 0, d.n, one, 1);
    feed(b, &d, 0, 0, d.n, odd, 5);
    sa = export_stats(a, &na), sb = export_stats(b, &nb);
    cr_assert(rel_maxdiff(sb, sa, (size_t)na) < 1e-13, "score pass chunked vs one call: %g",
              rel_maxdiff(sb, sa, (size_t)na));
    free(sa), free(sb);
    oscar_calib_destroy(a), oscar_calib_destroy(b), oscar_calib_destroy(c);
    free_data(&d);
    oscar_shutdown(ctx);
}

Test(calib_cpu, warmup_chunks_are_skipped_per_layer_and_pass) {
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    calib_data d = make_data(&r, 206, 2, 1, 16, OSCAR_DTYPE_F32);
    static const int64_t six_then_200[2] = {6, 200};
    static const int64_t two_hundred[1] = {200};
    int32_t ids[2] = {4, 9};
    oscar_calib *a = make_calib(ctx, &d, 2, ids, 1, 0), *b = make_calib(ctx, &d, 2, ids, 0, 0);
    double *sa, *sb;
    int64_t na, nb, i;
    /* a sees a 6-token warm-up chunk first on each layer, b only the rest */
    for (i = 0; i < 6 * 2 * 16; i++) ((float *)d.q.data)[i] *= 1000.0f;
    feed(a, &d, 4, 0, 206, six_then_200, 2);
    feed(a, &d, 9, 0, 206, six_then_200, 2);
    feed(b, &d, 4, 6, 206, two_hundred, 1);
    feed(b, &d, 9, 6, 206, two_hundred, 1);
    sa = export_stats(a, &na), sb = export_stats(b, &nb);
    cr_assert(na == nb && memcmp(sa, sb, sizeof(double) * (size_t)na) == 0, "skipping is exact");
    cr_assert_eq(sa[0], 200.0);
    free(sa), free(sb);
    /* the score pass skips again */
    TU_OK(ctx, oscar_calib_begin_score_pass(a, NULL));
    TU_OK(ctx, oscar_calib_begin_score_pass(b, NULL));
    feed(a, &d, 4, 0, 206, six_then_200, 2);
    feed(b, &d, 4, 6, 206, two_hundred, 1);
    sa = export_stats(a, &na), sb = export_stats(b, &nb);
    cr_assert(memcmp(sa, sb, sizeof(double) * (size_t)na) == 0);
    free(sa), free(sb);
    oscar_calib_destroy(a), oscar_calib_destroy(b);
    free_data(&d);
    oscar_shutdown(ctx);
}

/* Two accumulators on two halves, statistics summed (what an NCCL all-reduce
   does), give what one accumulator gives on everything. */
Test(calib_cpu, statistics_are_additive) {
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    calib_data d = make_data(&r, 400, 8, 2, 32, OSCAR_DTYPE_BF16);
    static const int64_t ch[2] = {33, 50};
    oscar_calib *a = make_calib(ctx, &d, 1, NULL, 0, 0), *b = make_calib(ctx, &d, 1, NULL, 0, 0),
                *all = make_calib(ctx, &d, 1, NULL, 0, 0);
    oscar_calib_finish_desc fd = {0};
    oscar_rotation_set *ka, *va, *kall, *vall;
    oscar_rotation_set_info ia = {0}, iall = {0};
    double *sa, *sb, *sall;
    int64_t n, i;
    calib_need_lapack();
    feed(a, &d, 0, 0, 150, ch, 2);
    feed(b, &d, 0, 150, 400, ch, 2);
    feed(all, &d, 0, 0, 400, ch, 2);
    sa = export_stats(a, &n), sb = export_stats(b, &n), sall = export_stats(all, &n);
    for (i = 0; i < n; i++) sa[i] += sb[i];
    cr_assert(rel_maxdiff(sa, sall, (size_t)n) < 1e-14);
    TU_OK(ctx, oscar_calib_import_stats(a, sa, n, NULL));
    TU_OK(ctx, oscar_calib_import_stats(b, sa, n, NULL));
    free(sa), free(sb), free(sall);
    TU_OK(ctx, oscar_calib_begin_score_pass(a, NULL));
    TU_OK(ctx, oscar_calib_begin_score_pass(b, NULL));
    TU_OK(ctx, oscar_calib_begin_score_pass(all, NULL));
    feed(a, &d, 0, 0, 150, ch, 2);
    feed(b, &d, 0, 150, 400, ch, 2);
    feed(all, &d, 0, 0, 400, ch, 2);
    sa = export_stats(a, &n), sb = export_stats(b, &n), sall = export_stats(all, &n);
    for (i = 0; i < n; i++) sa[i] += sb[i];
    cr_assert(rel_maxdiff(sa, sall, (size_t)n) < 1e-13, "pass 2: %g", rel_maxdiff(sa, sall, (size_t)n));
    TU_OK(ctx, oscar_calib_import_stats(a, sa, n, NULL));
    cr_assert_eq(oscar_calib_import_stats(a, sa, n - 1, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    fd.composition = OSCAR_ROTATION_U;
    TU_OK(ctx, oscar_calib_finish(a, &fd, &ka, &va, NULL));
    TU_OK(ctx, oscar_calib_finish(all, &fd, &kall, &vall, NULL));
    oscar_rotation_set_query(va, &ia);
    oscar_rotation_set_query(vall, &iall);
    for (i = 0; i < 32; i++)
        cr_assert(fabs(ia.eigenvalues[i] - iall.eigenvalues[i]) <= 1e-5 * fabs(iall.eigenvalues[31]));
    for (i = 0; i < 32 * 32; i++) cr_assert(fabs(ia.rotations[i] - iall.rotations[i]) < 1e-4, "V basis entry %d", (int)i);
    free(sa), free(sb), free(sall);
    oscar_rotation_set_destroy(ka), oscar_rotation_set_destroy(va);
    oscar_rotation_set_destroy(kall), oscar_rotation_set_destroy(vall);
    oscar_calib_destroy(a), oscar_calib_destroy(b), oscar_calib_destroy(all);
    free_data(&d);
    oscar_shutdown(ctx);
}

/* ---- precision at 32K tokens ------------------------------------------------------- */
static void dd_add(double *hi, double *lo, double x) {
    double s = *hi + x, bb = s - *hi, e = (*hi - (s - bb)) + (x - bb);
    *hi = s;
    *lo += e;
}

/* float64 accumulation of 32768 tokens x 4 query heads of bf16 activations with
   outliers and a large common offset, against double-double sums (bf16
   products are exact in float64, so double-double is exact to ~1e-30). */
Test(calib_cpu, float64_accumulation_is_exact_enough_at_32k_tokens, .timeout = 300) {
    enum { D = 64, HQ = 4 };
    const int64_t n = 32768;
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    act_buf q = act_alloc((size_t)n * HQ * D, OSCAR_DTYPE_BF16);
    double *hi = cr_dzero(D * D), *lo = cr_dzero(D * D), *s;
    float *f32 = (float *)tu_xmalloc(sizeof(float) * D * D);
    oscar_calib_desc desc = {0};
    oscar_calib_batch_desc b = {0};
    oscar_calib *c;
    double worst = 0, worst32 = 0;
    int64_t i, cnt;
    int a, e;
    for (i = 0; i < n * HQ; i++)
        for (a = 0; a < D; a++) {
            double x = 3.0 + tu_normal(&r) * (a % 7 == 0 ? 40.0 : 1.0 + a * 0.1);
            act_set(&q, (size_t)(i * D + a), x);
        }
    memset(f32, 0, sizeof(float) * D * D);
    for (i = 0; i < n * HQ; i++) {
        const double *x = q.vals + i * D;
        for (a = 0; a < D; a++)
            for (e = a; e < D; e++) {
                dd_add(&hi[a * D + e], &lo[a * D + e], x[a] * x[e]);
                f32[a * D + e] += (float)(x[a] * x[e]); /* what float32 accumulation would give */
            }
    }
    desc.num_layers = 1, desc.head_dim = D, desc.num_q_heads = HQ, desc.num_kv_heads = 1;
    TU_OK(ctx, oscar_calib_create(ctx, &desc, &c));
    b.num_tokens = n, b.q = q.data;
    TU_OK(ctx, oscar_calib_accumulate(c, &b, NULL));
    s = export_stats(c, &cnt);
    for (a = 0; a < D; a++)
        for (e = a; e < D; e++) {
            double exact = hi[a * D + e] + lo[a * D + e];
            double scale = sqrt((hi[a * D + a] + lo[a * D + a]) * (hi[e * D + e] + lo[e * D + e]));
            worst = fmax(worst, fabs(s[1 + a * D + e] - exact) / scale);
            worst32 = fmax(worst32, fabs((double)f32[a * D + e] - exact) / scale);
            cr_assert_eq(s[1 + a * D + e], s[1 + e * D + a], "exactly symmetric");
        }
    cr_log_info("131072 rows: float64 accumulation max error %.2e (relative to sqrt(S_aa S_bb)); float32 would be %.2e",
                worst, worst32);
    cr_assert(worst < 1e-13, "float64 accumulation error %g", worst);
    free(s), free(hi), free(lo), free(f32);
    act_free(&q);
    oscar_calib_destroy(c);
    oscar_shutdown(ctx);
}

/* ---- planted covariances ---------------------------------------------------------- */

/* Rows x_i = sqrt(D λ_i) u_i (and their negatives) give exactly C = U Λ Uᵀ:
   the fitted U (composition U) recovers u_i up to sign, λ exactly. */
Test(calib_cpu, planted_covariance_exact_recovery) {
    enum { D = 32 };
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    double U0[D * D], lam[D];
    act_buf q = act_alloc(2 * D * D, OSCAR_DTYPE_F32);
    oscar_calib_desc desc = {0};
    oscar_calib_batch_desc b = {0};
    oscar_calib_finish_desc fd = {0};
    oscar_calib *c;
    oscar_rotation_set *k;
    oscar_rotation_set_info info = {0};
    int i, j, a;
    calib_need_lapack();
    random_orthogonal(&r, D, U0);
    for (i = 0; i < D; i++) lam[i] = 0.05 * pow(1.3, i); /* distinct, ascending */
    for (i = 0; i < D; i++)
        for (a = 0; a < D; a++) {
            act_set(&q, (size_t)(2 * i) * D + a, sqrt(D * lam[i]) * U0[a * D + i]);
            act_set(&q, (size_t)(2 * i + 1) * D + a, -sqrt(D * lam[i]) * U0[a * D + i]);
        }
    desc.num_layers = 1, desc.head_dim = D, desc.num_q_heads = 1, desc.num_kv_heads = 1;
    TU_OK(ctx, oscar_calib_create(ctx, &desc, &c));
    b.num_tokens = 2 * D, b.q = q.data, b.dtype = OSCAR_DTYPE_F32;
    TU_OK(ctx, oscar_calib_accumulate(c, &b, NULL));
    fd.composition = OSCAR_ROTATION_U;
    TU_OK(ctx, oscar_calib_finish(c, &fd, &k, NULL, NULL));
    oscar_rotation_set_query(k, &info);
    cr_assert_str_eq(info.objective, "qqt_plain");
    for (i = 0; i < D; i++) {
        double dot = 0;
        cr_assert(fabs(info.eigenvalues[i] - lam[i]) < 1e-5 * lam[D - 1], "λ_%d = %g, planted %g", i, info.eigenvalues[i],
                  lam[i]);
        for (j = 0; j < D; j++) dot += info.rotations[j * D + i] * U0[j * D + i];
        cr_assert(fabs(fabs(dot) - 1) < 1e-5, "eigenvector %d: |u·u0| = %g", i, fabs(dot));
    }
    oscar_rotation_set_destroy(k);
    oscar_calib_destroy(c);
    act_free(&q);
    oscar_shutdown(ctx);
}

/* Sampled Gaussian queries with a planted covariance, GQA 4:1 over two KV
   heads sharing it: the top eigenvectors come back within sampling error. */
Test(calib_cpu, planted_covariance_sampled_recovery) {
    enum { D = 64, HQ = 8, HKV = 2 };
    const int64_t n = 6000;
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    double *U0 = cr_dalloc(D * D), lam[D], z[D];
    act_buf q = act_alloc((size_t)n * HQ * D, OSCAR_DTYPE_BF16);
    oscar_calib_desc desc = {0};
    oscar_calib_batch_desc b = {0};
    oscar_calib_finish_desc fd = {0};
    oscar_calib *c;
    oscar_rotation_set *k;
    oscar_rotation_set_info info = {0};
    int64_t t;
    int i, j, a;
    calib_need_lapack();
    random_orthogonal(&r, D, U0);
    for (i = 0; i < D; i++) lam[i] = i < D - 8 ? 0.01 + 0.001 * i : pow(2.0, i - (D - 8)); /* top 8: 1, 2, .., 128 */
    for (t = 0; t < n * HQ; t++) {
        for (i = 0; i < D; i++) z[i] = tu_normal(&r) * sqrt(lam[i]);
        for (a = 0; a < D; a++) {
            double x = 0;
            for (i = 0; i < D; i++) x += U0[a * D + i] * z[i];
            act_set(&q, (size_t)(t * D + a), x);
        }
    }
    desc.num_layers = 1, desc.head_dim = D, desc.num_q_heads = HQ, desc.num_kv_heads = HKV;
    TU_OK(ctx, oscar_calib_create(ctx, &desc, &c));
    b.num_tokens = n, b.q = q.data;
    TU_OK(ctx, oscar_calib_accumulate(c, &b, NULL));
    fd.composition = OSCAR_ROTATION_U;
    TU_OK(ctx, oscar_calib_finish(c, &fd, &k, NULL, NULL));
    oscar_rotation_set_query(k, &info);
    for (i = D - 8; i < D; i++) {
        double dot = 0;
        for (j = 0; j < D; j++) dot += info.rotations[j * D + i] * U0[j * D + i];
        cr_assert(fabs(dot) > 0.98, "top eigenvector %d: |u·u0| = %g", i, fabs(dot));
        cr_assert(fabs(info.eigenvalues[i] / lam[i] - 1) < 0.05, "λ_%d = %g vs %g", i, info.eigenvalues[i], lam[i]);
    }
    oscar_rotation_set_destroy(k);
    oscar_calib_destroy(c);
    act_free(&q);
    free(U0);
    oscar_shutdown(ctx);
}

/* ---- every composition is a rotation in fp32 ------------------------------------------- */
Test(calib_cpu, every_composition_is_orthogonal_in_fp32, .timeout = 300) {
    static const int dims[3] = {64, 128, 256};
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    int di, comp;
    calib_need_lapack();
    for (di = 0; di < 3; di++) {
        calib_data d = make_data(&r, 300, 4, 2, dims[di], OSCAR_DTYPE_BF16);
        int32_t ids[2] = {3, 31}; /* sparse */
        oscar_calib *c = make_calib(ctx, &d, 2, ids, 0, 1);
        static const int64_t ch[1] = {300};
        feed(c, &d, 3, 0, 300, ch, 1);
        feed(c, &d, 31, 0, 300, ch, 1);
        TU_OK(ctx, oscar_calib_begin_score_pass(c, NULL));
        feed(c, &d, 3, 0, 300, ch, 1);
        feed(c, &d, 31, 0, 300, ch, 1);
        for (comp = 1; comp < OSCAR__ROTATION_COUNT; comp++) {
            oscar_calib_finish_desc fd = {0};
            oscar_rotation_set *k, *v;
            oscar_rotation_set_info ik = {0}, iv = {0};
            int l;
            fd.composition = (oscar_rotation_composition)comp;
            fd.k_target = comp % 2 ? OSCAR_CALIB_TARGET_QUERY : OSCAR_CALIB_TARGET_KEY;
            fd.v_target = comp % 2 ? OSCAR_CALIB_TARGET_SCORE : OSCAR_CALIB_TARGET_VALUE;
            TU_OK(ctx, oscar_calib_finish(c, &fd, &k, &v, NULL));
            oscar_rotation_set_query(k, &ik);
            oscar_rotation_set_query(v, &iv);
            cr_assert(ik.num_layers == 2 && ik.layer_ids[0] == 3 && ik.layer_ids[1] == 31 && ik.head_dim == dims[di]);
            for (l = 0; l < 2; l++) {
                double ek = oscar__orthogonality_error(ik.rotations + (size_t)l * dims[di] * dims[di], dims[di]);
                double ev = oscar__orthogonality_error(iv.rotations + (size_t)l * dims[di] * dims[di], dims[di]);
                cr_assert(ek <= 1e-5 && ev <= 1e-5, "D=%d %s/%s layer %d: max|RRᵀ-I| = %g / %g", dims[di], ik.objective,
                          iv.objective, l, ek, ev);
                if (comp == OSCAR_ROTATION_U_H_PBR && l == 0)
                    cr_log_info("D=%d %s: max|RRᵀ-I| = %.2e, %s: %.2e", dims[di], ik.objective, ek, iv.objective, ev);
            }
            oscar_rotation_set_destroy(k), oscar_rotation_set_destroy(v);
        }
        oscar_calib_destroy(c);
        free_data(&d);
    }
    oscar_shutdown(ctx);
}

Test(calib_cpu, tensor_targets_are_mean_head_gram) {
    enum { D = 16 };
    oscar_ctx *ctx = cpu_ctx();
    tu_rng r = tu_seed();
    calib_data d = make_data(&r, 90, 6, 3, D, OSCAR_DTYPE_F32);
    oscar_calib *c = make_calib(ctx, &d, 1, NULL, 0, 1);
    static const int64_t ch[1] = {40};
    double want[D * D], got[D * D];
    int kv, h, a, e;
    int64_t t;
    feed(c, &d, 0, 0, 90, ch, 1);
    for (kv = 0; kv < 2; kv++) {
        const double *x = kv ? d.v.vals : d.k.vals;
        memset(want, 0, sizeof want);
        for (t = 0; t < 90; t++)
            for (h = 0; h < 3; h++)
                for (a = 0; a < D; a++)
                    for (e = 0; e < D; e++) want[a * D + e] += x[(t * 3 + h) * D + a] * x[(t * 3 + h) * D + e] / (90.0 * 3);
        TU_OK(ctx, oscar__calib_targets(c, "t", kv ? OSCAR_CALIB_TARGET_VALUE : OSCAR_CALIB_TARGET_KEY, c->h_stats1, NULL,
                                        got));
        cr_assert(rel_maxdiff(got, want, D * D) < 1e-13);
    }
    oscar_calib_destroy(c);
    free_data(&d);
    oscar_shutdown(ctx);
}

/* ---- sets, validation --------------------------------------------------------------------- */
Test(calib_cpu, hadamard_set_with_sparse_ids) {
    int32_t ids[3] = {3, 7, 31};
    oscar_rotation_set *s;
    oscar_rotation_set_info info = {0};
    int i;
    TU_OK(NULL, oscar_rotation_set_hadamard(NULL, 256, 3, ids, &s));
    oscar_rotation_set_query(s, &info);
    cr_assert(info.num_layers == 3 && info.head_dim == 256 && !info.eigenvalues);
    cr_assert_str_eq(info.objective, "hadamard");
    cr_assert(oscar_rotation_set_find(s, 7) == 1 && oscar_rotation_set_find(s, 8) == -1 &&
              oscar_rotation_set_find(s, 31) == 2);
    for (i = 0; i < 3; i++) cr_assert(oscar__orthogonality_error(info.rotations + (size_t)i * 65536, 256) < 1e-6);
    cr_assert_eq(info.rotations[65536 + 1 * 256 + 1], -1.0f / 16);
    oscar_rotation_set_destroy(s);
    cr_assert_eq(oscar_rotation_set_hadamard(NULL, 96, 3, NULL, &s), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(NULL), "head_dim = 96") != NULL, "%s", oscar_last_error(NULL));
    ids[1] = 3;
    cr_assert_eq(oscar_rotation_set_hadamard(NULL, 64, 3, ids, &s), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(NULL), "layer_ids[1] = 3") != NULL, "%s", oscar_last_error(NULL));
}

Test(calib_cpu, validation_names_the_field) {
    oscar_ctx *ctx = cpu_ctx();
    oscar_calib_desc desc = {0};
    oscar_calib_batch_desc b = {0};
    oscar_calib_finish_desc fd = {0};
    oscar_calib *c = NULL;
    oscar_rotation_set *k = NULL, *v = NULL;
    float q[6 * 64] = {0};
    desc.num_layers = 2, desc.head_dim = 96, desc.num_q_heads = 6, desc.num_kv_heads = 4;
    cr_assert_eq(oscar_calib_create(ctx, &desc, &c), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "desc.head_dim = 96") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "desc.num_kv_heads = 4") != NULL, "%s", oscar_last_error(ctx));
    desc._end_canary = 1;
    cr_assert_eq(oscar_calib_create(ctx, &desc, &c), OSCAR_STATUS_INVALID_DESC);
    desc._end_canary = 0, desc.head_dim = 64, desc.num_kv_heads = 2;
    TU_OK(ctx, oscar_calib_create(ctx, &desc, &c));
    b.layer_id = 5, b.num_tokens = 1, b.dtype = OSCAR_DTYPE_I32;
    cr_assert_eq(oscar_calib_accumulate(c, &b, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "batch.layer_id = 5") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "batch.dtype = i32") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(strstr(oscar_last_error(ctx), "batch.q = NULL") != NULL, "%s", oscar_last_error(ctx));
    b.layer_id = 1, b.dtype = OSCAR_DTYPE_F32, b.q = q;
    TU_OK(ctx, oscar_calib_accumulate(c, &b, NULL));
    cr_assert_eq(oscar_calib_finish(c, &fd, &k, &v, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "needs the score pass") != NULL, "%s", oscar_last_error(ctx));
    cr_assert(k == NULL && v == NULL);
    fd.k_target = OSCAR_CALIB_TARGET_KEY;
    cr_assert_eq(oscar_calib_finish(c, &fd, &k, NULL, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "tensor_targets") != NULL, "%s", oscar_last_error(ctx));
    fd.k_target = 0;
    cr_assert_eq(oscar_calib_finish(c, &fd, &k, NULL, NULL), OSCAR_STATUS_INVALID_ARGUMENT, "layer 0 has no tokens");
    cr_assert(strstr(oscar_last_error(ctx), "layer 0 received no tokens") != NULL, "%s", oscar_last_error(ctx));
    TU_OK(ctx, oscar_calib_begin_score_pass(c, NULL));
    cr_assert_eq(oscar_calib_begin_score_pass(c, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    b.q = NULL;
    cr_assert_eq(oscar_calib_accumulate(c, &b, NULL), OSCAR_STATUS_INVALID_ARGUMENT);
    cr_assert(strstr(oscar_last_error(ctx), "batch.k = NULL; *must* be set in pass 2") != NULL, "%s",
              oscar_last_error(ctx));
    oscar_calib_destroy(c);
    oscar_shutdown(ctx);
}
