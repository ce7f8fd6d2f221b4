/* test_switches.c: the environment switches (DGEMMA_*; src/base/envsw.c parses, src/backend/switches.c is the
 * table, dg_switches_check refuses), on the CPU build.
 *
 *  - every switch of the table: unset and "" give its default; each accepted value gives the value its reader took
 *    before session 30 (written here, not taken from the table); a set of bad values (text, negative, out of range,
 *    trailing junk or blank, overflow, a word in the wrong case) gives DG_ERR_INVALID_ARG and the exact line
 *    'NAME="value" is not ALLOWED (WHAT)', with ALLOWED and WHAT written here;
 *  - dg_sw_get gives the default for a refused value and leaves dg_last_error() alone;
 *  - dg_switches_check: the host's switches for every device, the CUDA backend's only for DG_DEVICE_CUDA;
 *  - dg_model_load and dg_context_new on a CPU model refuse a bad host switch (no model, no context) and ignore
 *    the CUDA backend's (the CPU backend reads none of them).
 * The environment is restored after each test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/switches.h"
#include "base/dg_error.h"
#include "base/dg_mem.h"
#include "synth.h"
#include "testutil.h"

typedef struct {
  const char *v;
  long a, b; /* what the reader took: a, and for DGEMMA_ATTN the second version b (else a) */
} good_val;

typedef struct {
  dg_sw_id id;
  const char *name;
  long def, def_b;      /* unset: the value (def_b: DGEMMA_ATTN's second) */
  const good_val *good; /* accepted values, NULL-terminated by v */
  const char *const *bad; /* this switch's own bad values (out of range, near misses), NULL-terminated */
  const char *allowed, *what; /* the line's parts */
} sw_case;

#define ONOFF_GOOD {{"0", 0, 0}, {"1", 1, 1}, {NULL, 0, 0}}
static const good_val onoff_good[] = ONOFF_GOOD;
static const char *const onoff_bad[] = {"2", "00", "01", "on", "off", "true", "yes", "-0", NULL};
#define OO "0 or 1"

static const good_val attn_good[] = {{"0", 0, 0},      {"6", 6, 6},     {"8", 8, 8},   {"15", 15, 15},
                                     {"16", 16, 16},   {"18", 18, 18},  {"2,15", 2, 15}, {"16,18", 16, 18},
                                     {"6,0", 6, 0},    {NULL, 0, 0}};
static const char *const attn_bad[] = {"9", "14", "17", "19", "15,", ",6", "6,17", "6,x", "6,6,6", "06", "6 ,6", NULL};
static const good_val one_good[] = {{"one", 1, 1}, {NULL, 0, 0}};
static const char *const one_bad[] = {"One", "two", "1", "0", NULL};
static const good_val kib_good[] = {{"1", 1, 1}, {"4096", 4096, 4096}, {"32768", 32768, 32768}, {"+8", 8, 8}, {NULL, 0, 0}};
static const char *const kib_bad[] = {"0", "32769", "4096k", "4 KiB", NULL};
static const good_val pre_good[] = {{"pre", 2, 2}, {NULL, 0, 0}};
static const char *const pre_bad[] = {"PRE", "post", "0", "2", NULL};
static const good_val pool_good[] = {{"default", 0, 0}, {"small", 1, 1}, {"zero", 2, 2}, {NULL, 0, 0}};
static const char *const pool_bad[] = {"Small", "small ", "1", NULL};
static const good_val chunk_good[] = {{"64", 64, 64}, {"256", 256, 256}, {"1024", 1024, 1024}, {"4096", 4096, 4096},
                                      {"0128", 128, 128}, {NULL, 0, 0}};
static const char *const chunk_bad[] = {"0", "32", "96", "100", "4160", "8192", "64abc", "1e3", NULL};
static const good_val seg_good[] = {{"1", 1, 1}, {"4", 4, 4}, {"8", 8, 8}, {NULL, 0, 0}};
static const char *const seg_bad[] = {"0", "9", "-1", "4x", "4.0", NULL};
static const good_val gmax_good[] = {{"1", 1, 1}, {"2", 2, 2}, {"1024", 1024, 1024}, {NULL, 0, 0}};
static const char *const gmax_bad[] = {"0", "1025", "2.5", "0x10", NULL};
static const good_val flat_good[] = {{"flat", 2, 2}, {NULL, 0, 0}};
static const char *const flat_bad[] = {"Flat", "tree", "2", NULL};
static const good_val nt_good[] = {{"1", 1, 1}, {"2", 2, 2}, {"3", 3, 3}, {"4", 4, 4}, {"5", 5, 5}, {"8", 8, 8},
                                   {NULL, 0, 0}};
static const char *const nt_bad[] = {"0", "6", "7", "9", "16", "02", NULL};
static const good_val dq_good[] = {{"4", 4, 4}, {"5", 5, 5}, {"6", 6, 6}, {"7", 7, 7}, {"8", 8, 8}, {NULL, 0, 0}};
static const char *const dq_bad[] = {"0", "3", "9", "16", NULL};
static const good_val qrl_good[] = {{"v50", 0, 0}, {"lean", 1, 1}, {"lean5", 2, 2}, {NULL, 0, 0}};
static const char *const qrl_bad[] = {"0", "1", "Lean", "lean ", "v49", "lean4", NULL};
static const good_val route_good[] = {{"grid", 3, 3},  {"tiles", 2, 2}, {"chain", 0, 0}, {"split", 0, 0},
                                      {"fused", 1, 1}, {"deep", 4, 4},  {"one", 5, 5},   {"gridp", 6, 6},
                                      {NULL, 0, 0}};
static const char *const route_bad[] = {"Grid", "gird", "grid,tiles", "3", "row", NULL};
static const good_val row_good[] = {{"row", 0, 0}, {NULL, 0, 0}};
static const char *const row_bad[] = {"tab", "rows", "0", NULL};
static const good_val dense_good[] = {{"0", 0, 0}, {"1", 1, 1}, {"inv", 2, 2}, {NULL, 0, 0}};
static const char *const dense_bad[] = {"2", "INV", "invariant", NULL};
static const good_val vocab_good[] = {{"chain", 0, 0}, {"fused", 1, 1}, {"zstore", 2, 2}, {NULL, 0, 0}};
static const char *const vocab_bad[] = {"one", "Chain", "z", NULL};

static const sw_case cases[] = {
    {DG_SW_THP, "DGEMMA_THP", 0, 0, onoff_good, onoff_bad, OO,
     "big host allocations 2 MiB-aligned and advised MADV_HUGEPAGE; unset: 0"},
    {DG_SW_CPU_AMX, "DGEMMA_CPU_AMX", 0, 0, onoff_good, onoff_bad, OO,
     "avx512lp's 4-bit g64 products of 32 or more rows by AMX int8 tiles, the same bits; unset: 0"},
    {DG_SW_TURBO_BATCH, "DGEMMA_TURBO_BATCH", 1, 1, onoff_good, onoff_bad, OO,
     "a batch's top-K and self-conditioning rows in one backend call each; unset: 1"},
    {DG_SW_ATTN, "DGEMMA_ATTN", -1, -1, attn_good, attn_bad,
     "one of 0, 1, 2, 3, 4, 5, 6, 7, 8, 15, 16, 18, or two of them joined by a comma",
     "attention version at head dims <= 256, and above after a comma; unset: 15 where the device runs sm_90a code, "
     "else 6"},
    {DG_SW_BRANCH, "DGEMMA_BRANCH", 1, 1, onoff_good, onoff_bad, OO,
     "a layer's dense and expert branches on two streams; unset: 1"},
    {DG_SW_BRANCH_HANDLE, "DGEMMA_BRANCH_HANDLE", 0, 0, one_good, one_bad, "one",
     "the dense branch on the context's own cuBLAS handle; unset: a second handle"},
    {DG_SW_BRANCH_WS_KIB, "DGEMMA_BRANCH_WS_KIB", 0, 0, kib_good, kib_bad, "an integer in [1, 32768]",
     "KiB of the second branch's cuBLAS workspace; unset: 4096, or the whole workspace with DGEMMA_GEMM_PIN=1 or "
     "DGEMMA_STACK_DENSE=inv"},
    {DG_SW_COMBINE, "DGEMMA_COMBINE", 0, 0, pre_good, pre_bad, "pre", "k_ffn_combine_norm's version 2; unset: version 0"},
    {DG_SW_CUBLAS_POOL, "DGEMMA_CUBLAS_POOL", 0, 0, pool_good, pool_bad, "one of default, small, zero",
     "cuBLAS's default workspace pool per handle; unset: default"},
    {DG_SW_CUDA_LIMITS, "DGEMMA_CUDA_LIMITS", 1, 1, onoff_good, onoff_bad, OO,
     "the device's stack, printf FIFO and malloc heap limits set to 0; unset: 1"},
    {DG_SW_CUDA_MEMLOG, "DGEMMA_CUDA_MEMLOG", 0, 0, onoff_good, onoff_bad, OO, "device memory lines on stderr; unset: 0"},
    {DG_SW_CUDA_SYNC, "DGEMMA_CUDA_SYNC", 0, 0, onoff_good, onoff_bad, OO,
     "a synchronization after every kernel; unset: 0"},
    {DG_SW_DN_FUSE, "DGEMMA_DN_FUSE", 0, 0, onoff_good, onoff_bad, OO,
     "the down product's input copy in gate/up's epilogue; unset: 0"},
    {DG_SW_ENC_CHUNK, "DGEMMA_ENC_CHUNK", 1024, 1024, chunk_good, chunk_bad, "a multiple of 64 in [64, 4096]",
     "prompt tokens per CUDA encoder pass; unset: 1024"},
    {DG_SW_EXPERTS_FG, "DGEMMA_EXPERTS_FG", 0, 0, onoff_good, onoff_bad, OO,
     "gate/up and down of the experts in one launch; unset: 0"},
    {DG_SW_GEMM_PIN, "DGEMMA_GEMM_PIN", 0, 0, onoff_good, onoff_bad, OO,
     "the dense products' cublasLt algorithms pinned; unset: 0"},
    {DG_SW_GRAPHS, "DGEMMA_GRAPHS", 1, 1, onoff_good, onoff_bad, OO,
     "passes captured and replayed as CUDA graphs; unset: 1"},
    {DG_SW_GRAPHS_MAX, "DGEMMA_GRAPHS_MAX", 32, 32, gmax_good, gmax_bad, "an integer in [1, 1024]",
     "CUDA graphs kept per context; unset: 32"},
    {DG_SW_GSP, "DGEMMA_GSP", 0, 0, flat_good, flat_bad, "flat", "k_group_sums_perm's version 2; unset: version 0"},
    {DG_SW_INITCHECK, "DGEMMA_INITCHECK", 0, 0, onoff_good, onoff_bad, OO,
     "every cuBLAS output cleared before its product, for compute-sanitizer; unset: 0"},
    {DG_SW_PDL, "DGEMMA_PDL", 1, 1, onoff_good, onoff_bad, OO,
     "every kernel launched with programmatic dependent launch; unset: 1"},
    {DG_SW_QE_NT, "DGEMMA_QE_NT", 0, 0, nt_good, nt_bad, "one of 1, 2, 3, 4, 5, 8",
     "the quantized expert kernels' n-tiles for every product; unset: by the rows per expert"},
    {DG_SW_QR_DQ, "DGEMMA_QR_DQ", 0, 0, dq_good, dq_bad, "an integer in [4, 8]",
     "the quantized expert kernels' dequantization form; unset: 0"},
    {DG_SW_QR_LAUNCH, "DGEMMA_QR_LAUNCH", 1, 1, qrl_good, qrl_bad, "one of v50, lean, lean5",
     "the 4-bit g64 expert kernels' launch choices at 5 and 8 n-tiles; unset: lean"},
    {DG_SW_ROUTE, "DGEMMA_ROUTE", 3, 3, route_good, route_bad,
     "one of grid, tiles, chain, split, fused, deep, one, gridp", "the router and top-k launches; unset: grid"},
    {DG_SW_ROUTE_COOP, "DGEMMA_ROUTE_COOP", 0, 0, onoff_good, onoff_bad, OO,
     "route_gr_kernel through a cooperative launch; unset: 0"},
    {DG_SW_SC_INPLACE, "DGEMMA_SC_INPLACE", 1, 1, onoff_good, onoff_bad, OO,
     "the self-conditioning probabilities written over the logits; unset: 1"},
    {DG_SW_SC_PROBS, "DGEMMA_SC_PROBS", 1, 1, row_good, row_bad, "row",
     "the one-block-per-row self-conditioning kernel; unset: the table kernels"},
    {DG_SW_SEG_STREAMS, "DGEMMA_SEG_STREAMS", 1, 1, seg_good, seg_bad, "an integer in [1, 8]",
     "streams for a stacked batch pass's per-canvas products; unset: 1, off"},
    {DG_SW_STACK_DENSE, "DGEMMA_STACK_DENSE", 0, 0, dense_good, dense_bad, "one of 0, 1, inv",
     "a stacked pass's dense products once over the stack (1), batch-invariant (inv); unset: 0, per canvas"},
    {DG_SW_VOCAB, "DGEMMA_VOCAB", 2, 2, vocab_good, vocab_bad, "one of chain, fused, zstore",
     "the chain over the logits; unset: zstore"},
    {DG_SW_WEIGHT_BLOCK, "DGEMMA_WEIGHT_BLOCK", 1, 1, onoff_good, onoff_bad, OO,
     "a CUDA model's weights in one allocation; unset: 1"},
    {DG_SW_WL, "DGEMMA_WL", 0, 0, onoff_good, onoff_bad, OO, "the wgmma expert kernel (wl_kernel); unset: 0"},
};
#define N_CASES (sizeof cases / sizeof cases[0])

/* Bad for every switch: text, negative, trailing junk, trailing or leading-and-trailing blank, a blank alone,
 * overflow, a control byte (quoted \x0a in the line), a quote (quoted \x22). */
static const struct { const char *v, *quoted; } common_bad[] = {
    {"abc", "abc"}, {"-1", "-1"},   {"1x", "1x"}, {"1 ", "1 "}, {" ", " "}, {"99999999999999999999", "99999999999999999999"},
    {"a\nb", "a\\x0ab"}, {"\"", "\\x22"}, {"-64", "-64"}};

/* Every variable the table names, saved at the start and restored at the end of each test. */
static char *saved[DG_SW_COUNT];
static int had[DG_SW_COUNT];

static int save_env(void **state) {
  (void)state;
  for (int i = 0; i < DG_SW_COUNT; i++) {
    const char *v = getenv(dg_sw_of((dg_sw_id)i)->name);
    had[i] = v != NULL;
    saved[i] = v ? strdup(v) : NULL;
    unsetenv(dg_sw_of((dg_sw_id)i)->name);
  }
  return 0;
}

static int restore_env(void **state) {
  (void)state;
  for (int i = 0; i < DG_SW_COUNT; i++) {
    if (had[i]) setenv(dg_sw_of((dg_sw_id)i)->name, saved[i], 1);
    else unsetenv(dg_sw_of((dg_sw_id)i)->name);
    free(saved[i]);
    saved[i] = NULL;
  }
  return 0;
}

/* One refused value v (quoted as q in the line) of case c: the status, the default in both values, the line. */
static void expect_bad(const sw_case *c, const char *v, const char *q) {
  const dg_sw *s = dg_sw_of(c->id);
  setenv(c->name, v, 1);
  long out[2] = {-7, -7};
  const dg_status st = dg_sw_read(s, out);
  if (st != DG_ERR_INVALID_ARG) fail_msg("%s=\"%s\": status %d, expected DG_ERR_INVALID_ARG", c->name, q, (int)st);
  char want[1024];
  snprintf(want, sizeof want, "%s=\"%s\" is not %s (%s)", c->name, q, c->allowed, c->what);
  if (strcmp(dg_last_error(), want)) fail_msg("%s=\"%s\":\n got  %s\n want %s", c->name, q, dg_last_error(), want);
  if (out[0] != c->def || out[1] != c->def) fail_msg("%s=\"%s\": out %ld %ld, not the default", c->name, q, out[0], out[1]);
  /* dg_sw_get: the default, and the line is not touched */
  dg_clearerr();
  if (dg_sw_get(c->id) != c->def) fail_msg("%s=\"%s\": dg_sw_get %ld, not the default %ld", c->name, q, dg_sw_get(c->id), c->def);
  assert_string_equal(dg_last_error(), "");
  /* dg_switches_check: CUDA's always; the host's also for the CPU */
  assert_int_equal(dg_switches_check(DG_DEVICE_CUDA), DG_ERR_INVALID_ARG);
  assert_string_equal(dg_last_error(), want);
  const int host = c->id < DG_SW_CUDA_FIRST;
  assert_int_equal(dg_switches_check(DG_DEVICE_CPU), host ? DG_ERR_INVALID_ARG : DG_OK);
  unsetenv(c->name);
}

static void test_each_switch(void **state) {
  (void)state;
  assert_int_equal(N_CASES, DG_SW_COUNT); /* every switch of the table has a case here */
  assert_dg_ok(dg_switches_check(DG_DEVICE_CPU));
  assert_dg_ok(dg_switches_check(DG_DEVICE_CUDA));
  int n_good = 0, n_bad = 0;
  for (size_t k = 0; k < N_CASES; k++) {
    const sw_case *c = &cases[k];
    const dg_sw *s = dg_sw_of(c->id);
    assert_non_null(s);
    assert_string_equal(s->name, c->name);
    /* unset and empty: the default */
    long out[2] = {-7, -7};
    unsetenv(c->name);
    assert_dg_ok(dg_sw_read(s, out));
    if (out[0] != c->def || out[1] != c->def_b) fail_msg("%s unset: %ld %ld", c->name, out[0], out[1]);
    setenv(c->name, "", 1);
    assert_dg_ok(dg_sw_read(s, out));
    if (out[0] != c->def || out[1] != c->def_b) fail_msg("%s=\"\": %ld %ld", c->name, out[0], out[1]);
    assert_dg_ok(dg_switches_check(DG_DEVICE_CUDA));
    for (const good_val *g = c->good; g->v; g++, n_good++) {
      setenv(c->name, g->v, 1);
      out[0] = out[1] = -7;
      if (dg_sw_read(s, out) != DG_OK) fail_msg("%s=%s refused: %s", c->name, g->v, dg_last_error());
      if (out[0] != g->a || out[1] != g->b)
        fail_msg("%s=%s: %ld, %ld, expected %ld, %ld", c->name, g->v, out[0], out[1], g->a, g->b);
      long v2[2];
      dg_sw_get2(c->id, v2);
      assert_int_equal(v2[0], g->a);
      assert_int_equal(v2[1], g->b);
      assert_int_equal(dg_sw_get(c->id), g->a);
      assert_dg_ok(dg_switches_check(DG_DEVICE_CUDA));
    }
    for (const char *const *b = c->bad; *b; b++, n_bad++) expect_bad(c, *b, *b);
    for (size_t i = 0; i < sizeof common_bad / sizeof common_bad[0]; i++, n_bad++)
      expect_bad(c, common_bad[i].v, common_bad[i].quoted);
    unsetenv(c->name);
  }
  /* a long value is cut in the line (dg_env_quote into 64 bytes), marked by "..." */
  char longv[201];
  memset(longv, 'x', 200);
  longv[200] = '\0';
  setenv("DGEMMA_ROUTE", longv, 1);
  assert_int_equal(dg_switches_check(DG_DEVICE_CUDA), DG_ERR_INVALID_ARG);
  printf("# DGEMMA_ROUTE=x * 200: %s\n", dg_last_error());
  char want[256];
  snprintf(want, sizeof want, "DGEMMA_ROUTE=\"%.59s...\" is not one of grid, tiles, chain, split, fused, deep, one, "
           "gridp (the router and top-k launches; unset: grid)", longv);
  assert_string_equal(dg_last_error(), want);
  unsetenv("DGEMMA_ROUTE");
  printf("# %zu switches: %d accepted values, %d refused with their line\n", N_CASES, n_good, n_bad);
}

/* The first bad switch in the table's order is the one named; DG_ERR_INVALID_ARG for any. */
static void test_check_order(void **state) {
  (void)state;
  setenv("DGEMMA_WL", "2", 1);
  setenv("DGEMMA_ATTN", "9", 1);
  assert_int_equal(dg_switches_check(DG_DEVICE_CUDA), DG_ERR_INVALID_ARG);
  assert_non_null(strstr(dg_last_error(), "DGEMMA_ATTN=\"9\""));
  assert_dg_ok(dg_switches_check(DG_DEVICE_CPU));
  unsetenv("DGEMMA_ATTN");
  assert_int_equal(dg_switches_check(DG_DEVICE_CUDA), DG_ERR_INVALID_ARG);
  assert_non_null(strstr(dg_last_error(), "DGEMMA_WL=\"2\""));
  unsetenv("DGEMMA_WL");
  assert_dg_ok(dg_switches_check(DG_DEVICE_CUDA));
  /* the readers' view: DGEMMA_THP through dg_big_alloc_wants_huge */
  setenv("DGEMMA_THP", "1", 1);
  assert_int_equal(dg_big_alloc_wants_huge(), 1);
  setenv("DGEMMA_THP", "0", 1);
  assert_int_equal(dg_big_alloc_wants_huge(), 0);
  setenv("DGEMMA_THP", "yes", 1);
  assert_int_equal(dg_big_alloc_wants_huge(), 0); /* refused by dg_switches_check; reads as the default */
  unsetenv("DGEMMA_THP");
  /* dg_cuda_enc_chunk: the table's DGEMMA_ENC_CHUNK */
  int32_t chunk = -1;
  setenv("DGEMMA_ENC_CHUNK", "512", 1);
  assert_dg_ok(dg_cuda_enc_chunk(&chunk));
  assert_int_equal(chunk, 512);
  setenv("DGEMMA_ENC_CHUNK", "500", 1);
  assert_int_equal(dg_cuda_enc_chunk(&chunk), DG_ERR_INVALID_ARG);
  assert_int_equal(chunk, 1024);
  unsetenv("DGEMMA_ENC_CHUNK");
}

/* A CPU model: a bad host switch refuses dg_model_load (no model) and dg_context_new (no context); a bad CUDA
 * switch changes nothing on the CPU. */
static void test_model_and_context(void **state) {
  (void)state;
  char dir[] = "/tmp/dg_switchesXXXXXX";
  assert_non_null(mkdtemp(dir));
  synth_cfg sc = synth_default();
  assert_int_equal(synth_model_dir(dir, &sc), 0);
  dg_model_params mp = dg_model_default_params();
  mp.no_tokenizer = 1;
  mp.n_threads = 1;
  dg_model *m = (dg_model *)&m; /* not NULL: the refusal sets it */
  setenv("DGEMMA_THP", "on", 1);
  assert_int_equal(dg_model_load(dir, &mp, &m), DG_ERR_INVALID_ARG);
  assert_null(m);
  assert_string_equal(dg_last_error(), "DGEMMA_THP=\"on\" is not 0 or 1 (big host allocations 2 MiB-aligned and "
                                       "advised MADV_HUGEPAGE; unset: 0)");
  unsetenv("DGEMMA_THP");
  setenv("DGEMMA_ROUTE", "gird", 1); /* the CUDA backend's: a CPU model loads and makes contexts */
  setenv("DGEMMA_ENC_CHUNK", "100", 1);
  assert_dg_ok(dg_model_load(dir, &mp, &m));
  dg_context_params cp = dg_context_default_params();
  dg_context *x = NULL;
  assert_dg_ok(dg_context_new(m, &cp, &x));
  dg_context_free(x);
  unsetenv("DGEMMA_ROUTE");
  unsetenv("DGEMMA_ENC_CHUNK");
  setenv("DGEMMA_TURBO_BATCH", "2", 1);
  x = (dg_context *)&x;
  assert_int_equal(dg_context_new(m, &cp, &x), DG_ERR_INVALID_ARG);
  assert_null(x);
  assert_string_equal(dg_last_error(), "DGEMMA_TURBO_BATCH=\"2\" is not 0 or 1 (a batch's top-K and "
                                       "self-conditioning rows in one backend call each; unset: 1)");
  unsetenv("DGEMMA_TURBO_BATCH");
  assert_dg_ok(dg_context_new(m, &cp, &x));
  dg_context_free(x);
  dg_model_free(m);
  /* a CUDA model: refused by the switches before the device is looked at */
  mp.device = DG_DEVICE_CUDA;
  setenv("DGEMMA_GRAPHS", "yes", 1);
  m = (dg_model *)&m;
  assert_int_equal(dg_model_load(dir, &mp, &m), DG_ERR_INVALID_ARG);
  assert_null(m);
  assert_string_equal(dg_last_error(), "DGEMMA_GRAPHS=\"yes\" is not 0 or 1 (passes captured and replayed as CUDA "
                                       "graphs; unset: 1)");
  unsetenv("DGEMMA_GRAPHS");
  dg_test_rm_dir(dir);
}

/* DGEMMA_KERNELS (its own parser, cpu/dispatch.c): a name of no kernel set is refused by dg_switches_check for any
 * device, by dg_model_load, and reported by dg_cpu_kernels with the same line; the five names pass the check whether
 * or not this CPU has the set (a lacked set runs the best exact one with dg_cpu_kernels's warning, test_cli). */
static void test_kernels_name(void **state) {
  (void)state;
  const char *saved = getenv("DGEMMA_KERNELS");
  char *keep = saved ? strdup(saved) : NULL;
  unsetenv("DGEMMA_KERNELS");
  const char *best = NULL, *name = NULL;
  assert_dg_ok(dg_cpu_kernels(&best));
  static const char *const known[] = {"", "ref", "avx2", "avx512", "avx512lp", "avx2lp"};
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
    setenv("DGEMMA_KERNELS", known[i], 1);
    assert_dg_ok(dg_switches_check(DG_DEVICE_CPU));
    assert_dg_ok(dg_switches_check(DG_DEVICE_CUDA));
  }
  static const struct { const char *v, *quoted; } bad[] = {
      {"bogus", "bogus"}, {"AVX512", "AVX512"}, {"avx512 ", "avx512 "}, {"ref,avx2", "ref,avx2"},
      {"bad\nvalue", "bad\\x0avalue"}, {"a\"b", "a\\x22b"}};
  char want[512];
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    setenv("DGEMMA_KERNELS", bad[i].v, 1);
    snprintf(want, sizeof want, "DGEMMA_KERNELS=\"%s\" is not one of ref, avx2, avx512, avx512lp, avx2lp (the CPU "
             "kernel set; unset: the best exact set this CPU has)", bad[i].quoted);
    assert_int_equal(dg_switches_check(DG_DEVICE_CPU), DG_ERR_INVALID_ARG);
    assert_string_equal(dg_last_error(), want);
    assert_int_equal(dg_switches_check(DG_DEVICE_CUDA), DG_ERR_INVALID_ARG);
    assert_string_equal(dg_last_error(), want);
    name = NULL;
    assert_int_equal(dg_cpu_kernels(&name), DG_ERR_INVALID_ARG);
    assert_string_equal(dg_last_error(), want);
    assert_string_equal(name, best); /* what dg_kernels_best would run: never reached by a model */
  }
  /* a long value is cut like the table's (64 bytes, "...") */
  char longv[101];
  memset(longv, 'k', 100);
  longv[100] = '\0';
  setenv("DGEMMA_KERNELS", longv, 1);
  assert_int_equal(dg_switches_check(DG_DEVICE_CPU), DG_ERR_INVALID_ARG);
  snprintf(want, sizeof want, "DGEMMA_KERNELS=\"%.59s...\" is not one of ref, avx2, avx512, avx512lp, avx2lp (the CPU "
           "kernel set; unset: the best exact set this CPU has)", longv);
  assert_string_equal(dg_last_error(), want);
  /* the model load refuses it before reading the checkpoint */
  char dir[] = "/tmp/dg_switchesXXXXXX";
  assert_non_null(mkdtemp(dir));
  synth_cfg sc = synth_default();
  assert_int_equal(synth_model_dir(dir, &sc), 0);
  dg_model_params mp = dg_model_default_params();
  mp.no_tokenizer = 1;
  mp.n_threads = 1;
  dg_model *m = (dg_model *)&m;
  setenv("DGEMMA_KERNELS", "avx3", 1);
  assert_int_equal(dg_model_load(dir, &mp, &m), DG_ERR_INVALID_ARG);
  assert_null(m);
  assert_non_null(strstr(dg_last_error(), "DGEMMA_KERNELS=\"avx3\" is not one of"));
  setenv("DGEMMA_KERNELS", "ref", 1);
  assert_dg_ok(dg_model_load(dir, &mp, &m));
  dg_model_free(m);
  dg_test_rm_dir(dir);
  if (keep) setenv("DGEMMA_KERNELS", keep, 1);
  else unsetenv("DGEMMA_KERNELS");
  free(keep);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test_setup_teardown(test_each_switch, save_env, restore_env),
      cmocka_unit_test_setup_teardown(test_check_order, save_env, restore_env),
      cmocka_unit_test_setup_teardown(test_model_and_context, save_env, restore_env),
      cmocka_unit_test_setup_teardown(test_kernels_name, save_env, restore_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
