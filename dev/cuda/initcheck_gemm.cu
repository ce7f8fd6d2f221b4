/* initcheck_gemm.cu: does compute-sanitizer's initcheck see every element cuBLAS writes? (issue 16: initcheck
 * flagged a 64 x 8 block of the q/k/v product's output in test_step_stats as never written, while the tests that
 * read it match the CPU). The product of the golden fixture's first layer: y[T=40, N=128] = x[40, 48] W^T (bf16 in,
 * fp32 out, cublasGemmEx as backend.cu's gemm), then a kernel reads every element of y and checks it against a
 * CPU product; run as `compute-sanitizer --tool initcheck build/initcheck_gemm`. Reports initcheck errors (if
 * any) and the largest |y - ref|: an error report together with a correct y means initcheck misses the writes.
 * Argument "graph": the product and the reader captured in one CUDA graph and replayed, the reader launched with
 * programmatic dependent launch, as dgemma's decoder passes run (src/cuda/graph.cu, common.cuh): the control of
 * scripts/san_sweep_gpu.sh, that kernels launched that way stay checked when cuBLAS's kernels are excluded.
 *   nvcc -O2 -gencode=arch=compute_90,code=sm_90 dev/cuda/initcheck_gemm.cu -lcublas -o build/initcheck_gemm */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__global__ void sum_kernel(const float *y, int n, double *out) {
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += y[i];
  atomicAdd(out, s);
}

/* sum_kernel as dgemma's kernels begin under PDL (DG_PDL_ENTRY, common.cuh): wait for the grid before it */
__global__ void sum_kernel_pdl(const float *y, int n, double *out) {
  asm volatile("griddepcontrol.launch_dependents;\n griddepcontrol.wait;\n" ::: "memory");
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += y[i];
  atomicAdd(out, s);
}

int main(int argc, char **argv) {
  const int T = 40, N = 128, K = 48, graph = argc > 1 && !strcmp(argv[1], "graph");
  static __nv_bfloat16 hx[T * K], hw[N * K];
  static float ref[T * N], hy[T * N];
  unsigned r = 1;
  for (int i = 0; i < T * K; i++) { r = r * 1664525u + 1013904223u; hx[i] = __float2bfloat16((float)((r >> 8) % 1000) / 500.0f - 1.0f); }
  for (int i = 0; i < N * K; i++) { r = r * 1664525u + 1013904223u; hw[i] = __float2bfloat16((float)((r >> 8) % 1000) / 500.0f - 1.0f); }
  for (int t = 0; t < T; t++)
    for (int n = 0; n < N; n++) {
      double s = 0;
      for (int k = 0; k < K; k++) s += (double)__bfloat162float(hx[t * K + k]) * __bfloat162float(hw[n * K + k]);
      ref[t * N + n] = (float)s;
    }
  __nv_bfloat16 *x, *w;
  float *y;
  double *sum;
  cudaMalloc(&x, sizeof hx); cudaMalloc(&w, sizeof hw); cudaMalloc(&y, sizeof hy); cudaMalloc(&sum, 8);
  cudaMemcpy(x, hx, sizeof hx, cudaMemcpyHostToDevice);
  cudaMemcpy(w, hw, sizeof hw, cudaMemcpyHostToDevice);
  cudaMemset(sum, 0, 8);
  cublasHandle_t h;
  cublasCreate(&h);
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = CUBLAS_STATUS_NOT_INITIALIZED; /* graph mode: stays so if the capture could not begin */
  cudaError_t ge = cudaSuccess; /* graph mode: the first failed call of the capture and replay */
  if (!graph) {
    st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K, &beta, y,
                      CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    sum_kernel<<<1, 256>>>(y, T * N, sum);
  } else { /* a workspace of its own, as dgemma's contexts (cuBLAS allocates none inside a capture) */
    cudaStream_t s;
    void *ws;
    cudaGraph_t g;
    cudaGraphExec_t gx;
    const size_t ws_bytes = (size_t)32 << 20;
    cudaDeviceSynchronize(); /* the copies and the memset above, on the legacy stream, done before s (non-blocking) */
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cudaMalloc(&ws, ws_bytes);
    cublasSetStream(h, s);
    cublasSetWorkspace(h, ws, ws_bytes);
    if ((ge = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal)) != cudaSuccess) goto out;
    st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &alpha, w, CUDA_R_16BF, K, x, CUDA_R_16BF, K, &beta, y,
                      CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    {
      cudaLaunchConfig_t cfg;
      cudaLaunchAttribute at;
      memset(&cfg, 0, sizeof cfg);
      memset(&at, 0, sizeof at);
      at.id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at.val.programmaticStreamSerializationAllowed = 1;
      cfg.gridDim = dim3(1);
      cfg.blockDim = dim3(256);
      cfg.stream = s;
      cfg.attrs = &at;
      cfg.numAttrs = 1;
      const float *yc = y;
      const int n = T * N;
      cudaError_t le = cudaLaunchKernelEx(&cfg, sum_kernel_pdl, yc, n, sum);
      cudaError_t ce = cudaStreamEndCapture(s, &g);
      if ((ge = le != cudaSuccess ? le : ce) != cudaSuccess) goto out;
    }
    if ((ge = cudaGraphInstantiate(&gx, g, 0)) != cudaSuccess) goto out;
    if ((ge = cudaGraphLaunch(gx, s)) != cudaSuccess) goto out;
    ge = cudaStreamSynchronize(s);
  out:;
  }
  cudaMemcpy(hy, y, sizeof hy, cudaMemcpyDeviceToHost);
  double worst = 0;
  for (int i = 0; i < T * N; i++) worst = fmax(worst, fabs(hy[i] - ref[i]));
  printf("%scublasGemmEx status %d, kernel %s; largest |y - ref| over all %d elements: %.3g (fp32 accumulation of %d bf16 products: <~1e-5)\n",
         graph ? "graph (the product and a PDL reader captured and replayed): " : "", (int)st,
         cudaGetErrorString(ge != cudaSuccess ? ge : cudaGetLastError()), T * N, worst, K);
  return worst < 1e-3 && ge == cudaSuccess ? 0 : 1;
}
