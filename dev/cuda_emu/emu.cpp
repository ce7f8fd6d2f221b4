/* emu.cpp (dev/cuda_emu): the block scheduler, the runtime calls and the cuBLAS
 * calls of the emulation described in emu.h. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <ucontext.h>

#include <vector>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuda_runtime.h"

namespace emu {
uint3_ threadIdx_, blockIdx_;
dim3 blockDim_, gridDim_;

namespace {
const size_t STACK = 256 * 1024;
struct thr {
  ucontext_t ctx;
  uint3_ idx;
  bool done;
};
std::vector<thr> th;
std::vector<char> stacks;
ucontext_t sched;
int cur = -1, nthreads = 0, alive = 0;
std::function<void()> body;
/* block barrier */
int bar_count = 0;
unsigned bar_gen = 0;
/* named barriers (bar.sync id, n): 16 per block, as on the GPU; id 0 is __syncthreads' own */
int nb_count[16];
unsigned nb_gen[16];
/* warp exchange */
struct warp {
  int count;
  unsigned gen;
  unsigned char val[32][64]; /* one lane's published value (a shuffle's 8 bytes, an mma fragment set) */
};
std::vector<warp> warps;
std::vector<unsigned char> smem;
cudaError_t last = cudaSuccess;

void yield() { swapcontext(&th[cur].ctx, &sched); }
void entry() {
  body();
  th[cur].done = true;
  alive--;
}
int warp_size(int w) { int n = nthreads - 32 * w; return n < 32 ? n : 32; }
}  // namespace

int lane() { return cur & 31; }
void check_aligned(const void *p, unsigned bytes, const char *what, const char *file, int line) {
  if ((uintptr_t)p % bytes) {
    fprintf(stderr, "emu: %s:%d: %s = %p is not %u-byte aligned (a vector access would fault on the GPU)\n", file,
            line, what, p, bytes);
    abort();
  }
}
void *dyn_smem() { return smem.data(); }

void syncthreads() {
  unsigned g = bar_gen;
  if (++bar_count == nthreads) {
    bar_count = 0;
    bar_gen++;
    return;
  }
  int spins = 0;
  while (bar_gen == g) {
    yield();
    if (++spins > 1000000) { fprintf(stderr, "emu: __syncthreads deadlock (threads exited early?)\n"); abort(); }
  }
}

/* bar.sync id, n (PTX ISA, "bar.sync"): the first n threads to arrive at barrier id go on together. A count
 * that is not a multiple of 32 (or is over the block's threads), or id outside 1..15, is a bug in the kernel. */
void bar_sync(int id, int n) {
  if (id < 1 || id > 15 || n <= 0 || n % 32 || n > nthreads) {
    fprintf(stderr, "emu: bar.sync %d, %d in a block of %d threads\n", id, n, nthreads);
    abort();
  }
  unsigned g = nb_gen[id];
  if (++nb_count[id] == n) {
    nb_count[id] = 0;
    nb_gen[id]++;
    return;
  }
  int spins = 0;
  while (nb_gen[id] == g) {
    yield();
    if (++spins > 1000000) { fprintf(stderr, "emu: bar.sync %d deadlock\n", id); abort(); }
  }
}

/* Each lane publishes its value, waits for its warp, reads src_lane's, waits again. */
static void warp_barrier(warp &w, int n) {
  unsigned g = w.gen;
  if (++w.count == n) { w.count = 0; w.gen++; return; }
  int spins = 0;
  while (w.gen == g) {
    yield();
    if (++spins > 1000000) { fprintf(stderr, "emu: warp shuffle deadlock (diverged warp?)\n"); abort(); }
  }
}
void warp_exchange(const void *v, void *out, int size, int src) {
  const int wi = cur >> 5, n = warp_size(wi);
  warp &w = warps[wi];
  memcpy(w.val[cur & 31], v, (size_t)size);
  warp_barrier(w, n);
  if (src >= n) { fprintf(stderr, "emu: shuffle from inactive lane %d\n", src); abort(); }
  memcpy(out, w.val[src], (size_t)size);
  warp_barrier(w, n);
}

/* Each lane publishes `size` bytes; every lane gets all 32 (the warp-wide mma of src/cuda/mma.cuh). */
void warp_gather(const void *v, void *all, int size) {
  const int wi = cur >> 5, n = warp_size(wi);
  warp &w = warps[wi];
  if (size > 64 || n != 32) { fprintf(stderr, "emu: warp_gather of %d bytes over %d lanes\n", size, n); abort(); }
  memcpy(w.val[cur & 31], v, (size_t)size);
  warp_barrier(w, n);
  for (int l = 0; l < 32; l++) memcpy((unsigned char *)all + (size_t)l * size, w.val[l], (size_t)size);
  warp_barrier(w, n);
}

void run(dim3 grid, dim3 block, size_t sm, std::function<void()> fn) {
  const int n = (int)(block.x * block.y * block.z);
  if (n <= 0 || n > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 ||
      sm > 227 * 1024) {
    fprintf(stderr, "emu: bad launch grid (%u,%u,%u) block (%u,%u,%u) smem %zu\n", grid.x, grid.y, grid.z, block.x,
            block.y, block.z, sm);
    last = cudaErrorInvalidConfiguration;
    return;
  }
  if ((int)th.size() < n) {
    th.resize((size_t)n);
    stacks.assign((size_t)n * STACK, 0);
  }
  smem.assign(sm + 16, 0xFF); /* uninitialised: NaN */
  warps.assign((size_t)(n + 31) / 32, warp{0, 0, {}});
  blockDim_ = block;
  gridDim_ = grid;
  body = fn;
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        blockIdx_ = uint3_{bx, by, bz};
        bar_count = 0;
        for (int b = 0; b < 16; b++) nb_count[b] = 0;
        for (auto &w : warps) w.count = 0;
        for (int i = 0; i < n; i++) {
          getcontext(&th[i].ctx);
          th[i].ctx.uc_stack.ss_sp = stacks.data() + (size_t)i * STACK;
          th[i].ctx.uc_stack.ss_size = STACK;
          th[i].ctx.uc_link = &sched;
          makecontext(&th[i].ctx, entry, 0);
          th[i].idx = uint3_{(unsigned)(i % block.x), (unsigned)((i / block.x) % block.y),
                             (unsigned)(i / (block.x * block.y))};
          th[i].done = false;
        }
        nthreads = n;
        alive = n;
        while (alive > 0)
          for (int i = 0; i < n; i++) {
            if (th[i].done) continue;
            cur = i;
            threadIdx_ = th[i].idx;
            swapcontext(&sched, &th[i].ctx);
          }
      }
  cur = -1;
}
}  // namespace emu

/* ---- runtime ---- */
static int emu_fail_malloc_above = -1;
cudaError_t cudaGetDeviceCount(int *n) { *n = 1; return cudaSuccess; }
cudaError_t cudaGetDeviceProperties(cudaDeviceProp *p, int) {
  memset(p, 0, sizeof *p);
  snprintf(p->name, sizeof p->name, "dgemma CPU emulation of CUDA (dev/cuda_emu)");
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 1;
  p->totalGlobalMem = (size_t)64 << 30;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int) { return cudaSuccess; }
cudaError_t cudaGetDevice(int *dev) { *dev = 0; return cudaSuccess; }
/* the emulated device reports the H200's 132 multiprocessors (the kernels' split counts follow) */
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr, int) { *v = 132; return cudaSuccess; }
cudaError_t cudaMemGetInfo(size_t *fr, size_t *tot) { *fr = *tot = (size_t)64 << 30; return cudaSuccess; }
cudaError_t cudaDriverGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaRuntimeGetVersion(int *v) { *v = 13000; return cudaSuccess; }
cudaError_t cudaMalloc(void **p, size_t n) {
  (void)emu_fail_malloc_above;
  *p = malloc(n);
  if (!*p) return cudaErrorMemoryAllocation;
  memset(*p, 0xFF, n); /* uninitialised device memory reads as NaN */
  return cudaSuccess;
}
cudaError_t cudaFree(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMallocHost(void **p, size_t n) { *p = malloc(n); return *p ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaFreeHost(void *p) { free(p); return cudaSuccess; }
cudaError_t cudaMemcpy(void *d, const void *s, size_t n, cudaMemcpyKind) { memmove(d, s, n); return cudaSuccess; }
cudaError_t cudaMemcpyAsync(void *d, const void *s, size_t n, cudaMemcpyKind, cudaStream_t) {
  memmove(d, s, n);
  return cudaSuccess;
}
cudaError_t cudaMemset(void *d, int v, size_t n) { memset(d, v, n); return cudaSuccess; }
cudaError_t cudaMemset2DAsync(void *d, size_t pitch, int v, size_t width, size_t height, cudaStream_t) {
  if (width > pitch) return cudaErrorInvalidValue; /* as the runtime: a row may not overlap the next */
  for (size_t r = 0; r < height; r++) memset((char *)d + r * pitch, v, width);
  return cudaSuccess;
}
struct emu_event { double t; };
cudaError_t cudaEventCreate(cudaEvent_t *e) { *e = (cudaEvent_t)calloc(1, sizeof(emu_event)); return *e ? cudaSuccess : cudaErrorMemoryAllocation; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned) { return cudaEventCreate(e); }
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  if (!e) return cudaErrorInvalidValue;
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  e->t = (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) { return e ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
  if (!a || !b) return cudaErrorInvalidValue;
  *ms = (float)(1e3 * (b->t - a->t));
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) { free(e); return cudaSuccess; }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned) { *s = (cudaStream_t)malloc(1); return cudaSuccess; }
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t e, unsigned) { return e ? cudaSuccess : cudaErrorInvalidValue; }
cudaError_t cudaStreamDestroy(cudaStream_t s) { free(s); return cudaSuccess; }
cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
cudaError_t cudaGetLastError(void) { cudaError_t e = emu::last; emu::last = cudaSuccess; return e; }
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }

/* ---- cuBLAS ---- */
cublasStatus_t cublasCreate(cublasHandle_t *h) { *h = (cublasHandle_t)malloc(1); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasDestroy(cublasHandle_t h) { free(h); return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetStream(cublasHandle_t, cudaStream_t) { return CUBLAS_STATUS_SUCCESS; }
cublasStatus_t cublasSetMathMode(cublasHandle_t, cublasMath_t) { return CUBLAS_STATUS_SUCCESS; }
const char *cublasGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "success" : "emulated cuBLAS error"; }

static float elem(const void *p, cudaDataType t, size_t i) {
  if (t == CUDA_R_16BF) return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
  return ((const float *)p)[i];
}

static cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void *A,
                           cudaDataType at, int lda, const void *B, cudaDataType bt, int ldb, float beta, void *C,
                           cudaDataType ct, int ldc) {
  if (ct != CUDA_R_32F || m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_NOT_SUPPORTED;
  if (lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n) || ldc < m) return CUBLAS_STATUS_INVALID_VALUE;
  float *c = (float *)C;
  std::vector<float> a((size_t)k);
#pragma omp parallel for firstprivate(a) schedule(static)
  for (int i = 0; i < m; i++) {
    a.resize((size_t)k);
    for (int l = 0; l < k; l++) a[(size_t)l] = elem(A, at, ta == CUBLAS_OP_N ? (size_t)i + (size_t)l * lda : (size_t)l + (size_t)i * lda);
    for (int j = 0; j < n; j++) {
      float s = 0.0f;
      for (int l = 0; l < k; l++)
        s += a[(size_t)l] * elem(B, bt, tb == CUBLAS_OP_N ? (size_t)l + (size_t)j * ldb : (size_t)j + (size_t)l * ldb);
      float *o = c + (size_t)i + (size_t)j * ldc;
      *o = alpha * s + (beta != 0.0f ? beta * *o : 0.0f);
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType at, int lda, const void *B, cudaDataType bt,
                            int ldb, const void *beta, void *C, cudaDataType ct, int ldc, cublasComputeType_t,
                            cublasGemmAlgo_t) {
  return gemm(ta, tb, m, n, k, *(const float *)alpha, A, at, lda, B, bt, ldb, *(const float *)beta, C, ct, ldc);
}
cublasStatus_t cublasSgemm(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                           const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
                           float *C, int ldc) {
  return gemm(ta, tb, m, n, k, *alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F, ldb, *beta, C, CUDA_R_32F, ldc);
}
