/* oscar_kernels/dequant.cuh -- INT2 pool rows back to dense bf16/f16.

   in   pool codes  [page][token|head][head|token][HEAD_DIM/4] u8, 4 x 2-bit per byte
                    (byte j: dims j, j+D/4, j+D/2, j+3D/4 in bits 1:0, 3:2, 5:4, 7:6)
        pool scales [..][HEAD_DIM/GROUP_SIZE] x (f16 scale, f16 min) or (f32 scale, f32 zero)
        slots       [num_tokens] i32|i64, slot = page * page_size + offset
   out  k_out, v_out [num_tokens][num_kv_heads][HEAD_DIM] bf16|f16 (strides in elements)

   Template: HEAD_DIM (64/128/256), GROUP_SIZE (32..HEAD_DIM), PAGE_SIZE
   (1, 8, 16, 32, 64, or 0 = runtime). One thread expands 4 code bytes (16
   values: 4 runs of 4 consecutive dims) of one row; an out-of-range slot
   yields NaN rows rather than an out-of-bounds read.
   v1: plain per-thread loop; this kernel is for debugging and fallbacks. */
#ifndef OSCAR_K_DEQUANT_CUH
#define OSCAR_K_DEQUANT_CUH

#include "common.cuh"

namespace oscar {

template <int HEAD_DIM, int GROUP_SIZE, int PAGE_SIZE>
__global__ void __launch_bounds__(256) dequant_kernel(const __grid_constant__ oscar_dequant_params p) {
    using namespace detail;
    constexpr int Q4 = HEAD_DIM / 4;   // bytes per row
    constexpr int WORDS = Q4 / 4;      // 32-bit words per row
    static_assert(HEAD_DIM % 64 == 0 && HEAD_DIM <= 256, "head dim");
    static_assert(HEAD_DIM % GROUP_SIZE == 0 && GROUP_SIZE >= 32, "group size");
    static_assert(PAGE_SIZE >= 0, "page size");

    const int H = p.pool.num_kv_heads;
    const i64 total = p.num_tokens * H * WORDS;
    for (i64 idx = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x; idx < total;
         idx += static_cast<i64>(gridDim.x) * blockDim.x) {
        const int word = static_cast<int>(idx % WORDS);
        const i64 row = idx / WORDS;
        const int head = static_cast<int>(row % H);
        const i64 tok = row / H;
        const i64 slot = load_slot(p.slots, tok, p.slot_dtype);
        const i64 ps = PAGE_SIZE > 0 ? PAGE_SIZE : p.pool.page_size;
        const bool valid = slot >= 0 && slot < static_cast<i64>(p.pool.num_pages) * ps;
        const i64 code_off = valid ? row_offset<PAGE_SIZE>(slot, head, p.pool.codes_page_stride, p.pool.codes_token_stride,
                                                           p.pool.codes_head_stride, p.pool.page_size)
                                   : 0;
        const i64 scale_off = valid ? row_offset<PAGE_SIZE>(slot, head, p.pool.scales_page_stride,
                                                            p.pool.scales_token_stride, p.pool.scales_head_stride,
                                                            p.pool.page_size)
                                    : 0;
        const i64 out_off = tok * p.out_token_stride + static_cast<i64>(head) * p.out_head_stride;
#pragma unroll
        for (int kv = 0; kv < 2; kv++) {
            const u64 out_base = kv == 0 ? p.k_out : p.v_out;
            if (out_base == 0) continue;
            const u8 *codes = reinterpret_cast<const u8 *>(kv == 0 ? p.pool.k_codes : p.pool.v_codes) + code_off;
            const u8 *scales = reinterpret_cast<const u8 *>(kv == 0 ? p.pool.k_scales : p.pool.v_scales) + scale_off;
            const u32 w = valid ? reinterpret_cast<const u32 *>(codes)[word] : 0u;
            u16 *out = reinterpret_cast<u16 *>(out_base) + out_off;
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int d0 = q * Q4 + 4 * word;  // 4 consecutive dims d0..d0+3
                const group_affine a = load_group_affine(scales, d0 / GROUP_SIZE, p.pool.scale_layout);
                u16 h[4];
#pragma unroll
                for (int b = 0; b < 4; b++) {
                    const u32 code = (w >> (8 * b + 2 * q)) & 3u;
                    const float x = valid ? dequant_value(code, a, p.pool.scale_layout) : __int_as_float(0x7fc00000);
                    h[b] = from_f32(x, p.out_dtype);
                }
                uint2 packed;
                packed.x = static_cast<u32>(h[0]) | (static_cast<u32>(h[1]) << 16);
                packed.y = static_cast<u32>(h[2]) | (static_cast<u32>(h[3]) << 16);
                *reinterpret_cast<uint2 *>(out + d0) = packed;
            }
        }
    }
}

}  // namespace oscar

#endif  // OSCAR_K_DEQUANT_CUH
