/* model.c — see model.h. */
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

/* ------------------------------------------------------------------ load */

typedef struct loader {
    const gguf_file *f;
    float *arena;
    size_t used, cap;
    char *err;
    size_t errlen;
} loader;

/* Find `name`, check its shape is [ne0, ne1] (ne1 = 1 for vectors), dequantize it into the
   arena. NULL on any mismatch, with the reason in err. */
static const float *load_tensor(loader *L, const char *name, uint64_t ne0, uint64_t ne1) {
    const gguf_tensor *t = gguf_find_tensor(L->f, name);
    if (!t) {
        snprintf(L->err, L->errlen, "model: tensor '%s' is missing", name);
        return NULL;
    }
    if (t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != 1 || t->ne[3] != 1) {
        snprintf(L->err, L->errlen, "model: tensor '%s' has shape [%llu, %llu, %llu, %llu]; expected [%llu, %llu]",
                 name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                 (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
                 (unsigned long long)ne0, (unsigned long long)ne1);
        return NULL;
    }
    if (!dequant_supported(t->type)) {
        snprintf(L->err, L->errlen, "model: tensor '%s' has ggml type %s (%u); this example reads only F32, Q4_1, Q8_0",
                 name, ggml_type_name(t->type), t->type);
        return NULL;
    }
    size_t n = (size_t)(ne0 * ne1);
    if (L->used + n > L->cap) {
        snprintf(L->err, L->errlen, "model: internal error: weight arena too small");
        return NULL;
    }
    float *dst = L->arena + L->used;
    if (dequantize_row(t->type, t->data, dst, n) != 0) {
        snprintf(L->err, L->errlen, "model: cannot dequantize '%s'", name);
        return NULL;
    }
    L->used += n;
    return dst;
}

static int get_u32(const gguf_file *f, const char *key, int32_t *out, char *err, size_t errlen) {
    uint32_t v;
    if (gguf_get_u32(f, key, &v) != 0 || v == 0 || v > (1u << 24)) {
        snprintf(err, errlen, "model: metadata '%s' is missing or out of range", key);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

void model_free(model *m) {
    if (!m) return;
    free(m->arena);
    free(m->layers);
    free(m->x); free(m->xn); free(m->q); free(m->k); free(m->v); free(m->att); free(m->h1); free(m->h2);
    free(m);
}

model *model_load(const gguf_file *f, int32_t max_batch, char *err, size_t errlen) {
    char e2[8];
    if (!err) { err = e2; errlen = sizeof e2; }
    gguf_str arch;
    if (gguf_get_str(f, "general.architecture", &arch) != 0 || !gguf_str_eq(arch, "llama")) {
        snprintf(err, errlen, "model: general.architecture must be \"llama\"");
        return NULL;
    }
    model *m = calloc(1, sizeof *m);
    if (!m) { snprintf(err, errlen, "model: out of memory"); return NULL; }
    model_config *c = &m->cfg;
    if (get_u32(f, "llama.block_count", &c->num_layers, err, errlen) ||
        get_u32(f, "llama.embedding_length", &c->dim, err, errlen) ||
        get_u32(f, "llama.feed_forward_length", &c->ffn_dim, err, errlen) ||
        get_u32(f, "llama.attention.head_count", &c->num_heads, err, errlen) ||
        get_u32(f, "llama.attention.head_count_kv", &c->num_kv_heads, err, errlen) ||
        get_u32(f, "llama.context_length", &c->context_length, err, errlen))
        goto fail;
    if (c->dim % c->num_heads != 0 || c->num_heads % c->num_kv_heads != 0) {
        snprintf(err, errlen, "model: dim %d / heads %d / kv heads %d do not divide", c->dim, c->num_heads,
                 c->num_kv_heads);
        goto fail;
    }
    c->head_dim = c->dim / c->num_heads;
    uint32_t u;
    if (gguf_get_u32(f, "llama.rope.dimension_count", &u) == 0 && (int32_t)u != c->head_dim) {
        snprintf(err, errlen, "model: partial RoPE (dimension_count %u, head_dim %d) is not supported", u, c->head_dim);
        goto fail;
    }
    if (c->head_dim % 2 != 0 || c->head_dim > 1024) {
        snprintf(err, errlen, "model: head_dim %d; expected even, <= 1024", c->head_dim);
        goto fail;
    }
    if (gguf_get_f32(f, "llama.rope.freq_base", &c->rope_theta) != 0) c->rope_theta = 10000.0f;
    if (gguf_get_f32(f, "llama.attention.layer_norm_rms_epsilon", &c->rms_eps) != 0) c->rms_eps = 1e-5f;
    if (!(c->rope_theta > 1.0f) || !(c->rms_eps > 0.0f && c->rms_eps < 1.0f)) {
        snprintf(err, errlen, "model: rope.freq_base %g or rms epsilon %g out of range", c->rope_theta, c->rms_eps);
        goto fail;
    }
    const gguf_tensor *emb = gguf_find_tensor(f, "token_embd.weight");
    if (!emb || emb->ne[1] == 0 || emb->ne[1] > (1u << 24)) {
        snprintf(err, errlen, "model: tensor 'token_embd.weight' is missing");
        goto fail;
    }
    c->vocab_size = (int32_t)emb->ne[1];
    c->tied_output = gguf_find_tensor(f, "output.weight") == NULL;

    /* arena size */
    const size_t D = (size_t)c->dim, F = (size_t)c->ffn_dim, KV = (size_t)c->num_kv_heads * (size_t)c->head_dim;
    const size_t per_layer = 2 * D + D * D * 2 + 2 * D * KV + 3 * D * F;
    size_t cap = (size_t)c->vocab_size * D * (c->tied_output ? 1 : 2) + D + per_layer * (size_t)c->num_layers;
    loader L = {f, malloc(cap * sizeof(float)), 0, cap, err, errlen};
    m->arena = L.arena;
    m->layers = calloc((size_t)c->num_layers, sizeof(layer_weights));
    if (!m->arena || !m->layers) { snprintf(err, errlen, "model: out of memory for %zu MB of weights", cap * 4 >> 20); goto fail; }

    if (!(m->token_embd = load_tensor(&L, "token_embd.weight", D, (uint64_t)c->vocab_size))) goto fail;
    if (!(m->output_norm = load_tensor(&L, "output_norm.weight", D, 1))) goto fail;
    m->output = c->tied_output ? m->token_embd : load_tensor(&L, "output.weight", D, (uint64_t)c->vocab_size);
    if (!m->output) goto fail;
    for (int32_t l = 0; l < c->num_layers; l++) {
        char name[64];
        layer_weights *w = &m->layers[l];
#define LOAD(field, suffix, a, b) \
        snprintf(name, sizeof name, "blk.%d." suffix, (int)l); \
        if (!(w->field = load_tensor(&L, name, a, b))) goto fail;
        LOAD(attn_norm, "attn_norm.weight", D, 1)
        LOAD(wq, "attn_q.weight", D, D)
        LOAD(wk, "attn_k.weight", D, KV)
        LOAD(wv, "attn_v.weight", D, KV)
        LOAD(wo, "attn_output.weight", D, D)
        LOAD(ffn_norm, "ffn_norm.weight", D, 1)
        LOAD(w_gate, "ffn_gate.weight", D, F)
        LOAD(w_up, "ffn_up.weight", D, F)
        LOAD(w_down, "ffn_down.weight", F, D)
#undef LOAD
    }

    m->max_batch = max_batch > 0 ? max_batch : 1;
    const size_t B = (size_t)m->max_batch;
    m->x = malloc(B * D * sizeof(float));
    m->xn = malloc(B * D * sizeof(float));
    m->q = malloc(B * D * sizeof(float));
    m->k = malloc(B * KV * sizeof(float));
    m->v = malloc(B * KV * sizeof(float));
    m->att = malloc(B * D * sizeof(float));
    m->h1 = malloc(B * F * sizeof(float));
    m->h2 = malloc(B * F * sizeof(float));
    if (!m->x || !m->xn || !m->q || !m->k || !m->v || !m->att || !m->h1 || !m->h2) {
        snprintf(err, errlen, "model: out of memory");
        goto fail;
    }
    return m;
fail:
    model_free(m);
    return NULL;
}

kv_shape model_kv_shape(const model *m, int32_t max_tokens) {
    kv_shape s = {m->cfg.num_layers, m->cfg.num_heads, m->cfg.num_kv_heads, m->cfg.head_dim, max_tokens};
    return s;
}

/* ------------------------------------------------------------------ math */

/* 16 independent partial sums: vectorises without -ffast-math and gives the same result
   for a row whatever the batch size or thread count. */
static float dot(const float *a, const float *b, int32_t n) {
    float acc[16] = {0};
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) acc[j] += a[i + j] * b[i + j];
    float s = 0.0f;
    for (int j = 0; j < 16; j++) s += acc[j];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* dot() for four vectors against one weight row: the same per-lane operations in the same
   order (so results are bit-identical to dot()), with four independent FMA chains and one
   load of w for four tokens. */
static void dot4(const float *w, const float *x0, const float *x1, const float *x2, const float *x3,
                 int32_t n, float *out) {
    float a0[16] = {0}, a1[16] = {0}, a2[16] = {0}, a3[16] = {0};
    int32_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) {
            const float wj = w[i + j];
            a0[j] += wj * x0[i + j];
            a1[j] += wj * x1[i + j];
            a2[j] += wj * x2[i + j];
            a3[j] += wj * x3[i + j];
        }
    float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
    for (int j = 0; j < 16; j++) { s0 += a0[j]; s1 += a1[j]; s2 += a2[j]; s3 += a3[j]; }
    for (; i < n; i++) { s0 += w[i] * x0[i]; s1 += w[i] * x1[i]; s2 += w[i] * x2[i]; s3 += w[i] * x3[i]; }
    out[0] = s0; out[1] = s1; out[2] = s2; out[3] = s3;
}

/* y[b][o] = sum_i W[o][i] x[b][i] for b < B; W is [out][in] (ggml ne0 = in). */
static void matmul(float *y, const float *x, const float *W, int32_t B, int32_t in, int32_t out) {
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int32_t o = 0; o < out; o++) {
        const float *w = W + (size_t)o * (size_t)in;
        int32_t b = 0;
        for (; b + 4 <= B; b += 4) {
            float r[4];
            const float *xb = x + (size_t)b * (size_t)in;
            dot4(w, xb, xb + in, xb + 2 * (size_t)in, xb + 3 * (size_t)in, in, r);
            for (int j = 0; j < 4; j++) y[(size_t)(b + j) * (size_t)out + (size_t)o] = r[j];
        }
        for (; b < B; b++) y[(size_t)b * (size_t)out + (size_t)o] = dot(w, x + (size_t)b * (size_t)in, in);
    }
}

static void rmsnorm(float *y, const float *x, const float *g, int32_t n, float eps) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int32_t i = 0; i < n; i++) y[i] = x[i] * r * g[i];
}

static void rope(float *x, int32_t num_heads, int32_t hd, int64_t pos, float theta, rope_style style) {
    for (int32_t i = 0; i < hd / 2; i++) {
        const double ang = (double)pos * pow((double)theta, -2.0 * i / hd);
        const float c = (float)cos(ang), s = (float)sin(ang);
        for (int32_t h = 0; h < num_heads; h++) {
            float *v = x + (size_t)h * (size_t)hd;
            const int32_t a = style == ROPE_NORM ? 2 * i : i;
            const int32_t b = style == ROPE_NORM ? 2 * i + 1 : i + hd / 2;
            const float x0 = v[a], x1 = v[b];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}

/* ------------------------------------------------------------------ forward */

int model_forward(model *m, kv_backend *kv, const int32_t *tokens, int32_t n, int64_t pos0,
                  float *logits, int all_logits) {
    const model_config *c = &m->cfg;
    const int32_t Di = c->dim, Fi = c->ffn_dim;
    const size_t D = (size_t)c->dim, F = (size_t)c->ffn_dim, KV = (size_t)c->num_kv_heads * (size_t)c->head_dim;
    if (n <= 0 || n > m->max_batch) return -1;
    for (int32_t b = 0; b < n; b++) {
        if (tokens[b] < 0 || tokens[b] >= c->vocab_size) return -1;
        memcpy(m->x + (size_t)b * D, m->token_embd + (size_t)tokens[b] * D, D * sizeof(float));
    }
    for (int32_t l = 0; l < c->num_layers; l++) {
        const layer_weights *w = &m->layers[l];
        for (int32_t b = 0; b < n; b++)
            rmsnorm(m->xn + (size_t)b * D, m->x + (size_t)b * D, w->attn_norm, Di, c->rms_eps);
        matmul(m->q, m->xn, w->wq, n, Di, Di);
        matmul(m->k, m->xn, w->wk, n, Di, (int32_t)KV);
        matmul(m->v, m->xn, w->wv, n, Di, (int32_t)KV);
        for (int32_t b = 0; b < n; b++) {
            float *q = m->q + (size_t)b * D, *k = m->k + (size_t)b * KV, *v = m->v + (size_t)b * KV;
            const int64_t pos = pos0 + b;
            rope(q, c->num_heads, c->head_dim, pos, c->rope_theta, m->rope);
            rope(k, c->num_kv_heads, c->head_dim, pos, c->rope_theta, m->rope);
            if (m->capture) m->capture(m->capture_user, l, pos, q, k, v);
            if (kv->append(kv, l, pos, k, v) != 0) return -1;
            if (kv->attend(kv, l, pos, q, m->att + (size_t)b * D) != 0) return -1;
        }
        matmul(m->xn, m->att, w->wo, n, Di, Di);
        for (size_t i = 0; i < (size_t)n * D; i++) m->x[i] += m->xn[i];

        for (int32_t b = 0; b < n; b++)
            rmsnorm(m->xn + (size_t)b * D, m->x + (size_t)b * D, w->ffn_norm, Di, c->rms_eps);
        matmul(m->h1, m->xn, w->w_gate, n, Di, Fi);
        matmul(m->h2, m->xn, w->w_up, n, Di, Fi);
        for (size_t i = 0; i < (size_t)n * F; i++) {
            const float g = m->h1[i];
            m->h1[i] = g / (1.0f + expf(-g)) * m->h2[i];
        }
        matmul(m->xn, m->h1, w->w_down, n, Fi, Di);
        for (size_t i = 0; i < (size_t)n * D; i++) m->x[i] += m->xn[i];
    }
    if (!logits) return 0;
    const int32_t first = all_logits ? 0 : n - 1;
    for (int32_t b = first; b < n; b++)
        rmsnorm(m->xn + (size_t)(b - first) * D, m->x + (size_t)b * D, m->output_norm, Di, c->rms_eps);
    matmul(logits, m->xn, m->output, n - first, Di, c->vocab_size);
    return 0;
}
