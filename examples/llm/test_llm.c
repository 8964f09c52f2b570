/* test_llm — checks for the LLM example. Exit status 0 = all passed, 1 = a failure.

   test_llm [MODEL]

   Always: the GGUF reader on a small GGUF synthesized in memory (parses; every truncation
   is rejected; targeted corruptions are rejected with the expected message; random byte
   corruptions never crash), and the simulated KV cache's demotion schedule.
   When MODEL (default models/SmolLM2-135M-Instruct.Q4_1.gguf, or $LLM_MODEL) exists:
   truncated and corrupted copies of the real file are rejected or parsed safely, the
   tokenizer round-trips text and gives recorded ids, a batched prefill gives the same
   logits as token-by-token decoding, and the first greedy tokens of a fixed prompt equal
   recorded ones. Without the file those checks are skipped (reported, not failed). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llm_common.h"
#include "quant.h"

static int failures = 0;
#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            failures++;                                                   \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);          \
            fprintf(stderr, __VA_ARGS__);                                 \
            fprintf(stderr, "\n");                                        \
        }                                                                 \
    } while (0)

/* ------------------------------------------------------------ GGUF writer */

typedef struct buf { uint8_t *p; size_t n, cap; } buf;

static void put(buf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
        if (!b->p) { fprintf(stderr, "out of memory\n"); exit(1); }
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void put_u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buf *b, const char *s) { put_u64(b, strlen(s)); put(b, s, strlen(s)); }

/* Offsets of interesting fields in the synthesized file, for targeted corruption. */
typedef struct layout {
    size_t version, n_tensors, n_kv, name_len, str_len, arr_type, n_dims, ttype, toff, data;
} layout;

/* A GGUF v3 file: 4 metadata entries (u32, string, string array, f32 array) and two
   tensors: "a" F32 [4] and "b" Q8_0 [32, 2], the last one ending exactly at EOF. */
static buf make_gguf(layout *L, int dup_tensor) {
    buf b = {0};
    float f4[4] = {1.0f, -2.0f, 3.5f, 0.25f};
    put(&b, "GGUF", 4);
    L->version = b.n; put_u32(&b, 3);
    L->n_tensors = b.n; put_u64(&b, 2);
    L->n_kv = b.n; put_u64(&b, 4);
    L->name_len = b.n; put_str(&b, "test.count"); put_u32(&b, GGUF_VT_UINT32); put_u32(&b, 42);
    put_str(&b, "test.name"); put_u32(&b, GGUF_VT_STRING); L->str_len = b.n; put_str(&b, "hello");
    put_str(&b, "test.words"); put_u32(&b, GGUF_VT_ARRAY); L->arr_type = b.n; put_u32(&b, GGUF_VT_STRING);
    put_u64(&b, 3); put_str(&b, "x"); put_str(&b, "yy"); put_str(&b, "");
    put_str(&b, "test.floats"); put_u32(&b, GGUF_VT_ARRAY); put_u32(&b, GGUF_VT_FLOAT32); put_u64(&b, 4);
    put(&b, f4, 16);
    put_str(&b, "a"); L->n_dims = b.n; put_u32(&b, 1); put_u64(&b, 4); L->ttype = b.n; put_u32(&b, GGML_T_F32);
    L->toff = b.n; put_u64(&b, 0);
    put_str(&b, dup_tensor ? "a" : "b"); put_u32(&b, 2); put_u64(&b, 32); put_u64(&b, 2);
    put_u32(&b, GGML_T_Q8_0); put_u64(&b, 32);
    while (b.n % 32) put(&b, "", 1);
    L->data = b.n;
    put(&b, f4, 16);
    uint8_t pad[16] = {0};
    put(&b, pad, 16);
    for (int blk = 0; blk < 2; blk++) { /* Q8_0: f16 d = 0.5 (0x3800), q = i - 16 */
        uint8_t q[34];
        q[0] = 0x00; q[1] = 0x38;
        for (int i = 0; i < 32; i++) q[2 + i] = (uint8_t)(int8_t)(i - 16 + blk);
        put(&b, q, 34);
    }
    return b;
}

static void set_u32(buf *b, size_t off, uint32_t v) { memcpy(b->p + off, &v, 4); }
static void set_u64(buf *b, size_t off, uint64_t v) { memcpy(b->p + off, &v, 8); }

/* Expect parse failure with `needle` in the message. */
static void expect_reject(buf *b, const char *needle, const char *what) {
    gguf_file f;
    char err[512];
    int rc = gguf_parse(&f, b->p, b->n, err, sizeof err);
    CHECK(rc != 0, "%s: accepted", what);
    if (rc == 0) gguf_close(&f);
    else CHECK(strstr(err, needle) != NULL, "%s: message '%s' lacks '%s'", what, err, needle);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rng(void) {
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return rng_state;
}

static void test_gguf_synthetic(void) {
    layout L;
    buf b = make_gguf(&L, 0);
    gguf_file f;
    char err[512];
    int rc = gguf_parse(&f, b.p, b.n, err, sizeof err);
    CHECK(rc == 0, "valid synthetic file rejected: %s", err);
    if (rc == 0) {
        uint32_t u = 0;
        gguf_str s;
        CHECK(gguf_get_u32(&f, "test.count", &u) == 0 && u == 42, "test.count");
        CHECK(gguf_get_str(&f, "test.name", &s) == 0 && gguf_str_eq(s, "hello"), "test.name");
        const gguf_kv *w = gguf_find_kv(&f, "test.words");
        CHECK(w && w->v.arr.n == 3 && gguf_str_eq(w->v.arr.strs[1], "yy") && w->v.arr.strs[2].len == 0,
              "test.words");
        const gguf_tensor *ta = gguf_find_tensor(&f, "a"), *tb = gguf_find_tensor(&f, "b");
        CHECK(ta && ta->type == GGML_T_F32 && ta->n_bytes == 16, "tensor a");
        CHECK(tb && tb->type == GGML_T_Q8_0 && tb->ne[1] == 2 && tb->n_bytes == 68, "tensor b");
        if (ta && tb) {
            float x[64];
            CHECK(dequantize_row(ta->type, ta->data, x, 4) == 0 && x[2] == 3.5f, "dequant F32");
            CHECK(dequantize_row(tb->type, tb->data, x, 64) == 0 && x[0] == -8.0f && x[63] == 8.0f,
                  "dequant Q8_0: %g %g", x[0], x[63]);
        }
        CHECK(gguf_find_tensor(&f, "c") == NULL && gguf_get_u32(&f, "test.name", &u) != 0, "lookups");
        gguf_close(&f);
    }

    /* every truncation fails: the last tensor ends at EOF */
    int accepted = 0;
    for (size_t n = 0; n < b.n; n++) {
        if (gguf_parse(&f, b.p, n, err, sizeof err) == 0) { accepted++; gguf_close(&f); }
    }
    CHECK(accepted == 0, "%d truncated copies accepted", accepted);

    /* targeted corruptions, each with its message */
    struct { size_t off; int is64; uint64_t v; const char *needle, *what; } cases[] = {
        {0, 0, 0x46554747u + 1, "bad magic", "magic"},
        {L.version, 0, 1, "version 1", "version 1"},
        {L.n_tensors, 1, UINT64_C(1) << 60, "tensor count", "huge tensor count"},
        {L.n_kv, 1, UINT64_C(1) << 40, "metadata count", "huge kv count"},
        {L.name_len, 1, UINT64_C(1) << 62, "exceeds", "huge key length"},
        {L.str_len, 1, 10000, "exceeds", "string past EOF"},
        {L.arr_type, 0, GGUF_VT_ARRAY, "nested arrays", "nested array"},
        {L.arr_type, 0, 99, "element type 99", "bad array type"},
        {L.n_dims, 0, 5, "n_dims = 5", "n_dims 5"},
        {L.ttype, 0, 77, "unknown ggml type 77", "unknown tensor type"},
        {L.toff, 1, 4, "not a multiple of the alignment", "misaligned offset"},
        {L.toff, 1, 1u << 20, "truncated file", "offset past EOF"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        buf c = {0};
        put(&c, b.p, b.n);
        if (cases[i].is64) set_u64(&c, cases[i].off, cases[i].v);
        else set_u32(&c, cases[i].off, (uint32_t)cases[i].v);
        expect_reject(&c, cases[i].needle, cases[i].what);
        free(c.p);
    }
    layout L2;
    buf d = make_gguf(&L2, 1);
    expect_reject(&d, "duplicate tensor name 'a'", "duplicate tensor");
    free(d.p);

    /* random corruptions of the header region: parse or reject, never crash (run under ASan) */
    for (int it = 0; it < 20000; it++) {
        buf c = {0};
        put(&c, b.p, b.n);
        int flips = 1 + (int)(rng() % 4);
        for (int k = 0; k < flips; k++) c.p[rng() % L.data] = (uint8_t)rng();
        if (gguf_parse(&f, c.p, c.n, err, sizeof err) == 0) {
            for (uint64_t t = 0; t < f.num_tensors; t++) /* the data must be inside the buffer */
                CHECK(f.tensors[t].data >= c.p && f.tensors[t].data + f.tensors[t].n_bytes <= c.p + c.n,
                      "tensor out of bounds after corruption");
            gguf_close(&f);
        }
        free(c.p);
    }
    free(b.p);
}

/* ------------------------------------------------------------ KV demotion schedule */

typedef struct demote_log { int64_t lo, hi; int calls_k, calls_v, bad; } demote_log;

static void log_qdq(void *user, int32_t layer, int is_v, int64_t pos0, int32_t n_tokens, float *rows,
                    int32_t num_kv_heads, int32_t head_dim) {
    demote_log *d = user;
    (void)rows; (void)num_kv_heads; (void)head_dim;
    if (layer != 0) return;
    if (is_v) { d->calls_v++; return; }
    d->calls_k++;
    if (pos0 != d->hi) d->bad++; /* contiguous, in order */
    d->hi = pos0 + n_tokens;
}

static void test_kv_schedule(void) {
    kv_shape s = {2, 4, 2, 8, 64};
    demote_log d = {4, 4, 0, 0, 0};
    kv_sim_desc desc = {4, 8, 2, log_qdq, &d};
    kv_backend *kv = kv_backend_sim_create(s, &desc);
    CHECK(kv != NULL, "sim backend");
    if (!kv) return;
    float k[16], v[16], q[32], o[32];
    for (int i = 0; i < 16; i++) k[i] = v[i] = (float)i / 16.0f;
    for (int i = 0; i < 32; i++) q[i] = 0.1f;
    for (int64_t p = 0; p < 40; p++) {
        for (int32_t l = 0; l < 2; l++) {
            CHECK(kv->append(kv, l, p, k, v) == 0, "append %lld", (long long)p);
            CHECK(kv->attend(kv, l, p, q, o) == 0, "attend %lld", (long long)p);
        }
        const int64_t n = p + 1, recent = n - (d.hi > 4 ? d.hi : 4);
        if (n > 4) CHECK(recent >= (n - 4 < 8 ? n - 4 : 8) && recent <= 8 + 2 - 1, "recent holds %lld after %lld",
                         (long long)recent, (long long)n);
    }
    CHECK(d.bad == 0 && d.lo == 4 && d.hi == 32 && d.calls_k == d.calls_v && d.calls_k == 14,
          "demoted [%lld, %lld) in %d calls", (long long)d.lo, (long long)d.hi, d.calls_k);
    CHECK(kv->append(kv, 0, 41, k, v) != 0, "out-of-order append accepted");
    kv->destroy(kv);
}

/* ------------------------------------------------------------ with the real model */

static void test_real_file_corruption(const char *path) {
    gguf_file f;
    char err[512];
    if (gguf_open(&f, path, err, sizeof err) != 0) { CHECK(0, "%s", err); return; }
    const uint8_t *p = f.bytes;
    const size_t n = f.size_bytes, meta = (size_t)f.data_offset;
    const size_t cuts[] = {0, 3, 4, 8, 23, 24, 100, 4096, meta / 2, meta - 1, meta, meta + 1000, n / 2, n - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        gguf_file g;
        int rc = gguf_parse(&g, p, cuts[i], err, sizeof err);
        CHECK(rc != 0, "truncation at %zu accepted", cuts[i]);
        if (rc == 0) gguf_close(&g);
        else if (i == sizeof cuts / sizeof cuts[0] - 1)
            printf("  truncated real file (%zu of %zu bytes): \"%s\"\n", cuts[i], n, err);
    }
    uint8_t *c = malloc(meta);
    if (!c) { gguf_close(&f); return; }
    int rejected = 0, runs = 300;
    for (int it = 0; it < runs; it++) { /* corrupt the metadata + tensor-info region only */
        memcpy(c, p, meta);
        for (int k = 0; k < 3; k++) {
            size_t off = (size_t)(rng() % (it % 2 ? 4096 : meta)); /* half the runs hit the first 4 KB */
            c[off] = (uint8_t)rng();
        }
        gguf_file g;
        /* the copy lacks the tensor data: parsing must fail, or (if the corruption shrank the
           tensor table) describe only bytes inside the copy; it must never crash */
        if (gguf_parse(&g, c, meta, err, sizeof err) == 0) {
            for (uint64_t t = 0; t < g.num_tensors; t++)
                CHECK(g.tensors[t].data >= c && g.tensors[t].data + g.tensors[t].n_bytes <= c + meta,
                      "tensor out of bounds after corruption");
            gguf_close(&g);
        } else {
            rejected++;
        }
    }
    printf("  %d of %d corrupted real headers rejected, the rest parsed in bounds\n", rejected, runs);
    free(c);
    gguf_close(&f);
}

static int32_t argmax(const float *x, int32_t n) {
    int32_t b = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

static void test_model(const char *path) {
    llm L;
    char err[512];
    if (llm_open(&L, path, 8, err, sizeof err) != 0) { CHECK(0, "%s", err); return; }
    const model_config *c = &L.model->cfg;
    CHECK(c->num_layers == 30 && c->dim == 576 && c->num_heads == 9 && c->num_kv_heads == 3 &&
          c->head_dim == 64 && c->vocab_size == 49152 && c->tied_output && c->rope_theta == 100000.0f,
          "config");

    /* tokenizer */
    const char *s = "Hello world! It's 2024: naïve café, “quotes” — 日本語.\n\n  indented\ttab";
    int32_t *ids;
    size_t n;
    CHECK(tokenizer_encode(L.tok, s, strlen(s), 0, &ids, &n) == 0, "encode");
    char *back;
    size_t bl;
    CHECK(tokenizer_decode(L.tok, ids, n, &back, &bl) == 0 && bl == strlen(s) && memcmp(back, s, bl) == 0,
          "round trip");
    free(back);
    free(ids);
    const char *prompt = "The capital of France is";
    const int32_t want_prompt[] = {504, 3575, 282, 4649, 314};
    CHECK(tokenizer_encode(L.tok, prompt, strlen(prompt), 0, &ids, &n) == 0 && n == 5 &&
          memcmp(ids, want_prompt, sizeof want_prompt) == 0, "prompt ids");
    int32_t *sp;
    size_t nsp;
    const char *chat = "<|im_start|>user\nHi<|im_end|>";
    CHECK(tokenizer_encode(L.tok, chat, strlen(chat), 1, &sp, &nsp) == 0 && nsp >= 4 && sp[0] == 1 &&
          sp[nsp - 1] == 2, "special tokens");
    free(sp);

    /* batched prefill == token-by-token; then greedy tokens equal the recorded ones */
    const int32_t want_gen[] = {7042, 30, 198, 198, 504, 2988, 314, 42}; /* " Paris." "\n\n" "The answer is:" */
    const int32_t n_gen = (int32_t)(sizeof want_gen / sizeof want_gen[0]);
    kv_backend *kv1 = kv_backend_dense_create(model_kv_shape(L.model, 32), 1);
    kv_backend *kv2 = kv_backend_dense_create(model_kv_shape(L.model, 32), 1);
    float *l1 = malloc((size_t)c->vocab_size * sizeof(float)), *l2 = malloc((size_t)c->vocab_size * sizeof(float));
    if (!kv1 || !kv2 || !l1 || !l2) { CHECK(0, "out of memory"); return; }
    CHECK(model_forward(L.model, kv1, ids, (int32_t)n, 0, l1, 0) == 0, "batched forward");
    for (size_t i = 0; i < n; i++) CHECK(model_forward(L.model, kv2, ids + i, 1, (int64_t)i, l2, 0) == 0, "decode");
    CHECK(memcmp(l1, l2, (size_t)c->vocab_size * sizeof(float)) == 0, "batched and token-by-token logits differ");
    int32_t got[8];
    for (int32_t i = 0; i < n_gen; i++) {
        got[i] = argmax(l1, c->vocab_size);
        if (model_forward(L.model, kv1, &got[i], 1, (int64_t)n + i, l1, 0) != 0) { CHECK(0, "generate"); break; }
    }
    CHECK(memcmp(got, want_gen, sizeof want_gen) == 0, "greedy tokens %d %d %d %d %d %d %d %d", got[0], got[1],
          got[2], got[3], got[4], got[5], got[6], got[7]);
    printf("  greedy: \"%s", prompt);
    for (int32_t i = 0; i < n_gen; i++) {
        size_t tl;
        const char *t = tokenizer_token_bytes(L.tok, got[i], &tl);
        if (t) fwrite(t, 1, tl, stdout);
    }
    printf("\"\n");
    free(ids); free(l1); free(l2);
    kv1->destroy(kv1);
    kv2->destroy(kv2);
    llm_close(&L);
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : getenv("LLM_MODEL") ? getenv("LLM_MODEL") : LLM_DEFAULT_MODEL;
    printf("gguf reader, synthetic file\n");
    test_gguf_synthetic();
    printf("kv demotion schedule\n");
    test_kv_schedule();
    FILE *fp = fopen(path, "rb");
    if (fp) {
        fclose(fp);
        printf("real model file %s: truncation and corruption\n", path);
        test_real_file_corruption(path);
        printf("tokenizer and greedy tokens\n");
        test_model(path);
    } else {
        printf("SKIPPED model checks: %s not found (run examples/llm/fetch_model.sh)\n", path);
    }
    printf(failures ? "%d FAILED\n" : "all passed\n", failures);
    return failures ? 1 : 0;
}
