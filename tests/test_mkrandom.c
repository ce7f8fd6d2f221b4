/* test_mkrandom.c: dg_mkrandom (dgemma mkrandom), the random-weight
 * checkpoint writer.
 *
 *  - the built-in real config plans exactly the tensors and sizes of spec 3.1
 *    / 1.4 (dry run: 691 text tensors, 25.25 B parameters, counted here from
 *    the spec's shapes; 1,289 tensors and 299 quantized modules with the mlx
 *    recipe, as the spec's observed MLX checkpoint);
 *  - a small model written by mkrandom loads with dg_model_load and gives
 *    finite logits (bf16, 4-bit experts, the mlx recipe);
 *  - the same seed gives byte-identical files whatever the thread count, and
 *    another seed different weights;
 *  - every stored bf16 value is the bf16 rounding of the documented draw
 *    (mkrandom.h), norms/scalars are one, the padding row is zero, and the
 *    draws have mean 0, standard deviation initializer_range and the normal
 *    kurtosis 3 within 5-sigma sampling bounds;
 *  - quantized tensors dequantize within the quantization bound of the drawn
 *    values, and equal byte for byte what dg_quantize makes of the bf16 model;
 *  - bad inputs: non-empty output, bad configs, bad recipes, missing source,
 *    each a clear error and nothing left behind;
 *  - on_tmp_dir (mkrandom and quantize) announces the temporary sibling just
 *    before it is made and NULL once it is renamed or removed (also when the
 *    progress callback stops the run). */
#include "testutil.h"

#include <math.h>
#include <sys/stat.h>

#include "base/dg_io.h"
#include "dgemma_tools.h"
#include "cpu/kernels.h"
#include "writers/mkrandom.h"
#include "io/quant.h"
#include "io/safetensors.h"

static char tmp_root[64];

static int setup(void **state) {
  (void)state;
  snprintf(tmp_root, sizeof tmp_root, "/tmp/dgemma-test-mkrandom-XXXXXX");
  return mkdtemp(tmp_root) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  DIR *d = opendir(tmp_root);
  if (!d) return 0;
  struct dirent *e;
  char p[512];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", tmp_root, e->d_name);
    dg_test_rm_dir(p);
  }
  closedir(d);
  rmdir(tmp_root);
  return 0;
}

static const char *tdir(const char *name) {
  static char buf[8][256];
  static int k;
  char *b = buf[k++ & 7];
  snprintf(b, 256, "%s/%s", tmp_root, name);
  return b;
}

static dg_mkrandom_params small_params(const char *recipe, uint64_t seed, int threads) {
  dg_mkrandom_params p = dg_mkrandom_default_params();
  p.config = "small";
  p.recipe = recipe;
  p.seed = seed;
  p.n_threads = threads;
  return p;
}

static void write_small(const char *dir, const char *recipe, uint64_t seed, int threads) {
  dg_mkrandom_params p = small_params(recipe, seed, threads);
  dg_mkrandom_result r;
  assert_dg_ok(dg_mkrandom(dir, &p, &r));
}

/* ---- the real configuration, planned ---------------------------------------- */

static void test_real_plan(void **state) {
  (void)state;
  /* spec 1.2 / 3.1 shapes, counted independently of src/writers/mkrandom.c */
  const int64_t V = 262144, H = 2816, I = 2112, M = 704, E = 128, NH = 16;
  int64_t n = V * H + 2 * H /* final norm, sc pre_norm */ + 3 * I * H /* sc MLP */ + 30 /* encoder scalars */;
  for (int i = 0; i < 30; i++) {
    const int full = i % 6 == 5;
    const int64_t d = full ? 512 : 256, kv = full ? 2 : 8;
    n += NH * d * H + kv * d * H + (full ? 0 : kv * d * H) + H * NH * d + 2 * d; /* attention + q/k norms */
    n += 7 * H + 3 * I * H + E * H + H + E + E * 2 * M * H + E * H * M + 1;  /* norms, MLP, router, experts, scalar */
  }
  dg_mkrandom_params p = dg_mkrandom_default_params();
  p.dry_run = 1;
  p.recipe = "all=bf16";
  dg_mkrandom_result r;
  assert_dg_ok(dg_mkrandom(tdir("never"), &p, &r));
  struct stat sb;
  assert_int_not_equal(stat(tdir("never"), &sb), 0); /* a dry run writes nothing */
  assert_int_equal(r.n_tensors, 691);                 /* spec 3.1: 661 decoder + 30 encoder scalars */
  assert_true(r.n_params == n);
  assert_true(r.bytes_out == 2 * n);
  assert_int_equal(r.n_quantized, 0);
  printf("# real config: %lld parameters (spec 1.4: ~25.25 B), %d tensors, bf16 %.2f GB\n", (long long)r.n_params,
         r.n_tensors, r.bytes_out / 1e9);
  /* default: experts 4-bit g64, per stack [E, out, in] -> in/2 bytes + 2 x 2 bytes per 64 */
  p.recipe = NULL;
  assert_dg_ok(dg_mkrandom(tdir("never"), &p, &r));
  const int64_t expert_w = 30 * (E * 2 * M * H + E * H * M);
  assert_int_equal(r.n_quantized, 60);
  assert_int_equal(r.n_tensors, 691 + 2 * 60);
  assert_true(r.bytes_out == 2 * (n - expert_w) + expert_w / 2 + expert_w / 64 * 4);
  printf("# real config, 4-bit g64 experts: %.3f GB (spec 1.4: ~17.67 GB), %d shards\n", r.bytes_out / 1e9,
         r.n_shards);
  /* mlx-vlm's recipe: the spec's observed checkpoint has 1,289 text tensors, 299 quantized modules */
  p.recipe = "mlx";
  assert_dg_ok(dg_mkrandom(tdir("never"), &p, &r));
  assert_int_equal(r.n_quantized, 299);
  assert_int_equal(r.n_tensors, 1289);
  /* group 128: 704 and 2112 are not multiples (spec 3.2): expert down, dense and sc down stay bf16 */
  p.recipe = "all=4:128";
  assert_dg_ok(dg_mkrandom(tdir("never"), &p, &r));
  assert_int_equal(r.n_indivisible, 30 * 2 + 1);
}

/* ---- loads and runs ------------------------------------------------------------- */

static void run_model(const char *dir, int expect_bits_max) {
  dg_model_params mp = dg_model_default_params();
  mp.no_tokenizer = 1;
  mp.n_threads = 2;
  dg_model *m;
  assert_dg_ok(dg_model_load(dir, &mp, &m));
  dg_model_info info;
  dg_model_get_info(m, &info);
  assert_int_equal(info.vocab_size, 1024);
  assert_int_equal(info.hidden_size, 128);
  assert_int_equal(info.quant_bits_max, expect_bits_max);
  const int P = 40, C = info.canvas_length, V = info.vocab_size;
  int32_t prompt[40], canvas[64];
  for (int i = 0; i < P; i++) prompt[i] = (i * 37 + 5) % V;
  for (int i = 0; i < C; i++) canvas[i] = (i * 101 + 7) % V;
  dg_context *ctx;
  assert_dg_ok(dg_context_new(m, NULL, &ctx));
  float *l = malloc((size_t)C * V * 4), *l2 = malloc((size_t)C * V * 4);
  assert_dg_ok(dg_encode(ctx, prompt, P));
  assert_dg_ok(dg_decode(ctx, canvas, NULL, l));
  assert_dg_ok(dg_decode(ctx, canvas, l, l2)); /* with self-conditioning */
  double mx = 0;
  for (size_t i = 0; i < (size_t)C * V; i++) {
    if (!isfinite(l[i]) || !isfinite(l2[i])) fail_msg("%s: non-finite logit at %zu", dir, i);
    if (fabs(l[i]) > mx) mx = fabs(l[i]);
  }
  assert_true(mx > 0 && mx <= 30); /* softcapped at 30, not all zero */
  printf("# %s: logits finite, max |logit| %.4f (bits max %d)\n", dir, mx, expect_bits_max);
  free(l);
  free(l2);
  dg_context_free(ctx);
  dg_model_free(m);
}

static void test_loads_and_runs(void **state) {
  (void)state;
  write_small(tdir("q4"), NULL, 1, 2);
  run_model(tdir("q4"), 4);
  write_small(tdir("bf16"), "all=bf16", 1, 2);
  run_model(tdir("bf16"), 0);
  write_small(tdir("mlx"), "mlx", 1, 2);
  run_model(tdir("mlx"), 8);
  /* several shards + index load too */
  dg_mkrandom_params p = small_params("mlx,experts=3", 1, 2);
  p.max_shard_bytes = 400000;
  dg_mkrandom_result r;
  assert_dg_ok(dg_mkrandom(tdir("sharded"), &p, &r));
  assert_true(r.n_shards >= 3);
  run_model(tdir("sharded"), 8);
}

/* ---- determinism ---------------------------------------------------------------- */

static int files_equal(const char *a, const char *b) {
  char *x = NULL, *y = NULL;
  size_t nx = 0, ny = 0;
  if (dg_read_file(a, 0, &x, &nx) || dg_read_file(b, 0, &y, &ny)) { free(x); free(y); return -1; }
  int eq = nx == ny && !memcmp(x, y, nx);
  free(x);
  free(y);
  return eq;
}

static void test_deterministic(void **state) {
  (void)state;
  write_small(tdir("s7a"), "mlx,experts=3", 7, 1);
  write_small(tdir("s7b"), "mlx,experts=3", 7, 2);
  write_small(tdir("s8"), "mlx,experts=3", 8, 2);
  const char *files[] = {"config.json", "generation_config.json", "model.safetensors.index.json", "model.safetensors"};
  char a[512], b[512];
  for (int i = 0; i < 4; i++) {
    snprintf(a, sizeof a, "%s/%s", tdir("s7a"), files[i]);
    snprintf(b, sizeof b, "%s/%s", tdir("s7b"), files[i]);
    assert_int_equal(files_equal(a, b), 1);
  }
  snprintf(b, sizeof b, "%s/model.safetensors", tdir("s8"));
  assert_int_equal(files_equal(a, b), 0);
  /* another seed: every random tensor differs (not just the file) */
  dg_safetensors *s7, *s8;
  assert_dg_ok(dg_st_open_dir(tdir("s7a"), &s7));
  assert_dg_ok(dg_st_open_dir(tdir("s8"), &s8));
  assert_int_equal(dg_st_count(s7), dg_st_count(s8));
  const dg_tensor *t7 = dg_st_find(s7, "model.decoder.layers.0.self_attn.q_proj.weight"),
                  *t8 = dg_st_find(s8, "model.decoder.layers.0.self_attn.q_proj.weight");
  assert_non_null(t7);
  assert_non_null(t8);
  assert_int_equal(t7->nbytes, t8->nbytes);
  assert_true(memcmp(t7->data, t8->data, t7->nbytes) != 0);
  dg_st_close(s7);
  dg_st_close(s8);
}

/* ---- values --------------------------------------------------------------------- */

static int is_ones_tensor(const char *name) {
  static const char *const sfx[] = {"norm.weight", "layernorm.weight", "layernorm_1.weight", "layernorm_2.weight",
                                    "router.scale", "router.per_expert_scale", "layer_scalar"};
  size_t n = strlen(name);
  for (size_t i = 0; i < sizeof sfx / sizeof sfx[0]; i++) {
    size_t k = strlen(sfx[i]);
    if (n >= k && !strcmp(name + n - k, sfx[i])) return 1;
  }
  return 0;
}

/* Checks mean, std and kurtosis of n values against normal(0, sd).
 * Bounds, 5 sampling standard deviations (the seed is fixed, so a check
 * either always passes or always fails; 5 sigma makes a false alarm on a
 * correct generator a ~6e-7 event per check):
 *   mean:      sd(mean) = sd / sqrt(n)
 *   std:       sd(s) / sd = sqrt((kurtosis - 1) / n) / 2 = 1 / sqrt(2n) for a
 *              normal, plus 2^-8: every stored value is bf16 (relative
 *              rounding error <= 2^-8, which moves s by at most that factor)
 *   kurtosis:  sd = sqrt(24 / n) (normal), plus 6 * 2^-8 for the rounding;
 *              only checked where n >= 20000 (a uniform's 1.8 is then > 5
 *              sigma away; the whole-model pool has millions). */
static void check_moments(const char *what, const double *s, double n, double sd, double *worst) {
  double mean = s[1] / n, var = s[2] / n - mean * mean, m4 = s[4] / n; /* mean ~ 0: m4 about 0 up to O(mean) */
  double std = sqrt(var), kurt = m4 / (var * var);
  double bm = 5 * sd / sqrt(n), bs = 5 / sqrt(2 * n) + ldexp(1, -8), bk = 5 * sqrt(24 / n) + 6 * ldexp(1, -8);
  if (fabs(mean) > bm) fail_msg("%s: mean %g, bound %g (n %.0f)", what, mean, bm, n);
  if (fabs(std / sd - 1) > bs) fail_msg("%s: std %g vs %g: relative %g > bound %g", what, std, sd, std / sd - 1, bs);
  if (n >= 20000 && fabs(kurt - 3) > bk) fail_msg("%s: kurtosis %g, bound 3 +- %g", what, kurt, bk);
  double w = fmax(fabs(mean) / bm, fabs(std / sd - 1) / bs);
  if (w > *worst) *worst = w;
  if (n >= 1e6) printf("# %s: n %.0f, mean %.3g (bound %.2g), std %.6f (sd %.4f, bound %.2g rel), kurtosis %.4f (bound 3 +- %.3f)\n",
                       what, n, mean, bm, std, sd, bs, kurt, bk);
}

static void test_values_bf16(void **state) {
  (void)state;
  const uint64_t seed = 11;
  write_small(tdir("vals"), "all=bf16", seed, 2);
  dg_safetensors *st;
  assert_dg_ok(dg_st_open_dir(tdir("vals"), &st));
  const double sd = 0.02; /* the small config's initializer_range */
  double pool[5] = {0}, pooln = 0, worst = 0;
  size_t n_norm = 0, n_ones = 0;
  float *draw = NULL;
  size_t cap = 0;
  for (size_t i = 0; i < dg_st_count(st); i++) {
    const dg_tensor *t = dg_st_at(st, i);
    assert_int_equal(t->dtype, DG_BF16);
    const size_t ne = t->nbytes / 2;
    const uint16_t *v = t->data;
    if (is_ones_tensor(t->name)) {
      for (size_t k = 0; k < ne; k++)
        if (v[k] != 0x3F80) fail_msg("%s[%zu] = bf16 0x%04x, expected 1.0", t->name, k, v[k]);
      n_ones++;
      continue;
    }
    if (ne > cap) { cap = ne; draw = realloc(draw, cap * sizeof *draw); }
    dg_mkrandom_normals(seed, dg_mkrandom_name_hash(t->name), 0, ne, (float)sd, draw);
    const int embed = !strcmp(t->name, "model.decoder.embed_tokens.weight");
    const size_t cols = (size_t)t->shape[t->ndim - 1];
    double s[5] = {0}, n = 0;
    for (size_t k = 0; k < ne; k++) {
      if (embed && k < cols) { /* the padding row (pad_token_id 0) */
        if (v[k] != 0) fail_msg("embedding pad row [0, %zu] = 0x%04x, expected 0", k, v[k]);
        continue;
      }
      if (v[k] != dg_f32_to_bf16(draw[k]))
        fail_msg("%s[%zu] = 0x%04x, the draw rounds to 0x%04x", t->name, k, v[k], dg_f32_to_bf16(draw[k]));
      double x = dg_bf16_to_f32(v[k]), x2 = x * x;
      s[1] += x; s[2] += x2; s[4] += x2 * x2;
      n++;
    }
    check_moments(t->name, s, n, sd, &worst);
    for (int j = 1; j < 5; j++) pool[j] += s[j];
    pooln += n;
    n_norm++;
  }
  check_moments("all normal tensors", pool, pooln, sd, &worst);
  printf("# %zu normal tensors (each within its bounds: worst |dev| / bound %.3f), %zu tensors of ones\n", n_norm,
         worst, n_ones);
  assert_int_equal(n_norm, 1 + 6 * 10 - 2 + 3); /* embed; per layer q,k,v,o, 3 mlp, router, 2 experts (no v on the 2 full layers); sc */
  free(draw);
  dg_st_close(st);
}

/* Quantized tensors against the draws: |w - deq| <= |s'| (1 + 2^-8) (the
 * code is the nearest except at the far end of a group, up to one step off;
 * docs/quantization.md) + (2^b - 1) |s'| 2^-8 + |b'| 2^-8 (scale and bias
 * rounded to bf16: relative error <= 2^-8, so the product q s moves by at
 * most (2^b - 1) |s| 2^-8; primes are the stored values, and |s| <=
 * |s'| (1 + 2^-8) is absorbed in the first term's slack) + 2^-22 |w| (fp32
 * roundings of q s' + b'). w is the bf16 draw, what gets quantized. */
static void check_quantized(dg_safetensors *st, uint64_t seed, const char *module, const char *hf_name, int bits,
                            int G, double *worst) {
  char nw[256], ns[256], nb[256];
  snprintf(nw, sizeof nw, "%s.weight", module);
  snprintf(ns, sizeof ns, "%s.scales", module);
  snprintf(nb, sizeof nb, "%s.biases", module);
  const dg_tensor *tw = dg_st_find(st, nw), *ts = dg_st_find(st, ns), *tb = dg_st_find(st, nb);
  if (!tw || !ts || !tb) fail_msg("%s: missing weight/scales/biases", module);
  assert_int_equal(tw->dtype, DG_U32);
  assert_int_equal(ts->dtype, DG_BF16);
  const int64_t cols = tw->shape[tw->ndim - 1] * 32 / bits;
  int64_t rows = 1;
  for (int d = 0; d < tw->ndim - 1; d++) rows *= tw->shape[d];
  assert_int_equal(ts->shape[ts->ndim - 1], cols / G);
  dg_weight W = {.dtype = DG_U32, .data = tw->data, .rows = rows, .cols = cols, .bits = bits, .group_size = G,
                 .sb_dtype = DG_BF16, .scales = ts->data, .biases = tb->data};
  float *deq = malloc((size_t)cols * 4), *w = malloc((size_t)cols * 4);
  const uint64_t h = dg_mkrandom_name_hash(hf_name);
  const int embed = strstr(module, "embed_tokens") != NULL;
  for (int64_t r = 0; r < rows; r++) {
    dg_quant_dequant_row(&W, r, deq);
    if (embed && r == 0) memset(w, 0, (size_t)cols * 4);
    else dg_mkrandom_normals(seed, h, (uint64_t)(r * cols), (size_t)cols, 0.02f, w);
    const uint16_t *sr = (const uint16_t *)ts->data + r * (cols / G), *br = (const uint16_t *)tb->data + r * (cols / G);
    for (int64_t k = 0; k < cols; k++) {
      double x = dg_bf16_to_f32(dg_f32_to_bf16(w[k]));
      double s = fabs(dg_bf16_to_f32(sr[k / G])), b = fabs(dg_bf16_to_f32(br[k / G]));
      double bound = s * (1 + ldexp(1, -8)) + ((1 << bits) - 1) * s * ldexp(1, -8) + b * ldexp(1, -8) +
                     ldexp(fabs(x), -22);
      double err = fabs(x - deq[k]);
      if (err > bound) fail_msg("%s [%lld, %lld]: |w - deq| = %g > bound %g", module, (long long)r, (long long)k, err, bound);
      if (err / bound > *worst) *worst = err / bound;
    }
  }
  free(deq);
  free(w);
}

static void test_values_quantized(void **state) {
  (void)state;
  const uint64_t seed = 5;
  write_small(tdir("qv"), "mlx,experts=3,sc=2:32", seed, 2);
  dg_safetensors *st;
  assert_dg_ok(dg_st_open_dir(tdir("qv"), &st));
  double worst[3] = {0};
  char m[200], hf[256];
  for (int i = 0; i < 6; i++) {
    static const char *const ex[] = {"experts.gate_up_proj", "experts.down_proj"};
    for (int k = 0; k < 2; k++) {
      snprintf(m, sizeof m, "model.decoder.layers.%d.%s", i, ex[k]);
      check_quantized(st, seed, m, m, 3, 64, &worst[0]);
      snprintf(hf, sizeof hf, "%s.weight", m);
      assert_null(dg_st_find(st, m)); /* the float HF name is gone */
    }
    static const char *const lin[] = {"self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj", "router.proj"};
    for (int k = 0; k < 4; k++) {
      snprintf(m, sizeof m, "model.decoder.layers.%d.%s", i, lin[k]);
      snprintf(hf, sizeof hf, "%s.weight", m);
      check_quantized(st, seed, m, hf, 8, 64, &worst[1]);
    }
  }
  check_quantized(st, seed, "model.decoder.embed_tokens", "model.decoder.embed_tokens.weight", 8, 64, &worst[1]);
  check_quantized(st, seed, "model.decoder.self_conditioning.down_proj",
                  "model.decoder.self_conditioning.down_proj.weight", 2, 32, &worst[2]);
  printf("# dequantized vs drawn: max |w - deq| / bound: 3-bit experts %.3f, 8-bit %.3f, 2-bit g32 %.3f\n", worst[0],
         worst[1], worst[2]);
  /* the config records it: defaults 4/64, overrides per module */
  dg_quant_config qc;
  char path[512];
  snprintf(path, sizeof path, "%s/config.json", tdir("qv"));
  assert_dg_ok(dg_quant_config_load(path, &qc));
  int bits, g;
  assert_int_equal(qc.bits, 4);
  assert_int_equal(qc.group_size, 64);
  dg_quant_config_lookup(&qc, "model.decoder.layers.2.experts.down_proj", &bits, &g);
  assert_int_equal(bits, 3);
  dg_quant_config_lookup(&qc, "model.decoder.self_conditioning.up_proj", &bits, &g);
  assert_int_equal(bits, 2);
  assert_int_equal(g, 32);
  dg_quant_config_lookup(&qc, "model.decoder.embed_tokens", &bits, &g);
  assert_int_equal(bits, 8);
  dg_quant_config_free(&qc);
  dg_st_close(st);
}

/* mkrandom's quantized experts are what `dgemma quantize` makes of its bf16 model. */
static void test_same_as_quantize(void **state) {
  (void)state;
  write_small(tdir("fl"), "all=bf16", 3, 2);
  dg_quantize_params qp = dg_quantize_default_params();
  qp.recipe = "all=bf16,experts=4";
  qp.n_threads = 2;
  assert_dg_ok(dg_quantize(tdir("fl"), tdir("flq"), &qp, NULL));
  write_small(tdir("direct"), NULL, 3, 2);
  dg_safetensors *a, *b;
  assert_dg_ok(dg_st_open_dir(tdir("flq"), &a));
  assert_dg_ok(dg_st_open_dir(tdir("direct"), &b));
  assert_int_equal(dg_st_count(a), dg_st_count(b));
  size_t nq = 0;
  for (size_t i = 0; i < dg_st_count(a); i++) {
    const dg_tensor *x = dg_st_at(a, i), *y = dg_st_find(b, x->name);
    if (!y) fail_msg("%s: in dgemma quantize's output, not in mkrandom's", x->name);
    assert_int_equal(x->dtype, y->dtype);
    assert_int_equal(x->ndim, y->ndim);
    assert_memory_equal(x->shape, y->shape, sizeof x->shape);
    if (x->nbytes != y->nbytes || memcmp(x->data, y->data, x->nbytes)) fail_msg("%s: bytes differ", x->name);
    nq += x->dtype == DG_U32;
  }
  assert_int_equal(nq, 12);
  printf("# dgemma quantize of the bf16 model == mkrandom's direct 4-bit experts: %zu tensors identical\n",
         dg_st_count(a));
  dg_st_close(a);
  dg_st_close(b);
}

/* ---- errors --------------------------------------------------------------------- */

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  fputs(text, f);
  fclose(f);
}

/* The small config with one substitution (from -> to) as a file. */
static const char *small_variant(const char *name, const char *from, const char *to) {
  static char path[512];
  /* the small config's text: write it with mkrandom once and read it back */
  const char *src = tdir("variant-src");
  struct stat sb;
  if (stat(src, &sb) != 0) write_small(src, "all=bf16", 0, 1);
  char cp[512], *text = NULL;
  size_t n = 0;
  snprintf(cp, sizeof cp, "%s/config.json", src);
  assert_dg_ok(dg_read_file(cp, 0, &text, &n));
  char *at = strstr(text, from);
  if (!at) fail_msg("small config has no \"%s\"", from);
  size_t out_n = n - strlen(from) + strlen(to) + 1;
  char *out = malloc(out_n);
  snprintf(out, out_n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
  snprintf(path, sizeof path, "%s/%s.json", tmp_root, name);
  write_file(path, out);
  free(out);
  free(text);
  return path;
}

static void expect_error(const char *cfg, const char *recipe, const char *source, const char *out, dg_status want,
                         const char *needle) {
  dg_mkrandom_params p = small_params(recipe, 0, 1);
  p.config = cfg;
  p.source_dir = source;
  dg_status st = dg_mkrandom(out, &p, NULL);
  if (st != want)
    fail_msg("config %s recipe %s: got %s (%s), want %s", cfg, recipe ? recipe : "-", dg_status_str(st),
             dg_last_error(), dg_status_str(want));
  if (!strstr(dg_last_error(), needle)) fail_msg("message \"%s\" lacks \"%s\"", dg_last_error(), needle);
  printf("# refused as expected: %s\n", dg_last_error());
  struct stat sb;
  if (strcmp(out, tdir("full")) && stat(out, &sb) == 0) fail_msg("%s exists after a failure", out);
}

static void test_errors(void **state) {
  (void)state;
  /* a non-empty output directory is never touched */
  mkdir(tdir("full"), 0755);
  char p[512];
  snprintf(p, sizeof p, "%s/keep.txt", tdir("full"));
  write_file(p, "x");
  expect_error("small", NULL, NULL, tdir("full"), DG_ERR_INVALID_ARG, "not empty");
  assert_int_equal(access(p, F_OK), 0);
  /* configs */
  expect_error(tdir("missing.json"), NULL, NULL, tdir("o1"), DG_ERR_NOT_FOUND, "missing.json");
  snprintf(p, sizeof p, "%s/notjson.json", tmp_root);
  write_file(p, "{\"model_type\": ");
  expect_error(p, NULL, NULL, tdir("o2"), DG_ERR_JSON, "notjson.json");
  expect_error(small_variant("nohidden", "\"hidden_size\": 128,", ""), NULL, NULL, tdir("o3"), DG_ERR_CONFIG,
               "hidden_size");
  expect_error(small_variant("badheads", "\"num_attention_heads\": 4", "\"num_attention_heads\": -4"), NULL, NULL,
               tdir("o4"), DG_ERR_CONFIG, "num_attention_heads");
  expect_error(small_variant("noexperts", "\"num_experts\": 8", "\"num_experts\": 0"), NULL, NULL, tdir("o5"),
               DG_ERR_CONFIG, "num_experts");
  expect_error(small_variant("badrange", "\"initializer_range\": 0.02,\n    \"dtype\"",
                             "\"initializer_range\": -1,\n    \"dtype\""),
               NULL, NULL, tdir("o6"), DG_ERR_CONFIG, "text_config.initializer_range");
  expect_error(small_variant("quant", "\"canvas_length\": 32,", "\"canvas_length\": 32, \"quantization\": {\"bits\": 4},"),
               NULL, NULL, tdir("o7"), DG_ERR_CONFIG, "quantization block");
  expect_error(small_variant("mt", "\"model_type\": \"diffusion_gemma\"", "\"model_type\": \"llama\""), NULL, NULL,
               tdir("o8"), DG_ERR_UNSUPPORTED_MODEL, "llama");
  /* recipe, source */
  expect_error("small", "experts=5", NULL, tdir("o9"), DG_ERR_INVALID_ARG, "bits 5");
  expect_error("small", NULL, tdir("nosuchsource"), tdir("o10"), DG_ERR_NOT_FOUND, "nosuchsource");
  /* a source tokenizer with more ids than the config's vocabulary (the bundled model's 4096 vs
   * "small"'s 1024): refused before anything is written, since the output would not load */
  expect_error("small", NULL, "models/dgemma-small", tdir("o11"), DG_ERR_VOCAB_MISMATCH, "does not fit");
  /* an input dim the group does not divide stays bf16, as MLX leaves it (and still loads) */
  const char *odd = small_variant("odd", "\"moe_intermediate_size\": 128", "\"moe_intermediate_size\": 96");
  dg_mkrandom_params mp = small_params(NULL, 0, 2);
  mp.config = odd;
  dg_mkrandom_result r;
  assert_dg_ok(dg_mkrandom(tdir("odd"), &mp, &r));
  assert_int_equal(r.n_indivisible, 6);
  assert_int_equal(r.n_quantized, 6);
  dg_model_params lp = dg_model_default_params();
  lp.no_tokenizer = 1;
  dg_model *m;
  assert_dg_ok(dg_model_load(tdir("odd"), &lp, &m));
  dg_model_free(m);
}

/* ---- the temporary directory reported (on_tmp_dir) ----------------------------------- */

typedef struct tmp_seen {
  int calls, n_null;
  char path[512];
  int existed;    /* the announced path existed when announced (it must not yet) */
  int was_dir;    /* at the first progress call, the announced path was a directory */
  int stop_after; /* progress: abort at this call (0 = never) */
  int n_progress;
} tmp_seen;

static void seen_tmp(const char *tmp, void *ud) {
  tmp_seen *t = ud;
  t->calls++;
  if (!tmp) { t->n_null++; return; }
  snprintf(t->path, sizeof t->path, "%s", tmp);
  t->existed |= access(tmp, F_OK) == 0;
}

static int seen_progress(int64_t done, int64_t total, const char *tensor, void *ud) {
  tmp_seen *t = ud;
  struct stat sb;
  if (++t->n_progress == 1) t->was_dir = stat(t->path, &sb) == 0 && S_ISDIR(sb.st_mode);
  return t->n_progress == t->stop_after;
}

/* on_tmp_dir gets the temporary sibling ".<name>.tmp-XXXXXX" just before it is made (so that a
 * CLI can remove it on a second Ctrl-C from the moment it exists) and the writer then writes in
 * it, then NULL once it is renamed or removed; a dry run creates none. */
static void test_tmp_dir_reported(void **state) {
  (void)state;
  char want[512];
  tmp_seen t = {0};
  dg_mkrandom_params p = small_params(NULL, 1, 1);
  p.on_tmp_dir = seen_tmp;
  p.progress = seen_progress;
  p.user_data = &t;
  assert_dg_ok(dg_mkrandom(tdir("tmpcb"), &p, NULL));
  assert_int_equal(t.existed, 0);
  assert_int_equal(t.calls, 2);
  assert_int_equal(t.n_null, 1);
  assert_int_equal(t.was_dir, 1);
  snprintf(want, sizeof want, "%s/.tmpcb.tmp-", tmp_root);
  assert_int_equal(strncmp(t.path, want, strlen(want)), 0);
  assert_int_equal(strlen(t.path), strlen(want) + 6);
  assert_int_equal(access(t.path, F_OK), -1); /* renamed */
  assert_int_equal(access(tdir("tmpcb"), F_OK), 0);
  /* stopped by the progress callback: reported, then removed and NULL */
  memset(&t, 0, sizeof t);
  t.stop_after = 3;
  assert_int_equal(dg_mkrandom(tdir("tmpcb2"), &p, NULL), DG_ERR_ABORTED);
  assert_int_equal(t.calls, 2);
  assert_int_equal(t.n_null, 1);
  assert_int_equal(t.was_dir, 1);
  assert_int_equal(access(t.path, F_OK), -1);
  assert_int_equal(access(tdir("tmpcb2"), F_OK), -1);
  /* a dry run writes nothing and reports nothing */
  memset(&t, 0, sizeof t);
  p.progress = NULL;
  p.dry_run = 1;
  assert_dg_ok(dg_mkrandom(tdir("tmpcb3"), &p, NULL));
  assert_int_equal(t.calls, 0);
  /* dg_quantize the same: of the first output, into a new directory */
  memset(&t, 0, sizeof t);
  dg_quantize_params qp = dg_quantize_default_params();
  qp.on_tmp_dir = seen_tmp;
  qp.progress = seen_progress;
  qp.user_data = &t;
  qp.recipe = "all=8";
  dg_mkrandom_params fp = small_params("all=bf16", 1, 1);
  assert_dg_ok(dg_mkrandom(tdir("tmpcb4"), &fp, NULL));
  assert_dg_ok(dg_quantize(tdir("tmpcb4"), tdir("tmpcb5"), &qp, NULL));
  assert_int_equal(t.existed, 0);
  assert_int_equal(t.calls, 2);
  assert_int_equal(t.n_null, 1);
  assert_int_equal(t.was_dir, 1);
  snprintf(want, sizeof want, "%s/.tmpcb5.tmp-", tmp_root);
  assert_int_equal(strncmp(t.path, want, strlen(want)), 0);
  assert_int_equal(access(t.path, F_OK), -1);
  assert_int_equal(access(tdir("tmpcb5"), F_OK), 0);
}

/* ---- the source directory --------------------------------------------------------- */

static void test_source_copied(void **state) {
  (void)state;
  mkdir(tdir("src"), 0755);
  char p[512];
  snprintf(p, sizeof p, "%s/tokenizer_config.json", tdir("src"));
  write_file(p, "{\"add_bos_token\": false}\n");
  snprintf(p, sizeof p, "%s/README.md", tdir("src"));
  write_file(p, "not copied\n");
  snprintf(p, sizeof p, "%s/model.safetensors", tdir("src"));
  write_file(p, "not copied\n");
  dg_mkrandom_params mp = small_params(NULL, 0, 2);
  mp.source_dir = tdir("src");
  dg_mkrandom_result r;
  assert_dg_ok(dg_mkrandom(tdir("withsrc"), &mp, &r));
  assert_int_equal(r.n_copied, 1);
  char a[512];
  snprintf(a, sizeof a, "%s/tokenizer_config.json", tdir("withsrc"));
  snprintf(p, sizeof p, "%s/tokenizer_config.json", tdir("src"));
  assert_int_equal(files_equal(a, p), 1);
  snprintf(a, sizeof a, "%s/README.md", tdir("withsrc"));
  assert_int_not_equal(access(a, F_OK), 0);
  snprintf(a, sizeof a, "%s/model.safetensors", tdir("withsrc"));
  assert_int_not_equal(files_equal(a, p), 1);
}

/* ---- the streaming writer (dg_st_create) ------------------------------------------ */

/* Filled out of order and in pieces, it makes the same bytes as dg_st_write;
 * a range outside a tensor is refused; a file left incomplete is an error and
 * is removed. */
static void test_stream_writer(void **state) {
  (void)state;
  uint32_t a[6] = {1, 2, 3, 4, 5, 6};
  uint16_t b[5] = {7, 8, 9, 10, 11};
  dg_tensor ts[2] = {{.name = "a", .dtype = DG_U32, .ndim = 2, .shape = {2, 3}, .data = a, .nbytes = sizeof a},
                     {.name = "b", .dtype = DG_BF16, .ndim = 1, .shape = {5}, .data = b, .nbytes = sizeof b}};
  const char *mk[1] = {"format"}, *mv[1] = {"pt"};
  char p1[512], p2[512];
  snprintf(p1, sizeof p1, "%s/whole.safetensors", tmp_root);
  snprintf(p2, sizeof p2, "%s/stream.safetensors", tmp_root);
  assert_dg_ok(dg_st_write(p1, ts, 2, mk, mv, 1));
  dg_tensor hdr[2] = {ts[0], ts[1]};
  hdr[0].data = hdr[1].data = NULL; /* the header needs no data */
  dg_st_out *o;
  assert_dg_ok(dg_st_create(p2, hdr, 2, mk, mv, 1, &o));
  assert_int_equal(dg_st_out_offset(o, 1) - dg_st_out_offset(o, 0), sizeof a);
  assert_dg_ok(dg_st_out_pwrite(o, 1, 4, b + 2, 6)); /* b[2..5) first */
  assert_dg_ok(dg_st_out_pwrite(o, 0, 12, a + 3, 12));
  assert_dg_ok(dg_st_out_pwrite(o, 1, 0, b, 4));
  assert_int_equal(dg_st_out_pwrite(o, 1, 8, b, 4), DG_ERR_INVALID_ARG); /* bytes [8, 12) of a 10-byte tensor */
  assert_non_null(strstr(dg_last_error(), "outside its 10 bytes"));
  assert_dg_ok(dg_st_out_pwrite(o, 0, 0, a, 12));
  assert_dg_ok(dg_st_out_close(o));
  assert_int_equal(files_equal(p1, p2), 1);
  /* incomplete: refused at close, file removed */
  snprintf(p2, sizeof p2, "%s/partial.safetensors", tmp_root);
  assert_dg_ok(dg_st_create(p2, hdr, 2, mk, mv, 1, &o));
  assert_dg_ok(dg_st_out_pwrite(o, 0, 0, a, sizeof a));
  assert_int_equal(dg_st_out_close(o), DG_ERR_IO);
  assert_non_null(strstr(dg_last_error(), "24 of 34 data bytes were written"));
  assert_int_not_equal(access(p2, F_OK), 0);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_real_plan),        cmocka_unit_test(test_loads_and_runs),
      cmocka_unit_test(test_deterministic),    cmocka_unit_test(test_values_bf16),
      cmocka_unit_test(test_values_quantized), cmocka_unit_test(test_same_as_quantize),
      cmocka_unit_test(test_errors),           cmocka_unit_test(test_source_copied),
      cmocka_unit_test(test_stream_writer),
      cmocka_unit_test(test_tmp_dir_reported),
  };
  return cmocka_run_group_tests_name("mkrandom", tests, setup, teardown);
}
