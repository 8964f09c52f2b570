/* bench/bench_util.h -- llm.c-style benchmark harness shared by the bench programs:
   CUDA-event timing with warm-up and medians, the device's measured copy
   bandwidth, and the result files (bench/results/<name>.md and .json) with
   GPU, date, commit and command. */
#ifndef OSCAR_BENCH_UTIL_H
#define OSCAR_BENCH_UTIL_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BU_CUDA(call)                                                                                                \
    do {                                                                                                             \
        cudaError_t bu_e = (call);                                                                                   \
        if (bu_e != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s:%d: %s failed: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(bu_e));          \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)
#define BU_OK(ctx, call)                                                                                             \
    do {                                                                                                             \
        oscar_status bu_st = (call);                                                                                 \
        if (bu_st != OSCAR_OK) {                                                                                     \
            fprintf(stderr, "%s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #call, oscar_status_string(bu_st),          \
                    oscar_last_error(ctx));                                                                          \
            exit(1);                                                                                                 \
        }                                                                                                            \
    } while (0)

static inline int bu_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static inline double bu_median(double *v, int n) {
    qsort(v, (size_t)n, sizeof(double), bu_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The stream the timed functions launch on and the events are recorded on:
   0, except while bu_time_graph_us captures and replays its graphs. */
static cudaStream_t bu_stream;

/* Times fn(arg, rep) with CUDA events: `warmup` untimed calls, then `reps`
   timed calls one by one; returns the median in microseconds, and the
   spread (max-min over the middle half) in *spread_us if non-NULL. */
typedef void (*bu_fn)(void *arg, int rep);
static inline double bu_time_us(bu_fn fn, void *arg, int warmup, int reps, double *spread_us) {
    cudaEvent_t a, b;
    double *t = (double *)malloc(sizeof(double) * (size_t)reps);
    int i;
    double med;
    BU_CUDA(cudaEventCreate(&a));
    BU_CUDA(cudaEventCreate(&b));
    for (i = 0; i < warmup; i++) fn(arg, i);
    BU_CUDA(cudaDeviceSynchronize());
    for (i = 0; i < reps; i++) {
        float ms = 0;
        BU_CUDA(cudaEventRecord(a, bu_stream));
        fn(arg, warmup + i);
        BU_CUDA(cudaEventRecord(b, bu_stream));
        BU_CUDA(cudaEventSynchronize(b));
        BU_CUDA(cudaEventElapsedTime(&ms, a, b));
        t[i] = ms * 1e3;
    }
    med = bu_median(t, reps);
    if (spread_us) *spread_us = t[(3 * reps) / 4] - t[reps / 4];
    free(t);
    BU_CUDA(cudaEventDestroy(a));
    BU_CUDA(cudaEventDestroy(b));
    return med;
}

/* The same timing over CUDA-graph replays, the way engines run a decode step:
   fn(arg, v) for each v < variants is captured once into its own graph (fn
   launches on bu_stream, the capture stream here), each graph is uploaded and
   launched once (its first launch does one-time work), and bu_time_us times
   rep i as a replay of graph i % variants on that stream. What this removes
   from bu_time_us's direct number is the host's launch work (argument checks,
   one driver call per kernel), which a direct run puts between the GPU's
   kernels when the kernels are short. */
typedef struct bu_graphs {
    cudaGraphExec_t *ge;
    int variants;
} bu_graphs;
static inline void bu_graph_replay(void *arg, int rep) {
    const bu_graphs *g = (const bu_graphs *)arg;
    BU_CUDA(cudaGraphLaunch(g->ge[rep % g->variants], bu_stream));
}
/* fn(arg, variant) captured on stream s (bu_stream while it runs) into an
   instantiated graph */
static inline cudaGraphExec_t bu_graph_capture(bu_fn fn, void *arg, int variant, cudaStream_t s) {
    cudaGraph_t g;
    cudaGraphExec_t ge;
    bu_stream = s;
    BU_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    fn(arg, variant);
    BU_CUDA(cudaStreamEndCapture(s, &g));
    BU_CUDA(cudaGraphInstantiate(&ge, g, 0));
    BU_CUDA(cudaGraphDestroy(g));
    return ge;
}
static inline double bu_time_graph_us(bu_fn fn, void *arg, int variants, int warmup, int reps, double *spread_us) {
    cudaStream_t s;
    bu_graphs gr;
    double med;
    int i;
    gr.ge = (cudaGraphExec_t *)calloc((size_t)variants, sizeof *gr.ge), gr.variants = variants;
    BU_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    for (i = 0; i < variants; i++) {
        gr.ge[i] = bu_graph_capture(fn, arg, i, s);
        BU_CUDA(cudaGraphUpload(gr.ge[i], s));
        BU_CUDA(cudaGraphLaunch(gr.ge[i], s));
    }
    med = bu_time_us(bu_graph_replay, &gr, warmup, reps, spread_us);
    bu_stream = 0;
    for (i = 0; i < variants; i++) BU_CUDA(cudaGraphExecDestroy(gr.ge[i]));
    free(gr.ge);
    BU_CUDA(cudaStreamDestroy(s));
    return med;
}

/* --trace FILE: the CSV opened with its header line, and desc set for trace
   builds (1 << 20 record slots); NULL (after a message) if it cannot be written. */
static inline FILE *bu_trace_open(const char *path, const char *first_column, oscar_desc *desc) {
    FILE *f = fopen(path, "w");
    if (!f) {
        printf("--trace: cannot write %s\n", path);
        return NULL;
    }
    fprintf(f, "%s,kernel,mark,cta,sm,us\n", first_column);
    desc->trace_records = 1 << 20;
    return f;
}

/* The kernel trace of one CUDA-graph replay of fn(arg, 0) (a context set up
   with desc.trace_records > 0; oscar.h, "Kernel trace"): the step is
   captured, replayed twice untraced-for (warm), then once between a trace
   reset and a read. Prints, per kernel and mark, the CTAs that made it and
   the min / median / max time in us from the replay's first mark; appends
   every record to csv (label, kernel, mark, cta, sm, us) when csv is set. */
static inline void bu_trace_graph(oscar_ctx *ctx, bu_fn fn, void *arg, const char *label, FILE *csv) {
    enum { CAP = 1 << 20 };
    oscar_trace_record *rec = (oscar_trace_record *)malloc(sizeof(oscar_trace_record) * CAP);
    double *t = (double *)malloc(sizeof(double) * CAP);
    cudaStream_t s;
    cudaGraphExec_t ge;
    uint64_t t0 = UINT64_MAX;
    int32_t count = 0, dropped = 0, n, i, k, m;
    BU_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    ge = bu_graph_capture(fn, arg, 0, s);
    BU_CUDA(cudaGraphLaunch(ge, s));
    BU_CUDA(cudaGraphLaunch(ge, s));
    BU_OK(ctx, oscar_trace_reset(ctx, s));
    BU_CUDA(cudaGraphLaunch(ge, s));
    BU_CUDA(cudaStreamSynchronize(s));
    BU_OK(ctx, oscar_trace_read(ctx, rec, CAP, &count, &dropped));
    n = count < CAP ? count : CAP;
    if (count > CAP || dropped) printf("trace %s: %d marks, %d kept, %d dropped (CTAs beyond the slots)\n", label, count, n, dropped);
    for (i = 0; i < n; i++)
        if (rec[i].time_ns < t0) t0 = rec[i].time_ns;
    printf("trace %s (one graph replay; us from its first mark; CTAs: min / median / max)\n", label);
    for (k = 1; k < OSCAR__TRACE_KERNEL_COUNT; k++)
        for (m = 0; m < OSCAR__TRACE_MARK_COUNT; m++) {
            int c = 0;
            for (i = 0; i < n; i++)
                if (rec[i].kernel == k && rec[i].mark == m) t[c++] = (double)(rec[i].time_ns - t0) * 1e-3;
            if (!c) continue;
            qsort(t, (size_t)c, sizeof(double), bu_cmp_double);
            printf("  %-18s %-9s %6d  %8.2f %8.2f %8.2f\n", oscar_trace_kernel_name(k), oscar_trace_mark_name(m), c, t[0],
                   t[c / 2], t[c - 1]);
        }
    if (csv)
        for (i = 0; i < n; i++)
            fprintf(csv, "%s,%s,%s,%u,%u,%.3f\n", label, oscar_trace_kernel_name(rec[i].kernel),
                    oscar_trace_mark_name(rec[i].mark), rec[i].cta, (unsigned)rec[i].sm,
                    (double)(rec[i].time_ns - t0) * 1e-3);
    bu_stream = 0;
    BU_CUDA(cudaGraphExecDestroy(ge));
    BU_CUDA(cudaStreamDestroy(s));
    free(rec), free(t);
}

/* Device copy bandwidth in TB/s counting bytes read plus bytes written, from
   a device-to-device copy of `bytes` (default 1 GiB), median of 20. */
typedef struct bu_copy_arg {
    void *src, *dst;
    size_t bytes;
} bu_copy_arg;
static inline void bu_copy_fn(void *arg, int rep) {
    bu_copy_arg *c = (bu_copy_arg *)arg;
    (void)rep;
    BU_CUDA(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDeviceToDevice, 0));
}
static inline double bu_copy_bandwidth_tbps(size_t bytes) {
    bu_copy_arg c;
    double us;
    c.bytes = bytes ? bytes : ((size_t)1 << 30);
    BU_CUDA(cudaMalloc(&c.src, c.bytes));
    BU_CUDA(cudaMalloc(&c.dst, c.bytes));
    BU_CUDA(cudaMemset(c.src, 1, c.bytes));
    us = bu_time_us(bu_copy_fn, &c, 3, 20, NULL);
    BU_CUDA(cudaFree(c.src));
    BU_CUDA(cudaFree(c.dst));
    return 2.0 * (double)c.bytes / (us * 1e-6) / 1e12;
}

/* ---- result files ---------------------------------------------------------- */
typedef struct bu_report {
    char name[64];
    char gpu[256];
    char date[32];
    char commit[64];
    char command[512];
    double copy_tbps;
    FILE *md, *json;
    int rows;
} bu_report;

static inline void bu_report_open(bu_report *r, const char *name, int argc, char **argv, const char *dir) {
    char path[512];
    struct cudaDeviceProp prop;
    time_t now = time(NULL);
    const char *commit = getenv("OSCAR_COMMIT");
    int i;
    size_t len = 0;
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) snprintf(r->gpu, sizeof r->gpu, "%s", prop.name);
    strftime(r->date, sizeof r->date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    snprintf(r->commit, sizeof r->commit, "%s", commit && commit[0] ? commit : "unknown");
    for (i = 0; i < argc && len + 2 < sizeof r->command; i++) {
        int k = snprintf(r->command + len, sizeof r->command - len, "%s%s", i ? " " : "", argv[i]);
        if (k > 0) len += (size_t)k;
    }
    snprintf(path, sizeof path, "%s/%s.md", dir, name);
    r->md = fopen(path, "w");
    snprintf(path, sizeof path, "%s/%s.json", dir, name);
    r->json = fopen(path, "w");
    if (!r->md || !r->json) {
        fprintf(stderr, "cannot write results under %s\n", dir);
        exit(1);
    }
}

/* Writes the headers once the copy bandwidth is known. `columns` is the
   markdown header row, e.g. "| shape | time (us) | ... |". */
static inline void bu_report_begin(bu_report *r, double copy_tbps, const char *columns, const char *notes) {
    int i, ncol = 0;
    r->copy_tbps = copy_tbps;
    fprintf(r->md, "# %s\n\n- GPU: %s\n- date: %s\n- commit: %s\n- command: `%s`\n- copy bandwidth (read+write, "
                   "measured in this run): %.3f TB/s\n",
            r->name, r->gpu, r->date, r->commit, r->command, copy_tbps);
    if (notes && notes[0]) fprintf(r->md, "\n%s\n", notes);
    fprintf(r->md, "\n%s\n", columns);
    for (i = 0; columns[i]; i++) ncol += columns[i] == '|';
    for (i = 0; i < ncol - 1; i++) fprintf(r->md, "|---");
    fprintf(r->md, "|\n");
    fprintf(r->json,
            "{\n  \"bench\": \"%s\",\n  \"gpu\": \"%s\",\n  \"date\": \"%s\",\n  \"commit\": \"%s\",\n  \"command\": "
            "\"%s\",\n  \"copy_bandwidth_tbps\": %.4f,\n  \"rows\": [\n",
            r->name, r->gpu, r->date, r->commit, r->command, copy_tbps);
}

/* One row: the markdown line and the JSON object (both given by the caller). */
static inline void bu_report_row(bu_report *r, const char *md_line, const char *json_object) {
    fprintf(r->md, "%s\n", md_line);
    fprintf(r->json, "%s    %s", r->rows ? ",\n" : "", json_object);
    r->rows++;
}

static inline void bu_report_close(bu_report *r) {
    fprintf(r->json, "\n  ]\n}\n");
    fclose(r->md);
    fclose(r->json);
}

#endif
