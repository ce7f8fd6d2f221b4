/* sc_prod.cu: the self-conditioning product P . E of the backend under DGEMMA_STACK_DENSE=1 or inv (issues 12 and 14,
 * session 27 helper sk12): src/cuda/sc_prod.cuh's kernel, whose output row r has the same words whatever the row count
 * (its file comment), in place of cuBLAS's default (=1: not invariant at small M) or cublasLt's split-K-1 algorithm
 * (=inv: invariant but 2.6x the default's time at 163 rows, session 27's H100 call). Entered from gemm_inv
 * (src/cuda/gemm_inv.cu), so soft_from and dg_cuda_turbo_sc reach it unchanged. */
#include "cuda/host.cuh"
#include "cuda/sc_prod.cuh"

/* The workspace's rows: a product of more rows runs in ceil(n / SC_MC) equal chunks, each reading E once more (at
 * 256 rows the chunk's tensor work, ~0.38 TFLOP on the 26B, outlasts its 1.48 GB read). 12 x 256 x 2816 x 4 bytes =
 * 34.6 MB per context on the 26B. */
enum { SC_MC = 256 };

int sc_prod_gemm(dg_cuda_ctx *c, int m, int n, int k, float alpha, const bf16 *E, const bf16 *P, int ldb, float *C,
                 int ldc, dg_status *st) {
  if (!sc_prod_fits(k, m, ldb, P, E) || ldc < m) return 0;
  *st = DG_OK;
  if (n <= 0) return 1;
  const int S = sc_prod_splits(k);
  const size_t row_bytes = (size_t)S * m * 4;
  if (!c->sc_ws) { /* first use: never inside a capture (graph.cu runs a key's first use plainly) */
#ifndef DG_CUDA_EMU
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(c->stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) {
      *st = dg_seterr(DG_ERR_BACKEND, "self-conditioning product (sc_prod): its workspace would be allocated "
                                      "inside a stream capture");
      return 1;
    }
#endif
    const cudaError_t e = cudaMalloc((void **)&c->sc_ws, row_bytes * SC_MC);
    if (e != cudaSuccess) {
      c->sc_ws = NULL;
      *st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "self-conditioning product (sc_prod): workspace of %zu bytes: %s",
                      row_bytes * SC_MC, cudaGetErrorString(e));
      return 1;
    }
    c->sc_ws_bytes = row_bytes * SC_MC;
  }
  const int mc = (int)(c->sc_ws_bytes / row_bytes < SC_MC ? c->sc_ws_bytes / row_bytes : SC_MC);
  if (mc < 1) {
    *st = dg_seterr(DG_ERR_BACKEND, "self-conditioning product (sc_prod): the workspace (%zu bytes) is too small "
                                    "for H %d, V %d", c->sc_ws_bytes, m, k);
    return 1;
  }
  const cudaError_t e = sc_prod_run(c->stream, P, ldb, E, k, m, n, alpha, C, ldc, c->sc_ws, mc, 0);
  if (e != cudaSuccess)
    *st = dg_seterr(DG_ERR_BACKEND, "self-conditioning product (sc_prod) of %d rows, H %d, V %d: %s", n, m, k,
                    cudaGetErrorString(e));
  return 1;
}

void sc_prod_free(dg_cuda_ctx *c) {
  if (c->sc_ws) cudaFree(c->sc_ws);
  c->sc_ws = NULL;
  c->sc_ws_bytes = 0;
}

int sc_prod_splits_of(int k) { return sc_prod_splits(k); }
