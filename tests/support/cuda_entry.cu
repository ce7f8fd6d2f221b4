/* cuda_entry.cu: the CUDA backend's test entry points (dg_cuda_test_*,
 * cuda_entry.h): one kernel on host data each, for tests/test_cuda.c. Built
 * into the test support library $(BUILD)/libdgemma_cuda_test.so, linked
 * against the CUDA plugin (whose upload and kernel launchers it calls) and
 * opened only by the tests: nothing here ships in the plugin. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/host.cuh"
#include "cuda/qmoe_r.cuh" /* qr_launch_bits of DIET 0, qr_launcher_set */
#include "../../dev/cuda/qr_diet_lab.cuh" /* the kernel lab's versions 95-114 (dg_cuda_test_experts_lab; 112, 114: _qw) */
#include "../../dev/cuda/qmoe_w.cuh"     /* the lab's wgmma versions 20-22, 75 (dg_cuda_test_experts_qw) */
#include "../../dev/cuda/attention_lab.cuh" /* the attention lab's versions 9-15 (dg_cuda_test_attention) */
#include "cuda/qmoe_wl.cuh" /* the large-M wgmma kernel: lab versions 120-124 (dg_cuda_test_experts_qw) */

#include "cuda_entry.h"

/* Upload one matrix for a test (float or quantized) into al. */
static dg_status test_up(alloc_list *al, dg_cuda_w *w, const dg_weight *m) {
  DG_TRY(check_mat(m, "test matrix", -1));
  uint16_t *stage = NULL;
  if (!m->bits && m->dtype != DG_BF16 && !(stage = (uint16_t *)malloc(STAGE_ELEMS * 2)))
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  const dg_weight *p1[1] = {m};
  dg_status st = up_w(al, w, p1, 1, "test matrix", stage);
  free(stage);
  return st;
}

/* Device copy of n host bytes. */
static dg_status test_in(alloc_list *al, void **dst, const void *src, size_t n, const char *what) {
  DG_TRY(dalloc(al, dst, n, what));
  CK(cudaMemcpy(*dst, src, n, cudaMemcpyHostToDevice));
  return DG_OK;
}

/* A test's start: its device, then matrix m uploaded as W into al. */
static dg_status test_begin(int device, alloc_list *al, dg_cuda_w *W, const dg_weight *m) {
  CK(cudaSetDevice(device));
  return test_up(al, W, m);
}

/* Wait for a test's kernels, then copy n result bytes from the device to the host. */
static dg_status test_out(void *dst, const void *src, size_t n) {
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  return DG_OK;
}

/* The grouping buffers of b for TK = T * K routed pairs over E experts (k_group's outputs). */
static dg_status test_group_bufs(alloc_list *al, dg_cuda_moe_buf *b, size_t TK, int E) {
  DG_TRY(dalloc(al, (void **)&b->count, (size_t)E * 4, "count"));
  DG_TRY(dalloc(al, (void **)&b->start, (size_t)(E + 1) * 4, "start"));
  DG_TRY(dalloc(al, (void **)&b->pairs, TK * 4, "pairs"));
  DG_TRY(dalloc(al, (void **)&b->slot_row, TK * 4, "slot_row"));
  DG_TRY(dalloc(al, (void **)&b->tiles, (TK + E) * 2 * 4, "tiles"));
  DG_TRY(dalloc(al, (void **)&b->order, (size_t)E * 4, "order"));
  DG_TRY(dalloc(al, (void **)&b->wl_count, (size_t)E * 8, "wl_count"));
  DG_TRY(dalloc(al, (void **)&b->done, (4 + (size_t)E) * 4, "route block counter and DGEMMA_EXPERTS_FG's counters"));
  CK(cudaMemset(b->done, 0, (4 + (size_t)E) * 4));
  b->fg_off = 1; /* the fused launch's 3 + E counters after the router's (dg_moe_fg) */
  DG_TRY(dalloc(al, (void **)&b->gsc, DG_ROUTE_GSC_INTS * 4, "route grid scratch"));
  CK(cudaMemset(b->gsc, 0, DG_ROUTE_GSC_INTS * 4));
  return dalloc(al, (void **)&b->n_tiles, 4, "n_tiles");
}

#define TT_(x) do { if ((st = (x)) != DG_OK) goto done; } while (0)
#define TC_(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    st = dg_seterr(DG_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    goto done; } } while (0)

extern "C" dg_status dg_cuda_test_matmul(int device, const dg_weight *w, int64_t row0, int N, const uint16_t *x,
                                         int ldx, int T, float *y, int ldy) {
  if (!w->bits || row0 < 0 || row0 + N > w->rows || ldx < w->cols || ldy < N || T <= 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_matmul: needs a quantized matrix and row0 + N <= rows, "
                                         "ldx >= cols, ldy >= N, T > 0");
  alloc_list al = {NULL, 0, 0};
  dg_cuda_w W;
  void *dx = NULL, *dy = NULL;
  dg_status st = test_begin(device, &al, &W, w);
  if (st != DG_OK) goto done;
  TT_(test_in(&al, &dx, x, (size_t)T * ldx * 2, "x"));
  TT_(test_in(&al, &dy, y, (size_t)T * ldy * 4, "y"));
  TC_(k_qmatmul(0, (const bf16 *)dx, ldx, T, &W, row0, N, (float *)dy, ldy));
  TT_(test_out(y, dy, (size_t)T * ldy * 4));
done:
  dfree_all(&al);
  return st;
}

extern "C" dg_status dg_cuda_test_embed(int device, const dg_weight *e, const int32_t *ids, int T, float scale,
                                        float *x) {
  for (int t = 0; t < T; t++)
    if (ids[t] < 0 || ids[t] >= e->rows) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_embed: id %d", ids[t]);
  alloc_list al = {NULL, 0, 0};
  dg_cuda_w W;
  void *dids = NULL, *dx = NULL;
  dg_status st = test_begin(device, &al, &W, e);
  if (st != DG_OK) goto done;
  TT_(test_in(&al, &dids, ids, (size_t)T * 4, "ids"));
  TT_(dalloc(&al, &dx, (size_t)T * e->cols * 4, "x"));
  TC_(k_embed(0, (float *)dx, &W, (const int32_t *)dids, T, (int)e->cols, scale));
  TT_(test_out(x, dx, (size_t)T * e->cols * 4));
done:
  dfree_all(&al);
  return st;
}

extern "C" dg_status dg_cuda_test_soft(int device, const dg_weight *e, const uint16_t *P, int C, float alpha,
                                       float *soft) {
  if (!e->bits || C <= 0) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_soft: needs a quantized matrix, C > 0");
  alloc_list al = {NULL, 0, 0};
  dg_cuda_w W;
  void *dp = NULL, *ds = NULL;
  dg_status st = test_begin(device, &al, &W, e);
  if (st != DG_OK) goto done;
  TT_(test_in(&al, &dp, P, (size_t)C * e->rows * 2, "P"));
  TT_(dalloc(&al, &ds, (size_t)C * e->cols * 4, "soft"));
  TC_(k_qsoft(0, (const bf16 *)dp, C, &W, alpha, (float *)ds));
  TT_(test_out(soft, ds, (size_t)C * e->cols * 4));
done:
  dfree_all(&al);
  return st;
}

static dg_status test_experts_with(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                                   const int32_t *idx, int T, int H, int IE, int E, int K, int nt, int dq_from,
                                   int fuse, int *fused, uint16_t *h, float *y);
extern "C" dg_status dg_cuda_test_experts(int device, const dg_weight *gate_up, const dg_weight *down,
                                          const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E, int K,
                                          uint16_t *h, float *y) {
  int fused;
  return test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, -1, -1, -1, &fused, h, y);
}
/* test_experts_with twice, with the down product's input copy by its own launch and the backend's launchers first,
 * then with fuse1 and the launcher swap (qr_launcher_set; NULL: the backend's): the words of h [0] and y [1] that
 * differ; fused0 / fused1: whether each run's gate/up kernel made the copy. */
static dg_status experts_twice(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                               const int32_t *idx, int T, int H, int IE, int E, int K, int nt, int fuse1,
                               qr_launcher swap, long n_diff[2], int *fused0, int *fused1) {
  const size_t nh = (size_t)T * K * IE, ny = (size_t)T * K * H;
  uint16_t *h0 = (uint16_t *)malloc(nh * 2), *h1 = (uint16_t *)malloc(nh * 2);
  float *y0 = (float *)malloc(ny * 4), *y1 = (float *)malloc(ny * 4);
  dg_status st = !h0 || !h1 || !y0 || !y1 ? dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory") : DG_OK;
  if (st == DG_OK) st = test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, 0, fused0, h0, y0);
  qr_launcher_set(swap);
  if (st == DG_OK) st = test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, fuse1, fused1, h1, y1);
  qr_launcher_set(NULL);
  n_diff[0] = n_diff[1] = 0;
  if (st == DG_OK) {
    for (size_t i = 0; i < nh; i++) n_diff[0] += h0[i] != h1[i];
    for (size_t i = 0; i < ny; i++) n_diff[1] += memcmp(&y0[i], &y1[i], 4) != 0;
  }
  free(h0); free(h1); free(y0); free(y1);
  return st;
}
/* The experts with the down product's input copy made by the gate/up kernel (fuse 1) and by its own launch (0),
 * word for word. */
extern "C" dg_status dg_cuda_test_experts_dn_fuse(int device, const dg_weight *gate_up, const dg_weight *down,
                                                  const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E,
                                                  int K, int nt, long n_diff[2], int *fused) {
  if (nt < 0 || nt > 8 || nt == 6 || nt == 7)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_dn_fuse: tile count %d (1-5, 8 or 0)", nt);
  int f0 = 0;
  dg_status st = experts_twice(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 1, NULL, n_diff, &f0, fused);
  if (st == DG_OK && f0) st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_experts_dn_fuse: fused with the switch off");
  return st;
}
/* qr_kernel with the other stage loop than the backend's at every tile count (qr_launch_bits' FLIP 1: the loop
 * before the SASS diet where the backend runs the diet (QR_DIET_TILES), the diet elsewhere) for 3-
 * and 4-bit and bf16 stacks: the launcher dg_cuda_test_experts_diet swaps in (qr_launcher_set) */
static cudaError_t nodiet_launch(cudaStream_t s, dim3 grid, int nt, const qe_args &a, int bits, int gateup) {
  switch (bits) {
  case 3: return gateup ? qr_launch_bits<3, 1, 1>(s, grid, nt, a) : qr_launch_bits<3, 0, 1>(s, grid, nt, a);
  case 4: return gateup ? qr_launch_bits<4, 1, 1>(s, grid, nt, a) : qr_launch_bits<4, 0, 1>(s, grid, nt, a);
  case 16: return gateup ? qr_launch_bits<16, 1, 1>(s, grid, nt, a) : qr_launch_bits<16, 0, 1>(s, grid, nt, a);
  default: return cudaErrorInvalidValue; /* not instantiated here */
  }
}
extern "C" dg_status dg_cuda_test_experts_diet(int device, const dg_weight *gate_up, const dg_weight *down,
                                               const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E,
                                               int K, int nt, long n_diff[2]) {
  if (nt < 0 || nt > 8 || nt == 6 || nt == 7)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_diet: tile count %d (1-5, 8 or 0)", nt);
  int f0, f1;
  return experts_twice(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, nodiet_launch, n_diff, &f0, &f1);
}
/* The kernel lab's version lab_ver of the 4-bit products (dev/cuda/qr_diet_lab.cuh qr_diet_version: the SASS diet
 * with other launch choices), the launcher dg_cuda_test_experts_lab swaps in (qr_launcher_set) */
static int lab_ver;
static cudaError_t lab_launch(cudaStream_t s, dim3 grid, int nt, const qe_args &a, int bits, int gateup) {
  if (bits != 4) return cudaErrorInvalidValue; /* the candidates are instantiated for 4 bits only */
  return gateup ? qr_diet_version<4, 1>(lab_ver, s, grid, nt, a) : qr_diet_version<4, 0>(lab_ver, s, grid, nt, a);
}
/* Version 110 (qr_diet_lab.cuh qr_tl_kernel) through experts_twice, then the timeline of its last launch (the down
 * product's; none where it ran version 50's kernel, qr_tl_blocks 0): every block of an expert with rows has its
 * stamps in program order (clock: entry < row table < first activation stage < first weight stage < loop end <
 * epilogue end, strictly on the emulation, whose stamps are one counter; on a GPU equal clocks are allowed and a
 * first-weight stamp of 0 is the one record word in 2^32 that reads as "no stamp"), an expert without rows its five
 * body stamps equal, globaltimer entry <= end, and the expert and row count of word 9 in range; DG_ERR_BACKEND
 * naming the first block that is not. */
static dg_status experts_tl(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                            const int32_t *idx, int T, int H, int IE, int E, int K, int nt, long n_diff[2]) {
  int f0, f1;
  qr_tl_blocks = 0;
  dg_status st = experts_twice(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, lab_launch, n_diff, &f0, &f1);
  if (st != DG_OK || qr_tl_blocks == 0) return st;
  const size_t nb = qr_tl_blocks;
  uint64_t *w = (uint64_t *)malloc(nb * QR_TL_WORDS * 8);
  if (!w) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  if (cudaMemcpy(w, qr_tl_buf, nb * QR_TL_WORDS * 8, cudaMemcpyDeviceToHost) != cudaSuccess) {
    free(w);
    return dg_seterr(DG_ERR_BACKEND, "experts_tl: the timeline's copy failed");
  }
#ifdef DG_CUDA_EMU
  const int strict = 1;
#else
  const int strict = 0;
#endif
  for (size_t b = 0; b < nb && st == DG_OK; b++) {
    const uint64_t *s = w + b * QR_TL_WORDS;
    const long e = (long)(s[9] >> 32), cnt = (long)(uint32_t)s[9];
    int ok = e >= 0 && e < E && cnt >= 0 && cnt <= (long)T * K && s[0] <= s[1];
    uint64_t prev = s[2];
    for (int k = 3; k < 8 && ok; k++) {
      if (cnt == 0 && k > 3) {
        ok = s[k] == s[3];
        continue;
      }
      if (k == 5 && cnt > 0 && s[5] == 0 && !strict) continue; /* no stamp (the record word 0x9e3779b9) */
      ok = strict ? prev < s[k] : prev <= s[k];
      prev = s[k];
    }
    if (!ok)
      st = dg_seterr(DG_ERR_BACKEND, "experts_tl: block %zu of %zu: stamps out of order or out of range (expert %ld, "
                     "%ld rows; clock %llu %llu %llu %llu %llu %llu)", b, nb, e, cnt, (unsigned long long)s[2],
                     (unsigned long long)s[3], (unsigned long long)s[4], (unsigned long long)s[5],
                     (unsigned long long)s[6], (unsigned long long)s[7]);
  }
  free(w);
  return st;
}
extern "C" dg_status dg_cuda_test_experts_lab(int device, int version, const dg_weight *gate_up, const dg_weight *down,
                                              const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E,
                                              int K, int nt, long n_diff[2]) {
  if (nt < 0 || nt > 8 || nt == 6 || nt == 7)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_lab: tile count %d (1-5, 8 or 0)", nt);
  if (version < 95 || version > 111)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_lab: version %d (95-111)", version);
  if (gate_up->bits != 4 || down->bits != 4)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_lab: %d/%d-bit stacks (4-bit only)",
                     gate_up->bits, down->bits);
  int f0, f1;
  lab_ver = version;
  if (version == 110) return experts_tl(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, n_diff);
  if (version < 107 || version > 108)
    return experts_twice(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, lab_launch, n_diff, &f0, &f1);
  /* 107-108, the persistent grid: once with the resident blocks (the emulation's 132, at least the items: a block
   * each), once capped at 3 blocks (each takes items b, b + 3, ...: the item loop, the next item's prefetch); the
   * words that differ summed over both */
  long nd2[2] = {0, 0};
  qr_pers_grid_cap = 0;
  dg_status st = experts_twice(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, lab_launch, n_diff, &f0, &f1);
  if (st != DG_OK) return st;
  qr_pers_grid_cap = 3;
  st = experts_twice(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, lab_launch, nd2, &f0, &f1);
  qr_pers_grid_cap = 0;
  n_diff[0] += nd2[0];
  n_diff[1] += nd2[1];
  return st;
}
/* k_qe_dn_fuse_group on lane-record stacks of the given widths (0: bf16) and groups, with b->hs set, the switch
 * forced on and DGEMMA_QR_DQ's choice dq_from (qr_dq_set): host bookkeeping only, no device memory. */
extern "C" dg_status dg_cuda_test_dn_fuse_group(int gu_bits, int gu_group, int dn_bits, int dn_group, int IE,
                                                int dq_from, int *G) {
  if (dq_from < 0 || dq_from > 8)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_dn_fuse_group: DQ from %d (0-8)", dq_from);
  dg_cuda_w gu, dn;
  memset(&gu, 0, sizeof gu);
  memset(&dn, 0, sizeof dn);
  gu.bits = gu_bits; gu.group = gu_group; gu.lay = DG_CUDA_LAY_LANES;
  dn.bits = dn_bits; dn.group = dn_group; dn.lay = DG_CUDA_LAY_LANES;
  dg_cuda_moe_buf b;
  memset(&b, 0, sizeof b);
  float hs_word = 0; /* only tested for NULL */
  b.hs = &hs_word;
  qr_dn_fuse_set(1);
  qr_dq_set(dq_from);
  *G = k_qe_dn_fuse_group(&gu, &dn, IE, &b);
  qr_dq_set(-1);
  qr_dn_fuse_set(-1);
  return DG_OK;
}
extern "C" dg_status dg_cuda_test_vocab_set(int mode) {
  if (mode < -1 || mode > 2) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_vocab_set: mode %d (-1..2)", mode);
  dg_cuda_vocab_set(mode);
  return DG_OK;
}
extern "C" dg_status dg_cuda_test_branch_set(int on) {
  if (on < -1 || on > 1) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_branch_set: %d (-1..1)", on);
  dg_cuda_branch_set(on);
  return DG_OK;
}
extern "C" dg_status dg_cuda_test_experts_fg(int on, long *launches) {
  if (on < -1 || on > 1) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_fg: %d (-1..1)", on);
  qr_experts_fg_set(on);
  if (launches) *launches = qr_fg_launches;
  return DG_OK;
}
extern "C" dg_status dg_cuda_test_seg_streams(int n, int64_t *forks) {
  if (n != -1 && (n < 1 || n > DG_SEG_STREAMS_MAX))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_seg_streams: %d (-1 or 1..%d)", n, DG_SEG_STREAMS_MAX);
  dg_cuda_seg_streams_set(n);
  if (forks) *forks = seg_forks_total;
  return DG_OK;
}
extern "C" dg_status dg_cuda_test_branch_stats(const dg_cuda_ctx *c, int *on, int64_t *forks) {
  if (!c || !on || !forks) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_branch_stats: NULL argument");
  *on = c->side.on;
  *forks = c->side.forks;
  return DG_OK;
}
extern "C" dg_status dg_cuda_test_experts_nt(int device, const dg_weight *gate_up, const dg_weight *down,
                                             const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E,
                                             int K, int nt, int dq_from, uint16_t *h, float *y) {
  if (nt < 0 || nt > 8 || nt == 6 || nt == 7 || dq_from < 0 || dq_from > 8)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_nt: tile count %d (1-5, 8 or 0) or DQ from %d (0-8)",
                     nt, dq_from);
  int fused;
  return test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, dq_from, -1, &fused, h, y);
}
/* Lab version 114 (dev/cuda/qr_diet_lab.cuh qr_fg_version: gate/up and down in one launch) in place of the backend's
 * launches while fg_on is set (test_experts_with, with the fused down input forced on): the gate/up input's copy
 * (k_group_sums_perm, as k_qe_gate_up makes it), then the one launch over the arguments k_qe_gate_up (QR_GATEUP_HP)
 * and k_qe_down (over h and its sums) would pass; synchronized, then its counters read (qr_fg_error: fg_err 1 a
 * down block's wait found its expert's gate/up blocks not all counted, 2 a counter not back at 0). */
static int fg_on, fg_err, fg_ver = 114; /* fg_ver: 114, or 116-119 (qr_fgx_version) */
/* After a launch of version 116 (synchronized): its timeline (qr_fgx_buf, a row per ticket) covers every item
 * exactly once (gate/up: expert order index x ngu slabs, then down: x ndn; from words 9 and 13 against gu.order) and
 * each block of an expert with rows has its stamps in program order (clock: entry <= ticket <= row table <= first
 * activation stage <= first weight stage <= loop end <= epilogue end; globaltimer: entry <= ticket <= end, a down
 * block's wait end between its ticket and its end, a gate/up block's count after its end; strictly on the emulation,
 * whose stamps are one counter). fg_err 3 where not (a message on stderr). */
static void fgx_check(int E, int ngu, int ndn, const int *order_h) {
  const size_t nb = qr_fgx_blocks;
  if (!nb) return;
  uint64_t *w = (uint64_t *)malloc(nb * QR_FGX_WORDS * 8);
  int *seen = (int *)calloc(nb, sizeof(int));
  int *pos = (int *)malloc((size_t)E * sizeof(int));
  if (!w || !seen || !pos || cudaMemcpy(w, qr_fgx_buf, nb * QR_FGX_WORDS * 8, cudaMemcpyDeviceToHost) != cudaSuccess) {
    fg_err = 3;
    free(w); free(seen); free(pos);
    return;
  }
  for (int i = 0; i < E; i++) pos[order_h[i]] = i;
#ifdef DG_CUDA_EMU
  const int strict = 1;
#else
  const int strict = 0;
#endif
  for (size_t b = 0; b < nb && fg_err == 0; b++) {
    const uint64_t *x = w + b * QR_FGX_WORDS;
    const int prod = (int)(x[13] >> 32), slab = (int)(uint32_t)x[13], e = (int)(x[9] >> 32), cnt = (int)(uint32_t)x[9];
    int ok = (prod == 0 || prod == 1) && e >= 0 && e < E && slab >= 0 && slab < (prod ? ndn : ngu);
    if (ok) {
      const size_t item = prod ? (size_t)E * ngu + (size_t)pos[e] * ndn + slab : (size_t)pos[e] * ngu + slab;
      ok = item < nb && seen[item]++ == 0;
    }
    if (ok && cnt > 0) {
      const uint64_t c[7] = {x[2], x[10], x[3], x[4], x[5], x[6], x[7]};
      for (int k = 1; k < 7 && ok; k++) ok = strict ? c[k - 1] < c[k] : c[k - 1] <= c[k] || (k == 4 && c[k] == 0);
      ok = ok && x[0] <= x[11] && x[11] <= x[1];
      if (prod) ok = ok && x[11] <= x[12] && x[12] <= x[1];
      else ok = ok && x[1] <= x[12];
    }
    if (!ok) {
      fprintf(stderr, "version %d: ticket %zu of %zu: timeline out of order or an item not covered once (product %d, "
              "expert %d, slab %d, %d rows)\n", fg_ver, b, nb, prod, e, slab, cnt);
      fg_err = 3;
    }
  }
  free(w); free(seen); free(pos);
}
static cudaError_t experts_fg(const dg_cuda_layer *l, const bf16 *xe, dg_cuda_moe_buf *b, int T, int H, int IE, int E,
                              int K, int nt) {
  const dg_cuda_w *W = &l->experts_gate_up, *V = &l->experts_down;
  if (W->bits != 4 || V->bits != 4 || W->lay != DG_CUDA_LAY_LANES || V->lay != DG_CUDA_LAY_LANES || !b->hs)
    return cudaErrorInvalidValue;
  cudaError_t e = k_group_sums_perm(0, xe, T, H, W->group, b->xs, b->xp);
  if (e != cudaSuccess) return e;
  qe_args a, d;
  memset(&a, 0, sizeof a);
  a.q = W->q; a.sbp = W->sbp; a.sb = W->sb; a.group = W->group;
  a.count = b->count; a.start = b->start; a.pairs = b->pairs; a.order = b->order; a.topk = K;
  d = a;
  a.X = b->xp; a.xs = b->xs; a.Kdim = H; a.N = IE; a.h = b->h; a.hg = W->group; a.hs = b->hs;
  d.q = V->q; d.sbp = V->sbp; d.sb = V->sb; d.group = V->group;
  d.X = b->h; d.xs = b->hs; d.Kdim = IE; d.N = H; d.y = b->y;
  e = fg_ver == 114 ? qr_fg_version<4>(0, E, nt > 0 ? nt : qe_nt(T, K, E), a, d)
                     : qr_fgx_version<4>(fg_ver, 0, E, nt > 0 ? nt : qe_nt(T, K, E), a, d);
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  if (e == cudaSuccess) fg_err = qr_fg_error(E);
  if (e == cudaSuccess && fg_ver != 114)
    printf("#   version %d: E %d, ticket order ia %d ik %d (%s)\n", fg_ver, E, qr_fgx_ia, qr_fgx_ik,
           fg_ver >= 119 ? "114's, persistent blocks" : qr_fgx_ik ? "interleaved" : "114's");
  if (e == cudaSuccess && fg_ver >= 119) printf("#   version %d: %d blocks\n", fg_ver, qr_fgp_grid);
  if (e == cudaSuccess && fg_err == 0 && fg_ver != 114 && qr_fgx_blocks) {
    int *order_h = (int *)malloc((size_t)E * sizeof(int));
    if (!order_h || cudaMemcpy(order_h, b->order, (size_t)E * 4, cudaMemcpyDeviceToHost) != cudaSuccess) fg_err = 3;
    else fgx_check(E, IE / (16 * QR_WARPS), (H + 32 * QR_WARPS - 1) / (32 * QR_WARPS), order_h);
    free(order_h);
  }
  return e;
}
/* nt < 0: dg_cuda_experts as the passes call it; else dg_cuda_experts_nt with nt and dq_from. fuse 0 / 1: the down
 * product's input copy by its own launch / by the gate/up kernel where it can (qr_dn_fuse_set; -1: DGEMMA_DN_FUSE's
 * choice); fuse 0 also holds DGEMMA_EXPERTS_FG off (its launch makes the copy in the epilogue); *fused: whether the
 * gate/up kernel made it, by DGEMMA_DN_FUSE or in DGEMMA_EXPERTS_FG's launch (h is then read back in
 * k_group_sums_perm's order and returned in the plain one). b's DGEMMA_EXPERTS_FG counters must be back at 0 after
 * the run. */
static dg_status test_experts_with(int device, const dg_weight *gate_up, const dg_weight *down, const uint16_t *xe,
                                   const int32_t *idx, int T, int H, int IE, int E, int K, int nt, int dq_from,
                                   int fuse, int *fused, uint16_t *h, float *y) {
  if (gate_up->rows != (int64_t)E * 2 * IE || gate_up->cols != H || down->rows != (int64_t)E * H || down->cols != IE ||
      T <= 0 || K <= 0 || K > E)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts: shapes [%lld, %lld] and [%lld, %lld] do not match "
                                         "E %d, H %d, IE %d", (long long)gate_up->rows, (long long)gate_up->cols,
                     (long long)down->rows, (long long)down->cols, E, H, IE);
  for (int i = 0; i < T * K; i++)
    if (idx[i] < 0 || idx[i] >= E) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts: expert id %d", idx[i]);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  dg_cuda_layer l;
  memset(&l, 0, sizeof l);
  dg_cuda_moe_buf b;
  memset(&b, 0, sizeof b);
  void *dxe = NULL;
  const size_t TK = (size_t)T * K;
  int32_t *slot_row = (int32_t *)malloc(TK * 4);
  uint16_t *hd = (uint16_t *)malloc(TK * IE * 2);
  float *yd = (float *)malloc(TK * H * 4);
  if (!slot_row || !hd || !yd) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  TT_(check_mat(gate_up, "test gate_up", -1));
  TT_(check_mat(down, "test down", -1));
  TT_(up_experts(&al, &l.experts_gate_up, gate_up, 1, E, "test gate_up", NULL));
  TT_(up_experts(&al, &l.experts_down, down, 0, E, "test down", NULL));
  TT_(test_in(&al, &dxe, xe, (size_t)T * H * 2, "xe"));
  TT_(test_in(&al, (void **)&b.topk_idx, idx, TK * 4, "topk_idx"));
  TT_(test_group_bufs(&al, &b, TK, E));
  TT_(dalloc(&al, (void **)&b.h, TK * IE * 2, "h"));
  TT_(dalloc(&al, (void **)&b.y, TK * H * 4, "y"));
  TT_(dalloc(&al, (void **)&b.xs, (TK * IE > (size_t)T * H ? TK * IE : (size_t)T * H) / 32 * 4, "xs"));
  TT_(dalloc(&al, (void **)&b.xp, (TK * IE > (size_t)T * H ? TK * IE : (size_t)T * H) * 2, "xp"));
  TT_(dalloc(&al, (void **)&b.hs, TK * IE / 32 * 4, "hs"));
  TC_(k_group(0, &b, T, E, K));
  if (fuse == 0) qr_experts_fg_set(0); /* the separate copy: no fused epilogue, so not DGEMMA_EXPERTS_FG's launch */
  qr_dn_fuse_set(fuse);
  if (nt >= 0) qr_dq_set(dq_from); /* as dg_cuda_experts_nt sets it: k_qe_dn_fuse_group reads it */
  *fused = k_qe_dn_fuse_group(&l.experts_gate_up, &l.experts_down, IE, &b) > 0;
  qr_dq_set(-1);
  if (fg_on && !*fused) {
    qr_dn_fuse_set(-1);
    if (fuse == 0) qr_experts_fg_set(-1);
    st = dg_seterr(DG_ERR_INVALID_ARG, "version 114: the stacks do not take the fused down input (k_qe_dn_fuse_group)");
    goto done;
  }
  {
    const long fg0 = qr_fg_launches;
    const cudaError_t e = fg_on    ? experts_fg(&l, (const bf16 *)dxe, &b, T, H, IE, E, K, nt)
                          : nt < 0 ? dg_cuda_experts(0, &l, (const bf16 *)dxe, &b, T, H, IE, E, K)
                                   : dg_cuda_experts_nt(0, &l, (const bf16 *)dxe, &b, T, H, IE, E, K, nt, dq_from);
    qr_dn_fuse_set(-1); /* before any exit */
    if (fuse == 0) qr_experts_fg_set(-1);
    if (qr_fg_launches != fg0) *fused = 1; /* DGEMMA_EXPERTS_FG's launch: h in the fused order too */
    if (e != cudaSuccess) {
      st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_experts%s: %s", nt < 0 ? "" : "_nt", cudaGetErrorString(e));
      goto done;
    }
  }
  TT_(test_out(slot_row, b.slot_row, TK * 4));
  TC_(cudaMemcpy(hd, b.h, TK * IE * 2, cudaMemcpyDeviceToHost));
  if (*fused) /* runs of 8 stored as (x0, x4, x1, x5, x2, x6, x3, x7) */
    for (size_t r = 0; r < TK * IE; r += 8) {
      uint16_t v[8];
      for (int i = 0; i < 4; i++) { v[i] = hd[r + 2 * i]; v[4 + i] = hd[r + 2 * i + 1]; }
      memcpy(hd + r, v, 16);
    }
  TC_(cudaMemcpy(yd, b.y, TK * H * 4, cudaMemcpyDeviceToHost));
  { /* DGEMMA_EXPERTS_FG=1's counters: every launch must leave them zero (its last block's reset) */
    const int n = 3 + E;
    int32_t *fgc = (int32_t *)malloc((size_t)n * 4);
    if (!fgc) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
    const cudaError_t e = cudaMemcpy(fgc, dg_moe_fg(&b), (size_t)n * 4, cudaMemcpyDeviceToHost);
    int bad = -1;
    for (int i = 0; i < n && e == cudaSuccess && bad < 0; i++)
      if (fgc[i]) bad = i;
    if (e != cudaSuccess) st = dg_seterr(DG_ERR_BACKEND, "cudaMemcpy of DGEMMA_EXPERTS_FG's counters: %s", cudaGetErrorString(e));
    else if (bad >= 0)
      st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_experts: DGEMMA_EXPERTS_FG's counter %d is %d after the launch (not back "
                                     "at 0)", bad, fgc[bad]);
    free(fgc);
    if (st != DG_OK) goto done;
  }
  for (size_t i = 0; i < TK; i++) { /* grouped order -> (token, slot) order */
    memcpy(h + i * IE, hd + (size_t)slot_row[i] * IE, (size_t)IE * 2);
    memcpy(y + i * H, yd + (size_t)slot_row[i] * H, (size_t)H * 4);
  }
done:
  free(slot_row);
  free(hd);
  free(yd);
  dfree_all(&al);
  return st;
}
extern "C" dg_status dg_cuda_test_route(int device, int mode, float *rlog, const float *pes, int T, int E, int K,
                                        int32_t *idx, float *w, int32_t *start, int32_t *pairs, int32_t *order) {
  if (T <= 0 || E <= 0 || E > 256 || K <= 0 || K > E || K > 32 || mode < 1 || mode > 3)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_route: mode %d (1..3), T %d, E %d (1..256), K %d (1..min(E, 32))",
                     mode, T, E, K);
  if ((mode == 2 && !k_router_tiles_ok(T, E, 4, K)) || (mode == 3 && !k_router_grid_ok(T, E, 4, K)))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_route: mode %d does not cover T %d, E %d, K %d", mode, T, E, K);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  void *drl = NULL, *dpes = NULL;
  dg_cuda_moe_buf b;
  memset(&b, 0, sizeof b);
  const size_t TK = (size_t)T * K;
  TT_(test_in(&al, &drl, rlog, (size_t)T * E * 4, "router logits"));
  TT_(test_in(&al, &dpes, pes, (size_t)E * 4, "per-expert scales"));
  TT_(dalloc(&al, (void **)&b.topk_idx, TK * 4, "topk_idx"));
  TT_(dalloc(&al, (void **)&b.topk_w, TK * 4, "topk_w"));
  TT_(test_group_bufs(&al, &b, TK, E));
  TC_(k_route(0, (float *)drl, (const float *)dpes, &b, T, E, K, mode)); /* (the chain: test_router_route) */
  TT_(test_out(rlog, drl, (size_t)T * E * 4));
  TC_(cudaMemcpy(idx, b.topk_idx, TK * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(w, b.topk_w, TK * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(start, b.start, (size_t)(E + 1) * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(pairs, b.pairs, TK * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(order, b.order, (size_t)E * 4, cudaMemcpyDeviceToHost));
done:
  dfree_all(&al);
  return st;
}
/* The outputs of one routing, gathered from the device for a comparison (word for word). */
static dg_status route_words(const dg_cuda_moe_buf *b, const float *rlog, int T, int E, int K, uint32_t *out) {
  const size_t TK = (size_t)T * K;
  size_t o = 0;
  CK(cudaDeviceSynchronize());
  const struct { const void *p; size_t n; } part[] = {
      {rlog, (size_t)T * E}, {b->topk_idx, TK}, {b->topk_w, TK}, {b->count, (size_t)E}, {b->start, (size_t)E + 1},
      {b->pairs, TK},        {b->slot_row, TK}, {b->n_tiles, 1}, {b->order, (size_t)E}};
  for (size_t i = 0; i < sizeof part / sizeof part[0]; i++) {
    CK(cudaMemcpy(out + o, part[i].p, part[i].n * 4, cudaMemcpyDeviceToHost));
    o += part[i].n;
  }
  /* the tile list up to its length */
  const int32_t nt = (int32_t)out[o - E - 1];
  if (nt < 0 || (size_t)nt > TK + (size_t)E) return dg_seterr(DG_ERR_BACKEND, "route: n_tiles %d out of range", nt);
  memset(out + o, 0, (TK + E) * 2 * 4);
  CK(cudaMemcpy(out + o, b->tiles, (size_t)nt * 2 * 4, cudaMemcpyDeviceToHost));
  return DG_OK;
}

extern "C" dg_status dg_cuda_test_router_route(int device, int mode, const float *u, const float *W, const float *pes,
                                               int T, int E, int H, int K, int32_t *idx, float *w, long *n_diff) {
  if (T <= 0 || E <= 0 || E > 256 || H <= 0 || K <= 0 || K > E || K > 32 || mode < 1 || mode > 6)
    return dg_seterr(DG_ERR_INVALID_ARG,
                     "dg_cuda_test_router_route: mode %d (1..6), T %d, E %d (1..256), H %d, K %d (1..min(E, 32))", mode,
                     T, E, H, K);
  if ((mode == 2 && !k_router_tiles_ok(T, E, H, K)) ||
      ((mode == 3 || mode == 4 || mode == 6) && !k_router_grid_ok(T, E, H, K)) ||
      (mode == 5 && !k_router_one_ok(T, E, H, K))) /* mode 5 would take mode 3's path: refused, so it is tested */
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_router_route: mode %d does not cover T %d, E %d, H %d, K %d",
                     mode, T, E, H, K);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  void *du = NULL, *dW = NULL, *dpes = NULL, *drl = NULL, *dws = NULL, *dxe = NULL, *xs0 = NULL, *xp0 = NULL;
  dg_cuda_moe_buf b;
  memset(&b, 0, sizeof b);
  const size_t TK = (size_t)T * K, nw = (size_t)T * E + 4 * TK + 3 * (size_t)E + 2 + (TK + E) * 2;
  /* the gate/up input: u rounded to bf16 (its bits), group G; mode 3 makes its permuted copy and group sums inside
   * route_gr_kernel, compared word for word with k_group_sums_perm's */
  const int G = H % 64 == 0 ? 64 : H % 32 == 0 ? 32 : 8;
  const size_t nxs = (size_t)T * H / G, nxp = (size_t)T * H / 2; /* words */
  uint32_t *ref = (uint32_t *)calloc(nw, 4), *got = (uint32_t *)calloc(nw, 4);
  uint32_t *xref = (uint32_t *)calloc(nxs + nxp, 4), *xgot = (uint32_t *)calloc(nxs + nxp, 4);
  uint16_t *xe = (uint16_t *)malloc((size_t)T * H * 2);
  *n_diff = 0;
  if (!ref || !got || !xref || !xgot || !xe) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  for (size_t i = 0; i < (size_t)T * H; i++) {
    uint32_t x;
    memcpy(&x, u + i, 4);
    xe[i] = (uint16_t)(x >> 16);
  }
  TT_(test_in(&al, &du, u, (size_t)T * H * 4, "router input"));
  TT_(test_in(&al, &dW, W, (size_t)E * H * 4, "router weights"));
  TT_(test_in(&al, &dpes, pes, (size_t)E * 4, "per-expert scales"));
  TT_(dalloc(&al, &drl, (size_t)T * E * 4, "router logits"));
  TT_(dalloc(&al, &dws, (size_t)DG_ROUTER_MAX_SPLITS * T * E * 4, "router split sums"));
  TT_(dalloc(&al, (void **)&b.topk_idx, TK * 4, "topk_idx"));
  TT_(dalloc(&al, (void **)&b.topk_w, TK * 4, "topk_w"));
  TT_(test_group_bufs(&al, &b, TK, E));
  TT_(test_in(&al, &dxe, xe, (size_t)T * H * 2, "gate/up input"));
  TT_(dalloc(&al, (void **)&b.xs, nxs * 4, "group sums"));
  TT_(dalloc(&al, (void **)&b.xp, (size_t)T * H * 2, "permuted copy"));
  TT_(dalloc(&al, &xs0, nxs * 4, "group sums (k_group_sums_perm)"));
  TT_(dalloc(&al, &xp0, (size_t)T * H * 2, "permuted copy (k_group_sums_perm)"));
  TC_(k_group_sums_perm(0, (const bf16 *)dxe, T, H, G, (float *)xs0, (bf16 *)xp0));
  TC_(cudaMemcpy(xref, xs0, nxs * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(xref + nxs, xp0, nxp * 4, cudaMemcpyDeviceToHost));
  /* the chain of separate launches */
  TC_(k_router_logits(0, (const float *)du, (const float *)dW, (float *)drl, T, E, H, (float *)dws));
  TC_(k_route_topk(0, (float *)drl, (const float *)dpes, &b, T, E, K));
  TC_(k_group(0, &b, T, E, K));
  TT_(route_words(&b, (const float *)drl, T, E, K, ref));
  for (int rep = 0; rep < 2; rep++) {
    TC_(cudaMemset(drl, 0xFF, (size_t)T * E * 4)); /* NaN: nothing left from the run before */
    TC_(cudaMemset(b.topk_idx, 0xFF, TK * 4));
    TC_(cudaMemset(b.pairs, 0xFF, TK * 4));
    TC_(cudaMemset(b.slot_row, 0xFF, TK * 4));
    TC_(cudaMemset(b.topk_w, 0xFF, TK * 4)); /* and every other output: nothing the chain left passes for new */
    TC_(cudaMemset(b.count, 0xFF, (size_t)E * 4));
    TC_(cudaMemset(b.start, 0xFF, (size_t)(E + 1) * 4));
    TC_(cudaMemset(b.tiles, 0xFF, (TK + E) * 2 * 4));
    TC_(cudaMemset(b.n_tiles, 0xFF, 4));
    TC_(cudaMemset(b.order, 0xFF, (size_t)E * 4));
    TC_(cudaMemset(dws, 0xFF, (size_t)DG_ROUTER_MAX_SPLITS * T * E * 4)); /* no split sum of the chain's either */
    TC_(cudaMemset(b.xs, 0xFF, nxs * 4));
    TC_(cudaMemset(b.xp, 0xFF, (size_t)T * H * 2));
    b.gu_x = (const bf16 *)dxe;
    b.gu_group = G;
    TC_(k_router_route(0, (const float *)du, (const float *)dW, (float *)drl, (const float *)dpes, &b, T, E, H, K,
                       (float *)dws, mode)); /* the mode asked for (-1: the library's default) */
    TT_(route_words(&b, (const float *)drl, T, E, K, got));
    for (size_t i = 0; i < nw; i++) *n_diff += got[i] != ref[i];
    if (mode >= 3) { /* route_gr_kernel must have made the gate/up input's copy and sums */
      if (b.gu_ready != b.gu_x) {
        st = dg_seterr(DG_ERR_BACKEND, "router mode %d: the gate/up input's copy was not made (T %d, E %d, H %d)", mode,
                       T, E, H);
        goto done;
      }
      TC_(cudaMemcpy(xgot, b.xs, nxs * 4, cudaMemcpyDeviceToHost));
      TC_(cudaMemcpy(xgot + nxs, b.xp, nxp * 4, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < nxs + nxp; i++) *n_diff += xgot[i] != xref[i];
    } else if (b.gu_ready) {
      st = dg_seterr(DG_ERR_BACKEND, "router mode %d claims the gate/up input's copy", mode);
      goto done;
    }
  }
  TC_(cudaMemcpy(idx, b.topk_idx, TK * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(w, b.topk_w, TK * 4, cudaMemcpyDeviceToHost));
done:
  free(ref);
  free(got);
  free(xref);
  free(xgot);
  free(xe);
  dfree_all(&al);
  return st;
}

/* n words of es bytes (2 or 4) of device a (the chain's) against device b (the fused chain's): how many differ,
 * added to *nd. */
static dg_status words_diff(const void *a, const void *b, size_t n, size_t es, long *nd) {
  unsigned char *ha = (unsigned char *)malloc(n * es + 1), *hb = (unsigned char *)malloc(n * es + 1);
  dg_status st = DG_OK;
  if (!ha || !hb) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  TC_(cudaDeviceSynchronize());
  TC_(cudaMemcpy(ha, a, n * es, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(hb, b, n * es, cudaMemcpyDeviceToHost));
  for (size_t i = 0; i < n; i++) *nd += memcmp(ha + i * es, hb + i * es, es) != 0;
done:
  free(ha);
  free(hb);
  return st;
}

/* The self-conditioning partials (chunk maxima, chunk sums) in device workspace ws into m and sum. */
static dg_status sc_parts(const void *ws, int C, int V, int fused, float *m, double *sum) {
  const size_t bytes = k_vocab_ws_bytes(C, V);
  void *h = malloc(bytes);
  if (!h) return dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory");
  cudaError_t e = cudaDeviceSynchronize();
  if (e == cudaSuccess) e = cudaMemcpy(h, ws, bytes, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) k_vocab_sc_parts(h, C, V, fused, m, sum);
  free(h);
  if (e != cudaSuccess) return dg_seterr(DG_ERR_BACKEND, "workspace copy: %s", cudaGetErrorString(e));
  return DG_OK;
}

/* The n (maximum, sum) pairs of a against b, as words: how many differ, added to *nd. */
static long parts_diff(const float *ma, const double *sa, const float *mb, const double *sb, size_t n) {
  long nd = 0;
  for (size_t i = 0; i < n; i++) nd += memcmp(&ma[i], &mb[i], 4) != 0, nd += memcmp(&sa[i], &sb[i], 8) != 0;
  return nd;
}

extern "C" dg_status dg_cuda_test_vocab_chain(int device, const float *raw, int C, int V, float cap, float T, int act,
                                              int mode, uint64_t seed, uint32_t block, uint32_t step, const float *uni,
                                              void *stats, int32_t *bad, uint16_t *P, long n_diff[7]) {
  if (C <= 0 || V <= 0 || !(T > 0.0f) ||
      (mode != DG_PROPOSAL_SAMPLE && mode != DG_PROPOSAL_ARGMAX && mode != DG_PROPOSAL_REPLAY_UNIFORM))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_vocab_chain: C %d, V %d, T %g, mode %d", C, V, (double)T, mode);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  const size_t n = (size_t)C * V, sw = (size_t)C * sizeof(dg_cuda_pos_stats) / 4;
  void *dz = NULL, *dx = NULL, *dz2 = NULL, *duni = NULL, *ds0 = NULL, *ds1 = NULL, *db = NULL, *dP0 = NULL,
       *dP1 = NULL, *ws = NULL;
  const int32_t nobad = INT32_MAX;
  const size_t np = k_vocab_ws_bytes(C, V) / k_vocab_ws_bytes(1, 1); /* (position, chunk) partials */
  float *pm0 = (float *)malloc(np * 4), *pm1 = (float *)malloc(np * 4);
  double *ps0 = (double *)malloc(np * 8), *ps1 = (double *)malloc(np * 8);
  for (int i = 0; i < 7; i++) n_diff[i] = 0;
  if (!pm0 || !pm1 || !ps0 || !ps1) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  TT_(test_in(&al, &dz, raw, n * 4, "logits (the chain's, softcapped and divided in place)"));
  TT_(test_in(&al, &dx, raw, n * 4, "logits (the fused chain's)"));
  TT_(test_in(&al, &dz2, raw, n * 4, "logits (k_vocab_z)"));
  TT_(test_in(&al, &duni, uni, (size_t)C * 4, "uniforms"));
  TT_(dalloc(&al, &ds0, sw * 4, "stats (chain)"));
  TT_(dalloc(&al, &ds1, sw * 4, "stats (fused)"));
  TT_(dalloc(&al, &db, 8, "bad positions"));
  TT_(dalloc(&al, &dP0, n * 2, "P (chain)"));
  TT_(dalloc(&al, &dP1, n * 2, "P (fused)"));
  TT_(dalloc(&al, &ws, k_vocab_ws_bytes(C, V), "vocabulary partials"));
  /* P starts as different garbage in each: nothing either chain leaves unwritten passes for equal */
  TC_(cudaMemset(ds0, 0xFF, sw * 4)); /* the records of non-finite positions stay so in both (argmax -1) */
  TC_(cudaMemset(ds1, 0xFF, sw * 4));
  TC_(cudaMemset(dP0, 0x33, n * 2));
  TC_(cudaMemset(dP1, 0x44, n * 2));
  TC_(cudaMemcpy(db, &nobad, 4, cudaMemcpyHostToDevice));
  TC_(cudaMemcpy((int32_t *)db + 1, &nobad, 4, cudaMemcpyHostToDevice));
  /* the chain: softcap in place, statistics (z in place), probabilities of that z */
  if (cap > 0.0f) TC_(k_softcap(0, (float *)dz, n, cap));
  TC_(k_step_stats(0, (float *)dz, C, V, T, mode, seed, block, step, (const float *)duni, (dg_cuda_pos_stats *)ds0,
                   (int32_t *)db, ws));
  TC_(k_sc_probs(0, (const float *)dz, (bf16 *)dP0, C, V, act, ws));
  TT_(sc_parts(ws, C, V, 0, pm0, ps0));
  /* the fused chain on the raw logits, the probabilities from what the statistics left */
  TC_(cudaMemset(ws, 0xFF, k_vocab_ws_bytes(C, V))); /* no partial of the chain's */
  TC_(k_vocab_stats(0, (const float *)dx, C, V, cap, T, act, mode, seed, block, step, (const float *)duni,
                    (dg_cuda_pos_stats *)ds1, (int32_t *)db + 1, ws, 0));
  TC_(k_vocab_sc(0, (const float *)dx, (bf16 *)dP1, C, V, cap, T, act, ws, mode == DG_PROPOSAL_ARGMAX ? 1 : 2));
  TT_(words_diff(ds0, ds1, sw, 4, &n_diff[0]));
  TT_(words_diff(db, (int32_t *)db + 1, 1, 4, &n_diff[0]));
  TT_(words_diff(dP0, dP1, n, 2, &n_diff[1]));
  TT_(sc_parts(ws, C, V, 1, pm1, ps1));
  n_diff[1] += parts_diff(pm0, ps0, pm1, ps1, np);
  /* the fused probabilities with nothing in ws (soft_from_z straight after a decode: the passes it lacks) */
  TC_(cudaMemset(ws, 0xFF, k_vocab_ws_bytes(C, V)));
  TC_(cudaMemset(dP1, 0x44, n * 2));
  TC_(k_vocab_sc(0, (const float *)dx, (bf16 *)dP1, C, V, cap, T, act, ws, 0));
  TT_(words_diff(dP0, dP1, n, 2, &n_diff[2]));
  TT_(sc_parts(ws, C, V, 1, pm1, ps1));
  n_diff[2] += parts_diff(pm0, ps0, pm1, ps1, np);
  /* z made real (logits_materialize) and the fused logits untouched */
  TC_(k_vocab_z(0, (float *)dz2, n, cap, T));
  TT_(words_diff(dz, dz2, n, 4, &n_diff[3]));
  TT_(test_in(&al, &dz2, raw, n * 4, "logits (as given)"));
  TT_(words_diff(dx, dz2, n, 4, &n_diff[3]));
  /* zstore: pass 1 stores z in the logits (dz2, the raw logits again), the probabilities read it as stored */
  TC_(cudaMemset(ws, 0xFF, k_vocab_ws_bytes(C, V)));
  TC_(cudaMemset(ds1, 0xFF, sw * 4));
  TC_(cudaMemset(dP1, 0x55, n * 2));
  TC_(cudaMemcpy((int32_t *)db + 1, &nobad, 4, cudaMemcpyHostToDevice));
  TC_(k_vocab_stats(0, (const float *)dz2, C, V, cap, T, act, mode, seed, block, step, (const float *)duni,
                    (dg_cuda_pos_stats *)ds1, (int32_t *)db + 1, ws, 1));
  TC_(k_vocab_sc(0, (const float *)dz2, (bf16 *)dP1, C, V, DG_VZ_STORED, 1.0f, act, ws,
                 mode == DG_PROPOSAL_ARGMAX ? 1 : 2));
  TT_(words_diff(ds0, ds1, sw, 4, &n_diff[4]));
  TT_(words_diff(db, (int32_t *)db + 1, 1, 4, &n_diff[4]));
  TT_(words_diff(dP0, dP1, n, 2, &n_diff[5]));
  TT_(sc_parts(ws, C, V, 1, pm1, ps1));
  n_diff[5] += parts_diff(pm0, ps0, pm1, ps1, np);
  TT_(words_diff(dz, dz2, n, 4, &n_diff[5])); /* the stored z: the chain's */
  /* P over the logits (context.cu's layout with sc_group G: a head of G rows, CARVE_ALIGN-padded before the logits,
   * that ends where they begin; P row c at logits + (c - G) V), made in groups of G rows: from the chain's z
   * (k_sc_probs_g) and from the raw logits with nothing in ws (k_vocab_sc_g): the separate P's words (dP0) */
  for (int G = 1; G <= 2 && G < C; G++) {
    const size_t head = (size_t)G * V * 2, pad = (head + CARVE_ALIGN - 1) / CARVE_ALIGN * CARVE_ALIGN;
    void *blk = NULL;
    TT_(dalloc(&al, &blk, pad + n * 4, "P over the logits"));
    float *lz = (float *)((unsigned char *)blk + pad);
    bf16 *Pi = (bf16 *)((unsigned char *)lz - head);
    TC_(cudaMemset(blk, 0x66, pad));
    TC_(cudaMemcpy(lz, dz, n * 4, cudaMemcpyDeviceToDevice));
    TC_(k_sc_probs_g(0, lz, Pi, C, V, act, ws, G));
    TT_(words_diff(dP0, Pi, n, 2, &n_diff[6]));
    TC_(cudaMemset(blk, 0x77, pad));
    TC_(cudaMemcpy(lz, dx, n * 4, cudaMemcpyDeviceToDevice));
    TC_(cudaMemset(ws, 0xFF, k_vocab_ws_bytes(C, V)));
    TC_(k_vocab_sc_g(0, lz, Pi, C, V, cap, T, act, ws, 0, G));
    TT_(words_diff(dP0, Pi, n, 2, &n_diff[6]));
  }
  TT_(test_out(stats, ds1, sw * 4));
  TT_(test_out(bad, (int32_t *)db + 1, 4));
  TT_(test_out(P, dP1, n * 2));
done:
  free(pm0); free(pm1); free(ps0); free(ps1);
  dfree_all(&al);
  return st;
}

extern "C" dg_status dg_cuda_test_attention(int device, int version, const float *q, const uint16_t *kc,
                                            const uint16_t *vc, int S, int nq, int NH, int NKV, int D, int32_t pos0,
                                            int32_t kv_hi, int causal, int is_full, int window, uint16_t *out) {
  /* the keys of the pass: [lo, hi) must have distinct slots j % S (a ring on sliding layers: S < hi) */
  const int32_t hi = causal ? pos0 + nq : kv_hi,
                lo = is_full ? 0 : causal ? (pos0 + 1 - window > 0 ? pos0 + 1 - window : 0)
                                          : (pos0 - (window - 1) > 0 ? pos0 - (window - 1) : 0);
  if (nq <= 0 || NH <= 0 || NKV <= 0 || NH % NKV || D <= 0 || D % 8 || S <= 0 || pos0 < 0 || window <= 0 ||
      version < 0 || version > ATT_LAB_LAST || (!causal && kv_hi <= pos0) || hi - lo > S)
    return dg_seterr(DG_ERR_INVALID_ARG,
                     "dg_cuda_test_attention: version %d, nq %d, NH %d, NKV %d, D %d, S %d, pos0 %d, kv_hi %d, "
                     "causal %d, window %d",
                     version, nq, NH, NKV, D, S, pos0, kv_hi, causal, window);
  if (version >= 2 && !k_attention_flash_ok(D, NH, NKV))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_attention: the tensor-core kernel takes D 64/128/256/512, not %d",
                     D);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  void *dq = NULL, *dk = NULL, *dv = NULL, *dout = NULL;
  void *dcnt = NULL;
  dg_att_ws ws = {NULL, 8 * (size_t)nq * NH * ((size_t)D + 2)};
  const size_t kvn = (size_t)NKV * S * D * 2, on = (size_t)nq * NH * D;
  const int ncnt = 4096; /* the lab's versions 9-11: arrival counters, one per (row tile, KV head), zero */
  TT_(test_in(&al, &dq, q, on * 4, "q"));
  TT_(test_in(&al, &dk, kc, kvn, "k cache"));
  TT_(test_in(&al, &dv, vc, kvn, "v cache"));
  TT_(dalloc(&al, &dout, on * 2, "out"));
  TT_(dalloc(&al, (void **)&ws.part, ws.n * 4, "key-split partials"));
  if (version >= ATT_LAB_FIRST && version != DG_ATT_WQ && version != DG_ATT_WQC && version != DG_ATT_WQB) {
    /* the lab's versions (dev/cuda/attention_lab.cuh), not the backend's (15, 16 and 18 are: k_attention_any below) */
    TT_(dalloc(&al, &dcnt, (size_t)ncnt * 4, "arrival counters"));
    TC_(cudaMemset(dcnt, 0, (size_t)ncnt * 4));
    TC_(att_lab_version(version, 0, &ws, (int *)dcnt, ncnt, (const float *)dq, (const bf16 *)dk, (const bf16 *)dv,
                        (bf16 *)dout, S, nq, NH, NKV, D, pos0, kv_hi, causal, is_full, window));
  } else
    TC_(k_attention_any(0, &ws, version, (const float *)dq, (const bf16 *)dk, (const bf16 *)dv, (bf16 *)dout, S, nq,
                        NH, NKV, D, pos0, kv_hi, causal, is_full, window));
  TT_(test_out(out, dout, on * 2));
done:
  dfree_all(&al);
  return st;
}

extern "C" dg_status dg_cuda_test_attention_batch(int device, int nb, const float *const *q, const uint16_t *const *kc,
                                                  const uint16_t *const *vc, const int32_t *S, const int32_t *nq,
                                                  const int32_t *pos0, const int32_t *kv_hi, int NH, int NKV, int D,
                                                  int is_full, int window, uint16_t *const *out) {
  if (nb < 1 || nb > 64 || NH <= 0 || NKV <= 0 || NH % NKV || (D != 128 && D != 256 && D != 512) || window <= 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_attention_batch: nb %d, NH %d, NKV %d, D %d, window %d", nb, NH,
                     NKV, D, window);
  for (int i = 0; i < nb; i++) {
    const int32_t lo = is_full ? 0 : (pos0[i] - (window - 1) > 0 ? pos0[i] - (window - 1) : 0);
    if (nq[i] < 1 || S[i] <= 0 || pos0[i] < 0 || kv_hi[i] <= pos0[i] || kv_hi[i] - lo > S[i])
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_attention_batch: canvas %d: nq %d, S %d, pos0 %d, kv_hi %d", i,
                       nq[i], S[i], pos0[i], kv_hi[i]);
  }
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  float *dq[64];
  bf16 *dk[64], *dv[64], *dout[64];
  for (int i = 0; i < nb; i++) {
    const size_t kvn = (size_t)NKV * S[i] * D * 2, on = (size_t)nq[i] * NH * D;
    dq[i] = NULL; dk[i] = dv[i] = dout[i] = NULL;
    TT_(test_in(&al, (void **)&dq[i], q[i], on * 4, "q"));
    TT_(test_in(&al, (void **)&dk[i], kc[i], kvn, "k cache"));
    TT_(test_in(&al, (void **)&dv[i], vc[i], kvn, "v cache"));
    TT_(dalloc(&al, (void **)&dout[i], on * 2, "out"));
  }
  TC_(k_attention_batch(0, nb, dq, dk, dv, dout, S, nq, pos0, kv_hi, NH, NKV, D, is_full, window));
  for (int i = 0; i < nb; i++) TT_(test_out(out[i], dout[i], (size_t)nq[i] * NH * D * 2));
done:
  dfree_all(&al);
  return st;
}
#undef TT_
#undef TC_

/* ---- a context's device state, for the tests of the turbo entry points ---- */

extern "C" dg_status dg_cuda_test_put_raw_rows(dg_cuda_ctx *c, int32_t n, const float *raw) {
  const dg_cuda_model_desc *d = &c->m->d;
  if (n < 0 || n > d->canvas) return dg_seterr(DG_ERR_INVALID_ARG, "CUDA: %d raw rows for a canvas of %d", n, d->canvas);
  CK(cudaSetDevice(c->m->device));
  DG_TRY(turbo_bufs(c, 0));
  CK(cudaMemcpyAsync(c->logits, raw, (size_t)n * d->vocab * 4, cudaMemcpyHostToDevice, c->stream));
  CK(cudaStreamSynchronize(c->stream));
  logits_written(c, 0.0f);
  c->tb->nraw = n;
  return DG_OK;
}

extern "C" dg_status dg_cuda_test_get_soft(dg_cuda_ctx *c, float *soft) {
  const dg_cuda_model_desc *d = &c->m->d;
  CK(cudaSetDevice(c->m->device));
  CK(cudaMemcpyAsync(soft, c->soft, (size_t)d->canvas * d->hidden * 4, cudaMemcpyDeviceToHost, c->stream));
  CK(cudaStreamSynchronize(c->stream));
  return DG_OK;
}

extern "C" dg_status dg_cuda_test_put_soft(dg_cuda_ctx *c, const float *soft) {
  const dg_cuda_model_desc *d = &c->m->d;
  CK(cudaSetDevice(c->m->device));
  CK(cudaMemcpyAsync(c->soft, soft, (size_t)d->canvas * d->hidden * 4, cudaMemcpyHostToDevice, c->stream));
  CK(cudaStreamSynchronize(c->stream));
  return DG_OK;
}

#define TT_(x) do { if ((st = (x)) != DG_OK) goto done; } while (0)
#define TC_(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    st = dg_seterr(DG_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    goto done; } } while (0)
/* The byte pattern of buffer i of a context's block (37 is odd: 256 buffers in a row differ). */
static unsigned char arena_byte(int i) { return (unsigned char)(i * 37 + 11); }

extern "C" dg_status dg_cuda_test_ctx_arena(dg_cuda_ctx *c, int32_t n_allocs[2], int *n_bufs, long *n_bad) {
  enum { CAP = 4096 };
  dg_status st = DG_OK;
  void **p = (void **)malloc(CAP * sizeof *p);
  size_t *b = (size_t *)malloc(CAP * sizeof *b);
  int *ord = (int *)malloc(CAP * sizeof *ord);
  unsigned char *h = NULL;
  void *blk = NULL;
  size_t blk_bytes = 0, most = 0;
  *n_bad = 0;
  n_allocs[0] = c->n_allocs[0];
  n_allocs[1] = c->n_allocs[1];
  if (!p || !b || !ord) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  TC_(cudaSetDevice(c->m->device));
  TC_(cudaStreamSynchronize(c->stream));
  *n_bufs = ctx_carves(c, p, b, CAP, &blk, &blk_bytes);
  if (*n_bufs > CAP) { st = dg_seterr(DG_ERR_INVALID_ARG, "%d buffers in a context, more than %d", *n_bufs, CAP); goto done; }
  for (int i = 0; i < *n_bufs; i++) {
    const uintptr_t a = (uintptr_t)p[i], lo = (uintptr_t)blk;
    *n_bad += a < lo || a + b[i] > lo + blk_bytes || (a - lo) % 256 != 0 || a % 16 != 0;
    ord[i] = i;
    if (b[i] > most) most = b[i];
  }
  for (int i = 1; i < *n_bufs; i++) /* insertion sort by address */
    for (int j = i; j > 0 && (uintptr_t)p[ord[j]] < (uintptr_t)p[ord[j - 1]]; j--) {
      const int t = ord[j]; ord[j] = ord[j - 1]; ord[j - 1] = t;
    }
  for (int i = 1; i < *n_bufs; i++) *n_bad += (uintptr_t)p[ord[i - 1]] + b[ord[i - 1]] > (uintptr_t)p[ord[i]];
  { /* the encoder's view (a chunk beyond the decoder's rows, context.cu ctx_layout): inside the block, at the
     * block's alignment, no two of its buffers overlapping (it lies over the decoder's union by design) */
    const int ne = ctx_carves_enc(c, p, b, CAP);
    if (ne > CAP) { st = dg_seterr(DG_ERR_INVALID_ARG, "%d buffers in an encoder view, more than %d", ne, CAP); goto done; }
    for (int i = 0; i < ne; i++) {
      const uintptr_t a = (uintptr_t)p[i], lo = (uintptr_t)blk;
      *n_bad += a < lo || a + b[i] > lo + blk_bytes || (a - lo) % 256 != 0;
      *n_bad += i > 0 && (uintptr_t)p[i - 1] + b[i - 1] > a; /* laid out in address order */
    }
    *n_bad += ne == 0 && c->enc_rows > c->tmax;
    *n_bad += ne > 0 && c->enc_rows <= c->tmax;
    *n_bufs = ctx_carves(c, p, b, CAP, &blk, &blk_bytes); /* the decoder's again, for the pattern check below */
  }
  if (!(h = (unsigned char *)malloc(most ? most : 1))) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  for (int i = 0; i < *n_bufs; i++) TC_(cudaMemset(p[i], arena_byte(i), b[i]));
  for (int i = 0; i < *n_bufs; i++) {
    TC_(cudaMemcpy(h, p[i], b[i], cudaMemcpyDeviceToHost));
    size_t k = 0;
    while (k < b[i] && h[k] == arena_byte(i)) k++;
    *n_bad += k < b[i];
  }
done:
  free(p); free(b); free(ord); free(h);
  return st;
}

#ifndef DG_CUDA_EMU
__global__ void test_fill_bf16(bf16 *p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    uint32_t h = (uint32_t)i * 2654435761u ^ seed ^ (uint32_t)(i >> 32) * 40503u;
    h ^= h >> 15; h *= 2246822519u; h ^= h >> 13;
    p[i] = __float2bfloat16((float)(h & 0xffff) / 32768.0f - 1.0f);
  }
}
#endif

extern "C" dg_status dg_cuda_test_gemm_pins(int device, int i, int *n_cfg, int *active, long *n_diff, long *n_checked,
                                            double *worst) {
  int m = 0, n = 0, k = 0;
  *n_cfg = 0;
  while (gemm_pin_shape(*n_cfg, &m, &n, &k)) ++*n_cfg;
  *active = -1; *n_diff = 0; *n_checked = 0; *worst = 0.0;
#ifdef DG_CUDA_EMU
  (void)device; (void)i;
  return DG_OK; /* no cublasLt on the emulation: no pins */
#else
  if (!gemm_pin_shape(i, &m, &n, &k))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_gemm_pins: pin %d outside the table of %d", i, *n_cfg);
  CK(cudaSetDevice(device));
  if (!gemm_pins_device()) { *active = -2; return DG_OK; }
  alloc_list al = {NULL, 0, 0};
  dg_cuda_ctx c;
  memset(&c, 0, sizeof c);
  cublasHandle_t h = NULL;
  bf16 *W = NULL, *x = NULL;
  float *y0 = NULL, *y1 = NULL, *hy0 = NULL, *hy1 = NULL;
  uint16_t *hx = NULL, *hw = NULL;
  const size_t ws_bytes = (size_t)32 << 20, ny = (size_t)m * n;
  dg_status st = DG_OK;
  TT_(dalloc(&al, (void **)&W, (size_t)m * k * 2, "pin W"));
  TT_(dalloc(&al, (void **)&x, (size_t)n * k * 2, "pin x"));
  TT_(dalloc(&al, (void **)&y0, ny * 4, "pin y0"));
  TT_(dalloc(&al, (void **)&y1, ny * 4, "pin y1"));
  TT_(dalloc(&al, &c.blas_ws, ws_bytes, "pin workspace"));
  test_fill_bf16<<<1024, 256>>>(W, (size_t)m * k, 0x9e3779b9u);
  test_fill_bf16<<<1024, 256>>>(x, (size_t)n * k, 0x7f4a7c15u);
  /* the outputs cleared first: compute-sanitizer's initcheck does not see cuBLAS's stores (session 5), so without this
   * the copies below read, as far as it knows, memory nothing wrote (session 20: 256 MB reports until its time ran out) */
  TC_(cudaMemset(y0, 0, ny * 4));
  TC_(cudaMemset(y1, 0xff, ny * 4)); /* NaN words, unlike y0's zeros: an element neither product wrote differs (both
                                      * products have beta 0, so cuBLAS does not read them) */
  TC_(cudaGetLastError());
  TC_(cudaStreamCreate(&c.stream));
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, c.stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(h, c.blas_ws, ws_bytes) != CUBLAS_STATUS_SUCCESS) {
    st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_gemm_pins: cuBLAS set-up failed");
    goto done;
  }
  {
    const float one = 1.0f, zero = 0.0f;
    if (cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, W, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &zero, y0,
                     CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
      st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_gemm_pins: cublasGemmEx failed");
      goto done;
    }
  }
  gemm_pins_init(&c, ws_bytes, 1); /* whatever DGEMMA_GEMM_PIN says: the pins themselves are under test */
  *active = gemm_pinned(&c, x, k, n, W, m, k, y1, m, &st);
  if (st != DG_OK || !*active) goto done;
  TC_(cudaStreamSynchronize(c.stream));
  hy0 = (float *)malloc(ny * 4); hy1 = (float *)malloc(ny * 4);
  hx = (uint16_t *)malloc((size_t)n * k * 2); hw = (uint16_t *)malloc((size_t)k * 2);
  if (!hy0 || !hy1 || !hx || !hw) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  TC_(cudaMemcpy(hy0, y0, ny * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(hy1, y1, ny * 4, cudaMemcpyDeviceToHost));
  TC_(cudaMemcpy(hx, x, (size_t)n * k * 2, cudaMemcpyDeviceToHost));
  for (size_t j = 0; j < ny; j++) *n_diff += memcmp(&hy0[j], &hy1[j], 4) != 0;
  {
    const double u = ldexp(1.0, -24), gam = k * u / (1.0 - k * u);
    uint32_t r = 12345;
    for (int s = 0; s < 2048; s++) { /* sampled outputs (row rr of W, token t), the four corners first */
      r = r * 1664525u + 1013904223u;
      const int rr = s == 0 || s == 1 ? 0 : s == 2 || s == 3 ? m - 1 : (int)(r % (uint32_t)m);
      const int t = s == 0 || s == 2 ? 0 : s == 1 || s == 3 ? n - 1 : (int)((r >> 7) % (uint32_t)n);
      TC_(cudaMemcpy(hw, W + (size_t)rr * k, (size_t)k * 2, cudaMemcpyDeviceToHost));
      double mag = 0.0;
      for (int q = 0; q < k; q++) {
        uint32_t a = (uint32_t)hx[(size_t)t * k + q] << 16, b = (uint32_t)hw[q] << 16;
        float fa, fb;
        memcpy(&fa, &a, 4); memcpy(&fb, &b, 4);
        mag += fabs((double)fa * fb);
      }
      const double bound = 2.0 * gam * mag + 1e-30, d = fabs((double)hy1[(size_t)t * m + rr] - hy0[(size_t)t * m + rr]);
      if (d / bound > *worst) *worst = d / bound;
      ++*n_checked;
    }
  }
done:
  free(hy0); free(hy1); free(hx); free(hw);
  gemm_pins_free(&c);
  if (h) cublasDestroy(h);
  if (c.stream) cudaStreamDestroy(c.stream);
  dfree_all(&al);
  return st;
#endif
}
extern "C" dg_status dg_cuda_test_stack_dense_set(int mode) {
  if (mode < -1 || mode > 2) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_stack_dense_set: %d (-1..2)", mode);
  dg_cuda_stack_dense_set(mode);
  return DG_OK;
}

extern "C" dg_status dg_cuda_test_gemm_inv(int device, int i, int M1, int M2, int *n_shapes, int *active, int cfg[9],
                                           int *rule, long *n_diff, long *n_checked, double *worst) {
  int tn = 0, m = 0, k = 0;
  *n_shapes = 0;
  while (gemm_inv_shape(*n_shapes, &tn, &m, &k)) ++*n_shapes;
  *active = -1; *rule = -1; *n_diff = 0; *n_checked = 0; *worst = 0.0;
  for (int a = 0; a < 9; a++) cfg[a] = -1;
  if (!gemm_inv_shape(i, &tn, &m, &k))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_gemm_inv: shape %d outside the list of %d", i, *n_shapes);
  if (M2 < 1 || M1 < M2) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_gemm_inv: rows %d, %d (1 <= M2 <= M1)", M1, M2);
#ifdef DG_CUDA_EMU
  (void)device;
  return DG_OK; /* no cublasLt on the emulation */
#else
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_cuda_ctx c;
  memset(&c, 0, sizeof c);
  cublasHandle_t h = NULL;
  bf16 *A = NULL, *B = NULL;
  float *y1 = NULL, *y2 = NULL, *y0 = NULL, *hy0 = NULL, *hy1 = NULL;
  uint16_t *hb = NULL, *ha = NULL;
  const size_t ws_bytes = (size_t)32 << 20, ny = (size_t)m * M1, na = (size_t)m * k, nb = (size_t)k * M1;
  const int NS = 512;
  dg_status st = DG_OK;
  TT_(dalloc(&al, (void **)&A, na * 2, "inv A"));
  TT_(dalloc(&al, (void **)&B, nb * 2, "inv B"));
  TT_(dalloc(&al, (void **)&y0, ny * 4, "inv y0"));
  TT_(dalloc(&al, (void **)&y1, ny * 4, "inv y1"));
  TT_(dalloc(&al, (void **)&y2, (size_t)m * M2 * 4, "inv y2"));
  TT_(dalloc(&al, &c.blas_ws, ws_bytes, "inv workspace"));
  test_fill_bf16<<<1024, 256>>>(A, na, 0x9e3779b9u);
  test_fill_bf16<<<1024, 256>>>(B, nb, 0x7f4a7c15u);
  TC_(cudaMemset(y0, 0, ny * 4));
  TC_(cudaMemset(y1, 0xff, ny * 4));
  TC_(cudaMemset(y2, 0, (size_t)m * M2 * 4)); /* zeros vs y1's NaN words: an output neither product wrote differs */
  TC_(cudaGetLastError());
  TC_(cudaStreamCreate(&c.stream));
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, c.stream) != CUBLAS_STATUS_SUCCESS ||
      cublasSetMathMode(h, CUBLAS_DEFAULT_MATH) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(h, c.blas_ws, ws_bytes) != CUBLAS_STATUS_SUCCESS) {
    st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_gemm_inv: cuBLAS set-up failed");
    goto done;
  }
  {
    const float one = 1.0f, zero = 0.0f;
    if (cublasGemmEx(h, tn ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, m, M1, k, &one, A, CUDA_R_16BF, tn ? k : m, B,
                     CUDA_R_16BF, k, &zero, y0, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) !=
        CUBLAS_STATUS_SUCCESS) {
      st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_gemm_inv: cublasGemmEx failed");
      goto done;
    }
  }
  dg_cuda_stack_dense_set(2); /* the invariant products themselves are under test, whatever DGEMMA_STACK_DENSE says */
  st = gemm_inv_init(&c, ws_bytes);
  dg_cuda_stack_dense_set(-1);
  if (st) goto done;
  *active = gemm_inv(&c, tn, m, M1, k, 1.0f, A, B, k, y1, m, &st);
  if (st != DG_OK || !*active) goto done;
  if (gemm_inv(&c, tn, m, M2, k, 1.0f, A, B, k, y2, m, &st) && st != DG_OK) goto done;
  gemm_inv_config(&c, tn, m, k, cfg, rule);
  TC_(cudaStreamSynchronize(c.stream));
  hy0 = (float *)malloc(ny * 4); hy1 = (float *)malloc(ny * 4);
  hb = (uint16_t *)malloc(nb * 2); ha = (uint16_t *)malloc(tn ? (size_t)k * 2 : na * 2); /* P . E: all of E */
  if (!hy0 || !hy1 || !hb || !ha) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  TC_(cudaMemcpy(hy0, y2, (size_t)m * M2 * 4, cudaMemcpyDeviceToHost)); /* the M2 product's rows, then y1's */
  TC_(cudaMemcpy(hy1, y1, ny * 4, cudaMemcpyDeviceToHost));
  for (size_t j = 0; j < (size_t)m * M2; j++) *n_diff += memcmp(&hy0[j], &hy1[j], 4) != 0;
  TC_(cudaMemcpy(hy0, y0, ny * 4, cudaMemcpyDeviceToHost)); /* the default at M1 rows */
  TC_(cudaMemcpy(hb, B, nb * 2, cudaMemcpyDeviceToHost));
  if (!tn) TC_(cudaMemcpy(ha, A, na * 2, cudaMemcpyDeviceToHost));
  {
    const double u = ldexp(1.0, -24), gam = k * u / (1.0 - k * u);
    uint32_t r = 12345;
    for (int s = 0; s < NS; s++) { /* sampled outputs (column j, row t), the four corners first */
      r = r * 1664525u + 1013904223u;
      const int j = s == 0 || s == 1 ? 0 : s == 2 || s == 3 ? m - 1 : (int)(r % (uint32_t)m);
      const int t = s == 0 || s == 2 ? 0 : s == 1 || s == 3 ? M1 - 1 : (int)((r >> 7) % (uint32_t)M1);
      if (tn) TC_(cudaMemcpy(ha, A + (size_t)j * k, (size_t)k * 2, cudaMemcpyDeviceToHost)); /* row j of W */
      double mag = 0.0;
      for (int q = 0; q < k; q++) { /* W[j, q] (row j copied), or E[q, j] */
        uint32_t a = (uint32_t)hb[(size_t)t * k + q] << 16, b = (uint32_t)ha[tn ? (size_t)q : (size_t)q * m + j] << 16;
        float fa, fb;
        memcpy(&fa, &a, 4); memcpy(&fb, &b, 4);
        mag += fabs((double)fa * fb);
      }
      const double bound = 2.0 * gam * mag + 1e-30, d = fabs((double)hy1[(size_t)t * m + j] - hy0[(size_t)t * m + j]);
      if (!(d / bound <= *worst)) *worst = d / bound; /* a NaN makes it NaN */
      ++*n_checked;
    }
  }
done:
  free(hy0); free(hy1); free(hb); free(ha);
  gemm_inv_free(&c);
  if (h) cublasDestroy(h);
  if (c.stream) cudaStreamDestroy(c.stream);
  dfree_all(&al);
  return st;
#endif
}
extern "C" dg_status dg_cuda_test_combine_norm(int device, const float *x, const float *dense, const float *y,
                                               const int32_t *idx, const float *w, const float *w_ff1,
                                               const float *w_ff2, const float *w_ff, const float *w_next, float scalar,
                                               float eps, int T, int H, int K, int *fused, long *n_diff) {
  *fused = 0; *n_diff = 0;
  if (T < 1 || H < 1 || K < 1) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_combine_norm: T %d, H %d, K %d", T, H, K);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  const size_t TH = (size_t)T * H, TK = (size_t)T * K;
  float *dx1 = NULL, *dx2 = NULL, *dd = NULL, *dy = NULL, *dw = NULL, *w1 = NULL, *w2 = NULL, *wf = NULL, *wn = NULL;
  int32_t *didx = NULL, *dslot = NULL;
  bf16 *a1 = NULL, *a2 = NULL;
  float *hx1 = NULL, *hx2 = NULL;
  uint16_t *ha1 = NULL, *ha2 = NULL;
  int32_t *slot = NULL;
  dg_status st = DG_OK;
  TT_(test_in(&al, (void **)&dx1, x, TH * 4, "x"));
  TT_(test_in(&al, (void **)&dx2, x, TH * 4, "x"));
  TT_(test_in(&al, (void **)&dd, dense, TH * 4, "dense"));
  TT_(test_in(&al, (void **)&dy, y, TK * H * 4, "y"));
  TT_(test_in(&al, (void **)&dw, w, TK * 4, "w"));
  TT_(test_in(&al, (void **)&didx, idx, TK * 4, "idx"));
  TT_(test_in(&al, (void **)&w1, w_ff1, (size_t)H * 4, "w_ff1"));
  TT_(test_in(&al, (void **)&w2, w_ff2, (size_t)H * 4, "w_ff2"));
  TT_(test_in(&al, (void **)&wf, w_ff, (size_t)H * 4, "w_ff"));
  TT_(test_in(&al, (void **)&wn, w_next, (size_t)H * 4, "w_next"));
  TT_(dalloc(&al, (void **)&a1, TH * 2, "a1"));
  TT_(dalloc(&al, (void **)&a2, TH * 2, "a2"));
  slot = (int32_t *)malloc(TK * 4);
  hx1 = (float *)malloc(TH * 4); hx2 = (float *)malloc(TH * 4);
  ha1 = (uint16_t *)malloc(TH * 2); ha2 = (uint16_t *)malloc(TH * 2);
  if (!slot || !hx1 || !hx2 || !ha1 || !ha2) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  for (size_t i = 0; i < TK; i++) slot[i] = (int32_t)i; /* pair i's output in row i of y */
  TT_(test_in(&al, (void **)&dslot, slot, TK * 4, "slot_row"));
  TC_(k_ffn_combine(0, dx1, dd, dy, dslot, didx, dw, w1, w2, wf, scalar, T, H, K, eps));
  TC_(k_rmsnorm(0, dx1, wn, NULL, a1, T, H, eps));
  TT_(test_out(hx1, dx1, TH * 4));
  TT_(test_out(ha1, a1, TH * 2));
  /* version 0 (the default's kernel), then version 2 (the next norm's weight loaded first, DGEMMA_COMBINE=pre) from
   * the same x, each against the two launches */
  for (int version = 0; version <= 2; version += 2) {
    int f = 0;
    TC_(cudaMemcpy(dx2, x, TH * 4, cudaMemcpyHostToDevice));
    TC_(cudaMemset(a2, 0xFF, TH * 2));
    TC_(k_ffn_combine_norm_v(0, version, dx2, dd, dy, dslot, didx, dw, w1, w2, wf, scalar, T, H, K, eps, wn, a2, &f));
    if (!f) TC_(k_rmsnorm(0, dx2, wn, NULL, a2, T, H, eps));
    if (version == 0) *fused = f;
    else if (f != *fused) { st = dg_seterr(DG_ERR_BACKEND, "combine: version 2 fused %d, version 0 %d", f, *fused); goto done; }
    TT_(test_out(hx2, dx2, TH * 4));
    TT_(test_out(ha2, a2, TH * 2));
    for (size_t i = 0; i < TH; i++) *n_diff += memcmp(&hx1[i], &hx2[i], 4) != 0;
    for (size_t i = 0; i < TH; i++) *n_diff += ha1[i] != ha2[i];
  }
done:
  free(slot); free(hx1); free(hx2); free(ha1); free(ha2);
  dfree_all(&al);
  return st;
}
extern "C" dg_status dg_cuda_test_group_sums_perm(int device, int version, const uint16_t *x, int rows, int cols, int G,
                                                  float *xs, uint16_t *xp) {
  if (rows <= 0 || G <= 0 || G % 8 || cols <= 0 || cols % G || (version != 0 && version != 2))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_group_sums_perm: version %d (0 or 2), rows %d, cols %d, G %d",
                     version, rows, cols, G);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  void *dx = NULL, *dxs = NULL, *dxp = NULL;
  const size_t n = (size_t)rows * cols, ns = n / G;
  TT_(test_in(&al, &dx, x, n * 2, "rows"));
  TT_(dalloc(&al, &dxs, ns * 4, "group sums"));
  TT_(dalloc(&al, &dxp, n * 2, "permuted copy"));
  TC_(cudaMemset(dxs, 0xFF, ns * 4)); /* NaN / 0xFFFF: a word not written shows */
  TC_(cudaMemset(dxp, 0xFF, n * 2));
  TC_(k_group_sums_perm_v(0, version, (const bf16 *)dx, rows, cols, G, (float *)dxs, (bf16 *)dxp));
  TT_(test_out(xs, dxs, ns * 4));
  TT_(test_out(xp, dxp, n * 2));
done:
  dfree_all(&al);
  return st;
}
#undef TT_
#undef TC_

/* ---- the exact self-conditioning probabilities (turbo.cu k_turbo_sc_probs_tab against k_turbo_sc_probs) ---- */
#define TT_(x) do { if ((st = (x)) != DG_OK) goto done; } while (0)
#define TC_(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    st = dg_seterr(DG_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    goto done; } } while (0)
extern "C" dg_status dg_cuda_test_sc_probs(int device, int act, int B, const int32_t *n, int V, float cap,
                                           const float *T, const float *raw, uint16_t *p_tab, uint16_t *p_row,
                                           double *sum_tab, double *sum_row) {
  if (B < 1 || B > DG_TB_TAB || V < 1)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_sc_probs: B %d (1..%d), V %d", B, DG_TB_TAB, V);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  void *draw = NULL, *dpt = NULL, *dpr = NULL, *dmax = NULL, *dsum = NULL, *drs = NULL;
  double *ws = NULL;
  size_t R = 0, off = 0;
  for (int b = 0; b < B; b++) R += (size_t)n[b];
  const size_t nch = (size_t)dg_scp_chunks(V);
  dg_tb_tab tab = {};
  TT_(test_in(&al, &draw, raw, R * V * 4, "raw rows"));
  TT_(dalloc(&al, &dpt, R * V * 2, "P (table)"));
  TT_(dalloc(&al, &dpr, R * V * 2, "P (row)"));
  TT_(dalloc(&al, &dmax, R * nch * 4, "chunk maxima"));
  TT_(dalloc(&al, &dsum, R * 16 * 8, "warp sums"));
  TT_(dalloc(&al, &drs, R * 8 + 8, "row sums"));
  TC_(cudaMemset(dpt, 0xFF, R * V * 2)); /* 0xFFFF (a NaN): a word not written shows */
  TC_(cudaMemset(dpr, 0xFF, R * V * 2));
  tab.B = B;
  for (int b = 0; b < B; b++) { /* each canvas its own scratch (its rows of the buffers) */
    tab.s[b] = (dg_tb_seg){(const float *)draw + off * V, (bf16 *)dpt + off * V, (float *)dmax + off * nch,
                           (double *)dsum + off * 16, T[b]};
    tab.row0[b + 1] = tab.row0[b] + n[b];
    if (n[b] > 0)
      TC_(k_turbo_sc_probs_sum(0, (const float *)draw + off * V, (bf16 *)dpr + off * V, n[b], V, cap, T[b], act,
                               (double *)drs + off));
    off += (size_t)n[b];
  }
  TC_(k_turbo_sc_probs_tab(0, &tab, V, cap, act));
  TC_(cudaDeviceSynchronize());
  TT_(test_out(p_tab, dpt, R * V * 2));
  TT_(test_out(p_row, dpr, R * V * 2));
  TT_(test_out(sum_row, drs, R * 8));
  /* the table's sum of each row as scp_write_kernel forms it from the 16 warp sums (lane l < 16: warp l's, else 0;
   * the xor butterfly, in IEEE double here as there) */
  if (!(ws = (double *)malloc(R * 16 * 8))) { st = dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory"); goto done; }
  TT_(test_out(ws, dsum, R * 16 * 8));
  for (size_t r = 0; r < R; r++) {
    double lane[32], nx[32];
    for (int l = 0; l < 32; l++) lane[l] = l < 16 ? ws[r * 16 + l] : 0.0;
    for (int k = 16; k; k >>= 1) {
      for (int l = 0; l < 32; l++) nx[l] = lane[l] + lane[l ^ k];
      memcpy(lane, nx, sizeof lane);
    }
    sum_tab[r] = lane[0];
  }
done:
  free(ws);
  dfree_all(&al);
  return st;
}
#undef TT_
#undef TC_

extern "C" dg_status dg_cuda_test_sc_probs_set(int mode) {
  if (mode < -1 || mode > 1) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_sc_probs_set: %d (-1..1)", mode);
  dg_cuda_sc_probs_set(mode);
  return DG_OK;
}

/* ---- wgmma (src/cuda/wgmma.cuh) and the kernel lab's warpgroup kernels (dev/cuda/qmoe_w.cuh qw_kernel) ---- */
#define TT_(x) do { if ((st = (x)) != DG_OK) goto done; } while (0)
#define TC_(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { \
    st = dg_seterr(DG_ERR_BACKEND, "%s:%d: %s failed: %s", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
    goto done; } } while (0)

/* Whether this build's device code has wgmma (sm_90a, the default since session 25; a compute_90 pass traps instead). */
__global__ void wg_probe_kernel(int *avail) {
  DG_PDL_ENTRY();
  if (threadIdx.x == 0) *avail = dg_wg_available();
}
static dg_status wg_probe(alloc_list *al, int *avail) {
  int *d = NULL;
  DG_TRY(dalloc(al, (void **)&d, 4, "wgmma probe"));
  DG_LAUNCH(wg_probe_kernel, 1, 32, 0, 0)(d);
  CK(cudaGetLastError());
  return test_out(avail, d, 4);
}

/* One wgmma.mma_async m64n64k16 (dg_cuda_test_wgmma): A [64, 16] and B's transpose Bt [64, 16] (bf16, row-major)
 * into shared memory in the layout that mode asks for, D = A B + C (scd) from C's fragments, D written back in the
 * documented fragment layout. Shared memory from a 1024-byte boundary: A's tile at 0, B's at WGT_OPB. */
enum { WGT_SW128 = 1, WGT_ASMEM = 2, WGT_SCD0 = 4, WGT_SLICE = 16, WGT_OPB = 8192 };
__global__ void __launch_bounds__(128) wg_test_kernel(const uint16_t *A, const uint16_t *Bt, const float *C, float *D,
                                                       int mode) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  const int tid = threadIdx.x, w = tid >> 5, l = tid & 31, g = l >> 2, t = l & 3;
  const int sw = mode & WGT_SW128, slice = (mode / WGT_SLICE) & 3, mut = mode >> 8;
  const uint32_t s0 = dg_smem_addr(smem), pad = (1024u - s0 % 1024u) % 1024u, sa = s0 + pad;
  unsigned char *tile = smem + pad;
  /* filler 3.0 everywhere (what a wrong address reads), then each operand's (mn, k):
   *   no swizzle (LBO 1024, SBO 128): (mn / 8) 128 + (k / 8) 1024 + (mn % 8) 16 + (k % 8) 2;
   *   128-byte swizzle (SBO 1024): row mn of 128 bytes (64 k), the operand's k16 slice at k 16 s.. of the row
   *   (s = mode / WGT_SLICE % 4: the descriptor's start 32 s bytes in), bits 4-6 of the offset XORed with 7-9 */
  for (int i = tid; i < WGT_OPB; i += 128) ((uint16_t *)tile)[i] = 0x4040;
  __syncthreads();
  for (int i = tid; i < 2 * 64 * 16; i += 128) {
    const int op = i / 1024, mn = (i / 16) % 64, k = i % 16;
    uint32_t off;
    if (sw) {
      off = (uint32_t)(mn * 128 + (16 * slice + k) * 2);
      off ^= ((off >> 7) & 7u) << 4;
    } else {
      off = (uint32_t)((mn / 8) * 128 + (k / 8) * 1024 + (mn % 8) * 16 + (k % 8) * 2);
    }
    *(uint16_t *)(tile + op * WGT_OPB + off) = op ? Bt[mn * 16 + k] : A[mn * 16 + k];
  }
  uint64_t desc[2];
  for (int op = 0; op < 2; op++) {
    const uint32_t a = sa + (uint32_t)(op * WGT_OPB);
    desc[op] = sw ? dg_wg_desc_sw128(a + 32 * slice, 1024) : mut == 1 ? dg_wg_desc(a, 128, 1024) : dg_wg_desc(a, 1024, 128);
    if (mut == 2) desc[op] &= ~((uint64_t)3 << 62); /* the swizzle mode dropped */
  }
  float d[8][4];
  for (int j = 0; j < 8; j++)
    for (int i = 0; i < 4; i++) d[j][i] = C[(16 * w + g + 8 * (i >> 1)) * 64 + 8 * j + 2 * t + (i & 1)];
  const int r0 = 16 * w + g, r8 = r0 + 8;
  uint32_t a[4];
  a[0] = (uint32_t)A[r0 * 16 + 2 * t] | (uint32_t)A[r0 * 16 + 2 * t + 1] << 16;
  a[1] = (uint32_t)A[r8 * 16 + 2 * t] | (uint32_t)A[r8 * 16 + 2 * t + 1] << 16;
  a[2] = (uint32_t)A[r0 * 16 + 2 * t + 8] | (uint32_t)A[r0 * 16 + 2 * t + 9] << 16;
  a[3] = (uint32_t)A[r8 * 16 + 2 * t + 8] | (uint32_t)A[r8 * 16 + 2 * t + 9] << 16;
  if (mut == 3) { const uint32_t x = a[1]; a[1] = a[2]; a[2] = x; } /* the A fragment's k and row halves mixed */
  dg_fence_proxy_async();
  __syncthreads();
  dg_wg_fence();
  const int scd = !(mode & WGT_SCD0);
  if (mode & WGT_ASMEM) dg_wgmma_bf16_ss<8>(d, desc[0], desc[1], scd);
  else dg_wgmma_bf16<8>(d, a, desc[1], scd);
  dg_wg_commit();
  const int early = mut == 4; /* the accumulators read before the wait_group */
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) {
      dg_wg_wait0();
      dg_wg_pin<8>(d);
    }
    if (pass == (early ? 0 : 1))
      for (int j = 0; j < 8; j++)
        for (int i = 0; i < 4; i++) D[(16 * w + g + 8 * (i >> 1)) * 64 + 8 * j + 2 * t + (i & 1)] = d[j][i];
  }
}
extern "C" dg_status dg_cuda_test_wgmma(int device, int mode, const uint16_t *A, const uint16_t *Bt, const float *C,
                                        float *D, int *avail) {
  const int mut = mode >> 8, lay = mode & 255;
  if ((lay & ~(WGT_SW128 | WGT_ASMEM | WGT_SCD0 | 3 * WGT_SLICE)) || ((lay & 3 * WGT_SLICE) && !(lay & WGT_SW128)) || mut < 0 || mut > 4 || (mut == 1 && (lay & WGT_SW128)) ||
      (mut == 2 && !(lay & WGT_SW128)) || (mut == 3 && (lay & WGT_ASMEM)))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_wgmma: mode %#x", mode);
#ifndef DG_CUDA_EMU
  if (mut == 4) /* on the GPU the early read is undefined, not a certain failure */
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_wgmma: mutation 4 (no wait) is for the emulation only");
#endif
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  void *dA = NULL, *dB = NULL, *dC = NULL, *dD = NULL;
  TT_(wg_probe(&al, avail));
  if (!*avail) goto done;
  TT_(test_in(&al, &dA, A, 64 * 16 * 2, "A"));
  TT_(test_in(&al, &dB, Bt, 64 * 16 * 2, "Bt"));
  TT_(test_in(&al, &dC, C, 64 * 64 * 4, "C"));
  TT_(dalloc(&al, &dD, 64 * 64 * 4, "D"));
  DG_LAUNCH(wg_test_kernel, 1, 128, 1024 + 2 * WGT_OPB, 0)((const uint16_t *)dA, (const uint16_t *)dB,
                                                           (const float *)dC, (float *)dD, mode);
  TC_(cudaGetLastError());
  TT_(test_out(D, dD, 64 * 64 * 4));
done:
  dfree_all(&al);
  return st;
}

/* dg_cuda_test_bulk's kernel: 64 threads, slots of BT_SLOT bytes at 0 and BT_SLOT, their mbarriers at 2 BT_SLOT. */
enum { BT_SLOT = 256 };
__global__ void __launch_bounds__(64) bulk_test_kernel(const uint8_t *src, uint8_t *dst, int n, int mode) {
  DG_PDL_ENTRY();
  DG_DYN_SMEM16(smem);
  uint64_t *bar = (uint64_t *)(smem + 2 * BT_SLOT);
  const int tid = threadIdx.x;
  if (tid == 0) {
    dg_mbar_init(&bar[0]);
    dg_mbar_init(&bar[1]);
    dg_mbar_fence_init();
  }
  __syncthreads();
  if (tid == 0) dg_bulk_g2s(smem, src, BT_SLOT, &bar[0]);
  for (int s = 0; s < n; s++) {
    const int slot = s & 1;
    if (tid == 0 && s + 1 < n) /* slot 1 - slot was read at stage s - 1, before the barrier that ended it */
      dg_bulk_g2s(smem + (1 - slot) * BT_SLOT, src + (size_t)(s + 1) * BT_SLOT, BT_SLOT, &bar[1 - slot]);
    const uint32_t parity = (uint32_t)(s >> 1) & 1u;
    if (mode != 1) dg_mbar_wait(&bar[slot], mode == 2 ? parity ^ 1u : parity);
    const uint32_t v = *(const uint32_t *)(smem + slot * BT_SLOT + 4 * tid);
    memcpy(dst + (size_t)s * BT_SLOT + 4 * tid, &v, 4);
    __syncthreads(); /* every thread's read of the slot done before it is refilled */
  }
  if (mode != 0 && tid == 0) /* the mutations: each slot's last phase waited for, so that the block exits clean */
    for (int s = n > 1 ? n - 2 : 0; s < n; s++) dg_mbar_wait(&bar[s & 1], (uint32_t)(s >> 1) & 1u);
}
extern "C" dg_status dg_cuda_test_bulk(int device, int mode, const uint8_t *src, uint8_t *dst, int n) {
  if (mode < 0 || mode > 2 || n < 1 || n > 64)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_bulk: mode %d (0-2), %d stages (1-64)", mode, n);
#ifndef DG_CUDA_EMU
  if (mode != 0) /* on the GPU an early read is undefined, not a certain failure */
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_bulk: mutation %d is for the emulation only", mode);
#endif
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = DG_OK;
  void *ds = NULL, *dd = NULL;
  TT_(test_in(&al, &ds, src, (size_t)n * BT_SLOT, "src"));
  TT_(dalloc(&al, &dd, (size_t)n * BT_SLOT, "dst"));
  DG_LAUNCH(bulk_test_kernel, 1, 64, 2 * BT_SLOT + 16, 0)((const uint8_t *)ds, (uint8_t *)dd, n, mode);
  TC_(cudaGetLastError());
  TT_(test_out(dst, dd, (size_t)n * BT_SLOT));
done:
  dfree_all(&al);
  return st;
}

/* The lane records of qw_kernel from the backend's (qr_tile_pack's compact layout, 4 warps per block): lane (g, t)'s
 * code j of a row's run of 32 becomes the run's code 8 (j % 4) + 4 (j / 4) + t (qw_tile_pack in
 * dev/cuda/moe_quant.cu), that is code 4 (j / 4) + t of lane (g, j % 4); the pairs stay. n stages of 4 warps. */
static void qw_recode(uint8_t *q, int64_t n, int bits, int group) {
  const int KC = qr_kc(group), RUNS = KC / 32, CB = 4 * RUNS * bits, PSC = CB % 16 == 0 ? 16 : 8;
  const int64_t WST = qr_wstage(bits, group, 1);
  const uint32_t mask = (1u << bits) - 1;
  uint8_t in[32 * 64], out[32 * 64]; /* CB <= 64 (8 bits, 2 runs) */
  for (int64_t s = 0; s < n; s++) {
    uint8_t *ws = q + s * WST;
    for (int lane = 0; lane < 32; lane++)
      for (int p = 0; p < CB / PSC; p++) memcpy(in + lane * CB + p * PSC, ws + (p * 32 + lane) * PSC, (size_t)PSC);
    memset(out, 0, sizeof out);
    for (int lane = 0; lane < 32; lane++)
      for (int r = 0; r < 4 * RUNS; r++) /* (row r / RUNS, run r % RUNS) */
        for (int j = 0; j < 8; j++) {
          const int src = (lane & ~3) + (j & 3), bs = (r * 8 + 4 * (j >> 2) + (lane & 3)) * bits, bd = (r * 8 + j) * bits;
          uint32_t v = 0;
          memcpy(&v, in + src * CB + bs / 8, bs / 8 + 1 < CB ? 2 : 1);
          v = (v >> (bs % 8)) & mask;
          v <<= bd % 8;
          out[lane * CB + bd / 8] |= (uint8_t)v;
          if (v >> 8) out[lane * CB + bd / 8 + 1] |= (uint8_t)(v >> 8);
        }
    for (int lane = 0; lane < 32; lane++)
      for (int p = 0; p < CB / PSC; p++) memcpy(ws + (p * 32 + lane) * PSC, out + lane * CB + p * PSC, (size_t)PSC);
  }
}
/* The kernel lab's qw version qw_ver (dev/cuda/moe_quant.cu run_wg / run_wgdq, 4-bit g64) in place of qr_kernel:
 * the backend's records recoded into a copy (qw_recode), the launch, the copy freed. */
static int qw_ver;
static const dg_weight *qw_w[2]; /* versions 120-: the host stacks (down, gate/up), packed by wl_pack at launch */
/* Versions 120-122 (dev/cuda/moe_quant.cu run_wl): wl_kernel over the wl layout of the host stack (wl_pack), the
 * launch, the copy freed; 120: two warpgroups (128-row passes), 6 slots, 128 columns; 121: one warpgroup (64 rows),
 * 4 slots, 2 blocks per SM; 122: two warpgroups, 5 slots, 256 columns; 123, 124: 122 with a block over 3 slabs or
 * every slab of its expert (the copies streaming on across the slabs). */
static cudaError_t wl_launch_ver(cudaStream_t s, const qe_args &a0, int gateup) {
  const dg_weight *w = qw_w[gateup];
  const int E = (int)(w->rows / (gateup ? 2 * a0.N : a0.N));
  const int bn = qw_ver >= 122 ? 256 : 128;
  const size_t bytes = wl_bytes(gateup, E, a0.N, a0.Kdim, bn);
  uint8_t *h = (uint8_t *)malloc(bytes);
  void *dq = NULL;
  if (!h) return cudaErrorMemoryAllocation;
  wl_pack(gateup, E, a0.N, a0.Kdim, bn, (const uint8_t *)w->data, (const uint16_t *)w->scales, (const uint16_t *)w->biases, h);
  cudaError_t e = cudaMalloc(&dq, bytes);
  if (e == cudaSuccess) e = cudaMemcpy(dq, h, bytes, cudaMemcpyHostToDevice);
  qe_args a = a0;
  a.q = (const uint32_t *)dq;
  if (e == cudaSuccess) {
    if (qw_ver == 120) e = gateup ? wl_launch<1, 2, 6>(s, E, a) : wl_launch<0, 2, 6>(s, E, a);
    else if (qw_ver == 121) e = gateup ? wl_launch<1, 1, 4, 2>(s, E, a) : wl_launch<0, 1, 4, 2>(s, E, a);
    else if (qw_ver == 123) e = gateup ? wl_launch<1, 2, 5, 1, 256, 3>(s, E, a) : wl_launch<0, 2, 5, 1, 256, 3>(s, E, a);
    else if (qw_ver == 124) e = gateup ? wl_launch<1, 2, 5, 1, 256, 12>(s, E, a) : wl_launch<0, 2, 5, 1, 256, 12>(s, E, a);
    else e = gateup ? wl_launch<1, 2, 5, 1, 256>(s, E, a) : wl_launch<0, 2, 5, 1, 256>(s, E, a);
  }
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  cudaFree(dq);
  free(h);
  return e;
}
static cudaError_t qw_launch_ver(cudaStream_t s, dim3 grid, int nt, const qe_args &a0, int bits, int gateup) {
  if (bits != 4 || a0.group != 64) return cudaErrorInvalidValue; /* the versions are instantiated for 4-bit g64 */
  if (qw_ver >= 120) return wl_launch_ver(s, a0, gateup);
  if (qw_ver == 75 && nt <= 3) return gateup ? qr_launch_bits<4, 1>(s, grid, nt, a0) : qr_launch_bits<4, 0>(s, grid, nt, a0);
  const int64_t n = (int64_t)grid.x * grid.y * (a0.Kdim / qr_kc(64)) * 4;
  const size_t bytes = (size_t)n * qr_wstage(4, 64, 1);
  uint8_t *h = (uint8_t *)malloc(bytes);
  void *dq = NULL;
  if (!h) return cudaErrorMemoryAllocation;
  cudaError_t e = cudaMalloc(&dq, bytes);
  if (e == cudaSuccess) e = cudaMemcpy(h, a0.q, bytes, cudaMemcpyDeviceToHost);
  if (e == cudaSuccess) {
    qw_recode(h, n, 4, 64);
    e = cudaMemcpy(dq, h, bytes, cudaMemcpyHostToDevice);
  }
  qe_args a = a0;
  a.q = (const uint32_t *)dq;
#define QW_NT(GU, D, ST, MB, SUB, PF, SW)                                                                       \
  (nt == 1   ? qw_launch_g<4, GU, 1, 64, D, ST, MB, SUB, 0, SW>(s, grid, a)                                     \
   : nt == 2 ? qw_launch_g<4, GU, 2, 64, D, ST, MB, SUB, 0, SW>(s, grid, a)                                     \
   : nt == 3 ? qw_launch_g<4, GU, 3, 64, D, ST, MB, SUB, PF, SW>(s, grid, a)                                    \
             : qw_launch_g<4, GU, 4, 64, D, ST, MB, SUB, PF, SW>(s, grid, a))
  if (e == cudaSuccess) switch (qw_ver) {
    case 20: e = gateup ? QW_NT(1, 2, 3, 4, 2, 2, 0) : QW_NT(0, 2, 3, 4, 2, 2, 0); break;
    case 21: e = gateup ? QW_NT(1, 2, 3, 4, 2, 2, 1) : QW_NT(0, 2, 3, 4, 2, 2, 1); break; /* LBO and SBO exchanged */
    case 22: e = gateup ? QW_NT(1, 2, 3, 3, 2, 2, 0) : QW_NT(0, 2, 3, 3, 2, 2, 0); break;
    default: /* 75: the DQ body, 64 tokens per pass, ring of 3, 1 block per SM */
      e = gateup ? qw_launch_g<4, 1, 8, 64, QR_D, 3, 1, QR_SUB, -2, 0, 1>(s, grid, a)
                 : qw_launch_g<4, 0, 8, 64, QR_D, 3, 1, QR_SUB, -2, 0, 1>(s, grid, a);
    }
#undef QW_NT
  if (e == cudaSuccess) e = cudaDeviceSynchronize();
  cudaFree(dq);
  free(h);
  return e;
}
extern "C" dg_status dg_cuda_test_experts_qw(int device, int version, const dg_weight *gate_up, const dg_weight *down,
                                             const uint16_t *xe, const int32_t *idx, int T, int H, int IE, int E,
                                             int K, int nt, uint16_t *h, float *y, int *avail) {
  if (version == 200) { /* the backend's experts path as the passes call it, with DGEMMA_WL=1 (qmoe_wl.cu) */
    CK(cudaSetDevice(device));
    alloc_list al = {NULL, 0, 0};
    dg_status st = wg_probe(&al, avail);
    dfree_all(&al);
    if (st != DG_OK || !*avail) return st;
    int fused;
    const long n0 = qr_wl_launches;
    qr_wl_set(1);
    st = test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, -1, 0, -1, &fused, h, y);
    qr_wl_set(-1);
    if (st == DG_OK && qr_wl_launches == n0)
      st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_experts_qw: DGEMMA_WL=1 launched no wl_kernel");
    return st;
  }
  if (version % 1000 == 112 && version >= 112 && version < 1000000) {
    /* the lab's tail split (qr_diet_lab.cuh qr_sk_kernel; no wgmma): 112 with the resident slots of the occupancy
     * query (the emulation's 132: every item of a small stack split), 112 + 1000 c with the slots taken as c (the
     * items past the last multiple of c split, the others whole) */
    if (gate_up->bits != 4 || down->bits != 4)
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_qw: version 112: %d/%d-bit stacks (4-bit only)",
                       gate_up->bits, down->bits);
    int fused;
    *avail = 1;
    lab_ver = 112;
    qr_sk_rows = T * K;
    qr_sk_slots_cap = version / 1000;
    qr_launcher_set(lab_launch);
    dg_status st = test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, 0, &fused, h, y);
    qr_launcher_set(NULL);
    qr_sk_slots_cap = 0;
    return st;
  }
  if (version == 114 || (version % 1000 >= 116 && version % 1000 <= 119) ||
      (version % 1000 >= 125 && version % 1000 <= 129)) {
    /* the lab's gate/up + down in one launch (qr_diet_lab.cuh qr_fg_version, 4-bit): version 50 with the fused down
     * input (the backend's two launches, DGEMMA_DN_FUSE=1), then 114 twice (the second finds the counters the first
     * left: they must be back at 0), each h and y word for word 50's; h and y returned are 114's (the caller checks
     * them against the CPU); 116-119 (qr_fgx_version: 114 with the timeline, checked by fgx_check, other ticket
     * orders, persistent blocks) likewise, version 116-119 + 1000 c taking the resident slots as c (qr_fgx_slots_cap:
     * the interleaved orders of 117-118 need fewer slots than gate/up items, which the emulation's 132 x 4 never are;
     * 119 then runs c blocks) */
    const int fver = version % 1000;
    if (gate_up->bits != 4 || down->bits != 4)
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_qw: version %d: %d/%d-bit stacks (4-bit only)",
                       fver, gate_up->bits, down->bits);
    *avail = 1;
    const size_t nh = (size_t)T * K * IE, ny = (size_t)T * K * H;
    uint16_t *h0 = (uint16_t *)malloc(nh * 2);
    float *y0 = (float *)malloc(ny * 4);
    int fused = 0;
    dg_status st = !h0 || !y0 ? dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory") : DG_OK;
    if (st == DG_OK) st = test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, 1, &fused, h0, y0);
    if (st == DG_OK && !fused)
      st = dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_qw: version %d: the stacks do not take the fused down "
                     "input (k_qe_dn_fuse_group: group 32 or 64, IE a multiple of %d)", fver, 16 * QR_WARPS);
    for (int run = 0; run < 2 && st == DG_OK; run++) {
      fg_on = 1;
      fg_err = 0;
      fg_ver = fver;
      qr_fgx_slots_cap = version / 1000;
      st = test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, 1, &fused, h, y);
      fg_on = 0;
      fg_ver = 114;
      qr_fgx_slots_cap = 0;
      if (st != DG_OK) break;
      if (fg_err)
        st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_experts_qw: version %d, launch %d: %s", fver, run + 1,
                       fg_err == 1 ? "a down block's wait found its expert's gate/up blocks not all counted"
                                   : fg_err == 2 ? "a counter not back at 0 after the launch"
                                   : fg_err == 3 ? "the timeline out of order or an item not covered once (stderr)"
                                                 : "counters unreadable");
      long dh = 0, dy = 0;
      for (size_t i = 0; i < nh && st == DG_OK; i++) dh += h[i] != h0[i];
      for (size_t i = 0; i < ny && st == DG_OK; i++) dy += memcmp(&y[i], &y0[i], 4) != 0;
      if (st == DG_OK && (dh || dy))
        st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_experts_qw: version %d, launch %d: words that differ from "
                       "version 50's (DGEMMA_DN_FUSE=1): h %ld of %zu, y %ld of %zu", fver, run + 1, dh, nh, dy, ny);
    }
    free(h0);
    free(y0);
    return st;
  }
  if (version == 115) {
    /* the backend's DGEMMA_EXPERTS_FG=1 (qmoe.cu k_qe_experts_fg: gate/up and down in one launch of qmoe_fg.cuh
     * qr_fg_kernel) through dg_cuda_experts_nt (nt 0: qe_nt's choice): first the backend with DGEMMA_DN_FUSE=1 and the
     * switch off (two launches), then twice with the switch on (test_experts_with also fails on a counter of b.fg not
     * back at 0 after each); each run must have made exactly one fused launch (qr_fg_launches) and given h and y word
     * for word the two launches'; h and y returned are the fused launch's */
    if (gate_up->bits != 4 || down->bits != 4)
      return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_qw: version 115: %d/%d-bit stacks (4-bit only)",
                       gate_up->bits, down->bits);
    *avail = 1;
    const size_t nh = (size_t)T * K * IE, ny = (size_t)T * K * H;
    uint16_t *h0 = (uint16_t *)malloc(nh * 2);
    float *y0 = (float *)malloc(ny * 4);
    int fused = 0;
    dg_status st = !h0 || !y0 ? dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of host memory") : DG_OK;
    qr_experts_fg_set(0);
    if (st == DG_OK) st = test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, 1, &fused, h0, y0);
    if (st == DG_OK && !fused)
      st = dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_qw: version 115: the stacks do not take the fused down "
                     "input (k_qe_dn_fuse_group: group 32 or 64, IE a multiple of %d)", 16 * QR_WARPS);
    for (int run = 0; run < 2 && st == DG_OK; run++) {
      const long n0 = qr_fg_launches;
      qr_experts_fg_set(1);
      st = test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, 1, &fused, h, y);
      qr_experts_fg_set(-1);
      if (st != DG_OK) break;
      if (qr_fg_launches != n0 + 1)
        st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_experts_qw: version 115, run %d: %ld fused launches (expected 1)",
                       run + 1, qr_fg_launches - n0);
      long dh = 0, dy = 0;
      for (size_t i = 0; i < nh && st == DG_OK; i++) dh += h[i] != h0[i];
      for (size_t i = 0; i < ny && st == DG_OK; i++) dy += memcmp(&y[i], &y0[i], 4) != 0;
      if (st == DG_OK && (dh || dy))
        st = dg_seterr(DG_ERR_BACKEND, "dg_cuda_test_experts_qw: version 115, run %d: words that differ from the two "
                       "launches' (DGEMMA_DN_FUSE=1): h %ld of %zu, y %ld of %zu", run + 1, dh, nh, dy, ny);
    }
    qr_experts_fg_set(-1);
    free(h0);
    free(y0);
    return st;
  }
  if (version != 20 && version != 21 && version != 22 && version != 75 && (version < 120 || version > 124))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_qw: version %d (20, 21, 22, 75, 112, 114, 115, 120-124, 200)",
                     version);
  if (version >= 120 && (gate_up->sb_dtype != DG_BF16 || down->sb_dtype != DG_BF16 || H % 64 || IE % 64))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_qw: version %d needs bf16 scales and H, IE multiples "
                     "of 64", version);
  if (nt < 1 || nt > 8 || nt == 6 || nt == 7)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_qw: tile count %d (1-5, 8)", nt);
  if (gate_up->bits != 4 || down->bits != 4 || gate_up->group_size != 64 || down->group_size != 64)
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_experts_qw: %d/%d-bit g%d/g%d stacks (4-bit g64 only)",
                     gate_up->bits, down->bits, gate_up->group_size, down->group_size);
  CK(cudaSetDevice(device));
  alloc_list al = {NULL, 0, 0};
  dg_status st = wg_probe(&al, avail);
  dfree_all(&al);
  if (st != DG_OK || !*avail) return st;
  int fused;
  qw_ver = version;
  qw_w[0] = down;
  qw_w[1] = gate_up;
  qr_launcher_set(qw_launch_ver);
  st = test_experts_with(device, gate_up, down, xe, idx, T, H, IE, E, K, nt, 0, 0, &fused, h, y);
  qr_launcher_set(NULL);
  return st;
}
#undef TT_
#undef TC_

extern "C" void dg_cuda_model_allocs(const dg_cuda_model *m, int *n, size_t *used, size_t *cap); /* upload.cu */
extern "C" size_t dg_cuda_model_bytes(const dg_cuda_model *m);

extern "C" dg_status dg_cuda_test_weight_block(const dg_cuda_ctx *c, int *n, size_t *used, size_t *cap,
                                               size_t *weight_bytes) {
  if (!c || !n || !used || !cap || !weight_bytes) return dg_seterr(DG_ERR_INVALID_ARG, "dg_cuda_test_weight_block: NULL");
  dg_cuda_model_allocs(c->m, n, used, cap);
  *weight_bytes = dg_cuda_model_bytes(c->m);
  return DG_OK;
}

extern "C" dg_status dg_cuda_test_soft_from_z(dg_cuda_ctx *c, int *sc_group) {
  *sc_group = c->sc_group;
  return dg_cuda_soft_from_z(c);
}

static const dg_cuda_test_api test_table = {
    dg_cuda_test_matmul,    dg_cuda_test_embed,        dg_cuda_test_soft,     dg_cuda_test_experts, dg_cuda_test_route,
    dg_cuda_test_attention, dg_cuda_test_put_raw_rows, dg_cuda_test_get_soft,  dg_cuda_test_router_route,
    dg_cuda_test_experts_nt, dg_cuda_test_gemm_pins, dg_cuda_test_combine_norm, dg_cuda_test_vocab_chain,
    dg_cuda_test_experts_dn_fuse,
    dg_cuda_test_ctx_arena, dg_cuda_test_dn_fuse_group, dg_cuda_test_vocab_set, dg_cuda_test_branch_set,
    dg_cuda_test_branch_stats, dg_cuda_test_experts_diet, dg_cuda_test_experts_lab, dg_cuda_test_put_soft,
    dg_cuda_test_group_sums_perm,
    dg_cuda_test_wgmma, dg_cuda_test_experts_qw, dg_cuda_test_bulk, dg_cuda_test_stack_dense_set,
    dg_cuda_test_gemm_inv, dg_cuda_test_experts_fg, dg_cuda_test_sc_probs,
    dg_cuda_test_sc_probs_set, dg_cuda_test_weight_block, dg_cuda_test_soft_from_z, dg_cuda_test_attention_batch,
    dg_cuda_test_seg_streams,
};

extern "C" const dg_cuda_test_api *dg_cuda_test_table(void) { return &test_table; }
