/* common.cuh: shared definitions of the CUDA backend's .cu files: status
 * checks that turn CUDA/cuBLAS failures into DG_ERR_BACKEND with the call
 * named (never abort), bf16 helpers, the device-side model and context
 * structs, and the kernel launchers (kernels.cu, moe.cu) used by the host
 * side (upload.cu, context.cu, passes.cu, turbo_host.cu; shared: host.cuh). */
#ifndef DG_CUDA_COMMON_CUH
#define DG_CUDA_COMMON_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "base/dg_error.h"
}
#include "cuda/backend.h"

/* The float dtypes of the device code (the scales/biases dtype of a device
 * matrix, dg_cuda_w.sb; the activation dtype of the self-conditioning casts)
 * are the ground floor's dg_dtype (src/base/dtype.h), as in the host description
 * (dg_weight); these are the kernels' short names for its three values. */
enum { DG_CUDA_F32 = DG_F32, DG_CUDA_BF16 = DG_BF16, DG_CUDA_F16 = DG_F16 };

/* Return DG_ERR_BACKEND from the enclosing function if a CUDA call fails. */
#define CK(call)                                                                                          \
  do {                                                                                                    \
    cudaError_t ck_e_ = (call);                                                                           \
    if (ck_e_ != cudaSuccess)                                                                             \
      return dg_seterr(DG_ERR_BACKEND, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__, #call,            \
                       cudaGetErrorName(ck_e_), cudaGetErrorString(ck_e_));                               \
  } while (0)

/* Same for cuBLAS. */
#define CKB(call)                                                                                         \
  do {                                                                                                    \
    cublasStatus_t ckb_s_ = (call);                                                                       \
    if (ckb_s_ != CUBLAS_STATUS_SUCCESS)                                                                  \
      return dg_seterr(DG_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call,                 \
                       cublasGetStatusString(ckb_s_));                                                    \
  } while (0)

/* A kernel launcher (returns the launch's cudaError_t): a bad configuration is
 * reported at once; with DGEMMA_CUDA_SYNC=1 in the environment the context
 * also synchronises after every launch, so a fault in the kernel is reported
 * with the launcher's name instead of at the next synchronisation. */
#define CKK(ctx, call)                                                                                    \
  do {                                                                                                    \
    CK(call);                                                                                             \
    if ((ctx)->debug_sync) {                                                                              \
      cudaError_t ckk_e_ = cudaStreamSynchronize((ctx)->stream);                                          \
      if (ckk_e_ != cudaSuccess)                                                                          \
        return dg_seterr(DG_ERR_BACKEND, "%s:%d: %s failed while running: %s (%s)", __FILE__, __LINE__,   \
                         #call, cudaGetErrorName(ckk_e_), cudaGetErrorString(ckk_e_));                    \
    }                                                                                                     \
  } while (0)

typedef __nv_bfloat16 bf16;

/* Kernel launch and dynamic shared memory, spelled as macros so that
 * dev/cuda_emu (a CPU emulation used to check the kernels' indexing without a
 * GPU) can compile the same sources with a host compiler. */
#ifndef DG_CUDA_EMU
/* Programmatic dependent launch (CUDA programming guide, "Programmatic Dependent Launch and Synchronization"; PTX
 * ISA griddepcontrol, sm_90): with dg_cuda_pdl set (on unless DGEMMA_PDL=0, read in kernels.cu), every
 * launch carries cudaLaunchAttributeProgrammaticStreamSerialization, so that a kernel's blocks may be placed while the
 * kernel before it in the stream drains. Every kernel of src/cuda therefore begins with DG_PDL_ENTRY() (checked by
 * tests/python/test_pdl_entry.py): launch_dependents lets the next kernel be placed, wait blocks until the previous
 * grid has completed and its memory is visible, before any global read or write of this one. Without the attribute
 * both instructions return at once. */
extern int dg_cuda_pdl;
#define DG_PDL_ENTRY() asm volatile("griddepcontrol.launch_dependents;\n griddepcontrol.wait;\n" ::: "memory")
/* DG_PDL_ENTRY's two halves, for a kernel that does work between them which needs nothing of the grids before it
 * (qr_kernel's qr_prewait: L2 prefetches of constant weights). Only `*_prewait(...)` calls may stand between them
 * (tests/python/test_pdl_entry.py); the "memory" clobber keeps every global access of the source after
 * DG_PDL_WAIT() after it. */
#define DG_PDL_LAUNCH() asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory")
#define DG_PDL_WAIT() asm volatile("griddepcontrol.wait;\n" ::: "memory")
/* coop (DG_LAUNCH_COOP): the launch also carries cudaLaunchAttributeCooperative (CUDA runtime API, cudaLaunchKernelEx:
 * "the same usage and semantics as cudaLaunchCooperativeKernel"): the driver places every block of the grid at once
 * or refuses the launch (cudaErrorCooperativeLaunchTooLarge), whatever else runs on the device, so that a grid-wide
 * wait inside the kernel cannot deadlock; the attribute is valid for launches and graph nodes, so a captured
 * launch becomes a cooperative kernel node (a graph update cannot turn it into a plain one or back). The PDL
 * attribute composes with it in the same attribute list. */
template <typename... KP> struct dg_launch_pdl {
  void (*k)(KP...);
  dim3 g, b;
  size_t smem;
  cudaStream_t s;
  int coop;
  template <typename... A> void operator()(A &&...args) const {
    if (!dg_cuda_pdl && !coop) {
      k<<<g, b, smem, s>>>(static_cast<KP>(args)...);
      return;
    }
    cudaLaunchAttribute at[2];
    int na = 0;
    if (dg_cuda_pdl) {
      at[na].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      at[na++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (coop) {
      at[na].id = cudaLaunchAttributeCooperative;
      at[na++].val.cooperative = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g;
    cfg.blockDim = b;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = at;
    cfg.numAttrs = na;
    (void)cudaLaunchKernelEx(&cfg, k, static_cast<KP>(args)...); /* an error is left for cudaGetLastError */
  }
};
template <typename... KP>
static inline dg_launch_pdl<KP...> dg_launch_of(void (*k)(KP...), dim3 g, dim3 b, size_t smem, cudaStream_t s,
                                                int coop = 0) {
  return dg_launch_pdl<KP...>{k, g, b, smem, s, coop};
}
#define DG_LAUNCH(kernel, grid, block, smem, stream) dg_launch_of((kernel), dim3(grid), dim3(block), (smem), (stream))
/* A cooperative launch (above); the emulation (dev/cuda_emu/emu.h) maps it to its plain launch. */
#define DG_LAUNCH_COOP(kernel, grid, block, smem, stream)                                                        \
  dg_launch_of((kernel), dim3(grid), dim3(block), (smem), (stream), 1)
#define DG_DYN_SMEM(type, name) extern __shared__ type name[]
/* A kernel's dynamic shared memory as 16-byte aligned bytes (cp.async and 16-byte loads); the emulation's form in
 * dev/cuda_emu/emu.h. */
#define DG_DYN_SMEM16(name) extern __shared__ __align__(16) unsigned char name[]
#define DG_ASSERT_ALIGNED(ptr, bytes) ((void)0) /* checked by the emulation only */
#endif
extern int dg_cuda_initcheck; /* DGEMMA_INITCHECK=1: cuBLAS outputs cleared first (kernels.cu; host.cuh dg_initcheck_clear) */

/* One weight matrix [rows, cols] on the device: bf16, or MLX affine-quantized
 * as stored (the host's dg_weight, src/base/weight.h): packed rows of cols*bits/32 uint32
 * words, scales and biases [rows, cols/group] of dtype sb (DG_CUDA_*). The
 * quantized kernels (quant.cu) dequantize w = (float)q * s + b in fp32. */
struct dg_cuda_w {
  int bits;                 /* 0: bf16 in w */
  int group, sb;            /* quantized only: group size, scales/biases dtype */
  int64_t rows, cols;
  bf16 *w;                  /* bits == 0: [rows, cols] */
  uint32_t *q;              /* bits != 0: [rows, cols*bits/32] */
  void *s, *b;              /* bits != 0: [rows, cols/group]; NULL for expert stacks (they keep sbp) */
  void *sbp;                /* expert stacks (bits != 0), tile layout: (scale, bias) pairs in dtype sb */
  int lay;                  /* expert stacks (bits != 0): DG_CUDA_LAY_TILES (q and sbp in the tile layout of
                               qmoe.cuh, qe_tiling) or DG_CUDA_LAY_LANES (q: lane records with the pairs
                               inside, qmoe_r.cuh; sbp NULL); bf16 expert stacks: DG_CUDA_LAY_TILES (w, the
                               plain [rows, cols]) or DG_CUDA_LAY_LANES (q: lane records of the bf16 weights,
                               qr_tile_pack with bits 16; w NULL) */
  void *wl;                 /* NULL, or (DGEMMA_WL=1, 4-bit g64 gate/up stacks with bf16 pairs, a device with wgmma)
                               the same stack in qmoe_wl.cuh's wl layout of 256-column slabs beside the lane
                               records: k_qe_gate_up's hybrid (qmoe_wl.cu) */
};
enum { DG_CUDA_LAY_TILES = 0, DG_CUDA_LAY_LANES = 1 };

/* The weights of a fused product (q|k|v, gate|up): the row blocks in order,
 * consecutive blocks of one format concatenated into one matrix (so an
 * all-bf16 or uniformly quantized set is one matrix, one product). */
struct dg_cuda_wset {
  int n;
  dg_cuda_w p[3];
};

/* Device copy of one layer (pointers into device memory): the device form of
 * the host's dg_layer (src/base/layer.h), with q|k|v and gate|up fused. */
struct dg_cuda_layer {
  int is_full, n_kv, head_dim, has_v;
  int64_t n_qkv;            /* NH*D + NKV*D (+ NKV*D when v exists): rows of wqkv */
  dg_cuda_wset wqkv;        /* [n_qkv, H]: q rows, k rows, v rows */
  dg_cuda_w wo;             /* [H, NH*D] */
  float *q_norm, *k_norm;   /* [D] */
  float *input_norm, *post_attn_norm, *pre_ff_norm, *post_ff1_norm, *pre_ff2_norm, *post_ff2_norm, *post_ff_norm;
  dg_cuda_wset w_gate_up;   /* [2I, H]: gate rows then up rows */
  dg_cuda_w w_down;         /* [H, I] */
  float *router;            /* [E, H] fp32 */
  float *router_scale;      /* [H] */
  float *per_expert_scale;  /* [E] */
  dg_cuda_w experts_gate_up; /* [E*2*IE, H] */
  dg_cuda_w experts_down;   /* [E*H, IE] */
  float layer_scalar_dec, layer_scalar_enc;
};

struct dg_cuda_model {
  dg_cuda_model_desc d;     /* dims (pointers in it are host pointers, not kept valid) */
  int device;
  dg_cuda_w embed;          /* [V, H] */
  float *final_norm, *sc_pre_norm;
  dg_cuda_wset sc_gate_up;  /* [2I, H] */
  dg_cuda_w sc_down;        /* [H, I] */
  float *inv_freq_sliding, *inv_freq_full;
  dg_cuda_layer *layers;    /* host array of device pointers */
  size_t bytes;             /* device bytes of the weights */
  int dmax, kvmax, qkvmax;  /* max D, max NKV*D, max n_qkv over layers */
};

/* Per-position statistics written by the sampler kernel; same layout as dg_pos_stats. */
struct dg_cuda_pos_stats {
  int32_t argmax, proposal;
  float entropy, max_prob;
};

/* Expert-grouping state of one MoE call (moe.cu). */
#define DG_ROUTE_GSC_INTS (32 + 256 + 16384)
struct dg_cuda_moe_buf {
  int32_t *topk_idx;   /* [T, K] */
  float *topk_w;       /* [T, K] */
  int32_t *count;      /* [E] */
  int32_t *start;      /* [E+1] */
  int32_t *pairs;      /* [T*K] (t*K + k) grouped by expert, tokens ascending */
  int32_t *slot_row;   /* [T*K] row in grouped order of pair t*K+k */
  int32_t *tiles;      /* [T*K/16 + E] (expert, row0) work list of the grouped product */
  int32_t *n_tiles;    /* [1] */
  int32_t *order;      /* [E] or NULL: the experts by descending count, ties by index (group_scan_kernel): the
                        * lane-record products take their blocks in this order (qmoe_r.cuh) */
  int32_t *done;       /* [1] blocks of route_kernel finished (moe.cu); 0 between launches (zeroed at allocation) */
  int32_t *gsc;        /* [DG_ROUTE_GSC_INTS] route_gr_kernel's generation, expert totals and (block, expert) counts
                        * (moe.cu; zeroed at allocation); NULL: DGEMMA_ROUTE=grid takes the tiles' path */
  /* The gate/up input's permuted copy xp and group sums xs (k_group_sums_perm) made inside route_gr_kernel, while its
   * blocks wait for the grouping, instead of in a launch of their own (moe.cu): the caller of k_router_route sets
   * gu_x (the rows [T, H]) and gu_group (G; 0: none, as k_qe_gate_up_group says); k_router_route sets gu_ready to
   * gu_x where its launch made them (else NULL), and k_qe_gate_up skips its own k_group_sums_perm for that input
   * and clears it. Host-side bookkeeping: the device reads only gu_x and gu_group. */
  const bf16 *gu_x;
  int gu_group;
  int fg_off;          /* host bookkeeping: DGEMMA_EXPERTS_FG's counters at done + fg_off (dg_moe_fg below; 0: none) */
  const bf16 *gu_ready;
  bf16 *h;             /* [T*K, IE] gelu(gate) * up per (token, expert); where hp_group > 0 in the down product's
                        * fragment order instead (its input copy made by the gate/up kernel, DGEMMA_DN_FUSE=1) */
  float *hs;           /* [T*K*IE/32] or NULL: the group sums of h's rows made by the gate/up kernel (qmoe.cu) */
  int hp_group;        /* host bookkeeping: G of the copy and sums the last gate/up product left in h and hs (0: none);
                        * k_qe_down uses them instead of its own k_group_sums_perm, and clears it */
  float *y;            /* [T*K, H] expert outputs in grouped order */
  float *xs;           /* [max(T*H, T*K*IE) / 32] per-group activation sums of the quantized products (qmoe.cu) */
  bf16 *xp;            /* [max(T*H, T*K*IE)] their input in fragment order (k_group_sums_perm, lane layout) */
  int32_t *wl_count;   /* [2 E] or NULL: DGEMMA_WL=1's count split at WL_MIN_ROWS (qmoe_wl.cu k_wl_split) */
};
/* DGEMMA_EXPERTS_FG=1's counters of b (3 + E ints, qmoe_fg.cuh qr_fg_kernel: the next ticket, the blocks finished,
 * the error flag, done[e]; zeroed at allocation, every launch leaves them zero) at done + fg_off, in the same
 * allocation (context.cu's buffer table: a row of their own); NULL where fg_off is 0: two launches whatever the
 * switch. (An offset in the struct's padding, not a pointer: the router's kernels take the struct by value, and
 * their PTX stays as it was.) */
static inline int32_t *dg_moe_fg(const dg_cuda_moe_buf *b) { return b->fg_off > 0 ? b->done + b->fg_off : NULL; }

/* Device scratch for the tensor-core kernel's key splits: n floats (a split
 * count that does not fit is lowered; part NULL: no splits). */
typedef struct dg_att_ws {
  float *part;
  size_t n;
  int ver[2]; /* the passes' attention versions (k_attention, k_attention_canvas) at head dims <= 256 and above: set
               * once per context by k_attention_choose (context.cu); the lab's and tests' own ws leave them 0 */
  int wq_why; /* k_attention_choose's reason (ATT_WHY_*, attention.cu), for the context's log line */
} dg_att_ws;
#define DG_ATT_VERSIONS 8 /* k_attention_any's versions 0..DG_ATT_VERSIONS, and DG_ATT_WQ (the lab's own 9-14:
                             dev/cuda/attention.cu) */
#define DG_ATT_WQ 15      /* k_attention_any's wgmma version (att_wq_kernel, attention_wq.cuh; sm_90a code only) */
#define DG_ATT_WQC 16     /* 15 with its key splits merged in a thread block cluster (att_wqc_kernel, attention_wqc.cuh;
                             sm_90a; DGEMMA_ATTN=16 only, session 29) */
#define DG_ATT_WQB 18     /* 16's kernel over a stack's canvases in one launch, each canvas its own split count
                             (k_attention_batch; one canvas: k_attention_any; DGEMMA_ATTN=18 only, session 29) */

/* The encoder chunk up to which the decoder's work buffers and the sliding layers' rings grow with it (session 28's
 * default chunk): a longer chunk's rows beyond them lie over the decoder-only buffers (context.cu ctx_layout) and
 * its sliding layers attend in calls of at most this many rows (passes.cu layer_segs). */
#define DG_RING_CHUNK 256

/* The most streams DGEMMA_SEG_STREAMS may name (dg_cuda_ctx.segs). */
#define DG_SEG_STREAMS_MAX 8

struct dg_cuda_ctx {
  dg_cuda_model *m;
  cudaStream_t stream;
  cublasHandle_t blas;
  int32_t cap, S;           /* cache capacity (positions) and the slots of a full layer (cap + C) */
  int32_t S_ring;           /* the slots of a sliding layer: a ring (position p in slot p % S_ring), min(S,
                             * window - 1 + ring_rows in tiles of 64) */
  int32_t tmax;             /* rows of a decoder pass (its view of the work buffers: max(C, rows, the encoder chunk
                             * up to DG_RING_CHUNK)) */
  int32_t enc_rows;         /* rows of an encoder pass (max(tmax, enc_chunk)); > tmax: the encoder's view of the
                             * work buffers lies over P's head and the logits (context.cu ctx_rows_view) */
  int32_t ring_rows;        /* rows of one sliding-layer attention call of the encoder (max(C, the chunk up to
                             * DG_RING_CHUNK)): the rings hold the window before them and them (passes.cu) */
  int32_t enc_chunk;        /* tokens per encoder pass (<= enc_rows; dg_cuda_enc_chunk when the context was made) */
  int32_t hi;               /* 1 + the highest position whose K/V a pass has written since the last pass at position
                             * 0 (dg_cuda_truncate_check: what a ring may have overwritten) */
  int32_t lo;               /* the first position the sliding layers hold (0; dg_cuda_ctx_copy: the first it copied);
                             * back to 0 with the next pass at position 0 */
  bf16 **kc, **vc;          /* [L] -> [NKV, S or S_ring, D] */
  int32_t *ids;             /* [tmax] */
  float *x;                 /* [T, H] residual stream, fp32 */
  float *f1;                /* [T, max(H, ...)] fp32 GEMM output (o proj, down proj) */
  float *dense;             /* [T, H] dense branch output */
  bf16 *a;                  /* [T, H] normed activations for the next product */
  bf16 *xe;                 /* [T, H] expert input pre_ff2(r) */
  float *u;                 /* [T, H] router input */
  float *qkv;               /* [T, qkvmax] */
  float *q;                 /* [T, NH, Dmax] */
  bf16 *att;                /* [T, NH*Dmax] */
  dg_att_ws att_ws;         /* attention key-split partials */
  float *gu;                /* [T, 2I] */
  bf16 *h;                  /* [T, I] */
  float *rlog;              /* [T, E] router logits */
  dg_cuda_moe_buf moe;
  float *logits;            /* [C, V] softcapped logits, then z = logits / T (the default chain); DGEMMA_VOCAB=fused
                               and zstore: see lg */
  /* What c->logits holds for the sampler (passes.cu, the fused chain of kernels.cu): lg_virt = 0: the softcapped
   * logits or z itself; lg_virt = 1: x whose z = vz(x, lg_cap, lg_T) (softcap still to apply where lg_cap > 0,
   * the division by the step's temperature where lg_T != 1) was not stored, or (lg_cap DG_VZ_STORED, zstore) z
   * itself as the statistics' pass 1 stored it; lg_parts: what c->vws holds for that z (k_vocab_sc's have). */
  int lg_virt, lg_parts;
  float lg_cap, lg_T;
  int lg_dead;              /* c->logits overwritten by P written in place (1: dg_cuda_soft_from_z with sc_group >
                               0) or by an encoder pass's rows (2: enc_rows > tmax, ctx_rows_view): nothing may read
                               them until a pass writes them again (logits_written clears it) */
  /* [C, V] self-conditioning probabilities of the reference path (soft_from_v). sc_group 0 (DGEMMA_SC_INPLACE=0):
   * a buffer of their own, made in one launch group. sc_group G > 0 (the default, G = C / 8): P's first G rows
   * in a buffer of their own that ends where c->logits begins, rows G.. in the logits' own bytes (P row c at
   * c->logits + (c - G) V bf16 values), made in groups of G rows in order: group c0's rows land in the logits rows
   * [0, c0) of the groups already read (the end of P row c <= c0 4V bytes for c in [c0, c0 + G), c0 >= G), so one
   * [C, V] matrix with leading dimension V as before, 112 MiB less at the 26B's C 256, V 262,144 (context.cu). The
   * turbo engine's rows use c->tb->P (turbo_host.cu): its exact rows made ahead may be made again from the logits. */
  bf16 *P;
  int sc_group;
  float *soft;              /* [C, H] soft embedding */
  int have_soft;
  int debug_sync;           /* DGEMMA_CUDA_SYNC=1: synchronise after every kernel (CKK) */
  float *uni;               /* [C] uniforms (replay) */
  dg_cuda_pos_stats *stats; /* [C] */
  int32_t *bad;             /* [1] first non-finite position or INT32_MAX */
  void *vws;                /* k_vocab_ws_bytes(C, V): per-chunk partials of k_step_stats / k_sc_probs */
  void *blas_ws;            /* cuBLAS's workspace (cublasSetWorkspace; context.cu) */
  float *rws;               /* [DG_ROUTER_MAX_SPLITS, T, E] split sums of the router logits */
  dg_cuda_pos_stats *h_stats; /* pinned host [C] */
  int32_t *h_bad;             /* pinned host [1] */
  struct dg_cuda_turbo *tb;   /* turbo engine buffers (turbo_host.cu), allocated on first use */
  struct dg_cuda_prof *prof;  /* stage timing (dg_cuda_profile), NULL when off */
  struct dg_cuda_prof *prof_stack; /* while prof is on: the stacked passes this context led (dg_cuda_compact_batch:
                                    * the first profiled canvas of a stack), recorded on the work context's stream;
                                    * allocated by the first such pass, freed with prof */
  struct dg_cuda_graphs *graphs; /* the passes' CUDA graphs (graph.cu; DGEMMA_GRAPHS=0: off) */
  struct dg_gemm_pins *pins;     /* cublasLt algorithms pinned for some dense products (gemm_pin.cu; NULL: none) */
  struct dg_gemm_inv *inv;       /* DGEMMA_STACK_DENSE=inv: the batch-invariant algorithms of every dense product
                                  * (gemm_inv.cu; NULL: off, or the emulation) */
  int32_t n_allocs[2];          /* the device and pinned host allocations this context made (context.cu: one block
                                 * each; the turbo engine's buffers and cuBLAS's, graphs' and pins' own not counted) */
  int32_t norm_next, norm_rows; /* layer norm_next's input norm of norm_rows rows is in a already (written by the
                                 * combine of the layer before it, k_ffn_combine_norm; -1: none) */
  /* DGEMMA_BRANCH (on by default; passes.cu, layer_segs): each layer's dense MLP on a second stream, concurrent with its router,
   * grouping and experts on `stream`, forked after the attention residual and joined before the combine. Made with
   * the context where the switch is on when it is made (on 0: none of it, every pass sequential). */
  struct dg_cuda_side {
    int on;                /* the context was made with the branches on (the default, or dg_cuda_branch_set(1)) */
    cudaStream_t stream;   /* non-blocking; has work only between a layer's fork and join */
    cublasHandle_t blas;   /* bound to stream, with workspace ws of blas_ws's size (the same algorithms as blas) */
    void *ws;              /* its own: two products running at once never share a workspace */
    cudaEvent_t fork, join; /* recorded on stream / side.stream, waited on by the other (no timing) */
    int64_t forks;         /* layers issued with the fork (host count, for the tests; a graph replay adds none) */
  } side;
  /* DGEMMA_SEG_STREAMS=N (off by default; issue 14; passes.cu seg_fork / seg_to / seg_join): a stacked pass's
   * per-canvas products (q/k/v with its rope and K/V scatter, o-proj, the dense and self-conditioning MLPs, the LM
   * heads) issued on up to N streams, canvas g on stream g % N, forked from the issuing stream (c->stream, or the
   * side's for the dense MLP) and joined into it before the next stage that reads all rows. Stream 0 is the issuing
   * stream itself (its own cuBLAS workspace); streams 1..n-1, their workspaces and the stack's LM-head rows are made
   * by seg_ready (context.cu) before the first stacked pass of a context made with N > 1 (the batch's work context),
   * so that a single-sequence context holds none of it. */
  struct dg_cuda_segs {
    int want;                                /* N when the context was made (dg_cuda_seg_streams; 1: off) */
    int n;                                   /* streams ready (0: seg_ready not run yet) */
    cudaStream_t stream[DG_SEG_STREAMS_MAX]; /* [0] unused (the issuing stream); [1, n) non-blocking, ours */
    cudaEvent_t fork, join[DG_SEG_STREAMS_MAX]; /* no timing */
    void *blk;                               /* one cudaMalloc: n - 1 workspaces of ws_bytes, then rows */
    void *ws[DG_SEG_STREAMS_MAX];            /* [k] stream k's cuBLAS workspace ([0] unused) */
    size_t ws_bytes;                         /* each: the context's whole workspace (the most an issuing stream has) */
    int32_t *rows;                           /* [tmax] a stack's LM-head rows, each canvas's at its own offset */
    /* the fork being issued (seg_fork .. seg_join): the issuing stream, its workspace and that workspace's bytes
     * (what cuBLAS is told on every stream, so that it chooses the algorithms it chooses on the issuing one) */
    cudaStream_t base;
    void *base_ws;
    size_t base_ws_bytes;
    int used;                                /* streams of the fork that got work (<= n) */
    int64_t forks;                           /* forks issued (host count, for the tests) */
  } segs;
};

/* ---- kernel launchers (kernels.cu); all asynchronous on `s` ---- */
/* x[t] = E[ids[t]] * scale (fp32; a quantized E is dequantized, quant.cu). */
cudaError_t k_embed(cudaStream_t s, float *x, const dg_cuda_w *E, const int32_t *ids, int T, int H, float scale);
/* y = x * rms(x)^-1 * w (w may be NULL); writes fp32 yf and/or bf16 yb (either may be NULL). */
cudaError_t k_rmsnorm(cudaStream_t s, const float *x, const float *w, float *yf, bf16 *yb, int T, int H, float eps);
/* x += rms(o) * w_post; then a = bf16(rms(x) * w_ff), xe = bf16(rms(x) * w_ff2), u = rms(x) * rscale * root */
cudaError_t k_attn_residual(cudaStream_t s, float *x, const float *o, const float *w_post, const float *w_ff,
                            const float *w_ff2, const float *rscale, float root, bf16 *a, bf16 *xe, float *u, int T,
                            int H, float eps);
cudaError_t k_geglu(cudaStream_t s, const float *gu, bf16 *h, int T, int I);
cudaError_t k_add(cudaStream_t s, float *x, const float *y, size_t n);
/* q/k norms, rope at positions pos0+t, v = rms_noweight(v_raw); K/V into the cache slots (pos0+t) % S. */
cudaError_t k_qkv_post(cudaStream_t s, const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc, int S,
                       const float *q_norm, const float *k_norm, const float *inv_freq, int T, int NH, int NKV, int D,
                       int has_v, int32_t pos0, float eps);
/* The same at scattered absolute positions tpos[T] (device array): rope angle and cache slot tpos[t]
 * (the compacted decoder's forward set, spec 7.4; duplicates write identical values). */
cudaError_t k_qkv_post_at(cudaStream_t s, const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc, int S,
                          const float *q_norm, const float *k_norm, const float *inv_freq, int T, int NH, int NKV,
                          int D, int has_v, const int32_t *tpos, float eps);
/* Versions of the row launchers above for dev/cuda/step_kernels.cu: 0 the backend's (what the unversioned
 * launcher runs), 1 the earlier kernel, 2 (k_rmsnorm_v only) the register kernel at 128 threads per row. */
cudaError_t k_rmsnorm_v(cudaStream_t s, int version, const float *x, const float *w, float *yf, bf16 *yb, int T, int H,
                        float eps);
cudaError_t k_attn_residual_v(cudaStream_t s, int version, float *x, const float *o, const float *w_post,
                              const float *w_ff, const float *w_ff2, const float *rscale, float root, bf16 *a, bf16 *xe,
                              float *u, int T, int H, float eps);
cudaError_t k_geglu_v(cudaStream_t s, int version, const float *gu, bf16 *h, int T, int I);
cudaError_t k_qkv_post_v(cudaStream_t s, int version, const float *qkv, int64_t ld, float *q, bf16 *kc, bf16 *vc,
                         int S, const float *q_norm, const float *k_norm, const float *inv_freq, int T, int NH, int NKV,
                         int D, int has_v, int32_t pos0, const int32_t *tpos, float eps);
cudaError_t k_ffn_combine_v(cudaStream_t s, int version, float *x, const float *dense, const float *y,
                            const int32_t *slot_row, const int32_t *topk_idx, const float *topk_w, const float *w_ff1,
                            const float *w_ff2, const float *w_ff, float scalar, int T, int H, int K, float eps);
/* k_ffn_combine and then the next layer's input norm of the new x, a_next bf16 [T, H] = rmsnorm(x) w_next (what
 * k_rmsnorm(x, w_next, NULL, a_next) writes, bit for bit), in one launch where both take their register-row kernels
 * (*fused = 1); else k_ffn_combine alone (*fused = 0: the caller runs the norm). Saves a launch and a read of x per
 * layer (issue 12). */
cudaError_t k_ffn_combine_norm(cudaStream_t s, float *x, const float *dense, const float *y, const int32_t *slot_row,
                               const int32_t *topk_idx, const float *topk_w, const float *w_ff1, const float *w_ff2,
                               const float *w_ff, float scalar, int T, int H, int K, float eps, const float *w_next,
                               bf16 *a_next, int *fused);
/* k_ffn_combine_norm in a given version: 0 the default's kernel; 2 the same with the next norm's weight loaded at
 * the start (ffn_combine_row_kernel's PRE, kernels.cu; DGEMMA_COMBINE=pre makes it k_ffn_combine_norm's): every
 * output word the same. */
cudaError_t k_ffn_combine_norm_v(cudaStream_t s, int version, float *x, const float *dense, const float *y,
                                 const int32_t *slot_row, const int32_t *topk_idx, const float *topk_w,
                                 const float *w_ff1, const float *w_ff2, const float *w_ff, float scalar, int T, int H,
                                 int K, float eps, const float *w_next, bf16 *a_next, int *fused);

/* ---- attention (attention.cu) ---- */
/* Attention of nq query rows q fp32 [nq, NH, D] over the cache kc, vc bf16
 * [NKV, S, D] into out bf16 [nq, NH, D] (spec 4.4 step 3, masks 4.5).
 * causal = 1 (encoder): row t at position pos0 + t sees keys
 * [lo, pos0 + t + 1); causal = 0 (decoder): every row sees [lo, kv_hi); lo = 0
 * on full layers, else the window's start. version 0: the tensor-core kernel
 * where k_attention_flash_ok (D in 64, 128, 256, 512), else the warp-per-row
 * kernel; 1: the warp-per-row kernel; 2: the tensor-core kernel; 3..DG_ATT_VERSIONS:
 * its other versions (as the lab dev/cuda/attention.cu numbers them; 6 is the
 * passes' default without sm_90a code); DG_ATT_WQ (15): att_wq_kernel with Q K^T
 * and P V on wgmma (the passes' default on Hopper with sm_90a code; at D 64 it is
 * version 6; the caller checks the device runs wgmma, cuda_wg_available, else it
 * traps); DG_ATT_WQC (16), DG_ATT_WQB (18): att_wqc_kernel (attention_wqc.cuh: 15's
 * block, the key splits merged in a thread block cluster; 18 through its batch instance, so that a canvas's words
 * are the same alone and in k_attention_batch; D 64 as 6, wgmma as for 15) (cudaErrorInvalidValue where one cannot
 * run or for another version, the lab's own 9-14 and 17 included). */
cudaError_t k_attention_any(cudaStream_t s, const dg_att_ws *ws, int version, const float *q, const bf16 *kc,
                            const bf16 *vc, bf16 *out, int S, int nq, int NH, int NKV, int D, int32_t pos0, int kv_hi,
                            int causal, int is_full, int window);
int k_attention_flash_ok(int D, int NH, int NKV);
/* Whether the current device runs this build's wgmma (sm_90a) code: a probe kernel, once per process and device
 * (qmoe_wl.cu; not inside a stream capture). */
int cuda_wg_available(void);
/* ws->ver[0], ws->ver[1] (the passes' versions at head dims <= 256 and wider) and ws->wq_why from DGEMMA_ATTN and the
 * device: called once per context (dg_cuda_ctx_new) on its device; the rule: attention.cu above attn_choose. */
void k_attention_choose(dg_att_ws *ws);
/* One line naming ws's versions and why (k_attention_choose's choice) into buf of n bytes (the context's log). */
void k_attention_describe(const dg_att_ws *ws, char *buf, size_t n);
/* Decoder attention of nq query rows over the cache slots [lo, pos0 + C): the
 * prefix and the whole canvas of C slots (spec 7.4: the canvas K/V buffer). */
cudaError_t k_attention_canvas(cudaStream_t s, const dg_att_ws *ws, const float *q, const bf16 *kc, const bf16 *vc,
                               bf16 *out, int S, int nq, int NH, int NKV, int D, int32_t pos0, int C, int is_full,
                               int window);
/* The decoder attention of nb canvases (a stacked pass's segments, dg_cuda_seg) in one launch of version 18
 * (DG_ATT_WQB, att_wqc_kernel over up to WQC_MAXB canvases at a time): canvas i's nq[i] rows of q[i] over its own cache
 * kc[i], vc[i] of S[i] slots, keys [lo, kv_hi[i]) (lo: 0 on full layers, pos0[i] - (window - 1) on sliding ones),
 * into out[i]; each canvas's words are those of k_attention_any(18) on it alone. The same NH, NKV, D (128, 256 or
 * 512) and layer kind for all; cudaErrorInvalidValue otherwise or where wgmma does not run (the caller checks, as
 * for 15). */
cudaError_t k_attention_batch(cudaStream_t s, int nb, const float *const *q, const bf16 *const *kc,
                              const bf16 *const *vc, bf16 *const *out, const int32_t *S, const int32_t *nq,
                              const int32_t *pos0, const int32_t *kv_hi, int NH, int NKV, int D, int is_full,
                              int window);
/* Whether the passes' attention for head dim D runs stacked canvases in one launch (k_attention_batch: the context's
 * version there is 18 and the shape is one att_wqc_kernel takes). */
int k_attention_batched(const dg_att_ws *ws, int D, int NH, int NKV);
/* causal = 1: encoder masks; 0: decoder (all of [lo, pos0 + T)). */
cudaError_t k_attention(cudaStream_t s, const dg_att_ws *ws, const float *q, const bf16 *kc, const bf16 *vc, bf16 *out,
                        int S, int T, int NH, int NKV, int D, int32_t pos0, int causal, int is_full, int window);
/* x = (x + post_ff(post_ff1(dense) + post_ff2(sum_k w y))) * scalar */
cudaError_t k_ffn_combine(cudaStream_t s, float *x, const float *dense, const float *y, const int32_t *slot_row,
                          const int32_t *topk_idx, const float *topk_w, const float *w_ff1, const float *w_ff2,
                          const float *w_ff, float scalar, int T, int H, int K, float eps);
cudaError_t k_softcap(cudaStream_t s, float *x, size_t n, float cap);
/* Bytes of the workspace of k_step_stats and k_sc_probs: one partial per (position, chunk of 8192 logits). */
extern "C" size_t k_vocab_ws_bytes(int C, int V);
/* The self-conditioning chunk maxima m and sums sum of a host copy ws of that workspace, [C x chunks]: the chain's
 * (fused 0) or the fused chain's (1). Tests only. */
extern "C" void k_vocab_sc_parts(const void *ws, int C, int V, int fused, float *m, double *sum);
/* Sampler statistics of C rows of V logits (dg_cuda_step_stats): z = logits / T in place, then out[c]; a
 * non-finite z sets *bad = min(*bad, c). ws: k_vocab_ws_bytes(C, V) bytes. */
cudaError_t k_step_stats(cudaStream_t s, float *logits, int C, int V, float temperature, int mode, uint64_t seed,
                         uint32_t block, uint32_t step, const float *uni, dg_cuda_pos_stats *out, int32_t *bad,
                         void *ws);
/* P [C, V] bf16 = cast(softmax(cast(z))) (spec 5, 4.9). ws: k_vocab_ws_bytes(C, V) bytes. */
cudaError_t k_sc_probs(cudaStream_t s, const float *z, bf16 *P, int C, int V, int act_dtype, void *ws);
/* The same with the chunk passes launched over groups of `group` positions (0: all), for the lab. */
cudaError_t k_step_stats_g(cudaStream_t s, float *logits, int C, int V, float temperature, int mode, uint64_t seed,
                           uint32_t block, uint32_t step, const float *uni, dg_cuda_pos_stats *out, int32_t *bad,
                           void *ws, int group);
cudaError_t k_sc_probs_g(cudaStream_t s, const float *z, bf16 *P, int C, int V, int act_dtype, void *ws, int group);
/* The fused chain (kernels.cu, issue 14): the same outputs bit for bit from logits x left unchanged, z = vz(x) =
 * (cap > 0 ? tanhf(x / cap) * cap : x) / T recomputed in registers (softcap_kernel's and the division's fp32
 * operations); fewer passes. k_vocab_stats: k_step_stats's out and *bad, plus the self-conditioning probabilities'
 * chunk maxima (and with sampled proposals their sums) in ws for k_vocab_sc; store 0: logits unchanged; store 1
 * (DGEMMA_VOCAB=zstore): pass 1 also writes z in place (the chain's z bit for bit), and the passes after it take
 * those values as they are (cap DG_VZ_STORED). k_vocab_sc: k_sc_probs's P of that z; have: what ws holds for the
 * same logits, cap, T and act (0 nothing, 1 the maxima: after argmax proposals, 2 the sums too: after sampled
 * ones); after k_vocab_stats with store 1: cap DG_VZ_STORED, T 1. k_vocab_z: x = vz(x) in place. */
#define DG_VZ_STORED (-1.0f) /* vz's cap for logits that already hold z (stored by a pass 1): z = x, no operation */
cudaError_t k_vocab_stats(cudaStream_t s, const float *logits, int C, int V, float cap, float T, int act, int mode,
                          uint64_t seed, uint32_t block, uint32_t step, const float *uni, dg_cuda_pos_stats *out,
                          int32_t *bad, void *ws, int store);
cudaError_t k_vocab_sc(cudaStream_t s, const float *logits, bf16 *P, int C, int V, float cap, float T, int act,
                       void *ws, int have);
cudaError_t k_vocab_z(cudaStream_t s, float *x, size_t n, float cap, float T);
/* For the lab: group as k_step_stats_g's; store as k_vocab_stats's. */
cudaError_t k_vocab_stats_g(cudaStream_t s, float *logits, int C, int V, float cap, float T, int act, int mode,
                            uint64_t seed, uint32_t block, uint32_t step, const float *uni, dg_cuda_pos_stats *out,
                            int32_t *bad, void *ws, int group, int store);
cudaError_t k_vocab_sc_g(cudaStream_t s, const float *logits, bf16 *P, int C, int V, float cap, float T, int act,
                         void *ws, int have, int group);

/* ---- turbo engine (turbo.cu; spec 7) ---- */
/* dst[r] = src[rows[r]] for r < n, rows of H floats. */
cudaError_t k_gather_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows, int n, int H);
/* dst[rows[r]] = src[r] for r < n (rows distinct or carrying identical values). */
cudaError_t k_scatter_rows(cudaStream_t s, float *dst, const float *src, const int32_t *rows, int n, int H);
/* Hierarchical exact top-K of each of n rows of raw [n, V] (spec 7.3), see turbo.cu. */
cudaError_t k_topk_hier(cudaStream_t s, const float *raw, int n, int V, int K, float *cv, int32_t *ci, float *candv,
                        int32_t *candi, float *val, int32_t *idx, int32_t *bad);
/* P[r] = bf16(cast(softmax(cast(z)))) with z = softcap(raw[r]) / T (spec 5, 4.9, 7.3). */
cudaError_t k_turbo_sc_probs(cudaStream_t s, const float *raw, bf16 *P, int n, int V, float cap, float T, int act);
/* soft[rows[r]] = scale * sum_k p[r, k] E[idx[r, k]] (the top-K self-conditioning signal, spec 7.3). */
cudaError_t k_turbo_sc_topk(cudaStream_t s, const float *p, const int32_t *idx, const int32_t *rows, const bf16 *E,
                            float *soft, int n, int K, int H, float scale);

/* ---- MoE (moe.cu) ---- */
/* Router logits rlog [T, E] = u [T, H] . W [E, H]^T in fp32 (spec 4.6 step 2), split over H in a fixed order
 * (moe.cu). ws: DG_ROUTER_MAX_SPLITS * T * E floats. */
#define DG_ROUTER_MAX_SPLITS 16
cudaError_t k_router_logits(cudaStream_t s, const float *u, const float *W, float *rlog, int T, int E, int H,
                            float *ws);
/* The first half of k_route: softmax (in place over rlog), top-K and weights (no grouping). */
cudaError_t k_route_topk(cudaStream_t s, float *rlog, const float *per_expert_scale, dg_cuda_moe_buf *b, int T, int E,
                         int K);
/* Router softmax (in place over rlog), top-k (ties to the lower expert), renormalisation and per-expert scale
 * (spec 4.6), then grouping of the (token, slot) pairs by expert. mode 0: k_route_topk then k_group; 1: one launch
 * (route_kernel, b->done set up) up to 4,096 pairs; 2: route_tk_kernel (k_route_tiles with the logits as one split,
 * b->done set up) where k_route_tiles covers the shape; 3: route_gr_kernel (k_route_grid, b->done and b->gsc set up;
 * where it does not cover the shape, mode 2, then 0); -1: the library's default (3 since session 14, 2 before;
 * DGEMMA_ROUTE=chain makes it 0, DGEMMA_ROUTE=fused 1, DGEMMA_ROUTE=tiles 2, DGEMMA_ROUTE=grid 3). Every mode gives the same results word for word; a shape a mode does not cover takes
 * mode 0. E <= 256, K <= 32. */
cudaError_t k_route(cudaStream_t s, float *rlog, const float *per_expert_scale, dg_cuda_moe_buf *b, int T, int E,
                    int K, int mode);
/* k_router_logits then k_route; mode 1: the split sums of the logits added inside route_kernel, two launches;
 * mode 2: k_router_tiles_product then k_route_tiles, two launches (H % 4 == 0 and a shape k_route_tiles covers,
 * k_router_tiles_ok; else mode 0); mode 3: k_router_tiles_product then k_route_grid (k_router_grid_ok, b->gsc; else
 * mode 2); mode 4 (DGEMMA_ROUTE=deep, session 22; not the default): mode 3 with router_tile_deep_kernel (every stage of
 * a split in flight at once) and route_gr_kernel's gate/up copy loading each group before storing it (where mode 3
 * covers the shape, else mode 2); mode 5 (DGEMMA_ROUTE=one, session 29; not the default): k_router_one, the stage
 * in one launch (where it covers the shape, else mode 3); mode 6 (DGEMMA_ROUTE=gridp, session 29; not the default):
 * mode 3 with route_gr_kernel's copy loading first, its placement in one trip and the last block's copy after its
 * placement (where mode 3 covers the shape, else mode 2); rlog and the groupings bit for bit those of the separate
 * calls. */
cudaError_t k_router_route(cudaStream_t s, const float *u, const float *W, float *rlog, const float *per_expert_scale,
                           dg_cuda_moe_buf *b, int T, int E, int H, int K, float *ws, int mode);
/* DGEMMA_ROUTE=tiles's two launches (moe.cu): the split sums ws [S][T][E] of router_part_kernel's splits (S set
 * to their count; H % 4 == 0, u and W 16-byte aligned), then from them rlog (the probabilities), the choices,
 * weights and the grouping by expert (route_tk_kernel: a warp per token, the last block groups; up to 4,096 pairs;
 * part may be rlog itself when S = 1). k_router_tiles_ok: whether k_router_route's mode 2 covers the shape. */
int k_router_tiles_ok(int T, int E, int H, int K);
cudaError_t k_router_tiles_product(cudaStream_t s, const float *u, const float *W, float *ws, int T, int E, int H,
                                   int *S);
/* The same product in a given version: 0 router_tile_kernel (3 stages of 16 k in flight); 4 router_tile_deep_kernel
 * (11 of a 26B split's 11 in flight, 96 KB of dynamic shared memory): every split sum the same word. */
cudaError_t k_router_tiles_product_v(cudaStream_t s, int version, const float *u, const float *W, float *ws, int T,
                                     int E, int H, int *S);
cudaError_t k_route_tiles(cudaStream_t s, const float *part, int S, float *rlog, const float *per_expert_scale,
                          dg_cuda_moe_buf *b, int T, int E, int K);
/* G of the permuted copy k_qe_gate_up makes of its input for the stack W (lane records), 0 where it makes none
 * (qmoe.cu): what the caller of k_router_route sets in b->gu_group. */
int k_qe_gate_up_group(const dg_cuda_w *W);
/* DGEMMA_ROUTE=grid (mode 3, the default since session 14; moe.cu): route_tk_kernel's routing with the grouping
 * spread over every block (route_gr_kernel: each block counts and places its own pairs; the last block to finish
 * scans the experts' totals; a grid-wide wait, launched only where the grid is resident at once). Returns
 * cudaErrorInvalidValue, launching nothing, where it does not cover the shape (b->gsc NULL, more (block, expert)
 * counts than its table, a grid not resident at once). k_router_grid_ok: whether k_router_route's mode 3 covers it. */
int k_router_grid_ok(int T, int E, int H, int K);
cudaError_t k_route_grid(cudaStream_t s, const float *part, int S, float *rlog, const float *per_expert_scale,
                         dg_cuda_moe_buf *b, int T, int E, int K);
/* DGEMMA_ROUTE=one (mode 5, session 29; not the default; moe.cu): the whole router stage, mode 3's words, in one
 * launch (router_one_kernel: router_tile_kernel's product on its grid into ws [S][T][E], each token tile's blocks
 * waiting for one another, then route_gr_kernel's routing, grouping and gate/up input copy spread over the same
 * blocks). Returns cudaErrorInvalidValue, launching nothing, where it does not cover the shape (k_router_one_ok: H %
 * 4 == 0, T <= 1,984, (route slots x E) <= 16,384, i.e. T <= 256 at 128 experts, the grid resident at once; u, W
 * not 16-byte aligned; b->gsc or b->done NULL). Sets b->gu_ready as mode 3 does. */
int k_router_one_ok(int T, int E, int H, int K);
cudaError_t k_router_one(cudaStream_t s, const float *u, const float *W, float *ws, float *rlog,
                         const float *per_expert_scale, dg_cuda_moe_buf *b, int T, int E, int H, int K);
/* Grouping of given top-k expert ids b->topk_idx [T, K] by expert and the
 * tile work list (the second half of k_route). */
cudaError_t k_group(cudaStream_t s, dg_cuda_moe_buf *b, int T, int E, int K);
/* The expert product behind one function, so that a quantized variant can
 * replace it: y[row] = down_e(gelu(G_e xe[tok]) * U_e xe[tok]) for every
 * grouped row (spec 4.6 step 4). The launch grid is the worst case of the
 * work list (T*K/32 + E tiles); surplus blocks exit at once. */
cudaError_t dg_cuda_experts(cudaStream_t s, const dg_cuda_layer *l, const bf16 *xe, dg_cuda_moe_buf *b, int T, int H,
                            int IE, int E, int K);
/* dg_cuda_experts with the quantized kernels' tile count nt (1-5, 8: 8 nt tokens per pass over an expert's
 * weights; 0: the choice by rows per expert, qe_nt) and dq_from (the tile count from which the DQ body runs, as
 * DGEMMA_QR_DQ; 0 never, -1 the environment's): the tests' way to reach every body (tests/support/cuda_entry.cu).
 * Not thread-safe against other expert calls of the process (dq_from is process-wide while it runs). */
void qr_dq_set(int n); /* qmoe.cu (declared with qr_dq_from in qmoe_r.cuh) */
cudaError_t dg_cuda_experts_nt(cudaStream_t s, const dg_cuda_layer *l, const bf16 *xe, dg_cuda_moe_buf *b, int T,
                               int H, int IE, int E, int K, int nt, int dq_from);

/* ---- MLX affine-quantized weights (quant.cu) ---- */
/* Rows of the expert work list per tile (moe.cu builds the list with it; the
 * quantized expert kernels take the same tiles). */
#define DG_MOE_TM 32
/* y[t*ldy + n] = sum_k x[t*ldx + k] * W[row0 + n, k], t < T, n < N; x bf16,
 * W quantized, dequantized in fp32 and accumulated in fp32. */
cudaError_t k_qmatmul(cudaStream_t s, const bf16 *x, int ldx, int T, const dg_cuda_w *W, int64_t row0, int N, float *y,
                      int ldy);
/* soft[c*H + h] = alpha * sum_v P[c*V + v] * E[v, h], c < C (spec 5), E quantized [V, H]. */
cudaError_t k_qsoft(cudaStream_t s, const bf16 *P, int C, const dg_cuda_w *E, float alpha, float *soft);
/* Embedding rows of a quantized E: x[t*H + j] = dequant(E[ids[t], j]) * scale. */
cudaError_t k_qembed(cudaStream_t s, float *x, const dg_cuda_w *E, const int32_t *ids, int T, float scale);
/* The grouped expert products of dg_cuda_experts for a quantized stack:
 * gate/up (h = bf16(gelu(G x) * U x)) and down (y = D h). Grids: tiles of the
 * work list x column tiles; surplus tiles exit at once. */
cudaError_t k_qexperts_gate_up(cudaStream_t s, const dg_cuda_w *W, const bf16 *xe, dg_cuda_moe_buf *b, int T, int H,
                               int IE, int E, int K);
cudaError_t k_qexperts_down(cudaStream_t s, const dg_cuda_w *W, dg_cuda_moe_buf *b, int T, int H, int IE, int E, int K);

/* One grouped expert product of dg_cuda_experts for a plain bf16 stack W->w
 * (the WMMA grouped_kernel of moe.cu, bf16 stacks whose columns are not a
 * multiple of 64): gateup: h = bf16(gelu(G x) U x) over x = xe [T, H]; else
 * y = D h over x = b->h [T * K, IE]; over the work list of k_group (b->tiles). */
cudaError_t k_bexperts(cudaStream_t s, int gateup, const dg_cuda_w *W, const bf16 *x, dg_cuda_moe_buf *b, int T, int H,
                       int IE, int E, int K);

/* ---- quantized experts on tensor cores (qmoe.cu) ---- */
/* The gathered MoE products over a quantized expert stack, or a bf16 one in
 * lane records (W->bits 0, qr_kernel's BITS 16) (W->lay: lane
 * records, qr_kernel of qmoe_r.cuh, or the tile layout with the pairs in
 * W->sbp, qe_kernel of qmoe.cuh): gate/up h[row] = bf16(gelu(G_e x) U_e x)
 * over xe [T, H] and down y[row] = D_e h[row], for every grouped row of the
 * work of k_group (count, start, pairs). Each first writes the group sums of
 * its input into b->xs (of xe for gate/up, of b->h [T*K, IE] for down; the
 * lane layout also its permuted copy into b->xp, k_group_sums_perm). Grid:
 * E x row slabs; experts without rows exit at once. nt: tokens per pass / 8
 * (1, 2, 3, 4 or 8; <= 0: qe_nt(T, K, E)). */
cudaError_t k_qe_gate_up(cudaStream_t s, const dg_cuda_w *W, const bf16 *xe, dg_cuda_moe_buf *b, int T, int H, int IE,
                         int E, int K, int nt);
cudaError_t k_qe_down(cudaStream_t s, const dg_cuda_w *W, dg_cuda_moe_buf *b, int T, int H, int IE, int E, int K,
                      int nt);
/* With DGEMMA_DN_FUSE=1 (not the default until measured on a GPU; qr_dn_fuse_set(1 / 0) forces it on / off, -1 gives
 * the environment's choice back: the tests): the group G of the down product's input copy that k_qe_gate_up makes
 * in qr_kernel's epilogue (b->h in k_group_sums_perm's fragment order, its group sums into b->hs; qr_store_hp,
 * qmoe_r.cuh, qr_kernel's GATEUP QR_GATEUP_HP), so that k_qe_down launches no copy of its own: where both stacks are
 * lane records, b->hs is set, IE is a multiple of the gate/up block's 16 QR_WARPS features, G (the down stack's
 * group; bf16: QR_BF16_GROUP) is 32 or 64 (whole groups in a block's features; b->hs holds IE / 32 sums per row),
 * the gate/up stack has the same group, and DGEMMA_QR_DQ is off (the kernels with that epilogue are compiled for
 * these cases only); else 0. The caller sets b->hp_group to it before k_qe_gate_up (dg_cuda_experts); the down
 * product's inputs are word for word those of the separate copy (test_experts_dn_fuse). */
int k_qe_dn_fuse_group(const dg_cuda_w *gu, const dg_cuda_w *dn, int IE, const dg_cuda_moe_buf *b);
void qr_dn_fuse_set(int on);
/* With DGEMMA_EXPERTS_FG=1 (read once, at the first MoE layer; not the default until timed on a GPU:
 * dev/gpu/s26_fgb.sh; qr_experts_fg_set(1 / 0) forces it on / off, -1 gives the environment's choice back: the
 * tests) dg_cuda_experts runs gate/up and down as ONE launch (qmoe_fg.cuh qr_fg_kernel: work tickets in order, each
 * down block waiting on its expert's gate/up blocks) where it can: both stacks 4-bit lane records of group 64 with
 * the fused down input's conditions (k_qe_dn_fuse_group's, the switch DGEMMA_DN_FUSE aside), 2 or 3 n-tiles, the
 * counters present (dg_moe_fg) and no test launcher (qr_launcher_set); elsewhere today's launches. Its h, group sums
 * and y are word for word those of DGEMMA_DN_FUSE=1's two launches (test_quant_experts_fgb). k_qe_experts_fg: gate/up's input copy (unless
 * the router made it) and the one launch; *ran 0 where it does not apply (nothing launched, cudaSuccess). A down
 * block's wait past ~1 s on the GPU traps (the launch fails: cudaErrorLaunchFailure at the next synchronization,
 * with DGEMMA_CUDA_SYNC=1 at dg_cuda_experts' own check); on the emulation the flag read after the launch gives
 * cudaErrorLaunchFailure. */
void qr_experts_fg_set(int on);
cudaError_t k_qe_experts_fg(cudaStream_t s, const dg_cuda_w *gu, const dg_cuda_w *dn, const bf16 *xe,
                            dg_cuda_moe_buf *b, int T, int H, int IE, int E, int K, int nt, int *ran);
/* DGEMMA_WL=1 (qmoe_wl.cu; off by default): the hybrid gate/up of 4-bit g64 experts (experts of >= WL_MIN_ROWS rows
 * through the wgmma kernel wl_kernel, from the wl layout packed at upload, dg_cuda_w.wl). qr_wl_set(1 / 0) forces it
 * on / off for the stacks uploaded next, -1 gives the environment's choice back (the tests); qr_wl_launches counts
 * the hybrid's wl_kernel launches (the tests: that it ran). */
void qr_wl_set(int on);
int qr_wl_on(void);
extern long qr_wl_launches;
/* out[r * (cols / G) + j] = sum_{k < G} x[r * cols + j G + k] in fp32, r < rows. */
cudaError_t k_group_sums(cudaStream_t s, const bf16 *x, int rows, int cols, int G, float *out);
/* k_group_sums, and xp [rows, cols] = x with each run of 8 columns permuted to
 * (0, 4, 1, 5, 2, 6, 3, 7) (the B-fragment order of qr_kernel, qmoe_r.cuh). */
cudaError_t k_group_sums_perm(cudaStream_t s, const bf16 *x, int rows, int cols, int G, float *out, bf16 *xp);
/* k_group_sums_perm in a given version: 0 one block of 64 threads per row, a thread per group (the default); 2 a
 * thread per (row, group) over the whole input, each group's loads before its stores (qmoe.cu; DGEMMA_GSP=flat makes
 * it k_group_sums_perm's); every output word the same. x, xp 16-byte aligned, G % 8 == 0, cols % G == 0. */
cudaError_t k_group_sums_perm_v(cudaStream_t s, int version, const bf16 *x, int rows, int cols, int G, float *out,
                                bf16 *xp);
/* k_group_sums_perm with each group sum S (fp32, the same order of additions) written as the three bf16 parts
 * S = hi + mid + lo (hi = bf16(S), mid = bf16(S - hi), lo = bf16(S - hi - mid); |S - hi - mid - lo| <= 2^-24 |S|)
 * in the record the bias products of qr_kernel's BM mode read (qmoe_r.cuh): out4[r * (cols / G) + j] = the
 * bf16 pairs (hi, mid), (lo, -128 hi), (-128 mid, -128 lo), (0, 0) (lo half first). */
cudaError_t k_group_sums_perm_split(cudaStream_t s, const bf16 *x, int rows, int cols, int G, uint4 *out4, bf16 *xp);

#endif
