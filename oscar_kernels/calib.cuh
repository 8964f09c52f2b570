/* oscar_kernels/calib.cuh -- calibration statistics in float64 (OSCAR-SPEC.md §6.3).

   calib_gram_kernel<D>     partial Gram matrices of rows of x
       in   x         [tokens][heads][D] bf16|f16|f32 (token/head strides in elements)
            weights   [tokens][num_heads] f64 or none
       out  partials  [splits][num_heads][tiles][64][64] f64, tiles = upper-triangle 64×64 tiles of D×D
       grid (tiles, num_heads, splits), 256 threads, each thread a 4×4 block of its tile.
       Row i of output head h is input head h·group + i % group of token i / group,
       so the query heads of one KV head (GQA) are rows of one Gram matrix.
   calib_reduce_kernel<D>   S[h] += Σ_split partials, mirrored into both triangles
       out  acc [num_heads][D][D] f64; count += count_add (one thread)
       grid (tiles, num_heads), 256 threads.
   calib_weights_kernel<D>  w[t][h] = k_t · C[h] · k_tᵀ (V-target score weights)
       in   k [tokens][heads][D], cq [num_heads][D][D] f64;  out weights [tokens][num_heads] f64
       grid (ceil(tokens/16), num_heads), 256 threads, 16 tokens per block share each C load.
   calib_sum_weights_kernel wsum[h] += Σ_t w[t][h];  grid (num_heads), 256 threads.

   Template: D = head dim (64, 128, 256).
   Precision: every product and sum is float64 (inputs are exact in f64), so
   30K+ tokens lose nothing measurable (tests/test_calib_cpu.c checks against
   double-double sums). Deterministic: fixed splits, fixed reduction orders,
   no atomics -- the same inputs give the same bits.
   v1: plain fp64 FMA tiles through shared memory (calibration is off the hot
   path; no tensor-core DMMA yet). */
#ifndef OSCAR_K_CALIB_CUH
#define OSCAR_K_CALIB_CUH

#include "common.cuh"
#include "calib_params.cuh"

namespace oscar {
namespace calib {

constexpr int TILE = 64;     // Gram tile edge
constexpr int ROWS = 16;     // rows staged in shared memory per step
constexpr int THREADS = 256;
constexpr int WTOK = 16;     // tokens per block of the weights kernel

__device__ __forceinline__ double load_elem(detail::u64 base, detail::i64 off, int dtype) {
    if (dtype == OSCAR_K_DTYPE_F32) return static_cast<double>(reinterpret_cast<const float *>(base)[off]);
    const detail::u16 h = reinterpret_cast<const detail::u16 *>(base)[off];
    return static_cast<double>(dtype == OSCAR_K_DTYPE_F16 ? detail::f16_to_f32(h) : detail::bf16_to_f32(h));
}

/* Tile t of the upper triangle, row by row: (0,0) (0,1) .. (0,nb-1) (1,1) .. */
__device__ __forceinline__ void tile_coords(int t, int nb, int &ti, int &tj) {
    ti = 0;
    while (t >= nb - ti) {
        t -= nb - ti;
        ti++;
    }
    tj = ti + t;
}

}  // namespace calib

template <int D>
__global__ void __launch_bounds__(256) calib_gram_kernel(const __grid_constant__ oscar_calib_gram_params p) {
    using namespace detail;
    using namespace calib;
    static_assert(D % TILE == 0 && D <= 256, "head dim");
    constexpr int NB = D / TILE;
    constexpr int NT = NB * (NB + 1) / 2;
    __shared__ double As[ROWS][TILE];
    __shared__ double Bs[ROWS][TILE];
    __shared__ i64 row_off[ROWS];
    __shared__ double row_w[ROWS];

    int ti, tj;
    tile_coords(blockIdx.x, NB, ti, tj);
    const int h = blockIdx.y, s = blockIdx.z;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const i64 rows = p.num_tokens * p.group;
    const i64 r0 = static_cast<i64>(s) * p.rows_per_split;
    const i64 r1 = r0 + p.rows_per_split < rows ? r0 + p.rows_per_split : rows;
    double acc[4][4];
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) acc[a][b] = 0.0;

    for (i64 base = r0; base < r1; base += ROWS) {
        if (threadIdx.x < ROWS) {
            const i64 row = base + threadIdx.x;
            i64 off = -1;
            double w = 0.0;
            if (row < r1) {
                const i64 t = row / p.group;
                const int j = h * p.group + static_cast<int>(row - t * p.group);
                off = t * p.token_stride + static_cast<i64>(j) * p.head_stride;
                w = p.weights ? reinterpret_cast<const double *>(p.weights)[t * p.num_heads + h] : 1.0;
            }
            row_off[threadIdx.x] = off;
            row_w[threadIdx.x] = w;
        }
        __syncthreads();
#pragma unroll
        for (int m = 0; m < ROWS * TILE / THREADS; m++) {
            const int e = threadIdx.x + m * THREADS;
            const int rr = e / TILE, c = e % TILE;
            const i64 off = row_off[rr];
            double xa = 0.0, xb = 0.0;
            if (off >= 0) {
                xa = load_elem(p.x, off + ti * TILE + c, p.dtype);
                xb = ti == tj ? xa : load_elem(p.x, off + tj * TILE + c, p.dtype);
            }
            As[rr][c] = row_w[rr] * xa;
            Bs[rr][c] = xb;
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < ROWS; rr++) {
            double av[4], bv[4];
#pragma unroll
            for (int a = 0; a < 4; a++) av[a] = As[rr][ty + 16 * a];
#pragma unroll
            for (int b = 0; b < 4; b++) bv[b] = Bs[rr][tx + 16 * b];
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) acc[a][b] = __fma_rn(av[a], bv[b], acc[a][b]);
        }
        __syncthreads();
    }
    double *out = reinterpret_cast<double *>(p.partials) +
                  ((static_cast<i64>(s) * p.num_heads + h) * NT + blockIdx.x) * (TILE * TILE);
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) out[(ty + 16 * a) * TILE + tx + 16 * b] = acc[a][b];
}

template <int D>
__global__ void __launch_bounds__(256) calib_reduce_kernel(const __grid_constant__ oscar_calib_gram_params p) {
    using namespace detail;
    using namespace calib;
    constexpr int NB = D / TILE;
    constexpr int NT = NB * (NB + 1) / 2;
    int ti, tj;
    tile_coords(blockIdx.x, NB, ti, tj);
    const int h = blockIdx.y;
    const double *part = reinterpret_cast<const double *>(p.partials);
    double *S = reinterpret_cast<double *>(p.acc) + static_cast<i64>(h) * D * D;
    for (int e = threadIdx.x; e < TILE * TILE; e += THREADS) {
        const int a = e / TILE, b = e % TILE;
        if (ti == tj && a > b) continue;  // the mirror of (b, a), written below
        double sum = 0.0;
        for (int sp = 0; sp < p.num_splits; sp++)
            sum += part[((static_cast<i64>(sp) * p.num_heads + h) * NT + blockIdx.x) * (TILE * TILE) + e];
        const int r = ti * TILE + a, c = tj * TILE + b;
        S[r * D + c] += sum;
        if (r != c) S[c * D + r] += sum;
    }
    if (p.count && blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0)
        *reinterpret_cast<double *>(p.count) += static_cast<double>(p.count_add);
}

template <int D>
__global__ void __launch_bounds__(256) calib_weights_kernel(const __grid_constant__ oscar_calib_weight_params p) {
    using namespace detail;
    using namespace calib;
    static_assert(D % 32 == 0 && D <= 256, "head dim");
    __shared__ double Ks[WTOK][D];
    __shared__ double red[THREADS / 32][WTOK];
    const int h = blockIdx.y;
    const i64 t0 = static_cast<i64>(blockIdx.x) * WTOK;
    for (int e = threadIdx.x; e < WTOK * D; e += THREADS) {
        const int t = e / D, d = e % D;
        const i64 tok = t0 + t;
        Ks[t][d] = tok < p.num_tokens
                       ? load_elem(p.k, tok * p.token_stride + static_cast<i64>(h) * p.head_stride + d, p.dtype)
                       : 0.0;
    }
    __syncthreads();
    const double *C = reinterpret_cast<const double *>(p.cq) + static_cast<i64>(h) * D * D;
    double part[WTOK];
#pragma unroll
    for (int t = 0; t < WTOK; t++) part[t] = 0.0;
    for (int c = threadIdx.x; c < D; c += THREADS) {
        double u[WTOK];
#pragma unroll
        for (int t = 0; t < WTOK; t++) u[t] = 0.0;
        for (int d = 0; d < D; d++) {
            const double cdc = C[d * D + c];  // coalesced across threads
#pragma unroll
            for (int t = 0; t < WTOK; t++) u[t] = __fma_rn(Ks[t][d], cdc, u[t]);
        }
#pragma unroll
        for (int t = 0; t < WTOK; t++) part[t] = __fma_rn(u[t], Ks[t][c], part[t]);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
    for (int t = 0; t < WTOK; t++) {
        double v = part[t];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0) red[warp][t] = v;
    }
    __syncthreads();
    if (threadIdx.x < WTOK) {
        const i64 tok = t0 + threadIdx.x;
        double w = 0.0;
        for (int i = 0; i < THREADS / 32; i++) w += red[i][threadIdx.x];
        if (tok < p.num_tokens) reinterpret_cast<double *>(p.weights)[tok * p.num_heads + h] = w;
    }
}

__global__ void __launch_bounds__(256) calib_sum_weights_kernel(const __grid_constant__ oscar_calib_weight_params p) {
    using namespace detail;
    using namespace calib;
    __shared__ double red[THREADS];
    const int h = blockIdx.x;
    const double *w = reinterpret_cast<const double *>(p.weights);
    double s = 0.0;
    for (i64 t = threadIdx.x; t < p.num_tokens; t += THREADS) s += w[t * p.num_heads + h];
    red[threadIdx.x] = s;
    __syncthreads();
    for (int o = THREADS / 2; o > 0; o >>= 1) {
        if (static_cast<int>(threadIdx.x) < o) red[threadIdx.x] += red[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) reinterpret_cast<double *>(p.wsum)[h] += red[0];
}

}  // namespace oscar

#endif  // OSCAR_K_CALIB_CUH
