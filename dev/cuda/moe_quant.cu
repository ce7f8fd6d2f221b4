/* moe_quant.cu: the kernel lab of the quantized MoE products (issue 11), in
 * the manner of llm.c's dev/cuda: every version of the gathered expert
 * products side by side on the real 26B-A4B shapes, each checked against a
 * CPU reference on seeded random input (tolerance derived below and printed)
 * and timed with cudaEvents (L2 flushed between repetitions) against the
 * roofline of this GPU, measured in the same invocation.
 *
 *   version 1  qtile_kernel (src/cuda/quant.cu, k_qexperts_*): the first
 *              backend's kernels: fp32 FMA on CUDA cores over 32-row tiles of
 *              the expert work list, weights re-read per tile, no pipeline
 *   version 2  qe_kernel (src/cuda/qmoe.cuh): tensor cores (mma.sync
 *              m16n8k16 bf16, exact code products, per-group fold), codes and
 *              (scale, bias) pairs in the tile layout (each stage one
 *              contiguous run) through a cp.async ring in shared memory, every
 *              expert's weights read once per pass: QE_WARPS warps, QE_KC
 *              codes per stage, QE_STAGES stages (the backend's kernel for f32
 *              scales and for columns that are not a multiple of 64)
 *   version 3  qr_kernel (src/cuda/qmoe_r.cuh) as the backend runs it: the same
 *              math, weights streamed from device memory straight into
 *              registers (lane records with the pairs inside, QR_D stages
 *              deep), activations in fragment order through a shared ring
 *   versions 4-9  qr_kernel with other blocks and depths (warps, register
 *              stages D, ring stages, min blocks per SM, weight stages per
 *              activation stage SUB): 4 = (4, 3, 3, 4, 2), 5 = (4, 3, 4, 4, 2),
 *              6 = (4, 2, 4, 4, 2), 7 = (4, 4, 3, 4, 2), 8 = (4, 2, 3, 4, 4),
 *              9 = (4, 3, 3, 4, 1); 10-12: the weights through a bulk-copy (TMA)
 *              ring of WD stages per warp in shared memory (cp.async.bulk +
 *              mbarrier) instead of register stages: WD 4, 6 (4 blocks per SM),
 *              8 (3 blocks per SM) (removed in session 6: slower; the numbers stand in docs/results); 4-bit only, 8 NT <= 32 tokens per pass (the
 *              backend's is (4, 2, 3, 4, 2)); 13-16: version 3 with an L2 prefetch of each warp's
 *              weight stage PF = 2, 4, 8, 16 stages ahead (cp.async.bulk.prefetch.L2, lane 0); 17: version 3
 *              on the first lane-record layout, each lane's record with the pairs of its 4 rows (the pairs
 *              stored 4 times: 48 bytes per lane and 4-bit stage instead of 36) (earlier runs, docs/results/h200-moe/
 *              lab_variants_run*.md, numbered qe_kernel's variants 3-7)
 *   versions 20-25  qw_kernel (dev/cuda/qmoe_w.cuh): version 3's data path with the products on wgmma
 *              (m64nNk16, A = the codes from registers, B = the activations from the shared ring in the
 *              canonical K-major layout), one warpgroup per block; (D, ring stages, min blocks per SM):
 *              20 = (2, 3, 4), 22 = (2, 3, 3), 23 = (3, 3, 3), 24 = (2, 4, 3), 25 = (2, 3, 2); 21 = 20 with
 *              the descriptor's LBO and SBO exchanged (a check of their reading: it must fail). Needs the
 *              sm_90a build (lab_build in scripts/gpu_env.sh); 26 = 22 without the L2 prefetch, 27 = 22 with
 *              per-lane line prefetches (prefetch.global.L2) 2 stages ahead instead of lane 0's bulk prefetch
 *   versions 18, 19, 28  qr_kernel with per-lane line prefetches instead of the bulk prefetch (18), with the
 *              body of 2 n-tiles for experts of at most 16 rows (19), both (28: the backend's since session 5,
 *              = version 3); 29, 30: 28 with the line prefetches at every n-tile count, 2 and 4 stages
 *              ahead; 31: 28 with 4 stages ahead; 32: 28 with the bias term (b - 128 s) S of the fold as
 *              tensor-core products over the split group sums (qr_kernel's BM mode, one mma per pair of groups
 *              and tile; the fold keeps one FFMA per element: acc += s P'), 33: 32 with line prefetches at every
 *              n-tile count; 34: 32 with registers for 3 blocks per SM; 35-38 (the larger canvases, T 512 and
 *              1024): a forced count of n-tiles with line prefetches and a smaller body for the experts that fit
 *              it, 35 = 4 (3), 36 = 5 (4), 37 = 6 (4), 38 = 8 (6); 39: 28 with the activation copies of
 *              tokens past the expert's rows skipped instead of zero-filled (no source size per copy)
 *   bf16 stacks (--bits 16): version 3 = the backend's qr_kernel with BITS 16 (lane records of the bf16
 *              weights themselves: no decoding, no pairs, no fold); 40 = the plain [rows, cols] stack through
 *              moe.cu's WMMA grouped_kernel (k_bexperts: the backend's bf16 path before, and still for columns
 *              that are not a multiple of 64); 41-44: BITS 16 with other choices: 41 = 3 register stages at 2
 *              blocks per SM, 42 = line prefetches at every n-tile count, 43 = 2 blocks per SM (the backend's
 *              since session 6), 44 = 8 warps; 45-47: 43 with activation stages of 4 weight stages (45), of 1
 *              (46), of 4 with 3 register stages and a ring of 4 (47); 48, 49: stages of 32 weights (16 record
 *              registers instead of 32): 48 = 3 blocks per SM, 49 = 4 register stages, activation stages of 4
 *   versions 80-87 (80: 2, 3, 4, 8 bits; the others 4-bit): qs_kernel (dev/cuda/qmoe_s.cuh): a block per expert,
 *              the pass's activations resident in shared memory, each warp streaming its 32-row tasks' weight
 *              stages with no barrier (W warps, D register stages, line prefetches PF ahead, passes of NTM n-tiles):
 *              80 (16, 2, 4, 4, spilling at the 4-tile body), 81 (16, 2, 4, 3), 82 (11, 3, 4, 4), 83 (12, 3, 6, 4),
 *              84 (12, 2, 8, 4), 85 (8, 4, 6, 4), 86 (81 without prefetches), 87 (11, 4, 8, 4); each output
 *              compared with version 50's bit for bit
 *   version 50 (every bit width and bf16): version 3 with the blocks taking the experts by descending row count
 *              (k_group's order, qr_block): largest processing time first
 *   versions 61-65 (4-bit): version 50 with the weights through a ring in shared memory (run_ring)
 *   versions 90-94 (4-bit): probes of the weight stream alone (run_probe; no check)
 *   version 95 (every bit width and bf16): version 50 with qr_kernel's other stage loop at every tile count (qr_launch_bits'
 *              FLIP 1: the loop before the SASS diet at the tile counts where the backend runs the diet
 *              since session 21, QR_DIET_TILES, the diet elsewhere), each output compared with version 50's bit for bit
 *   versions 96-104 (4-bit; dev/cuda/qr_diet_lab.cuh): version 50 with the diet's loop (DIET 1) and other launch choices
 *              at 3 n-tiles (the 256-token canvas) and 2, each output compared with version 50's bit for bit: 96, 97 line
 *              prefetches 3, 4 stages ahead; 98 4 register stages (D); 99 D 3 with activation stages of 3 (SUB); 100 D 4
 *              and prefetches 4 ahead at 3 n-tiles, D 4 at 2; 101 5 blocks per SM at 2 n-tiles (session 18: what each
 *              tests and why, docs/cuda.md "The next GPU calls"); 102-104 registers for 3 blocks per SM at 3
 *              n-tiles with D 4 (102), D 4 and prefetches 4 ahead (103), D 3 SUB 3 (104) (session 21)
 *   versions 105-106 (4-bit; dev/cuda/qr_diet_lab.cuh qr_dring_kernel): the diet's loop over a weight ring in shared
 *              memory (cp.async 3 (105: a ring of 4 stages) or 5 (106: 6) weight stages ahead per warp, read back
 *              by LDS) at 3 n-tiles, 4 blocks per SM; elsewhere as 96-104; each output compared with version 50's
 *              bit for bit (session 21)
 *   versions 107-108 (4-bit; dev/cuda/qr_diet_lab.cuh qr_pers_kernel): the diet with the backend's choices in a
 *              persistent grid at 2 and 3 n-tiles (the resident blocks take the (expert, slab) items in the backend's
 *              order, item b + k blocks for block b), the next item's first 2 (107) or 6 (108) weight stages asked of
 *              L2 before each item; elsewhere as 96-104; each output compared with version 50's bit for bit (session 22)
 *   version 109 (4-bit; dev/cuda/qr_diet_lab.cuh qr_early_kernel): the diet with the backend's choices at 2 and 3
 *              n-tiles, each warp's first weight stage loaded (and the first L2 prefetches issued) as soon as the block
 *              knows its expert, before the expert's count, start and row table; elsewhere as 96-104; each output
 *              compared with version 50's bit for bit (session 23)
 *   version 110 (4-bit; dev/cuda/qr_diet_lab.cuh qr_tl_kernel): version 50's kernel (the backend's choices at 2 and 3
 *              n-tiles) with a per-block timeline (thread 0's %globaltimer / %clock64 stamps at entry, row table ready,
 *              first activation and weight stages landed, stage loop end, epilogue end, and %smid), printed after the
 *              row (print_timeline: each phase's median and p10/p90 over blocks, the blocks' start times against the
 *              first, the rounds and the tail, the per-SM busy fraction); elsewhere version 50 itself; each output
 *              compared with version 50's bit for bit (session 24)
 *   version 111 (4-bit; dev/cuda/qr_diet_lab.cuh qr_pair_kernel): the down product's blocks two consecutive n-slabs
 *              each (half the blocks), one weight / activation pipeline across both slabs, at 2 and 3 n-tiles;
 *              gate/up and elsewhere version 50; each output compared with version 50's bit for bit (session 24)
 *   version 112 (4-bit; dev/cuda/qr_diet_lab.cuh qr_sk_kernel): the diet with the backend's choices at 2 and 3
 *              n-tiles, floor(items / slots) x slots items (slots: the resident blocks) whole, each of the rest split
 *              along K into QR_SK_P (3) pieces of consecutive weight stages, a block each after the whole ones, the
 *              last piece of an item adding the pieces' fp32 sums in piece order and running the epilogue; checked
 *              against the CPU and, within both bounds, against version 50 (check_vs50; a split item's sums are
 *              rounded in another order) (session 25)
 *   version 113 (4-bit; dev/cuda/qr_diet_lab.cuh qr_empty_kernel): an empty kernel over version 50's grid, block and
 *              dynamic shared memory (2 or 3 n-tiles), timed as every version: the launch, block scheduling and
 *              events' share of a row's time (a probe: no output, no check) (session 25)
 *   version 114 (4-bit; src/cuda/qmoe_fg.cuh qr_fg_kernel, the backend's with DGEMMA_EXPERTS_FG=1, off by default):
 *              gate/up and down in one launch at 2 and 3 n-tiles, the
 *              blocks taking work tickets in order from a global counter (the gate/up items, then the down items, each
 *              in version 50's order), a down block waiting (acquire spin) only until its expert's gate/up blocks are
 *              counted; version 50's bodies (qr_body, the HP epilogue: h in the down product's fragment order and its
 *              sums). Not a row of its own per product: with 114 in --versions, each case also gets "gate_up+down" rows
 *              for version 50 (the backend with DGEMMA_DN_FUSE=1: two launches back to back) and 114, each checked
 *              against the CPU (check_fused: h, and y over the kernel's own h) and 114's h and y against 50's word for
 *              word, its counters after the launches (no wait ran out, all back at 0) (session 26)
 *   versions 116-119 (4-bit; dev/cuda/qr_diet_lab.cuh qr_fgx_kernel, session 27): version 114's kernel (a lab copy)
 *              with version 110's per-block stamps (116: 114's ticket order; its timeline under the gate_up+down
 *              row, print_fg_timeline: the ticket, each product's phases, the down blocks' waits, per expert its first
 *              down ticket against its last gate/up count, gate/up's last round's slots, the slots over time) or
 *              another ticket order (117: the last partial round of gate/up items interleaved 1 : 2 with down
 *              items of experts already placed; 118: the last two rounds 1 : 1) or, 119 (qr_fgp_kernel),
 *              persistent blocks over the resident slots, each taking its next ticket while it runs its item; rows
 *              as 114's (gate_up+down, checked against the CPU, word for word against 50, the counters)
 *   versions 125-127 (4-bit; dev/cuda/qr_diet_lab.cuh qr_fgn_kernel, session 28): 119 with the next item's row-table
 *              chain (order, count, start, gate/up's pairs) prefetched into L1 by thread 0 through qr_body's hooks
 *              during the current item; 126 also the next item's first 2 weight stages into L2; 127 125 with a down
 *              item's wait skipped when the previous item's loop hook read its expert's count complete; rows as 119's
 *   versions 128-129 (4-bit; qr_diet_lab.cuh qr_fgr_kernel, session 28, helper rg11): 119 with the activation ring
 *              carried across items (the next item's row table and first STAGES - 1 activation stages issued during
 *              the current item's last stages, the HP tile in the slot they do not take); 129 also the next item's
 *              first weight stage loaded into registers before the current item's epilogue; rows as 119's
 *   versions 120-122 (4-bit g64; src/cuda/qmoe_wl.cuh wl_kernel, session 23, issues 12 and 14): the products for many
 *              rows per expert (compute-bound from ~71 rows per expert on an H100) on wgmma m64nBNk16 with both
 *              operands in 128-byte-swizzled shared memory: the gathered rows of xp (A) and the weights of a chunk
 *              layout (wl_pack) dequantized to bf16 once per tile (B), cp.async rings, fp32 accumulators over the
 *              whole K (the DQ bound, g_dq); blocks in version 50's order, every row count: 120 = passes of 128 rows,
 *              BN 128, 6 slots; 121 = passes of 64 rows, BN 128, 4 slots, 2 blocks per SM; 122 = 128 rows, BN 256, 5
 *              slots; each output checked against the CPU and 256 sampled outputs against version 50's within the
 *              sum of both bounds (check_vs50: not word for word, the sums' orders differ)
 *   versions 123, 124 (session 24): 122 with a block over 3 slabs of its expert (123) or all of them (124), one
 *              stream of copies and dequantizations across the slabs (the ring filled and drained once a pass)
 *   versions 130-133 (4-bit g64; dev/cuda/qr_lm_lab.cuh qr_lm_kernel, qr_lm8_kernel, session 28, issues 12 and 14):
 *              version 50's products with each pass's body fitted to its own rows (passes of 64 tokens, the last at the
 *              smallest of 1-6 or 8 n-tiles that holds it) in version 50's grid (131), or one block per (expert, pass,
 *              slab) in version 50's order (130: an expert's passes read its weights at the same time); 132: 130's
 *              items with 8 warps per block, two warps per 32 weight rows, each on a half of the pass's 64 tokens (4
 *              n-tiles: registers for 16 warps per SM instead of 8); 133: 132 with registers for 8 warps per SM (its
 *              occupancy alone); bit for bit = v50
 *   versions 134-137 (4-bit g64; dev/cuda/qr_lm_lab.cuh qr_occ_launch, session 29, helper wp11): version 50 with more
 *              warps per SM at 4-8 n-tiles: registers for 3 blocks per SM (134, ring 3; 136, ring 2 at 8 n-tiles), 4
 *              (135, ring 2 at 8 n-tiles: 16 warps), or version 50's (137, ring 2 at 8 n-tiles: the ring's cost
 *              alone); 138, 139: version 50's grid, order and 64-token passes at 8 n-tiles (6 for experts of <= 48
 *              rows) with each group's products and fold done n-tile by n-tile (qr_lean_stage: 8 live partial sums
 *              instead of 64), registers for 3 blocks per SM (138: 12 warps) or 1 (139); bit for bit = v50
 *   versions 51-60 (4-bit): version 50 with other choices at 1 and 2 n-tiles (run_small: blocks per SM the
 *              registers are capped for, register stages, line prefetches, weight stages per activation stage),
 *              the backend's from 3 n-tiles on but for 59, 60 (3 blocks per SM at 3 n-tiles; 60 also D 3)
 *
 * Shapes (DiffusionGemma 26B-A4B, spec 3.1): 128 experts, hidden 2816,
 * expert intermediate 704, top-8. Rows of the sweep:
 *   uniform M   every expert gets exactly M rows (T = 16 M tokens), M = 1..256
 *   gathered T  T tokens routed top-8 of 128 uniformly at random (seed 1)
 *   skewed T    (--ss only) T tokens, each routed to expert 0 and 7 others at random: expert 0 T rows (route_skew)
 * for gate/up ([1408, 2816] per expert, GeGLU fused) and down ([2816, 704]),
 * MLX affine bits 2/3/4/6/8, group 64, bf16 scales and biases; bits 16: bf16 weights
 * (roofline bytes 2 per weight; check bound K 2^-22 sum |x w|: exact products, fp32 accumulation).
 *
 * Ceilings (same invocation): read bandwidth of a streaming-read kernel over
 * 4 GiB (16-byte loads, a reduction), and the bf16 rate of cublasGemmEx
 * 8192^3 (bf16 in, fp32 accumulate) on random data. Roofline of a row =
 * max(weight bytes / read BW, FLOPs / bf16 rate); weight bytes = packed codes
 * + scales + biases of the experts that have rows (MLX layout); FLOPs =
 * 2 x rows x N x K.
 *
 * Build and run (on the GPU machine, after `make CUDA=1`):
 *   nvcc -O2 -std=c++17 -gencode=arch=compute_90,code=sm_90 -Iinclude -Isrc dev/cuda/moe_quant.cu \
 *        build/libdgemma.a -lcublas -lcudart -lcjson -lgomp -o build/moe_quant
 *   build/moe_quant [--quick] [--json FILE] [--bits 4,3,2] [--versions 1,2]
 */
#ifdef LAB_ONLY_FG /* -DLAB_ONLY_FG: LAB_ONLY_SK narrowed further to versions 1-3, 40, 50, 110 and the gate/up + down rows
                     * of 114, 116-119 and 125-129 (dev/gpu/s27_tl11.sh, s28_pf11.sh: 95 and 112-113 not compiled) */
#ifndef LAB_ONLY_SK
#define LAB_ONLY_SK
#endif
#endif
#ifdef LAB_ONLY_SK /* -DLAB_ONLY_SK: LAB_LEAN narrowed to versions 1-3, 40, 50, 95-113 and 114's gate/up + down rows
                     * (4-bit rows only for 95-114): the lab of dev/gpu/s25_sk11.sh and s26_fg11.sh, built on the GPU
                     * machine in a minute or two */
#ifndef LAB_LEAN
#define LAB_LEAN
#endif
#endif
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <vector>

#include "cuda/qmoe_r.cuh"
#include "qmoe_w.cuh" /* the wgmma candidate (lab only) */
#include "qmoe_s.cuh" /* resident activations, a block per expert (lab only: measured slower) */
#include "qr_diet_lab.cuh" /* versions 95-113: the SASS diet, its launch choices, weight rings, persistent grid, early
                               * weights, timeline, slab pairs, tail split, empty probe (lab only) */
#include "qr_lm_lab.cuh" /* versions 130-137: passes fitted to their rows, split blocks, token halves (session 28, helper lm14);
                           * more warps per SM (134-139, session 29, helper wp11) */
#include "cuda/qmoe_wl.cuh" /* versions 120-124: the large-M wgmma kernel (the backend gate/up of DGEMMA_WL=1 is 122) */
extern "C" {
#include "io/quant.h"
}

#define CKL(x)                                                                                                   \
  do {                                                                                                           \
    cudaError_t e_ = (x);                                                                                        \
    if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); exit(1); } \
  } while (0)

static const int E = 128, H = 2816, IE = 704, TOPK = 8, G = 64;

static uint64_t rs = 0x9e3779b97f4a7c15ull;
static uint64_t rnd() { rs ^= rs >> 12; rs ^= rs << 25; rs ^= rs >> 27; return rs * 0x2545f4914f6cdd1dull; }
static float frand() { return (float)((rnd() >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f; } /* [-1, 1) */

/* ---- ceilings ---- */
__global__ void read_kernel(const uint4 *p, size_t n, unsigned *sink) {
  DG_PDL_ENTRY();
  unsigned acc = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x12345678u) *sink = acc; /* never true on random data; keeps the loads */
}

static float time_ms(cudaEvent_t a, cudaEvent_t b) { float ms; CKL(cudaEventElapsedTime(&ms, a, b)); return ms; }

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v.empty() ? 0 : v[v.size() / 2]; }

/* ---- weights ---- */
struct tiled { int warps, kc, gateup, lanes; uint32_t *q; void *p; size_t bytes; };
struct stack {
  dg_weight w;           /* host view: codes, scales, biases (MLX layout) */
  std::vector<uint8_t> pk;
  std::vector<uint16_t> sc, bi;
  dg_cuda_w d;           /* device: q, s, b in the MLX layout (version 1) */
  std::vector<tiled> tl; /* tile-layout and lane-record copies (versions 2-9), made on first use */
};

static void make_stack(stack *st, int64_t rows, int64_t cols, int bits) {
  if (bits == 16) { /* bf16 weights, |w| < 0.05 as the quantized stacks' */
    st->pk.resize((size_t)(rows * cols * 2));
    uint16_t *w16 = (uint16_t *)st->pk.data();
    for (size_t i = 0; i < (size_t)(rows * cols); i++) w16[i] = dg_f32_to_bf16(0.05f * frand());
    dg_weight w = {};
    w.dtype = DG_BF16; w.data = st->pk.data(); w.rows = rows; w.cols = cols; w.bits = 16;
    st->w = w;
    st->tl.clear();
    memset(&st->d, 0, sizeof st->d);
    st->d.rows = rows; st->d.cols = cols; /* bits 0: bf16 */
    CKL(cudaMalloc((void **)&st->d.w, st->pk.size())); /* the plain [rows, cols] of version 40 */
    CKL(cudaMemcpy(st->d.w, st->pk.data(), st->pk.size(), cudaMemcpyHostToDevice));
    return;
  }
  st->pk.resize((size_t)(rows * cols * bits / 8));
  for (size_t i = 0; i < st->pk.size(); i += 8) {
    uint64_t r = rnd();
    memcpy(&st->pk[i], &r, std::min((size_t)8, st->pk.size() - i));
  }
  const int64_t ng = cols / G;
  st->sc.resize((size_t)(rows * ng));
  st->bi.resize((size_t)(rows * ng));
  const int qmax = (1 << bits) - 1;
  for (size_t i = 0; i < st->sc.size(); i++) { /* an MLX-like group: |w| <= ~0.05, bias the most negative value */
    const float s = (0.5f + 0.5f * (frand() + 1.0f)) * 0.1f / qmax;
    st->sc[i] = dg_f32_to_bf16(s);
    st->bi[i] = dg_f32_to_bf16(-s * qmax * (0.4f + 0.2f * (frand() + 1.0f) / 2.0f));
  }
  dg_weight w = {};
  w.dtype = DG_U32; w.data = st->pk.data(); w.rows = rows; w.cols = cols; w.bits = bits; w.group_size = G;
  w.sb_dtype = DG_BF16; w.scales = st->sc.data(); w.biases = st->bi.data();
  st->w = w;
  st->tl.clear();
  memset(&st->d, 0, sizeof st->d);
  st->d.bits = bits; st->d.group = G; st->d.sb = DG_CUDA_BF16; st->d.rows = rows; st->d.cols = cols;
  CKL(cudaMalloc((void **)&st->d.q, st->pk.size()));
  CKL(cudaMemcpy(st->d.q, st->pk.data(), st->pk.size(), cudaMemcpyHostToDevice));
  CKL(cudaMalloc(&st->d.s, st->sc.size() * 2));
  CKL(cudaMalloc(&st->d.b, st->bi.size() * 2));
  CKL(cudaMemcpy(st->d.s, st->sc.data(), st->sc.size() * 2, cudaMemcpyHostToDevice));
  CKL(cudaMemcpy(st->d.b, st->bi.data(), st->bi.size() * 2, cudaMemcpyHostToDevice));
}

/* The lane records of qw_kernel (dev/cuda/qmoe_w.cuh): those of qr_tile_pack (compact layout) with lane t's code
 * j = 0..7 of a row's run of 32 the run's code 8 (j % 4) + 4 (j / 4) + t instead of 8 t + j. Built from qr_tile_pack's
 * records (written first) by rewriting each lane's code bytes (the pairs are the same bytes). */
static void qw_tile_pack(const qe_tiling &t, const uint8_t *codes, uint8_t *dst) {
  const int KC = t.kc, RUNS = KC / 32, CB = 4 * RUNS * t.bits, PSC = CB % 16 == 0 ? 16 : 8, nst = (int)(t.K / KC);
  const int64_t slabs = qe_slabs(t), rowbytes = t.K * t.bits / 8, WST = qr_wstage(t.bits, t.group, 1);
  const uint32_t mask = (1u << t.bits) - 1;
  auto getc = [&](const uint8_t *row, int64_t k) { /* code k of an MLX row: a little-endian bit stream */
    const int64_t bit = k * t.bits;
    uint32_t v = 0;
    memcpy(&v, row + bit / 8, (size_t)std::min<int64_t>(2, rowbytes - bit / 8));
    return (v >> (bit % 8)) & mask;
  };
  std::vector<uint8_t> rec((size_t)CB);
  for (int64_t e = 0; e < t.E; e++)
    for (int64_t sl = 0; sl < slabs; sl++)
      for (int s = 0; s < nst; s++)
        for (int w = 0; w < t.warps; w++)
          for (int lane = 0; lane < 32; lane++) {
            const int g = lane >> 2, t4 = lane & 3;
            std::fill(rec.begin(), rec.end(), 0);
            for (int r = 0; r < 4; r++) {
              const int64_t gr = qe_tile_row(t, e, sl, w * 32 + (r >> 1) * 16 + g + 8 * (r & 1));
              if (gr < 0) continue;
              for (int c = 0; c < RUNS; c++)
                for (int j = 0; j < 8; j++) {
                  const uint32_t q = getc(codes + gr * rowbytes, (int64_t)s * KC + 32 * c + 8 * (j & 3) + 4 * (j >> 2) + t4);
                  const int bit = ((r * RUNS + c) * 8 + j) * t.bits; /* a code spans at most 2 bytes */
                  const uint32_t v = q << (bit % 8);
                  rec[(size_t)(bit / 8)] |= (uint8_t)v;
                  if (v >> 8) rec[(size_t)(bit / 8 + 1)] |= (uint8_t)(v >> 8);
                }
            }
            uint8_t *ws = dst + (((e * slabs + sl) * nst + s) * t.warps + w) * WST;
            for (int p = 0; p < CB / PSC; p++) memcpy(ws + (p * 32 + lane) * PSC, rec.data() + p * PSC, (size_t)PSC);
          }
}

/* The stack in the tile layout (qe_tile_pack) or as lane records (lanes: qr_tile_pack; 3: qw_tile_pack's) of
 * blocks of `warps` warps and stages of kc codes. */
static const tiled &get_tiled(stack *st, int warps, int kc, int gateup, int lanes = 0) {
  for (const tiled &t : st->tl)
    if (t.warps == warps && t.kc == kc && t.gateup == gateup && t.lanes == lanes) return t;
  if (lanes == 4) { /* wl_kernel's layout of slabs of `warps` columns (qmoe_wl.cuh wl_pack; 4-bit g64) */
    const int N = gateup ? IE : H, K = (int)st->w.cols;
    const size_t qb = wl_bytes(gateup, E, N, K, warps);
    std::vector<uint8_t> hq(qb);
    wl_pack(gateup, E, N, K, warps, st->pk.data(), st->sc.data(), st->bi.data(), hq.data());
    tiled t = {warps, kc, gateup, lanes, NULL, NULL, qb};
    CKL(cudaMalloc((void **)&t.q, qb));
    CKL(cudaMemcpy(t.q, hq.data(), qb, cudaMemcpyHostToDevice));
    st->tl.push_back(t);
    return st->tl.back();
  }
  /* bf16 (bits 16): the stage is the "group" (qr_kc) */
  qe_tiling q = qe_tiling_of(warps, kc, gateup, st->w.bits, st->w.bits == 16 ? kc : G, 4, E, st->w.rows, st->w.cols);
  q.cp = lanes == 1; /* lanes 2: the replicated-pair lane records (qr_wstage cp 0) */
  size_t pb = 0;
  if (lanes == 3) q.cp = 1;
  const size_t qb = lanes ? qr_tile_bytes(q) : qe_tile_bytes(q, &pb);
  std::vector<uint8_t> hq(qb), hp(pb);
  if (lanes == 3) {
    qr_tile_pack(q, st->pk.data(), st->sc.data(), st->bi.data(), hq.data());
    qw_tile_pack(q, st->pk.data(), hq.data());
  } else if (lanes) qr_tile_pack(q, st->pk.data(), st->sc.data(), st->bi.data(), hq.data());
  else qe_tile_pack(q, st->pk.data(), st->sc.data(), st->bi.data(), hq.data(), hp.data());
  tiled t = {warps, kc, gateup, lanes, NULL, NULL, qb};
  CKL(cudaMalloc((void **)&t.q, qb));
  CKL(cudaMemcpy(t.q, hq.data(), qb, cudaMemcpyHostToDevice));
  if (pb) {
    CKL(cudaMalloc(&t.p, pb));
    CKL(cudaMemcpy(t.p, hp.data(), pb, cudaMemcpyHostToDevice));
  }
  st->tl.push_back(t);
  return st->tl.back();
}

static void free_stack(stack *st) {
  cudaFree(st->d.q); cudaFree(st->d.s); cudaFree(st->d.b); cudaFree(st->d.w);
  for (tiled &t : st->tl) { cudaFree(t.q); cudaFree(t.p); }
}

/* Bound on |GPU - exact| of one dot product sum_k x_k w_k, w_k = q_k s + b (the
 * CPU's dequantized w_k = fl(fl(q s) + b) as the reference): version 2's
 * decomposition as tests/test_cuda.c (qdot_bound) derives it, which also
 * covers version 1 (fp32 FMA over dequantized w: gamma_K sum |x w| <= the
 * same terms): D = 1.01 (u (Aq + Aw + Ab) + (g(2G) + g(2ng+1) + g(K)) (Ao + Ab)). */
static int g_dq = 0; /* the last run dequantized its weights to bf16 in registers (versions 70-79: qr_kernel's DQ) */
static double dot_ref(const dg_weight *W, int64_t row, const float *x, double *bound) {
  if (W->bits == 16) { /* bf16 weights: exact products in fp32, K fp32 additions at 2u each (truncating adds of
                          the tensor core allowed), as tests/test_cuda.c bdot_bound: g(2K) sum |x w| */
    const uint16_t *w = (const uint16_t *)W->data + row * W->cols;
    const double ut = ldexp(1.0, -24), n = 2.0 * (double)W->cols;
    double e = 0, aw = 0;
    for (int64_t k = 0; k < W->cols; k++) {
      const double p = (double)x[k] * dg_bf16_to_f32(w[k]);
      e += p;
      aw += fabs(p);
    }
    *bound = 1.01 * n * ut / (1.0 - n * ut) * aw;
    return e;
  }
  const double u = ldexp(1.0, -24), o = W->bits == 8 ? 0.0 : 128.0;
  const int64_t K = W->cols, ng = K / G;
  std::vector<float> w((size_t)K);
  dg_quant_dequant_row(W, row, w.data());
  const uint8_t *pk = (const uint8_t *)W->data + row * K * W->bits / 8;
  double aq = 0, ao = 0, ab = 0, aw = 0, e = 0;
  for (int64_t k = 0; k < K; k++) {
    const size_t gi = (size_t)(row * ng + k / G);
    const double s = dg_bf16_to_f32(((const uint16_t *)W->scales)[gi]), b = dg_bf16_to_f32(((const uint16_t *)W->biases)[gi]);
    const double q = dg_quant_code(pk, W->bits, k);
    aq += fabs(x[k] * q * s);
    ao += fabs(x[k] * (q + o) * s);
    ab += fabs(x[k] * (b - o * s));
    aw += fabs((double)x[k] * w[(size_t)k]);
    e += (double)x[k] * w[(size_t)k];
  }
  auto gm = [&](double n) { return n * u / (1.0 - n * u); };
  /* version 2+ as tests/test_cuda.c (qdot_bound) derives it; gamma_K (Aq + Ab + Ao) covers version 1's fp32 dot product */
  *bound = 1.01 * (u * (aq + aw + ab) + (gm(2.0 * G) + gm(2.0 * ng + 1) + gm((double)K)) * (ao + ab));
  /* DQ (qr_run_products_dq): each w' = fl_bf16(q s + b), |w' - q s - b| <= 2^-8 |q s + b|, then exact products and
   * fp32 sums as the bf16 path (g(2K) sum |x w'|); the reference's own w_k = fl(fl(q s) + b) is within
   * u (|q s| + |w|) of q s + b (the u (Aq + Aw) terms) */
  if (g_dq) *bound = 1.01 * (u * (aq + aw) + ldexp(1.0, -8) * (aw + u * (aq + aw)) + gm(2.0 * K) * (1.0 + ldexp(1.0, -8)) * (aw + u * (aq + aw)));
  return e;
}

static double gelu_d(double a) { return 0.5 * a * (1.0 + tanh(0.7978845608028654 * (a + 0.044715 * a * a * a))); }

/* ---- one routing case on the device ---- */
struct routing {
  int T;
  std::vector<int32_t> idx; /* [T, TOPK] */
  dg_cuda_moe_buf b;
  bf16 *xe;                 /* [T, H] */
  std::vector<uint16_t> hx; /* host copy of xe */
  std::vector<uint16_t> hh; /* host h inputs of the down product [T K, IE] (grouped order) */
  int hit;                  /* experts with rows */
  int32_t *ord;             /* the experts by descending count (k_group's order): version 50's block order */
};

static void route_alloc(routing *r) {
  const size_t TK = (size_t)r->T * TOPK;
  memset(&r->b, 0, sizeof r->b);
  CKL(cudaMalloc((void **)&r->b.topk_idx, TK * 4));
  CKL(cudaMemcpy(r->b.topk_idx, r->idx.data(), TK * 4, cudaMemcpyHostToDevice));
  CKL(cudaMalloc((void **)&r->b.count, E * 4));
  CKL(cudaMalloc((void **)&r->b.start, (E + 1) * 4));
  CKL(cudaMalloc((void **)&r->b.pairs, TK * 4));
  CKL(cudaMalloc((void **)&r->b.slot_row, TK * 4));
  CKL(cudaMalloc((void **)&r->b.tiles, (TK + E) * 2 * 4));
  CKL(cudaMalloc((void **)&r->b.n_tiles, 4));
  CKL(cudaMalloc((void **)&r->b.h, TK * IE * 2));
  CKL(cudaMalloc((void **)&r->b.y, TK * H * 4));
  CKL(cudaMalloc((void **)&r->b.xs, std::max(TK * IE, (size_t)r->T * H) / 32 * 4));
  CKL(cudaMalloc((void **)&r->b.xp, std::max(TK * IE, (size_t)r->T * H) * 2));
  CKL(cudaMalloc((void **)&r->b.hs, TK * IE / 32 * 4)); /* the gate/up + down rows' sums of h (version 114) */
  CKL(cudaMalloc((void **)&r->xe, (size_t)r->T * H * 2));
  r->hx.resize((size_t)r->T * H);
  for (auto &v : r->hx) v = dg_f32_to_bf16(frand());
  CKL(cudaMemcpy(r->xe, r->hx.data(), r->hx.size() * 2, cudaMemcpyHostToDevice));
  r->hh.resize(TK * IE);
  for (auto &v : r->hh) v = dg_f32_to_bf16(0.2f * frand());
  CKL(cudaMalloc((void **)&r->b.order, E * 4));
  CKL(k_group(0, &r->b, r->T, E, TOPK));
  CKL(cudaDeviceSynchronize());
  r->ord = r->b.order; /* versions other than 50 run without it (blocks in expert order) */
  r->b.order = NULL;
  std::vector<int32_t> cnt(E);
  CKL(cudaMemcpy(cnt.data(), r->b.count, E * 4, cudaMemcpyDeviceToHost));
  r->hit = 0;
  for (int e = 0; e < E; e++) r->hit += cnt[e] > 0;
}

static void route_free(routing *r) {
  cudaFree(r->b.topk_idx); cudaFree(r->b.count); cudaFree(r->b.start); cudaFree(r->b.pairs); cudaFree(r->b.slot_row); cudaFree(r->ord);
  cudaFree(r->b.tiles); cudaFree(r->b.n_tiles); cudaFree(r->b.h); cudaFree(r->b.y); cudaFree(r->b.xs); cudaFree(r->b.xp); cudaFree(r->b.hs); cudaFree(r->xe);
}

static void route_uniform(routing *r, int M) { /* pair p = t K + k -> expert p mod E: every expert exactly M rows */
  r->T = E * M / TOPK;
  r->idx.resize((size_t)r->T * TOPK);
  for (int p = 0; p < r->T * TOPK; p++) r->idx[(size_t)p] = p % E;
}

static void route_random(routing *r, int T) {
  r->T = T;
  r->idx.resize((size_t)T * TOPK);
  for (int t = 0; t < T; t++) {
    int perm[E];
    for (int e = 0; e < E; e++) perm[e] = e;
    for (int k = 0; k < TOPK; k++) { /* partial Fisher-Yates */
      const int j = k + (int)(rnd() % (uint64_t)(E - k));
      std::swap(perm[k], perm[j]);
      r->idx[(size_t)t * TOPK + k] = perm[k];
    }
  }
}

/* Skewed T (--ss, session 26): T tokens, each routed to expert 0 and 7 other experts at random: expert 0 has T rows
 * (several passes: its gate/up and down blocks are by far the longest), the others ~7 T / 127. Version 114's stress:
 * expert 0's items come first in the block order, so its down blocks are taken while its gate/up blocks still run
 * and must wait for them (a down block that did not wait, or read h or its sums before the gate/up writes were
 * visible, would change y's words against version 50's). */
static void route_skew(routing *r, int T) {
  r->T = T;
  r->idx.resize((size_t)T * TOPK);
  for (int t = 0; t < T; t++) {
    int perm[E];
    for (int e = 0; e < E; e++) perm[e] = e;
    r->idx[(size_t)t * TOPK] = 0;
    for (int k = 1; k < TOPK; k++) { /* partial Fisher-Yates over experts 1 .. E - 1 */
      const int j = k + (int)(rnd() % (uint64_t)(E - k));
      std::swap(perm[k], perm[j]);
      r->idx[(size_t)t * TOPK + k] = perm[k];
    }
  }
}
static const char *case_label(int kind) { return kind == 0 ? "uniform" : kind == 1 ? "gathered T" : "skewed T"; }
static const char *case_json(int kind) { return kind == 0 ? "uniform" : kind == 1 ? "random" : "skewed"; }

/* ---- versions ---- */
enum { GU = 0, DN = 1 };

/* Versions 4-12: qr_kernel over a lane-record copy, WARPS warps, D register stages, STAGES ring stages,
 * (Versions 10-12, a WD-deep bulk-copy ring of weight stages per warp in shared memory instead of D, were removed
 * with the ring in session 6: measured slower in session 3, lab_s3_bulk_ring.md.) */
/* The split group-sum records of BM versions ([rows, cols / G] x 16 bytes), allocated on first use. */
static uint4 *split_sums(size_t rows) {
  static uint4 *p = NULL;
  static size_t n = 0;
  if (rows * (H / G) > n) {
    if (p) CKL(cudaFree(p));
    n = rows * (H / G);
    CKL(cudaMalloc((void **)&p, n * sizeof(uint4)));
  }
  return p;
}

/* The arguments of a lane-record launch over tl (versions 4-39) and the group sums of its input (k_group_sums_perm;
 * bm: the split records of k_group_sums_perm_split): gate/up over xe, down over the lab's h. */
static cudaError_t lab_args(const tiled &tl, routing *r, int gateup, int bm, qe_args *a) {
  memset(a, 0, sizeof *a);
  a->q = tl.q; a->sb = DG_CUDA_BF16; a->group = tl.kc; a->pb = 4; /* kc = G for the quantized stacks, the stage for bf16 */
  a->xs = r->b.xs; a->count = r->b.count; a->start = r->b.start; a->pairs = r->b.pairs; a->topk = TOPK;
  a->X = r->b.xp;
  const bf16 *x = gateup ? r->xe : r->b.h;
  const int rows = gateup ? r->T : r->T * TOPK, K = gateup ? H : IE;
  if (gateup) { a->Kdim = H; a->N = IE; a->h = r->b.h; }
  else { a->Kdim = IE; a->N = H; a->y = r->b.y; }
  if (!bm) return k_group_sums_perm(0, x, rows, K, a->group, r->b.xs, r->b.xp);
  uint4 *x4 = split_sums((size_t)rows);
  a->xs = (const float *)x4;
  return k_group_sums_perm_split(0, x, rows, K, G, x4, r->b.xp);
}

template <int WARPS, int D, int STAGES, int MINB = 1, int SUB = 1, int PF = 0, int CP = 1, int NTS = 0,
          int PF3 = PF, int BM = 0, int NTF = 0, int NZ = 0, int BITS = 4, int GL = G>
static cudaError_t run_lanes(int prod, stack *st, routing *r, int nt) {
  const int gateup = prod == GU;
  const tiled &tl = get_tiled(st, WARPS, qr_kc(GL, BITS), gateup, CP ? 1 : 2);
  qe_args a;
  cudaError_t e = lab_args(tl, r, gateup, BM, &a);
  if (e != cudaSuccess) return e;
  if (gateup) {
    const dim3 grid(E, (IE + 16 * WARPS - 1) / (16 * WARPS));
    if constexpr (NTF > 0) return qr_launch_g<BITS, 1, NTF, GL, WARPS, D, STAGES, MINB, SUB, PF3, CP, NTS, BM, NZ>(0, grid, a);
    switch (nt) {
    case 1: return qr_launch_g<BITS, 1, 1, GL, WARPS, D, STAGES, MINB, SUB, PF, CP, 0, BM, NZ>(0, grid, a);
    case 2: return qr_launch_g<BITS, 1, 2, GL, WARPS, D, STAGES, MINB, SUB, PF, CP, 0, BM, NZ>(0, grid, a);
    case 3: return qr_launch_g<BITS, 1, 3, GL, WARPS, D, STAGES, MINB, SUB, PF3, CP, NTS, BM, NZ>(0, grid, a);
    default: return qr_launch_g<BITS, 1, 4, GL, WARPS, D, STAGES, MINB, SUB, PF, CP, 0, BM, NZ>(0, grid, a);
    }
  }
  const dim3 grid(E, (H + 32 * WARPS - 1) / (32 * WARPS));
  if constexpr (NTF > 0) return qr_launch_g<BITS, 0, NTF, GL, WARPS, D, STAGES, MINB, SUB, PF3, CP, NTS, BM, NZ>(0, grid, a);
  switch (nt) {
  case 1: return qr_launch_g<BITS, 0, 1, GL, WARPS, D, STAGES, MINB, SUB, PF, CP, 0, BM, NZ>(0, grid, a);
  case 2: return qr_launch_g<BITS, 0, 2, GL, WARPS, D, STAGES, MINB, SUB, PF, CP, 0, BM, NZ>(0, grid, a);
  case 3: return qr_launch_g<BITS, 0, 3, GL, WARPS, D, STAGES, MINB, SUB, PF3, CP, NTS, BM, NZ>(0, grid, a);
  default: return qr_launch_g<BITS, 0, 4, GL, WARPS, D, STAGES, MINB, SUB, PF, CP, 0, BM, NZ>(0, grid, a);
  }
}

/* The arguments and grid of the backend's lane-record launch in its block order (versions 50-65). */
static cudaError_t backend_args(int prod, stack *st, routing *r, qe_args *a, dim3 *grid) {
  const int gateup = prod == GU;
  const tiled &tl = get_tiled(st, QR_WARPS, qr_kc(G), gateup, 1);
  cudaError_t e = lab_args(tl, r, gateup, 0, a);
  if (e != cudaSuccess) return e;
  a->order = r->ord;
  *grid = gateup ? dim3(E, (IE + 16 * QR_WARPS - 1) / (16 * QR_WARPS)) : dim3(E, (H + 32 * QR_WARPS - 1) / (32 * QR_WARPS));
  return cudaSuccess;
}

/* Versions 95-111 (qr_diet_version, dev/cuda/qr_diet_lab.cuh): version 50 (the backend's block order) with
 * qr_kernel's other stage loop (95: qr_launch_bits' FLIP 1; the SASS diet's loop, session 17, has steady-state
 * iterations without tests, real-row copies, 32-bit shared loads; the backend runs it at the tile counts of
 * QR_DIET_TILES, the loop before it elsewhere) and the diet with other launch choices (96-104) or over a weight ring in
 * shared memory (105-106) or in a persistent grid (107-108) or with the first weight loads early (109), or version 50
 * with a timeline (110) or two slabs per down block (111), 4-bit rows only; their outputs are compared with
 * version 50's bit for bit; 112 (the last partial round split along K, 4-bit) is checked against the CPU and against
 * version 50 within both bounds (check_vs50), as 120-124. */
static cudaError_t run_diet(int ver, int prod, stack *st, routing *r) {
  qe_args a;
  dim3 grid;
  const int gateup = prod == GU;
  const cudaError_t e = backend_args(prod, st, r, &a, &grid);
  if (e != cudaSuccess) return e;
  const int nt = qe_nt(r->T, TOPK, E);
  g_dq = 0;
  qr_sk_rows = r->T * TOPK; /* version 112's workspace rows */
#ifdef LAB_ONLY_SK /* 4-bit only: the other widths' version 95 not built */
  if (st->w.bits != 4) return cudaErrorNotSupported;
  return gateup ? qr_diet_version<4, 1>(ver, 0, grid, nt, a) : qr_diet_version<4, 0>(ver, 0, grid, nt, a);
#endif
  switch (st->w.bits) {
  case 2: return gateup ? qr_diet_version<2, 1>(ver, 0, grid, nt, a) : qr_diet_version<2, 0>(ver, 0, grid, nt, a);
  case 3: return gateup ? qr_diet_version<3, 1>(ver, 0, grid, nt, a) : qr_diet_version<3, 0>(ver, 0, grid, nt, a);
  case 4: return gateup ? qr_diet_version<4, 1>(ver, 0, grid, nt, a) : qr_diet_version<4, 0>(ver, 0, grid, nt, a);
  case 6: return gateup ? qr_diet_version<6, 1>(ver, 0, grid, nt, a) : qr_diet_version<6, 0>(ver, 0, grid, nt, a);
  case 8: return gateup ? qr_diet_version<8, 1>(ver, 0, grid, nt, a) : qr_diet_version<8, 0>(ver, 0, grid, nt, a);
  default: return gateup ? qr_diet_version<16, 1>(ver, 0, grid, nt, a) : qr_diet_version<16, 0>(ver, 0, grid, nt, a);
  }
}

/* Versions 130-133 (4-bit g64; dev/cuda/qr_lm_lab.cuh, session 28): version 50 with each pass's body fitted to its rows
 * (131), and one block per (expert, pass, slab) (130; 132, 133 with two warps per weight warp, one per token half);
 * outputs compared with version 50's bit for bit */
static cudaError_t run_lm(int ver, int prod, stack *st, routing *r) {
  qe_args a;
  dim3 grid;
  if (st->w.bits != 4) return cudaErrorNotSupported;
  const cudaError_t e = backend_args(prod, st, r, &a, &grid);
  if (e != cudaSuccess) return e;
  qr_lm_pairs = r->T * TOPK;
  return prod == GU ? qr_lm_launch<4, 1>(ver, 0, grid, a) : qr_lm_launch<4, 0>(ver, 0, grid, a);
}

/* Versions 134-139 (4-bit g64; dev/cuda/qr_lm_lab.cuh qr_occ_launch, qr_lean_launch, session 29): version 50 with
 * registers (and at 8 n-tiles an activation ring of 2 stages) for 12 or 16 warps per SM at 4-8 n-tiles (134-137), or
 * its 8-tile body with the lean stage order (138: registers for 12 warps per SM, 139: for 8); outputs compared with
 * version 50's bit for bit */
static cudaError_t run_occ(int ver, int prod, stack *st, routing *r) {
  qe_args a;
  dim3 grid;
  if (st->w.bits != 4) return cudaErrorNotSupported;
  const cudaError_t e = backend_args(prod, st, r, &a, &grid);
  if (e != cudaSuccess) return e;
  if (a.group != 64) return cudaErrorNotSupported;
  const int nt = qe_nt(r->T, TOPK, E);
  g_dq = 0;
  if (ver >= 138) /* 138, 139: the lean stage in place of the 8-tile kernel (below 8 n-tiles version 50's kernels) */
    return prod == GU ? qr_lean_launch<4, 1>(ver, 0, grid, nt, a) : qr_lean_launch<4, 0>(ver, 0, grid, nt, a);
  return prod == GU ? qr_occ_launch<4, 1>(ver, 0, grid, nt, a) : qr_occ_launch<4, 0>(ver, 0, grid, nt, a);
}

/* The gate/up + down rows (versions 50 and 114, 4-bit): gate/up over xe and down over the h it makes, as the backend
 * runs them with DGEMMA_DN_FUSE=1 (gate/up's epilogue writes h in the down product's fragment order and its group
 * sums, qr_store_hp; down reads them). 50: the backend's own launchers (k_qe_gate_up with b.hp_group 64: the input
 * copy k_group_sums_perm of xe, then qr_kernel QR_GATEUP_HP; k_qe_down: qr_kernel over h and its sums), two launches
 * back to back (PDL as in the backend); 114: the same input copy, then gate/up and down in one launch (qr_fg_version,
 * dev/cuda/qr_diet_lab.cuh). Both in the backend's block order. */
static cudaError_t run_fused(int ver, stack *gu, stack *dn, routing *r) {
  const int nt = qe_nt(r->T, TOPK, E);
  g_dq = 0;
  if (ver == 50) {
    dg_cuda_w wg = gu->d, wd = dn->d;
    const tiled &tg = get_tiled(gu, QR_WARPS, qr_kc(G), 1, 1);
    const tiled &td = get_tiled(dn, QR_WARPS, qr_kc(G), 0, 1);
    wg.q = tg.q; wd.q = td.q;
    wg.sbp = wd.sbp = NULL;
    wg.s = wg.b = wd.s = wd.b = NULL;
    wg.w = wd.w = NULL;
    wg.lay = wd.lay = DG_CUDA_LAY_LANES;
    dg_cuda_moe_buf b = r->b;
    b.order = r->ord;
    b.hp_group = G; /* k_qe_dn_fuse_group's choice for 4-bit g64 stacks, IE 704 (a multiple of 64) */
    const cudaError_t e = k_qe_gate_up(0, &wg, r->xe, &b, r->T, H, IE, E, TOPK, 0);
    return e != cudaSuccess ? e : k_qe_down(0, &wd, &b, r->T, H, IE, E, TOPK, 0);
  }
  qe_args a, d;
  const tiled &tg = get_tiled(gu, QR_WARPS, qr_kc(G), 1, 1);
  const tiled &td = get_tiled(dn, QR_WARPS, qr_kc(G), 0, 1);
  const cudaError_t e = lab_args(tg, r, 1, 0, &a); /* the input copy of xe (xp, xs), as k_qe_gate_up makes it */
  if (e != cudaSuccess) return e;
  a.order = r->ord;
  a.hg = G;
  a.hs = r->b.hs;
  memset(&d, 0, sizeof d);
  d.q = td.q; d.sb = DG_CUDA_BF16; d.group = G; d.pb = 4;
  d.count = r->b.count; d.start = r->b.start; d.pairs = r->b.pairs; d.topk = TOPK; d.order = r->ord;
  d.X = r->b.h; d.xs = r->b.hs; d.Kdim = IE; d.N = H; d.y = r->b.y;
  return ver == 114 ? qr_fg_version<4>(0, E, nt, a, d) : qr_fgx_version<4>(ver, 0, E, nt, a, d);
}

/* The gate/up + down rows' outputs against the CPU at nsamp sampled (pair, feature) and (pair, row) each: hp the h
 * the run left (grouped rows in the fragment order: runs of 8 as x0 x4 x1 x5 x2 x6 x3 x7), put back in plain order
 * into *hplain; the down reference takes that h as its input (the kernel's own), as tests/test_cuda.c
 * check_qexperts does. Returns the largest |diff| / bound. */
static double h_ref(const stack *gu, int e, int n, const float *x, double *bound);
static double check_fused(const stack *gu, const stack *dn, routing *r, const std::vector<uint16_t> &hp,
                          const std::vector<float> &y, std::vector<uint16_t> *hplain, int nsamp) {
  const size_t TK = (size_t)r->T * TOPK;
  hplain->resize(hp.size());
  for (size_t i = 0; i < hp.size(); i += 8)
    for (int j = 0; j < 4; j++) {
      (*hplain)[i + j] = hp[i + 2 * j];
      (*hplain)[i + 4 + j] = hp[i + 2 * j + 1];
    }
  std::vector<int32_t> slot(TK);
  CKL(cudaMemcpy(slot.data(), r->b.slot_row, TK * 4, cudaMemcpyDeviceToHost));
  std::vector<float> x((size_t)std::max(H, IE));
  double worst = 0;
  for (int i = 0; i < nsamp; i++) {
    const size_t p = rnd() % TK, row = (size_t)slot[p];
    const int e = r->idx[p], n = (int)(rnd() % IE), m = (int)(rnd() % H);
    double bound;
    for (int k = 0; k < H; k++) x[(size_t)k] = dg_bf16_to_f32(r->hx[(p / TOPK) * H + k]);
    const double ref = h_ref(gu, e, n, x.data(), &bound), got = dg_bf16_to_f32((*hplain)[row * IE + n]);
    worst = std::max(worst, std::isfinite(got) ? fabs(got - ref) / bound : 1e30);
    for (int k = 0; k < IE; k++) x[(size_t)k] = dg_bf16_to_f32((*hplain)[row * IE + k]);
    const double refy = dot_ref(&dn->w, (int64_t)e * H + m, x.data(), &bound), goty = y[row * H + m];
    worst = std::max(worst, std::isfinite(goty) ? fabs(goty - refy) / (bound + 1e-30) : 1e30);
  }
  return worst;
}

/* q-quantile (0..1) of v by the nearest rank (v sorted here); 0 for an empty v. */
static double quant(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, (size_t)(q * (v.size() - 1) + 0.5))];
}
#include "fg_timeline.h" /* version 116: the one launch's timeline printout */

/* Version 110's timeline of its last launch (dev/cuda/qr_diet_lab.cuh qr_tl_kernel, qr_tl_buf: QR_TL_WORDS words per
 * block), printed under the row: the SM clock (clock64 cycles per globaltimer ns over all blocks) and the
 * globaltimer's step (the smallest gap between distinct entry stamps); each phase's length in us over the blocks of
 * experts with rows (median, p10 and p90): rows = entry to the row table (qr_block's order, count, start,
 * qe_pass_rows, barrier), act0 = to the first activation stage's barrier, w0 = to the first weight stage in thread 0's
 * registers after that, loop = to the stage loop's end (last pass), epi = the epilogue, block = entry to the
 * epilogue's end; over one-pass blocks (at most 8 nt rows) F = block - loop and the loop per weight stage (nst
 * stages); the blocks' start times after the first block's (p10, median, p90, last) and how many start within 2 us of
 * it; the concurrency over time from the globaltimer intervals (its maximum C: the resident slots reached; blocks / C
 * rounds; the mean busy slots over the span), the tail (from the last block's start to the end: its length and its
 * slots' busy fraction); per SM, the union of its blocks' intervals over the span (min, p10, median, max over the SMs
 * seen). */
static void print_timeline(int nst, int nt) {
  const size_t nb = qr_tl_blocks;
  if (!nb) {
    printf("  version 110: no timeline (version 50's kernel ran: not 4-bit g64 at 2 or 3 n-tiles)\n");
    return;
  }
  std::vector<uint64_t> w(nb * QR_TL_WORDS);
  CKL(cudaMemcpy(w.data(), qr_tl_buf, w.size() * 8, cudaMemcpyDeviceToHost));
  uint64_t g0 = UINT64_MAX, g1 = 0;
  double sc = 0, sg = 0;
  std::vector<uint64_t> starts;
  for (size_t b = 0; b < nb; b++) {
    const uint64_t *x = &w[b * QR_TL_WORDS];
    g0 = std::min(g0, x[0]);
    g1 = std::max(g1, x[1]);
    sc += (double)(x[7] - x[2]);
    sg += (double)(x[1] - x[0]);
    starts.push_back(x[0]);
  }
  std::sort(starts.begin(), starts.end());
  uint64_t step = UINT64_MAX;
  for (size_t i = 1; i < nb; i++)
    if (starts[i] > starts[i - 1]) step = std::min(step, starts[i] - starts[i - 1]);
  const double cpn = sg > 0 ? sc / sg : 1.0, span = (g1 - g0) * 1e-3; /* cycles per ns; us */
  auto us = [&](uint64_t c0, uint64_t c1) { return (double)(c1 - c0) / cpn * 1e-3; };
  std::vector<double> ph[8]; /* rows, act0, w0, loop, epi, block, F, per stage */
  std::vector<double> st;
  long empty = 0, now0 = 0;
  for (size_t b = 0; b < nb; b++) {
    const uint64_t *x = &w[b * QR_TL_WORDS];
    const long cnt = (long)(uint32_t)x[9];
    st.push_back((x[0] - g0) * 1e-3);
    if (cnt == 0) { empty++; continue; }
    ph[0].push_back(us(x[2], x[3]));
    ph[1].push_back(us(x[3], x[4]));
    if (x[5]) ph[2].push_back(us(x[4], x[5])); else now0++;
    if (x[5]) ph[3].push_back(us(x[5], x[6]));
    ph[4].push_back(us(x[6], x[7]));
    ph[5].push_back(us(x[2], x[7]));
    if (cnt <= 8 * nt && x[5]) {
      ph[6].push_back(us(x[2], x[7]) - us(x[5], x[6]));
      ph[7].push_back(us(x[5], x[6]) / nst);
    }
  }
  /* concurrency: +1 at each start, -1 at each end (globaltimer) */
  std::vector<std::pair<uint64_t, int>> ev;
  for (size_t b = 0; b < nb; b++) {
    ev.push_back({w[b * QR_TL_WORDS], 1});
    ev.push_back({w[b * QR_TL_WORDS + 1], -1});
  }
  std::sort(ev.begin(), ev.end(), [](const std::pair<uint64_t, int> &p, const std::pair<uint64_t, int> &q) {
    return p.first != q.first ? p.first < q.first : p.second < q.second; /* an end before a start at the same ns */
  });
  const uint64_t tlast = starts.back();
  int cur = 0, cmax = 0;
  double area = 0, tarea = 0;
  for (size_t i = 0; i < ev.size(); i++) {
    if (i > 0) {
      const uint64_t a0 = ev[i - 1].first, a1 = ev[i].first;
      area += (double)cur * (a1 - a0);
      if (a1 > tlast) tarea += (double)cur * (a1 - std::max(a0, tlast));
    }
    cur += ev[i].second;
    cmax = std::max(cmax, cur);
  }
  const double tail = (g1 - tlast) * 1e-3;
  long early = 0;
  for (uint64_t t : starts) early += t - g0 <= 2000;
  /* per SM: the union of its blocks' intervals */
  std::vector<std::vector<std::pair<uint64_t, uint64_t>>> sm(1024);
  for (size_t b = 0; b < nb; b++) {
    const uint64_t *x = &w[b * QR_TL_WORDS];
    sm[std::min<uint64_t>(x[8], 1023)].push_back({x[0], x[1]});
  }
  std::vector<double> busy;
  for (auto &v : sm) {
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    uint64_t u = 0, c0 = v[0].first, c1 = v[0].second;
    for (auto &iv : v) {
      if (iv.first > c1) { u += c1 - c0; c0 = iv.first; c1 = iv.second; }
      else c1 = std::max(c1, iv.second);
    }
    u += c1 - c0;
    busy.push_back(u * 1e-3 / span);
  }
  printf("  timeline (version 110): %zu blocks, %ld of experts without rows; clock %.3f GHz (clock64 / globaltimer), "
         "globaltimer step %llu ns; span %.1f us\n",
         nb, empty, cpn, (unsigned long long)(step == UINT64_MAX ? 0 : step), span);
  static const char *nm[8] = {"rows", "act0", "w0", "loop", "epi", "block", "F (1 pass)", "loop/stage"};
  printf("   phases us, median [p10 p90]:");
  for (int k = 0; k < 8; k++)
    printf("%s %s %.2f [%.2f %.2f]", k ? " |" : "", nm[k], quant(ph[k], 0.5), quant(ph[k], 0.1), quant(ph[k], 0.9));
  printf("%s\n", now0 ? " (w0 not stamped in some blocks)" : "");
  printf("   starts after the first, us: p10 %.1f, median %.1f, p90 %.1f, last %.1f; %ld blocks within 2 us\n",
         quant(st, 0.1), quant(st, 0.5), quant(st, 0.9), (tlast - g0) * 1e-3, early);
  printf("   slots: at most %d blocks at once, %zu blocks = %.2f rounds of them; busy slots over the span %.1f %%; tail "
         "(last start to end) %.1f us = %.1f %% of the span, its slots %.1f %% busy\n", cmax, nb, (double)nb / cmax,
         100.0 * area / ((double)cmax * (g1 - g0)), tail, 100.0 * tail / span,
         tail > 0 ? 100.0 * tarea / ((double)cmax * (g1 - tlast)) : 0.0);
  printf("   per-SM busy (its blocks' union / span) over %zu SMs: min %.3f, p10 %.3f, median %.3f, max %.3f\n",
         busy.size(), quant(busy, 0), quant(busy, 0.1), quant(busy, 0.5), quant(busy, 1));
}

/* Version 116's timeline of its last launch (qr_fgx_buf), printed by fg_timeline.h's fg_timeline_print. */
static void print_fg_timeline(int ver, int nst_gu, int nst_dn) {
  static_assert(QR_FGX_WORDS == FG_TL_WORDS, "qr_fgx_kernel's words per ticket are fg_timeline.h's");
  const size_t nb = qr_fgx_blocks;
  if (!nb) {
    printf("  version %d: no timeline (not 4-bit g64 at 2 or 3 n-tiles)\n", ver);
    return;
  }
  std::vector<uint64_t> w(nb * QR_FGX_WORDS);
  CKL(cudaMemcpy(w.data(), qr_fgx_buf, w.size() * 8, cudaMemcpyDeviceToHost));
  fg_timeline_print(w, ver, qr_fgx_ia, qr_fgx_ik, nst_gu, nst_dn);
}

/* Versions 51-60: the backend's kernel as it runs (version 50: the block order, qr_launch_bits' choices per tile
 * count) with other choices at 1 and 2 n-tiles (up to 16 rows per expert: the decode-sized canvases), where the
 * kernel is bound by its weight stream, not its instructions: blocks per SM the registers are capped for (MBn),
 * register stages (Dn), line prefetches (PFn), weight stages per activation stage (SUBn). From 3 n-tiles on the
 * backend's, or MB3 blocks per SM and D3 register stages when MB3 > 0 (the 256-token canvas's tile count). */
template <int MB1, int D1, int PF1, int SUB1, int MB2, int D2, int PF2, int SUB2, int MB3 = 0, int D3 = QR_D>
static cudaError_t run_small(int prod, stack *st, routing *r, int nt) {
  const int gateup = prod == GU;
  qe_args a;
  dim3 grid;
  cudaError_t e = backend_args(prod, st, r, &a, &grid);
  if (e != cudaSuccess) return e;
  if (nt == 1)
    return gateup ? qr_launch_g<4, 1, 1, G, QR_WARPS, D1, QR_STAGES, MB1, SUB1, PF1>(0, grid, a)
                  : qr_launch_g<4, 0, 1, G, QR_WARPS, D1, QR_STAGES, MB1, SUB1, PF1>(0, grid, a);
  if (nt == 2)
    return gateup ? qr_launch_g<4, 1, 2, G, QR_WARPS, D2, QR_STAGES, MB2, SUB2, PF2>(0, grid, a)
                  : qr_launch_g<4, 0, 2, G, QR_WARPS, D2, QR_STAGES, MB2, SUB2, PF2>(0, grid, a);
  if constexpr (MB3 > 0) /* MB3 > 0: 3 n-tiles with MB3 blocks per SM and D3 register stages */
    if (nt == 3)
      return gateup ? qr_launch_g<4, 1, 3, G, QR_WARPS, D3, QR_STAGES, MB3, QR_SUB, -QR_PF, 1, QR_NTS>(0, grid, a)
                    : qr_launch_g<4, 0, 3, G, QR_WARPS, D3, QR_STAGES, MB3, QR_SUB, -QR_PF, 1, QR_NTS>(0, grid, a);
  return gateup ? qr_launch_bits<4, 1>(0, grid, nt, a) : qr_launch_bits<4, 0>(0, grid, nt, a);
}

/* Versions 61-65 (4-bit): version 50 with the weight ring in shared memory (qr_body's D < 0: each lane's
 * records cp.async-copied WR - 1 stages ahead, no register stages) at 1 and 2 n-tiles (WR1/MB1, WR2/MB2: ring
 * stages, blocks per SM), and at 3 n-tiles when WR3 > 0 (MB3 blocks per SM, no prefetch, the 2-tile body for
 * experts of at most 16 rows); else the backend's from 3 n-tiles. The probes (90-94) put the stream of 2 loads in
 * flight per thread at v50's speed and 4 at 13 % less time: the ring keeps WR - 1 stages in flight per lane. */
template <int WR1, int MB1, int WR2, int MB2, int WR3 = 0, int MB3 = QR_MINB>
static cudaError_t run_ring(int prod, stack *st, routing *r, int nt) {
  const int gateup = prod == GU;
  qe_args a;
  dim3 grid;
  cudaError_t e = backend_args(prod, st, r, &a, &grid);
  if (e != cudaSuccess) return e;
  if (nt == 1)
    return gateup ? qr_launch_g<4, 1, 1, G, QR_WARPS, -WR1, QR_STAGES, MB1>(0, grid, a)
                  : qr_launch_g<4, 0, 1, G, QR_WARPS, -WR1, QR_STAGES, MB1>(0, grid, a);
  if (nt == 2)
    return gateup ? qr_launch_g<4, 1, 2, G, QR_WARPS, -WR2, QR_STAGES, MB2>(0, grid, a)
                  : qr_launch_g<4, 0, 2, G, QR_WARPS, -WR2, QR_STAGES, MB2>(0, grid, a);
  if constexpr (WR3 > 0)
    if (nt == 3)
      return gateup ? qr_launch_g<4, 1, 3, G, QR_WARPS, -WR3, QR_STAGES, MB3, QR_SUB, 0, 1, QR_NTS>(0, grid, a)
                    : qr_launch_g<4, 0, 3, G, QR_WARPS, -WR3, QR_STAGES, MB3, QR_SUB, 0, 1, QR_NTS>(0, grid, a);
  return gateup ? qr_launch_bits<4, 1>(0, grid, nt, a) : qr_launch_bits<4, 0>(0, grid, nt, a);
}

/* Versions 20-: qw_kernel (wgmma) over the wgmma-order lane records; PF only from 3 n-tiles, as the backend's. */
template <int D, int STAGES, int MINB, int SUB, int PF, int SWAP>
static cudaError_t run_wg(int prod, stack *st, routing *r, int nt) {
  const int gateup = prod == GU;
  const tiled &tl = get_tiled(st, 4, qr_kc(G), gateup, 3);
  qe_args a;
  cudaError_t e = lab_args(tl, r, gateup, 0, &a);
  if (e != cudaSuccess) return e;
  if (gateup) {
    const dim3 grid(E, (IE + 63) / 64);
    switch (nt) {
    case 1: return qw_launch_g<4, 1, 1, G, D, STAGES, MINB, SUB, 0, SWAP>(0, grid, a);
    case 2: return qw_launch_g<4, 1, 2, G, D, STAGES, MINB, SUB, 0, SWAP>(0, grid, a);
    case 3: return qw_launch_g<4, 1, 3, G, D, STAGES, MINB, SUB, PF, SWAP>(0, grid, a);
    default: return qw_launch_g<4, 1, 4, G, D, STAGES, MINB, SUB, PF, SWAP>(0, grid, a);
    }
  }
  const dim3 grid(E, (H + 127) / 128);
  switch (nt) {
  case 1: return qw_launch_g<4, 0, 1, G, D, STAGES, MINB, SUB, 0, SWAP>(0, grid, a);
  case 2: return qw_launch_g<4, 0, 2, G, D, STAGES, MINB, SUB, 0, SWAP>(0, grid, a);
  case 3: return qw_launch_g<4, 0, 3, G, D, STAGES, MINB, SUB, PF, SWAP>(0, grid, a);
  default: return qw_launch_g<4, 0, 4, G, D, STAGES, MINB, SUB, PF, SWAP>(0, grid, a);
  }
}

/* Versions 120-122 (4-bit g64): wl_kernel (src/cuda/qmoe_wl.cuh: wgmma m64nBNk16 with A the gathered rows of xp and
 * B the weights dequantized to bf16 in shared memory, both 128-byte swizzled; the DQ bound) at every row count, the
 * blocks in the backend's descending-count order: 120 = two warpgroups (passes of 128 rows), BN 128, a ring of 6
 * slots (4 stages of copies ahead), 1 block per SM (176,128 bytes of shared memory); 121 = one warpgroup (64 rows),
 * BN 128, 4 slots, 2 blocks per SM (101,376 bytes); 122 = two warpgroups, BN 256 (half the A tiles' L2 reads per
 * flop), 5 slots (227,328 bytes); 123, 124 = 122 with a block over 3 slabs (gate/up: 2 blocks an expert; down: 4)
 * or every slab of its expert (one block an expert), the copies streaming on across the slabs (session 24: down's
 * K 704 is 11 stages a block at one slab, where the ring's fill and drain weigh). */
static cudaError_t run_wl(int ver, int prod, stack *st, routing *r) {
  const int gateup = prod == GU, bn = ver >= 122 ? 256 : 128;
  const tiled &tl = get_tiled(st, bn, G, gateup, 4);
  qe_args a;
  cudaError_t e = lab_args(tl, r, gateup, 0, &a);
  if (e != cudaSuccess) return e;
  a.order = r->ord;
  g_dq = 1;
  if (ver == 120) return gateup ? wl_launch<1, 2, 6>(0, E, a) : wl_launch<0, 2, 6>(0, E, a);
  if (ver == 121) return gateup ? wl_launch<1, 1, 4, 2>(0, E, a) : wl_launch<0, 1, 4, 2>(0, E, a);
  if (ver == 123) return gateup ? wl_launch<1, 2, 5, 1, 256, 3>(0, E, a) : wl_launch<0, 2, 5, 1, 256, 3>(0, E, a);
  if (ver == 124) return gateup ? wl_launch<1, 2, 5, 1, 256, 12>(0, E, a) : wl_launch<0, 2, 5, 1, 256, 12>(0, E, a);
  return gateup ? wl_launch<1, 2, 5, 1, 256>(0, E, a) : wl_launch<0, 2, 5, 1, 256>(0, E, a);
}

/* Versions 75-79 (4-bit): the backend's kernel (version 50) up to 3 n-tiles; from 4 n-tiles qw_kernel's DQ body
 * (wgmma.m64nNk16 with the weights dequantized to bf16 in registers as A, the activations from the shared ring as
 * B, accumulated over the whole K: no per-group wait, one run's wgmmas in flight while the next run is decoded;
 * the blocks in the backend's descending-count order), NTB n-tiles per pass (NTB2 for experts of more than 64
 * rows when NTB2 > NTB), MB blocks per SM, ST activation stages. */
template <int NTB, int MB, int ST, int NTB2 = NTB>
static cudaError_t run_wgdq(int prod, stack *st, routing *r, int nt) {
  const int gateup = prod == GU;
  if (nt <= 3) {
    qe_args a;
    dim3 grid;
    cudaError_t e = backend_args(prod, st, r, &a, &grid);
    if (e != cudaSuccess) return e;
    g_dq = 0;
    return gateup ? qr_launch_bits<4, 1>(0, grid, nt, a) : qr_launch_bits<4, 0>(0, grid, nt, a);
  }
  const tiled &tl = get_tiled(st, 4, qr_kc(G), gateup, 3);
  qe_args a;
  cudaError_t e = lab_args(tl, r, gateup, 0, &a);
  if (e != cudaSuccess) return e;
  a.order = r->ord;
  g_dq = 1;
  const bool big = NTB2 > NTB && r->T * TOPK > 64 * E;
  const dim3 grid = gateup ? dim3(E, (IE + 63) / 64) : dim3(E, (H + 127) / 128);
  if (gateup) return big ? qw_launch_g<4, 1, NTB2, G, QR_D, ST, MB, QR_SUB, -2, 0, 1>(0, grid, a)
                         : qw_launch_g<4, 1, NTB, G, QR_D, ST, MB, QR_SUB, -2, 0, 1>(0, grid, a);
  return big ? qw_launch_g<4, 0, NTB2, G, QR_D, ST, MB, QR_SUB, -2, 0, 1>(0, grid, a)
             : qw_launch_g<4, 0, NTB, G, QR_D, ST, MB, QR_SUB, -2, 0, 1>(0, grid, a);
}

/* Versions 90-94 (4-bit, probes: no products, no output, no check): what the weight stream alone achieves at this
 * size. 90: the ceiling's streaming-read kernel over the backend layout's bytes of the product (all 128 experts,
 * 1,056 blocks of 512 threads); 91-94: one block of 32 QR_WARPS threads per (expert, slab) as qr_kernel's grid,
 * each reading its slab's contiguous bytes in 16-byte streaming loads (dg_ld_stream16), U loads in flight per
 * thread, the blocks per SM capped at MB by dynamic shared memory: 91 U 2 MB 5, 92 U 4 MB 5, 93 U 8 MB 5,
 * 94 U 4 MB 16. The gap between 91-93 and the real kernel at M = 1 is its instructions; between 91 and 93, its
 * bytes in flight. */
template <int U> __global__ void probe_slab(const uint4 *q, size_t slab16, const int *count, unsigned *sink) {
  DG_PDL_ENTRY();
  extern __shared__ unsigned char probe_smem[];
  const int e = blockIdx.x;
  if (count[e] == 0) return;
  const uint4 *p = q + ((size_t)e * gridDim.y + blockIdx.y) * slab16;
  unsigned acc = 0;
  for (size_t i = threadIdx.x; i < slab16; i += (size_t)blockDim.x * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; u++) {
      const size_t j = i + (size_t)u * blockDim.x;
      v[u] = j < slab16 ? dg_ld_stream16(p + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  if (acc == 0x12345678u) { probe_smem[0] = 1; *sink = acc; } /* never true on random codes; keeps the loads */
}

static cudaError_t run_probe(int ver, int prod, stack *st, routing *r) {
  static unsigned *sink = NULL;
  if (!sink) CKL(cudaMalloc((void **)&sink, 4));
  const int gateup = prod == GU;
  const tiled &tl = get_tiled(st, QR_WARPS, qr_kc(G), gateup, 1);
  if (ver == 90) {
    read_kernel<<<132 * 8, 512>>>((const uint4 *)tl.q, tl.bytes / 16, sink);
    return cudaGetLastError();
  }
  const dim3 grid(E, gateup ? (IE + 16 * QR_WARPS - 1) / (16 * QR_WARPS) : (H + 32 * QR_WARPS - 1) / (32 * QR_WARPS));
  const size_t slab16 = tl.bytes / 16 / ((size_t)grid.x * grid.y);
  if (slab16 * 16 * grid.x * grid.y != tl.bytes) return cudaErrorInvalidValue;
  const int mb = ver == 94 ? 16 : 5;
  const size_t smem = (size_t)(227 * 1024) / mb - 1024; /* caps the blocks per SM at mb */
  void (*k)(const uint4 *, size_t, const int *, unsigned *) =
      ver == 91 ? probe_slab<2> : ver == 93 ? probe_slab<8> : probe_slab<4>;
  static int set[3] = {0, 0, 0};
  const int ki = ver == 91 ? 0 : ver == 93 ? 2 : 1;
  if (!set[ki]) { CKL(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, 100 * 1024)); set[ki] = 1; }
  k<<<grid, 32 * QR_WARPS, mb == 16 ? 0 : smem>>>((const uint4 *)tl.q, slab16, r->b.count, sink);
  return cudaGetLastError();
}

/* Versions 70-79: version 50 (the backend's block order and choices) with the weights dequantized to bf16 in
 * registers before the tensor core (qr_kernel's DQ: w = fl_bf16(q s + b), no group sums, no partial sums, no
 * per-group fold, half the accumulator registers): DQS 1 at every tile count, 0 from 4 n-tiles on only (the
 * backend's kernel below); from 4 n-tiles MB4 blocks per SM the registers are capped for, NT8 n-tiles for the
 * largest experts (8: 64 tokens per pass, as the backend; 16: 128, experts of at most 64 rows take 8). */
template <int BITS, int GU, int DQS, int MB4, int NT8>
static cudaError_t dq_launch(dim3 grid, const qe_args &a, int nt) {
  constexpr int MB = QR_MINB;
  if (!DQS && nt <= 3) { g_dq = 0; return qr_launch_bits<BITS, GU>(0, grid, nt, a); }
  g_dq = 1;
  switch (nt) {
  case 1: return qr_launch_g<BITS, GU, 1, G, QR_WARPS, QR_D, QR_STAGES, (BITS <= 4 ? QR_MINB1 : MB), QR_SUB, 0, 1, 0, 0, 0, 1>(0, grid, a);
  case 2: return qr_launch_g<BITS, GU, 2, G, QR_WARPS, QR_D, QR_STAGES, MB, QR_SUB, 0, 1, 0, 0, 0, 1>(0, grid, a);
  case 3: return qr_launch_g<BITS, GU, 3, G, QR_WARPS, QR_D, QR_STAGES, MB, QR_SUB, -QR_PF, 1, QR_NTS, 0, 0, 1>(0, grid, a);
  case 4: return qr_launch_g<BITS, GU, 4, G, QR_WARPS, QR_D, QR_STAGES, MB4, QR_SUB, -QR_PF, 1, 3, 0, 0, 1>(0, grid, a);
  case 5: return qr_launch_g<BITS, GU, 5, G, QR_WARPS, QR_D, QR_STAGES, MB4, QR_SUB, -QR_PF, 1, 4, 0, 0, 1>(0, grid, a);
  default: return qr_launch_g<BITS, GU, NT8, G, QR_WARPS, QR_D, QR_STAGES, (NT8 > 8 ? 1 : MB4), QR_SUB, -QR_PF, 1, (NT8 > 8 ? 8 : 6), 0, 0, 1>(0, grid, a);
  }
}
template <int BITS, int DQS, int MB4, int NT8 = 8>
static cudaError_t run_dq(int prod, stack *st, routing *r, int nt) {
  qe_args a;
  dim3 grid;
  cudaError_t e = backend_args(prod, st, r, &a, &grid);
  if (e != cudaSuccess) return e;
  if (r->T * TOPK / E > 64 && NT8 > 8) nt = 8; /* (qe_nt's largest class) */
  return prod == GU ? dq_launch<BITS, 1, DQS, MB4, NT8>(grid, a, nt) : dq_launch<BITS, 0, DQS, MB4, NT8>(grid, a, nt);
}
template <int DQS, int MB4, int NT8 = 8>
static cudaError_t run_dq_bits(int bits, int prod, stack *st, routing *r, int nt) {
  switch (bits) {
  case 2: return run_dq<2, DQS, MB4, NT8>(prod, st, r, nt);
  case 3: return run_dq<3, DQS, MB4, NT8>(prod, st, r, nt);
  case 8: return run_dq<8, DQS, MB4, NT8>(prod, st, r, nt);
  default: return run_dq<4, DQS, MB4, NT8>(prod, st, r, nt);
  }
}

/* Versions 80-89: qs_kernel (dev/cuda/qmoe_s.cuh; slower than version 50 on the H200, session 13): a block of W warps per expert, the pass's activations resident
 * in shared memory, each warp streaming its 32-row tasks' weight stages (D register stages, line prefetches |PF|
 * stages ahead) with no barrier; passes of at most 8 NTM rows. Over the backend's lane records (QR_WARPS slabs)
 * in its block order; falls back to the backend's kernel (version 50) where the pass does not fit in shared
 * memory. Bit-identical to version 50 by construction (the lab compares every output). */
template <int BITS, int NTM, int W, int D, int PF>
static cudaError_t run_qs(int prod, stack *st, routing *r, int nt) {
  qe_args a;
  dim3 grid;
  cudaError_t e = backend_args(prod, st, r, &a, &grid);
  if (e != cudaSuccess) return e;
  e = prod == GU ? qs_launch<BITS, 1, NTM, W, D, PF>(0, E, a) : qs_launch<BITS, 0, NTM, W, D, PF>(0, E, a);
  if (e != cudaErrorInvalidValue) return e;
  (void)cudaGetLastError();
  return prod == GU ? qr_launch_bits<BITS, 1>(0, grid, nt, a) : qr_launch_bits<BITS, 0>(0, grid, nt, a);
}
template <int NTM, int W, int D, int PF>
static cudaError_t run_qs_bits(int bits, int prod, stack *st, routing *r, int nt) {
  switch (bits) {
  case 2: return run_qs<2, NTM, W, D, PF>(prod, st, r, nt);
  case 3: return run_qs<3, NTM, W, D, PF>(prod, st, r, nt);
  case 8: return run_qs<8, NTM, W, D, PF>(prod, st, r, nt);
  default: return run_qs<4, NTM, W, D, PF>(prod, st, r, nt);
  }
}

static cudaError_t run_version(int ver, int prod, stack *gu, stack *dn, routing *r) {
  const int T = r->T;
  stack *st = prod == GU ? gu : dn;
  if (ver >= 130 && ver <= 133) return run_lm(ver, prod, st, r);
  if (ver >= 134 && ver <= 139) return run_occ(ver, prod, st, r);
  if (ver >= 95 && ver <= 113) return run_diet(ver, prod, st, r);
#ifdef LAB_ONLY_SK /* versions 1-3, 40, 50 and 95-113 only (issue 11's session-25 call: the build in ~1-2 minutes) */
  (void)run_probe; /* (not built in: no "declared but never referenced" warnings) */
#ifdef LAB_LM /* -DLAB_LM (dev/gpu/s28_lm14.sh): with 120-124 */
  if (ver >= 120 && ver <= 124) return run_wl(ver, prod, st, r);
#else
  (void)run_wl;
#endif
  if ((ver >= 80 && ver < 95) || ver >= 120) return cudaErrorNotSupported;
#else
  if (ver >= 90 && ver <= 94) return run_probe(ver, prod, prod == GU ? gu : dn, r);
  if (ver >= 120 && ver <= 124) return run_wl(ver, prod, st, r);
#endif
#ifndef LAB_LEAN /* LAB_LEAN: versions 1-3, 40, 50, 80-94, 95-113 and 120-124 only (a build in a fraction of the time) */
  if (ver >= 20 && ver < 28) {
    const int nt = qe_nt(T, TOPK, E);
    switch (ver) {
    case 20: return run_wg<2, 3, 4, 2, 2, 0>(prod, st, r, nt);
    case 21: return run_wg<2, 3, 4, 2, 2, 1>(prod, st, r, nt); /* LBO and SBO exchanged: must fail its check */
    case 22: return run_wg<2, 3, 3, 2, 2, 0>(prod, st, r, nt);
    case 23: return run_wg<3, 3, 3, 2, 2, 0>(prod, st, r, nt);
    case 24: return run_wg<2, 4, 3, 2, 2, 0>(prod, st, r, nt);
    case 26: return run_wg<2, 3, 3, 2, 0, 0>(prod, st, r, nt);  /* 22 without the L2 prefetch */
    case 27: return run_wg<2, 3, 3, 2, -2, 0>(prod, st, r, nt); /* 22 with per-lane line prefetches */
    default: return run_wg<2, 3, 2, 2, 2, 0>(prod, st, r, nt); /* 25 */
    }
  }
  if (ver == 40) return k_bexperts(0, prod == GU, &st->d, prod == GU ? r->xe : r->b.h, &r->b, T, H, IE, E, TOPK);
  if (ver >= 41 && ver < 50) { /* bf16 stacks (bits 16) in lane records: qr_kernel's BITS 16 with other choices */
    const int nt = qe_nt(T, TOPK, E);
    switch (ver) {
    case 41: return run_lanes<4, 3, 3, 2, 2, 0, 1, 2, -2, 0, 0, 0, 16>(prod, st, r, nt); /* D 3, 2 blocks per SM */
    case 42: return run_lanes<4, 2, 3, 4, 2, -2, 1, 2, -2, 0, 0, 0, 16>(prod, st, r, nt); /* line prefetch everywhere */
    case 43: return run_lanes<4, 2, 3, 2, 2, 0, 1, 2, -2, 0, 0, 0, 16>(prod, st, r, nt); /* 2 blocks per SM */
    /* 45-47: 43 with other activation stages: 45 = 4 weight stages each (half the barriers), 46 = 1 each,
     * 47 = 4 each with 3 register stages and a ring of 4 */
    case 45: return run_lanes<4, 2, 3, 2, 4, 0, 1, 2, -2, 0, 0, 0, 16>(prod, st, r, nt);
    case 46: return run_lanes<4, 2, 3, 2, 1, 0, 1, 2, -2, 0, 0, 0, 16>(prod, st, r, nt);
    case 47: return run_lanes<4, 3, 4, 2, 4, 0, 1, 2, -2, 0, 0, 0, 16>(prod, st, r, nt);
    /* 48, 49: stages of 32 weights (half the record registers): 48 = 3 blocks per SM, 49 = 4 register stages, 4
     * weight stages per activation stage, 2 blocks per SM */
    case 48: return run_lanes<4, 2, 3, 3, 2, 0, 1, 2, -2, 0, 0, 0, 16, 32>(prod, st, r, nt);
    case 49: return run_lanes<4, 4, 3, 2, 4, 0, 1, 2, -2, 0, 0, 0, 16, 32>(prod, st, r, nt);
    default: return run_lanes<8, 2, 3, 1, 2, 0, 1, 2, -2, 0, 0, 0, 16>(prod, st, r, nt); /* 44: 8 warps */
    }
  }
  if (ver > 50 && ver <= 65) { /* (MB, D, PF, SUB) at 1 n-tile, then at 2 (, MB, D at 3); the backend's: (4, 2, 0, 2) */
    const int nt = qe_nt(T, TOPK, E);
    switch (ver) {
    case 51: return run_small<6, 2, 0, 2, 4, 2, 0, 2>(prod, st, r, nt);  /* 6 blocks per SM at 1 n-tile */
    case 61: return run_ring<4, 6, 4, 4>(prod, st, r, nt);       /* ring of 4 at 1 and 2 n-tiles */
    case 62: return run_ring<5, 6, 5, 4>(prod, st, r, nt);       /* ring of 5 */
    case 63: return run_ring<4, 6, 4, 4, 4, 4>(prod, st, r, nt); /* ring of 4 at 3 n-tiles too */
    case 64: return run_ring<3, 6, 3, 4, 3, 4>(prod, st, r, nt); /* ring of 3 everywhere up to 3 n-tiles */
    case 65: return run_ring<5, 5, 5, 3, 5, 3>(prod, st, r, nt); /* ring of 5, fewer blocks per SM */
    case 52: return run_small<4, 3, 0, 2, 4, 2, 0, 2>(prod, st, r, nt);  /* 3 register stages at 1 */
    case 53: return run_small<4, 4, 0, 2, 4, 2, 0, 2>(prod, st, r, nt);  /* 4 register stages at 1 */
    case 54: return run_small<6, 2, -2, 2, 4, 2, -2, 2>(prod, st, r, nt); /* 51 + line prefetches at 1 and 2 */
    case 55: return run_small<6, 2, 0, 4, 4, 2, 0, 4>(prod, st, r, nt);  /* 51 + activation stages of 4 at 1 and 2 */
    case 56: return run_small<5, 3, 0, 2, 3, 3, 0, 2>(prod, st, r, nt);  /* 3 register stages, 5 / 3 blocks per SM */
    case 57: return run_small<8, 2, 0, 2, 5, 2, 0, 2>(prod, st, r, nt);  /* 8 / 5 blocks per SM */
    case 58: return run_small<6, 2, -4, 2, 4, 3, 0, 2>(prod, st, r, nt); /* 4 stages ahead at 1, D 3 at 2 */
    case 59: return run_small<6, 2, 0, 2, 4, 2, 0, 2, 3>(prod, st, r, nt); /* 51 + 3 blocks per SM at 3 n-tiles */
    default: return run_small<6, 2, 0, 2, 4, 3, 0, 2, 3, 3>(prod, st, r, nt); /* 60: 59 with D 3 at 2 and 3 */
    }
  }
#endif
  g_dq = 0;
#ifndef LAB_ONLY_SK
  if (ver >= 80 && ver < 90) {
    const int nt = qe_nt(T, TOPK, E), bits = st->w.bits;
    switch (ver) {
    case 80: return run_qs_bits<4, 16, 2, -4>(bits, prod, st, r, nt); /* 16 warps, 2 register stages, 4 ahead */
    case 81: return run_qs<4, 3, 16, 2, -4>(prod, st, r, nt);          /* passes of 24 rows: no spill at 16 warps */
    case 82: return run_qs<4, 4, 11, 3, -4>(prod, st, r, nt);          /* 11 warps: 4 gate/up and 8 down tasks each */
    case 83: return run_qs<4, 4, 12, 3, -6>(prod, st, r, nt);          /* 12 warps, 3 stages, 6 ahead */
    case 84: return run_qs<4, 4, 12, 2, -8>(prod, st, r, nt);          /* 12 warps, 2 stages, 8 ahead */
    case 85: return run_qs<4, 4, 8, 4, -6>(prod, st, r, nt);           /* 8 warps, 4 register stages */
    case 86: return run_qs<4, 3, 16, 2, 0>(prod, st, r, nt);           /* 81 without the prefetches */
    default: return run_qs<4, 4, 11, 4, -8>(prod, st, r, nt);          /* 87: 11 warps, 4 stages, 8 ahead */
    }
  }
#endif
#ifndef LAB_LEAN
  if (ver >= 75 && ver < 80) {
    const int nt = qe_nt(T, TOPK, E);
    switch (ver) {
    case 75: return run_wgdq<8, 1, 3>(prod, st, r, nt);     /* 64 tokens per pass, the compiler's registers */
    case 76: return run_wgdq<8, 2, 3>(prod, st, r, nt);     /* 2 blocks per SM */
    case 77: return run_wgdq<8, 1, 3, 16>(prod, st, r, nt); /* 128 tokens per pass above 64 rows per expert */
    default: return run_wgdq<8, 1, 4>(prod, st, r, nt);     /* 78: a ring of 4 activation stages */
    }
  }
  if (ver >= 70 && ver < 80) {
    const int nt = qe_nt(T, TOPK, E), bits = st->w.bits;
    switch (ver) {
    case 70: return run_dq_bits<1, 1>(bits, prod, st, r, nt);     /* DQ at every tile count */
    case 71: return run_dq_bits<0, 2>(bits, prod, st, r, nt);     /* DQ from 4 n-tiles, 2 blocks per SM */
    case 72: return run_dq_bits<0, 3>(bits, prod, st, r, nt);     /* DQ from 4 n-tiles, 3 blocks per SM */
    case 73: return run_dq_bits<0, 1>(bits, prod, st, r, nt);     /* DQ from 4 n-tiles, the compiler's registers */
    default: return run_dq_bits<0, 2, 16>(bits, prod, st, r, nt); /* 74: 71 with 128 tokens per pass above 64 rows */
    }
  }
  if (ver >= 4 && ver != 50) {
    const int nt = qe_nt(T, TOPK, E);
    switch (ver) {
    case 4: return run_lanes<4, 3, 3, 4, 2>(prod, st, r, nt);
    case 5: return run_lanes<4, 3, 4, 4, 2>(prod, st, r, nt);
    case 6: return run_lanes<4, 2, 4, 4, 2>(prod, st, r, nt);
    case 7: return run_lanes<4, 4, 3, 4, 2>(prod, st, r, nt);
    case 8: return run_lanes<4, 2, 3, 4, 4>(prod, st, r, nt);
    case 9: return run_lanes<4, 3, 3, 4, 1>(prod, st, r, nt);
    case 10: case 11: case 12: return cudaErrorNotSupported; /* the bulk-copy weight ring: removed (session 6) */
    case 13: return run_lanes<4, 2, 3, 4, 2, 2>(prod, st, r, nt);
    case 14: return run_lanes<4, 2, 3, 4, 2, 4>(prod, st, r, nt);
    case 15: return run_lanes<4, 2, 3, 4, 2, 8>(prod, st, r, nt);
    case 16: return run_lanes<4, 2, 3, 4, 2, 16>(prod, st, r, nt);
    /* 18, 19, 28: the backend's (version 3: PF 2 from 3 n-tiles only) with per-lane line prefetches instead of
     * lane 0's bulk prefetch (18), with the 2-tile body for experts of <= 16 rows (19), both (28) */
    case 18: return run_lanes<4, 2, 3, 4, 2, 0, 1, 0, -2>(prod, st, r, nt);
    case 19: return run_lanes<4, 2, 3, 4, 2, 0, 1, 2, 2>(prod, st, r, nt);
    case 28: return run_lanes<4, 2, 3, 4, 2, 0, 1, 2, -2>(prod, st, r, nt);
    /* 29, 30: 28 with the line prefetches at every n-tile count, 2 and 4 stages ahead; 31: 28 with 4 */
    case 29: return run_lanes<4, 2, 3, 4, 2, -2, 1, 2, -2>(prod, st, r, nt);
    case 30: return run_lanes<4, 2, 3, 4, 2, -4, 1, 2, -4>(prod, st, r, nt);
    case 31: return run_lanes<4, 2, 3, 4, 2, 0, 1, 2, -4>(prod, st, r, nt);
    /* 32: 28 with the bias term (b - 128 s) S on the tensor cores (BM: one mma per pair of groups and tile over
     * the split group sums, the fold one FFMA per element instead of two); 33: 32 with line prefetches at
     * every n-tile count */
    case 32: return run_lanes<4, 2, 3, 4, 2, 0, 1, 2, -2, 1>(prod, st, r, nt);
    case 33: return run_lanes<4, 2, 3, 4, 2, -2, 1, 2, -2, 1>(prod, st, r, nt);
    case 34: return run_lanes<4, 2, 3, 3, 2, 0, 1, 2, -2, 1>(prod, st, r, nt); /* 32 at 3 blocks per SM */
    /* 35-38: a forced tile count for the larger canvases (registers the compiler's), line prefetches, a smaller
     * body for experts that fit it: 35 = 4 n-tiles (3 below 25 rows), 36 = 5 (4), 37 = 6 (4), 38 = 8 (6) */
    case 35: return run_lanes<4, 2, 3, 1, 2, 0, 1, 3, -2, 0, 4>(prod, st, r, nt);
    case 36: return run_lanes<4, 2, 3, 1, 2, 0, 1, 4, -2, 0, 5>(prod, st, r, nt);
    case 37: return run_lanes<4, 2, 3, 1, 2, 0, 1, 4, -2, 0, 6>(prod, st, r, nt);
    case 38: return run_lanes<4, 2, 3, 1, 2, 0, 1, 6, -2, 0, 8>(prod, st, r, nt);
    /* 39: 28 (the backend's) with the copies of tokens past the expert's rows skipped, not zero-filled */
    case 39: return run_lanes<4, 2, 3, 4, 2, 0, 1, 2, -2, 0, 0, 1>(prod, st, r, nt);
    default: return run_lanes<4, 2, 3, 4, 2, 0, 0>(prod, st, r, nt); /* 17: version 3 on the replicated-pair layout */
    }
  }
#else
  if ((ver >= 4 && ver < 40) || (ver > 40 && ver < 80 && ver != 50)) return cudaErrorNotSupported;
#endif
  if (ver == 1) {
    if (prod == GU) return k_qexperts_gate_up(0, &gu->d, r->xe, &r->b, T, H, IE, E, TOPK);
    return k_qexperts_down(0, &dn->d, &r->b, T, H, IE, E, TOPK);
  }
  /* 2: the tile layout (qe_kernel); 3: the backend's lane records (qr_kernel) */
  const tiled &tl = ver == 2 ? get_tiled(st, QE_WARPS, QE_KC, prod == GU) : get_tiled(st, QR_WARPS, qr_kc(G), prod == GU, 1);
  dg_cuda_w w = st->d;
  w.q = tl.q;
  w.sbp = tl.p;
  w.s = w.b = NULL;
  w.w = NULL;
  w.lay = ver == 2 ? DG_CUDA_LAY_TILES : DG_CUDA_LAY_LANES;
  dg_cuda_moe_buf b = r->b; /* 50: version 3 with the blocks in descending expert count (b.order) */
  if (ver == 50) b.order = r->ord;
  if (prod == GU) return k_qe_gate_up(0, &w, r->xe, &b, T, H, IE, E, TOPK, 0);
  return k_qe_down(0, &w, &b, T, H, IE, E, TOPK, 0);
}

/* The exact h = gelu(gate) up of expert e's feature n on input x, and the bound of a kernel's bf16 h on it (*bound;
 * the products' bounds dot_ref's, g_dq as set): the GPU's fp32 gate and up sums g', u' are within dg, du of the exact
 * g, u; |gelu_tanh'| <= 1.1290, so gelu(g') u' is within E1 = 1.13 dg (|u| + du) + |gelu(g)| du of gelu(g) u; the
 * fp32 gelu adds at most 64 u_f32 (|g| + 1) |u'|; the bf16 store rounds by at most 2^-8 of the value (tests/test_cuda.c
 * check_qexperts derives the same). */
static double h_ref(const stack *gu, int e, int n, const float *x, double *bound) {
  double dg, du;
  const double g = dot_ref(&gu->w, (int64_t)e * 2 * IE + n, x, &dg);
  const double uu = dot_ref(&gu->w, (int64_t)e * 2 * IE + IE + n, x, &du);
  const double u = ldexp(1.0, -24), ref = gelu_d(g) * uu;
  const double e1 = 1.13 * dg * (fabs(uu) + du) + fabs(gelu_d(g)) * du + 64.0 * u * (fabs(g) + 1.0) * (fabs(uu) + du);
  *bound = ldexp(1.0, -8) * (fabs(ref) + e1) + e1 + 1e-30;
  return ref;
}

/* Versions 120-: the outputs o (h bf16 or y fp32, as the run left them) against version 50's o50 at nsamp sampled
 * outputs, within the sum of the two bounds (each within its own of the exact value: the DQ bound for o, g_dq 1; the
 * exact fold's for o50, g_dq 0), not word for word (other summation orders). Returns the largest |o - o50| / (bound
 * + bound50) (> 1 fails). */
static double check_vs50(int prod, const stack *gu, const stack *dn, routing *r, const std::vector<uint8_t> &o,
                         const std::vector<uint8_t> &o50, int nsamp) {
  const size_t TK = (size_t)r->T * TOPK;
  std::vector<int32_t> slot(TK);
  CKL(cudaMemcpy(slot.data(), r->b.slot_row, TK * 4, cudaMemcpyDeviceToHost));
  std::vector<float> x((size_t)std::max(H, IE));
  double worst = 0;
  for (int i = 0; i < nsamp; i++) {
    const size_t p = rnd() % TK, row = (size_t)slot[p];
    const int e = r->idx[p], n = (int)(rnd() % (prod == GU ? IE : H));
    double b1, b0, v1, v0;
    if (prod == GU) {
      for (int k = 0; k < H; k++) x[(size_t)k] = dg_bf16_to_f32(r->hx[(p / TOPK) * H + k]);
      g_dq = 1;
      (void)h_ref(gu, e, n, x.data(), &b1);
      g_dq = 0;
      (void)h_ref(gu, e, n, x.data(), &b0);
      v1 = dg_bf16_to_f32(((const uint16_t *)o.data())[row * IE + n]);
      v0 = dg_bf16_to_f32(((const uint16_t *)o50.data())[row * IE + n]);
    } else {
      for (int k = 0; k < IE; k++) x[(size_t)k] = dg_bf16_to_f32(r->hh[row * IE + k]);
      g_dq = 1;
      (void)dot_ref(&dn->w, (int64_t)e * H + n, x.data(), &b1);
      g_dq = 0;
      (void)dot_ref(&dn->w, (int64_t)e * H + n, x.data(), &b0);
      v1 = ((const float *)o.data())[row * H + n];
      v0 = ((const float *)o50.data())[row * H + n];
    }
    const double q = std::isfinite(v1) && std::isfinite(v0) ? fabs(v1 - v0) / (b1 + b0 + 1e-30) : 1e30;
    worst = std::max(worst, q);
  }
  return worst;
}

/* Check sampled outputs of the last run against the CPU; returns the largest |diff| / bound (> 1 fails). */
static double check(int prod, const stack *gu, const stack *dn, routing *r, int nsamp) {
  const int T = r->T;
  const size_t TK = (size_t)T * TOPK;
  std::vector<int32_t> slot(TK);
  CKL(cudaMemcpy(slot.data(), r->b.slot_row, TK * 4, cudaMemcpyDeviceToHost));
  double worst = 0;
  std::vector<float> x((size_t)std::max(H, IE));
  if (prod == GU) {
    std::vector<uint16_t> h(TK * IE);
    CKL(cudaMemcpy(h.data(), r->b.h, h.size() * 2, cudaMemcpyDeviceToHost));
    for (int i = 0; i < nsamp; i++) {
      const size_t p = rnd() % TK;
      const int t = (int)(p / TOPK), e = r->idx[p], n = (int)(rnd() % IE);
      for (int k = 0; k < H; k++) x[(size_t)k] = dg_bf16_to_f32(r->hx[(size_t)t * H + k]);
      double bound;
      const double ref = h_ref(gu, e, n, x.data(), &bound);
      const double got = dg_bf16_to_f32(h[(size_t)slot[p] * IE + n]);
      const double q = std::isfinite(got) ? fabs(got - ref) / bound : 1e30;
      worst = std::max(worst, q);
    }
  } else {
    std::vector<float> y(TK * H);
    CKL(cudaMemcpy(y.data(), r->b.y, y.size() * 4, cudaMemcpyDeviceToHost));
    for (int i = 0; i < nsamp; i++) {
      const size_t p = rnd() % TK;
      const int e = r->idx[p], n = (int)(rnd() % H);
      const size_t row = (size_t)slot[p];
      for (int k = 0; k < IE; k++) x[(size_t)k] = dg_bf16_to_f32(r->hh[row * IE + k]);
      double bd;
      const double ref = dot_ref(&dn->w, (int64_t)e * H + n, x.data(), &bd);
      const double got = y[row * H + n];
      const double q = std::isfinite(got) ? fabs(got - ref) / (bd + 1e-30) : 1e30;
      worst = std::max(worst, q);
    }
  }
  return worst;
}

int main(int argc, char **argv) {
  int quick = 0;
  const char *json = NULL, *bits_s = "4,3,2,8,6", *vers_s = "1,2,3", *ms_s = NULL, *ts_s = NULL, *ss_s = NULL;
  int nreps = 25;
  for (int i = 1; i < argc; i++) {
    if (!strcmp(argv[i], "--quick")) quick = 1;
    else if (!strcmp(argv[i], "--json") && i + 1 < argc) json = argv[++i];
    else if (!strcmp(argv[i], "--bits") && i + 1 < argc) bits_s = argv[++i];
    else if (!strcmp(argv[i], "--versions") && i + 1 < argc) vers_s = argv[++i];
    else if (!strcmp(argv[i], "--ms") && i + 1 < argc) ms_s = argv[++i];
    else if (!strcmp(argv[i], "--ts") && i + 1 < argc) ts_s = argv[++i];
    else if (!strcmp(argv[i], "--ss") && i + 1 < argc) ss_s = argv[++i];
    else if (!strcmp(argv[i], "--reps") && i + 1 < argc) nreps = atoi(argv[++i]);
    else { fprintf(stderr, "usage: moe_quant [--quick] [--json FILE] [--bits LIST] [--versions LIST] [--ms LIST|none] [--ts LIST|none] [--ss LIST] [--reps N]\n"); return 2; }
  }
  std::vector<int> bitsv, versv;
  for (const char *p = bits_s; *p;) { bitsv.push_back(atoi(p)); while (*p && *p != ',') p++; if (*p) p++; }
  for (const char *p = vers_s; *p;) { versv.push_back(atoi(p)); while (*p && *p != ',') p++; if (*p) p++; }
  FILE *jf = json ? fopen(json, "w") : NULL;
  cudaDeviceProp prop;
  CKL(cudaGetDeviceProperties(&prop, 0));
  printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount, prop.l2CacheSize >> 20);
  cudaEvent_t e0, e1;
  CKL(cudaEventCreate(&e0));
  CKL(cudaEventCreate(&e1));

  /* ceilings */
  double bw = 0, rate = 0;
  {
    const size_t n = (size_t)4 << 30;
    uint4 *buf;
    unsigned *sink;
    CKL(cudaMalloc((void **)&buf, n));
    CKL(cudaMalloc((void **)&sink, 4));
    std::vector<uint8_t> hb((size_t)64 << 20);
    for (size_t i = 0; i < hb.size(); i += 8) { uint64_t r = rnd(); memcpy(&hb[i], &r, 8); }
    for (size_t o = 0; o < n; o += hb.size()) CKL(cudaMemcpy((char *)buf + o, hb.data(), hb.size(), cudaMemcpyHostToDevice));
    std::vector<double> t;
    for (int rep = 0; rep < 12; rep++) {
      CKL(cudaEventRecord(e0));
      read_kernel<<<prop.multiProcessorCount * 8, 512>>>(buf, n / 16, sink);
      CKL(cudaEventRecord(e1));
      CKL(cudaEventSynchronize(e1));
      if (rep >= 2) t.push_back(time_ms(e0, e1));
    }
    CKL(cudaGetLastError());
    bw = n / (median(t) * 1e-3);
    cudaFree(buf);
    cudaFree(sink);
    const int N = 8192;
    bf16 *A, *B;
    float *C;
    CKL(cudaMalloc((void **)&A, (size_t)N * N * 2));
    CKL(cudaMalloc((void **)&B, (size_t)N * N * 2));
    CKL(cudaMalloc((void **)&C, (size_t)N * N * 4));
    std::vector<uint16_t> hv((size_t)N * N);
    for (auto &v : hv) v = dg_f32_to_bf16(frand());
    CKL(cudaMemcpy(A, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice));
    CKL(cudaMemcpy(B, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice));
    cublasHandle_t hdl;
    cublasCreate(&hdl);
    const float one = 1.0f, zero = 0.0f;
    t.clear();
    for (int rep = 0; rep < 8; rep++) {
      CKL(cudaEventRecord(e0));
      if (cublasGemmEx(hdl, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &one, A, CUDA_R_16BF, N, B, CUDA_R_16BF, N, &zero, C,
                       CUDA_R_32F, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "cublasGemmEx failed\n");
        return 1;
      }
      CKL(cudaEventRecord(e1));
      CKL(cudaEventSynchronize(e1));
      if (rep >= 2) t.push_back(time_ms(e0, e1));
    }
    rate = 2.0 * N * N * (double)N / (median(t) * 1e-3);
    cublasDestroy(hdl);
    cudaFree(A); cudaFree(B); cudaFree(C);
  }
  printf("ceilings: read %.0f GB/s (streaming-read kernel, 4 GiB, median of 10), bf16 %.0f TFLOP/s (cublasGemmEx 8192^3, "
         "median of 6)\n\n", bw / 1e9, rate / 1e12);
  if (jf) fprintf(jf, "{\"kind\": \"ceilings\", \"device\": \"%s\", \"read_gbs\": %.1f, \"bf16_tflops\": %.1f}\n", prop.name, bw / 1e9, rate / 1e12);

  void *flush;
  const size_t flush_bytes = (size_t)256 << 20;
  CKL(cudaMalloc(&flush, flush_bytes));

  std::vector<int> Ms = quick ? std::vector<int>{1, 16, 64} : std::vector<int>{1, 2, 4, 8, 16, 32, 64, 128, 256};
  std::vector<int> Ts = quick ? std::vector<int>{256} : std::vector<int>{256, 512, 1024};
  auto parse = [](const char *l, std::vector<int> &v) {
    v.clear();
    if (!strcmp(l, "none")) return;
    for (const char *p = l; *p;) { v.push_back(atoi(p)); while (*p && *p != ',') p++; if (*p) p++; }
  };
  if (ms_s) parse(ms_s, Ms);
  if (ts_s) parse(ts_s, Ts);
  std::vector<int> Ss; /* skewed T (route_skew): none unless asked for */
  if (ss_s) parse(ss_s, Ss);
  printf("| bits | product | rows | M/expert | version | median us | min-max us | GB/s | TFLOP/s | roofline us | %% of roofline | check |\n"
         "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  int failures = 0;
  for (int bits : bitsv) {
    stack gu, dn;
    make_stack(&gu, (int64_t)E * 2 * IE, H, bits);
    make_stack(&dn, (int64_t)E * H, IE, bits);
    std::vector<std::pair<int, int>> cases; /* (kind 0 uniform / 1 random / 2 skewed, value) */
    for (int M : Ms) cases.push_back({0, M});
    for (int T : Ts) cases.push_back({1, T});
    for (int T : Ss) cases.push_back({2, T});
    for (auto cs : cases) {
      routing r;
      /* each case's routing and inputs from a generator state of its own: rows compare across runs whatever
       * versions ran before (the checks draw from the same generator) */
      rs = 0x9e3779b97f4a7c15ull ^ ((uint64_t)cs.first << 32 | (uint64_t)cs.second);
      if (cs.first == 0) route_uniform(&r, cs.second);
      else if (cs.first == 1) route_random(&r, cs.second);
      else route_skew(&r, cs.second);
      route_alloc(&r);
      CKL(cudaMemcpy(r.b.h, r.hh.data(), r.hh.size() * 2, cudaMemcpyHostToDevice));
      for (int prod = 0; prod < 2; prod++) {
        const int64_t N = prod == GU ? 2 * IE : H, K = prod == GU ? H : IE;
        const double wbytes = (double)r.hit * N * (bits == 16 ? 2.0 * K : (double)K * bits / 8 + 2.0 * (K / G) * 2);
        const double flops = 2.0 * r.T * TOPK * N * (double)K;
        const double roof = std::max(wbytes / bw, flops / rate);
        for (int ver : versv) {
          if (ver == 1 && cs.first == 0 && cs.second > 64 && quick) continue;
          if (bits == 16 ? ver != 3 && ver != 95 && (ver < 40 || ver > 50) : ver >= 40 && ver < 50) continue; /* bf16: 3, 40-50, 95; 51-60: 4-bit */
          if (bits == 16 && ver >= 70 && ver < 80) continue; /* DQ: quantized stacks (2, 3, 4, 8 bits) */
          if (bits != 4 && ver >= 75 && ver < 80) continue; /* qw DQ: 4-bit (qw_tile_pack) */
          if (bits == 6 && ver >= 70 && ver < 80) continue;
          if ((bits == 16 || bits == 6) && ver >= 80 && ver < 90) continue; /* qs: quantized stacks of 2, 3, 4, 8 bits */
          if (bits != 4 && ver > 80 && ver < 90) continue;                   /* 81-89: 4-bit */
          if (bits != 16 && ver >= 4 && ver != 50 && ver != 95 && !(ver >= 70 && ver < 90) &&
              (bits != 4 || (ver < 35 && qe_nt(r.T, TOPK, E) > 4))) continue;
          if (bits == 16 && ver > 40 && ver < 50 && qe_nt(r.T, TOPK, E) > 4) continue;
          if (ver >= 90 && ver <= 94 && bits != 4) continue; /* the probes: 4-bit only */
          /* the diet's launch choices, rings, persistent grid, early weights, timeline, slab pairs: 4-bit only */
          if (ver > 95 && ver <= 113 && bits != 4) continue;
          if (ver == 114 || (ver >= 116 && ver <= 119) || (ver >= 125 && ver <= 129))
            continue; /* gate/up + down in one launch: rows after both */
          if (ver >= 120 && bits != 4) continue;             /* the large-M wgmma kernel: 4-bit g64 only */
          /* the down product reads h: restore the lab's input (a gate/up run overwrote it) */
          if (prod == DN) CKL(cudaMemcpy(r.b.h, r.hh.data(), r.hh.size() * 2, cudaMemcpyHostToDevice));
          if (prod == GU) CKL(cudaMemset(r.b.h, 0xff, (size_t)r.T * TOPK * IE * 2)); /* poison: NaN */
          else CKL(cudaMemset(r.b.y, 0xff, (size_t)r.T * TOPK * H * 4));
          CKL(run_version(ver, prod, &gu, &dn, &r));
          CKL(cudaDeviceSynchronize());
          const int probe = (ver >= 90 && ver <= 94) || ver == 113; /* no output to check */
          const double q = probe ? 0.0 : check(prod, &gu, &dn, &r, 48);
          if (!(q <= 1.0)) failures++;
          /* versions 80-89, 95-111: output words that differ from version 50's (bit-identical by construction) */
          long ndiff = -1;
          if ((ver >= 80 && ver < 90) || (ver >= 95 && ver <= 111) || (ver >= 130 && ver <= 139)) {
            const size_t words = prod == GU ? (size_t)r.T * TOPK * IE : (size_t)r.T * TOPK * H, wb = prod == GU ? 2 : 4;
            void *out = prod == GU ? (void *)r.b.h : (void *)r.b.y;
            std::vector<uint8_t> o1(words * wb), o2(words * wb);
            CKL(cudaMemcpy(o1.data(), out, o1.size(), cudaMemcpyDeviceToHost));
            CKL(cudaMemset(out, 0xff, o2.size()));
            CKL(run_version(50, prod, &gu, &dn, &r));
            CKL(cudaDeviceSynchronize());
            CKL(cudaMemcpy(o2.data(), out, o2.size(), cudaMemcpyDeviceToHost));
            ndiff = 0;
            for (size_t i = 0; i < words; i++) ndiff += memcmp(&o1[i * wb], &o2[i * wb], wb) != 0;
            if (ndiff) failures++;
            if (prod == DN) CKL(cudaMemcpy(r.b.h, r.hh.data(), r.hh.size() * 2, cudaMemcpyHostToDevice));
          }
          double q50 = -1; /* versions 112, 120-: |v - v50| / (bound + bound50) over 256 sampled outputs */
          if ((ver >= 120 && ver <= 124) || ver == 112) {
            const size_t bytes = prod == GU ? (size_t)r.T * TOPK * IE * 2 : (size_t)r.T * TOPK * H * 4;
            void *out = prod == GU ? (void *)r.b.h : (void *)r.b.y;
            std::vector<uint8_t> o1(bytes), o2(bytes);
            CKL(cudaMemcpy(o1.data(), out, bytes, cudaMemcpyDeviceToHost));
            CKL(cudaMemset(out, 0xff, bytes));
            CKL(run_version(50, prod, &gu, &dn, &r));
            CKL(cudaDeviceSynchronize());
            CKL(cudaMemcpy(o2.data(), out, bytes, cudaMemcpyDeviceToHost));
            q50 = check_vs50(prod, &gu, &dn, &r, o1, o2, 256);
            if (!(q50 <= 1.0)) failures++;
            if (prod == DN) CKL(cudaMemcpy(r.b.h, r.hh.data(), r.hh.size() * 2, cudaMemcpyHostToDevice));
          }
          std::vector<double> t;
          int reps = nreps;
          for (int rep = 0; rep < reps + 3; rep++) {
            CKL(cudaMemsetAsync(flush, rep & 0xff, flush_bytes));
            CKL(cudaEventRecord(e0));
            CKL(run_version(ver, prod, &gu, &dn, &r));
            CKL(cudaEventRecord(e1));
            CKL(cudaEventSynchronize(e1));
            if (rep >= 3) t.push_back(time_ms(e0, e1) * 1e3);
            if (rep == 3 && t[0] > 20000) reps = 5; /* slow versions: fewer repetitions */
          }
          std::sort(t.begin(), t.end());
          const double med = t[t.size() / 2];
          char label[64];
          snprintf(label, sizeof label, "%s %d", case_label(cs.first), cs.second);
          printf("| %d | %s | %s | %.1f | %d | %.1f | %.1f-%.1f | %.0f | %.1f | %.1f | %.1f | %.3f %s |\n", bits,
                 prod == GU ? "gate_up" : "down", label, (double)r.T * TOPK / E, ver, med, t.front(), t.back(),
                 wbytes / (med * 1e-6) / 1e9, flops / (med * 1e-6) / 1e12, roof * 1e6, 100.0 * roof * 1e6 / med,
                 q, probe ? "probe" : q <= 1.0 && ndiff <= 0 ? (ndiff == 0 ? "ok, = v50" : "ok") : ndiff > 0 ? "FAIL (!= v50)" : "FAIL");
          if (ndiff > 0) printf("  version %d: %ld output words differ from version 50's\n", ver, ndiff);
          if (ver == 110) print_timeline(prod == GU ? H / qr_kc(G, 4) : IE / qr_kc(G, 4), qe_nt(r.T, TOPK, E));
          if (q50 >= 0)
            printf("  version %d vs 50: largest |diff| / (bound + bound of v50) %.3f over 256 sampled outputs (%s)\n", ver,
                   q50, q50 <= 1.0 ? "ok" : "FAIL");
          if (jf)
            fprintf(jf, "{\"kind\": \"moe_lab\", \"device\": \"%s\", \"bits\": %d, \"group\": %d, \"product\": \"%s\", "
                        "\"routing\": \"%s\", \"n\": %d, \"tokens\": %d, \"experts_hit\": %d, \"rows_per_expert\": %.2f, "
                        "\"version\": %d, \"median_us\": %.2f, \"min_us\": %.2f, \"max_us\": %.2f, \"reps\": %zu, "
                        "\"weight_bytes\": %.0f, \"flops\": %.0f, \"gbs\": %.1f, \"tflops\": %.2f, \"roofline_us\": %.2f, "
                        "\"frac_roofline\": %.4f, \"read_gbs\": %.1f, \"bf16_tflops\": %.1f, \"check_ratio\": %.4f}\n",
                    prop.name, bits, G, prod == GU ? "gate_up" : "down", case_json(cs.first),
                    cs.second, r.T, r.hit, (double)r.T * TOPK / E, ver, med, t.front(), t.back(), t.size(), wbytes,
                    flops, wbytes / (med * 1e-6) / 1e9, flops / (med * 1e-6) / 1e12, roof * 1e6, roof * 1e6 / med,
                    bw / 1e9, rate / 1e12, q);
          fflush(stdout);
        }
      }
      /* version 114 asked for (4-bit): the gate/up + down rows, version 50's two launches and 114's one, each
       * checked against the CPU (check_fused), 114's h and y against 50's word for word and its counters (a wait
       * that ran out, the reset: qr_fg_error) */
      std::vector<int> fv; /* the one-launch versions asked for (114, 116-119, 125-129), after version 50 */
      for (int v : versv)
        if (v == 114 || (v >= 116 && v <= 119) || (v >= 125 && v <= 129)) fv.push_back(v);
      if (bits == 4 && !fv.empty()) {
        const size_t TK = (size_t)r.T * TOPK;
        const double wb = (double)r.hit * ((2.0 * IE) * ((double)H * bits / 8 + 2.0 * (H / G) * 2) +
                                           (double)H * ((double)IE * bits / 8 + 2.0 * (IE / G) * 2));
        const double flops = 2.0 * TK * (2.0 * IE * H + (double)H * IE), roof = std::max(wb / bw, flops / rate);
        std::vector<uint16_t> h50, hp(TK * IE), hplain;
        std::vector<float> y50, y(TK * H);
        fv.insert(fv.begin(), 50);
        for (int ver : fv) {
          CKL(cudaMemset(r.b.h, 0xff, TK * IE * 2)); /* poison: NaN */
          CKL(cudaMemset(r.b.hs, 0xff, TK * IE / 32 * 4));
          CKL(cudaMemset(r.b.y, 0xff, TK * H * 4));
          CKL(run_fused(ver, &gu, &dn, &r));
          CKL(cudaDeviceSynchronize());
          CKL(cudaMemcpy(hp.data(), r.b.h, TK * IE * 2, cudaMemcpyDeviceToHost));
          CKL(cudaMemcpy(y.data(), r.b.y, TK * H * 4, cudaMemcpyDeviceToHost));
          const double q = check_fused(&gu, &dn, &r, hp, y, &hplain, 48);
          long dh = -1, dy = -1;
          int ferr = 0;
          if (ver == 50) {
            h50 = hp;
            y50 = y;
          } else {
            dh = dy = 0;
            for (size_t i = 0; i < hp.size(); i++) dh += hp[i] != h50[i];
            for (size_t i = 0; i < y.size(); i++) dy += memcmp(&y[i], &y50[i], 4) != 0;
            ferr = qr_fg_error(E);
          }
          const int ok = q <= 1.0 && dh <= 0 && dy <= 0 && ferr == 0;
          if (!ok) failures++;
          std::vector<double> t;
          for (int rep = 0; rep < nreps + 3; rep++) {
            CKL(cudaMemsetAsync(flush, rep & 0xff, flush_bytes));
            CKL(cudaEventRecord(e0));
            CKL(run_fused(ver, &gu, &dn, &r));
            CKL(cudaEventRecord(e1));
            CKL(cudaEventSynchronize(e1));
            if (rep >= 3) t.push_back(time_ms(e0, e1) * 1e3);
          }
          if (ver != 50) { /* the timed launches too: no wait ran out, the counters back at 0 */
            const int fe = qr_fg_error(E);
            if (fe) {
              failures++;
              printf("  version %d: counters after the timed launches: %s\n", ver, fe == 1 ? "a wait ran out" : "not reset");
            }
          }
          std::sort(t.begin(), t.end());
          const double med = t[t.size() / 2];
          char label[64];
          snprintf(label, sizeof label, "%s %d", case_label(cs.first), cs.second);
          printf("| %d | gate_up+down | %s | %.1f | %d | %.1f | %.1f-%.1f | %.0f | %.1f | %.1f | %.1f | %.3f %s |\n", bits,
                 label, (double)TK / E, ver, med, t.front(), t.back(), wb / (med * 1e-6) / 1e9,
                 flops / (med * 1e-6) / 1e12, roof * 1e6, 100.0 * roof * 1e6 / med, q,
                 ok ? (ver != 50 ? "ok, = v50" : "ok") : "FAIL");
          if (ver != 50)
            printf("  version %d vs 50 (DGEMMA_DN_FUSE=1, two launches): words that differ h %ld of %zu, y %ld of %zu; "
                   "counters %s\n", ver, dh, hp.size(), dy, y.size(),
                   ferr == 0 ? "ok (no wait ran out, all back at 0)" : ferr == 1 ? "FAIL (a wait ran out)" : ferr == 2 ? "FAIL (not reset)" : "FAIL (unreadable)");
          if (ver == 116) print_fg_timeline(ver, H / qr_kc(G, 4), IE / qr_kc(G, 4));
          else if (ver > 114) printf("  version %d: ticket order ia %d ik %d (gate/up items %d)%s\n", ver, qr_fgx_ia, qr_fgx_ik,
                                     E * (IE / (16 * QR_WARPS)), ver == 119 ? ", persistent blocks"
                                     : ver == 125 ? ", persistent blocks, next item's head to L1"
                                     : ver == 126 ? ", persistent blocks, next item's head to L1, 2 weight stages to L2"
                                     : ver == 127 ? ", persistent blocks, next item's head to L1, early down-wait check"
                                     : ver == 128 ? ", persistent blocks, activation ring carried across items"
                                     : ver == 129 ? ", persistent blocks, ring and first weight stage carried across items"
                                                  : "");
          if (jf)
            fprintf(jf, "{\"kind\": \"moe_lab\", \"device\": \"%s\", \"bits\": %d, \"group\": %d, \"product\": \"gate_up+down\", "
                        "\"routing\": \"%s\", \"n\": %d, \"tokens\": %d, \"experts_hit\": %d, \"rows_per_expert\": %.2f, "
                        "\"version\": %d, \"median_us\": %.2f, \"min_us\": %.2f, \"max_us\": %.2f, \"reps\": %zu, "
                        "\"weight_bytes\": %.0f, \"flops\": %.0f, \"roofline_us\": %.2f, \"check_ratio\": %.4f, "
                        "\"diff_h\": %ld, \"diff_y\": %ld}\n",
                    prop.name, bits, G, case_json(cs.first), cs.second, r.T, r.hit, (double)TK / E, ver,
                    med, t.front(), t.back(), t.size(), wb, flops, roof * 1e6, q, dh, dy);
          fflush(stdout);
        }
      }
      route_free(&r);
    }
    free_stack(&gu);
    free_stack(&dn);
  }
  if (jf) fclose(jf);
  printf("\ncheck: largest |diff| / derived bound over 48 sampled outputs per row (<= 1 passes); %d rows failed\n", failures);
  return failures ? 1 : 0;
}
