/* oscar_kernels/common.cuh -- device helpers shared by every kernel family.
   Self-contained for NVRTC: no toolkit headers. bf16/f16 are handled as bit
   patterns (u16) and converted with integer arithmetic or PTX cvt, so the
   kernels compile with no include path at all.

   Rounding contract shared with the CPU reference (cpu/oscar_cpu.h):
     f32 -> bf16  round to nearest even on the bit pattern (NaN -> 0x7FC0)
     f32 -> f16   PTX cvt.rn.f16.f32 (round to nearest even)
     arithmetic that must match the CPU bit for bit uses explicit __f*_rn
     intrinsics, so no FMA contraction can change it. */
#ifndef OSCAR_K_COMMON_CUH
#define OSCAR_K_COMMON_CUH

#include "oscar_params.h"

namespace oscar {
namespace detail {

typedef oscar_i64 i64;
typedef oscar_u64 u64;
typedef oscar_i32 i32;
typedef oscar_u32 u32;
typedef oscar_u16 u16;
typedef oscar_u8 u8;

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __uint_as_float(static_cast<u32>(h) << 16); }

__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<u16>(u >> 16);
}

__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

/* Input element (bf16 or f16 bit pattern) to f32. */
template <int DTYPE>
__device__ __forceinline__ float to_f32(u16 h) {
    return DTYPE == OSCAR_K_DTYPE_F16 ? f16_to_f32(h) : bf16_to_f32(h);
}
__device__ __forceinline__ u16 from_f32(float f, int dtype) {
    return dtype == OSCAR_K_DTYPE_F16 ? f32_to_f16(f) : f32_to_bf16(f);
}

__device__ __forceinline__ i64 load_slot(u64 slots, i64 i, int dtype) {
    return dtype == OSCAR_K_DTYPE_I64 ? reinterpret_cast<const i64 *>(slots)[i]
                                      : static_cast<i64>(reinterpret_cast<const i32 *>(slots)[i]);
}

/* Byte offset of a row (slot, head) in a paged array. PAGE_SIZE 0 means the
   runtime page size; a power of two at compile time turns the divide into a
   shift. */
template <int PAGE_SIZE>
__device__ __forceinline__ i64 row_offset(i64 slot, int head, i64 page_stride, i64 token_stride, i64 head_stride,
                                          int runtime_page_size) {
    i64 page, off;
    if constexpr (PAGE_SIZE == 1) {
        page = slot;
        off = 0;
    } else if constexpr (PAGE_SIZE > 0) {
        page = slot / PAGE_SIZE;
        off = slot - page * PAGE_SIZE;
    } else {
        page = slot / runtime_page_size;
        off = slot - page * runtime_page_size;
    }
    return page * page_stride + off * token_stride + static_cast<i64>(head) * head_stride;
}

/* Scale/offset pair of group g of a row: the value is x = lo + code * scale. */
struct group_affine {
    float scale;
    float offset;  // F16_SCALE_MIN: the min; F32_SCALE_ZERO: the zero point
};

__device__ __forceinline__ group_affine load_group_affine(const u8 *scale_row, int g, int layout) {
    group_affine a;
    if (layout == OSCAR_K_SCALE_F32_SCALE_ZERO) {
        const float *s = reinterpret_cast<const float *>(scale_row) + 2 * g;
        a.scale = s[0];
        a.offset = s[1];
    } else {
        u32 w = reinterpret_cast<const u32 *>(scale_row)[g];
        a.scale = f16_to_f32(static_cast<u16>(w & 0xffffu));
        a.offset = f16_to_f32(static_cast<u16>(w >> 16));
    }
    return a;
}

/* Dequantized value of one code, bit-identical to cpu/oscar_cpu.h. */
__device__ __forceinline__ float dequant_value(u32 code, group_affine a, int layout) {
    float c = static_cast<float>(code);
    if (layout == OSCAR_K_SCALE_F32_SCALE_ZERO) return __fmul_rn(__fsub_rn(c, a.offset), a.scale);
    return __fmaf_rn(c, a.scale, a.offset);
}

/* ---- warp-level building blocks (sm_80+) --------------------------------- */

__device__ __forceinline__ u32 smem_addr(const void *p) { return static_cast<u32>(__cvta_generic_to_shared(p)); }

/* 16-byte global -> shared copy; src_bytes 0 fills zeros (out-of-range rows). */
__device__ __forceinline__ void cp_async16(u32 dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2(u32 addr, u32 &r0, u32 &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n" : "=r"(r0), "=r"(r1) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x2_trans(u32 addr, u32 &r0, u32 &r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(addr));
}

/* D[16x8] += A[16x16] * B[16x8], fp32 accumulate; DTYPE picks bf16 or f16 operands. */
template <int DTYPE>
__device__ __forceinline__ void mma_16816(float (&d)[4], u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
    if constexpr (DTYPE == OSCAR_K_DTYPE_F16) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    } else {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
            "{%0, %1, %2, %3};\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
    }
}

/* Transposes an 8x8 b16 matrix held one fragment row per lane group. */
__device__ __forceinline__ u32 movmatrix_trans(u32 a) {
    u32 d;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(d) : "r"(a));
    return d;
}

/* f16x2 SIMD: per half 1.0 where a >= b, else 0.0; and add. */
__device__ __forceinline__ u32 hset2_ge(u32 a, u32 b) {
    u32 d;
    asm("set.ge.f16x2.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ u32 hadd2(u32 a, u32 b) {
    u32 d;
    asm("add.rn.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    return d;
}
__device__ __forceinline__ float half2_sum(u32 h) {
    return f16_to_f32(static_cast<u16>(h & 0xffffu)) + f16_to_f32(static_cast<u16>(h >> 16));
}

__device__ __forceinline__ u32 pack_half2(u16 lo, u16 hi) { return static_cast<u32>(lo) | (static_cast<u32>(hi) << 16); }

/* Quad (4 lanes of one mma row group) reductions. */
__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float quad_min(float v) {
    v = fminf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fminf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

}  // namespace detail
}  // namespace oscar


/* ---- kernel trace (oscar_desc.trace_records > 0) ---------------------------
   Compiled only into trace builds (-DOSCAR_TRACE=1: their own JIT cache
   entries), so the kernels an engine runs carry none of it. The host writes
   oscar_trace = {buffer address, CTA slots per kernel} into every module it
   loads. Thread 0 of a CTA stores (time, cta, sm, kernel, mark) into the
   record slot of its (kernel, CTA, mark): plain stores, no atomic to wait
   for, so a mark costs its CTA's warp 0 a few instructions and no round trip
   (a first form appended with a returning atomicAdd: +4 to +16% on the decode
   step in the H200 bench, the warps stalling on the contended counter). A CTA
   beyond the slots only counts its mark as dropped (a fire-and-forget add).
   The marks (oscar.h, "Kernel trace"): ENTRY, WAITED (the kernel's inputs
   from an earlier grid are visible), LOOP_END (thread 0's warp left its main
   loop), DONE (results written and published). */
#if defined(OSCAR_TRACE) && OSCAR_TRACE
extern "C" {
__constant__ unsigned long long oscar_trace[2];
}
namespace oscar {
namespace detail {
__device__ __forceinline__ void trace_mark(u32 kernel, u32 mark) {
    if (threadIdx.x != 0 || oscar_trace[0] == 0) return;
    u64 t;
    u32 sm;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    const u32 cta = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const u64 slots = oscar_trace[1];
    u8 *buf = reinterpret_cast<u8 *>(oscar_trace[0]);
    if (cta >= slots) {
        atomicAdd(reinterpret_cast<u32 *>(buf), 1u); /* the dropped count (header word 0) */
        return;
    }
    u64 *r = reinterpret_cast<u64 *>(buf + OSCAR_K_TRACE_HEADER_BYTES +
                                     OSCAR_K_TRACE_RECORD_BYTES * (((kernel - 1) * slots + cta) * OSCAR_K_TRACE_MARKS + mark));
    r[0] = t;
    r[1] = cta | (static_cast<u64>(sm & 0xffffu) << 32) | (static_cast<u64>(kernel) << 48) | (static_cast<u64>(mark) << 56);
}
}  // namespace detail
}  // namespace oscar
#define OSCAR_TRACE_MARK(kernel, mark) ::oscar::detail::trace_mark(OSCAR_K_TRACE_##kernel, OSCAR_K_TRACE_##mark)
#else
#define OSCAR_TRACE_MARK(kernel, mark) ((void)0)
#endif

#endif  // OSCAR_K_COMMON_CUH
