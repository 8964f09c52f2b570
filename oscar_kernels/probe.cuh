/* oscar_kernels/probe.cuh -- memory probes for the benchmarks and the tuner.

   probe_read_kernel: reads up to 8 buffers once, 16 bytes per load, a grid-
   stride loop with UNROLL independent loads in flight per thread, and does
   nothing else. Its time for the bytes a decode must read is the decode's
   read floor on this GPU. v1. */
#ifndef OSCAR_K_PROBE_CUH
#define OSCAR_K_PROBE_CUH

#include "common.cuh"

namespace oscar {

template <int UNROLL>
__global__ void __launch_bounds__(256) probe_read_kernel(const __grid_constant__ oscar_probe_params p) {
    using namespace detail;
    u32 acc = 0;
    const i64 stride = static_cast<i64>(gridDim.x) * blockDim.x;
    for (int b = 0; b < p.count; b++) {
        const uint4 *src = reinterpret_cast<const uint4 *>(p.ptr[b]);
        const i64 n = p.bytes[b] / 16;
        i64 i = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
        for (; i + (UNROLL - 1) * stride < n; i += UNROLL * stride) {
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++) v[u] = __ldcs(src + i + u * stride);
#pragma unroll
            for (int u = 0; u < UNROLL; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
        }
        for (; i < n; i += stride) {
            const uint4 v = __ldcs(src + i);
            acc ^= v.x ^ v.y ^ v.z ^ v.w;
        }
    }
    if (acc == 0x9e3779b9u && p.sink) *reinterpret_cast<u32 *>(p.sink) = acc;
}

}  // namespace oscar

#endif  // OSCAR_K_PROBE_CUH
