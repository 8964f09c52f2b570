/* src/oscar_decode.h -- part of the oscar.h implementation: decode attention
   plan (splits, kernels, workspace) and run (validation, four launches).
   Kernels: decode.cuh. */
#ifndef OSCAR_DECODE_H_INCLUDED
#define OSCAR_DECODE_H_INCLUDED

#define OSCAR__PLAN_MAGIC 0x05CA2DECu
#define OSCAR__DECODE_WIN_TOK 16
#define OSCAR__DECODE_WIN_STAGES 2

OSCAR__PRIVATE size_t oscar__align256(size_t x) { return (x + 255) & ~OSCAR__CAST(size_t, 255); }

/* Shared memory of the window kernel (the INT2 kernel's: jit/oscar_registry.h) */
OSCAR__PRIVATE uint32_t oscar__decode_window_smem(int head_dim, int group_ratio, int warps) {
    uint32_t pipe = OSCAR__CAST(uint32_t, warps * OSCAR__DECODE_WIN_STAGES * 2 * OSCAR__DECODE_WIN_TOK * head_dim * 2);
    return OSCAR__MAX(pipe, oscar__decode_combine_bytes(warps, head_dim, group_ratio));
}

/* prep's chunk of R_k rows in shared memory (64 KB, or all of R when smaller) */
OSCAR__PRIVATE uint32_t oscar__decode_prep_smem(int head_dim) {
    int rows = 16384 / head_dim < head_dim ? 16384 / head_dim : head_dim;
    return OSCAR__CAST(uint32_t, rows * head_dim * 4);
}

OSCAR__PRIVATE oscar_window_pool_desc oscar__window_defaults(const oscar_window_pool_desc *w, int num_kv_heads,
                                                             int head_dim) {
    oscar_window_pool_desc d = *w;
    int64_t ps;
    d.dtype = oscar__def(d.dtype, OSCAR_DTYPE_BF16);
    d.page_size = oscar__def(d.page_size, 1);
    d.layout = oscar__def(d.layout, OSCAR_KV_LAYOUT_NHD);
    ps = d.page_size;
    if (d.layout == OSCAR_KV_LAYOUT_HND) {
        d.token_stride = oscar__def(d.token_stride, head_dim);
        d.head_stride = oscar__def(d.head_stride, ps * head_dim);
    } else {
        d.head_stride = oscar__def(d.head_stride, head_dim);
        d.token_stride = oscar__def(d.token_stride, OSCAR__CAST(int64_t, num_kv_heads) * head_dim);
    }
    d.page_stride = oscar__def(d.page_stride, ps * num_kv_heads * head_dim);
    return d;
}

OSCAR__PRIVATE void oscar__window_validate(oscar__validator *v, const oscar_window_pool_desc *w, const char *name,
                                           int need_arrays) {
    OSCAR__CHECK_CANARIES(v, w, "window_pool");
    OSCAR__VALIDATE(v, w->dtype == OSCAR_DTYPE_BF16 || w->dtype == OSCAR_DTYPE_F16, "%s.dtype = %s; expected bf16 or f16",
                    name, oscar__dtype_name(w->dtype));
    OSCAR__VALIDATE(v, w->num_pages >= 1, "%s.num_pages = %d; expected >= 1 (*must* be set)", name, w->num_pages);
    OSCAR__VALIDATE(v, w->page_size >= 1, "%s.page_size = %d; expected >= 1", name, w->page_size);
    OSCAR__VALIDATE(v,
                    w->page_stride > 0 && w->token_stride > 0 && w->head_stride > 0 && w->page_stride % 8 == 0 &&
                        w->token_stride % 8 == 0 && w->head_stride % 8 == 0,
                    "%s.{page,token,head}_stride = %lld, %lld, %lld; expected positive multiples of 8 elements", name,
                    OSCAR__CAST(long long, w->page_stride), OSCAR__CAST(long long, w->token_stride),
                    OSCAR__CAST(long long, w->head_stride));
    if (need_arrays)
        OSCAR__VALIDATE(v,
                        w->k && w->v && (OSCAR__RCAST(uintptr_t, w->k) | OSCAR__RCAST(uintptr_t, w->v)) % 16 == 0,
                        "%s.k = %p, %s.v = %p; both *must* be set, 16-byte aligned", name, w->k, name, w->v);
}

/* INT2 split count for (batch x kv heads) = base CTA rows and up to L tokens
   per request: the count minimising  waves x (tokens per split + C), where
   waves = ceil(CTAs / resident CTAs) with the kernel's measured occupancy
   (cuOccupancyMaxActiveBlocksPerMultiprocessor; 4 per SM when it cannot be
   asked) and C = 128 tokens stands for a CTA's fixed cost (q fragments,
   pipeline fill, the combine), plus 32 tokens per split for the merge's
   work per split (session 9: without it, batch 1 took every slot -- 66
   splits at 1 x 32K and 1 x 128K, measured 27.9 and 43.5 us in CUDA-graph
   replay on the H200 against 21.2 and 36.9 with the 32 and 64 this term
   picks, the graph-timed tuner's choices; bench/results/logs/
   decode_v11_h200.txt). v1-v3 aimed at 4 CTAs per SM in all, which put 32
   x 32K at 768 CTAs = 1.16 waves of the 5-per-SM PACK kernel. Each split
   keeps >= 256 tokens; at most 128 splits. */
/* SMs the plan sizes its grids for: 132 (the H200's) where the context cannot
   say (CPU backend, compile-only contexts). */
OSCAR__PRIVATE int64_t oscar__decode_sms(const oscar_ctx *ctx) { return ctx->num_sms > 0 ? ctx->num_sms : 132; }
/* The merge kernel a plan uses: one CTA per query head (decode_merge_head_kernel)
   when batch x q heads fits in one wave of CTAs, else one per KV head doing its
   group (decode_merge_kernel, which reads R_v once per group). Decided from the
   plan alone, so plan (which compiles it) and run (which launches it) agree. */
OSCAR__PRIVATE int oscar__decode_merge_per_head(const oscar_ctx *ctx, const oscar_decode_plan_info *pl) {
    return OSCAR__CAST(int64_t, pl->batch_size) * pl->num_q_heads <= oscar__decode_sms(ctx);
}
/* Requests per prep and per-KV-head merge CTA, the heuristic: one while
   batch x KV heads CTAs fit one per SM at ratio <= 4, two per SM above
   (their latency chains then run side by side), else enough for that (R_k,
   R_v read once for them; measured on the H200 at 128 x 4K: prep 24.5 ->
   18.5, merge 49.8 -> 44.8 us alone with 4), at most 16 rows. Not best
   everywhere, and no group-count rule is (session 16: 2 at 32 x 8K and
   32 x 32K -4.5% / -1.8%, at 8 x 32K and 16 x 32K +3-4%): it is a tuned
   parameter. Until session 35 the rule was two per SM everywhere;
   oscar_tune's candidate curves (bench/results/logs/session35_h200.txt)
   moved it at ratio 4: batch 32 (8 groups per SM) ran 2-6% faster with 2
   requests than with 1 at 4K-8K, batch 24 level; at ratio 8, whose CTAs
   carry twice the rows, batch 24 ran 1-7% slower with 2 and batch 32 at
   most 2% faster, so it keeps two per SM. */
OSCAR__PRIVATE int oscar__decode_requests_heuristic(const oscar_ctx *ctx, const oscar_decode_plan_info *pl) {
    const int64_t ratio = pl->num_q_heads / pl->num_kv_heads;
    const int64_t slots = (ratio > 4 ? 2 : 1) * OSCAR__CAST(int64_t, oscar__decode_sms(ctx));
    const int64_t want = (OSCAR__CAST(int64_t, pl->batch_size) * pl->num_kv_heads + slots - 1) / slots;
    return OSCAR__CAST(int, OSCAR__MAX(1, OSCAR__MIN(want, OSCAR_K_PREP_ROWS / ratio)));
}
/* The plan's choice (desc, table or heuristic, set by oscar_decode_plan). */
OSCAR__PRIVATE int oscar__decode_requests_per_cta(const oscar_ctx *ctx, const oscar_decode_plan_info *pl) {
    return pl->requests_per_cta > 0 ? pl->requests_per_cta : oscar__decode_requests_heuristic(ctx, pl);
}
/* CTAs per group of the per-KV-head merge, each finishing head_dim / that
   many output dims: 4 at head dim 256 where four times the merge's CTAs
   still fit in one wave (two 512-thread CTAs per SM), so each reads a
   quarter of R_v, in registers before its wait; else 1. Measured on the
   H200 with 4 at every D 256 shape (session 14): 8 x 32K 132 -> 117 us (64
   groups: 256 CTAs), 32 x 8K 179 -> 186 (256 groups: 1024 CTAs, 4 waves). */
OSCAR__PRIVATE int oscar__decode_merge_dim_split(const oscar_ctx *ctx, const oscar_decode_plan_info *pl) {
    const int64_t slots = 2 * oscar__decode_sms(ctx);
    const int64_t nb = oscar__decode_requests_per_cta(ctx, pl);
    const int64_t ctas = (pl->batch_size + nb - 1) / nb * pl->num_kv_heads;
    return pl->head_dim == 256 && 4 * ctas <= slots ? 4 : 1;
}
/* Warps per window CTA (decode_window_kernel's WARPS): 2 at head dim 256
   with one 8-head tile when an INT2 tier runs and the window grid has more
   CTAs than the GPU has SMs (a 4-warp D 256 CTA, 131 KB of stages, fits no
   SM holding an INT2 CTA, so such a grid runs in waves after the INT2 grid;
   a 2-warp one fits beside two), else 4. H200 (session 16, same-call A/B):
   32 x 8K D 256 176.6 -> 162.0 us with this rule; 2 warps everywhere had
   cost 8 x 32K D 256 +3% (128 window CTAs) and 1 x 128K D 256 +6.5% (16),
   where the rule keeps 4. */
OSCAR__PRIVATE int oscar__decode_window_warps(const oscar_ctx *ctx, const oscar_decode_plan_info *pl) {
    const int ratio = pl->num_q_heads / pl->num_kv_heads;
    const int64_t ctas = OSCAR__CAST(int64_t, pl->window_splits) * pl->batch_size * pl->num_kv_heads;
    return pl->head_dim == 256 && oscar__head_tiles(ratio) == 1 && pl->int2_splits > 0 && ctas > oscar__decode_sms(ctx)
               ? 2
               : OSCAR__DECODE_WARPS;
}
/* The per-KV-head merge's ROWS: the smallest of 4, 8, 16 holding its rows. */
OSCAR__PRIVATE int oscar__decode_merge_rows(const oscar_ctx *ctx, const oscar_decode_plan_info *pl) {
    const int ratio = pl->num_q_heads / pl->num_kv_heads, rows = oscar__decode_requests_per_cta(ctx, pl) * ratio;
    return rows <= 4 ? 4 : rows <= 8 ? 8 : 16;
}

/* Resident INT2 CTAs of `warps` warps on the whole device: the kernel's
   measured occupancy (cuOccupancyMaxActiveBlocksPerMultiprocessor) x SMs; 4
   per SM (1 for 16-warp CTAs) when it cannot be asked (CPU backend,
   compile-only contexts, a failed probe). */
OSCAR__PRIVATE int64_t oscar__decode_int2_slots(oscar_ctx *ctx, const oscar_decode_plan_info *pl, int32_t ratio,
                                                int warps) {
    int64_t per_sm = warps == OSCAR__DECODE_WARPS ? 4 : 1;
    if (ctx->backend == OSCAR_BACKEND_CUDA && !ctx->compile_only && ctx->cu.cuOccupancyMaxActiveBlocksPerMultiprocessor) {
        char name[192];
        oscar__kernel *k = NULL;
        int n = 0;
        uint32_t smem = oscar__decode_int2_smem(pl->head_dim, pl->group_size, ratio, warps);
        oscar__name_decode_int2(name, sizeof name, pl->head_dim, pl->group_size, pl->page_size, ratio,
                                OSCAR__CAST(int, pl->scale_layout), warps);
        if (oscar__jit_get(ctx, "decode.cuh", name, &k) == OSCAR_OK) {
            const int pushed = oscar__push_if_needed(ctx);
            if (pushed >= 0) {
                if (smem <= 48 * 1024 || ctx->cu.cuFuncSetAttribute(k->function, OSCAR__CU_FUNC_ATTR_MAX_DYNAMIC_SMEM,
                                                                     OSCAR__CAST(int, smem)) == 0)
                    if (ctx->cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, k->function, 32 * warps, smem) == 0 && n > 0)
                        per_sm = n;
                if (pushed) oscar__pop(ctx);
            }
        }
        oscar__clear_error(ctx); /* a failed probe only falls back to the default */
    }
    return per_sm * oscar__decode_sms(ctx);
}

/* The INT2 split count. Where one wave of the INT2 kernel holds them (small
   batches), s = 1.565 (L / 1024)^0.8 splits of L tokens: about 1000 tokens
   per split at 8K, 1300 at 32K, 1500 at 64K. Session 24 measured batch 1-4
   on the H200 (graph replay, bench/results/logs/session24_h200.txt sections
   3-8): the fastest counts grow nearly in proportion to L (8 at 8K, 24 at
   32K, 45 at 64K), which no per-split cost term reproduced.
   Otherwise (and where that count would not fit in one wave) the bandwidth
   model, oscar__decode_split_cost: the least estimated time over 1..cap.
   It replaced (session 34) a model that counted whole waves, waves x (tokens
   per split + 128) + 32 per split: that one charged a partly filled last
   wave as a full one, so it split to round the wave count off (3 splits at
   ratio 8 32 x 8K: 91.5 us, where the new model's 1 takes 84.3; ratio 16
   48 x 48K: 11 splits 930 us, 2 833) where the GPU, bandwidth-bound, gains
   nothing from the rounding and pays each split's fixed costs. The shipped
   table overrides both where it has the shape.
   At 16 query heads per INT2 CTA (ratio 9-16) the small-batch rule's count
   is capped at one CTA per SM (session 36; the curves suggest a 16-head CTA
   leaves little of an SM for a second one, which then only lengthens the
   SMs that hold two).
   H200, held-out A/B in one process (bench/results/logs/session36_h200.txt
   call 6), capped / uncapped over the 8 shapes it changes: 0.954 in
   geometric mean, 128 / 8 heads 3 x 10K 46.1 -> 41.6 us, 5 x 5K 45.3 ->
   40.3, 64 / 4 heads 10 x 6K 46.7 -> 41.2; the worst 1 x 40K +1.7%. Session
   35's curves gave the same direction in-sample (regret 4.75% -> 3.55%).
   At 8 query heads per INT2 CTA (ratio 5-8), head dim 128, one group per row
   and f16 scale + min, it is capped at two CTAs per SM where those fill at
   least 90% of them (session 37; the kernel holds three per SM). H200,
   scripts/ab_decode_plans.sh, bench/results/logs/session37_h200.txt calls 2
   and 3, capped / uncapped in geometric mean over the shapes whose plan
   changes: a cap at one CTA per SM lost (+5% at D 128); at two, 0.968 over
   13 shapes in call 2 (worst +2.3%) and, held out in call 3, 0.965 over 36
   shapes of ratio 5-8 (16 KV heads and pages of 1 included; worst 32 / 4
   heads 7 x 14K +4.7%): 64 / 8 heads 4 x 14K 38.3 -> 33.9 us, 128 / 16
   heads 8 x 3K 38.2 -> 33.0, 2 x 14K 37.9 -> 33.2. Where the cap would
   leave fewer CTAs (12 x 3K: 192 of 264, +3 to +4% on all four
   configurations of call 3, which chose the 90%) it is not taken, nor with
   f32 scale + zero (+3.7% over 6 shapes: 1 x 56K +6%, 2 x 28K +12%),
   group 64 (+6%) or at D 64 (+4 to +8% in call 2): their CTAs want the
   third.
   At 4 query heads per INT2 CTA (ratio <= 4; four CTAs per SM) the same cap,
   from 20 groups (batch x KV heads) and where the rule's count gives at
   least 2.5 CTAs per SM (session 37 calls 4-6): in-sample 0.909 over 24
   shapes (3 x 20K 30.4 -> 25.8 us, 5 x 9K 30.2 -> 25.5), held out 0.958 over
   36 shapes of ratio 1-4 (8 or 16 KV heads, pages of 1): 64 / 16 heads 4 x
   8K 34.1 -> 29.7, 32 / 8 heads 6 x 10.5K 32.3 -> 29.5; it loses at 11 x
   3.5K (4 -> 3 splits: +7.3 to +7.8% on three configurations). With f32
   scale + zero, unlike at 8 heads, it won on all 16 shapes (0.90: 32 / 8
   heads 5 x 11.5K 32.3 -> 28.2 us). Below 20 groups (batch 1-2) or 2.5 CTAs
   per SM the cap alone was mixed (2 x 40K with pages of 1 +9%, 4 x 33K at 4
   KV heads -7.5%) and is not taken.
   Session 38 (bench/results/logs/session38_h200.txt; capped / uncapped time,
   graph replay, both plans in one process): the 4-head cap is not taken where
   it removes one split from three or four -- 4 -> 3 lost on all 12 shapes
   timed (1.02-1.08: 11 x 3.6K 29.3 -> 31.5 us, 87 x 3.75K at one KV head
   29.3 -> 31.5), 3 -> 2 on 7 of 7 (1.005-1.05), while 5 -> 4 (0.90-0.91 on
   four shapes), 2 -> 1 (0.93-0.95 on 6) and the deeper cuts won (6 x 7K
   28.3 -> 25.1 us, 11 x 8.25K at 4 KV heads 28.7 -> 24.9); held out (call
   3, 16 shapes at 5, 10, 2 KV heads and pages of 1) the exclusion is worth
   less, 0.991 (worst +1.2%). At 8 heads the same single-split cuts win
   (uncapped 1.08-1.24x slower on 8 held-out shapes), so it stays 4-head only.
   The 4-head cap applies to groups of 32 and 64 too, which reach it only
   with few KV heads (their CTAs hold fewer per SM): held out 0.937 over 34
   shapes (16 / 4 heads G64 11 x 9K 33.0 -> 27.6 us, 12 / 3 heads G64 7 x 20K
   29.6 -> 25.3); 7 lost, among them group 64 with f16 scales cut 6 -> 4 at
   6K on all 5 such shapes (+2.4 to +6.7%) -- their second window split, now
   dropped there (oscar__decode_window_balance). */
/* The estimated time, in token-times of one CTA streaming alone, of s INT2
   splits of L tokens for `base` CTA rows on `slots` resident CTAs: waves of
   at most `slots` CTAs; a wave of a CTAs takes one CTA's time (L / s + 512
   + 16 x heads: the fixed costs of q's fragments, the pipeline's fill, the
   combine of `heads` rows) where a <= half the slots (latency-bound: the
   CTAs do not share enough bandwidth to slow each other) and proportionally
   longer beyond (bandwidth-bound); plus a quarter of one CTA's time for the
   spread of CTA speeds under shared bandwidth (the last CTA ends late by a
   part of its own length, so long splits cost more than the wave count
   says). Constants fitted to oscar_tune's candidate curves on the H200 in
   session 34 (210 shapes of batch 1-256 x 4K-128K at ratio 4, 8, 16 with D
   128 and at D 64 and 256; those raw logs were lost with that session) and
   checked in session 35 on held-out shapes against the whole-wave model
   (bench/results/logs/session35_h200.txt): over the shapes whose plan
   changed, new / old time 0.972 at ratio 4, 0.976 at 8, 0.941 at 16, 0.951
   at D 256, 0.996 at D 64 (geometric means). It misses where fuller waves
   win: ratio 8 6 x 24K (6 splits +10% against 8) and 12 x 48K (7 +10%
   against 4), ratio 16 2 x 48K and 6 x 12K (+10-11%). */
OSCAR__PRIVATE double oscar__decode_split_cost(int64_t base, int64_t slots, int heads, int64_t L, int64_t s) {
    const double cta = OSCAR__CAST(double, (L + s - 1) / s) + 512.0 + 16.0 * heads, half = 0.5 * OSCAR__CAST(double, slots);
    double t = 0.25 * cta;
    int64_t left = base * s;
    while (left > 0) {
        const int64_t a = OSCAR__MIN(slots, left);
        t += cta * OSCAR__MAX(1.0, OSCAR__CAST(double, a) / half);
        left -= a;
    }
    return t;
}
/* Whether a grid of `ctas` INT2 CTAs fills at least 90% of two per SM (rule
   4's cap and the group-64 window rule, sessions 37-38). */
OSCAR__PRIVATE int oscar__decode_fills_two_per_sm(int64_t ctas, int64_t sms) { return 10 * ctas >= 18 * sms; }
/* Whether the small-batch rule's s splits are capped at s2 = two CTAs per SM
   (rule 4, sessions 37-38; the measurements above): at head dim 128 where the
   cap still fills 90% of two CTAs per SM, 8 heads per CTA with one group per
   row and f16 scales, or 4 heads (any group, either layout) from 20 groups
   where s gives 2.5 CTAs per SM or more, unless the cap would remove a single
   split of three or four. */
OSCAR__PRIVATE int oscar__decode_two_per_sm_cap(const oscar_decode_plan_info *pl, int heads, int64_t base, int64_t s,
                                               int64_t s2, int64_t sms) {
    if (pl->head_dim != 128 || s <= s2 || s2 < 1 || !oscar__decode_fills_two_per_sm(base * s2, sms)) return 0;
    if (heads == 8) return pl->group_size == 128 && pl->scale_layout == OSCAR_SCALE_LAYOUT_F16_SCALE_MIN;
    return heads == 4 && base >= 20 && 2 * base * s >= 5 * sms && !(s2 + 1 == s && (s == 3 || s == 4));
}
/* The most INT2 tokens one warp walks in a plan. Its PV sums live in the tensor cores' f32 accumulators
   for the whole walk, and each mma adds its 16 tokens' products to them with the accumulators' rounding;
   after a token that dominates a head, the later tokens' small products lose their low bits mma after mma.
   On the H200 (session 41, decode_gpu/dominant_tokens_over_long_warps, 128K tokens with a few whose logits
   stand out by up to ~50 log2 units, one split of 4 warps = 32K tokens a warp) o reached 5.1e-3 of float64
   with bf16 hi + lo PV weights and 6.3e-3 with v23's f16 weights, against <= 1.9e-3 with the plan's 76
   splits; the error grows with the tokens a warp sums. So the plan raises the INT2 split count (up to 128)
   until ceil(tokens / splits) / warps is at most this; a forced or tuned count below it is raised too.
   Over 1050 shapes (ratio 1-16, D 64-256, batch 1-512, contexts 4K-512K) it changes the heuristic's plan
   at 195: batch 512 x 64K, 256 and 512 x 128K, ratio 16 128 x 128K, ratio 8 16 x 128K (12 warps: 1 -> 2
   splits) and contexts of 256K and more; the bench's shapes and the shipped table's keep theirs. */
#define OSCAR__DECODE_WARP_TOKENS 8192
OSCAR__PRIVATE int32_t oscar__decode_int2_splits_for_precision(int64_t max_int2_tokens, int32_t splits, int32_t warps) {
    int64_t need;
    if (splits <= 0 || max_int2_tokens <= 0) return splits;
    need = (max_int2_tokens + OSCAR__CAST(int64_t, warps) * OSCAR__DECODE_WARP_TOKENS - 1) /
           (OSCAR__CAST(int64_t, warps) * OSCAR__DECODE_WARP_TOKENS);
    return OSCAR__CAST(int32_t, OSCAR__MAX(splits, OSCAR__MIN(need, 128)));
}

OSCAR__PRIVATE int32_t oscar__decode_int2_splits(oscar_ctx *ctx, const oscar_decode_plan_info *pl, int32_t ratio,
                                                 int64_t base, int64_t L) {
    int64_t slots = oscar__decode_int2_slots(ctx, pl, ratio, OSCAR__DECODE_WARPS), s, cap, best = 1;
    const int heads = oscar__int2_heads(ratio);
    double best_cost = 0;
    cap = OSCAR__MAX(1, OSCAR__MIN(128, (L + 255) / 256));
    s = OSCAR__CAST(int64_t, floor(1.565 * pow(OSCAR__CAST(double, L) / 1024.0, 0.8) + 0.5));
    s = OSCAR__MAX(1, OSCAR__MIN(cap, s));
    if (base * s <= slots) {
        const int64_t sms = oscar__decode_sms(ctx), s2 = 2 * sms / base;
        /* 16 heads per CTA: at most one CTA per SM (session 36) */
        if (heads == 16) s = OSCAR__MIN(s, OSCAR__MAX(1, sms / base));
        if (oscar__decode_two_per_sm_cap(pl, heads, base, s, s2, sms)) s = s2;
        return OSCAR__CAST(int32_t, s);
    }
    for (s = 1; s <= cap; s++) {
        const double cost = oscar__decode_split_cost(base, slots, heads, L, s);
        if (s == 1 || cost < best_cost) best = s, best_cost = cost;
    }
    return OSCAR__CAST(int32_t, best);
}

/* The split count of one-CTA-per-SM INT2 CTAs (16 or 12 warps,
   oscar__decode_int2_wide): one wave of them (one per SM where the occupancy
   cannot be asked), each split at least 256 tokens, <= 128. */
OSCAR__PRIVATE int32_t oscar__decode_int2_wide_splits_in(int64_t slots, int64_t base, int64_t L) {
    return OSCAR__CAST(int32_t, OSCAR__MAX(1, OSCAR__MIN(OSCAR__MIN(128, (L + 255) / 256), slots / base)));
}
OSCAR__PRIVATE int32_t oscar__decode_int2_wide_splits(oscar_ctx *ctx, const oscar_decode_plan_info *pl, int32_t ratio,
                                                      int64_t base, int64_t L) {
    return oscar__decode_int2_wide_splits_in(oscar__decode_int2_slots(ctx, pl, ratio, oscar__decode_int2_wide(ratio)),
                                             base, L);
}
/* The split count of 16-warp INT2 CTAs on at most three quarters of the
   SMs (`slots` one-per-SM places), or 0 (session 36): where the full-wave
   rule above declines, at 4 query heads per KV head or fewer, at head dim 64
   for any batch and at head dim 128 for at most 8 groups (batch x KV heads),
   as many splits as fit on 3/4 of the slots while each keeps 1536 to 12288
   tokens. The window tier then runs on the SMs left free beside them (its
   split count by the general rule, oscar_decode_plan). At D 64 a 4-warp CTA
   is bound by its per-token work (softmax, scales, the logits' assembly) on
   half the bytes of D 128, so the CTAs that keep an SM busy are wide ones,
   and the window CTAs finish beside them instead of after them. Fitted on
   session 35's candidate curves (bench/results/logs/session35_tune_curves.txt:
   D 64 4 x 8K wide 2 splits -11% against the best 4-warp plan, 6 x 12K -11%,
   8 x 4K -8%; splits of 24K tokens or more lose: 6 x 48K +2%, 12 x 24K +5%, 8 x
   32K with one split +28%) and checked on held-out shapes against the
   previous heuristic, both plans timed in one process (scripts/
   ab_decode_plans.sh; bench/results/logs/session36_h200.txt), new / old,
   geometric means: D 64 batch 2-10 0.86 (32 / 8 heads, 14 shapes; 2 x 20K
   23.5 -> 17.0 us, 3 x 10K 23.5 -> 18.1), 16 / 8 heads 0.85 (6), 16 / 4 heads
   0.81 (5); D 64 batch 1 0.90 (9 shapes; 1 x 48K 26.7 -> 17.1 us), 16 / 4 heads
   batch 1-2 0.99 (4); D 128 at
   <= 8 groups 0.96 (11 shapes at batch 1, -12% to +2%; 16 / 4 heads at batch
   1-2 0.95). Not at D 128 from 16 groups up: 32 / 8 heads batch 2-12, 16
   shapes, +3% (2 x 5K-20K +4-6%, 7 x 10K +25%). */
/* The most one-per-SM INT2 CTAs that leave the window tier room: 3/4 of the places */
OSCAR__PRIVATE int64_t oscar__decode_int2_wide_partial_ctas(int64_t slots) { return 3 * slots / 4; }
OSCAR__PRIVATE int64_t oscar__decode_int2_wide_partial(const oscar_decode_plan_info *pl, int64_t slots, int64_t base,
                                                       int64_t L) {
    int64_t s = oscar__decode_int2_wide_partial_ctas(slots) / OSCAR__MAX(base, 1);
    if (oscar__int2_heads(pl->num_q_heads / pl->num_kv_heads) != 4 || s < 1 ||
        !(pl->head_dim == 64 || (pl->head_dim == 128 && base <= 8)))
        return 0;
    s = OSCAR__MIN(s, 128);
    while (s > 1 && L < 1536 * s) s--;
    return L >= 1536 * s && L <= 12288 * s ? s : 0;
}
/* Warps per INT2 CTA, and with the one-CTA-per-SM form (16 warps at ratio
   <= 4, 12 at 5-8: oscar__decode_int2_wide) its split count (*splits). That
   form where its kernel exists for the geometry (oscar__decode_int2_warps_exist)
   and one wave of it (one CTA per SM; s = resident CTAs / (batch x KV heads)
   splits)
   - fills at least 90% of its slots (batch 6 x 8 KV heads: 2 splits, 96 of
     132 SMs -- 6 x 64K 88 against 80 us with 4 warps, 6 x 128K 159 / 138),
   - gives each split at least 5120 tokens (10 tiles per warp),
   - and gives each split at least as many tokens as the whole window tier
     has (batch x KV heads x max_window_tokens): the window CTAs, with one
     split per group in that case (oscar_decode_plan), run on the few SMs
     the 16-warp grid leaves (4 on the H200: a 16-warp CTA's registers fill
     its SM), and only hide behind INT2 splits that long.
   Else 4.
   Session 27 on the H200 (graph replay; bench/results/logs/session27_h200.txt
   sections 1-2), 16 warps with 1 window split against the 4-warp plan:
   4 x 64K 55.6-55.7 against 58.6-59.0 us, 8 x 64K 96.4 / 99.5, 8 x 128K
   169.9 / 182.6, 4 x 128K 95.2 / 98.1, 3 x 128K 76.8 / 78.3, 4 x 64K at D 64
   38.5 / 44.5; where the window tier outweighs a split they lose: 8 x 32K
   65.6 / 60.4 (window 20480 tokens against 16384 per split), 4 x 32K 45.4 /
   43.4 (10240 / 8192), 2 x 32K 35.9 / 31.6. Session 25's rule (the 4-warp
   count >= 32 and 5120 tokens per split; bench/results/logs/session25_h200.txt)
   chose the same where both apply, e.g. 1 x 128K (16 splits against 64: 34.9
   against 36.1-36.5 us), 1 x 256K, 2 x 128K, 2 x 64K, 1 x 96K, 1 x 128K at
   D 64; at 1 x 64K (4096 tokens per split) the two warp counts tie. 12
   warps at ratio 8 (section 7, against the 4-warp plan): 1 x 128K 47.3 ->
   44.9 us, 4 x 128K 133.2 -> 128.5, 16 x 128K 461.2 -> 446.0, 1 x 128K at
   D 64 34.7 -> 32.7. */
OSCAR__PRIVATE int32_t oscar__decode_int2_warps(oscar_ctx *ctx, const oscar_decode_plan_info *pl, int32_t ratio,
                                                int64_t base, int64_t L, int64_t max_win, int32_t s4,
                                                int32_t *splits) {
    const int wide = oscar__decode_int2_wide(ratio);
    int64_t slots, s;
    *splits = s4;
    if (!oscar__decode_int2_warps_exist(pl->head_dim, pl->group_size, ratio, wide, oscar__ctx_smem_limit(ctx)))
        return OSCAR__DECODE_WARPS;
    slots = oscar__decode_int2_slots(ctx, pl, ratio, wide); /* one occupancy probe for both uses */
    s = oscar__decode_int2_wide_splits_in(slots, base, L);
    if (base > slots || 10 * base * s < 9 * slots || L < 5120 * s || (pl->has_window && base * max_win * s > L)) {
        s = oscar__decode_int2_wide_partial(pl, slots, base, L);
        if (s == 0) return OSCAR__DECODE_WARPS;
    }
    *splits = OSCAR__CAST(int32_t, s);
    return wide;
}

/* Window splits that keep a window CTA no longer than an INT2 CTA (4
   warps): the window tier's bytes per request and KV head (max_win tokens of
   bf16 K and V, 4 D bytes a token) over 0.7 x one INT2 split's (tokens x
   (D / 2 code bytes + K and V scales of D / group groups)), rounded up; at
   least 1. A window split costs a CTA's fixed work and a partial state the
   merge reads, which only pays where the window CTAs would otherwise end
   after the INT2 grid. At 320 window tokens and D 128 that is 2 splits below
   about 1600 INT2 tokens per split, else 1. Fitted on the H200 (session 34)
   and measured again in session 35 (oscar_tune's candidate curves, the
   fastest INT2 plan with 1 window split against 2; bench/results/logs/
   session35_h200.txt): 1 ran faster at ratio 8 8 x 8K (-15%), 32 x 4K
   (-10%), ratio 16 64 x 4K (-10%), ratio 4 6 x 12K (-8%), 32 x 8K (-3 to
   -6%); 2 beside short INT2 splits (ratio 4 4 x 8K, 8 splits: +1-2% with
   1; D 64 8 x 8K, 8 splits: +7-8%). Missed: D 64 12 x 12K (4 splits of
   2992 tokens: 1 window split, +8% against 2).
   At 8 query heads per INT2 CTA (ratio 5-8) and D 128, 1 wherever the INT2
   grid has at least one CTA per SM (session 36). From session 35's curves,
   each INT2 split count against itself, 1 window split against 2: 8 x 4K
   (256 INT2 CTAs) -17%, 4 x 8K -16%, 8 x 8K -15%, 2 x 12K and 2 x 24K -9 to
   -10%: the 8-head window CTA costs more per token than the 4-head one, and
   the INT2 grid, 3 CTAs per SM, leaves less room beside it. Held out (scripts/
   ab_decode_plans.sh, bench/results/logs/session36_h200.txt), new / old:
   64 / 8 heads 0.94 (7 x 5K 37.0 -> 29.9 us, 2 x 20K 35.0 -> 30.4), 32 / 4
   heads 0.91, 48 / 8 heads 0.90, 4 x 12K 37.0 -> 31.3. Below one INT2 CTA per
   SM the spare SMs take the second window split: 32 / 4 heads 2 x 6K (48 INT2
   CTAs) +9% with 1, 4 x 6K (96) +5%, 64 / 8 heads 2 x 5K (80) +2%. Not at D
   64: 64 / 8 heads at D 64 ran +4 to +9% with 1 (5 shapes).
   At 4 query heads per INT2 CTA (ratio <= 4), D 128 and groups of 64, 1
   where the INT2 grid has at least 1.8 CTAs per SM (90% of two; session 38,
   bench/results/logs/session38_h200.txt calls 4-8): 16 / 4 heads 16 x 6K,
   4 + 2 -> 4 + 1, 34.7 -> 28.1 us, 32 / 8 heads 4 x 11.5K 8 + 2 -> 8 + 1
   32.4 -> 27.5 (6 of 6 such shapes 13-19% faster in call 4); held out
   (call 8, 38 shapes at 1-8 KV heads, f16 and f32): 0.948, 6 slower (worst
   +1.6%), 12 / 3 heads 14 x 8K 28.5 -> 25.7 us. The same from one CTA per
   SM at every group measured 0.968 over 45 shapes (call 5) but 0.995 over 54
   held out (call 6; group 128 from two CTAs per SM ~0.985): not taken; groups
   of 32 were not measured enough. */
OSCAR__PRIVATE int64_t oscar__decode_window_balance(const oscar_decode_plan_info *pl, int64_t L, int64_t max_win,
                                                    int64_t sms) {
    double scale, int2_bytes, per_split;
    const int heads = oscar__int2_heads(pl->num_q_heads / pl->num_kv_heads);
    const int64_t ctas = OSCAR__CAST(int64_t, pl->batch_size) * pl->num_kv_heads * pl->int2_splits;
    if (pl->head_dim == 128 &&
        ((heads == 8 && ctas >= sms) || (heads == 4 && pl->group_size == 64 && oscar__decode_fills_two_per_sm(ctas, sms))))
        return 1;
    scale = OSCAR__CAST(double, oscar__scale_pair_bytes(pl->scale_layout));
    int2_bytes = 0.5 * pl->head_dim + 2.0 * scale * (pl->head_dim / pl->group_size);
    per_split = OSCAR__CAST(double, (L + pl->int2_splits - 1) / pl->int2_splits);
    return OSCAR__MAX(1, OSCAR__CAST(int64_t, ceil(0.7 * OSCAR__CAST(double, max_win) * 4.0 * pl->head_dim / int2_bytes / per_split)));
}

OSCAR_API oscar_status oscar_decode_plan(oscar_ctx *ctx, const oscar_decode_plan_desc *desc,
                                         oscar_decode_plan_info *out) {
    oscar__validator v;
    oscar_int2_pool_desc pool, geo;
    oscar_window_pool_desc win;
    oscar_decode_plan_info pl;
    oscar_status st;
    int64_t base, target, max_win;
    size_t splits_total, B, Hq, D;
    int ratio = 0, i;

    OSCAR__REQUIRE_CTX(ctx, "oscar_decode_plan");
    if (!desc || !out) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_decode_plan: desc and out must be non-NULL");
    if (!desc->int2_pool)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_decode_plan: desc.int2_pool = NULL (*must* be set)");
    pool = oscar__pool_defaults(desc->int2_pool);
    memset(&win, 0, sizeof win);
    oscar__validate_begin(&v, ctx, "oscar_decode_plan");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    /* geometry only: the arrays are the run's */
    geo = pool;
    geo.k_codes = geo.v_codes = geo.k_scales = geo.v_scales = OSCAR__RCAST(void *, OSCAR__CAST(uintptr_t, 256));
    oscar__pool_validate(&v, &geo, "desc.int2_pool");
    if (pool.num_kv_heads > 0) ratio = desc->num_q_heads / pool.num_kv_heads;
    OSCAR__VALIDATE(&v,
                    pool.num_kv_heads > 0 && desc->num_q_heads >= 1 && desc->num_q_heads % pool.num_kv_heads == 0 &&
                        ratio >= 1 && ratio <= 16,
                    "desc.num_q_heads = %d with %d kv heads; expected a multiple with ratio 1..16", desc->num_q_heads,
                    pool.num_kv_heads);
    OSCAR__VALIDATE(&v, desc->batch_size >= 1 && desc->batch_size <= 65535, "desc.batch_size = %d; expected 1..65535",
                    desc->batch_size);
    OSCAR__VALIDATE(&v, desc->max_int2_tokens >= 0 && desc->max_int2_tokens < (OSCAR__CAST(int64_t, 1) << 31),
                    "desc.max_int2_tokens = %lld; expected 0 <= n < 2^31", OSCAR__CAST(long long, desc->max_int2_tokens));
    OSCAR__VALIDATE(&v, desc->max_window_tokens >= 0, "desc.max_window_tokens = %d; expected >= 0", desc->max_window_tokens);
    OSCAR__VALIDATE(&v, desc->int2_splits >= 0 && desc->int2_splits <= 128 && desc->window_splits >= 0 &&
                            desc->window_splits <= 128,
                    "desc.int2_splits = %d, window_splits = %d; expected 0 (automatic) .. 128", desc->int2_splits,
                    desc->window_splits);
    OSCAR__VALIDATE(&v,
                    desc->int2_warps == 0 || desc->int2_warps == OSCAR__DECODE_WARPS ||
                        desc->int2_warps == OSCAR__DECODE_INT2_WIDE8 || desc->int2_warps == OSCAR__DECODE_INT2_WIDE,
                    "desc.int2_warps = %d; expected 0 (automatic), %d, %d or %d", desc->int2_warps, OSCAR__DECODE_WARPS,
                    OSCAR__DECODE_INT2_WIDE8, OSCAR__DECODE_INT2_WIDE);
    OSCAR__VALIDATE(&v, desc->requests_per_cta >= 0 && (ratio < 1 || desc->requests_per_cta * ratio <= OSCAR_K_PREP_ROWS),
                    "desc.requests_per_cta = %d with %d query heads per KV head; expected 0 (automatic) or at most "
                    "%d rows per CTA (requests x heads per KV head)",
                    desc->requests_per_cta, ratio, OSCAR_K_PREP_ROWS);
    if (desc->window_pool) {
        win = oscar__window_defaults(desc->window_pool, pool.num_kv_heads, pool.head_dim);
        oscar__window_validate(&v, &win, "desc.window_pool", 0);
    }
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;
    if (desc->int2_warps > OSCAR__DECODE_WARPS &&
        !oscar__decode_int2_warps_exist(pool.head_dim, pool.group_size, ratio, desc->int2_warps,
                                        oscar__ctx_smem_limit(ctx)))
        return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED,
                           "oscar_decode_plan: desc.int2_warps = %d needs %s query heads per KV head (have %d), "
                           "head_dim <= 128 (have %d)%s and %u bytes of shared memory per block (this device allows %lld)",
                           desc->int2_warps, desc->int2_warps == OSCAR__DECODE_INT2_WIDE ? "at most 4" : "5 to 8", ratio,
                           pool.head_dim,
                           desc->int2_warps == OSCAR__DECODE_INT2_WIDE8 ? ", group_size >= 64 at head_dim 128" : "",
                           oscar__decode_int2_smem(pool.head_dim, pool.group_size, ratio, desc->int2_warps),
                           OSCAR__CAST(long long, oscar__ctx_smem_limit(ctx)));

    memset(&pl, 0, sizeof pl);
    pl.magic = OSCAR__PLAN_MAGIC;
    pl.batch_size = desc->batch_size;
    pl.num_q_heads = desc->num_q_heads;
    pl.num_kv_heads = pool.num_kv_heads;
    pl.head_dim = pool.head_dim;
    pl.group_size = pool.group_size;
    pl.page_size = pool.page_size;
    pl.scale_layout = pool.scale_layout;
    pl.has_window = desc->window_pool != NULL;
    pl.window_page_size = pl.has_window ? win.page_size : 1;
    pl.window_dtype = pl.has_window ? OSCAR__CAST(int32_t, win.dtype) : OSCAR_DTYPE_BF16;
    /* splits: INT2 by the heuristics above, windows below */
    base = OSCAR__CAST(int64_t, desc->batch_size) * pool.num_kv_heads;
    target = 4 * oscar__decode_sms(ctx);
    max_win = desc->max_window_tokens ? desc->max_window_tokens : 512;
    /* INT2 warps per CTA and splits: forced, or by the heuristics above */
    pl.int2_warps = desc->int2_warps ? desc->int2_warps : OSCAR__DECODE_WARPS;
    if (desc->max_int2_tokens == 0)
        pl.int2_splits = 0; /* no INT2 tier (e.g. the BF16 baseline) */
    else if (desc->int2_splits)
        pl.int2_splits = desc->int2_splits;
    else if (desc->int2_warps > OSCAR__DECODE_WARPS)
        pl.int2_splits = oscar__decode_int2_wide_splits(ctx, &pl, ratio, base, desc->max_int2_tokens);
    else {
        const int32_t s4 = oscar__decode_int2_splits(ctx, &pl, ratio, base, desc->max_int2_tokens);
        if (desc->int2_warps == OSCAR__DECODE_WARPS)
            pl.int2_splits = s4;
        else
            pl.int2_warps =
                oscar__decode_int2_warps(ctx, &pl, ratio, base, desc->max_int2_tokens, max_win, s4, &pl.int2_splits);
    }
    /* window splits: given, 1 where the plan chose 16-warp INT2 CTAs that
       fill more than three quarters of the SMs (their window CTAs share the
       few SMs the INT2 grid leaves, so fewer of them end sooner: 2 x 64K
       42.3 -> 37.5 us, 4 x 64K 63.2 -> 55.7, 8 x 64K 102.6 -> 96.4; equal from
       128K up; session 27; oscar__decode_int2_wide_partial's CTAs leave a
       quarter free, and there 2 window splits ran as fast as 1 or faster at
       D 64: 6 x 6K -4%, 4 x 4K -7%, 4 x 8K +1%), else about four CTAs
       per SM in all, each taking at least 256 tokens, and beside 4-warp INT2
       CTAs no more than oscar__decode_window_balance allows */
    if (!pl.has_window)
        pl.window_splits = 0;
    else if (desc->window_splits)
        pl.window_splits = desc->window_splits;
    else if (pl.int2_warps > OSCAR__DECODE_WARPS && desc->int2_warps == 0 && pl.int2_splits > 0 &&
             base * pl.int2_splits > oscar__decode_int2_wide_partial_ctas(oscar__decode_sms(ctx)))
        pl.window_splits = 1;
    else {
        int64_t w = OSCAR__MAX(1, OSCAR__MIN(OSCAR__MIN((target + base - 1) / base, 128), (max_win + 255) / 256));
        if (pl.int2_warps == OSCAR__DECODE_WARPS && pl.int2_splits > 0)
            w = OSCAR__MIN(w, oscar__decode_window_balance(&pl, desc->max_int2_tokens, max_win, oscar__decode_sms(ctx)));
        pl.window_splits = OSCAR__CAST(int32_t, w);
    }
    pl.requests_per_cta = desc->requests_per_cta;
    /* >>tune hook (tune/oscar_tune.h): splits and requests per CTA the desc left at 0 come from the tuning table
       when it has this shape */
    oscar__tune_decode_apply(ctx, desc, &pl);
    /* whatever chose them (the heuristic, the table or the desc), no INT2 warp walks more than
       OSCAR__DECODE_WARP_TOKENS tokens: see there */
    pl.int2_splits = oscar__decode_int2_splits_for_precision(desc->max_int2_tokens, pl.int2_splits, pl.int2_warps);
    if (pl.requests_per_cta == 0) pl.requests_per_cta = oscar__decode_requests_heuristic(ctx, &pl);
    pl.min_chunk = 0;
    B = OSCAR__CAST(size_t, pl.batch_size), Hq = OSCAR__CAST(size_t, pl.num_q_heads), D = OSCAR__CAST(size_t, pl.head_dim);
    splits_total = OSCAR__CAST(size_t, pl.int2_splits + pl.window_splits);
    pl.ws_q_offset = 0;
    {
        /* INT2 q' digit fragments [b][kvh][NT n-tiles][D/32 k-steps][lane] 8 B, then group
           sums and scales [b][kvh][HEADS][G + 1] f32 (the layout of q_workspace in decode.cuh;
           NT = HEADS / 2 with four digits at 4 heads, 3 HEADS / 8 with three at 8 and 16: q_digits) */
        size_t heads = OSCAR__CAST(size_t, oscar__int2_heads(ratio)), Hkv = OSCAR__CAST(size_t, pl.num_kv_heads);
        size_t G = OSCAR__CAST(size_t, pl.head_dim / pl.group_size);
        size_t nt = heads == 4 ? 2 : 3 * heads / 8;
        size_t q_bytes = B * Hkv * nt * (D / 32) * 32 * 8 + B * Hkv * heads * (G + 1) * 4;
        pl.ws_o_offset = oscar__align256(q_bytes);
    }
    pl.ws_lse_offset = pl.ws_o_offset + oscar__align256(B * Hq * splits_total * D * 4);
    /* then the split counters u32 [b][kvh] (split_counters in decode.cuh: right after the lse, 256-aligned) */
    pl.workspace_bytes = pl.ws_lse_offset + oscar__align256(B * Hq * splits_total * 4) +
                         oscar__align256(B * OSCAR__CAST(size_t, pl.num_kv_heads) * 4);
    if (ctx->backend == OSCAR_BACKEND_CPU) pl.workspace_bytes = 0; /* the C reference needs none */
    pl.smem_int2 = oscar__decode_int2_smem(pl.head_dim, pl.group_size, ratio, pl.int2_warps);
    pl.smem_window = oscar__decode_window_smem(pl.head_dim, ratio, oscar__decode_window_warps(ctx, &pl));
    if (ctx->backend == OSCAR_BACKEND_CUDA) {
        if (!ctx->compile_only && OSCAR__CAST(int32_t, OSCAR__MAX(pl.smem_int2, pl.smem_window)) > ctx->max_smem_optin)
            return oscar__fail(ctx, OSCAR_STATUS_UNSUPPORTED,
                               "oscar_decode_plan: head_dim %d, group_size %d need %u bytes of shared memory per "
                               "block; this device allows %d",
                               pl.head_dim, pl.group_size, OSCAR__MAX(pl.smem_int2, pl.smem_window), ctx->max_smem_optin);
        for (i = 0; i < 4; i++) {
            char name[192];
            oscar__kernel *k = NULL;
            if ((i == 1 && !pl.has_window) || ((i == 0 || i == 2) && pl.int2_splits == 0)) continue;
            if (i == 3 && !oscar__decode_merge_per_head(ctx, &pl))
                oscar__name_decode_merge(name, sizeof name, pl.head_dim, oscar__decode_merge_rows(ctx, &pl),
                                         oscar__decode_merge_dim_split(ctx, &pl));
            else if (i == 1)
                oscar__name_decode_window(name, sizeof name, pl.head_dim, ratio, pl.window_dtype,
                                          oscar__decode_window_warps(ctx, &pl));
            else if (i == 2)
                oscar__name_decode_int2(name, sizeof name, pl.head_dim, pl.group_size, pl.page_size, ratio,
                                        OSCAR__CAST(int, pl.scale_layout), pl.int2_warps);
            else
                oscar__name_decode(name, sizeof name, i == 3 ? 4 : i, pl.head_dim, pl.group_size, pl.page_size, ratio,
                                   OSCAR__CAST(int, pl.scale_layout));
            st = oscar__jit_get(ctx, "decode.cuh", name, &k);
            if (st != OSCAR_OK) return st;
            pl.kernels[i] = k;
        }
    }
    *out = pl;
    return OSCAR_OK;
}

OSCAR__PRIVATE int32_t oscar__k_dtype(oscar_dtype t) {
    return t == OSCAR_DTYPE_F16 ? OSCAR_K_DTYPE_F16 : t == OSCAR_DTYPE_F32 ? OSCAR_K_DTYPE_F32 : OSCAR_K_DTYPE_BF16;
}

OSCAR_API oscar_status oscar_decode_run(oscar_ctx *ctx, const oscar_decode_plan_info *plan,
                                        const oscar_decode_run_desc *desc, oscar_stream stream) {
    oscar__validator v;
    oscar_int2_pool_desc pool;
    oscar_window_pool_desc win;
    oscar_decode_run_desc d;
    oscar_decode_params p;
    oscar_status st;
    unsigned B, Hkv, nb;

    OSCAR__REQUIRE_CTX(ctx, "oscar_decode_run");
    if (!plan || !desc) return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_decode_run: plan and desc must be non-NULL");
    if (plan->magic != OSCAR__PLAN_MAGIC)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT,
                           "oscar_decode_run: plan.magic = 0x%08x; expected a plan made by oscar_decode_plan", plan->magic);
    if (!desc->int2_pool)
        return oscar__fail(ctx, OSCAR_STATUS_INVALID_ARGUMENT, "oscar_decode_run: desc.int2_pool = NULL (*must* be set)");
    d = *desc;
    d.q_dtype = oscar__def(d.q_dtype, OSCAR_DTYPE_BF16);
    d.o_dtype = oscar__def(d.o_dtype, OSCAR_DTYPE_BF16);
    d.lse_base = oscar__def(d.lse_base, OSCAR_LSE_BASE_E);
    d.q_head_stride = oscar__def(d.q_head_stride, plan->head_dim);
    d.q_batch_stride = oscar__def(d.q_batch_stride, OSCAR__CAST(int64_t, plan->num_q_heads) * plan->head_dim);
    d.o_head_stride = oscar__def(d.o_head_stride, plan->head_dim);
    d.o_batch_stride = oscar__def(d.o_batch_stride, OSCAR__CAST(int64_t, plan->num_q_heads) * plan->head_dim);
    pool = oscar__pool_defaults(d.int2_pool);
    memset(&win, 0, sizeof win);

    oscar__validate_begin(&v, ctx, "oscar_decode_run");
    OSCAR__CHECK_CANARIES(&v, desc, "desc");
    oscar__pool_validate(&v, &pool, "desc.int2_pool");
    OSCAR__VALIDATE(&v,
                    pool.head_dim == plan->head_dim && pool.num_kv_heads == plan->num_kv_heads &&
                        pool.group_size == plan->group_size && pool.page_size == plan->page_size &&
                        pool.scale_layout == plan->scale_layout,
                    "desc.int2_pool geometry (head_dim %d, kv heads %d, group %d, page %d, scale layout %d) differs "
                    "from the plan's (%d, %d, %d, %d, %d)",
                    pool.head_dim, pool.num_kv_heads, pool.group_size, pool.page_size, OSCAR__CAST(int, pool.scale_layout),
                    plan->head_dim, plan->num_kv_heads, plan->group_size, plan->page_size,
                    OSCAR__CAST(int, plan->scale_layout));
    OSCAR__VALIDATE(&v, d.int2_pages.indptr && d.int2_pages.indices && d.int2_pages.last_page_len,
                    "desc.int2_pages: indptr, indices and last_page_len *must* be set");
    if (plan->has_window) {
        OSCAR__VALIDATE(&v, d.window_pool != NULL, "desc.window_pool = NULL but the plan has a window tier");
        if (d.window_pool) {
            win = oscar__window_defaults(d.window_pool, plan->num_kv_heads, plan->head_dim);
            oscar__window_validate(&v, &win, "desc.window_pool", 1);
            OSCAR__VALIDATE(&v, win.page_size == plan->window_page_size && OSCAR__CAST(int32_t, win.dtype) == plan->window_dtype,
                            "desc.window_pool page size %d / dtype %s differ from the plan's %d / %s", win.page_size,
                            oscar__dtype_name(win.dtype), plan->window_page_size,
                            oscar__dtype_name(OSCAR__CAST(oscar_dtype, plan->window_dtype)));
        }
        OSCAR__VALIDATE(&v, d.window_pages.indptr && d.window_pages.indices && d.window_pages.last_page_len,
                        "desc.window_pages: indptr, indices and last_page_len *must* be set");
    }
    OSCAR__VALIDATE(&v, d.q && d.o, "desc.q = %p, desc.o = %p; both *must* be set", d.q, d.o);
    OSCAR__VALIDATE(&v, oscar__is_half_dtype(d.q_dtype) && oscar__is_half_dtype(d.o_dtype),
                    "desc.q_dtype = %s, o_dtype = %s; expected bf16 or f16", oscar__dtype_name(d.q_dtype),
                    oscar__dtype_name(d.o_dtype));
    OSCAR__VALIDATE(&v, d.lse_base > 0 && d.lse_base < OSCAR__LSE_BASE_COUNT, "desc.lse_base = %d; expected E or 2",
                    OSCAR__CAST(int, d.lse_base));
    OSCAR__VALIDATE(&v, d.sm_scale > 0.0f && d.sm_scale < 1e30f, "desc.sm_scale = %g; expected > 0 (*must* be set)",
                    OSCAR__CAST(double, d.sm_scale));
    OSCAR__VALIDATE(&v, d.logit_cap >= 0.0f, "desc.logit_cap = %g; expected >= 0", OSCAR__CAST(double, d.logit_cap));
    OSCAR__VALIDATE(&v,
                    plan->workspace_bytes == 0 || (d.workspace && d.workspace_bytes >= plan->workspace_bytes &&
                                                   OSCAR__RCAST(uintptr_t, d.workspace) % 256 == 0),
                    "desc.workspace = %p (%zu bytes); expected a 256-byte aligned buffer of plan.workspace_bytes = %zu",
                    d.workspace, d.workspace_bytes, plan->workspace_bytes);
    OSCAR__VALIDATE(&v,
                    (OSCAR__RCAST(uintptr_t, d.k_rotation) | OSCAR__RCAST(uintptr_t, d.v_rotation)) % 16 == 0,
                    "desc.k_rotation = %p, v_rotation = %p; expected 16-byte aligned", OSCAR__CAST(const void *, d.k_rotation),
                    OSCAR__CAST(const void *, d.v_rotation));
    st = oscar__validate_end(&v);
    if (st != OSCAR_OK) return st;

    memset(&p, 0, sizeof p);
    p.pool = oscar__pool_params(&pool);
    p.int2_indptr = OSCAR__RCAST(uint64_t, d.int2_pages.indptr);
    p.int2_indices = OSCAR__RCAST(uint64_t, d.int2_pages.indices);
    p.int2_last_page_len = OSCAR__RCAST(uint64_t, d.int2_pages.last_page_len);
    if (plan->has_window) {
        p.win_k = OSCAR__RCAST(uint64_t, win.k);
        p.win_v = OSCAR__RCAST(uint64_t, win.v);
        p.win_page_stride = win.page_stride;
        p.win_token_stride = win.token_stride;
        p.win_head_stride = win.head_stride;
        p.win_indptr = OSCAR__RCAST(uint64_t, d.window_pages.indptr);
        p.win_indices = OSCAR__RCAST(uint64_t, d.window_pages.indices);
        p.win_last_page_len = OSCAR__RCAST(uint64_t, d.window_pages.last_page_len);
        p.win_num_pages = win.num_pages;
    }
    p.win_page_size = plan->window_page_size;
    p.q = OSCAR__RCAST(uint64_t, d.q);
    p.o = OSCAR__RCAST(uint64_t, d.o);
    p.lse = OSCAR__RCAST(uint64_t, d.lse);
    p.q_batch_stride = d.q_batch_stride, p.q_head_stride = d.q_head_stride;
    p.o_batch_stride = d.o_batch_stride, p.o_head_stride = d.o_head_stride;
    p.rot_k = OSCAR__RCAST(uint64_t, d.k_rotation);
    p.rot_v = OSCAR__RCAST(uint64_t, d.v_rotation);
    p.ws_q = OSCAR__RCAST(uint64_t, d.workspace) + plan->ws_q_offset;
    p.ws_o = OSCAR__RCAST(uint64_t, d.workspace) + plan->ws_o_offset;
    p.ws_lse = OSCAR__RCAST(uint64_t, d.workspace) + plan->ws_lse_offset;
    p.sm_scale = d.sm_scale;
    p.logit_cap = d.logit_cap;
    p.batch_size = plan->batch_size;
    p.num_q_heads = plan->num_q_heads;
    p.group_ratio = plan->num_q_heads / plan->num_kv_heads;
    p.int2_splits = plan->int2_splits;
    p.win_splits = plan->window_splits;
    p.q_dtype = oscar__k_dtype(d.q_dtype);
    p.o_dtype = oscar__k_dtype(d.o_dtype);
    p.kv_dtype = oscar__k_dtype(OSCAR__CAST(oscar_dtype, plan->window_dtype));
    p.lse_base = d.lse_base == OSCAR_LSE_BASE_2 ? 2 : 1;
    p.min_chunk = plan->min_chunk;
    p.prep_requests = p.merge_requests = oscar__decode_requests_per_cta(ctx, plan);

    if (ctx->backend == OSCAR_BACKEND_CPU) {
        if (oscar__cpu_decode(&p, plan->head_dim, plan->group_size) != 0)
            return oscar__fail(ctx, OSCAR_STATUS_OUT_OF_MEMORY, "oscar_decode_run: out of host memory");
        return OSCAR_OK;
    }
    B = OSCAR__CAST(unsigned, plan->batch_size), Hkv = OSCAR__CAST(unsigned, plan->num_kv_heads);
    /* The first kernel of the step follows the engine's work normally; the
       others start early (programmatic dependent launch) and wait inside for
       their inputs. The window kernel goes after the INT2 one: it reads only
       inputs, so its CTAs fill the SMs the INT2 tail leaves idle and wait
       only to write. Without an INT2 tier (e.g. the BF16 baseline) there is
       no q' to prepare: prep is not launched (v2-v8 ran it anyway, ~5-15 us
       for nothing) and the window kernel goes first. */
    /* prep and the per-KV-head merge: nb requests of a KV head per CTA */
    nb = OSCAR__CAST(unsigned, p.prep_requests);
    st = OSCAR_OK;
    if (plan->int2_splits > 0) {
        st = oscar__launch_ex(ctx, OSCAR__CAST(oscar__kernel *, plan->kernels[0]), (B + nb - 1) / nb, Hkv, 1, 256,
                              OSCAR__CAST(unsigned, oscar__decode_prep_smem(plan->head_dim)), stream, &p, 0);
        if (st == OSCAR_OK)
            st = oscar__launch_ex(ctx, OSCAR__CAST(oscar__kernel *, plan->kernels[2]),
                                  OSCAR__CAST(unsigned, plan->int2_splits), Hkv, B,
                                  32 * OSCAR__CAST(unsigned, plan->int2_warps), plan->smem_int2, stream, &p, 1);
    }
    if (st == OSCAR_OK && plan->has_window)
        st = oscar__launch_ex(ctx, OSCAR__CAST(oscar__kernel *, plan->kernels[1]),
                              OSCAR__CAST(unsigned, plan->window_splits), Hkv, B,
                              32 * OSCAR__CAST(unsigned, oscar__decode_window_warps(ctx, plan)), plan->smem_window,
                              stream, &p, plan->int2_splits > 0);
    if (st == OSCAR_OK) {
        const int pdl = plan->int2_splits > 0 || plan->has_window;
        if (oscar__decode_merge_per_head(ctx, plan))
            st = oscar__launch_ex(ctx, OSCAR__CAST(oscar__kernel *, plan->kernels[3]), B,
                                  OSCAR__CAST(unsigned, plan->num_q_heads), 1, 2 * OSCAR__CAST(unsigned, plan->head_dim), 0,
                                  stream, &p, pdl);
        else
            st = oscar__launch_ex(ctx, OSCAR__CAST(oscar__kernel *, plan->kernels[3]), (B + nb - 1) / nb, Hkv,
                                  OSCAR__CAST(unsigned, oscar__decode_merge_dim_split(ctx, plan)), 512, 0, stream, &p, pdl);
    }
    return st;
}

#endif /* OSCAR_DECODE_H_INCLUDED */
