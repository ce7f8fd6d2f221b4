/* qmoe_wl.cu: DGEMMA_WL=1 (off by default; session 24, issues 12 and 14), the hybrid gate/up product of the 4-bit
 * g64 experts: the experts of at least WL_MIN_ROWS (128) rows through wl_kernel (qmoe_wl.cuh, the kernel lab's
 * version 122: 128-row passes x 256 columns, wgmma with the weights dequantized to bf16 once per tile), the others
 * through qr_kernel, in the same stream, on the same input copy xp and into the same h (qmoe.cu k_qe_gate_up): a
 * one-block launch splits the experts' counts at the threshold (k_wl_split: two arrays of E, each zero for the other
 * kernel's experts), qr_kernel runs on the first, wl_kernel on the second, so that neither kernel changed (the
 * default path's PTX is what it was). The down product and every other stage are the default's.
 *
 * Why off by default: wl_kernel's sums are those of the DQ body (each weight rounded once to bf16, the qdq bound of
 * tests/test_cuda.c), qr_kernel's the exact fold's; an expert takes one or the other by its row count in this pass,
 * so with the switch on a canvas's h (and all after it) in a stacked pass of several canvases may differ, within
 * the bound, from its single run, where its experts had fewer rows (session 12 saw the same of DGEMMA_QR_DQ). The
 * speed (lab, H100, session 24 morning): 1.3-1.6x the backend's kernel at 128 and 256 rows per expert, slower at 64.
 *
 * Device memory: the wl layout is kept beside the lane records (both are needed: the experts under the threshold
 * read the lane records), wl_bytes(1, E, IE, H, 256): the 26B-A4B's gate/up 128 x 6 slabs x 44 groups x 9,216 bytes
 * = 311.4 MB a layer (the lane records 285.5 MB; the last slab is half empty, IE 704 = 5.5 x 128 features).
 * Needs a device and a build with wgmma (sm_90a code: CUDA_ARCH=-gencode=arch=compute_90a,code=sm_90a); elsewhere
 * (the default build, compute_90) the switch is ignored: qr_wl_usable says 0 and nothing is packed. */
#include <stdlib.h>
#include <string.h>

#include "backend/switches.h"
#include "cuda/host.cuh"
#include "cuda/qmoe_wl.cuh"

static int wl_override = -1;
void qr_wl_set(int on) { wl_override = on; }
int qr_wl_on(void) {
  if (wl_override >= 0) return wl_override;
  static int v = -1; /* read once (a data race on first use writes the same value) */
  if (v < 0) v = dg_sw_get(DG_SW_WL) == 1; /* backend/switches.c */
  return v;
}

__global__ void wl_probe_kernel(int *out) {
  DG_PDL_ENTRY();
  *out = dg_wg_available();
}

/* Whether the current device runs this build's wgmma code (the device took the build's sm_90a SASS: a Hopper GPU
 * and a build with -gencode=arch=compute_90a,code=sm_90a; the compute_90 PTX JIT-compiled for it, or sm_90 SASS,
 * say 0): a one-thread probe of dg_wg_available() in device code, run once per process and device (64 devices
 * kept; a device number past that is probed each time). Not inside a stream capture (it allocates and copies).
 * The users: DGEMMA_WL=1 (qr_wl_usable below) and the passes' attention default (attention.cu k_attention_choose). */
int cuda_wg_available(void) {
  static int v[64] = {0}; /* 0 unknown, 1 no, 2 yes (a data race on first use writes the same value) */
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  if (dev >= 0 && dev < 64 && v[dev]) return v[dev] == 2;
  int *d = NULL, h = 0, ok = 0;
  if (cudaMalloc((void **)&d, sizeof(int)) == cudaSuccess) {
    DG_LAUNCH(wl_probe_kernel, 1, 1, 0, 0)(d);
    if (cudaGetLastError() == cudaSuccess && cudaMemcpy(&h, d, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess)
      ok = h == 1;
    cudaFree(d);
  }
  (void)cudaGetLastError();
  if (dev >= 0 && dev < 64) v[dev] = ok ? 2 : 1;
  return ok;
}

#define WL_GU 1, 2, 5, 1, 256 /* version 122: gate/up, 2 warpgroups, 5 slots, 1 block per SM, 256 columns */

int qr_wl_usable(const dg_weight *m, int gateup) {
  if (!gateup || !qr_wl_on() || m->bits != 4 || m->group_size != 64 || m->sb_dtype != DG_BF16 || m->cols % 64)
    return 0;
  if (!cuda_wg_available()) return 0;
  /* the kernel's shared memory, set here, outside any stream capture */
  const size_t smem = (size_t)5 * (128 * 128 + wl_chunk(256)) + 3 * wl_btile(256) + 1024;
  return cudaFuncSetAttribute(wl_kernel<WL_GU>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess;
}

dg_status up_experts_wl(alloc_list *al, dg_cuda_w *dst, const dg_weight *m, int64_t E, const char *what) {
  const int IE = (int)(m->rows / (2 * E)), H = (int)m->cols;
  const size_t bytes = wl_bytes(1, E, IE, H, 256);
  uint8_t *h = (uint8_t *)malloc(bytes);
  if (!h) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory packing %s's wl layout (%zu bytes)", what, bytes);
  wl_pack(1, E, IE, H, 256, (const uint8_t *)m->data, (const uint16_t *)m->scales, (const uint16_t *)m->biases, h);
  dg_status st = dalloc(al, &dst->wl, bytes, what);
  cudaError_t e = cudaSuccess;
  if (st == DG_OK && (e = cudaMemcpy(dst->wl, h, bytes, cudaMemcpyHostToDevice)) != cudaSuccess)
    st = dg_seterr(DG_ERR_BACKEND, "%s:%d: cudaMemcpy of %s's wl layout failed: %s", __FILE__, __LINE__, what,
                   cudaGetErrorString(e));
  free(h);
  return st;
}

long qr_wl_launches = 0;

__global__ void wl_split_kernel(const int32_t *count, int32_t *wl_count, int E) {
  DG_PDL_ENTRY();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const int c = count[e], big = c >= WL_MIN_ROWS;
    wl_count[e] = big ? 0 : c;
    wl_count[E + e] = big ? c : 0;
  }
}

cudaError_t k_wl_split(cudaStream_t s, const int32_t *count, int32_t *wl_count, int E) {
  DG_LAUNCH(wl_split_kernel, 1, 128, 0, s)(count, wl_count, E);
  return cudaGetLastError();
}

cudaError_t k_wl_gate_up(cudaStream_t s, const dg_cuda_w *W, const qe_args &a0, int E) {
  qe_args a = a0;
  a.q = (const uint32_t *)W->wl;
  qr_wl_launches++;
  DG_LAUNCH(wl_kernel<WL_GU>, dim3(E, wl_slabs(1, a.N, 256)), 256,
            (size_t)5 * (128 * 128 + wl_chunk(256)) + 3 * wl_btile(256) + 1024, s)(a);
  return cudaGetLastError();
}
