/* tests/test_quantize_thresh.c -- the direct code thresholds of quantize.cuh
   (q_direct_candidate) against the reference formula, on the CPU (no GPU).

   The uniform code of a value v of the source dtype is
     code(v) = trunc(RN(RN(RN(v / scale) + zero) + 0.5)) clamped to [0, 3]
   (cpu/oscar_cpu.h), a monotone step function of v, so code(v) >= k iff
   v >= t_k, t_k the smallest dtype value reaching level k. The kernel
   computes t_k directly:
     1. q* = the smallest f32 quotient q with RN(RN(q + zero) + 0.5) >= k:
        q0 = RN32(M_k - zero) in f64 (M_k = the real boundary of the two
        rounded adds: 0.5 - 3 * 2^-26 (strict), 1.5 - 2^-24, 2.5 - 2^-23),
        then q* = q0 or its neighbour, settled by two evaluations of the adds;
     2. t_k = the smallest dtype value v with RN(v / scale) >= q*: with p =
        pred(q*), RN(v / scale) >= q* iff v >= P = (p + q*) / 2 * scale (exact
        in f64), strictly when the tie goes to p (q* odd);
   then the kernel checks the formula at t_k and its predecessor and falls
   back to the search where that check fails (or step 1 could not settle).
   This program mirrors the candidate computation in C and proves it equals
   the reference threshold (found by a bisection of the reference formula,
   itself checked by exhaustive scans) over many (scale, zero) pairs. */
#define OSCAR_IMPLEMENTATION
#include "oscar.h"
#include "test_util.h"

static float t_val(uint32_t o, int dt) { return oscar__to_f32((uint16_t)oscar__cpu_unord16(o), dt); }
static uint32_t t_fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* the reference: code(v) >= k, as oscar__cpu_quantize_row computes qv;
   trunc(qv) clamped to [0, 3] reaches k >= 1 iff qv >= k (written so,
   because values outside a group's range, which the full-range checks
   evaluate, can give qv >= 2^31, where the C conversion to int is undefined) */
static int ref_reaches(float v, float scale, float zero, int k) {
    volatile float qv = v / scale + zero + 0.5f;
    return qv >= (float)k;
}
/* smallest ordered index in [lo, hi + 1] that reaches (bisection; monotone) */
static uint32_t ref_threshold(float scale, float zero, int k, int dt, uint32_t lo, uint32_t hi) {
    uint32_t a = lo - 1u, b = hi + 1u; /* !reaches(a), reaches(b) by convention */
    while (b - a > 1u) {
        uint32_t m = a + ((b - a) >> 1);
        if (ref_reaches(t_val(m, dt), scale, zero, k))
            b = m;
        else
            a = m;
    }
    return b;
}
static uint32_t scan_threshold(float scale, float zero, int k, int dt, uint32_t lo, uint32_t hi, int *monotone) {
    uint32_t o, b = hi + 1u;
    int seen = 0;
    for (o = lo; o <= hi; o++) {
        int r = ref_reaches(t_val(o, dt), scale, zero, k);
        if (r && !seen) b = o, seen = 1;
        if (!r && seen) *monotone = 0;
    }
    return b;
}

/* ---- the C mirror of quantize.cuh's q_direct_candidate --------------------- */
static int h_reaches(float q, float zero, int k) {
    volatile float a = q + zero;
    volatile float b = a + 0.5f;
    return b >= (float)k;
}
static const double T_M[3] = {0.5 - 3.0 / 67108864.0, 1.5 - 1.0 / 16777216.0, 2.5 - 1.0 / 8388608.0};
/* 1: a candidate ordered index (unclamped) in *cand; 0: no candidate (search) */
static int direct_candidate(float scale, float zero, int k, int dt, uint32_t *cand) {
    float q = (float)(T_M[k - 1] - (double)zero), qa, qs, p, P32;
    int hq = h_reaches(q, zero, k), strict;
    double P;
    uint32_t c;
    qa = hq ? nextafterf(q, -INFINITY) : nextafterf(q, INFINITY);
    if (hq == h_reaches(qa, zero, k)) return 0;
    qs = hq ? q : qa;
    if (!(fabsf(qs) < 0x1p127f) || qs == 0.f) return 0;
    p = nextafterf(qs, -INFINITY);
    P = (0.5 * ((double)p + (double)qs)) * (double)scale;
    strict = (t_fbits(qs) & 1u) != 0u;
    P32 = (float)P; /* rounded up: */
    if ((double)P32 < P) P32 = nextafterf(P32, INFINITY);
    c = oscar__cpu_ord16(oscar__from_f32(P32, dt));
    if (t_val(c, dt) < P32) c++;
    if (strict && (double)t_val(c, dt) == P) c++;
    *cand = c;
    return 1;
}

typedef struct {
    long cases, exact, nocand, wrong;
} tally;

/* one (scale, zero, range): the candidate, clamped to [lo, hi + 1], must be
   the reference threshold */
static void check_one(tally *t, float scale, float zero, int k, int dt, uint32_t lo, uint32_t hi, const char *what) {
    uint32_t ref = ref_threshold(scale, zero, k, dt, lo, hi), c;
    t->cases++;
    if (!direct_candidate(scale, zero, k, dt, &c)) {
        t->nocand++;
        return;
    }
    c = c < lo ? lo : c > hi + 1u ? hi + 1u : c;
    if (c == ref) {
        t->exact++;
    } else {
        if (t->wrong < 10)
            fprintf(stderr, "%s: scale %a zero %a k %d dt %d: candidate %04x, reference %04x\n", what, (double)scale,
                    (double)zero, k, dt, oscar__cpu_unord16(c), oscar__cpu_unord16(ref));
        t->wrong++;
    }
}
static uint32_t lo_finite(int dt) { return oscar__cpu_ord16(dt == OSCAR_K_DTYPE_F16 ? 0xFBFFu : 0xFF7Fu); }
static uint32_t hi_finite(int dt) { return oscar__cpu_ord16(dt == OSCAR_K_DTYPE_F16 ? 0x7BFFu : 0x7F7Fu); }

/* a group with min mn and max mx (values of the dtype): the reference's
   scale and zero, thresholds over the group's range and over all finite values */
static void check_group(tally *t, float mn, float mx, int dt, const char *what) {
    float scale = fmaxf(mx - mn, 1e-8f) / 3.0f, zero = -mn / scale;
    int k;
    if (!isfinite(zero) || !isfinite(scale)) return;
    for (k = 1; k <= 3; k++) {
        check_one(t, scale, zero, k, dt, oscar__cpu_ord16(oscar__from_f32(mn, dt)), oscar__cpu_ord16(oscar__from_f32(mx, dt)),
                  what);
        check_one(t, scale, zero, k, dt, lo_finite(dt), hi_finite(dt), what);
    }
}

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng >> 16);
}
static uint16_t rnd_val(int dt) { /* a random finite value of the dtype */
    for (;;) {
        uint16_t h = (uint16_t)rnd();
        float f = oscar__to_f32(h, dt);
        if (isfinite(f)) return h;
    }
}

static void report(const char *what, const tally *t) {
    printf("%-44s %9ld cases: %9ld exact, %6ld without candidate (search), %ld wrong\n", what, t->cases, t->exact,
           t->nocand, t->wrong);
    fflush(stdout);
    cr_assert_eq(t->wrong, 0, "%s: %ld wrong candidates", what, t->wrong);
}

/* every clipped group: min = -tau, max = tau, for every positive finite tau */
Test(quantize_thresh, clipped_groups_all_tau) {
    int dt;
    for (dt = 0; dt < 2; dt++) {
        int dtype = dt ? OSCAR_K_DTYPE_F16 : OSCAR_K_DTYPE_BF16;
        uint32_t h, top = dt ? 0x7BFFu : 0x7F7Fu;
        tally t = {0, 0, 0, 0};
        for (h = 1; h <= top; h++) {
            float tau = oscar__to_f32((uint16_t)h, dtype);
            check_group(&t, -tau, tau, dtype, "clipped");
        }
        report(dt ? "clipped (-tau, tau), every f16 tau" : "clipped (-tau, tau), every bf16 tau", &t);
        cr_assert(t.exact >= t.cases - t.cases / 1000, "too many without a candidate");
    }
}

/* random groups: min and max of random sign and magnitude, near-equal ones
   (scale = 1e-8 / 3), one-sided ones, both of small exponent spread */
Test(quantize_thresh, random_groups) {
    int dt, i;
    for (dt = 0; dt < 2; dt++) {
        int dtype = dt ? OSCAR_K_DTYPE_F16 : OSCAR_K_DTYPE_BF16;
        tally t = {0, 0, 0, 0};
        for (i = 0; i < 400000; i++) {
            float a, b;
            int mode = i % 4;
            if (mode == 0) { /* anything */
                a = oscar__to_f32(rnd_val(dtype), dtype), b = oscar__to_f32(rnd_val(dtype), dtype);
            } else if (mode == 1) { /* a few ulps apart */
                uint32_t o = oscar__cpu_ord16(rnd_val(dtype));
                a = t_val(o, dtype), b = t_val(o + rnd() % 8u, dtype);
                if (!isfinite(b)) continue;
            } else if (mode == 2) { /* KV-like magnitudes, mixed signs */
                a = oscar__to_f32(oscar__from_f32(ldexpf((float)(rnd() % 65536u) / 65536.f, (int)(rnd() % 12u) - 6), dtype), dtype);
                b = oscar__to_f32(oscar__from_f32(ldexpf((float)(rnd() % 65536u) / 65536.f, (int)(rnd() % 12u) - 6), dtype), dtype);
                if (rnd() & 1u) a = -a;
                if (rnd() & 3u) b = -b;
            } else { /* near-symmetric: -tau and a value a few ulps off tau */
                uint32_t o = oscar__cpu_ord16(rnd_val(dtype));
                b = fabsf(t_val(o, dtype));
                a = -t_val(oscar__cpu_ord16(oscar__from_f32(b, dtype)) + rnd() % 5u - 2u, dtype);
                if (!isfinite(a)) continue;
            }
            if (a > b) {
                float s = a;
                a = b, b = s;
            }
            check_group(&t, a, b, dtype, "random");
        }
        report(dt ? "random groups, f16" : "random groups, bf16", &t);
    }
}

/* arbitrary (scale, zero): zero a few ulps around each level's boundaries
   M_k and k - 0.5, scales of few mantissa bits (exact ties in v / scale),
   tiny and huge scales, large zero points */
Test(quantize_thresh, arbitrary_scale_zero) {
    static const float fewbits[] = {1.f, 1.5f, 1.25f, 1.75f, 1.125f, 1.0078125f};
    int dt, i, k, j;
    for (dt = 0; dt < 2; dt++) {
        int dtype = dt ? OSCAR_K_DTYPE_F16 : OSCAR_K_DTYPE_BF16;
        tally t = {0, 0, 0, 0};
        for (i = 0; i < 30000; i++) {
            float scale, base, zero;
            int e = (int)(rnd() % 200u) - 100;
            if (i % 3 == 0)
                scale = ldexpf(fewbits[rnd() % 6u], e);
            else if (i % 3 == 1)
                scale = ldexpf(1.f + (float)(rnd() % 8388608u) / 8388608.f, e);
            else
                scale = ldexpf(1.f + (float)(rnd() % 8388608u) / 8388608.f, (int)(rnd() % 10u) - 12);
            if (scale < 1e-8f / 3.0f) scale = 1e-8f / 3.0f;
            for (k = 1; k <= 3; k++) {
                base = (rnd() & 1u) ? (float)T_M[k - 1] : (float)k - 0.5f;
                if (rnd() % 4u == 0) base = (float)k - 1.f;
                for (j = -4; j <= 4; j++) {
                    int n;
                    zero = base;
                    for (n = 0; n < (j < 0 ? -j : j); n++) zero = nextafterf(zero, j < 0 ? -INFINITY : INFINITY);
                    check_one(&t, scale, zero, k, dtype, lo_finite(dtype), hi_finite(dtype), "zero near boundary");
                }
                zero = ldexpf((float)(rnd() % 65536u) / 32768.f - 1.f, (int)(rnd() % 40u) - 10);
                check_one(&t, scale, zero, k, dtype, lo_finite(dtype), hi_finite(dtype), "random zero");
                zero = (float)(rnd() % 8u) * 0.5f - 0.5f; /* dyadic: ties in the adds */
                check_one(&t, scale, zero, k, dtype, lo_finite(dtype), hi_finite(dtype), "dyadic zero");
            }
        }
        report(dt ? "arbitrary (scale, zero), f16" : "arbitrary (scale, zero), bf16", &t);
    }
}

/* the bisection reference against exhaustive scans (monotone, same threshold),
   and the candidate against the scans */
Test(quantize_thresh, exhaustive_scans) {
    int dt, i, k;
    for (dt = 0; dt < 2; dt++) {
        int dtype = dt ? OSCAR_K_DTYPE_F16 : OSCAR_K_DTYPE_BF16;
        uint32_t lo = lo_finite(dtype), hi = hi_finite(dtype);
        long n = 0, nocand = 0;
        for (i = 0; i < 300; i++) {
            float mn, mx, scale, zero;
            if (i % 2 == 0) {
                mx = fabsf(oscar__to_f32(oscar__from_f32(ldexpf((float)(rnd() % 65536u) / 65536.f, (int)(rnd() % 16u) - 8), dtype), dtype));
                mn = -mx;
            } else {
                mn = oscar__to_f32(rnd_val(dtype), dtype), mx = oscar__to_f32(rnd_val(dtype), dtype);
                if (mn > mx) {
                    float s = mn;
                    mn = mx, mx = s;
                }
            }
            scale = fmaxf(mx - mn, 1e-8f) / 3.0f, zero = -mn / scale;
            if (!isfinite(zero) || !isfinite(scale)) continue;
            for (k = 1; k <= 3; k++) {
                int mono = 1;
                uint32_t s = scan_threshold(scale, zero, k, dtype, lo, hi, &mono), c;
                cr_assert(mono, "not monotone: scale %a zero %a k %d", (double)scale, (double)zero, k);
                cr_assert_eq(s, ref_threshold(scale, zero, k, dtype, lo, hi));
                if (direct_candidate(scale, zero, k, dtype, &c)) {
                    c = c < lo ? lo : c > hi + 1u ? hi + 1u : c;
                    cr_assert_eq(c, s, "scale %a zero %a k %d: candidate %04x scan %04x", (double)scale, (double)zero, k,
                                 oscar__cpu_unord16(c), oscar__cpu_unord16(s));
                } else {
                    nocand++;
                }
                n++;
            }
        }
        printf("exhaustive scans, %s: %ld thresholds (every finite value), %ld without candidate\n", dt ? "f16" : "bf16",
               n, nocand);
    }
}

/* quantize.cuh v8's table (q_tab_entry, q_tab_shift): a bf16 group clipped at
   both ends (min -tau, max tau) takes its thresholds from an entry computed at
   tau in [1, 2) with tau's mantissa, shifted by tau's exponent, where the entry
   is usable (a marker, or a threshold >= 2^-70 that reappears shifted at
   exponents 2^-25 and 2^60) and tau's exponent lies in that range. Here, with
   the reference formula: for every bf16 tau of that range, the shifted
   usable entry equals the reference thresholds -- the premise of the table,
   checked exhaustively rather than on the GPU tests' random rows. Words as
   q_threshold makes them on sm_90: -inf (0xFF80) when -tau itself reaches the
   level, +inf (0x7F80) when tau does not, else the threshold's bf16 pattern. */
static uint32_t table_shift(uint32_t t, int de) {
    const uint32_t mag = t & 0x7fffu;
    if (mag >= 0x7f80u || mag == 0u) return t;
    return (t & 0x8000u) | (mag + (uint32_t)(de * 128));
}
static void clipped_words(uint32_t h, uint32_t w[3]) {
    const int dt = OSCAR_K_DTYPE_BF16;
    const float tau = oscar__to_f32((uint16_t)h, dt), scale = fmaxf(tau - -tau, 1e-8f) / 3.0f, zero = -(-tau) / scale;
    const uint32_t lo = oscar__cpu_ord16(h | 0x8000u), hi = oscar__cpu_ord16(h);
    int k;
    for (k = 1; k <= 3; k++) {
        const uint32_t b = ref_threshold(scale, zero, k, dt, lo, hi);
        w[k - 1] = b == lo ? 0xFF80u : b > hi ? 0x7F80u : oscar__cpu_unord16(b);
    }
}
Test(quantize_thresh, clipped_table_scales_with_tau_exponent) {
    const int emin = 127 - 25, emax = 127 + 60; /* Q_TAB_EMIN, Q_TAB_EMAX */
    long usable = 0, checked = 0, markers = 0;
    uint32_t m;
    for (m = 0; m < 128; m++) {
        uint32_t base[3], lo[3], hi[3], e;
        int k, ok[3];
        clipped_words((127u << 7) | m, base);
        clipped_words(((uint32_t)emin << 7) | m, lo);
        clipped_words(((uint32_t)emax << 7) | m, hi);
        for (k = 0; k < 3; k++) {
            const uint32_t mag = base[k] & 0x7fffu;
            ok[k] = (mag >= 0x7f80u || mag >= ((127u - 70u) << 7)) && lo[k] == table_shift(base[k], emin - 127) &&
                    hi[k] == table_shift(base[k], emax - 127);
            usable += ok[k], markers += ok[k] && mag >= 0x7f80u;
        }
        if (!(ok[0] && ok[1] && ok[2])) continue; /* the kernel then computes the group's thresholds in full */
        for (e = (uint32_t)emin; e <= (uint32_t)emax; e++) {
            uint32_t w[3];
            clipped_words((e << 7) | m, w);
            for (k = 0; k < 3; k++) {
                cr_assert_eq(w[k], table_shift(base[k], (int)e - 127),
                             "tau 0x%04x level %d: reference threshold %04x, table %04x", (e << 7) | m, k + 1, w[k],
                             table_shift(base[k], (int)e - 127));
                checked++;
            }
        }
    }
    printf("clipped-group table: %ld of 384 entries usable (%ld markers), %ld thresholds over 2^-25..2^60 equal the "
           "reference\n",
           usable, markers, checked);
    cr_assert(usable >= 300, "most entries usable (%ld of 384)", usable);
}

/* The table the kernel reads (session 18: oscar_kernels/quantize_table.cuh, a
   constant written by tools/gen_quantize_table.c from cpu/oscar_cpu.h's
   oscar__cpu_clip_table; sessions 8-17 built it per CTA on the device). Here:
   the committed file equals the generator for both compare domains (else:
   regenerate it), and every entry equals one rebuilt from this file's own
   reference -- the stored threshold at tau = 1.m by a plain scan of [-tau, tau]
   (monotone), the usable bit from ref_threshold at exponents 2^-25 and 2^60
   -- with the domain's markers: sm_90 compares bf16 (+inf 0x7F80), sm_80 and
   sm_89 compare bf16 patterns as f16 (+inf 0x7C00). No entry is a marker
   today (-tau never reaches level 1, tau always reaches level 3), so the two
   tables are equal; the test keeps them apart in case the formula changes. */
#include "oscar_kernels/quantize_table.cuh"
static uint32_t domain_word(uint32_t w, uint32_t pos_inf) {
    return w == 0x7F80u ? pos_inf : w == 0xFF80u ? (pos_inf | 0x8000u) : w;
}
Test(quantize_thresh, clip_table_committed_equals_reference) {
    static const uint32_t committed[2][384] = {OSCAR_K_CLIP_TABLE_F16CMP, OSCAR_K_CLIP_TABLE_NATIVE};
    const int emin = 127 - 25, emax = 127 + 60;
    int native, usable[2] = {0, 0};
    for (native = 0; native <= 1; native++) {
        const uint32_t pos_inf = native ? 0x7F80u : 0x7C00u;
        uint32_t gen[384], m;
        int i;
        oscar__cpu_clip_table(native, gen);
        for (i = 0; i < 384; i++)
            cr_assert_eq(gen[i], committed[native][i],
                         "%s entry %d: committed 0x%05x, oscar__cpu_clip_table 0x%05x -- regenerate with "
                         "build/tools/gen_quantize_table > oscar_kernels/quantize_table.cuh",
                         native ? "native" : "f16cmp", i, committed[native][i], gen[i]);
        for (m = 0; m < 128; m++) {
            const uint32_t h = (127u << 7) | m;
            const float tau = oscar__bf16_to_f32((uint16_t)h), scale = fmaxf(tau - -tau, 1e-8f) / 3.0f, zero = tau / scale;
            const uint32_t olo = oscar__cpu_ord16(h | 0x8000u), ohi = oscar__cpu_ord16(h);
            uint32_t lo[3], hi[3];
            int k;
            clipped_words(((uint32_t)emin << 7) | m, lo);
            clipped_words(((uint32_t)emax << 7) | m, hi);
            for (k = 1; k <= 3; k++) {
                int monotone = 1;
                const uint32_t b = scan_threshold(scale, zero, k, OSCAR_K_DTYPE_BF16, olo, ohi, &monotone);
                const uint32_t t = b == olo ? (pos_inf | 0x8000u) : b > ohi ? pos_inf : oscar__cpu_unord16(b), mag = t & 0x7fffu;
                const int ok = (mag >= 0x7f80u || mag >= ((127u - 70u) << 7)) &&
                               domain_word(lo[k - 1], pos_inf) == table_shift(t, emin - 127) &&
                               domain_word(hi[k - 1], pos_inf) == table_shift(t, emax - 127);
                cr_assert(monotone, "tau 0x%04x level %d: the code is not monotone", h, k);
                cr_assert_eq(committed[native][3 * m + k - 1], t | (ok ? 0x10000u : 0u),
                             "%s tau 0x%04x level %d: table 0x%05x, reference 0x%05x", native ? "native" : "f16cmp", h, k,
                             committed[native][3 * m + k - 1], t | (ok ? 0x10000u : 0u));
                usable[native] += ok;
            }
        }
    }
    printf("clip table: %d (sm_90) and %d (sm_80/89) of 384 entries usable, both equal the reference\n", usable[1],
           usable[0]);
    cr_assert(usable[1] >= 300, "most sm_90 entries usable (%d of 384)", usable[1]);
}

/* quantize.cuh's q_divisor (bb19712), mirrored: the address code divides row
   indices by the KV-head count and slots by page sizes as (n m) >> (31 + l)
   with l = ceil(log2 d), m = ceil(2^(31 + l) / d) (2^31 for powers of two).
   Exact for every n < 2^31: checked here for every d <= 2048, a geometric
   sweep of d to 70000 and large d up to 2^31 - 1, with n at both ends of the
   range, around multiples of d and random. The GPU tests only reach small n. */
static uint32_t div_ms(uint32_t n, uint32_t d) {
    const uint32_t l = d > 1u ? 32u - (uint32_t)__builtin_clz(d - 1u) : 0u, s = 31u + l;
    const uint32_t m = (d & (d - 1u)) == 0u ? 0x80000000u : (uint32_t)(((1ull << s) + d - 1u) / d);
    return (uint32_t)(((uint64_t)n * m) >> s);
}
Test(quantize_thresh, divisor_multiply_shift_is_exact) {
    static const uint32_t big[] = {0x7fffffffu, 0x40000001u, 0x40000000u, 0x3fffffffu, 123456789u, 65537u, 1000003u};
    uint64_t x = 0x9e3779b97f4a7c15ull, checked = 0;
    uint32_t d, k;
    for (d = 1; d <= 70000; d = d < 2048 ? d + 1 : d + d / 64) {
        for (k = 0; k < 4000; k++) {
            uint32_t n;
            if (k < 32) n = 0x7fffffffu - k;
            else if (k < 64) n = k - 32;
            else if (k < 1064) n = (uint32_t)(((uint64_t)d * (k - 64) * 2147u) % 0x80000000u) - (k & 1);
            else x = x * 6364136223846793005ull + 1442695040888963407ull, n = (uint32_t)(x >> 33);
            n &= 0x7fffffffu;
            cr_assert_eq(div_ms(n, d), n / d, "d = %u, n = %u", d, n);
            checked++;
        }
    }
    for (k = 0; k < sizeof big / sizeof big[0]; k++)
        for (d = 0; d < 200000; d++) {
            uint32_t n;
            x = x * 6364136223846793005ull + 1442695040888963407ull, n = (uint32_t)(x >> 33) & 0x7fffffffu;
            if (d < 16) n = 0x7fffffffu - d;
            cr_assert_eq(div_ms(n, big[k]), n / big[k], "d = %u, n = %u", big[k], n);
            checked++;
        }
    cr_log_info("%llu (d, n) pairs exact", (unsigned long long)checked);
}
