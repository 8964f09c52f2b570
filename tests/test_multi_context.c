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

/* The first registered instantiation whose name expression starts with
   `prefix` (prefixes, so the test does not depend on template parameters
   added later, e.g. a tuned tile size). */
static int32_t instantiation_index(const char *prefix) {
    int32_t i, n = oscar_jit_instantiation_count();
    for (i = 0; i < n; i++) {
        const char *prog = NULL, *nm = NULL;
        if (oscar_jit_instantiation(i, &prog, &nm) == OSCAR_OK && strncmp(nm, prefix, strlen(prefix)) == 0) return i;
    }
    cr_assert_fail("no instantiation starts with %s", prefix);
    return -1;
}

/* Cheap kernels (each compiles in well under a second): merge_states and dequantize. */
#define NUM_CHEAP 4
static void cheap_indices(int32_t *out) {
    static const char *prefixes[NUM_CHEAP] = {"oscar::merge_states_kernel<64", "oscar::merge_states_kernel<128",
                                              "oscar::dequant_kernel<64, 64, 16>", "oscar::dequant_kernel<128, 32, 1>"};
    int i, k;
    for (i = 0; i < NUM_CHEAP; i++) out[i] = instantiation_index(prefixes[i]);
    for (i = 0; i < NUM_CHEAP; i++)
        for (k = i + 1; k < NUM_CHEAP; k++) cr_assert_neq(out[i], out[k], "two cheap kernels are one instantiation");
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
    int k, pass;
    calib_need_lapack();
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &ctx));
    d = cal_make(&r, 500, 8, 4, 32, 2);
    for (k = 0; k < 2; k++) rk[k] = cal_create(ctx, &d, ids, d.Hkv / 2);
    all = cal_create(ctx, &d, ids, d.Hkv), gathered = cal_create(ctx, &d, ids, d.Hkv);
    for (pass = 1; pass <= 2; pass++) {
        double *s[2], *full, *sall;
        int64_t n[2], nall;
        if (pass == 2) {
            for (k = 0; k < 2; k++) TU_OK(ctx, oscar_calib_begin_score_pass(rk[k], NULL)); /* no sum needed first */
            TU_OK(ctx, oscar_calib_begin_score_pass(all, NULL));
            TU_OK(ctx, oscar_calib_begin_score_pass(gathered, NULL));
        }
        for (k = 0; k < 2; k++) cal_feed(rk[k], &d, ids, 0, d.n, k * d.Hkv / 2, NULL);
        cal_feed(all, &d, ids, 0, d.n, 0, NULL);
        for (k = 0; k < 2; k++) s[k] = stats_copy(rk[k], &n[k]);
        sall = stats_copy(all, &nall);
        full = cr_dalloc((size_t)nall);
        gather_heads(s[0], s[1], full, d.L, d.Hkv, d.D, pass);
        /* per head the sums are the same sums in the same order: identical bits */
        cr_assert(memcmp(full, sall, sizeof(double) * (size_t)nall) == 0,
                  "gathered pass-%d blocks differ from one accumulator", pass);
        TU_OK(ctx, oscar_calib_import_stats(gathered, full, nall, NULL));
        free(s[0]), free(s[1]), free(full), free(sall);
    }
    pall = cal_finish(all), pg = cal_finish(gathered);
    cr_assert(rot_identical(pg.k, pall.k) && rot_identical(pg.v, pall.v),
              "rotations from gathered head shards differ from one accumulator (K %g, V %g)",
              rot_maxdiff(pg.k, pall.k, NULL), rot_maxdiff(pg.v, pall.v, NULL));
    rot_free(&pall), rot_free(&pg);
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

/* ---- quantize -> decode, one problem per thread ------------------------- */

/* One layer's decode problem in host memory: bf16 K/V rows that quantize
   writes into the INT2 pool (slots from a shuffled page table), the engine's
   bf16 window cache (NHD), queries, the layer's rotations. */
typedef struct mc_prob {
    int B, Hq, Hkv, D, GS, ps, wps;
    int64_t int2_len[4], win_len[4], T; /* T = INT2 tokens in all */
    int32_t int2_pages, win_pages;
    int32_t *ip, *idx, *last, *wip, *widx, *wlast; /* CSR tables */
    int32_t *dst_slots;                            /* [T] */
    uint16_t *src_k, *src_v;                       /* [T][Hkv][D] */
    uint16_t *wk, *wv;                             /* [win_pages][wps][Hkv][D] */
    uint16_t *q;                                   /* [B][Hq][D] */
    float *rk, *rv;                                /* [D][D] */
    int int2_splits, window_splits;                /* 0: the plan chooses */
} mc_prob;

static void mc_table(tu_rng *r, int B, const int64_t *len, int ps, int32_t **ip, int32_t **idx, int32_t **last,
                     int32_t *num_pages) {
    int64_t total = 0, *perm, i;
    int b, k = 0;
    for (b = 0; b < B; b++) total += (len[b] + ps - 1) / ps;
    *num_pages = (int32_t)total + 3; /* a few pages nobody owns */
    perm = tu_xmalloc(sizeof(int64_t) * (size_t)*num_pages);
    tu_permutation(r, perm, *num_pages);
    *ip = tu_xmalloc(sizeof(int32_t) * (size_t)(B + 1)), *last = tu_xmalloc(sizeof(int32_t) * (size_t)B);
    *idx = tu_xmalloc(sizeof(int32_t) * (size_t)(total + 1));
    (*ip)[0] = 0;
    for (b = 0; b < B; b++) {
        int64_t np = (len[b] + ps - 1) / ps;
        for (i = 0; i < np; i++, k++) (*idx)[k] = (int32_t)perm[k];
        (*ip)[b + 1] = k;
        (*last)[b] = np ? (int32_t)(len[b] - (np - 1) * ps) : 1;
    }
    free(perm);
}

static void mc_rotation(tu_rng *r, int D, float *R) {
    double *U = cr_dalloc((size_t)D * D);
    int i;
    random_orthogonal(r, D, U);
    for (i = 0; i < D * D; i++) R[i] = (float)U[i];
    free(U);
}

static void mc_make(tu_rng *r, int D, int GS, int Hkv, int ratio, int variant, mc_prob *P) {
    /* requests: long, sub-page, window only, no INT2 and a single window token */
    static const int64_t il[2][4] = {{1531, 7, 0, 900}, {2048, 300, 16, 0}};
    static const int64_t wl[2][4] = {{320, 64, 200, 1}, {256, 320, 0, 77}};
    int b, h, d;
    int64_t t, i;
    memset(P, 0, sizeof *P);
    P->B = 4, P->Hkv = Hkv, P->Hq = Hkv * ratio, P->D = D, P->GS = GS, P->ps = 16, P->wps = 16;
    for (b = 0; b < 4; b++) P->int2_len[b] = il[variant % 2][b], P->win_len[b] = wl[variant % 2][b], P->T += P->int2_len[b];
    mc_table(r, P->B, P->int2_len, P->ps, &P->ip, &P->idx, &P->last, &P->int2_pages);
    mc_table(r, P->B, P->win_len, P->wps, &P->wip, &P->widx, &P->wlast, &P->win_pages);
    P->dst_slots = tu_xmalloc(sizeof(int32_t) * (size_t)(P->T + 1));
    for (b = 0, t = 0; b < P->B; b++)
        for (i = 0; i < P->int2_len[b]; i++) P->dst_slots[t++] = P->idx[P->ip[b] + i / P->ps] * P->ps + (int32_t)(i % P->ps);
    P->src_k = tu_xmalloc((size_t)(P->T + 1) * Hkv * D * 2), P->src_v = tu_xmalloc((size_t)(P->T + 1) * Hkv * D * 2);
    for (t = 0; t < P->T; t++)
        for (h = 0; h < Hkv; h++)
            for (d = 0; d < D; d++) { /* outlier channels, as real keys have */
                size_t e = ((size_t)t * Hkv + h) * D + d;
                P->src_k[e] = oscar__f32_to_bf16((float)(tu_normal(r) * (d % 17 == 3 ? 12.0 : 1.0)));
                P->src_v[e] = oscar__f32_to_bf16((float)tu_normal(r));
            }
    {
        size_t n = (size_t)P->win_pages * P->wps * Hkv * D;
        P->wk = tu_xmalloc(n * 2), P->wv = tu_xmalloc(n * 2);
        for (i = 0; i < (int64_t)n; i++) {
            P->wk[i] = oscar__f32_to_bf16((float)(tu_normal(r) * ((i % D) % 17 == 3 ? 12.0 : 1.0)));
            P->wv[i] = oscar__f32_to_bf16((float)tu_normal(r));
        }
    }
    P->q = tu_xmalloc((size_t)P->B * P->Hq * D * 2);
    for (i = 0; i < (int64_t)P->B * P->Hq * D; i++) P->q[i] = oscar__f32_to_bf16((float)(1.5 * tu_normal(r)));
    P->rk = tu_xmalloc(sizeof(float) * (size_t)D * D), P->rv = tu_xmalloc(sizeof(float) * (size_t)D * D);
    mc_rotation(r, D, P->rk);
    mc_rotation(r, D, P->rv);
}

static void mc_free(mc_prob *P) {
    free(P->ip), free(P->idx), free(P->last), free(P->wip), free(P->widx), free(P->wlast), free(P->dst_slots);
    free(P->src_k), free(P->src_v), free(P->wk), free(P->wv), free(P->q), free(P->rk), free(P->rv);
}

/* Rank `rank` of `nranks` in tensor parallelism: KV heads [rank·H/n,
   (rank+1)·H/n) and the query heads that belong to them; the same tokens,
   page tables and rotations (rotations are per layer, shared by its heads). */
static void mc_shard(const mc_prob *F, int rank, int nranks, mc_prob *S) {
    int h = F->Hkv / nranks, hq = F->Hq / nranks;
    int64_t rows, i;
    size_t wrows;
    *S = *F;
    S->Hkv = h, S->Hq = hq;
#define MC_DUP(field, n) (S->field = tu_xmalloc(sizeof *F->field * (size_t)(n)), memcpy(S->field, F->field, sizeof *F->field * (size_t)(n)))
    MC_DUP(ip, F->B + 1), MC_DUP(idx, F->ip[F->B] + 1), MC_DUP(last, F->B);
    MC_DUP(wip, F->B + 1), MC_DUP(widx, F->wip[F->B] + 1), MC_DUP(wlast, F->B);
    MC_DUP(dst_slots, F->T + 1), MC_DUP(rk, F->D * F->D), MC_DUP(rv, F->D * F->D);
#undef MC_DUP
    rows = F->T;
    S->src_k = tu_xmalloc((size_t)(rows + 1) * h * F->D * 2), S->src_v = tu_xmalloc((size_t)(rows + 1) * h * F->D * 2);
    for (i = 0; i < rows; i++) {
        memcpy(S->src_k + (size_t)i * h * F->D, F->src_k + ((size_t)i * F->Hkv + (size_t)rank * h) * F->D, (size_t)h * F->D * 2);
        memcpy(S->src_v + (size_t)i * h * F->D, F->src_v + ((size_t)i * F->Hkv + (size_t)rank * h) * F->D, (size_t)h * F->D * 2);
    }
    wrows = (size_t)F->win_pages * F->wps; /* NHD: [page][token] rows of Hkv heads */
    S->wk = tu_xmalloc(wrows * h * F->D * 2), S->wv = tu_xmalloc(wrows * h * F->D * 2);
    for (i = 0; i < (int64_t)wrows; i++) {
        memcpy(S->wk + (size_t)i * h * F->D, F->wk + ((size_t)i * F->Hkv + (size_t)rank * h) * F->D, (size_t)h * F->D * 2);
        memcpy(S->wv + (size_t)i * h * F->D, F->wv + ((size_t)i * F->Hkv + (size_t)rank * h) * F->D, (size_t)h * F->D * 2);
    }
    S->q = tu_xmalloc((size_t)F->B * hq * F->D * 2);
    for (i = 0; i < F->B; i++)
        memcpy(S->q + (size_t)i * hq * F->D, F->q + ((size_t)i * F->Hq + (size_t)rank * hq) * F->D, (size_t)hq * F->D * 2);
}

static void mc_pool_desc(const mc_prob *P, oscar_int2_pool_desc *pool, oscar_window_pool_desc *win) {
    memset(pool, 0, sizeof *pool), memset(win, 0, sizeof *win);
    pool->head_dim = P->D, pool->num_kv_heads = P->Hkv, pool->num_pages = P->int2_pages, pool->page_size = P->ps;
    pool->group_size = P->GS;
    win->num_pages = P->win_pages, win->page_size = P->wps;
}

/* What a thread brings back. */
typedef struct mc_out {
    size_t code_bytes, scale_bytes;
    uint8_t *kc, *vc, *ks, *vs;
    uint16_t *o;
    float *lse;
    int32_t int2_splits, window_splits;
    oscar_jit_stats stats;
    oscar_jit_kernel_info kernels[16];
    int32_t num_kernels;
    int failed;
    char error[4400];
} mc_out;
static void mc_out_free(mc_out *o) { free(o->kc), free(o->vc), free(o->ks), free(o->vs), free(o->o), free(o->lse); }

typedef struct mc_job {
    const mc_prob *P;
    int device;
    oscar_ctx *shared;     /* a context shared with other threads, or NULL: set one up */
    const char *cache_dir; /* the shared disk cache of the contexts set up here */
    pthread_barrier_t *start;
    int iters;             /* quantize -> decode repeated on the stream (same result each time) */
    mc_out out;
} mc_job;

#define MC_CUDA(call)                                                                                                \
    do {                                                                                                             \
        cudaError_t mc_e = (call);                                                                                   \
        if (mc_e != cudaSuccess) {                                                                                   \
            snprintf(o->error, sizeof o->error, "line %d: %s: %s", __LINE__, #call, cudaGetErrorString(mc_e));       \
            goto done;                                                                                               \
        }                                                                                                            \
    } while (0)
#define MC_OK(call)                                                                                                  \
    do {                                                                                                             \
        oscar_status mc_s = (call);                                                                                  \
        if (mc_s != OSCAR_OK) {                                                                                      \
            snprintf(o->error, sizeof o->error, "line %d: %s -> %s: %s", __LINE__, #call, oscar_status_string(mc_s),  \
                     oscar_last_error(ctx));                                                                         \
            goto done;                                                                                               \
        }                                                                                                            \
    } while (0)

static void *mc_worker(void *arg) {
    mc_job *j = (mc_job *)arg;
    const mc_prob *P = j->P;
    mc_out *o = &j->out;
    oscar_ctx *ctx = j->shared;
    oscar_status setup = OSCAR_OK;
    cudaStream_t s = NULL;
    oscar_int2_pool_desc pool;
    oscar_window_pool_desc win;
    oscar_quantize_desc qd = {0};
    oscar_decode_plan_desc pd = {0};
    oscar_decode_plan_info plan;
    oscar_decode_run_desc rd = {0};
    void *d_kc = NULL, *d_vc = NULL, *d_ks = NULL, *d_vs = NULL, *d_wk = NULL, *d_wv = NULL, *d_q = NULL, *d_o = NULL;
    void *d_lse = NULL, *d_rk = NULL, *d_rv = NULL, *d_ws = NULL, *d_srck = NULL, *d_srcv = NULL, *d_dst = NULL;
    void *d_tab[6] = {NULL, NULL, NULL, NULL, NULL, NULL};
    const int32_t *h_tab[6];
    size_t n_tab[6], o_bytes = (size_t)P->B * P->Hq * P->D * 2, lse_bytes = (size_t)P->B * P->Hq * 4;
    size_t src_bytes = (size_t)P->T * P->Hkv * P->D * 2, win_bytes = (size_t)P->win_pages * P->wps * P->Hkv * P->D * 2;
    int64_t max_i = 0, max_w = 0;
    int i, b;
    o->failed = 1;
    if (!ctx) {
        oscar_desc desc = {0};
        desc.device_ordinal = j->device;
        desc.cache_dir = j->cache_dir;
        setup = oscar_setup(&desc, &ctx);
        if (setup != OSCAR_OK) snprintf(o->error, sizeof o->error, "oscar_setup(device %d): %s", j->device, oscar_last_error(NULL));
    }
    /* every thread plans (JIT), quantizes and decodes at the same time */
    if (j->start) pthread_barrier_wait(j->start);
    if (setup != OSCAR_OK) return NULL;
    MC_CUDA(cudaSetDevice(j->device));
    MC_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    mc_pool_desc(P, &pool, &win);
    MC_OK(oscar_int2_pool_bytes(ctx, &pool, &o->code_bytes, &o->scale_bytes));
    MC_CUDA(cudaMalloc(&d_kc, o->code_bytes)); MC_CUDA(cudaMalloc(&d_vc, o->code_bytes));
    MC_CUDA(cudaMalloc(&d_ks, o->scale_bytes)); MC_CUDA(cudaMalloc(&d_vs, o->scale_bytes));
    MC_CUDA(cudaMalloc(&d_wk, win_bytes)); MC_CUDA(cudaMalloc(&d_wv, win_bytes));
    MC_CUDA(cudaMalloc(&d_srck, src_bytes + 16)); MC_CUDA(cudaMalloc(&d_srcv, src_bytes + 16));
    MC_CUDA(cudaMalloc(&d_dst, sizeof(int32_t) * (size_t)(P->T + 1)));
    MC_CUDA(cudaMalloc(&d_q, o_bytes)); MC_CUDA(cudaMalloc(&d_o, o_bytes)); MC_CUDA(cudaMalloc(&d_lse, lse_bytes));
    MC_CUDA(cudaMalloc(&d_rk, sizeof(float) * (size_t)P->D * P->D)); MC_CUDA(cudaMalloc(&d_rv, sizeof(float) * (size_t)P->D * P->D));
    h_tab[0] = P->ip, h_tab[1] = P->idx, h_tab[2] = P->last, h_tab[3] = P->wip, h_tab[4] = P->widx, h_tab[5] = P->wlast;
    n_tab[0] = n_tab[3] = (size_t)P->B + 1, n_tab[2] = n_tab[5] = (size_t)P->B;
    n_tab[1] = (size_t)P->ip[P->B] + 1, n_tab[4] = (size_t)P->wip[P->B] + 1;
    for (i = 0; i < 6; i++) {
        MC_CUDA(cudaMalloc(&d_tab[i], 4 * n_tab[i]));
        MC_CUDA(cudaMemcpyAsync(d_tab[i], h_tab[i], 4 * n_tab[i], cudaMemcpyHostToDevice, s));
    }
    MC_CUDA(cudaMemsetAsync(d_kc, 0, o->code_bytes, s)); MC_CUDA(cudaMemsetAsync(d_vc, 0, o->code_bytes, s));
    MC_CUDA(cudaMemsetAsync(d_ks, 0, o->scale_bytes, s)); MC_CUDA(cudaMemsetAsync(d_vs, 0, o->scale_bytes, s));
    MC_CUDA(cudaMemcpyAsync(d_wk, P->wk, win_bytes, cudaMemcpyHostToDevice, s));
    MC_CUDA(cudaMemcpyAsync(d_wv, P->wv, win_bytes, cudaMemcpyHostToDevice, s));
    MC_CUDA(cudaMemcpyAsync(d_srck, P->src_k, src_bytes, cudaMemcpyHostToDevice, s));
    MC_CUDA(cudaMemcpyAsync(d_srcv, P->src_v, src_bytes, cudaMemcpyHostToDevice, s));
    MC_CUDA(cudaMemcpyAsync(d_dst, P->dst_slots, sizeof(int32_t) * (size_t)P->T, cudaMemcpyHostToDevice, s));
    MC_CUDA(cudaMemcpyAsync(d_q, P->q, o_bytes, cudaMemcpyHostToDevice, s));
    MC_CUDA(cudaMemcpyAsync(d_rk, P->rk, sizeof(float) * (size_t)P->D * P->D, cudaMemcpyHostToDevice, s));
    MC_CUDA(cudaMemcpyAsync(d_rv, P->rv, sizeof(float) * (size_t)P->D * P->D, cudaMemcpyHostToDevice, s));
    MC_CUDA(cudaMemsetAsync(d_o, 0xFF, o_bytes, s)); /* NaN poison */
    MC_CUDA(cudaMemsetAsync(d_lse, 0xFF, lse_bytes, s));
    pool.k_codes = d_kc, pool.v_codes = d_vc, pool.k_scales = d_ks, pool.v_scales = d_vs;
    win.k = d_wk, win.v = d_wv;
    for (b = 0; b < P->B; b++) max_i = P->int2_len[b] > max_i ? P->int2_len[b] : max_i, max_w = P->win_len[b] > max_w ? P->win_len[b] : max_w;
    pd.num_q_heads = P->Hq, pd.int2_pool = &pool, pd.window_pool = &win, pd.batch_size = P->B;
    pd.max_int2_tokens = max_i, pd.max_window_tokens = (int32_t)max_w;
    pd.int2_splits = P->int2_splits, pd.window_splits = P->window_splits;
    MC_OK(oscar_decode_plan(ctx, &pd, &plan));
    o->int2_splits = plan.int2_splits, o->window_splits = plan.window_splits;
    MC_CUDA(cudaMalloc(&d_ws, plan.workspace_bytes ? plan.workspace_bytes : 16));
    qd.pool = &pool, qd.src_k = d_srck, qd.src_v = d_srcv, qd.k_rotation = (const float *)d_rk;
    qd.v_rotation = (const float *)d_rv, qd.num_tokens = P->T, qd.dst_slots = d_dst;
    qd.k_clip_ratio = 0.96f, qd.v_clip_ratio = 0.92f;
    rd.int2_pool = &pool, rd.window_pool = &win;
    rd.int2_pages.indptr = d_tab[0], rd.int2_pages.indices = d_tab[1], rd.int2_pages.last_page_len = d_tab[2];
    rd.window_pages.indptr = d_tab[3], rd.window_pages.indices = d_tab[4], rd.window_pages.last_page_len = d_tab[5];
    rd.q = d_q, rd.o = d_o, rd.lse = (float *)d_lse;
    rd.k_rotation = (const float *)d_rk, rd.v_rotation = (const float *)d_rv;
    rd.sm_scale = 1.0f / sqrtf((float)P->D);
    rd.workspace = d_ws, rd.workspace_bytes = plan.workspace_bytes;
    for (i = 0; i < j->iters; i++) {
        MC_OK(oscar_quantize_kv(ctx, &qd, (oscar_stream)s));
        MC_OK(oscar_decode_run(ctx, &plan, &rd, (oscar_stream)s));
    }
    MC_CUDA(cudaStreamSynchronize(s));
    o->kc = malloc(o->code_bytes), o->vc = malloc(o->code_bytes), o->ks = malloc(o->scale_bytes);
    o->vs = malloc(o->scale_bytes), o->o = malloc(o_bytes), o->lse = malloc(lse_bytes);
    if (!o->kc || !o->vc || !o->ks || !o->vs || !o->o || !o->lse) {
        snprintf(o->error, sizeof o->error, "out of host memory for the results");
        goto done;
    }
    MC_CUDA(cudaMemcpy(o->kc, d_kc, o->code_bytes, cudaMemcpyDeviceToHost));
    MC_CUDA(cudaMemcpy(o->vc, d_vc, o->code_bytes, cudaMemcpyDeviceToHost));
    MC_CUDA(cudaMemcpy(o->ks, d_ks, o->scale_bytes, cudaMemcpyDeviceToHost));
    MC_CUDA(cudaMemcpy(o->vs, d_vs, o->scale_bytes, cudaMemcpyDeviceToHost));
    MC_CUDA(cudaMemcpy(o->o, d_o, o_bytes, cudaMemcpyDeviceToHost));
    MC_CUDA(cudaMemcpy(o->lse, d_lse, lse_bytes, cudaMemcpyDeviceToHost));
    MC_OK(oscar_query_jit_stats(ctx, &o->stats));
    MC_OK(oscar_query_jit_kernels(ctx, o->kernels, 16, &o->num_kernels));
    o->failed = 0;
done:
    if (s) cudaStreamSynchronize(s), cudaStreamDestroy(s);
    cudaFree(d_kc), cudaFree(d_vc), cudaFree(d_ks), cudaFree(d_vs), cudaFree(d_wk), cudaFree(d_wv), cudaFree(d_q);
    cudaFree(d_o), cudaFree(d_lse), cudaFree(d_rk), cudaFree(d_rv), cudaFree(d_ws), cudaFree(d_srck), cudaFree(d_srcv);
    cudaFree(d_dst);
    for (i = 0; i < 6; i++) cudaFree(d_tab[i]);
    if (!j->shared && ctx) oscar_shutdown(ctx);
    return NULL;
}

/* The same work on the CPU backend (host memory, no streams): runs in CI and
   checks this file's problem, shard and comparison code without a GPU. */
static void mc_cpu_run(oscar_ctx *ctx, const mc_prob *P, mc_out *o) {
    oscar_int2_pool_desc pool;
    oscar_window_pool_desc win;
    oscar_quantize_desc qd = {0};
    oscar_decode_plan_desc pd = {0};
    oscar_decode_plan_info plan;
    oscar_decode_run_desc rd = {0};
    int64_t max_i = 0, max_w = 0;
    int b;
    memset(o, 0, sizeof *o);
    mc_pool_desc(P, &pool, &win);
    TU_OK(ctx, oscar_int2_pool_bytes(ctx, &pool, &o->code_bytes, &o->scale_bytes));
    o->kc = calloc(1, o->code_bytes), o->vc = calloc(1, o->code_bytes);
    o->ks = calloc(1, o->scale_bytes), o->vs = calloc(1, o->scale_bytes);
    o->o = tu_xmalloc((size_t)P->B * P->Hq * P->D * 2), o->lse = tu_xmalloc((size_t)P->B * P->Hq * 4);
    cr_assert(o->kc && o->vc && o->ks && o->vs);
    pool.k_codes = o->kc, pool.v_codes = o->vc, pool.k_scales = o->ks, pool.v_scales = o->vs;
    win.k = P->wk, win.v = P->wv;
    qd.pool = &pool, qd.src_k = P->src_k, qd.src_v = P->src_v, qd.k_rotation = P->rk, qd.v_rotation = P->rv;
    qd.num_tokens = P->T, qd.dst_slots = P->dst_slots, qd.k_clip_ratio = 0.96f, qd.v_clip_ratio = 0.92f;
    TU_OK(ctx, oscar_quantize_kv(ctx, &qd, NULL));
    for (b = 0; b < P->B; b++) max_i = P->int2_len[b] > max_i ? P->int2_len[b] : max_i, max_w = P->win_len[b] > max_w ? P->win_len[b] : max_w;
    pd.num_q_heads = P->Hq, pd.int2_pool = &pool, pd.window_pool = &win, pd.batch_size = P->B;
    pd.max_int2_tokens = max_i, pd.max_window_tokens = (int32_t)max_w;
    TU_OK(ctx, oscar_decode_plan(ctx, &pd, &plan));
    rd.int2_pool = &pool, rd.window_pool = &win;
    rd.int2_pages.indptr = P->ip, rd.int2_pages.indices = P->idx, rd.int2_pages.last_page_len = P->last;
    rd.window_pages.indptr = P->wip, rd.window_pages.indices = P->widx, rd.window_pages.last_page_len = P->wlast;
    rd.q = P->q, rd.o = o->o, rd.lse = o->lse, rd.k_rotation = P->rk, rd.v_rotation = P->rv;
    rd.sm_scale = 1.0f / sqrtf((float)P->D);
    rd.workspace = o->lse, rd.workspace_bytes = plan.workspace_bytes; /* 0 bytes: the CPU backend needs none */
    TU_OK(ctx, oscar_decode_run(ctx, &plan, &rd, NULL));
}

/* Runs the jobs in threads, all at once (with a start barrier) or one after the other. */
static void mc_run(mc_job *jobs, int n, int together) {
    pthread_t th[16];
    pthread_barrier_t start;
    int t;
    cr_assert(n <= 16);
    if (together) pthread_barrier_init(&start, NULL, (unsigned)n);
    for (t = 0; t < n; t++) {
        memset(&jobs[t].out, 0, sizeof jobs[t].out);
        jobs[t].start = together ? &start : NULL;
        cr_assert(pthread_create(&th[t], NULL, mc_worker, &jobs[t]) == 0);
        if (!together) pthread_join(th[t], NULL);
    }
    if (together)
        for (t = 0; t < n; t++) pthread_join(th[t], NULL);
    if (together) pthread_barrier_destroy(&start);
    for (t = 0; t < n; t++) cr_assert(!jobs[t].out.failed, "thread %d (device %d): %s", t, jobs[t].device, jobs[t].out.error);
}

static void mc_assert_same(const mc_out *a, const mc_out *b, const mc_prob *P, const char *what, int t) {
    size_t o_bytes = (size_t)P->B * P->Hq * P->D * 2;
    cr_assert(a->code_bytes == b->code_bytes && a->scale_bytes == b->scale_bytes);
    cr_assert(memcmp(a->kc, b->kc, a->code_bytes) == 0 && memcmp(a->vc, b->vc, a->code_bytes) == 0,
              "problem %d: INT2 codes %s differ from the run alone", t, what);
    cr_assert(memcmp(a->ks, b->ks, a->scale_bytes) == 0 && memcmp(a->vs, b->vs, a->scale_bytes) == 0,
              "problem %d: scales %s differ from the run alone", t, what);
    cr_assert(memcmp(a->o, b->o, o_bytes) == 0, "problem %d: decode output %s differs from the run alone", t, what);
    cr_assert(memcmp(a->lse, b->lse, (size_t)P->B * P->Hq * 4) == 0, "problem %d: lse %s differs from the run alone", t, what);
}

/* float64 decode over the pool the GPU wrote (the CPU backend's kernel), and
   the per-head check of test_decode.c: relative L2 error of o <= 5e-3, |lse
   error| <= 1e-3, no NaN. */
static void mc_check_decode(const mc_prob *P, const mc_out *g, int t) {
    oscar_int2_pool_desc pool, filled;
    oscar_window_pool_desc win, wf;
    oscar_decode_params p;
    double *scratch, o_ref[256], lse_ref, worst = 0, worst_lse = 0;
    int b, h, d;
    mc_pool_desc(P, &pool, &win);
    pool.k_codes = g->kc, pool.v_codes = g->vc, pool.k_scales = g->ks, pool.v_scales = g->vs;
    win.k = P->wk, win.v = P->wv;
    filled = oscar__pool_defaults(&pool);
    wf = oscar__window_defaults(&win, P->Hkv, P->D);
    memset(&p, 0, sizeof p);
    p.pool = oscar__pool_params(&filled);
    p.int2_indptr = (uint64_t)(uintptr_t)P->ip, p.int2_indices = (uint64_t)(uintptr_t)P->idx;
    p.int2_last_page_len = (uint64_t)(uintptr_t)P->last;
    p.win_k = (uint64_t)(uintptr_t)wf.k, p.win_v = (uint64_t)(uintptr_t)wf.v;
    p.win_page_stride = wf.page_stride, p.win_token_stride = wf.token_stride, p.win_head_stride = wf.head_stride;
    p.win_indptr = (uint64_t)(uintptr_t)P->wip, p.win_indices = (uint64_t)(uintptr_t)P->widx;
    p.win_last_page_len = (uint64_t)(uintptr_t)P->wlast;
    p.win_page_size = wf.page_size, p.win_num_pages = wf.num_pages;
    p.q = (uint64_t)(uintptr_t)P->q, p.q_batch_stride = (int64_t)P->Hq * P->D, p.q_head_stride = P->D;
    p.rot_k = (uint64_t)(uintptr_t)P->rk, p.rot_v = (uint64_t)(uintptr_t)P->rv;
    p.sm_scale = 1.0f / sqrtf((float)P->D);
    p.batch_size = P->B, p.num_q_heads = P->Hq, p.group_ratio = P->Hq / P->Hkv;
    p.q_dtype = OSCAR_K_DTYPE_BF16, p.kv_dtype = OSCAR_K_DTYPE_BF16;
    scratch = tu_xmalloc(sizeof(double) * (size_t)oscar__cpu_decode_max_tokens(&p));
    for (b = 0; b < P->B; b++)
        for (h = 0; h < P->Hq; h++) {
            const uint16_t *got = g->o + ((size_t)b * P->Hq + h) * P->D;
            double num = 0, den = 0, rel, lg = g->lse[b * P->Hq + h];
            oscar__cpu_decode_head(&p, P->D, P->GS, b, h, o_ref, &lse_ref, scratch);
            for (d = 0; d < P->D; d++) {
                double x = oscar__bf16_to_f32(got[d]);
                cr_assert(x == x, "problem %d: NaN in o at b=%d h=%d d=%d", t, b, h, d);
                num += (x - o_ref[d]) * (x - o_ref[d]), den += o_ref[d] * o_ref[d];
            }
            rel = den > 0 ? sqrt(num / den) : sqrt(num);
            worst = fmax(worst, rel);
            cr_assert(rel <= 5e-3, "problem %d b=%d h=%d: relative error of o %.3e > 5e-3", t, b, h, rel);
            if (lse_ref == -HUGE_VAL) {
                cr_assert(lg == -HUGE_VAL, "problem %d b=%d h=%d: empty request, lse %g", t, b, h, lg);
            } else {
                worst_lse = fmax(worst_lse, fabs(lg - lse_ref));
                cr_assert(fabs(lg - lse_ref) <= 1e-3, "problem %d b=%d h=%d: lse %.6f vs %.6f", t, b, h, lg, lse_ref);
            }
        }
    free(scratch);
    cr_log_info("problem %d (D=%d G=%d %d/%d heads): decode vs float64: max rel. error of o %.2e, max |lse error| %.2e", t,
                P->D, P->GS, P->Hq, P->Hkv, worst, worst_lse);
}

/* The GPU pool against the CPU backend's quantize of the same rows: with a
   dense rotation a rotated value can round to the other bf16 neighbour, so
   test_quantize.c allows 2e-3 of code bytes and 1e-3 of scales (by > 1%) to differ. */
static void mc_check_quantize(const mc_prob *P, const mc_out *g, oscar_ctx *cpu, int t) {
    oscar_int2_pool_desc pool;
    oscar_window_pool_desc win;
    oscar_quantize_desc qd = {0};
    uint8_t *kc = tu_xmalloc(g->code_bytes), *vc = tu_xmalloc(g->code_bytes);
    uint8_t *ks = tu_xmalloc(g->scale_bytes), *vs = tu_xmalloc(g->scale_bytes);
    size_t i, codes_off = 0, scales_off = 0, scales_seen = 0, codes_seen = 0;
    int64_t tok;
    mc_pool_desc(P, &pool, &win);
    memset(kc, 0, g->code_bytes), memset(vc, 0, g->code_bytes), memset(ks, 0, g->scale_bytes), memset(vs, 0, g->scale_bytes);
    pool.k_codes = kc, pool.v_codes = vc, pool.k_scales = ks, pool.v_scales = vs;
    qd.pool = &pool, qd.src_k = P->src_k, qd.src_v = P->src_v, qd.k_rotation = P->rk, qd.v_rotation = P->rv;
    qd.num_tokens = P->T, qd.dst_slots = P->dst_slots, qd.k_clip_ratio = 0.96f, qd.v_clip_ratio = 0.92f;
    TU_OK(cpu, oscar_quantize_kv(cpu, &qd, NULL));
    for (i = 0; i < g->code_bytes; i++) codes_off += (kc[i] != g->kc[i]) + (vc[i] != g->vc[i]);
    codes_seen = 2 * (size_t)P->T * P->Hkv * (size_t)P->D / 4;
    for (tok = 0; tok < P->T; tok++) { /* f16 (scale, min) pairs of the written rows */
        size_t row = (size_t)P->dst_slots[tok] * P->Hkv, per = (size_t)(P->D / P->GS) * 2, k;
        for (k = 0; k < (size_t)P->Hkv * per; k++) {
            size_t e = row * per + k;
            const uint16_t *a16[2] = {(const uint16_t *)g->ks, (const uint16_t *)g->vs};
            const uint16_t *b16[2] = {(const uint16_t *)ks, (const uint16_t *)vs};
            int kv;
            for (kv = 0; kv < 2; kv++) {
                double a = oscar__f16_to_f32(a16[kv][e]), b = oscar__f16_to_f32(b16[kv][e]);
                scales_seen++;
                scales_off += fabs(a - b) > 1e-2 * fabs(b);
            }
        }
    }
    cr_log_info("problem %d: quantize vs CPU backend: %zu of %zu code bytes and %zu of %zu scale entries differ", t,
                codes_off, codes_seen, scales_off, scales_seen);
    cr_assert((double)codes_off <= 2e-3 * (double)codes_seen, "problem %d: %zu of %zu code bytes differ", t, codes_off, codes_seen);
    cr_assert(scales_off <= scales_seen / 1000, "problem %d: %zu of %zu scales differ by > 1%%", t, scales_off, scales_seen);
    free(kc), free(vc), free(ks), free(vs);
}

/* Rank `rank` of 2 holds exactly the unsharded run's rows of its heads:
   codes and scales of every slot, o and lse of its query heads. */
static void mc_assert_shard(const mc_prob *F, const mc_out *full, int rank, const mc_out *R) {
    size_t slots = (size_t)F->int2_pages * F->ps, crow, srow, s;
    int hh = F->Hkv / 2, hq = F->Hq / 2, h, b;
    crow = full->code_bytes / (slots * (size_t)F->Hkv), srow = full->scale_bytes / (slots * (size_t)F->Hkv);
    cr_assert(crow * slots * (size_t)F->Hkv == full->code_bytes && crow == (size_t)F->D / 4, "contiguous NHD rows");
    cr_assert_eq(R->code_bytes, full->code_bytes / 2);
    cr_assert_eq(R->scale_bytes, full->scale_bytes / 2);
    for (s = 0; s < slots; s++)
        for (h = 0; h < hh; h++) {
            size_t a = s * (size_t)hh + (size_t)h, f = s * (size_t)F->Hkv + (size_t)(rank * hh + h);
            cr_assert(memcmp(R->kc + a * crow, full->kc + f * crow, crow) == 0 &&
                          memcmp(R->vc + a * crow, full->vc + f * crow, crow) == 0,
                      "rank %d slot %zu head %d: codes differ from the unsharded pool", rank, s, h);
            cr_assert(memcmp(R->ks + a * srow, full->ks + f * srow, srow) == 0 &&
                          memcmp(R->vs + a * srow, full->vs + f * srow, srow) == 0,
                      "rank %d slot %zu head %d: scales differ from the unsharded pool", rank, s, h);
        }
    for (b = 0; b < F->B; b++) {
        cr_assert(memcmp(R->o + (size_t)b * hq * F->D, full->o + ((size_t)b * F->Hq + (size_t)rank * hq) * F->D,
                         (size_t)hq * F->D * 2) == 0,
                  "rank %d request %d: o differs from the unsharded run's heads %d..%d", rank, b, rank * hq, rank * hq + hq - 1);
        cr_assert(memcmp(R->lse + (size_t)b * hq, full->lse + (size_t)b * F->Hq + (size_t)rank * hq, (size_t)hq * 4) == 0,
                  "rank %d request %d: lse differs from the unsharded run", rank, b);
    }
}

Test(multi_context_cpu, tensor_parallel_shards_on_the_cpu_backend, .timeout = 300) {
    static const int shapes[2][4] = {{128, 128, 8, 4}, {64, 32, 4, 2}}; /* D, G, Hkv, q heads per KV head */
    oscar_desc desc = {0};
    oscar_ctx *cpu = NULL, *rk[2] = {NULL, NULL};
    tu_rng r = tu_seed();
    int variant, rank;
    desc.backend = OSCAR_BACKEND_CPU;
    TU_OK(NULL, oscar_setup(&desc, &cpu));
    for (rank = 0; rank < 2; rank++) TU_OK(NULL, oscar_setup(&desc, &rk[rank]));
    for (variant = 0; variant < 2; variant++) {
        const int *sh = shapes[variant];
        mc_prob F, S;
        mc_out full, part;
        mc_make(&r, sh[0], sh[1], sh[2], sh[3], variant, &F);
        mc_cpu_run(cpu, &F, &full);
        mc_check_quantize(&F, &full, cpu, variant);
        mc_check_decode(&F, &full, variant);
        for (rank = 0; rank < 2; rank++) {
            mc_shard(&F, rank, 2, &S);
            mc_cpu_run(rk[rank], &S, &part);
            mc_assert_shard(&F, &full, rank, &part);
            mc_out_free(&part);
            mc_free(&S);
        }
        mc_out_free(&full);
        mc_free(&F);
    }
    oscar_shutdown(cpu), oscar_shutdown(rk[0]), oscar_shutdown(rk[1]);
}

Test(multi_context_gpu, threads_with_own_contexts_and_streams_equal_runs_alone, .timeout = 900) {
    int ndev = visible_devices_or_skip(), n = ndev * 2 < 4 ? 4 : ndev * 2, t, k, i, distinct = 0;
    static const int shapes[4][4] = {{128, 128, 2, 4}, {128, 32, 4, 2}, {64, 64, 2, 8}, {256, 256, 1, 4}}; /* D, G, Hkv, ratio */
    char dir[256], names[64][256];
    mc_prob P[16];
    mc_job jobs[16], alone[16], shared[16];
    tu_rng r = tu_seed();
    int64_t compiles = 0;
    oscar_desc desc = {0};
    oscar_ctx *one = NULL, *cpu = NULL;
    if (n > 16) n = 16;
    tu_tempdir(dir, sizeof dir, "mtgpu");
    cr_log_info("%d threads on %d device(s), one context and one stream each, one fresh disk cache", n, ndev);
    memset(jobs, 0, sizeof jobs);
    for (t = 0; t < n; t++) {
        const int *sh = shapes[t % 4];
        mc_make(&r, sh[0], sh[1], sh[2], sh[3], t / 4, &P[t]);
        jobs[t].P = &P[t], jobs[t].device = t % ndev, jobs[t].cache_dir = dir, jobs[t].iters = 8;
    }
    memcpy(alone, jobs, sizeof jobs);
    mc_run(jobs, n, 1);
    /* the same kernels wanted by several threads were compiled once between them */
    for (t = 0; t < n; t++) {
        compiles += jobs[t].out.stats.compiles;
        for (k = 0; k < jobs[t].out.num_kernels; k++) {
            char key[256];
            snprintf(key, sizeof key, "%s %s", jobs[t].out.kernels[k].program, jobs[t].out.kernels[k].name_expression);
            for (i = 0; i < distinct && strcmp(names[i], key) != 0; i++) {}
            if (i == distinct && distinct < 64) snprintf(names[distinct++], sizeof names[0], "%s", key);
        }
    }
    cr_log_info("%lld compiles in all for %d distinct kernels", (long long)compiles, distinct);
    cr_assert_eq(compiles, distinct, "%lld compiles for %d distinct kernels: a kernel was compiled twice", (long long)compiles,
                 distinct);
    /* each problem alone (warm cache now), then all of them on ONE context shared by the threads */
    mc_run(alone, n, 0);
    desc.cache_dir = dir;
    TU_OK(NULL, oscar_setup(&desc, &one));
    memcpy(shared, jobs, sizeof jobs);
    for (t = 0; t < n; t++) shared[t].shared = one, shared[t].device = 0;
    mc_run(shared, n, 1);
    desc.backend = OSCAR_BACKEND_CPU, desc.cache_dir = NULL;
    TU_OK(NULL, oscar_setup(&desc, &cpu));
    for (t = 0; t < n; t++) {
        mc_assert_same(&jobs[t].out, &alone[t].out, &P[t], "of concurrent threads (own contexts)", t);
        mc_assert_same(&shared[t].out, &alone[t].out, &P[t], "of threads sharing one context", t);
        mc_check_decode(&P[t], &alone[t].out, t);
        mc_check_quantize(&P[t], &alone[t].out, cpu, t);
        mc_out_free(&jobs[t].out), mc_out_free(&alone[t].out), mc_out_free(&shared[t].out);
        mc_free(&P[t]);
    }
    oscar_shutdown(one), oscar_shutdown(cpu);
    tu_rmtree(dir);
}

/* Tensor parallelism: the KV heads of one layer over 2 ranks. Each rank has
   its own context (device r % ndev), its own pools of num_kv_heads/2 heads,
   its query heads, the layer's rotations, the same page tables. With the
   split counts of the unsharded plan (the auto choice depends on the head
   count: another split is another summation order, equal only to rounding),
   the ranks' codes, scales, o and lse are the unsharded run's, bit for bit. */
Test(multi_context_gpu, tensor_parallel_shards_concatenate_bit_for_bit, .timeout = 600) {
    int ndev = visible_devices_or_skip(), rank, variant;
    static const int shapes[2][4] = {{128, 128, 8, 4}, {64, 32, 4, 2}};
    tu_rng r = tu_seed();
    for (variant = 0; variant < 2; variant++) {
        const int *sh = shapes[variant];
        mc_prob F, S[2];
        mc_job full, ranks[2];
        mc_make(&r, sh[0], sh[1], sh[2], sh[3], variant, &F);
        memset(&full, 0, sizeof full);
        full.P = &F, full.device = 0, full.iters = 1;
        mc_run(&full, 1, 0);
        memset(ranks, 0, sizeof ranks);
        for (rank = 0; rank < 2; rank++) {
            mc_shard(&F, rank, 2, &S[rank]);
            S[rank].int2_splits = full.out.int2_splits, S[rank].window_splits = full.out.window_splits;
            ranks[rank].P = &S[rank], ranks[rank].device = rank % ndev, ranks[rank].iters = 1;
        }
        mc_run(ranks, 2, 1);
        cr_log_info("D=%d G=%d %d/%d heads on 2 ranks (devices 0 and %d), splits %d + %d", F.D, F.GS, F.Hq, F.Hkv, 1 % ndev,
                    full.out.int2_splits, full.out.window_splits);
        for (rank = 0; rank < 2; rank++) {
            mc_assert_shard(&F, &full.out, rank, &ranks[rank].out);
            mc_out_free(&ranks[rank].out);
            mc_free(&S[rank]);
        }
        mc_check_decode(&F, &full.out, variant);
        mc_out_free(&full.out);
        mc_free(&F);
    }
}
