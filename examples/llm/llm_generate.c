/* llm_generate — greedy generation from a prompt.

   llm_generate [-m MODEL] [-p PROMPT] [-n N] [--chat] [--batch B] [--ids] [KV options]

   --chat wraps the prompt in the model's chat template (ChatML with SmolLM2's default
   system message). The prompt is run in batches of B tokens (same result as token-by-token,
   see model.h), then one token per step; generation stops at N tokens or an end token. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm_common.h"

static const char *chat_fmt =
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
    "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n";

static int32_t argmax(const float *x, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

static void usage(void) {
    fprintf(stderr,
            "usage: llm_generate [-m MODEL] [-p PROMPT] [-n N] [--chat] [--batch B] [--ids] [--rope norm|neox]\n"
            "  -m MODEL      GGUF file (default " LLM_DEFAULT_MODEL ")\n"
            "  -p PROMPT     prompt text (default \"The capital of France is\")\n"
            "  -n N          tokens to generate (default 32)\n"
            "  --chat        apply the chat template\n"
            "  --batch B     prompt tokens per forward call (default 64)\n"
            "  --ids         also print the token ids\n"
            "  --rope        RoPE pairing (default norm; neox is wrong for GGUF llama, for checks)\n%s",
            kv_options_usage());
}

int main(int argc, char **argv) {
    const char *model_path = LLM_DEFAULT_MODEL, *prompt = "The capital of France is";
    int32_t n_gen = 32, batch = 64;
    int chat = 0, print_ids = 0;
    rope_style rope = ROPE_NORM;
    kv_options kvo = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int r = kv_parse_option(&kvo, argc, argv, &i);
        if (r < 0) return 2;
        if (r > 0) continue;
        if (!strcmp(a, "-m") && v) { model_path = v; i++; }
        else if (!strcmp(a, "-p") && v) { prompt = v; i++; }
        else if (!strcmp(a, "-n") && v) { n_gen = atoi(v); i++; }
        else if (!strcmp(a, "--batch") && v) { batch = atoi(v); i++; }
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--ids")) print_ids = 1;
        else if (!strcmp(a, "--rope") && v && (!strcmp(v, "norm") || !strcmp(v, "neox"))) {
            rope = !strcmp(v, "neox") ? ROPE_NEOX : ROPE_NORM;
            i++;
        } else { usage(); return 2; }
    }
    if (n_gen < 0 || batch < 1) { usage(); return 2; }

    char err[512];
    llm L;
    double t0 = now_seconds();
    if (llm_open(&L, model_path, batch, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    L.model->rope = rope;
    const model_config *c = &L.model->cfg;
    double t_load = now_seconds() - t0;

    char *text = NULL;
    size_t text_len;
    if (chat) {
        text_len = strlen(chat_fmt) + strlen(prompt);
        text = malloc(text_len + 1);
        snprintf(text, text_len + 1, chat_fmt, prompt);
        text_len = strlen(text);
    } else {
        text_len = strlen(prompt);
        text = malloc(text_len + 1);
        if (text) memcpy(text, prompt, text_len + 1);
    }
    int32_t *ids;
    size_t n_prompt;
    if (!text || tokenizer_encode(L.tok, text, text_len, chat, &ids, &n_prompt) != 0 || n_prompt == 0) {
        fprintf(stderr, "empty prompt or out of memory\n");
        return 1;
    }
    const int32_t max_tokens = (int32_t)n_prompt + n_gen;
    if (max_tokens > c->context_length) {
        fprintf(stderr, "prompt + generation (%d tokens) exceeds the context length %d\n", max_tokens,
                c->context_length);
        return 1;
    }
    kv_backend *kv = kv_create(&kvo, model_kv_shape(L.model, max_tokens));
    float *logits = malloc((size_t)c->vocab_size * sizeof(float));
    int32_t *out = malloc(((size_t)n_gen + 1) * sizeof(int32_t));
    if (!kv || !logits || !out) { fprintf(stderr, "out of memory\n"); return 1; }
    char desc[256];
    kv_describe(&kvo, desc, sizeof desc);
    fprintf(stderr, "model: %d layers, dim %d, %d/%d heads x %d, vocab %d, rope theta %g (%s), load %.2f s\n",
            c->num_layers, c->dim, c->num_heads, c->num_kv_heads, c->head_dim, c->vocab_size, c->rope_theta,
            rope == ROPE_NORM ? "norm" : "neox", t_load);
    fprintf(stderr, "kv: %s; prompt %zu tokens\n", desc, n_prompt);

    double t1 = now_seconds();
    for (size_t p = 0; p < n_prompt; p += (size_t)batch) {
        int32_t nb = (int32_t)(n_prompt - p < (size_t)batch ? n_prompt - p : (size_t)batch);
        if (model_forward(L.model, kv, ids + p, nb, (int64_t)p, logits, 0) != 0) {
            fprintf(stderr, "forward failed\n");
            return 1;
        }
    }
    double t2 = now_seconds();
    fwrite(text, 1, text_len, stdout);
    int32_t n_out = 0;
    for (int32_t s = 0; s < n_gen; s++) {
        int32_t next = argmax(logits, c->vocab_size);
        out[n_out++] = next;
        if (next == tokenizer_eos(L.tok) || next == 0) break; /* <|im_end|> or <|endoftext|> */
        size_t bl;
        const char *bytes = tokenizer_token_bytes(L.tok, next, &bl);
        fwrite(bytes, 1, bl, stdout);
        fflush(stdout);
        if (s + 1 < n_gen &&
            model_forward(L.model, kv, &next, 1, (int64_t)n_prompt + s, logits, 0) != 0) {
            fprintf(stderr, "forward failed\n");
            return 1;
        }
    }
    double t3 = now_seconds();
    printf("\n");
    if (print_ids) {
        printf("prompt ids:");
        for (size_t i = 0; i < n_prompt; i++) printf(" %d", ids[i]);
        printf("\ngenerated ids:");
        for (int32_t i = 0; i < n_out; i++) printf(" %d", out[i]);
        printf("\n");
    }
    fprintf(stderr, "prompt: %.1f tok/s (%zu tokens, %.2f s); generation: %.1f tok/s (%d tokens, %.2f s)\n",
            (double)n_prompt / (t2 - t1), n_prompt, t2 - t1, n_out > 1 ? (n_out - 1) / (t3 - t2) : 0.0,
            n_out, t3 - t2);
    kv->destroy(kv);
    free(logits); free(out); free(ids); free(text);
    llm_close(&L);
    return 0;
}
