/* wgmma.cuh: Hopper's warpgroup tensor-core product (wgmma.mma_async, sm_90a) for the kernel lab's warpgroup
 * kernels (dev/cuda/qmoe_w.cuh, qmoe_wl.cuh; none of the backend's kernels uses it yet), with the CPU emulation's equivalents
 * (dev/cuda_emu: DG_CUDA_EMU) so that such kernels can be written and checked without a GPU.
 *
 * Source: PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate Instructions" (wgmma.mma_async,
 * .m64nNk16 .f32.bf16.bf16; its register fragments and the shared-memory matrix descriptor).
 *
 *   a warpgroup      4 consecutive warps (threads 128 i .. 128 i + 127); every wgmma, fence, commit and wait is
 *                    issued by all 128 with the same descriptors and shape (.sync.aligned)
 *   D (64 x N fp32)  warp w of the warpgroup holds rows 16 w .. 16 w + 15; lane l, g = l / 4, t = l % 4:
 *                    d[j][i] = D[16 w + g + 8 (i / 2)][8 j + 2 t + i % 2] (mma.sync's C layout per 8 columns)
 *   A (64 x 16 bf16) from registers: warp w's rows 16 w.. in mma.sync m16n8k16's A layout (a[0] = (A[g][2t],
 *                    A[g][2t+1]), a[1] the same of row g + 8, a[2], a[3] those at k + 8; lower k in the low half);
 *                    or from shared memory through a descriptor (dg_wgmma_bf16_ss)
 *   B (16 x N bf16)  from shared memory through a descriptor, K-major (column n's 16 k contiguous per core
 *                    matrix row; no transpose), or MN-major with the 128-byte swizzle (dg_wgmma_bf16_tb16:
 *                    imm-trans-b 1, dg_wg_desc_sw128_mn)
 *   descriptor       64 bits: start address >> 4 (bits 0-13), leading dimension byte offset (LBO) >> 4 (16-29),
 *                    stride dimension byte offset (SBO) >> 4 (32-45), base offset (49-51), swizzle (62-63: 0 none,
 *                    1 128-byte, 2 64-byte, 3 32-byte). K-major core matrices are 8 rows (m or n) of 16 bytes (8 k):
 *                    no swizzle: row r of core matrix (mn / 8, k / 8) at start + (mn / 8) SBO + (k / 8) LBO + 16 r;
 *                    128-byte swizzle: rows of 128 bytes (64 k), 8 rows a 1024-byte pattern, (mn / 8) SBO apart,
 *                    the 16-byte chunk index (address bits 4-6) XORed with the row in the pattern (bits 7-9); the
 *                    k16 steps advance the start address by 32 bytes inside the row (LBO unused)
 *   scale-d          scd 0: D = A B; else D = A B + D
 *
 * Asynchrony: a wgmma runs after its issue until a wgmma.wait_group retires its commit group; its accumulator
 * registers, its A registers and the shared memory it reads must not be touched meanwhile, and shared memory
 * written by ordinary stores or cp.async must be made visible to it by fence.proxy.async first.
 *
 * The emulation (DG_CUDA_EMU; dev/cuda_emu/README.md): the issue is a rendezvous of the 128 threads (their A
 * registers are read then, and the operands must agree); each thread's part is computed when the wait_group that
 * retires its group runs, reading shared memory then: the sum in k order from D (or 0), products exact in fp32,
 * each addition rounded to nearest (the hardware's order and rounding of the sums are unspecified: compare wgmma
 * kernels with a tolerance). Fences are nothing; swizzles other than none and 128-byte, a nonzero base offset or
 * a 128-byte pattern off a 1024-byte boundary abort. */
#ifndef DG_CUDA_WGMMA_CUH
#define DG_CUDA_WGMMA_CUH

#include <stdint.h>
#include "cuda/mma.cuh"

/* The matrix descriptor of a no-swizzle K-major tile at shared address saddr: LBO the distance of the core
 * matrices along K, SBO along M or N (bytes, multiples of 16). */
__device__ __forceinline__ uint64_t dg_wg_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}
/* The same of a 128-byte-swizzled K-major tile (rows of 128 bytes, the 8-row patterns SBO apart, 1024-byte
 * aligned): LBO unused (1, as is customary), swizzle mode 1. */
__device__ __forceinline__ uint64_t dg_wg_desc_sw128(uint32_t saddr, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(sbo >> 4) << 32) | ((uint64_t)1 << 62);
}
/* The same of a 128-byte-swizzled MN-major B (transposed): the PTX ISA's canonical layout "Swizzle<3,4,3> o
 * ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO))" (its "Canonical Layouts" table; T = 8 16-bit elements): rows of 128 bytes =
 * 64 consecutive n of one k, 8 rows (k) a 1024-byte pattern, the 8-row groups along k SBO apart, the 64-column
 * blocks along n LBO apart. */
__device__ __forceinline__ uint64_t dg_wg_desc_sw128_mn(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((saddr & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32) |
         ((uint64_t)1 << 62);
}

#ifndef DG_CUDA_EMU
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900 || !defined(__CUDA_ARCH_FEAT_SM90_ALL))
#define DG_WG_TRAP 1 /* not an sm_90a pass: the kernels trap (the lab builds for sm_90a) */
#endif

__device__ __forceinline__ void dg_wg_fence() {
#ifndef DG_WG_TRAP
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void dg_wg_commit() {
#ifndef DG_WG_TRAP
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void dg_wg_wait0() {
#ifndef DG_WG_TRAP
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void dg_wg_wait1() {
#ifndef DG_WG_TRAP
  asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
#endif
}
/* Shared memory written by the generic proxy (cp.async, stores) made visible to the tensor cores' reads. */
__device__ __forceinline__ void dg_fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
/* Pin registers in place for the compiler around asynchronous tensor-core operations. */
template <int NT> __device__ __forceinline__ void dg_wg_pin(float (&d)[NT][4]) {
#pragma unroll
  for (int j = 0; j < NT; j++)
#pragma unroll
    for (int i = 0; i < 4; i++) asm volatile("" : "+f"(d[j][i])::"memory");
}

#define DG_WG_D4(j) "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3])
/* d (64 x 8 NT, this warp's 16 rows: the mma.sync C layout per 8 columns) = A B + (scd ? d : 0); A 64 x 16 bf16
 * from the lanes' registers (the mma.sync A layout per warp), B 16 x 8 NT bf16 K-major at desc. */
template <int NT> __device__ __forceinline__ void dg_wgmma_bf16(float (&d)[NT][4], const uint32_t a[4], uint64_t desc, int scd);
template <> __device__ __forceinline__ void dg_wgmma_bf16<1>(float (&d)[1][4], const uint32_t a[4], uint64_t desc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
               : DG_WG_D4(0)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scd));
#endif
}
template <> __device__ __forceinline__ void dg_wgmma_bf16<2>(float (&d)[2][4], const uint32_t a[4], uint64_t desc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, {%8,%9,%10,%11}, %12, "
               "p, 1, 1, 0;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scd));
#endif
}
template <> __device__ __forceinline__ void dg_wgmma_bf16<3>(float (&d)[3][4], const uint32_t a[4], uint64_t desc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %17, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n24k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11}, "
               "{%12,%13,%14,%15}, %16, p, 1, 1, 0;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1), DG_WG_D4(2)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scd));
#endif
}
template <> __device__ __forceinline__ void dg_wgmma_bf16<4>(float (&d)[4][4], const uint32_t a[4], uint64_t desc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %21, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,"
               "%14,%15}, {%16,%17,%18,%19}, %20, p, 1, 1, 0;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1), DG_WG_D4(2), DG_WG_D4(3)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scd));
#endif
}
template <> __device__ __forceinline__ void dg_wgmma_bf16<8>(float (&d)[8][4], const uint32_t a[4], uint64_t desc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
               "{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1), DG_WG_D4(2), DG_WG_D4(3), DG_WG_D4(4), DG_WG_D4(5), DG_WG_D4(6), DG_WG_D4(7)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scd));
#endif
}
template <> __device__ __forceinline__ void dg_wgmma_bf16<16>(float (&d)[16][4], const uint32_t a[4], uint64_t desc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
               "{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1), DG_WG_D4(2), DG_WG_D4(3), DG_WG_D4(4), DG_WG_D4(5), DG_WG_D4(6), DG_WG_D4(7), DG_WG_D4(8), DG_WG_D4(9), DG_WG_D4(10), DG_WG_D4(11), DG_WG_D4(12), DG_WG_D4(13), DG_WG_D4(14), DG_WG_D4(15)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scd));
#endif
}

/* d (64 x 128 fp32, this warp's 16 rows) = A B + (scd ? d : 0), A 64 x 16 bf16 from the lanes' registers (the
 * mma.sync A layout per warp), B 16 x 128 bf16 MN-major (transposed: imm-trans-b 1) at desc, a 128-byte-swizzled
 * descriptor of dg_wg_desc_sw128_mn (the attention lab's version 15: P V with P from registers, V [keys, dims]). */
__device__ __forceinline__ void dg_wgmma_bf16_tb16(float (&d)[16][4], const uint32_t a[4], uint64_t desc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
               "{%64,%65,%66,%67}, %68, p, 1, 1, 1;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1), DG_WG_D4(2), DG_WG_D4(3), DG_WG_D4(4), DG_WG_D4(5), DG_WG_D4(6), DG_WG_D4(7), DG_WG_D4(8), DG_WG_D4(9), DG_WG_D4(10), DG_WG_D4(11), DG_WG_D4(12), DG_WG_D4(13), DG_WG_D4(14), DG_WG_D4(15)
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scd));
#endif
}

/* d (64 x 8 NT, NT = 4, 8, 16 or 32) = A B + (scd ? d : 0), A 64 x 16 bf16 K-major at adesc, B 16 x 8 NT bf16
 * K-major at bdesc (no transposes, no negation); N = 32 for the attention lab's version 12 at D 512, 64-256 for the
 * large-M expert lab versions 120-122. */
template <int NT> __device__ __forceinline__ void dg_wgmma_bf16_ss(float (&d)[NT][4], uint64_t adesc, uint64_t bdesc, int scd);
template <> __device__ __forceinline__ void dg_wgmma_bf16_ss<4>(float (&d)[4][4], uint64_t adesc, uint64_t bdesc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,"
               "%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1), DG_WG_D4(2), DG_WG_D4(3)
               : "l"(adesc), "l"(bdesc), "r"(scd));
#endif
}
template <> __device__ __forceinline__ void dg_wgmma_bf16_ss<8>(float (&d)[8][4], uint64_t adesc, uint64_t bdesc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
               "%32, %33, p, 1, 1, 0, 0;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1), DG_WG_D4(2), DG_WG_D4(3), DG_WG_D4(4), DG_WG_D4(5), DG_WG_D4(6), DG_WG_D4(7)
               : "l"(adesc), "l"(bdesc), "r"(scd));
#endif
}
template <> __device__ __forceinline__ void dg_wgmma_bf16_ss<16>(float (&d)[16][4], uint64_t adesc, uint64_t bdesc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
               "%64, %65, p, 1, 1, 0, 0;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1), DG_WG_D4(2), DG_WG_D4(3), DG_WG_D4(4), DG_WG_D4(5), DG_WG_D4(6), DG_WG_D4(7), DG_WG_D4(8), DG_WG_D4(9), DG_WG_D4(10), DG_WG_D4(11), DG_WG_D4(12), DG_WG_D4(13), DG_WG_D4(14), DG_WG_D4(15)
               : "l"(adesc), "l"(bdesc), "r"(scd));
#endif
}
template <> __device__ __forceinline__ void dg_wgmma_bf16_ss<32>(float (&d)[32][4], uint64_t adesc, uint64_t bdesc, int scd) {
#ifdef DG_WG_TRAP
  __trap();
#else
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
               "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
               "%128, %129, p, 1, 1, 0, 0;\n}\n"
               : DG_WG_D4(0), DG_WG_D4(1), DG_WG_D4(2), DG_WG_D4(3), DG_WG_D4(4), DG_WG_D4(5), DG_WG_D4(6), DG_WG_D4(7), DG_WG_D4(8), DG_WG_D4(9), DG_WG_D4(10), DG_WG_D4(11), DG_WG_D4(12), DG_WG_D4(13), DG_WG_D4(14), DG_WG_D4(15), DG_WG_D4(16), DG_WG_D4(17), DG_WG_D4(18), DG_WG_D4(19), DG_WG_D4(20), DG_WG_D4(21), DG_WG_D4(22), DG_WG_D4(23), DG_WG_D4(24), DG_WG_D4(25), DG_WG_D4(26), DG_WG_D4(27), DG_WG_D4(28), DG_WG_D4(29), DG_WG_D4(30), DG_WG_D4(31)
               : "l"(adesc), "l"(bdesc), "r"(scd));
#endif
}
#undef DG_WG_D4

/* 1 where this pass has wgmma (sm_90a), 0 where its wrappers trap (a kernel can test it and report instead). */
__device__ __forceinline__ int dg_wg_available() {
#ifdef DG_WG_TRAP
  return 0;
#else
  return 1;
#endif
}

#else /* the CPU emulation (dev/cuda_emu/emu.cpp: wgmma_bf16, wgmma_commit, wgmma_wait) */

static inline uint32_t dg_smem_addr(const void *p) { return emu::smem_addr(p); }
static inline void dg_wg_fence() {}
static inline void dg_wg_commit() { emu::wgmma_commit(); }
static inline void dg_wg_wait0() { emu::wgmma_wait(0); }
static inline void dg_wg_wait1() { emu::wgmma_wait(1); }
static inline void dg_fence_proxy_async() {}
template <int NT> static inline void dg_wg_pin(float (&)[NT][4]) {}
/* the shapes the asm above has, no others (a kernel that runs here must build for the GPU too) */
template <int NT> static inline void dg_wgmma_bf16(float (&d)[NT][4], const uint32_t a[4], uint64_t desc, int scd) {
  static_assert(NT == 1 || NT == 2 || NT == 3 || NT == 4 || NT == 8 || NT == 16, "dg_wgmma_bf16: N = 8, 16, 24, 32, 64, 128");
  emu::wgmma_bf16(&d[0][0], NT, a, 0, desc, scd);
}
static inline void dg_wgmma_bf16_tb16(float (&d)[16][4], const uint32_t a[4], uint64_t desc, int scd) {
  emu::wgmma_bf16(&d[0][0], 16, a, 0, desc, scd, 1);
}
template <int NT> static inline void dg_wgmma_bf16_ss(float (&d)[NT][4], uint64_t adesc, uint64_t bdesc, int scd) {
  static_assert(NT == 4 || NT == 8 || NT == 16 || NT == 32, "dg_wgmma_bf16_ss: N = 32, 64, 128, 256");
  emu::wgmma_bf16(&d[0][0], NT, NULL, adesc, bdesc, scd);
}
static inline int dg_wg_available() { return 1; }
#endif

#endif
