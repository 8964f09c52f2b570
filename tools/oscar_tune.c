/* tools/oscar_tune.c -- the `oscar_tune` tool: tunes the decode and quantize
   (and optionally merge_states) shapes of a model config on this machine's
   GPU, writes the tuning table and bench/results/tune.{md,json}.

       oscar_tune --bench-shapes [options]
           the decode benchmark's shapes: 32 q / 8 kv heads, D 128, batch x context in
           {1x8K, 1x32K, 1x128K, 8x32K, 32x8K, 32x32K, 128x4K}, and 8x32K at D 64 and
           D 256 (group = head dim), 64 sink + 256 recent bf16 window tokens, INT2 pages
           of 16 (HND), f16 scale + min;
           and the quantize benchmark's: a 128K-token prefill (8 kv heads, D 128, K and
           V rotated, clip .96/.92, dense rows) and the demotion of 8 tokens of 1, 32
           and 256 requests x 36 layers in one launch (K rotated, V absorbed, clip
           .96/.92, rows gathered from a bf16 cache of 16-token pages)
       oscar_tune --q-heads 32 --kv-heads 8 --head-dim 128 --batch 1,8,32 --context 8192,32768 [options]
           every batch x context of a model config (context = tokens per request,
           window included); quantize: a prefill of each context's tokens and the
           demotion of 8 tokens of each batch's requests x --layers layers
     options
       --group G            INT2 group size (head dim)
       --page P             INT2 page size (16)
       --scale f16|f32      scale layout: f16 scale+min (default) or f32 scale+zero
       --window N|none      bf16 window tokens per request (320)
       --merge              also tune merge_states on rows = batch x q heads (2 states, bf16)
       --layers N           quantize: layers per demotion launch (36; 1..48)
       --rotation kv|k|none quantize (model config): which of K and V are rotated (kv)
       --clip K,V|off       quantize (model config): clip ratios (0.96,0.92)
       --no-quantize        tune decode (and merge) only
       --no-decode          tune quantize (and merge, if asked) only
       --table PATH         the table to extend and write (default: the context's,
                            $OSCAR_TUNE_TABLE or <JIT cache>/tune_table.txt)
       --fresh              start from an empty table (e.g. for tune/default_sm90.txt)
       --results DIR        where tune.md and tune.json go (default: bench/results)
       --repeats N          timed runs per candidate (15); --warmup N (3)
       oscar_tune --digests [--table PATH]
           print this build's kernel-source digest of each tuned family (the src= a
           current table entry carries; an entry with another is ignored when its
           table loads) and, with --table, how many of that table's entries are
           current and how many stale. Needs no GPU. Exit status 3: the table has
           stale entries; 1: it cannot be read or parsed.
   With OSCAR_TUNE_VERBOSE set it logs to stderr every candidate's median
   (`candidate int2_splits=.. ...: T us (IQR I)`) and every rejection.
   Without a GPU it says so and exits 0. Exit status 1: a tuning call failed;
   2: bad arguments. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifndef OSCAR_RESULTS_DIR
#define OSCAR_RESULTS_DIR "bench/results"
#endif

#define MAX_LIST 32
#define MAX_SHAPES (MAX_LIST * MAX_LIST)
#define MAX_QSHAPES (2 * MAX_LIST)

static int usage(const char *why) {
    fprintf(stderr,
            "oscar_tune: %s\n"
            "usage: oscar_tune --bench-shapes | --q-heads N --kv-heads N --head-dim D --batch B[,B...] --context T[,T...]\n"
            "                  [--group G] [--page P] [--scale f16|f32] [--window N|none] [--merge] [--table PATH]\n"
            "                  [--fresh] [--results DIR] [--repeats N] [--warmup N] [--layers N]\n"
            "                  [--rotation kv|k|none] [--clip K,V|off] [--no-quantize]\n"
            "       oscar_tune --digests [--table PATH]\n",
            why);
    return 2;
}

/* "1,8,32" -> values; returns the count, or -1 */
static int parse_list(const char *s, int64_t *out) {
    int n = 0;
    while (*s) {
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 1 || n == MAX_LIST) return -1;
        if (*end == 'K' || *end == 'k') v *= 1024, end++;
        out[n++] = v;
        if (*end == ',') end++;
        else if (*end) return -1;
        s = end;
    }
    return n;
}

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static void shape_name(char *out, size_t cap, int batch, int64_t tokens) {
    if (tokens % 1024 == 0) snprintf(out, cap, "%d x %lldK", batch, (long long)(tokens / 1024));
    else snprintf(out, cap, "%d x %lld", batch, (long long)tokens);
}

/* --digests: each family's digest of this build's kernel sources, and with a
   table path how many of its entries carry it (current) or another (stale). */
static int print_digests(const char *table) {
    char digest[OSCAR__TUNE_FAMILY_COUNT][17], *text = NULL;
    int current[OSCAR__TUNE_FAMILY_COUNT] = {0}, stale[OSCAR__TUNE_FAMILY_COUNT] = {0}, any_stale = 0, f, i, r;
    size_t n = 0;
    oscar__tune_table *t = NULL;
    for (f = 1; f < OSCAR__TUNE_FAMILY_COUNT; f++) {
        oscar__tune_family_digest(f, digest[f]);
        printf("%-13s %s\n", oscar__tune_families[f].name, digest[f]);
    }
    if (!table) return 0;
    r = oscar__tune_read_file(NULL, table, &text, &n);
    if (r != 0) {
        fprintf(stderr, "oscar_tune: cannot read the table %s: %s\n", table, r > 0 ? "no such file" : strerror(errno));
        return 1;
    }
    if (oscar__tune_parse(NULL, "oscar_tune --digests", table, text, n, &t) != OSCAR_OK) {
        fprintf(stderr, "oscar_tune: %s\n", oscar_last_error(NULL));
        oscar__free(NULL, text);
        return 1;
    }
    oscar__free(NULL, text);
    for (i = 0; i < t->num_entries; i++) {
        const oscar__tune_entry *e = &t->entries[i];
        if (strcmp(e->src, digest[e->family]) == 0) current[e->family]++;
        else stale[e->family]++, any_stale = 1;
    }
    printf("table %s (tuned on %s, %d SMs, sm_%d, %s):\n", table, t->prov.gpu_name, t->prov.num_sms, t->prov.sm,
           t->prov.date);
    for (f = 1; f < OSCAR__TUNE_FAMILY_COUNT; f++)
        printf("  %-13s %d current, %d stale\n", oscar__tune_families[f].name, current[f], stale[f]);
    oscar__tune_table_free(NULL, t);
    return any_stale ? 3 : 0;
}

/* One row of the results: its family, shape and report. */
typedef struct result_row {
    const char *family;
    char shape[96];
    const oscar_tune_report *rep;
} result_row;

static double now_s(void) {
    struct timespec a;
    clock_gettime(CLOCK_MONOTONIC, &a);
    return (double)a.tv_sec + 1e-9 * (double)a.tv_nsec;
}

int main(int argc, char **argv) {
    oscar_desc desc = {0};
    oscar_ctx *ctx = NULL;
    oscar_tune_decode_desc td = {0};
    oscar_tune_merge_desc tm = {0};
    /* quantize: [0] prefill (dense rows), [1] demotion (gathered rows, many layers) */
    oscar_tune_quantize_desc tq[2] = {{0}, {0}};
    static oscar_tune_shape shapes[MAX_SHAPES], mshapes[MAX_SHAPES], qshapes[2][MAX_LIST];
    static oscar_tune_report reps[MAX_SHAPES], mreps[MAX_SHAPES], qreps[2][MAX_LIST];
    /* --bench-shapes: the decode benchmark's other head dims (8 x 32K at D 64 and 256) */
    enum { BENCH_DIMS = 2 };
    static const int32_t bench_dims[BENCH_DIMS] = {64, 256};
    static const oscar_tune_shape bench_dim_shape = {8, 32768};
    oscar_tune_report dim_reps[BENCH_DIMS];
    static result_row rows[2 * MAX_SHAPES + MAX_QSHAPES + BENCH_DIMS];
    int ndims; /* of bench_dims tuned in this run */
    oscar_tune_info info;
    oscar_ctx_info ci;
    oscar_status st;
    int64_t batches[MAX_LIST], contexts[MAX_LIST];
    int nb = 0, nctx = 0, nshapes = 0, nm = 0, nq[2] = {0, 0}, nrows = 0, bench = 0, merge = 0, fresh = 0, quant = 1, decode = 1;
    int digests = 0;
    int layers = 36, rotation = 0, i, j;
    float clip_k = 0.96f, clip_v = 0.92f;
    const char *table = NULL, *results = OSCAR_RESULTS_DIR, *commit = getenv("OSCAR_COMMIT");
    char command[1024] = "", date[32], path[1200];
    size_t clen = 0;
    double t0, total_s;
    FILE *md, *js;

    for (i = 0; i < argc && clen + 2 < sizeof command; i++) {
        int k = snprintf(command + clen, sizeof command - clen, "%s%s", i ? " " : "", argv[i]);
        if (k > 0) clen += (size_t)k;
    }
    for (i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int takes = 1;
        if (!strcmp(a, "--bench-shapes")) bench = 1, takes = 0;
        else if (!strcmp(a, "--merge")) merge = 1, takes = 0;
        else if (!strcmp(a, "--fresh")) fresh = 1, takes = 0;
        else if (!strcmp(a, "--no-quantize")) quant = 0, takes = 0;
        else if (!strcmp(a, "--no-decode")) decode = 0, takes = 0;
        else if (!strcmp(a, "--digests")) digests = 1, takes = 0;
        else if (!v) return usage("an option lacks its value");
        else if (!strcmp(a, "--q-heads")) td.num_q_heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) td.num_kv_heads = atoi(v);
        else if (!strcmp(a, "--head-dim")) td.head_dim = atoi(v);
        else if (!strcmp(a, "--group")) td.group_size = atoi(v);
        else if (!strcmp(a, "--page")) td.page_size = atoi(v);
        else if (!strcmp(a, "--repeats")) td.repeats = atoi(v);
        else if (!strcmp(a, "--warmup")) td.warmup = atoi(v);
        else if (!strcmp(a, "--table")) table = v;
        else if (!strcmp(a, "--results")) results = v;
        else if (!strcmp(a, "--layers")) {
            layers = atoi(v);
            if (layers < 1 || layers > 48) return usage("--layers wants 1..48 (one launch)");
        } else if (!strcmp(a, "--rotation")) {
            if (!strcmp(v, "kv")) rotation = 0;
            else if (!strcmp(v, "k")) rotation = 1;
            else if (!strcmp(v, "none")) rotation = -1;
            else return usage("--rotation wants kv, k or none");
        } else if (!strcmp(a, "--clip")) {
            char *end;
            if (!strcmp(v, "off")) clip_k = clip_v = 0.0f;
            else {
                clip_k = strtof(v, &end);
                if (*end != ',') return usage("--clip wants K,V (e.g. 0.96,0.92) or off");
                clip_v = strtof(end + 1, &end);
                if (*end || !(clip_k >= 0 && clip_k <= 1 && clip_v >= 0 && clip_v <= 1))
                    return usage("--clip wants two ratios in [0, 1] (e.g. 0.96,0.92) or off");
            }
        } else if (!strcmp(a, "--scale")) {
            if (!strcmp(v, "f16")) td.scale_layout = OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
            else if (!strcmp(v, "f32")) td.scale_layout = OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO;
            else return usage("--scale wants f16 or f32");
        } else if (!strcmp(a, "--window")) {
            td.window_tokens = !strcmp(v, "none") ? -1 : atoi(v);
            if (td.window_tokens == 0) return usage("--window wants a token count >= 1 or none");
        } else if (!strcmp(a, "--batch")) {
            if ((nb = parse_list(v, batches)) < 1) return usage("--batch wants B[,B...], each >= 1");
        } else if (!strcmp(a, "--context")) {
            if ((nctx = parse_list(v, contexts)) < 1) return usage("--context wants T[,T...] (e.g. 8K,32768), each >= 1");
        } else {
            char why[256];
            snprintf(why, sizeof why, "unknown option %s", a);
            return usage(why);
        }
        i += takes;
    }
    if (digests) return print_digests(table);
    for (j = 0; j < 2; j++) {
        tq[j].group_size = td.group_size, tq[j].scale_layout = td.scale_layout;
        tq[j].repeats = td.repeats, tq[j].warmup = td.warmup;
    }
    if (bench) {
        static const int bb[7] = {1, 1, 1, 8, 32, 32, 128};
        static const int64_t bc[7] = {8192, 32768, 131072, 32768, 8192, 32768, 4096};
        static const int dem_requests[3] = {1, 32, 256};
        if (nb || nctx) return usage("--bench-shapes and --batch/--context exclude each other");
        td.num_q_heads = 32, td.num_kv_heads = 8, td.head_dim = 128, td.page_size = 16;
        td.int2_layout = OSCAR_KV_LAYOUT_HND, td.window_tokens = 320;
        for (i = 0; i < 7; i++) shapes[i].batch_size = bb[i], shapes[i].context_tokens = bc[i];
        nshapes = 7;
        /* bench/bench_quantize.c: prefill (rotate K+V, clip .96/.92, pool pages of 16) and
           demotion (36 layers, K rotated, V absorbed, clip .96/.92, bf16 cache pages of 16,
           pool pages of 1) */
        tq[0].rotation = 0, tq[0].page_size = 16;
        qshapes[0][0].batch_size = 1, qshapes[0][0].context_tokens = 128 * 1024;
        nq[0] = 1;
        tq[1].rotation = 1, tq[1].src_page_size = 16, tq[1].page_size = 1;
        for (i = 0; i < 3; i++) qshapes[1][i].batch_size = 36, qshapes[1][i].context_tokens = 8 * dem_requests[i];
        nq[1] = 3;
        clip_k = 0.96f, clip_v = 0.92f;
    } else {
        if (!td.num_q_heads || !td.num_kv_heads || !td.head_dim || !nb || !nctx)
            return usage("give --bench-shapes, or --q-heads, --kv-heads, --head-dim, --batch and --context");
        for (i = 0; i < nb; i++)
            for (j = 0; j < nctx; j++) {
                shapes[nshapes].batch_size = (int32_t)batches[i];
                shapes[nshapes].context_tokens = contexts[j];
                nshapes++;
            }
        /* prefills of each context's tokens; demotion of 8 tokens of each batch's requests */
        tq[0].rotation = tq[1].rotation = rotation, tq[0].page_size = td.page_size;
        tq[1].src_page_size = 16, tq[1].page_size = td.page_size;
        for (j = 0; j < nctx; j++)
            if (contexts[j] <= (1 << 24)) qshapes[0][nq[0]].batch_size = 1, qshapes[0][nq[0]++].context_tokens = contexts[j];
        for (i = 0; i < nb; i++)
            if (batches[i] <= (1 << 21)) qshapes[1][nq[1]].batch_size = layers, qshapes[1][nq[1]++].context_tokens = 8 * batches[i];
    }
    for (j = 0; j < 2; j++) {
        tq[j].num_kv_heads = td.num_kv_heads, tq[j].head_dim = td.head_dim;
        tq[j].k_clip_ratio = clip_k, tq[j].v_clip_ratio = clip_v;
        tq[j].num_shapes = nq[j], tq[j].shapes = qshapes[j];
    }
    if (!quant) nq[0] = nq[1] = 0;
    if (!decode) nshapes = 0;
    td.num_shapes = nshapes, td.shapes = shapes;

    ndims = bench && decode ? BENCH_DIMS : 0;
    desc.tune_table_path = table;
    desc.logger.func = getenv("OSCAR_TUNE_VERBOSE") ? oscar_log_stderr : NULL;
    st = oscar_setup(&desc, &ctx);
    if (st != OSCAR_OK) {
        printf("oscar_tune: no GPU to tune on (%s: %s); nothing done\n", oscar_status_string(st), oscar_last_error(NULL));
        return 0;
    }
    oscar_query_ctx_info(ctx, &ci);
    if (fresh) oscar_tune_table_clear(ctx);
    oscar_query_tune_info(ctx, &info);
    if (!info.path[0] && !table) {
        fprintf(stderr, "oscar_tune: no table path (no --table, no $OSCAR_TUNE_TABLE, no disk cache)\n");
        oscar_shutdown(ctx);
        return 2;
    }
    printf("oscar_tune on %s (%d SMs, sm_%d, NVRTC %d.%d): %d decode shape(s)%s, %d quantize shape(s), table %s%s\n",
           ci.device_name, ci.num_sms, ci.sm, ci.nvrtc_version / 1000, ci.nvrtc_version % 1000 / 10,
           nshapes + ndims,
           merge ? " + merge_states" : "", nq[0] + nq[1], table ? table : info.path, info.has_table ? " (extended)" : " (new)");
    fflush(stdout);
    t0 = now_s();
    st = nshapes ? oscar_tune_decode(ctx, &td, reps) : OSCAR_OK;
    if (st != OSCAR_OK) {
        fprintf(stderr, "oscar_tune: oscar_tune_decode: %s: %s\n", oscar_status_string(st), oscar_last_error(ctx));
        oscar_shutdown(ctx);
        return 1;
    }
    for (i = 0; i < nshapes; i++) {
        rows[nrows].family = "decode", rows[nrows].rep = &reps[i];
        shape_name(rows[nrows].shape, sizeof rows[nrows].shape, shapes[i].batch_size, shapes[i].context_tokens);
        nrows++;
    }
    for (i = 0; i < ndims; i++) {
        oscar_tune_decode_desc tdd = td;
        tdd.head_dim = bench_dims[i], tdd.group_size = 0; /* group = head dim */
        tdd.num_shapes = 1, tdd.shapes = &bench_dim_shape;
        st = oscar_tune_decode(ctx, &tdd, &dim_reps[i]);
        if (st != OSCAR_OK) {
            fprintf(stderr, "oscar_tune: oscar_tune_decode (D %d): %s: %s\n", bench_dims[i], oscar_status_string(st),
                    oscar_last_error(ctx));
            oscar_shutdown(ctx);
            return 1;
        }
        rows[nrows].family = "decode", rows[nrows].rep = &dim_reps[i];
        shape_name(rows[nrows].shape, sizeof rows[nrows].shape, bench_dim_shape.batch_size,
                   bench_dim_shape.context_tokens);
        snprintf(rows[nrows].shape + strlen(rows[nrows].shape), sizeof rows[nrows].shape - strlen(rows[nrows].shape),
                 ", D %d", bench_dims[i]);
        nrows++;
    }
    if (merge) {
        for (i = 0; i < nshapes; i++) {
            int64_t r = (int64_t)shapes[i].batch_size * td.num_q_heads;
            for (j = 0; j < nm && mshapes[j].context_tokens != r; j++) {}
            if (j == nm) mshapes[nm].batch_size = 0, mshapes[nm].context_tokens = r, nm++;
        }
        tm.head_dim = td.head_dim, tm.num_states = 2, tm.dtype = OSCAR_DTYPE_BF16;
        tm.num_shapes = nm, tm.shapes = mshapes, tm.repeats = td.repeats, tm.warmup = td.warmup;
        st = oscar_tune_merge(ctx, &tm, mreps);
        if (st != OSCAR_OK) {
            fprintf(stderr, "oscar_tune: oscar_tune_merge: %s: %s\n", oscar_status_string(st), oscar_last_error(ctx));
            oscar_shutdown(ctx);
            return 1;
        }
        for (i = 0; i < nm; i++) {
            rows[nrows].family = "merge_states", rows[nrows].rep = &mreps[i];
            snprintf(rows[nrows].shape, sizeof rows[nrows].shape, "%lld rows", (long long)mshapes[i].context_tokens);
            nrows++;
        }
    }
    for (j = 0; j < 2; j++) {
        if (!nq[j]) continue;
        st = oscar_tune_quantize(ctx, &tq[j], qreps[j]);
        if (st != OSCAR_OK) {
            fprintf(stderr, "oscar_tune: oscar_tune_quantize (%s): %s: %s\n", j ? "demotion" : "prefill",
                    oscar_status_string(st), oscar_last_error(ctx));
            oscar_shutdown(ctx);
            return 1;
        }
        for (i = 0; i < nq[j]; i++) {
            const oscar_tune_shape *q = &qshapes[j][i];
            rows[nrows].family = "quantize", rows[nrows].rep = &qreps[j][i];
            if (j == 0 && q->context_tokens % 1024 == 0)
                snprintf(rows[nrows].shape, sizeof rows[nrows].shape, "prefill %lldK tok", (long long)(q->context_tokens / 1024));
            else if (j == 0)
                snprintf(rows[nrows].shape, sizeof rows[nrows].shape, "prefill %lld tok", (long long)q->context_tokens);
            else
                snprintf(rows[nrows].shape, sizeof rows[nrows].shape, "demote %lld req x 8 tok x %d layers",
                         (long long)((q->context_tokens + 7) / 8), q->batch_size);
            nrows++;
        }
    }
    total_s = now_s() - t0;
    st = oscar_tune_table_save(ctx, table);
    if (st != OSCAR_OK) {
        fprintf(stderr, "oscar_tune: oscar_tune_table_save: %s: %s\n", oscar_status_string(st), oscar_last_error(ctx));
        oscar_shutdown(ctx);
        return 1;
    }
    oscar_query_tune_info(ctx, &info);

    /* the table on stdout, then the result files */
    printf("\n%-12s %-32s %-34s %10s %-34s %10s %8s %6s %8s\n", "family", "shape", "default", "us", "kept", "us", "speedup",
           "cands", "rejected");
    for (i = 0; i < nrows; i++) {
        const oscar_tune_report *r = rows[i].rep;
        printf("%-12s %-32s %-34s %10.1f %-34s %10.1f %7.3fx %6d %8d\n", rows[i].family, rows[i].shape, r->default_params,
               r->default_us, r->params, r->tuned_us, r->default_us / r->tuned_us, r->num_candidates, r->num_rejected);
        if (r->rejected[0]) printf("             rejected: %s\n", r->rejected);
    }
    printf("\ntuning took %.1f s (this run); table %s: %d entries, tuning_s %.1f in all\n", total_s,
           table ? table : info.path, info.num_entries, info.provenance.tuning_seconds);

    {
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    }
    snprintf(path, sizeof path, "%s/tune.md", results);
    md = fopen(path, "w");
    snprintf(path, sizeof path, "%s/tune.json", results);
    js = fopen(path, "w");
    if (!md || !js) {
        fprintf(stderr, "oscar_tune: cannot write %s/tune.{md,json}\n", results);
        if (md) fclose(md);
        if (js) fclose(js);
        oscar_shutdown(ctx);
        return 1;
    }
    fprintf(md, "# tune\n\n- GPU: %s (%d SMs, sm_%d)\n- NVRTC: %d.%d, oscar %s\n- date: %s\n- commit: %s\n- command: `%s`\n"
                "- tuning took: %.1f s\n\n",
            ci.device_name, ci.num_sms, ci.sm, ci.nvrtc_version / 1000, ci.nvrtc_version % 1000 / 10,
            OSCAR_VERSION_STRING, date, commit && commit[0] ? commit : "unknown", command, total_s);
    fprintf(md, "Decode: %d q / %d kv heads, D %d, group %d, INT2 pages of %d, window %d bf16 tokens per request.",
            td.num_q_heads, td.num_kv_heads, td.head_dim, td.group_size ? td.group_size : td.head_dim,
            td.page_size ? td.page_size : 16, td.window_tokens < 0 ? 0 : td.window_tokens ? td.window_tokens : 320);
    if (ndims) fprintf(md, " The rows marked D 64 / D 256: the same at that head dim (group = head dim).");
    if (nq[0] + nq[1])
        fprintf(md, " Quantize: %d kv heads, D %d, bf16 rows, clip %.2f/%.2f; prefill: dense rows, %s rotated; demotion: "
                    "8 tokens per request gathered from a bf16 cache of 16-token pages, %d layers in one launch, %s rotated.",
                td.num_kv_heads, td.head_dim, (double)clip_k, (double)clip_v,
                tq[0].rotation < 0 ? "nothing" : tq[0].rotation == 1 ? "K" : "K and V", bench ? 36 : layers,
                tq[1].rotation < 0 ? "nothing" : tq[1].rotation == 1 ? "K" : "K and V");
    fprintf(md, " Default = the heuristic's choice; kept = the best valid candidate, kept only if its median beats the "
                "default's by more than the larger interquartile range in an interleaved re-timing (both times below are "
                "from that re-timing; medians of %d CUDA-event timings, of CUDA-graph replays (one graph per candidate and "
                "input set) where the timing column says graph, else of direct launches; inputs rotating over 2x the L2). "
                "Candidates whose "
                "output differs from the default's (decode: o > 5e-3 relative per head, lse > 1e-3; merge_states: any bit; "
                "quantize: any bit of the codes or scales) are rejected.\n\n",
            2 * (td.repeats ? td.repeats : 15));
    fprintf(md, "| family | shape | bucket | default | default (us) | kept | kept (us) | speedup | candidates | rejected | "
                "timing | seconds |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    fprintf(js, "{\n  \"bench\": \"tune\",\n  \"gpu\": ");
    json_string(js, ci.device_name);
    fprintf(js, ",\n  \"num_sms\": %d,\n  \"sm\": %d,\n  \"nvrtc\": \"%d.%d\",\n  \"oscar\": \"%s\",\n  \"date\": \"%s\",\n"
                "  \"commit\": ",
            ci.num_sms, ci.sm, ci.nvrtc_version / 1000, ci.nvrtc_version % 1000 / 10, OSCAR_VERSION_STRING, date);
    json_string(js, commit && commit[0] ? commit : "unknown");
    fprintf(js, ",\n  \"command\": ");
    json_string(js, command);
    fprintf(js, ",\n  \"tuning_seconds\": %.2f,\n  \"rows\": [\n", total_s);
    for (i = 0; i < nrows; i++) {
        const oscar_tune_report *r = rows[i].rep;
        fprintf(md, "| %s | %s | `%s` | %s | %.1f (IQR %.1f) | %s | %.1f (IQR %.1f) | %.3fx | %d | %d%s%s | %s | %.1f |\n",
                rows[i].family, rows[i].shape, r->key, r->default_params, r->default_us, r->default_spread_us, r->params,
                r->tuned_us, r->tuned_spread_us, r->default_us / r->tuned_us, r->num_candidates, r->num_rejected,
                r->rejected[0] ? ": " : "", r->rejected, r->graph_timed ? "graph" : "direct", r->seconds);
        fprintf(js, "%s    {\"family\": \"%s\", \"shape\": ", i ? ",\n" : "", rows[i].family);
        json_string(js, rows[i].shape);
        fprintf(js, ", \"bucket\": ");
        json_string(js, r->key);
        fprintf(js, ", \"default_params\": ");
        json_string(js, r->default_params);
        fprintf(js, ", \"default_us\": %.3f, \"default_spread_us\": %.3f, \"params\": ", r->default_us, r->default_spread_us);
        json_string(js, r->params);
        fprintf(js, ", \"tuned_us\": %.3f, \"tuned_spread_us\": %.3f, \"speedup\": %.4f, \"improved\": %s, "
                    "\"candidates\": %d, \"rejected\": %d, \"rejected_detail\": ",
                r->tuned_us, r->tuned_spread_us, r->default_us / r->tuned_us, r->improved ? "true" : "false",
                r->num_candidates, r->num_rejected);
        json_string(js, r->rejected);
        fprintf(js, ", \"timing\": \"%s\", \"seconds\": %.2f}", r->graph_timed ? "graph" : "direct", r->seconds);
    }
    fprintf(js, "\n  ]\n}\n");
    fclose(md);
    fclose(js);
    printf("wrote %s/tune.md and tune.json\n", results);
    oscar_shutdown(ctx);
    return 0;
}
