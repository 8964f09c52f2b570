/* llm_gpu_check — the model's decode steps through oscar's real GPU kernels, side by side
   with oscar's CPU backend: same prompt, same rotations, same windows.

   llm_gpu_check [-m MODEL] [-f TEXT] [--positions N] [--gen G] [--rot-k FILE --rot-v FILE | --hadamard]
                 [--sink S] [--recent R] [--clip-k X] [--clip-v Y] [--tol T] [--against cuda|cpu|cpu-sim]
                 [--out FILE]

   The first N tokens (default 384) of TEXT (default /usr/share/common-licenses/GPL-3, else a
   built-in paragraph) are teacher-forced one decode step at a time — so with sink 64 + recent
   256 the INT2 tier fills from position 327 on: demotion (oscar_quantize_kv, all layers in
   one call, 8 tokens at a time) and INT2 decode attention (oscar_decode_run) both run — then
   G (default 16) greedy tokens. Two KV backends (kv_backend_oscar) see every step:
     A: an OSCAR_BACKEND_CPU context (host memory; the float64 C reference of every kernel);
     B: the CUDA context (device memory, NVRTC-compiled kernels) — or, to check this program
        on a machine without a GPU, --against cpu (a second CPU backend: must be identical)
        or cpu-sim (the simulated cache with oscar's quantizer, kv_backend_sim_create).
   In the greedy phase both are fed A's token, so every step compares logits of the same
   context; the continuations are "identical" when B's argmax equals A's at every step.

   Tolerance (--tol, default 1.0): max |Δlogit| over all steps (logits here reach about 35).
   The two backends differ only where the arithmetic does: the GPU rotates K/V rows with
   bf16 tensor-core MMAs and f32 accumulation (the CPU in float64; both round the rotated row
   to bf16, so a rare 1-ulp difference can move an INT2 code) and decodes with f32 state
   (the CPU in float64; both round q and the attention output to bf16, so some outputs
   differ by one bf16 ulp). Scale, measured on the CPU with this program: two CPU backends
   differ by exactly 0; the CPU backend against the simulated cache, which differs by full
   bf16 roundings of q, of the output and of every dequantized value in every layer, by 0.43
   (windows only) and 0.87 (with INT2) — so 1.0 bounds rounding-level differences, while a
   wrong page table, slot or rotation moves logits by several units.
   Greedy: the continuations must be identical, unless they part at a genuine near tie:
   A's top-1 logit within 0.1 of A's logit for B's choice (reported, does not fail).
   Exit status: 0 pass; 1 logits beyond the tolerance or a greedy token differs (not at a
   near tie); 2 setup error (no GPU, no NVRTC, model or text missing). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_backend_oscar.h"
#include "llm_oscar_util.h"

static const char BUILTIN_TEXT[] =
    "A key-value cache keeps, for every layer of a transformer, the keys and values of all tokens seen so far, "
    "so that each new token attends to the whole history without recomputing it. Its size grows with the "
    "context: for long documents and many concurrent requests it is the largest consumer of accelerator "
    "memory, and reading it dominates the time of every decoding step. Quantizing the cache to two bits per "
    "value shrinks it eightfold against sixteen-bit storage, but naive rounding destroys the attention "
    "pattern: a few channels carry values far larger than the rest, and a per-token scale stretched over them "
    "leaves almost no resolution for everything else. Rotating each head's keys and values by an orthogonal "
    "matrix before rounding spreads those outliers over all channels; choosing the rotation from the "
    "statistics of the queries that will read the keys puts the rounding error where the queries do not "
    "look. The most recent tokens and the first few tokens of a sequence stay in sixteen-bit precision, "
    "because attention concentrates on them. The engine demotes tokens from the recent window in small "
    "groups, quantizing them on their way into the two-bit pool, and the decode kernel reads both tiers in "
    "one pass, merging the partial softmax states exactly. A calibration run over a few thousand tokens "
    "estimates the covariance of the queries of every layer and of the values weighted by how strongly the "
    "keys are attended to; the eigenvectors of those matrices, composed with a Hadamard transform and a "
    "bit-reversal permutation, give the rotations. Everything else stays as it was: the weights, the "
    "activations, the sampling. What changes is the memory a request needs and the bandwidth a step reads, "
    "and the accuracy that is lost should be small enough that nobody notices in the answers. Whether it is "
    "small enough has to be measured, on a real model and real text, against the sixteen-bit baseline, with "
    "the same prompts and the same decoding, and the measurement has to be repeated whenever the kernels "
    "change. This paragraph exists so that such a check has something to read when no other text is at hand.";

typedef struct step {
    int64_t pos;
    int greedy;
    double max_d, max_abs;
    int32_t top_a, top_b;
    double margin; /* A's logit of its top-1 minus A's logit of B's top-1 */
} step;

static void usage(void) {
    fprintf(stderr, "usage: llm_gpu_check [-m MODEL] [-f TEXT] [--positions N] [--gen G] [--rot-k F --rot-v F | --hadamard]\n"
                    "                     [--sink S] [--recent R] [--clip-k X] [--clip-v Y] [--tol T]\n"
                    "                     [--against cuda|cpu|cpu-sim] [--out FILE]\n");
}

static FILE *g_out = NULL;
/* print to stdout and to the --out file */
#define PR(...)                                                 \
    do {                                                        \
        printf(__VA_ARGS__);                                    \
        if (g_out) fprintf(g_out, __VA_ARGS__);                 \
    } while (0)

static int setup_failure(const char *msg) {
    PR("ERROR: %s\nresult: ERROR (exit 2)\n", msg);
    if (g_out) fclose(g_out);
    return 2;
}

int main(int argc, char **argv) {
    const char *model_path = LLM_DEFAULT_MODEL, *text_path = "/usr/share/common-licenses/GPL-3", *against = "cuda";
    const char *rot_k = NULL, *rot_v = NULL, *out_path = NULL;
    const char *def_k = "examples/llm/rotations/smollm2-135m.gpl2.k.safetensors",
               *def_v = "examples/llm/rotations/smollm2-135m.gpl2.v.safetensors";
    int32_t n_pos = 384, n_gen = 16, sink = 64, recent = 256, use_had = 0;
    float clip_k = 0.96f, clip_v = 0.92f;
    double tol = 1.0;
    const double near_tie = 0.1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--hadamard")) { use_had = 1; continue; }
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "-f")) text_path = v;
        else if (!strcmp(a, "--positions")) n_pos = atoi(v);
        else if (!strcmp(a, "--gen")) n_gen = atoi(v);
        else if (!strcmp(a, "--rot-k")) rot_k = v;
        else if (!strcmp(a, "--rot-v")) rot_v = v;
        else if (!strcmp(a, "--sink")) sink = atoi(v);
        else if (!strcmp(a, "--recent")) recent = atoi(v);
        else if (!strcmp(a, "--clip-k")) clip_k = (float)atof(v);
        else if (!strcmp(a, "--clip-v")) clip_v = (float)atof(v);
        else if (!strcmp(a, "--tol")) tol = atof(v);
        else if (!strcmp(a, "--against") && (!strcmp(v, "cuda") || !strcmp(v, "cpu") || !strcmp(v, "cpu-sim"))) against = v;
        else if (!strcmp(a, "--out")) out_path = v;
        else { usage(); return 2; }
        i++;
    }
    if (n_pos < 2 || n_gen < 0 || !(tol > 0) || (!rot_k) != (!rot_v)) { usage(); return 2; }
    if (out_path && !(g_out = fopen(out_path, "w"))) { fprintf(stderr, "cannot write %s\n", out_path); return 2; }
    char date[32], commit[64], cmd[2048], err[1024];
    llm_run_date(date, sizeof date);
    llm_run_commit(commit, sizeof commit);
    llm_run_command(argc, argv, cmd, sizeof cmd);
    PR("llm_gpu_check: %s, commit %s\ncommand: %s\n", date, commit, cmd);

    /* contexts */
    oscar_ctx *cpu = llm_oscar_setup(OSCAR_BACKEND_CPU, err, sizeof err);
    if (!cpu) return setup_failure(err);
    oscar_ctx *gpu = NULL;
    if (!strcmp(against, "cuda")) {
        gpu = llm_oscar_setup(OSCAR_BACKEND_CUDA, err, sizeof err);
        if (!gpu) return setup_failure(err);
        oscar_ctx_info info;
        oscar_query_ctx_info(gpu, &info);
        PR("GPU: %s (sm_%d, %d SMs), driver %d, NVRTC %d, JIT cache %s\n", info.device_name, info.sm, info.num_sms,
           info.driver_version, info.nvrtc_version, info.cache_dir[0] ? info.cache_dir : "memory only");
    } else {
        PR("no GPU requested: B is %s (a check of this program, not of the GPU)\n",
           !strcmp(against, "cpu") ? "a second CPU backend" : "the simulated cache with oscar's CPU quantizer");
    }

    /* model, text, rotations */
    llm L;
    if (llm_open(&L, model_path, 1, err, sizeof err) != 0) return setup_failure(err);
    const model_config *c = &L.model->cfg;
    int32_t *ids = NULL;
    size_t n_ids = 0, n_bytes = 0;
    const char *text_name = text_path;
    if (llm_tokenize_file(&L, text_path, &ids, &n_ids, &n_bytes) != 0 || n_ids < (size_t)n_pos) {
        free(ids);
        ids = NULL;
        if (tokenizer_encode(L.tok, BUILTIN_TEXT, strlen(BUILTIN_TEXT), 0, &ids, &n_ids) != 0 || n_ids < (size_t)n_pos) {
            snprintf(err, sizeof err, "%s is missing or short and the built-in text has %zu tokens (< %d)", text_path,
                     n_ids, n_pos);
            return setup_failure(err);
        }
        text_name = "(built-in paragraph)";
    }
    float *rk = NULL, *rv = NULL;
    const char *rot_desc;
    if (!rot_k && !use_had) {
        FILE *fk = fopen(def_k, "rb"), *fv = fopen(def_v, "rb");
        if (fk && fv) rot_k = def_k, rot_v = def_v;
        if (fk) fclose(fk);
        if (fv) fclose(fv);
        if (!rot_k) use_had = 1;
    }
    if (use_had) {
        rk = rv = llm_hadamard_rotations(c->num_layers, c->head_dim, err, sizeof err);
        rot_desc = "normalised Hadamard (data-free)";
    } else {
        rk = llm_load_rotations(rot_k, c->num_layers, c->head_dim, err, sizeof err);
        if (rk) rv = llm_load_rotations(rot_v, c->num_layers, c->head_dim, err, sizeof err);
        rot_desc = "calibrated (files)";
    }
    if (!rk || !rv) return setup_failure(err);
    PR("model %s; text %s, %d teacher-forced positions then %d greedy tokens\n", model_path, text_name, n_pos, n_gen);
    PR("cache: sink %d + recent %d bf16, INT2 pages of 16 (HND, f16 scale+min), demote 8 at a time, clip K %.2f / V %.2f; "
       "rotations: %s%s%s%s%s\n",
       sink, recent, clip_k, clip_v, rot_desc, rot_k ? " " : "", rot_k ? rot_k : "", rot_v ? " " : "", rot_v ? rot_v : "");

    const int32_t max_tokens = n_pos + n_gen + 1;
    const kv_shape shape = model_kv_shape(L.model, max_tokens);
    kv_oscar_desc od = {0};
    od.sink_tokens = sink > 0 ? sink : -1;
    od.recent_tokens = recent > 0 ? recent : -1;
    od.k_clip_ratio = clip_k, od.v_clip_ratio = clip_v;
    od.k_rotations = rk, od.v_rotations = rv;
    od.ctx = cpu;
    kv_backend *A = kv_backend_oscar_create(shape, &od, err, sizeof err);
    if (!A) return setup_failure(err);
    kv_backend *B = NULL;
    kv_oscar_qdq q = {0};
    if (gpu || !strcmp(against, "cpu")) {
        od.ctx = gpu ? gpu : cpu;
        B = kv_backend_oscar_create(shape, &od, err, sizeof err);
    } else {
        kv_sim_desc sd = {0};
        q.ctx = cpu, q.k_rotations = rk, q.v_rotations = rv, q.k_clip_ratio = clip_k, q.v_clip_ratio = clip_v;
        sd.sink_tokens = od.sink_tokens, sd.recent_tokens = od.recent_tokens;
        sd.qdq = kv_oscar_qdq_fn, sd.qdq_user = &q;
        B = kv_backend_sim_create(shape, &sd);
        if (!B) snprintf(err, sizeof err, "cannot create the simulated cache");
    }
    if (!B) return setup_failure(err);
    const int b_is_oscar = B->name && !strcmp(B->name, "oscar");

    const size_t V = (size_t)c->vocab_size;
    float *la = malloc(sizeof(float) * V), *lb = malloc(sizeof(float) * V);
    step *steps = calloc((size_t)(n_pos + n_gen), sizeof(step));
    int32_t *gen_a = calloc((size_t)n_gen + 1, sizeof(int32_t)), *gen_b = calloc((size_t)n_gen + 1, sizeof(int32_t));
    if (!la || !lb || !steps || !gen_a || !gen_b) return setup_failure("out of memory");
    A->reset(A), B->reset(B);
    double t_a = 0, t_b = 0;
    int32_t tok = ids[0];
    /* the first query that reads INT2 rows: the demotion of 8 tokens happens in the append of this
       position (kv_backend_oscar.h), before its attention */
    const int64_t first_int2 = (int64_t)(sink > 0 ? sink : 0) + (recent > 0 ? recent : 0) + 7;
    for (int32_t s = 0; s < n_pos + n_gen; s++) {
        const int64_t pos = s;
        double t0 = now_seconds();
        if (model_forward(L.model, A, &tok, 1, pos, la, 0) != 0) {
            snprintf(err, sizeof err, "CPU backend failed at position %lld: %s", (long long)pos, kv_backend_oscar_error(A));
            return setup_failure(err);
        }
        t_a += now_seconds() - t0;
        t0 = now_seconds();
        if (model_forward(L.model, B, &tok, 1, pos, lb, 0) != 0) {
            snprintf(err, sizeof err, "backend B failed at position %lld: %s", (long long)pos,
                     b_is_oscar ? kv_backend_oscar_error(B) : "simulated cache");
            return setup_failure(err);
        }
        t_b += now_seconds() - t0;
        step *st = &steps[s];
        st->pos = pos;
        st->greedy = s >= n_pos - 1;
        for (size_t i = 0; i < V; i++) {
            st->max_d = fmax(st->max_d, fabs((double)la[i] - lb[i]));
            st->max_abs = fmax(st->max_abs, fabs((double)la[i]));
        }
        st->top_a = llm_argmax(la, (int32_t)V);
        st->top_b = llm_argmax(lb, (int32_t)V);
        st->margin = (double)la[st->top_a] - la[st->top_b];
        if (s >= n_pos - 1 && s - (n_pos - 1) <= n_gen) {
            gen_a[s - (n_pos - 1)] = st->top_a;
            gen_b[s - (n_pos - 1)] = st->top_b;
        }
        tok = s + 1 < n_pos ? ids[s + 1] : st->top_a; /* teacher-forced, then A's greedy token */
    }

    /* report */
    PR("\nstep  position  max|Δlogit|  max|logit|  top-1 A  top-1 B  phase\n");
    double max_tf_win = 0, max_tf_int2 = 0, max_gen = 0;
    int greedy_same = 1, hard_mismatch = 0, first_diff = -1;
    for (int32_t s = 0; s < n_pos + n_gen; s++) {
        const step *st = &steps[s];
        const int in_gen = s >= n_pos - 1;
        if (in_gen) max_gen = fmax(max_gen, st->max_d);
        else if (st->pos < first_int2) max_tf_win = fmax(max_tf_win, st->max_d);
        else max_tf_int2 = fmax(max_tf_int2, st->max_d);
        if (in_gen && st->top_a != st->top_b) {
            greedy_same = 0;
            if (first_diff < 0) first_diff = s;
            if (st->margin > near_tie) hard_mismatch = 1;
        }
        const int show = in_gen || s % 32 == 0 || (st->pos >= first_int2 - 2 && st->pos < first_int2 + 10);
        if (show)
            PR("%4d  %8lld  %11.5f  %10.3f  %7d  %7d  %s%s\n", s, (long long)st->pos, st->max_d, st->max_abs, st->top_a,
               st->top_b, in_gen ? "greedy" : st->pos < first_int2 ? "teacher-forced, windows only" : "teacher-forced, INT2 + windows",
               st->top_a != st->top_b ? (in_gen ? "  <- DIFFERENT greedy token" : "  (top-1 differs)") : "");
    }
    const double max_all = fmax(max_tf_win, fmax(max_tf_int2, max_gen));
    char *ta = NULL, *tb = NULL;
    size_t la_len = 0, lb_len = 0;
    if (tokenizer_decode(L.tok, gen_a, (size_t)n_gen + 1, &ta, &la_len) != 0) ta = NULL;
    if (tokenizer_decode(L.tok, gen_b, (size_t)n_gen + 1, &tb, &lb_len) != 0) tb = NULL;
    /* one line each: newlines shown as \n */
    for (char **t = &ta; t; t = t == &ta ? &tb : NULL)
        if (*t) {
            size_t n = strlen(*t), extra = 0;
            for (size_t i = 0; i < n; i++) extra += (*t)[i] == '\n';
            char *e = malloc(n + extra + 1), *w = e;
            if (!e) break;
            for (size_t i = 0; i < n; i++) {
                if ((*t)[i] == '\n') *w++ = '\\', *w++ = 'n';
                else *w++ = (*t)[i];
            }
            *w = 0;
            free(*t);
            *t = e;
        }
    PR("\ngreedy continuation A (CPU backend): \"%s\"\n", ta ? ta : "?");
    PR("greedy continuation B (%s): \"%s\"\n", gpu ? "CUDA backend" : against, tb ? tb : "?");
    free(ta), free(tb);
    PR("greedy tokens: %s", greedy_same ? "identical" : "DIFFERENT");
    if (!greedy_same)
        PR(" (first at step %d; A's top-1 margin over B's choice %.4f %s near-tie threshold %.2f)", first_diff,
           steps[first_diff].margin, hard_mismatch ? ">" : "<=", near_tie);
    PR("\nmax |Δlogit|: teacher-forced positions < %lld (windows only) %.5f; positions >= %lld (INT2 + windows) %.5f; "
       "greedy %.5f; all %.5f (tolerance %.3g)\n",
       (long long)first_int2, max_tf_win, (long long)first_int2, max_tf_int2, max_gen, max_all, tol);
    kv_oscar_stats sa, sb;
    kv_backend_oscar_stats(A, &sa);
    PR("A (CPU): %lld quantize calls (%lld rows) %.2f s, %lld decode calls %.2f s, total step time %.1f s\n",
       (long long)sa.quantize_calls, (long long)sa.demoted_rows, sa.quantize_s, (long long)sa.decode_calls, sa.decode_s, t_a);
    if (b_is_oscar) {
        kv_backend_oscar_stats(B, &sb);
        PR("B (%s): %lld quantize calls (%lld rows) %.3f s, %lld decode calls %.3f s (%.1f us per call incl. copies and "
           "sync), total step time %.1f s\n",
           gpu ? "CUDA" : "CPU", (long long)sb.quantize_calls, (long long)sb.demoted_rows, sb.quantize_s,
           (long long)sb.decode_calls, sb.decode_s, 1e6 * sb.decode_s / (double)(sb.decode_calls ? sb.decode_calls : 1), t_b);
        /* INT2 pools written by the two backends */
        size_t bytes = 0, diff_k = 0, diff_v = 0, used = 0;
        kv_backend_oscar_read_codes(A, 0, NULL, NULL, &bytes);
        uint8_t *ka = malloc(bytes), *va = malloc(bytes), *kb = malloc(bytes), *vb = malloc(bytes);
        int codes_ok = ka && va && kb && vb;
        for (int32_t l = 0; codes_ok && l < c->num_layers; l++) {
            if (kv_backend_oscar_read_codes(A, l, ka, va, &bytes) || kv_backend_oscar_read_codes(B, l, kb, vb, &bytes)) {
                codes_ok = 0;
                break;
            }
            for (size_t i = 0; i < bytes; i++) {
                diff_k += ka[i] != kb[i], diff_v += va[i] != vb[i];
                used += ka[i] != 0 || kb[i] != 0;
            }
        }
        if (codes_ok)
            PR("INT2 pools after the run: %zu of %zu K code bytes and %zu V code bytes differ between A and B (%d layers; "
               "a differing byte holds 4 codes)\n",
               diff_k, used, diff_v, c->num_layers);
        else
            PR("INT2 pools: could not read them back: %s\n", kv_backend_oscar_error(B));
        free(ka), free(va), free(kb), free(vb);
    }
    if (gpu) {
        oscar_jit_stats js;
        if (oscar_query_jit_stats(gpu, &js) == OSCAR_OK)
            PR("JIT: %lld compiles (%.0f ms), %lld disk hits, %lld memory hits\n", (long long)js.compiles, js.compile_ms,
               (long long)js.disk_hits, (long long)js.memory_hits);
    }
    const int pass = max_all <= tol && !hard_mismatch;
    PR("result: %s (max |Δlogit| %.5f %s %.3g; greedy continuation %s)\n", pass ? "PASS" : "FAIL", max_all,
       max_all <= tol ? "<=" : ">", tol,
       greedy_same ? "identical" : hard_mismatch ? "DIFFERS beyond tolerance" : "differs only at a near tie");
    if (g_out) fclose(g_out);
    A->destroy(A), B->destroy(B);
    kv_oscar_qdq_free(&q);
    if (gpu) oscar_shutdown(gpu);
    oscar_shutdown(cpu);
    if (rv != rk) free(rv);
    free(rk), free(la), free(lb), free(steps), free(gen_a), free(gen_b), free(ids);
    llm_close(&L);
    return pass ? 0 : 1;
}
