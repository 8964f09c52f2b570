/* bench/bench_decode.c -- one decode step of attention on the GPU, per shape:
   oscar's INT2 decode (INT2 history + 320 bf16 window tokens, merged), the
   read floor of its bytes (a kernel that only reads them with 16-byte
   loads), oscar's BF16 decode over all tokens, and the copy bandwidth.
   Inputs rotate among enough copies that the working set exceeds the L2.
   Prints a table and writes bench/results/decode.md and .json.
     usage: bench_decode [--quick] [--shape B:CTX:D] [--reps N] [--out DIR]
                         [--int2-layout nhd|hnd] [--page N] [--v-absorbed]
                         [--splits INT2:WINDOW] [--q-heads N] [--warps N] [--group N]
     --shape runs one shape (e.g. under a profiler: --shape 32:32768:128 --reps 1).
     --v-absorbed: V's rotation folded into the model's weights (v_rotation =
     NULL: the merge applies no R_v^T), as with quantize's V-absorbed mode;
     writes decode_v_absorbed.md / .json instead.
     --q-heads N: N query heads over the 8 KV heads (32 by default); other
     counts write decode_qN.md / .json (decode_v_absorbed_qN with it).
     --warps N: force the INT2 kernel's warps per CTA (4, 12 or 16).
     --group N: scale groups of N dims (32, 64, 128 or 256; the head dim
     where that is smaller; default the head dim); writes decode[...]_gN.
     --splits: force the split counts (0: the plan's, from the tuning table or
     the heuristic), e.g. to try counts the tuner's candidates lack.
     --trace FILE: kernel trace builds (oscar.h, "Kernel trace"); after each
     shape's timings, one graph replay of the oscar step is traced: a per-
     kernel, per-mark summary is printed and every CTA's marks appended to
     FILE (CSV). The timings are then the trace build's, so the report is
     written as decode_trace[...] instead. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "bench_util.h"
#include "bench_decode_setup.h"

#include <math.h>

/* one random stream for the whole run (the page order it makes is the same
   run to run); the fill and table helpers are shared with bench_multi_gpu */
static bds_rng rng = {88172645463325252ULL};
typedef bds_shape shape;

typedef struct dset { /* one copy of everything a step reads */
    void *kc, *vc, *ks, *vs, *wk, *wv, *q;
} dset;

typedef struct run_arg {
    oscar_ctx *ctx;
    oscar_decode_plan_info *plan;
    oscar_decode_run_desc *rd;
    oscar_int2_pool_desc *pool;
    oscar_window_pool_desc *win;
    dset *sets;
    int nsets;
    /* read floor */
    const void *ptrs[8];
    size_t bytes[8];
    int nptr;
    void *sink;
} run_arg;

static void run_decode(void *arg, int rep) {
    run_arg *a = (run_arg *)arg;
    dset *s = &a->sets[rep % a->nsets];
    a->pool->k_codes = s->kc, a->pool->v_codes = s->vc, a->pool->k_scales = s->ks, a->pool->v_scales = s->vs;
    a->win->k = s->wk, a->win->v = s->wv;
    a->rd->q = s->q;
    BU_OK(a->ctx, oscar_decode_run(a->ctx, a->plan, a->rd, (oscar_stream)bu_stream));
}
static void run_floor(void *arg, int rep) {
    run_arg *a = (run_arg *)arg;
    dset *s = &a->sets[rep % a->nsets];
    const void *p[8];
    int i;
    for (i = 0; i < a->nptr; i++) p[i] = a->ptrs[i];
    /* the same buffers as the decode reads, in this copy */
    p[0] = s->kc, p[1] = s->vc, p[2] = s->ks, p[3] = s->vs, p[4] = s->wk, p[5] = s->wv, p[6] = s->q;
    BU_OK(a->ctx, oscar__probe_read(a->ctx, p, a->bytes, a->nptr, a->sink, (oscar_stream)bu_stream));
}

int main(int argc, char **argv) {
    /* the shapes, then two long-context batches beyond them (4 x 64K,
       16 x 128K: where the plan takes 16-warp INT2 CTAs), then head dims 64 and 256 */
    static const shape full[] = {{1, 8192, 128},   {1, 32768, 128}, {1, 131072, 128}, {8, 32768, 128},
                                 {32, 8192, 128},  {32, 32768, 128}, {128, 4096, 128}, {4, 65536, 128},
                                 {16, 131072, 128}, {8, 32768, 64},   {8, 32768, 256}};
    static const shape quick[] = {{1, 32768, 128}, {8, 32768, 128}};
    const shape *shapes = full;
    int nshapes = (int)(sizeof full / sizeof full[0]);
    const char *out_dir = OSCAR_RESULTS_DIR;
    oscar_kv_layout int2_layout = OSCAR_KV_LAYOUT_HND;
    int int2_ps = 16;
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    bu_report rep;
    char md[1024], js[2048], wshort[16], wlong[32];
    int si, i, reps = 30, warmup = 5, q_heads = 32, group = 0;
    char about[2048], gdesc[64];
    shape one;
    int v_absorbed = 0, force_int2 = 0, force_win = 0, force_warps = 0;
    FILE *trace_csv = NULL;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) shapes = quick, nshapes = 2;
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_dir = argv[++i];
        else if (!strcmp(argv[i], "--int2-layout") && i + 1 < argc)
            int2_layout = !strcmp(argv[++i], "nhd") ? OSCAR_KV_LAYOUT_NHD : OSCAR_KV_LAYOUT_HND;
        else if (!strcmp(argv[i], "--page") && i + 1 < argc) int2_ps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--v-absorbed")) v_absorbed = 1;
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
            if (!(trace_csv = bu_trace_open(argv[++i], "shape", &desc))) return 2;
        }
        else if (!strcmp(argv[i], "--splits") && i + 1 < argc) {
            if (sscanf(argv[++i], "%d:%d", &force_int2, &force_win) != 2) {
                printf("--splits wants INT2:WINDOW split counts (0 = the plan's), got %s\n", argv[i]);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--warps") && i + 1 < argc) {
            force_warps = atoi(argv[++i]); /* warps per INT2 CTA; 0 = the plan's */
            if (force_warps != 0 && force_warps != 4 && force_warps != 12 && force_warps != 16) {
                printf("--warps wants 0 (the plan's), 4, 12 or 16 warps per INT2 CTA, got %d\n", force_warps);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--q-heads") && i + 1 < argc) {
            q_heads = atoi(argv[++i]); /* GQA ratio q_heads / 8 */
            if (q_heads < 8 || q_heads > 128 || q_heads % 8) {
                printf("--q-heads wants a multiple of 8 in [8, 128] (8 KV heads, group ratios 1-16), got %d\n", q_heads);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--group") && i + 1 < argc) {
            group = atoi(argv[++i]); /* scale group size; 0 = the head dim (capped at it per shape) */
            if (group != 0 && group != 32 && group != 64 && group != 128 && group != 256) {
                printf("--group wants 0 (the head dim), 32, 64, 128 or 256, got %d\n", group);
                return 2;
            }
        }
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1) reps = 1;
            warmup = reps < 5 ? 0 : 5;
        } else if (!strcmp(argv[i], "--shape") && i + 1 < argc) {
            if (!bds_parse_shape(argv[++i], &one)) return 2;
            shapes = &one, nshapes = 1;
        }
    }
    if (oscar_setup(&desc, &ctx) != OSCAR_OK) {
        printf("bench_decode needs a CUDA GPU: %s\n", oscar_last_error(NULL));
        return 0;
    }
    { /* decode[_v_absorbed][_q<heads>][_g<group>].md / .json: the defaults keep the name */
        char name[64];
        snprintf(name, sizeof name, "%s%s", v_absorbed ? "decode_v_absorbed" : "decode", trace_csv ? "_trace" : "");
        if (q_heads != 32) snprintf(name + strlen(name), sizeof name - strlen(name), "_q%d", q_heads);
        if (group) snprintf(name + strlen(name), sizeof name - strlen(name), "_g%d", group);
        bu_report_open(&rep, name, argc, argv, out_dir);
    }
    snprintf(gdesc, sizeof gdesc, group ? "%d (the head dim where that is smaller)" : "head dim", group);
    snprintf(about, sizeof about,
             "%d query / 8 KV heads, group = %s, f16 scale+min, INT2 pages of 16 tokens; each request has 64 sink + "
        "256 recent tokens in the engine's bf16 cache (NHD, pages of 16) and the rest in INT2; %s. Bytes = INT2 codes + scales + window "
        "K/V + q + page tables read, o written. Read floor = a kernel that only reads those bytes (16-byte loads). "
        "BF16 decode = oscar's bf16 paged decode kernel over all tokens (same pages, no rotation). Medians of 30 "
        "CUDA-event timings after warm-up, inputs rotating over copies larger than the L2. Direct = one oscar_decode_run "
        "(or probe / BF16 run) per timing, host launch work included; graph = the same step captured once per input "
        "copy into a CUDA graph and replayed, as engines run decode steps (no host work between the kernels).",
             q_heads, gdesc,
             v_absorbed ? "R_k applied (q rotated in the kernel), V's rotation absorbed into the model's weights "
                          "(v_rotation = NULL: no R_v^T in the merge)"
                        : "R_k and R_v applied (q rotated in the kernel, the INT2 output brought back with R_v^T)");
    bu_report_begin(&rep, bu_copy_bandwidth_tbps(0),
                    "| batch x context | D | INT2 tokens/req | oscar INT2 decode (us) | bytes | TB/s | of copy BW | read "
                    "floor (us) | / floor | BF16 decode (us) | speed-up vs BF16 | graph: oscar (us) | graph: read floor (us) | "
                    "graph: / floor | graph: BF16 (us) | graph: speed-up | splits |",
                    about);
    printf("copy bandwidth %.3f TB/s\n", rep.copy_tbps);
    printf("%-12s %4s %10s %10s %8s %7s %10s %7s %10s %8s | %-5s %6s %6s %6s %7s %7s\n", "shape", "D", "oscar us", "TB/s",
           "of copy", "floor us", "/floor", "bf16 us", "speedup", "splits", "graph", "oscar", "floor", "/floor", "bf16",
           "speedup");
    for (si = 0; si < nshapes; si++) {
        const shape *S = &shapes[si];
        const int Hq = q_heads, Hkv = 8, D = S->D, wps = 16;
        const int64_t W = S->ctx < 320 ? S->ctx : 320, L = S->ctx - W;
        int32_t *d_ip, *d_idx, *d_last, *d_wip, *d_widx, *d_wlast, int2_pages, win_pages;
        oscar_int2_pool_desc pool = {0};
        oscar_window_pool_desc win = {0};
        oscar_decode_plan_desc pd = {0};
        oscar_decode_plan_info plan, plan_bf16;
        oscar_decode_run_desc rd = {0};
        size_t code_bytes, scale_bytes, win_bytes, q_bytes, set_bytes, ws_bytes;
        dset *sets;
        int nsets, k;
        void *ws, *o, *rk, *rv, *sink;
        run_arg a;
        double us, spread, floor_us, bf16_us = 0, bytes, tbps, g_us, g_spread, g_floor_us, g_bf16_us = 0;
        bds_tables(&rng, S->B, L, int2_ps, &d_ip, &d_idx, &d_last, &int2_pages);
        bds_tables(&rng, S->B, W, wps, &d_wip, &d_widx, &d_wlast, &win_pages);
        pool.head_dim = D, pool.num_kv_heads = Hkv, pool.num_pages = int2_pages, pool.page_size = int2_ps;
        pool.group_size = group && group < D ? group : D;
        pool.layout = int2_layout;
        BU_OK(ctx, oscar_int2_pool_bytes(ctx, &pool, &code_bytes, &scale_bytes));
        win.num_pages = win_pages, win.page_size = wps;
        win_bytes = (size_t)win_pages * wps * Hkv * D * 2;
        q_bytes = (size_t)S->B * Hq * D * 2;
        set_bytes = 2 * code_bytes + 2 * scale_bytes + 2 * win_bytes + q_bytes;
        nsets = (int)((256u << 20) / set_bytes) + 1;
        if (nsets > 48) nsets = 48;
        sets = calloc((size_t)nsets, sizeof *sets);
        for (k = 0; k < nsets; k++) {
            sets[k].kc = bds_dev_fill(&rng, code_bytes, 0), sets[k].vc = bds_dev_fill(&rng, code_bytes, 0);
            sets[k].ks = bds_dev_fill(&rng, scale_bytes, 2), sets[k].vs = bds_dev_fill(&rng, scale_bytes, 2);
            sets[k].wk = bds_dev_fill(&rng, win_bytes, 1), sets[k].wv = bds_dev_fill(&rng, win_bytes, 1);
            sets[k].q = bds_dev_fill(&rng, q_bytes, 1);
        }
        {
            float *R = malloc(sizeof(float) * (size_t)D * D);
            int x, y;
            for (x = 0; x < D; x++)
                for (y = 0; y < D; y++) R[x * D + y] = (__builtin_popcount((unsigned)(x & y)) & 1 ? -1.0f : 1.0f) / sqrtf((float)D);
            BU_CUDA(cudaMalloc(&rk, sizeof(float) * (size_t)D * D));
            BU_CUDA(cudaMalloc(&rv, sizeof(float) * (size_t)D * D));
            BU_CUDA(cudaMemcpy(rk, R, sizeof(float) * (size_t)D * D, cudaMemcpyHostToDevice));
            BU_CUDA(cudaMemcpy(rv, R, sizeof(float) * (size_t)D * D, cudaMemcpyHostToDevice));
            free(R);
        }
        pd.num_q_heads = Hq, pd.int2_pool = &pool, pd.window_pool = &win, pd.batch_size = S->B;
        pd.max_int2_tokens = L, pd.max_window_tokens = (int32_t)W;
        pd.int2_splits = force_int2, pd.window_splits = force_win, pd.int2_warps = force_warps;
        BU_OK(ctx, oscar_decode_plan(ctx, &pd, &plan));
        BU_CUDA(cudaMalloc(&ws, plan.workspace_bytes));
        BU_CUDA(cudaMalloc(&o, q_bytes));
        BU_CUDA(cudaMalloc(&sink, 64));
        rd.int2_pool = &pool, rd.window_pool = &win;
        rd.int2_pages.indptr = d_ip, rd.int2_pages.indices = d_idx, rd.int2_pages.last_page_len = d_last;
        rd.window_pages.indptr = d_wip, rd.window_pages.indices = d_widx, rd.window_pages.last_page_len = d_wlast;
        rd.o = o, rd.k_rotation = rk, rd.v_rotation = v_absorbed ? NULL : rv, rd.sm_scale = 1.0f / sqrtf((float)D);
        rd.workspace = ws, rd.workspace_bytes = plan.workspace_bytes;
        memset(&a, 0, sizeof a);
        a.ctx = ctx, a.plan = &plan, a.rd = &rd, a.pool = &pool, a.win = &win, a.sets = sets, a.nsets = nsets;
        us = bu_time_us(run_decode, &a, warmup, reps, &spread);
        g_us = bu_time_graph_us(run_decode, &a, nsets, warmup, reps, &g_spread);
        {
            /* no NaN in the output */
            uint16_t *h = malloc(q_bytes);
            size_t j, bad = 0;
            BU_CUDA(cudaMemcpy(h, o, q_bytes, cudaMemcpyDeviceToHost));
            for (j = 0; j < q_bytes / 2; j++) bad += (h[j] & 0x7F80) == 0x7F80;
            if (bad) printf("warning: %zu non-finite outputs\n", bad);
            free(h);
        }
        /* the bytes a step must read, and the read floor over the same buffers */
        a.nptr = 8;
        a.bytes[0] = a.bytes[1] = (size_t)S->B * (size_t)((L + int2_ps - 1) / int2_ps) * int2_ps * Hkv * (D / 4);
        a.bytes[2] = a.bytes[3] = (size_t)S->B * (size_t)((L + int2_ps - 1) / int2_ps) * int2_ps * Hkv * 4;
        a.bytes[4] = a.bytes[5] = (size_t)S->B * (size_t)((W + wps - 1) / wps) * wps * Hkv * D * 2;
        a.bytes[6] = q_bytes;
        a.ptrs[7] = d_idx, a.bytes[7] = (size_t)(S->B * ((L + int2_ps - 1) / int2_ps)) * 4 + 16;
        if (a.bytes[0] == 0) a.bytes[0] = a.bytes[1] = a.bytes[2] = a.bytes[3] = 16;
        a.sink = sink;
        floor_us = bu_time_us(run_floor, &a, warmup, reps, NULL);
        g_floor_us = bu_time_graph_us(run_floor, &a, nsets, warmup, reps, NULL);
        bytes = (double)(a.bytes[0] + a.bytes[1] + a.bytes[2] + a.bytes[3] + a.bytes[4] + a.bytes[5] + a.bytes[6] +
                         a.bytes[7]) + (double)q_bytes;
        tbps = bytes / (us * 1e-6) / 1e12;
        /* BF16 baseline: every token in a bf16 paged cache */
        {
            int32_t *b_ip, *b_idx, *b_last, bpages;
            oscar_window_pool_desc bw = {0};
            oscar_int2_pool_desc bp = pool;
            oscar_decode_plan_desc bd = {0};
            oscar_decode_run_desc br = rd;
            size_t bbytes;
            int nb, kb;
            dset *bsets;
            run_arg ba;
            bds_tables(&rng, S->B, S->ctx, wps, &b_ip, &b_idx, &b_last, &bpages);
            bw.num_pages = bpages, bw.page_size = wps;
            bbytes = (size_t)bpages * wps * Hkv * D * 2;
            nb = (int)((256u << 20) / (2 * bbytes)) + 1;
            if (nb > 16) nb = 16;
            bsets = calloc((size_t)nb, sizeof *bsets);
            for (kb = 0; kb < nb; kb++) {
                bsets[kb] = sets[kb % nsets];
                bsets[kb].wk = bds_dev_fill(&rng, bbytes, 1), bsets[kb].wv = bds_dev_fill(&rng, bbytes, 1);
            }
            bd.num_q_heads = Hq, bd.int2_pool = &bp, bd.window_pool = &bw, bd.batch_size = S->B;
            bd.max_int2_tokens = 0, bd.max_window_tokens = (int32_t)S->ctx;
            BU_OK(ctx, oscar_decode_plan(ctx, &bd, &plan_bf16));
            ws_bytes = plan_bf16.workspace_bytes;
            {
                void *bws;
                BU_CUDA(cudaMalloc(&bws, ws_bytes));
                br.window_pool = &bw;
                br.window_pages.indptr = b_ip, br.window_pages.indices = b_idx, br.window_pages.last_page_len = b_last;
                br.k_rotation = br.v_rotation = NULL;
                br.workspace = bws, br.workspace_bytes = ws_bytes;
                memset(&ba, 0, sizeof ba);
                ba.ctx = ctx, ba.plan = &plan_bf16, ba.rd = &br, ba.pool = &bp, ba.win = &bw, ba.sets = bsets, ba.nsets = nb;
                bf16_us = bu_time_us(run_decode, &ba, warmup, reps, NULL);
                g_bf16_us = bu_time_graph_us(run_decode, &ba, nb, warmup, reps, NULL);
                cudaFree(bws);
            }
            for (kb = 0; kb < nb; kb++) cudaFree(bsets[kb].wk), cudaFree(bsets[kb].wv);
            free(bsets);
            cudaFree(b_ip), cudaFree(b_idx), cudaFree(b_last);
        }
        /* the INT2 CTA's warps where not the usual 4 */
        wshort[0] = wlong[0] = 0;
        if (plan.int2_warps != 4) {
            snprintf(wshort, sizeof wshort, " w%d", plan.int2_warps);
            snprintf(wlong, sizeof wlong, " (%d-warp INT2 CTAs)", plan.int2_warps);
        }
        printf("%4d x %-6lld %4d %10.1f %10.3f %7.1f%% %8.1f %7.2f %10.1f %7.2fx %3d+%d%s | graph %6.1f %6.1f %6.2f %7.1f "
               "%6.2fx\n",
               S->B, (long long)S->ctx, D, us, tbps, 100 * tbps / rep.copy_tbps, floor_us, us / floor_us, bf16_us,
               bf16_us / us, plan.int2_splits, plan.window_splits, wshort, g_us, g_floor_us,
               g_us / g_floor_us, g_bf16_us, g_bf16_us / g_us);
        snprintf(md, sizeof md,
                 "| %d x %lld | %d | %lld | %.1f (spread %.1f) | %.0f | %.3f | %.1f%% | %.1f | %.2f | %.1f | %.2fx | %.1f "
                 "(spread %.1f) | %.1f | %.2f | %.1f | %.2fx | %d + %d%s |",
                 S->B, (long long)S->ctx, D, (long long)L, us, spread, bytes, tbps, 100 * tbps / rep.copy_tbps, floor_us,
                 us / floor_us, bf16_us, bf16_us / us, g_us, g_spread, g_floor_us, g_us / g_floor_us, g_bf16_us,
                 g_bf16_us / g_us, plan.int2_splits, plan.window_splits, wlong);
        snprintf(js, sizeof js,
                 "{\"batch\": %d, \"context\": %lld, \"head_dim\": %d, \"group_size\": %d, \"q_heads\": %d, \"kv_heads\": 8, \"int2_tokens\": %lld, "
                 "\"window_tokens\": %lld, \"int2_page_size\": %d, \"int2_layout\": \"%s\", \"time_us\": %.2f, \"spread_us\": %.2f, "
                 "\"bytes\": %.0f, \"tbps\": %.4f, \"frac_copy_bw\": %.4f, \"read_floor_us\": %.2f, \"ratio_to_floor\": %.3f, "
                 "\"bf16_time_us\": %.2f, \"speedup_vs_bf16\": %.3f, \"graph_time_us\": %.2f, \"graph_spread_us\": %.2f, "
                 "\"graph_read_floor_us\": %.2f, \"graph_bf16_time_us\": %.2f, \"graph_speedup_vs_bf16\": %.3f, "
                 "\"int2_splits\": %d, \"window_splits\": %d, \"int2_warps\": %d}",
                 S->B, (long long)S->ctx, D, pool.group_size, Hq, (long long)L, (long long)W, int2_ps,
                 int2_layout == OSCAR_KV_LAYOUT_HND ? "HND" : "NHD", us, spread, bytes, tbps, tbps / rep.copy_tbps, floor_us,
                 us / floor_us, bf16_us, bf16_us / us, g_us, g_spread, g_floor_us, g_bf16_us, g_bf16_us / g_us,
                 plan.int2_splits, plan.window_splits, plan.int2_warps);
        bu_report_row(&rep, md, js);
        if (trace_csv) {
            char label[64];
            snprintf(label, sizeof label, "%dx%lld D%d %d+%d", S->B, (long long)S->ctx, D, plan.int2_splits,
                     plan.window_splits);
            bu_trace_graph(ctx, run_decode, &a, label, trace_csv);
        }
        for (k = 0; k < nsets; k++)
            cudaFree(sets[k].kc), cudaFree(sets[k].vc), cudaFree(sets[k].ks), cudaFree(sets[k].vs), cudaFree(sets[k].wk),
                cudaFree(sets[k].wv), cudaFree(sets[k].q);
        free(sets);
        cudaFree(ws), cudaFree(o), cudaFree(rk), cudaFree(rv), cudaFree(sink);
        cudaFree(d_ip), cudaFree(d_idx), cudaFree(d_last), cudaFree(d_wip), cudaFree(d_widx), cudaFree(d_wlast);
    }
    bu_report_close(&rep);
    if (trace_csv) fclose(trace_csv);
    {
        oscar_jit_stats s;
        oscar_query_jit_stats(ctx, &s);
        printf("JIT: %lld compiled (%.0f ms), %lld disk hits\n", (long long)s.compiles, s.compile_ms, (long long)s.disk_hits);
    }
    oscar_shutdown(ctx);
    return 0;
}
