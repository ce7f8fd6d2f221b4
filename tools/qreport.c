/* qreport.c: `dgemma qreport`, the quantization quality report.
 *
 *   dgemma qreport [-m DIR] [--recipes "R1;R2;..."] [--bits B] [--group-size G] [-t N] [--seed S]
 *
 * For each recipe (dg_quant_recipe_parse syntax; default: a fixed list from
 * uniform 8 to 2 bits and the mixed recipes of docs/quantization.md) the float
 * model in DIR is quantized into a temporary directory with dg_quantize and
 * compared with the float model on a fixed set of chat prompts, three decoder
 * inputs per prompt:
 *   noise  a uniform random canvas (the first denoising step), no self-conditioning;
 *   sc     the same canvas with self-conditioning from each model's own noise
 *          logits at the first step's temperature (t_max);
 *   clean  the float model's greedy first block (a settled canvas, the last steps).
 * Per canvas position: KL(p_float || p_quant) of the softmax of the softcapped
 * logits (nats), top-1 agreement, max |logit difference|. Plus the greedy
 * first block of the quantized model vs the float model's (token agreement).
 * Prints one markdown table to stdout; progress on stderr. */
#include <dirent.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dgemma.h"
#include "dgemma_tools.h"
#include "qreport.h"

static const char *const PROMPTS[] = {
    "Sam has 23 apples. He buys 14 more apples. How many apples does Sam have now?",
    "Ruby starts with 35 apples. She loses 26 apples. How many apples does Ruby have at the end?",
    "Nora owns 32 balloons. She divides the balloons into 4 equal piles and keeps one pile. How many balloons does Nora have at the end?",
    "A baker makes 12 loaves a day for 5 days. How many loaves does he make?",
    "Tom had 50 marbles and gave 18 to his sister. Then he found 7 more. How many marbles does Tom have?",
    "Write a short speech in the style of Shakespeare about the sea.",
    "What is 7 times 8?",
    "Tell me about the weather today.",
};
#define N_PROMPTS (int)(sizeof PROMPTS / sizeof PROMPTS[0])

static const char *const DEFAULT_RECIPES =
    "all=8;all=6;all=4;all=3;all=2;all=4:32;all=4:128;mlx;mlx,experts=3;mlx,experts=2;mlx,experts=3,embed=6;"
    "mlx,experts=2,embed=bf16";

static void rm_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[4096];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

static void fail(const char *what, dg_status st) {
  fprintf(stderr, "dgemma qreport: %s: %s\n  %s\n", what, dg_status_str(st), dg_last_error());
  exit(1);
}

typedef struct acc {
  double kl_sum, kl_max, dmax;
  long n, top1;
} acc;

/* Compare two [C, V] logit sets position by position. */
static void compare(const float *a, const float *b, int C, int V, acc *s) {
  for (int c = 0; c < C; c++) {
    const float *x = a + (size_t)c * V, *y = b + (size_t)c * V;
    double mx = -DBL_MAX, my = -DBL_MAX;
    int ax = 0, ay = 0;
    for (int v = 0; v < V; v++) {
      if (x[v] > mx) { mx = x[v]; ax = v; }
      if (y[v] > my) { my = y[v]; ay = v; }
      double d = fabs((double)x[v] - y[v]);
      if (d > s->dmax) s->dmax = d;
    }
    double zx = 0, zy = 0;
    for (int v = 0; v < V; v++) { zx += exp(x[v] - mx); zy += exp(y[v] - my); }
    double lzx = mx + log(zx), lzy = my + log(zy), kl = 0;
    for (int v = 0; v < V; v++) {
      double lp = x[v] - lzx, lq = y[v] - lzy;
      kl += exp(lp) * (lp - lq);
    }
    if (kl < 0) kl = 0; /* rounding */
    s->kl_sum += kl;
    if (kl > s->kl_max) s->kl_max = kl;
    s->n++;
    s->top1 += ax == ay;
  }
}

typedef struct ref_data {
  int32_t *prompt[N_PROMPTS];
  size_t n_prompt[N_PROMPTS];
  int32_t *noise[N_PROMPTS], *clean[N_PROMPTS];
  float *l_noise[N_PROMPTS], *l_sc[N_PROMPTS], *l_clean[N_PROMPTS];
} ref_data;

/* Logits of one model on the three inputs of prompt i; greedy block into gen. */
static void run_model(dg_model *m, const ref_data *r, int i, float t_first, uint64_t seed, float *ln, float *lsc,
                      float *lcl, int32_t *gen) {
  dg_model_info info;
  dg_model_get_info(m, &info);
  const int C = info.canvas_length, V = info.vocab_size;
  dg_context_params cp = dg_context_default_params();
  cp.max_context = (int32_t)r->n_prompt[i] + 2 * C;
  dg_context *ctx;
  dg_status st;
  if ((st = dg_context_new(m, &cp, &ctx))) fail("context", st);
  if ((st = dg_encode(ctx, r->prompt[i], r->n_prompt[i]))) fail("encode", st);
  if ((st = dg_decode(ctx, r->noise[i], NULL, ln))) fail("decode", st);
  float *z = malloc(sizeof(float) * (size_t)C * V);
  for (size_t k = 0; k < (size_t)C * V; k++) z[k] = ln[k] / t_first;
  if ((st = dg_decode(ctx, r->noise[i], z, lsc))) fail("decode (self-conditioning)", st);
  free(z);
  if (r->clean[i] && (st = dg_decode(ctx, r->clean[i], NULL, lcl))) fail("decode", st);
  if (gen) {
    dg_context_reset(ctx);
    dg_gen_params gp = dg_gen_default_params(m);
    gp.max_new_tokens = C;
    gp.proposal = DG_PROPOSAL_ARGMAX;
    gp.seed = seed + (uint64_t)i;
    dg_gen_result res;
    if ((st = dg_generate(ctx, r->prompt[i], r->n_prompt[i], &gp, &res))) fail("generate", st);
    memcpy(gen, res.tokens, sizeof(int32_t) * (size_t)C);
    dg_gen_result_free(&res);
  }
  dg_context_free(ctx);
}

int dg_cli_qreport(const char *model_dir, const qreport_opts *o) {
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = o->threads;
  dg_model *mf;
  dg_status st;
  if ((st = dg_model_load(model_dir, &mp, &mf))) fail("load", st);
  dg_model_info info;
  dg_model_get_info(mf, &info);
  if (info.n_quantized) {
    fprintf(stderr, "dgemma qreport: %s is already quantized; give the float model\n", model_dir);
    return 2;
  }
  const int C = info.canvas_length, V = info.vocab_size;
  const size_t CV = (size_t)C * V;
  dg_gen_params g0 = dg_gen_default_params(mf);
  const float t_first = g0.t_max; /* T at s = N (spec 6.1) */
  ref_data r;
  memset(&r, 0, sizeof r);
  int32_t *ref_gen[N_PROMPTS];
  uint64_t rng = o->seed * 6364136223846793005ull + 1442695040888963407ull;
  fprintf(stderr, "qreport: float model %s, %d prompts\n", model_dir, N_PROMPTS);
  for (int i = 0; i < N_PROMPTS; i++) {
    dg_chat_message msg = {"user", PROMPTS[i]};
    if ((st = dg_chat_apply(mf, &msg, 1, 0, &r.prompt[i], &r.n_prompt[i]))) fail("chat template", st);
    r.noise[i] = malloc(sizeof(int32_t) * C);
    for (int c = 0; c < C; c++) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      r.noise[i][c] = (int32_t)((rng >> 33) % (uint64_t)V);
    }
    r.l_noise[i] = malloc(sizeof(float) * CV);
    r.l_sc[i] = malloc(sizeof(float) * CV);
    r.l_clean[i] = malloc(sizeof(float) * CV);
    ref_gen[i] = malloc(sizeof(int32_t) * C);
    /* the clean canvas is the float model's own greedy block */
    run_model(mf, &r, i, t_first, o->seed, r.l_noise[i], r.l_sc[i], NULL, ref_gen[i]);
    r.clean[i] = ref_gen[i];
    run_model(mf, &r, i, t_first, o->seed, r.l_noise[i], r.l_sc[i], r.l_clean[i], NULL);
  }
  char *recipes = strdup(o->recipes ? o->recipes : DEFAULT_RECIPES);
  printf("| recipe | size MB | bits/weight | KL noise | KL sc | KL clean | KL max | top-1 noise | top-1 sc | top-1 "
         "clean | max abs dlogit | greedy tokens equal |\n");
  printf("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
  fflush(stdout);
  float *ln = malloc(sizeof(float) * CV), *ls = malloc(sizeof(float) * CV), *lc = malloc(sizeof(float) * CV);
  int32_t *gen = malloc(sizeof(int32_t) * C);
  char *save = NULL;
  for (char *rec = strtok_r(recipes, ";", &save); rec; rec = strtok_r(NULL, ";", &save)) {
    char tmpl[] = "/tmp/dgemma-qreport-XXXXXX";
    char *qdir = mkdtemp(tmpl);
    if (!qdir) { perror("mkdtemp"); return 1; }
    dg_quantize_params qp = dg_quantize_default_params();
    if (o->bits) qp.bits = o->bits;
    if (o->group_size) qp.group_size = o->group_size;
    qp.recipe = rec;
    qp.n_threads = o->threads > 0 ? o->threads : 1;
    dg_quantize_result qr;
    if ((st = dg_quantize(model_dir, qdir, &qp, &qr))) { rm_dir(qdir); fail(rec, st); }
    dg_model_params qmp = mp;
    qmp.no_tokenizer = 1;
    dg_model *mq;
    if ((st = dg_model_load(qdir, &qmp, &mq))) { rm_dir(qdir); fail(rec, st); }
    acc an = {0}, as = {0}, ac = {0};
    long same = 0, total = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
      run_model(mq, &r, i, t_first, o->seed, ln, ls, lc, gen);
      compare(r.l_noise[i], ln, C, V, &an);
      compare(r.l_sc[i], ls, C, V, &as);
      compare(r.l_clean[i], lc, C, V, &ac);
      for (int c = 0; c < C; c++) same += gen[c] == ref_gen[i][c];
      total += C;
    }
    double klmax = fmax(an.kl_max, fmax(as.kl_max, ac.kl_max)), dmax = fmax(an.dmax, fmax(as.dmax, ac.dmax));
    /* bits per parameter of the whole checkpoint (norms and scalars included) */
    double bpw = 8.0 * (double)qr.bytes_out / (double)info.n_params;
    printf("| `%s` | %.2f | %.2f | %.2e | %.2e | %.2e | %.2e | %.2f%% | %.2f%% | %.2f%% | %.3f | %.2f%% |\n", rec,
           qr.bytes_out / 1e6, bpw, an.kl_sum / an.n, as.kl_sum / as.n, ac.kl_sum / ac.n, klmax,
           100.0 * an.top1 / an.n, 100.0 * as.top1 / as.n, 100.0 * ac.top1 / ac.n, dmax, 100.0 * same / total);
    fflush(stdout);
    fprintf(stderr, "qreport: %s done\n", rec);
    dg_model_free(mq);
    rm_dir(qdir);
  }
  printf("\nfloat model: %s, %.2f M parameters, %s; %d prompts x %d canvas positions per input; seed %llu\n",
         model_dir, info.n_params / 1e6, info.weight_dtype, N_PROMPTS, C, (unsigned long long)o->seed);
  free(ln); free(ls); free(lc); free(gen); free(recipes);
  for (int i = 0; i < N_PROMPTS; i++) {
    dg_free(r.prompt[i]);
    free(r.noise[i]); free(r.l_noise[i]); free(r.l_sc[i]); free(r.l_clean[i]); free(ref_gen[i]);
  }
  dg_model_free(mf);
  return 0;
}
