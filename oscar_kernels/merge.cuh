/* oscar_kernels/merge.cuh -- exact merge of partial attention states.

   in   num_states x (o [rows][HEAD_DIM] bf16|f16|f32, lse f32 [rows], natural or base 2)
   out  o [rows][HEAD_DIM] (same dtype), lse f32 [rows] (same base, optional)
   o = sum_i w_i o_i / sum_i w_i with w_i = exp(lse_i - max lse); lse = max + log(sum w).
   A state with lse = -inf (no tokens) or NaN contributes nothing and its o is
   never read; if every state is empty, o = 0 and lse = -inf.
   One warp per row, ROWS rows (warps) per CTA; template HEAD_DIM (64/128/256),
   ROWS (4, 8, 16: the tunable tile of the merge_states family, chosen by the
   tuning table or 4; every row's arithmetic is the same for any ROWS, so the
   candidates' outputs are bit-identical). v2. */
#ifndef OSCAR_K_MERGE_CUH
#define OSCAR_K_MERGE_CUH

#include "common.cuh"

namespace oscar {

template <int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(32 * ROWS) merge_states_kernel(const __grid_constant__ oscar_merge_params p) {
    using namespace detail;
    constexpr int PER_LANE = HEAD_DIM / 32;
    static_assert(ROWS >= 1 && ROWS <= 32, "merge_states: 1..32 rows (warps) per CTA");
    const i64 row = static_cast<i64>(blockIdx.x) * ROWS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= p.num_rows) return;
    const float to2 = p.lse_base == 2 ? 1.f : 1.4426950408889634f; /* input lse -> base 2 */
    float l2[8], m = __int_as_float(0xff800000);
    for (int i = 0; i < p.num_states; i++) {
        const float x = reinterpret_cast<const float *>(p.lse[i])[row] * to2;
        l2[i] = x == x ? x : __int_as_float(0xff800000); /* NaN counts as empty */
        m = fmaxf(m, l2[i]);
    }
    float acc[PER_LANE];
#pragma unroll
    for (int k = 0; k < PER_LANE; k++) acc[k] = 0.f;
    float W = 0.f;
    if (m != __int_as_float(0xff800000)) {
        for (int i = 0; i < p.num_states; i++) {
            const float w = exp2f(l2[i] - m);
            if (!(w > 0.f)) continue;
            W += w;
#pragma unroll
            for (int k = 0; k < PER_LANE; k++) {
                const i64 e = row * p.row_stride + lane + 32 * k;
                float x;
                if (p.dtype == OSCAR_K_DTYPE_F32)
                    x = reinterpret_cast<const float *>(p.o[i])[e];
                else
                    x = p.dtype == OSCAR_K_DTYPE_F16 ? f16_to_f32(reinterpret_cast<const u16 *>(p.o[i])[e])
                                                    : bf16_to_f32(reinterpret_cast<const u16 *>(p.o[i])[e]);
                acc[k] = fmaf(w, x, acc[k]);
            }
        }
    }
    const float inv = W > 0.f ? 1.f / W : 0.f;
#pragma unroll
    for (int k = 0; k < PER_LANE; k++) {
        const i64 e = row * p.out_row_stride + lane + 32 * k;
        if (p.dtype == OSCAR_K_DTYPE_F32)
            reinterpret_cast<float *>(p.out_o)[e] = acc[k] * inv;
        else
            reinterpret_cast<u16 *>(p.out_o)[e] = from_f32(acc[k] * inv, p.dtype);
    }
    if (lane == 0 && p.out_lse)
        reinterpret_cast<float *>(p.out_lse)[row] =
            W > 0.f ? (m + __log2f(W)) / to2 : __int_as_float(0xff800000);
}

}  // namespace oscar

#endif  // OSCAR_K_MERGE_CUH
