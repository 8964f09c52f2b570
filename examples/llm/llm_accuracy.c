/* llm_accuracy — perplexity and attention-level error of a 2-bit KV cache on a real model:
   BF16 vs OSCAR vs the baselines, written to bench/results/accuracy.{md,json}.

   llm_accuracy --rot-k FILE --rot-v FILE [-m MODEL] [--eval TEXT] [--calib-text TEXT]
                [--ctx N] [--windows W] [--batch B] [--rows LIST] [--kl-every N] [--no-probe] [--no-twin]
                [--backend real|sim] [--out-md FILE] [--out-json FILE]

   Perplexity (teacher-forced, the llm_eval protocol): the evaluation text (default GPL-3) is
   cut into W (default 2) non-overlapping windows of N (default 2048) tokens, each scored from
   an empty cache, every token but the window's first. Reported over all scored tokens and
   over the tokens at positions >= 320 (= sink 64 + recent 256: the ones whose attention
   reads INT2 history in the windowed rows). Each row is a KV cache:

     bf16          dense cache, K/V rounded to bf16, attention in f32 (the baseline)
     naive         per-token symmetric INT2, no rotation: s = max|x| per (token, head) row,
                   code = clamp(round(x/s), -2, 1) (the textbook signed 2-bit quantizer, so
                   in effect {-s, 0, +s}); sink 64 + recent 256 in bf16
     minmax        OSCAR's quantizer without rotation or clip (asymmetric min-max INT2, one
                   (scale, min) per row); same windows
     hadamard      normalised Hadamard rotation (oscar_rotation_set_hadamard, QuaRot-style,
                   data-free), no clip; same windows
     hadamard-clip the same with OSCAR's clip K 0.96 / V 0.92 (isolates the calibrated U)
     oscar         calibrated R_k = U_Q·H·P_br, R_v = U_S·H·P_br (--rot-k/--rot-v), clip K 0.96 /
                   V 0.92, sink 64, recent 256, demote 8 at a time
     oscar-noclip  the same without clipping
     oscar-nowin   the same without windows: sink 0, recent 0, every row quantized as it is
                   appended (demote interval 1; the query never sees a bf16 row)
     hadamard-nowin  hadamard-clip without windows (for comparison with oscar-nowin)
   and, only when named in --rows, diagnostics: oscar-sink (sink 64, no recent window),
   oscar-recent (recent 256, no sink), oscar-sink4 (sink 4 + recent 256), kcal-vhad and
   khad-vcal (the calibrated rotation on one side, the Hadamard on the other), hadamard-g32
   and oscar-g32 (two scale groups of 32 per row).

   Caches (--backend real, the default): every row that uses oscar's quantizer runs on the
   real oscar backend (kv_backend_oscar on an OSCAR_BACKEND_CPU context: oscar_quantize_kv on
   every demotion, oscar_decode_run per layer and token, float64 reference decode). The naive
   row has its own quantizer and runs on the simulated cache (kv_backend_sim_create, the
   quantizer as demotion hook). The `oscar` row also runs, in lockstep on the same tokens,
   the simulated cache with oscar's quantizer as hook (oscar_quantize_kv + oscar_dequantize_kv
   then R^T): logits and perplexity of the two are compared. --backend sim swaps the roles
   (the table from the simulated caches, the real backend as the oscar row's twin).

   Attention-level error (unless --no-probe), during the bf16 pass: every method keeps a
   shadow cache fed with the same bf16 rows and demoted on the same schedule; every --kl-every
   (default 32) positions from 320 on, each layer's attention of the bf16 run's query is
   computed in float64 from the bf16 rows and from each shadow: per layer,
     KL(p_bf16 || p_q) averaged over query heads and sampled positions,
     relative error sqrt(Σ|o_q - o|² / Σ|o|²) of the attention output (before W_O),
     relative error of the logits q·k/sqrt(D) over the quantized tokens, and the relative MSE
     of the quantized K and V rows themselves.
   The inputs are the bf16 run's, so this isolates each layer's quantization error (errors do
   not propagate from earlier layers here; the perplexity rows include propagation). */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kv_backend_oscar.h"
#include "llm_oscar_util.h"
#include "quant.h"

#define FAR_POS 320

typedef enum { Q_NONE, Q_NAIVE_SYM, Q_OSCAR } qkind;
typedef enum { ROT_NONE, ROT_HADAMARD, ROT_CALIB } rotkind;

typedef struct method {
    const char *id, *label;
    qkind q;
    rotkind rot;                    /* R_k and R_v, unless rot_v says otherwise */
    float kclip, vclip;
    int32_t sink, recent, interval; /* kv_sim_desc convention: -1 = none */
    int extra;                      /* not in the default set: only with --rows */
    rotkind rot_v;                  /* 0 (= ROT_NONE): same kind as rot; else R_v's kind */
    int32_t group;                  /* scale group size; 0 = head_dim */
} method;


static const method METHODS[] = {
    /* id, label, quantizer, rotation, clip K, clip V, sink, recent, demote interval, extra, R_v kind, group */
    {"bf16", "BF16 (dense, K/V rounded to bf16)", Q_NONE, ROT_NONE, 0, 0, 0, 0, 0, 0, ROT_NONE, 0},
    {"naive", "naive INT2: per-token symmetric, no rotation", Q_NAIVE_SYM, ROT_NONE, 0, 0, 64, 256, 8, 0, ROT_NONE, 0},
    {"minmax", "INT2 min-max (asymmetric), no rotation, no clip", Q_OSCAR, ROT_NONE, 0, 0, 64, 256, 8, 0, ROT_NONE, 0},
    {"hadamard", "Hadamard-only INT2 (QuaRot-style), no clip", Q_OSCAR, ROT_HADAMARD, 0, 0, 64, 256, 8, 0, ROT_NONE, 0},
    {"hadamard-clip", "Hadamard-only INT2, clip K .96 / V .92", Q_OSCAR, ROT_HADAMARD, 0.96f, 0.92f, 64, 256, 8, 0,
     ROT_NONE, 0},
    {"oscar", "OSCAR INT2 (U·H·P_br, clip K .96 / V .92)", Q_OSCAR, ROT_CALIB, 0.96f, 0.92f, 64, 256, 8, 0, ROT_NONE, 0},
    {"oscar-noclip", "OSCAR without clipping", Q_OSCAR, ROT_CALIB, 0, 0, 64, 256, 8, 0, ROT_NONE, 0},
    {"oscar-nowin", "OSCAR without windows (everything INT2)", Q_OSCAR, ROT_CALIB, 0.96f, 0.92f, -1, -1, 1, 0, ROT_NONE, 0},
    {"hadamard-nowin", "Hadamard-only, clip, without windows", Q_OSCAR, ROT_HADAMARD, 0.96f, 0.92f, -1, -1, 1, 0,
     ROT_NONE, 0},
    /* diagnostics (--rows): which window matters */
    {"oscar-sink", "OSCAR, sink 64 only (recent 0: the <= 7 newest tokens wait in bf16)", Q_OSCAR, ROT_CALIB, 0.96f,
     0.92f, 64, -1, 8, 1, ROT_NONE, 0},
    {"oscar-recent", "OSCAR, recent 256 only (no sink)", Q_OSCAR, ROT_CALIB, 0.96f, 0.92f, -1, 256, 8, 1, ROT_NONE, 0},
    {"oscar-sink4", "OSCAR, sink 4 + recent 256", Q_OSCAR, ROT_CALIB, 0.96f, 0.92f, 4, 256, 8, 1, ROT_NONE, 0},
    /* diagnostics (--rows): which side the calibrated rotation helps or hurts */
    {"kcal-vhad", "R_k calibrated, R_v Hadamard, clip", Q_OSCAR, ROT_CALIB, 0.96f, 0.92f, 64, 256, 8, 1, ROT_HADAMARD, 0},
    {"khad-vcal", "R_k Hadamard, R_v calibrated, clip", Q_OSCAR, ROT_HADAMARD, 0.96f, 0.92f, 64, 256, 8, 1, ROT_CALIB, 0},
    /* diagnostics (--rows): two scale groups per row (32 dims each; 3 bits per element with f16 scale+min):
       where P_br and the balanced importance of U_Q·H should matter */
    {"hadamard-g32", "Hadamard-only, clip, group 32", Q_OSCAR, ROT_HADAMARD, 0.96f, 0.92f, 64, 256, 8, 1, ROT_NONE, 32},
    {"oscar-g32", "OSCAR, clip, group 32", Q_OSCAR, ROT_CALIB, 0.96f, 0.92f, 64, 256, 8, 1, ROT_NONE, 32},
};
#define N_METHODS ((int)(sizeof METHODS / sizeof METHODS[0]))

/* ------------------------------------------------------------------ quantizers */

/* naive INT2: per (token, head) row, symmetric, s = max|x| / qmax with qmax = 1, codes -2..1 */
static void qdq_naive_sym(void *user, int32_t layer, int is_v, int64_t pos0, int32_t n_tokens, float *rows,
                          int32_t num_kv_heads, int32_t head_dim) {
    (void)user, (void)layer, (void)is_v, (void)pos0;
    for (int64_t r = 0; r < (int64_t)n_tokens * num_kv_heads; r++) {
        float *x = rows + r * head_dim, m = 0.0f;
        for (int32_t i = 0; i < head_dim; i++) m = fmaxf(m, fabsf(x[i]));
        if (m == 0.0f) continue;
        for (int32_t i = 0; i < head_dim; i++) {
            float c = rintf(x[i] / m);
            c = c < -2.0f ? -2.0f : c > 1.0f ? 1.0f : c;
            x[i] = c * m;
        }
    }
}

typedef struct rotations {
    float *had, *calib_k, *calib_v;
} rotations;

static const float *rot_of(const method *m, int is_v, const rotations *R) {
    const rotkind k = is_v && m->rot_v != ROT_NONE ? m->rot_v : m->rot;
    return k == ROT_HADAMARD ? R->had : k == ROT_CALIB ? (is_v ? R->calib_v : R->calib_k) : NULL;
}

typedef struct quantizer {
    const method *m;
    kv_oscar_qdq oq;
} quantizer;

static void quantizer_init(quantizer *z, const method *m, oscar_ctx *cpu, const rotations *R) {
    memset(z, 0, sizeof *z);
    z->m = m;
    z->oq.ctx = cpu;
    z->oq.k_rotations = rot_of(m, 0, R);
    z->oq.v_rotations = rot_of(m, 1, R);
    z->oq.k_clip_ratio = m->kclip;
    z->oq.v_clip_ratio = m->vclip;
    z->oq.group_size = m->group;
}

static void quantizer_fn(void *user, int32_t layer, int is_v, int64_t pos0, int32_t n, float *rows, int32_t H, int32_t D) {
    quantizer *z = user;
    if (z->m->q == Q_NAIVE_SYM) qdq_naive_sym(NULL, layer, is_v, pos0, n, rows, H, D);
    else kv_oscar_qdq_fn(&z->oq, layer, is_v, pos0, n, rows, H, D);
}

static int32_t win_sink(const method *m) { return m->sink < 0 ? 0 : m->sink; }
static int32_t win_recent(const method *m) { return m->recent < 0 ? 0 : m->recent; }

/* The cache of a row: dense (bf16), the real oscar backend (real = 1, oscar-path rows), or the
   simulated cache with the row's quantizer. */
static kv_backend *make_backend(const method *m, quantizer *z, kv_shape shape, int real, oscar_ctx *cpu,
                                const rotations *R, char *err, size_t errlen) {
    if (m->q == Q_NONE) return kv_backend_dense_create(shape, 1);
    if (real && m->q == Q_OSCAR) {
        kv_oscar_desc od = {0};
        od.ctx = cpu;
        od.sink_tokens = m->sink, od.recent_tokens = m->recent, od.demote_interval = m->interval;
        od.k_clip_ratio = m->kclip, od.v_clip_ratio = m->vclip;
        od.group_size = m->group;
        od.k_rotations = rot_of(m, 0, R);
        od.v_rotations = rot_of(m, 1, R);
        return kv_backend_oscar_create(shape, &od, err, errlen);
    }
    kv_sim_desc s = {0};
    s.sink_tokens = m->sink, s.recent_tokens = m->recent, s.demote_interval = m->interval;
    s.qdq = quantizer_fn;
    s.qdq_user = z;
    return kv_backend_sim_create(shape, &s);
}

/* ------------------------------------------------------------------ the probe backend */

typedef struct shadow {
    const method *m;
    quantizer z;
    float *k, *v;           /* [L][T][re] */
    int64_t *next_demote;   /* per layer */
    double *kl, *o_num, *o_den, *s_num, *s_den, *k_num, *k_den, *v_num, *v_den; /* per layer */
    int64_t *n_kl;
    double *sig_e;          /* [L][Hkv][D][D]: Σ e eᵀ of the K rows' quantization error (unrotated space) */
    int64_t *n_e;           /* per layer: rows in sig_e (per head) */
} shadow;

typedef struct probe {
    kv_backend *inner;      /* the dense bf16 cache the model runs on */
    kv_shape s;
    float *rk, *rv;         /* [L][T][re] the bf16 rows */
    shadow *sh;
    int n_sh;
    int32_t kl_every;
    double *cq;             /* [L][Hkv][D][D]: Σ q qᵀ of the query heads of each KV head, positions >= FAR_POS */
    int64_t *n_q;           /* per layer: query rows per KV head in cq */
} probe;

static size_t re_of(const kv_shape *s) { return (size_t)s->num_kv_heads * (size_t)s->head_dim; }

static void probe_reset(kv_backend *b) {
    probe *P = b->impl;
    P->inner->reset(P->inner);
    for (int i = 0; i < P->n_sh; i++)
        for (int32_t l = 0; l < P->s.num_layers; l++) P->sh[i].next_demote[l] = win_sink(P->sh[i].m);
}

static int probe_append(kv_backend *b, int32_t layer, int64_t pos, const float *k, const float *v) {
    probe *P = b->impl;
    if (P->inner->append(P->inner, layer, pos, k, v)) return -1;
    const size_t re = re_of(&P->s), off = ((size_t)layer * (size_t)P->s.max_tokens + (size_t)pos) * re;
    for (size_t i = 0; i < re; i++) P->rk[off + i] = round_bf16(k[i]), P->rv[off + i] = round_bf16(v[i]);
    for (int i = 0; i < P->n_sh; i++) {
        shadow *S = &P->sh[i];
        memcpy(S->k + off, P->rk + off, re * sizeof(float));
        memcpy(S->v + off, P->rv + off, re * sizeof(float));
        const int32_t step = S->m->interval, recent = win_recent(S->m);
        while (pos + 1 - recent - S->next_demote[layer] >= step) {
            const int64_t p = S->next_demote[layer];
            const size_t o2 = ((size_t)layer * (size_t)P->s.max_tokens + (size_t)p) * re, n = (size_t)step * re;
            for (int side = 0; side < 2; side++) {
                float *rows = side ? S->v + o2 : S->k + o2;
                const float *ref = side ? P->rv + o2 : P->rk + o2;
                quantizer_fn(&S->z, layer, side, p, step, rows, P->s.num_kv_heads, P->s.head_dim);
                double num = 0, den = 0;
                for (size_t e = 0; e < n; e++) {
                    const double d = (double)rows[e] - ref[e];
                    num += d * d, den += (double)ref[e] * ref[e];
                }
                if (side) S->v_num[layer] += num, S->v_den[layer] += den;
                else S->k_num[layer] += num, S->k_den[layer] += den;
                if (side == 0) { /* error covariance of the K rows, per KV head */
                    const int32_t D = P->s.head_dim, H = P->s.num_kv_heads;
                    for (int32_t t = 0; t < step; t++)
                        for (int32_t h = 0; h < H; h++) {
                            double e[256];
                            double *Sg = S->sig_e + (((size_t)layer * H + (size_t)h) * D) * D;
                            for (int32_t i = 0; i < D; i++) {
                                const size_t at = ((size_t)t * H + (size_t)h) * D + (size_t)i;
                                e[i] = (double)rows[at] - ref[at];
                            }
                            for (int32_t i = 0; i < D; i++)
                                for (int32_t j = 0; j < D; j++) Sg[i * D + j] += e[i] * e[j];
                        }
                    S->n_e[layer] += step;
                }
            }
            S->next_demote[layer] = p + step;
        }
    }
    return 0;
}

/* softmax attention of one head in float64: scores s[0..n), returns lse, o */
static double attend64(const float *q, const float *K, const float *V, int64_t n, size_t re, int32_t D, int32_t g,
                       double *s, double *o) {
    const double scale = 1.0 / sqrt((double)D);
    double mx = -INFINITY;
    for (int64_t t = 0; t < n; t++) {
        const float *k = K + (size_t)t * re + (size_t)g * D;
        double acc = 0;
        for (int32_t i = 0; i < D; i++) acc += (double)q[i] * k[i];
        s[t] = acc * scale;
        mx = s[t] > mx ? s[t] : mx;
    }
    double sum = 0;
    for (int32_t i = 0; i < D; i++) o[i] = 0;
    for (int64_t t = 0; t < n; t++) {
        const double w = exp(s[t] - mx);
        const float *v = V + (size_t)t * re + (size_t)g * D;
        sum += w;
        for (int32_t i = 0; i < D; i++) o[i] += w * v[i];
    }
    for (int32_t i = 0; i < D; i++) o[i] /= sum;
    return mx + log(sum);
}

static int probe_attend(kv_backend *b, int32_t layer, int64_t pos, const float *q, float *out) {
    probe *P = b->impl;
    if (P->inner->attend(P->inner, layer, pos, q, out)) return -1;
    if (pos < FAR_POS) return 0;
    { /* query covariance per KV head (GQA group), for the K error anatomy */
        const int32_t D = P->s.head_dim, grp = P->s.num_heads / P->s.num_kv_heads;
        for (int32_t h = 0; h < P->s.num_heads; h++) {
            double *C = P->cq + (((size_t)layer * P->s.num_kv_heads + (size_t)(h / grp)) * D) * D;
            const float *qh = q + (size_t)h * D;
            for (int32_t i = 0; i < D; i++)
                for (int32_t j = 0; j < D; j++) C[i * D + j] += (double)qh[i] * qh[j];
        }
        P->n_q[layer] += grp;
    }
    if ((pos - FAR_POS) % P->kl_every != 0) return 0;
    const kv_shape *s = &P->s;
    const size_t re = re_of(s), lo = (size_t)layer * (size_t)s->max_tokens * re;
    const int32_t D = s->head_dim, group = s->num_heads / s->num_kv_heads;
    const int64_t n = pos + 1;
#ifdef _OPENMP
#pragma omp parallel for schedule(dynamic)
#endif
    for (int32_t h = 0; h < s->num_heads; h++) {
        double *sr = malloc(sizeof(double) * (size_t)n * 2), *sq = sr + n, o_r[256], o_q[256];
        if (!sr) continue;
        const float *qh = q + (size_t)h * D;
        const int32_t g = h / group;
        const double lse_r = attend64(qh, P->rk + lo, P->rv + lo, n, re, D, g, sr, o_r);
        double on = 0;
        for (int32_t i = 0; i < D; i++) on += o_r[i] * o_r[i];
        for (int i = 0; i < P->n_sh; i++) {
            shadow *S = &P->sh[i];
            const double lse_q = attend64(qh, S->k + lo, S->v + lo, n, re, D, g, sq, o_q);
            double kl = 0, dn = 0, sn = 0, sd = 0;
            for (int64_t t = 0; t < n; t++) {
                const double lp = sr[t] - lse_r, lq = sq[t] - lse_q;
                kl += exp(lp) * (lp - lq);
            }
            /* logits of the quantized tokens: [sink, next_demote) */
            for (int64_t t = win_sink(S->m); t < S->next_demote[layer] && t < n; t++) {
                const double d = sq[t] - sr[t];
                sn += d * d, sd += sr[t] * sr[t];
            }
            for (int32_t e = 0; e < D; e++) dn += (o_q[e] - o_r[e]) * (o_q[e] - o_r[e]);
#ifdef _OPENMP
#pragma omp critical
#endif
            {
                S->kl[layer] += kl > 0 ? kl : 0;
                S->n_kl[layer]++;
                S->o_num[layer] += dn, S->o_den[layer] += on;
                S->s_num[layer] += sn, S->s_den[layer] += sd;
            }
        }
        free(sr);
    }
    return 0;
}

static void probe_destroy(kv_backend *b) { (void)b; }

/* ------------------------------------------------------------------ perplexity runs */

typedef struct row_result {
    const method *m;
    double nll, nll_far, time_s;
    int64_t n, n_far;
    int ran, real;
    kv_oscar_stats st; /* real oscar backend only */
    char err[512];
} row_result;

typedef struct text {
    const char *path;
    size_t bytes, n_ids;
    int32_t *ids;
} text;

/* A second cache run in lockstep with a row's (the real oscar backend against the simulated one). */
typedef struct twin_result {
    int ran;
    double nll, nll_far, time_s;
    int64_t n, n_far, top1_same, positions;
    double max_dlogit, sum_dnll, max_dnll;
    /* by position in the window: [0, first INT2 position), [.., 1024), [1024, ctx) */
    double b_max[3];
    int64_t b_top1[3], b_n[3];
    int64_t first_int2;
    int real;              /* the twin is the real oscar backend */
    kv_oscar_stats st;
} twin_result;

static const char *backend_label(const method *m, int real) {
    if (m->q == Q_NONE) return "dense";
    if (m->q == Q_NAIVE_SYM) return "sim (own quantizer)";
    return real ? "oscar (CPU backend)" : "sim (oscar qdq)";
}

/* Teacher-forced NLL of windows through one backend (and a twin in lockstep, optional). */
static int run_ppl(llm *L, kv_backend *kv, kv_backend *twin, const text *T, size_t n_windows, int32_t ctx,
                   int32_t batch, float *logits, float *logits2, row_result *r, twin_result *tw, const char *tag) {
    const model_config *c = &L->model->cfg;
    const size_t V = (size_t)c->vocab_size;
    double t_main = 0;
    r->nll = r->nll_far = 0, r->n = r->n_far = 0;
    if (twin) {
        memset(tw, 0, sizeof *tw);
        /* the first position whose query reads INT2 rows (the sim/real schedule of kv_backend.h) */
        tw->first_int2 = (int64_t)win_sink(r->m) + win_recent(r->m) + r->m->interval - 1;
    }
    for (size_t w = 0; w < n_windows; w++) {
        const int32_t *win = T->ids + w * (size_t)ctx;
        kv->reset(kv);
        if (twin) twin->reset(twin);
        for (int32_t p = 0; p < ctx; p += batch) {
            const int32_t nb = ctx - p < batch ? ctx - p : batch;
            double t0 = now_seconds();
            if (model_forward(L->model, kv, win + p, nb, p, logits, 1) != 0) {
                snprintf(r->err, sizeof r->err, "forward failed at window %zu position %d%s%s", w, p,
                         kv->name && !strcmp(kv->name, "oscar") ? ": " : "",
                         kv->name && !strcmp(kv->name, "oscar") ? kv_backend_oscar_error(kv) : "");
                return -1;
            }
            t_main += now_seconds() - t0;
            if (twin) {
                t0 = now_seconds();
                if (model_forward(L->model, twin, win + p, nb, p, logits2, 1) != 0) {
                    snprintf(r->err, sizeof r->err, "twin forward failed at window %zu position %d", w, p);
                    return -1;
                }
                tw->time_s += now_seconds() - t0;
            }
            for (int32_t b = 0; b < nb; b++) {
                const int32_t pos = p + b;
                const float *x = logits + (size_t)b * V;
                double lp2 = 0;
                if (twin) {
                    const float *y = logits2 + (size_t)b * V;
                    double md = 0;
                    for (size_t i = 0; i < V; i++) md = fmax(md, fabs((double)x[i] - y[i]));
                    const int same = llm_argmax(x, (int32_t)V) == llm_argmax(y, (int32_t)V);
                    const int bk = pos < tw->first_int2 ? 0 : pos < 1024 ? 1 : 2;
                    tw->max_dlogit = fmax(tw->max_dlogit, md);
                    tw->top1_same += same;
                    tw->positions++;
                    tw->b_max[bk] = fmax(tw->b_max[bk], md), tw->b_top1[bk] += same, tw->b_n[bk]++;
                    if (pos + 1 < ctx) lp2 = llm_log_prob(y, (int32_t)V, win[pos + 1]);
                }
                if (pos + 1 >= ctx) continue;
                const double lp = llm_log_prob(x, (int32_t)V, win[pos + 1]);
                r->nll -= lp, r->n++;
                if (pos + 1 >= FAR_POS) r->nll_far -= lp, r->n_far++;
                if (twin) {
                    tw->nll -= lp2, tw->n++;
                    if (pos + 1 >= FAR_POS) tw->nll_far -= lp2, tw->n_far++;
                    tw->sum_dnll += fabs(lp - lp2);
                    tw->max_dnll = fmax(tw->max_dnll, fabs(lp - lp2));
                }
            }
        }
        fprintf(stderr, "  [%s] window %zu: ppl %.4f (ppl pos>=%d %.4f), %.0f s%s\n", tag, w, exp(r->nll / (double)r->n),
                FAR_POS, exp(r->nll_far / (double)(r->n_far ? r->n_far : 1)), t_main, twin ? " (+ twin)" : "");
    }
    r->time_s = t_main;
    r->ran = 1;
    if (twin) tw->ran = 1;
    return 0;
}

/* ------------------------------------------------------------------ rotation diagnostics */

/* Per layer, from a calibrated K rotation file's R = U·H·P and eigenvalues λ of C_Q:
   C_Q = U Λ Uᵀ with U = R Pᵀ H (P relabels channels, so diag(Rᵀ C_Q R) is a permutation of
   diag(H Λ H), which is flat). Reported: λ_max/mean λ (how anisotropic the query covariance
   is), and the max/mean of the per-channel importance diag(Mᵀ C_Q M) for M = I (no
   rotation), H (Hadamard only) and R (OSCAR: exactly 1). */
typedef struct diag_row {
    double lam_ratio, top4_share, imp_none, imp_had, imp_oscar;
} diag_row;

static void hadamard_inplace(double *x, int32_t n) {
    for (int32_t len = 1; len < n; len <<= 1)
        for (int32_t i = 0; i < n; i += 2 * len)
            for (int32_t j = i; j < i + len; j++) {
                double a = x[j], b = x[j + len];
                x[j] = a + b, x[j + len] = a - b;
            }
    for (int32_t i = 0; i < n; i++) x[i] /= sqrt((double)n);
}

static int rotation_diagnostics(const char *path, int32_t Lnum, int32_t D, diag_row *out) {
    oscar_rotation_set *set = NULL;
    oscar_rotation_set_info info;
    if (oscar_rotation_set_load(NULL, path, &set) != OSCAR_OK) return -1;
    oscar_rotation_set_query(set, &info);
    if (!info.eigenvalues || info.head_dim != D || D > 256) { oscar_rotation_set_destroy(set); return -1; }
    double *C = malloc(sizeof(double) * (size_t)D * D);
    for (int32_t l = 0; C && l < Lnum; l++) {
        const int32_t idx = oscar_rotation_set_find(set, l);
        if (idx < 0) continue;
        const float *R = info.rotations + (size_t)idx * D * D, *lam = info.eigenvalues + (size_t)idx * D;
        llm_rotation_covariance(R, lam, D, C, NULL);
        double sum = 0, top4 = 0, mx_i = 0, mx_h = 0, mx_r = 0;
        for (int32_t i = 0; i < D; i++) sum += lam[i];
        for (int32_t i = D - 4; i < D; i++) top4 += lam[i];
        const double mean = sum / D;
        for (int32_t j = 0; j < D; j++) {
            double hj[256], v = 0, r2 = 0;
            mx_i = fmax(mx_i, C[(size_t)j * D + j]);
            for (int32_t i = 0; i < D; i++) hj[i] = i == j;
            hadamard_inplace(hj, D);
            for (int32_t a = 0; a < D; a++)
                for (int32_t b2 = 0; b2 < D; b2++) {
                    v += hj[a] * C[(size_t)a * D + b2] * hj[b2];
                    r2 += R[(size_t)a * D + j] * C[(size_t)a * D + b2] * R[(size_t)b2 * D + j];
                }
            mx_h = fmax(mx_h, v), mx_r = fmax(mx_r, r2);
        }
        out[l].lam_ratio = lam[D - 1] / mean;
        out[l].top4_share = top4 / sum;
        out[l].imp_none = mx_i / mean;
        out[l].imp_had = mx_h / mean;
        out[l].imp_oscar = mx_r / mean;
    }
    free(C);
    oscar_rotation_set_destroy(set);
    return 0;
}

/* ------------------------------------------------------------------ K error anatomy */

/* One shadow's K error in layer l, with C_g the measured query covariance of KV head g
   (mean q qᵀ of its query heads) and Σ_g the covariance of the quantization error of its K rows:
     raw = Σ_g tr(Σ_g)                 (what the quantizer loses, whatever reads it)
     wt  = Σ_g tr(C_g Σ_g)             (= E (q·e)², the attention-logit error the queries see)
     iso = Σ_g tr(C_g) tr(Σ_g) / D     (wt if the error had no preferred direction)
   OSCAR's R_k = U_Q·H·P can only help through wt / iso (align): it equalises the queries'
   weight over the rotated coordinates, which matters only where the error is uneven. */
static void k_anatomy(const probe *P, const shadow *S, int32_t l, double *raw, double *wt, double *iso) {
    const int32_t D = P->s.head_dim, H = P->s.num_kv_heads;
    *raw = *wt = *iso = 0;
    if (!S->n_e[l] || !P->n_q[l]) return;
    for (int32_t g = 0; g < H; g++) {
        const double *C = P->cq + (((size_t)l * H + (size_t)g) * D) * D, *E = S->sig_e + (((size_t)l * H + (size_t)g) * D) * D;
        const double nq = (double)P->n_q[l], ne = (double)S->n_e[l];
        double trC = 0, trE = 0, w = 0;
        for (int32_t i = 0; i < D; i++) {
            trC += C[i * D + i] / nq, trE += E[i * D + i] / ne;
            for (int32_t j = 0; j < D; j++) w += C[i * D + j] / nq * E[j * D + i] / ne;
        }
        *raw += trE, *wt += w, *iso += trC * trE / D;
    }
}

/* max / mean of diag(Mᵀ C M) over the coordinates, C the measured query covariance of layer l
   (mean over KV heads); M = NULL: identity; hadamard: the normalised Hadamard */
static double importance_ratio(const probe *P, int32_t l, const float *M) {
    const int32_t D = P->s.head_dim, H = P->s.num_kv_heads;
    double C[256 * 256], mx = 0, sum = 0;
    if (D > 256 || !P->n_q[l]) return NAN;
    for (int32_t i = 0; i < D * D; i++) C[i] = 0;
    for (int32_t g = 0; g < H; g++)
        for (int32_t i = 0; i < D * D; i++) C[i] += P->cq[(((size_t)l * H + (size_t)g) * D) * D + (size_t)i] / H;
    for (int32_t j = 0; j < D; j++) {
        double v = 0;
        for (int32_t a = 0; a < D; a++)
            for (int32_t b = 0; b < D; b++)
                v += (M ? (double)M[a * D + j] : (a == j)) * C[a * D + b] * (M ? (double)M[b * D + j] : (b == j));
        mx = fmax(mx, v), sum += v;
    }
    return mx / (sum / D);
}

/* ------------------------------------------------------------------ output */

static double ppl_of(double nll, int64_t n) { return n > 0 ? exp(nll / (double)n) : NAN; }

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', f), fputc(*s, f);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static void json_arr(FILE *f, const double *x, int n) {
    fputc('[', f);
    for (int i = 0; i < n; i++) {
        if (isfinite(x[i])) fprintf(f, "%s%.6g", i ? ", " : "", x[i]);
        else fprintf(f, "%snull", i ? ", " : "");
    }
    fputc(']', f);
}

static void usage(void) {
    fprintf(stderr,
            "usage: llm_accuracy --rot-k FILE --rot-v FILE [-m MODEL] [--eval TEXT] [--calib-text TEXT]\n"
            "                    [--ctx N] [--windows W] [--batch B] [--rows id,id,...] [--kl-every N] [--no-probe] [--no-twin]\n"
            "                    [--backend real|sim] [--out-md FILE] [--out-json FILE]\n");
}

int main(int argc, char **argv) {
    const char *model_path = LLM_DEFAULT_MODEL, *eval_path = "/usr/share/common-licenses/GPL-3",
               *calib_path = "/usr/share/common-licenses/GPL-2", *rot_k_path = NULL, *rot_v_path = NULL,
               *rows_arg = NULL, *out_md = NULL, *out_json = NULL;
    int32_t ctx = 2048, windows = 2, batch = 32, kl_every = 32, probe_on = 1, real = 1, twin_on = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--no-probe")) { probe_on = 0; continue; }
        if (!strcmp(a, "--no-twin")) { twin_on = 0; continue; }
        if (!v) { usage(); return 2; }
        if (!strcmp(a, "-m")) model_path = v;
        else if (!strcmp(a, "--eval")) eval_path = v;
        else if (!strcmp(a, "--calib-text")) calib_path = v;
        else if (!strcmp(a, "--rot-k")) rot_k_path = v;
        else if (!strcmp(a, "--rot-v")) rot_v_path = v;
        else if (!strcmp(a, "--rows")) rows_arg = v;
        else if (!strcmp(a, "--ctx")) ctx = atoi(v);
        else if (!strcmp(a, "--windows")) windows = atoi(v);
        else if (!strcmp(a, "--batch")) batch = atoi(v);
        else if (!strcmp(a, "--kl-every")) kl_every = atoi(v);
        else if (!strcmp(a, "--backend") && (!strcmp(v, "real") || !strcmp(v, "sim"))) real = !strcmp(v, "real");
        else if (!strcmp(a, "--out-md")) out_md = v;
        else if (!strcmp(a, "--out-json")) out_json = v;
        else { usage(); return 2; }
        i++;
    }
    if (!rot_k_path || !rot_v_path || ctx <= FAR_POS || windows < 1 || batch < 1 || kl_every < 1) {
        usage();
        return 2;
    }
    int want[N_METHODS];
    for (int i = 0; i < N_METHODS; i++) want[i] = rows_arg == NULL && !METHODS[i].extra;
    if (rows_arg) {
        char buf[512];
        snprintf(buf, sizeof buf, "%s", rows_arg);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
            int found = 0;
            for (int i = 0; i < N_METHODS; i++)
                if (!strcmp(t, METHODS[i].id)) want[i] = found = 1;
            if (!found) { fprintf(stderr, "unknown row %s\n", t); return 2; }
        }
        want[0] = 1; /* the baseline is always run */
    }

    char err[1024];
    llm L;
    if (llm_open(&L, model_path, batch, err, sizeof err) != 0) { fprintf(stderr, "%s\n", err); return 2; }
    const model_config *c = &L.model->cfg;
    text T = {eval_path, 0, 0, NULL}, C = {calib_path, 0, 0, NULL};
    if (llm_tokenize_file(&L, eval_path, &T.ids, &T.n_ids, &T.bytes) != 0) { fprintf(stderr, "cannot read %s\n", eval_path); return 2; }
    if (llm_tokenize_file(&L, calib_path, &C.ids, &C.n_ids, &C.bytes) != 0) C.n_ids = 0;
    size_t n_windows = T.n_ids / (size_t)ctx;
    if (n_windows > (size_t)windows) n_windows = (size_t)windows;
    if (n_windows == 0) { fprintf(stderr, "%s has %zu tokens, fewer than one window of %d\n", eval_path, T.n_ids, ctx); return 2; }

    rotations R = {0};
    R.had = llm_hadamard_rotations(c->num_layers, c->head_dim, err, sizeof err);
    if (R.had) R.calib_k = llm_load_rotations(rot_k_path, c->num_layers, c->head_dim, err, sizeof err);
    if (R.calib_k) R.calib_v = llm_load_rotations(rot_v_path, c->num_layers, c->head_dim, err, sizeof err);
    if (!R.had || !R.calib_k || !R.calib_v) { fprintf(stderr, "%s\n", err); return 2; }
    oscar_ctx *cpu = llm_oscar_setup(OSCAR_BACKEND_CPU, err, sizeof err);
    if (!cpu) { fprintf(stderr, "%s\n", err); return 2; }

    const kv_shape shape = model_kv_shape(L.model, ctx);
    float *logits = malloc(sizeof(float) * (size_t)batch * (size_t)c->vocab_size);
    float *logits2 = malloc(sizeof(float) * (size_t)batch * (size_t)c->vocab_size);
    row_result res[N_METHODS];
    memset(res, 0, sizeof res);
    fprintf(stderr, "eval %s: %zu tokens, %zu window(s) of %d; rows:", eval_path, T.n_ids, n_windows, ctx);
    for (int i = 0; i < N_METHODS; i++) if (want[i]) fprintf(stderr, " %s", METHODS[i].id);
    fprintf(stderr, "\n");

    /* the bf16 row, with the probe (shadow caches of every INT2 row) around it */
    probe P = {0};
    kv_backend pb = {0};
    kv_backend *dense = kv_backend_dense_create(shape, 1);
    if (!dense || !logits || !logits2) { fprintf(stderr, "out of memory\n"); return 2; }
    kv_backend *first = dense;
    const size_t cache_elems = (size_t)c->num_layers * (size_t)ctx * re_of(&shape);
    if (probe_on) {
        P.inner = dense, P.s = shape, P.kl_every = kl_every;
        P.rk = malloc(sizeof(float) * cache_elems), P.rv = malloc(sizeof(float) * cache_elems);
        P.sh = calloc(N_METHODS, sizeof(shadow));
        for (int i = 1; i < N_METHODS; i++) {
            if (!want[i]) continue;
            shadow *S = &P.sh[P.n_sh++];
            S->m = &METHODS[i];
            quantizer_init(&S->z, S->m, cpu, &R);
            S->k = malloc(sizeof(float) * cache_elems), S->v = malloc(sizeof(float) * cache_elems);
            S->next_demote = calloc((size_t)c->num_layers, sizeof(int64_t));
            double **arrs[] = {&S->kl, &S->o_num, &S->o_den, &S->s_num, &S->s_den, &S->k_num, &S->k_den, &S->v_num, &S->v_den};
            for (size_t a = 0; a < sizeof arrs / sizeof arrs[0]; a++) *arrs[a] = calloc((size_t)c->num_layers, sizeof(double));
            S->n_kl = calloc((size_t)c->num_layers, sizeof(int64_t));
            S->sig_e = calloc((size_t)c->num_layers * c->num_kv_heads * c->head_dim * c->head_dim, sizeof(double));
            S->n_e = calloc((size_t)c->num_layers, sizeof(int64_t));
            if (!S->sig_e || !S->n_e) { fprintf(stderr, "out of memory for the probe\n"); return 2; }
            if (!S->k || !S->v || !S->n_kl || !S->v_den) { fprintf(stderr, "out of memory for the probe\n"); return 2; }
        }
        P.cq = calloc((size_t)c->num_layers * c->num_kv_heads * c->head_dim * c->head_dim, sizeof(double));
        P.n_q = calloc((size_t)c->num_layers, sizeof(int64_t));
        if (!P.rk || !P.rv || !P.cq || !P.n_q) { fprintf(stderr, "out of memory for the probe\n"); return 2; }
        pb.shape = shape, pb.name = "probe", pb.reset = probe_reset, pb.append = probe_append,
        pb.attend = probe_attend, pb.destroy = probe_destroy, pb.impl = &P;
        first = &pb;
    }
    res[0].m = &METHODS[0];
    if (run_ppl(&L, first, NULL, &T, n_windows, ctx, batch, logits, logits2, &res[0], NULL,
                probe_on ? "bf16 + probe" : "bf16") != 0) {
        fprintf(stderr, "%s\n", res[0].err);
        return 1;
    }
    for (int i = 0; i < P.n_sh; i++)
        if (P.sh[i].z.oq.failed) { fprintf(stderr, "probe %s: %s\n", P.sh[i].m->id, P.sh[i].z.oq.err); return 1; }
    dense->destroy(dense);
    /* the INT2 rows; the oscar row also runs the other cache kind (real <-> simulated) in lockstep */
    twin_result tw = {0};
    for (int i = 1; i < N_METHODS; i++) {
        if (!want[i]) continue;
        const method *m = &METHODS[i];
        quantizer z, z2;
        quantizer_init(&z, m, cpu, &R);
        quantizer_init(&z2, m, cpu, &R);
        kv_backend *kv = make_backend(m, &z, shape, real, cpu, &R, err, sizeof err);
        kv_backend *twin = NULL;
        if (!kv) { fprintf(stderr, "cannot create the %s cache: %s\n", m->id, err); return 2; }
        if (twin_on && !strcmp(m->id, "oscar")) {
            twin = make_backend(m, &z2, shape, !real, cpu, &R, err, sizeof err);
            if (!twin) { fprintf(stderr, "cannot create the %s twin cache: %s\n", m->id, err); return 2; }
        }
        res[i].m = m;
        res[i].real = real && m->q == Q_OSCAR;
        if (run_ppl(&L, kv, twin, &T, n_windows, ctx, batch, logits, logits2, &res[i], &tw, m->id) != 0 ||
            z.oq.failed || z2.oq.failed) {
            fprintf(stderr, "%s: %s%s%s\n", m->id, res[i].err, z.oq.err, z2.oq.err);
            return 1;
        }
        if (res[i].real) kv_backend_oscar_stats(kv, &res[i].st);
        if (twin && twin->name && !strcmp(twin->name, "oscar")) tw.real = 1, kv_backend_oscar_stats(twin, &tw.st);
        kv->destroy(kv);
        if (twin) twin->destroy(twin);
        kv_oscar_qdq_free(&z.oq);
        kv_oscar_qdq_free(&z2.oq);
        fprintf(stderr, "%-15s ppl %.4f  ppl pos>=%d %.4f  (%.0f s)\n", m->id, ppl_of(res[i].nll, res[i].n), FAR_POS,
                ppl_of(res[i].nll_far, res[i].n_far), res[i].time_s);
    }
    diag_row *dg = calloc((size_t)c->num_layers, sizeof(diag_row));
    const int have_diag = dg && rotation_diagnostics(rot_k_path, c->num_layers, c->head_dim, dg) == 0;

    /* ---- write */
    char date[32], commit[64], cmd[2048];
    llm_run_date(date, sizeof date);
    llm_run_commit(commit, sizeof commit);
    llm_run_command(argc, argv, cmd, sizeof cmd);
    const double base_ppl = ppl_of(res[0].nll, res[0].n), base_far = ppl_of(res[0].nll_far, res[0].n_far);
    FILE *md = out_md ? fopen(out_md, "w") : NULL;
    if (out_md && !md) { fprintf(stderr, "cannot write %s\n", out_md); return 2; }
    FILE *mds[2] = {stdout, md};
    for (int o = 0; o < 2; o++) {
        FILE *f = mds[o];
        if (!f) continue;
        fprintf(f, "# accuracy: OSCAR 2-bit KV cache on SmolLM2-135M (examples/llm)\n\n");
        fprintf(f, "- date: %s\n- commit: %s\n- command: `%s`\n", date, commit, cmd);
        fprintf(f, "- model: %s (%d layers, %d query / %d KV heads, head_dim %d; weights Q4_1, activations f32)\n",
                model_path, c->num_layers, c->num_heads, c->num_kv_heads, c->head_dim);
        fprintf(f, "- evaluation text: %s (%zu bytes, %zu tokens); %zu window(s) of %d tokens, each from an empty cache; "
                   "all positions scored (every token but the window's first) and, separately, positions >= %d\n",
                eval_path, T.bytes, T.n_ids, n_windows, ctx, FAR_POS);
        fprintf(f, "- calibration text: %s (%zu tokens, all used); rotations %s, %s\n", calib_path, C.n_ids, rot_k_path,
                rot_v_path);
        fprintf(f, "- INT2 rows: the simulated cache (kv_backend_sim_create) with oscar's CPU backend as quantizer "
                   "(oscar_quantize_kv + oscar_dequantize_kv, then R^T), group = head_dim, f16 scale+min; the naive row "
                   "uses its own symmetric quantizer. Windows (bf16): sink 64 + recent 256, demote 8 at a time, unless "
                   "the row says otherwise. Details: examples/llm/llm_accuracy.c, docs/llm.md.\n\n");
        fprintf(f, "## Perplexity\n\n| KV cache | id | ppl (all) | vs BF16 | ppl (pos >= %d) | vs BF16 | scored | cache | time |\n"
                   "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n", FAR_POS);
        for (int i = 0; i < N_METHODS; i++) {
            if (!res[i].ran) continue;
            const double p1 = ppl_of(res[i].nll, res[i].n), p2 = ppl_of(res[i].nll_far, res[i].n_far);
            fprintf(f, "| %s | `%s` | %.3f | %+.1f%% | %.3f | %+.1f%% | %lld / %lld | %s | %.0f s |\n", res[i].m->label,
                    res[i].m->id, p1, 100 * (p1 / base_ppl - 1), p2, 100 * (p2 / base_far - 1), (long long)res[i].n,
                    (long long)res[i].n_far, backend_label(res[i].m, res[i].real), res[i].time_s);
        }
        if (real) {
            fprintf(f, "\nCache `oscar (CPU backend)`: kv_backend_oscar on an OSCAR_BACKEND_CPU context, i.e. oscar_quantize_kv "
                       "on every demotion and oscar_decode_run (float64 reference decode; q and the output in bf16) for "
                       "every layer and token. oscar calls, per row: ");
            for (int i = 1; i < N_METHODS; i++)
                if (res[i].ran && res[i].real)
                    fprintf(f, "`%s` %lld quantize (%.0f s) + %lld decode (%.0f s); ", res[i].m->id,
                            (long long)res[i].st.quantize_calls, res[i].st.quantize_s, (long long)res[i].st.decode_calls,
                            res[i].st.decode_s);
            fprintf(f, "\n");
        }
        if (tw.ran) {
            const int ri = 5; /* the oscar row */
            fprintf(f, "\n## Real oscar backend vs simulated cache (`oscar` row, same tokens, lockstep)\n\n");
            fprintf(f, "| | %s | %s |\n| --- | --- | --- |\n", real ? "real oscar backend (table)" : "simulated (table)",
                    real ? "simulated (oscar qdq)" : "real oscar backend");
            fprintf(f, "| ppl (all, %lld tokens) | %.4f | %.4f |\n", (long long)tw.n, ppl_of(res[ri].nll, res[ri].n),
                    ppl_of(tw.nll, tw.n));
            fprintf(f, "| ppl (pos >= %d, %lld tokens) | %.4f | %.4f |\n", FAR_POS, (long long)tw.n_far,
                    ppl_of(res[ri].nll_far, res[ri].n_far), ppl_of(tw.nll_far, tw.n_far));
            fprintf(f, "| time | %.0f s | %.0f s |\n\n", res[ri].time_s, tw.time_s);
            if (tw.real)
                fprintf(f, "The real backend made %lld oscar_quantize_kv calls (%lld layer x token rows, %.1f s) and %lld "
                           "oscar_decode_run calls (%.0f s).\n\n",
                        (long long)tw.st.quantize_calls, (long long)tw.st.demoted_rows, tw.st.quantize_s,
                        (long long)tw.st.decode_calls, tw.st.decode_s);
            fprintf(f, "max |Δlogit| %.4f over %lld positions; mean |Δnll| %.5f, max %.4f; same top-1 token at %lld of %lld "
                       "positions. The simulated cache attends in f32 to bf16-rounded dequantized rows; the real one rounds "
                       "q and the output to bf16 and decodes in float64.\n",
                    tw.max_dlogit, (long long)tw.positions, tw.sum_dnll / (double)(tw.n ? tw.n : 1), tw.max_dnll,
                    (long long)tw.top1_same, (long long)tw.positions);
            fprintf(f, "\nBy position in the window (teacher-forced, so differences propagate along the sequence only "
                       "through the K/V rows the two caches hold; INT2 codes are a discontinuous function of their "
                       "input, so a rounding-level difference can flip a code and grow):\n\n"
                       "| positions | max abs Δlogit | same top-1 |\n| --- | --- | --- |\n");
            const char *bn[3] = {"windows only", "INT2, < 1024", "INT2, >= 1024"};
            for (int k = 0; k < 3; k++)
                if (tw.b_n[k])
                    fprintf(f, "| %s (%s) | %.3f | %lld / %lld |\n", k == 0 ? "0 .. first INT2 read" : k == 1 ? "first INT2 read .. 1023" : "1024 ..",
                            bn[k], tw.b_max[k], (long long)tw.b_top1[k], (long long)tw.b_n[k]);
        }
        if (P.n_sh > 0) {
            fprintf(f, "\n## Attention-level error (per layer, inputs of the BF16 run, every %d positions from %d; "
                       "%zu window(s))\n\n", kl_every, FAR_POS, n_windows);
            fprintf(f, "Mean over the %d layers (KL and errors per layer first, then averaged):\n\n"
                       "| method | KL(p_bf16 ‖ p_q) | attn-out rel. err | logit rel. err (INT2 tokens) | K rel. MSE | V rel. MSE |\n"
                       "| --- | --- | --- | --- | --- | --- |\n", c->num_layers);
            for (int i = 0; i < P.n_sh; i++) {
                shadow *S = &P.sh[i];
                double kl = 0, oe = 0, se = 0, ke = 0, ve = 0;
                for (int32_t l = 0; l < c->num_layers; l++) {
                    kl += S->kl[l] / (double)(S->n_kl[l] ? S->n_kl[l] : 1);
                    oe += sqrt(S->o_num[l] / (S->o_den[l] > 0 ? S->o_den[l] : 1));
                    se += sqrt(S->s_num[l] / (S->s_den[l] > 0 ? S->s_den[l] : 1));
                    ke += S->k_num[l] / (S->k_den[l] > 0 ? S->k_den[l] : 1);
                    ve += S->v_num[l] / (S->v_den[l] > 0 ? S->v_den[l] : 1);
                }
                const double nl = c->num_layers;
                fprintf(f, "| `%s` | %.4g | %.4f | %.4f | %.4f | %.4f |\n", S->m->id, kl / nl, oe / nl, se / nl, ke / nl,
                        ve / nl);
            }
            const char *what[2] = {"KL(p_bf16 ‖ p_q)", "attention-output relative error"};
            for (int t = 0; t < 2; t++) {
                fprintf(f, "\nPer layer, %s:\n\n| layer |", what[t]);
                for (int i = 0; i < P.n_sh; i++) fprintf(f, " `%s` |", P.sh[i].m->id);
                fprintf(f, "\n| --- |");
                for (int i = 0; i < P.n_sh; i++) fprintf(f, " --- |");
                fprintf(f, "\n");
                for (int32_t l = 0; l < c->num_layers; l++) {
                    fprintf(f, "| %d |", l);
                    for (int i = 0; i < P.n_sh; i++) {
                        shadow *S = &P.sh[i];
                        const double x = t == 0 ? S->kl[l] / (double)(S->n_kl[l] ? S->n_kl[l] : 1)
                                                : sqrt(S->o_num[l] / (S->o_den[l] > 0 ? S->o_den[l] : 1));
                        fprintf(f, t == 0 ? " %.3g |" : " %.3f |", x);
                    }
                    fprintf(f, "\n");
                }
            }
        }
        if (P.n_sh > 0) {
            int ref = -1;
            for (int i = 0; i < P.n_sh; i++)
                if (!strcmp(P.sh[i].m->id, "hadamard-clip")) ref = i;
            fprintf(f, "\n## Anatomy of the K error (query covariance measured on the evaluation text, positions >= %d)\n\n"
                       "Per layer and KV head, C = mean q qᵀ of its query heads and Σ = covariance of the quantization error "
                       "e = k̂ − k of its INT2 K rows: raw = tr Σ, logit error = tr(C Σ) = E(q·e)², align = tr(C Σ) / (tr C · tr Σ / D) "
                       "(1 = the error has no preferred direction relative to the queries). Means over the layers%s.\n\n"
                       "| method | raw K error%s | logit error%s | align |\n| --- | --- | --- | --- |\n",
                    FAR_POS, ref >= 0 ? "; errors relative to `hadamard-clip`" : "", ref >= 0 ? " (rel.)" : "",
                    ref >= 0 ? " (rel.)" : "");
            for (int i = 0; i < P.n_sh; i++) {
                double sr = 0, sw = 0, sa = 0;
                for (int32_t l = 0; l < c->num_layers; l++) {
                    double raw, wt, iso, r0 = 1, w0 = 1, i0;
                    k_anatomy(&P, &P.sh[i], l, &raw, &wt, &iso);
                    if (ref >= 0) k_anatomy(&P, &P.sh[ref], l, &r0, &w0, &i0);
                    sr += raw / r0, sw += wt / w0, sa += wt / iso;
                }
                fprintf(f, "| `%s` | %.3f | %.3f | %.3f |\n", P.sh[i].m->id, sr / c->num_layers, sw / c->num_layers,
                        sa / c->num_layers);
            }
            fprintf(f, "\nPer layer: importance max/mean of diag(Mᵀ C M) with the measured C for M = I, H and R_k "
                       "(calibrated on the calibration text), and the logit error of `oscar` relative to `hadamard-clip`:\n\n"
                       "| layer | importance I | H | R_k | oscar / hadamard-clip logit error | align hadamard-clip | align oscar |\n"
                       "| --- | --- | --- | --- | --- | --- | --- |\n");
            int io = -1;
            for (int i = 0; i < P.n_sh; i++)
                if (!strcmp(P.sh[i].m->id, "oscar")) io = i;
            for (int32_t l = 0; l < c->num_layers; l++) {
                double r1 = 0, w1 = 0, i1 = 1, r0 = 0, w0 = 1, i0 = 1;
                if (io >= 0) k_anatomy(&P, &P.sh[io], l, &r1, &w1, &i1);
                if (ref >= 0) k_anatomy(&P, &P.sh[ref], l, &r0, &w0, &i0);
                fprintf(f, "| %d | %.2f | %.2f | %.2f | %.3f | %.3f | %.3f |\n", l, importance_ratio(&P, l, NULL),
                        importance_ratio(&P, l, R.had + (size_t)l * c->head_dim * c->head_dim),
                        importance_ratio(&P, l, R.calib_k + (size_t)l * c->head_dim * c->head_dim),
                        io >= 0 && ref >= 0 ? w1 / w0 : NAN, ref >= 0 ? w0 / i0 : NAN, io >= 0 ? w1 / i1 : NAN);
            }
        }
        if (have_diag) {
            fprintf(f, "\n## Query covariance and channel importance (from the K rotation file)\n\n"
                       "Per layer: λ_max / mean λ of C_Q, share of tr(C_Q) in the top 4 eigen-directions, and the largest "
                       "per-channel importance diag(Mᵀ C_Q M) / mean for M = I (no rotation), H (Hadamard only) and R "
                       "(OSCAR; 1 = perfectly flat).\n\n| layer | λ_max/mean | top-4 share | importance I | H | R |\n"
                       "| --- | --- | --- | --- | --- | --- |\n");
            for (int32_t l = 0; l < c->num_layers; l++)
                fprintf(f, "| %d | %.1f | %.3f | %.2f | %.2f | %.2f |\n", l, dg[l].lam_ratio, dg[l].top4_share,
                        dg[l].imp_none, dg[l].imp_had, dg[l].imp_oscar);
        }
    }
    if (md) fclose(md);
    if (out_json) {
        FILE *f = fopen(out_json, "w");
        if (!f) { fprintf(stderr, "cannot write %s\n", out_json); return 2; }
        fprintf(f, "{\n  \"date\": \"%s\",\n  \"commit\": ", date);
        json_str(f, commit);
        fprintf(f, ",\n  \"command\": ");
        json_str(f, cmd);
        fprintf(f, ",\n  \"model\": {\"path\": ");
        json_str(f, model_path);
        fprintf(f, ", \"name\": \"SmolLM2-135M-Instruct Q4_1\", \"layers\": %d, \"q_heads\": %d, \"kv_heads\": %d, \"head_dim\": %d},\n",
                c->num_layers, c->num_heads, c->num_kv_heads, c->head_dim);
        fprintf(f, "  \"texts\": {\"eval\": {\"path\": ");
        json_str(f, eval_path);
        fprintf(f, ", \"bytes\": %zu, \"tokens\": %zu, \"windows\": %zu, \"window_tokens\": %d}, \"calib\": {\"path\": ",
                T.bytes, T.n_ids, n_windows, ctx);
        json_str(f, calib_path);
        fprintf(f, ", \"tokens\": %zu}},\n  \"rotations\": {\"k\": ", C.n_ids);
        json_str(f, rot_k_path);
        fprintf(f, ", \"v\": ");
        json_str(f, rot_v_path);
        fprintf(f, "},\n  \"far_position\": %d,\n  \"rows\": [\n", FAR_POS);
        int first_row = 1;
        for (int i = 0; i < N_METHODS; i++) {
            if (!res[i].ran) continue;
            const method *m = res[i].m;
            fprintf(f, "%s    {\"id\": \"%s\", \"label\": ", first_row ? "" : ",\n", m->id);
            json_str(f, m->label);
            fprintf(f, ", \"cache\": \"%s\"", backend_label(m, res[i].real));
            if (res[i].real)
                fprintf(f, ", \"oscar_calls\": {\"quantize\": %lld, \"quantize_s\": %.1f, \"decode\": %lld, \"decode_s\": %.1f}",
                        (long long)res[i].st.quantize_calls, res[i].st.quantize_s, (long long)res[i].st.decode_calls,
                        res[i].st.decode_s);
            fprintf(f, ", \"group_size\": %d", m->group > 0 ? m->group : c->head_dim);
            fprintf(f, ", \"sink\": %d, \"recent\": %d, \"demote_interval\": %d, \"rotation\": \"%s\", \"k_clip\": %.2f, "
                       "\"v_clip\": %.2f, \"ppl\": %.6f, \"nll\": %.6f, \"scored\": %lld, \"ppl_far\": %.6f, \"scored_far\": %lld, "
                       "\"time_s\": %.1f",
                    m->q == Q_NONE ? 0 : win_sink(m), m->q == Q_NONE ? 0 : win_recent(m), m->interval,
                    m->rot_v == ROT_HADAMARD ? "K calibrated, V hadamard" : m->rot_v == ROT_CALIB ? "K hadamard, V calibrated"
                    : m->rot == ROT_HADAMARD ? "hadamard" : m->rot == ROT_CALIB ? "calibrated" : "none", m->kclip, m->vclip,
                    ppl_of(res[i].nll, res[i].n), res[i].nll / (double)res[i].n, (long long)res[i].n,
                    ppl_of(res[i].nll_far, res[i].n_far), (long long)res[i].n_far, res[i].time_s);
            for (int s = 0; s < P.n_sh; s++) {
                shadow *S = &P.sh[s];
                if (S->m != m) continue;
                double kl[256], oe[256], se[256], ke[256], ve[256];
                for (int32_t l = 0; l < c->num_layers && l < 256; l++) {
                    kl[l] = S->kl[l] / (double)(S->n_kl[l] ? S->n_kl[l] : 1);
                    oe[l] = sqrt(S->o_num[l] / (S->o_den[l] > 0 ? S->o_den[l] : 1));
                    se[l] = sqrt(S->s_num[l] / (S->s_den[l] > 0 ? S->s_den[l] : 1));
                    ke[l] = S->k_num[l] / (S->k_den[l] > 0 ? S->k_den[l] : 1);
                    ve[l] = S->v_num[l] / (S->v_den[l] > 0 ? S->v_den[l] : 1);
                }
                fprintf(f, ",\n     \"per_layer\": {\"kl\": ");
                json_arr(f, kl, c->num_layers);
                fprintf(f, ",\n       \"attn_out_rel_err\": ");
                json_arr(f, oe, c->num_layers);
                fprintf(f, ",\n       \"logit_rel_err\": ");
                json_arr(f, se, c->num_layers);
                fprintf(f, ",\n       \"k_rel_mse\": ");
                json_arr(f, ke, c->num_layers);
                fprintf(f, ",\n       \"v_rel_mse\": ");
                json_arr(f, ve, c->num_layers);
                double kr[256], kw[256], kal[256];
                for (int32_t l = 0; l < c->num_layers && l < 256; l++) {
                    double iso;
                    k_anatomy(&P, S, l, &kr[l], &kw[l], &iso);
                    kal[l] = iso > 0 ? kw[l] / iso : NAN;
                }
                fprintf(f, ",\n       \"k_err_trace\": ");
                json_arr(f, kr, c->num_layers);
                fprintf(f, ",\n       \"k_logit_err\": ");
                json_arr(f, kw, c->num_layers);
                fprintf(f, ",\n       \"k_align\": ");
                json_arr(f, kal, c->num_layers);
                fprintf(f, "}");
            }
            fprintf(f, "}");
            first_row = 0;
        }
        fprintf(f, "\n  ],\n  \"probe\": {\"enabled\": %s, \"every\": %d, \"from\": %d}", P.n_sh ? "true" : "false",
                kl_every, FAR_POS);
        if (P.n_sh) {
            double a[256], b2[256], c3[256];
            for (int32_t l = 0; l < c->num_layers && l < 256; l++) {
                a[l] = importance_ratio(&P, l, NULL);
                b2[l] = importance_ratio(&P, l, R.had + (size_t)l * c->head_dim * c->head_dim);
                c3[l] = importance_ratio(&P, l, R.calib_k + (size_t)l * c->head_dim * c->head_dim);
            }
            fprintf(f, ",\n  \"importance_measured\": {\"none\": ");
            json_arr(f, a, c->num_layers);
            fprintf(f, ", \"hadamard\": ");
            json_arr(f, b2, c->num_layers);
            fprintf(f, ", \"oscar\": ");
            json_arr(f, c3, c->num_layers);
            fprintf(f, "}");
        }
        if (tw.ran)
            fprintf(f, ",\n  \"twin\": {\"row\": \"oscar\", \"table_cache\": \"%s\", \"twin_cache\": \"%s\", "
                       "\"ppl_twin\": %.6f, \"ppl_far_twin\": %.6f, \"max_abs_dlogit\": %.6g, \"mean_abs_dnll\": %.6g, "
                       "\"max_abs_dnll\": %.6g, \"top1_same\": %lld, \"positions\": %lld, \"time_twin_s\": %.1f}",
                    real ? "real" : "sim", real ? "sim" : "real", ppl_of(tw.nll, tw.n), ppl_of(tw.nll_far, tw.n_far),
                    tw.max_dlogit, tw.sum_dnll / (double)(tw.n ? tw.n : 1), tw.max_dnll, (long long)tw.top1_same,
                    (long long)tw.positions, tw.time_s);
        if (tw.ran && tw.real)
            fprintf(f, ",\n  \"twin_oscar_calls\": {\"quantize\": %lld, \"rows\": %lld, \"quantize_s\": %.1f, \"decode\": %lld, "
                       "\"decode_s\": %.1f}",
                    (long long)tw.st.quantize_calls, (long long)tw.st.demoted_rows, tw.st.quantize_s,
                    (long long)tw.st.decode_calls, tw.st.decode_s);
        if (tw.ran) {
            fprintf(f, ",\n  \"twin_by_position\": [");
            for (int k = 0; k < 3; k++)
                fprintf(f, "%s{\"from\": %lld, \"to\": %d, \"max_abs_dlogit\": %.6g, \"top1_same\": %lld, \"positions\": %lld}",
                        k ? ", " : "", (long long)(k == 0 ? 0 : k == 1 ? tw.first_int2 : 1024),
                        k == 0 ? (int)tw.first_int2 : k == 1 ? 1024 : ctx, tw.b_max[k], (long long)tw.b_top1[k],
                        (long long)tw.b_n[k]);
            fprintf(f, "]");
        }
        if (have_diag) {
            double a[256], b2[256], c1[256], c2[256], c3[256];
            for (int32_t l = 0; l < c->num_layers && l < 256; l++)
                a[l] = dg[l].lam_ratio, b2[l] = dg[l].top4_share, c1[l] = dg[l].imp_none, c2[l] = dg[l].imp_had,
                c3[l] = dg[l].imp_oscar;
            fprintf(f, ",\n  \"query_covariance\": {\"lambda_max_over_mean\": ");
            json_arr(f, a, c->num_layers);
            fprintf(f, ",\n    \"top4_share\": ");
            json_arr(f, b2, c->num_layers);
            fprintf(f, ",\n    \"importance_max_over_mean\": {\"none\": ");
            json_arr(f, c1, c->num_layers);
            fprintf(f, ", \"hadamard\": ");
            json_arr(f, c2, c->num_layers);
            fprintf(f, ", \"oscar\": ");
            json_arr(f, c3, c->num_layers);
            fprintf(f, "}}");
        }
        fprintf(f, "\n}\n");
        fclose(f);
    }
    oscar_shutdown(cpu);
    free(logits), free(logits2), free(T.ids), free(C.ids), free(R.had), free(R.calib_k), free(R.calib_v), free(dg);
    llm_close(&L);
    return 0;
}
