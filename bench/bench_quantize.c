/* bench/bench_quantize.c -- the write path on the GPU: bulk prefill write
   (rotate + clip + INT2 + pack of K and V) and multi-layer demotion latency.
   Prints a table and writes bench/results/quantize.md and .json; rows
   "tile: ..." time every valid tile candidate (rows per warp step x warps
   per CTA) of a case, the heuristic's choice being the case's own row.
     usage: bench_quantize [--tokens N] [--out DIR] [--prefill-only] [--no-tiles]
                           [--variants 0,2,3] [--warmup N] [--reps N] [--identity-rotation]
       --prefill-only  skip the demotion cases; --no-tiles  skip the tile sweeps;
       --variants      only these prefill variants (index into the table below);
       --warmup/--reps untimed and timed launches per prefill case (3, 20): with
                       --warmup 0 --reps 1 each variant launches once (profilers);
       --identity-rotation  R = I in every case (y = x exactly): the rotated path's
                       cost on the same rows as the unrotated one -- a bound, since
                       the bench's rows keep their outlier channels
     Rows 6 and 7 quantize source rows rotated on the host (the rows an engine
     with V absorbed hands over; row 0's values without its MMA).
       --trace FILE    kernel trace builds (oscar.h, "Kernel trace"): one graph
                       replay of each demotion case (prepared rotations) is
                       traced, summarised and written to FILE (CSV); the report
                       is then quantize_trace.md / .json (the trace build's times) */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "bench_util.h"

#include <math.h>

typedef struct qarg {
    oscar_ctx *ctx;
    oscar_quantize_desc *d;
    const oscar__quant_tile *tile; /* NULL: the heuristic's */
} qarg;
static void q_fn(void *arg, int rep) {
    qarg *a = (qarg *)arg;
    (void)rep;
    BU_OK(a->ctx, oscar__quantize_kv_tiled(a->ctx, a->d, (oscar_stream)bu_stream, a->tile));
}
/* the launch cost itself: an empty kernel (one CTA of 32 threads), loaded
   from PTX through the runtime's library API -- what any launch pays before
   its first instruction, below which no oscar kernel can go */
static const char bench_empty_ptx[] = ".version 7.0\n.target sm_80\n.address_size 64\n"
                                      ".visible .entry bench_empty_kernel()\n{\n\tret;\n}\n";
static void empty_fn(void *arg, int rep) {
    const dim3 grid = {1, 1, 1}, block = {32, 1, 1};
    (void)rep;
    BU_CUDA(cudaLaunchKernel((const void *)*(cudaKernel_t *)arg, grid, block, NULL, 0, bu_stream));
}
/* the launch floor: the smallest oscar launch, a 1-row dequantize */
typedef struct {
    oscar_ctx *ctx;
    const oscar_int2_pool_desc *pool;
    const oscar_dequant_desc *dq;
} dqarg;
static void dq_fn(void *arg, int rep) {
    dqarg *a = (dqarg *)arg;
    (void)rep;
    BU_OK(a->ctx, oscar_dequantize_kv(a->ctx, a->pool, a->dq, (oscar_stream)bu_stream));
}

/* Times every valid tile candidate (rows per warp x warps per CTA) on one
   case and records a row per candidate: the data for the heuristic and the
   autotuner. */
static void time_tiles(bu_report *rep, oscar_ctx *ctx, oscar_quantize_desc *d, const char *what, int D, int with_rot,
                       double bytes, int warmup, int reps) {
    int ri, wi;
    char md[1024], js[1024];
    for (ri = 0; ri < OSCAR__NUM_QUANT_ROWS; ri++)
        for (wi = 0; wi < OSCAR__NUM_QUANT_WARPS; wi++) {
            oscar__quant_tile t;
            qarg a;
            double us, spread, tbps;
            t.rows_per_warp = oscar__quant_rows_candidates[ri], t.warps_per_cta = oscar__quant_warps_candidates[wi], t.ctas = 0;
            if (!oscar__quant_tile_valid(ctx, D, t.rows_per_warp, t.warps_per_cta, with_rot)) continue;
            a.ctx = ctx, a.d = d, a.tile = &t;
            us = bu_time_us(q_fn, &a, warmup, reps, &spread);
            tbps = bytes / (us * 1e-6) / 1e12;
            printf("  tile %s: rows %2d x warps %d: %9.2f us (spread %.2f)  %.3f TB/s  %.1f%% of copy\n", what,
                   t.rows_per_warp, t.warps_per_cta, us, spread, tbps, 100 * tbps / rep->copy_tbps);
            snprintf(md, sizeof md, "| tile: %s | rows %d x warps %d | %.2f | %.2f | %.0f | %.3f | %.1f%% |", what,
                     t.rows_per_warp, t.warps_per_cta, us, spread, bytes, tbps, 100 * tbps / rep->copy_tbps);
            snprintf(js, sizeof js,
                     "{\"case\": \"tile\", \"variant\": \"%s\", \"rows_per_warp\": %d, \"warps_per_cta\": %d, "
                     "\"time_us\": %.3f, \"spread_us\": %.3f, \"bytes\": %.0f, \"tbps\": %.4f, \"frac_copy_bw\": %.4f}",
                     what, t.rows_per_warp, t.warps_per_cta, us, spread, bytes, tbps, tbps / rep->copy_tbps);
            bu_report_row(rep, md, js);
        }
}

/* Rows of D normal values with outlier channels (x20 on every 17th dim),
   as bf16. rotated != 0: each row multiplied by the bench's rotation
   (dev_rotation: the D x D Sylvester-Hadamard sign matrix / sqrt(D), its
   entries rounded to bf16 as the kernel's MMA takes them) on the host, in
   double, then rounded to bf16 -- the rows an engine hands over when the
   rotation is absorbed into its projection (V absorbed), and the rows row
   0's kernel quantizes after its own rotation (up to the f32 sum's
   rounding), so "no rotation" rows over them are row 0 minus the rotation
   on the same values. */
static int identity_rotation; /* --identity-rotation: R = I, and pre-rotated rows are the rows themselves */
static void *dev_random_bf16(size_t n, uint64_t seed, int D, int rotated) {
    uint16_t *h = malloc(n * 2);
    double *row = malloc(sizeof(double) * (size_t)D);
    const double hs = oscar__bf16_to_f32(oscar__f32_to_bf16(1.0f / sqrtf((float)D)));
    void *d;
    size_t i;
    uint64_t s = seed * 0x9E3779B97F4A7C15ULL + 1;
    for (i = 0; i < n; i++) {
        double u1, u2, x;
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        u1 = (double)((s * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0 + 1e-12;
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        u2 = (double)((s * 0x2545F4914F6CDD1DULL) >> 11) / 9007199254740992.0;
        x = sqrt(-2 * log(u1)) * cos(6.2831853 * u2) * ((i % 128) % 17 == 3 ? 20 : 1);
        h[i] = oscar__f32_to_bf16((float)x);
        if (rotated && !identity_rotation && (i + 1) % (size_t)D == 0) {
            /* y_j = sum_i x_i (-1)^popcount(i & j) / sqrt(D): the natural-order
               fast Walsh-Hadamard transform of the row's bf16 values */
            size_t j0 = i + 1 - (size_t)D;
            int a, len;
            for (a = 0; a < D; a++) row[a] = oscar__bf16_to_f32(h[j0 + (size_t)a]);
            for (len = 1; len < D; len <<= 1)
                for (a = 0; a < D; a += 2 * len) {
                    int b;
                    for (b = a; b < a + len; b++) {
                        const double u = row[b], v = row[b + len];
                        row[b] = u + v, row[b + len] = u - v;
                    }
                }
            for (a = 0; a < D; a++) h[j0 + (size_t)a] = oscar__f32_to_bf16((float)(row[a] * hs));
        }
    }
    BU_CUDA(cudaMalloc(&d, n * 2));
    BU_CUDA(cudaMemcpy(d, h, n * 2, cudaMemcpyHostToDevice));
    free(row);
    free(h);
    return d;
}

/* A random orthogonal-ish rotation is not needed for timing: any dense f32
   matrix costs the same. A scaled Hadamard-like sign matrix keeps values sane;
   --identity-rotation makes it I. */
static void *dev_rotation(int D) {
    float *h = malloc(sizeof(float) * (size_t)D * D);
    void *d;
    int i, j;
    for (i = 0; i < D; i++)
        for (j = 0; j < D; j++)
            h[i * D + j] = identity_rotation ? (i == j ? 1.0f : 0.0f)
                                             : (__builtin_popcount((unsigned)(i & j)) & 1 ? -1.0f : 1.0f) / sqrtf((float)D);
    BU_CUDA(cudaMalloc(&d, sizeof(float) * (size_t)D * D));
    BU_CUDA(cudaMemcpy(d, h, sizeof(float) * (size_t)D * D, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

static void *dev_slots(int64_t n, int64_t modulo, int shuffle) {
    int32_t *h = malloc(sizeof(int32_t) * (size_t)n);
    void *d;
    int64_t i;
    for (i = 0; i < n; i++) h[i] = (int32_t)(shuffle ? (i * 2654435761LL) % modulo : i % modulo);
    BU_CUDA(cudaMalloc(&d, sizeof(int32_t) * (size_t)n));
    BU_CUDA(cudaMemcpy(d, h, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    free(h);
    return d;
}

int main(int argc, char **argv) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    const char *out_dir = OSCAR_RESULTS_DIR;
    int64_t T = 128 * 1024;
    const int D = 128, H = 8;
    bu_report rep;
    char md[1024], js[1024];
    int i, prefill_only = 0, tiles = 1, warmup = 3, reps = 20;
    const char *only = NULL;
    FILE *trace_csv = NULL;
    for (i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--tokens") && i + 1 < argc) T = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out_dir = argv[++i];
        else if (!strcmp(argv[i], "--prefill-only")) prefill_only = 1;
        else if (!strcmp(argv[i], "--identity-rotation")) identity_rotation = 1;
        else if (!strcmp(argv[i], "--no-tiles")) tiles = 0;
        else if (!strcmp(argv[i], "--variants") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc) warmup = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--trace") && i + 1 < argc) {
            if (!(trace_csv = bu_trace_open(argv[++i], "case", &desc))) return 2;
        }
    }
    if (oscar_setup(&desc, &ctx) != OSCAR_OK) {
        printf("bench_quantize needs a CUDA GPU: %s\n", oscar_last_error(NULL));
        return 0;
    }
    bu_report_open(&rep, trace_csv ? "quantize_trace" : "quantize", argc, argv, out_dir);
    bu_report_begin(&rep, bu_copy_bandwidth_tbps(0),
                    "| case | shape | time (us, median) | spread (us) | bytes moved | TB/s | of copy BW |",
                    "Bytes moved = bf16 K and V read once + codes, scales and slot ids written/read once "
                    "(the minimum the kernel must move). Demotion latency includes the launch; the launch "
                    "floor rows are a 1-row dequantize launch on the same stream (the smallest oscar launch), "
                    "the launch cost row an empty kernel's (what any launch pays). The json's demotion rows "
                    "give the graph time beyond each. Source rows: normals with outlier channels (x20 on every 17th "
                    "dim); \"pre-rotated\" rows are those rows times the bench's R on the host, as an engine whose "
                    "projection absorbs the rotation hands them over (the demotion's V rows, V being absorbed there).");
    printf("copy bandwidth: %.3f TB/s\n", rep.copy_tbps);

    /* ---- bulk prefill ------------------------------------------------------ */
    {
        oscar_int2_pool_desc pool = {0};
        oscar_quantize_desc d = {0};
        size_t code_bytes, scale_bytes, n = (size_t)T * H * D;
        void *src_k = dev_random_bf16(n, 1, D, 0), *src_v = dev_random_bf16(n, 2, D, 0), *rk = dev_rotation(D), *rv = dev_rotation(D);
        void *src_k_rot = NULL, *src_v_rot = NULL; /* the same rows pre-rotated: made when a variant needs them */
        void *slots = dev_slots(T, T, 0), *ck, *cv, *sk, *sv;
        qarg a;
        struct {
            const char *name;
            int rot_k, rot_v;
            float ck, cv;
            oscar_scale_layout layout;
            int pre; /* source rows pre-rotated on the host: 1 V's, 2 K's and V's */
        } variants[] = {
            {"rotate K+V, clip .96/.92, f16 scales", 1, 1, 0.96f, 0.92f, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 0},
            /* V absorbed over the raw rows (outlier channels): not what an
               absorbed projection hands over (row 6 is); named "rotate K (V
               absorbed), clip .96/.92" up to session 23's shipped run */
            {"rotate K, V absorbed (V rows raw), clip .96/.92", 1, 0, 0.96f, 0.92f, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 0},
            {"rotate K+V, no clip", 1, 1, 0.0f, 0.0f, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 0},
            {"no rotation, no clip", 0, 0, 0.0f, 0.0f, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 0},
            {"rotate K+V, clip .96/.92, f32 scale+zero", 1, 1, 0.96f, 0.92f, OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO, 0},
            /* the source rows unrotated, clipped: they keep the outlier channels
               (x20 on every 17th dim) that the rotation spreads, so the clip's
               search costs more here than on row 0's rotated rows -- not row 0
               minus its rotation (docs/quantize.md "Session 22") */
            {"no rotation, clip .96/.92", 0, 0, 0.96f, 0.92f, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 0},
            /* V absorbed as an engine runs it: its projection already gives
               rotated V rows, so V's clip meets rotated values, not the
               outlier channels above (row 1 keeps those) */
            {"rotate K, V absorbed (V rows pre-rotated), clip .96/.92", 1, 0, 0.96f, 0.92f,
             OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 1},
            /* row 0's quantize work without its rotation: the kernel sees the
               values row 0's MMA gives it (up to the f32 sum's rounding) */
            {"no rotation, rows pre-rotated, clip .96/.92", 0, 0, 0.96f, 0.92f, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN, 2},
        };
        int v;
        pool.head_dim = D, pool.num_kv_heads = H, pool.num_pages = (int32_t)(T / 16), pool.page_size = 16;
        for (v = 0; v < (int)(sizeof variants / sizeof variants[0]); v++) {
            double us, spread, bytes, tbps;
            if (only) {
                char key[8];
                const char *f;
                int hit = 0;
                snprintf(key, sizeof key, "%d", v);
                for (f = only; *f; f++)
                    if ((f == only || f[-1] == ',') && !strncmp(f, key, strlen(key)) &&
                        (f[strlen(key)] == ',' || f[strlen(key)] == 0))
                        hit = 1;
                if (!hit) continue;
            }
            pool.scale_layout = variants[v].layout;
            BU_OK(ctx, oscar_int2_pool_bytes(ctx, &pool, &code_bytes, &scale_bytes));
            BU_CUDA(cudaMalloc(&ck, code_bytes));
            BU_CUDA(cudaMalloc(&cv, code_bytes));
            BU_CUDA(cudaMalloc(&sk, scale_bytes));
            BU_CUDA(cudaMalloc(&sv, scale_bytes));
            pool.k_codes = ck, pool.v_codes = cv, pool.k_scales = sk, pool.v_scales = sv;
            memset(&d, 0, sizeof d);
            if (variants[v].pre >= 1 && !src_v_rot) src_v_rot = dev_random_bf16(n, 2, D, 1);
            if (variants[v].pre >= 2 && !src_k_rot) src_k_rot = dev_random_bf16(n, 1, D, 1);
            d.pool = &pool, d.src_k = variants[v].pre >= 2 ? src_k_rot : src_k, d.src_v = variants[v].pre >= 1 ? src_v_rot : src_v;
            d.k_rotation = variants[v].rot_k ? rk : NULL;
            d.v_rotation = variants[v].rot_v ? rv : NULL;
            d.num_tokens = T, d.dst_slots = slots;
            d.k_clip_ratio = variants[v].ck, d.v_clip_ratio = variants[v].cv;
            a.ctx = ctx, a.d = &d, a.tile = NULL;
            us = bu_time_us(q_fn, &a, warmup, reps < 1 ? 1 : reps, &spread);
            bytes = 2.0 * (double)n * 2 + 2.0 * (double)code_bytes + 2.0 * (double)scale_bytes + 4.0 * (double)T;
            tbps = bytes / (us * 1e-6) / 1e12;
            printf("prefill %-42s %lld x %d x %d: %9.1f us (spread %.1f)  %.3f TB/s  %.0f%% of copy\n",
                   variants[v].name, (long long)T, H, D, us, spread, tbps, 100 * tbps / rep.copy_tbps);
            snprintf(md, sizeof md, "| prefill: %s | %lld tok x %d heads x D %d | %.1f | %.1f | %.0f | %.3f | %.1f%% |",
                     variants[v].name, (long long)T, H, D, us, spread, bytes, tbps, 100 * tbps / rep.copy_tbps);
            snprintf(js, sizeof js,
                     "{\"case\": \"prefill\", \"variant\": \"%s\", \"tokens\": %lld, \"kv_heads\": %d, \"head_dim\": %d, "
                     "\"time_us\": %.2f, \"spread_us\": %.2f, \"bytes\": %.0f, \"tbps\": %.4f, \"frac_copy_bw\": %.4f}",
                     variants[v].name, (long long)T, H, D, us, spread, bytes, tbps, tbps / rep.copy_tbps);
            bu_report_row(&rep, md, js);
            if (tiles && (v == 0 || v == 3)) time_tiles(&rep, ctx, &d, v == 0 ? "prefill rotate+clip" : "prefill plain", D, v == 0, bytes, 2, 10);
            cudaFree(ck), cudaFree(cv), cudaFree(sk), cudaFree(sv);
        }
        cudaFree(src_k), cudaFree(src_v), cudaFree(rk), cudaFree(rv), cudaFree(slots);
        if (src_k_rot) cudaFree(src_k_rot);
        if (src_v_rot) cudaFree(src_v_rot);
    }

    /* ---- demotion: 8 tokens per request, 36 layers, one launch -------------- */
    if (!prefill_only) {
        enum { LAYERS = 36, SRC_PAGE = 16 };
        static const int requests[] = {1, 32, 256};
        int ri, l;
        const int64_t src_tokens = 256 * 300; /* the engine's bf16 cache: room for 300 tokens per request */
        oscar_int2_pool_desc pool = {0};
        oscar_quantize_layer_desc layers[LAYERS];
        size_t code_bytes, scale_bytes;
        double floor_us, floor_spread, floor_graph_us, empty_graph_us;
        /* V absorbed (no R_v): the engine's cache holds V rows its absorbed
           projection rotated, so V's rows are pre-rotated (session 23; before,
           V's rows kept the outlier channels) */
        void *src_k = dev_random_bf16((size_t)src_tokens * H * D, 3, D, 0), *src_v = dev_random_bf16((size_t)src_tokens * H * D, 4, D, 1);
        void *rk = dev_rotation(D), *rk_img;
        void *codes, *scales;
        pool.head_dim = D, pool.num_kv_heads = H, pool.num_pages = 256 * 8 * 4, pool.page_size = 1;
        BU_OK(ctx, oscar_int2_pool_bytes(ctx, &pool, &code_bytes, &scale_bytes));
        {
            /* rk's prepared image (oscar_prepare_rotation): the demotion is also timed with it */
            oscar_rotation_prepare_desc pd = {0};
            pd.head_dim = D, pd.rotation = (const float *)rk, pd.out_bytes = oscar_rotation_prepared_bytes(D);
            BU_CUDA(cudaMalloc(&rk_img, pd.out_bytes));
            pd.out = rk_img;
            BU_OK(ctx, oscar_prepare_rotation(ctx, &pd, NULL));
            BU_CUDA(cudaDeviceSynchronize());
        }
        /* one allocation per array kind, carved into per-layer pools */
        BU_CUDA(cudaMalloc(&codes, 2 * LAYERS * code_bytes));
        BU_CUDA(cudaMalloc(&scales, 2 * LAYERS * scale_bytes));
        for (l = 0; l < LAYERS; l++) {
            layers[l].src_k = src_k, layers[l].src_v = src_v;
            layers[l].k_rotation = rk, layers[l].v_rotation = NULL; /* V absorbed, as in production */
            layers[l].k_codes = (char *)codes + (2 * l) * code_bytes;
            layers[l].v_codes = (char *)codes + (2 * l + 1) * code_bytes;
            layers[l].k_scales = (char *)scales + (2 * l) * scale_bytes;
            layers[l].v_scales = (char *)scales + (2 * l + 1) * scale_bytes;
        }
        pool.k_codes = layers[0].k_codes, pool.v_codes = layers[0].v_codes;
        pool.k_scales = layers[0].k_scales, pool.v_scales = layers[0].v_scales;
        {
            /* launch floor: the smallest oscar launch (dequantize one row), timed
               directly and as a CUDA-graph replay (no host work: what an engine
               that captures its decode step pays) */
            oscar_dequant_desc dq = {0};
            void *one = dev_slots(1, 1, 0), *out;
            dqarg a;
            BU_CUDA(cudaMalloc(&out, (size_t)H * D * 2));
            dq.slots = one, dq.num_tokens = 1, dq.k_out = out;
            a.ctx = ctx, a.pool = &pool, a.dq = &dq;
            floor_us = bu_time_us(dq_fn, &a, 5, 64, &floor_spread);
            floor_graph_us = bu_time_graph_us(dq_fn, &a, 1, 5, 64, NULL);
            {
                cudaLibrary_t lib;
                cudaKernel_t k;
                BU_CUDA(cudaLibraryLoadData(&lib, bench_empty_ptx, NULL, NULL, 0, NULL, NULL, 0));
                BU_CUDA(cudaLibraryGetKernel(&k, lib, "bench_empty_kernel"));
                empty_graph_us = bu_time_graph_us(empty_fn, &k, 1, 5, 64, NULL);
                BU_CUDA(cudaLibraryUnload(lib));
            }
            printf("launch floor (1-row dequantize): %.2f us, graph replay %.2f us; an empty kernel, graph replay %.2f us\n",
                   floor_us, floor_graph_us, empty_graph_us);
            snprintf(md, sizeof md, "| launch floor | 1-row dequantize | %.2f | %.2f | - | - | - |", floor_us, floor_spread);
            snprintf(js, sizeof js, "{\"case\": \"launch_floor\", \"time_us\": %.3f, \"spread_us\": %.3f}", floor_us,
                     floor_spread);
            bu_report_row(&rep, md, js);
            snprintf(md, sizeof md, "| launch floor (graph replay) | 1-row dequantize | %.2f | - | - | - | - |", floor_graph_us);
            snprintf(js, sizeof js, "{\"case\": \"launch_floor_graph\", \"time_us\": %.3f}", floor_graph_us);
            bu_report_row(&rep, md, js);
            snprintf(md, sizeof md, "| launch cost (graph replay) | empty kernel, 1 CTA | %.2f | - | - | - | - |", empty_graph_us);
            snprintf(js, sizeof js, "{\"case\": \"empty_launch_graph\", \"time_us\": %.3f}", empty_graph_us);
            bu_report_row(&rep, md, js);
            cudaFree(one), cudaFree(out);
        }
        for (ri = 0; ri < 3; ri++) {
            int64_t n = (int64_t)requests[ri] * 8;
            oscar_quantize_desc d = {0};
            void *src_slots = dev_slots(n, src_tokens, 1), *dst_slots = dev_slots(n, pool.num_pages, 1);
            qarg a;
            double us, g_us, spread, bytes, tbps, g_tbps;
            d.pool = &pool, d.num_layers = LAYERS, d.layers = layers;
            d.num_tokens = n, d.src_slots = src_slots, d.src_page_size = SRC_PAGE, d.dst_slots = dst_slots;
            d.k_clip_ratio = 0.96f, d.v_clip_ratio = 0.92f;
            a.ctx = ctx, a.d = &d, a.tile = NULL;
            us = bu_time_us(q_fn, &a, 5, 100, &spread);
            g_us = bu_time_graph_us(q_fn, &a, 1, 5, 100, NULL);
            bytes = (double)LAYERS * n * H * (2.0 * D * 2 + 2.0 * D / 4 + 2.0 * 4) + 8.0 * n;
            tbps = bytes / (us * 1e-6) / 1e12, g_tbps = bytes / (g_us * 1e-6) / 1e12;
            printf("demotion %3d requests x 8 tokens x %d layers (one launch): %7.2f us (spread %.2f), graph replay %7.2f us "
                   "(%.2f beyond the graph launch floor, %.2f beyond an empty launch)\n",
                   requests[ri], LAYERS, us, spread, g_us, g_us - floor_graph_us, g_us - empty_graph_us);
            snprintf(md, sizeof md, "| demotion | %d req x 8 tok x %d layers x %d heads | %.2f | %.2f | %.0f | %.3f | %.1f%% |",
                     requests[ri], LAYERS, H, us, spread, bytes, tbps, 100 * tbps / rep.copy_tbps);
            snprintf(js, sizeof js,
                     "{\"case\": \"demotion\", \"requests\": %d, \"tokens_per_request\": 8, \"layers\": %d, \"kv_heads\": "
                     "%d, \"head_dim\": %d, \"time_us\": %.3f, \"spread_us\": %.3f, \"bytes\": %.0f, \"tbps\": %.4f, "
                     "\"frac_copy_bw\": %.4f}",
                     requests[ri], LAYERS, H, D, us, spread, bytes, tbps, tbps / rep.copy_tbps);
            bu_report_row(&rep, md, js);
            snprintf(md, sizeof md, "| demotion (graph replay) | %d req x 8 tok x %d layers x %d heads | %.2f | - | %.0f | %.3f | %.1f%% |",
                     requests[ri], LAYERS, H, g_us, bytes, g_tbps, 100 * g_tbps / rep.copy_tbps);
            snprintf(js, sizeof js,
                     "{\"case\": \"demotion_graph\", \"requests\": %d, \"tokens_per_request\": 8, \"layers\": %d, "
                     "\"kv_heads\": %d, \"head_dim\": %d, \"time_us\": %.3f, \"beyond_graph_launch_floor_us\": %.3f, "
                     "\"beyond_empty_launch_us\": %.3f, \"bytes\": %.0f, \"tbps\": %.4f, \"frac_copy_bw\": %.4f}",
                     requests[ri], LAYERS, H, D, g_us, g_us - floor_graph_us, g_us - empty_graph_us, bytes, g_tbps,
                     g_tbps / rep.copy_tbps);
            bu_report_row(&rep, md, js);
            {
                /* the same with rk's prepared image in every layer */
                double p_us, p_spread, p_g_us, p_tbps;
                const void *kprep[LAYERS];
                for (l = 0; l < LAYERS; l++) kprep[l] = rk_img;
                d.k_rotation_prepared = kprep;
                p_us = bu_time_us(q_fn, &a, 5, 100, &p_spread);
                p_g_us = bu_time_graph_us(q_fn, &a, 1, 5, 100, NULL);
                if (trace_csv) {
                    char label[64];
                    snprintf(label, sizeof label, "demotion %d req prepared", requests[ri]);
                    bu_trace_graph(ctx, q_fn, &a, label, trace_csv);
                }
                d.k_rotation_prepared = NULL;
                p_tbps = bytes / (p_us * 1e-6) / 1e12;
                printf("demotion %3d requests, prepared rotations: %7.2f us (spread %.2f), graph replay %7.2f us (%.2f beyond "
                       "the graph launch floor, %.2f beyond an empty launch)\n",
                       requests[ri], p_us, p_spread, p_g_us, p_g_us - floor_graph_us, p_g_us - empty_graph_us);
                snprintf(md, sizeof md,
                         "| demotion, prepared rotation | %d req x 8 tok x %d layers x %d heads | %.2f (graph %.2f) | %.2f | %.0f | "
                         "%.3f | %.1f%% |",
                         requests[ri], LAYERS, H, p_us, p_g_us, p_spread, bytes, p_tbps, 100 * p_tbps / rep.copy_tbps);
                snprintf(js, sizeof js,
                         "{\"case\": \"demotion_prepared\", \"requests\": %d, \"tokens_per_request\": 8, \"layers\": %d, "
                         "\"kv_heads\": %d, \"head_dim\": %d, \"time_us\": %.3f, \"spread_us\": %.3f, \"graph_time_us\": %.3f, "
                         "\"graph_beyond_graph_launch_floor_us\": %.3f, \"graph_beyond_empty_launch_us\": %.3f, "
                         "\"bytes\": %.0f, \"tbps\": %.4f, \"frac_copy_bw\": %.4f}",
                         requests[ri], LAYERS, H, D, p_us, p_spread, p_g_us, p_g_us - floor_graph_us, p_g_us - empty_graph_us,
                         bytes, p_tbps, p_tbps / rep.copy_tbps);
                bu_report_row(&rep, md, js);
            }
            if (tiles) {
                char what[64];
                snprintf(what, sizeof what, "demotion %d req", requests[ri]);
                time_tiles(&rep, ctx, &d, what, D, 1, bytes, 5, 50);
            }
            cudaFree(src_slots), cudaFree(dst_slots);
        }
        cudaFree(src_k), cudaFree(src_v), cudaFree(rk), cudaFree(rk_img), cudaFree(codes), cudaFree(scales);
    }
    bu_report_close(&rep);
    if (trace_csv) fclose(trace_csv);
    {
        oscar_jit_stats s;
        oscar_query_jit_stats(ctx, &s);
        printf("JIT: %lld compiled (%.0f ms), %lld disk hits (%.1f ms)\n", (long long)s.compiles, s.compile_ms,
               (long long)s.disk_hits, s.disk_load_ms);
    }
    oscar_shutdown(ctx);
    return 0;
}
