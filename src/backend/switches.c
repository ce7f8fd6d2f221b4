/* switches.c: the table of the library's environment switches (switches.h) and dg_switches_check (dgemma.h).
 *
 * Here, in the host library beside backend_select.c (which calls dg_switches_check), because the CUDA plugin reads
 * its switches through dg_sw_get: the plugin is opened with RTLD_NOW and takes these symbols from the program, so
 * they must be in an object that every program opening the plugin links. Each entry's comment names its reader;
 * the words, ranges and defaults are those the readers' own parsers accepted before session 30 (whose other values
 * ran silently as the default and are now refused). */
#include "backend/switches.h"

#include <stdlib.h>

#include "base/dg_error.h"
#include "cpu/kernels.h"
#include "model/context.h"

#define DG_STR_(x) #x
#define DG_STR(x) DG_STR_(x)
#define N_OF(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define ONOFF(nm, d, w) {nm, DG_SW_ONOFF, 0, 0, 0, NULL, 0, NULL, d, w}
#define INT(nm, lo, hi, st, d, w) {nm, DG_SW_INT, lo, hi, st, NULL, 0, NULL, d, w}
#define WORD(nm, ws, vs, d, w) {nm, DG_SW_WORD, 0, 0, 0, ws, N_OF(ws), vs, d, w}

/* DGEMMA_ATTN (cuda/attention.cu k_attention_choose): k_attention_any's versions 0..8 (DG_ATT_VERSIONS), 15, 16
 * and 18 (DG_ATT_WQ, DG_ATT_WQC, DG_ATT_WQB; cuda/common.cuh) */
static const char *const attn_w[] = {"0", "1", "2", "3", "4", "5", "6", "7", "8", "15", "16", "18"};
static const int attn_v[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 18};
static const char *const one_w[] = {"one"};
static const int one_v[] = {1};
static const char *const pre_w[] = {"pre"};
static const int pre_v[] = {2};
static const char *const pool_w[] = {"default", "small", "zero"};
static const char *const flat_w[] = {"flat"};
static const int flat_v[] = {2};
static const char *const nt_w[] = {"1", "2", "3", "4", "5", "8"};
static const int nt_v[] = {1, 2, 3, 4, 5, 8};
/* DGEMMA_ROUTE (cuda/moe.cu route_mode_from_env): the modes of k_route; "split" is session 11's name of "chain" */
static const char *const route_w[] = {"grid", "tiles", "chain", "split", "fused", "deep", "one", "gridp"};
static const int route_v[] = {3, 2, 0, 0, 1, 4, 5, 6};
/* DGEMMA_QR_LAUNCH (cuda/qmoe.cu qr_launch_form): QR_FORM_V50, QR_FORM_LEAN, QR_FORM_LEAN5 (cuda/qmoe_r.cuh) */
static const char *const qrl_w[] = {"v50", "lean", "lean5"};
static const char *const row_w[] = {"row"};
static const int row_v[] = {0};
static const char *const dense_w[] = {"0", "1", "inv"};
static const char *const vocab_w[] = {"chain", "fused", "zstore"};

static const dg_sw table[DG_SW_COUNT] = {
    /* base/dg_mem.c dg_big_alloc_wants_huge, at each big allocation */
    [DG_SW_THP] = ONOFF("DGEMMA_THP", 0, "big host allocations 2 MiB-aligned and advised MADV_HUGEPAGE; unset: 0"),
    /* cpu/matmul_avx512lp.c amx_wanted, at each call */
    [DG_SW_CPU_AMX] = ONOFF("DGEMMA_CPU_AMX", 0,
                            "avx512lp's 4-bit g64 products of 32 or more rows by AMX int8 tiles, the same bits; unset: 0"),
    /* sample/turbo.c seqs_after_forward, read once */
    [DG_SW_TURBO_BATCH] = ONOFF("DGEMMA_TURBO_BATCH", 1,
                                "a batch's top-K and self-conditioning rows in one backend call each; unset: 1"),
    /* cuda/attention.cu k_attention_choose, when a context is made */
    [DG_SW_ATTN] = {"DGEMMA_ATTN", DG_SW_WORD2, 0, 0, 0, attn_w, N_OF(attn_w), attn_v, -1,
                    "attention version at head dims <= 256, and above after a comma; unset: 15 where the device runs "
                    "sm_90a code, else 6"},
    /* cuda/passes.cu branch_from_env, read once */
    [DG_SW_BRANCH] = ONOFF("DGEMMA_BRANCH", 1, "a layer's dense and expert branches on two streams; unset: 1"),
    /* cuda/context.cu side_one_handle, read once */
    [DG_SW_BRANCH_HANDLE] = WORD("DGEMMA_BRANCH_HANDLE", one_w, one_v, 0,
                                 "the dense branch on the context's own cuBLAS handle; unset: a second handle"),
    /* cuda/context.cu side_ws_kib_env, read once */
    [DG_SW_BRANCH_WS_KIB] = INT("DGEMMA_BRANCH_WS_KIB", 1, 32768, 1, 0,
                                "KiB of the second branch's cuBLAS workspace; unset: 4096, or the whole workspace "
                                "with DGEMMA_GEMM_PIN=1 or DGEMMA_STACK_DENSE=inv"),
    /* cuda/kernels.cu combine_from_env, read once */
    [DG_SW_COMBINE] = WORD("DGEMMA_COMBINE", pre_w, pre_v, 0, "k_ffn_combine_norm's version 2; unset: version 0"),
    /* cuda/upload.cu cublas_pool_env, when a CUDA model is made */
    [DG_SW_CUBLAS_POOL] = WORD("DGEMMA_CUBLAS_POOL", pool_w, NULL, 0,
                               "cuBLAS's default workspace pool per handle; unset: default"),
    /* cuda/upload.cu dev_limits, when a CUDA model is made */
    [DG_SW_CUDA_LIMITS] = ONOFF("DGEMMA_CUDA_LIMITS", 1,
                                "the device's stack, printf FIFO and malloc heap limits set to 0; unset: 1"),
    /* cuda/upload.cu memlog_on, read once */
    [DG_SW_CUDA_MEMLOG] = ONOFF("DGEMMA_CUDA_MEMLOG", 0, "device memory lines on stderr; unset: 0"),
    /* cuda/context.cu dg_cuda_ctx_new, when a context is made */
    [DG_SW_CUDA_SYNC] = ONOFF("DGEMMA_CUDA_SYNC", 0, "a synchronization after every kernel; unset: 0"),
    /* cuda/qmoe.cu dn_fuse_on, read once */
    [DG_SW_DN_FUSE] = ONOFF("DGEMMA_DN_FUSE", 0, "the down product's input copy in gate/up's epilogue; unset: 0"),
    /* dg_cuda_enc_chunk (backend_select.c), when a CUDA context is made */
    [DG_SW_ENC_CHUNK] = INT("DGEMMA_ENC_CHUNK", 64, 4096, 64, DG_CUDA_ENC_CHUNK,
                            "prompt tokens per CUDA encoder pass; unset: " DG_STR(DG_CUDA_ENC_CHUNK)),
    /* cuda/qmoe.cu experts_fg_on, read once */
    [DG_SW_EXPERTS_FG] = ONOFF("DGEMMA_EXPERTS_FG", 0, "gate/up and down of the experts in one launch; unset: 0"),
    /* cuda/gemm_pin.cu pins_from_env and cuda/context.cu side_ws_bytes, when a context is made */
    [DG_SW_GEMM_PIN] = ONOFF("DGEMMA_GEMM_PIN", 0, "the dense products' cublasLt algorithms pinned; unset: 0"),
    /* cuda/graph.cu graph_init, when a context is made */
    [DG_SW_GRAPHS] = ONOFF("DGEMMA_GRAPHS", 1, "passes captured and replayed as CUDA graphs; unset: 1"),
    [DG_SW_GRAPHS_MAX] = INT("DGEMMA_GRAPHS_MAX", 1, 1024, 1, 32, "CUDA graphs kept per context; unset: 32"),
    /* cuda/qmoe.cu gsp_from_env, read once */
    [DG_SW_GSP] = WORD("DGEMMA_GSP", flat_w, flat_v, 0, "k_group_sums_perm's version 2; unset: version 0"),
    /* cuda/kernels.cu initcheck_from_env, read once */
    [DG_SW_INITCHECK] = ONOFF("DGEMMA_INITCHECK", 0,
                              "every cuBLAS output cleared before its product, for compute-sanitizer; unset: 0"),
    /* cuda/kernels.cu pdl_from_env, read once */
    [DG_SW_PDL] = ONOFF("DGEMMA_PDL", 1, "every kernel launched with programmatic dependent launch; unset: 1"),
    /* cuda/moe.cu qe_nt_from_env, read once */
    [DG_SW_QE_NT] = WORD("DGEMMA_QE_NT", nt_w, nt_v, 0,
                         "the quantized expert kernels' n-tiles for every product; unset: by the rows per expert"),
    /* cuda/qmoe.cu qr_dq_from, read once */
    [DG_SW_QR_DQ] = INT("DGEMMA_QR_DQ", 4, 8, 1, 0, "the quantized expert kernels' dequantization form; unset: 0"),
    /* cuda/qmoe.cu qr_launch_form, read once (QR_FORM_* in cuda/qmoe_r.cuh) */
    [DG_SW_QR_LAUNCH] = WORD("DGEMMA_QR_LAUNCH", qrl_w, NULL, 1,
                             "the 4-bit g64 expert kernels' launch choices at 5 and 8 n-tiles; unset: lean"),
    /* cuda/moe.cu route_mode_from_env, read once */
    [DG_SW_ROUTE] = WORD("DGEMMA_ROUTE", route_w, route_v, 3, "the router and top-k launches; unset: grid"),
    /* cuda/moe.cu route_coop_from_env, read once */
    [DG_SW_ROUTE_COOP] = ONOFF("DGEMMA_ROUTE_COOP", 0, "route_gr_kernel through a cooperative launch; unset: 0"),
    /* cuda/context.cu sc_inplace, read once */
    [DG_SW_SC_INPLACE] = ONOFF("DGEMMA_SC_INPLACE", 1,
                               "the self-conditioning probabilities written over the logits; unset: 1"),
    /* cuda/turbo_host.cu sc_probs_env, read once */
    [DG_SW_SC_PROBS] = WORD("DGEMMA_SC_PROBS", row_w, row_v, 1,
                            "the one-block-per-row self-conditioning kernel; unset: the table kernels"),
    /* cuda/passes.cu dg_cuda_seg_streams, when a CUDA context is made */
    [DG_SW_SEG_STREAMS] = INT("DGEMMA_SEG_STREAMS", 1, 8, 1, 1,
                              "streams for a stacked batch pass's per-canvas products; unset: 1, off"),
    /* cuda/gemm_inv.cu stack_dense_from_env, read once */
    [DG_SW_STACK_DENSE] = WORD("DGEMMA_STACK_DENSE", dense_w, NULL, 0,
                               "a stacked pass's dense products once over the stack (1), batch-invariant (inv); "
                               "unset: 0, per canvas"),
    /* cuda/passes.cu vocab_mode_from_env, read once */
    [DG_SW_VOCAB] = WORD("DGEMMA_VOCAB", vocab_w, NULL, 2, "the chain over the logits; unset: zstore"),
    /* cuda/upload.cu arena_new, when a CUDA model is made */
    [DG_SW_WEIGHT_BLOCK] = ONOFF("DGEMMA_WEIGHT_BLOCK", 1, "a CUDA model's weights in one allocation; unset: 1"),
    /* cuda/qmoe_wl.cu qr_wl_on, read once */
    [DG_SW_WL] = ONOFF("DGEMMA_WL", 0, "the wgmma expert kernel (wl_kernel); unset: 0"),
};

const dg_sw *dg_sw_of(dg_sw_id id) { return id >= 0 && id < DG_SW_COUNT ? &table[id] : NULL; }

void dg_sw_get2(dg_sw_id id, long v[2]) {
  const dg_sw *s = dg_sw_of(id);
  if (!s) {
    v[0] = v[1] = 0;
    return;
  }
  if (!dg_sw_ok(s, getenv(s->name), v)) v[0] = v[1] = s->def;
}

long dg_sw_get(dg_sw_id id) {
  long v[2];
  dg_sw_get2(id, v);
  return v[0];
}

dg_status dg_switches_check(dg_device dev) {
  const char *kern = getenv("DGEMMA_KERNELS"); /* its own parser (cpu/dispatch.c); a name of no set is refused here */
  if (!dg_kernels_known(kern)) {
    char why[256];
    dg_kernels_refusal(kern, why, sizeof why);
    return dg_seterr(DG_ERR_INVALID_ARG, "%s", why);
  }
  const int n = dev == DG_DEVICE_CUDA ? DG_SW_COUNT : DG_SW_CUDA_FIRST;
  for (int i = 0; i < n; i++) DG_TRY(dg_sw_read(&table[i], NULL));
  return DG_OK;
}
