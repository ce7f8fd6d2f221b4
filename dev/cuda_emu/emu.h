/* emu.h: a CPU emulation of the small part of CUDA that src/cuda uses, so
 * that the kernels' indexing, masks, reductions and tile bookkeeping can be
 * checked against the CPU path on a machine without a GPU (dev/cuda_emu/README.md).
 *
 * Model: blocks run one after another (those of a thread block cluster together: run_cluster); the threads of a
 * block are cooperative
 * user-space contexts (ucontext) switched round-robin at __syncthreads and at
 * warp shuffles, so barrier semantics are exact and the run is deterministic.
 * __shared__ becomes `static` (one block at a time). WMMA fragments hold whole
 * 16x16 tiles per lane. Not emulated: timing, memory coalescing, bank
 * conflicts, races between blocks (blocks are sequential), warp divergence
 * hazards other than barriers. It says nothing about speed. */
#ifndef DG_CUDA_EMU_H
#define DG_CUDA_EMU_H

#define DG_CUDA_EMU 1

#include <math.h>
#include <stdint.h>
#include <string.h>

#include <algorithm>
#include <functional>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
struct uint3_ { unsigned x, y, z; };
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
/* fp32 product and sum, each rounded (no contraction into an FMA) */
static inline float __fmul_rn(float a, float b) { volatile float r = a * b; return r; }
static inline float __fadd_rn(float a, float b) { volatile float r = a + b; return r; }
static inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return uint4{a, b, c, d}; }
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static inline float2 make_float2(float a, float b) { return float2{a, b}; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }

namespace emu {
extern uint3_ threadIdx_, blockIdx_;
extern dim3 blockDim_, gridDim_;
void syncthreads();
void bar_sync(int id, int n); /* named barrier id (1..15) of n threads (a multiple of 32) */
void warp_exchange(const void *v, void *out, int size, int src_lane); /* all lanes of the warp */
void warp_gather(const void *v, void *all, int size);              /* all lanes: everyone's `size` (<= 64) bytes */
void *dyn_smem();
/* The shared-memory address of p (its byte offset in the launch's dynamic shared memory, which starts 1024-byte
 * aligned both as an address and on the host, so that swizzle bits agree); aborts for any other pointer (a static
 * __shared__ variable has no emulated shared address). */
uint32_t smem_addr(const void *p);
void warpgroup_gather(const void *v, void *all, int size); /* the 128 threads of a warpgroup: everyone's `size` (<= 64) bytes */
/* wgmma.mma_async m64nNk16 f32 += bf16 x bf16 (src/cuda/wgmma.cuh, dev/cuda_emu/README.md): this thread's part of the
 * warpgroup's product, recorded at the issue (a rendezvous of the warpgroup: A from registers is read then) and
 * computed at the wgmma_wait that retires its group (the descriptors' shared memory is read then). n8 = N / 8;
 * a: this thread's 4 A registers, or NULL for A from the descriptor adesc; scd 0: D = A B, else D += A B; tb 1: B
 * MN-major (imm-trans-b; 128-byte swizzle only: emu.cpp wg_elem_mn). */
void wgmma_bf16(float *d, int n8, const uint32_t *a, uint64_t adesc, uint64_t bdesc, int scd, int tb = 0);
void wgmma_commit();      /* wgmma.commit_group */
void wgmma_wait(int n);   /* wgmma.wait_group n: all but the newest n committed groups complete */
/* mbarrier and cp.async.bulk (PTX ISA, "Parallel Synchronization and Communication Instructions: mbarrier",
 * "cp.async.bulk"; dev/cuda_emu/README.md): an mbarrier in dynamic shared memory (bar: its 8 bytes) with an
 * expected arrival count, the current phase, the arrivals still pending in it and its transaction count. A bulk copy
 * global -> shared is recorded at the issue and performed (its bytes read and written, its transaction bytes
 * completed) only when a thread waits on the phase it completes, so a thread that reads the destination without
 * waiting, or waits on the wrong parity, reads the old bytes; the phase completes when its arrivals and transaction
 * bytes are all in, the next begins with the expected count again (an arrival on a phase whose arrivals are all in
 * completes that phase first: its copies have landed by then on the GPU too). Misuse aborts with the reason: an
 * uninitialised barrier, a copy not 16-byte aligned or not a multiple of 16 bytes, a destination outside the dynamic
 * shared memory, transaction bytes that do not match the copies', a wait that no arrival can complete, a block that
 * exits with copies not waited for. */
void mbar_init(void *bar, int count);
void mbar_arrive_expect_tx(void *bar, uint32_t bytes);
void bulk_g2s(void *dst, const void *src, uint32_t bytes, void *bar);
bool mbar_try_wait_parity(void *bar, uint32_t parity); /* true once the phase of that parity has completed */
void mbar_wait_parity(void *bar, uint32_t parity);      /* try_wait until true, yielding to the other threads */
/* A launch: blocks run one after another, or, with a cluster shape cdim of more than one block (a thread block
 * cluster, sm_90: cudaLaunchAttributeClusterDimension), the blocks of one cluster together, their threads switched
 * round-robin as one block's are, so that barrier.cluster (cluster_sync) and reads of another block's shared memory
 * (cluster_map, mapa) behave as on the GPU; clusters one after another. */
void run(dim3 grid, dim3 block, size_t smem, std::function<void()> fn);
void run_cluster(dim3 grid, dim3 block, size_t smem, std::function<void()> fn, dim3 cdim);
unsigned cluster_rank();                         /* %cluster_ctarank: x fastest within the cluster */
unsigned cluster_size();                         /* %cluster_nctarank */
void cluster_sync();                             /* barrier.cluster.arrive.release + barrier.cluster.wait.acquire */
void *cluster_map(const void *p, unsigned rank); /* mapa: p's dynamic shared-memory offset in block `rank` */
int lane();
void check_aligned(const void *p, unsigned bytes, const char *what, const char *file, int line);
}  // namespace emu

#define threadIdx emu::threadIdx_
#define blockIdx emu::blockIdx_
#define blockDim emu::blockDim_
#define gridDim emu::gridDim_

static inline void __syncthreads() { emu::syncthreads(); }

template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int o) {
  (void)mask;
  T r;
  emu::warp_exchange(&v, &r, (int)sizeof(T), emu::lane() ^ o);
  return r;
}

template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src) {
  (void)mask;
  T r;
  emu::warp_exchange(&v, &r, (int)sizeof(T), src);
  return r;
}

/* A warp barrier: every lane reaches it before any goes on (memory is shared, so that orders it too). */
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  char d = 0, all[32];
  emu::warp_gather(&d, all, 1);
}

static inline unsigned __ballot_sync(unsigned mask, int pred) {
  (void)mask;
  int p = pred != 0, all[32];
  emu::warp_gather(&p, all, (int)sizeof p);
  unsigned r = 0;
  for (int l = 0; l < 32; l++) r |= all[l] ? 1u << l : 0u;
  return r;
}
static inline int __popc(unsigned v) { return __builtin_popcount(v); }

static inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }
static inline int atomicMin(int *p, int v) { int o = *p; if (v < o) *p = v; return o; }
/* threads switch only at barriers and shuffles, blocks run one after another: atomics are plain updates, fences
 * and cache hints nothing */
static inline int atomicAdd(int *p, int v) { int o = *p; *p = o + v; return o; }
static inline void __threadfence() {}
template <typename T> static inline T __ldcg(const T *p) { return *p; }
/* the lanes whose v equals this lane's */
static inline unsigned __match_any_sync(unsigned mask, int v) {
  (void)mask;
  int all[32];
  emu::warp_gather(&v, all, (int)sizeof v);
  unsigned r = 0;
  for (int l = 0; l < 32; l++) r |= all[l] == v ? 1u << l : 0u;
  return r;
}
/* redux.sync: the warp's maximum / minimum of v (all lanes take part) */
static inline unsigned __reduce_max_sync(unsigned mask, unsigned v) {
  (void)mask;
  unsigned all[32];
  emu::warp_gather(&v, all, (int)sizeof v);
  unsigned r = all[0];
  for (int l = 1; l < 32; l++) r = all[l] > r ? all[l] : r;
  return r;
}
static inline int __reduce_min_sync(unsigned mask, int v) {
  (void)mask;
  int all[32];
  emu::warp_gather(&v, all, (int)sizeof v);
  int r = all[0];
  for (int l = 1; l < 32; l++) r = all[l] < r ? all[l] : r;
  return r;
}
static inline float emu_rsqrtf(float x) { return 1.0f / sqrtf(x); }
#define rsqrtf emu_rsqrtf
using std::max;
using std::min;

#define DG_LAUNCH(kernel, grid, block, smem, stream) emu::launcher(dim3(grid), dim3(block), (smem), kernel)
/* A cooperative launch (common.cuh) is a plain one here: blocks run one after another, so there is no co-residency
 * to ask for, and a kernel that waits grid-wide must take its own emulated path (route_gr_kernel's, moe.cu). */
#define DG_LAUNCH_COOP(kernel, grid, block, smem, stream) DG_LAUNCH(kernel, grid, block, smem, stream)
/* A launch in thread block clusters of shape cdim (att_wqc_kernel's, src/cuda/attention_wqc.cuh wqc_launch; its GPU
 * form there is cudaLaunchKernelEx with cudaLaunchAttributeClusterDimension). */
#define DG_LAUNCH_CLUSTER(kernel, grid, block, smem, stream, cdim) \
  emu::launcher_cl(dim3(grid), dim3(block), (smem), kernel, dim3(cdim))
#define DG_DYN_SMEM(type, name) type *name = (type *)emu::dyn_smem()
#define DG_DYN_SMEM16(name) DG_DYN_SMEM(unsigned char, name)
#define DG_PDL_ENTRY() ((void)0) /* blocks run one after another: nothing to wait for */
#define DG_PDL_LAUNCH() ((void)0)
#define DG_PDL_WAIT() ((void)0)
#define DG_ASSERT_ALIGNED(ptr, bytes) emu::check_aligned((const void *)(ptr), (bytes), #ptr, __FILE__, __LINE__)

namespace emu {
template <typename F> struct launch {
  dim3 g, b;
  size_t sm;
  F *k;
  template <typename... A> void operator()(A... a) const {
    F *kk = k;
    run(g, b, sm, [=]() { kk(a...); });
  }
};
template <typename F> launch<F> launcher(dim3 g, dim3 b, size_t sm, F *k) { return launch<F>{g, b, sm, k}; }
template <typename F> struct launch_cl {
  dim3 g, b;
  size_t sm;
  F *k;
  dim3 c;
  template <typename... A> void operator()(A... a) const {
    F *kk = k;
    run_cluster(g, b, sm, [=]() { kk(a...); }, c);
  }
};
template <typename F> launch_cl<F> launcher_cl(dim3 g, dim3 b, size_t sm, F *k, dim3 c) {
  return launch_cl<F>{g, b, sm, k, c};
}
}  // namespace emu

#endif
