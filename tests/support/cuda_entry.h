/* cuda_entry.h: the test entry points of the CUDA backend (one kernel on
 * host data each; tests/test_cuda.c), in the test support library
 * $(BUILD)/libdgemma_cuda_test.so (tests/support/cuda_entry.cu) instead of the
 * product: it is linked against the CUDA plugin ($(BUILD)/libdgemma_cuda.so,
 * whose upload and kernel launchers it calls) and opened by the tests only,
 * after the plugin (dg_cuda_test_api_get in tests/test_cuda.c). Plain C.
 * Matrices are the loader's dg_weight (src/base/weight.h). */
#ifndef DG_CUDA_ENTRY_H
#define DG_CUDA_ENTRY_H

#include <stdint.h>

#include "cuda/backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Each entry point uploads its inputs to device `device`, runs the kernel the forward
 * pass uses, copies the result back and frees everything. bf16 inputs are
 * raw bf16 bits (uint16_t). Errors: DG_ERR_BACKEND, DG_ERR_INVALID_ARG (a
 * shape the kernel does not take), DG_ERR_OUT_OF_MEMORY. */

/* y[t*ldy + n] = sum_k x[t*ldx + k] * W[row0 + n, k] for t < T, n < N (the
 * dense product of every linear layer and the LM head); x bf16 [T, ldx]. */
dg_status dg_cuda_test_matmul(int device, const dg_weight *w, int64_t row0, int N, const uint16_t *x, int ldx,
                              int T, float *y, int ldy);
/* x[t, :] = E[ids[t], :] * scale (the embedding lookup), x fp32 [T, E.cols]. */
dg_status dg_cuda_test_embed(int device, const dg_weight *e, const int32_t *ids, int T, float scale, float *x);
/* soft[c, h] = alpha * sum_v P[c, v] * E[v, h] (the self-conditioning soft
 * embedding, spec 5), P bf16 [C, E.rows], soft fp32 [C, E.cols]. */
dg_status dg_cuda_test_soft(int device, const dg_weight *e, const uint16_t *P, int C, float alpha, float *soft);
/* The gathered MoE product (spec 4.6 step 4) for the routing idx [T, K]
 * (expert ids; every token's K ids distinct), through the device grouping and
 * dg_cuda_experts: per (token t, slot k) with e = idx[t*K + k],
 *   h[t*K + k, :] = bf16(gelu_tanh(G_e xe[t]) * U_e xe[t])   [IE] (bf16 bits)
 *   y[t*K + k, :] = D_e h[t*K + k]                            [H] fp32
 * gate_up [E*2*IE, H] (per expert IE gate rows then IE up rows), down [E*H, IE],
 * xe bf16 [T, H]. h and y are returned in (token, slot) order. */
dg_status dg_cuda_test_experts(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                               const int32_t *idx, int T, int H, int IE, int E, int K, uint16_t *h, float *y);
/* As dg_cuda_test_experts with the quantized kernels' tile count nt (1-5 or 8: 8 nt tokens per pass over an
 * expert's weights; 0: the backend's choice) and dq_from (0: the exact per-group fold everywhere; 4-8: the DQ body,
 * weights dequantized to bf16, from that tile count on, for group-64 stacks of 2, 3, 4 or 8 bits): every body of
 * qr_kernel reachable from small shapes. DG_ERR_INVALID_ARG for other values. */
dg_status dg_cuda_test_experts_nt(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                                  const int32_t *idx, int T, int H, int IE, int E, int K, int nt, int dq_from,
                                  uint16_t *h, float *y);
/* dg_cuda_experts_nt (tile count nt as there, the exact fold) twice: the down product's input copy and group sums
 * made by its own launch (k_group_sums_perm), and made by the gate/up kernel's epilogue where k_qe_dn_fuse_group
 * allows it (DGEMMA_DN_FUSE=1's path, forced on by qr_dn_fuse_set); *fused: whether it did. n_diff: the words of h
 * [0] (bf16, read back in the plain order) and of y [1] (fp32) that differ between the two. */
dg_status dg_cuda_test_experts_dn_fuse(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                                       const int32_t *idx, int T, int H, int IE, int E, int K, int nt, long n_diff[2],
                                       int *fused);
/* dg_cuda_experts_nt (tile count nt as there, the exact fold, the down product's input copy by its own launch) twice:
 * with the backend's qr_kernel (DIET 1, the stage loop of qr_diet_pass) and with its loop before the SASS diet (DIET
 * 0, through qr_launcher_set; 3- and 4-bit and bf16 stacks only). n_diff: the words of h [0] and y [1] that differ. */
dg_status dg_cuda_test_experts_diet(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                                    const int32_t *idx, int T, int H, int IE, int E, int K, int nt, long n_diff[2]);
/* dg_cuda_test_experts_diet with the kernel lab's version (95-111, dev/cuda/qr_diet_lab.cuh qr_diet_version: the SASS
 * diet with other launch choices, the same arithmetic; 110 also checks its timeline's stamps) in place of the other
 * DIET, on 4-bit stacks; DG_ERR_INVALID_ARG for another version, width or tile count. */
dg_status dg_cuda_test_experts_lab(int device, int version, const dg_weight *gate_up, const dg_weight *down,
                                   const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E, int K, int nt,
                                   long n_diff[2]);
/* One wgmma.mma_async m64n64k16 f32 += bf16 x bf16 (src/cuda/wgmma.cuh) by one warpgroup: D [64, 64] = A B + C,
 * or A B with mode & 4 (scale-d 0); A [64, 16] and Bt = B's transpose [64, 16] bf16 row-major, C and D fp32
 * row-major. B from shared memory through a K-major descriptor, no swizzle (mode & 1 clear: LBO 1024, SBO 128) or
 * 128-byte swizzle (mode & 1: SBO 1024, the operand the k16 slice s = (mode >> 4) & 3 of each 128-byte row of 64 k,
 * the descriptor's start 32 s bytes in); A from registers, or with
 * mode & 2 from shared memory in B's layout. Mutations (mode >> 8; each must fail a test's bound): 1 LBO and SBO
 * exchanged (no swizzle), 2 the descriptors' swizzle mode dropped (128-byte), 3 A's registers a[1] and a[2]
 * exchanged (A from registers), 4 D read before wgmma.wait_group (the emulation only). *avail = 0 (and nothing run)
 * where the build's device code has no wgmma (not sm_90a). DG_ERR_INVALID_ARG for another mode. */
dg_status dg_cuda_test_wgmma(int device, int mode, const uint16_t *A, const uint16_t *Bt, const float *C, float *D,
                             int *avail);
/* dg_cuda_experts_nt's products (tile count nt, no DQ, no fused copy) with the kernel lab's wgmma version `version`
 * (dev/cuda/moe_quant.cu: 20, 22 qw_kernel; 21 = 20 with the descriptor's LBO and SBO exchanged; 75 qw_kernel's DQ
 * body from 4 n-tiles, the backend's kernel below; 120-122 src/cuda/qmoe_wl.cuh wl_kernel, the large-M kernel, at
 * every tile count: bf16 scales, H and IE multiples of 64; 112 + 1000 c, c >= 0, dev/cuda/qr_diet_lab.cuh
 * qr_sk_kernel, the last partial round split along K, with the resident slots taken as c, 0: the occupancy query's; no
 * wgmma, any 4-bit group; 114 qr_fg_version, gate/up and down in one launch over the fused down input (4-bit, group 32
 * or 64, IE a multiple of 64): run twice after version 50 with DGEMMA_DN_FUSE=1, DG_ERR_BACKEND where a word of h or y
 * differs from 50's, a down block's wait found its expert's gate/up blocks not all counted, or a counter is not back at
 * 0) in place of qr_kernel, on 4-bit g64 stacks: h [T K, IE]
 * and y [T K, H] as dg_cuda_test_experts_nt. *avail = 0 (nothing run) where the build has no wgmma (not sm_90a).
 * DG_ERR_INVALID_ARG for another version, width, group or tile count. */
/* A ring of 2 shared-memory slots of 256 bytes filled by cp.async.bulk on an mbarrier each (src/cuda/qmoe_r.cuh
 * dg_bulk_g2s, dg_mbar_wait; one block of 64 threads, thread 0 issuing stage s + 1 while stage s is read): dst
 * [n, 256] = src [n, 256] byte for byte, n 1..64 stages (each slot's mbarrier through n / 2 phases). Mutations
 * (mode 1, 2; the emulation only, where each must leave bytes of dst unequal: on the GPU the result is undefined):
 * 1 the slot read without waiting on its mbarrier, 2 the wait on the other parity. DG_ERR_INVALID_ARG for another
 * mode or n. */
dg_status dg_cuda_test_bulk(int device, int mode, const uint8_t *src, uint8_t *dst, int n);
dg_status dg_cuda_test_experts_qw(int device, int version, const dg_weight *gate_up, const dg_weight *down,
                                  const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E, int K, int nt,
                                  uint16_t *h, float *y, int *avail);
/* *G = k_qe_dn_fuse_group (src/cuda/common.cuh) for lane-record stacks gate/up (gu_bits 0: bf16, gu_group) and down
 * (dn_bits, dn_group), IE features, with the group-sum buffer present, DGEMMA_DN_FUSE forced on and DGEMMA_QR_DQ's
 * choice dq_from (0 off, 4-8): the down group the gate/up epilogue would make its copy for, 0 where it must not.
 * Host only (no device memory); DG_ERR_INVALID_ARG for dq_from outside 0-8. */
dg_status dg_cuda_test_dn_fuse_group(int gu_bits, int gu_group, int dn_bits, int dn_group, int IE, int dq_from, int *G);
/* The chain over the logits of the passes that follow (dg_cuda_vocab_set, src/cuda/host.cuh): 0 the chain, 1 fused,
 * 2 zstore (DGEMMA_VOCAB's values), -1 the environment's choice again; DG_ERR_INVALID_ARG for other values. */
dg_status dg_cuda_test_vocab_set(int mode);
/* DGEMMA_BRANCH for the contexts made next (dg_cuda_branch_set, src/cuda/host.cuh): 1 each layer's dense MLP on a
 * second stream, concurrent with the router and experts, 0 everything on one stream, -1 the environment's choice again;
 * DG_ERR_INVALID_ARG for other values. */
dg_status dg_cuda_test_branch_set(int on);
/* DGEMMA_EXPERTS_FG (qr_experts_fg_set, src/cuda/common.cuh): on 1 gate/up and down in one launch where it applies, 0
 * two launches, -1 the environment's choice again; DG_ERR_INVALID_ARG for other values. *launches (if not NULL): the
 * fused launches the backend has made so far in this process (qr_fg_launches; captures count, graph replays do
 * not). */
dg_status dg_cuda_test_experts_fg(int on, long *launches);
/* Of context c: *on whether it was made with the second stream, *forks the layers it has issued with the fork so far
 * (passes.cu ffn_branches; plain passes and captures count, graph replays do not). */
dg_status dg_cuda_test_branch_stats(const dg_cuda_ctx *c, int *on, int64_t *forks);

/* The router on the device (k_route in mode 1, route_kernel, or 2, route_tk_kernel: the modes of
 * DGEMMA_ROUTE=fused and =tiles; spec 4.6 step 2) for logits rlog [T, E]
 * (overwritten with the probabilities, as the backend does), per-expert
 * scales pes [E]: idx [T, K] the K most probable experts (ties to the lower
 * id), w [T, K] their renormalised, scaled weights; and the grouping by
 * expert: start [E + 1] the first grouped row of each expert, pairs [T K] the
 * pair t K + k of each grouped row (experts ascending, pairs ascending within
 * one), order [E] the experts by descending row count, ties by id (the block
 * order of the lane-record expert products). E <= 256, K <= min(E, 32). */
dg_status dg_cuda_test_route(int device, int mode, float *rlog, const float *pes, int T, int E, int K, int32_t *idx,
                             float *w, int32_t *start, int32_t *pairs, int32_t *order);

/* The router of one layer from its input: k_router_route in mode 1 (the logits' split products, then
 * route_kernel's sums, softmax, top-K and grouping in one launch) or mode 2 (router_tile_kernel's split products,
 * then route_tk_kernel; DG_ERR_INVALID_ARG where mode 2 does not cover the shape, so that the test never passes
 * through the chain unawares), run twice in a row (the kernels' block counter must return to 0), against the
 * chain of separate launches (k_router_logits, k_route_topk, k_group) on the same
 * inputs: u fp32 [T, H] (the router input), W fp32 [E, H], pes [E]. n_diff: the number of 32-bit words of the
 * outputs (probabilities [T, E], idx, w, count, start, pairs, slot_row, tiles, n_tiles, order) that differ
 * between the two ways (both fused runs counted), 0 when they agree bit for bit; idx [T, K] and w [T, K] the
 * fused choices. Modes 3 and 4 (route_gr_kernel; 4: the deep product, DGEMMA_ROUTE=deep) also the gate/up input's
 * permuted copy and sums made inside the launch, against k_group_sums_perm's. E <= 256, K <= min(E, 32). */
dg_status dg_cuda_test_router_route(int device, int mode, const float *u, const float *W, const float *pes, int T, int E,
                                    int H, int K, int32_t *idx, float *w, long *n_diff);

/* The experts' input copy (k_group_sums_perm_v, qmoe.cu) in version 0 (a block per row) or 2 (a thread per group,
 * its loads first): x bf16 bits [rows, cols] -> xs [rows, cols / G] (each group's fp32 sum in column order) and xp
 * bf16 bits [rows, cols] (each run of 8 columns permuted to 0, 4, 1, 5, 2, 6, 3, 7). G % 8 == 0, cols % G == 0. */
dg_status dg_cuda_test_group_sums_perm(int device, int version, const uint16_t *x, int rows, int cols, int G,
                                       float *xs, uint16_t *xp);

/* The exact self-conditioning probabilities of B canvases' raw rows raw [sum n, V] (canvas b's n[b] rows one
 * after another, at temperature T[b]; softcap cap; activation dtype act): p_tab [sum n, V] bf16 bits from one
 * k_turbo_sc_probs_tab launch over the B canvases (each its own buffers), p_row from k_turbo_sc_probs per canvas
 * (session 26's one-block-per-row kernel); sum_tab / sum_row [sum n] each row's softmax sum (the double its
 * probabilities divide by) as the table launches form it from their warp sums and as the row kernel does.
 * B <= DG_TB_TAB. */
dg_status dg_cuda_test_sc_probs(int device, int act, int B, const int32_t *n, int V, float cap, const float *T,
                                const float *raw, uint16_t *p_tab, uint16_t *p_row, double *sum_tab, double *sum_row);
/* DGEMMA_SC_PROBS for contexts' turbo SC from now on: 1 the table kernels, 0 the row kernel, -1 the environment's. */
dg_status dg_cuda_test_sc_probs_set(int mode);

/* The layer attention on the device (attention.cu, spec 4.4 step 3 and the
 * masks of 4.5): q fp32 [nq, NH, D], kc and vc bf16 bits [NKV, S, D] (the
 * cache of one layer: key j in slot j % S, so S may be a ring shorter than
 * the positions as long as the pass's keys [lo, hi) fit), out bf16 bits [nq, NH, D]. causal = 1: query t at
 * position pos0 + t sees keys [lo, pos0 + t + 1); causal = 0: every query sees
 * [lo, kv_hi); lo = 0 if is_full, else max(0, pos - window + 1) (causal) or
 * max(0, pos0 - window + 1). version 0: the backend's choice, 1: one warp per
 * (query, head), 2: the tensor-core kernel (D of 64, 128, 256 or 512; else
 * DG_ERR_INVALID_ARG), 3 and 4: its other tile shapes (the lab's), 5: version
 * 2 with the earlier choice of key splits, 6-8: the backend's warp-pair
 * kernels; 9-15: the attention lab's own (dev/cuda/attention_lab.cuh,
 * att_lab_version; 12-15 need sm_90a, elsewhere they trap). The key splits use up
 * to 8 splits of scratch. */
dg_status dg_cuda_test_attention(int device, int version, const float *q, const uint16_t *kc, const uint16_t *vc, int S,
                                 int nq, int NH, int NKV, int D, int32_t pos0, int32_t kv_hi, int causal, int is_full,
                                 int window, uint16_t *out);

/* The sampler's passes over the logits after the LM head (src/cuda/kernels.cu), the three chains on the same raw
 * logits raw [C, V]: the chain (k_softcap in place where cap > 0, k_step_stats with z = logits / T in place,
 * k_sc_probs of that z; the default), the fused chain (k_vocab_stats and k_vocab_sc on the raw logits, z recomputed
 * in registers; DGEMMA_VOCAB=fused) and zstore (k_vocab_stats with store 1: z stored by pass 1, k_vocab_sc with cap
 * DG_VZ_STORED; DGEMMA_VOCAB=zstore). T > 0; mode a dg_proposal (Philox uniforms from seed, block, step, or
 * uni [C]); act the self-conditioning dtype (DG_BF16, DG_F16, DG_F32). Returns zstore's statistics stats [C]
 * (dg_pos_stats layout), its first non-finite position *bad (INT32_MAX: none) and the fused chain's probabilities
 * P [C, V] (bf16 bits); n_diff the words (32-bit; P: its 16-bit values) that differ from the chain's: [0] the fused
 * statistics and bad position, [1] fused P after the statistics (the maxima and, sampled, the sums they left),
 * [2] fused P with nothing left (every pass of its own), both with the probabilities' chunk maxima and sums (float
 * and double words) against the chain's, [3] k_vocab_z's z against the chain's in-place z, plus the fused chain's
 * logits against raw (they must stay untouched); [4] zstore's statistics and bad position, [5] zstore's P after its
 * statistics with its chunk maxima and sums, plus the z it stored against the chain's in-place z. */
dg_status dg_cuda_test_vocab_chain(int device, const float *raw, int C, int V, float cap, float T, int act, int mode,
                                   uint64_t seed, uint32_t block, uint32_t step, const float *uni, void *stats,
                                   int32_t *bad, uint16_t *P, long n_diff[7]);

/* Upload n host rows raw [n, V] into context c as if a pass had left them (the tests of the device
 * top-K and self-conditioning rows). Errors: DG_ERR_INVALID_ARG (n outside [0, C]), DG_ERR_BACKEND,
 * DG_ERR_OUT_OF_MEMORY. */
dg_status dg_cuda_test_put_raw_rows(dg_cuda_ctx *c, int32_t n, const float *raw);
/* Copy c's device self-conditioning rows [C, H] to soft (host). Errors: DG_ERR_BACKEND. */
dg_status dg_cuda_test_get_soft(dg_cuda_ctx *c, float *soft);
/* Copy host rows soft [C, H] into c's device self-conditioning rows (a known state for the tests that check which
 * rows a kernel leaves untouched; without it those rows are memory nothing wrote). Errors: DG_ERR_BACKEND. */
dg_status dg_cuda_test_put_soft(dg_cuda_ctx *c, const float *soft);

/* A pinned dense product (src/cuda/gemm_pin.cu) against cublasGemmEx's default on the same inputs: pin i of the
 * table (its shape m x n x k: y[n, m] = x[n, k] W[m, k]^T, W and x filled on the device with values in [-1, 1) of
 * bf16; the pins made whatever DGEMMA_GEMM_PIN says). *n_cfg: the table's size; *active: 1 if the pin ran (cublasLt's
 * heuristic list holds its configuration here),
 * 0 if not, -1 on a build without pins (the emulation), -2 on a device the pins are not for (compute capability
 * other than 9.0; nothing allocated in either case); *n_diff: output words that differ from
 * the default's; *n_checked outputs sampled, each against the bound 2 gamma_K sum_k |x w| of two fp32 dot products
 * of the same terms (gamma_K = K u / (1 - K u), u = 2^-24), *worst the largest |diff| / bound among them.
 * DG_ERR_INVALID_ARG for i outside the table. */
dg_status dg_cuda_test_gemm_pins(int device, int i, int *n_cfg, int *active, long *n_diff, long *n_checked,
                                 double *worst);

/* DGEMMA_STACK_DENSE's mode for the contexts made after it (dg_cuda_stack_dense_set: 0 per canvas, 1 stacked, 2 inv;
 * -1 the environment's). DG_ERR_INVALID_ARG outside -1..2. */
dg_status dg_cuda_test_stack_dense_set(int mode);

/* The batch-invariant product of shape i of gemm_inv_shape (the 26B-A4B pass's products, random bf16 inputs) at M1
 * and at M2 <= M1 rows, the M2 rows being the first M2 of the M1 input (src/cuda/gemm_inv.cu, forced on):
 * *n_shapes the list's length, *active 1 when the invariant product ran (-1 on the emulation: no cublasLt, nothing
 * done), cfg[9] and *rule its configuration (algo, tile, stages, split-K, reduction, swizzle, custom, inner, cluster)
 * and how it was chosen (gemm_inv_config); *n_diff the output words of the first M2 rows that differ between the
 * two products (0: invariant); *n_checked outputs of the M1 product sampled against cublasGemmEx's default at M1,
 * each against the bound 2 gamma_K sum_k |a b| of two fp32 dot products of the same terms (gamma_K = K u /
 * (1 - K u), u = 2^-24), *worst the largest |diff| / bound. Errors: DG_ERR_INVALID_ARG for i outside the list or
 * rows outside 1 <= M2 <= M1; the invariant product's own error (no configuration, refused at a row count). */
dg_status dg_cuda_test_gemm_inv(int device, int i, int M1, int M2, int *n_shapes, int *active, int cfg[9], int *rule,
                                long *n_diff, long *n_checked, double *worst);

/* The combine of a layer with the next layer's input norm in one launch (k_ffn_combine_norm_v versions 0 and 2, each
 * from the same x; n_diff counts both) against the two
 * launches it replaces (k_ffn_combine, then k_rmsnorm of the new x with w_next into bf16), on the same inputs:
 * x fp32 [T, H] (the residual, updated), dense fp32 [T, H], y fp32 [T K, H] (the expert outputs, pair t K + k in row
 * t K + k), experts idx [T, K] (distinct per token), weights w [T, K], the norms' weights w_ff1, w_ff2, w_ff, w_next
 * [H]. *fused: 1 if one launch did both; *n_diff: the words of the new x and of the normed rows (bf16, 16-bit
 * words) that differ between the two ways (0: bit for bit). */
dg_status dg_cuda_test_combine_norm(int device, const float *x, const float *dense, const float *y, const int32_t *idx,
                                    const float *w, const float *w_ff1, const float *w_ff2, const float *w_ff,
                                    const float *w_next, float scalar, float eps, int T, int H, int K, int *fused,
                                    long *n_diff);

/* A context's one device block (src/cuda/context.cu ctx_carves), checked: n_allocs[0..1] the device and pinned
 * host allocations the context made (its own counter, dg_cuda_ctx.n_allocs); n_bufs the buffers carved from the
 * block; n_bad the failures of: every buffer inside the block, at a multiple of 256 bytes from its start and
 * 16-byte aligned, no two overlapping (in address order), and a byte pattern of its own written into every buffer
 * (all of them first, then each read back) found intact. Overwrites the context's device state: for a fresh
 * context that is freed after. */
dg_status dg_cuda_test_ctx_arena(dg_cuda_ctx *c, int32_t n_allocs[2], int *n_bufs, long *n_bad);

/* The weights' allocations of c's model (src/cuda/upload.cu, session 28): *n cudaMalloc calls (one block: 1),
 * *used bytes carved from the block of *cap (0, 0 without one: DGEMMA_WEIGHT_BLOCK=0 when the model was loaded),
 * *weight_bytes the weights' bytes (dg_cuda_model_bytes). */
dg_status dg_cuda_test_weight_block(const dg_cuda_ctx *c, int *n, size_t *used, size_t *cap, size_t *weight_bytes);

/* The entry points above by pointer: dg_cuda_test_table() in the library, found with dlsym so that
 * the tests link in a CPU-only build. */
typedef struct dg_cuda_test_api {
  dg_status (*test_matmul)(int device, const dg_weight *w, int64_t row0, int N, const uint16_t *x, int ldx, int T,
                           float *y, int ldy);
  dg_status (*test_embed)(int device, const dg_weight *e, const int32_t *ids, int T, float scale, float *x);
  dg_status (*test_soft)(int device, const dg_weight *e, const uint16_t *P, int C, float alpha, float *soft);
  dg_status (*test_experts)(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                            const int32_t *idx, int T, int H, int IE, int E, int K, uint16_t *h, float *y);
  dg_status (*test_route)(int device, int mode, float *rlog, const float *pes, int T, int E, int K, int32_t *idx,
                          float *w, int32_t *start, int32_t *pairs, int32_t *order);
  dg_status (*test_attention)(int device, int version, const float *q, const uint16_t *kc, const uint16_t *vc, int S,
                              int nq, int NH, int NKV, int D, int32_t pos0, int32_t kv_hi, int causal, int is_full,
                              int window, uint16_t *out);
  dg_status (*put_raw_rows)(dg_cuda_ctx *c, int32_t n, const float *raw);
  dg_status (*get_soft)(dg_cuda_ctx *c, float *soft);
  dg_status (*test_router_route)(int device, int mode, const float *u, const float *W, const float *pes, int T, int E,
                                 int H, int K, int32_t *idx, float *w, long *n_diff);
  dg_status (*test_experts_nt)(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                               const int32_t *idx, int T, int H, int IE, int E, int K, int nt, int dq_from, uint16_t *h,
                               float *y);
  dg_status (*test_gemm_pins)(int device, int i, int *n_cfg, int *active, long *n_diff, long *n_checked,
                              double *worst);
  dg_status (*test_combine_norm)(int device, const float *x, const float *dense, const float *y, const int32_t *idx,
                                 const float *w, const float *w_ff1, const float *w_ff2, const float *w_ff,
                                 const float *w_next, float scalar, float eps, int T, int H, int K, int *fused,
                                 long *n_diff);
  dg_status (*test_vocab_chain)(int device, const float *raw, int C, int V, float cap, float T, int act, int mode,
                                uint64_t seed, uint32_t block, uint32_t step, const float *uni, void *stats,
                                int32_t *bad, uint16_t *P, long n_diff[7]);
  dg_status (*test_experts_dn_fuse)(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                                    const int32_t *idx, int T, int H, int IE, int E, int K, int nt, long n_diff[2],
                                    int *fused);
  dg_status (*test_ctx_arena)(dg_cuda_ctx *c, int32_t n_allocs[2], int *n_bufs, long *n_bad);
  dg_status (*test_dn_fuse_group)(int gu_bits, int gu_group, int dn_bits, int dn_group, int IE, int dq_from, int *G);
  dg_status (*test_vocab_set)(int mode);
  dg_status (*test_branch_set)(int on);
  dg_status (*test_branch_stats)(const dg_cuda_ctx *c, int *on, int64_t *forks);
  dg_status (*test_experts_diet)(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                                 const int32_t *idx, int T, int H, int IE, int E, int K, int nt, long n_diff[2]);
  dg_status (*test_experts_lab)(int device, int version, const dg_weight *gate_up, const dg_weight *down,
                                const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E, int K, int nt,
                                long n_diff[2]);
  dg_status (*put_soft)(dg_cuda_ctx *c, const float *soft);
  dg_status (*test_group_sums_perm)(int device, int version, const uint16_t *x, int rows, int cols, int G, float *xs,
                                    uint16_t *xp);
  dg_status (*test_wgmma)(int device, int mode, const uint16_t *A, const uint16_t *Bt, const float *C, float *D,
                          int *avail);
  dg_status (*test_experts_qw)(int device, int version, const dg_weight *gate_up, const dg_weight *down,
                               const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E, int K, int nt,
                               uint16_t *h, float *y, int *avail);
  dg_status (*test_bulk)(int device, int mode, const uint8_t *src, uint8_t *dst, int n);
  dg_status (*test_stack_dense_set)(int mode);
  dg_status (*test_gemm_inv)(int device, int i, int M1, int M2, int *n_shapes, int *active, int cfg[9], int *rule,
                             long *n_diff, long *n_checked, double *worst);
  dg_status (*test_experts_fg)(int on, long *launches);
  dg_status (*test_sc_probs)(int device, int act, int B, const int32_t *n, int V, float cap, const float *T,
                             const float *raw, uint16_t *p_tab, uint16_t *p_row, double *sum_tab, double *sum_row);
  dg_status (*test_sc_probs_set)(int mode);
  dg_status (*test_weight_block)(const dg_cuda_ctx *c, int *n, size_t *used, size_t *cap, size_t *weight_bytes);
  dg_status (*test_soft_from_z)(dg_cuda_ctx *c, int *sc_group);
  dg_status (*test_attention_batch)(int device, int nb, const float *const *q, const uint16_t *const *kc,
                                    const uint16_t *const *vc, const int32_t *S, const int32_t *nq, const int32_t *pos0,
                                    const int32_t *kv_hi, int NH, int NKV, int D, int is_full, int window,
                                    uint16_t *const *out);
  dg_status (*test_seg_streams)(int n, int64_t *forks);
} dg_cuda_test_api;

/* dg_cuda_soft_from_z(c) (the reference sampler's kept self-conditioning: P, then the SC product) and c's
 * sc_group (0: P in a buffer of its own; G > 0: P over the logits in groups of G rows, common.cuh), for the test
 * that the logits are refused after it (DG_ERR_INVALID_ARG) until a decoder pass writes them again. */
dg_status dg_cuda_test_soft_from_z(dg_cuda_ctx *c, int *sc_group);
/* The decoder attention of nb canvases (each its own q [nq, NH, D] fp32, bf16 caches [NKV, S, D], positions pos0,
 * keys [lo, kv_hi)) in one call of k_attention_batch (version 18, src/cuda/attention.cu: up to 8 canvases a launch,
 * each canvas its own split count) into out[i] [nq, NH, D] bf16; D 128, 256 or 512; needs wgmma (sm_90a, the caller
 * probes: test_wgmma). DG_ERR_INVALID_ARG for a bad shape naming the canvas. */
dg_status dg_cuda_test_attention_batch(int device, int nb, const float *const *q, const uint16_t *const *kc,
                                       const uint16_t *const *vc, const int32_t *S, const int32_t *nq,
                                       const int32_t *pos0, const int32_t *kv_hi, int NH, int NKV, int D, int is_full,
                                       int window, uint16_t *const *out);

/* DGEMMA_SEG_STREAMS for the contexts made next (dg_cuda_seg_streams_set, src/cuda/host.cuh): n 1..8 the streams a
 * stacked pass's per-canvas products go to (1: one, the order without the switch), -1 the environment's choice again;
 * *forks (if not NULL): the forks to those streams every context has issued so far in this process (seg_forks_total).
 * DG_ERR_INVALID_ARG for other n. */
dg_status dg_cuda_test_seg_streams(int n, int64_t *forks);

const dg_cuda_test_api *dg_cuda_test_table(void);

#ifdef __cplusplus
}
#endif
#endif
