/* calib/oscar_calib_math.h -- part of the oscar.h implementation (included
   by calib/oscar_calib.h): rotation sets, the rotation algebra of
   OSCAR-SPEC.md §6.3 (normalised Sylvester Hadamard, bit-reversal
   permutation, compositions) and the float64 symmetric eigensolvers, LAPACK
   dsyevd and cuSOLVER cusolverDnDsyevd, both opened at run time. */
#ifndef OSCAR_CALIB_MATH_H_INCLUDED
#define OSCAR_CALIB_MATH_H_INCLUDED

/* ---- allocation that outlives a ctx --------------------------------------- */
OSCAR__PRIVATE oscar_allocator oscar__ctx_allocator(const oscar_ctx *ctx) {
    oscar_allocator a;
    memset(&a, 0, sizeof a);
    if (ctx) a = ctx->desc.allocator;
    return a;
}
OSCAR__PRIVATE void *oscar__alloc_a(const oscar_allocator *a, size_t n) {
    void *p;
    if (n == 0) n = 1;
    p = a->alloc_fn ? a->alloc_fn(n, a->user_data) : OSCAR_MALLOC(n);
    if (p) memset(p, 0, n);
    return p;
}
OSCAR__PRIVATE void oscar__free_a(const oscar_allocator *a, void *p) {
    if (!p) return;
    if (a->free_fn)
        a->free_fn(p, a->user_data);
    else
        OSCAR_FREE(p);
}

/* ---- rotation sets ------------------------------------------------------------ */
#define OSCAR__MAX_ROTATION_DIM 4096
#define OSCAR__OBJECTIVE_CAP 64

struct oscar_rotation_set {
    oscar_allocator allocator;
    int32_t num_layers;
    int32_t head_dim;
    int32_t *layer_ids;
    float *rotations;
    float *eigenvalues; /* NULL when the set has none */
    char objective[OSCAR__OBJECTIVE_CAP];
};

OSCAR_API void oscar_rotation_set_destroy(oscar_rotation_set *set) {
    oscar_allocator a;
    if (!set) return;
    a = set->allocator;
    oscar__free_a(&a, set->layer_ids);
    oscar__free_a(&a, set->rotations);
    oscar__free_a(&a, set->eigenvalues);
    oscar__free_a(&a, set);
}

/* A zeroed set of the given shape (layer ids 0..L-1). */
OSCAR__PRIVATE oscar_status oscar__rotation_set_new(const oscar_ctx *ctx, const char *func, int32_t num_layers,
                                                    int32_t head_dim, int with_eigenvalues, oscar_rotation_set **out) {
    oscar_allocator a = oscar__ctx_allocator(ctx);
    oscar_rotation_set *s;
    size_t L = OSCAR__CAST(size_t, num_layers), D = OSCAR__CAST(size_t, head_dim);
    int32_t i;
    *out = NULL;
    s = OSCAR__CAST(oscar_rotation_set *, oscar__alloc_a(&a, sizeof *s));
    if (!s) return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory for a rotation set", func);
    s->allocator = a;
    s->num_layers = num_layers;
    s->head_dim = head_dim;
    s->layer_ids = OSCAR__CAST(int32_t *, oscar__alloc_a(&a, sizeof(int32_t) * L));
    s->rotations = OSCAR__CAST(float *, oscar__alloc_a(&a, sizeof(float) * L * D * D));
    if (with_eigenvalues) s->eigenvalues = OSCAR__CAST(float *, oscar__alloc_a(&a, sizeof(float) * L * D));
    if (!s->layer_ids || !s->rotations || (with_eigenvalues && !s->eigenvalues)) {
        oscar_rotation_set_destroy(s);
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY,
                           "%s: out of memory for %d layers of %d×%d rotations", func, num_layers, head_dim, head_dim);
    }
    for (i = 0; i < num_layers; i++) s->layer_ids[i] = i;
    *out = s;
    return OSCAR_OK;
}

OSCAR__PRIVATE void oscar__set_objective(oscar_rotation_set *s, const char *objective) {
    snprintf(s->objective, sizeof s->objective, "%s", objective ? objective : "");
}

/* Layer ids must be strictly ascending and >= 0; returns the first bad index or -1. */
OSCAR__PRIVATE int32_t oscar__bad_layer_id(const int32_t *ids, int32_t n) {
    int32_t i;
    for (i = 0; i < n; i++)
        if (ids[i] < 0 || (i > 0 && ids[i] <= ids[i - 1])) return i;
    return -1;
}

OSCAR_API oscar_status oscar_rotation_set_create(oscar_ctx *ctx, const oscar_rotation_set_desc *desc,
                                                 oscar_rotation_set **out_set) {
    oscar__validator v;
    oscar_rotation_set *s;
    oscar_status st;
    int32_t bad;
    size_t L, D;
    oscar__clear_error(ctx);
    if (!out_set || !desc)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_rotation_set_create: desc and out_set must be non-NULL");
    *out_set = NULL;
    oscar__validate_begin(&v, ctx, "oscar_rotation_set_create");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, desc->num_layers >= 1, "desc.num_layers = %d; expected >= 1", desc->num_layers);
    OSCAR__VALIDATE(&v, desc->head_dim >= 1 && desc->head_dim <= OSCAR__MAX_ROTATION_DIM,
                    "desc.head_dim = %d; expected 1..%d", desc->head_dim, OSCAR__MAX_ROTATION_DIM);
    OSCAR__VALIDATE(&v, desc->rotations != NULL, "desc.rotations = NULL; *must* be set");
    OSCAR__VALIDATE(&v, !desc->objective || strlen(desc->objective) < OSCAR__OBJECTIVE_CAP,
                    "desc.objective is %zu bytes; expected at most %d", desc->objective ? strlen(desc->objective) : 0,
                    OSCAR__OBJECTIVE_CAP - 1);
    if (desc->layer_ids && desc->num_layers >= 1) {
        bad = oscar__bad_layer_id(desc->layer_ids, desc->num_layers);
        OSCAR__VALIDATE(&v, bad < 0, "desc.layer_ids[%d] = %d; expected >= 0 and strictly ascending", bad,
                        bad >= 0 ? desc->layer_ids[bad] : 0);
    }
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;
    st = oscar__rotation_set_new(ctx, "oscar_rotation_set_create", desc->num_layers, desc->head_dim,
                                 desc->eigenvalues != NULL, &s);
    if (st != OSCAR_OK) return st;
    L = OSCAR__CAST(size_t, desc->num_layers);
    D = OSCAR__CAST(size_t, desc->head_dim);
    if (desc->layer_ids) memcpy(s->layer_ids, desc->layer_ids, sizeof(int32_t) * L);
    memcpy(s->rotations, desc->rotations, sizeof(float) * L * D * D);
    if (desc->eigenvalues) memcpy(s->eigenvalues, desc->eigenvalues, sizeof(float) * L * D);
    oscar__set_objective(s, desc->objective);
    *out_set = s;
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_rotation_set_query(const oscar_rotation_set *set, oscar_rotation_set_info *out_info) {
    if (!out_info) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_rotation_set_query: out_info = NULL");
    memset(out_info, 0, sizeof *out_info);
    if (!set) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_rotation_set_query: set = NULL");
    out_info->num_layers = set->num_layers;
    out_info->head_dim = set->head_dim;
    out_info->layer_ids = set->layer_ids;
    out_info->rotations = set->rotations;
    out_info->eigenvalues = set->eigenvalues;
    out_info->objective = set->objective;
    return OSCAR_OK;
}

/* Index of id in a strictly ascending array, or -1. */
OSCAR__PRIVATE int32_t oscar__find_layer_id(const int32_t *ids, int32_t n, int32_t id) {
    int32_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (ids[mid] == id) return mid;
        if (ids[mid] < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return -1;
}

OSCAR_API int32_t oscar_rotation_set_find(const oscar_rotation_set *set, int32_t layer_id) {
    return set ? oscar__find_layer_id(set->layer_ids, set->num_layers, layer_id) : -1;
}

/* ---- rotation algebra (float64) ------------------------------------------------ */

OSCAR__PRIVATE int oscar__log2i(int32_t n) {
    int b = 0;
    while ((OSCAR__CAST(int32_t, 1) << b) < n) b++;
    return b;
}
OSCAR__PRIVATE int32_t oscar__bit_reverse(int32_t i, int bits) {
    int32_t r = 0;
    int b;
    for (b = 0; b < bits; b++)
        if (i & (OSCAR__CAST(int32_t, 1) << b)) r |= OSCAR__CAST(int32_t, 1) << (bits - 1 - b);
    return r;
}

/* Normalised Sylvester Hadamard: H[i][j] = (-1)^popcount(i & j) / sqrt(D). */
OSCAR__PRIVATE void oscar__hadamard(int32_t D, double *H) {
    double s = 1.0 / sqrt(OSCAR__CAST(double, D));
    int32_t i, j;
    for (i = 0; i < D; i++)
        for (j = 0; j < D; j++) {
            uint32_t x = OSCAR__CAST(uint32_t, i & j), odd = 0;
            while (x) {
                odd ^= x & 1u;
                x >>= 1;
            }
            H[OSCAR__CAST(size_t, i) * OSCAR__CAST(size_t, D) + OSCAR__CAST(size_t, j)] = odd ? -s : s;
        }
}

/* y = x·H in place for one row (H symmetric, so also H·x): the fast
   Walsh-Hadamard transform in Sylvester order, then / sqrt(D). */
OSCAR__PRIVATE void oscar__fwht_row(double *x, int32_t D) {
    int32_t len, i, j;
    double s = 1.0 / sqrt(OSCAR__CAST(double, D));
    for (len = 1; len < D; len <<= 1)
        for (i = 0; i < D; i += 2 * len)
            for (j = i; j < i + len; j++) {
                double u = x[j], w = x[j + len];
                x[j] = u + w;
                x[j + len] = u - w;
            }
    for (i = 0; i < D; i++) x[i] *= s;
}

/* The bit-reversal permutation of OSCAR-SPEC.md §6.3: sorted = argsort(λ,
   descending), perm[br(i)] = sorted[i], P = I[:, perm], so (y·P)_j = y_perm[j]:
   the largest-eigenvalue direction goes to position 0, the second to D/2,
   the third to D/4, the fourth to 3D/4. Ties keep eigh's order reversed
   (sorted[i] = D-1-i for ascending λ), as argsort of an ascending array.
   evals NULL: the order of distinct ascending eigenvalues. D a power of two. */
OSCAR__PRIVATE void oscar__pbr_perm(int32_t D, const double *evals, int32_t *perm, int32_t *sorted) {
    int bits = oscar__log2i(D);
    int32_t i, j;
    for (i = 0; i < D; i++) sorted[i] = D - 1 - i;
    if (evals) /* insertion sort, stable on the D-1-i order: descending λ */
        for (i = 1; i < D; i++) {
            int32_t cur = sorted[i];
            j = i - 1;
            while (j >= 0 && evals[sorted[j]] < evals[cur]) {
                sorted[j + 1] = sorted[j];
                j--;
            }
            sorted[j + 1] = cur;
        }
    for (i = 0; i < D; i++) perm[oscar__bit_reverse(i, bits)] = sorted[i];
}

OSCAR__PRIVATE const char *oscar__composition_name(oscar_rotation_composition c) {
    switch (c) {
    case OSCAR_ROTATION_U_H_PBR: return "r_h_pbr";
    case OSCAR_ROTATION_U_H: return "r_h";
    case OSCAR_ROTATION_U: return "plain";
    case OSCAR_ROTATION_U_PBR: return "pbr";
    case OSCAR_ROTATION_H_PBR: return "h_pbr";
    case OSCAR_ROTATION_H: return "hadamard";
    case OSCAR_ROTATION_IDENTITY: return "identity";
    default: return "?";
    }
}
OSCAR__PRIVATE int oscar__composition_needs_pow2(oscar_rotation_composition c) {
    return c != OSCAR_ROTATION_U && c != OSCAR_ROTATION_IDENTITY;
}

/* R (D×D row-major) from the eigenbasis U (row-major, column j = the
   eigenvector of evals[j], ascending) as the composition asks, x' = x @ R:
       U_H_PBR  R = U·H·P      U_H  R = U·H      U  R = U      U_PBR  R = U·P
       H_PBR    R = H·P        H    R = H        IDENTITY  R = I
   with (M·P)[:, j] = M[:, perm[j]]. work: 2·D doubles + 2·D int32. */
OSCAR__PRIVATE void oscar__compose(int32_t D, oscar_rotation_composition comp, const double *U, const double *evals,
                                   double *R, double *work, int32_t *iwork) {
    size_t n = OSCAR__CAST(size_t, D), i, j;
    int use_u = comp == OSCAR_ROTATION_U_H_PBR || comp == OSCAR_ROTATION_U_H || comp == OSCAR_ROTATION_U ||
                comp == OSCAR_ROTATION_U_PBR;
    int use_h = comp == OSCAR_ROTATION_U_H_PBR || comp == OSCAR_ROTATION_U_H || comp == OSCAR_ROTATION_H_PBR ||
                comp == OSCAR_ROTATION_H;
    int use_p = comp == OSCAR_ROTATION_U_H_PBR || comp == OSCAR_ROTATION_U_PBR || comp == OSCAR_ROTATION_H_PBR;
    int32_t *perm = iwork, *sorted = iwork + D;
    double *row = work;
    if (use_p) oscar__pbr_perm(D, evals, perm, sorted);
    for (i = 0; i < n; i++) {
        /* row i of the unpermuted product M = (U or I)·(H or I) */
        if (use_u)
            memcpy(row, U + i * n, sizeof(double) * n);
        else
            for (j = 0; j < n; j++) row[j] = i == j ? 1.0 : 0.0;
        if (use_h) oscar__fwht_row(row, D);
        for (j = 0; j < n; j++) R[i * n + j] = use_p ? row[perm[j]] : row[j];
    }
}

/* Fixes each eigenvector's sign: its largest-magnitude component (the first
   on ties) is positive, so every solver gives the same basis. */
OSCAR__PRIVATE void oscar__fix_signs(int32_t D, double *U) {
    size_t n = OSCAR__CAST(size_t, D), i, j, best;
    for (j = 0; j < n; j++) {
        best = 0;
        for (i = 1; i < n; i++)
            if (fabs(U[i * n + j]) > fabs(U[best * n + j])) best = i;
        if (U[best * n + j] < 0)
            for (i = 0; i < n; i++) U[i * n + j] = -U[i * n + j];
    }
}

/* max |R·Rᵀ − I| of one fp32 rotation, in float64. */
OSCAR__PRIVATE double oscar__orthogonality_error(const float *R, int32_t D) {
    size_t n = OSCAR__CAST(size_t, D), i, j, k;
    double worst = 0.0;
    for (i = 0; i < n; i++)
        for (j = i; j < n; j++) {
            double s = 0.0;
            for (k = 0; k < n; k++) s += OSCAR__CAST(double, R[i * n + k]) * OSCAR__CAST(double, R[j * n + k]);
            s -= i == j ? 1.0 : 0.0;
            if (fabs(s) > worst || s != s) worst = s != s ? HUGE_VAL : fabs(s);
        }
    return worst;
}

OSCAR_API oscar_status oscar_rotation_set_hadamard(oscar_ctx *ctx, int32_t head_dim, int32_t num_layers,
                                                   const int32_t *layer_ids, oscar_rotation_set **out_set) {
    oscar__validator v;
    oscar_rotation_set *s;
    oscar_status st;
    double *H;
    size_t n, i, l;
    int32_t bad;
    oscar__clear_error(ctx);
    if (!out_set) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_rotation_set_hadamard: out_set = NULL");
    *out_set = NULL;
    oscar__validate_begin(&v, ctx, "oscar_rotation_set_hadamard");
    OSCAR__VALIDATE(&v, oscar__is_pow2(head_dim) && head_dim <= OSCAR__MAX_ROTATION_DIM,
                    "head_dim = %d; expected a power of two up to %d (Sylvester Hadamard)", head_dim,
                    OSCAR__MAX_ROTATION_DIM);
    OSCAR__VALIDATE(&v, num_layers >= 1, "num_layers = %d; expected >= 1", num_layers);
    if (layer_ids && num_layers >= 1) {
        bad = oscar__bad_layer_id(layer_ids, num_layers);
        OSCAR__VALIDATE(&v, bad < 0, "layer_ids[%d] = %d; expected >= 0 and strictly ascending", bad,
                        bad >= 0 ? layer_ids[bad] : 0);
    }
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;
    n = OSCAR__CAST(size_t, head_dim);
    H = OSCAR__CAST(double *, oscar__alloc(ctx, sizeof(double) * n * n));
    if (!H) return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_rotation_set_hadamard: out of memory");
    st = oscar__rotation_set_new(ctx, "oscar_rotation_set_hadamard", num_layers, head_dim, 0, &s);
    if (st != OSCAR_OK) {
        oscar__free(ctx, H);
        return st;
    }
    oscar__hadamard(head_dim, H);
    for (l = 0; l < OSCAR__CAST(size_t, num_layers); l++) {
        for (i = 0; i < n * n; i++) s->rotations[l * n * n + i] = OSCAR__CAST(float, H[i]);
        if (layer_ids) s->layer_ids[l] = layer_ids[l];
    }
    oscar__set_objective(s, "hadamard");
    oscar__free(ctx, H);
    *out_set = s;
    return OSCAR_OK;
}

/* ---- eigensolvers ----------------------------------------------------------------- */

/* Handles stay open for the life of the process: OpenBLAS and cuSOLVER keep
   thread pools and exit handlers that do not survive dlclose. */
OSCAR__PRIVATE void *oscar__dlopen_env(const char *env_name, const char *const *names, int n, char *tried,
                                       size_t cap) {
    const char *list[12];
    const char *env = getenv(env_name);
    int i, k = 0;
    list[k++] = env;
    for (i = 0; i < n && k < 12; i++) list[k++] = names[i];
    return oscar__dlopen_first(list, k, tried, cap);
}

typedef void (*oscar__dsyevd_fn)(const char *jobz, const char *uplo, const int *n, double *a, const int *lda,
                                 double *w, double *work, const int *lwork, int *iwork, const int *liwork, int *info,
                                 size_t jobz_len, size_t uplo_len);

/* mats: count symmetric D×D matrices in; their eigenvectors out (row-major,
   column j = eigenvector of evals[j], ascending). */
OSCAR__PRIVATE oscar_status oscar__eigh_lapack(const oscar_ctx *ctx, const char *func, int32_t D, int32_t count,
                                               double *mats, double *evals, int *unavailable) {
    static const char *const names[] = {"liblapack.so.3",  "liblapack.so",      "libopenblas.so.0", "libopenblas.so",
                                        "libflexiblas.so.3", "libmkl_rt.so.2", "libmkl_rt.so"};
    char tried[2048];
    void *lib = oscar__dlopen_env("OSCAR_LAPACK_PATH", names, 7, tried, sizeof tried);
    oscar__dsyevd_fn dsyevd = NULL;
    int n = D, lwork = 1 + 6 * D + 2 * D * D, liwork = 3 + 5 * D, info = 0;
    size_t nn = OSCAR__CAST(size_t, D) * OSCAR__CAST(size_t, D), i, j;
    double *a, *work;
    int *iwork;
    int32_t m;
    *unavailable = 0;
    if (!lib) {
        *unavailable = 1;
        return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED,
                           "%s: no LAPACK for the eigendecomposition (tried %s); install liblapack3 (or OpenBLAS) or set "
                           "OSCAR_LAPACK_PATH",
                           func, tried);
    }
    *OSCAR__RCAST(void **, &dsyevd) = dlsym(lib, "dsyevd_");
    if (!dsyevd) {
        *unavailable = 1;
        return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED, "%s: the LAPACK library found has no dsyevd_", func);
    }
    a = OSCAR__CAST(double *, oscar__alloc(ctx, sizeof(double) * (nn + OSCAR__CAST(size_t, lwork))));
    iwork = OSCAR__CAST(int *, oscar__alloc(ctx, sizeof(int) * OSCAR__CAST(size_t, liwork)));
    if (!a || !iwork) {
        oscar__free(ctx, a);
        oscar__free(ctx, iwork);
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory for the eigensolver", func);
    }
    work = a + nn;
    for (m = 0; m < count; m++) {
        double *M = mats + OSCAR__CAST(size_t, m) * nn;
        memcpy(a, M, sizeof(double) * nn); /* symmetric: row- and column-major agree */
        dsyevd("V", "U", &n, a, &n, evals + OSCAR__CAST(size_t, m) * OSCAR__CAST(size_t, D), work, &lwork, iwork,
               &liwork, &info, 1, 1);
        if (info != 0) {
            oscar__free(ctx, a);
            oscar__free(ctx, iwork);
            return oscar__fail(ctx, OSCAR_STATUS_INTERNAL, "%s: LAPACK dsyevd failed on matrix %d (info = %d)", func,
                               OSCAR__CAST(int, m), info);
        }
        for (i = 0; i < OSCAR__CAST(size_t, D); i++) /* column-major eigenvectors -> row-major U */
            for (j = 0; j < OSCAR__CAST(size_t, D); j++) M[i * OSCAR__CAST(size_t, D) + j] = a[j * OSCAR__CAST(size_t, D) + i];
    }
    oscar__free(ctx, a);
    oscar__free(ctx, iwork);
    return OSCAR_OK;
}

typedef int (*oscar__cusolver_create_fn)(void **handle);
typedef int (*oscar__cusolver_destroy_fn)(void *handle);
typedef int (*oscar__cusolver_set_stream_fn)(void *handle, oscar_stream stream);
typedef int (*oscar__cusolver_syevd_size_fn)(void *handle, int jobz, int uplo, int n, const double *A, int lda,
                                             const double *W, int *lwork);
typedef int (*oscar__cusolver_syevd_fn)(void *handle, int jobz, int uplo, int n, double *A, int lda, double *W,
                                        double *work, int lwork, int *info);

/* Same contract as oscar__eigh_lapack, on the ctx's device. */
OSCAR__PRIVATE oscar_status oscar__eigh_cusolver(const oscar_ctx *ctx, const char *func, int32_t D, int32_t count,
                                                 double *mats, double *evals, oscar_stream stream, int *unavailable) {
    char tried[4096], home_path[1024];
    const char *cuda_home = getenv("CUDA_HOME");
    const char *names[6];
    void *lib, *handle = NULL;
    oscar__cusolver_create_fn create = NULL;
    oscar__cusolver_destroy_fn destroy = NULL;
    oscar__cusolver_set_stream_fn set_stream = NULL;
    oscar__cusolver_syevd_size_fn syevd_size = NULL;
    oscar__cusolver_syevd_fn syevd = NULL;
    oscar__CUdeviceptr dA = 0, dW = 0, dwork = 0, dinfo = 0;
    size_t nn = OSCAR__CAST(size_t, D) * OSCAR__CAST(size_t, D), total = nn * OSCAR__CAST(size_t, count), i, j;
    int lwork = 0, r, *info = NULL;
    int32_t m;
    oscar_status st = OSCAR_OK;
    oscar__CUresult cr;

    *unavailable = 0;
    home_path[0] = 0;
    if (cuda_home && cuda_home[0]) snprintf(home_path, sizeof home_path, "%s/lib64/libcusolver.so", cuda_home);
    names[0] = "libcusolver.so.12";
    names[1] = "libcusolver.so.11";
    names[2] = "libcusolver.so";
    names[3] = home_path;
    names[4] = "/usr/local/cuda/lib64/libcusolver.so";
    names[5] = "/usr/local/cuda/lib64/libcusolver.so.12";
    lib = oscar__dlopen_env("OSCAR_CUSOLVER_PATH", names, 6, tried, sizeof tried);
    if (!lib) {
        *unavailable = 1;
        return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED,
                           "%s: cuSOLVER could not be loaded (tried %s); install the CUDA toolkit's cuSOLVER or set "
                           "OSCAR_CUSOLVER_PATH",
                           func, tried);
    }
    *OSCAR__RCAST(void **, &create) = dlsym(lib, "cusolverDnCreate");
    *OSCAR__RCAST(void **, &destroy) = dlsym(lib, "cusolverDnDestroy");
    *OSCAR__RCAST(void **, &set_stream) = dlsym(lib, "cusolverDnSetStream");
    *OSCAR__RCAST(void **, &syevd_size) = dlsym(lib, "cusolverDnDsyevd_bufferSize");
    *OSCAR__RCAST(void **, &syevd) = dlsym(lib, "cusolverDnDsyevd");
    if (!create || !destroy || !set_stream || !syevd_size || !syevd) {
        *unavailable = 1;
        return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED, "%s: the cuSOLVER library found lacks cusolverDnDsyevd", func);
    }
    info = OSCAR__CAST(int *, oscar__alloc(ctx, sizeof(int) * OSCAR__CAST(size_t, count)));
    if (!info) return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of memory", func);
    st = oscar__push(ctx);
    if (st != OSCAR_OK) {
        oscar__free(ctx, info);
        return st;
    }
    r = create(&handle);
    if (r != 0) {
        st = oscar__fail(ctx, OSCAR_STATUS_CUDA_ERROR, "%s: cusolverDnCreate failed (cusolverStatus %d)", func, r);
        goto out;
    }
    cr = ctx->cu.cuMemAlloc(&dA, sizeof(double) * total);
    if (cr == 0) cr = ctx->cu.cuMemAlloc(&dW, sizeof(double) * OSCAR__CAST(size_t, D) * OSCAR__CAST(size_t, count));
    if (cr == 0) cr = ctx->cu.cuMemAlloc(&dinfo, sizeof(int) * OSCAR__CAST(size_t, count));
    if (cr == 0) cr = ctx->cu.cuMemcpyHtoD(dA, mats, sizeof(double) * total);
    if (cr == 0) cr = ctx->cu.cuStreamSynchronize(NULL);
    if (cr != 0) {
        st = oscar__cu_fail(ctx, cr, "cuSOLVER buffers (cuMemAlloc/cuMemcpyHtoD)");
        goto out;
    }
    r = set_stream(handle, stream);
    if (r == 0)
        r = syevd_size(handle, 1 /* CUSOLVER_EIG_MODE_VECTOR */, 1 /* CUBLAS_FILL_MODE_UPPER */, D,
                       OSCAR__RCAST(const double *, dA), D, OSCAR__RCAST(const double *, dW), &lwork);
    if (r != 0 || lwork < 0) {
        st = oscar__fail(ctx, OSCAR_STATUS_CUDA_ERROR, "%s: cusolverDnDsyevd_bufferSize failed (cusolverStatus %d)",
                         func, r);
        goto out;
    }
    cr = ctx->cu.cuMemAlloc(&dwork, sizeof(double) * OSCAR__CAST(size_t, lwork + 1));
    if (cr != 0) {
        st = oscar__cu_fail(ctx, cr, "cuSOLVER workspace (cuMemAlloc)");
        goto out;
    }
    for (m = 0; m < count && st == OSCAR_OK; m++) {
        r = syevd(handle, 1, 1, D, OSCAR__RCAST(double *, dA + sizeof(double) * nn * OSCAR__CAST(size_t, m)), D,
                  OSCAR__RCAST(double *, dW + sizeof(double) * OSCAR__CAST(size_t, D) * OSCAR__CAST(size_t, m)),
                  OSCAR__RCAST(double *, dwork), lwork, OSCAR__RCAST(int *, dinfo + sizeof(int) * OSCAR__CAST(size_t, m)));
        if (r != 0)
            st = oscar__fail(ctx, OSCAR_STATUS_CUDA_ERROR, "%s: cusolverDnDsyevd failed on matrix %d (cusolverStatus %d)",
                             func, OSCAR__CAST(int, m), r);
    }
    if (st != OSCAR_OK) goto out;
    cr = ctx->cu.cuStreamSynchronize(stream);
    if (cr == 0) cr = ctx->cu.cuMemcpyDtoH(mats, dA, sizeof(double) * total);
    if (cr == 0) cr = ctx->cu.cuMemcpyDtoH(evals, dW, sizeof(double) * OSCAR__CAST(size_t, D) * OSCAR__CAST(size_t, count));
    if (cr == 0) cr = ctx->cu.cuMemcpyDtoH(info, dinfo, sizeof(int) * OSCAR__CAST(size_t, count));
    if (cr != 0) {
        st = oscar__cu_fail(ctx, cr, "cusolverDnDsyevd results (cuMemcpyDtoH)");
        goto out;
    }
    for (m = 0; m < count; m++)
        if (info[m] != 0) {
            st = oscar__fail(ctx, OSCAR_STATUS_INTERNAL, "%s: cusolverDnDsyevd did not converge on matrix %d (info = %d)",
                             func, OSCAR__CAST(int, m), info[m]);
            goto out;
        }
    /* column-major eigenvectors -> row-major U: transpose in place */
    for (m = 0; m < count; m++) {
        double *M = mats + nn * OSCAR__CAST(size_t, m);
        for (i = 0; i < OSCAR__CAST(size_t, D); i++)
            for (j = i + 1; j < OSCAR__CAST(size_t, D); j++) {
                double t = M[i * OSCAR__CAST(size_t, D) + j];
                M[i * OSCAR__CAST(size_t, D) + j] = M[j * OSCAR__CAST(size_t, D) + i];
                M[j * OSCAR__CAST(size_t, D) + i] = t;
            }
    }
out:
    if (handle) destroy(handle);
    if (dA) ctx->cu.cuMemFree(dA);
    if (dW) ctx->cu.cuMemFree(dW);
    if (dwork) ctx->cu.cuMemFree(dwork);
    if (dinfo) ctx->cu.cuMemFree(dinfo);
    oscar__pop(ctx);
    oscar__free(ctx, info);
    return st;
}

/* Eigendecomposition of count symmetric matrices with the solver asked
   for (DEFAULT: cuSOLVER on a device, falling back to LAPACK when cuSOLVER
   cannot be loaded; LAPACK on the CPU backend), then the sign convention. */
OSCAR__PRIVATE oscar_status oscar__eigh(const oscar_ctx *ctx, const char *func, oscar_eigensolver solver, int32_t D,
                                        int32_t count, double *mats, double *evals, oscar_stream stream) {
    oscar_status st;
    int unavailable = 0;
    int32_t m;
    int device = ctx && ctx->backend == OSCAR_BACKEND_CUDA && !ctx->compile_only;
    if (solver == OSCAR_EIGENSOLVER_CUSOLVER && !device)
        return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED,
                           "%s: desc.eigensolver = CUSOLVER needs a CUDA context with a device; use LAPACK", func);
    if (solver == OSCAR_EIGENSOLVER_CUSOLVER || (solver == OSCAR_EIGENSOLVER_DEFAULT && device)) {
        st = oscar__eigh_cusolver(ctx, func, D, count, mats, evals, stream, &unavailable);
        if (st != OSCAR_OK && unavailable && solver == OSCAR_EIGENSOLVER_DEFAULT) {
            char first[512];
            snprintf(first, sizeof first, "%.500s", oscar_last_error(ctx));
            oscar__info(ctx, "%s; using LAPACK", first);
            st = oscar__eigh_lapack(ctx, func, D, count, mats, evals, &unavailable);
            if (st != OSCAR_OK && unavailable)
                st = oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED, "%s: no eigensolver: %s; and %s", func, first,
                                 oscar_last_error(ctx));
        }
    } else {
        st = oscar__eigh_lapack(ctx, func, D, count, mats, evals, &unavailable);
    }
    if (st != OSCAR_OK) return st;
    for (m = 0; m < count; m++)
        oscar__fix_signs(D, mats + OSCAR__CAST(size_t, m) * OSCAR__CAST(size_t, D) * OSCAR__CAST(size_t, D));
    return OSCAR_OK;
}

#endif /* OSCAR_CALIB_MATH_H_INCLUDED */
