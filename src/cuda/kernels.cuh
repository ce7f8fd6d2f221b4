/* kernels.cuh: device helpers of the forward pass's kernels (kernels.cu) that
 * the step-kernel lab (dev/cuda/step_kernels.cu) uses too: the block sum and
 * the proposal draws' Philox4x32-10 (src/base/rng.c). Included once per translation
 * unit (no relocatable device code: each has its own copy). */
#ifndef DG_CUDA_KERNELS_CUH
#define DG_CUDA_KERNELS_CUH

#include "cuda/common.cuh"

/* Sum over the block (blockDim.x a multiple of 32, at most 1024). sh: 32 slots. */
template <typename T> __device__ __forceinline__ T block_sum(T v, T *sh) {
  for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
  __syncthreads(); /* sh may still be read by a previous call */
  if (l == 0) sh[w] = v;
  __syncthreads();
  if (w == 0) {
    v = l < nw ? sh[l] : T(0);
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (l == 0) sh[0] = v;
  }
  __syncthreads();
  return sh[0];
}

/* Philox4x32-10 with Random123's constants, as src/base/rng.c. */
__device__ __forceinline__ void philox4x32_10(uint32_t c[4], uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; r++) {
    uint32_t hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
    uint32_t hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
    uint32_t n0 = hi1 ^ c[1] ^ k0, n1 = lo1, n2 = hi0 ^ c[3] ^ k1, n3 = lo0;
    c[0] = n0; c[1] = n1; c[2] = n2; c[3] = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

/* Uniform in [0,1) of draw (seed, DG_RNG_PROPOSAL = 2, block, step, i): src/base/rng.h. */
__device__ __forceinline__ float proposal_uniform(uint64_t seed, uint32_t block, uint32_t step, uint32_t i) {
  uint32_t c[4] = {i / 4, step, block, 2u};
  philox4x32_10(c, (uint32_t)seed, (uint32_t)(seed >> 32));
  return (float)(c[i % 4] >> 8) * (1.0f / 16777216.0f);
}

#endif
