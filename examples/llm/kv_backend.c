/* kv_backend.c — the dense bf16 cache and the simulated quantized cache (kv_backend.h). */
#include "kv_backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant.h"

typedef struct dense_kv {
    float *k, *v;          /* [num_layers][max_tokens][num_kv_heads * head_dim] */
    float *scores;         /* [num_heads][max_tokens] */
    int64_t *n_tokens;     /* per layer: tokens appended */
    int64_t *next_demote;  /* per layer: first position not yet demoted */
    int round_bf16;
    kv_sim_desc sim;       /* sim.qdq == NULL: plain dense cache */
} dense_kv;

static size_t row_elems(const kv_shape *s) { return (size_t)s->num_kv_heads * (size_t)s->head_dim; }

static void dense_reset(kv_backend *b) {
    dense_kv *d = b->impl;
    for (int32_t l = 0; l < b->shape.num_layers; l++) {
        d->n_tokens[l] = 0;
        d->next_demote[l] = d->sim.sink_tokens;
    }
}

/* Demote every row that has left the recent window, demote_interval tokens at a time. */
static void demote(kv_backend *b, int32_t layer) {
    dense_kv *d = b->impl;
    const kv_shape *s = &b->shape;
    const int64_t n = d->n_tokens[layer];
    const int32_t step = d->sim.demote_interval;
    size_t re = row_elems(s);
    while (n - d->sim.recent_tokens - d->next_demote[layer] >= step) {
        int64_t p = d->next_demote[layer];
        size_t off = ((size_t)layer * (size_t)s->max_tokens + (size_t)p) * re;
        d->sim.qdq(d->sim.qdq_user, layer, 0, p, step, d->k + off, s->num_kv_heads, s->head_dim);
        d->sim.qdq(d->sim.qdq_user, layer, 1, p, step, d->v + off, s->num_kv_heads, s->head_dim);
        d->next_demote[layer] = p + step;
    }
}

static int dense_append(kv_backend *b, int32_t layer, int64_t pos, const float *k, const float *v) {
    dense_kv *d = b->impl;
    const kv_shape *s = &b->shape;
    if (layer < 0 || layer >= s->num_layers || pos != d->n_tokens[layer] || pos >= s->max_tokens)
        return -1;
    size_t re = row_elems(s);
    float *kd = d->k + ((size_t)layer * (size_t)s->max_tokens + (size_t)pos) * re;
    float *vd = d->v + ((size_t)layer * (size_t)s->max_tokens + (size_t)pos) * re;
    for (size_t i = 0; i < re; i++) {
        kd[i] = d->round_bf16 ? round_bf16(k[i]) : k[i];
        vd[i] = d->round_bf16 ? round_bf16(v[i]) : v[i];
    }
    d->n_tokens[layer] = pos + 1;
    if (d->sim.qdq) demote(b, layer);
    return 0;
}

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

static int dense_attend(kv_backend *b, int32_t layer, int64_t pos, const float *q, float *out) {
    dense_kv *d = b->impl;
    const kv_shape *s = &b->shape;
    if (layer < 0 || layer >= s->num_layers || pos + 1 != d->n_tokens[layer]) return -1;
    const int32_t hd = s->head_dim, group = s->num_heads / s->num_kv_heads;
    const size_t re = row_elems(s);
    const float *kl = d->k + (size_t)layer * (size_t)s->max_tokens * re;
    const float *vl = d->v + (size_t)layer * (size_t)s->max_tokens * re;
    const float scale = 1.0f / sqrtf((float)hd);
#ifdef _OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int32_t h = 0; h < s->num_heads; h++) {
        const int32_t g = h / group;
        float *scores = d->scores + (size_t)h * (size_t)s->max_tokens;
        const float *qh = q + (size_t)h * (size_t)hd;
        float *oh = out + (size_t)h * (size_t)hd;
        float mx = -INFINITY, sum = 0.0f;
        for (int64_t p = 0; p <= pos; p++) {
            float x = dot(qh, kl + (size_t)p * re + (size_t)g * (size_t)hd, hd) * scale;
            scores[p] = x;
            mx = x > mx ? x : mx;
        }
        for (int64_t p = 0; p <= pos; p++) {
            scores[p] = expf(scores[p] - mx);
            sum += scores[p];
        }
        for (int32_t i = 0; i < hd; i++) oh[i] = 0.0f;
        for (int64_t p = 0; p <= pos; p++) {
            const float w = scores[p] / sum;
            const float *vp = vl + (size_t)p * re + (size_t)g * (size_t)hd;
            for (int32_t i = 0; i < hd; i++) oh[i] += w * vp[i];
        }
    }
    return 0;
}

static void dense_destroy(kv_backend *b) {
    if (!b) return;
    dense_kv *d = b->impl;
    if (d) {
        free(d->k); free(d->v); free(d->scores); free(d->n_tokens); free(d->next_demote);
        free(d);
    }
    free(b);
}

static kv_backend *create(kv_shape shape, int round, const kv_sim_desc *sim) {
    if (shape.num_layers <= 0 || shape.num_heads <= 0 || shape.num_kv_heads <= 0 || shape.head_dim <= 0 ||
        shape.max_tokens <= 0 || shape.num_heads % shape.num_kv_heads != 0)
        return NULL;
    kv_backend *b = calloc(1, sizeof *b);
    dense_kv *d = calloc(1, sizeof *d);
    if (!b || !d) { free(b); free(d); return NULL; }
    b->impl = d;
    b->shape = shape;
    b->reset = dense_reset;
    b->append = dense_append;
    b->attend = dense_attend;
    b->destroy = dense_destroy;
    size_t n = (size_t)shape.num_layers * (size_t)shape.max_tokens * row_elems(&shape);
    d->k = malloc(n * sizeof(float));
    d->v = malloc(n * sizeof(float));
    d->scores = malloc((size_t)shape.num_heads * (size_t)shape.max_tokens * sizeof(float));
    d->n_tokens = calloc((size_t)shape.num_layers, sizeof(int64_t));
    d->next_demote = calloc((size_t)shape.num_layers, sizeof(int64_t));
    d->round_bf16 = round;
    if (sim) d->sim = *sim;
    if (!d->k || !d->v || !d->scores || !d->n_tokens || !d->next_demote) { dense_destroy(b); return NULL; }
    dense_reset(b);
    return b;
}

kv_backend *kv_backend_dense_create(kv_shape shape, int round_bf16) {
    kv_backend *b = create(shape, round_bf16, NULL);
    if (b) b->name = round_bf16 ? "bf16" : "f32";
    return b;
}

kv_backend *kv_backend_sim_create(kv_shape shape, const kv_sim_desc *desc) {
    kv_sim_desc s = *desc;
    if (!s.qdq) return NULL;
    s.sink_tokens = s.sink_tokens == 0 ? 64 : s.sink_tokens < 0 ? 0 : s.sink_tokens;
    s.recent_tokens = s.recent_tokens == 0 ? 256 : s.recent_tokens < 0 ? 0 : s.recent_tokens;
    s.demote_interval = s.demote_interval <= 0 ? 8 : s.demote_interval;
    kv_backend *b = create(shape, 1, &s);
    if (b) b->name = "sim-quant";
    return b;
}

/* ------------------------------------------------------------ built-in INT2 qdq */

/* y = x·H with the normalised Sylvester Hadamard matrix (H symmetric, H·H = I). */
static void hadamard(float *x, int32_t n) {
    for (int32_t len = 1; len < n; len <<= 1)
        for (int32_t i = 0; i < n; i += 2 * len)
            for (int32_t j = i; j < i + len; j++) {
                float a = x[j], c = x[j + len];
                x[j] = a + c;
                x[j + len] = a - c;
            }
    const float s = 1.0f / sqrtf((float)n);
    for (int32_t i = 0; i < n; i++) x[i] *= s;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

/* OSCAR-SPEC.md §4 sort path: tau = sort(|x|)[CLIP_INDEX], clamp to [-tau, tau]. */
static void clip_row(float *x, int32_t n, float ratio, float *tmp) {
    if (ratio <= 0.0f) return;
    int32_t ci = (int32_t)(ratio * (float)n);
    ci = ci < 0 ? 0 : ci > n - 1 ? n - 1 : ci;
    for (int32_t i = 0; i < n; i++) tmp[i] = fabsf(x[i]);
    qsort(tmp, (size_t)n, sizeof(float), cmp_float);
    const float tau = tmp[ci];
    for (int32_t i = 0; i < n; i++) x[i] = x[i] > tau ? tau : x[i] < -tau ? -tau : x[i];
}

/* OSCAR-SPEC.md §3.2/§3.3: min-max asymmetric INT2 of one group, quantize then dequantize. */
static void qdq_group(float *x, int32_t n) {
    float mn = x[0], mx = x[0];
    for (int32_t i = 1; i < n; i++) { mn = x[i] < mn ? x[i] : mn; mx = x[i] > mx ? x[i] : mx; }
    const float range = mx - mn > 1e-8f ? mx - mn : 1e-8f;
    const float scale = range / 3.0f;
    const float zero = -mn / scale;
    for (int32_t i = 0; i < n; i++) {
        float c = truncf(x[i] / scale + zero + 0.5f);
        c = c < 0.0f ? 0.0f : c > 3.0f ? 3.0f : c;
        x[i] = (c - zero) * scale;
    }
}

void qdq_int2(void *user, int32_t layer, int is_v, int64_t pos0, int32_t n_tokens, float *rows,
              int32_t num_kv_heads, int32_t head_dim) {
    const qdq_int2_desc *q = user;
    float tmp[1024];
    int32_t gs = (q && q->group_size > 0) ? q->group_size : head_dim;
    const float clip = q ? (is_v ? q->v_clip_ratio : q->k_clip_ratio) : 0.0f;
    (void)layer; (void)pos0;
    /* not reachable with this model (head_dim 64); refuse rather than compute nonsense */
    if (head_dim > 1024 || head_dim % gs != 0) return;
    if (q && q->hadamard && (head_dim & (head_dim - 1)) != 0) return;
    for (int64_t r = 0; r < (int64_t)n_tokens * num_kv_heads; r++) {
        float *x = rows + r * head_dim;
        if (q && q->hadamard) hadamard(x, head_dim);
        clip_row(x, head_dim, clip, tmp);
        for (int32_t g = 0; g < head_dim; g += gs) qdq_group(x + g, gs);
        if (q && q->hadamard) hadamard(x, head_dim);
    }
}
