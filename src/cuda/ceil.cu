/* ceil.cu: what the GPU reaches, measured in the same command as a benchmark
 * (dg_cuda_ceilings_measure, backend.h), so that `dgemma bench --device cuda`
 * puts its rows against this GPU's ceilings instead of the host's:
 *
 *   read  a streaming-read kernel: grid-stride over the buffer in 16-byte
 *         loads (four in flight per thread), a per-thread sum of the words,
 *         reduced per block and written out (so the loads cannot be dropped);
 *         bytes read per second
 *   copy  cudaMemcpyAsync device to device; bytes read + written per second
 *   bf16  cublasGemmEx, bf16 A and B, fp32 C and accumulation (the tensor-core
 *         rate the dense products of the forward pass use); FLOP/s
 *
 * The buffers hold random non-zero data generated on the device (a zero page
 * could be served by compression or special paths). Each figure is the best
 * and the median of `reps` repetitions after one untimed run, timed with
 * cudaEvents on the default stream. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/common.cuh"

#define CEIL_THREADS 256

/* p[i] = dg_cuda_ceil_word(i) for i < n (uint32 words). */
__global__ void __launch_bounds__(CEIL_THREADS) ceil_fill_kernel(uint32_t *p, size_t n) {
  DG_PDL_ENTRY();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = dg_cuda_ceil_word(i);
}

/* n bf16 values +-[0.5, 1) (random sign and mantissa from word i + off of the hash). */
__global__ void __launch_bounds__(CEIL_THREADS) ceil_fill_bf16_kernel(uint16_t *p, size_t n, uint64_t off) {
  DG_PDL_ENTRY();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = (uint16_t)((dg_cuda_ceil_word(i + off) >> 8 & 0x807fu) | 0x3f00u);
}

__device__ __forceinline__ uint32_t sum4(uint4 v) { return v.x + v.y + v.z + v.w; }

/* part[block] = sum mod 2^32 of the words the block's threads read; every
 * 16-byte chunk i < n of p is read by exactly one thread. */
__global__ void __launch_bounds__(CEIL_THREADS) ceil_read_kernel(const uint4 *p, size_t n, uint32_t *part) {
  DG_PDL_ENTRY();
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  uint32_t s = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = p[i], b = p[i + stride], c = p[i + 2 * stride], d = p[i + 3 * stride];
    s += sum4(a) + sum4(b) + sum4(c) + sum4(d);
  }
  for (; i < n; i += stride) s += sum4(p[i]);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  __shared__ uint32_t ws[CEIL_THREADS / 32];
  if ((threadIdx.x & 31) == 0) ws[threadIdx.x >> 5] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    uint32_t t = 0;
    for (int w = 0; w < CEIL_THREADS / 32; w++) t += ws[w];
    part[blockIdx.x] = t;
  }
}

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Best and median of v[n] (sorted in place): the smallest time is the best. */
static void best_med(double *v, int n, double *best, double *med) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  *best = v[0];
  *med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

#define CT_(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    st = dg_seterr(e_ == cudaErrorMemoryAllocation ? DG_ERR_OUT_OF_MEMORY : DG_ERR_BACKEND, "%s:%d: %s failed: %s (%s)", \
                   __FILE__, __LINE__, #call, cudaGetErrorName(e_), cudaGetErrorString(e_)); goto done; } } while (0)
#define CT_OK_(x) do { if ((st = (x)) != DG_OK) goto done; } while (0)
#define CTB_(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { \
    st = dg_seterr(DG_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cublasGetStatusString(s_)); \
    goto done; } } while (0)

/* Time a warm-up and R timed runs of op() (a dg_status; its work on stream 0,
 * between events e0 and e1): t[0..R) gets the seconds of each timed run,
 * *best and *med the fastest and the median (best_med). */
template <class Op>
static dg_status time_reps(int R, cudaEvent_t e0, cudaEvent_t e1, double *t, double *best, double *med, Op op) {
  for (int r = -1; r < R; r++) {
    CK(cudaEventRecord(e0, 0));
    DG_TRY(op());
    CK(cudaEventRecord(e1, 0));
    CK(cudaEventSynchronize(e1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    if (r >= 0) t[r] = 1e-3 * (ms > 0 ? ms : 1e-6f);
  }
  best_med(t, R, best, med);
  return DG_OK;
}

extern "C" dg_status dg_cuda_ceilings_measure(int device, int64_t read_bytes, int64_t copy_bytes, int gemm_n,
                                              int reps, dg_cuda_ceilings *out) {
  if (!out || read_bytes < 0 || copy_bytes < 0 || gemm_n < 0 || reps < 0 || reps > 1000)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_ceilings_measure: out NULL, a negative size or reps outside [0, 1000]");
  memset(out, 0, sizeof *out);
  DG_TRY(dg_cuda_info(device, NULL, 0)); /* a GPU this build can run on */
  const size_t rb = read_bytes ? ((size_t)read_bytes < 16 ? 16 : (size_t)read_bytes & ~(size_t)15) : (size_t)4 << 30;
  const size_t cb = copy_bytes ? ((size_t)copy_bytes < 16 ? 16 : (size_t)copy_bytes & ~(size_t)15) : (size_t)2 << 30;
  const int n = gemm_n ? (gemm_n < 16 ? 16 : gemm_n & ~15) : 8192;
  const int R = reps ? reps : 10;
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, device));
  snprintf(out->name, sizeof out->name, "%s", prop.name);
  out->sms = prop.multiProcessorCount;
  out->reps = R;
  out->read_bytes = rb;
  out->copy_bytes = cb;
  out->gemm_n = n;
  const int grid = 8 * (prop.multiProcessorCount > 0 ? prop.multiProcessorCount : 1); /* 2048 threads per SM */
  const size_t sb = rb > cb ? rb : cb;
  dg_status st = DG_OK;
  void *src = NULL, *dst = NULL, *A = NULL, *B = NULL, *C = NULL;
  uint32_t *part = NULL, *hpart = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  cublasHandle_t blas = NULL;
  double *t = (double *)malloc((size_t)R * sizeof *t);
  if (!t || !(hpart = (uint32_t *)malloc((size_t)grid * 4))) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  CT_(cudaEventCreate(&e0));
  CT_(cudaEventCreate(&e1));
  CT_(cudaMalloc(&src, sb));
  CT_(cudaMalloc(&dst, cb));
  CT_(cudaMalloc((void **)&part, (size_t)grid * 4));
  DG_LAUNCH(ceil_fill_kernel, grid, CEIL_THREADS, 0, 0)((uint32_t *)src, sb / 4);
  CT_(cudaGetLastError());
  CT_(cudaDeviceSynchronize());
  double best, med;
  /* read */
  CT_OK_(time_reps(R, e0, e1, t, &best, &med, [&]() -> dg_status {
    DG_LAUNCH(ceil_read_kernel, grid, CEIL_THREADS, 0, 0)((const uint4 *)src, rb / 16, part);
    CK(cudaGetLastError());
    return DG_OK;
  }));
  CT_(cudaMemcpy(hpart, part, (size_t)grid * 4, cudaMemcpyDeviceToHost));
  for (int b = 0; b < grid; b++) out->read_sum += hpart[b];
  out->read_bps = (double)rb / best;
  out->read_med_bps = (double)rb / med;
  /* device-to-device copy */
  CT_OK_(time_reps(R, e0, e1, t, &best, &med, [&]() -> dg_status {
    CK(cudaMemcpyAsync(dst, src, cb, cudaMemcpyDeviceToDevice, 0));
    return DG_OK;
  }));
  out->copy_bps = 2.0 * (double)cb / best;
  out->copy_med_bps = 2.0 * (double)cb / med;
  CT_(cudaFree(src)); src = NULL;
  CT_(cudaFree(dst)); dst = NULL;
  /* bf16 GEMM: C [n, n] fp32 = A B */
  {
    const size_t nn = (size_t)n * (size_t)n;
    CT_(cudaMalloc(&A, nn * 2));
    CT_(cudaMalloc(&B, nn * 2));
    CT_(cudaMalloc(&C, nn * 4));
    DG_LAUNCH(ceil_fill_bf16_kernel, grid, CEIL_THREADS, 0, 0)((uint16_t *)A, nn, 0);
    CT_(cudaGetLastError());
    DG_LAUNCH(ceil_fill_bf16_kernel, grid, CEIL_THREADS, 0, 0)((uint16_t *)B, nn, nn);
    CT_(cudaGetLastError());
    CTB_(cublasCreate(&blas));
    CTB_(cublasSetStream(blas, 0));
    CTB_(cublasSetMathMode(blas, CUBLAS_DEFAULT_MATH));
    const float one = 1.0f, zero = 0.0f;
    CT_OK_(time_reps(R, e0, e1, t, &best, &med, [&]() -> dg_status {
      CKB(cublasGemmEx(blas, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, A, CUDA_R_16BF, n, B, CUDA_R_16BF, n, &zero, C,
                       CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      return DG_OK;
    }));
    const double fl = 2.0 * (double)n * (double)n * (double)n;
    out->bf16_flops = fl / best;
    out->bf16_med_flops = fl / med;
  }
done:
  if (blas) cublasDestroy(blas);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(part);
  cudaFree(A);
  cudaFree(B);
  cudaFree(C);
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  free(t);
  free(hpart);
  return st;
}
