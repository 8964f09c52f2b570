/* llm_eval — teacher-forced perplexity of a text file, through the decode path.

   llm_eval -f TEXT [-m MODEL] [--ctx N] [--batch B] [--max-windows W] [KV options]
            [--capture FILE [--capture-dtype f32|bf16] [--capture-max-pos P]]
            [--dump-logits FILE --dump-n N]

   The text is tokenized (no BOS: the file's add_bos_token is false) and cut into
   non-overlapping windows of N tokens (default 2048; 0 = the whole text in one window,
   up to the model's context length); a trailing partial window is dropped unless it is the
   only one. Each window starts from an empty KV cache; token t (t >= 1) is scored by
   log p(x_t | x_0..x_{t-1}). Tokens go through model_forward in batches of B, whose
   attention runs token by token through the KV backend, so every score is the one a
   single-token decode step would produce (the KV backend sees appends in position order).

   Output: perplexity over all scored tokens, and over the tokens at positions >= sink +
   recent (the ones whose attention reads quantized history in the int2 caches).
   --capture writes the post-RoPE q, k, v of every token and layer (capture.h).
   --dump-logits writes the f32 logits of the first N positions of window 0 (dev checks). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "capture.h"
#include "llm_common.h"

static void usage(void) {
    fprintf(stderr,
            "usage: llm_eval -f TEXT [-m MODEL] [--ctx N] [--batch B] [--max-windows W] [KV options]\n"
            "  -f TEXT              text file to score\n"
            "  -m MODEL             GGUF file (default " LLM_DEFAULT_MODEL ")\n"
            "  --ctx N              window length in tokens (default 2048; 0 = whole text)\n"
            "  --batch B            tokens per forward call (default 32; results do not depend on it)\n"
            "  --max-windows W      score at most W windows (default all)\n"
            "  --capture FILE       write post-RoPE q/k/v of every token and layer (capture.h)\n"
            "  --capture-dtype T    f32 (default) or bf16\n"
            "  --capture-max-pos P  capture only positions < P of each window\n"
            "  --dump-logits FILE   write logits of the first --dump-n (default 16) positions of window 0\n"
            "  --rope norm|neox     RoPE pairing (default norm)\n%s",
            kv_options_usage());
}

/* log-softmax of logits at index target, in double */
static double log_prob(const float *logits, int32_t n, int32_t target) {
    float mx = logits[0];
    for (int32_t i = 1; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    double s = 0.0;
    for (int32_t i = 0; i < n; i++) s += exp((double)logits[i] - mx);
    return (double)logits[target] - mx - log(s);
}

int main(int argc, char **argv) {
    const char *model_path = LLM_DEFAULT_MODEL, *text_path = NULL, *capture_path = NULL, *dump_path = NULL;
    int32_t ctx = 2048, batch = 32, max_windows = 0, capture_dtype = 0, dump_n = 16;
    int64_t capture_max_pos = 0;
    rope_style rope = ROPE_NORM;
    kv_options kvo = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = kv_parse_option(&kvo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-m") && v) model_path = argv[++i];
        else if (!strcmp(a, "-f") && v) text_path = argv[++i];
        else if (!strcmp(a, "--ctx") && v) { ctx = atoi(v); i++; }
        else if (!strcmp(a, "--batch") && v) { batch = atoi(v); i++; }
        else if (!strcmp(a, "--max-windows") && v) { max_windows = atoi(v); i++; }
        else if (!strcmp(a, "--capture") && v) capture_path = argv[++i];
        else if (!strcmp(a, "--capture-dtype") && v && (!strcmp(v, "f32") || !strcmp(v, "bf16"))) {
            capture_dtype = !strcmp(v, "bf16");
            i++;
        } else if (!strcmp(a, "--capture-max-pos") && v) { capture_max_pos = atoll(v); i++; }
        else if (!strcmp(a, "--dump-logits") && v) dump_path = argv[++i];
        else if (!strcmp(a, "--dump-n") && v) { dump_n = atoi(v); i++; }
        else if (!strcmp(a, "--rope") && v && (!strcmp(v, "norm") || !strcmp(v, "neox"))) {
            rope = !strcmp(v, "neox") ? ROPE_NEOX : ROPE_NORM;
            i++;
        } else { usage(); return 2; }
    }
    if (!text_path || ctx < 0 || batch < 1 || max_windows < 0 || dump_n < 1) { usage(); return 2; }

    char err[512];
    llm L;
    if (llm_open(&L, model_path, batch, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    L.model->rope = rope;
    const model_config *c = &L.model->cfg;
    size_t text_len;
    char *text = read_file(text_path, &text_len);
    if (!text) { fprintf(stderr, "cannot read %s\n", text_path); return 1; }
    int32_t *ids;
    size_t n_ids;
    if (tokenizer_encode(L.tok, text, text_len, 0, &ids, &n_ids) != 0 || n_ids < 2) {
        fprintf(stderr, "%s: fewer than 2 tokens\n", text_path);
        return 1;
    }
    if (ctx == 0) ctx = n_ids < (size_t)c->context_length ? (int32_t)n_ids : c->context_length;
    if (ctx > c->context_length) {
        fprintf(stderr, "--ctx %d exceeds the model's context length %d\n", ctx, c->context_length);
        return 1;
    }
    size_t n_windows = n_ids / (size_t)ctx;
    int32_t last_len = ctx;
    if (n_windows == 0) { n_windows = 1; last_len = (int32_t)n_ids; }
    if (max_windows > 0 && n_windows > (size_t)max_windows) n_windows = (size_t)max_windows;

    kv_backend *kv = kv_create(&kvo, model_kv_shape(L.model, ctx));
    float *logits = malloc((size_t)batch * (size_t)c->vocab_size * sizeof(float));
    if (!kv || !logits) { fprintf(stderr, "out of memory\n"); return 1; }
    qkv_capture cap;
    if (capture_path) {
        if (qkv_capture_open(&cap, capture_path, c->num_layers, c->num_heads, c->num_kv_heads, c->head_dim,
                             capture_dtype) != 0) {
            fprintf(stderr, "cannot write %s\n", capture_path);
            return 1;
        }
        cap.max_pos = capture_max_pos;
        L.model->capture = qkv_capture_write;
        L.model->capture_user = &cap;
    }
    FILE *dump = dump_path ? fopen(dump_path, "wb") : NULL;
    if (dump_path && !dump) { fprintf(stderr, "cannot write %s\n", dump_path); return 1; }

    const int32_t sink = kvo.sim.sink_tokens == 0 ? 64 : kvo.sim.sink_tokens < 0 ? 0 : kvo.sim.sink_tokens;
    const int32_t recent = kvo.sim.recent_tokens == 0 ? 256 : kvo.sim.recent_tokens < 0 ? 0 : kvo.sim.recent_tokens;
    const int64_t far = sink + recent;
    char desc[256];
    kv_describe(&kvo, desc, sizeof desc);
    fprintf(stderr, "text: %s, %zu bytes, %zu tokens; %zu window(s) of %d tokens; kv: %s; batch %d\n", text_path,
            text_len, n_ids, n_windows, n_windows == 1 ? last_len : ctx, desc, batch);

    double nll = 0.0, nll_far = 0.0;
    int64_t n_scored = 0, n_far = 0;
    const double t0 = now_seconds();
    for (size_t w = 0; w < n_windows; w++) {
        const int32_t *win = ids + w * (size_t)ctx;
        const int32_t len = n_windows == 1 ? last_len : ctx;
        kv->reset(kv);
        cap.seq = (uint32_t)w;
        for (int32_t p = 0; p < len; p += batch) {
            const int32_t nb = len - p < batch ? len - p : batch;
            if (model_forward(L.model, kv, win + p, nb, p, logits, 1) != 0) {
                fprintf(stderr, "forward failed at window %zu position %d\n", w, p);
                return 1;
            }
            for (int32_t b = 0; b < nb; b++) {
                const int32_t pos = p + b;
                const float *lg = logits + (size_t)b * (size_t)c->vocab_size;
                if (dump && w == 0 && pos < dump_n) fwrite(lg, sizeof(float), (size_t)c->vocab_size, dump);
                if (pos + 1 >= len) continue;
                const double lp = log_prob(lg, c->vocab_size, win[pos + 1]);
                nll -= lp;
                n_scored++;
                if (pos + 1 >= far) { nll_far -= lp; n_far++; }
            }
        }
        fprintf(stderr, "window %zu: running ppl %.4f (%lld tokens, %.1f s)\n", w, exp(nll / (double)n_scored),
                (long long)n_scored, now_seconds() - t0);
    }
    const double dt = now_seconds() - t0;
    printf("kv=%s ctx=%d windows=%zu scored=%lld ppl=%.4f nll=%.6f", desc, n_windows == 1 ? last_len : ctx,
           n_windows, (long long)n_scored, exp(nll / (double)n_scored), nll / (double)n_scored);
    if (n_far > 0)
        printf(" ppl_pos>=%lld=%.4f (%lld tokens)", (long long)far, exp(nll_far / (double)n_far), (long long)n_far);
    printf(" time=%.1fs tok/s=%.1f\n", dt, (double)(n_scored + (int64_t)n_windows) / dt);
    if (capture_path) {
        if (qkv_capture_close(&cap) != 0) { fprintf(stderr, "writing %s failed\n", capture_path); return 1; }
        fprintf(stderr, "captured %llu records to %s\n", (unsigned long long)cap.num_records, capture_path);
    }
    if (dump) fclose(dump);
    kv->destroy(kv);
    free(logits); free(ids); free(text);
    llm_close(&L);
    return 0;
}
