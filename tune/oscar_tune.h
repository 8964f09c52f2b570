/* tune/oscar_tune.h -- part of the oscar.h implementation (>>tune): the
   tunable families (parameters, candidates, validity, buckets), the tuning
   tables (parse, write atomically, provenance checks), the lookups the plans
   make, and the tuning runs (correctness check, CUDA-event timing over
   rotating inputs, interleaved re-timing). Public API: tune/oscar_tune_api.h;
   manual: docs/tuning.md. */
#ifndef OSCAR_TUNE_H_INCLUDED
#define OSCAR_TUNE_H_INCLUDED

#include "tune/oscar_tune_defaults.inc"

#define OSCAR__TUNE_FORMAT 1
#define OSCAR__TUNE_MAX_KEYS 8
#define OSCAR__TUNE_MAX_PARAMS 4
#define OSCAR__TUNE_MAX_CANDIDATES 12
#define OSCAR__TUNE_MAX_LINE 4096
#define OSCAR__TUNE_MAX_FILE (OSCAR__CAST(size_t, 8) << 20)

/* ---- families ------------------------------------------------------------ */
/* How a bucket field is written: a number, or one of an enum's names. */
enum { OSCAR__TUNE_KEY_INT = 0, OSCAR__TUNE_KEY_SCALE, OSCAR__TUNE_KEY_DTYPE, OSCAR__TUNE_KEY_MODE };

typedef struct oscar__tune_param_def {
    const char *name;
    int32_t num_candidates;
    int32_t candidates[OSCAR__TUNE_MAX_CANDIDATES];
} oscar__tune_param_def;

typedef struct oscar__tune_family_def {
    const char *name; /* the record name in the table file */
    int32_t num_keys;
    const char *keys[OSCAR__TUNE_MAX_KEYS];
    int32_t key_kinds[OSCAR__TUNE_MAX_KEYS];
    int32_t num_params;
    oscar__tune_param_def params[OSCAR__TUNE_MAX_PARAMS];
    const char *sources[4]; /* embedded files whose digests key the entries (NULL: none) */
} oscar__tune_family_def;

/* Decode keys: the INT2 page size is exact (it picks the instantiation), the
   others are the fields the split heuristic and the kernels depend on. Why
   these candidates: the plan allows 1..128 splits per tier (the merge kernel
   keeps 128 weights per head); powers of two cover that range in 8 steps. */
enum {
    OSCAR__TK_DEC_HEAD_DIM = 0,
    OSCAR__TK_DEC_GROUP,
    OSCAR__TK_DEC_PAGE,
    OSCAR__TK_DEC_RATIO,
    OSCAR__TK_DEC_SCALE,
    OSCAR__TK_DEC_WINDOW,
    OSCAR__TK_DEC_BATCH,
    OSCAR__TK_DEC_CONTEXT
};
enum { OSCAR__TP_DEC_INT2_SPLITS = 0, OSCAR__TP_DEC_WINDOW_SPLITS, OSCAR__TP_DEC_REQUESTS_PER_CTA, OSCAR__TP_DEC_INT2_WARPS };
enum { OSCAR__TK_MRG_HEAD_DIM = 0, OSCAR__TK_MRG_STATES, OSCAR__TK_MRG_DTYPE, OSCAR__TK_MRG_ROWS };
enum { OSCAR__TP_MRG_ROWS_PER_CTA = 0 };
/* Quantize keys: what selects the instantiation (head dim, group size, source
   dtype) and what changes the work per row (scale layout, mode, how many of K
   and V are rotated, how many are clipped), then the launch's rows (every KV
   head of every token, K and V, of every layer in the launch) as a power of
   two capped at OSCAR__TUNE_QNT_ROWS_CAP. */
enum {
    OSCAR__TK_QNT_HEAD_DIM = 0,
    OSCAR__TK_QNT_GROUP,
    OSCAR__TK_QNT_SRC,
    OSCAR__TK_QNT_SCALE,
    OSCAR__TK_QNT_MODE,
    OSCAR__TK_QNT_ROTATED,
    OSCAR__TK_QNT_CLIPPED,
    OSCAR__TK_QNT_ROWS
};
enum { OSCAR__TP_QNT_ROWS_PER_WARP = 0, OSCAR__TP_QNT_WARPS_PER_CTA };
/* Above 2^20 rows (15 full waves of an H200 at 32-row warp steps) a launch is
   throughput-bound: a larger one changes only its tail, so they share the
   bucket (128K prefill tokens x 8 KV heads, K and V, is 2^21 rows). */
#define OSCAR__TUNE_QNT_ROWS_CAP (OSCAR__CAST(int64_t, 1) << 20)

/* The INT2 and window kernels take 32 and 16 tokens per step: a split smaller
   than one step is an empty CTA. */
#define OSCAR__TUNE_INT2_STEP 32
#define OSCAR__TUNE_WIN_STEP 16
/* merge_states: the heuristic's rows per CTA (one warp per row). */
#define OSCAR__MERGE_DEFAULT_ROWS 4

static const oscar__tune_family_def oscar__tune_families[OSCAR__TUNE_FAMILY_COUNT] = {
    {"", 0, {0}, {0}, 0, {{0, 0, {0}}}, {0, 0, 0}},
    {"decode",
     8,
     {"head_dim", "group", "page", "ratio", "scale", "window", "batch", "context"},
     {OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_SCALE,
      OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_INT},
     4,
     {{"int2_splits", 8, {1, 2, 4, 8, 16, 32, 64, 128}}, {"window_splits", 5, {1, 2, 4, 8, 16}},
      {"requests_per_cta", 5, {1, 2, 4, 8, 16}}, {"int2_warps", 3, {OSCAR__DECODE_WARPS, OSCAR__DECODE_INT2_WIDE8, OSCAR__DECODE_INT2_WIDE}}},
     {"decode.cuh", "common.cuh", "oscar_params.h"}},
    {"merge_states",
     4,
     {"head_dim", "states", "dtype", "rows"},
     {OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_DTYPE, OSCAR__TUNE_KEY_INT},
     1,
     {{"rows_per_cta", 3, {4, 8, 16}}},
     {"merge.cuh", "common.cuh", "oscar_params.h"}},
    /* quantize: the tile of quantize_kernel<D, G, SRC, ROWS, WARPS>; the
       candidate lists are jit/oscar_registry.h's (a test checks they agree),
       the registry decides which pairs exist per head dim */
    {"quantize",
     8,
     {"head_dim", "group", "dtype", "scale", "mode", "rotated", "clipped", "rows"},
     {OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_DTYPE, OSCAR__TUNE_KEY_SCALE, OSCAR__TUNE_KEY_MODE,
      OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_INT, OSCAR__TUNE_KEY_INT},
     2,
     {{"rows_per_warp", 2, {16, 32}}, {"warps_per_cta", 3, {2, 4, 8}}},
     {"quantize.cuh", "common.cuh", "oscar_params.h", "quantize_table.cuh"}},
};

OSCAR__PRIVATE int oscar__tune_family_ok(int32_t f) { return f > OSCAR_TUNE_FAMILY_NONE && f < OSCAR__TUNE_FAMILY_COUNT; }

/* Next power of two >= x (x >= 1); 0 stays 0. The bucket of a batch size or
   a token count. */
OSCAR__PRIVATE int64_t oscar__tune_pow2_bucket(int64_t x) {
    int64_t b = 1;
    if (x <= 0) return 0;
    while (b < x && b < (OSCAR__CAST(int64_t, 1) << 40)) b <<= 1;
    return b;
}

/* Is a key value one a bucket function can produce (and a sane one)? */
OSCAR__PRIVATE int oscar__tune_key_value_ok(int32_t family, int32_t k, int64_t v) {
    switch (family) {
    case OSCAR_TUNE_FAMILY_DECODE:
        switch (k) {
        case OSCAR__TK_DEC_HEAD_DIM: return v == 64 || v == 128 || v == 256;
        case OSCAR__TK_DEC_GROUP: return v == 32 || v == 64 || v == 128 || v == 256;
        case OSCAR__TK_DEC_PAGE: return v >= 1 && v <= 65536;
        case OSCAR__TK_DEC_RATIO: return v >= 1 && v <= 16;
        case OSCAR__TK_DEC_SCALE: return v > 0 && v < OSCAR__SCALE_LAYOUT_COUNT;
        case OSCAR__TK_DEC_WINDOW:
        case OSCAR__TK_DEC_CONTEXT: return v == 0 || (oscar__is_pow2(v) && v <= (OSCAR__CAST(int64_t, 1) << 31));
        case OSCAR__TK_DEC_BATCH: return oscar__is_pow2(v) && v <= 65536;
        default: return 0;
        }
    case OSCAR_TUNE_FAMILY_MERGE_STATES:
        switch (k) {
        case OSCAR__TK_MRG_HEAD_DIM: return v == 64 || v == 128 || v == 256;
        case OSCAR__TK_MRG_STATES: return v >= 1 && v <= 8;
        case OSCAR__TK_MRG_DTYPE: return v == OSCAR_DTYPE_BF16 || v == OSCAR_DTYPE_F16 || v == OSCAR_DTYPE_F32;
        case OSCAR__TK_MRG_ROWS: return oscar__is_pow2(v) && v <= (OSCAR__CAST(int64_t, 1) << 31);
        default: return 0;
        }
    case OSCAR_TUNE_FAMILY_QUANTIZE:
        switch (k) {
        case OSCAR__TK_QNT_HEAD_DIM: return v == 64 || v == 128 || v == 256;
        case OSCAR__TK_QNT_GROUP: return v == 32 || v == 64 || v == 128 || v == 256;
        case OSCAR__TK_QNT_SRC: return v == OSCAR_DTYPE_BF16 || v == OSCAR_DTYPE_F16;
        case OSCAR__TK_QNT_SCALE: return v > 0 && v < OSCAR__SCALE_LAYOUT_COUNT;
        case OSCAR__TK_QNT_MODE: return v > 0 && v < OSCAR__QUANT_MODE_COUNT;
        case OSCAR__TK_QNT_ROTATED:
        case OSCAR__TK_QNT_CLIPPED: return v >= 0 && v <= 2;
        case OSCAR__TK_QNT_ROWS: return oscar__is_pow2(v) && v <= OSCAR__TUNE_QNT_ROWS_CAP;
        default: return 0;
        }
    default: return 0;
    }
}

/* The validity rule of a candidate for a problem class (its bucket key). */
OSCAR__PRIVATE int oscar__tune_candidate_valid(int32_t family, const int32_t *key, int32_t param, int32_t value) {
    const oscar__tune_param_def *pd;
    int i, listed = 0;
    if (!oscar__tune_family_ok(family) || param < 0 || param >= oscar__tune_families[family].num_params) return 0;
    pd = &oscar__tune_families[family].params[param];
    for (i = 0; i < pd->num_candidates; i++) listed |= pd->candidates[i] == value;
    /* split counts: the grid times the listed powers of two, but a table entry
       (or an OSCAR_TUNE_DECODE_CANDIDATES plan the tuner kept) may name any
       count up to the largest (before session 37 a count like the bench's
       former 25 + 2 at 1 x 32K could not be pinned) */
    if (family == OSCAR_TUNE_FAMILY_DECODE && (param == OSCAR__TP_DEC_INT2_SPLITS || param == OSCAR__TP_DEC_WINDOW_SPLITS))
        listed = value >= 1 && value <= pd->candidates[pd->num_candidates - 1];
    if (!listed) return 0;
    if (family == OSCAR_TUNE_FAMILY_QUANTIZE) {
        /* a value some registered tile of this head dim uses (the registry's
           pairs are a product per head dim: 16|32 rows x 4|8 warps, and for
           head dim 256 16 rows x 2|8 warps, so values valid one by one make
           a registered pair) */
        const oscar__tune_param_def *other = &oscar__tune_families[family].params[1 - param];
        int j, any = 0;
        for (j = 0; j < other->num_candidates && !any; j++)
            any = param == OSCAR__TP_QNT_ROWS_PER_WARP
                      ? oscar__quant_tile_registered(key[OSCAR__TK_QNT_HEAD_DIM], value, other->candidates[j])
                      : oscar__quant_tile_registered(key[OSCAR__TK_QNT_HEAD_DIM], other->candidates[j], value);
        return any;
    }
    if (family == OSCAR_TUNE_FAMILY_DECODE) {
        /* a tier that does not exist has nothing to split; otherwise at least
           one kernel step of tokens per split */
        if (param == OSCAR__TP_DEC_INT2_SPLITS)
            return key[OSCAR__TK_DEC_CONTEXT] > 0 &&
                   OSCAR__CAST(int64_t, value) * OSCAR__TUNE_INT2_STEP <= key[OSCAR__TK_DEC_CONTEXT];
        if (param == OSCAR__TP_DEC_WINDOW_SPLITS)
            return key[OSCAR__TK_DEC_WINDOW] > 0 &&
                   OSCAR__CAST(int64_t, value) * OSCAR__TUNE_WIN_STEP <= key[OSCAR__TK_DEC_WINDOW];
        /* requests x heads per KV head fit a prep / merge CTA's rows, and no
           more requests than the bucket's batch */
        if (param == OSCAR__TP_DEC_REQUESTS_PER_CTA)
            return key[OSCAR__TK_DEC_RATIO] >= 1 && value * key[OSCAR__TK_DEC_RATIO] <= OSCAR_K_PREP_ROWS &&
                   value <= key[OSCAR__TK_DEC_BATCH];
        /* an INT2 kernel that exists for the bucket's geometry (the table is
           a device's: sm_90's shared memory bounds the 16-warp CTAs here; the
           plan checks its own device again) */
        if (param == OSCAR__TP_DEC_INT2_WARPS)
            return key[OSCAR__TK_DEC_CONTEXT] > 0 &&
                   oscar__decode_int2_warps_exist(key[OSCAR__TK_DEC_HEAD_DIM], key[OSCAR__TK_DEC_GROUP],
                                                  key[OSCAR__TK_DEC_RATIO], value, OSCAR__SM90_MAX_SMEM_OPTIN);
    }
    return 1;
}

/* The valid candidates of one parameter for a problem class; returns how many. */
OSCAR__PRIVATE int oscar__tune_candidates(int32_t family, const int32_t *key, int32_t param, int32_t *out) {
    int i, n = 0;
    if (!oscar__tune_family_ok(family) || param < 0 || param >= oscar__tune_families[family].num_params) return 0;
    for (i = 0; i < oscar__tune_families[family].params[param].num_candidates; i++) {
        int32_t v = oscar__tune_families[family].params[param].candidates[i];
        if (oscar__tune_candidate_valid(family, key, param, v)) out[n++] = v;
    }
    return n;
}

/* Bucket keys of the problems the plans see. */
OSCAR__PRIVATE void oscar__tune_decode_key(int32_t key[OSCAR__TUNE_MAX_KEYS], int head_dim, int group, int page,
                                           int ratio, oscar_scale_layout scale, int64_t window_tokens, int batch,
                                           int64_t int2_tokens) {
    memset(key, 0, sizeof(int32_t) * OSCAR__TUNE_MAX_KEYS);
    key[OSCAR__TK_DEC_HEAD_DIM] = head_dim;
    key[OSCAR__TK_DEC_GROUP] = group;
    key[OSCAR__TK_DEC_PAGE] = page;
    key[OSCAR__TK_DEC_RATIO] = ratio;
    key[OSCAR__TK_DEC_SCALE] = OSCAR__CAST(int32_t, scale);
    key[OSCAR__TK_DEC_WINDOW] = OSCAR__CAST(int32_t, oscar__tune_pow2_bucket(window_tokens));
    key[OSCAR__TK_DEC_BATCH] = OSCAR__CAST(int32_t, oscar__tune_pow2_bucket(batch));
    key[OSCAR__TK_DEC_CONTEXT] = OSCAR__CAST(int32_t, oscar__tune_pow2_bucket(int2_tokens));
}
OSCAR__PRIVATE void oscar__tune_merge_key(int32_t key[OSCAR__TUNE_MAX_KEYS], int head_dim, int states, oscar_dtype dtype,
                                          int64_t rows) {
    memset(key, 0, sizeof(int32_t) * OSCAR__TUNE_MAX_KEYS);
    key[OSCAR__TK_MRG_HEAD_DIM] = head_dim;
    key[OSCAR__TK_MRG_STATES] = states;
    key[OSCAR__TK_MRG_DTYPE] = OSCAR__CAST(int32_t, dtype);
    key[OSCAR__TK_MRG_ROWS] = OSCAR__CAST(int32_t, OSCAR__MIN(oscar__tune_pow2_bucket(rows), OSCAR__CAST(int64_t, 1) << 30));
}

/* quantize: rotated / clipped count the sides (K, V) with a rotation / a
   clip; rows are those of the launch (tokens x KV heads x 2 x layers). */
OSCAR__PRIVATE void oscar__tune_quant_key(int32_t key[OSCAR__TUNE_MAX_KEYS], int head_dim, int group, oscar_dtype src,
                                          oscar_scale_layout scale, oscar_quant_mode mode, int rotated, int clipped,
                                          int64_t rows) {
    memset(key, 0, sizeof(int32_t) * OSCAR__TUNE_MAX_KEYS);
    key[OSCAR__TK_QNT_HEAD_DIM] = head_dim;
    key[OSCAR__TK_QNT_GROUP] = group;
    key[OSCAR__TK_QNT_SRC] = OSCAR__CAST(int32_t, src);
    key[OSCAR__TK_QNT_SCALE] = OSCAR__CAST(int32_t, scale);
    key[OSCAR__TK_QNT_MODE] = OSCAR__CAST(int32_t, mode);
    key[OSCAR__TK_QNT_ROTATED] = rotated;
    key[OSCAR__TK_QNT_CLIPPED] = clipped;
    key[OSCAR__TK_QNT_ROWS] = OSCAR__CAST(int32_t, OSCAR__MIN(oscar__tune_pow2_bucket(OSCAR__MAX(rows, 1)), OSCAR__TUNE_QNT_ROWS_CAP));
}

/* The quantize tiles (rows per warp, warps per CTA) registered for a
   class's head dim, rows-major; returns how many (the device's shared
   memory limit is checked where a device is known). */
OSCAR__PRIVATE int oscar__tune_quant_tiles(const int32_t *key, int32_t *rows, int32_t *warps) {
    const oscar__tune_param_def *pr = &oscar__tune_families[OSCAR_TUNE_FAMILY_QUANTIZE].params[OSCAR__TP_QNT_ROWS_PER_WARP];
    const oscar__tune_param_def *pw = &oscar__tune_families[OSCAR_TUNE_FAMILY_QUANTIZE].params[OSCAR__TP_QNT_WARPS_PER_CTA];
    int i, j, n = 0;
    for (i = 0; i < pr->num_candidates; i++)
        for (j = 0; j < pw->num_candidates; j++)
            if (oscar__quant_tile_registered(key[OSCAR__TK_QNT_HEAD_DIM], pr->candidates[i], pw->candidates[j]))
                rows[n] = pr->candidates[i], warps[n] = pw->candidates[j], n++;
    return n;
}

/* The digest of a family's kernel sources (16 hex digits): entries tuned for
   other sources are stale and ignored. */
OSCAR__PRIVATE void oscar__tune_family_digest(int32_t family, char out[17]) {
    oscar__sha256 s;
    uint8_t d[32];
    int i;
    oscar__sha256_init(&s);
    for (i = 0; i < 4; i++) {
        const char *name = oscar__tune_families[family].sources[i];
        const oscar__embedded_source *src = name ? oscar__find_source(name) : NULL;
        if (!name) continue;
        oscar__sha256_str(&s, name);
        oscar__sha256_str(&s, src ? src->sha256 : "missing");
    }
    oscar__sha256_final(&s, d);
    oscar__hex(d, 8, out);
}

/* ---- tables ---------------------------------------------------------------- */
typedef struct oscar__tune_entry {
    int32_t family;
    int32_t key[OSCAR__TUNE_MAX_KEYS];
    int32_t params[OSCAR__TUNE_MAX_PARAMS];
    uint32_t params_set;  /* bit p: params[p] is tuned; unset = the heuristic's choice */
    double default_us;    /* < 0: not recorded */
    double tuned_us;
    char src[17];
} oscar__tune_entry;

typedef struct oscar__tune_table {
    oscar_tune_provenance prov;
    int32_t num_entries, cap_entries;
    oscar__tune_entry *entries;
} oscar__tune_table;

/* What the context keeps (NULL for the CPU backend). */
typedef struct oscar__tune_state {
    char path[1024];
    oscar__tune_table *user;    /* the context's table, or NULL */
    oscar__tune_table *builtin; /* the shipped table that applies, or NULL */
} oscar__tune_state;

/* Test hooks (tests define OSCAR_IMPLEMENTATION and set these). */
typedef struct oscar__tune_test_hooks {
    int32_t corrupt_int2_splits; /* decode candidates with this int2_splits get a corrupted output */
    int32_t slow_int2_splits;    /* decode candidates with this int2_splits run 4 times per timed run */
    int64_t fail_write_after;    /* > 0: a table write fails after this many bytes (atomicity test) */
    int32_t corrupt_quant_warps; /* quantize candidates with this warps_per_cta get corrupted codes */
} oscar__tune_test_hooks;
static oscar__tune_test_hooks oscar__tune_hooks;

/* Set by a tuning run on its own thread: the plans it makes for the default
   candidate must see the heuristic, not the table; merge and quantize
   candidates force their tile. */
static OSCAR__THREAD_LOCAL int oscar__tune_suppress;
static OSCAR__THREAD_LOCAL int32_t oscar__tune_force_merge_rows;
static OSCAR__THREAD_LOCAL int32_t oscar__tune_force_quant[2]; /* rows per warp, warps per CTA; 0: none */
static OSCAR__THREAD_LOCAL oscar_stream oscar__tune_stream;      /* the stream the candidates' runs launch on */
/* The tile of this thread's last quantize launch (the tuner reads the
   heuristic's choice from it; the tests, which tile a call took). */
static OSCAR__THREAD_LOCAL int32_t oscar__tune_last_quant[2];

OSCAR__PRIVATE oscar__tune_table *oscar__tune_table_new(const oscar_ctx *ctx) {
    return OSCAR__CAST(oscar__tune_table *, oscar__calloc(ctx, sizeof(oscar__tune_table)));
}
OSCAR__PRIVATE void oscar__tune_table_free(const oscar_ctx *ctx, oscar__tune_table *t) {
    if (!t) return;
    oscar__free(ctx, t->entries);
    oscar__free(ctx, t);
}
OSCAR__PRIVATE oscar__tune_table *oscar__tune_table_copy(const oscar_ctx *ctx, const oscar__tune_table *t) {
    oscar__tune_table *c = oscar__tune_table_new(ctx);
    if (!c) return NULL;
    c->prov = t->prov;
    if (t->num_entries > 0) {
        c->entries = OSCAR__CAST(oscar__tune_entry *,
                                 oscar__alloc(ctx, sizeof(oscar__tune_entry) * OSCAR__CAST(size_t, t->num_entries)));
        if (!c->entries) {
            oscar__free(ctx, c);
            return NULL;
        }
        memcpy(c->entries, t->entries, sizeof(oscar__tune_entry) * OSCAR__CAST(size_t, t->num_entries));
        c->num_entries = c->cap_entries = t->num_entries;
    }
    return c;
}

OSCAR__PRIVATE oscar__tune_entry *oscar__tune_table_find(const oscar__tune_table *t, int32_t family, const int32_t *key) {
    int i;
    if (!t) return NULL;
    for (i = 0; i < t->num_entries; i++)
        if (t->entries[i].family == family &&
            memcmp(t->entries[i].key, key, sizeof(int32_t) * OSCAR__TUNE_MAX_KEYS) == 0)
            return &t->entries[i];
    return NULL;
}

/* Adds or replaces the entry of (family, key). Returns 0, or -1 out of memory. */
OSCAR__PRIVATE int oscar__tune_table_put(const oscar_ctx *ctx, oscar__tune_table *t, const oscar__tune_entry *e) {
    oscar__tune_entry *old = oscar__tune_table_find(t, e->family, e->key);
    if (old) {
        *old = *e;
        return 0;
    }
    if (t->num_entries == t->cap_entries) {
        int32_t cap = t->cap_entries ? 2 * t->cap_entries : 16;
        oscar__tune_entry *n =
            OSCAR__CAST(oscar__tune_entry *, oscar__alloc(ctx, sizeof(oscar__tune_entry) * OSCAR__CAST(size_t, cap)));
        if (!n) return -1;
        if (t->num_entries) memcpy(n, t->entries, sizeof(oscar__tune_entry) * OSCAR__CAST(size_t, t->num_entries));
        oscar__free(ctx, t->entries);
        t->entries = n;
        t->cap_entries = cap;
    }
    t->entries[t->num_entries++] = *e;
    return 0;
}

/* ---- text: names of key values, the key and parameter strings ------------- */
OSCAR__PRIVATE const char *oscar__tune_scale_name(int32_t v) {
    return v == OSCAR_SCALE_LAYOUT_F16_SCALE_MIN ? "f16_scale_min" : v == OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO ? "f32_scale_zero" : "?";
}

OSCAR__PRIVATE const char *oscar__tune_mode_name(int32_t v) {
    return v == OSCAR_QUANT_MODE_UNIFORM ? "uniform" : v == OSCAR_QUANT_MODE_LLOYD_MAX ? "lloyd_max" : "?";
}

/* "head_dim=128 group=128 ..." (the bucket part of an entry line) */
OSCAR__PRIVATE void oscar__tune_key_text(int32_t family, const int32_t *key, char *out, size_t cap) {
    const oscar__tune_family_def *f = &oscar__tune_families[family];
    size_t len = 0;
    int k;
    out[0] = 0;
    for (k = 0; k < f->num_keys && len + 1 < cap; k++) {
        int n;
        if (f->key_kinds[k] == OSCAR__TUNE_KEY_SCALE)
            n = snprintf(out + len, cap - len, "%s%s=%s", k ? " " : "", f->keys[k], oscar__tune_scale_name(key[k]));
        else if (f->key_kinds[k] == OSCAR__TUNE_KEY_DTYPE)
            n = snprintf(out + len, cap - len, "%s%s=%s", k ? " " : "", f->keys[k],
                         oscar__dtype_name(OSCAR__CAST(oscar_dtype, key[k])));
        else if (f->key_kinds[k] == OSCAR__TUNE_KEY_MODE)
            n = snprintf(out + len, cap - len, "%s%s=%s", k ? " " : "", f->keys[k], oscar__tune_mode_name(key[k]));
        else
            n = snprintf(out + len, cap - len, "%s%s=%d", k ? " " : "", f->keys[k], key[k]);
        if (n > 0) len = OSCAR__MIN(len + OSCAR__CAST(size_t, n), cap - 1);
    }
}
/* "int2_splits=16 window_splits=2" (only the parameters in `set`) */
OSCAR__PRIVATE void oscar__tune_params_text(int32_t family, const int32_t *params, uint32_t set, char *out, size_t cap) {
    const oscar__tune_family_def *f = &oscar__tune_families[family];
    size_t len = 0;
    int p;
    out[0] = 0;
    for (p = 0; p < f->num_params && len + 1 < cap; p++) {
        int n;
        if (!(set & (1u << p))) continue;
        n = snprintf(out + len, cap - len, "%s%s=%d", len ? " " : "", f->params[p].name, params[p]);
        if (n > 0) len = OSCAR__MIN(len + OSCAR__CAST(size_t, n), cap - 1);
    }
}

/* ---- the file: writing --------------------------------------------------- */
typedef struct oscar__tune_buf {
    const oscar_ctx *ctx;
    char *p;
    size_t len, cap;
    int oom;
} oscar__tune_buf;

OSCAR__PRIVATE void oscar__tune_printf(oscar__tune_buf *b, const char *fmt, ...) OSCAR__PRINTF(2, 3);
OSCAR__PRIVATE void oscar__tune_printf(oscar__tune_buf *b, const char *fmt, ...) {
    va_list ap;
    int n;
    if (b->oom) return;
    for (;;) {
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        n = vsnprintf(b->p ? b->p + b->len : NULL, b->p ? room : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->p && OSCAR__CAST(size_t, n) < room) {
            b->len += OSCAR__CAST(size_t, n);
            return;
        }
        {
            size_t cap = (b->cap ? 2 * b->cap : 4096) + OSCAR__CAST(size_t, n);
            char *q = OSCAR__CAST(char *, oscar__alloc(b->ctx, cap));
            if (!q) {
                b->oom = 1;
                return;
            }
            if (b->len) memcpy(q, b->p, b->len);
            oscar__free(b->ctx, b->p);
            b->p = q;
            b->cap = cap;
        }
    }
}
/* A quoted string: \" and \\ escaped; control characters dropped. */
OSCAR__PRIVATE void oscar__tune_quote(oscar__tune_buf *b, const char *s) {
    oscar__tune_printf(b, "\"");
    for (; *s; s++) {
        unsigned char c = OSCAR__CAST(unsigned char, *s);
        if (c < 0x20) continue;
        if (c == '"' || c == '\\') oscar__tune_printf(b, "\\%c", c);
        else oscar__tune_printf(b, "%c", c);
    }
    oscar__tune_printf(b, "\"");
}

OSCAR__PRIVATE void oscar__tune_format(const oscar__tune_table *t, oscar__tune_buf *b) {
    int i;
    oscar__tune_printf(b, "# oscar.h tuning table (docs/tuning.md): one record per line, key=value fields.\n");
    oscar__tune_printf(b, "# An entry without a parameter keeps the heuristic's choice for it.\n");
    oscar__tune_printf(b, "oscar-tune-table format=%d\n", OSCAR__TUNE_FORMAT);
    oscar__tune_printf(b, "provenance gpu=");
    oscar__tune_quote(b, t->prov.gpu_name);
    oscar__tune_printf(b, " sms=%d cc=%d nvrtc=%d oscar=", t->prov.num_sms, t->prov.sm, t->prov.nvrtc_version);
    oscar__tune_quote(b, t->prov.oscar_version);
    oscar__tune_printf(b, " date=");
    oscar__tune_quote(b, t->prov.date);
    oscar__tune_printf(b, " tuning_s=%.3f\n", t->prov.tuning_seconds);
    for (i = 0; i < t->num_entries; i++) {
        const oscar__tune_entry *e = &t->entries[i];
        char key[512], params[256];
        oscar__tune_key_text(e->family, e->key, key, sizeof key);
        oscar__tune_params_text(e->family, e->params, e->params_set, params, sizeof params);
        oscar__tune_printf(b, "%s %s src=%s%s%s", oscar__tune_families[e->family].name, key, e->src, params[0] ? " " : "",
                           params);
        if (e->default_us >= 0) oscar__tune_printf(b, " default_us=%.3f", e->default_us);
        if (e->tuned_us >= 0) oscar__tune_printf(b, " tuned_us=%.3f", e->tuned_us);
        oscar__tune_printf(b, "\n");
    }
}

/* Writes data to path atomically: a temporary file in the same folder,
   fsync, rename. Returns OSCAR_OK or OSCAR_STATUS_IO_ERROR (sentence set);
   on failure the temporary file is removed and path is untouched. */
OSCAR__PRIVATE oscar_status oscar__tune_write_atomic(const oscar_ctx *ctx, const char *func, const char *path,
                                                    const char *data, size_t n) {
    static int counter = 0;
    char tmp[1200];
    int fd, k = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED), err;
    size_t first = n;
    if (strlen(path) > 1100)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "%s: path is %zu characters long; expected at most 1100",
                           func, strlen(path));
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%d", path, OSCAR__CAST(long, getpid()), k);
    fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "%s: cannot create %s: %s (the table at %s is unchanged)", func,
                           tmp, strerror(errno), path);
    if (oscar__tune_hooks.fail_write_after > 0 && OSCAR__CAST(size_t, oscar__tune_hooks.fail_write_after) < n)
        first = OSCAR__CAST(size_t, oscar__tune_hooks.fail_write_after);
    if (oscar__write_all(fd, data, first) != 0 || first < n || fsync(fd) != 0) {
        err = first < n ? EIO : errno;
        close(fd);
        unlink(tmp);
        return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "%s: cannot write %s: %s (the table at %s is unchanged)", func,
                           tmp, strerror(err), path);
    }
    close(fd);
    if (rename(tmp, path) != 0) {
        err = errno;
        unlink(tmp);
        return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "%s: cannot rename %s to %s: %s (the old table is unchanged)", func,
                           tmp, path, strerror(err));
    }
    return OSCAR_OK;
}

/* ---- the file: parsing ----------------------------------------------------- */
/* One `key=value` field; value points into the line buffer (unescaped in place). */
typedef struct oscar__tune_field {
    char *key, *value;
} oscar__tune_field;

/* Splits a line into its record name and fields. Returns the field count, or
   -1 with a reason in why. */
OSCAR__PRIVATE int oscar__tune_split(char *line, char **record, oscar__tune_field *fields, int cap, char *why, size_t why_cap) {
    char *p = line;
    int n = 0;
    while (*p == ' ' || *p == '\t') p++;
    *record = p;
    while (*p && *p != ' ' && *p != '\t' && *p != '=') p++;
    if (*p == '=') {
        snprintf(why, why_cap, "a record starts with its name (oscar-tune-table, provenance or a family), not a field");
        return -1;
    }
    if (*p) *p++ = 0;
    for (;;) {
        char *k, *v, *w;
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        if (n == cap) {
            snprintf(why, why_cap, "more than %d fields", cap);
            return -1;
        }
        k = p;
        while (*p && *p != '=' && *p != ' ' && *p != '\t') p++;
        if (*p != '=' || p == k) {
            snprintf(why, why_cap, "field \"%.*s\" is not key=value", OSCAR__CAST(int, OSCAR__MIN(p - k + 1, 40)), k);
            return -1;
        }
        *p++ = 0;
        if (*p == '"') {
            v = w = ++p;
            for (;;) {
                if (!*p) {
                    snprintf(why, why_cap, "the quoted value of %.40s has no closing quote", k);
                    return -1;
                }
                if (*p == '"') break;
                if (*p == '\\' && (p[1] == '"' || p[1] == '\\')) p++;
                *w++ = *p++;
            }
            p++;
            *w = 0;
            if (*p && *p != ' ' && *p != '\t') {
                snprintf(why, why_cap, "text right after the quoted value of %.40s", k);
                return -1;
            }
        } else {
            v = p;
            while (*p && *p != ' ' && *p != '\t') p++;
            if (p == v) {
                snprintf(why, why_cap, "%.40s has an empty value", k);
                return -1;
            }
            if (*p) *p++ = 0;
        }
        fields[n].key = k;
        fields[n].value = v;
        n++;
    }
    return n;
}

OSCAR__PRIVATE int oscar__tune_parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    long long v;
    errno = 0;
    if (!s[0] || s[0] == ' ') return 0;
    v = strtoll(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return 0;
    *out = v;
    return 1;
}
OSCAR__PRIVATE int oscar__tune_parse_double(const char *s, double *out) {
    char *end;
    double v;
    errno = 0;
    if (!s[0]) return 0;
    v = strtod(s, &end);
    if (errno || *end || !(v >= 0.0) || v > 1e12) return 0;
    *out = v;
    return 1;
}

OSCAR__PRIVATE int oscar__tune_parse_provenance(oscar__tune_field *f, int n, oscar_tune_provenance *prov, char *why,
                                                size_t why_cap) {
    static const char *const names[7] = {"gpu", "sms", "cc", "nvrtc", "oscar", "date", "tuning_s"};
    int seen[7] = {0, 0, 0, 0, 0, 0, 0}, i, j;
    memset(prov, 0, sizeof *prov);
    for (i = 0; i < n; i++) {
        int64_t v = 0;
        for (j = 0; j < 7 && strcmp(f[i].key, names[j]) != 0; j++) {}
        if (j == 7) {
            snprintf(why, why_cap, "provenance has an unknown field \"%.40s\"", f[i].key);
            return -1;
        }
        if (seen[j]++) {
            snprintf(why, why_cap, "provenance field %s appears twice", names[j]);
            return -1;
        }
        switch (j) {
        case 0:
        case 4:
        case 5: {
            char *dst = j == 0 ? prov->gpu_name : j == 4 ? prov->oscar_version : prov->date;
            size_t cap = j == 0 ? sizeof prov->gpu_name : j == 4 ? sizeof prov->oscar_version : sizeof prov->date;
            if (strlen(f[i].value) >= cap) {
                snprintf(why, why_cap, "provenance %s is %zu characters long; expected < %zu", names[j], strlen(f[i].value), cap);
                return -1;
            }
            snprintf(dst, cap, "%s", f[i].value);
            break;
        }
        case 6:
            if (!oscar__tune_parse_double(f[i].value, &prov->tuning_seconds)) {
                snprintf(why, why_cap, "provenance tuning_s = \"%.40s\"; expected seconds >= 0", f[i].value);
                return -1;
            }
            break;
        default:
            if (!oscar__tune_parse_int(f[i].value, 0, 1000000000, &v)) {
                snprintf(why, why_cap, "provenance %s = \"%.40s\"; expected an integer >= 0", names[j], f[i].value);
                return -1;
            }
            if (j == 1) prov->num_sms = OSCAR__CAST(int32_t, v);
            else if (j == 2) prov->sm = OSCAR__CAST(int32_t, v);
            else prov->nvrtc_version = OSCAR__CAST(int32_t, v);
        }
    }
    for (j = 0; j < 7; j++)
        if (!seen[j]) {
            snprintf(why, why_cap, "provenance lacks %s", names[j]);
            return -1;
        }
    return 0;
}

OSCAR__PRIVATE int oscar__tune_parse_entry(int32_t family, oscar__tune_field *f, int n, oscar__tune_entry *e, char *why,
                                           size_t why_cap) {
    const oscar__tune_family_def *fd = &oscar__tune_families[family];
    uint32_t keys_seen = 0;
    int i, k, p, seen_src = 0, seen_def = 0, seen_tuned = 0;
    memset(e, 0, sizeof *e);
    e->family = family;
    e->default_us = e->tuned_us = -1;
    for (i = 0; i < n; i++) {
        int64_t v = 0;
        for (k = 0; k < fd->num_keys && strcmp(f[i].key, fd->keys[k]) != 0; k++) {}
        if (k < fd->num_keys) {
            if (keys_seen & (1u << k)) {
                snprintf(why, why_cap, "%.40s appears twice", f[i].key);
                return -1;
            }
            keys_seen |= 1u << k;
            if (fd->key_kinds[k] == OSCAR__TUNE_KEY_SCALE) {
                v = !strcmp(f[i].value, "f16_scale_min") ? OSCAR_SCALE_LAYOUT_F16_SCALE_MIN
                    : !strcmp(f[i].value, "f32_scale_zero") ? OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO : 0;
            } else if (fd->key_kinds[k] == OSCAR__TUNE_KEY_DTYPE) {
                v = !strcmp(f[i].value, "bf16") ? OSCAR_DTYPE_BF16
                    : !strcmp(f[i].value, "f16") ? OSCAR_DTYPE_F16 : !strcmp(f[i].value, "f32") ? OSCAR_DTYPE_F32 : 0;
            } else if (fd->key_kinds[k] == OSCAR__TUNE_KEY_MODE) {
                v = !strcmp(f[i].value, "uniform") ? OSCAR_QUANT_MODE_UNIFORM
                    : !strcmp(f[i].value, "lloyd_max") ? OSCAR_QUANT_MODE_LLOYD_MAX : 0;
            } else if (!oscar__tune_parse_int(f[i].value, 0, OSCAR__CAST(int64_t, 1) << 31, &v)) {
                v = -1;
            }
            if (!oscar__tune_key_value_ok(family, k, v)) {
                snprintf(why, why_cap, "%s %s = \"%.40s\" is not a bucket value (see docs/tuning.md)", fd->name, fd->keys[k],
                         f[i].value);
                return -1;
            }
            e->key[k] = OSCAR__CAST(int32_t, v);
            continue;
        }
        for (p = 0; p < fd->num_params && strcmp(f[i].key, fd->params[p].name) != 0; p++) {}
        if (p < fd->num_params) {
            if (e->params_set & (1u << p)) {
                snprintf(why, why_cap, "%.40s appears twice", f[i].key);
                return -1;
            }
            if (!oscar__tune_parse_int(f[i].value, -1000000, 1000000, &v)) {
                snprintf(why, why_cap, "%.40s = \"%.40s\"; expected an integer", f[i].key, f[i].value);
                return -1;
            }
            e->params[p] = OSCAR__CAST(int32_t, v);
            e->params_set |= 1u << p;
            continue;
        }
        if (!strcmp(f[i].key, "src")) {
            size_t len = strlen(f[i].value), j;
            int hex = len == 16;
            for (j = 0; j < len && hex; j++) hex = (f[i].value[j] >= '0' && f[i].value[j] <= '9') || (f[i].value[j] >= 'a' && f[i].value[j] <= 'f');
            if (seen_src++ || !hex) {
                snprintf(why, why_cap, "src = \"%.40s\"; expected once, 16 lower-case hex digits", f[i].value);
                return -1;
            }
            memcpy(e->src, f[i].value, 17);
            continue;
        }
        if (!strcmp(f[i].key, "default_us") || !strcmp(f[i].key, "tuned_us")) {
            int is_def = f[i].key[0] == 'd';
            if ((is_def ? seen_def++ : seen_tuned++) ||
                !oscar__tune_parse_double(f[i].value, is_def ? &e->default_us : &e->tuned_us)) {
                snprintf(why, why_cap, "%.40s = \"%.40s\"; expected once, microseconds >= 0", f[i].key, f[i].value);
                return -1;
            }
            continue;
        }
        snprintf(why, why_cap, "%s has no field \"%.40s\" (fields: the bucket, src, the family's parameters, default_us, tuned_us)",
                 fd->name, f[i].key);
        return -1;
    }
    for (k = 0; k < fd->num_keys; k++)
        if (!(keys_seen & (1u << k))) {
            snprintf(why, why_cap, "%s entry lacks its bucket field %s", fd->name, fd->keys[k]);
            return -1;
        }
    if (!seen_src) {
        snprintf(why, why_cap, "%s entry lacks src (the digest of its kernel sources)", fd->name);
        return -1;
    }
    for (p = 0; p < fd->num_params; p++)
        if ((e->params_set & (1u << p)) && !oscar__tune_candidate_valid(family, e->key, p, e->params[p])) {
            snprintf(why, why_cap, "%s = %d is not a valid candidate for this bucket", fd->params[p].name, e->params[p]);
            return -1;
        }
    return 0;
}

/* Parses a table from text (n bytes, need not be terminated). Returns
   OSCAR_OK with *out, or OSCAR_STATUS_FORMAT_ERROR with the sentence
   "<func>: <name>:<line>: <why>" recorded (and logged). */
OSCAR__PRIVATE oscar_status oscar__tune_parse(const oscar_ctx *ctx, const char *func, const char *name, const char *text,
                                             size_t n, oscar__tune_table **out) {
    oscar__tune_table *t;
    char line[OSCAR__TUNE_MAX_LINE + 2], why[512];
    oscar__tune_field fields[32];
    size_t pos = 0;
    int lineno = 0, have_header = 0, have_prov = 0;
    *out = NULL;
    t = oscar__tune_table_new(ctx);
    if (!t) return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of host memory", func);
    why[0] = 0;
    while (pos < n) {
        size_t len = 0;
        char *record;
        int nf, fam;
        lineno++;
        while (pos < n && text[pos] != '\n') {
            unsigned char c = OSCAR__CAST(unsigned char, text[pos]);
            if (len >= OSCAR__TUNE_MAX_LINE) {
                snprintf(why, sizeof why, "line longer than %d characters", OSCAR__TUNE_MAX_LINE);
                goto bad;
            }
            if ((c < 0x20 && c != '\t' && c != '\r') || c == 0x7f) {
                snprintf(why, sizeof why, "control character 0x%02x (not a text file?)", c);
                goto bad;
            }
            line[len++] = OSCAR__CAST(char, c);
            pos++;
        }
        pos++; /* the newline */
        if (len && line[len - 1] == '\r') len--;
        line[len] = 0;
        {
            char *s = line;
            while (*s == ' ' || *s == '\t') s++;
            if (!*s || *s == '#') continue;
        }
        nf = oscar__tune_split(line, &record, fields, 32, why, sizeof why);
        if (nf < 0) goto bad;
        if (!have_header) {
            int64_t fmt = 0;
            if (strcmp(record, "oscar-tune-table") != 0) {
                snprintf(why, sizeof why, "the first record is \"%.40s\"; expected \"oscar-tune-table format=%d\"", record,
                         OSCAR__TUNE_FORMAT);
                goto bad;
            }
            if (nf != 1 || strcmp(fields[0].key, "format") != 0 || !oscar__tune_parse_int(fields[0].value, 0, 1000, &fmt) ||
                fmt != OSCAR__TUNE_FORMAT) {
                snprintf(why, sizeof why, "header \"oscar-tune-table %s=%s\"; this oscar reads format=%d",
                         nf ? fields[0].key : "", nf ? fields[0].value : "", OSCAR__TUNE_FORMAT);
                goto bad;
            }
            have_header = 1;
            continue;
        }
        if (!strcmp(record, "provenance")) {
            if (have_prov) {
                snprintf(why, sizeof why, "a second provenance record");
                goto bad;
            }
            if (oscar__tune_parse_provenance(fields, nf, &t->prov, why, sizeof why) != 0) goto bad;
            have_prov = 1;
            continue;
        }
        for (fam = 1; fam < OSCAR__TUNE_FAMILY_COUNT && strcmp(record, oscar__tune_families[fam].name) != 0; fam++) {}
        if (fam == OSCAR__TUNE_FAMILY_COUNT) {
            snprintf(why, sizeof why, "unknown record \"%.40s\" (expected provenance, decode, merge_states or quantize)", record);
            goto bad;
        }
        if (!have_prov) {
            snprintf(why, sizeof why, "an entry before the provenance record");
            goto bad;
        }
        {
            oscar__tune_entry e;
            if (oscar__tune_parse_entry(fam, fields, nf, &e, why, sizeof why) != 0) goto bad;
            if (oscar__tune_table_find(t, e.family, e.key)) {
                snprintf(why, sizeof why, "a second %s entry for the same bucket", oscar__tune_families[fam].name);
                goto bad;
            }
            if (oscar__tune_table_put(ctx, t, &e) != 0) {
                oscar__tune_table_free(ctx, t);
                return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of host memory", func);
            }
        }
    }
    if (!have_header || !have_prov) {
        snprintf(why, sizeof why, "%s", !have_header ? "no \"oscar-tune-table\" header" : "no provenance record");
        lineno = 0;
        goto bad;
    }
    *out = t;
    return OSCAR_OK;
bad:
    oscar__tune_table_free(ctx, t);
    if (lineno)
        return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: %s:%d: %s; the table is ignored", func, name, lineno, why);
    return oscar__fail(ctx, OSCAR_STATUS_FORMAT_ERROR, "%s: %s: %s; the table is ignored", func, name, why);
}

/* Reads a whole file (at most OSCAR__TUNE_MAX_FILE bytes). Returns 0, 1 when
   it does not exist, -1 on any other failure (errno set). */
OSCAR__PRIVATE int oscar__tune_read_file(const oscar_ctx *ctx, const char *path, char **out, size_t *out_n) {
    FILE *f = fopen(path, "rb");
    char *buf;
    size_t n = 0;
    *out = NULL;
    *out_n = 0;
    if (!f) return errno == ENOENT ? 1 : -1;
    buf = OSCAR__CAST(char *, oscar__alloc(ctx, OSCAR__TUNE_MAX_FILE + 1));
    if (!buf) {
        fclose(f);
        errno = ENOMEM;
        return -1;
    }
    n = fread(buf, 1, OSCAR__TUNE_MAX_FILE + 1, f);
    if (ferror(f) || n > OSCAR__TUNE_MAX_FILE) {
        int err = ferror(f) ? EIO : EFBIG;
        fclose(f);
        oscar__free(ctx, buf);
        errno = err;
        return -1;
    }
    fclose(f);
    *out = buf;
    *out_n = n;
    return 0;
}

/* ---- provenance ------------------------------------------------------------ */
OSCAR__PRIVATE void oscar__tune_identity(const oscar_ctx *ctx, oscar_tune_provenance *id) {
    memset(id, 0, sizeof *id);
    if (!ctx->compile_only) {
        snprintf(id->gpu_name, sizeof id->gpu_name, "%s", ctx->device_name);
        id->num_sms = ctx->num_sms;
    }
    id->sm = ctx->sm;
    id->nvrtc_version = ctx->nvrtc_major * 1000 + ctx->nvrtc_minor * 10;
    snprintf(id->oscar_version, sizeof id->oscar_version, "%s", OSCAR_VERSION_STRING);
}

/* 0 when a table made as `t` is valid for a context that is `have`; else 1
   and a sentence. num_sms == 0 in `have` (compile-only): GPU name and SM count
   are unknown and not compared. */
OSCAR__PRIVATE int oscar__tune_foreign(const oscar_tune_provenance *have, const oscar_tune_provenance *t, char *why,
                                       size_t cap) {
    const char *what = NULL;
    if (have->num_sms > 0 && strcmp(have->gpu_name, t->gpu_name) != 0) what = "GPU";
    else if (have->num_sms > 0 && have->num_sms != t->num_sms) what = "SM count";
    else if (have->sm != t->sm) what = "compute capability";
    else if (have->nvrtc_version != t->nvrtc_version) what = "NVRTC version";
    else if (strcmp(have->oscar_version, t->oscar_version) != 0) what = "oscar version";
    if (!what) return 0;
    snprintf(why, cap,
             "tuned on another %s: \"%s\" (%d SMs, sm_%d, NVRTC %d.%d, oscar %s); this context is \"%s\" (%d SMs, "
             "sm_%d, NVRTC %d.%d, oscar %s)",
             what, t->gpu_name, t->num_sms, t->sm, t->nvrtc_version / 1000, t->nvrtc_version % 1000 / 10,
             t->oscar_version, have->num_sms > 0 ? have->gpu_name : "compile-only", have->num_sms, have->sm,
             have->nvrtc_version / 1000, have->nvrtc_version % 1000 / 10, have->oscar_version);
    return 1;
}

/* A warning (level 2) to the logger: what a table lost, and why. */
OSCAR__PRIVATE void oscar__tune_warn(const oscar_ctx *ctx, const char *fmt, ...) OSCAR__PRINTF(2, 3);
OSCAR__PRIVATE void oscar__tune_warn(const oscar_ctx *ctx, const char *fmt, ...) {
    char buf[1400];
    va_list ap;
    if (!ctx || !ctx->desc.logger.func) return;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    oscar__log(ctx, 2, 0, buf, 0, NULL);
}

/* Drops entries whose kernel sources changed since they were tuned; logs how many. */
OSCAR__PRIVATE void oscar__tune_drop_stale(const oscar_ctx *ctx, oscar__tune_table *t, const char *name) {
    char digest[OSCAR__TUNE_FAMILY_COUNT][17];
    int f, i, kept = 0, dropped[OSCAR__TUNE_FAMILY_COUNT] = {0};
    for (f = 1; f < OSCAR__TUNE_FAMILY_COUNT; f++) oscar__tune_family_digest(f, digest[f]);
    for (i = 0; i < t->num_entries; i++) {
        if (strcmp(t->entries[i].src, digest[t->entries[i].family]) != 0) {
            dropped[t->entries[i].family]++;
            continue;
        }
        t->entries[kept++] = t->entries[i];
    }
    t->num_entries = kept;
    for (f = 1; f < OSCAR__TUNE_FAMILY_COUNT; f++)
        if (dropped[f])
            oscar__tune_warn(ctx, "tuning table %s: %d %s entries ignored: tuned for other kernel sources (src != %s)", name,
                             dropped[f], oscar__tune_families[f].name, digest[f]);
}

/* Checks a parsed table against an identity; on a match drops stale entries
   and returns 0, else logs "<name> ignored: <why>" and returns 1 (why filled). */
OSCAR__PRIVATE int oscar__tune_adopt(const oscar_ctx *ctx, const oscar_tune_provenance *have, oscar__tune_table *t,
                                     const char *name, char *why, size_t cap) {
    if (oscar__tune_foreign(have, &t->prov, why, cap)) {
        oscar__tune_warn(ctx, "tuning table %s ignored: %s", name, why);
        return 1;
    }
    oscar__tune_drop_stale(ctx, t, name);
    return 0;
}

/* ---- the context ------------------------------------------------------------ */
/* Loads a file for the context: NULL (no table) when missing, malformed or
   foreign, with a log line. */
OSCAR__PRIVATE oscar__tune_table *oscar__tune_load_quiet(oscar_ctx *ctx, const char *path) {
    char *text = NULL, why[1024];
    size_t n = 0;
    oscar__tune_table *t = NULL;
    oscar_tune_provenance id;
    int r = oscar__tune_read_file(ctx, path, &text, &n);
    if (r == 1) {
        oscar__info(ctx, "tuning table %s: no such file; heuristics (and shipped tables) decide", path);
        return NULL;
    }
    if (r != 0) {
        oscar__tune_warn(ctx, "tuning table %s: cannot read: %s; ignored", path, strerror(errno));
        return NULL;
    }
    if (oscar__tune_parse(ctx, "oscar_setup", path, text, n, &t) != OSCAR_OK) {
        /* the sentence was logged by oscar__fail; setup itself goes on */
        oscar__free(ctx, text);
        oscar__clear_error(ctx);
        return NULL;
    }
    oscar__free(ctx, text);
    oscar__tune_identity(ctx, &id);
    if (oscar__tune_adopt(ctx, &id, t, path, why, sizeof why)) {
        oscar__tune_table_free(ctx, t);
        return NULL;
    }
    oscar__info(ctx, "tuning table %s: %d entries (tuned %s, %.1f s)", path, t->num_entries, t->prov.date,
                t->prov.tuning_seconds);
    return t;
}

/* The shipped table of the context's arch, if it applies. Never in a
   compile-only context: it knows no GPU name or SM count, and a shipped table
   is measured on one GPU (a table the caller loads still applies there). */
OSCAR__PRIVATE oscar__tune_table *oscar__tune_load_builtin(oscar_ctx *ctx) {
    int i;
    if (ctx->compile_only) return NULL;
    for (i = 0; i < OSCAR__NUM_TUNE_DEFAULTS; i++) {
        oscar__tune_table *t = NULL;
        oscar_tune_provenance id;
        char why[1024];
        if (oscar__tune_defaults[i].sm != ctx->sm) continue;
        if (oscar__tune_parse(ctx, "oscar_setup", oscar__tune_defaults[i].name, oscar__tune_defaults[i].text,
                              strlen(oscar__tune_defaults[i].text), &t) != OSCAR_OK) {
            oscar__clear_error(ctx);
            continue;
        }
        oscar__tune_identity(ctx, &id);
        if (oscar__tune_adopt(ctx, &id, t, oscar__tune_defaults[i].name, why, sizeof why)) {
            oscar__tune_table_free(ctx, t);
            continue;
        }
        return t;
    }
    return NULL;
}

/* At oscar_setup (CUDA backend): the table path, the context's table, the
   shipped table. Never fails setup: a bad table only costs its entries. */
OSCAR__PRIVATE void oscar__tune_setup(oscar_ctx *ctx, const char *desc_path) {
    const char *env = getenv("OSCAR_TUNE_TABLE");
    oscar__tune_state *s = OSCAR__CAST(oscar__tune_state *, oscar__calloc(ctx, sizeof(oscar__tune_state)));
    ctx->tune = s;
    if (!s) return;
    if (desc_path && desc_path[0]) snprintf(s->path, sizeof s->path, "%s", desc_path);
    else if (env && env[0]) snprintf(s->path, sizeof s->path, "%s", env);
    else if (ctx->cache_dir[0] &&
             snprintf(s->path, sizeof s->path, "%s/tune_table.txt", ctx->cache_dir) >= OSCAR__CAST(int, sizeof s->path))
        s->path[0] = 0; /* too long for a path: no default table */
    if (s->path[0]) s->user = oscar__tune_load_quiet(ctx, s->path);
    s->builtin = oscar__tune_load_builtin(ctx);
}

OSCAR__PRIVATE void oscar__tune_destroy(oscar_ctx *ctx) {
    if (!ctx->tune) return;
    oscar__tune_table_free(ctx, ctx->tune->user);
    oscar__tune_table_free(ctx, ctx->tune->builtin);
    oscar__free(ctx, ctx->tune);
    ctx->tune = NULL;
}

/* The entry of (family, key): the context's table first, then the shipped
   one. Returns 1 and copies it, or 0 ("not tuned": the heuristic decides). */
OSCAR__PRIVATE int oscar__tune_lookup(oscar_ctx *ctx, int32_t family, const int32_t *key, oscar__tune_entry *out) {
    const oscar__tune_entry *e = NULL;
    if (!ctx || !ctx->tune || oscar__tune_suppress) return 0;
    pthread_mutex_lock(&ctx->lock);
    e = oscar__tune_table_find(ctx->tune->user, family, key);
    if (!e) e = oscar__tune_table_find(ctx->tune->builtin, family, key);
    if (e) *out = *e;
    pthread_mutex_unlock(&ctx->lock);
    return e != NULL;
}

/* The hook of oscar_decode_plan: replaces the automatic split counts (those
   the desc leaves at 0, of tiers that exist; the INT2 count with its warps
   per CTA, where the desc leaves both automatic) and requests per prep /
   merge CTA (where the desc leaves it at 0) by the table's for this bucket. */
OSCAR__PRIVATE void oscar__tune_decode_apply(oscar_ctx *ctx, const oscar_decode_plan_desc *desc, oscar_decode_plan_info *pl) {
    int32_t key[OSCAR__TUNE_MAX_KEYS];
    oscar__tune_entry e;
    int64_t win = pl->has_window ? (desc->max_window_tokens ? desc->max_window_tokens : 512) : 0;
    if (pl->num_kv_heads <= 0) return;
    oscar__tune_decode_key(key, pl->head_dim, pl->group_size, pl->page_size, pl->num_q_heads / pl->num_kv_heads,
                           pl->scale_layout, win, pl->batch_size, desc->max_int2_tokens);
    if (!oscar__tune_lookup(ctx, OSCAR_TUNE_FAMILY_DECODE, key, &e)) return;
    if (desc->int2_splits == 0 && desc->int2_warps == 0 && pl->int2_splits > 0 &&
        (e.params_set & (1u << OSCAR__TP_DEC_INT2_SPLITS))) {
        /* the table's split count with the warps it was tuned with (4 where an
           entry predates int2_warps), when this device has that kernel */
        const int32_t warps = (e.params_set & (1u << OSCAR__TP_DEC_INT2_WARPS)) ? e.params[OSCAR__TP_DEC_INT2_WARPS]
                                                                                 : OSCAR__DECODE_WARPS;
        if (oscar__decode_int2_warps_exist(pl->head_dim, pl->group_size, pl->num_q_heads / pl->num_kv_heads, warps,
                                           oscar__ctx_smem_limit(ctx)))
            pl->int2_splits = e.params[OSCAR__TP_DEC_INT2_SPLITS], pl->int2_warps = warps;
    }
    if (desc->window_splits == 0 && pl->window_splits > 0 && (e.params_set & (1u << OSCAR__TP_DEC_WINDOW_SPLITS)))
        pl->window_splits = e.params[OSCAR__TP_DEC_WINDOW_SPLITS];
    /* the bucket's batch is a power of two >= the plan's: the value may
       exceed the batch (one CTA then serves them all), never the rows */
    if (desc->requests_per_cta == 0 && (e.params_set & (1u << OSCAR__TP_DEC_REQUESTS_PER_CTA)) &&
        e.params[OSCAR__TP_DEC_REQUESTS_PER_CTA] * (pl->num_q_heads / pl->num_kv_heads) <= OSCAR_K_PREP_ROWS)
        pl->requests_per_cta = e.params[OSCAR__TP_DEC_REQUESTS_PER_CTA];
}

/* merge_states: rows per CTA from the table, else the heuristic (4). */
OSCAR__PRIVATE int32_t oscar__tune_merge_rows(oscar_ctx *ctx, int head_dim, int states, oscar_dtype dtype, int64_t rows) {
    int32_t key[OSCAR__TUNE_MAX_KEYS];
    oscar__tune_entry e;
    if (oscar__tune_force_merge_rows) return oscar__tune_force_merge_rows;
    oscar__tune_merge_key(key, head_dim, states, dtype, rows);
    if (oscar__tune_lookup(ctx, OSCAR_TUNE_FAMILY_MERGE_STATES, key, &e) &&
        (e.params_set & (1u << OSCAR__TP_MRG_ROWS_PER_CTA)))
        return e.params[OSCAR__TP_MRG_ROWS_PER_CTA];
    return OSCAR__MERGE_DEFAULT_ROWS;
}

/* quantize: src/oscar_quantize.h (later in the implementation) */
OSCAR__PRIVATE int oscar__quant_tile_valid(const oscar_ctx *ctx, int head_dim, int rows, int warps, int with_rotation);

/* The hook of oscar_quantize_kv's tile choice (unless the caller forced a
   tile): *rows_per_warp and *warps_per_cta hold the heuristic's choice and
   take the table's for this bucket when it has one that fits this device's
   shared memory; a tuning run's forced candidate comes first. */
OSCAR__PRIVATE void oscar__tune_quant_apply(oscar_ctx *ctx, const int32_t *key, int with_rotation, int32_t *rows_per_warp,
                                            int32_t *warps_per_cta) {
    oscar__tune_entry e;
    if (oscar__tune_force_quant[0]) {
        *rows_per_warp = oscar__tune_force_quant[0], *warps_per_cta = oscar__tune_force_quant[1];
    } else if (oscar__tune_lookup(ctx, OSCAR_TUNE_FAMILY_QUANTIZE, key, &e)) {
        int32_t r = *rows_per_warp, w = *warps_per_cta;
        if (e.params_set & (1u << OSCAR__TP_QNT_ROWS_PER_WARP)) r = e.params[OSCAR__TP_QNT_ROWS_PER_WARP];
        if (e.params_set & (1u << OSCAR__TP_QNT_WARPS_PER_CTA)) w = e.params[OSCAR__TP_QNT_WARPS_PER_CTA];
        if (oscar__quant_tile_valid(ctx, key[OSCAR__TK_QNT_HEAD_DIM], r, w, with_rotation))
            *rows_per_warp = r, *warps_per_cta = w;
    }
}

/* ---- public table API ------------------------------------------------------- */
OSCAR__PRIVATE oscar_status oscar__tune_require(const oscar_ctx *ctx, const char *func) {
    if (!ctx) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "%s: ctx = NULL", func);
    if (!ctx->tune)
        return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED, "%s: the %s has no tuning tables", func,
                           ctx->backend == OSCAR_BACKEND_CPU ? "CPU backend" : "context (out of memory at setup)");
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_query_tune_info(const oscar_ctx *ctx, oscar_tune_info *out) {
    oscar_status st = oscar__tune_require(ctx, "oscar_query_tune_info");
    if (st != OSCAR_OK) return st;
    if (!out) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_query_tune_info: out = NULL");
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&OSCAR__UNCONST(oscar_ctx *, ctx)->lock);
    snprintf(out->path, sizeof out->path, "%s", ctx->tune->path);
    if (ctx->tune->user) {
        out->has_table = 1;
        out->num_entries = ctx->tune->user->num_entries;
        out->provenance = ctx->tune->user->prov;
    }
    if (ctx->tune->builtin) {
        out->num_builtin_entries = ctx->tune->builtin->num_entries;
        out->builtin_provenance = ctx->tune->builtin->prov;
    }
    pthread_mutex_unlock(&OSCAR__UNCONST(oscar_ctx *, ctx)->lock);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_tune_table_load(oscar_ctx *ctx, const char *path) {
    char *text = NULL, why[1024];
    size_t n = 0;
    oscar__tune_table *t = NULL, *old;
    oscar_tune_provenance id;
    oscar_status st = oscar__tune_require(ctx, "oscar_tune_table_load");
    int r;
    if (st != OSCAR_OK) return st;
    if (!path || !path[0]) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_tune_table_load: path is NULL or empty");
    r = oscar__tune_read_file(ctx, path, &text, &n);
    if (r != 0)
        return oscar__fail(ctx, OSCAR_STATUS_IO_ERROR, "oscar_tune_table_load: cannot read %s: %s", path,
                           r == 1 ? "no such file" : strerror(errno));
    st = oscar__tune_parse(ctx, "oscar_tune_table_load", path, text, n, &t);
    oscar__free(ctx, text);
    if (st != OSCAR_OK) return st;
    oscar__tune_identity(ctx, &id);
    if (oscar__tune_adopt(ctx, &id, t, path, why, sizeof why)) {
        oscar__tune_table_free(ctx, t);
        return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED, "oscar_tune_table_load: %s: %s; the context's table is unchanged",
                           path, why);
    }
    pthread_mutex_lock(&ctx->lock);
    old = ctx->tune->user;
    ctx->tune->user = t;
    pthread_mutex_unlock(&ctx->lock);
    oscar__tune_table_free(ctx, old);
    return OSCAR_OK;
}

OSCAR_API oscar_status oscar_tune_table_save(oscar_ctx *ctx, const char *path) {
    oscar__tune_buf b;
    oscar__tune_table *t;
    oscar_status st = oscar__tune_require(ctx, "oscar_tune_table_save");
    if (st != OSCAR_OK) return st;
    if (!path || !path[0]) path = ctx->tune->path;
    if (!path[0])
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                           "oscar_tune_table_save: path = NULL and the context has no table path (no desc.tune_table_path, "
                           "no $OSCAR_TUNE_TABLE, no disk cache)");
    pthread_mutex_lock(&ctx->lock);
    t = ctx->tune->user ? oscar__tune_table_copy(ctx, ctx->tune->user) : NULL;
    pthread_mutex_unlock(&ctx->lock);
    if (!t) {
        if (!ctx->tune->user)
            return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                               "oscar_tune_table_save: the context has no table (load one or run a tuning call first)");
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_table_save: out of host memory");
    }
    memset(&b, 0, sizeof b);
    b.ctx = ctx;
    oscar__tune_format(t, &b);
    oscar__tune_table_free(ctx, t);
    if (b.oom) {
        oscar__free(ctx, b.p);
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_table_save: out of host memory");
    }
    st = oscar__tune_write_atomic(ctx, "oscar_tune_table_save", path, b.p, b.len);
    oscar__free(ctx, b.p);
    return st;
}

OSCAR_API oscar_status oscar_tune_table_clear(oscar_ctx *ctx) {
    oscar__tune_table *old;
    oscar_status st = oscar__tune_require(ctx, "oscar_tune_table_clear");
    if (st != OSCAR_OK) return st;
    pthread_mutex_lock(&ctx->lock);
    old = ctx->tune->user;
    ctx->tune->user = NULL;
    pthread_mutex_unlock(&ctx->lock);
    oscar__tune_table_free(ctx, old);
    return OSCAR_OK;
}

/* Stores a tuning result in the context's table (made with the context's
   provenance when there is none) and adds the run's wall time. */
OSCAR__PRIVATE oscar_status oscar__tune_store(oscar_ctx *ctx, const char *func, const oscar__tune_entry *e, double seconds) {
    int r = 0;
    time_t now = time(NULL);
    struct tm tmv;
    pthread_mutex_lock(&ctx->lock);
    if (!ctx->tune->user) {
        ctx->tune->user = oscar__tune_table_new(ctx);
        if (ctx->tune->user) oscar__tune_identity(ctx, &ctx->tune->user->prov);
    }
    if (!ctx->tune->user) r = -1;
    if (r == 0 && e) r = oscar__tune_table_put(ctx, ctx->tune->user, e);
    if (r == 0) {
        ctx->tune->user->prov.tuning_seconds += seconds;
        gmtime_r(&now, &tmv);
        strftime(ctx->tune->user->prov.date, sizeof ctx->tune->user->prov.date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
    }
    pthread_mutex_unlock(&ctx->lock);
    if (r != 0) return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "%s: out of host memory", func);
    return OSCAR_OK;
}

/* ======================================================================== */
/* Tuning runs                                                               */
/* ======================================================================== */

/* Device allocations of one tuning shape, freed together. */
#define OSCAR__TUNE_MAX_ALLOCS 24
typedef struct oscar__tune_mem {
    oscar__CUdeviceptr p[OSCAR__TUNE_MAX_ALLOCS];
    int n;
} oscar__tune_mem;

OSCAR__PRIVATE oscar_status oscar__tune_dalloc(oscar_ctx *ctx, oscar__tune_mem *m, size_t bytes, void **out) {
    oscar__CUdeviceptr p = 0;
    oscar__CUresult r;
    if (m->n == OSCAR__TUNE_MAX_ALLOCS) return oscar__fail(ctx, OSCAR_STATUS_INTERNAL, "oscar_tune: too many allocations");
    r = ctx->cu.cuMemAlloc(&p, bytes ? (bytes + 255) & ~OSCAR__CAST(size_t, 255) : 256);
    if (r != 0) return oscar__cu_fail(ctx, r, "oscar_tune: cuMemAlloc");
    m->p[m->n++] = p;
    *out = OSCAR__RCAST(void *, OSCAR__CAST(uintptr_t, p));
    return OSCAR_OK;
}
OSCAR__PRIVATE void oscar__tune_mem_free(oscar_ctx *ctx, oscar__tune_mem *m) {
    int i;
    for (i = 0; i < m->n; i++) ctx->cu.cuMemFree(m->p[i]);
    m->n = 0;
}
/* Fills bytes of device memory with a host pattern repeated. */
OSCAR__PRIVATE oscar_status oscar__tune_fill(oscar_ctx *ctx, void *dst, size_t bytes, const void *pattern, size_t plen) {
    size_t off;
    for (off = 0; off < bytes; off += plen) {
        size_t n = OSCAR__MIN(plen, bytes - off);
        oscar__CUresult r = ctx->cu.cuMemcpyHtoD(OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, dst)) + off, pattern, n);
        if (r != 0) return oscar__cu_fail(ctx, r, "oscar_tune: cuMemcpyHtoD");
    }
    return OSCAR_OK;
}
OSCAR__PRIVATE oscar_status oscar__tune_download(oscar_ctx *ctx, void *host, const void *dev, size_t bytes) {
    oscar__CUresult r = ctx->cu.cuCtxSynchronize();
    if (r == 0) r = ctx->cu.cuMemcpyDtoH(host, OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, dev)), bytes);
    if (r != 0) return oscar__cu_fail(ctx, r, "oscar_tune: reading a result back");
    return OSCAR_OK;
}

/* Host patterns (16 MiB each): random bytes, bf16 normals, scale pairs. */
#define OSCAR__TUNE_PATTERN (OSCAR__CAST(size_t, 16) << 20)
typedef struct oscar__tune_rng {
    uint64_t s;
} oscar__tune_rng;
OSCAR__PRIVATE uint64_t oscar__tune_next(oscar__tune_rng *r) {
    r->s ^= r->s << 13, r->s ^= r->s >> 7, r->s ^= r->s << 17;
    return r->s;
}
OSCAR__PRIVATE double oscar__tune_normal(oscar__tune_rng *r) {
    double u = (OSCAR__CAST(double, oscar__tune_next(r) >> 11) + 1.0) * (1.0 / 9007199254740993.0);
    double v = OSCAR__CAST(double, oscar__tune_next(r) >> 11) * (1.0 / 9007199254740992.0);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
/* kind 0: random bytes; 1: bf16 normals; 2: f16 (scale, min) pairs; 3: f32
   (scale, zero) pairs; 4: f16 normals; 5: f32 normals; 6: f32 lse values */
OSCAR__PRIVATE uint8_t *oscar__tune_pattern(oscar_ctx *ctx, int kind, uint64_t seed) {
    oscar__tune_rng r;
    uint8_t *h = OSCAR__CAST(uint8_t *, oscar__alloc(ctx, OSCAR__TUNE_PATTERN));
    size_t i;
    r.s = seed * 0x9E3779B97F4A7C15ULL + 88172645463325252ULL;
    if (!h) return NULL;
    for (i = 0; i + 8 <= OSCAR__TUNE_PATTERN; i += 8) {
        if (kind == 0) {
            uint64_t x = oscar__tune_next(&r);
            memcpy(h + i, &x, 8);
        } else if (kind == 1 || kind == 4) {
            int j;
            for (j = 0; j < 4; j++) {
                float x = OSCAR__CAST(float, oscar__tune_normal(&r));
                uint16_t b = kind == 1 ? oscar__f32_to_bf16(x) : oscar__f32_to_f16(x);
                memcpy(h + i + 2 * j, &b, 2);
            }
        } else if (kind == 2) {
            int j;
            for (j = 0; j < 2; j++) {
                double range = 1.0 + 2.0 * fabs(oscar__tune_normal(&r));
                uint16_t s = oscar__f32_to_f16(OSCAR__CAST(float, range / 3)), m = oscar__f32_to_f16(OSCAR__CAST(float, -range / 2));
                memcpy(h + i + 4 * j, &s, 2), memcpy(h + i + 4 * j + 2, &m, 2);
            }
        } else if (kind == 3) {
            float s = OSCAR__CAST(float, (1.0 + 2.0 * fabs(oscar__tune_normal(&r))) / 3), z = 1.5f;
            memcpy(h + i, &s, 4), memcpy(h + i + 4, &z, 4);
        } else {
            float a = OSCAR__CAST(float, oscar__tune_normal(&r) * (kind == 6 ? 3.0 : 1.0));
            float b = OSCAR__CAST(float, oscar__tune_normal(&r) * (kind == 6 ? 3.0 : 1.0));
            memcpy(h + i, &a, 4), memcpy(h + i + 4, &b, 4);
        }
    }
    return h;
}

/* One candidate's run on input set `set` (of nsets). */
typedef oscar_status (*oscar__tune_run_fn)(oscar_ctx *ctx, void *user, int candidate, int set);

OSCAR__PRIVATE int oscar__tune_cmp(const void *a, const void *b) {
    double x = *OSCAR__CAST(const double *, a), y = *OSCAR__CAST(const double *, b);
    return x < y ? -1 : x > y;
}
/* Median and interquartile range of n samples (sorted in place). */
OSCAR__PRIVATE void oscar__tune_stats(double *t, int n, double *median, double *iqr) {
    qsort(t, OSCAR__CAST(size_t, n), sizeof(double), oscar__tune_cmp);
    *median = n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]);
    *iqr = t[(3 * n) / 4 < n ? (3 * n) / 4 : n - 1] - t[n / 4];
}

typedef struct oscar__tune_timer {
    oscar__CUevent a, b;
    int counter; /* rotates the input sets */
    /* CUDA-graph replay (v2 of the tuner): one graph per (candidate, input
       set), captured on first use; 0 where the driver lacks graphs or a
       capture failed -- then each run is launched directly */
    oscar_stream stream;
    oscar__CUgraphExec *exec; /* [ncand][nsets] */
    int nsets, direct;
} oscar__tune_timer;

/* The graph of run (c, set), captured on first use and launched once (its
   first launch does one-time work). Returns 0 with *g = 0 where graphs are
   off or this capture failed (the timer then runs everything directly). */
OSCAR__PRIVATE oscar_status oscar__tune_graph(oscar_ctx *ctx, oscar__tune_timer *tm, oscar__tune_run_fn fn, void *user,
                                             int c, int set, oscar__CUgraphExec *g) {
    oscar__CUgraphExec *e;
    oscar__CUgraph graph = 0;
    oscar__CUresult r;
    oscar_status st;
    *g = 0;
    if (tm->direct) return OSCAR_OK;
    e = &tm->exec[OSCAR__CAST(size_t, c) * OSCAR__CAST(size_t, tm->nsets) + OSCAR__CAST(size_t, set)];
    if (!*e) {
        oscar__tune_stream = tm->stream;
        r = ctx->cu.cuStreamBeginCapture(tm->stream, 1 /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */);
        st = r == 0 ? fn(ctx, user, c, set) : OSCAR_OK;
        if (r == 0) r = ctx->cu.cuStreamEndCapture(tm->stream, &graph);
        oscar__tune_stream = 0;
        if (st != OSCAR_OK && r == 0) r = -1; /* not capturable: it runs directly (and fails there if it fails) */
        if (r == 0) r = ctx->cu.cuGraphInstantiateWithFlags(e, graph, 0);
        if (graph) ctx->cu.cuGraphDestroy(graph);
        if (r == 0) r = ctx->cu.cuGraphLaunch(*e, tm->stream);
        if (r == 0) r = ctx->cu.cuStreamSynchronize(tm->stream);
        if (r != 0) {
            oscar__info(ctx, "oscar_tune: CUDA-graph capture failed (%d); timing direct runs", r);
            if (*e) ctx->cu.cuGraphExecDestroy(*e), *e = 0;
            tm->direct = 1;
            return OSCAR_OK;
        }
    }
    *g = *e;
    return OSCAR_OK;
}

/* One run of candidate c on input set `set`: its graph's replay, or the run
   itself where graphs are off. */
OSCAR__PRIVATE oscar_status oscar__tune_run_once(oscar_ctx *ctx, oscar__tune_timer *tm, oscar__tune_run_fn fn, void *user,
                                                int c, int set) {
    oscar__CUgraphExec g;
    oscar_status st = oscar__tune_graph(ctx, tm, fn, user, c, set, &g);
    oscar__CUresult r;
    if (st != OSCAR_OK) return st;
    if (!g) return fn(ctx, user, c, set);
    r = ctx->cu.cuGraphLaunch(g, tm->stream);
    return r == 0 ? OSCAR_OK : oscar__cu_fail(ctx, r, "oscar_tune: cuGraphLaunch");
}

/* Times candidates: warmup untimed runs of each, then `reps` timed runs
   (CUDA events around each run), the candidates of `cands` taking turns run
   by run so drift hits all alike. samples: [ncand][reps] microseconds. Each
   run is a CUDA-graph replay where the driver has graphs, the way engines
   run a step: timed direct launches add the host's launch work between the
   kernels, whose jitter (several us at 1 x 128K) hid real differences. */
OSCAR__PRIVATE oscar_status oscar__tune_time(oscar_ctx *ctx, oscar__tune_timer *tm, oscar__tune_run_fn fn, void *user,
                                            const int *cands, int ncand, int nsets, int warmup, int reps, double *samples) {
    int i, c;
    oscar_status st;
    oscar_stream s;
    /* every graph first, so a capture that fails falls back before any timing */
    for (c = 0; c < ncand; c++)
        for (i = 0; i < nsets; i++) {
            oscar__CUgraphExec g;
            st = oscar__tune_graph(ctx, tm, fn, user, cands[c], i, &g);
            if (st != OSCAR_OK) return st;
        }
    for (c = 0; c < ncand; c++)
        for (i = 0; i < warmup; i++) {
            st = oscar__tune_run_once(ctx, tm, fn, user, cands[c], tm->counter++ % nsets);
            if (st != OSCAR_OK) return st;
        }
    s = tm->direct ? 0 : tm->stream;
    for (i = 0; i < reps; i++)
        for (c = 0; c < ncand; c++) {
            float ms = 0;
            oscar__CUresult r = ctx->cu.cuEventRecord(tm->a, s);
            if (r != 0) return oscar__cu_fail(ctx, r, "oscar_tune: cuEventRecord");
            st = oscar__tune_run_once(ctx, tm, fn, user, cands[c], tm->counter++ % nsets);
            if (st != OSCAR_OK) return st;
            r = ctx->cu.cuEventRecord(tm->b, s);
            if (r == 0) r = ctx->cu.cuEventSynchronize(tm->b);
            if (r == 0) r = ctx->cu.cuEventElapsedTime(&ms, tm->a, tm->b);
            if (r != 0) return oscar__cu_fail(ctx, r, "oscar_tune: timing with CUDA events");
            samples[c * reps + i] = OSCAR__CAST(double, ms) * 1e3;
        }
    return OSCAR_OK;
}

/* The generic search of one shape: candidate 0 is the default. check(c)
   returns 0 (output equals the default's within the family's rule) or 1
   (wrong; why filled). Every passing candidate is timed; the fastest is
   re-timed interleaved with the default and kept only if its median beats
   the default's by more than the larger interquartile range. */
typedef int (*oscar__tune_check_fn)(oscar_ctx *ctx, void *user, int candidate, char *why, size_t cap, oscar_status *st);

typedef struct oscar__tune_outcome {
    int best;       /* candidate index kept (0 = the default) */
    int num_valid, num_rejected;
    int graph_timed; /* the timer replayed graphs (oscar__tune_timer.direct stayed 0) */
    double def_us, def_iqr, best_us, best_iqr;
    char rejected[256];
} oscar__tune_outcome;

/* The end of one tuned shape, the same in every family (the key and the
   parameters of e are the family's): the entry's times and the report's
   numbers from the outcome, then the entry stored. */
OSCAR__PRIVATE oscar_status oscar__tune_finish_shape(oscar_ctx *ctx, const char *func, oscar__tune_entry *e,
                                                     const oscar__tune_outcome *oc, const char *const *labels, double t0,
                                                     oscar_tune_report *rep) {
    e->default_us = oc->def_us, e->tuned_us = oc->best_us;
    rep->default_us = oc->def_us, rep->default_spread_us = oc->def_iqr;
    rep->tuned_us = oc->best_us, rep->tuned_spread_us = oc->best_iqr;
    rep->num_candidates = oc->num_valid, rep->num_rejected = oc->num_rejected, rep->improved = oc->best != 0;
    rep->graph_timed = oc->graph_timed;
    snprintf(rep->params, sizeof rep->params, "%s", labels[oc->best]);
    snprintf(rep->rejected, sizeof rep->rejected, "%s", oc->rejected);
    rep->seconds = (oscar__now_ms() - t0) * 1e-3;
    return oscar__tune_store(ctx, func, e, rep->seconds);
}

OSCAR__PRIVATE oscar_status oscar__tune_search(oscar_ctx *ctx, oscar__tune_run_fn run, oscar__tune_check_fn check,
                                              void *user, int ncand, const char *const *labels, int nsets, int warmup,
                                              int reps, oscar__tune_outcome *out) {
    oscar__tune_timer tm;
    double *samples = NULL, best_med = 0;
    int *ok = NULL, nok = 0, c, best = 0, pair[2];
    size_t rlen = 0;
    oscar_status st = OSCAR_OK;
    oscar__CUresult r;
    memset(out, 0, sizeof *out);
    memset(&tm, 0, sizeof tm);
    r = ctx->cu.cuEventCreate(&tm.a, 0);
    if (r == 0) r = ctx->cu.cuEventCreate(&tm.b, 0);
    if (r != 0) {
        st = oscar__cu_fail(ctx, r, "oscar_tune: cuEventCreate");
        goto done;
    }
    tm.nsets = nsets;
    tm.direct = !ctx->cu.cuStreamCreate || !ctx->cu.cuStreamDestroy || !ctx->cu.cuStreamBeginCapture ||
                !ctx->cu.cuStreamEndCapture || !ctx->cu.cuGraphInstantiateWithFlags || !ctx->cu.cuGraphLaunch ||
                !ctx->cu.cuGraphExecDestroy || !ctx->cu.cuGraphDestroy ||
                ctx->cu.cuStreamCreate(&tm.stream, 1 /* CU_STREAM_NON_BLOCKING */) != 0;
    if (!tm.direct) {
        tm.exec = OSCAR__CAST(oscar__CUgraphExec *, oscar__alloc(ctx, sizeof(oscar__CUgraphExec) * OSCAR__CAST(size_t, ncand) *
                                                                          OSCAR__CAST(size_t, nsets)));
        if (!tm.exec) {
            st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune: out of host memory");
            goto done;
        }
        memset(tm.exec, 0, sizeof(oscar__CUgraphExec) * OSCAR__CAST(size_t, ncand) * OSCAR__CAST(size_t, nsets));
    }
    ok = OSCAR__CAST(int *, oscar__alloc(ctx, sizeof(int) * OSCAR__CAST(size_t, ncand)));
    samples = OSCAR__CAST(double *, oscar__alloc(ctx, sizeof(double) * OSCAR__CAST(size_t, ncand) * OSCAR__CAST(size_t, 2 * reps)));
    if (!ok || !samples) {
        st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune: out of host memory");
        goto done;
    }
    /* correctness first: candidate 0 is the reference the others must match */
    for (c = 0; c < ncand; c++) {
        char why[160];
        int bad = check(ctx, user, c, why, sizeof why, &st);
        if (st != OSCAR_OK) goto done;
        if (bad && c == 0) {
            st = oscar__fail(ctx, OSCAR_STATUS_INTERNAL, "oscar_tune: the default candidate %s: %s", labels[0], why);
            goto done;
        }
        if (bad) {
            int n;
            out->num_rejected++;
            n = snprintf(out->rejected + rlen, sizeof out->rejected - rlen, "%s%s (%s)", rlen ? "; " : "", labels[c], why);
            if (n > 0) rlen = OSCAR__MIN(rlen + OSCAR__CAST(size_t, n), sizeof out->rejected - 1);
            oscar__info(ctx, "oscar_tune: candidate %s rejected: %s", labels[c], why);
            continue;
        }
        ok[nok++] = c;
    }
    out->num_valid = ncand;
    /* one timing pass over every passing candidate */
    st = oscar__tune_time(ctx, &tm, run, user, ok, nok, nsets, warmup, reps, samples);
    if (st != OSCAR_OK) goto done;
    for (c = 0; c < nok; c++) {
        double med, iqr;
        oscar__tune_stats(samples + c * reps, reps, &med, &iqr);
        /* every candidate's median, for OSCAR_TUNE_VERBOSE (how a heuristic's
           choice compares with its neighbours, not just with the winner) */
        oscar__info(ctx, "oscar_tune: candidate %s: %.3f us (IQR %.3f)", labels[ok[c]], med, iqr);
        if (c == 0 || med < best_med) best_med = med, best = ok[c];
    }
    /* the winner against the default, interleaved, twice the repeats */
    pair[0] = 0, pair[1] = best;
    st = oscar__tune_time(ctx, &tm, run, user, pair, best ? 2 : 1, nsets, warmup, 2 * reps, samples);
    if (st != OSCAR_OK) goto done;
    oscar__tune_stats(samples, 2 * reps, &out->def_us, &out->def_iqr);
    if (best) {
        oscar__tune_stats(samples + 2 * reps, 2 * reps, &out->best_us, &out->best_iqr);
        if (!(out->def_us - out->best_us > OSCAR__MAX(out->def_iqr, out->best_iqr))) best = 0;
    }
    if (!best) out->best_us = out->def_us, out->best_iqr = out->def_iqr;
    out->best = best;
    out->graph_timed = !tm.direct;
done:
    if (tm.exec) {
        size_t i, n = OSCAR__CAST(size_t, ncand) * OSCAR__CAST(size_t, nsets);
        for (i = 0; i < n; i++)
            if (tm.exec[i]) ctx->cu.cuGraphExecDestroy(tm.exec[i]);
        oscar__free(ctx, tm.exec);
    }
    if (tm.stream) ctx->cu.cuStreamDestroy(tm.stream);
    if (tm.a) ctx->cu.cuEventDestroy(tm.a);
    if (tm.b) ctx->cu.cuEventDestroy(tm.b);
    oscar__free(ctx, ok);
    oscar__free(ctx, samples);
    return st;
}

OSCAR__PRIVATE oscar_status oscar__tune_require_device(oscar_ctx *ctx, const char *func) {
    oscar_status st = oscar__tune_require(ctx, func);
    if (st != OSCAR_OK) return st;
    if (ctx->compile_only)
        return oscar__fail(ctx, OSCAR_STATUS_NEEDS_DEVICE, "%s: the context is compile-only (sm_%d); tuning times kernels on a device",
                           func, ctx->sm);
    return OSCAR_OK;
}

/* The timing fields every tuning desc has, defaulted alike: 3 warm-up and 15
   timed launches, inputs rotating over twice the L2 (64 MB where its size is
   unknown). */
OSCAR__PRIVATE void oscar__tune_timing_defaults(const oscar_ctx *ctx, int32_t *warmup, int32_t *repeats, int64_t *min_bytes) {
    *warmup = oscar__def(*warmup, 3);
    *repeats = oscar__def(*repeats, 15);
    *min_bytes = oscar__def(*min_bytes, 2 * OSCAR__CAST(int64_t, ctx->l2_bytes > 0 ? ctx->l2_bytes : (64 << 20)));
}

OSCAR__PRIVATE size_t oscar__tune_sets(int64_t min_bytes, size_t set_bytes) {
    size_t n = set_bytes ? (OSCAR__CAST(size_t, min_bytes) + set_bytes - 1) / set_bytes : 1;
    return OSCAR__MAX(OSCAR__CAST(size_t, 1), OSCAR__MIN(n, OSCAR__CAST(size_t, 48)));
}

/* ---- decode ------------------------------------------------------------------ */
#define OSCAR__TUNE_DEC_MAX_CAND 160
typedef struct oscar__tune_dec {
    oscar_decode_plan_info plans[OSCAR__TUNE_DEC_MAX_CAND];
    int32_t int2[OSCAR__TUNE_DEC_MAX_CAND], win[OSCAR__TUNE_DEC_MAX_CAND], req[OSCAR__TUNE_DEC_MAX_CAND],
        warps[OSCAR__TUNE_DEC_MAX_CAND];
    oscar_int2_pool_desc pool;
    oscar_window_pool_desc wpool;
    oscar_decode_run_desc rd;
    uint8_t *kc, *vc, *ks, *vs, *wk, *wv, *q;
    size_t code_bytes, scale_bytes, win_bytes, q_bytes;
    void *o;
    float *lse;
    size_t o_bytes, lse_bytes;
    uint16_t *ref_o, *cand_o;
    float *ref_lse, *cand_lse;
    int64_t rows; /* batch * q heads */
    int head_dim;
} oscar__tune_dec;

/* Candidate c's parameters as its plan resolved them (the labels, the table entry) */
OSCAR__PRIVATE void oscar__tune_dec_record(oscar__tune_dec *w, int c) {
    w->int2[c] = w->plans[c].int2_splits, w->win[c] = w->plans[c].window_splits;
    w->req[c] = w->plans[c].requests_per_cta, w->warps[c] = w->plans[c].int2_warps;
}

/* The plans of OSCAR_TUNE_DECODE_CANDIDATES ("I:W:R:V,..."), appended to
   w's candidates after the default (*nc); returns 0 when the variable is
   unset (the grid then runs), 1 when it was used. A malformed entry ends the
   list and one the plan refuses is skipped, each with a message. */
OSCAR__PRIVATE int oscar__tune_env_candidates(oscar_ctx *ctx, const oscar_decode_plan_desc *pd, int64_t L,
                                              oscar__tune_dec *w, int *nc) {
    const char *env = getenv("OSCAR_TUNE_DECODE_CANDIDATES"), *s = env;
    if (!env || !*env) return 0;
    while (*s && *nc < OSCAR__TUNE_DEC_MAX_CAND) {
        int i = 0, wn = 0, r = 0, v = 0, used = 0;
        oscar_decode_plan_desc one = *pd;
        if (sscanf(s, "%d:%d:%d:%d%n", &i, &wn, &r, &v, &used) != 4 || used <= 0) {
            oscar__info(ctx, "oscar_tune: OSCAR_TUNE_DECODE_CANDIDATES: cannot read \"%s\" (want I:W:R:V,...)", s);
            break;
        }
        s += used;
        if (*s == ',') s++;
        one.int2_splits = L > 0 ? i : 0, one.window_splits = wn, one.requests_per_cta = r;
        one.int2_warps = L > 0 ? v : 0;
        if (oscar_decode_plan(ctx, &one, &w->plans[*nc]) != OSCAR_OK) {
            oscar__info(ctx, "oscar_tune: OSCAR_TUNE_DECODE_CANDIDATES: %d:%d:%d:%d refused by the plan", i, wn, r, v);
            oscar__clear_error(ctx);
            continue;
        }
        oscar__tune_dec_record(w, (*nc)++);
    }
    return 1;
}

OSCAR__PRIVATE oscar_status oscar__tune_dec_run(oscar_ctx *ctx, void *user, int c, int set) {
    oscar__tune_dec *d = OSCAR__CAST(oscar__tune_dec *, user);
    oscar_int2_pool_desc pool = d->pool;
    oscar_window_pool_desc wpool = d->wpool;
    oscar_decode_run_desc rd = d->rd;
    size_t s = OSCAR__CAST(size_t, set);
    int k, times = oscar__tune_hooks.slow_int2_splits && d->int2[c] == oscar__tune_hooks.slow_int2_splits ? 4 : 1;
    oscar_status st = OSCAR_OK;
    pool.k_codes = d->kc + s * d->code_bytes, pool.v_codes = d->vc + s * d->code_bytes;
    pool.k_scales = d->ks + s * d->scale_bytes, pool.v_scales = d->vs + s * d->scale_bytes;
    wpool.k = d->wk + s * d->win_bytes, wpool.v = d->wv + s * d->win_bytes;
    rd.int2_pool = &pool, rd.window_pool = d->rd.window_pool ? &wpool : NULL;
    rd.q = d->q + s * d->q_bytes;
    for (k = 0; k < times && st == OSCAR_OK; k++) st = oscar_decode_run(ctx, &d->plans[c], &rd, oscar__tune_stream);
    return st;
}

OSCAR__PRIVATE int oscar__tune_dec_check(oscar_ctx *ctx, void *user, int c, char *why, size_t cap, oscar_status *st) {
    oscar__tune_dec *d = OSCAR__CAST(oscar__tune_dec *, user);
    uint16_t *o = c ? d->cand_o : d->ref_o;
    float *lse = c ? d->cand_lse : d->ref_lse;
    double worst_o = 0, worst_l = 0;
    int64_t r;
    int D = d->head_dim, i;
    oscar__CUresult cr;
    /* poisoned first (0xFF: NaN in bf16 and f32), so a candidate that skips
       part of the output cannot pass */
    cr = ctx->cu.cuMemsetD8Async(OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, d->o)), 0xFF, d->o_bytes, NULL);
    if (cr == 0)
        cr = ctx->cu.cuMemsetD8Async(OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, d->lse)), 0xFF, d->lse_bytes, NULL);
    if (cr != 0) {
        *st = oscar__cu_fail(ctx, cr, "oscar_tune: cuMemsetD8Async");
        return 0;
    }
    *st = oscar__tune_dec_run(ctx, user, c, 0);
    if (*st == OSCAR_OK && oscar__tune_hooks.corrupt_int2_splits && d->int2[c] == oscar__tune_hooks.corrupt_int2_splits) {
        /* test hook: a wrong candidate (its first head's output scaled) */
        cr = ctx->cu.cuMemsetD8Async(OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, d->o)), 0x3F,
                                     OSCAR__CAST(size_t, D) * 2, NULL);
        if (cr != 0) *st = oscar__cu_fail(ctx, cr, "oscar_tune: cuMemsetD8Async");
    }
    if (*st == OSCAR_OK) *st = oscar__tune_download(ctx, o, d->o, d->o_bytes);
    if (*st == OSCAR_OK) *st = oscar__tune_download(ctx, lse, d->lse, d->lse_bytes);
    if (*st != OSCAR_OK) return 0;
    /* decode rule: per (request, head), |o - o_ref| / |o_ref| <= 5e-3 and
       |lse - lse_ref| <= 1e-3: the decode's own accuracy contract against
       float64 (tests/test_decode.c). Other split counts sum in another order
       and round the bf16 output elsewhere: on the H200 bench shapes they were
       1.6-2.1e-3 apart (lse 2e-6), so the first rule (1e-3) rejected correct
       candidates; a wrong one is off by O(1). */
    for (r = 0; r < d->rows; r++) {
        double num = 0, den = 0, e;
        for (i = 0; i < D; i++) {
            double x = oscar__bf16_to_f32(o[r * D + i]), y = oscar__bf16_to_f32(d->ref_o[r * D + i]);
            num += (x - y) * (x - y), den += y * y;
        }
        e = sqrt(num) / (sqrt(den) > 1e-30 ? sqrt(den) : 1e-30);
        if (!(e <= worst_o)) worst_o = e != e ? INFINITY : OSCAR__MAX(worst_o, e);
        e = fabs(OSCAR__CAST(double, lse[r]) - OSCAR__CAST(double, d->ref_lse[r]));
        if (!(e <= worst_l)) worst_l = e != e ? INFINITY : OSCAR__MAX(worst_l, e);
    }
    if (c == 0) {
        if (!(worst_o == 0 && worst_l == 0)) {
            snprintf(why, cap, "the default's output is not finite");
            return 1;
        }
        return 0;
    }
    if (worst_o <= 5e-3 && worst_l <= 1e-3) return 0;
    snprintf(why, cap, "o rel. err %.2e (<= 5e-3), lse err %.2e (<= 1e-3)", worst_o, worst_l);
    return 1;
}

OSCAR_API oscar_status oscar_tune_decode(oscar_ctx *ctx, const oscar_tune_decode_desc *desc, oscar_tune_report *out_reports) {
    oscar__validator v;
    oscar_tune_decode_desc d;
    oscar_status st;
    oscar__tune_dec *w = NULL;
    uint8_t *pat[4] = {NULL, NULL, NULL, NULL};
    int pushed = 0, si;

    /* an explicit NULL test: GCC's clone of this function for a NULL ctx
       otherwise warns (array-bounds) on the error paths further down */
    if (!ctx) return oscar__fail(NULL, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_tune_decode: ctx = NULL");
    st = oscar__tune_require_device(ctx, "oscar_tune_decode");
    if (st != OSCAR_OK) return st;
    if (!desc) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_tune_decode: desc = NULL");
    d = *desc;
    d.group_size = oscar__def(d.group_size, d.head_dim);
    d.page_size = oscar__def(d.page_size, 16);
    d.scale_layout = oscar__def(d.scale_layout, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN);
    d.int2_layout = oscar__def(d.int2_layout, OSCAR_KV_LAYOUT_HND);
    d.window_page_size = oscar__def(d.window_page_size, 16);
    d.window_tokens = oscar__def(d.window_tokens, 320);
    oscar__tune_timing_defaults(ctx, &d.warmup, &d.repeats, &d.min_bytes);
    oscar__validate_begin(&v, ctx, "oscar_tune_decode");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256,
                    "desc.head_dim = %d; expected 64, 128 or 256 (*must* be set)", d.head_dim);
    OSCAR__VALIDATE(&v, d.num_kv_heads >= 1 && d.num_q_heads >= 1 && d.num_q_heads % d.num_kv_heads == 0 &&
                            d.num_q_heads / d.num_kv_heads <= 16,
                    "desc.num_q_heads = %d, num_kv_heads = %d; expected a multiple with ratio 1..16 (*must* be set)",
                    d.num_q_heads, d.num_kv_heads);
    OSCAR__VALIDATE(&v, d.num_shapes >= 1 && d.shapes != NULL, "desc.num_shapes = %d, shapes = %p; expected >= 1 shapes",
                    d.num_shapes, OSCAR__CAST(const void *, d.shapes));
    OSCAR__VALIDATE(&v, d.warmup >= 0 && d.repeats >= 3 && d.repeats <= 1000,
                    "desc.warmup = %d, repeats = %d; expected >= 0 and 3..1000", d.warmup, d.repeats);
    OSCAR__VALIDATE(&v, d.min_bytes > 0, "desc.min_bytes = %lld; expected > 0", OSCAR__CAST(long long, d.min_bytes));
    OSCAR__VALIDATE(&v, d.page_size >= 1 && d.window_page_size >= 1, "desc.page_size = %d, window_page_size = %d; expected >= 1",
                    d.page_size, d.window_page_size);
    for (si = 0; d.shapes && si < d.num_shapes; si++)
        OSCAR__VALIDATE(&v, d.shapes[si].batch_size >= 1 && d.shapes[si].batch_size <= 65535 &&
                                d.shapes[si].context_tokens >= 1 && d.shapes[si].context_tokens < (OSCAR__CAST(int64_t, 1) << 31),
                        "desc.shapes[%d] = (batch %d, %lld tokens); expected batch 1..65535 and 1 <= tokens < 2^31", si,
                        d.shapes[si].batch_size, OSCAR__CAST(long long, d.shapes[si].context_tokens));
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;

    w = OSCAR__CAST(oscar__tune_dec *, oscar__calloc(ctx, sizeof(oscar__tune_dec)));
    pat[0] = oscar__tune_pattern(ctx, 0, 1);
    pat[1] = oscar__tune_pattern(ctx, 1, 2);
    pat[2] = oscar__tune_pattern(ctx, d.scale_layout == OSCAR_SCALE_LAYOUT_F32_SCALE_ZERO ? 3 : 2, 3);
    if (!w || !pat[0] || !pat[1] || !pat[2]) {
        st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_decode: out of host memory");
        goto out;
    }
    pushed = oscar__push_if_needed(ctx);
    if (pushed < 0) {
        pushed = 0;
        st = oscar__fail(ctx, OSCAR_STATUS_CUDA_ERROR, "oscar_tune_decode: cuCtxPushCurrent failed");
        goto out;
    }
    for (si = 0; si < d.num_shapes && st == OSCAR_OK; si++) {
        const oscar_tune_shape *S = &d.shapes[si];
        const int D = d.head_dim, Hq = d.num_q_heads, Hkv = d.num_kv_heads, ps = d.page_size, wps = d.window_page_size;
        const int64_t W = d.window_tokens < 0 ? 0 : OSCAR__MIN(S->context_tokens, OSCAR__CAST(int64_t, d.window_tokens));
        const int64_t L = S->context_tokens - W, np = (L + ps - 1) / ps, wnp = (W + wps - 1) / wps;
        const int64_t ipages = S->batch_size * np, wpages = S->batch_size * wnp;
        double t0 = oscar__now_ms();
        oscar__tune_mem mem;
        oscar_decode_plan_desc pd;
        oscar__tune_outcome oc;
        oscar__tune_entry e;
        int32_t key[OSCAR__TUNE_MAX_KEYS], ci[OSCAR__TUNE_MAX_CANDIDATES], cw[OSCAR__TUNE_MAX_CANDIDATES],
            cr[OSCAR__TUNE_MAX_CANDIDATES], cv[OSCAR__TUNE_MAX_CANDIDATES];
        int nci, ncw, ncr, ncv, a, b, r, wv, nc = 0, c;
        size_t nsets, ws_max = 0, set_bytes;
        void *ws = NULL, *ip = NULL, *idx = NULL, *last = NULL, *wip = NULL, *widx = NULL, *wlast = NULL, *rot = NULL;
        char labels_buf[OSCAR__TUNE_DEC_MAX_CAND][72];
        const char *labels[OSCAR__TUNE_DEC_MAX_CAND];
        oscar_tune_report rep;

        memset(&mem, 0, sizeof mem);
        memset(&rep, 0, sizeof rep);
        memset(&pd, 0, sizeof pd);
        /* the plan's key: its max_window_tokens is W here */
        oscar__tune_decode_key(key, D, d.group_size, ps, Hq / Hkv, d.scale_layout, W, S->batch_size, L);
        oscar__tune_key_text(OSCAR_TUNE_FAMILY_DECODE, key, rep.key, sizeof rep.key);

        /* geometry and the plans: candidate 0 is the heuristic's (table lookups off) */
        memset(&w->pool, 0, sizeof w->pool);
        w->pool.head_dim = D, w->pool.num_kv_heads = Hkv, w->pool.num_pages = OSCAR__CAST(int32_t, ipages + 1);
        w->pool.page_size = ps, w->pool.group_size = d.group_size, w->pool.scale_layout = d.scale_layout;
        w->pool.layout = d.int2_layout;
        memset(&w->wpool, 0, sizeof w->wpool);
        w->wpool.num_pages = OSCAR__CAST(int32_t, wpages + 1), w->wpool.page_size = wps;
        w->wpool.layout = OSCAR_KV_LAYOUT_NHD;
        st = oscar_int2_pool_bytes(ctx, &w->pool, &w->code_bytes, &w->scale_bytes);
        if (st != OSCAR_OK) break;
        w->win_bytes = OSCAR__CAST(size_t, wpages + 1) * OSCAR__CAST(size_t, wps * Hkv * D) * 2;
        w->q_bytes = OSCAR__CAST(size_t, S->batch_size) * OSCAR__CAST(size_t, Hq * D) * 2;
        w->head_dim = D;
        w->rows = OSCAR__CAST(int64_t, S->batch_size) * Hq;
        pd.num_q_heads = Hq, pd.int2_pool = &w->pool, pd.window_pool = W > 0 ? &w->wpool : NULL;
        pd.batch_size = S->batch_size, pd.max_int2_tokens = L, pd.max_window_tokens = OSCAR__CAST(int32_t, W);
        oscar__tune_suppress = 1;
        st = oscar_decode_plan(ctx, &pd, &w->plans[0]);
        oscar__tune_suppress = 0;
        if (st != OSCAR_OK) break;
        oscar__tune_dec_record(w, 0);
        nc = 1;
        nci = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_SPLITS, ci);
        ncw = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_WINDOW_SPLITS, cw);
        ncr = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_REQUESTS_PER_CTA, cr);
        ncv = oscar__tune_candidates(OSCAR_TUNE_FAMILY_DECODE, key, OSCAR__TP_DEC_INT2_WARPS, cv);
        if (ncv == 0) cv[0] = w->warps[0], ncv = 1;
        if (nci == 0) ci[0] = 0, nci = 1; /* no tier: the plan's 0 */
        if (ncw == 0) cw[0] = 0, ncw = 1;
        if (ncr == 0) cr[0] = w->req[0], ncr = 1;
        /* requests per CTA beyond the plan's batch all mean one CTA per KV head: the smallest such value only */
        for (r = 0; r < ncr; r++)
            if (cr[r] >= S->batch_size) {
                ncr = r + 1;
                break;
            }
        /* OSCAR_TUNE_DECODE_CANDIDATES="I:W:R:V,...": exactly these plans beside the default (INT2 splits,
           window splits, requests per CTA, INT2 warps), no grid -- for A/B runs of plan heuristics, where
           both builds' choices must be timed in one process, taking turns (docs/tuning.md) */
        if (oscar__tune_env_candidates(ctx, &pd, L, w, &nc)) ncv = 0;
        /* st ends every loop: a failed plan must not be overwritten by the next candidate's */
        for (wv = 0; wv < ncv && st == OSCAR_OK; wv++)
            for (r = 0; r < ncr && st == OSCAR_OK; r++)
                for (a = 0; a < nci && st == OSCAR_OK; a++)
                    for (b = 0; b < ncw && nc < OSCAR__TUNE_DEC_MAX_CAND && st == OSCAR_OK; b++) {
                        if (ci[a] == w->int2[0] && cw[b] == w->win[0] && cr[r] == w->req[0] && cv[wv] == w->warps[0])
                            continue; /* the default */
                        if (ci[a] == 0 && cw[b] == 0) continue;
                        /* 16-warp CTAs (one per SM) only in one wave: they serve small batches */
                        if (cv[wv] != OSCAR__DECODE_WARPS &&
                            OSCAR__CAST(int64_t, S->batch_size) * Hkv * ci[a] > (ctx->num_sms > 0 ? ctx->num_sms : 132))
                            continue;
                        pd.int2_splits = ci[a], pd.window_splits = cw[b], pd.requests_per_cta = cr[r];
                        pd.int2_warps = L > 0 ? cv[wv] : 0;
                        st = oscar_decode_plan(ctx, &pd, &w->plans[nc]);
                        if (st != OSCAR_OK) break;
                        oscar__tune_dec_record(w, nc++);
                    }
        if (st != OSCAR_OK) break;
        for (c = 0; c < nc; c++) {
            snprintf(labels_buf[c], sizeof labels_buf[c], "int2_splits=%d window_splits=%d requests_per_cta=%d int2_warps=%d",
                     w->int2[c], w->win[c], w->req[c], w->warps[c]);
            labels[c] = labels_buf[c];
            ws_max = OSCAR__MAX(ws_max, w->plans[c].workspace_bytes);
        }
        snprintf(rep.default_params, sizeof rep.default_params, "%s", labels[0]);

        /* inputs: enough copies to rotate over min_bytes */
        set_bytes = 2 * w->code_bytes + 2 * w->scale_bytes + 2 * w->win_bytes + w->q_bytes;
        nsets = oscar__tune_sets(d.min_bytes, set_bytes);
        w->code_bytes = (w->code_bytes + 255) & ~OSCAR__CAST(size_t, 255);
        w->scale_bytes = (w->scale_bytes + 255) & ~OSCAR__CAST(size_t, 255);
        w->win_bytes = (w->win_bytes + 255) & ~OSCAR__CAST(size_t, 255);
        w->q_bytes = (w->q_bytes + 255) & ~OSCAR__CAST(size_t, 255);
        w->o_bytes = OSCAR__CAST(size_t, w->rows) * OSCAR__CAST(size_t, D) * 2;
        w->lse_bytes = OSCAR__CAST(size_t, w->rows) * 4;
        {
            void *p[7];
            size_t sizes[7];
            int k;
            sizes[0] = sizes[1] = w->code_bytes, sizes[2] = sizes[3] = w->scale_bytes;
            sizes[4] = sizes[5] = w->win_bytes, sizes[6] = w->q_bytes;
            for (k = 0; k < 7 && st == OSCAR_OK; k++) {
                st = oscar__tune_dalloc(ctx, &mem, sizes[k] * nsets, &p[k]);
                if (st == OSCAR_OK)
                    st = oscar__tune_fill(ctx, p[k], sizes[k] * nsets, pat[k < 2 ? 0 : k < 4 ? 2 : 1], OSCAR__TUNE_PATTERN);
            }
            if (st != OSCAR_OK) goto shape_done;
            w->kc = OSCAR__CAST(uint8_t *, p[0]), w->vc = OSCAR__CAST(uint8_t *, p[1]);
            w->ks = OSCAR__CAST(uint8_t *, p[2]), w->vs = OSCAR__CAST(uint8_t *, p[3]);
            w->wk = OSCAR__CAST(uint8_t *, p[4]), w->wv = OSCAR__CAST(uint8_t *, p[5]), w->q = OSCAR__CAST(uint8_t *, p[6]);
        }
        /* page tables: request b owns np pages (shuffled ids, as an allocator hands them out) */
        {
            int64_t n = OSCAR__MAX(ipages, wpages) + 1, i, k;
            int32_t *h = OSCAR__CAST(int32_t *, oscar__alloc(ctx, sizeof(int32_t) * OSCAR__CAST(size_t, n + S->batch_size + 1)));
            oscar__tune_rng rng;
            rng.s = 0x5EED0000u + OSCAR__CAST(uint64_t, si);
            if (!h) {
                st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_decode: out of host memory");
                goto shape_done;
            }
            for (k = 0; k < 2 && st == OSCAR_OK; k++) {
                int64_t pages = k ? wpages : ipages, per = k ? wnp : np, len = k ? W : L, pg = k ? wps : ps;
                void **dip = k ? &wip : &ip, **didx = k ? &widx : &idx, **dlast = k ? &wlast : &last;
                for (i = 0; i < pages; i++) h[i] = OSCAR__CAST(int32_t, i);
                for (i = pages - 1; i > 0; i--) {
                    int64_t j = OSCAR__CAST(int64_t, oscar__tune_next(&rng) % OSCAR__CAST(uint64_t, i + 1));
                    int32_t t = h[i];
                    h[i] = h[j], h[j] = t;
                }
                st = oscar__tune_dalloc(ctx, &mem, sizeof(int32_t) * OSCAR__CAST(size_t, pages + 1), didx);
                if (st == OSCAR_OK) st = oscar__tune_fill(ctx, *didx, sizeof(int32_t) * OSCAR__CAST(size_t, pages + 1), h, sizeof(int32_t) * OSCAR__CAST(size_t, pages + 1));
                for (i = 0; i <= S->batch_size; i++) h[i] = OSCAR__CAST(int32_t, i * per);
                if (st == OSCAR_OK) st = oscar__tune_dalloc(ctx, &mem, sizeof(int32_t) * OSCAR__CAST(size_t, S->batch_size + 1), dip);
                if (st == OSCAR_OK) st = oscar__tune_fill(ctx, *dip, sizeof(int32_t) * OSCAR__CAST(size_t, S->batch_size + 1), h, sizeof(int32_t) * OSCAR__CAST(size_t, S->batch_size + 1));
                for (i = 0; i < S->batch_size; i++) h[i] = per ? OSCAR__CAST(int32_t, len - (per - 1) * pg) : 1;
                if (st == OSCAR_OK) st = oscar__tune_dalloc(ctx, &mem, sizeof(int32_t) * OSCAR__CAST(size_t, S->batch_size), dlast);
                if (st == OSCAR_OK) st = oscar__tune_fill(ctx, *dlast, sizeof(int32_t) * OSCAR__CAST(size_t, S->batch_size), h, sizeof(int32_t) * OSCAR__CAST(size_t, S->batch_size));
            }
            oscar__free(ctx, h);
            if (st != OSCAR_OK) goto shape_done;
        }
        /* R_k = R_v = a normalised Hadamard matrix, as the benchmark */
        {
            float *R = OSCAR__CAST(float *, oscar__alloc(ctx, sizeof(float) * OSCAR__CAST(size_t, D * D)));
            int x, y;
            if (!R) {
                st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_decode: out of host memory");
                goto shape_done;
            }
            for (x = 0; x < D; x++)
                for (y = 0; y < D; y++) {
                    unsigned m = OSCAR__CAST(unsigned, x & y), par = 0;
                    while (m) par ^= m & 1u, m >>= 1;
                    R[x * D + y] = (par ? -1.0f : 1.0f) / sqrtf(OSCAR__CAST(float, D));
                }
            st = oscar__tune_dalloc(ctx, &mem, sizeof(float) * OSCAR__CAST(size_t, D * D), &rot);
            if (st == OSCAR_OK) st = oscar__tune_fill(ctx, rot, sizeof(float) * OSCAR__CAST(size_t, D * D), R, sizeof(float) * OSCAR__CAST(size_t, D * D));
            oscar__free(ctx, R);
            if (st != OSCAR_OK) goto shape_done;
        }
        st = oscar__tune_dalloc(ctx, &mem, ws_max, &ws);
        if (st == OSCAR_OK) st = oscar__tune_dalloc(ctx, &mem, w->o_bytes, &w->o);
        if (st == OSCAR_OK) st = oscar__tune_dalloc(ctx, &mem, w->lse_bytes, OSCAR__RCAST(void **, &w->lse));
        if (st != OSCAR_OK) goto shape_done;
        w->ref_o = OSCAR__CAST(uint16_t *, oscar__alloc(ctx, w->o_bytes));
        w->cand_o = OSCAR__CAST(uint16_t *, oscar__alloc(ctx, w->o_bytes));
        w->ref_lse = OSCAR__CAST(float *, oscar__alloc(ctx, w->lse_bytes));
        w->cand_lse = OSCAR__CAST(float *, oscar__alloc(ctx, w->lse_bytes));
        if (!w->ref_o || !w->cand_o || !w->ref_lse || !w->cand_lse) {
            st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_decode: out of host memory");
            goto shape_done;
        }
        memset(&w->rd, 0, sizeof w->rd);
        w->rd.int2_pool = &w->pool, w->rd.window_pool = W > 0 ? &w->wpool : NULL;
        w->rd.int2_pages.indptr = OSCAR__CAST(const int32_t *, ip), w->rd.int2_pages.indices = OSCAR__CAST(const int32_t *, idx);
        w->rd.int2_pages.last_page_len = OSCAR__CAST(const int32_t *, last);
        w->rd.window_pages.indptr = OSCAR__CAST(const int32_t *, wip), w->rd.window_pages.indices = OSCAR__CAST(const int32_t *, widx);
        w->rd.window_pages.last_page_len = OSCAR__CAST(const int32_t *, wlast);
        w->rd.o = w->o, w->rd.lse = w->lse;
        w->rd.k_rotation = OSCAR__CAST(const float *, rot), w->rd.v_rotation = OSCAR__CAST(const float *, rot);
        w->rd.sm_scale = 1.0f / sqrtf(OSCAR__CAST(float, D));
        w->rd.workspace = ws, w->rd.workspace_bytes = ws_max;

        st = oscar__tune_search(ctx, oscar__tune_dec_run, oscar__tune_dec_check, w, nc, labels, OSCAR__CAST(int, nsets),
                                d.warmup, d.repeats, &oc);
        if (st != OSCAR_OK) goto shape_done;
        memset(&e, 0, sizeof e);
        e.family = OSCAR_TUNE_FAMILY_DECODE;
        memcpy(e.key, key, sizeof key);
        oscar__tune_family_digest(OSCAR_TUNE_FAMILY_DECODE, e.src);
        if (oc.best) {
            /* only the tiers that exist are tunable */
            if (L > 0) {
                e.params[OSCAR__TP_DEC_INT2_SPLITS] = w->int2[oc.best], e.params_set |= 1u << OSCAR__TP_DEC_INT2_SPLITS;
                e.params[OSCAR__TP_DEC_INT2_WARPS] = w->warps[oc.best], e.params_set |= 1u << OSCAR__TP_DEC_INT2_WARPS;
            }
            if (W > 0) e.params[OSCAR__TP_DEC_WINDOW_SPLITS] = w->win[oc.best], e.params_set |= 1u << OSCAR__TP_DEC_WINDOW_SPLITS;
            e.params[OSCAR__TP_DEC_REQUESTS_PER_CTA] = w->req[oc.best];
            e.params_set |= 1u << OSCAR__TP_DEC_REQUESTS_PER_CTA;
        }
        st = oscar__tune_finish_shape(ctx, "oscar_tune_decode", &e, &oc, labels, t0, &rep);
        oscar__info(ctx, "oscar_tune_decode: %s: default %s %.1f us, kept %s %.1f us (%d candidates, %d rejected)", rep.key,
                    rep.default_params, rep.default_us, rep.params, rep.tuned_us, rep.num_candidates, rep.num_rejected);
    shape_done:
        oscar__free(ctx, w->ref_o), oscar__free(ctx, w->cand_o), oscar__free(ctx, w->ref_lse), oscar__free(ctx, w->cand_lse);
        w->ref_o = w->cand_o = NULL, w->ref_lse = w->cand_lse = NULL;
        oscar__tune_mem_free(ctx, &mem);
        if (out_reports) out_reports[si] = rep;
    }
out:
    if (pushed) oscar__pop(ctx);
    oscar__free(ctx, pat[0]), oscar__free(ctx, pat[1]), oscar__free(ctx, pat[2]), oscar__free(ctx, pat[3]);
    oscar__free(ctx, w);
    return st;
}

/* ---- merge_states --------------------------------------------------------- */
typedef struct oscar__tune_mrg {
    int32_t rows_per_cta[OSCAR__TUNE_MAX_CANDIDATES];
    oscar_merge_desc md;
    uint8_t *o, *lse; /* [set][state] blocks */
    size_t o_bytes, lse_bytes; /* per state */
    int states;
    void *out_o;
    float *out_lse;
    uint8_t *ref_o, *cand_o, *ref_lse, *cand_lse;
    size_t out_o_bytes;
    int64_t rows;
} oscar__tune_mrg;

OSCAR__PRIVATE oscar_status oscar__tune_mrg_run(oscar_ctx *ctx, void *user, int c, int set) {
    oscar__tune_mrg *m = OSCAR__CAST(oscar__tune_mrg *, user);
    oscar_merge_desc md = m->md;
    oscar_status st;
    int i;
    for (i = 0; i < m->states; i++) {
        size_t k = OSCAR__CAST(size_t, set * m->states + i);
        md.o[i] = m->o + k * m->o_bytes;
        md.lse[i] = OSCAR__RCAST(const float *, m->lse + k * m->lse_bytes);
    }
    oscar__tune_force_merge_rows = m->rows_per_cta[c];
    st = oscar_merge_states(ctx, &md, oscar__tune_stream);
    oscar__tune_force_merge_rows = 0;
    return st;
}

OSCAR__PRIVATE int oscar__tune_mrg_check(oscar_ctx *ctx, void *user, int c, char *why, size_t cap, oscar_status *st) {
    oscar__tune_mrg *m = OSCAR__CAST(oscar__tune_mrg *, user);
    oscar__CUresult cr = ctx->cu.cuMemsetD8Async(OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, m->out_o)), 0xFF,
                                                 m->out_o_bytes, NULL);
    size_t lb = OSCAR__CAST(size_t, m->rows) * 4;
    if (cr == 0)
        cr = ctx->cu.cuMemsetD8Async(OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, m->out_lse)), 0xFF, lb, NULL);
    if (cr != 0) {
        *st = oscar__cu_fail(ctx, cr, "oscar_tune: cuMemsetD8Async");
        return 0;
    }
    *st = oscar__tune_mrg_run(ctx, user, c, 0);
    if (*st == OSCAR_OK) *st = oscar__tune_download(ctx, c ? m->cand_o : m->ref_o, m->out_o, m->out_o_bytes);
    if (*st == OSCAR_OK) *st = oscar__tune_download(ctx, c ? m->cand_lse : m->ref_lse, m->out_lse, lb);
    if (*st != OSCAR_OK || c == 0) return 0;
    /* merge rule: the tile does not change any row's arithmetic: bit-identical */
    if (memcmp(m->cand_o, m->ref_o, m->out_o_bytes) != 0 || memcmp(m->cand_lse, m->ref_lse, lb) != 0) {
        snprintf(why, cap, "output differs from the default's bits");
        return 1;
    }
    return 0;
}

OSCAR_API oscar_status oscar_tune_merge(oscar_ctx *ctx, const oscar_tune_merge_desc *desc, oscar_tune_report *out_reports) {
    oscar__validator v;
    oscar_tune_merge_desc d;
    oscar_status st;
    oscar__tune_mrg m;
    uint8_t *pat_o = NULL, *pat_l = NULL;
    int pushed, si;
    size_t esize;
    st = oscar__tune_require_device(ctx, "oscar_tune_merge");
    if (st != OSCAR_OK) return st;
    if (!desc) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_tune_merge: desc = NULL");
    d = *desc;
    d.num_states = oscar__def(d.num_states, 2);
    d.dtype = oscar__def(d.dtype, OSCAR_DTYPE_BF16);
    oscar__tune_timing_defaults(ctx, &d.warmup, &d.repeats, &d.min_bytes);
    oscar__validate_begin(&v, ctx, "oscar_tune_merge");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256,
                    "desc.head_dim = %d; expected 64, 128 or 256 (*must* be set)", d.head_dim);
    OSCAR__VALIDATE(&v, d.num_states >= 1 && d.num_states <= 8, "desc.num_states = %d; expected 1..8", d.num_states);
    OSCAR__VALIDATE(&v, d.dtype == OSCAR_DTYPE_BF16 || d.dtype == OSCAR_DTYPE_F16 || d.dtype == OSCAR_DTYPE_F32,
                    "desc.dtype = %s; expected bf16, f16 or f32", oscar__dtype_name(d.dtype));
    OSCAR__VALIDATE(&v, d.num_shapes >= 1 && d.shapes != NULL, "desc.num_shapes = %d; expected >= 1 shapes", d.num_shapes);
    OSCAR__VALIDATE(&v, d.warmup >= 0 && d.repeats >= 3 && d.repeats <= 1000,
                    "desc.warmup = %d, repeats = %d; expected >= 0 and 3..1000", d.warmup, d.repeats);
    for (si = 0; d.shapes && si < d.num_shapes; si++)
        OSCAR__VALIDATE(&v, d.shapes[si].context_tokens >= 1 && d.shapes[si].context_tokens <= (OSCAR__CAST(int64_t, 1) << 26),
                        "desc.shapes[%d].context_tokens (rows) = %lld; expected 1..2^26", si,
                        OSCAR__CAST(long long, d.shapes[si].context_tokens));
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;
    esize = d.dtype == OSCAR_DTYPE_F32 ? 4 : 2;
    pat_o = oscar__tune_pattern(ctx, d.dtype == OSCAR_DTYPE_F32 ? 5 : d.dtype == OSCAR_DTYPE_F16 ? 4 : 1, 11);
    pat_l = oscar__tune_pattern(ctx, 6, 12);
    if (!pat_o || !pat_l) {
        oscar__free(ctx, pat_o), oscar__free(ctx, pat_l);
        return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_merge: out of host memory");
    }
    pushed = oscar__push_if_needed(ctx);
    if (pushed < 0) {
        oscar__free(ctx, pat_o), oscar__free(ctx, pat_l);
        return oscar__fail(ctx, OSCAR_STATUS_CUDA_ERROR, "oscar_tune_merge: cuCtxPushCurrent failed");
    }
    for (si = 0; si < d.num_shapes && st == OSCAR_OK; si++) {
        int64_t rows = d.shapes[si].context_tokens;
        double t0 = oscar__now_ms();
        oscar__tune_mem mem;
        oscar__tune_outcome oc;
        oscar__tune_entry e;
        oscar_tune_report rep;
        int32_t key[OSCAR__TUNE_MAX_KEYS], cand[OSCAR__TUNE_MAX_CANDIDATES];
        int ncand, nc = 1, c;
        size_t nsets;
        char labels_buf[OSCAR__TUNE_MAX_CANDIDATES][32];
        const char *labels[OSCAR__TUNE_MAX_CANDIDATES];
        void *po = NULL, *pl = NULL;
        memset(&mem, 0, sizeof mem);
        memset(&rep, 0, sizeof rep);
        memset(&m, 0, sizeof m);
        oscar__tune_merge_key(key, d.head_dim, d.num_states, d.dtype, rows);
        oscar__tune_key_text(OSCAR_TUNE_FAMILY_MERGE_STATES, key, rep.key, sizeof rep.key);
        m.rows_per_cta[0] = OSCAR__MERGE_DEFAULT_ROWS;
        ncand = oscar__tune_candidates(OSCAR_TUNE_FAMILY_MERGE_STATES, key, OSCAR__TP_MRG_ROWS_PER_CTA, cand);
        for (c = 0; c < ncand; c++)
            if (cand[c] != OSCAR__MERGE_DEFAULT_ROWS) m.rows_per_cta[nc++] = cand[c];
        for (c = 0; c < nc; c++) {
            snprintf(labels_buf[c], sizeof labels_buf[c], "rows_per_cta=%d", m.rows_per_cta[c]);
            labels[c] = labels_buf[c];
        }
        snprintf(rep.default_params, sizeof rep.default_params, "%s", labels[0]);
        m.states = d.num_states;
        m.rows = rows;
        m.o_bytes = (OSCAR__CAST(size_t, rows) * OSCAR__CAST(size_t, d.head_dim) * esize + 255) & ~OSCAR__CAST(size_t, 255);
        m.lse_bytes = (OSCAR__CAST(size_t, rows) * 4 + 255) & ~OSCAR__CAST(size_t, 255);
        m.out_o_bytes = OSCAR__CAST(size_t, rows) * OSCAR__CAST(size_t, d.head_dim) * esize;
        nsets = oscar__tune_sets(d.min_bytes, OSCAR__CAST(size_t, d.num_states) * (m.o_bytes + m.lse_bytes) + m.o_bytes);
        st = oscar__tune_dalloc(ctx, &mem, nsets * OSCAR__CAST(size_t, d.num_states) * m.o_bytes, &po);
        if (st == OSCAR_OK) st = oscar__tune_fill(ctx, po, nsets * OSCAR__CAST(size_t, d.num_states) * m.o_bytes, pat_o, OSCAR__TUNE_PATTERN);
        if (st == OSCAR_OK) st = oscar__tune_dalloc(ctx, &mem, nsets * OSCAR__CAST(size_t, d.num_states) * m.lse_bytes, &pl);
        if (st == OSCAR_OK) st = oscar__tune_fill(ctx, pl, nsets * OSCAR__CAST(size_t, d.num_states) * m.lse_bytes, pat_l, OSCAR__TUNE_PATTERN);
        if (st == OSCAR_OK) st = oscar__tune_dalloc(ctx, &mem, m.out_o_bytes, &m.out_o);
        if (st == OSCAR_OK) st = oscar__tune_dalloc(ctx, &mem, OSCAR__CAST(size_t, rows) * 4, OSCAR__RCAST(void **, &m.out_lse));
        m.o = OSCAR__CAST(uint8_t *, po), m.lse = OSCAR__CAST(uint8_t *, pl);
        m.ref_o = OSCAR__CAST(uint8_t *, oscar__alloc(ctx, m.out_o_bytes));
        m.cand_o = OSCAR__CAST(uint8_t *, oscar__alloc(ctx, m.out_o_bytes));
        m.ref_lse = OSCAR__CAST(uint8_t *, oscar__alloc(ctx, OSCAR__CAST(size_t, rows) * 4));
        m.cand_lse = OSCAR__CAST(uint8_t *, oscar__alloc(ctx, OSCAR__CAST(size_t, rows) * 4));
        if (st == OSCAR_OK && (!m.ref_o || !m.cand_o || !m.ref_lse || !m.cand_lse))
            st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_merge: out of host memory");
        if (st == OSCAR_OK) {
            m.md.num_states = d.num_states, m.md.num_rows = rows, m.md.head_dim = d.head_dim, m.md.dtype = d.dtype;
            m.md.out_o = m.out_o, m.md.out_lse = m.out_lse;
            st = oscar__tune_search(ctx, oscar__tune_mrg_run, oscar__tune_mrg_check, &m, nc, labels, OSCAR__CAST(int, nsets),
                                    d.warmup, d.repeats, &oc);
        }
        if (st == OSCAR_OK) {
            memset(&e, 0, sizeof e);
            e.family = OSCAR_TUNE_FAMILY_MERGE_STATES;
            memcpy(e.key, key, sizeof key);
            oscar__tune_family_digest(OSCAR_TUNE_FAMILY_MERGE_STATES, e.src);
            if (oc.best) e.params[OSCAR__TP_MRG_ROWS_PER_CTA] = m.rows_per_cta[oc.best], e.params_set = 1u;
            st = oscar__tune_finish_shape(ctx, "oscar_tune_merge", &e, &oc, labels, t0, &rep);
        }
        oscar__free(ctx, m.ref_o), oscar__free(ctx, m.cand_o), oscar__free(ctx, m.ref_lse), oscar__free(ctx, m.cand_lse);
        oscar__tune_mem_free(ctx, &mem);
        if (out_reports) out_reports[si] = rep;
    }
    if (pushed) oscar__pop(ctx);
    oscar__free(ctx, pat_o), oscar__free(ctx, pat_l);
    return st;
}


/* ---- quantize ------------------------------------------------------------------ */
typedef struct oscar__tune_qnt {
    int32_t rows_per_warp[OSCAR__TUNE_MAX_CANDIDATES], warps_per_cta[OSCAR__TUNE_MAX_CANDIDATES];
    oscar_quantize_desc qd;
    oscar_int2_pool_desc pool;
    oscar_quantize_layer_desc *layers; /* [set][layer] */
    int32_t num_layers;
    uint8_t *codes, *scales;           /* [set][layer][K|V] arrays */
    size_t code_bytes, scale_bytes;    /* of one array, rounded to 256 */
    uint8_t *ref, *cand;               /* host copies of set 0's codes then scales */
} oscar__tune_qnt;

OSCAR__PRIVATE oscar_status oscar__tune_qnt_run(oscar_ctx *ctx, void *user, int c, int set) {
    oscar__tune_qnt *q = OSCAR__CAST(oscar__tune_qnt *, user);
    oscar_quantize_desc qd = q->qd;
    oscar_status st;
    qd.layers = q->layers + OSCAR__CAST(size_t, set) * OSCAR__CAST(size_t, q->num_layers);
    oscar__tune_force_quant[0] = q->rows_per_warp[c], oscar__tune_force_quant[1] = q->warps_per_cta[c];
    st = oscar_quantize_kv(ctx, &qd, oscar__tune_stream);
    oscar__tune_force_quant[0] = oscar__tune_force_quant[1] = 0;
    return st;
}

OSCAR__PRIVATE int oscar__tune_qnt_check(oscar_ctx *ctx, void *user, int c, char *why, size_t cap, oscar_status *st) {
    oscar__tune_qnt *q = OSCAR__CAST(oscar__tune_qnt *, user);
    size_t nc = 2 * OSCAR__CAST(size_t, q->num_layers) * q->code_bytes, ns = 2 * OSCAR__CAST(size_t, q->num_layers) * q->scale_bytes;
    uint8_t *h = c ? q->cand : q->ref;
    size_t i;
    /* poisoned first (0xFF), so a candidate that skips a row cannot pass */
    oscar__CUresult cr = ctx->cu.cuMemsetD8Async(OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, q->codes)), 0xFF, nc, NULL);
    if (cr == 0) cr = ctx->cu.cuMemsetD8Async(OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, q->scales)), 0xFF, ns, NULL);
    if (cr != 0) {
        *st = oscar__cu_fail(ctx, cr, "oscar_tune: cuMemsetD8Async");
        return 0;
    }
    *st = oscar__tune_qnt_run(ctx, user, c, 0);
    if (*st == OSCAR_OK && c && oscar__tune_hooks.corrupt_quant_warps == q->warps_per_cta[c]) {
        /* test hook: a wrong candidate (16 code bytes of its first row overwritten) */
        cr = ctx->cu.cuMemsetD8Async(OSCAR__CAST(oscar__CUdeviceptr, OSCAR__RCAST(uintptr_t, q->codes)), 0x5A, 16, NULL);
        if (cr != 0) *st = oscar__cu_fail(ctx, cr, "oscar_tune: cuMemsetD8Async");
    }
    if (*st == OSCAR_OK) *st = oscar__tune_download(ctx, h, q->codes, nc);
    if (*st == OSCAR_OK) *st = oscar__tune_download(ctx, h + nc, q->scales, ns);
    if (*st != OSCAR_OK || c == 0) return 0;
    /* quantize rule: the tile changes which lanes and warps handle a row,
       never a row's arithmetic: codes and scales bit-identical */
    if (memcmp(q->cand, q->ref, nc) != 0) {
        for (i = 0; i < nc && q->cand[i] == q->ref[i]; i++) {}
        snprintf(why, cap, "codes differ from the default's at byte %zu: 0x%02x, not 0x%02x", i, q->cand[i], q->ref[i]);
        return 1;
    }
    if (memcmp(q->cand + nc, q->ref + nc, ns) != 0) {
        for (i = 0; i < ns && q->cand[nc + i] == q->ref[nc + i]; i++) {}
        snprintf(why, cap, "scales differ from the default's at byte %zu", i);
        return 1;
    }
    return 0;
}

OSCAR_API oscar_status oscar_tune_quantize(oscar_ctx *ctx, const oscar_tune_quantize_desc *desc, oscar_tune_report *out_reports) {
    oscar__validator v;
    oscar_tune_quantize_desc d;
    oscar_status st;
    oscar__tune_qnt q;
    uint8_t *pat = NULL;
    int pushed, si, rotated, clipped;
    size_t esize = 2;
    st = oscar__tune_require_device(ctx, "oscar_tune_quantize");
    if (st != OSCAR_OK) return st;
    if (!desc) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_tune_quantize: desc = NULL");
    d = *desc;
    d.group_size = oscar__def(d.group_size, d.head_dim);
    d.src_dtype = oscar__def(d.src_dtype, OSCAR_DTYPE_BF16);
    d.scale_layout = oscar__def(d.scale_layout, OSCAR_SCALE_LAYOUT_F16_SCALE_MIN);
    d.mode = oscar__def(d.mode, OSCAR_QUANT_MODE_UNIFORM);
    d.page_size = oscar__def(d.page_size, 16);
    oscar__tune_timing_defaults(ctx, &d.warmup, &d.repeats, &d.min_bytes);
    oscar__validate_begin(&v, ctx, "oscar_tune_quantize");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    OSCAR__VALIDATE(&v, d.head_dim == 64 || d.head_dim == 128 || d.head_dim == 256,
                    "desc.head_dim = %d; expected 64, 128 or 256 (*must* be set)", d.head_dim);
    OSCAR__VALIDATE(&v, d.num_kv_heads >= 1 && d.num_kv_heads <= 1024, "desc.num_kv_heads = %d; expected 1..1024 (*must* be set)",
                    d.num_kv_heads);
    OSCAR__VALIDATE(&v, (d.group_size == 32 || d.group_size == 64 || d.group_size == 128 || d.group_size == 256) &&
                            d.group_size <= d.head_dim,
                    "desc.group_size = %d; expected 32, 64, 128 or 256, at most head_dim", d.group_size);
    OSCAR__VALIDATE(&v, d.src_dtype == OSCAR_DTYPE_BF16 || d.src_dtype == OSCAR_DTYPE_F16,
                    "desc.src_dtype = %s; expected bf16 or f16", oscar__dtype_name(d.src_dtype));
    OSCAR__VALIDATE(&v, d.scale_layout > 0 && d.scale_layout < OSCAR__SCALE_LAYOUT_COUNT,
                    "desc.scale_layout = %d; expected an oscar_scale_layout", OSCAR__CAST(int, d.scale_layout));
    OSCAR__VALIDATE(&v, d.mode > 0 && d.mode < OSCAR__QUANT_MODE_COUNT, "desc.mode = %d; expected an oscar_quant_mode",
                    OSCAR__CAST(int, d.mode));
    OSCAR__VALIDATE(&v, d.rotation <= 1, "desc.rotation = %d; expected 0 (K and V), 1 (K only) or < 0 (none)", d.rotation);
    OSCAR__VALIDATE(&v, d.k_clip_ratio >= 0.0f && d.k_clip_ratio <= 1.0f && d.v_clip_ratio >= 0.0f && d.v_clip_ratio <= 1.0f,
                    "desc.k_clip_ratio = %g, v_clip_ratio = %g; expected 0 <= ratio <= 1", OSCAR__CAST(double, d.k_clip_ratio),
                    OSCAR__CAST(double, d.v_clip_ratio));
    OSCAR__VALIDATE(&v, d.src_page_size >= 0 && d.page_size >= 1, "desc.src_page_size = %d, page_size = %d; expected >= 0, >= 1",
                    d.src_page_size, d.page_size);
    OSCAR__VALIDATE(&v, d.num_shapes >= 1 && d.shapes != NULL, "desc.num_shapes = %d; expected >= 1 shapes", d.num_shapes);
    OSCAR__VALIDATE(&v, d.warmup >= 0 && d.repeats >= 3 && d.repeats <= 1000,
                    "desc.warmup = %d, repeats = %d; expected >= 0 and 3..1000", d.warmup, d.repeats);
    OSCAR__VALIDATE(&v, d.min_bytes > 0, "desc.min_bytes = %lld; expected > 0", OSCAR__CAST(long long, d.min_bytes));
    for (si = 0; d.shapes && si < d.num_shapes; si++)
        OSCAR__VALIDATE(&v, d.shapes[si].batch_size >= 0 && d.shapes[si].batch_size <= OSCAR_K_MAX_QUANT_LAYERS &&
                                d.shapes[si].context_tokens >= 1 && d.shapes[si].context_tokens <= (OSCAR__CAST(int64_t, 1) << 24),
                        "desc.shapes[%d] = (%d layers, %lld tokens); expected 0..%d layers (one launch) and 1..2^24 tokens", si,
                        d.shapes[si].batch_size, OSCAR__CAST(long long, d.shapes[si].context_tokens), OSCAR_K_MAX_QUANT_LAYERS);
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;
    rotated = d.rotation < 0 ? 0 : d.rotation == 1 ? 1 : 2;
    clipped = (d.k_clip_ratio > 0.0f) + (d.v_clip_ratio > 0.0f);
    pat = oscar__tune_pattern(ctx, d.src_dtype == OSCAR_DTYPE_F16 ? 4 : 1, 21);
    if (!pat) return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_quantize: out of host memory");
    pushed = oscar__push_if_needed(ctx);
    if (pushed < 0) {
        oscar__free(ctx, pat);
        return oscar__fail(ctx, OSCAR_STATUS_CUDA_ERROR, "oscar_tune_quantize: cuCtxPushCurrent failed");
    }
    for (si = 0; si < d.num_shapes && st == OSCAR_OK; si++) {
        const int D = d.head_dim, H = d.num_kv_heads, L = d.shapes[si].batch_size ? d.shapes[si].batch_size : 1;
        const int64_t T = d.shapes[si].context_tokens, groups = (T + 7) / 8;
        const int gathered = d.src_page_size > 0;
        /* source: dense [T][H][D], or a paged cache of the groups' slots */
        const int64_t src_slots_n = gathered ? (groups * 8 + d.src_page_size - 1) / d.src_page_size * d.src_page_size : T;
        const size_t src_bytes = (OSCAR__CAST(size_t, src_slots_n) * OSCAR__CAST(size_t, H * D) * esize + 255) & ~OSCAR__CAST(size_t, 255);
        double t0 = oscar__now_ms();
        oscar__tune_mem mem;
        oscar__tune_outcome oc;
        oscar__tune_entry e;
        oscar_tune_report rep;
        int32_t key[OSCAR__TUNE_MAX_KEYS], tr[OSCAR__TUNE_MAX_CANDIDATES], tw[OSCAR__TUNE_MAX_CANDIDATES];
        int nt, nc = 1, c;
        size_t nsets = 1, set_bytes, k, host_bytes;
        char labels_buf[OSCAR__TUNE_MAX_CANDIDATES][48];
        const char *labels[OSCAR__TUNE_MAX_CANDIDATES];
        void *src = NULL, *codes = NULL, *scales = NULL, *rot = NULL, *sslots = NULL, *dslots = NULL;
        memset(&mem, 0, sizeof mem);
        memset(&rep, 0, sizeof rep);
        memset(&q, 0, sizeof q);
        oscar__tune_quant_key(key, D, d.group_size, d.src_dtype, d.scale_layout, d.mode, rotated, clipped,
                              T * H * 2 * L);
        oscar__tune_key_text(OSCAR_TUNE_FAMILY_QUANTIZE, key, rep.key, sizeof rep.key);

        /* the pool: each layer's own arrays, as many slots as the writes need */
        q.pool.head_dim = D, q.pool.num_kv_heads = H, q.pool.page_size = d.page_size, q.pool.group_size = d.group_size;
        q.pool.scale_layout = d.scale_layout;
        q.pool.num_pages = OSCAR__CAST(int32_t, ((gathered ? groups * 8 : T) + d.page_size - 1) / d.page_size);
        st = oscar_int2_pool_bytes(ctx, &q.pool, &q.code_bytes, &q.scale_bytes);
        if (st != OSCAR_OK) goto shape_done;
        q.code_bytes = (q.code_bytes + 255) & ~OSCAR__CAST(size_t, 255);
        q.scale_bytes = (q.scale_bytes + 255) & ~OSCAR__CAST(size_t, 255);
        q.num_layers = L;
        set_bytes = 2 * OSCAR__CAST(size_t, L) * (src_bytes + q.code_bytes + q.scale_bytes);
        nsets = oscar__tune_sets(d.min_bytes, set_bytes);
        st = oscar__tune_dalloc(ctx, &mem, nsets * 2 * OSCAR__CAST(size_t, L) * src_bytes, &src);
        if (st == OSCAR_OK) st = oscar__tune_fill(ctx, src, nsets * 2 * OSCAR__CAST(size_t, L) * src_bytes, pat, OSCAR__TUNE_PATTERN);
        if (st == OSCAR_OK) st = oscar__tune_dalloc(ctx, &mem, nsets * 2 * OSCAR__CAST(size_t, L) * q.code_bytes, &codes);
        if (st == OSCAR_OK) st = oscar__tune_dalloc(ctx, &mem, nsets * 2 * OSCAR__CAST(size_t, L) * q.scale_bytes, &scales);
        if (st != OSCAR_OK) goto shape_done;
        q.codes = OSCAR__CAST(uint8_t *, codes), q.scales = OSCAR__CAST(uint8_t *, scales);
        /* R: a normalised Hadamard matrix per layer, as the benchmark */
        if (rotated) {
            float *R = OSCAR__CAST(float *, oscar__alloc(ctx, sizeof(float) * OSCAR__CAST(size_t, D * D)));
            int x, y, l;
            if (!R) {
                st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_quantize: out of host memory");
                goto shape_done;
            }
            for (x = 0; x < D; x++)
                for (y = 0; y < D; y++) {
                    unsigned m = OSCAR__CAST(unsigned, x & y), par = 0;
                    while (m) par ^= m & 1u, m >>= 1;
                    R[x * D + y] = (par ? -1.0f : 1.0f) / sqrtf(OSCAR__CAST(float, D));
                }
            st = oscar__tune_dalloc(ctx, &mem, sizeof(float) * OSCAR__CAST(size_t, D * D * L), &rot);
            for (l = 0; st == OSCAR_OK && l < L; l++)
                st = oscar__tune_fill(ctx, OSCAR__CAST(float *, rot) + OSCAR__CAST(size_t, l) * OSCAR__CAST(size_t, D * D),
                                      sizeof(float) * OSCAR__CAST(size_t, D * D), R, sizeof(float) * OSCAR__CAST(size_t, D * D));
            oscar__free(ctx, R);
            if (st != OSCAR_OK) goto shape_done;
        }
        /* slot ids: dense 0..T-1; or 8 consecutive tokens per request at shuffled places (source and pool alike) */
        {
            int32_t *h = OSCAR__CAST(int32_t *, oscar__alloc(ctx, sizeof(int32_t) * OSCAR__CAST(size_t, T + groups)));
            int32_t *perm = h ? h + T : NULL;
            oscar__tune_rng rng;
            int64_t i, pass;
            if (!h) {
                st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_quantize: out of host memory");
                goto shape_done;
            }
            for (pass = 0; pass < 2 && st == OSCAR_OK; pass++) {
                void **dst = pass ? &dslots : &sslots;
                if (!gathered && pass == 0) continue; /* dense source: no slot ids */
                rng.s = 0x51075000u + OSCAR__CAST(uint64_t, si * 2 + pass);
                for (i = 0; i < groups; i++) perm[i] = OSCAR__CAST(int32_t, i);
                for (i = groups - 1; gathered && i > 0; i--) {
                    int64_t j = OSCAR__CAST(int64_t, oscar__tune_next(&rng) % OSCAR__CAST(uint64_t, i + 1));
                    int32_t t = perm[i];
                    perm[i] = perm[j], perm[j] = t;
                }
                for (i = 0; i < T; i++) h[i] = gathered ? perm[i / 8] * 8 + OSCAR__CAST(int32_t, i % 8) : OSCAR__CAST(int32_t, i);
                st = oscar__tune_dalloc(ctx, &mem, sizeof(int32_t) * OSCAR__CAST(size_t, T), dst);
                if (st == OSCAR_OK) st = oscar__tune_fill(ctx, *dst, sizeof(int32_t) * OSCAR__CAST(size_t, T), h, sizeof(int32_t) * OSCAR__CAST(size_t, T));
            }
            oscar__free(ctx, h);
            if (st != OSCAR_OK) goto shape_done;
        }
        q.layers = OSCAR__CAST(oscar_quantize_layer_desc *, oscar__calloc(ctx, sizeof(oscar_quantize_layer_desc) * nsets * OSCAR__CAST(size_t, L)));
        host_bytes = 2 * OSCAR__CAST(size_t, L) * (q.code_bytes + q.scale_bytes);
        q.ref = OSCAR__CAST(uint8_t *, oscar__alloc(ctx, host_bytes));
        q.cand = OSCAR__CAST(uint8_t *, oscar__alloc(ctx, host_bytes));
        if (!q.layers || !q.ref || !q.cand) {
            st = oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_tune_quantize: out of host memory");
            goto shape_done;
        }
        for (k = 0; k < nsets * OSCAR__CAST(size_t, L); k++) {
            oscar_quantize_layer_desc *ld = &q.layers[k];
            const float *R = rot ? OSCAR__CAST(const float *, rot) + (k % OSCAR__CAST(size_t, L)) * OSCAR__CAST(size_t, D * D) : NULL;
            ld->src_k = OSCAR__CAST(uint8_t *, src) + (2 * k) * src_bytes;
            ld->src_v = OSCAR__CAST(uint8_t *, src) + (2 * k + 1) * src_bytes;
            ld->k_rotation = R, ld->v_rotation = rotated == 2 ? R : NULL;
            ld->k_codes = q.codes + (2 * k) * q.code_bytes, ld->v_codes = q.codes + (2 * k + 1) * q.code_bytes;
            ld->k_scales = q.scales + (2 * k) * q.scale_bytes, ld->v_scales = q.scales + (2 * k + 1) * q.scale_bytes;
        }
        q.qd.pool = &q.pool, q.qd.num_layers = L, q.qd.layers = q.layers;
        q.qd.src_dtype = d.src_dtype, q.qd.num_tokens = T;
        q.qd.src_slots = sslots, q.qd.src_page_size = gathered ? d.src_page_size : 1;
        q.qd.dst_slots = dslots, q.qd.slot_dtype = OSCAR_DTYPE_I32;
        q.qd.k_clip_ratio = d.k_clip_ratio, q.qd.v_clip_ratio = d.v_clip_ratio, q.qd.mode = d.mode;

        /* candidate 0: the heuristic's tile (table lookups off), read from the launch */
        oscar__tune_suppress = 1;
        oscar__tune_last_quant[0] = oscar__tune_last_quant[1] = 0;
        st = oscar_quantize_kv(ctx, &q.qd, NULL);
        oscar__tune_suppress = 0;
        if (st != OSCAR_OK) goto shape_done;
        q.rows_per_warp[0] = oscar__tune_last_quant[0], q.warps_per_cta[0] = oscar__tune_last_quant[1];
        nt = oscar__tune_quant_tiles(key, tr, tw);
        for (c = 0; c < nt; c++)
            if ((tr[c] != q.rows_per_warp[0] || tw[c] != q.warps_per_cta[0]) &&
                oscar__quant_tile_valid(ctx, D, tr[c], tw[c], rotated > 0))
                q.rows_per_warp[nc] = tr[c], q.warps_per_cta[nc] = tw[c], nc++;
        for (c = 0; c < nc; c++) {
            snprintf(labels_buf[c], sizeof labels_buf[c], "rows_per_warp=%d warps_per_cta=%d", q.rows_per_warp[c], q.warps_per_cta[c]);
            labels[c] = labels_buf[c];
        }
        snprintf(rep.default_params, sizeof rep.default_params, "%s", labels[0]);
        st = oscar__tune_search(ctx, oscar__tune_qnt_run, oscar__tune_qnt_check, &q, nc, labels, OSCAR__CAST(int, nsets),
                                d.warmup, d.repeats, &oc);
        if (st != OSCAR_OK) goto shape_done;
        memset(&e, 0, sizeof e);
        e.family = OSCAR_TUNE_FAMILY_QUANTIZE;
        memcpy(e.key, key, sizeof key);
        oscar__tune_family_digest(OSCAR_TUNE_FAMILY_QUANTIZE, e.src);
        if (oc.best) {
            e.params[OSCAR__TP_QNT_ROWS_PER_WARP] = q.rows_per_warp[oc.best];
            e.params[OSCAR__TP_QNT_WARPS_PER_CTA] = q.warps_per_cta[oc.best];
            e.params_set = (1u << OSCAR__TP_QNT_ROWS_PER_WARP) | (1u << OSCAR__TP_QNT_WARPS_PER_CTA);
        }
        st = oscar__tune_finish_shape(ctx, "oscar_tune_quantize", &e, &oc, labels, t0, &rep);
        oscar__info(ctx, "oscar_tune_quantize: %s: default %s %.1f us, kept %s %.1f us (%d candidates, %d rejected)", rep.key,
                    rep.default_params, rep.default_us, rep.params, rep.tuned_us, rep.num_candidates, rep.num_rejected);
    shape_done:
        oscar__free(ctx, q.layers), oscar__free(ctx, q.ref), oscar__free(ctx, q.cand);
        oscar__tune_mem_free(ctx, &mem);
        if (out_reports) out_reports[si] = rep;
    }
    if (pushed) oscar__pop(ctx);
    oscar__free(ctx, pat);
    return st;
}

#endif /* OSCAR_TUNE_H_INCLUDED */
