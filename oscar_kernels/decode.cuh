/* oscar_kernels/decode.cuh -- one decode step of attention for a batch of
   requests: INT2 history in oscar's pool + bf16/f16 sink and recent windows
   in the engine's own paged cache, split-KV, merged exactly.

   Four kernels, launched in this order by oscar_decode_run:
     decode_prep_kernel<D,GS,H>        q -> q' = q @ R_k (the INT2 part's query),
                                       pre-scaled, as the INT2 kernel's IMMA
                                       fragments (signed 8-bit digits)
     decode_int2_kernel<D,GS,PS,H,SL>  INT2 paged tokens, straight from the codes
                                       (SL: the pool's scale layout)
     decode_window_kernel<D,NH,KV,W>   bf16/f16 (KV) paged tokens (sink + recent;
                                       also the BF16 baseline over a whole
                                       context); reads only inputs, so it
                                       overlaps the INT2 tier and writes without
                                       waiting; W warps per CTA (4, or 2 at D 256)
     decode_merge_kernel<D,ROWS,DS>    splits -> INT2 part @ R_v^T -> merge with
                                       the window part -> o, lse; waits only for
                                       its own groups' splits (split_counters);
                                       ROWS (request, head) rows per CTA, DS CTAs
                                       per group (or decode_merge_head_kernel<D>:
                                       one CTA per query head at small batch)
   q  [batch][q heads][D] bf16|f16 (strides)       o [batch][q heads][D] bf16|f16
   INT2 pool as oscar_int2_pool_desc; pages listed per request in CSR form
   (indptr[batch+1], indices, last_page_len[batch]) as FlashInfer does; the
   window cache likewise with its own CSR table.
   workspace: q' digit fragments, group sums and scales (q_workspace), partial
   o [b][h][splits][D] f32, lse [b][h][splits] f32, split counters [b][kv h] u32.

   The INT2 tier never dequantizes into memory or registers as values:
     s[t,h]  = sum_g scale[t,g] * (q' . codes[t, group g]) + sum_g min[t,g] * sum_{d in g} q'[h,d]
     o[h,d]  = sum_t codes[t,d] * (p[t,h] * scale[t,g(d)]) + sum_t p[t,h] * min[t,g(d)]
   so the tensor cores see the raw codes (exact small integers).
   QK (v6): integer tensor cores, mma m16n8k32 u8 x s8 -> s32. One AND of a
   code word keeps quarter k of 4 bytes: code * 4^k as 4 u8 values, no
   conversion; q' is an integer per head (24 bits of its largest element)
   times 4^(3-k), as four s8 digits in four B columns, so the s32 sums are
   exact and one IMAD + I2F per digit pair rebuilds the dot product. At 8
   and 16 heads, three digits (v20, q_digits).
   PV: p*scale in bf16 hi + lo against the codes as exact bf16 values,
   mma m16n8k16, f32 accumulation; v7: one AND per code pair (the codes as
   bf16 subnormals, code * 4^k * 2^-133, weights scaled by 2^64, the sums
   by 2^69 / 4^k), v3-v6: a LOP3 and an HFMA2 per pair. v23: at 8 and 16
   heads one f16 weight per token and head (the same code bits as f16
   subnormals, code * 4^k * 2^-24) with a per-head unit that follows the
   data, one mma per n-tile instead of two.
   Dims are permuted inside a k-step / m-tile so that a thread's fragment
   elements come from the bytes ldmatrix gave it (a dot product is
   order-free); the output dims are mapped back when stored. Lane (g, c) owns
   heads c + 4j: their logits for tokens g, g + 8 of each 16-token sub-tile,
   softmax state and output columns; p moves to the PV B layout with
   movmatrix. Softmax is online in base 2 with f32 state per head.
   v18 (session 25): 16-warp INT2 CTAs for small batches with long contexts
   (a template parameter; the plan's choice): 1 x 256K 59 -> 53 us on the H200.
   v12-v17, v19: docs/decode.md.
   v20 (session 28): q' as three digits at 8 and 16 heads per KV head (a
   quarter fewer QK IMMA; the codes of quarters 2-3 shifted down so q' keeps
   20-22 bits): ratio 8 -2 to -5%, ratio 16 -8 to -10% on the H200; the
   4-head kernels unchanged.
   v21 (session 30): the window kernel loads q before it walks its page
   table (the BF16 baseline 1 x 8K -8 to -10% on the H200; the step within
   its spread).
   v23 (session 40): f16 PV weights at 8 and 16 heads per KV head, each
   head's unit 2^U re-anchored at the lazy rescales and a guard on the V
   scales that forces one before any weight could overflow f16 (see
   decode_int2_kernel); decode_prep_kernel held to 96 registers up to D 128
   so two such INT2 CTAs start beside it. The 4-head kernels unchanged
   (same SASS). docs/decode.md "Session 40".
   v11: prep's q loads all in flight (raw values first, one scale; v10's
   change there had not taken effect: SASS), and the per-head merge loads its
   first split partials with the weights' round trip instead of three round
   trips after it; 1 x 128K in a CUDA graph 38.7 -> 37.0 us (docs/decode.md).
   v10: per-(request, KV head) split counters instead of grid-completion
   waits between the tiers, and every load of q in flight before its first use
   in the window kernel (a per-CTA globaltimer trace showed 5-9 us of every
   window CTA spent on one dependent round trip per q pair); 8 x 32K 71 -> 67
   us, 128 x 4K 182 -> 176 on the H200 (docs/decode.md).
   v9: the INT2 kernel at D 128 / one group per row bounded to 4 CTAs per SM.
   v8: prep and merge take several requests per CTA at large batch (R read
   once for them), the merge's mat-vec reads 16 bytes at a time, window
   kernel v2 (whole-row copies; 480 -> 365 SASS per tile); 128 x 4K 230 ->
   191 us on the H200 (docs/decode.md).
   v7: V codes as bf16 subnormals (no offset, no HFMA2; loop 489 -> 411
   SASS instructions per 32-token tile at D 128 / group 128 / 4 heads).
   v6: QK on IMMA (32x32K, H200: 329 -> 268 us with the same splits; loop
   ~690 -> ~455 SASS instructions per 32-token tile); one head per lane (v5
   duplicated the PACK logits on half the lanes); the page position kept
   incrementally (no division per tile for a run-time page size); compiled
   per scale layout (a run-time layout predicated every scale load twice).
   v5: PACK (hi | lo halves of one n-tile for <= 4 heads), lazy rescaling,
   tuned splits. v4: each warp walked only its own tiles (v1-v3 walked all).
   v3: p (and p * scale) as hi + lo too: o within ~1e-3 of float64 (bf16 output).
   v2: q' as f16 hi + lo (logits to ~1e-6); prep/merge rebuilt for latency; PDL.
   v1: first version (lse off by ~3e-3 at logits ~20; merge latency-bound). */
#ifndef OSCAR_K_DECODE_CUH
#define OSCAR_K_DECODE_CUH

#include "common.cuh"

namespace oscar {
namespace detail {

__device__ __forceinline__ float neg_inf() { return __int_as_float(0xff800000); }
__device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
__device__ __forceinline__ float tanh_approx(float x) {
    float y;
    asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}
/* {lo, hi} floats -> packed 16-bit pair of DTYPE */
template <int DTYPE>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
    u32 d;
    if constexpr (DTYPE == OSCAR_K_DTYPE_F16)
        asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    else
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

/* Programmatic dependent launch (sm_90): a kernel may start while the one
   before it in the stream finishes; it waits here before touching what that
   one wrote, and lets the next one start early. Every CTA waits before it
   exits, so a grid's completion implies its predecessors'. No-ops below sm_90. */
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_next() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* v10: per-(request, KV head) completion counters, u32 [batch][kv heads], in
   the workspace after the split lse (the host sizes it the same way). With
   an INT2 tier (int2_splits > 0) every INT2 and window CTA adds 1 to its
   group's counter once its partial state is written, and the merge waits for
   int2_splits + win_splits there instead of for the window grid's
   completion (v2-v9: the window kernel waited for the whole INT2 grid before
   writing, the merge for the whole window grid; a grid-completion wait costs
   the slowest group and the release latency, twice). Known state: the prep
   kernel zeroes its groups' counters; the INT2 CTAs trigger the next launch
   only after their wait for prep, so every later CTA (window, merge) starts
   after the zeroes are visible. Spinning is safe: a merge CTA starts only
   after every INT2 and window CTA has started (each triggers or exits). */
__device__ __forceinline__ u32 *split_counters(const oscar_decode_params &p) {
    const i64 lse_bytes = static_cast<i64>(p.batch_size) * p.num_q_heads * (p.int2_splits + p.win_splits) * 4;
    return reinterpret_cast<u32 *>(p.ws_lse + ((lse_bytes + 255) & ~static_cast<i64>(255)));
}
/* every thread's partial-state stores, then one release add for the CTA */
__device__ __forceinline__ void signal_split_done(const oscar_decode_params &p, int b, int kvh) {
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        u32 *c = split_counters(p) + static_cast<i64>(b) * p.pool.num_kv_heads + kvh;
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(c) : "memory");
    }
}
/* one thread: until every split of group (b, kvh) has signalled */
__device__ __forceinline__ void wait_splits_done(const oscar_decode_params &p, int b, int kvh) {
    const u32 *c = split_counters(p) + static_cast<i64>(b) * p.pool.num_kv_heads + kvh;
    const u32 target = static_cast<u32>(p.int2_splits + p.win_splits);
    for (;;) {
        u32 v;
        asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(c) : "memory");
        if (v >= target) break;
        __nanosleep(64);
    }
}

/* q scaled so that logits come out in base 2 (or in units of the soft-cap),
   as both the prep kernel (for q') and the window kernel (for q) use it. */
__device__ __forceinline__ float q_scale(const oscar_decode_params &p) {
    return p.logit_cap > 0.f ? p.sm_scale / p.logit_cap : p.sm_scale * 1.4426950408889634f;
}
__device__ __forceinline__ float q_value(const oscar_decode_params &p, u16 x, float scale) {
    return (p.q_dtype == OSCAR_K_DTYPE_F16 ? f16_to_f32(x) : bf16_to_f32(x)) * scale;
}

/* Workspace regions of the prepared queries (written by decode_prep_kernel,
   read by decode_int2_kernel), per (request, KV head):
     frags  [NT n-tiles][D/32 k-steps][32 lanes] uint2: the IMMA B
            fragments of q' as signed base-256 digits (see decode_prep_kernel;
            NT = HEADS / 2 with four digits, 3 HEADS / 8 with three)
     sums   [HEADS][G] f32: sum of q' over each group (as the digits carry it),
            then [HEADS] f32: 1 / (64 S_h) (q_digits: 2^(e - QBITS - QSHIFT)), what turns a head's integer dot
            products back into q' . codes */
/* q' as signed base-256 digits in the IMMA's B operand.
   Four digits at 4 heads (where 12 digit columns would fill two n-tiles all
   the same): the codes of quarter k go in as code * 4^k (one AND per 4
   codes, qk_code_frags), so q' is M = rint(q' S) with |M| < 2^23 and its
   quarter-k values are M * 4^(3-k) (< 2^29).
   Three digits at 8 and 16 heads (v20: a quarter fewer QK IMMA per tile,
   qk_digit_ntile): the codes of quarters 2 and 3 are shifted down first
   (one SHF per code word: quarters as code * 1, * 4, * 1, * 4), so a value
   is rint(q' C / 4^(k & 1)) with |q' C| < 2^22: q' to 22 bits in quarters 0
   and 2, 20 in 1 and 3, and |value| <= 2^22 keeps the top digit in
   [-64, 64]. (Without the shift, q' to 17 bits for every quarter took the
   lse 1.4e-3 from the float64 reference at lse ~51, past the 1e-3 bound.) */
template <int HEADS>
struct q_digits {
    static constexpr int DIGITS = HEADS == 4 ? 4 : 3;
    static constexpr bool SHIFTED = DIGITS == 3; /* quarters 2 and 3 shifted down (qk_code_frags) */
    /* log2 of the scale for amax < 2^e: S = 2^(QBITS - e) */
    static constexpr int QBITS = DIGITS == 4 ? 23 : 22;
    /* 1 / (the integer dot product's scale) = 2^(e - QBITS - QSHIFT) */
    static constexpr int QSHIFT = DIGITS == 4 ? 6 : 0;
    static constexpr int NT = HEADS * DIGITS / 8; /* QK n-tiles */
};
/* The n-tile and column of digit k of head h (h < HEADS) in the IMMA B
   operand, chosen so that lane c of an accumulator fragment (columns 2c,
   2c + 1) holds the digits of its heads c + 4 j. Four digits: n-tile
   2 (h / 4) + k / 2, column 2 (h % 4) + k % 2 (digits 0 + 1 and 2 + 3 side by
   side). Three digits, per pair of head slots (2 jp, 2 jp + 1): digits 0 and
   1 of slot e in n-tile 3 jp + e, columns 2 (h % 4) + k; digit 2 of both in
   n-tile 3 jp + 2, column 2 (h % 4) + e. */
template <int HEADS>
__device__ __forceinline__ void qk_digit_ntile(int h, int k, int &nt, int &col) {
    if constexpr (q_digits<HEADS>::DIGITS == 4) {
        nt = 2 * (h / 4) + k / 2, col = 2 * (h % 4) + (k & 1);
    } else {
        const int jp = h / 8, e = (h / 4) & 1;
        nt = k < 2 ? 3 * jp + e : 3 * jp + 2, col = 2 * (h % 4) + (k < 2 ? k : e);
    }
}
template <int D, int HEADS>
struct q_workspace {
    static constexpr int NT = q_digits<HEADS>::NT, KSI = D / 32;
    __device__ static uint2 *frags(const oscar_decode_params &p, int b, int kvh) {
        return reinterpret_cast<uint2 *>(p.ws_q) + (static_cast<i64>(b) * p.pool.num_kv_heads + kvh) * NT * KSI * 32;
    }
    __device__ static float *sums(const oscar_decode_params &p, int b, int kvh, int g) {
        const i64 frag_bytes = static_cast<i64>(p.batch_size) * p.pool.num_kv_heads * NT * KSI * 32 * 8;
        return reinterpret_cast<float *>(reinterpret_cast<u8 *>(p.ws_q) + frag_bytes) +
               (static_cast<i64>(b) * p.pool.num_kv_heads + kvh) * HEADS * (g + 1);
    }
};

/* (x0, x1) as a 16-bit pair hi and the remainder lo (hi + lo carries ~16
   significant bits), in the mma C layout. */
template <int DTYPE>
__device__ __forceinline__ void hi_lo_pair(float x0, float x1, u32 &hi, u32 &lo) {
    hi = pack2<DTYPE>(x0, x1);
    lo = pack2<DTYPE>(x0 - to_f32<DTYPE>(static_cast<u16>(hi & 0xffffu)), x1 - to_f32<DTYPE>(static_cast<u16>(hi >> 16)));
}
/* Both parts moved to the mma B layout (movmatrix). */
template <int DTYPE>
__device__ __forceinline__ void split_pair(float x0, float x1, u32 &hi, u32 &lo) {
    hi_lo_pair<DTYPE>(x0, x1, hi, lo);
    hi = movmatrix_trans(hi);
    lo = movmatrix_trans(lo);
}
/* One value as the bf16 pair (hi, lo): hi in the low half (mma column 2c),
   the remainder lo in the high half (column 2c + 1). hi is x truncated to
   bf16 (exact: one AND), lo the remainder rounded, so hi + lo carries ~15
   bits in 3 instructions (v11 rounded hi first: ~16 bits in 4). */
__device__ __forceinline__ u32 hi_lo_one_trunc(float x) {
    const float h = __uint_as_float(__float_as_uint(x) & 0xffff0000u);
    return pack2<OSCAR_K_DTYPE_BF16>(h, x - h);
}

/* D[16x8] += A[16x32] * B[32x8]: u8 codes times s8 digits, exact s32 accumulation. */
__device__ __forceinline__ void imma_16832(int (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* D[16x8] += A[16x8] * B[8x8] on the tf32 tensor cores, f32 accumulate. The
   operands are f32 bit patterns; the mma reads their top 19 bits (tf32). */
__device__ __forceinline__ void mma_1688_tf32(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
                 "{%0, %1, %2, %3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
/* x rounded to the nearest tf32 (ties away from zero; 10 mantissa bits,
   relative error <= 2^-11), as the mma's operand word. */
__device__ __forceinline__ u32 tf32_round(float x) {
    u32 h;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(h) : "f"(x));
    return h;
}

/* The QK A fragments of k-step ks (m16n8k32, u8) from a lane's ldmatrix
   registers: each register is 4 code bytes of one token (byte j of the
   quartered packing holds dims j, j + D/4, j + D/2, j + 3D/4), and one AND
   keeps quarter k of all four as code * 4^k (0..192): 4 codes per LOP3, no
   conversion. The 4^k goes into q's digits (decode_prep_kernel).
   D >= 128: block ks / 4, quarter ks % 4 of r[block][0..3]
   (token g | g + 8, bytes 4c.. | 16 + 4c..). D = 64 (16-byte rows): quarter
   2 ks of r[0][0..1] in k 0-15, quarter 2 ks + 1 in k 16-31. */
template <int D, int NBLK, bool SHIFTED = false>
__device__ __forceinline__ void qk_code_frags(const u32 (&r)[NBLK][4], int ks, u32 &a0, u32 &a1, u32 &a2, u32 &a3) {
    /* SHIFTED (q_digits): quarters 2 and 3 from the word shifted down by 4,
       as code * 1 and code * 4 */
    if constexpr (D == 64) {
        const int sh = SHIFTED ? 0 : 4 * ks;
        const u32 m0 = 0x03030303u << sh, m1 = 0x03030303u << (sh + 2);
        const u32 w0 = SHIFTED && ks == 1 ? r[0][0] >> 4 : r[0][0], w1 = SHIFTED && ks == 1 ? r[0][1] >> 4 : r[0][1];
        a0 = w0 & m0, a1 = w1 & m0, a2 = w0 & m1, a3 = w1 & m1;
    } else {
        const int bk = ks / 4, k = ks % 4, sh = SHIFTED && k >= 2 ? 4 : 0;
        const u32 m = 0x03030303u << (2 * k - sh);
        a0 = (r[bk][0] >> sh) & m, a1 = (r[bk][1] >> sh) & m, a2 = (r[bk][2] >> sh) & m, a3 = (r[bk][3] >> sh) & m;
    }
}

/* Exact codes of quarter k of bytes (0, 2) of r as two bf16 values, one AND
   (v7): with no exponent bits set, the low byte n of each half is the bf16
   n * 2^-133 (subnormals continue into the first binade exactly for n < 256),
   so the pair is code * 4^k * 2^-133 with no offset to remove -- the tensor
   cores take subnormal bf16 inputs as they are. The caller scales the weights
   by 2^PV_W_SHIFT (so the products are normal f32; v12: through ex2's
   reference, removed from l and the min sums by pv_weight_inverse after the
   loop) and the m-tile's sums by
   pv_out_factor(k). v3-v6 set the exponent of 128 with an OR and removed
   the offset with an HFMA2 (and shifted quarter 3 down first): 64 HFMA2 +
   16 SHF more per 32-token tile. */
constexpr int PV_W_SHIFT = 64;
__device__ __forceinline__ u32 code_pair(u32 r, int k) { return r & (0x00030003u << (2 * k)); }
/* 2^-PV_W_SHIFT */
__device__ __forceinline__ float pv_weight_inverse() { return __int_as_float((127 - PV_W_SHIFT) << 23); }
/* 2^(133 - PV_W_SHIFT) / 4^k, exactly */
__device__ __forceinline__ float pv_out_factor(int k) { return __int_as_float((127 + 133 - PV_W_SHIFT - 2 * k) << 23); }
/* v23, 8 and 16 heads: the same code bits read as f16 are code * 4^k * 2^-24
   (f16 subnormals, exact; the tensor cores keep them), so with f16 weights
   the m-tile's sums are scaled back by 2^24 / 4^k */
__device__ __forceinline__ float pv_out_factor_f16(int k) { return __int_as_float((127 + 24 - 2 * k) << 23); }
/* v23: bounds of the per-head weight unit 2^U (see decode_int2_kernel): p in
   units stays below 2^(8 + 90), so l's sums stay finite in f32 */
constexpr float PV_UNIT_LIMIT = 90.f;

/* The four PV A-fragment registers of m-tile mt from a lane's ldmatrix.trans
   registers r (see int2_map::v_dim for which dims they hold). D >= 128:
   block mt / 8, byte-in-pair (mt % 8) / 4, quarter mt % 4 of r[block][0..3].
   D = 64: quarter mt of the low and high bytes of r[0][0..1] (dims g, g + 8
   first). */
template <int D, int NBLK>
__device__ __forceinline__ void v_code_frags(const u32 (&r)[NBLK][4], int mt, u32 &a0, u32 &a1, u32 &a2, u32 &a3) {
    if constexpr (D == 64) {
        const u32 lo0 = r[0][0], lo1 = r[0][1], hi0 = lo0 >> 8, hi1 = lo1 >> 8;
        a0 = code_pair(lo0, mt), a1 = code_pair(hi0, mt), a2 = code_pair(lo1, mt), a3 = code_pair(hi1, mt);
    } else {
        const int bk = mt / 8, i = (mt % 8) / 4, k = mt % 4;
        a0 = code_pair(i ? r[bk][0] >> 8 : r[bk][0], k);
        a1 = code_pair(i ? r[bk][1] >> 8 : r[bk][1], k);
        a2 = code_pair(i ? r[bk][2] >> 8 : r[bk][2], k);
        a3 = code_pair(i ? r[bk][3] >> 8 : r[bk][3], k);
    }
}

/* Sum over the 8 lanes that share c (the rows of one mma fragment column). */
__device__ __forceinline__ float row_lanes_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    return v + __shfl_xor_sync(0xffffffffu, v, 16);
}

/* Where the fragment elements of k-step ks (QK) and m-tile mt (PV) come from
   in a packed row: for D >= 128, 32-byte blocks, quarter k (and for PV the
   byte in a pair j); for D = 64, one 16-byte block. Natural dims of this
   lane's elements: */
template <int D>
struct int2_map {
    static constexpr int Q4 = D / 4;
    /* QK with IMMA: the natural dim and the quarter of k index kk (0..31) of
       k-step ks (qk_code_frags); every k-step covers 32 consecutive dims */
    __device__ static int qk_dim(int ks, int kk, int &quarter) {
        if constexpr (D == 64) {
            quarter = 2 * ks + (kk >> 4);
            return quarter * 16 + (kk & 15);
        } else {
            quarter = ks % 4;
            return quarter * Q4 + 32 * (ks / 4) + kk;
        }
    }
    __device__ static constexpr int qk_group_base(int ks) { return D == 64 ? 32 * ks : (ks % 4) * Q4 + 32 * (ks / 4); }
    /* PV, A operand row g (half 0) or g + 8 (half 1) */
    __device__ static int v_dim(int mt, int g, int half) {
        if constexpr (D == 64) {
            return 16 * mt + 2 * g + half;
        } else {
            const int bk = mt / 8, j = (mt % 8) / 4, k = mt % 4;
            return 32 * bk + k * Q4 + 2 * g + j + 16 * half;
        }
    }
    /* PV: the quarter whose codes m-tile mt holds (v_code_frags) */
    __device__ static constexpr int v_quarter(int mt) { return D == 64 ? mt : mt % 4; }
    __device__ static constexpr int v_group_base(int mt) {
        return D == 64 ? 16 * mt : 32 * (mt / 8) + (mt % 4) * Q4;
    }
};

/* Byte offset of 16-byte chunk ch of row r in a [rows][row_bytes] tile,
   swizzled so that ldmatrix's 8 consecutive rows fall in 8 different 16-byte
   bank groups. */
template <int ROW_BYTES>
__device__ __forceinline__ u32 tile_off(int r, int ch) {
    constexpr int CH = ROW_BYTES / 16;
    if constexpr (CH == 1) {
        return static_cast<u32>(r * 16);
    } else if constexpr (CH < 8) {
        return static_cast<u32>(r * ROW_BYTES + ((ch ^ ((r / (8 / CH)) & (CH - 1))) << 4));
    } else {
        return static_cast<u32>(r * ROW_BYTES + ((ch ^ (r & 7)) << 4));
    }
}

__device__ __forceinline__ void cp_async8(u32 dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(u32 dst, const void *src, int src_bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}

/* Number of tokens of request b in a CSR page table. */
template <int PAGE_SIZE>
__device__ __forceinline__ int csr_tokens(const int *indptr, const int *last_len, int b, int runtime_ps) {
    const int n = indptr[b + 1] - indptr[b];
    const int ps = PAGE_SIZE > 0 ? PAGE_SIZE : runtime_ps;
    return n > 0 ? (n - 1) * ps + last_len[b] : 0;
}

/* This split's token range [start, end) of a request of len tokens. */
__device__ __forceinline__ void split_range(int len, int splits, int split, int align, int min_chunk, int &start,
                                            int &end) {
    int chunk = (len + splits - 1) / splits;
    chunk = max(chunk, min_chunk);
    chunk = (chunk + align - 1) / align * align;
    start = split * chunk;
    end = min(len, start + chunk);
}

/* Tiles w, w + warps, w + 2 warps, ... of `total` belong to warp w. (v1-v3
   looped every warp over all `total` tiles, 3 of 4 of them past the split's
   end and fully masked: 4x the instructions for the same result.) */
__device__ __forceinline__ int warp_tiles(int total, int warp, int warps) {
    return total > warp ? (total - warp + warps - 1) / warps : 0;
}

/* ---- per-warp online softmax over the heads of one CTA -------------------- */
/* Lane (g, c) owns heads nh*8 + 2c + e of every n-tile. */
template <int NH>
struct softmax_state {
    float m[NH][2];
    float l[NH][2];
    __device__ void init() {
#pragma unroll
        for (int nh = 0; nh < NH; nh++) m[nh][0] = m[nh][1] = neg_inf(), l[nh][0] = l[nh][1] = 0.f;
    }
};

/* Lazy rescaling. Each head's exponentials subtract a reference m (the
   state's m); it moves up to the running max only when a logit exceeds it by
   more than RESCALE_SLACK (log2 units) for some head of the warp, so p stays
   <= 2^8 and most tiles skip scaling the accumulators. Exact: l and o are
   accumulated against the same reference and combined by it.
   Over SUB 16-token sub-tiles of logits s (C fragments [sub][nh][i], i = e +
   2 * half): returns whether the warp rescaled; alpha = the factor the old
   state was scaled by (1 when not), ref = what the exponentials subtract. */
constexpr float RESCALE_SLACK = 8.f;
template <int NH, int SUB>
__device__ __forceinline__ bool softmax_rescale(softmax_state<NH> &st, const float (&s)[SUB][NH][4],
                                                float (&alpha)[NH][2], float (&ref)[NH][2]) {
    float mx[NH][2];
    bool grow = false;
#pragma unroll
    for (int nh = 0; nh < NH; nh++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float m = neg_inf();
#pragma unroll
            for (int sub = 0; sub < SUB; sub++) m = fmaxf(m, fmaxf(s[sub][nh][e], s[sub][nh][e + 2]));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 4));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 8));
            mx[nh][e] = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 16));
            grow |= mx[nh][e] > st.m[nh][e] + RESCALE_SLACK;
        }
    const bool rescale = __any_sync(0xffffffffu, grow);
#pragma unroll
    for (int nh = 0; nh < NH; nh++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            if (rescale) {
                const float m_new = fmaxf(st.m[nh][e], mx[nh][e]);
                ref[nh][e] = m_new == neg_inf() ? 0.f : m_new;
                alpha[nh][e] = ex2(st.m[nh][e] - ref[nh][e]);
                st.m[nh][e] = m_new;
                st.l[nh][e] *= alpha[nh][e];
            } else {
                ref[nh][e] = st.m[nh][e] == neg_inf() ? 0.f : st.m[nh][e];
                alpha[nh][e] = 1.f;
            }
        }
    return rescale;
}

/* The end of a warp's work: reduce l (and per-group extras) over the 8 row
   lanes; write the warp's unnormalised output and (m, l) to shared memory;
   then the CTA combines its warps and writes one partial state. */
template <int D, int NH, int WARPS>
struct cta_combine {
    /* smem: m[WARPS][NH*8], l[WARPS][NH*8], o[WARPS][NH*8][D] f32 */
    static constexpr int BYTES = WARPS * NH * 8 * (2 + D) * 4;
    __device__ static float *m_of(u8 *smem, int w) { return reinterpret_cast<float *>(smem) + w * NH * 8; }
    __device__ static float *l_of(u8 *smem, int w) { return reinterpret_cast<float *>(smem) + (WARPS + w) * NH * 8; }
    /* reduce the lanes' partial l over the rows, then lanes of row 0 store (m, l) */
    __device__ static void store_state(u8 *smem, int w, int g, int c, softmax_state<NH> &st) {
#pragma unroll
        for (int nh = 0; nh < NH; nh++)
#pragma unroll
            for (int e = 0; e < 2; e++) st.l[nh][e] = row_lanes_sum(st.l[nh][e]);
        if (g == 0)
#pragma unroll
            for (int nh = 0; nh < NH; nh++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    m_of(smem, w)[nh * 8 + 2 * c + e] = st.m[nh][e];
                    l_of(smem, w)[nh * 8 + 2 * c + e] = st.l[nh][e];
                }
    }
    __device__ static float *o_of(u8 *smem, int w, int h) {
        return reinterpret_cast<float *>(smem) + 2 * WARPS * NH * 8 + (w * NH * 8 + h) * D;
    }
    /* all warps have stored; write the CTA's partial (o normalised, lse base 2) */
    __device__ static void finish(u8 *smem, const oscar_decode_params &p, int b, int kvh, int split_slot) {
        const int r = p.group_ratio, splits = p.int2_splits + p.win_splits;
        for (int i = threadIdx.x; i < r * D; i += blockDim.x) {
            const int h = i / D, d = i % D;
            float m = neg_inf();
#pragma unroll
            for (int w = 0; w < WARPS; w++) m = fmaxf(m, m_of(smem, w)[h]);
            float L = 0.f, O = 0.f;
            if (m != neg_inf()) {
#pragma unroll
                for (int w = 0; w < WARPS; w++) {
                    const float f = ex2(m_of(smem, w)[h] - m);
                    L += f * l_of(smem, w)[h];
                    O += f * o_of(smem, w, h)[d];
                }
            }
            const i64 row = (static_cast<i64>(b) * p.num_q_heads + kvh * r + h) * splits + split_slot;
            reinterpret_cast<float *>(p.ws_o)[row * D + d] = L > 0.f ? O / L : 0.f;
            if (d == 0) reinterpret_cast<float *>(p.ws_lse)[row] = L > 0.f ? m + __log2f(L) : neg_inf();
        }
    }
};

/* An empty split: lse = -inf so the merge skips it. */
__device__ __forceinline__ void write_empty_split(const oscar_decode_params &p, int b, int kvh, int split_slot, bool wait) {
    if (wait) pdl_wait();
    const int r = p.group_ratio, splits = p.int2_splits + p.win_splits;
    for (int h = threadIdx.x; h < r; h += blockDim.x)
        reinterpret_cast<float *>(p.ws_lse)[(static_cast<i64>(b) * p.num_q_heads + kvh * r + h) * splits + split_slot] =
            neg_inf();
}

}  // namespace detail

/* ======================================================================== */
/* Queries, once per step: q scaled so logits come out in base 2 (for the   */
/* window tier), and q' = q @ R_k for the INT2 tier, as the INT2 kernel's   */
/* IMMA B fragments, with the per-group sums it adds for the group minima.  */
/* Grid (ceil(batch / prep_requests), kv heads), 256 threads: a CTA takes   */
/* prep_requests requests of one KV head (v8), so at large batch R_k is     */
/* read once for several (v2-v7: one request per CTA: at 128 x 4K 1024 CTAs */
/* read 64 KB each, 24.5 us alone; 4 per CTA: 18.5 us -- but a CTA's phases */
/* run one after another, so at 32 x 8K 4 per CTA took 16 instead of 9.8 us:*/
/* the plan gives several only when the CTAs would not fit in two per SM). */
/* R_k goes through shared memory in row chunks of 64 KB (the whole matrix  */
/* up to D 128), every load in flight at once.                              */
/* q' as integers: per head h, S_h = 2^(23 - E_h) with max_d |q'_hd| < 2^E_h,
   Q_hd = rint(q'_hd * S_h) (|Q| <= 2^23: q' to 24 bits of its head's largest
   element -- f32-like logits); for a dim in quarter k the kernel's A operand
   is code * 4^k, so B carries M = Q * 4^(3 - k) (|M| <= 2^29) and every
   product is 64 * Q * code. M as four signed base-256 digits
   M = d0 + 2^8 d1 + 2^16 d2 + 2^24 d3, one digit per B column:
   column n of QK n-tile nt = head n / 2 + 4 (nt / 2), digit 2 (nt % 2) + n % 2,
   so each lane's accumulators hold all four digits of its head (c + 4 j). */
namespace detail {
/* acc[j] += sum over this thread's rows d of the chunk of q[j][row0 + d] * R[row0 + d][n]
   for the rows j < 4 NJ (q transposed in shared memory: one 16-byte load
   serves four rows), d in the order part, part + PARTS, ... (the order of
   every version: q' is bitwise the same) */
template <int NJ, int D, int QR, int CHUNK_ROWS, int PARTS>
__device__ __forceinline__ void prep_matvec(const float *rs, const float (*qt)[QR], int row0, int part, int n,
                                            float (&acc)[QR]) {
#pragma unroll 4
    for (int d = part; d < CHUNK_ROWS; d += PARTS) {
        const float rv = rs[d * D + n];
#pragma unroll
        for (int jc = 0; jc < NJ; jc++) {
            const float4 q4 = reinterpret_cast<const float4 *>(qt[row0 + d])[jc];
            acc[4 * jc + 0] = fmaf(q4.x, rv, acc[4 * jc + 0]);
            acc[4 * jc + 1] = fmaf(q4.y, rv, acc[4 * jc + 1]);
            acc[4 * jc + 2] = fmaf(q4.z, rv, acc[4 * jc + 2]);
            acc[4 * jc + 3] = fmaf(q4.w, rv, acc[4 * jc + 3]);
        }
    }
}
}  // namespace detail

template <int HEAD_DIM, int GROUP_SIZE, int HEADS>
/* v23: at most 96 registers a thread up to D 128 (the compiler took 100;
   94 without spills): 8 warps x 96 leave 40960 registers of an SM, so two
   4-warp INT2 CTAs of up to 160 registers start beside a prep CTA (under
   PDL the INT2 grid is placed while prep runs). At 100, 8-head INT2 CTAs of
   153-160 registers fit only one beside it, and a one-wave grid of two
   CTAs per SM was placed 3 / 1 per SM instead (H200, 32 x 8K at 64 / 8
   heads, 1 + 1 splits: 60 SMs with 3, 68 with 1; +12%). D 256 keeps its
   ~150 (96 spills). */
__global__ void __maxnreg__(HEAD_DIM <= 128 ? 96 : 255) decode_prep_kernel(const __grid_constant__ oscar_decode_params p) {
    using namespace detail;
    constexpr int D = HEAD_DIM, G = D / GROUP_SIZE, THREADS = 256, WARPS = THREADS / 32;
    constexpr int QR = OSCAR_K_PREP_ROWS;                  /* q rows (request, head) per CTA */
    constexpr int PARTS = THREADS / D;                     /* threads per output column */
    constexpr int CHUNK_ROWS = (16384 / D) < D ? 16384 / D : D; /* 64 KB of f32 rows */
    constexpr int KSI = D / 32;
    using MAP = int2_map<D>;
    using QW = q_workspace<D, HEADS>;
    extern __shared__ __align__(16) u8 smem[];
    float *rs = reinterpret_cast<float *>(smem);           /* [CHUNK_ROWS][D] */
    __shared__ __align__(16) float qt[D][QR];              /* q rows, transposed */
    __shared__ float qs[QR][D];                            /* q', then Q */
    __shared__ float part_sum[PARTS > 1 ? PARTS - 1 : 1][PARTS > 1 ? QR : 1][D];
    OSCAR_TRACE_MARK(DECODE_PREP, ENTRY);
    pdl_launch_next();
    const int r = p.group_ratio, nb = p.prep_requests, kvh = blockIdx.y, t = threadIdx.x;
    const int b0 = blockIdx.x * nb, rows = min(nb, p.batch_size - b0) * r, nreq = rows / r;
    const int nj = (rows + 3) / 4; /* 16-byte column groups of qt in use */
    const float *R = reinterpret_cast<const float *>(p.rot_k);
    constexpr int F4 = CHUNK_ROWS * D / 4 / THREADS; /* float4 loads per thread and chunk */
    /* R_k's first chunk is loaded before the wait: a constant input (q is
       not: the kernel before this one may still be writing it) */
    float4 v[F4]; /* zeros without R: an undefined value here cost a stack slot */
#pragma unroll
    for (int u = 0; u < F4; u++) v[u] = R ? reinterpret_cast<const float4 *>(R)[t + u * THREADS] : make_float4(0.f, 0.f, 0.f, 0.f);
    pdl_wait(); /* the previous step's merge may still read this workspace */
    OSCAR_TRACE_MARK(DECODE_PREP, WAITED);
    /* v10: this step's split counters of these groups start at zero */
    if (t < nreq) split_counters(p)[static_cast<i64>(b0 + t) * p.pool.num_kv_heads + kvh] = 0u;
    /* row j = request b0 + j / r, head j % r of the group; rows up to 4 nj are
       zero (they run through the matvec's last column group) */
    { /* v10: a thread's loads all issued before the first store (a round trip
         each before: ~1.7 us of prep at batch 1 by a per-CTA trace) */
        constexpr int PER_T = QR * D / THREADS; /* items per thread at most (4 nj <= QR rows) */
        /* s9: raw loads first, then one scale and the conversions (q_scaled per
           item put the scale's division and its branches between the loads
           and their uses: the 8 loads went out one round trip at a time) */
        u16 raw[PER_T];
        const u16 *qb = reinterpret_cast<const u16 *>(p.q);
        /* v13: j / r as (j * ceil(2^16 / r)) >> 16, exact for j < 2^16 / r
           (here j < QR): v11's run-time divisions were ~20 instructions per
           item, ~1.2M of the 6.9M warp instructions at 128 x 4K (ncu) */
        const u32 rmul = (65536u + r - 1) / r;
#pragma unroll
        for (int u = 0; u < PER_T; u++) {
            const int i = t + u * THREADS, j = i / D;
            const bool in = i < 4 * nj * D && j < rows;
            const int jj = in ? j : 0, jb = static_cast<int>((static_cast<u32>(jj) * rmul) >> 16);
            raw[u] = in ? qb[(b0 + jb) * p.q_batch_stride + (kvh * r + jj - jb * r) * p.q_head_stride + i % D] : u16(0);
        }
        const float scale = q_scale(p);
#pragma unroll
        for (int u = 0; u < PER_T; u++) {
            const int i = t + u * THREADS;
            if (i < 4 * nj * D) qt[i % D][i / D] = i / D < rows ? q_value(p, raw[u], scale) : 0.f;
        }
    }
    __syncthreads();
    const int n = t % D, part = t / D;
    if (R) {
        float acc[QR];
#pragma unroll
        for (int j = 0; j < QR; j++) acc[j] = 0.f;
        for (int row0 = 0; row0 < D; row0 += CHUNK_ROWS) {
#pragma unroll
            for (int u = 0; u < F4; u++) reinterpret_cast<float4 *>(rs)[t + u * THREADS] = v[u];
            __syncthreads();
            /* v13: the next chunk's loads (D 256: R_k is four 64-KB chunks) are
               issued before this chunk's matvec, so they fly while it runs (v12
               issued them after it: one exposed round trip per chunk) */
            if (row0 + CHUNK_ROWS < D)
#pragma unroll
                for (int u = 0; u < F4; u++)
                    v[u] = reinterpret_cast<const float4 *>(R + static_cast<i64>(row0 + CHUNK_ROWS) * D)[t + u * THREADS];
            /* the loop nest per count of column groups: rows are a run-time count */
            if (nj == 1)
                prep_matvec<1, D, QR, CHUNK_ROWS, PARTS>(rs, qt, row0, part, n, acc);
            else if (nj == 2)
                prep_matvec<2, D, QR, CHUNK_ROWS, PARTS>(rs, qt, row0, part, n, acc);
            else if (nj == 3)
                prep_matvec<3, D, QR, CHUNK_ROWS, PARTS>(rs, qt, row0, part, n, acc);
            else
                prep_matvec<4, D, QR, CHUNK_ROWS, PARTS>(rs, qt, row0, part, n, acc);
            __syncthreads();
        }
        if (part > 0)
#pragma unroll
            for (int j = 0; j < QR; j++)
                if (j < rows) part_sum[PARTS > 1 ? part - 1 : 0][PARTS > 1 ? j : 0][n] = acc[j];
        __syncthreads();
        if (part == 0)
#pragma unroll
            for (int j = 0; j < QR; j++) {
                if (j >= rows) break;
                float x = acc[j];
#pragma unroll
                for (int q = 1; q < PARTS; q++) x += part_sum[q - 1][PARTS > 1 ? j : 0][n];
                qs[j][n] = x;
            }
    } else {
        for (int i = t; i < rows * D; i += THREADS) qs[i / D][i % D] = qt[i % D][i / D];
    }
    __syncthreads();
    /* per row: E_h, then Q = rint(q' * S_h) in place (exact integers in f32) */
    const int lane = t & 31, warp = t / 32;
    for (int j = warp; j < rows; j += WARPS) {
        float amax = 0.f;
        for (int d = lane; d < D; d += 32) amax = fmaxf(amax, fabsf(qs[j][d]));
#pragma unroll
        for (int k = 16; k > 0; k >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, k));
        int e = 0;
        frexpf(amax, &e); /* amax < 2^e (e = 0 for 0) */
        constexpr int QB = q_digits<HEADS>::QBITS;
        constexpr bool SHIFTED = q_digits<HEADS>::SHIFTED;
        const float S = ldexpf(1.f, QB - e);
        /* v10: the row's per-group sums of Q here (a phase of its own before:
           ~0.4-2.5 us of prep by a per-CTA trace); integers, exact in any order */
        double gs[G];
#pragma unroll
        for (int grp = 0; grp < G; grp++) gs[grp] = 0.0;
#pragma unroll
        for (int k = 0; k < D / 32; k++) {
            const int d = lane + 32 * k;
            /* SHIFTED: quarters 1 and 3 (d / (D / 4) odd) at a quarter of the scale */
            const bool q4 = SHIFTED && ((d / (D / 4)) & 1);
            const float v = rintf(qs[j][d] * (q4 ? 0.25f * S : S));
            qs[j][d] = v;
            gs[d / GROUP_SIZE] += q4 ? 4.f * v : v; /* exact: |4 v| <= 2^22 */
        }
        const int bb = j / r, h = j % r;
        float *sums = QW::sums(p, b0 + bb, kvh, G);
#pragma unroll
        for (int grp = 0; grp < G; grp++) {
#pragma unroll
            for (int k = 16; k > 0; k >>= 1) gs[grp] += __shfl_xor_sync(0xffffffffu, gs[grp], k);
            if (lane == 0) sums[h * G + grp] = static_cast<float>(ldexp(gs[grp], e - QB));
        }
        if (lane == 0) sums[HEADS * G + h] = ldexpf(1.f, e - QB - q_digits<HEADS>::QSHIFT);
    }
    /* heads h >= r of an instantiation's HEADS: sums 0, E = 0 */
    for (int i = t; i < nreq * (HEADS - r); i += THREADS) {
        float *sums = QW::sums(p, b0 + i / (HEADS - r), kvh, G);
        const int h = r + i % (HEADS - r);
        for (int grp = 0; grp < G; grp++) sums[h * G + grp] = 0.f;
        sums[HEADS * G + h] = ldexpf(1.f, -q_digits<HEADS>::QBITS - q_digits<HEADS>::QSHIFT);
    }
    __syncthreads();
    /* fragments of each request; heads h >= r of an instantiation's HEADS are
       zero. v13: one item per (request, 4-head block, k-step, lane quad c,
       head h of the block) makes all four digits of its 8 values at once and
       writes the 4 fragment words they feed (v11: one item per fragment word
       derived all four digits of each value to keep one: ~1.3M of the 6.9M
       warp instructions at 128 x 4K). With u = M + 0x808080, bytes 0-2 of u
       are d0..d2 + 128 and u >> 24 is d3 (signed base-256 digits, each in
       [-128, 127]), so the digit bytes of M are the bytes of u ^ 0x808080.
       Three digits (|value| <= 2^22, q_digits): u = value + 0x8080, bytes 0-1
       d0, d1 + 128, and byte 2 of u is d2 in [-64, 64] as it stands. */
    constexpr int DIGITS = q_digits<HEADS>::DIGITS;
    constexpr u32 BIAS = DIGITS == 4 ? 0x00808080u : 0x00008080u;
    constexpr int IPR = HEADS * KSI * 4; /* items per request */
    for (int i = t; i < nreq * IPR; i += THREADS) {
        const int bb = i / IPR, f = i % IPR;
        const int hb = f / (KSI * 16), ks = (f / 16) % KSI, c = (f / 4) % 4, hh = f % 4, h = hh + 4 * hb;
        u32 w[4][2]; /* [digit][reg] */
#pragma unroll
        for (int reg = 0; reg < 2; reg++) {
            u32 v[4] = {0u, 0u, 0u, 0u};
            if (h < r)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int quarter;
                    const int d = MAP::qk_dim(ks, 16 * reg + 4 * c + e, quarter);
                    const int m = static_cast<int>(qs[bb * r + h][d]) * (DIGITS == 3 ? 1 : 1 << (2 * (3 - quarter)));
                    v[e] = (static_cast<u32>(m) + BIAS) ^ BIAS;
                }
            /* 4 x 4 byte transpose: word k = byte k of v[0..3] */
            const u32 t0 = __byte_perm(v[0], v[1], 0x5140), t1 = __byte_perm(v[2], v[3], 0x5140);
            const u32 t2 = __byte_perm(v[0], v[1], 0x7362), t3 = __byte_perm(v[2], v[3], 0x7362);
            w[0][reg] = __byte_perm(t0, t1, 0x5410), w[1][reg] = __byte_perm(t0, t1, 0x7632);
            w[2][reg] = __byte_perm(t2, t3, 0x5410), w[3][reg] = __byte_perm(t2, t3, 0x7632);
        }
        uint2 *fr = QW::frags(p, b0 + bb, kvh);
#pragma unroll
        for (int k = 0; k < DIGITS; k++) {
            int nt, g;
            qk_digit_ntile<HEADS>(h, k, nt, g);
            fr[(nt * KSI + ks) * 32 + 4 * g + c] = make_uint2(w[k][0], w[k][1]);
        }
    }
    OSCAR_TRACE_MARK(DECODE_PREP, DONE);
}

/* ======================================================================== */
/* INT2 tier                                                                 */
/* HEADS: the most query heads per KV head this instantiation serves (4, 8
   or 16). Lane (g, c) owns heads c + 4 j (j < HEADS / 4): their logits for
   tokens g and g + 8 of each 16-token sub-tile, their softmax state, and
   their output columns.
   QK on the integer tensor cores (v6): the codes go in as bytes,
   code * 4^k = (code word) & (0x03030303 << 2k), 4 codes per LOP3 and no
   conversion; q' as four s8 digits per head (decode_prep_kernel), so the s32
   accumulators are exact and one IMAD + one I2F per digit pair rebuild the
   dot product.
   PV on 16-bit mma: V codes as exact subnormals (v7: one AND per pair, see
   code_pair). With HEADS = 4, p * scale * 2^PV_W_SHIFT as bf16 hi + lo, and
   the hi and lo of head c share one 8-column n-tile (columns 2c, 2c + 1:
   PACK). Otherwise (v23, F16W) n-tile nv holds the heads of slots 2 nv,
   2 nv + 1 (columns 2c, 2c + 1), each as one f16 weight p * scale * 2^U with
   a per-head unit U that follows the data (before v23: bf16 hi + lo as two mma
   into the same accumulators). */
/* CTAs per SM the registers must allow: HEADS 4 at D 64: 5 (<= 96 registers,
   no spill); at D 128 with one group per row: 4 (<= 128; the compiler takes
   115). v6-v8 bounded the latter to 5 CTAs (96 registers, no spill); session
   7 measured 4 faster on the H200, each with its own tuned splits, in one
   call: 1 x 128K 51-53 -> 45-47 us, 8 x 32K 75 -> 71-73, 32 x 8K 91-92 -> 82,
   32 x 32K 220 -> 200-203, 128 x 4K 194-195 -> 181-182; 1 x 8K and D 64 within
   the spread (bench/results/logs/decode_v9_experiments_h200.txt). At 5 CTAs
   the kernel is latency-bound: 4.2 warps per scheduler, 1.3 eligible, issue
   slots 50% busy (ncu, 8 x 32K). D 256 at 96 registers spilled ~360 B and
   ran 302 instead of 246 us at 8 x 32K: 1 (the registers decide). */
/* WARPS (v18, session 25): 4, or 16 for small batches with long contexts
   (oscar__decode_int2_warps: HEADS 4, D <= 128, where the 4-warp plan would
   take 32 or more splits). A 16-warp CTA is one per SM with the registers
   of four 4-warp CTAs, so a group's split count drops four-fold for the
   same warps per SM; its warps' states meet in the CTA combine instead of
   the merge. H200, graph replay, same call (bench/results/logs/
   session25_h200.txt): 1 x 128K 36.1-36.4 -> 34.9 us with 16 splits of 16
   warps against 64 of 4, 1 x 256K 58.8-59.0 -> 52.8, 1 x 128K at D 64
   30.7-30.8 -> 25.2; slower where the 4-warp plan has few splits (8 x 32K
   60.1 -> 63.4, 4 x 32K 43.3 -> 45.2). */
namespace detail {
/* CTAs per SM the INT2 kernel's launch bounds ask for: the 4-warp kernel's
   (above), divided by 4 for 16-warp CTAs: the same registers per thread */
template <int HEAD_DIM, int GROUP_SIZE, int HEADS, int WARPS>
struct int2_min_ctas {
    static constexpr int FOUR = HEADS == 8 && HEAD_DIM == 128 && GROUP_SIZE == 64 ? 3 : HEADS != 4 ? 1 : HEAD_DIM == 64 ? 5 : HEAD_DIM == 128 && GROUP_SIZE == 128 ? 4 : 1;
    static constexpr int VALUE = FOUR * 4 / WARPS < 1 ? 1 : FOUR * 4 / WARPS;
};
}  // namespace detail
template <int HEAD_DIM, int GROUP_SIZE, int PAGE_SIZE, int HEADS, int SCALE_LAYOUT, int WARPS = 4>
__global__ void __launch_bounds__(32 * WARPS, detail::int2_min_ctas<HEAD_DIM, GROUP_SIZE, HEADS, WARPS>::VALUE) decode_int2_kernel(const __grid_constant__ oscar_decode_params p) {
    using namespace detail;
    static_assert(HEADS == 4 || HEADS == 8 || HEADS == 16, "heads per KV head");
    constexpr int HS = HEADS / 4;            /* head slots per lane */
    constexpr int NT = q_digits<HEADS>::NT;  /* QK n-tiles: 4 digit columns per head, or 3 (q_digits) */
    constexpr bool PACK = HEADS == 4;
    /* v23: one f16 weight per token and head (one PV mma per n-tile) where
       bf16 hi + lo would take two; with PACK hi and lo share one n-tile */
    constexpr bool F16W = !PACK;
    constexpr int NV = PACK ? 1 : HEADS / 8; /* PV n-tiles */
    constexpr int NHC = HEADS > 8 ? 2 : 1;   /* 8-head tiles of the CTA combine */
    constexpr int D = HEAD_DIM, Q4 = D / 4, G = D / GROUP_SIZE, KSI = D / 32, MT = D / 16;
    /* one CTA per SM (oscar__decode_int2_wide): 16 warps at 4 heads, 12 at 8
       where 168 registers a thread hold the kernel (not D 128 with groups of
       32; groups of 64 fit since v20's three digits) */
    static_assert(WARPS == 4 || (WARPS == 16 && HEADS == 4 && HEAD_DIM <= 128) ||
                      (WARPS == 12 && HEADS == 8 && (HEAD_DIM == 64 || (HEAD_DIM == 128 && GROUP_SIZE >= 64))),
                  "warps per INT2 CTA");
    constexpr int TOK = 32, STAGES = 4, SC = 8 * G; /* scale bytes reserved per token and side */
    constexpr int CODE_BYTES = TOK * Q4, STAGE_BYTES = 2 * CODE_BYTES + 2 * TOK * SC;
    constexpr int NBLK = D >= 128 ? Q4 / 32 : 1;
    constexpr int ADV = WARPS * TOK;         /* tokens from one of a warp's tiles to its next */
    using MAP = int2_map<D>;
    using COMB = cta_combine<D, NHC, WARPS>;
    using QW = q_workspace<D, HEADS>;
    static_assert(D == 64 || D == 128 || D == 256, "head dim");
    static_assert(D % GROUP_SIZE == 0 && GROUP_SIZE >= 32, "group size");

    extern __shared__ __align__(16) u8 smem[];

    /* v10: the next launch is triggered after the wait for prep (see
       split_counters), not here */
    OSCAR_TRACE_MARK(DECODE_INT2, ENTRY);
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int *indptr = reinterpret_cast<const int *>(p.int2_indptr);
    const int *indices = reinterpret_cast<const int *>(p.int2_indices);
    const int ps = PAGE_SIZE > 0 ? PAGE_SIZE : p.pool.page_size;
    const int len = csr_tokens<PAGE_SIZE>(indptr, reinterpret_cast<const int *>(p.int2_last_page_len), b, ps);
    int start, end;
    split_range(len, p.int2_splits, split, TOK, p.min_chunk, start, end);
    if (start >= end) {
        write_empty_split(p, b, kvh, split, true);
        pdl_launch_next();
        signal_split_done(p, b, kvh);
        OSCAR_TRACE_MARK(DECODE_INT2, DONE);
        return;
    }
    const int *pages = indices + indptr[b];

    /* ---- the pipeline: this warp's tiles are start + (warp + WARPS * i) * TOK */
    u8 *wsm = smem + warp * STAGES * STAGE_BYTES;
    const u32 wsm_addr = smem_addr(wsm);
    constexpr bool F32_SCALES = SCALE_LAYOUT == OSCAR_K_SCALE_F32_SCALE_ZERO;
    constexpr int scale_bytes = G * (F32_SCALES ? 8 : 4);
    /* the split's tiles are dealt round-robin to the warps: this warp's count */
    const int ntiles = warp_tiles((end - start + TOK - 1) / TOK, warp, WARPS);
    /* lane i loads token i of a tile. Its position in the next tile to fetch
       is kept incrementally (no division per tile for a run-time page size):
       token ft, page index fpi into the request's pages, offset fpo in it;
       the page id is fetched one tile ahead of its copies. */
    int ft = start + warp * TOK + lane, fpi, fpo, adv_pages = 0, adv_off = 0;
    if constexpr (PAGE_SIZE > 0) {
        fpi = ft / PAGE_SIZE, fpo = ft % PAGE_SIZE;
    } else {
        fpi = ft / ps, fpo = ft - fpi * ps, adv_pages = ADV / ps, adv_off = ADV - adv_pages * ps;
    }
    /* v12: with a fixed offset in the page, the page id's address is a
       pointer stepped by ADV / PAGE_SIZE (v11: a 64-bit LEA pair from the
       index every tile) */
    constexpr bool FIXED_OFF = PAGE_SIZE > 0 && ADV % PAGE_SIZE == 0; /* the offset in the page never changes */
    const int *fpp = pages + fpi;
    auto fetch_page = [&](int &page, int &off) {
        page = ft < end ? (FIXED_OFF ? *fpp : pages[fpi]) : -1;
        off = fpo;
        ft += ADV;
        if constexpr (FIXED_OFF) {
            fpp += ADV / PAGE_SIZE;
        } else {
            fpi += adv_pages, fpo += adv_off;
            if (fpo >= ps) fpo -= ps, fpi++;
        }
    };
    /* per-lane bases; a tile adds page * page stride (+ offset * token stride) */
    const i64 lane_co = kvh * p.pool.codes_head_stride, lane_so = kvh * p.pool.scales_head_stride;
    const u8 *kcodes = reinterpret_cast<const u8 *>(p.pool.k_codes) + lane_co;
    const u8 *vcodes = reinterpret_cast<const u8 *>(p.pool.v_codes) + lane_co;
    const u8 *kscales = reinterpret_cast<const u8 *>(p.pool.k_scales) + lane_so;
    const u8 *vscales = reinterpret_cast<const u8 *>(p.pool.v_scales) + lane_so;
    /* v12: the lane's offsets in its page, once, where they are fixed (v11
       recomputed the scales' every tile) */
    const i64 lane_co_off = fpo * p.pool.codes_token_stride, lane_so_off = fpo * p.pool.scales_token_stride;
    auto issue = [&](int page, int off, int stage) {
        const u32 kbase = wsm_addr + stage * STAGE_BYTES, vbase = kbase + CODE_BYTES, ksb = vbase + CODE_BYTES,
                  vsb = ksb + TOK * SC;
        /* page < 0: past the split's end; ids outside the pool are skipped */
        const bool ok = static_cast<u32>(page) < static_cast<u32>(p.pool.num_pages);
        const u64 pg = ok ? static_cast<u32>(page) : 0u;
        const i64 co = static_cast<i64>(pg * static_cast<u64>(p.pool.codes_page_stride)) + (FIXED_OFF ? lane_co_off : off * p.pool.codes_token_stride);
        const i64 so = static_cast<i64>(pg * static_cast<u64>(p.pool.scales_page_stride)) + (FIXED_OFF ? lane_so_off : off * p.pool.scales_token_stride);
        const int n = ok ? 16 : 0;
#pragma unroll
        for (int ch = 0; ch < Q4 / 16; ch++) {
            cp_async16(kbase + tile_off<Q4>(lane, ch), kcodes + co + ch * 16, n);
            cp_async16(vbase + tile_off<Q4>(lane, ch), vcodes + co + ch * 16, n);
        }
        if constexpr (scale_bytes >= 16) {
            for (int ch = 0; ch < scale_bytes / 16; ch++) {
                cp_async16(ksb + lane * SC + ch * 16, kscales + so + ch * 16, n);
                cp_async16(vsb + lane * SC + ch * 16, vscales + so + ch * 16, n);
            }
        } else if constexpr (scale_bytes == 8) {
            cp_async8(ksb + lane * SC, kscales + so, ok ? 8 : 0);
            cp_async8(vsb + lane * SC, vscales + so, ok ? 8 : 0);
        } else {
            cp_async4(ksb + lane * SC, kscales + so, ok ? 4 : 0);
            cp_async4(vsb + lane * SC, vscales + so, ok ? 4 : 0);
        }
        cp_async_commit();
    };

    float m_run[HS], l_run[HS];
    /* ex2's reference, loop-carried and changed only when the warp rescales
       (v12). It includes the weights' 2^PV_W_SHIFT (v11 multiplied both V
       scales of a token pair by it every sub-tile), so p, l and vmin carry
       2^PV_W_SHIFT until the end of the loop. */
    float pref[HS];
    /* v23 (F16W): the f16 weights p * scale carry a per-head unit 2^U
       (wunit = U, folded into ex2's reference like PV_W_SHIFT: p, l and
       vmin carry it too; removed after the loop). f16 is normal from 2^-14
       to 2^15 only, so U follows the data. At every rescale U becomes the
       smaller of U + (ref - m_old), which keeps the weights already summed
       at their size, and ref - a, which puts this tile's largest weight at
       1 (a: log2 of it against ref). So from the first rescale on, some
       summed weight is >= 1, and every weight within 2^-12 of the largest
       is a normal f16 (11 bits, as the tests' ratio 5-16 classes need).
       Between rescales p <= 2^SLACK, so a weight is at most 2^SLACK * scale
       * 2^U: a tile whose largest V scale exceeds vthr = 2^(15 - SLACK -
       max U) forces a rescale, and no weight overflows f16. U stays within
       +-PV_UNIT_LIMIT, so p (<= 2^(SLACK + U)) and l stay finite in f32;
       f32 V scales beyond ~2^80 would overflow f16 (bf16 hi + lo did not).
       Before v23, and in the 4-head kernels: bf16 hi + lo, units 2^PV_W_SHIFT. */
    float wunit[HS];
    float vthr = 0.f; /* the first tile rescales anyway */
    float acc[MT][NV][4];
    float vmin[G][HS];
#pragma unroll
    for (int j = 0; j < HS; j++)
        m_run[j] = neg_inf(), l_run[j] = 0.f, wunit[j] = 0.f, pref[j] = F16W ? 0.f : -static_cast<float>(PV_W_SHIFT);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nv = 0; nv < NV; nv++) acc[mt][nv][0] = acc[mt][nv][1] = acc[mt][nv][2] = acc[mt][nv][3] = 0.f;
#pragma unroll
    for (int grp = 0; grp < G; grp++)
#pragma unroll
        for (int j = 0; j < HS; j++) vmin[grp][j] = 0.f;

    const bool capped = p.logit_cap > 0.f;
    const float cap_log2 = p.logit_cap * 1.4426950408889634f;
    /* the stored pair of group grp of token row `tok` of a stage's scale
       block as floats: (scale, zero) with F32_SCALES, else (scale, min) */
    auto scale_pair = [&](const u8 *sb, int tok, int grp, float &scale, float &second) {
        if constexpr (F32_SCALES) {
            const float2 sz = *reinterpret_cast<const float2 *>(sb + tok * SC + 8 * grp);
            scale = sz.x;
            second = sz.y;
        } else {
            const u32 w = *reinterpret_cast<const u32 *>(sb + tok * SC + 4 * grp);
            scale = f16_to_f32(static_cast<u16>(w & 0xffffu));
            second = f16_to_f32(static_cast<u16>(w >> 16));
        }
    };
    auto scale_only = [&](const u8 *sb, int tok, int grp) -> float {
        if constexpr (F32_SCALES)
            return *reinterpret_cast<const float *>(sb + tok * SC + 8 * grp);
        else
            return f16_to_f32(*reinterpret_cast<const u16 *>(sb + tok * SC + 4 * grp));
    };

    int next_page, next_off;
    fetch_page(next_page, next_off);
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        issue(next_page, next_off, s);
        fetch_page(next_page, next_off);
    }
    /* ---- q' digits (decode_prep_kernel), per-group sums, the dot products' inverse scale. The
       first tiles' page ids and copies (inputs only) are already in flight:
       they overlap the prep kernel's tail. */
    pdl_wait();
    OSCAR_TRACE_MARK(DECODE_INT2, WAITED);
    pdl_launch_next();
    u32 qf[KSI][NT][2];
    float qsum[HS][G], qinv[HS];
    {
        const uint2 *frag = QW::frags(p, b, kvh);
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int ks = 0; ks < KSI; ks++) {
                const uint2 f = frag[(nt * KSI + ks) * 32 + lane];
                qf[ks][nt][0] = f.x, qf[ks][nt][1] = f.y;
            }
        const float *sums = QW::sums(p, b, kvh, G);
#pragma unroll
        for (int j = 0; j < HS; j++) {
            qinv[j] = sums[HEADS * G + c + 4 * j];
#pragma unroll
            for (int grp = 0; grp < G; grp++) qsum[j][grp] = sums[(c + 4 * j) * G + grp];
        }
    }

    for (int tile = 0; tile < ntiles; tile++) {
        issue(next_page, next_off, (tile + STAGES - 1) % STAGES);
        fetch_page(next_page, next_off);
        cp_async_wait<STAGES - 1>();
        __syncwarp();
        const int stage = tile % STAGES;
        const u8 *st = wsm + stage * STAGE_BYTES;
        const u32 kb = wsm_addr + stage * STAGE_BYTES, vb = kb + CODE_BYTES;
        const u8 *ksb = st + 2 * CODE_BYTES, *vsb = ksb + TOK * SC;
        const int t0 = start + (warp + WARPS * tile) * TOK;

        /* ---- logits of the two 16-token sub-tiles: s[sub][j][half] is head
           c + 4 j at token sub * 16 + g + 8 * half */
        /* F16W: the guard, from the lane's tokens' V scales; read first,
           off the logits' dependency chain */
        bool vguard = false;
        if constexpr (F16W) {
            float vm = 0.f;
#pragma unroll
            for (int sub = 0; sub < 2; sub++)
#pragma unroll
                for (int half = 0; half < 2; half++)
#pragma unroll
                    for (int grp = 0; grp < G; grp++) vm = fmaxf(vm, scale_only(vsb, sub * 16 + g + 8 * half, grp));
            vguard = vm > vthr;
        }
        float s[2][HS][2];
#pragma unroll
        for (int sub = 0; sub < 2; sub++) {
            u32 kr[NBLK][4];
            const int mi = lane >> 3, mr = lane & 7;
#pragma unroll
            for (int bk = 0; bk < NBLK; bk++) {
                if constexpr (D == 64) {
                    ldmatrix_x2(kb + tile_off<Q4>(sub * 16 + (mi & 1) * 8 + mr, 0), kr[0][0], kr[0][1]);
                } else {
                    ldmatrix_x4(kb + tile_off<Q4>(sub * 16 + (mi & 1) * 8 + mr, 2 * bk + (mi >> 1)), kr[bk][0],
                                kr[bk][1], kr[bk][2], kr[bk][3]);
                }
            }
            float sv[2][HS], smn[2][HS];
            /* with the reference's (scale, zero) a group's term is
               scale * (x / (64 S) - zero * qsum): 3 instructions per logit
               where v11's (scale, -zero * scale) took 4 */
#pragma unroll
            for (int half = 0; half < 2; half++)
#pragma unroll
                for (int j = 0; j < HS; j++) sv[half][j] = smn[half][j] = 0.f;
#pragma unroll
            for (int grp = 0; grp < G; grp++) {
                int si[NT][4]; /* digit columns: exact */
#pragma unroll
                for (int nt = 0; nt < NT; nt++) si[nt][0] = si[nt][1] = si[nt][2] = si[nt][3] = 0;
#pragma unroll
                for (int ks = 0; ks < KSI; ks++) {
                    if (MAP::qk_group_base(ks) / GROUP_SIZE != grp) continue;
                    u32 a0, a1, a2, a3;
                    qk_code_frags<D, NBLK, q_digits<HEADS>::SHIFTED>(kr, ks, a0, a1, a2, a3);
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) imma_16832(si[nt], a0, a1, a2, a3, qf[ks][nt][0], qf[ks][nt][1]);
                }
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    float sc, zm; /* zm: zero (F32_SCALES) or min */
                    scale_pair(ksb, sub * 16 + g + 8 * half, grp, sc, zm);
#pragma unroll
                    for (int j = 0; j < HS; j++) {
                        /* digits 0 + 1 and 2 + 3 (or 2 alone): |d0 + 256 d1| < 2^31 (|digit sum| <= 128 * 192 * 256);
                           n-tiles and column parities of slot j's head (any c) from qk_digit_ntile */
                        int nlo, clo, nhi, chi;
                        qk_digit_ntile<HEADS>(4 * j, 0, nlo, clo);
                        qk_digit_ntile<HEADS>(4 * j, 2, nhi, chi);
                        const int lo = si[nlo][2 * half] + 256 * si[nlo][2 * half + 1];
                        const int hi = q_digits<HEADS>::DIGITS == 4 ? si[nhi][2 * half] + 256 * si[nhi][2 * half + 1]
                                                                     : si[nhi][2 * half + (chi & 1)];
                        const float x = fmaf(static_cast<float>(hi), 65536.f, static_cast<float>(lo));
                        if constexpr (F32_SCALES) {
                            sv[half][j] = fmaf(sc, fmaf(x, qinv[j], -(zm * qsum[j][grp])), sv[half][j]);
                        } else {
                            sv[half][j] = fmaf(sc, x, sv[half][j]);
                            smn[half][j] = fmaf(zm, qsum[j][grp], smn[half][j]);
                        }
                    }
                }
            }
#pragma unroll
            for (int half = 0; half < 2; half++)
#pragma unroll
                for (int j = 0; j < HS; j++) s[sub][j][half] = F32_SCALES ? sv[half][j] : fmaf(sv[half][j], qinv[j], smn[half][j]);
        }
        /* soft-cap and the mask of tokens past the split's end behind
           warp-uniform branches: predicated, they took issue slots on every
           tile (4 MUFU + 4 FMUL, 4 ISETP + 4 FSEL at 4 heads) */
        if (__builtin_expect(capped, 0)) {
#pragma unroll
            for (int sub = 0; sub < 2; sub++)
#pragma unroll
                for (int j = 0; j < HS; j++)
#pragma unroll
                    for (int half = 0; half < 2; half++) s[sub][j][half] = cap_log2 * tanh_approx(s[sub][j][half]);
        }
        if (__builtin_expect(t0 + TOK > end, 0)) {
#pragma unroll
            for (int sub = 0; sub < 2; sub++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const bool valid = t0 + sub * 16 + g + 8 * half < end;
#pragma unroll
                    for (int j = 0; j < HS; j++) s[sub][j][half] = valid ? s[sub][j][half] : neg_inf();
                }
        }

        /* ---- online softmax, lazily rescaled (softmax_rescale's rule). A
           lane's own logits decide whether the warp rescales (the warp-wide
           max exceeds m + slack iff some lane's does); only then are the
           maxima reduced over the 8 row lanes -- not on every tile. */
        float alpha[HS];
        {
            float mx[HS];
            bool grow = false;
            if constexpr (F16W) grow = vguard;
#pragma unroll
            for (int j = 0; j < HS; j++) {
                mx[j] = fmaxf(fmaxf(s[0][j][0], s[0][j][1]), fmaxf(s[1][j][0], s[1][j][1]));
                grow |= mx[j] > m_run[j] + RESCALE_SLACK;
            }
            const bool rescale = __any_sync(0xffffffffu, grow);
            /* F16W, on a rescale only: log2 of each of the lane's tokens'
               largest V scale (over its groups), read again here so that
               nothing of it lives across the common path (registers: two
               4-warp CTAs must fit beside a decode_prep CTA, see there and
               tests/check_prep_coresidency.cmake) */
            float lvs[2][2];
            if constexpr (F16W) {
                if (rescale)
#pragma unroll
                    for (int sub = 0; sub < 2; sub++)
#pragma unroll
                        for (int half = 0; half < 2; half++) {
                            float x = scale_only(vsb, sub * 16 + g + 8 * half, 0);
#pragma unroll
                            for (int grp = 1; grp < G; grp++) x = fmaxf(x, scale_only(vsb, sub * 16 + g + 8 * half, grp));
                            lvs[sub][half] = __log2f(x);
                        }
            }
            float umax = -PV_UNIT_LIMIT;
#pragma unroll
            for (int j = 0; j < HS; j++) {
                if (rescale) {
                    mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 4));
                    mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 8));
                    mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 16));
                    const float m_new = fmaxf(m_run[j], mx[j]);
                    const float ref = m_new == neg_inf() ? 0.f : m_new;
                    if constexpr (F16W) {
                        /* log2 of the tile's largest weight against ref (a
                           bound: each token's largest scale over its groups) */
                        float a = fmaxf(fmaxf(s[0][j][0] + lvs[0][0], s[0][j][1] + lvs[0][1]),
                                        fmaxf(s[1][j][0] + lvs[1][0], s[1][j][1] + lvs[1][1]));
                        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 4));
                        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 8));
                        a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, 16));
                        /* keep the summed weights' size (U + ref - m_old),
                           or lower U so this tile's largest is <= 1 */
                        float u = m_run[j] == neg_inf() ? (a == neg_inf() ? wunit[j] : ref - a)
                                                        : fminf(wunit[j] + (ref - m_run[j]), ref - a);
                        u = fminf(fmaxf(u, -PV_UNIT_LIMIT), PV_UNIT_LIMIT);
                        alpha[j] = ex2(m_run[j] - ref + (u - wunit[j]));
                        pref[j] = ref - u;
                        wunit[j] = u;
                        umax = fmaxf(umax, u);
                    } else {
                        alpha[j] = ex2(m_run[j] - ref);
                        pref[j] = ref - static_cast<float>(PV_W_SHIFT);
                    }
                    m_run[j] = m_new;
                    l_run[j] *= alpha[j];
                }
            }
            if constexpr (F16W) {
                if (rescale) {
                    /* heads c + 4 j of the other column lanes */
                    umax = fmaxf(umax, __shfl_xor_sync(0xffffffffu, umax, 1));
                    umax = fmaxf(umax, __shfl_xor_sync(0xffffffffu, umax, 2));
                    vthr = ex2(15.f - RESCALE_SLACK - umax);
                }
            }
            if (rescale) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nv = 0; nv < NV; nv++)
#pragma unroll
                        for (int i = 0; i < 4; i++) acc[mt][nv][i] *= alpha[PACK ? 0 : 2 * nv + (i & 1)];
#pragma unroll
                for (int grp = 0; grp < G; grp++)
#pragma unroll
                    for (int j = 0; j < HS; j++) vmin[grp][j] *= alpha[j];
            }
        }

        /* ---- p, p * scale -> B fragments, V codes -> A fragments, PV */
#pragma unroll
        for (int sub = 0; sub < 2; sub++) {
            float pr[HS][2];
#pragma unroll
            for (int j = 0; j < HS; j++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    pr[j][half] = ex2(s[sub][j][half] - pref[j]);
                    l_run[j] += pr[j][half];
                }
            /* p * scale as bf16 hi + lo: one bf16 alone costs ~2^-9 of a
               dominant token's weight, enough to show in peaky heads */
            u32 pb[G][NV][2];
#pragma unroll
            for (int grp = 0; grp < G; grp++) {
                /* with the reference's (scale, zero) the min term is summed as
                   + (p scale) zero and negated after the loop (v11 formed
                   -zero * scale per token first) */
                float sc[2], mn[2]; /* mn: zero (F32_SCALES) or min */
#pragma unroll
                for (int half = 0; half < 2; half++) scale_pair(vsb, sub * 16 + g + 8 * half, grp, sc[half], mn[half]);
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    if constexpr (PACK) {
                        pb[grp][0][half] = movmatrix_trans(hi_lo_one_trunc(pr[0][half] * sc[half]));
                    } else {
#pragma unroll
                        for (int nv = 0; nv < NV; nv++)
                            pb[grp][nv][half] = movmatrix_trans(pack2<OSCAR_K_DTYPE_F16>(pr[2 * nv][half] * sc[half], pr[2 * nv + 1][half] * sc[half]));
                    }
                }
#pragma unroll
                for (int j = 0; j < HS; j++) {
                    if constexpr (F32_SCALES)
                        vmin[grp][j] = fmaf(pr[j][0] * sc[0], mn[0], fmaf(pr[j][1] * sc[1], mn[1], vmin[grp][j]));
                    else
                        vmin[grp][j] = fmaf(pr[j][0], mn[0], fmaf(pr[j][1], mn[1], vmin[grp][j]));
                }
            }
            u32 vr[NBLK][4];
            const int mi = lane >> 3, mr = lane & 7;
#pragma unroll
            for (int bk = 0; bk < NBLK; bk++) {
                if constexpr (D == 64) {
                    ldmatrix_x2_trans(vb + tile_off<Q4>(sub * 16 + (mi & 1) * 8 + mr, 0), vr[0][0], vr[0][1]);
                } else {
                    /* matrices: (tok 0-7, bytes 0-15), (tok 0-7, 16-31), (tok 8-15, 0-15), (tok 8-15, 16-31) */
                    ldmatrix_x4_trans(vb + tile_off<Q4>(sub * 16 + (mi >> 1) * 8 + mr, 2 * bk + (mi & 1)), vr[bk][0],
                                      vr[bk][1], vr[bk][2], vr[bk][3]);
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                u32 a0, a1, a2, a3;
                v_code_frags<D>(vr, mt, a0, a1, a2, a3);
                const int grp = MAP::v_group_base(mt) / GROUP_SIZE;
#pragma unroll
                for (int nv = 0; nv < NV; nv++) {
                    mma_16816<F16W ? OSCAR_K_DTYPE_F16 : OSCAR_K_DTYPE_BF16>(acc[mt][nv], a0, a1, a2, a3, pb[grp][nv][0], pb[grp][nv][1]);
                }
            }
        }
        __syncwarp(); /* this stage may be refilled */
    }
    cp_async_wait<0>();
    OSCAR_TRACE_MARK(DECODE_INT2, LOOP_END);

    /* ---- reduce the per-lane sums over the 8 row lanes and hand the warp's
       state to the CTA combine */
    /* 2^-U per head (F16W), else 2^-PV_W_SHIFT: the unit is exactly removed
       from the ratio o / l, and from l (the lse) to ex2's precision */
    float unit_inv[HS];
#pragma unroll
    for (int j = 0; j < HS; j++) {
        unit_inv[j] = F16W ? ex2(-wunit[j]) : pv_weight_inverse();
        l_run[j] = row_lanes_sum(l_run[j]) * unit_inv[j];
#pragma unroll
        for (int grp = 0; grp < G; grp++)
            vmin[grp][j] = row_lanes_sum(vmin[grp][j]) * (F32_SCALES ? -unit_inv[j] : unit_inv[j]);
    }
    __syncthreads(); /* every warp is done with its pipeline smem */
    if (g == 0)
#pragma unroll
        for (int j = 0; j < HS; j++) {
            COMB::m_of(smem, warp)[c + 4 * j] = m_run[j];
            COMB::l_of(smem, warp)[c + 4 * j] = l_run[j];
        }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        const int grp = MAP::v_group_base(mt) / GROUP_SIZE;
        const float f = F16W ? pv_out_factor_f16(MAP::v_quarter(mt)) : pv_out_factor(MAP::v_quarter(mt));
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int d = MAP::v_dim(mt, g, half);
            if constexpr (PACK) {
                COMB::o_of(smem, warp, c)[d] = fmaf(acc[mt][0][2 * half] + acc[mt][0][2 * half + 1], f, vmin[grp][0]);
            } else {
#pragma unroll
                for (int nv = 0; nv < NV; nv++)
#pragma unroll
                    for (int e = 0; e < 2; e++)
                        COMB::o_of(smem, warp, c + 4 * (2 * nv + e))[d] =
                            fmaf(acc[mt][nv][2 * half + e], f * unit_inv[2 * nv + e], vmin[grp][2 * nv + e]);
            }
        }
    }
    __syncthreads();
    COMB::finish(smem, p, b, kvh, split);
    signal_split_done(p, b, kvh);
    OSCAR_TRACE_MARK(DECODE_INT2, DONE);
}

/* ======================================================================== */
/* bf16/f16 tier (sink + recent windows; also the BF16 baseline)            */
/* Grid (splits, kv heads, batch), 4 warps. A split's 16-token tiles are    */
/* dealt round-robin to the warps; each streams its own through 2 shared-   */
/* memory stages (K and V of 16 tokens: 8 KB at D 128; 64 KB per CTA, as    */
/* oscar__decode_window_smem counts, OSCAR__DECODE_WIN_STAGES there).       */
/* v2: every copy instruction moves whole token rows (lane l: chunk l % CH  */
/* of row RPI j + l / CH, RPI = 2 at D 128; v1 gave each lane pair one row, */
/* so one instruction touched 32 bytes of each of 16 rows); the page        */
/* position advances by additions (v1 divided by the run-time page size     */
/* twice per tile); the page ids of the first STAGES + 1 tiles are loaded   */
/* at once and STAGES tiles issued before q is read. Same mma order (same   */
/* logits and output bit for bit). Loop 480 -> 365 SASS instructions per    */
/* tile (D 128, 4 heads). H200, ncu, alone: 128 x 4K (1024 CTAs of 320      */
/* tokens) 79.5 -> 62.0 us, 1 x 128K (8 CTAs) 16.3 -> 13.7 us; the BF16     */
/* baseline (same kernel over whole contexts) 698 -> 498 us at 128 x 4K.    */
/* Tried and not kept: 3, 4 or 6 stages (fewer CTAs per SM: slower at every */
/* batch, no gain at batch 1 -- the batch-1 chain is not the tiles' round   */
/* trips; bench/results/logs/decode_window_v2_h200.txt).                    */
namespace detail {
constexpr int WINDOW_STAGES = 2; /* = OSCAR__DECODE_WIN_STAGES */
/* CTAs per SM that the pipeline's shared memory allows (228 KB per SM, 1 KB
   reserved per CTA), at most 4: the launch bounds keep the registers from
   lowering occupancy below that. Not at D >= 128 with 16 heads: bounded to 3
   CTAs it spills (v1 fit in 168 registers); it runs at 2 (212 registers). */
template <int HEAD_DIM, int NH, int WARPS>
struct window_min_ctas {
    static constexpr int BYTES = WARPS * WINDOW_STAGES * 2 * 16 * HEAD_DIM * 2 + 1024, N = (228 * 1024) / BYTES;
    static constexpr int VALUE = NH == 2 && HEAD_DIM >= 128 ? 1 : N < 1 ? 1 : N > 4 ? 4 : N;
};
}  // namespace detail
/* WARPS: 4, or 2 at head dim 256 with one 8-head tile where the plan runs
   an INT2 tier and more window CTAs than SMs (oscar__decode_window_warps,
   session 16). A 4-warp D 256 CTA (131 KB of stages) fits no SM that holds
   an INT2 CTA, so the window grid runs after the INT2 grid; a 2-warp one
   (65 KB) fits beside two D 256 INT2 CTAs. H200: 32 x 8K D 256 -8.7% with
   the rule; 2 warps everywhere had cost 8 x 32K D 256 +3% (128 window CTAs)
   and 1 x 128K D 256 +6.5% (16), which the rule leaves at 4. */
template <int HEAD_DIM, int NH, int KV_DTYPE, int WARPS>
__global__ void __launch_bounds__(32 * WARPS, detail::window_min_ctas<HEAD_DIM, NH, WARPS>::VALUE) decode_window_kernel(
    const __grid_constant__ oscar_decode_params p) {
    using namespace detail;
    static_assert(WARPS == 2 || WARPS == 4, "warps per window CTA");
    constexpr int D = HEAD_DIM, KS = D / 16, MT = D / 16, ROW = D * 2;
    constexpr int TOK = 16, STAGES = WINDOW_STAGES;
    constexpr int TILE = TOK * ROW, STAGE_BYTES = 2 * TILE;
    constexpr int CH = ROW / 16;  /* 16-byte chunks per token row */
    constexpr int RPI = 32 / CH;  /* token rows per copy instruction */
    constexpr int NI = TOK / RPI; /* copy instructions per K (and per V) tile */
    static_assert(CH <= 32 && 32 % CH == 0 && NI * RPI == TOK && STAGES >= 2, "window tiling");
    using COMB = cta_combine<D, NH, WARPS>;
    extern __shared__ __align__(16) u8 smem[];

    OSCAR_TRACE_MARK(DECODE_WINDOW, ENTRY);
    pdl_launch_next();
    const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int r = p.group_ratio;
    /* q's raw values (this lane's elements of its heads' rows), loaded
       first (v21, session 30): they arrive while the page table is walked
       (two dependent round trips) instead of one round trip after the first
       copies are issued. Same registers and spills at every instantiation
       (ptxas). H200, graph replay: the BF16 baseline (this kernel over whole
       contexts) 1 x 8K -8 to -10%, 1 x 32K -4%, within 1% elsewhere; the
       oscar step within its spread at every bench shape. */
    u16 qraw[NH][KS][2][2];
#pragma unroll
    for (int nh = 0; nh < NH; nh++) {
        const int h = nh * 8 + g, qh = kvh * r + min(h, r - 1);
        const u16 *qrow = reinterpret_cast<const u16 *>(p.q) + b * p.q_batch_stride + qh * p.q_head_stride;
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
#pragma unroll
            for (int half = 0; half < 2; half++)
#pragma unroll
                for (int e = 0; e < 2; e++) qraw[nh][ks][half][e] = qrow[16 * ks + 2 * c + 8 * half + e];
    }
    const int *indptr = reinterpret_cast<const int *>(p.win_indptr);
    const int *indices = reinterpret_cast<const int *>(p.win_indices);
    const int ps = p.win_page_size;
    const int len = csr_tokens<0>(indptr, reinterpret_cast<const int *>(p.win_last_page_len), b, ps);
    int start, end;
    split_range(len, p.win_splits, split, TOK, p.min_chunk, start, end);
    const int slot = p.int2_splits + split;
    const bool counted = p.int2_splits > 0; /* see split_counters */
    if (start >= end) {
        write_empty_split(p, b, kvh, slot, !counted);
        if (counted) signal_split_done(p, b, kvh);
        OSCAR_TRACE_MARK(DECODE_WINDOW, DONE);
        return;
    }
    const int page0 = indptr[b];

    u8 *wsm = smem + warp * STAGES * STAGE_BYTES;
    /* the split's tiles are dealt round-robin to the warps: this warp's count */
    const int ntiles = warp_tiles((end - start + TOK - 1) / TOK, warp, WARPS);
    /* Lane l (and l ^ 16) keeps the position of token row l % 16 of the warp's
       next tile to fetch: t, its page list index and offset in the page,
       advanced WARPS * TOK tokens per tile without a division. fetch() loads
       that row's page id (-1 past the end) and returns it with the offset. */
    int t_row = start + warp * TOK + (lane & (TOK - 1));
    int pos = t_row / ps, poff = t_row - pos * ps; /* pos: in indices[], from page0 on */
    const int step = (WARPS * TOK) / ps * 128 + (WARPS * TOK) % ps; /* pages * 128 + tokens (< 128) */
    pos += page0;
    auto fetch = [&](int &page, int &off) {
        page = t_row < end ? indices[pos] : -1;
        off = poff;
        t_row += WARPS * TOK, pos += step >> 7, poff += step & 127;
        if (poff >= ps) poff -= ps, pos++;
    };
    /* this lane's chunk of every row it copies, in bytes */
    const u8 *kc = reinterpret_cast<const u8 *>(p.win_k) + (lane % CH) * 16;
    const u8 *vc = reinterpret_cast<const u8 *>(p.win_v) + (lane % CH) * 16;
    /* Copies of one tile into stage `stage`: each instruction moves RPI whole
       rows (lane l: chunk l % CH of row RPI j + l / CH), whose byte offsets
       the lanes holding them pass on; a row past the end or on a page out of
       range is zero-filled. Same swizzled layout (tile_off) as v1. */
    auto issue = [&](int stage, int page, int off) {
        const bool ok = page >= 0 && page < p.win_num_pages;
        const i64 eo = ok ? 2 * (static_cast<i64>(page) * p.win_page_stride + static_cast<i64>(off) * p.win_token_stride +
                                 static_cast<i64>(blockIdx.y) * p.win_head_stride)
                          : static_cast<i64>(0);
        const u32 valid = __ballot_sync(0xffffffffu, ok) >> (lane / CH); /* bit RPI j: this lane's row j */
        const u32 kbase = smem_addr(wsm + stage * STAGE_BYTES), vbase = kbase + TILE;
#pragma unroll(NH == 1 ? NI : 1)
        for (int j = 0; j < NI; j++) {
            const int row = RPI * j + lane / CH;
            const i64 e = __shfl_sync(0xffffffffu, eo, row);
            const int bytes = (valid >> (RPI * j)) & 1 ? 16 : 0;
            const u32 dst = tile_off<ROW>(row, lane % CH);
            cp_async16(kbase + dst, kc + e, bytes);
            cp_async16(vbase + dst, vc + e, bytes);
        }
    };

    /* page ids of the first STAGES + 1 tiles (all loads in flight at once),
       then the first STAGES tiles' copies, one commit group per tile (empty
       past the warp's last tile), all before q is converted */
    int next_page, next_off;
    {
        int pg[STAGES], po[STAGES];
#pragma unroll
        for (int s = 0; s < STAGES; s++) fetch(pg[s], po[s]);
        fetch(next_page, next_off);
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            if (s < ntiles) issue(s, pg[s], po[s]);
            cp_async_commit();
        }
    }

    /* q in two parts (hi + lo in the cache's dtype): logits as precise as f32
       q. Read from the input itself, scaled as decode_prep_kernel scales it:
       this kernel runs after the INT2 one and overlaps its tail, reading
       nothing an earlier kernel writes; it waits only before its own writes. */
    u32 qf[KS][NH][2][2];
    {
        /* v10: every load of q issued before the first use (one q_scaled per
           element loaded and converted pair by pair: 16-32 dependent round
           trips, 5-9 us of every window CTA on the H200 by a per-CTA trace);
           v21: at the kernel's start (above) */
        const float qscale = q_scale(p);
        auto qv = [&](u16 x) { return q_value(p, x, qscale); };
#pragma unroll
        for (int nh = 0; nh < NH; nh++) {
            const int h = nh * 8 + g;
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const float x0 = h < r ? qv(qraw[nh][ks][half][0]) : 0.f;
                    const float x1 = h < r ? qv(qraw[nh][ks][half][1]) : 0.f;
                    const float h0 = to_f32<KV_DTYPE>(from_f32(x0, KV_DTYPE)), h1 = to_f32<KV_DTYPE>(from_f32(x1, KV_DTYPE));
                    qf[ks][nh][0][half] = pack2<KV_DTYPE>(h0, h1);
                    qf[ks][nh][1][half] = pack2<KV_DTYPE>(x0 - h0, x1 - h1);
                }
        }
    }

    softmax_state<NH> sm;
    sm.init();
    float acc[MT][NH][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nh = 0; nh < NH; nh++) acc[mt][nh][0] = acc[mt][nh][1] = acc[mt][nh][2] = acc[mt][nh][3] = 0.f;
    const bool capped = p.logit_cap > 0.f;
    const float cap_log2 = p.logit_cap * 1.4426950408889634f;
    /* ldmatrix addresses: tile_off<ROW>(r, 2 x + h) for a row r with r % 8 = mr
       is r ROW + 128 (x / 4) + 32 ((x % 4) ^ (mr / 2)) + 16 (h ^ (mr % 2)):
       lane terms + constants (ROW >= 128) */
    const int mi = lane >> 3, mr = lane & 7;
    static_assert(ROW >= 128, "ldmatrix addressing");
    const u32 k_lane = ((mi & 1) * 8 + mr) * ROW + 16 * ((mi >> 1) ^ (mr & 1));
    const u32 v_lane = ((mi >> 1) * 8 + mr) * ROW + 16 * ((mi & 1) ^ (mr & 1)) + TILE;
    auto ld_off = [&](int x) -> u32 { return 128 * (x / 4) + 32 * ((x % 4) ^ (mr >> 1)); };

    for (int tile = 0; tile < ntiles; tile++) {
        cp_async_wait<STAGES - 1>(); /* this tile's group is done */
        __syncwarp();
        const int stage = tile % STAGES;
        const u32 sb = smem_addr(wsm + stage * STAGE_BYTES), kb = sb + k_lane, vb = sb + v_lane;
        const int t0 = start + (warp + WARPS * tile) * TOK;

        float s[1][NH][4];
#pragma unroll
        for (int nh = 0; nh < NH; nh++) s[0][nh][0] = s[0][nh][1] = s[0][nh][2] = s[0][nh][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            u32 a0, a1, a2, a3;
            ldmatrix_x4(kb + ld_off(ks), a0, a1, a2, a3);
#pragma unroll
            for (int nh = 0; nh < NH; nh++) {
                mma_16816<KV_DTYPE>(s[0][nh], a0, a1, a2, a3, qf[ks][nh][0][0], qf[ks][nh][0][1]);
                mma_16816<KV_DTYPE>(s[0][nh], a0, a1, a2, a3, qf[ks][nh][1][0], qf[ks][nh][1][1]);
            }
        }
#pragma unroll
        for (int nh = 0; nh < NH; nh++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float x = s[0][nh][i];
                if (capped) x = cap_log2 * tanh_approx(x);
                s[0][nh][i] = t0 + g + 8 * (i >> 1) < end ? x : neg_inf();
            }
        float alpha[NH][2], ref[NH][2];
        const bool rescaled = softmax_rescale<NH, 1>(sm, s, alpha, ref);
        u32 pb[NH][2], pbl[NH][2]; /* p as hi + lo in the cache's dtype */
#pragma unroll
        for (int nh = 0; nh < NH; nh++) {
            float pr[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                pr[i] = ex2(s[0][nh][i] - ref[nh][i & 1]);
                sm.l[nh][i & 1] += pr[i];
            }
            split_pair<KV_DTYPE>(pr[0], pr[1], pb[nh][0], pbl[nh][0]);
            split_pair<KV_DTYPE>(pr[2], pr[3], pb[nh][1], pbl[nh][1]);
        }
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            u32 a0, a1, a2, a3;
            /* matrices: (tok 0-7, dims 16mt..+7), (tok 0-7, +8..), (tok 8-15, ..), (tok 8-15, +8..) */
            ldmatrix_x4_trans(vb + ld_off(mt), a0, a1, a2, a3);
#pragma unroll
            for (int nh = 0; nh < NH; nh++) {
                if (rescaled) {
                    acc[mt][nh][0] *= alpha[nh][0], acc[mt][nh][1] *= alpha[nh][1];
                    acc[mt][nh][2] *= alpha[nh][0], acc[mt][nh][3] *= alpha[nh][1];
                }
                mma_16816<KV_DTYPE>(acc[mt][nh], a0, a1, a2, a3, pb[nh][0], pb[nh][1]);
                mma_16816<KV_DTYPE>(acc[mt][nh], a0, a1, a2, a3, pbl[nh][0], pbl[nh][1]);
            }
        }
        __syncwarp(); /* every lane is done with this stage: refill it */
        if (tile + STAGES < ntiles) issue(stage, next_page, next_off);
        cp_async_commit();
        fetch(next_page, next_off);
    }
    cp_async_wait<0>();
    OSCAR_TRACE_MARK(DECODE_WINDOW, LOOP_END);
    __syncthreads(); /* every warp is done with its pipeline smem */
    COMB::store_state(smem, warp, g, c, sm);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nh = 0; nh < NH; nh++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                COMB::o_of(smem, warp, nh * 8 + 2 * c + (i & 1))[16 * mt + g + 8 * (i >> 1)] = acc[mt][nh][i];
    __syncthreads();
    /* without an INT2 tier this kernel went first: the previous step's merge
       may still read this workspace. With one, prep waited for that merge. */
    if (!counted) pdl_wait();
    COMB::finish(smem, p, b, kvh, slot);
    if (counted) signal_split_done(p, b, kvh);
    OSCAR_TRACE_MARK(DECODE_WINDOW, DONE);
}

/* ======================================================================== */
/* merge: INT2 splits -> @ R_v^T -> with the window splits -> o, lse        */
/* Grid (batch, kv heads), 512 threads. Split weights are computed by lanes */
/* in parallel, the weighted sums by threads over (head, dim) with the      */
/* splits' loads independent of each other, and R_v^T by Q = 512 / D        */
/* neighbouring lanes per output dim (a shuffle sums their parts). v1-v3    */
/* used 128 threads, one per output dim walking all of R's row: a 66-split */
/* 1 x 128K step spent ~15 us here. v6: HEADS (4, 8, 16 >= the group     */
/* ratio) bounds the per-head loops: v5 unrolled 16 heads, predicated, at   */
/* every ratio (1755 instructions per warp, 18-20 us alone at batch 1).     */
namespace detail {
/* sum_s w[s] * src[s * stride] over n splits, CHUNK loads in flight at once:
   every load of a chunk is issued (predicated on s < n) before the first FMA
   uses one. A plain loop with a remainder serialised the remainder's loads
   (in-order issue stalls at each FMA on its load): 15 L2 round trips at
   31 splits, about half of the merge's 13.6 us at batch 1 (ncu, v6). An
   empty split (weight 0) may hold stale values, NaN included: selected away. */
/* One warp: the normalised weights w[s] = 2^(lse[s] - max) / sum of ns
   splits (all 0 when every split is empty) and, from lane 0, the combined
   lse (base 2) of the part. */
template <int MAX_SPLITS>
__device__ __forceinline__ void split_weights(const float *lse, int ns, float *w, float *lse_out, int lane) {
    /* v10: each lse read once, every load in flight together (two passes over
       memory before; ns <= MAX_SPLITS, the plan never makes more) */
    constexpr int PER = MAX_SPLITS / 32;
    float v[PER];
#pragma unroll
    for (int k = 0; k < PER; k++) v[k] = lane + 32 * k < ns ? __ldcg(lse + lane + 32 * k) : neg_inf();
    float m = neg_inf();
#pragma unroll
    for (int k = 0; k < PER; k++) m = fmaxf(m, v[k]);
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, k));
    float L = 0.f;
#pragma unroll
    for (int k = 0; k < PER; k++) {
        const int s = lane + 32 * k;
        if (s >= ns) break;
        const float e = m == neg_inf() ? 0.f : ex2(v[k] - m);
        w[s] = e;
        L += e;
    }
#pragma unroll
    for (int k = 16; k > 0; k >>= 1) L += __shfl_xor_sync(0xffffffffu, L, k);
    __syncwarp();
    for (int s = lane; s < ns && s < MAX_SPLITS; s += 32) w[s] = L > 0.f ? w[s] / L : 0.f;
    if (lane == 0) *lse_out = L > 0.f ? m + __log2f(L) : neg_inf();
}
/* ITEMS independent sums of this kind over splits s_begin..n-1 added to out,
   every load of a chunk of every item in flight together (v8: the merge's
   items ran one after another, a round trip each); an item with ok = false
   adds nothing. Each sum adds its splits in order, whatever ITEMS and CHUNK:
   results do not depend on them. */
template <int ITEMS, int CHUNK>
__device__ __forceinline__ void weighted_split_sums_from(int s_begin, const float *const (&src)[ITEMS],
                                                         const float *const (&w)[ITEMS], const bool (&ok)[ITEMS], int n,
                                                         int stride, float (&out)[ITEMS]) {
    for (int s0 = s_begin; s0 < n; s0 += CHUNK) {
        float v[ITEMS][CHUNK], wt[ITEMS][CHUNK];
#pragma unroll
        for (int it = 0; it < ITEMS; it++)
#pragma unroll
            for (int u = 0; u < CHUNK; u++) {
                const bool in = ok[it] && s0 + u < n;
                wt[it][u] = in ? w[it][s0 + u] : 0.f;
                v[it][u] = in ? __ldcg(src[it] + static_cast<i64>(s0 + u) * stride) : 0.f;
            }
#pragma unroll
        for (int it = 0; it < ITEMS; it++)
#pragma unroll
            for (int u = 0; u < CHUNK; u++) out[it] = fmaf(wt[it][u], wt[it][u] > 0.f ? v[it][u] : 0.f, out[it]);
    }
}
template <int ITEMS, int CHUNK>
__device__ __forceinline__ void weighted_split_sums(const float *const (&src)[ITEMS], const float *const (&w)[ITEMS],
                                                    const bool (&ok)[ITEMS], int n, int stride, float (&out)[ITEMS]) {
#pragma unroll
    for (int it = 0; it < ITEMS; it++) out[it] = 0.f;
    weighted_split_sums_from<ITEMS, CHUNK>(0, src, w, ok, n, stride, out);
}
/* The first C of n splits' values (stride apart; 0 past n), every load in
   flight together, for weighted_split_sum_pre once the weights are known. */
template <int C>
__device__ __forceinline__ void prefetch_splits(const float *src, int n, int stride, float (&v)[C]) {
#pragma unroll
    for (int u = 0; u < C; u++) v[u] = u < n ? __ldcg(src + static_cast<i64>(u) * stride) : 0.f;
}
/* One weighted split sum with the first C values already in v: the same sum
   in the same order (splits ascending, one fmaf each), so the same bits. */
template <int C, int CHUNK>
__device__ __forceinline__ float weighted_split_sum_pre(const float (&v)[C], const float *src, const float *w, int n,
                                                        int stride) {
    const float *const s1[1] = {src}, *const w1[1] = {w};
    const bool ok[1] = {true};
    float out[1] = {0.f};
#pragma unroll
    for (int u = 0; u < C; u++) {
        const float wt = u < n ? w[u] : 0.f;
        out[0] = fmaf(wt, wt > 0.f ? v[u] : 0.f, out[0]);
    }
    weighted_split_sums_from<1, CHUNK>(C, s1, w1, ok, n, stride, out);
    return out[0];
}
/* A lane's piece of R_v's row n: PER floats from column q * PER, loaded into
   rrow now (before the kernel's wait: a constant input) where PREFETCH says
   it fits in registers; the pointer serves the loads otherwise. */
template <int D, int PER, bool PREFETCH>
__device__ __forceinline__ const float4 *rv_row_piece(const float *R, int n, int q, float4 (&rrow)[PREFETCH ? PER / 4 : 1]) {
    const float4 *row = reinterpret_cast<const float4 *>(R + static_cast<i64>(n) * D + q * PER);
    if (PREFETCH && R)
#pragma unroll
        for (int d4 = 0; d4 < (PREFETCH ? PER / 4 : 1); d4++) rrow[d4] = row[d4];
    return row;
}
}  // namespace detail

/* A CTA merges merge_requests requests of one KV head: rows (request, head),
   at most ROWS (4, 8 or 16) of them (v8; v2-v7: one request, so at large
   batch every CTA read all of R_v for 4 heads: 64 MB from L2 at 128 x 4K,
   49.8 us alone; 4 requests per CTA: 44.8 us. The rows' latency chains run
   one after another in a CTA: at 32 x 8K 4 per CTA took 34.8 instead of
   15.3 us, so the plan gives several only when the CTAs would not fit in
   two per SM).
   The R_v^T mat-vec runs on the tf32 tensor cores: one m16n8k8 chain per
   n-tile of 8 output dims, o_int2 and R_v rounded to tf32 (relative error
   <= 2^-11 per operand; the reference applies R_v^T with both in bf16,
   2^-8, and o is bf16 or fp16). History: v13's FFMA mat-vec read o_int2
   from shared memory once per 4 FMAs and was ~4.9M of the merge's 8.65M
   warp instructions at 128 x 4K (ncu, session 13); v14-v16 used the mma at
   8 and 16 rows as 3xTF32 (hi/lo pairs, ~2^-20 of f32, three mma per step)
   and kept the FFMA mat-vec at 4 rows, where it was no more instructions
   than the mma's and a shorter chain. v17 (session 17): one mma per step,
   at every ROWS (4 rows read 8, the upper four zero) -- same-call A/B, two
   rounds, graph: 32 x 8K 67.6 -> 66.2 us, 32 x 32K 183.2 -> 181.9, 128 x 4K
   144.6 -> 143.4, 8 x 32K D 256 (4 rows, DSPLIT 4) 114.8 -> 111.6; the
   4-row step at D 128 (8 x 32K) unchanged.
   DSPLIT (v15) CTAs share a group (grid z), each finishing D / DSPLIT
   output dims: each sums the INT2 partials of all D dims (the mat-vec's
   input, 16 KB at 4 rows and D 256) but reads only its part of R_v. The
   plan takes 4 at head dim 256 where four times the merge CTAs still fit in
   one wave (oscar__decode_merge_dim_split): a quarter of R_v (64 KB) then
   fits in registers before the wait, where v14 streamed all 256 KB from L2
   after it (17.7 us alone at 8 x 32K, ncu; 8 x 32K D 256 -12% in the step,
   but 32 x 8K D 256 +4% with its 1024 CTAs in four waves). */
template <int D, int ROWS, int DSPLIT>
__global__ void __launch_bounds__(512, 2) decode_merge_kernel(const __grid_constant__ oscar_decode_params p) {
    using namespace detail;
    constexpr int THREADS = 512, WARPS = THREADS / 32, MAX_SPLITS = 128; /* the plan never makes more */
    constexpr int MR = ROWS < 8 ? 8 : ROWS; /* rows the mma reads (zeros past ROWS) */
    /* this CTA's output dims: n0 .. n0 + DO - 1 */
    constexpr int DO = D / DSPLIT;
    static_assert(DSPLIT == 1 || (D == 256 && DSPLIT == 4), "merge dim split");
    /* NT n-tiles of 8 dims, NTW per warp on the first TCW warps; KS 16-dim
       k chunks; RM = 2 where the mma's rows 8-15 are in use. Lane (g, c)
       finishes rows g (+ 8) x dims n0 + 8 nt + 2c, + 1. */
    constexpr int NT = DO / 8, NTW = NT > WARPS ? NT / WARPS : 1, TCW = NT < WARPS ? NT : WARPS, KS = D / 16;
    constexpr int RM = ROWS > 8 ? 2 : 1;
    /* o_int2 rows PAD words apart, [d] with PAD = D + 16 = 16 (mod 32): a
       quarter warp's 16-byte loads (two rows x 16 dims) hit every bank once. */
    constexpr int PAD = D + 16;
    constexpr int ITEMS = (ROWS * D + THREADS - 1) / THREADS; /* (row, dim) items per thread */
    constexpr int OWN = 2 * RM * NTW;                         /* outputs a lane finishes */
    __shared__ __align__(16) float o_int2[MR * PAD];
    __shared__ float lse_part[ROWS][2];
    __shared__ float wgt[2][ROWS][MAX_SPLITS]; /* normalised weight of each split */
    /* v13: per row, computed once by one thread each: its (request, head)
       row in the workspace, its output element offset, and the two parts'
       final weights. v11 recomputed them (two run-time divisions by the group
       ratio each) wherever a row was used, and every lane walked all ROWS rows
       to finish its own: at 128 x 4K (ROWS 16) the output phase alone was
       half of the kernel's 16.2M warp instructions (ncu, session 13). */
    __shared__ i64 row_ws[ROWS], row_out[ROWS];
    __shared__ float row_w[ROWS][2];
    OSCAR_TRACE_MARK(DECODE_MERGE, ENTRY);
    pdl_launch_next();
    const int r = p.group_ratio, nb = p.merge_requests, kvh = blockIdx.y, b0 = blockIdx.x * nb;
    const int rows = min(nb, p.batch_size - b0) * r;
    const int splits = p.int2_splits + p.win_splits;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n0 = DSPLIT > 1 ? static_cast<int>(blockIdx.z) * DO : 0;
    const float *ws_o = reinterpret_cast<const float *>(p.ws_o), *ws_lse = reinterpret_cast<const float *>(p.ws_lse);
    /* row j: request b0 + j / r, q head kvh * r + j % r */
    if (static_cast<int>(threadIdx.x) < rows) {
        const int j = threadIdx.x, bb = b0 + j / r, h = kvh * r + j % r;
        row_ws[j] = static_cast<i64>(bb) * p.num_q_heads + h;
        row_out[j] = bb * p.o_batch_stride + h * p.o_head_stride;
    }
    /* this lane's pieces of R_v, loaded before the wait (a constant input)
       where they fit in registers (32 floats): at 16 rows the 64-register cap
       spilled (ncu, 128 x 4K); at D 256 they are 128 floats unless the dims
       are split over 4 CTAs (DSPLIT) */
    constexpr bool PREFETCH = ROWS < 16 && NTW * KS <= 8;
    const float *R = reinterpret_cast<const float *>(p.rot_v);
    const int g = lane >> 2, c = lane & 3;
    float4 rb[PREFETCH ? NTW * KS : 1];
    if (PREFETCH && R && warp < TCW)
#pragma unroll
        for (int t = 0; t < NTW; t++)
#pragma unroll
            for (int kc = 0; kc < KS; kc++)
                rb[PREFETCH ? t * KS + kc : 0] =
                    reinterpret_cast<const float4 *>(R + static_cast<i64>(n0 + 8 * (warp + WARPS * t) + g) * D)[4 * kc + c];
    if (p.int2_splits > 0) { /* v10: this CTA's groups, not the window grid */
        if (static_cast<int>(threadIdx.x) < rows / r) wait_splits_done(p, b0 + threadIdx.x, kvh);
    } else {
        pdl_wait();
    }
    __syncthreads();
    OSCAR_TRACE_MARK(DECODE_MERGE, WAITED);
    /* weights: warp per (row, part) */
    for (int job = warp; job < 2 * rows; job += WARPS) {
        const int j = job >> 1, part = job & 1;
        const int s0 = part ? p.int2_splits : 0, ns = part ? p.win_splits : p.int2_splits;
        split_weights<MAX_SPLITS>(ws_lse + row_ws[j] * splits + s0, ns, wgt[part][j], &lse_part[j][part], lane);
    }
    __syncthreads();
    /* each row's two part weights and its lse, once */
    if (static_cast<int>(threadIdx.x) < rows) {
        const int j = threadIdx.x;
        const float l1 = lse_part[j][0], l2 = lse_part[j][1];
        const float m = fmaxf(l1, l2);
        const float w1 = m == neg_inf() ? 0.f : ex2(l1 - m), w2 = m == neg_inf() ? 0.f : ex2(l2 - m);
        const float inv = w1 + w2 > 0.f ? 1.f / (w1 + w2) : 0.f;
        row_w[j][0] = w1 * inv, row_w[j][1] = w2 * inv;
        if (p.lse && (DSPLIT == 1 || blockIdx.z == 0)) {
            const float lse2 = m == neg_inf() ? neg_inf() : m + __log2f(w1 + w2);
            reinterpret_cast<float *>(p.lse)[row_ws[j]] = p.lse_base == 2 ? lse2 : lse2 * 0.6931471805599453f;
        }
    }
    /* the INT2 part of every row, in the rotated space, all of a thread's
       items' loads at once; an empty split (weight 0: all of a row's when it
       has none) may hold stale values, NaN included: selected away */
    {
        const float *src[ITEMS], *w[ITEMS];
        bool ok[ITEMS];
        float o[ITEMS];
#pragma unroll
        for (int it = 0; it < ITEMS; it++) {
            const int i = threadIdx.x + it * THREADS, j = i < rows * D ? i / D : 0;
            ok[it] = i < rows * D;
            src[it] = ws_o + row_ws[j] * splits * D + i % D;
            w[it] = wgt[0][j];
        }
        weighted_split_sums<ITEMS, (8 / ITEMS > 1 ? 8 / ITEMS : 1)>(src, w, ok, p.int2_splits, D, o);
#pragma unroll
        for (int it = 0; it < ITEMS; it++) {
            const int i = threadIdx.x + it * THREADS, d = i % D;
            if (ok[it]) o_int2[(i / D) * PAD + d] = o[it];
        }
        /* the mma reads MR rows; rows past the CTA's are zeros */
        for (int i = rows * D + threadIdx.x; i < MR * D; i += THREADS) o_int2[(i / D) * PAD + i % D] = 0.f;
    }
    __syncthreads();
    /* o = w1' * (o_int2 @ R_v^T) + w2' * o_win: the outputs (row own_j, dim
       own_n) this lane finishes and their INT2 values own_x */
    int own_j[OWN], own_n[OWN];
    float own_x[OWN];
    bool own_ok;
    {
        /* k order: in 16-dim chunk kc lane c loads dims 16 kc + 4c .. + 3 of
           A and B (16 bytes each) and feeds dims 4c, 4c + 1 to the first
           mma as its k = c, c + 4 and 4c + 2, 4c + 3 to the second: a
           permutation of k shared by A and B, so the same products. Two
           accumulators (one per mma of a chunk) halve the dependent chain. */
        float acc[NTW][2][4];
#pragma unroll
        for (int t = 0; t < NTW; t++)
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[t][s][e] = 0.f;
        own_ok = warp < TCW;
        if (R && own_ok) {
#pragma unroll
            for (int kc = 0; kc < KS; kc++) {
                u32 a[2][4]; /* [row half][dim 4c + e] */
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const float4 v = h < RM ? *reinterpret_cast<const float4 *>(&o_int2[(g + 8 * h) * PAD + 16 * kc + 4 * c])
                                            : make_float4(0.f, 0.f, 0.f, 0.f);
                    a[h][0] = tf32_round(v.x), a[h][1] = tf32_round(v.y), a[h][2] = tf32_round(v.z), a[h][3] = tf32_round(v.w);
                }
#pragma unroll
                for (int t = 0; t < NTW; t++) {
                    const float4 bv =
                        PREFETCH ? rb[PREFETCH ? t * KS + kc : 0]
                                 : reinterpret_cast<const float4 *>(R + static_cast<i64>(n0 + 8 * (warp + WARPS * t) + g) * D)[4 * kc + c];
                    const u32 b[4] = {tf32_round(bv.x), tf32_round(bv.y), tf32_round(bv.z), tf32_round(bv.w)};
#pragma unroll
                    for (int s = 0; s < 2; s++)
                        mma_1688_tf32(acc[t][s], a[0][2 * s], a[1][2 * s], a[0][2 * s + 1], a[1][2 * s + 1], b[2 * s], b[2 * s + 1]);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < NTW; t++)
#pragma unroll
            for (int h = 0; h < RM; h++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int k = (t * RM + h) * 2 + e, j = g + 8 * h, d = n0 + 8 * (warp + WARPS * t) + 2 * c + e;
                    own_j[k] = j, own_n[k] = d;
                    own_x[k] = R ? acc[t][0][2 * h + e] + acc[t][1][2 * h + e] : own_ok ? o_int2[j * PAD + d] : 0.f;
                }
    }
    /* the window parts of the lane's outputs, every load at once (all
       weights 0 where a row has no window tokens), then o */
    float win[OWN];
    {
        const float *src[OWN], *w[OWN];
        bool ok[OWN];
#pragma unroll
        for (int k = 0; k < OWN; k++) {
            const int j = own_j[k], jj = j < rows ? j : 0;
            ok[k] = own_ok && j < rows;
            src[k] = ws_o + (row_ws[jj] * splits + p.int2_splits) * D + own_n[k];
            w[k] = wgt[1][jj];
        }
        weighted_split_sums<OWN, (8 / OWN > 1 ? 8 / OWN : 1)>(src, w, ok, p.win_splits, D, win);
    }
    u16 *o = reinterpret_cast<u16 *>(p.o);
#pragma unroll
    for (int k = 0; k < OWN; k++) {
        const int j = own_j[k];
        if (own_ok && j < rows) o[row_out[j] + own_n[k]] = from_f32(fmaf(row_w[j][0], own_x[k], row_w[j][1] * win[k]), p.o_dtype);
    }
    OSCAR_TRACE_MARK(DECODE_MERGE, DONE);
    pdl_wait(); /* this grid's completion implies the window grid's */
}

/* merge, one CTA per query head (v7, used when batch x q heads fits in one
   wave: the plan picks it at batch 1-4 with 32 heads on 132 SMs). Grid
   (batch, q heads), 2 * D threads; two lanes per output dim n each take half
   of R_v's row n (loaded before the wait). decode_merge_kernel above, one CTA
   per KV head doing its group, is ~1500 instructions per warp on 8 SMs at
   batch 1 (9.6-10.4 us alone at 1 x 8K); this kernel took 1 x 8K from 30.1 to
   25.2 us (3b3f256, where it served every batch: at large batch it re-reads
   R_v per head, 128 x 4K 230 -> 314 us -- hence both kernels). */
template <int D>
__global__ void __launch_bounds__(2 * D) decode_merge_head_kernel(const __grid_constant__ oscar_decode_params p) {
    using namespace detail;
    constexpr int THREADS = 2 * D, MAX_SPLITS = 128; /* the plan never makes more */
    constexpr int PER = D / 2;                       /* floats of R's row per lane */
    constexpr bool PREFETCH = PER <= 64;             /* R in registers up to D 128 */
    __shared__ __align__(16) float o_int2[D];
    __shared__ float lse_part[2];
    __shared__ float wgt[2][MAX_SPLITS]; /* normalised weight of each split */
    static_assert(THREADS <= 512, "merge tiling");
    OSCAR_TRACE_MARK(DECODE_MERGE_HEAD, ENTRY);
    pdl_launch_next();
    const int b = blockIdx.x, hpc = p.num_q_heads / static_cast<int>(gridDim.y), t = threadIdx.x;
    const int splits = p.int2_splits + p.win_splits;
    const int warp = t >> 5, lane = t & 31;
    const float *ws_o = reinterpret_cast<const float *>(p.ws_o), *ws_lse = reinterpret_cast<const float *>(p.ws_lse);
    const float *R = reinterpret_cast<const float *>(p.rot_v);
    const int n = t >> 1, q = t & 1;
    float4 rrow[PREFETCH ? PER / 4 : 1];
    const float4 *row = rv_row_piece<D, PER, PREFETCH>(R, n, q, rrow);
    const bool counted = p.int2_splits > 0; /* v10: wait per group, see split_counters */
    if (!counted) pdl_wait();
    for (int hh = 0; hh < hpc; hh++) {
        const int h = blockIdx.y * hpc + hh;
        const i64 hrow = static_cast<i64>(b) * p.num_q_heads + h;
        if (counted && (hh == 0 || h % p.group_ratio == 0)) {
            if (t == 0) wait_splits_done(p, b, h / p.group_ratio);
            __syncthreads();
        }
        if (hh == 0) OSCAR_TRACE_MARK(DECODE_MERGE_HEAD, WAITED);
        /* v11: the first PRE INT2 partials of dim t (threads t < D) and the
           first PRE_W window partials of dim n (lanes q = 0) are loaded before
           the weights, so they share the weights' round trip (the sums were
           three more round trips after the wait, each slow while the INT2
           grid still streams) */
        constexpr int PRE = 32, PRE_W = 8;
        float pv[PRE], pw[PRE_W];
        const float *src_i = ws_o + hrow * splits * D + (t < D ? t : 0);
        const float *src_w = ws_o + (hrow * splits + p.int2_splits) * D + n;
        prefetch_splits<PRE>(src_i, t < D ? p.int2_splits : 0, D, pv);
        prefetch_splits<PRE_W>(src_w, q == 0 ? p.win_splits : 0, D, pw);
        /* weights: warp 0 the INT2 splits, warp 1 the window splits */
        if (warp < 2) {
            const int part = warp;
            const int s0 = part ? p.int2_splits : 0, ns = part ? p.win_splits : p.int2_splits;
            split_weights<MAX_SPLITS>(ws_lse + hrow * splits + s0, ns, wgt[part], &lse_part[part], lane);
        }
        __syncthreads();
        /* the INT2 part in the rotated space, one dim per thread */
        if (t < D)
            o_int2[t] = lse_part[0] != neg_inf() ? weighted_split_sum_pre<PRE, 32>(pv, src_i, wgt[0], p.int2_splits, D) : 0.f;
        __syncthreads();
        /* o[n] = sum_d o_int2[d] * R_v[n][d]: lane q of dim n takes half the row */
        float x;
        if (R) {
            x = 0.f;
#pragma unroll
            for (int d4 = 0; d4 < PER / 4; d4++) {
                const float4 rv = PREFETCH ? rrow[PREFETCH ? d4 : 0] : row[d4];
                const float4 ov = *reinterpret_cast<const float4 *>(&o_int2[q * PER + 4 * d4]);
                x = fmaf(ov.x, rv.x, fmaf(ov.y, rv.y, fmaf(ov.z, rv.z, fmaf(ov.w, rv.w, x))));
            }
            x += __shfl_xor_sync(0xffffffffu, x, 1);
        } else {
            x = o_int2[n];
        }
        if (q == 0) {
            const float l1 = lse_part[0], l2 = lse_part[1];
            const float m = fmaxf(l1, l2);
            const float w1 = m == neg_inf() ? 0.f : ex2(l1 - m), w2 = m == neg_inf() ? 0.f : ex2(l2 - m);
            float win = 0.f;
            if (w2 > 0.f) win = weighted_split_sum_pre<PRE_W, 8>(pw, src_w, wgt[1], p.win_splits, D);
            u16 *o = reinterpret_cast<u16 *>(p.o) + b * p.o_batch_stride + h * p.o_head_stride;
            o[n] = from_f32(w1 + w2 > 0.f ? (w1 * x + w2 * win) / (w1 + w2) : 0.f, p.o_dtype);
            if (n == 0 && p.lse) {
                const float lse2 = m == neg_inf() ? neg_inf() : m + __log2f(w1 + w2);
                reinterpret_cast<float *>(p.lse)[hrow] = p.lse_base == 2 ? lse2 : lse2 * 0.6931471805599453f;
            }
        }
        __syncthreads(); /* o_int2, wgt and lse_part are the next head's */
    }
    OSCAR_TRACE_MARK(DECODE_MERGE_HEAD, DONE);
    pdl_wait(); /* this grid's completion implies the window grid's */
}

}  // namespace oscar

#endif  // OSCAR_K_DECODE_CUH
