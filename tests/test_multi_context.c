/* tests/test_multi_context.c -- oscar.h inside an engine with several threads,
   several contexts and several GPUs (issue #8).

   CPU (no GPU needed, runs in CI):
   - several threads, each with its own compile-only context, share one empty
     disk cache and prepare the same kernels at once: every kernel is
     compiled exactly once in total, the others are disk hits, and the cache
     files are whole afterwards (a fresh CACHED_ONLY context loads them all);
   - one context used by several threads at once: one compile per kernel;
   - error sentences are per thread;
   - calibration split over two simulated ranks (token halves), statistics
     summed as an engine's all-reduce would (in place through
     oscar_calib_stats_view for pass 1, export/sum/import for pass 2), pass 1
     summed before oscar_calib_begin_score_pass: both ranks finish into the
     same rotations, equal to one accumulator on all tokens; and calibration
     with the KV heads split over two ranks (tensor parallelism), per-head
     statistics gathered instead of summed.
   GPU (skipped without a device; every visible device is used):
   - N threads, each with its own context and stream (on device i % ndev),
     quantize -> decode on their own data at once: outputs bit-identical to
     the same work run alone and to the same work run by threads sharing one
     context; decode within test_decode.c's tolerances of the float64
     reference; codes within test_quantize.c's tolerance of the CPU quantize;
   - tensor-parallel shards: the KV heads of one problem on 2 ranks (2
     contexts, pools of num_kv_heads/2, their q heads, the layer's rotations)
     concatenate to the unsharded run bit for bit;
   - calibration on 2 ranks (accumulators on devices 0 and 1 % ndev) summed
     through the device statistics views. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"
#include "calib_ref.h"

#include <dirent.h>
#include <pthread.h>

/* ======================================================================== */
/* CPU: JIT tables and the shared disk cache under threads                  */

static int32_t instantiation_index(const char *name) {
    int32_t i, n = oscar_jit_instantiation_count();
    for (i = 0; i < n; i++) {
        const char *prog = NULL, *nm = NULL;
        if (oscar_jit_instantiation(i, &prog, &nm) == OSCAR_OK && strcmp(nm, name) == 0) return i;
    }
    cr_assert_fail("instantiation %s is not registered", name);
    return -1;
}

/* Cheap kernels (each compiles in about a second): merge_states and dequantize. */
#define NUM_CHEAP 4
static void cheap_indices(int32_t *out) {
    static const char *names[NUM_CHEAP] = {"oscar::merge_states_kernel<64>", "oscar::merge_states_kernel<128>",
                                           "oscar::dequant_kernel<64, 64, 16>", "oscar::dequant_kernel<128, 32, 1>"};
    int i;
    for (i = 0; i < NUM_CHEAP; i++) out[i] = instantiation_index(names[i]);
}

static int count_suffix(const char *dir, const char *part, int at_end) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int n = 0;
    size_t lp = strlen(part);
    cr_assert(d != NULL, "cannot open %s", dir);
    while ((e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (at_end ? (len > lp && strcmp(e->d_name + len - lp, part) == 0) : strstr(e->d_name, part) != NULL) n++;
    }
    closedir(d);
    return n;
}

/* A worker thread never calls cr_assert (Criterion aborts a test with a
   longjmp, which must not cross threads): it records what failed. */
typedef struct jit_job {
    oscar_ctx *ctx;         /* shared context, or NULL: the thread sets up its own */
    const char *cache_dir;  /* for its own context */
    pthread_barrier_t *start;
    const int32_t *indices; /* what to prepare, in this order */
    int count;
    oscar_jit_stats stats;  /* of its own context */
    oscar_jit_kernel_info kernels[NUM_CHEAP];
    int32_t num_kernels;
    oscar_status status;
    char error[4400]; /* room for a whole oscar_last_error sentence */
} jit_job;

static void *jit_worker(void *arg) {
    jit_job *j = (jit_job *)arg;
    oscar_ctx *ctx = j->ctx;
    int i;
    if (!ctx) {
        oscar_desc desc = {0};
        desc.compile_only_sm = 90;
        desc.cache_dir = j->cache_dir;
        j->status = oscar_setup(&desc, &ctx);
        if (j->status != OSCAR_OK) {
            snprintf(j->error, sizeof j->error, "oscar_setup: %s", oscar_last_error(NULL));
            pthread_barrier_wait(j->start);
            return NULL;
        }
    }
    pthread_barrier_wait(j->start); /* every thread starts preparing at once */
    for (i = 0; i < j->count; i++) {
        j->status = oscar_jit_prepare(ctx, j->indices[i]);
        if (j->status != OSCAR_OK) {
            snprintf(j->error, sizeof j->error, "oscar_jit_prepare(%d): %s", (int)j->indices[i], oscar_last_error(ctx));
            break;
        }
    }
    if (!j->ctx) {
        oscar_query_jit_stats(ctx, &j->stats);
        oscar_query_jit_kernels(ctx, j->kernels, NUM_CHEAP, &j->num_kernels);
        oscar_shutdown(ctx);
    }
    return NULL;
}

Test(multi_context_cpu, threads_with_own_contexts_share_one_disk_cache, .timeout = 600) {
    enum { T = 6 };
    char dir[256];
    int32_t idx[NUM_CHEAP], order[T][NUM_CHEAP];
    jit_job jobs[T];
    pthread_t th[T];
    pthread_barrier_t start;
    int64_t compiles = 0, disk_hits = 0, rejects = 0;
    int per_kernel[NUM_CHEAP] = {0};
    int t, i, k;
    oscar_ctx *probe = NULL;
    {
        oscar_desc desc = {0};
        oscar_status st;
        desc.compile_only_sm = 90;
        desc.cache_mode = OSCAR_JIT_CACHE_MEMORY_ONLY;
        st = oscar_setup(&desc, &probe);
        if (st == OSCAR_STATUS_NO_NVRTC) cr_skip_test("no NVRTC: %s", oscar_last_error(NULL));
        TU_OK(NULL, st);
        oscar_shutdown(probe);
    }
    cheap_indices(idx);
    tu_tempdir(dir, sizeof dir, "mtcache");
    pthread_barrier_init(&start, NULL, T);
    memset(jobs, 0, sizeof jobs);
    for (t = 0; t < T; t++) {
        /* each thread walks the same kernels from a different starting point,
           so every kernel is wanted by several threads at the same moment */
        for (i = 0; i < NUM_CHEAP; i++) order[t][i] = idx[(i + t) % NUM_CHEAP];
        jobs[t].cache_dir = dir, jobs[t].start = &start, jobs[t].indices = order[t], jobs[t].count = NUM_CHEAP;
        cr_assert(pthread_create(&th[t], NULL, jit_worker, &jobs[t]) == 0);
    }
    for (t = 0; t < T; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start);
    for (t = 0; t < T; t++) {
        cr_assert(jobs[t].status == OSCAR_OK, "thread %d: %s", t, jobs[t].error);
        cr_assert_eq(jobs[t].num_kernels, NUM_CHEAP, "thread %d holds %d kernels", t, (int)jobs[t].num_kernels);
        compiles += jobs[t].stats.compiles, disk_hits += jobs[t].stats.disk_hits, rejects += jobs[t].stats.disk_rejects;
        for (k = 0; k < jobs[t].num_kernels; k++)
            for (i = 0; i < NUM_CHEAP; i++) {
                const char *prog = NULL, *name = NULL;
                oscar_jit_instantiation(idx[i], &prog, &name);
                if (strcmp(jobs[t].kernels[k].name_expression, name) == 0 && jobs[t].kernels[k].origin == 1)
                    per_kernel[i]++;
            }
        cr_log_info("thread %d: %lld compiled (%.0f ms), %lld disk hits", t, (long long)jobs[t].stats.compiles,
                    jobs[t].stats.compile_ms, (long long)jobs[t].stats.disk_hits);
    }
    cr_assert_eq(compiles, NUM_CHEAP, "%d threads x %d kernels: %lld compiles in total, expected one per kernel", T,
                 NUM_CHEAP, (long long)compiles);
    cr_assert_eq(disk_hits, (int64_t)T * NUM_CHEAP - NUM_CHEAP, "the other %d preparations are disk hits, got %lld",
                 T * NUM_CHEAP - NUM_CHEAP, (long long)disk_hits);
    cr_assert_eq(rejects, 0, "no thread saw a torn entry");
    for (i = 0; i < NUM_CHEAP; i++) cr_assert_eq(per_kernel[i], 1, "kernel %d compiled by %d threads", i, per_kernel[i]);
    /* the files: one entry per kernel, no temporary left, all loadable */
    cr_assert_eq(count_suffix(dir, ".cubin", 1), NUM_CHEAP);
    cr_assert_eq(count_suffix(dir, ".tmp.", 0), 0, "a temporary file was left behind");
    {
        oscar_desc desc = {0};
        oscar_ctx *fresh = NULL;
        oscar_jit_stats s = {0};
        desc.compile_only_sm = 90, desc.cache_dir = dir, desc.cache_mode = OSCAR_JIT_CACHE_CACHED_ONLY;
        TU_OK(NULL, oscar_setup(&desc, &fresh));
        for (i = 0; i < NUM_CHEAP; i++) TU_OK(fresh, oscar_jit_prepare(fresh, idx[i]));
        TU_OK(fresh, oscar_query_jit_stats(fresh, &s));
        cr_assert(s.disk_hits == NUM_CHEAP && s.compiles == 0 && s.disk_rejects == 0,
                  "a fresh context: %lld disk hits, %lld compiles, %lld rejects", (long long)s.disk_hits,
                  (long long)s.compiles, (long long)s.disk_rejects);
        oscar_shutdown(fresh);
    }
    tu_rmtree(dir);
}

Test(multi_context_cpu, one_context_from_several_threads, .timeout = 600) {
    enum { T = 5, PER = 3 };
    int32_t idx[NUM_CHEAP], order[T][PER];
    jit_job jobs[T];
    pthread_t th[T];
    pthread_barrier_t start;
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_jit_stats s = {0};
    oscar_jit_kernel_info info[8];
    int32_t n = 0;
    oscar_status st;
    int t, i;
    desc.compile_only_sm = 90;
    desc.cache_mode = OSCAR_JIT_CACHE_MEMORY_ONLY; /* the mutex alone must prevent double compiles */
    st = oscar_setup(&desc, &ctx);
    if (st == OSCAR_STATUS_NO_NVRTC) cr_skip_test("no NVRTC: %s", oscar_last_error(NULL));
    TU_OK(NULL, st);
    cheap_indices(idx);
    pthread_barrier_init(&start, NULL, T);
    memset(jobs, 0, sizeof jobs);
    for (t = 0; t < T; t++) { /* overlapping windows of 3 out of 4 kernels */
        for (i = 0; i < PER; i++) order[t][i] = idx[(t + i) % NUM_CHEAP];
        jobs[t].ctx = ctx, jobs[t].start = &start, jobs[t].indices = order[t], jobs[t].count = PER;
        cr_assert(pthread_create(&th[t], NULL, jit_worker, &jobs[t]) == 0);
    }
    for (t = 0; t < T; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&start);
    for (t = 0; t < T; t++) cr_assert(jobs[t].status == OSCAR_OK, "thread %d: %s", t, jobs[t].error);
    TU_OK(ctx, oscar_query_jit_stats(ctx, &s));
    cr_assert_eq(s.compiles, NUM_CHEAP, "%lld compiles for %d distinct kernels", (long long)s.compiles, NUM_CHEAP);
    cr_assert_eq(s.memory_hits, T * PER - NUM_CHEAP, "%lld memory hits", (long long)s.memory_hits);
    TU_OK(ctx, oscar_query_jit_kernels(ctx, info, 8, &n));
    cr_assert_eq(n, NUM_CHEAP, "the table holds each kernel once: %d records", (int)n);
    for (t = 0; t < n; t++)
        for (i = t + 1; i < n; i++)
            cr_assert(strcmp(info[t].name_expression, info[i].name_expression) != 0, "%s twice in the table",
                      info[t].name_expression);
    oscar_shutdown(ctx);
}

/* Per-thread error sentences: thread A fails, thread B (same context) sees
   nothing; B fails differently, A still reads its own sentence. */
typedef struct err_job {
    oscar_ctx *ctx;
    pthread_barrier_t *step;
    int which;
    char seen_before[4096], seen_after[4096], own[4096]; /* as large as oscar_last_error's sentence */
} err_job;

static void *err_worker(void *arg) {
    err_job *j = (err_job *)arg;
    oscar_int2_pool_desc pool = {0};
    size_t cb, sb;
    if (j->which == 0) {
        pool.head_dim = 96, pool.num_kv_heads = 8, pool.num_pages = 4; /* bad head dim */
        oscar_int2_pool_bytes(j->ctx, &pool, &cb, &sb);
        snprintf(j->own, sizeof j->own, "%s", oscar_last_error(j->ctx));
    }
    pthread_barrier_wait(j->step);
    snprintf(j->seen_before, sizeof j->seen_before, "%s", oscar_last_error(j->ctx));
    pthread_barrier_wait(j->step);
    if (j->which == 1) {
        pool.head_dim = 128, pool.num_kv_heads = 0, pool.num_pages = 4; /* bad head count */
        oscar_int2_pool_bytes(j->ctx, &pool, &cb, &sb);
        snprintf(j->own, sizeof j->own, "%s", oscar_last_error(j->ctx));
    }
    pthread_barrier_wait(j->step);
    snprintf(j->seen_after, sizeof j->seen_after, "%s", oscar_last_error(j->ctx));
    return NULL;
}

Test(multi_context_cpu, last_error_is_per_thread) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    err_job jobs[2];
    pthread_t th[2];
    pthread_barrier_t step;
    int t;
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    pthread_barrier_init(&step, NULL, 2);
    memset(jobs, 0, sizeof jobs);
    for (t = 0; t < 2; t++) {
        jobs[t].ctx = ctx, jobs[t].step = &step, jobs[t].which = t;
        cr_assert(pthread_create(&th[t], NULL, err_worker, &jobs[t]) == 0);
    }
    for (t = 0; t < 2; t++) pthread_join(th[t], NULL);
    pthread_barrier_destroy(&step);
    cr_assert(strstr(jobs[0].own, "head_dim = 96") != NULL, "thread A's sentence: %s", jobs[0].own);
    cr_assert(strstr(jobs[1].own, "num_kv_heads = 0") != NULL, "thread B's sentence: %s", jobs[1].own);
    cr_assert_str_eq(jobs[1].seen_before, "", "thread B saw thread A's error: %s", jobs[1].seen_before);
    cr_assert_str_eq(jobs[0].seen_before, jobs[0].own);
    cr_assert_str_eq(jobs[0].seen_after, jobs[0].own, "thread A's sentence was overwritten by B's: %s",
                     jobs[0].seen_after);
    cr_assert_str_eq(jobs[1].seen_after, jobs[1].own);
    cr_assert_str_eq(oscar_last_error(ctx), "", "the main thread saw a worker's error: %s", oscar_last_error(ctx));
    oscar_shutdown(ctx);
}

/* ======================================================================== */
/* Calibration over ranks                                                    */

/* Activations of one layer: [n][Hq][D] queries, [n][Hkv][D] keys and values
   (f32, so the GPU variant reads exactly the CPU's values). */
typedef struct cal_data {
    int64_t n;
    int Hq, Hkv, D, L;
    act_buf q[2], k[2], v[2]; /* per layer (up to 2) */
} cal_data;

static cal_data cal_make(tu_rng *r, int64_t n, int Hq, int Hkv, int D, int L) {
    cal_data c;
    int l;
    double *M = cr_dalloc((size_t)D * D);
    memset(&c, 0, sizeof c);
    c.n = n, c.Hq = Hq, c.Hkv = Hkv, c.D = D, c.L = L;
    for (l = 0; l < L; l++) {
        c.q[l] = act_alloc((size_t)n * Hq * D, OSCAR_DTYPE_F32);
        c.k[l] = act_alloc((size_t)n * Hkv * D, OSCAR_DTYPE_F32);
        c.v[l] = act_alloc((size_t)n * Hkv * D, OSCAR_DTYPE_F32);
        random_orthogonal(r, D, M);
        fill_structured(r, &c.q[l], n * Hq, D, M, 8.0, 1 + l);
        random_orthogonal(r, D, M);
        fill_structured(r, &c.k[l], n * Hkv, D, M, 12.0, 5 + l);
        fill_structured(r, &c.v[l], n * Hkv, D, NULL, 6.0, 9 + l);
    }
    free(M);
    return c;
}
static void cal_free(cal_data *c) {
    int l;
    for (l = 0; l < c->L; l++) act_free(&c->q[l]), act_free(&c->k[l]), act_free(&c->v[l]);
}

/* Feeds tokens [t0, t1) of every layer in chunks of 97 tokens, from KV head
   h0 on (as many KV heads as the accumulator has, with the query heads that
   belong to them: a strided view of the full activations). dev:
   NULL for the host arrays, else per layer the device copies of q, k, v. */
static void cal_feed(oscar_calib *c, const cal_data *d, const int32_t *ids, int64_t t0, int64_t t1, int h0,
                     void *const (*dev)[3]) {
    int l, r = d->Hq / d->Hkv;
    for (l = 0; l < d->L; l++) {
        int64_t t;
        for (t = t0; t < t1; t += 97) {
            oscar_calib_batch_desc b = {0};
            const char *q = dev ? (const char *)dev[l][0] : (const char *)d->q[l].data;
            const char *k = dev ? (const char *)dev[l][1] : (const char *)d->k[l].data;
            const char *v = dev ? (const char *)dev[l][2] : (const char *)d->v[l].data;
            b.layer_id = ids[l];
            b.num_tokens = t1 - t < 97 ? t1 - t : 97;
            b.dtype = OSCAR_DTYPE_F32;
            /* a head slice is a strided view of the full activations */
            b.q = q + 4 * (size_t)((t * d->Hq + h0 * r) * d->D);
            b.k = k + 4 * (size_t)((t * d->Hkv + h0) * d->D);
            b.v = v + 4 * (size_t)((t * d->Hkv + h0) * d->D);
            b.q_token_stride = (int64_t)d->Hq * d->D;
            b.k_token_stride = b.v_token_stride = (int64_t)d->Hkv * d->D;
            TU_OK(NULL, oscar_calib_accumulate(c, &b, NULL));
        }
    }
}

static oscar_calib *cal_create(oscar_ctx *ctx, const cal_data *d, const int32_t *ids, int kv_heads) {
    oscar_calib_desc desc = {0};
    oscar_calib *c = NULL;
    desc.num_layers = d->L, desc.layer_ids = ids, desc.head_dim = d->D;
    desc.num_q_heads = kv_heads * (d->Hq / d->Hkv), desc.num_kv_heads = kv_heads;
    TU_OK(ctx, oscar_calib_create(ctx, &desc, &c));
    return c;
}

/* The all-reduce of two ranks' current-pass statistics. in_place: through
   the views (what ncclAllReduce(view.data, view.data, count, ncclDouble,
   ncclSum) does on each rank; device views are read and written with
   cudaMemcpy on their own device), else export, sum on the host, import on
   both. dev[r]: the device of rank r (-1: CPU backend). */
static void allreduce2(oscar_calib *c0, oscar_calib *c1, const int *dev, int in_place) {
    oscar_calib_stats v[2] = {{0}, {0}};
    oscar_calib *c[2] = {c0, c1};
    double *a, *b;
    int64_t i;
    int k;
    TU_OK(NULL, oscar_calib_stats_view(c0, &v[0]));
    TU_OK(NULL, oscar_calib_stats_view(c1, &v[1]));
    cr_assert(v[0].count == v[1].count && v[0].pass == v[1].pass, "ranks disagree on the statistics layout");
    a = cr_dalloc((size_t)v[0].count), b = cr_dalloc((size_t)v[0].count);
    if (in_place && !v[0].on_device) {
        for (i = 0; i < v[0].count; i++) v[0].data[i] += v[1].data[i];
        memcpy(v[1].data, v[0].data, sizeof(double) * (size_t)v[0].count);
    } else if (in_place) {
        for (k = 0; k < 2; k++) { /* the accumulations were queued on each device's default stream */
            TU_CUDA(cudaSetDevice(dev[k]));
            TU_CUDA(cudaDeviceSynchronize());
            TU_CUDA(cudaMemcpy(k ? b : a, v[k].data, sizeof(double) * (size_t)v[k].count, cudaMemcpyDeviceToHost));
        }
        for (i = 0; i < v[0].count; i++) a[i] += b[i];
        for (k = 0; k < 2; k++) {
            TU_CUDA(cudaSetDevice(dev[k]));
            TU_CUDA(cudaMemcpy(v[k].data, a, sizeof(double) * (size_t)v[k].count, cudaMemcpyHostToDevice));
            TU_CUDA(cudaDeviceSynchronize());
        }
    } else {
        for (k = 0; k < 2; k++) {
            if (dev[k] >= 0) TU_CUDA(cudaSetDevice(dev[k]));
            TU_OK(NULL, oscar_calib_export_stats(c[k], k ? b : a, v[k].count, NULL));
        }
        for (i = 0; i < v[0].count; i++) a[i] += b[i];
        for (k = 0; k < 2; k++) {
            if (dev[k] >= 0) TU_CUDA(cudaSetDevice(dev[k]));
            TU_OK(NULL, oscar_calib_import_stats(c[k], a, v[k].count, NULL));
        }
    }
    if (dev[0] >= 0) TU_CUDA(cudaSetDevice(dev[0]));
    free(a), free(b);
}

static double *stats_copy(oscar_calib *c, int64_t *count) {
    oscar_calib_stats v = {0};
    double *s;
    TU_OK(NULL, oscar_calib_stats_view(c, &v));
    s = cr_dalloc((size_t)v.count);
    TU_OK(NULL, oscar_calib_export_stats(c, s, v.count, NULL));
    *count = v.count;
    return s;
}

typedef struct rot_pair {
    oscar_rotation_set *k, *v;
} rot_pair;

static rot_pair cal_finish(oscar_calib *c) {
    oscar_calib_finish_desc fd = {0};
    rot_pair p = {NULL, NULL};
    TU_OK(NULL, oscar_calib_finish(c, &fd, &p.k, &p.v, NULL)); /* OSCAR: R = U·H·P_br, K: QUERY, V: SCORE */
    return p;
}
static void rot_free(rot_pair *p) { oscar_rotation_set_destroy(p->k), oscar_rotation_set_destroy(p->v); }

static int rot_identical(const oscar_rotation_set *a, const oscar_rotation_set *b) {
    oscar_rotation_set_info ia, ib;
    oscar_rotation_set_query(a, &ia), oscar_rotation_set_query(b, &ib);
    if (!ia.eigenvalues != !ib.eigenvalues) return 0;
    return ia.num_layers == ib.num_layers && ia.head_dim == ib.head_dim &&
           memcmp(ia.rotations, ib.rotations, sizeof(float) * (size_t)ia.num_layers * ia.head_dim * ia.head_dim) == 0 &&
           (!ia.eigenvalues || memcmp(ia.eigenvalues, ib.eigenvalues, sizeof(float) * (size_t)ia.num_layers * ia.head_dim) == 0) &&
           memcmp(ia.layer_ids, ib.layer_ids, sizeof(int32_t) * (size_t)ia.num_layers) == 0;
}
/* max |Ra - Rb| over every entry, and max |λa - λb| / max|λb| */
static double rot_maxdiff(const oscar_rotation_set *a, const oscar_rotation_set *b, double *ev_rel) {
    oscar_rotation_set_info ia, ib;
    double d = 0, de = 0, m = 0;
    size_t i, n;
    oscar_rotation_set_query(a, &ia), oscar_rotation_set_query(b, &ib);
    cr_assert(ia.num_layers == ib.num_layers && ia.head_dim == ib.head_dim);
    n = (size_t)ia.num_layers * ia.head_dim * ia.head_dim;
    for (i = 0; i < n; i++) d = fmax(d, fabs((double)ia.rotations[i] - ib.rotations[i]));
    n = ia.eigenvalues && ib.eigenvalues ? (size_t)ia.num_layers * ia.head_dim : 0;
    for (i = 0; i < n; i++) de = fmax(de, fabs((double)ia.eigenvalues[i] - ib.eigenvalues[i])), m = fmax(m, fabs((double)ib.eigenvalues[i]));
    if (ev_rel) *ev_rel = m > 0 ? de / m : de;
    return d;
}

/* Tolerances against one accumulator on all tokens. The statistics of two
   halves summed differ from one sum over everything only by float64
   rounding (summation order): <= STATS_RANK_TOL relative to the largest
   entry (~n·2^-53 with n ~ 10^3 products per entry). The eigenvectors move by
   ~|ΔC|/gap, ~1e-12 for these spectra, far below fp32's resolution, so the
   fp32 rotations differ at most where a float64 entry sits next to an fp32
   rounding boundary: one fp32 ulp of an entry <= 1 (2^-24 ≈ 6e-8), with the
   composition's float64 products on top: ROT_RANK_TOL = 1e-6. Eigenvalues
   (fp32 in the set): 1e-6 of the largest. */
#define STATS_RANK_TOL 1e-13
#define ROT_RANK_TOL 1e-6
#define EV_RANK_TOL 1e-6

/* Two ranks (contexts ctx0, ctx1, which may be the same) with token halves
   [0, cut) and [cut, n), against one accumulator on all tokens (on ctx0).
   dev[r]: per layer the device copies of q, k, v for rank r, or NULL. */
static void calib_two_ranks(oscar_ctx *ctx0, oscar_ctx *ctx1, const cal_data *d, int64_t cut, void *const (*dev0)[3],
                            void *const (*dev1)[3], const int *devs) {
    static const int32_t ids[2] = {3, 11}; /* sparse global layer ids */
    oscar_calib *r0, *r1, *all, *early0, *early1;
    rot_pair p0, p1, pall, pe;
    double *s0, *sall, ev, dk, dv;
    int64_t n, i;
    int is_gpu = dev0 != NULL, dev_rank0 = devs[0], dev_rank1 = devs[1];
    if (is_gpu) TU_CUDA(cudaSetDevice(dev_rank0));
    r0 = cal_create(ctx0, d, ids, d->Hkv), all = cal_create(ctx0, d, ids, d->Hkv), early0 = cal_create(ctx0, d, ids, d->Hkv);
    if (is_gpu) TU_CUDA(cudaSetDevice(dev_rank1));
    r1 = cal_create(ctx1, d, ids, d->Hkv), early1 = cal_create(ctx1, d, ids, d->Hkv);
    /* pass 1: each rank its tokens */
    if (is_gpu) TU_CUDA(cudaSetDevice(dev_rank0));
    cal_feed(r0, d, ids, 0, cut, 0, dev0);
    cal_feed(early0, d, ids, 0, cut, 0, dev0);
    cal_feed(all, d, ids, 0, d->n, 0, dev0);
    if (is_gpu) TU_CUDA(cudaSetDevice(dev_rank1));
    cal_feed(r1, d, ids, cut, d->n, 0, dev1);
    cal_feed(early1, d, ids, cut, d->n, 0, dev1);
    if (is_gpu) TU_CUDA(cudaSetDevice(dev_rank0));
    /* all-reduce pass 1 in place, through the views, BEFORE begin_score_pass:
       the frozen C_qh must be the query covariance of all tokens */
    allreduce2(r0, r1, devs, 1);
    s0 = stats_copy(r0, &n), sall = stats_copy(all, &n);
    cr_log_info("pass 1: summed ranks vs one accumulator: max|Δ|/max|S| = %.2e (%lld doubles)",
                rel_maxdiff(s0, sall, (size_t)n), (long long)n);
    cr_assert(rel_maxdiff(s0, sall, (size_t)n) <= STATS_RANK_TOL, "pass 1 statistics: %g", rel_maxdiff(s0, sall, (size_t)n));
    for (i = 0; i < d->L; i++) cr_assert_eq(s0[(size_t)i * (size_t)(n / d->L)], (double)d->n, "token count of layer %d", (int)i);
    free(s0), free(sall);
    TU_OK(ctx0, oscar_calib_begin_score_pass(r0, NULL));
    TU_OK(ctx1, oscar_calib_begin_score_pass(r1, NULL));
    TU_OK(ctx0, oscar_calib_begin_score_pass(all, NULL));
    /* the wrong order, for contrast: each rank freezes its own half's C_qh */
    TU_OK(ctx0, oscar_calib_begin_score_pass(early0, NULL));
    TU_OK(ctx1, oscar_calib_begin_score_pass(early1, NULL));
    /* pass 2: the same tokens again, each rank its own */
    cal_feed(r0, d, ids, 0, cut, 0, dev0);
    cal_feed(early0, d, ids, 0, cut, 0, dev0);
    cal_feed(all, d, ids, 0, d->n, 0, dev0);
    if (is_gpu) TU_CUDA(cudaSetDevice(dev_rank1));
    cal_feed(r1, d, ids, cut, d->n, 0, dev1);
    cal_feed(early1, d, ids, cut, d->n, 0, dev1);
    if (is_gpu) TU_CUDA(cudaSetDevice(dev_rank0));
    /* all-reduce pass 2 through export / host sum / import */
    allreduce2(r0, r1, devs, 0);
    allreduce2(early0, early1, devs, 0);
    s0 = stats_copy(r0, &n), sall = stats_copy(all, &n);
    cr_log_info("pass 2: summed ranks vs one accumulator: max|Δ|/max|S| = %.2e", rel_maxdiff(s0, sall, (size_t)n));
    cr_assert(rel_maxdiff(s0, sall, (size_t)n) <= STATS_RANK_TOL, "pass 2 statistics: %g", rel_maxdiff(s0, sall, (size_t)n));
    free(s0), free(sall);
    /* finish on both ranks (each on its own device) and on the single accumulator */
    p0 = cal_finish(r0);
    if (is_gpu) TU_CUDA(cudaSetDevice(dev_rank1));
    p1 = cal_finish(r1);
    if (is_gpu) TU_CUDA(cudaSetDevice(dev_rank0));
    pall = cal_finish(all);
    pe = cal_finish(early0);
    cr_assert(rot_identical(p0.k, p1.k), "rank 0 and rank 1 K rotations differ (max %g)", rot_maxdiff(p0.k, p1.k, NULL));
    cr_assert(rot_identical(p0.v, p1.v), "rank 0 and rank 1 V rotations differ (max %g)", rot_maxdiff(p0.v, p1.v, NULL));
    dk = rot_maxdiff(p0.k, pall.k, &ev);
    cr_log_info("K rotations, 2 ranks vs 1 accumulator: max |ΔR| = %.2e, eigenvalues %.2e", dk, ev);
    cr_assert(dk <= ROT_RANK_TOL && ev <= EV_RANK_TOL, "K: max |ΔR| = %g, eigenvalues %g", dk, ev);
    dv = rot_maxdiff(p0.v, pall.v, &ev);
    cr_log_info("V rotations, 2 ranks vs 1 accumulator: max |ΔR| = %.2e, eigenvalues %.2e", dv, ev);
    cr_assert(dv <= ROT_RANK_TOL && ev <= EV_RANK_TOL, "V: max |ΔR| = %g, eigenvalues %g", dv, ev);
    /* summing pass 1 after begin_score_pass is wrong, and it shows */
    dv = rot_maxdiff(pe.v, pall.v, &ev);
    cr_log_info("V rotations when each rank froze its own C_qh (wrong order): max |ΔR| = %.2e, eigenvalues %.2e", dv, ev);
    cr_assert(dv > 100 * ROT_RANK_TOL, "the wrong order should change the V rotations visibly (max |ΔR| = %g)", dv);
    rot_free(&p0), rot_free(&p1), rot_free(&pall), rot_free(&pe);
    oscar_calib_destroy(r0), oscar_calib_destroy(r1), oscar_calib_destroy(all);
    oscar_calib_destroy(early0), oscar_calib_destroy(early1);
}

Test(calib_ranks_cpu, token_halves_summed_give_one_accumulators_rotations, .timeout = 300) {
    oscar_desc desc = {0};
    oscar_ctx *c0 = NULL, *c1 = NULL;
    tu_rng r = tu_seed();
    cal_data d;
    calib_need_lapack();
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &c0));
    TU_OK(NULL, oscar_setup(&desc, &c1));
    d = cal_make(&r, 700, 8, 2, 32, 2);
    static const int cpu_devs[2] = {-1, -1};
    calib_two_ranks(c0, c1, &d, 263, NULL, NULL, cpu_devs); /* unequal halves */
    cal_free(&d);
    oscar_shutdown(c0), oscar_shutdown(c1);
}

/* Tensor parallelism: rank r holds KV heads [r·H/2, (r+1)·H/2) (and their
   query heads) and sees every token. Per-head statistics need no sum: each
   rank's blocks are its heads' blocks of the full accumulator, and C_qh of a
   head only needs that head's queries, so each rank can run both passes
   alone. The layer's rotation is fitted from the mean over all heads, so the
   engine all-gathers the per-head blocks into a full-head layout and
   finishes from it (what an accumulator with every head would hold). */
static void gather_heads(const double *s0, const double *s1, double *full, int L, int H, int D, int pass) {
    /* per layer: pass 1 [tokens][H][D][D]; pass 2 [tokens][Σw: H][H][D][D] (no tensor targets) */
    int h2 = H / 2, l;
    size_t DD = (size_t)D * D, half1 = 1 + (size_t)h2 * DD, full1 = 1 + (size_t)H * DD;
    size_t half2 = 1 + (size_t)h2 + (size_t)h2 * DD, full2 = 1 + (size_t)H + (size_t)H * DD;
    for (l = 0; l < L; l++) {
        const double *a = s0 + (size_t)l * (pass == 1 ? half1 : half2), *b = s1 + (size_t)l * (pass == 1 ? half1 : half2);
        double *o = full + (size_t)l * (pass == 1 ? full1 : full2);
        cr_assert_eq(a[0], b[0], "both ranks saw the same tokens");
        o[0] = a[0];
        if (pass == 1) {
            memcpy(o + 1, a + 1, sizeof(double) * h2 * DD);
            memcpy(o + 1 + h2 * DD, b + 1, sizeof(double) * h2 * DD);
        } else {
            memcpy(o + 1, a + 1, sizeof(double) * (size_t)h2);
            memcpy(o + 1 + h2, b + 1, sizeof(double) * (size_t)h2);
            memcpy(o + 1 + H, a + 1 + h2, sizeof(double) * h2 * DD);
            memcpy(o + 1 + H + h2 * DD, b + 1 + h2, sizeof(double) * h2 * DD);
        }
    }
}

Test(calib_ranks_cpu, kv_head_shards_gathered_give_one_accumulators_rotations, .timeout = 300) {
    static const int32_t ids[2] = {0, 5};
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    tu_rng r = tu_seed();
    cal_data d;
    oscar_calib *rk[2], *all, *gathered;
    rot_pair pall, pg;
    double *s[2], *full, *sall;
    int64_t n[2], nf, nall;
    int k;
    calib_need_lapack();
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    d = cal_make(&r, 500, 8, 4, 32, 2);
    for (k = 0; k < 2; k++) rk[k] = cal_create(ctx, &d, ids, d.Hkv / 2);
    all = cal_create(ctx, &d, ids, d.Hkv), gathered = cal_create(ctx, &d, ids, d.Hkv);
    for (k = 0; k < 2; k++) cal_feed(rk[k], &d, ids, 0, d.n, k * d.Hkv / 2, NULL);
    cal_feed(all, &d, ids, 0, d.n, 0, NULL);
    for (k = 0; k < 2; k++) s[k] = stats_copy(rk[k], &n[k]);
    sall = stats_copy(all, &nall);
    full = cr_dalloc((size_t)nall);
    gather_heads(s[0], s[1], full, d.L, d.Hkv, d.D, 1);
    /* per head the sums are the same sums in the same order: identical bits */
    cr_assert(memcmp(full, sall, sizeof(double) * (size_t)nall) == 0, "gathered pass-1 blocks differ from one accumulator");
    TU_OK(ctx, oscar_calib_import_stats(gathered, full, nall, NULL));
    free(s[0]), free(s[1]), free(full), free(sall);
    for (k = 0; k < 2; k++) TU_OK(ctx, oscar_calib_begin_score_pass(rk[k], NULL)); /* no sum needed first */
    TU_OK(ctx, oscar_calib_begin_score_pass(all, NULL));
    TU_OK(ctx, oscar_calib_begin_score_pass(gathered, NULL));
    for (k = 0; k < 2; k++) cal_feed(rk[k], &d, ids, 0, d.n, k * d.Hkv / 2, NULL);
    cal_feed(all, &d, ids, 0, d.n, 0, NULL);
    for (k = 0; k < 2; k++) s[k] = stats_copy(rk[k], &n[k]);
    sall = stats_copy(all, &nall);
    full = cr_dalloc((size_t)nall);
    gather_heads(s[0], s[1], full, d.L, d.Hkv, d.D, 2);
    cr_assert(memcmp(full, sall, sizeof(double) * (size_t)nall) == 0, "gathered pass-2 blocks differ from one accumulator");
    TU_OK(ctx, oscar_calib_import_stats(gathered, full, nall, NULL));
    (void)nf;
    pall = cal_finish(all), pg = cal_finish(gathered);
    cr_assert(rot_identical(pg.k, pall.k) && rot_identical(pg.v, pall.v),
              "rotations from gathered head shards differ from one accumulator (K %g, V %g)",
              rot_maxdiff(pg.k, pall.k, NULL), rot_maxdiff(pg.v, pall.v, NULL));
    rot_free(&pall), rot_free(&pg);
    free(s[0]), free(s[1]), free(full), free(sall);
    for (k = 0; k < 2; k++) oscar_calib_destroy(rk[k]);
    oscar_calib_destroy(all), oscar_calib_destroy(gathered);
    cal_free(&d);
    oscar_shutdown(ctx);
}

/* ======================================================================== */
/* GPU                                                                       */

static int visible_devices_or_skip(void) {
    oscar_ctx *probe = tu_gpu_ctx_or_skip();
    int n = 0;
    oscar_shutdown(probe);
    TU_CUDA(cudaGetDeviceCount(&n));
    cr_assert(n >= 1);
    return n;
}

Test(calib_ranks_gpu, token_halves_on_two_contexts_summed_on_device, .timeout = 600) {
    int ndev = visible_devices_or_skip(), dev1 = 1 % ndev, l, k;
    oscar_desc desc = {0};
    oscar_ctx *c0 = NULL, *c1 = NULL;
    tu_rng r = tu_seed();
    cal_data d = cal_make(&r, 3000, 8, 2, 64, 2);
    void *dv[2][2][3]; /* [rank][layer][q, k, v] */
    TU_OK(NULL, oscar_setup(&desc, &c0));
    desc.device_ordinal = dev1;
    TU_OK(NULL, oscar_setup(&desc, &c1));
    cr_log_info("calibration ranks on devices 0 and %d (%d visible)", dev1, ndev);
    for (k = 0; k < 2; k++) {
        TU_CUDA(cudaSetDevice(k ? dev1 : 0));
        for (l = 0; l < 2; l++) {
            dv[k][l][0] = tu_dev_upload(d.q[l].data, d.q[l].count * 4);
            dv[k][l][1] = tu_dev_upload(d.k[l].data, d.k[l].count * 4);
            dv[k][l][2] = tu_dev_upload(d.v[l].data, d.v[l].count * 4);
        }
    }
    TU_CUDA(cudaSetDevice(0));
    {
        int devs[2];
        devs[0] = 0, devs[1] = dev1;
        calib_two_ranks(c0, c1, &d, 1234, (void *const(*)[3])dv[0], (void *const(*)[3])dv[1], devs);
    }
    for (k = 0; k < 2; k++) {
        TU_CUDA(cudaSetDevice(k ? dev1 : 0));
        for (l = 0; l < 2; l++) cudaFree(dv[k][l][0]), cudaFree(dv[k][l][1]), cudaFree(dv[k][l][2]);
    }
    TU_CUDA(cudaSetDevice(0));
    cal_free(&d);
    oscar_shutdown(c0), oscar_shutdown(c1);
}
