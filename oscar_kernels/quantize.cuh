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
     rotation  bf16 (f16 for f16 input) x and R on tensor cores (mma.sync
               m16n8k16), f32 accumulation, result rounded to the source
               dtype -- the reference also stores the rotated row in bf16
               before quantizing;
     clip      tau = sorted(|y|)[clip_index] exactly (the reference's sort
               threshold), found by a binary search over the 16-bit keys of
               |y| with f16x2 SIMD compares; y = min(max(y, -tau), tau);
     uniform   per group: scale = max(max - min, 1e-8) / 3, zero = -min / scale,
               code = trunc(y / scale + zero + 0.5) clamped to [0, 3], with
               IEEE round-to-nearest division (no fast math);
     lloyd-max per row: mean, var in a fixed summation order (per lane in
               dim order, then the quad butterfly), std = sqrt(var + 1e-8),
               code = [z >= -0.98107] + [z >= 0] + [z >= 0.98107],
               scale = 1.16739 std, zero = 1.5 - mean / scale.

   Template: HEAD_DIM (64/128/256), GROUP_SIZE (32..HEAD_DIM), SRC_DTYPE
   (bf16/f16). Page sizes are run-time values: this kernel computes one
   address per row, so a compile-time page size buys nothing here.
   Grid (ctas, layers, 2 = K|V); 4 warps, each owns 16-row tiles in turn; the
   CTA keeps its layer's R in shared memory (bf16, swizzled), the warps
   double-buffer their x tiles with cp.async.
   v2: per-row addresses computed once per tile, both rows' clip searches
   interleaved, divisions by a group's scale via its reciprocal (exact).
   v1: straightforward (0.37 TB/s prefill with clip on the H200). */
#ifndef OSCAR_K_QUANTIZE_CUH
#define OSCAR_K_QUANTIZE_CUH

#include "common.cuh"

namespace oscar {
namespace detail {

constexpr int QUANT_WARPS = 4;
constexpr float LM_THRESHOLD = 0.9810652732849121f;
constexpr float LM_SCALE = 1.1673919518788656f; /* (2 * 1.5095585584640503 / 3) * 1.16 */

template <int D>
struct quant_traits {
    static constexpr int NT = D / 8;               /* 8-column n-tiles per row */
    static constexpr int KS = D / 16;              /* 16-deep k-steps */
    static constexpr int Q4 = D / 4;               /* code bytes per row */
    static constexpr int CHUNKS = D / 8;           /* 16-byte chunks per 16-bit row */
    static constexpr int STAGES = D >= 256 ? 1 : 2;
    static constexpr int TILE_BYTES = 16 * D * 2;  /* one warp's 16-row tile */
};

/* Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][D] 16-bit
   tile: XOR-swizzled so that ldmatrix's 8 rows hit 8 different banks. */
template <int D>
__device__ __forceinline__ u32 swz(int row, int chunk) {
    return static_cast<u32>(row * (D * 2) + ((chunk ^ (row & 7)) << 4));
}

template <int SRC_DTYPE>
__device__ __forceinline__ float round_to_src(float x) {
    return to_f32<SRC_DTYPE>(from_f32(x, SRC_DTYPE));
}

/* The 16-bit key of |x| (x already representable in the source dtype). Keys
   of either dtype compare correctly as f16 numbers below 0x7C00. */
template <int SRC_DTYPE>
__device__ __forceinline__ u32 abs_key(float x) {
    return static_cast<u32>(from_f32(fabsf(x), SRC_DTYPE));
}

/* x / d rounded to nearest, from inv = RN(1/d): one product and one
   residual correction (Markstein). Correctly rounded for normal operands
   and quotients, which is what the codes see (scale >= 1e-8/3); checked bit
   for bit against the CPU's IEEE division by the GPU tests. */
__device__ __forceinline__ float div_rn_by(float x, float d, float inv) {
    const float y0 = __fmul_rn(x, inv);
    const float r = __fmaf_rn(-y0, d, x);
    return __fmaf_rn(r, inv, y0);
}

}  // namespace detail

template <int HEAD_DIM, int GROUP_SIZE, int SRC_DTYPE>
__global__ void __launch_bounds__(128) quantize_kernel(const __grid_constant__ oscar_quantize_params p) {
    using namespace detail;
    using TR = quant_traits<HEAD_DIM>;
    constexpr int D = HEAD_DIM, NT = TR::NT, KS = TR::KS, Q4 = TR::Q4, CHUNKS = TR::CHUNKS, STAGES = TR::STAGES;
    constexpr int G = D / GROUP_SIZE, NT_PER_GROUP = GROUP_SIZE / 8;
    constexpr int MANT_BITS = SRC_DTYPE == OSCAR_K_DTYPE_F16 ? 10 : 7;
    static_assert(D == 64 || D == 128 || D == 256, "head dim");
    static_assert(D % GROUP_SIZE == 0 && GROUP_SIZE >= 32, "group size");
    static_assert((16 * CHUNKS) % 32 == 0, "tile chunks per lane");

    extern __shared__ __align__(16) u8 smem[];
    const int layer = blockIdx.y, side = blockIdx.z;
    const oscar_quantize_layer &L = p.layers[layer];
    const u64 rot = side ? L.rot_v : L.rot_k;
    const u16 *src = reinterpret_cast<const u16 *>(side ? L.src_v : L.src_k);
    u8 *codes_base = reinterpret_cast<u8 *>(side ? L.v_codes : L.k_codes);
    u8 *scales_base = reinterpret_cast<u8 *>(side ? L.v_scales : L.k_scales);
    const int clip_index = side ? p.v_clip_index : p.k_clip_index;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int H = p.pool.num_kv_heads;
    u8 *xsm = smem + warp * STAGES * TR::TILE_BYTES;
    u8 *rsm = smem + QUANT_WARPS * STAGES * TR::TILE_BYTES;

    /* R (f32, global) -> bf16/f16 in shared memory, once per CTA; eight
       chunks' loads are issued before any is used, so their latencies overlap
       (a demotion launch is mostly this load) */
    if (rot) {
        const float *R = reinterpret_cast<const float *>(rot);
        constexpr int ITEMS = D * CHUNKS, PER = 8;
        for (int base = threadIdx.x; base < ITEMS; base += PER * QUANT_WARPS * 32) {
            float4 a[PER], bq[PER];
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = base + u * QUANT_WARPS * 32;
                if (i < ITEMS) {
                    const float4 *src4 = reinterpret_cast<const float4 *>(R + static_cast<i64>(i / CHUNKS) * D + (i % CHUNKS) * 8);
                    a[u] = src4[0];
                    bq[u] = src4[1];
                }
            }
#pragma unroll
            for (int u = 0; u < PER; u++) {
                const int i = base + u * QUANT_WARPS * 32;
                if (i < ITEMS) {
                    uint4 v;
                    v.x = pack_half2(from_f32(a[u].x, SRC_DTYPE), from_f32(a[u].y, SRC_DTYPE));
                    v.y = pack_half2(from_f32(a[u].z, SRC_DTYPE), from_f32(a[u].w, SRC_DTYPE));
                    v.z = pack_half2(from_f32(bq[u].x, SRC_DTYPE), from_f32(bq[u].y, SRC_DTYPE));
                    v.w = pack_half2(from_f32(bq[u].z, SRC_DTYPE), from_f32(bq[u].w, SRC_DTYPE));
                    *reinterpret_cast<uint4 *>(rsm + swz<D>(i / CHUNKS, i % CHUNKS)) = v;
                }
            }
        }
    }
    __syncthreads();

    const i64 rows = p.num_tokens * H;
    const i64 tiles = (rows + 15) / 16;
    const i64 step = static_cast<i64>(gridDim.x) * QUANT_WARPS;

    /* Per-row addresses of one 16-row tile, computed once by lanes 0..15 and
       handed to the other lanes by shuffles (no 64-bit divisions per chunk):
       src_off in elements (-1: no source row), dst offsets in bytes (-1: skip). */
    struct row_meta {
        i64 src_off, code_off, scale_off;
    };
    auto meta_for = [&](i64 tile) {
        row_meta m;
        m.src_off = m.code_off = m.scale_off = -1;
        const i64 row = tile * 16 + (lane & 15);
        if (row < rows) {
            const u32 r32 = static_cast<u32>(row), tok32 = r32 / static_cast<u32>(H); /* rows < 2^31: validated */
            const i64 tok = tok32;
            const int head = static_cast<int>(r32 - tok32 * static_cast<u32>(H));
            const i64 sslot = p.src_slots ? load_slot(p.src_slots, tok, p.slot_dtype) : tok;
            if (sslot >= 0) {
                const i64 page = sslot / p.src_page_size, off = sslot - page * p.src_page_size;
                m.src_off = page * p.src_page_stride + off * p.src_token_stride + head * p.src_head_stride;
            }
            const i64 dslot = load_slot(p.dst_slots, tok, p.slot_dtype);
            if (dslot >= 0 && dslot < static_cast<i64>(p.pool.num_pages) * p.pool.page_size) {
                const i64 page = dslot / p.pool.page_size, off = dslot - page * p.pool.page_size;
                m.code_off = page * p.pool.codes_page_stride + off * p.pool.codes_token_stride +
                             static_cast<i64>(head) * p.pool.codes_head_stride;
                m.scale_off = page * p.pool.scales_page_stride + off * p.pool.scales_token_stride +
                              static_cast<i64>(head) * p.pool.scales_head_stride;
            }
        }
        return m;
    };

    /* one warp's 16 source rows -> shared memory (zeros where there is none) */
    auto issue = [&](const row_meta &m, int stage) {
        const u32 base = smem_addr(xsm + stage * TR::TILE_BYTES);
#pragma unroll
        for (int k = 0; k < 16 * CHUNKS / 32; k++) {
            const int j = lane + 32 * k, r = j / CHUNKS, ch = j % CHUNKS;
            const i64 off = __shfl_sync(0xffffffffu, m.src_off, r);
            cp_async16(base + swz<D>(r, ch), off >= 0 ? static_cast<const void *>(src + off + ch * 8) : src,
                       off >= 0 ? 16 : 0);
        }
        cp_async_commit();
    };

    i64 tile = static_cast<i64>(blockIdx.x) * QUANT_WARPS + warp;
    int stage = 0;
    row_meta meta = meta_for(tile);
    if (tile < tiles) issue(meta, 0);
    for (; tile < tiles; tile += step) {
        const row_meta cur = meta;
        if constexpr (STAGES == 2) {
            if (tile + step < tiles) {
                meta = meta_for(tile + step);
                issue(meta, stage ^ 1);
            } else {
                cp_async_commit();
            }
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();
        const u8 *xt = xsm + stage * TR::TILE_BYTES;

        /* acc[nt][0,1]: row g, cols nt*8 + 2c + {0,1}; acc[nt][2,3]: row g + 8 */
        float acc[NT][4];
        if (rot) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;
            const int mi = lane >> 3, mr = lane & 7;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                u32 a0, a1, a2, a3;
                ldmatrix_x4(smem_addr(xt) + swz<D>((mi & 1) * 8 + mr, 2 * ks + (mi >> 1)), a0, a1, a2, a3);
#pragma unroll
                for (int np = 0; np < NT / 2; np++) {
                    u32 b0, b1, b2, b3;
                    ldmatrix_x4_trans(smem_addr(rsm) + swz<D>(ks * 16 + (mi & 1) * 8 + mr, 2 * np + (mi >> 1)), b0, b1,
                                      b2, b3);
                    mma_16816<SRC_DTYPE>(acc[2 * np], a0, a1, a2, a3, b0, b1);
                    mma_16816<SRC_DTYPE>(acc[2 * np + 1], a0, a1, a2, a3, b2, b3);
                }
            }
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int i = 0; i < 4; i++) acc[nt][i] = round_to_src<SRC_DTYPE>(acc[nt][i]);
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const u32 w0 = *reinterpret_cast<const u32 *>(xt + swz<D>(g, nt) + 4 * c);
                const u32 w1 = *reinterpret_cast<const u32 *>(xt + swz<D>(g + 8, nt) + 4 * c);
                acc[nt][0] = to_f32<SRC_DTYPE>(static_cast<u16>(w0 & 0xffffu));
                acc[nt][1] = to_f32<SRC_DTYPE>(static_cast<u16>(w0 >> 16));
                acc[nt][2] = to_f32<SRC_DTYPE>(static_cast<u16>(w1 & 0xffffu));
                acc[nt][3] = to_f32<SRC_DTYPE>(static_cast<u16>(w1 >> 16));
            }
        }
        __syncwarp(); /* the x tile may now be refilled */

        /* ---- clip both rows of this lane together (two independent chains):
           tau = sorted(|v|)[clip_index] = the m-th largest |v|, i.e. the
           largest key K with count(|v| >= K) >= m (count(>= 0) = D >= m).
           The first probe is max/4 (two exponents down), which usually holds. */
        if (clip_index >= 0) {
            const float m = static_cast<float>(D - clip_index);
            u32 kp[2][NT];
            u32 lo[2] = {0u, 0u}, hi[2];
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                u32 kmax = 0;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const u32 k0 = abs_key<SRC_DTYPE>(acc[nt][2 * hh]), k1 = abs_key<SRC_DTYPE>(acc[nt][2 * hh + 1]);
                    kp[hh][nt] = k0 | (k1 << 16);
                    kmax = max(kmax, max(k0, k1));
                }
                kmax = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, 1));
                hi[hh] = max(kmax, __shfl_xor_sync(0xffffffffu, kmax, 2));
            }
            /* counts of both rows in one f16x2 word: (row 0, row 1), summed over the quad */
            auto count_ge = [&](u32 key0, u32 key1, float &c0, float &c1) {
                u32 a0 = 0, a1 = 0;
                const u32 k0 = key0 | (key0 << 16), k1 = key1 | (key1 << 16);
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    a0 = hadd2(a0, hset2_ge(kp[0][nt], k0));
                    a1 = hadd2(a1, hset2_ge(kp[1][nt], k1));
                }
                /* (even, odd) halves -> (row 0 total, row 1 total) */
                u32 both = hadd2(__byte_perm(a0, a1, 0x5410), __byte_perm(a0, a1, 0x7632));
                both = hadd2(both, __shfl_xor_sync(0xffffffffu, both, 1));
                both = hadd2(both, __shfl_xor_sync(0xffffffffu, both, 2));
                c0 = f16_to_f32(static_cast<u16>(both & 0xffffu));
                c1 = f16_to_f32(static_cast<u16>(both >> 16));
            };
            {
                u32 probe[2];
                float c[2];
#pragma unroll
                for (int hh = 0; hh < 2; hh++)
                    probe[hh] = hi[hh] > (2u << MANT_BITS) ? hi[hh] - (2u << MANT_BITS) : 0u;
                count_ge(probe[0], probe[1], c[0], c[1]);
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    if (c[hh] >= m)
                        lo[hh] = probe[hh];
                    else
                        hi[hh] = probe[hh] - 1u;
                }
            }
            while (__any_sync(0xffffffffu, lo[0] < hi[0] || lo[1] < hi[1])) {
                u32 mid[2];
                float c[2];
#pragma unroll
                for (int hh = 0; hh < 2; hh++) mid[hh] = (lo[hh] + hi[hh] + 1u) >> 1;
                count_ge(mid[0], mid[1], c[0], c[1]); /* every lane takes part in the shuffles */
#pragma unroll
                for (int hh = 0; hh < 2; hh++) {
                    if (lo[hh] < hi[hh]) {
                        if (c[hh] >= m)
                            lo[hh] = mid[hh];
                        else
                            hi[hh] = mid[hh] - 1u;
                    }
                }
            }
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const float tau = to_f32<SRC_DTYPE>(static_cast<u16>(lo[hh]));
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    acc[nt][2 * hh] = fminf(fmaxf(acc[nt][2 * hh], -tau), tau);
                    acc[nt][2 * hh + 1] = fminf(fmaxf(acc[nt][2 * hh + 1], -tau), tau);
                }
            }
        }

#pragma unroll
        for (int hh = 0; hh < 2; hh++) {
            /* ---- codes and per-group (scale, offset) */
            u32 code[NT][2];
            float g_scale[G], g_zero[G], g_min[G];
            if (p.lloyd_max) {
                float s = 0.f, q = 0.f;
#pragma unroll
                for (int nt = 0; nt < NT; nt++) s = __fadd_rn(__fadd_rn(s, acc[nt][2 * hh]), acc[nt][2 * hh + 1]);
                const float mean = __fdiv_rn(quad_sum(s), static_cast<float>(D));
#pragma unroll
                for (int nt = 0; nt < NT; nt++) {
                    const float d0 = __fsub_rn(acc[nt][2 * hh], mean), d1 = __fsub_rn(acc[nt][2 * hh + 1], mean);
                    q = __fadd_rn(q, __fmul_rn(d0, d0));
                    q = __fadd_rn(q, __fmul_rn(d1, d1));
                }
                const float var = __fdiv_rn(quad_sum(q), static_cast<float>(D));
                const float sd = __fsqrt_rn(__fadd_rn(var, 1e-8f));
                const float inv_sd = __frcp_rn(sd);
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const float z = div_rn_by(__fsub_rn(acc[nt][2 * hh + e], mean), sd, inv_sd);
                        code[nt][e] = (z >= -LM_THRESHOLD ? 1u : 0u) + (z >= 0.f ? 1u : 0u) + (z >= LM_THRESHOLD ? 1u : 0u);
                    }
                g_scale[0] = __fmul_rn(LM_SCALE, sd);
                g_zero[0] = __fsub_rn(1.5f, __fdiv_rn(mean, g_scale[0]));
                g_min[0] = __fsub_rn(mean, __fmul_rn(1.5f, g_scale[0]));
#pragma unroll
                for (int gi = 1; gi < G; gi++) g_scale[gi] = g_scale[0], g_zero[gi] = g_zero[0], g_min[gi] = g_min[0];
            } else {
#pragma unroll
                for (int gi = 0; gi < G; gi++) {
                    float mn = acc[gi * NT_PER_GROUP][2 * hh], mx = mn;
#pragma unroll
                    for (int j = 0; j < NT_PER_GROUP; j++) {
                        const int nt = gi * NT_PER_GROUP + j;
                        mn = fminf(mn, fminf(acc[nt][2 * hh], acc[nt][2 * hh + 1]));
                        mx = fmaxf(mx, fmaxf(acc[nt][2 * hh], acc[nt][2 * hh + 1]));
                    }
                    mn = quad_min(mn);
                    mx = quad_max(mx);
                    const float scale = __fdiv_rn(fmaxf(__fsub_rn(mx, mn), 1e-8f), 3.0f);
                    const float zero = __fdiv_rn(-mn, scale);
                    const float inv = __frcp_rn(scale);
                    g_scale[gi] = scale, g_zero[gi] = zero, g_min[gi] = mn;
#pragma unroll
                    for (int j = 0; j < NT_PER_GROUP; j++) {
                        const int nt = gi * NT_PER_GROUP + j;
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float qv = __fadd_rn(__fadd_rn(div_rn_by(acc[nt][2 * hh + e], scale, inv), zero), 0.5f);
                            code[nt][e] = static_cast<u32>(min(max(__float2int_rz(qv), 0), 3));
                        }
                    }
                }
            }

            /* ---- store: this lane owns bytes 8a + 2c + {0,1} of its row */
            const i64 code_off = __shfl_sync(0xffffffffu, cur.code_off, g + 8 * hh);
            const i64 scale_off = __shfl_sync(0xffffffffu, cur.scale_off, g + 8 * hh);
            if (code_off >= 0) {
                u8 *crow = codes_base + code_off;
                u8 *srow = scales_base + scale_off;
#pragma unroll
                for (int a = 0; a < Q4 / 8; a++) {
                    u32 b0 = 0, b1 = 0;
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        b0 |= code[a + k * (Q4 / 8)][0] << (2 * k);
                        b1 |= code[a + k * (Q4 / 8)][1] << (2 * k);
                    }
                    *reinterpret_cast<u16 *>(crow + 8 * a + 2 * c) = static_cast<u16>(b0 | (b1 << 8));
                }
                if (c == 0) {
#pragma unroll
                    for (int gi = 0; gi < G; gi++) {
                        if (p.pool.scale_layout == OSCAR_K_SCALE_F32_SCALE_ZERO)
                            *reinterpret_cast<float2 *>(srow + 8 * gi) = make_float2(g_scale[gi], g_zero[gi]);
                        else
                            *reinterpret_cast<u32 *>(srow + 4 * gi) =
                                pack_half2(f32_to_f16(g_scale[gi]), f32_to_f16(g_min[gi]));
                    }
                }
            }
        }
        stage ^= STAGES - 1;
        if constexpr (STAGES == 1) {
            if (tile + step < tiles) {
                meta = meta_for(tile + step);
                issue(meta, 0);
            }
        }
    }
    cp_async_wait<0>();
}

}  // namespace oscar

#endif  // OSCAR_K_QUANTIZE_CUH
