/* host.cuh: what the host-side files of the CUDA backend share (upload.cu,
 * context.cu, passes.cu, turbo_host.cu; and the test entry points of
 * tests/support/cuda_entry.cu): the device allocation list, the upload of
 * one matrix, the stage marks of the profiler, the products and layers the
 * turbo passes reuse. Not an interface: the backend's is backend.h. */
#ifndef DG_CUDA_HOST_CUH
#define DG_CUDA_HOST_CUH

#include <stddef.h>
#include <stdint.h>

#include "cuda/common.cuh"

#define GiB (1024.0 * 1024.0 * 1024.0)
#define RESERVE ((size_t)512 << 20) /* CUDA context, cuBLAS workspace and fragmentation */
#define STAGE_ELEMS ((size_t)8 << 20) /* bf16 elements of the host staging buffer of an upload */

/* ---- one block for many buffers ---- */

/* Under DGEMMA_INITCHECK=1 (kernels.cu) only: zero the fp32 matrix y that a cuBLAS product is about to write on s:
 * rows rows of cols floats, ld floats apart (ld >= cols), so that compute-sanitizer's initcheck, which misses the stores of
 * cuBLAS's kernels, sees y written. Otherwise nothing. Returns the memset's error (cudaSuccess when off). */
static inline cudaError_t dg_initcheck_clear(cudaStream_t s, float *y, size_t ld, size_t cols, size_t rows) {
  return dg_cuda_initcheck ? cudaMemset2DAsync(y, ld * sizeof(float), 0, cols * sizeof(float), rows, s) : cudaSuccess;
}

/* Laying buffers out in one block (llm.c's size table): carve() gives each buffer the next CARVE_ALIGN-aligned
 * offset of the block; with base NULL it only adds up the bytes (the pointers it gives are NULL), so the same walk
 * sizes the block and then assigns the pointers into it (context.cu: a context's buffers; turbo_host.cu: the turbo
 * engine's). rec_p / rec_b (rec_cap entries), when set, receive each buffer's address and bytes (ctx_carves). */
#define CARVE_ALIGN 256 /* cudaMalloc's own alignment: what the kernels' 16-byte vector loads, cp.async and bulk
                         * copies and cuBLAS's workspace (256 bytes) need, kept for every buffer of the block */
typedef struct carver {
  unsigned char *base; /* the block, or NULL: sizing only */
  size_t off;          /* bytes laid out so far (a multiple of CARVE_ALIGN) */
  int n;               /* buffers laid out so far */
  void **rec_p;
  size_t *rec_b;
  int rec_cap;
} carver;

static inline void *carve(carver *cv, size_t bytes) {
  void *p = cv->base ? cv->base + cv->off : NULL;
  if (cv->rec_p && cv->n < cv->rec_cap) {
    cv->rec_p[cv->n] = p;
    cv->rec_b[cv->n] = bytes;
  }
  cv->n++;
  cv->off += (bytes + CARVE_ALIGN - 1) / CARVE_ALIGN * CARVE_ALIGN + (bytes == 0) * CARVE_ALIGN; /* none empty */
  return p;
}

/* ptr = carve(cv, bytes), typed. */
template <class T> static inline void carve_to(carver *cv, T *&ptr, size_t bytes) { ptr = (T *)carve(cv, bytes); }

/* *blk: one cudaMalloc holding the buffers that layout(cv) carves (layout is called twice: to size the block, then
 * to point the buffers into it); what names them in the error. Errors: DG_ERR_OUT_OF_MEMORY, DG_ERR_BACKEND (*blk
 * NULL, the pointers untouched). */
template <class F> static inline dg_status carve_block(void **blk, const char *what, F layout) {
  carver sz = {};
  layout(&sz);
  cudaError_t e = cudaMalloc(blk, sz.off);
  if (e != cudaSuccess) {
    *blk = NULL;
    return dg_seterr(e == cudaErrorMemoryAllocation ? DG_ERR_OUT_OF_MEMORY : DG_ERR_BACKEND,
                     "cudaMalloc(%zu bytes) for %s failed: %s", sz.off, what, cudaGetErrorString(e));
  }
  carver cv = {};
  cv.base = (unsigned char *)*blk;
  layout(&cv);
  return DG_OK;
}

/* ---- upload.cu ---- */

/* All device allocations of a model or context, freed together. With an arena (a model's weights in one block,
 * dg_cuda_model_new: cudaMalloc rounds every allocation of 2 MiB or more up to whole 2 MiB pages, ~1 MiB lost per
 * matrix), dalloc carves from it at CARVE_ALIGN while it has room (the arena itself recorded in p). */
typedef struct alloc_list {
  void **p;
  int n, cap;
  unsigned char *arena;
  size_t arena_off, arena_cap;
} alloc_list;
/* bytes into *out: carved from al's arena where it has room, else a cudaMalloc recorded in al (what names it in
 * the error). */
dg_status dalloc(alloc_list *al, void **out, size_t bytes, const char *what);
void dfree_all(alloc_list *al);
/* DGEMMA_CUDA_MEMLOG=1: one stderr line "dgemma cuda mem: WHERE: used X MiB (total - free of cudaMemGetInfo), free
 * Y MiB, stack limit S B" (the accounting of docs/cuda.md "What the context allocates"); nothing otherwise. */
void mem_log(const char *where);
/* Free and total device memory; DGEMMA_CUDA_MEM_LIMIT=BYTES in the environment
 * caps what dgemma considers free (to share a GPU, and to test the refusal).
 * DG_ERR_BACKEND if cudaMemGetInfo fails; DG_ERR_INVALID_ARG (naming the variable
 * and value) if it is set to anything but a decimal byte count. */
dg_status mem_info(size_t *fr, size_t *tot);
/* A device copy of n fp32 values. */
dg_status up_vec(alloc_list *al, float **dst, const float *src, size_t n, const char *what);
/* Upload the row blocks parts[0..nparts) (one format, same cols) as one device matrix (stage: STAGE_ELEMS
 * bf16 elements of host scratch, used when a float matrix is not bf16). */
dg_status up_w(alloc_list *al, dg_cuda_w *dst, const dg_weight *const *parts, int nparts, const char *what,
               uint16_t *stage);
/* A matrix the kernels take (float dtype; quantized bits, group and scales dtype); else
 * DG_ERR_UNSUPPORTED_MODEL naming it (and layer, if >= 0). */
dg_status check_mat(const dg_weight *m, const char *what, int layer);
/* Upload an expert stack of E experts (gateup: gate/up [E*2*IE, H], else down [E*H, IE]) in the layout of the
 * expert kernels (stage as up_w, or NULL: allocated when needed). */
/* DGEMMA_WL=1 (qmoe_wl.cu): whether m, an expert stack (gateup 1: gate/up), gets the wl layout beside its lane
 * records (4-bit g64 bf16 pairs, K a multiple of 64, a device with wgmma; sets wl_kernel's shared memory), and its
 * packing into dst->wl (device memory wl_bytes(1, E, IE, K, 256) from al). */
int qr_wl_usable(const dg_weight *m, int gateup);
dg_status up_experts_wl(alloc_list *al, dg_cuda_w *dst, const dg_weight *m, int64_t E, const char *what);
dg_status up_experts(alloc_list *al, dg_cuda_w *dst, const dg_weight *m, int gateup, int64_t E, const char *what,
                     uint16_t *stage);

/* ---- context.cu ---- */

/* The device buffers of c as its one block holds them (dg_cuda_ctx_new's layout, walked again; c's pointers are
 * set to the same values): their count, each one's address p[i] and bytes bytes[i] for i < min(count, cap); the
 * block and its bytes. For the tests (tests/support/cuda_entry.cu: the buffers do not overlap). */
int ctx_carves(dg_cuda_ctx *c, void **p, size_t *bytes, int cap, void **block, size_t *block_bytes);
int ctx_carves_enc(dg_cuda_ctx *c, void **p, size_t *bytes, int cap);

/* The interval that ends now belongs to stage st (no-op when profiling is off). */
dg_status mark(dg_cuda_ctx *c, int st);
/* A stacked pass of `canvases` canvases and `rows` rows on work context w whose first profiled canvas is lead:
 * when lead's profiling is on, w's marks go to lead->prof_stack (made here on first use) until w->prof is set
 * back to NULL, and the pass is counted there; a no-op otherwise. Errors: those of dg_cuda_profile. */
dg_status prof_stack_begin(dg_cuda_ctx *w, dg_cuda_ctx *lead, int32_t canvases, int32_t rows);
/* While w->prof is a stacked passes' record: layer li's expert counts (w->moe.count, E) copied to its host row,
 * on w->stream after the layer's routing (no-op otherwise). */
dg_status prof_stack_layer(dg_cuda_ctx *w, int li);
/* After w->stream is synchronised: the copied counts of every layer into the record's histogram. */
void prof_stack_end(dg_cuda_ctx *w);
/* A pass writes the K/V of positions [pos0, end): c->hi (a pass at position 0 starts the cache over). */
void note_written(dg_cuda_ctx *c, int32_t pos0, int32_t end);

/* ---- passes.cu (also used by the turbo passes) ---- */

/* y[t, n] (ld ldy, fp32) = sum_k x[t, k] * W[n, k] for every row n of W: cuBLAS for bf16, the dequantizing
 * kernel (quant.cu) for quantized W. */
dg_status wmatmul(dg_cuda_ctx *c, const bf16 *x, int ldx, int T, const dg_cuda_w *W, float *y, int ldy);
/* GeGLU MLP (spec 4.1): out[T, H] = down(gelu(gate a) * up a), a bf16 [T, H]. */
dg_status geglu_mlp(dg_cuda_ctx *c, const bf16 *a, int T, const dg_cuda_wset *w_gate_up, const dg_cuda_w *w_down,
                    float *out);
/* A canvas's rows [r0, r0 + n) of a stacked pass: its context's per-layer KV caches, the position of
 * its first canvas slot (or of its encoder chunk) and, compacted, its rows' absolute positions dpos[n] (device;
 * NULL: pos0 + t). */
#define DG_CUDA_MAX_STACK 64 /* canvases in one stack of dg_cuda_compact_batch */
typedef struct dg_cuda_seg {
  int r0, n;
  bf16 **kc, **vc;
  int32_t S, S_ring; /* slots of its full and sliding layers' caches (dg_cuda_ctx) */
  int32_t pos0;
  const int32_t *dpos;
} dg_cuda_seg;
/* One layer (spec 4.4) over c->x [T, H], the rows of the canvases sg[0..nseg) (host array): products over all
 * rows, the K/V scatter and attention per canvas; causal = encoder (one segment). */
dg_status layer_segs(dg_cuda_ctx *c, int li, int T, const dg_cuda_seg *sg, int nseg, int causal);
/* One layer (spec 4.4) over c->x [T, H] at positions pos0..; causal = encoder; dpos != NULL: the compacted
 * pass's absolute positions dpos[T] (device; spec 7.4). layer_segs with one segment in c's own cache. */
dg_status layer_at(dg_cuda_ctx *c, int li, int T, int32_t pos0, int causal, const int32_t *dpos);
/* soft [C, H] = embed_scale * P . E with P = cast(softmax(cast(z))) (spec 5, 4.9). */
dg_status soft_from(dg_cuda_ctx *c, const float *z);
/* The decoder over the whole canvas up to the last layer (spec 4.8, 4.4) into c->x [C, H]: decoder_upload
 * (host side: the canvas's slots noted in c->hi, canvas[C] into c->ids), then decoder_body (the device work from
 * c->ids, launches only: a part of a graph body). */
dg_status decoder_layers(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0, dg_sc_source sc);
dg_status decoder_upload(dg_cuda_ctx *c, const int32_t *canvas, int32_t pos0);
dg_status decoder_body(dg_cuda_ctx *c, int32_t pos0, dg_sc_source sc);
/* c->logits as a pass left them (passes.cu): softcapped or without softcap (raw_cap 0), or raw with the softcap
 * raw_cap still to apply (the fused chain's decode); any z before forgotten. */
void logits_written(dg_cuda_ctx *c, float raw_cap);
/* DG_ERR_INVALID_ARG (naming who) where c->logits were overwritten by P made in their place (c->lg_dead, common.cuh's
 * sc_group), else DG_OK: every reader of c->logits outside a pass asks first (passes.cu, turbo_host.cu). */
dg_status logits_alive(const dg_cuda_ctx *c, const char *who);
/* c's work buffers in the encoder's view (enc 1; the logits dead, lg_dead 2) or the decoder's (enc 0): context.cu. */
void ctx_rows_view(dg_cuda_ctx *c, int enc);
/* The chain over the logits the passes take from now on (passes.cu): 0 the chain, 1 fused, 2 zstore (the values of
 * DGEMMA_VOCAB=chain, fused, zstore); -1 gives the environment's choice back. For the tests, between passes. */
void dg_cuda_vocab_set(int mode);

/* DGEMMA_BRANCH (passes.cu): whether a context made now runs each layer's dense MLP on its second stream, concurrent
 * with the router and experts (1) or everything in order on one stream (0): the environment's choice (on unless
 * DGEMMA_BRANCH=0, read once when the library loads) unless dg_cuda_branch_set(0 / 1) overrides it (-1 gives the
 * environment's choice back; the tests). A context keeps what it was made with. */
int dg_cuda_branch_now(void);
void dg_cuda_branch_set(int on);

/* DGEMMA_SEG_STREAMS (passes.cu; issue 14): *n = the streams a context made now issues a stacked pass's per-canvas
 * products on (dg_cuda_ctx.segs): dg_cuda_seg_streams_set's value where one is set, else the environment's: unset
 * or empty 1 (off: every product on the issuing stream, the order before the switch), N in 1..DG_SEG_STREAMS_MAX
 * (decimal digits only). Read where a context is made (dg_cuda_ctx_new). Errors: DG_ERR_INVALID_ARG naming the
 * variable, its value and what is accepted (*n set to 1). dg_cuda_seg_streams_set(n): n in 1..DG_SEG_STREAMS_MAX
 * overrides the environment for the contexts made next, -1 gives it back (the tests). */
dg_status dg_cuda_seg_streams(int *n);
void dg_cuda_seg_streams_set(int n);
/* The streams, events, workspaces and LM-head rows of c->segs where c was made with DGEMMA_SEG_STREAMS > 1 and
 * they are not made yet (context.cu; before a stacked pass, outside any capture): (want - 1) x the context's cuBLAS
 * workspace bytes + tmax x 4 bytes of device memory. Errors: DG_ERR_OUT_OF_MEMORY, DG_ERR_BACKEND (nothing kept:
 * a later call tries again). */
dg_status seg_ready(dg_cuda_ctx *c);
/* Whether a stacked pass of ng canvases issues its per-canvas products on c->segs's streams (c->segs.n > 1, ng > 1,
 * not DGEMMA_CUDA_SYNC=1). */
int seg_on(const dg_cuda_ctx *c, int ng);
/* seg_fork: a fork from the issuing stream c->stream (its cuBLAS workspace c->blas_ws of ws_bytes) to the streams
 * of up to ng canvases; seg_to(c, g): canvas g's launches from here on go to stream g % n (c->stream, c->blas's
 * stream and workspace moved there; the workspace's bytes told to cuBLAS are ws_bytes on every stream); seg_join:
 * c's stream, handle and workspace back to the issuing ones and the issuing stream waits for every stream that got
 * work. Capture-legal (events only). Errors: DG_ERR_BACKEND (after seg_join's restore, whatever failed). */
dg_status seg_fork(dg_cuda_ctx *c, int ng, size_t ws_bytes);
extern int64_t seg_forks_total; /* seg_fork calls of every context so far (host count; the tests) */
dg_status seg_to(dg_cuda_ctx *c, int g);
dg_status seg_join(dg_cuda_ctx *c);
/* GeGLU MLP as geglu_mlp with its intermediates at gu [T, 2I] and h [T, I] (geglu_mlp: c->gu, c->h); geglu_step:
 * its launch `step` alone (0 gate/up into gu, 1 GeGLU into h, 2 down into out; another step: nothing), for the
 * per-canvas streams' step-by-step issue. */
dg_status geglu_mlp_at(dg_cuda_ctx *c, const bf16 *a, int T, const dg_cuda_wset *w_gate_up, const dg_cuda_w *w_down,
                       float *out, float *gu, bf16 *h);
dg_status geglu_step(dg_cuda_ctx *c, int step, const bf16 *a, int T, const dg_cuda_wset *w_gate_up,
                     const dg_cuda_w *w_down, float *out, float *gu, bf16 *h);
/* Offsets (elements) of ng <= DG_CUDA_MAX_STACK regions of n[g] x per elements each, laid one after another, each
 * start rounded up to `align` elements (the callers: 256 bytes of their type, so that every canvas's buffer is as
 * aligned as its own pass's, which starts at a carved buffer's 256-byte-aligned base) into off[g]; 1 if they end
 * within cap elements, else 0. */
int seg_pack(const int *n, int ng, size_t per, size_t align, size_t cap, size_t *off);

/* ---- graph.cu ---- */

/* What a pass's graph is kept under (graph.cu): everything that changes its sequence of launches or their
 * arguments except the signature of graph_run (the canvas position). */
typedef struct dg_graph_key {
  int32_t kind;  /* DG_GRAPH_* */
  int32_t sc;    /* the body's self-conditioning (dg_sc_source; DG_SC_HOST: the soft embedding computed in it) */
  int32_t n, nh; /* rows forwarded, LM-head rows (0 where the kind fixes them) */
} dg_graph_key;
enum { DG_GRAPH_DECODE = 1, DG_GRAPH_ROWS, DG_GRAPH_COMPACT, DG_GRAPH_DECODE_RAW /* the decode without softcap */ };
/* A pass's device work on c->stream: launches only (no synchronisation, no host copy, no allocation, no host
 * state that a replay would miss), the same for the same key and signature. */
typedef dg_status (*dg_pass_body)(dg_cuda_ctx *c, const void *arg);
/* c->graphs from DGEMMA_GRAPHS / DGEMMA_GRAPHS_MAX (dg_cuda_ctx_new). Errors: DG_ERR_OUT_OF_MEMORY. */
/* gemm_pin.cu: cublasLt algorithms pinned for the dense products the lab found faster than cuBLAS's default
 * (dev/cuda/gemm_lab.cu). gemm_pins_init: the pins cublasLt accepts on this device with a workspace of ws_bytes
 * (c->blas_ws) into c->pins (NULL when none, unless DGEMMA_GEMM_PIN=1 or force, or on the emulation; never an error: the
 * default products remain); gemm_pins_free releases them. gemm_pinned runs
 * y[T, N] (fp32, ld ldy) = x[T, K] (bf16, ld ldx) W[N, K]^T on c->stream through a pin when one matches (N, T, K)
 * with ldx == K and ldy == N, returns 1 and sets *st = DG_OK; 0: no pin matches, or cublasLt refused the pin's
 * product (that pin is dropped for the context): nothing done, the caller runs its default product. */
void gemm_pins_init(dg_cuda_ctx *c, size_t ws_bytes, int force);
void gemm_pins_free(dg_cuda_ctx *c);
/* The shape (cuBLAS m = N, n = T, k = K) of pin i of the table: 1, or 0 past its end (and on the emulation). */
int gemm_pin_shape(int i, int *m, int *n, int *k);
/* Whether the current device is one the pins are for (compute capability 9.0). */
int gemm_pins_device(void);
int gemm_pinned(dg_cuda_ctx *c, const bf16 *x, int ldx, int T, const bf16 *W, int N, int K, float *y, int ldy,
                dg_status *st);
/* gemm_inv.cu (issue 14): DGEMMA_STACK_DENSE. stack_dense_now: 0 the dense products of a stacked pass per canvas
 * (default), 1 once over the stack's rows with cuBLAS's default, 2 ("inv") once over the stack's rows and every dense
 * product of every pass through one batch-invariant cublasLt algorithm per product shape; dg_cuda_stack_dense_set
 * (0..2, -1 the environment's) overrides it (tests; set it before making the contexts: a context's graphs keep the
 * products they captured). gemm_inv_init: with mode 2 on a GPU, c->inv (a cublasLt handle; the algorithms chosen on
 * first use of each shape); otherwise c->inv = NULL. Errors: DG_ERR_OUT_OF_MEMORY, DG_ERR_BACKEND. gemm_inv runs
 * C[n, m] (fp32, ld ldc) = alpha op(A) B on c->stream with workspace c->blas_ws: tn = 1 y = x W^T (A = W [m, k]
 * row-major bf16, B = x [n, k] bf16 ld ldb), tn = 0 y = P E (A = E [k, m] row-major, B = P [n, k] ld ldb), beta 0;
 * returns 0 when c->inv is NULL (the caller runs its default product), else 1 with *st DG_OK or the error (no
 * configuration for the shape, cublasLt refused it at n rows: the message names shape, configuration and rows).
 * gemm_inv_shape: the products of a 26B-A4B pass (i = 0..7; 0 past the end); gemm_inv_config: the configuration
 * chosen for a shape (algo, tile, stages, split-K, reduction, swizzle, custom, inner, cluster) and how it
 * was chosen (0 the table, 1 the fallback rule's split-K 1 entry, 2 its first entry); 0 when none (or off). */
void dg_cuda_stack_dense_set(int mode);
int stack_dense_now(void);
dg_status gemm_inv_init(dg_cuda_ctx *c, size_t ws_bytes);
void gemm_inv_free(dg_cuda_ctx *c);
int gemm_inv(dg_cuda_ctx *c, int tn, int m, int n, int k, float alpha, const bf16 *A, const bf16 *B, int ldb, float *C,
             int ldc, dg_status *st);
int gemm_inv_shape(int i, int *tn, int *m, int *k);
int gemm_inv_config(dg_cuda_ctx *c, int tn, int m, int k, int v[9], int *rule);
dg_status graph_init(dg_cuda_ctx *c);
/* Destroy c's graphs (dg_cuda_ctx_free; the stream idle). */
void graph_free(dg_cuda_ctx *c);
/* body(c, arg) on c->stream: plainly (graphs off, profiling, DGEMMA_CUDA_SYNC, the key's first use), or by
 * launching the key's graph (captured again first if sig, the canvas position, differs from its capture's).
 * A capture error ends graphs for c and runs body plainly. Errors: body's, DG_ERR_BACKEND. */
dg_status graph_run(dg_cuda_ctx *c, const dg_graph_key *key, int64_t sig, dg_pass_body body, const void *arg);

/* ---- turbo_host.cu ---- */

/* Device buffers of the turbo entry points, made on first use (turbo_bufs): two blocks, the index buffers and the
 * top-K buffers (remade for a larger K); a batch's work context also the stacked SC rows' P (sc_stack_bufs). */
struct dg_cuda_turbo {
  int32_t *pos;      /* [tmax] absolute positions of a compacted pass's rows */
  int32_t *cpos;     /* [tmax] their canvas positions (self-conditioning rows) */
  int32_t *rows;     /* [C] LM-head rows, then canvas rows of the self-conditioning signal */
  int32_t *h_pos;    /* host [tmax] */
  int32_t nraw;      /* rows of raw logits in c->logits (0: none) */
  int32_t K;         /* largest K the top-K buffers hold (0: not allocated) */
  int32_t klast;     /* K of the last dg_cuda_topk: the layout of idx [n, klast] */
  float *cv, *candv, *val, *p; /* [C, nC], [C, min(K, nC) * 64], [C, K], [C, K] */
  int32_t *ci, *candi, *idx;   /* as cv, candv, val */
  int32_t *bad;      /* [1 + C] */
  float *pmax;       /* [C, dg_scp_chunks(V)] the exact SC probabilities' chunk maxima (k_turbo_sc_probs_tab) */
  double *psum;      /* [C, 16] their warp sums */
  bf16 *Pst;         /* work context, DGEMMA_STACK_DENSE 1 / inv: [pst_rows, V] the stacked SC rows' P */
  bf16 *P;           /* [C, V] the exact SC rows' P: c->P where it has a buffer of its own (sc_group 0), else pblk:
                      * an exact row made ahead may be made again from the raw rows (dg_cuda_turbo_sc_batch), so
                      * the turbo engine never writes P over the logits */
  int32_t pst_rows;
  cudaEvent_t sc_ev; /* work context: the end of the last dg_cuda_turbo_sc_batch (the canvases' streams wait on it) */
  cudaEvent_t tk_ev; /* work context: the top-K results of the last dg_cuda_topk_batch on the host */
  int32_t sc_pre_n;  /* rows of the exact SC product made ahead from the current raw rows (0: none; logits_written) */
  float sc_pre_T;    /* its temperature */
  float *sc_pre_f1;  /* its rows [sc_pre_n, H]: the canvas's f1, or the work context's (DGEMMA_STACK_DENSE 1 / inv) */
  void *iblk, *kblk, *sblk, *pblk; /* the blocks of the index buffers (pos, cpos, rows, pmax, psum), of the top-K
                                     * buffers, of Pst and of P (carve_block) */
};

/* Table launches over the canvases of a batch (issue 14: one launch for B canvases instead of B launches on B
 * streams; turbo.cu). Canvas b's rows are rows [row0[b], row0[b + 1]) of the launch, row0[0] = 0, b < B <=
 * DG_TB_TAB; each canvas has its own buffers and parameters, and each row's results are those of the one-canvas
 * kernels (a row's work does not depend on the other rows). */
#define DG_TB_TAB 8
/* Columns per block of the exact self-conditioning probabilities' first and last launch (k_turbo_sc_probs_tab;
 * the emulation's smaller, so that the test models' rows span several) and the chunks of a row of V. */
#ifdef DG_CUDA_EMU
#define DG_SCP_CW 128
#else
#define DG_SCP_CW 8192
#endif
static inline int dg_scp_chunks(int V) { return (V + DG_SCP_CW - 1) / DG_SCP_CW; }
/* k_topk_tab: canvas b's raw [n, V] and its top-K buffers (dg_cuda_turbo's layout for its K). */
typedef struct dg_tk_seg {
  const float *raw;
  float *cv, *candv, *val;
  int32_t *ci, *candi, *idx, *bad;
  int32_t K;
} dg_tk_seg;
typedef struct dg_tk_tab {
  dg_tk_seg s[DG_TB_TAB];
  int32_t row0[DG_TB_TAB + 1];
  int32_t B;
} dg_tk_tab;
/* k_turbo_sc_probs_tab: canvas b's raw [n, V], P [n, V] (bf16) written, its scratch pmax [n, dg_scp_chunks(V)]
 * and psum [n, 16] (dg_cuda_turbo), its temperature. */
typedef struct dg_tb_seg {
  const float *raw;
  bf16 *P;
  float *pmax;
  double *psum;
  float T;
} dg_tb_seg;
typedef struct dg_tb_tab {
  dg_tb_seg s[DG_TB_TAB];
  int32_t row0[DG_TB_TAB + 1];
  int32_t B;
} dg_tb_tab;
/* The hierarchical exact top-K of every row of the table (k_topk_hier's per row, one block a row, one launch).
 * cudaErrorInvalidValue for B outside [1, DG_TB_TAB]. */
cudaError_t k_topk_tab(cudaStream_t s, const dg_tk_tab *t, int V);
/* P = cast(softmax(cast(softcap(raw) / T))) of every row of the table, word for word k_turbo_sc_probs's (its
 * order of the sum kept: turbo.cu), in three launches of (chunks or 16 warps) x rows blocks. cap: the softcap
 * (0 none), act: the activation dtype. cudaErrorInvalidValue for B outside [1, DG_TB_TAB]. */
cudaError_t k_turbo_sc_probs_tab(cudaStream_t s, const dg_tb_tab *t, int V, float cap, int act);
/* k_turbo_sc_probs also writing each row's softmax sum (the double its probabilities divide by) to sum [n] (tests). */
cudaError_t k_turbo_sc_probs_sum(cudaStream_t s, const float *raw, bf16 *P, int n, int V, float cap, float T, int act,
                                 double *sum);
/* DGEMMA_SC_PROBS (turbo_host.cu): 1 (default) the exact self-conditioning probabilities by k_turbo_sc_probs_tab,
 * 0 (DGEMMA_SC_PROBS=row) by k_turbo_sc_probs (one block per row: session 26's kernel, for comparison); the same
 * words. dg_cuda_sc_probs_set(0 / 1, -1 the environment's) overrides it (tests). */
int sc_probs_now(void);
void dg_cuda_sc_probs_set(int mode);

/* c->tb with its index buffers; with K > 0 also the top-K buffers for K
 * (kept across calls for the largest K asked; a failed allocation leaves
 * nothing half-made behind). */
dg_status turbo_bufs(dg_cuda_ctx *c, int32_t K);
/* Free the turbo buffers of c (dg_cuda_ctx_free). */
void turbo_free(dg_cuda_ctx *c);

#endif
