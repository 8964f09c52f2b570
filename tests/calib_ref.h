/* tests/calib_ref.h -- helpers of the calibration suites: a literal, non-
   streaming float64 transcription of the reference's calibration math
   (OSCAR-SPEC.md §6.3, ROT/compute_kv_rotation.py) to check the streaming
   accumulator against, random orthogonal matrices, activation generators.
   Included after oscar.h (with OSCAR_IMPLEMENTATION) and test_util.h. */
#ifndef OSCAR_TEST_CALIB_REF_H
#define OSCAR_TEST_CALIB_REF_H

#include <stdio.h>

/* Fitting on the CPU needs LAPACK at run time (opened with dlopen): skip with the reason without it. */
static inline void calib_need_lapack(void) {
    int unavailable = 0;
    double m[4] = {2, 1, 1, 2}, e[2];
    if (oscar__eigh_lapack(NULL, "probe", 2, 1, m, e, &unavailable) != OSCAR_OK && unavailable)
        cr_skip_test("no LAPACK for the eigendecomposition (install liblapack3): %s", oscar_last_error(NULL));
}

static inline double *cr_dalloc(size_t n) { return (double *)tu_xmalloc(sizeof(double) * (n ? n : 1)); }
static inline double *cr_dzero(size_t n) {
    double *p = cr_dalloc(n);
    memset(p, 0, sizeof(double) * (n ? n : 1));
    return p;
}

/* The reference's targets, literally: per KV head h, C_h = Q_hᵀQ_h / (n r);
   C_Q = mean_h C_h; w_t = k_t C_h k_tᵀ, w <- w / max(Σw, 1e-12) · n;
   C_S = mean_h Σ_t w_t v_tᵀv_t / n. q: [n][Hq][D], k, v: [n][Hkv][D]. */
static inline void ref_targets(int64_t n, int Hq, int Hkv, int D, const double *q, const double *k, const double *v,
                        double *CQ, double *CS) {
    int r = Hq / Hkv, h, j, a, b;
    int64_t t;
    double *Ch = cr_dzero((size_t)D * D), *w = cr_dalloc((size_t)n), *Cs = cr_dzero((size_t)D * D);
    memset(CQ, 0, sizeof(double) * D * D);
    if (CS) memset(CS, 0, sizeof(double) * D * D);
    for (h = 0; h < Hkv; h++) {
        double sum = 0;
        memset(Ch, 0, sizeof(double) * D * D);
        for (t = 0; t < n; t++)
            for (j = 0; j < r; j++) {
                const double *x = q + ((size_t)t * Hq + (size_t)h * r + j) * D;
                for (a = 0; a < D; a++)
                    for (b = 0; b < D; b++) Ch[a * D + b] += x[a] * x[b];
            }
        for (a = 0; a < D * D; a++) Ch[a] /= (double)(n * r);
        for (a = 0; a < D * D; a++) CQ[a] += Ch[a] / Hkv;
        if (!CS) continue;
        for (t = 0; t < n; t++) {
            const double *kt = k + ((size_t)t * Hkv + h) * D;
            double acc = 0;
            for (a = 0; a < D; a++)
                for (b = 0; b < D; b++) acc += kt[a] * Ch[a * D + b] * kt[b];
            w[t] = acc;
            sum += acc;
        }
        for (t = 0; t < n; t++) w[t] = w[t] / fmax(sum, 1e-12) * (double)n;
        memset(Cs, 0, sizeof(double) * D * D);
        for (t = 0; t < n; t++) {
            const double *vt = v + ((size_t)t * Hkv + h) * D;
            for (a = 0; a < D; a++)
                for (b = 0; b < D; b++) Cs[a * D + b] += w[t] * vt[a] * vt[b];
        }
        for (a = 0; a < D * D; a++) CS[a] += Cs[a] / (double)n / Hkv;
    }
    free(Ch), free(w), free(Cs);
}

/* max |A - B| / max |B| */
static inline double rel_maxdiff(const double *A, const double *B, size_t n) {
    double d = 0, m = 0;
    size_t i;
    for (i = 0; i < n; i++) {
        d = fmax(d, fabs(A[i] - B[i]));
        m = fmax(m, fabs(B[i]));
    }
    return m > 0 ? d / m : d;
}

/* Random orthogonal D×D (Gram-Schmidt, twice, of a Gaussian matrix), row-major. */
static inline void random_orthogonal(tu_rng *r, int D, double *U) {
    int i, j, k, pass;
    for (i = 0; i < D * D; i++) U[i] = tu_normal(r);
    for (j = 0; j < D; j++) /* orthonormalise column j against columns < j */
        for (pass = 0; pass < 2; pass++) {
            double nrm = 0;
            for (k = 0; k < j; k++) {
                double dot = 0;
                for (i = 0; i < D; i++) dot += U[i * D + j] * U[i * D + k];
                for (i = 0; i < D; i++) U[i * D + j] -= dot * U[i * D + k];
            }
            for (i = 0; i < D; i++) nrm += U[i * D + j] * U[i * D + j];
            nrm = sqrt(nrm);
            for (i = 0; i < D; i++) U[i * D + j] /= nrm;
        }
}

/* Host activations in a given dtype, with the double values they stand for. */
typedef struct act_buf {
    void *data;   /* bf16/f16 bits or f32 */
    double *vals; /* the same values as doubles */
    size_t count;
    oscar_dtype dtype;
} act_buf;

static inline act_buf act_alloc(size_t count, oscar_dtype dtype) {
    act_buf a;
    a.count = count;
    a.dtype = dtype;
    a.data = tu_xmalloc(count * (dtype == OSCAR_DTYPE_F32 ? 4 : 2));
    a.vals = cr_dalloc(count);
    return a;
}
static inline void act_set(act_buf *a, size_t i, double x) {
    if (a->dtype == OSCAR_DTYPE_F32) {
        float f = (float)x;
        ((float *)a->data)[i] = f;
        a->vals[i] = f;
    } else if (a->dtype == OSCAR_DTYPE_F16) {
        uint16_t h = oscar__f32_to_f16((float)x);
        ((uint16_t *)a->data)[i] = h;
        a->vals[i] = oscar__f16_to_f32(h);
    } else {
        uint16_t h = oscar__f32_to_bf16((float)x);
        ((uint16_t *)a->data)[i] = h;
        a->vals[i] = oscar__bf16_to_f32(h);
    }
}
static inline void act_free(act_buf *a) {
    free(a->data);
    free(a->vals);
}

/* Activations with structure: a per-channel scale spread over two decades,
   a few outlier channels (x outlier_gain), a shared low-rank component,
   a per-token magnitude, all through a fixed orthogonal mixing M (D×D, may
   be NULL for none). rows = tokens*heads, row-major [rows][D]. */
static inline void fill_structured(tu_rng *r, act_buf *a, int64_t rows, int D, const double *M, double outlier_gain,
                            int seed_channels) {
    int64_t t;
    int d, e;
    double *z = cr_dalloc((size_t)D), *y = cr_dalloc((size_t)D);
    for (t = 0; t < rows; t++) {
        double tok = 0.5 + tu_uniform(r);
        for (d = 0; d < D; d++) {
            double scale = pow(10.0, -1.0 + 2.0 * (double)((d * 37 + seed_channels) % D) / D);
            if ((d + seed_channels) % 41 == 3) scale *= outlier_gain;
            z[d] = tu_normal(r) * scale * tok;
        }
        for (d = 0; d < D; d++) {
            double s = 0;
            if (M)
                for (e = 0; e < D; e++) s += z[e] * M[e * D + d];
            else
                s = z[d];
            y[d] = s;
        }
        for (d = 0; d < D; d++) act_set(a, (size_t)t * D + d, y[d]);
    }
    free(z), free(y);
}

#endif
