/* bench/bench_multi_gpu.c -- the decode benchmark on every visible GPU at
   once, as an engine with one process and one thread + oscar context per
   device runs it (tensor-parallel ranks each decoding their slice of heads).
   Per shape and GPU: the step time with the GPU alone (the others idle), the
   step time with every GPU running at the same moment, its throughput
   (TB/s over the bytes one step must move, counted as bench_decode counts
   them) and its fraction of that GPU's measured copy bandwidth; and the
   aggregate: the sum of the per-GPU throughputs, and a wall-clock burst (every
   GPU runs N steps back to back; total bytes / time from the common start to
   the last GPU's end). Writes bench/results/multi_gpu.md and .json.
     usage: bench_multi_gpu [--quick] [--shape B:CTX:D] [--reps N] [--burst N] [--gpus N] [--out DIR]
   Without a GPU it says so and exits 0. Each GPU decodes its own full problem
   (32 query / 8 KV heads): the per-GPU work of a tensor-parallel rank with 8
   KV heads, and no communication is timed (oscar has none; an engine's
   all-gather of o is its own). */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "bench_util.h"
#include "bench_decode_setup.h"

#include <pthread.h>

#define MAX_GPUS 16

typedef struct gpu_result {
    double alone_us, together_us, spread_us, burst_s0, burst_s1;
    int int2_splits, window_splits;
    size_t nonfinite;
} gpu_result;

typedef struct bench {
    int ngpu, reps, warmup, burst;
    const bds_shape *shapes;
    int nshapes;
    oscar_ctx *ctx[MAX_GPUS];
    char name[MAX_GPUS][256];
    double copy_tbps[MAX_GPUS];
    double bytes[64];                   /* per shape: bytes one step moves (the same on every GPU) */
    gpu_result res[64][MAX_GPUS];       /* [shape][gpu] */
    pthread_barrier_t bar;
} bench;

typedef struct gpu_thread {
    bench *b;
    int g;
} gpu_thread;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void step_fn(void *arg, int rep) { bds_decode_step((bds_decode *)arg, rep); }

static void *gpu_main(void *arg) {
    gpu_thread *t = (gpu_thread *)arg;
    bench *b = t->b;
    int g = t->g, si, k, i;
    BU_CUDA(cudaSetDevice(g));
    for (si = 0; si < b->nshapes; si++) {
        gpu_result *r = &b->res[si][g];
        bds_decode p;
        bds_decode_setup(&p, b->ctx[g], b->shapes[si], OSCAR_KV_LAYOUT_HND, 16, 0x9E3779B97F4A7C15ULL * (uint64_t)(g + 1));
        if (g == 0) b->bytes[si] = p.bytes;
        r->int2_splits = p.plan.int2_splits, r->window_splits = p.plan.window_splits;
        BU_CUDA(cudaDeviceSynchronize());
        /* alone: one GPU at a time, the others wait at the barrier */
        for (k = 0; k < b->ngpu; k++) {
            pthread_barrier_wait(&b->bar);
            if (k == g) r->alone_us = bu_time_us(step_fn, &p, b->warmup, b->reps, NULL);
        }
        /* together: every GPU times its steps at the same moment */
        pthread_barrier_wait(&b->bar);
        r->together_us = bu_time_us(step_fn, &p, b->warmup, b->reps, &r->spread_us);
        /* burst: back-to-back steps from a common start, wall clock */
        pthread_barrier_wait(&b->bar);
        r->burst_s0 = now_s();
        for (i = 0; i < b->burst; i++) bds_decode_step(&p, i);
        BU_CUDA(cudaDeviceSynchronize());
        r->burst_s1 = now_s();
        r->nonfinite = bds_decode_nonfinite(&p);
        bds_decode_free(&p);
        pthread_barrier_wait(&b->bar);
    }
    return NULL;
}

int main(int argc, char **argv) {
    static const bds_shape full[] = {{8, 32768, 128}, {32, 32768, 128}, {1, 131072, 128}, {128, 4096, 128}};
    static const bds_shape quick[] = {{8, 32768, 128}};
    static bench b; /* large: [shape][gpu] results */
    const char *out_dir = OSCAR_RESULTS_DIR;
    bds_shape one;
    int i, g, si, visible = 0, want = 0;
    pthread_t th[MAX_GPUS];
    gpu_thread args[MAX_GPUS];
    bu_report rep;
    char md[1024], js[2048], notes[2048];
    cudaError_t ce;
    size_t nl = 0;
    memset(&b, 0, sizeof b);
    b.shapes = full, b.nshapes = (int)(sizeof full / sizeof full[0]);
    b.reps = 30, b.warmup = 5, b.burst = 200;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) b.shapes = quick, b.nshapes = 1;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_dir = argv[++i];
        else if (!strcmp(argv[i], "--gpus") && i + 1 < argc) want = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--burst") && i + 1 < argc) {
            b.burst = atoi(argv[++i]);
            if (b.burst < 1) b.burst = 1;
        } else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            b.reps = atoi(argv[++i]);
            if (b.reps < 1) b.reps = 1;
            b.warmup = b.reps < 5 ? 0 : 5;
        } else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            if (!bds_parse_shape(argv[++i], &one)) return 2;
            b.shapes = &one, b.nshapes = 1;
        } else {
            printf("usage: bench_multi_gpu [--quick] [--shape B:CTX:D] [--reps N] [--burst N] [--gpus N] [--out DIR]\n");
            return 2;
        }
    }
    ce = cudaGetDeviceCount(&visible);
    if (ce != cudaSuccess || visible < 1) {
        printf("bench_multi_gpu: no CUDA GPU is visible (%s); nothing to measure.\n",
               ce != cudaSuccess ? cudaGetErrorString(ce) : "0 devices");
        return 0;
    }
    b.ngpu = visible < MAX_GPUS ? visible : MAX_GPUS;
    if (want > 0 && want < b.ngpu) b.ngpu = want;
    /* one context per device, set up here; each is then used by its device's thread */
    for (g = 0; g < b.ngpu; g++) {
        oscar_desc desc = {0};
        struct cudaDeviceProp prop;
        desc.device_ordinal = g;
        if (oscar_setup(&desc, &b.ctx[g]) != OSCAR_OK) {
            printf("bench_multi_gpu: no usable CUDA device %d: %s\n", g, oscar_last_error(NULL));
            return g == 0 ? 0 : 1;
        }
        BU_CUDA(cudaSetDevice(g));
        BU_CUDA(cudaGetDeviceProperties(&prop, g));
        snprintf(b.name[g], sizeof b.name[g], "%s", prop.name);
        b.copy_tbps[g] = bu_copy_bandwidth_tbps(0);
        printf("GPU %d: %s, copy bandwidth %.3f TB/s\n", g, b.name[g], b.copy_tbps[g]);
    }
    printf("%d GPU%s in use (%d visible)%s\n", b.ngpu, b.ngpu > 1 ? "s" : "", visible,
           b.ngpu == 1 ? ": only 1 GPU, so 'together' is that GPU alone and the aggregate is that GPU" : "");
    BU_CUDA(cudaSetDevice(0));
    pthread_barrier_init(&b.bar, NULL, (unsigned)b.ngpu);
    for (g = 0; g < b.ngpu; g++) {
        args[g].b = &b, args[g].g = g;
        if (pthread_create(&th[g], NULL, gpu_main, &args[g]) != 0) {
            printf("bench_multi_gpu: pthread_create failed for GPU %d\n", g);
            return 1;
        }
    }
    for (g = 0; g < b.ngpu; g++) pthread_join(th[g], NULL);
    pthread_barrier_destroy(&b.bar);

    for (g = 0; g < b.ngpu && nl + 64 < sizeof notes; g++) {
        int k = snprintf(notes + nl, sizeof notes - nl, "%sGPU %d: %s (copy %.3f TB/s)", g ? "; " : "", g, b.name[g], b.copy_tbps[g]);
        if (k > 0) nl += (size_t)k;
    }
    snprintf(notes + nl, sizeof notes - nl,
             ".\n\n%d GPU%s, one thread and one oscar context per GPU, all in one process. Each GPU decodes its own "
             "problem: 32 query / 8 KV heads (the per-GPU work of a tensor-parallel rank holding 8 KV heads), INT2 "
             "history (pages of 16, HND, f16 scale+min) + 320 bf16 window tokens, R_k and R_v applied, as "
             "bench_decode. alone = that GPU timed while the others wait; together = every GPU timed at the same "
             "moment (median of %d CUDA-event timings each after %d warm-up steps). TB/s = bytes one step moves "
             "(INT2 codes + scales, window K/V, q, page ids read, o written) / time. Aggregate: Σ of the per-GPU "
             "'together' throughputs, and a burst of %d back-to-back steps on every GPU from a common start "
             "(total bytes / wall time to the last GPU's end). No communication is timed.",
             b.ngpu, b.ngpu > 1 ? "s" : "", b.reps, b.warmup, b.burst);
    bu_report_open(&rep, "multi_gpu", argc, argv, out_dir);
    bu_report_begin(&rep, b.copy_tbps[0],
                    "| batch x context | D | GPU | alone (us) | together (us) | together / alone | TB/s (together) | of "
                    "its copy BW | splits |",
                    notes);
    printf("%-14s %4s %-10s %10s %12s %8s %9s %8s\n", "shape", "D", "GPU", "alone us", "together us", "ratio", "TB/s", "of copy");
    for (si = 0; si < b.nshapes; si++) {
        const bds_shape *S = &b.shapes[si];
        double sum_tbps = 0, sum_alone_tbps = 0, s0 = 1e300, s1 = 0, burst_tbps, worst_us = 0;
        size_t bad = 0;
        for (g = 0; g < b.ngpu; g++) {
            const gpu_result *r = &b.res[si][g];
            double tbps = b.bytes[si] / (r->together_us * 1e-6) / 1e12;
            sum_tbps += tbps, sum_alone_tbps += b.bytes[si] / (r->alone_us * 1e-6) / 1e12;
            s0 = r->burst_s0 < s0 ? r->burst_s0 : s0, s1 = r->burst_s1 > s1 ? r->burst_s1 : s1;
            worst_us = r->together_us > worst_us ? r->together_us : worst_us;
            bad += r->nonfinite;
            printf("%5d x %-7lld %4d GPU %-6d %10.1f %12.1f %8.3f %9.3f %7.1f%%\n", S->B, (long long)S->ctx, S->D, g,
                   r->alone_us, r->together_us, r->together_us / r->alone_us, tbps, 100 * tbps / b.copy_tbps[g]);
            snprintf(md, sizeof md, "| %d x %lld | %d | %d (%s) | %.1f | %.1f (spread %.1f) | %.3f | %.3f | %.1f%% | %d + %d |",
                     S->B, (long long)S->ctx, S->D, g, b.name[g], r->alone_us, r->together_us, r->spread_us,
                     r->together_us / r->alone_us, tbps, 100 * tbps / b.copy_tbps[g], r->int2_splits, r->window_splits);
            snprintf(js, sizeof js,
                     "{\"batch\": %d, \"context\": %lld, \"head_dim\": %d, \"q_heads\": 32, \"kv_heads\": 8, \"gpu\": %d, "
                     "\"gpu_name\": \"%s\", \"bytes\": %.0f, \"alone_us\": %.2f, \"together_us\": %.2f, \"spread_us\": %.2f, "
                     "\"tbps\": %.4f, \"copy_tbps\": %.4f, \"frac_copy_bw\": %.4f, \"int2_splits\": %d, \"window_splits\": %d}",
                     S->B, (long long)S->ctx, S->D, g, b.name[g], b.bytes[si], r->alone_us, r->together_us, r->spread_us, tbps,
                     b.copy_tbps[g], tbps / b.copy_tbps[g], r->int2_splits, r->window_splits);
            bu_report_row(&rep, md, js);
        }
        burst_tbps = b.bytes[si] * (double)b.burst * b.ngpu / (s1 - s0) / 1e12;
        printf("%5d x %-7lld %4d all %-6d %10s %12.1f %8.3f %9.3f  (burst %.3f TB/s over %d GPU%s)\n", S->B, (long long)S->ctx,
               S->D, b.ngpu, "", worst_us, sum_tbps / sum_alone_tbps, sum_tbps, burst_tbps, b.ngpu, b.ngpu > 1 ? "s" : "");
        snprintf(md, sizeof md,
                 "| %d x %lld | %d | **all %d** | Σ %.3f TB/s alone | slowest %.1f | %.3f | **Σ %.3f** (burst %.3f) | %d GPU%s | |",
                 S->B, (long long)S->ctx, S->D, b.ngpu, sum_alone_tbps, worst_us, sum_tbps / sum_alone_tbps, sum_tbps,
                 burst_tbps, b.ngpu, b.ngpu > 1 ? "s" : "");
        snprintf(js, sizeof js,
                 "{\"batch\": %d, \"context\": %lld, \"head_dim\": %d, \"gpu\": \"all\", \"num_gpus\": %d, \"bytes_per_gpu\": %.0f, "
                 "\"sum_tbps_together\": %.4f, \"sum_tbps_alone\": %.4f, \"burst_steps\": %d, \"burst_wall_s\": %.6f, "
                 "\"burst_tbps\": %.4f, \"slowest_together_us\": %.2f}",
                 S->B, (long long)S->ctx, S->D, b.ngpu, b.bytes[si], sum_tbps, sum_alone_tbps, b.burst, s1 - s0, burst_tbps,
                 worst_us);
        bu_report_row(&rep, md, js);
        if (bad) printf("warning: %zu non-finite outputs for shape %d x %lld\n", bad, S->B, (long long)S->ctx);
    }
    bu_report_close(&rep);
    for (g = 0; g < b.ngpu; g++) {
        oscar_jit_stats s;
        oscar_query_jit_stats(b.ctx[g], &s);
        printf("GPU %d JIT: %lld compiled (%.0f ms), %lld disk hits\n", g, (long long)s.compiles, s.compile_ms,
               (long long)s.disk_hits);
        oscar_shutdown(b.ctx[g]);
    }
    printf("wrote %s/multi_gpu.md and .json\n", out_dir);
    return 0;
}
