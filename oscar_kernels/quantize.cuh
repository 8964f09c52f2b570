/* oscar_kernels/quantize.cuh -- the write path of OSCAR: rows of K and V ->
   rotate by the layer's R -> round to the source dtype -> clip -> INT2 codes
   and scales -> the engine's INT2 pool. Prefill (dense rows) and demotion
   (rows gathered from the engine's bf16 paged cache), every layer in one
   launch.

   in   src rows     [tokens][heads][HEAD_DIM] bf16|f16 through src slot ids,
                     page size and element strides (dense: slot = token)
        R_k, R_v     [HEAD_DIM][HEAD_DIM] f32 row-major per layer (0: none);
                     y = x @ R, as the reference (row-vector convention)
   out  codes        [slot][head][HEAD_DIM/4] u8, quartered packing
        scales       [slot][head][HEAD_DIM/GROUP_SIZE] x (f16 scale, f16 min)
                     or (f32 scale, f32 zero)

   Arithmetic (identical to cpu/oscar_cpu.h, so codes match bit for bit on
   the same rotated row):
     rotation  bf16 (f16 for f16 input) x and R on tensor cores (wgmma
               m64nDk16 on sm_90a for head dims 64 and 128, mma.sync
               m16n8k16 otherwise), f32 accumulation, result rounded to the source
               dtype -- the reference also stores the rotated row in bf16
               before quantizing;
     clip      tau = sorted(|y|)[clip_index] exactly (the reference's sort
               threshold): the m-th largest |y|, m = D - clip_index, found
               by a binary search over the 16-bit keys of |y|, each probe
               counting with 16-bit SIMD compares;
     uniform   per group: scale = max(max - min, 1e-8) / 3, zero = -min / scale,
               code = trunc(y / scale + zero + 0.5) clamped to [0, 3], with
               IEEE round-to-nearest division (no fast math);
     lloyd-max per row: mean, var in a fixed summation order (dims
               nt*8 + 2c + e summed per c in dim order, then (s0 + s1) +
               (s2 + s3)), std = sqrt(var + 1e-8),
               code = [z >= -0.98107] + [z >= 0] + [z >= 0.98107],
               scale = 1.16739 std, zero = 1.5 - mean / scale.

   How the codes are computed (v3). The code of a value is a monotone step
   function of it: each f32 operation of the formula rounds monotonically,
   so code(y) = [y >= t1] + [y >= t2] + [y >= t3], where t_k is the smallest
   source-dtype value whose formula result reaches level k. Per group the
   kernel finds t1..t3 exactly -- uniform: computed directly (q_direct_candidate:
   the smallest f32 quotient reaching the level, from the tie rules of the
   two rounded adds, then the dtype ceiling of an exact f64 midpoint times
   scale) and checked by the formula at the candidate and its predecessor;
   Lloyd-Max: an estimate and its neighbours; a search where the check
   fails -- and then codes whole pairs of values with three 16-bit SIMD compares and
   three LOP3s, instead of a division and a float->int conversion per value.
   The clip folds into the thresholds (a threshold outside (-tau, tau]
   becomes -inf or +inf) and into the group's min and max (clip of the min
   = min of the clipped values), so clipped values are never formed.

   Warpgroups (sm_90a, head dim <= 128). The 4 warps of a warpgroup share
   one slice of 4 x ROWS rows laid out as wgmma's K-major tiles (128-byte
   rows per 64-column block, 128-byte swizzle, rows permuted so that a warp's
   rows are the ones its accumulators hold and the bank pattern is the
   per-warp slice's), step together (a named barrier once the rows are in,
   and once per 64-row m-tile before y replaces x), and multiply by R^T
   staged K-major. Otherwise, per warp:
   Layout. A warp takes ROWS (16 or 32) rows per step; their 16-bit rows are
   copied to the warp's shared-memory slice with cp.async, a lane pair 32
   contiguous bytes of one row per copy (immediate offsets, one shuffle of
   the source offset per 16 rows). With a rotation,
   the warp loads its A fragments (x) into registers, multiplies by R (bf16
   in shared memory, one copy per CTA; every B fragment feeds ROWS/16
   m-tiles) and writes the rounded y over x in the same slice. Then each
   row goes to 32/ROWS lanes (one lane per row for ROWS = 32): the lane
   holds its part of the row as packed 16-bit pairs in registers, and the
   slice is refilled with the next step's rows while the lane computes.
   A lane owns whole output bytes (byte j of the quartered packing is made
   of columns j, j+D/4, j+D/2, j+3D/4), so it stores its codes as 8- or
   16-byte words, and per-group work is done by one lane (two for groups
   split between the two lanes of a row).

   16-bit compares. Signed compares of bf16 values use set.bf16x2 on sm_90;
   before sm_90 (no bf16 set) they use f16 compares of the bf16 bit
   patterns, which order the same way while |y| < 2^121 (bf16 values that
   large do not occur in KV caches). The clip's counts compare |y| as f16
   patterns (one instruction per pair: abs folds into the compare) and fall
   back to an exact integer compare for rows whose max |y| >= 2^121 (bf16).

   Template: HEAD_DIM (64/128/256), GROUP_SIZE (32..HEAD_DIM), SRC_DTYPE
   (bf16/f16), ROWS (rows per warp step: 16 or 32; 16 for HEAD_DIM 256),
   WARPS (warps per CTA: 2..16; the registry compiles the candidates of
   jit/oscar_registry.h). Registers: at most 128 per thread (16 warps per SM)
   except for HEAD_DIM 256, whose 128 KB R allows one CTA per SM anyway.
   Page sizes are run-time values: the kernel computes one address per row.
   Grid (ctas, layers, 2 = K|V).

   Known difference from the reference: when a group's min or max is a zero
   and zeros of both signs occur (or the clip threshold is 0), the sign of
   that zero in the stored min / zero point can differ from the reference's
   (whose fminf keeps the first zero in dim order); codes are unaffected.

   Versions (H200, prefill 128K tokens x 8 heads x D 128, K and V, rotation
   + clip .96/.92; copy bandwidth 4.20-4.22 TB/s; bench/results/quantize.md):
   v16 (session 32): the prepared R's copies a cp.async group of their own
   after the first slot ids', so the first rows are issued while R is in
   flight: demotion of 32 requests 32.7-32.9 -> 32.1-32.5 us, 256 requests
   -0.4%, 1 request and the prefill unchanged (graph, three same-call rounds;
   docs/quantize.md "Session 32").
   v15 (session 22): v14's rule as m <= D / 16, so K at .96 takes it at
   every head dim and V at .92 (D 64: m = 6) no longer does; at D 128 the
   same SASS as v14.
   v14 (session 22): the clip's first bracket one binade below the max
   for m <= 8 (K at .96): 7 halvings after it instead of 8 where it holds:
   rotate + clip 342.5 / 344.4 -> 330.8 / 330.0 us, V absorbed -1.5%,
   256-request demotion 186.4 -> 183.5 (same-call A/B).
   v13 (session 21): the wgmma A descriptors from a warp-uniform slice
   address (a lane-0 shuffle) plus constant offsets, so they stay on the
   uniform datapath (32 R2UR and 32 LOP3 fewer per step): rotate + clip
   352 -> 343-345 us, no clip 283 -> 277-278 (same-call A/B).
   v12 (session 21): the codes from two compares per pair word instead of
   three (bit 0 against t3 or t1, picked by the bit-1 mask), and the side's
   CTA count by masks, which keeps the block indices and the layer's
   pointers on the uniform datapath (f590dff's select had moved them to
   vector registers): 360 -> 347-353 us, no clip 293 -> 282-285, 256-request
   demotion 190.6 -> 185 (same-call A/B, three calls). The ALU pipe, where
   HSET2 and LOP3 issue at half rate, bounds the kernel: one HSET2 less per
   pair word paid ~2%. Not kept: the clip's probes over a max/min
   tournament's candidates (HMNMX2 is half rate on the ALU pipe too: +2.6%),
   the codes as f16 1.0 / 0.0 sums on the FMA pipe (no clip -3%, with the
   clip +2 to +5%; gated to unclipped launches the clipped ones still lost
   3-4% from the extra path's registers) (docs/quantize.md "Session 21").
   v10 (session 18): the clipped-group threshold table (v8) is a constant
   (quantize_table.cuh) copied in with the first slot ids, no longer built
   per CTA, so every bf16 launch with a clip uses it: 32-request demotion
   -10%, prefill ~-1.5% (same-call A/B, docs/quantize.md).
   v9: the rotation on wgmma (sm_90a; quantize.cuh is the one program the
   JIT compiles for sm_90a): 392.8-393.9 -> 377.2-378.5 us (38% of copy), no
   clip 317-318 -> 304-307, demotion unchanged within spread (same-call A/B,
   bench/results/logs/quantize_v9_h200.txt). Profile (ncu): the group's
   barriers and wgmma waits are 12.6% of the stall samples; issue slots 51%
   busy. The rotation still adds ~96 us over a plain quantize: it sits on
   each group's path between the rows' arrival and their refill.
   v8 (after the v6 and v7 attempts below): a bf16 group clipped at both
   ends (min -tau, max tau: almost every group of a clipped row when the
   group is the row) takes its three code
   thresholds from a per-CTA table by tau's mantissa, shifted by tau's
   exponent (q_tab_entry: exact by power-of-two scaling, each entry checked
   at both ends of its exponent range) instead of two formula evaluations
   and the direct candidate per level: 436-437 -> 395-397 us (37% of copy),
   256-request demotion 286 -> 256 us, smaller demotions unchanged (no
   table below 16 steps per warp); test quantize_gpu/
   clipped_threshold_table_bit_exact (bench/results/logs/quantize_v8_h200.txt).
   v6 attempts (quant-v6; none kept; each timed against v5 in the
   same run, bench/results/logs/quantize_v6_experiments_h200.txt):
   - the clip threshold by a sorting network for m <= 16 (Batcher blocks of
     8 or 16 words, top-K merges, exact, GPU-tested): 471.7 vs 438.1 us. It
     cut ~530 instructions per warp step, but its min/max (HMNMX2) run on
     the ALU pipe like the probes' HSET2 (the probes' HADD2 run on the FMA
     pipes), and it has as many ALU operations as the 9 probes: ALU-bound.
   - the three threshold levels' checks written out side by side (the rolled
     loop was 24% of the stall samples, "wait"): 460.3 vs 443.8 us (the
     written-out checks are predicated: every level pays the third
     evaluation and the selects).
   - the rotation over two n-tile pairs at once (8 accumulator chains per
     warp instead of 4): 499.0 vs 443.8 us (32 more registers at the cap of
     128: spilled loop scalars).
   Profile of a v6 attempt (the network): 2856 instructions per warp step,
   issue slots 43% busy, 0.99 eligible of 3.49 warps per scheduler, ALU the
   busiest pipe (54%); rotation block 26% of the stall samples, code
   thresholds 24%, clip 21%, codes 10%. Left: fewer ALU operations in the
   clip (its compares on the FMA pipes: an exact HFMA2.SAT form exists for
   keys >= 2^-5), more warps per SM (the row in registers caps it at 16), the
   rotation with wgmma (sm_90a) or fewer registers.
   v5 (bdbbcf8: 442.5 us, 33.0% of copy; rotation without clip 321.6 us,
   45.4%; neither 209.8 us, 69.5%; demotion of 8 tokens x 36 layers 14.9 /
   51.6 / 286.1 us for 1 / 32 / 256 requests, v4 19 / 65 / 389): the
   uniform thresholds directly (above), two evaluations each instead of
   three plus the middle threshold's ~29-step search with subnormal IEEE
   divisions; the CPU proof is tests/test_quantize_thresh.c (candidate =
   reference threshold for every clipped group of bf16 and f16 and ~7M
   other cases, 0 wrong; declined, i.e. left to the search, only where
   |q*| >= 2^127: 288 of 2.4M random bf16 group cases).
   Left: the clip's 9 counting probes (~25% of v4's instructions, now a
   larger share), the rotation block; not profiled yet.
   v4 (592 us, 24.5% of copy; rotation without clip 388 us, 37%; neither
   214 us, 68%): copies with immediate offsets (the v3 copy loop was ~520
   instructions per warp step, now ~70) and code thresholds from three
   independent evaluations around the estimate. Where the time goes (ncu,
   bench/results/logs/ncu_quantize_v3_v4_h200.txt; per warp step of 32 rows,
   4900 instructions, issue slots 57% busy, ALU pipe 54%): the threshold
   search ~42% of the instructions and half the stall samples, the clip's
   9 counting probes ~25%, the rotation block 12% (19% of the samples),
   the codes 8%. The search is slow because with the clip a group's min
   and max are -tau and +tau for almost every row, so the middle threshold
   lies at 0, where f32 absorption (v / scale + zero, zero ~ 1.5) puts the
   exact boundary thousands of 16-bit ulps from the estimate: the doubling
   search and the bisection then take ~29 evaluations per warp step (15 +
   14, the slowest row's), and their subnormal quotients take div_rn_by's IEEE-division fallback (899f6bb):
   v3 without that fallback measured 497 us (vs 608) in the same run.
   Tried and reverted (no gain, measured): the rotation rolled over n-tile
   pairs with one copy of the probe loop (592 us), the clip's counts on the
   tensor cores (644 us).
   v3 (608-615 us, 24%): thresholds instead of per-value divisions, one
   lane per row, B fragments shared by 2 m-tiles, slot ids loaded two steps
   ahead.
   v2 (1128 us): quad per row, per-value divisions. v1: 0.37 TB/s. */
#ifndef OSCAR_K_QUANTIZE_CUH
#define OSCAR_K_QUANTIZE_CUH

#include "common.cuh"
#include "quantize_table.cuh"

namespace oscar {
namespace detail {

constexpr float LM_THRESHOLD = 0.9810652732849121f;
constexpr float LM_SCALE = 1.1673919518788656f; /* (2 * 1.5095585584640503 / 3) * 1.16 */

/* Row swizzle of the 16-byte chunks of a [rows][D] 16-bit slice. Any 8
   consecutive rows get 8 different chunk positions (ldmatrix, the Y stores
   and one-lane-per-row reads are conflict-free), and for two lanes per row
   the 4 rows of a quarter warp x 2 lane halves, whose chunks differ in bit
   (JW/8) -- 1 for D 64, 2 for D 128, 4 for D 256 -- also land on 8 different
   positions. */
template <int D>
__device__ __forceinline__ u32 q_rowswz(int row) {
    if constexpr (D == 64)
        return static_cast<u32>(((row & 3) << 1) | ((row >> 2) & 1));
    else if constexpr (D == 128)
        return static_cast<u32>((row & 1) | ((row & 2) << 1) | ((row & 4) >> 1));
    else
        return static_cast<u32>(row & 7);
}
template <int D>
__device__ __forceinline__ u32 qswz(int row, int chunk) {
    return static_cast<u32>(row * (D * 2)) + ((static_cast<u32>(chunk) ^ q_rowswz<D>(row)) << 4);
}
/* The wgmma path's 16-bit R in shared memory: R^T, K-major, 128-byte
   swizzle -- chunk c (R[8c..8c+7][n]) of row n at this byte offset. The
   kernel's f32 staging and rotation_prepare_kernel's image both use it. */
template <int D>
__device__ __forceinline__ int q_rwg_off(int c, int n) {
    return (c >> 3) * (D * 128) + n * 128 + (((c & 7) ^ (n & 7)) << 4);
}

/* ---- 16-bit SIMD on pairs of source values -------------------------------- */
template <int DT>
struct qsimd {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static constexpr bool NATIVE = true;
#else
    static constexpr bool NATIVE = DT == OSCAR_K_DTYPE_F16;
#endif
    static constexpr bool BF16 = DT != OSCAR_K_DTYPE_F16;
    /* +-infinity in the compare domain (bf16 compares, or f16 ones) */
    static constexpr u32 POS_INF = BF16 && NATIVE ? 0x7F80u : 0x7C00u;
    static constexpr u32 NEG_INF = POS_INF | 0x8000u;
    /* +infinity as a value of the dtype (min/max) */
    static constexpr u32 VAL_INF = BF16 ? 0x7F80u : 0x7C00u;

    /* per half 0xFFFF where a >= b, else 0 */
    static __device__ __forceinline__ u32 ge_mask(u32 a, u32 b) {
        u32 d;
        if constexpr (BF16 && NATIVE)
            asm("set.ge.u32.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        else
            asm("set.ge.u32.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        return d;
    }
    static __device__ __forceinline__ u32 min2(u32 a, u32 b) {
        u32 d;
        if constexpr (BF16)
            asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        else
            asm("min.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        return d;
    }
    static __device__ __forceinline__ u32 max2(u32 a, u32 b) {
        u32 d;
        if constexpr (BF16)
            asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        else
            asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
        return d;
    }
    /* f32 pair -> packed source dtype, round to nearest even (hi in bits 31:16) */
    static __device__ __forceinline__ u32 pack_rn(float hi, float lo) {
        u32 d;
        if constexpr (BF16)
            asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
        else
            asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
        return d;
    }
    static __device__ __forceinline__ float lo_f32(u32 w) {
        if constexpr (BF16) return __uint_as_float(w << 16);
        else return f16_to_f32(static_cast<u16>(w & 0xffffu));
    }
    static __device__ __forceinline__ float hi_f32(u32 w) {
        if constexpr (BF16) return __uint_as_float(w & 0xffff0000u);
        else return f16_to_f32(static_cast<u16>(w >> 16));
    }
};

/* Per half f16 1.0 where |a| >= b as f16 numbers, else 0. One asm block:
   the abs is loop-invariant in the clip search, and hoisting it would keep a
   second copy of the row in registers; inside the block it folds into the
   compare as an operand modifier. */
__device__ __forceinline__ u32 q_absge_f16(u32 a, u32 b) {
    u32 d;
    asm("{\n\t.reg .b32 t;\n\tabs.f16x2 t, %1;\n\tset.ge.f16x2.f16x2 %0, t, %2;\n\t}" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
/* acc + per half [|a| >= key] (bits 0 and 16), kk = key | key << 16, key < 2^15:
   (a | 0x8000) - key per half has bit 15 set iff |a| >= key, with no borrow
   across halves. One volatile block, for the same reason as above. */
__device__ __forceinline__ u32 q_absge_int(u32 acc, u32 a, u32 kk) {
    u32 d;
    asm volatile("{\n\t.reg .b32 t;\n\tor.b32 t, %1, 0x80008000;\n\tsub.u32 t, t, %2;\n\tshr.u32 t, t, 15;\n\t"
                 "and.b32 t, t, 0x00010001;\n\tadd.u32 %0, %3, t;\n\t}"
                 : "=r"(d)
                 : "r"(a), "r"(kk), "r"(acc));
    return d;
}
/* an opaque copy: keeps the compiler from holding values derived from the
   row across passes (it would rather keep 128 floats than recompute them) */
__device__ __forceinline__ u32 q_opaque(u32 a) {
    u32 d;
    asm volatile("mov.b32 %0, %1;" : "=r"(d) : "r"(a));
    return d;
}

/* 16-bit sign-magnitude pattern <-> unsigned index in value order */
__device__ __forceinline__ u32 q_ord(u32 pat) { return pat ^ ((pat & 0x8000u) ? 0xffffu : 0x8000u); }
__device__ __forceinline__ u32 q_unord(u32 o) { return o ^ ((o & 0x8000u) ? 0x8000u : 0xffffu); }

/* x / d rounded to nearest, from inv = RN(1/d): one product and one
   residual correction (Markstein). Correctly rounded for normal operands
   and quotients with a normal reciprocal (scale >= 1e-8/3); checked bit for
   bit against the CPU's IEEE division by the GPU tests. */
__device__ __forceinline__ float div_rn_by(float x, float d, float inv) {
    const float y0 = __fmul_rn(x, inv);
    const float r = __fmaf_rn(-y0, d, x);
    const float q = __fmaf_rn(r, inv, y0);
    /* Outside that range, the IEEE division: d >= 2^126 (inv subnormal or
       0 -- a Lloyd-Max row of ~1e30 values has var = inf, sd = inf, and the
       correction gave 0 * inf = NaN, i.e. code 0, where the reference's
       (y - mean) / inf = 0 gives code 2), a quotient that overflows (NaN
       again) or is subnormal. Only the threshold search calls this. */
    if (!(fabsf(d) < __int_as_float(0x7e800000)) || !(fabsf(q) < __int_as_float(0x7f000000)) ||
        (fabsf(q) < __int_as_float(0x01000000) && x != 0.f))
        return __fdiv_rn(x, d);
    return q;
}

/* The formula of the codes for one group, evaluated at a value. */
struct q_formula {
    float a, b, inv; /* uniform: scale, zero; lloyd-max: sd, mean */
    bool lloyd_max;
    /* uniform: (v / scale + zero) + 0.5 (>= k: code >= k);
       lloyd-max: (v - mean) / sd (>= level threshold) */
    __device__ __forceinline__ float eval(float v) const {
        if (lloyd_max) return div_rn_by(__fsub_rn(v, b), a, inv);
        return __fadd_rn(__fadd_rn(div_rn_by(v, a, inv), b), 0.5f);
    }
};

constexpr u32 Q_NO_CAND = 0xffffffffu;

/* The uniform code threshold of level k (1..3), directly: the smallest
   value v of the dtype (as an ordered index, not clamped to the group) with
   RN(RN(RN(v / scale) + zero) + 0.5) >= k, or Q_NO_CAND where this cannot
   settle it (the search then runs from the estimate). The formula's result
   reaches k iff the f32 quotient RN(v / scale) reaches q*, the smallest f32
   q with RN(RN(q + zero) + 0.5) >= k, i.e. with q + zero >= M_k as reals:
   the two rounded adds reach k exactly from M_1 = 0.5 - 3 * 2^-26 (strictly
   above it: the tie rounds to 0.5 - 2^-25, odd, whose + 0.5 is a tie that
   rounds up), M_2 = 1.5 - 2^-24, M_3 = 2.5 - 2^-23 (ties round up to the
   even 1.5, 2.5). q0 = RN(M_k - zero) (f64, then f32) is q* or its
   predecessor; one evaluation of the adds at q0 and one at its neighbour
   settle which (and decline where neither changes, e.g. zero not finite).
   Then RN(v / scale) >= q* iff v / scale >= the midpoint m of pred(q*) and
   q* (strictly where the tie goes to pred(q*), i.e. q* odd), and v >= m *
   scale = P is exact in f64 (25 x 24 significant bits); the candidate is
   the dtype's ceiling of P (f32 ceiling, then the dtype's), one index up
   where strict and equal. Declines q* = 0 and |q*| >= 2^127. The caller
   still checks the formula at the candidate and its predecessor, so a wrong
   candidate could only cost time; tests/test_quantize_thresh.c shows on the
   CPU that it is the reference's threshold for every clipped group of
   either dtype and ~7M other (scale, zero, level) cases. */
template <int DT>
__device__ __forceinline__ u32 q_direct_candidate(float scale, float zero, int k) {
    const double M = k == 1 ? 0.5 - 0x1.8p-25 : k == 2 ? 1.5 - 0x1p-24 : 2.5 - 0x1p-23;
    const float lv = static_cast<float>(k);
    auto h = [&](float q) { return __fadd_rn(__fadd_rn(q, zero), 0.5f) >= lv; };
    const float q = __double2float_rn(__dsub_rn(M, static_cast<double>(zero)));
    const bool hq = h(q);
    const float inf = __int_as_float(0x7f800000);
    const float qa = nextafterf(q, hq ? -inf : inf);
    const float qs = hq ? q : qa;
    if (hq == h(qa) || !(fabsf(qs) < 0x1p127f) || qs == 0.f) return Q_NO_CAND;
    const float p = nextafterf(qs, -inf);
    const double P = __dmul_rn(__dmul_rn(0.5, __dadd_rn(static_cast<double>(p), static_cast<double>(qs))),
                               static_cast<double>(scale));
    const float P32 = __double2float_ru(P);
    u32 c = q_ord(from_f32(P32, DT));
    if (to_f32<DT>(static_cast<u16>(q_unord(c))) < P32) c++;
    if ((__float_as_uint(qs) & 1u) && static_cast<double>(to_f32<DT>(static_cast<u16>(q_unord(c)))) == P) c++;
    return c;
}

/* The smallest value t of the dtype in [lo, hi] (ordered indices olo..ohi)
   with f.eval(t) >= level, as a packed compare word (t, t); -inf when it is
   lo itself (every value of the group, clipped or not, reaches the level),
   +inf when no value in [lo, hi] does. eval is monotone in the value. The
   estimate rounds the real boundary to the nearest value of the dtype (f32
   errors are far below one 16-bit ulp), so the boundary is the estimate or
   the value above it: three independent evaluations (the estimate and both
   neighbours) settle that. Otherwise (near zero, where ulps shrink, the
   boundary can be thousands of ulps off) steps double away from the
   estimate and a bisection finishes. */
template <int DT>
__device__ __forceinline__ u32 q_threshold(const q_formula &f, float level, float est, u32 cand, u32 olo, u32 ohi) {
    using S = qsimd<DT>;
    auto reaches = [&](u32 o) { return f.eval(to_f32<DT>(static_cast<u16>(q_unord(o)))) >= level; };
    /* the direct candidate (exact in the common case), else the estimate */
    u32 o = cand != Q_NO_CAND ? cand : q_ord(from_f32(est, DT));
    o = min(max(o, olo), ohi);
    /* below olo nothing is taken to reach, above ohi everything */
    const bool r0 = (o > olo) & reaches(o > olo ? o - 1u : o);
    const bool r1 = reaches(o);
    u32 b; /* the smallest index in [olo, ohi + 1] that reaches */
    if (!r0 && r1) {
        b = o;
    } else if (!r1 && ((o >= ohi) || reaches(o + 1u))) {
        b = o + 1u;
    } else {
        u32 lo, hi; /* invariant: !reaches(lo) (or lo = olo - 1), reaches(hi) (or hi = ohi + 1) */
        if (r1) {
            hi = o, lo = olo - 1u;
            for (u32 step = 1u; hi > olo;) {
                const u32 cand = hi - olo > step ? hi - step : olo;
                if (!reaches(cand)) {
                    lo = cand;
                    break;
                }
                hi = cand, step += step;
            }
        } else {
            lo = o, hi = ohi + 1u;
            for (u32 step = 1u; lo < ohi;) {
                const u32 cand = ohi - lo > step ? lo + step : ohi;
                if (reaches(cand)) {
                    hi = cand;
                    break;
                }
                lo = cand, step += step;
            }
        }
        while (hi - lo > 1u) {
            const u32 mid = lo + ((hi - lo) >> 1);
            if (reaches(mid))
                hi = mid;
            else
                lo = mid;
        }
        b = hi;
    }
    const u32 t = b == olo ? S::NEG_INF : b > ohi ? S::POS_INF : q_unord(b);
    return t | (t << 16);
}

/* s19: a group's three uniform thresholds. Each level's direct candidate and
   the two evaluations that confirm it (q_threshold's common case) are
   independent of the other levels', so they run as three interleaved chains
   instead of one after another: a small demotion's launch ends with the warp
   whose row is clipped at one end only (no table), and these chains were
   most of its time. A level they do not settle takes q_threshold's search. */
template <int DT>
__device__ __forceinline__ void q_uniform_thresholds(const q_formula &f, float scale, float zero, float mn, u32 olo, u32 ohi,
                                                     u32 &t0, u32 &t1, u32 &t2) {
    using S = qsimd<DT>;
    auto reaches = [&](u32 o, float level) { return f.eval(to_f32<DT>(static_cast<u16>(q_unord(o)))) >= level; };
    u32 b[3];
    bool ok[3];
#pragma unroll
    for (int k = 0; k < 3; k++) {
        const u32 cand = q_direct_candidate<DT>(scale, zero, k + 1);
        const float level = static_cast<float>(k + 1);
        u32 o = cand != Q_NO_CAND ? cand : q_ord(from_f32(__fmaf_rn(static_cast<float>(k) + 0.5f, scale, mn), DT));
        o = min(max(o, olo), ohi);
        const bool r0 = (o > olo) & reaches(o > olo ? o - 1u : o, level);
        ok[k] = !r0 && reaches(o, level);
        const u32 t = o == olo ? S::NEG_INF : q_unord(o);
        b[k] = t | (t << 16);
    }
    t0 = b[0], t1 = b[1], t2 = b[2];
    if (ok[0] && ok[1] && ok[2]) return;
#pragma unroll 1
    for (int k = 0; k < 3; k++) {
        const bool okk = k == 0 ? ok[0] : k == 1 ? ok[1] : ok[2];
        if (okk) continue;
        const u32 t = q_threshold<DT>(f, static_cast<float>(k + 1), __fmaf_rn(static_cast<float>(k) + 0.5f, scale, mn),
                                      q_direct_candidate<DT>(scale, zero, k + 1), olo, ohi);
        t0 = k == 0 ? t : t0, t1 = k == 1 ? t : t1, t2 = k == 2 ? t : t2;
    }
}

/* The uniform scale and zero point of a group with min mn and max mx, as the
   reference computes them. */
__device__ __forceinline__ void q_uniform_scale_zero(float mn, float mx, float &scale, float &zero) {
    scale = __fdiv_rn(fmaxf(__fsub_rn(mx, mn), 1e-8f), 3.0f);
    zero = __fdiv_rn(-mn, scale);
}
/* v8: the thresholds of a bf16 group clipped at both ends depend only on
   tau's mantissa. With mn = -tau, mx = tau: 2 tau is exact, scale = RN(2 tau
   / 3) and zero = RN(tau / scale) scale with tau by any power of two (zero
   does not change), and so does RN(v / scale) for v scaled alike; so while
   every value involved is a normal number and 2 tau > 1e-8 (the floor of
   max - min), tau * 2^j has the thresholds of tau, each times 2^j. The table
   holds, per mantissa m (tau = 1.m), the three threshold words computed in
   full at tau in [1, 2); an entry is used only if the same computation at
   tau * 2^-25 and tau * 2^60 gives the shifted words (its bit 16, set by the
   generator) and tau's exponent is in that range (Q_TAB_EMIN..Q_TAB_EMAX:
   2 tau >= 2^-24 > 1e-8; a threshold's magnitude, at least 2^-70 at
   [1, 2), stays >= 2^-95, normal). Entry bits 0-15 the threshold, bit 16
   set when usable; markers (+-inf: no value / every value reaches) do not
   shift. */
constexpr int Q_TAB_EMIN = 127 - 25, Q_TAB_EMAX = 127 + 60;
__device__ __forceinline__ u32 q_tab_shift(u32 t, int de) {
    const u32 mag = t & 0x7fffu;
    if (mag >= 0x7f80u || mag == 0u) return t; /* markers (and zeros: never usable) */
    return (t & 0x8000u) | (mag + static_cast<u32>(de * 128));
}
/* The table itself (session 18): a constant of the compare domain, written by
   tools/gen_quantize_table.c from cpu/oscar_cpu.h's definition (which the
   CPU tests check entry by entry against a plain scan). Sessions 8-17 built
   it per CTA on the device (q_tab_entry: 384 threshold searches, ~2 us per
   CTA), so only launches with 16 or more steps per warp used it; now every
   bf16 launch with a clip copies it to shared memory with its first slot
   ids. H200, same call: 32-request demotion 49.7 / 50.2 -> 45.6 / 44.2 us,
   256 requests 228.3 / 227.5 -> 222.5 / 220.5, prefill 369.3 / 369.2 ->
   358.3 / 363.2; the 1-request demotion unchanged (its slowest warp still
   has a row clipped at one end only, which computes its thresholds). */
__device__ __align__(16) const u32 q_tab_global[128 * 3] =
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    OSCAR_K_CLIP_TABLE_NATIVE;
#else
    OSCAR_K_CLIP_TABLE_F16CMP;
#endif

constexpr int Q_SLOT_RING = 3 * 32 * 16; /* per warp: 3 steps x 32 lanes x (src, dst slot) */

/* 4- or 8-byte global -> shared copy (slot ids) */
__device__ __forceinline__ void q_cp_async_small(u32 dst, const void *src, int bytes) {
    if (bytes == 8)
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(dst), "l"(src));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(dst), "l"(src));
}
__device__ __forceinline__ i64 q_slot_entry(const u8 *e, int dtype) {
    return dtype == OSCAR_K_DTYPE_I64 ? *reinterpret_cast<const i64 *>(e)
                                      : static_cast<i64>(*reinterpret_cast<const i32 *>(e));
}

/* Division of values below 2^31 by a divisor fixed for the whole launch
   (the KV-head count, page sizes), set up once per thread: with l = ceil(log2
   d) and m = ceil(2^(31 + l) / d) < 2^32, floor(n / d) = (n m) >> (31 + l) for
   every n < 2^31 (Granlund and Montgomery: the error m d - 2^(31 + l) < d <=
   2^l, times n, stays under 2^(31 + l)). A multiply and a shift where a
   32-bit division by a run-time value is ~20 instructions: v9 divided five
   times per 32-row step (three by the head count, two by page sizes). */
struct q_divisor {
    u32 m, s;
    __device__ __forceinline__ explicit q_divisor(u32 d) {
        const u32 l = d > 1u ? 32u - static_cast<u32>(__clz(d - 1u)) : 0u;
        s = 31u + l;
        m = (d & (d - 1u)) == 0u ? 0x80000000u /* 2^(31 + l) / 2^l: no 64-bit division */
                                 : static_cast<u32>(((1ull << s) + d - 1u) / d);
    }
    __device__ __forceinline__ u32 div(u32 n) const { return static_cast<u32>((static_cast<u64>(n) * m) >> s); }
};

/* page and offset of a slot (dv divides by page_size); the fast division
   where the slot fits in 31 bits */
__device__ __forceinline__ void q_split_slot(i64 slot, int page_size, const q_divisor &dv, i64 &page, i64 &off) {
    if (page_size == 1) {
        page = slot, off = 0;
    } else if (slot <= 0x7fffffffLL) {
        const u32 sl = static_cast<u32>(slot), pg = dv.div(sl);
        page = pg, off = sl - pg * static_cast<u32>(page_size);
    } else {
        page = slot / page_size, off = slot - page * page_size;
    }
}


/* ---- warpgroup MMA (sm_90a only: wgmma) ---------------------------------
   The rotation of the sm_90a build: one warpgroup (4 warps) multiplies 64
   rows of x (shared memory) by R (shared memory) with wgmma, the
   accumulators in the same fragment layout as mma.sync's (warp w of the
   group: rows 16w + g and 16w + g + 8, columns 8n + 2c, + 1). Both operands
   are K-major with the 128-byte swizzle: per 64-element k block, rows of
   128 bytes, 16-byte chunk c of row t at chunk position c ^ (t & 7), 8-row
   groups 1024 bytes apart (the tile bases are 1024-byte aligned). */
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
constexpr bool Q_WGMMA = true;
#else
constexpr bool Q_WGMMA = false;
#endif

/* shared-memory matrix descriptor: start address, leading byte offset 16
   (unused by swizzled K-major tiles), stride byte offset 1024 (the next 8
   rows), 128-byte swizzle */
__device__ __forceinline__ u64 q_wg_desc(u32 saddr) {
    return static_cast<u64>((saddr & 0x3ffffu) >> 4) | (static_cast<u64>(1) << 16) | (static_cast<u64>(1024 >> 4) << 32) |
           (static_cast<u64>(1) << 62);
}
__device__ __forceinline__ void q_wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void q_wg_commit_wait() {
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
/* generic-proxy writes of shared memory (cp.async, st.shared) -> visible to
   the wgmma that read it after the next barrier */
__device__ __forceinline__ void q_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* the barrier of one warpgroup (id 1 + group; 0 is __syncthreads) */
__device__ __forceinline__ void q_wg_barrier(int group) { asm volatile("bar.sync %0, 128;\n" ::"r"(1 + group) : "memory"); }
/* the accumulators are written by the asynchronous MMA: keep the compiler
   from moving their uses across the wait */
template <int N>
__device__ __forceinline__ void q_wg_fence_regs(float (&d)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}

#define Q_ACC8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), \
                  "+f"(d[i + 6]), "+f"(d[i + 7])
#define Q_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, " \
                 "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define Q_REGS64 Q_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, " \
                 "%49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define Q_WGMMA_N64(T)                                                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\nwgmma.mma_async.sync.aligned.m64n64k16.f32." T \
                 "." T " {" Q_REGS32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                     \
                 : Q_ACC8(0), Q_ACC8(8), Q_ACC8(16), Q_ACC8(24)                                            \
                 : "l"(da), "l"(db), "r"(accumulate)                                                        \
                 : "memory")
#define Q_WGMMA_N128(T)                                                                                      \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\nwgmma.mma_async.sync.aligned.m64n128k16.f32." T \
                 "." T " {" Q_REGS64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"                                      \
                 : Q_ACC8(0), Q_ACC8(8), Q_ACC8(16), Q_ACC8(24), Q_ACC8(32), Q_ACC8(40), Q_ACC8(48),       \
                   Q_ACC8(56)                                                                                \
                 : "l"(da), "l"(db), "r"(accumulate)                                                         \
                 : "memory")
/* d (+)= A (64 x 16, descriptor da) x B (16 x N, K-major, descriptor db);
   accumulate = 0 overwrites d */
template <int DT, int N>
__device__ __forceinline__ void q_wgmma(float (&d)[N / 2], u64 da, u64 db, u32 accumulate) {
    static_assert(N == 64 || N == 128, "wgmma n");
    if constexpr (N == 64) {
        if constexpr (DT == OSCAR_K_DTYPE_F16) Q_WGMMA_N64("f16");
        else Q_WGMMA_N64("bf16");
    } else {
        if constexpr (DT == OSCAR_K_DTYPE_F16) Q_WGMMA_N128("f16");
        else Q_WGMMA_N128("bf16");
    }
}
#undef Q_WGMMA_N64
#undef Q_WGMMA_N128
#undef Q_REGS64
#undef Q_REGS32
#undef Q_ACC8
}  // namespace detail

template <int HEAD_DIM, int GROUP_SIZE, int SRC_DTYPE, int ROWS, int WARPS>
__global__ void __launch_bounds__(WARPS * 32, HEAD_DIM == 256 || WARPS > 8 ? 1 : 16 / WARPS) quantize_kernel(const __grid_constant__ oscar_quantize_params p) {
    using namespace detail;
    using S = qsimd<SRC_DTYPE>;
    constexpr int D = HEAD_DIM, GS = GROUP_SIZE;
    constexpr int LPR = 32 / ROWS;             /* lanes per row */
    constexpr int E = D / LPR;                 /* values per lane */
    constexpr int Q4 = D / 4;                  /* code bytes per row */
    constexpr int JW = Q4 / LPR;               /* code bytes per lane */
    constexpr int JP = JW / 2;                 /* pair words per quarter per lane */
    constexpr int CHUNKS = D / 8, MT = ROWS / 16, KS = D / 16, NT = D / 8;
    constexpr int STEP_BYTES = ROWS * D * 2;
    constexpr bool EXCL = GS <= JW;            /* each group lies in one lane */
    constexpr int LG = EXCL ? E / GS : D / GS; /* groups a lane touches */
    constexpr int MANT_BITS = SRC_DTYPE == OSCAR_K_DTYPE_F16 ? 10 : 7;
    static_assert(D == 64 || D == 128 || D == 256, "head dim");
    static_assert(D % GS == 0 && GS >= 32, "group size");
    static_assert((ROWS == 16 || ROWS == 32) && E <= 128, "rows per warp step (16 for head dim 256)");
    static_assert(WARPS == 2 || WARPS == 4 || WARPS == 8 || WARPS == 16, "warps per CTA");
    static_assert(EXCL || LG <= 4, "a lane sees every group once per quarter");
    static_assert((ROWS * CHUNKS) % 32 == 0 && JW % 8 == 0, "copy and store granularity");
    /* sm_90a: the rotation on wgmma, by warpgroups of 4 warps sharing one
       slice of 4 x ROWS rows (below); head dim 256 keeps mma.sync */
    constexpr bool WG = Q_WGMMA && D <= 128 && WARPS % 4 == 0;
    constexpr int WG_ROWS = 4 * ROWS;
    /* slice geometry: bytes between 64-element k blocks (chunks 8c..8c+7),
       between row i and row i + 16 (rows: row_base below) */
    constexpr u32 KB_B = WG ? WG_ROWS * 128 : 128, RS_B = WG ? 64 * 128 : 16 * D * 2;

    extern __shared__ __align__(16) u8 smem_raw[];
    /* wgmma's swizzled tiles need 1024-byte alignment (the host adds 1024) */
    u8 *smem = WG ? smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u) : smem_raw;
    /* p.side_ctas: K's and V's shares of the resident CTAs, by their cost
       (oscar__quant_ctas); the grid's x is the larger, the smaller side's
       extra CTAs leave at once */
    const int layer = blockIdx.y, side = blockIdx.z, cta = blockIdx.x;
    /* side is 0 or 1: the count by masks, not a select -- with "side ?
       p.side_ctas[1] : p.side_ctas[0]" (f590dff) ptxas read the block indices
       into vector registers and kept the layer's pointers and the 64-bit
       stride there (S2R, LDC, IMAD.WIDE) instead of on the uniform datapath,
       in a kernel at its 128-register cap (s21: SASS against 8b8d120's) */
    const int side_ctas = (p.side_ctas[0] & (side - 1)) | (p.side_ctas[1] & -side);
    if (cta >= side_ctas) return;
    OSCAR_TRACE_MARK(QUANTIZE, ENTRY);
    const oscar_quantize_layer &L = p.layers[layer];
    const u64 rot = side ? L.rot_v : L.rot_k;
    const u16 *src = reinterpret_cast<const u16 *>(side ? L.src_v : L.src_k);
    u8 *codes_base = reinterpret_cast<u8 *>(side ? L.v_codes : L.k_codes);
    u8 *scales_base = reinterpret_cast<u8 *>(side ? L.v_scales : L.k_scales);
    const int clip_index = side ? p.v_clip_index : p.k_clip_index;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int my_row = lane / LPR, h = lane % LPR;
    const int H = p.pool.num_kv_heads;
    const int wgrp = warp >> 2, w4 = warp & 3; /* warpgroup, warp within it (WG) */
    u8 *slot_area = smem + warp * Q_SLOT_RING;
    /* WG: buf is the warpgroup's slice (its 4 warps' rows, K-major tiles);
       else the warp's own */
    u8 *buf = smem + WARPS * Q_SLOT_RING + (WG ? wgrp * 4 : warp) * STEP_BYTES;
    u8 *rsm = smem + WARPS * (Q_SLOT_RING + STEP_BYTES);
    const u32 buf_s = smem_addr(buf), slot_s = smem_addr(slot_area);
    /* Where this warp's slice row i lies in buf. WG: in tile row (i / 16) * 64
       + 16 w4 + (i & 8) + rowswz(i & 7) -- the rows this warp's wgmma
       accumulators hold, so each warp writes y back into its own rows; the
       permutation within 8 rows makes the tiles' swizzle (chunk ^ (t & 7))
       equal rowswz(i), the same bank pattern as the per-warp slice's, so
       copies and one-lane-per-row reads stay conflict-free. */
    auto row_base = [&](int i) -> u32 {
        if constexpr (WG) return static_cast<u32>(((i >> 4) * 64 + 16 * w4 + (i & 8)) * 128) + (q_rowswz<D>(i & 7) << 7);
        else return static_cast<u32>(i * D * 2);
    };
    /* byte offset in buf of 16-byte chunk ch (columns 8ch..8ch+7) of row i */
    auto chunk_off = [&](int i, int ch) -> u32 {
        return row_base(i) + static_cast<u32>(ch >> 3) * KB_B + (((static_cast<u32>(ch) & 7u) ^ q_rowswz<D>(i)) << 4);
    };

    const i64 rows = p.num_tokens * H;
    const i64 steps = (rows + ROWS - 1) / ROWS;
    const i64 stride = static_cast<i64>(side_ctas) * WARPS;
    const i64 num_slots = static_cast<i64>(p.pool.num_pages) * p.pool.page_size;
    const int slot_bytes = p.slot_dtype == OSCAR_K_DTYPE_I64 ? 8 : 4;

    /* ---- per-row slot ids: copied to this lane's entry of a 3-deep ring in
       shared memory with cp.async two steps ahead (no registers held, no
       wait), read back to compute the source address one step ahead and the
       destination addresses when the codes are stored */
    const q_divisor div_h(static_cast<u32>(H)), div_src_page(static_cast<u32>(p.src_page_size)),
        div_pool_page(static_cast<u32>(p.pool.page_size));
    auto row_of = [&](i64 st, int &head, i64 &tok) {
        const i64 row = st * ROWS + my_row;
        if (st >= steps || row >= rows) return false;
        const u32 r32 = static_cast<u32>(row), tok32 = div_h.div(r32); /* rows < 2^31: validated */
        tok = tok32;
        head = static_cast<int>(r32 - tok32 * static_cast<u32>(H));
        return true;
    };
    auto fetch_slots = [&](i64 st, int ring) {
        int head;
        i64 tok;
        if (row_of(st, head, tok)) {
            const u32 e = slot_s + static_cast<u32>((ring * 32 + lane) * 16);
            if (p.src_slots) q_cp_async_small(e, reinterpret_cast<const u8 *>(p.src_slots) + tok * slot_bytes, slot_bytes);
            q_cp_async_small(e + 8, reinterpret_cast<const u8 *>(p.dst_slots) + tok * slot_bytes, slot_bytes);
        }
    };
    /* src_off in elements (-1: no source row); code_off, scale_off in bytes (-1: skip) */
    auto src_off_of = [&](i64 st, int ring) {
        int head;
        i64 tok;
        if (!row_of(st, head, tok)) return static_cast<i64>(-1);
        const i64 sslot = p.src_slots ? q_slot_entry(slot_area + (ring * 32 + lane) * 16, p.slot_dtype) : tok;
        if (sslot < 0) return static_cast<i64>(-1);
        i64 page, off;
        q_split_slot(sslot, p.src_page_size, div_src_page, page, off);
        return page * p.src_page_stride + off * p.src_token_stride + head * p.src_head_stride;
    };
    auto dst_offs_of = [&](i64 st, int ring, i64 &code_off, i64 &scale_off) {
        int head;
        i64 tok;
        code_off = scale_off = -1;
        if (!row_of(st, head, tok)) return;
        const u8 *e = slot_area + (ring * 32 + lane) * 16;
        const i64 sslot = p.src_slots ? q_slot_entry(e, p.slot_dtype) : tok;
        const i64 dslot = q_slot_entry(e + 8, p.slot_dtype);
        if (sslot < 0 || dslot < 0 || dslot >= num_slots) return;
        i64 page, off;
        q_split_slot(dslot, p.pool.page_size, div_pool_page, page, off);
        code_off = page * p.pool.codes_page_stride + off * p.pool.codes_token_stride +
                   static_cast<i64>(head) * p.pool.codes_head_stride;
        scale_off = page * p.pool.scales_page_stride + off * p.pool.scales_token_stride +
                    static_cast<i64>(head) * p.pool.scales_head_stride;
    };
    /* one warp's ROWS source rows -> its slice (zeros where there is none).
       Lane pair i (lanes 2i, 2i + 1) copies chunks 2j and 2j + 1 of a row,
       32 contiguous bytes, per cp.async; copy k takes row i + 16 (k % RSETS)
       and chunk pair j = k / RSETS. A lane pair's rows share their swizzle
       (it reads row & 7), so four per-lane offsets plus immediates address
       every copy, and the only shuffles are one source offset per row set. */
    auto issue = [&](i64 my_src_off) {
        constexpr int RSETS = ROWS / 16, NCOPY = ROWS * CHUNKS / 32;
        const int ln = static_cast<int>(q_opaque(static_cast<u32>(lane))); /* see q_opaque: no hoisting */
        const int i = ln >> 1, e = ln & 1;
        const u16 *rp[RSETS];
        int nb[RSETS];
#pragma unroll
        for (int rs = 0; rs < RSETS; rs++) {
            /* LPR = 2: lanes 2i and 2i + 1 hold row i themselves */
            const i64 off = LPR == 2 ? my_src_off : __shfl_sync(0xffffffffu, my_src_off, (i + 16 * rs) * LPR);
            rp[rs] = src + (off >= 0 ? off : 0) + 8 * e;
            nb[rs] = off >= 0 ? 16 : 0;
        }
        const u32 sw = q_rowswz<D>(i), base = buf_s + row_base(i);
        u32 xo[4];
#pragma unroll
        for (int t = 0; t < 4; t++) xo[t] = base + (((static_cast<u32>(2 * t + e)) ^ sw) << 4);
#pragma unroll
        for (int k = 0; k < NCOPY; k++) {
            const int rs = k % RSETS, j = k / RSETS;
            cp_async16(xo[j & 3] + static_cast<u32>(rs) * RS_B + static_cast<u32>(j >> 2) * KB_B, rp[rs] + 16 * j, nb[rs]);
        }
    };

    /* the clipped groups' threshold table (bf16, uniform, clip on): the
       constant q_tab_global, copied with the first slot ids */
    constexpr bool TAB = SRC_DTYPE != OSCAR_K_DTYPE_F16;
    __shared__ __align__(16) u32 q_tab[TAB ? 128 * 3 : 4];
    const bool use_tab = TAB && clip_index >= 0 && !p.lloyd_max;
    if (use_tab)
        for (int i = threadIdx.x; i < 128 * 3 / 4; i += WARPS * 32) cp_async16(smem_addr(q_tab) + 16 * i, q_tab_global + 4 * i, 16);

    /* the first two steps' slot ids (with the table: one group) */
    i64 step = static_cast<i64>(cta) * WARPS + warp;
    fetch_slots(step, 0);
    fetch_slots(step + stride, 1);
    cp_async_commit();

    /* a prepared rotation (oscar_prepare_rotation): its header and this path's
       layout of R, copied straight into place (no f32 loads, no conversion); a
       header for another head dim, dtype or layout version leaves R to the f32
       staging below. s32: a group of its own after the slot ids', so the
       first rows are issued as soon as their slot ids are in, while R is
       still on its way (one wait for both before: the rows' round trip
       started only after R's 32 KB had landed) */
    const u64 rot_prep = rot ? (side ? L.rot_v_prepared : L.rot_k_prepared) : 0;
    __shared__ __align__(16) u32 q_prep_hdr[OSCAR_K_ROT_PREP_HEADER / 4];
    if (rot_prep) {
        constexpr int BYTES = D * D * 2;
        const u8 *img = reinterpret_cast<const u8 *>(rot_prep);
        const u8 *half = img + OSCAR_K_ROT_PREP_HEADER + (WG ? 0 : BYTES);
        if (threadIdx.x < OSCAR_K_ROT_PREP_HEADER / 16)
            cp_async16(smem_addr(q_prep_hdr) + 16 * threadIdx.x, img + 16 * threadIdx.x, 16);
        for (int i = threadIdx.x; i < BYTES / 16; i += WARPS * 32) cp_async16(smem_addr(rsm) + 16 * i, half + 16 * i, 16);
    }
    cp_async_commit();
    cp_async_wait<1>(); /* this lane's slot ids (R may still be in flight) */
    if (step < steps) issue(src_off_of(step, 0));
    cp_async_commit();
    cp_async_wait<1>(); /* R's image and the table (the rows may still be in flight) */
    bool prep_ok = false;
    if (rot_prep) { /* uniform over the CTA */
        if constexpr (WG) q_fence_proxy_async(); /* cp.async -> wgmma's reads, after the barriers below */
        __syncthreads();
        prep_ok = q_prep_hdr[0] == OSCAR_K_ROT_PREP_MAGIC && q_prep_hdr[1] == OSCAR_K_ROT_PREP_VERSION &&
                  q_prep_hdr[2] == static_cast<u32>(D) && q_prep_hdr[3] == static_cast<u32>(SRC_DTYPE);
    }

    /* R (f32, global) -> bf16/f16 in shared memory, once per CTA, after the
       first rows are on their way; eight chunks' loads are issued before any
       is used, so their latencies overlap (a demotion launch is mostly this) */
    if constexpr (WG) {
      if (rot && !prep_ok) {
        /* WG: R transposed (K-major B), chunk c of row n = R[8c..8c+7][n] at
           q_rwg_off(c, n); a warp's 32 loads of one R row are consecutive
           columns (coalesced) */
        const float *R = reinterpret_cast<const float *>(rot);
        constexpr int ITEMS = D * CHUNKS, PER = 4;
        for (int base = threadIdx.x; base < ITEMS; base += PER * WARPS * 32) {
            float v[PER][8];
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = base + u * WARPS * 32;
                if (i < ITEMS)
#pragma unroll
                    for (int e = 0; e < 8; e++) v[u][e] = R[static_cast<i64>((i / D) * 8 + e) * D + i % D];
            }
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = base + u * WARPS * 32, n = i % D, c = i / D;
                if (i < ITEMS)
                    *reinterpret_cast<uint4 *>(rsm + q_rwg_off<D>(c, n)) =
                        make_uint4(S::pack_rn(v[u][1], v[u][0]), S::pack_rn(v[u][3], v[u][2]),
                                   S::pack_rn(v[u][5], v[u][4]), S::pack_rn(v[u][7], v[u][6]));
            }
        }
        q_fence_proxy_async(); /* st.shared -> wgmma's reads, after the barrier below */
      }
    } else if (rot && !prep_ok) {
        const float *R = reinterpret_cast<const float *>(rot);
        constexpr int ITEMS = D * CHUNKS, PER = 8;
        for (int base = threadIdx.x; base < ITEMS; base += PER * WARPS * 32) {
            float4 a[PER], bq[PER];
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = base + u * WARPS * 32;
                if (i < ITEMS) {
                    const float4 *src4 = reinterpret_cast<const float4 *>(R + static_cast<i64>(i / CHUNKS) * D + (i % CHUNKS) * 8);
                    a[u] = src4[0];
                    bq[u] = src4[1];
                }
            }
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = base + u * WARPS * 32;
                if (i < ITEMS) {
                    uint4 v;
                    v.x = S::pack_rn(a[u].y, a[u].x);
                    v.y = S::pack_rn(a[u].w, a[u].z);
                    v.z = S::pack_rn(bq[u].y, bq[u].x);
                    v.w = S::pack_rn(bq[u].w, bq[u].z);
                    *reinterpret_cast<uint4 *>(rsm + qswz<D>(i / CHUNKS, i % CHUNKS)) = v;
                }
            }
        }
    }
    __syncthreads(); /* R and the threshold table are in shared memory */
    OSCAR_TRACE_MARK(QUANTIZE, WAITED);

    /* WG: the 4 warps of a group take steps 4s..4s+3 and loop together (the
       group's barriers), a warp past the end with empty rows */
    for (int ring = 0; (WG ? step - w4 : step) < steps; step += stride, ring = ring == 2 ? 0 : ring + 1) {
        cp_async_wait<0>();
        __syncwarp();

        /* ---- rotation (WG): y = x @ R for the group's 4 x ROWS rows, one
           64-row m-tile at a time (D / 2 accumulators per thread), rounded to
           the source dtype and written over x, each warp into its own rows */
        if constexpr (WG) {
          if (rot) {
            q_fence_proxy_async(); /* this thread's copies (and last step's y) -> wgmma */
            q_wg_barrier(wgrp);    /* ... and every warp's: the group's rows are in buf */
            /* the warpgroup's slice address as a warp-uniform value (a shuffle
               from lane 0), so its descriptors stay on the uniform datapath */
            const u64 adesc = q_wg_desc(static_cast<u32>(__shfl_sync(0xffffffffu, static_cast<int>(buf_s), 0)));
            const u64 rdesc = q_wg_desc(smem_addr(rsm));
#pragma unroll
            for (int mt = 0; mt < WG_ROWS / 64; mt++) {
                float acc[D / 2];
                q_wg_fence();
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    const u32 koff = static_cast<u32>(ks & 3) * 32; /* 16 columns = 32 bytes into the k block */
                    q_wgmma<SRC_DTYPE, D>(acc, adesc + ((mt * 64 * 128 + (ks >> 2) * KB_B + koff) >> 4),
                                          rdesc + (((ks >> 2) * (D * 128) + koff) >> 4), ks > 0 ? 1u : 0u);
                }
                q_wg_commit_wait();
                q_wg_fence_regs(acc);
                q_wg_barrier(wgrp); /* every warp's part of the MMA has read x: y may replace it */
                /* acc[4n + 0, 1]: tile row 16 w4 + g, cols 8n + 2c, + 1; [4n + 2, 3]: row + 8 */
                const int ln = static_cast<int>(q_opaque(static_cast<u32>(lane)));
                const int g = ln >> 2, c = ln & 3;
                u8 *yrow = buf + (mt * 64 + 16 * w4 + g) * 128 + 4 * c;
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    u8 *y = yrow + (n >> 3) * KB_B + ((static_cast<u32>(n & 7) ^ static_cast<u32>(g)) << 4);
                    *reinterpret_cast<u32 *>(y) = S::pack_rn(acc[4 * n + 1], acc[4 * n + 0]);
                    *reinterpret_cast<u32 *>(y + 8 * 128) = S::pack_rn(acc[4 * n + 3], acc[4 * n + 2]);
                }
            }
            __syncwarp();
          }
        } else if (rot) {
            /* ---- rotation (mma.sync): y = x @ R over the warp's slice, y
               rounded to the source dtype and written over x (A fragments are
               in registers first) */
            /* Lane-dependent addresses are formed here from an opaque copy of
               the lane id: step-invariant, they would otherwise be hoisted out
               of the step loop and held (spilled) through the whole kernel.
               ldmatrix row rr = (mi & 1) * 8 + mr, chunk 2i + (mi >> 1): the
               swizzle only touches the chunk's low 3 bits, so 4 offsets (i % 4)
               plus immediates give every A and B address. */
            const int ln = static_cast<int>(q_opaque(static_cast<u32>(lane)));
            const int mi = ln >> 3, mr = ln & 7, rr = (mi & 1) * 8 + mr;
            u32 o4[4];
#pragma unroll
            for (int i = 0; i < 4; i++)
                o4[i] = static_cast<u32>(rr * D * 2) + (((static_cast<u32>(2 * i + (mi >> 1))) ^ q_rowswz<D>(mr)) << 4);
            const u32 rsm_s = smem_addr(rsm);
            u32 af[MT][KS][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int ks = 0; ks < KS; ks++)
                    ldmatrix_x4(buf_s + o4[ks & 3] + mt * 16 * D * 2 + ((ks >> 2) << 7), af[mt][ks][0], af[mt][ks][1],
                                af[mt][ks][2], af[mt][ks][3]);
            __syncwarp();
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                float acc[MT][2][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int j = 0; j < 2; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    u32 b0, b1, b2, b3;
                    ldmatrix_x4_trans(rsm_s + o4[np & 3] + ks * 16 * D * 2 + ((np >> 2) << 7), b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_16816<SRC_DTYPE>(acc[mt][0], af[mt][ks][0], af[mt][ks][1], af[mt][ks][2], af[mt][ks][3], b0,
                                             b1);
                        mma_16816<SRC_DTYPE>(acc[mt][1], af[mt][ks][0], af[mt][ks][1], af[mt][ks][2], af[mt][ks][3], b2,
                                             b3);
                    }
                }
                /* acc[..][0,1]: row g, cols n*8 + 2c + {0,1}; acc[..][2,3]: row g + 8
                   (rows g and g + 8 share the swizzle: it reads row & 7) */
                const int g = ln >> 2, c = ln & 3;
                u8 *yrow = buf + g * D * 2 + 4 * c;
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int n = 2 * np + j;
                        u8 *y = yrow + mt * 16 * D * 2 + ((n >> 3) << 7) + ((static_cast<u32>(n & 7) ^ q_rowswz<D>(g)) << 4);
                        *reinterpret_cast<u32 *>(y) = S::pack_rn(acc[mt][j][1], acc[mt][j][0]);
                        *reinterpret_cast<u32 *>(y + 8 * D * 2) = S::pack_rn(acc[mt][j][3], acc[mt][j][2]);
                    }
            }
            __syncwarp();
        }

        /* ---- this lane's part of its row: w[q][jp] holds columns
           q*Q4 + h*JW + 2jp (low half) and + 1 (high half) */
        u32 w[4][JP];
        {
            const int ln = static_cast<int>(q_opaque(static_cast<u32>(lane)));
            const int r = ln / LPR, hh = ln % LPR;
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
            for (int cc = 0; cc < JW / 8; cc++) {
                const uint4 v = *reinterpret_cast<const uint4 *>(buf + chunk_off(r, (q * Q4 + hh * JW) / 8 + cc));
                w[q][4 * cc + 0] = v.x, w[q][4 * cc + 1] = v.y, w[q][4 * cc + 2] = v.z, w[q][4 * cc + 3] = v.w;
            }
        }
        __syncwarp(); /* the slice may now be refilled */
        {
            /* refill: rows of the next step, slot ids of the one after */
            const i64 next = step + stride;
            const int ring1 = ring == 2 ? 0 : ring + 1, ring2 = ring1 == 2 ? 0 : ring1 + 1;
            if (next < steps) issue(src_off_of(next, ring1));
            fetch_slots(next + stride, ring2);
            cp_async_commit();
        }

        /* ---- min and max of each group the lane touches */
        float g_mn[LG], g_mx[LG];
        {
            u32 mn2[LG], mx2[LG];
#pragma unroll
            for (int lg = 0; lg < LG; lg++) mn2[lg] = S::VAL_INF | (S::VAL_INF << 16), mx2[lg] = mn2[lg] | 0x80008000u;
#pragma unroll
            for (int q = 0; q < 4; q++)
#pragma unroll
                for (int jp = 0; jp < JP; jp++) {
                    const int lg = EXCL ? q * (JW / GS) + (2 * jp) / GS : (q * Q4) / GS;
                    mn2[lg] = S::min2(mn2[lg], w[q][jp]);
                    mx2[lg] = S::max2(mx2[lg], w[q][jp]);
                }
#pragma unroll
            for (int lg = 0; lg < LG; lg++) {
                g_mn[lg] = fminf(S::lo_f32(mn2[lg]), S::hi_f32(mn2[lg]));
                g_mx[lg] = fmaxf(S::lo_f32(mx2[lg]), S::hi_f32(mx2[lg]));
                if constexpr (LPR == 2 && !EXCL) {
                    g_mn[lg] = fminf(g_mn[lg], __shfl_xor_sync(0xffffffffu, g_mn[lg], 1));
                    g_mx[lg] = fmaxf(g_mx[lg], __shfl_xor_sync(0xffffffffu, g_mx[lg], 1));
                }
            }
        }

        /* ---- clip: tau = the m-th largest |y| = the largest key K with
           count(|y| >= K) >= m (count(>= 0) = D >= m). The first probe is
           max/4 (two binades down), which usually holds. */
        float tau = __uint_as_float(0x7f800000u);
        if (clip_index >= 0) {
            float amax = 0.f;
#pragma unroll
            for (int lg = 0; lg < LG; lg++) amax = fmaxf(amax, fmaxf(g_mx[lg], -g_mn[lg]));
            if constexpr (LPR == 2 && EXCL) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
            const float need = static_cast<float>(D - clip_index);
            const u32 kmax = static_cast<u32>(from_f32(amax, SRC_DTYPE));
            /* bf16 keys >= 0x7C00 (|y| >= 2^121) are not f16 numbers: count them
               with integer compares (exact, slower; never in real caches) */
            const bool exact_int = S::BF16 && __any_sync(0xffffffffu, kmax >= 0x7c00u);
            auto count_ge = [&](u32 key) {
                const u32 kk = key | (key << 16);
                float cnt;
                if (!exact_int) {
                    u32 a[4] = {0u, 0u, 0u, 0u};
#pragma unroll
                    for (int q = 0; q < 4; q++)
#pragma unroll
                        for (int jp = 0; jp < JP; jp++) a[jp & 3] = hadd2(a[jp & 3], q_absge_f16(w[q][jp], kk));
                    const u32 s = hadd2(hadd2(a[0], a[1]), hadd2(a[2], a[3]));
                    cnt = f16_to_f32(static_cast<u16>(s & 0xffffu)) + f16_to_f32(static_cast<u16>(s >> 16));
                } else {
                    u32 a = 0u;
#pragma unroll
                    for (int q = 0; q < 4; q++)
#pragma unroll
                        for (int jp = 0; jp < JP; jp++) a = q_absge_int(a, w[q][jp], kk);
                    cnt = static_cast<float>((a & 0xffffu) + (a >> 16));
                }
                if constexpr (LPR == 2) cnt += __shfl_xor_sync(0xffffffffu, cnt, 1);
                return cnt;
            };
            u32 lo = 0u, hi = kmax;
            bool down;
            {
                /* s22: where m <= D / 16 (K at clip .96: m = 3 / 6 / 11 at D 64 /
                   128 / 256) the first bracket is one binade below the max (7
                   halvings after it instead of 8 where it holds; a miss steps
                   down by 2 binades as before). A warp's probes by a CPU model
                   (docs/quantize.md "Session 22"): near-Gaussian D 128 rows at
                   m = 6 9.00 -> 8.57, real SmolLM2 rows rotated by their OSCAR
                   matrices (D 64, m = 3) 9.07 -> 8.26; heavy tails lose (real
                   unrotated V, Student-t, outlier channels: +0.6-1 probe). On
                   the H200 the clipped prefill -3.7% (v14, same call). Larger m
                   (V at .92: 6 / 11 / 21) keeps two binades: one costs rotated
                   rows 9.0 -> 9.5-10 there (v14's m <= 8 did so at D 64). */
                const u32 first = need <= static_cast<float>(D / 16) ? (1u << MANT_BITS) : (2u << MANT_BITS);
                const u32 probe = hi > first ? hi - first : 0u;
                down = count_ge(probe) < need;
                if (!down)
                    lo = probe;
                else
                    hi = probe - 1u;
            }
            /* s10: where a lane's m-th largest lies more than 2 binades below its
               max (a few large outliers, heavy tails), up to three more steps of
               2 binades down before the halvings: a warp's probes by a CPU model
               (docs/quantize.md) 15.3-15.7 -> 10.2-11.4 with outlier channels,
               13-15 -> ~10 for Student-t rows, 9 -> 9 for near-Gaussian rows
               (they only pay the vote) */
#pragma unroll 1
            for (int step = 0; step < 3 && __any_sync(0xffffffffu, down && hi > (2u << MANT_BITS)); step++) {
                const bool mine = down && hi > (2u << MANT_BITS);
                const u32 probe = mine ? hi - (2u << MANT_BITS) : hi;
                const float cnt = count_ge(probe); /* every lane takes part (shuffles) */
                if (mine) {
                    if (cnt >= need)
                        lo = probe, down = false;
                    else
                        hi = probe - 1u;
                }
            }
            while (__any_sync(0xffffffffu, lo < hi)) {
                const u32 mid = (lo + hi + 1u) >> 1;
                const float cnt = count_ge(mid); /* every lane takes part in the shuffles */
                if (lo < hi) {
                    if (cnt >= need)
                        lo = mid;
                    else
                        hi = mid - 1u;
                }
            }
            tau = to_f32<SRC_DTYPE>(static_cast<u16>(lo));
#pragma unroll
            for (int lg = 0; lg < LG; lg++) {
                g_mn[lg] = fminf(fmaxf(g_mn[lg], -tau), tau);
                g_mx[lg] = fminf(fmaxf(g_mx[lg], -tau), tau);
            }
        }

        /* ---- per group: scale and offset, and the three code thresholds */
        i64 code_off, scale_off;
        dst_offs_of(step, ring, code_off, scale_off);
        /* group lg's (scale, zero | min), stored as soon as it is known */
        auto store_scale = [&](int lg, float scale, float zero, float mn) {
            int gi = lg;
            if constexpr (EXCL) gi = (lg / (JW / GS)) * (Q4 / GS) + h * (JW / GS) + lg % (JW / GS);
            if (scale_off >= 0 && (EXCL || h == 0)) {
                u8 *srow = scales_base + scale_off;
                if (p.pool.scale_layout == OSCAR_K_SCALE_F32_SCALE_ZERO)
                    *reinterpret_cast<float2 *>(srow + 8 * gi) = make_float2(scale, zero);
                else
                    *reinterpret_cast<u32 *>(srow + 4 * gi) = pack_half2(f32_to_f16(scale), f32_to_f16(mn));
            }
        };
        u32 thr[LG][3];
        q_formula f;
        if (p.lloyd_max) {
            /* one group per row (validated). Sums over the clipped values in
               the reference's order: per c = (col % 8) / 2, columns ascending */
            float s[4] = {0.f, 0.f, 0.f, 0.f}, qq[4] = {0.f, 0.f, 0.f, 0.f};
            auto clipv = [&](float v) { return fminf(fmaxf(v, -tau), tau); };
            auto add_quarter = [&](int q, float mean, bool sq) {
#pragma unroll
                for (int jp = 0; jp < JP; jp++) {
                    const u32 wv = q_opaque(w[q][jp]);
                    const float v0 = clipv(S::lo_f32(wv)), v1 = clipv(S::hi_f32(wv));
                    if (!sq) {
                        s[jp & 3] = __fadd_rn(__fadd_rn(s[jp & 3], v0), v1);
                    } else {
                        const float d0 = __fsub_rn(v0, mean), d1 = __fsub_rn(v1, mean);
                        qq[jp & 3] = __fadd_rn(qq[jp & 3], __fmul_rn(d0, d0));
                        qq[jp & 3] = __fadd_rn(qq[jp & 3], __fmul_rn(d1, d1));
                    }
                }
            };
            auto row_sum = [&](float mean, bool sq) {
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    if constexpr (LPR == 1) {
                        add_quarter(q, mean, sq);
                    } else {
                        /* the two lanes' columns interleave per quarter: hand the
                           running sums over so the order stays the reference's */
                        if (h == 0) add_quarter(q, mean, sq);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            s[i] = __shfl_sync(0xffffffffu, s[i], lane & ~1);
                            qq[i] = __shfl_sync(0xffffffffu, qq[i], lane & ~1);
                        }
                        if (h == 1) add_quarter(q, mean, sq);
#pragma unroll
                        for (int i = 0; i < 4; i++) {
                            s[i] = __shfl_sync(0xffffffffu, s[i], lane | 1);
                            qq[i] = __shfl_sync(0xffffffffu, qq[i], lane | 1);
                        }
                    }
                }
            };
            row_sum(0.f, false);
            const float mean = __fdiv_rn(__fadd_rn(__fadd_rn(s[0], s[1]), __fadd_rn(s[2], s[3])), static_cast<float>(D));
            row_sum(mean, true);
            const float var = __fdiv_rn(__fadd_rn(__fadd_rn(qq[0], qq[1]), __fadd_rn(qq[2], qq[3])), static_cast<float>(D));
            const float sd = __fsqrt_rn(__fadd_rn(var, 1e-8f));
            f.a = sd, f.b = mean, f.inv = __frcp_rn(sd), f.lloyd_max = true;
            const float sc = __fmul_rn(LM_SCALE, sd);
            const u32 olo = q_ord(from_f32(g_mn[0], SRC_DTYPE)), ohi = q_ord(from_f32(g_mx[0], SRC_DTYPE));
            u32 t0 = 0u, t1 = 0u, t2 = 0u;
#pragma unroll 1
            for (int k = 0; k < 3; k++) {
                const float lv = static_cast<float>(k - 1) * LM_THRESHOLD; /* -T, 0, T */
                const u32 t = q_threshold<SRC_DTYPE>(f, lv, __fmaf_rn(lv, sd, mean), Q_NO_CAND, olo, ohi);
                t0 = k == 0 ? t : t0, t1 = k == 1 ? t : t1, t2 = k == 2 ? t : t2;
            }
            thr[0][0] = t0, thr[0][1] = t1, thr[0][2] = t2;
            store_scale(0, sc, __fsub_rn(1.5f, __fdiv_rn(mean, sc)), __fsub_rn(mean, __fmul_rn(1.5f, sc)));
#pragma unroll
            for (int lg = 1; lg < LG; lg++) thr[lg][0] = thr[0][0], thr[lg][1] = thr[0][1], thr[lg][2] = thr[0][2];
        } else {
#pragma unroll
            for (int lg = 0; lg < LG; lg++) {
                const float mn = g_mn[lg], mx = g_mx[lg];
                float scale, zero;
                q_uniform_scale_zero(mn, mx, scale, zero);
                store_scale(lg, scale, zero, mn);
                if (use_tab && mn == -tau && mx == tau) {
                    const u32 tb = __float_as_uint(tau) >> 16, e = tb >> 7, m = tb & 127u;
                    const u32 e0 = q_tab[m * 3], e1 = q_tab[m * 3 + 1], e2 = q_tab[m * 3 + 2];
                    if (e >= static_cast<u32>(Q_TAB_EMIN) && e <= static_cast<u32>(Q_TAB_EMAX) && (e0 & e1 & e2 & 0x10000u)) {
                        const int de = static_cast<int>(e) - 127;
                        const u32 t0 = q_tab_shift(e0 & 0xffffu, de), t1 = q_tab_shift(e1 & 0xffffu, de),
                                  t2 = q_tab_shift(e2 & 0xffffu, de);
                        thr[lg][0] = t0 | (t0 << 16), thr[lg][1] = t1 | (t1 << 16), thr[lg][2] = t2 | (t2 << 16);
                        continue;
                    }
                }
                f.a = scale, f.b = zero, f.inv = __frcp_rn(scale), f.lloyd_max = false;
                const u32 olo = q_ord(from_f32(mn, SRC_DTYPE)), ohi = q_ord(from_f32(mx, SRC_DTYPE));
                q_uniform_thresholds<SRC_DTYPE>(f, scale, zero, mn, olo, ohi, thr[lg][0], thr[lg][1], thr[lg][2]);
            }
        }

        /* ---- codes: code = [y >= t1] + [y >= t2] + [y >= t3]; bit 1 = [y >= t2],
           bit 0 = the xor of the three (thermometer; two compares below). Word jp of quarter q
           feeds lane bytes 2jp (low half) and 2jp + 1 (high half) at bits 2q,
           2q + 1; even words go to bytes 0 and 2 of an output word, odd ones to
           1 and 3, and one PRMT restores the byte order. */
        u32 out[JP / 2];
#pragma unroll
        for (int j2 = 0; j2 < JP / 2; j2++) {
            u32 acc = 0u;
#pragma unroll
            for (int par = 0; par < 2; par++) {
                const int jp = 2 * j2 + par;
#pragma unroll
                for (int q = 0; q < 4; q++) {
                    const int lg = EXCL ? q * (JW / GS) + (2 * jp) / GS : (q * Q4) / GS;
                    /* s21: two compares, not three -- with t1 <= t2 <= t3 (the
                       thresholds of a monotone code), y >= t2 gives code 2 + [y
                       >= t3] and y < t2 gives [y >= t1]: bit 0 is [y >= (y >= t2 ?
                       t3 : t1)], the threshold picked per half by one LOP3
                       (HSET2 issues at half rate on the ALU pipe, as the LOP3s) */
                    const u32 m2 = S::ge_mask(w[q][jp], thr[lg][1]);
                    const u32 t13 = (thr[lg][2] & m2) | (thr[lg][0] & ~m2);
                    const u32 b0 = S::ge_mask(w[q][jp], t13);
                    const u32 c0 = par == 0 ? (1u << (2 * q)) | (1u << (16 + 2 * q)) : (1u << (8 + 2 * q)) | (1u << (24 + 2 * q));
                    acc |= (b0 & c0) | (m2 & (c0 << 1));
                }
            }
            out[j2] = __byte_perm(acc, 0u, 0x3120);
        }

        /* ---- store the codes */
        if (code_off >= 0) {
            u8 *crow = codes_base + code_off + h * JW;
            if constexpr (JW % 16 == 0) {
#pragma unroll
                for (int i = 0; i < JW / 16; i++)
                    *reinterpret_cast<uint4 *>(crow + 16 * i) = make_uint4(out[4 * i], out[4 * i + 1], out[4 * i + 2], out[4 * i + 3]);
            } else {
                *reinterpret_cast<uint2 *>(crow) = make_uint2(out[0], out[1]);
            }
        }
    }
    OSCAR_TRACE_MARK(QUANTIZE, DONE);
    cp_async_wait<0>();
}

/* oscar_prepare_rotation's image of R for quantize_kernel<HEAD_DIM, ..,
   SRC_DTYPE, ..>: the header, then R rounded to SRC_DTYPE (the same rounding
   as the kernel's staging) in the wgmma path's layout (q_rwg_off) and in
   the mma.sync path's (qswz), each exactly the bytes the kernel's f32
   staging writes to its shared memory. One thread per chunk. */
template <int HEAD_DIM, int SRC_DTYPE>
__global__ void __launch_bounds__(256) rotation_prepare_kernel(const __grid_constant__ oscar_rotation_prepare_params p) {
    using namespace detail;
    using S = qsimd<SRC_DTYPE>;
    constexpr int D = HEAD_DIM, CHUNKS = D / 8, ITEMS = D * CHUNKS, BYTES = D * D * 2;
    static_assert(D == 64 || D == 128 || D == 256, "head dim");
    const float *R = reinterpret_cast<const float *>(p.rotation);
    u8 *img = reinterpret_cast<u8 *>(p.out), *wg = img + OSCAR_K_ROT_PREP_HEADER, *ms = wg + BYTES;
    const int i = static_cast<int>(blockIdx.x) * 256 + static_cast<int>(threadIdx.x);
    if (i < OSCAR_K_ROT_PREP_HEADER / 16) {
        const u32 w0 = i == 0 ? OSCAR_K_ROT_PREP_MAGIC : 0u, w1 = i == 0 ? OSCAR_K_ROT_PREP_VERSION : 0u;
        const u32 w2 = i == 0 ? static_cast<u32>(D) : 0u, w3 = i == 0 ? static_cast<u32>(SRC_DTYPE) : 0u;
        reinterpret_cast<uint4 *>(img)[i] = make_uint4(w0, w1, w2, w3);
    }
    if (i >= ITEMS) return;
    {
        const int c = i / D, n = i % D;
        float v[8];
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = R[static_cast<i64>(c * 8 + e) * D + n];
        *reinterpret_cast<uint4 *>(wg + q_rwg_off<D>(c, n)) =
            make_uint4(S::pack_rn(v[1], v[0]), S::pack_rn(v[3], v[2]), S::pack_rn(v[5], v[4]), S::pack_rn(v[7], v[6]));
    }
    {
        const int row = i / CHUNKS, ch = i % CHUNKS;
        const float4 *src4 = reinterpret_cast<const float4 *>(R + static_cast<i64>(row) * D + ch * 8);
        const float4 a = src4[0], b = src4[1];
        *reinterpret_cast<uint4 *>(ms + qswz<D>(row, ch)) =
            make_uint4(S::pack_rn(a.y, a.x), S::pack_rn(a.w, a.z), S::pack_rn(b.y, b.x), S::pack_rn(b.w, b.z));
    }
}

}  // namespace oscar

#endif  // OSCAR_K_QUANTIZE_CUH
