/* dgemma.c: the command-line tool. The only place that prints and exits.
 *
 *   dgemma run      [-m DIR] -p PROMPT   generate (chat template, streamed)
 *   dgemma info     [-m DIR]             model summary
 *   dgemma tokenize [-m DIR] TEXT        ids of TEXT (no BOS)
 *   dgemma logits   ...                  decoder logits as raw float32 (parity)
 *   dgemma replay   ...                  generation from injected random streams (parity)
 *   dgemma eval     gsm8k ...            GSM8K, vLLM harness conventions (tools/eval.c, tools/gsm8k.c)
 *   dgemma eval     problems|text ...    held-out evaluation of the small model (tools/eval.c)
 *   dgemma bench    ...                  throughput protocols with their floors (tools/bench.c)
 *   dgemma quantize IN_DIR OUT_DIR ...   MLX affine quantization of a float checkpoint
 *   dgemma mkrandom OUT_DIR ...          a random-weight checkpoint (26B-A4B shapes by default)
 *   dgemma qreport  [-m DIR] ...         quantization quality: KL and top-1 vs the float model (tools/qreport.c)
 *   dgemma serve    [-m DIR] ...         OpenAI-compatible HTTP server (tools/serve.c)
 *
 * Without -m the bundled small model is used ($DGEMMA_MODEL, else
 * models/dgemma-small next to the executable's ../, else ./models/dgemma-small). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dgemma.h"
#include "bench.h"
#include "eval.h"
#include "outfile.h"
#include "qreport.h"
#include "serve.h"

#define DEFAULT_MODEL "models/dgemma-small"

static void die(const char *what, dg_status st) {
  fprintf(stderr, "dgemma: %s: %s\n", what, dg_status_str(st));
  const char *msg = dg_last_error();
  if (msg && *msg) fprintf(stderr, "  %s\n", msg);
  exit(1);
}

static void usage_exit(const char *msg) {
  if (msg) fprintf(stderr, "dgemma: %s\n\n", msg);
  fprintf(stderr,
          "usage: dgemma COMMAND [options]\n"
          "\n"
          "commands:\n"
          "  run       generate text: dgemma run [-m DIR] -p PROMPT\n"
          "  info      print the model configuration\n"
          "  tokenize  print the ids of a text: dgemma tokenize [-m DIR] [--special] TEXT\n"
          "  logits    write decoder logits [canvas, vocab] as little-endian float32\n"
          "  replay    generate from injected random canvases/uniforms, print the ids\n"
          "  eval      dgemma eval gsm8k [-m DIR] [--data DIR] [--chat] [--shots K] [--limit N] [-o items.jsonl]\n"
          "                       [--summary S.json] [--sample] [-n N] [-s STEPS] [--seed S] (docs/eval.md)\n"
          "            dgemma eval problems|text [-m DIR] --file F.jsonl [--limit N] [--seed S] [-o items.jsonl]\n"
          "                       [--gen-kwargs J] [--greedy] [-n N] [-s STEPS] [--ref] [-t N] (problems: -o resumes)\n"
          "  bench     dgemma bench [-m DIR] [--protocol vllm|p512|batch|ceiling|all] [--reps N] [--warmup N]\n"
          "                       [-o rows.jsonl] [--prompt-tokens P] [-n N] [--canvases 1,2,4,8] [--gen-kwargs JSON]\n"
          "                       [--rows 1,2,...,256] [--formats bf16,8,4,3,2] [--moe-tokens 256] [--quick]\n"
          "                       (docs/eval.md)\n"
          "  quantize  dgemma quantize IN_DIR OUT_DIR [--bits B] [--group-size G] [--recipe SPEC] [-t N]\n"
          "            (MLX affine; SPEC e.g. \"mlx,experts=3\" or \"experts=2:32,embed=bf16\"; see README)\n"
          "  mkrandom  dgemma mkrandom OUT_DIR [--config real|small|FILE.json] [--source DIR] [--seed S]\n"
          "                       [--bits B] [--group-size G] [--recipe SPEC] [-t N] [--dry-run]\n"
          "            (random weights drawn as Transformers initialises them; default: the 26B-A4B config,\n"
          "            experts 4-bit group 64, the rest bf16; --source copies tokenizer files; docs/cuda.md)\n"
          "  qreport   dgemma qreport [-m DIR] [--recipes \"R1;R2;...\"] [--bits B] [--group-size G]\n"
          "            (KL divergence and top-1 agreement of quantized logits vs the float model)\n"
          "  serve     dgemma serve [-m DIR] [--port P] [--max-batch N] [--api-key KEY] ... (dgemma serve --help)\n"
          "\n"
          "common options:\n"
          "  -m, --model DIR          Hugging Face DiffusionGemma directory (default: bundled %s)\n"
          "  -t, --threads N          CPU threads (default: all)\n"
          "      --ref                use the scalar fp32 oracle kernels\n"
          "      --device cpu|cuda[:N] where the forward pass runs (default cpu); `info --device cuda`\n"
          "                           also checks one decoder step on the GPU against the CPU\n"
          "\n"
          "run options:\n"
          "  -p, --prompt TEXT        the user message (chat template applied)\n"
          "      --system TEXT        a system message\n"
          "      --think              enable thinking in the chat template\n"
          "      --raw                use PROMPT as raw text (no template, no BOS added)\n"
          "  -n, --max-new-tokens N   tokens to generate (whole canvases)\n"
          "  -s, --steps N            max denoising steps per canvas\n"
          "      --seed N             random seed (default 0)\n"
          "      --greedy             argmax proposals instead of sampling\n"
          "      --gen-kwargs JSON    any generation_config field, e.g. '{\"entropy_bound\": 0.2}', or the\n"
          "                           turbo engine: '{\"diffusion_turbo\": true, \"turbo_accept\": \"confidence\",\n"
          "                           \"turbo_threshold\": [0.95, 0.80, 8], \"turbo_repair\": true}' (README)\n"
          "  -v, --verbose            show the canvas as it denoises (stderr)\n"
          "\n"
          "logits / replay options:\n"
          "      --prompt-ids LIST|@FILE   prompt ids: comma-separated, or @file of int32\n"
          "      --canvas-ids LIST|@FILE   canvas ids (logits)\n"
          "      --sc-logits FILE          previous step's processed logits [C,V] float32 (logits)\n"
          "  -o, --out FILE                output file (logits)\n"
          "      --canvases [@]FILE        replay: int32 canvases, C ids each, in draw order\n"
          "                                (bench: the B values of the batch protocol, e.g. 1,2,4,8)\n"
          "      --uniforms [@]FILE        replay: float32 uniforms, C per step (else argmax proposals)\n",
          DEFAULT_MODEL);
  exit(2);
}

/* ---- small helpers ------------------------------------------------------- */

/* Whole file (a leading '@' is accepted and skipped), or exit naming the file and the reason. */
static void *read_all(const char *path, size_t *len) {
  if (path[0] == '@') path++;
  FILE *f = fopen(path, "rb");
  if (!f) { fprintf(stderr, "dgemma: cannot open %s: %s\n", path, strerror(errno)); exit(1); }
  size_t cap = 1 << 16, n = 0, k;
  char *buf = malloc(cap);
  while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
    n += k;
    if (n == cap) {
      char *nb = realloc(buf, cap *= 2);
      if (!nb) { free(buf); buf = NULL; }
      buf = nb;
    }
  }
  if (!buf || ferror(f)) { fprintf(stderr, "dgemma: cannot read %s: %s\n", path, buf ? strerror(errno) : "out of memory"); exit(1); }
  fclose(f);
  *len = n;
  return buf;
}

/* Standard output at the end of a command: a write error (a full disk,
 * /dev/full) is reported and the status becomes 1. */
static int close_stdout(int rc) {
  if ((fflush(stdout) != 0 || ferror(stdout)) && rc == 0) { /* a failed command has said why already */
    fprintf(stderr, "dgemma: cannot write to standard output: %s\n", strerror(errno ? errno : EIO));
    return 1;
  }
  return rc;
}

/* "1,2,3" or "@file.i32" -> int32 array */
static int32_t *parse_ids(const char *arg, size_t *n) {
  if (arg[0] == '@') {
    size_t len;
    int32_t *ids = read_all(arg, &len);
    if (len % 4) { fprintf(stderr, "dgemma: %s: size %zu is not a multiple of 4 (int32)\n", arg + 1, len); exit(1); }
    *n = len / 4;
    return ids;
  }
  size_t cap = 16, cnt = 0;
  int32_t *ids = malloc(cap * sizeof *ids);
  const char *p = arg;
  while (*p) {
    char *end;
    errno = 0;
    long v = strtol(p, &end, 10);
    if (end == p || errno || v < INT32_MIN || v > INT32_MAX) {
      fprintf(stderr, "dgemma: bad id list near \"%s\"\n", p);
      exit(2);
    }
    if (cnt == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
    ids[cnt++] = (int32_t)v;
    p = end;
    while (*p == ',' || *p == ' ') p++;
  }
  *n = cnt;
  return ids;
}

static const char *default_model(void) {
  static char buf[PATH_MAX + 64];
  const char *env = getenv("DGEMMA_MODEL");
  if (env && *env) return env;
  char exe[PATH_MAX];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (k > 0) {
    exe[k] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) {
      *slash = 0;
      snprintf(buf, sizeof buf, "%s/../%s", exe, DEFAULT_MODEL);
      if (access(buf, R_OK) == 0) return buf;
    }
  }
  return DEFAULT_MODEL;
}

typedef struct opts {
  const char *model, *prompt, *system, *gen_kwargs, *prompt_ids, *canvas_ids, *sc_logits, *out, *canvases, *uniforms;
  const char *file, *recipe, *recipes, *config, *source;
  const char *data, *summary, *protocol;
  const char *rows, *formats, *moe_tokens; /* bench --protocol ceiling */
  int quick;
  int chat, sample, shots_set, shots, reps, warmup, prompt_tokens;
  int bits, group_size;
  const char *positional2;
  int threads, ref, think, raw, verbose, greedy, special, dry_run;
  int device, cuda_device; /* dg_device and CUDA ordinal (--device) */
  long long max_new, steps, seed, limit;
  int max_new_set, steps_set, seed_set;
  const char *positional;
} opts;

/* An integer option in [lo, hi]; anything else is a usage error naming the option. */
static long long parse_int(const char *s, const char *name, long long lo, long long hi) {
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (!*s || *end || errno || v < lo || v > hi) {
    fprintf(stderr, "dgemma: %s expects an integer in [%lld, %lld], got \"%s\"\n", name, lo, hi, s);
    exit(2);
  }
  return v;
}

static void parse_opts(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
#define ARG() (i + 1 < argc ? argv[++i] : (fprintf(stderr, "dgemma: %s needs a value\n", a), exit(2), ""))
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = ARG();
    else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) o->prompt = ARG();
    else if (!strcmp(a, "--system")) o->system = ARG();
    else if (!strcmp(a, "--think")) o->think = 1;
    else if (!strcmp(a, "--raw")) o->raw = 1;
    else if (!strcmp(a, "-n") || !strcmp(a, "--max-new-tokens")) { o->max_new = parse_int(ARG(), a, 1, 1 << 24); o->max_new_set = 1; }
    else if (!strcmp(a, "-s") || !strcmp(a, "--steps")) { o->steps = parse_int(ARG(), a, 1, 1 << 20); o->steps_set = 1; }
    else if (!strcmp(a, "--seed")) { o->seed = parse_int(ARG(), a, 0, (1LL << 53)); o->seed_set = 1; }
    else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) o->threads = (int)parse_int(ARG(), a, 0, DG_MAX_THREADS);
    else if (!strcmp(a, "--ref")) o->ref = 1;
    else if (!strcmp(a, "--device")) {
      const char *d = ARG();
      if (!strcmp(d, "cpu")) o->device = DG_DEVICE_CPU;
      else if (!strcmp(d, "cuda")) o->device = DG_DEVICE_CUDA;
      else if (!strncmp(d, "cuda:", 5)) { o->device = DG_DEVICE_CUDA; o->cuda_device = (int)parse_int(d + 5, a, 0, 1023); }
      else { fprintf(stderr, "dgemma: --device expects cpu, cuda or cuda:N, got \"%s\"\n", d); exit(2); }
    }
    else if (!strcmp(a, "--greedy")) o->greedy = 1;
    else if (!strcmp(a, "--special")) o->special = 1;
    else if (!strcmp(a, "--gen-kwargs")) o->gen_kwargs = ARG();
    else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) o->verbose = 1;
    else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = ARG();
    else if (!strcmp(a, "--canvas-ids")) o->canvas_ids = ARG();
    else if (!strcmp(a, "--sc-logits")) o->sc_logits = ARG();
    else if (!strcmp(a, "-o") || !strcmp(a, "--out")) o->out = ARG();
    else if (!strcmp(a, "--canvases")) o->canvases = ARG();
    else if (!strcmp(a, "--uniforms")) o->uniforms = ARG();
    else if (!strcmp(a, "--file")) o->file = ARG();
    else if (!strcmp(a, "--data")) o->data = ARG();
    else if (!strcmp(a, "--summary")) o->summary = ARG();
    else if (!strcmp(a, "--chat")) o->chat = 1;
    else if (!strcmp(a, "--sample")) o->sample = 1;
    else if (!strcmp(a, "--shots")) { o->shots = (int)parse_int(ARG(), a, 0, 64); o->shots_set = 1; }
    else if (!strcmp(a, "--protocol")) o->protocol = ARG();
    else if (!strcmp(a, "--rows")) o->rows = ARG();
    else if (!strcmp(a, "--formats")) o->formats = ARG();
    else if (!strcmp(a, "--moe-tokens")) o->moe_tokens = ARG();
    else if (!strcmp(a, "--quick")) o->quick = 1;
    else if (!strcmp(a, "--reps")) o->reps = (int)parse_int(ARG(), a, 1, 1000);
    else if (!strcmp(a, "--warmup")) o->warmup = (int)parse_int(ARG(), a, 0, 100) + 1;
    else if (!strcmp(a, "--prompt-tokens")) o->prompt_tokens = (int)parse_int(ARG(), a, 1, 1 << 20);
    else if (!strcmp(a, "--limit")) o->limit = parse_int(ARG(), a, 1, INT32_MAX); /* absent = all */
    else if (!strcmp(a, "--bits")) o->bits = (int)parse_int(ARG(), a, 2, 8);
    else if (!strcmp(a, "--group-size")) o->group_size = (int)parse_int(ARG(), a, 32, 128);
    else if (!strcmp(a, "--recipe")) o->recipe = ARG();
    else if (!strcmp(a, "--recipes")) o->recipes = ARG();
    else if (!strcmp(a, "--config")) o->config = ARG();
    else if (!strcmp(a, "--source")) o->source = ARG();
    else if (!strcmp(a, "--dry-run")) o->dry_run = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) usage_exit(NULL);
    else if (a[0] == '-' && a[1]) { fprintf(stderr, "dgemma: unknown option %s\n", a); usage_exit(NULL); }
    else if (!o->positional) o->positional = a;
    else if (!o->positional2 && !strcmp(argv[1], "quantize")) o->positional2 = a;
    else { fprintf(stderr, "dgemma: unexpected argument \"%s\"\n", a); usage_exit(NULL); }
#undef ARG
  }
}

/* Reject a positional argument for commands that take none. */
static void no_positional(const opts *o, const char *cmd) {
  if (o->positional) {
    fprintf(stderr, "dgemma: %s takes no argument \"%s\" (options only)\n", cmd, o->positional);
    exit(2);
  }
}

/* Context capacity for a prompt of n tokens and the canvases of gp, or exit if it overflows. */
static int32_t context_size(size_t n, const dg_gen_params *gp, int32_t canvas) {
  long long c = ((long long)gp->max_new_tokens + canvas - 1) / canvas;
  long long need = (long long)n + c * canvas;
  if (need > INT32_MAX) {
    fprintf(stderr, "dgemma: prompt of %zu tokens + %d new tokens is too long\n", n, gp->max_new_tokens);
    exit(2);
  }
  return (int32_t)need;
}

static dg_model *load_model(const opts *o, int need_tokenizer) {
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = o->threads;
  mp.reference_kernels = o->ref;
  mp.no_tokenizer = !need_tokenizer;
  mp.device = (dg_device)o->device;
  mp.cuda_device = o->cuda_device;
  dg_model *m = NULL;
  const char *dir = o->model ? o->model : default_model();
  dg_status st = dg_model_load(dir, &mp, &m);
  if (st) {
    fprintf(stderr, "dgemma: cannot load model %s\n", dir);
    if (!o->model && st == DG_ERR_NOT_FOUND)
      fprintf(stderr, "  (no -m given and the bundled model was not found; pass -m MODEL_DIR)\n");
    die("load", st);
  }
  return m;
}

static dg_gen_params gen_params(const dg_model *m, const opts *o) {
  dg_gen_params gp = dg_gen_default_params(m);
  if (o->gen_kwargs) {
    dg_status st = dg_gen_params_apply_json(&gp, o->gen_kwargs);
    if (st) die("--gen-kwargs", st);
  }
  if (o->max_new_set) gp.max_new_tokens = (int32_t)o->max_new;
  if (o->steps_set) gp.max_denoising_steps = (int32_t)o->steps;
  if (o->seed_set) gp.seed = (uint64_t)o->seed;
  if (o->greedy) gp.proposal = DG_PROPOSAL_ARGMAX;
  return gp;
}

/* ---- run ----------------------------------------------------------------- */

typedef struct stream_state {
  const dg_model *m;
  int32_t *ids;
  size_t n, cap;
  size_t printed; /* bytes of decoded text already written */
  int verbose;
  int write_errno; /* nonzero: writing stdout failed (generation stopped) */
} stream_state;

static int on_block(const dg_block_info *bi, void *ud) {
  stream_state *s = ud;
  if (s->n + (size_t)bi->n_valid > s->cap) {
    s->cap = (s->n + (size_t)bi->n_valid) * 2;
    s->ids = realloc(s->ids, s->cap * sizeof *s->ids);
  }
  memcpy(s->ids + s->n, bi->tokens, (size_t)bi->n_valid * sizeof(int32_t));
  s->n += (size_t)bi->n_valid;
  char *text = NULL;
  if (dg_detokenize(s->m, s->ids, s->n, 0, &text) == DG_OK) {
    size_t len = strlen(text);
    errno = 0;
    int bad = len > s->printed && fwrite(text + s->printed, 1, len - s->printed, stdout) != len - s->printed;
    s->printed = len;
    bad |= fflush(stdout) != 0;
    dg_free(text);
    if (bad) { /* a full disk or /dev/full: stop generating, cmd_run reports it */
      s->write_errno = errno ? errno : EIO;
      return 1;
    }
  }
  return 0;
}

static int on_step(const dg_step_info *si, void *ud) {
  stream_state *s = ud;
  char *text = NULL;
  const int tty = isatty(2);
  fprintf(stderr, "%s[block %d step %2d T=%.3f accepted %3d mean H %.4f%s]%s ", tty ? "\x1b[2m" : "", si->block,
          si->step, si->temperature, si->n_accepted, si->mean_entropy, si->stop ? " stop" : "", tty ? "\x1b[0m" : "");
  if (dg_detokenize(s->m, si->argmax, (size_t)si->canvas_length, 1, &text) == DG_OK) {
    for (char *c = text; *c; c++)
      if (*c == '\n') *c = ' ';
    fprintf(stderr, "%.160s\n", text);
    dg_free(text);
  } else {
    fprintf(stderr, "\n");
  }
  return 0;
}

static int cmd_run(const opts *o) {
  const char *prompt = o->prompt ? o->prompt : o->positional;
  if (!prompt) usage_exit("run needs a prompt (-p TEXT)");
  if (o->prompt && o->positional) {
    fprintf(stderr, "dgemma: run got both -p and the argument \"%s\"\n", o->positional);
    return 2;
  }
  dg_model *m = load_model(o, 1);
  dg_gen_params gp = gen_params(m, o);
  int32_t *ids = NULL;
  size_t n = 0;
  dg_status st;
  if (o->raw) {
    st = dg_tokenize(m, prompt, strlen(prompt), 1, &ids, &n);
  } else {
    dg_chat_message msgs[2];
    size_t nm = 0;
    if (o->system) msgs[nm++] = (dg_chat_message){"system", o->system};
    msgs[nm++] = (dg_chat_message){"user", prompt};
    st = dg_chat_apply(m, msgs, nm, o->think, &ids, &n);
  }
  if (st) die("prompt", st);
  dg_model_info info;
  dg_model_get_info(m, &info);
  dg_context_params cp = dg_context_default_params();
  cp.max_context = context_size(n, &gp, info.canvas_length);
  dg_context *ctx = NULL;
  if ((st = dg_context_new(m, &cp, &ctx))) die("context", st);
  stream_state ss = {m, NULL, 0, 0, 0, o->verbose, 0};
  gp.on_block = on_block;
  gp.on_step = o->verbose ? on_step : NULL;
  gp.user_data = &ss;
  dg_gen_result r;
  if ((st = dg_generate(ctx, ids, n, &gp, &r))) {
    if (st == DG_ERR_ABORTED && ss.write_errno) {
      fprintf(stderr, "dgemma: cannot write to standard output: %s (generation stopped)\n", strerror(ss.write_errno));
      free(ss.ids);
      dg_free(ids);
      dg_context_free(ctx);
      dg_model_free(m);
      return 1;
    }
    die("generate", st);
  }
  printf("\n");
  fflush(stdout); /* a failure here is reported by close_stdout at the end */
  static const char *const why[] = {"length", "stop", "repetition"};
  /* generated text only (n_visible): hidden <eos>/pad canvases are not tokens the user got */
  fprintf(stderr, "dgemma: %d tokens, %d blocks, %d denoising steps, %.2f tokens/forward, %.2f s, %.1f tok/s\n",
          r.n_visible, r.n_blocks, r.n_steps, r.n_steps ? (double)r.n_visible / r.n_steps : 0.0, r.seconds,
          r.seconds > 0 ? r.n_visible / r.seconds : 0.0);
  fprintf(stderr, "dgemma: %s sampler, %.2f forwards/block, %.1f positions/forward, finish reason %s\n",
          gp.turbo.enabled ? "turbo" : "reference", r.n_blocks ? (double)r.n_steps / r.n_blocks : 0.0,
          r.n_steps ? (double)r.n_forwarded / r.n_steps : 0.0,
          (unsigned)r.finish_reason < 3 ? why[r.finish_reason] : "?");
  dg_gen_result_free(&r);
  free(ss.ids);
  dg_free(ids);
  dg_context_free(ctx);
  dg_model_free(m);
  return 0;
}

/* ---- info / tokenize ------------------------------------------------------ */

/* `info --device cuda`: one encoder pass and two decoder steps (zero and
 * self-conditioned) of the model on the GPU and on the CPU, same inputs; prints
 * the largest logit difference, the normwise relative error and the argmax
 * agreement. Exit status 1 if the GPU result is not finite or its relative
 * error exceeds 5e-2 (bf16 products land near 1e-3..1e-2; a bug lands near 1). */
static int cuda_smoke(const opts *o, dg_model *gm) {
  opts oc = *o;
  oc.device = DG_DEVICE_CPU;
  dg_model *cm = load_model(&oc, 0);
  dg_model_info i;
  dg_model_get_info(cm, &i);
  const int C = i.canvas_length, V = i.vocab_size, P = 20;
  int32_t prompt[20], *canvas = malloc((size_t)C * sizeof *canvas);
  for (int k = 0; k < P; k++) prompt[k] = (int32_t)((2 + 37 * k) % V);
  for (int k = 0; k < C; k++) canvas[k] = (int32_t)((13 + 7919LL * k) % V);
  float *lc = malloc((size_t)C * V * sizeof(float)), *lg = malloc((size_t)C * V * sizeof(float));
  float *z = malloc((size_t)C * V * sizeof(float));
  dg_context_params cp = dg_context_default_params();
  cp.max_context = P + C;
  dg_context *cc = NULL, *gc = NULL;
  dg_status st;
  if ((st = dg_context_new(cm, &cp, &cc))) die("cpu context", st);
  if ((st = dg_context_new(gm, &cp, &gc))) die("cuda context", st);
  if ((st = dg_encode(cc, prompt, P))) die("cpu encode", st);
  if ((st = dg_encode(gc, prompt, P))) die("cuda encode", st);
  int bad = 0;
  for (int pass = 0; pass < 2; pass++) {
    const float *sc = pass ? z : NULL;
    if ((st = dg_decode(cc, canvas, sc, lc))) die("cpu decode", st);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if ((st = dg_decode(gc, canvas, sc, lg))) die("cuda decode", st);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double maxd = 0, num = 0, den = 0;
    int agree = 0, finite = 1;
    for (int r = 0; r < C; r++) {
      int ac = 0, ag = 0;
      for (int v = 0; v < V; v++) {
        size_t k = (size_t)r * V + v;
        if (!isfinite(lg[k])) finite = 0;
        double d = fabs((double)lg[k] - lc[k]);
        if (d > maxd) maxd = d;
        num += d * d;
        den += (double)lc[k] * lc[k];
        if (lc[k] > lc[(size_t)r * V + ac]) ac = v;
        if (lg[k] > lg[(size_t)r * V + ag]) ag = v;
      }
      agree += ac == ag;
    }
    double rel = den > 0 ? sqrt(num / den) : 0;
    printf("cuda vs cpu, decoder step %s: max |logit diff| %.4g, rel ||diff||/||cpu|| %.3g, argmax agrees %d/%d, "
           "cuda decode %.1f ms (incl. copying [%d x %d] logits back)\n",
           pass ? "with self-conditioning" : "without self-conditioning", maxd, rel, agree, C,
           (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6, C, V);
    if (!finite || !(rel <= 5e-2)) bad = 1;
    for (size_t k = 0; k < (size_t)C * V; k++) z[k] = lc[k] / 0.8f; /* processed logits at T = 0.8 */
  }
  printf("verdict: %s\n", bad ? "FAIL (non-finite or relative error above 5e-2)" : "ok");
  dg_context_free(cc);
  dg_context_free(gc);
  dg_model_free(cm);
  free(canvas); free(lc); free(lg); free(z);
  return bad;
}

static int cmd_info(const opts *o) {
  no_positional(o, "info");
  if (o->device == DG_DEVICE_CUDA) {
    char buf[512];
    dg_status st = dg_device_info(DG_DEVICE_CUDA, o->cuda_device, buf, sizeof buf);
    if (st) die("cuda", st);
    printf("device: cuda:%d %s\n", o->cuda_device, buf);
  }
  dg_model *m = load_model(o, 0);
  dg_model_info i;
  dg_model_get_info(m, &i);
  dg_gen_params gp = dg_gen_default_params(m);
  printf("vocab %d, hidden %d, layers %d (%d full), heads %d, kv heads %d/%d, head dim %d/%d, window %d\n",
         i.vocab_size, i.hidden_size, i.n_layers, i.n_full_layers, i.n_heads, i.n_kv_heads, i.n_global_kv_heads,
         i.head_dim, i.global_head_dim, i.sliding_window);
  printf("dense MLP %d, experts %d x %d (top-%d), canvas %d, weights %s, %.2f M text parameters\n",
         i.intermediate_size, i.n_experts, i.moe_intermediate_size, i.top_k_experts, i.canvas_length, i.weight_dtype,
         (double)i.n_params / 1e6);
  if (i.n_quantized)
    printf("quantized: %d matrices MLX affine, %d..%d bits\n", i.n_quantized, i.quant_bits_min, i.quant_bits_max);
  printf("generation: max_new_tokens %d, steps %d, entropy bound %g, T %g..%g, stability %d, confidence %g, stop ids",
         gp.max_new_tokens, gp.max_denoising_steps, gp.entropy_bound, gp.t_min, gp.t_max, gp.stability_threshold,
         gp.confidence_threshold);
  for (int k = 0; k < gp.n_stop_ids; k++) printf(" %d", gp.stop_ids[k]);
  printf("\n");
  int rc = 0;
  if (i.device == DG_DEVICE_CUDA) {
    printf("weights on the GPU: %.1f MiB (%s)\n", (double)i.device_bytes / (1 << 20),
           i.n_quantized ? "quantized matrices packed as stored, float ones as bf16" : "bf16");
    rc = cuda_smoke(o, m);
  }
  dg_model_free(m);
  return rc;
}

static int cmd_tokenize(const opts *o) {
  const char *text = o->positional ? o->positional : o->prompt;
  if (!text) usage_exit("tokenize needs a TEXT argument");
  dg_model *m = load_model(o, 1);
  int32_t *ids;
  size_t n;
  dg_status st = dg_tokenize(m, text, strlen(text), o->special, &ids, &n);
  if (st) die("tokenize", st);
  for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
  printf("\n");
  dg_free(ids);
  dg_model_free(m);
  return 0;
}

/* ---- logits / replay -------------------------------------------------------- */

/* Every input is checked before the output is touched and before the
 * prefill; the logits go to a temporary file renamed to -o when complete, so
 * an error or an interruption leaves an existing -o file as it was. */
static int cmd_logits(const opts *o) {
  if (!o->prompt_ids || !o->canvas_ids || !o->out) usage_exit("logits needs --prompt-ids, --canvas-ids and -o");
  no_positional(o, "logits");
  catch_stop_signals(1); /* no stop point in a forward pass: the handler removes the temporary file and exits */
  dg_model *m = load_model(o, 0);
  dg_model_info info;
  dg_model_get_info(m, &info);
  size_t np, nc;
  int32_t *prompt = parse_ids(o->prompt_ids, &np);
  int32_t *canvas = parse_ids(o->canvas_ids, &nc);
  float *sc = NULL, *logits = NULL;
  dg_context *ctx = NULL;
  int rc = 2; /* a bad input, until the inputs are checked */
  if (nc != (size_t)info.canvas_length) {
    fprintf(stderr, "dgemma: --canvas-ids has %zu ids; the model's canvas_length is %d\n", nc, info.canvas_length);
    goto out;
  }
  for (size_t k = 0; k < np + nc; k++) {
    int32_t id = k < np ? prompt[k] : canvas[k - np];
    if (id < 0 || id >= info.vocab_size) {
      fprintf(stderr, "dgemma: %s id %d (index %zu) is outside the vocabulary [0, %d)\n",
              k < np ? "--prompt-ids" : "--canvas-ids", id, k < np ? k : k - np, info.vocab_size);
      goto out;
    }
  }
  /* the canvas sits at positions np..np+C-1: check them now, not after a long prefill */
  if ((long long)np + info.canvas_length > info.max_position_embeddings) {
    fprintf(stderr,
            "dgemma: --prompt-ids has %zu ids: the canvas would take positions %zu..%lld, past the model's "
            "max_position_embeddings %d\n",
            np, np, (long long)np + info.canvas_length - 1, info.max_position_embeddings);
    goto out;
  }
  size_t CV = (size_t)info.canvas_length * (size_t)info.vocab_size;
  if (o->sc_logits) {
    size_t len;
    sc = read_all(o->sc_logits, &len);
    if (len != CV * 4) {
      fprintf(stderr, "dgemma: %s has %zu bytes; expected %zu (float32 [%d, %d])\n", o->sc_logits, len, CV * 4,
              info.canvas_length, info.vocab_size);
      goto out;
    }
  }
  rc = 1;
  FILE *f = out_open(o->out); /* before the forward passes: an unwritable directory fails now */
  dg_context_params cp = dg_context_default_params();
  cp.max_context = (int32_t)np + 1;
  dg_status st;
  if ((st = dg_context_new(m, &cp, &ctx))) die("context", st);
  struct timespec t0, t1, t2;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  if ((st = dg_encode(ctx, prompt, np))) die("encode", st);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  logits = malloc(CV * sizeof(float));
  if (!logits) {
    fprintf(stderr, "dgemma: out of memory for [%d, %d] logits\n", info.canvas_length, info.vocab_size);
    fclose(f);
    goto out;
  }
  if ((st = dg_decode(ctx, canvas, sc, logits))) die("decode", st);
  clock_gettime(CLOCK_MONOTONIC, &t2);
  if (fwrite(logits, sizeof(float), CV, f) != CV) {
    fprintf(stderr, "dgemma: cannot write %s: %s\n", o->out, strerror(errno));
    fclose(f);
    goto out; /* the temporary file is removed at exit */
  }
  if (out_commit(f, o->out)) goto out;
  fprintf(stderr, "dgemma: wrote [%d, %d] float32 logits to %s (encode %zu tokens %.3f s, decode %.3f s; wall times)\n",
          info.canvas_length, info.vocab_size, o->out, np,
          (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec),
          (double)(t2.tv_sec - t1.tv_sec) + 1e-9 * (double)(t2.tv_nsec - t1.tv_nsec));
  rc = 0;
out:
  free(logits); free(sc); free(prompt); free(canvas);
  dg_context_free(ctx);
  dg_model_free(m);
  return rc;
}

static int cmd_replay(const opts *o) {
  if (!o->prompt_ids || !o->canvases) usage_exit("replay needs --prompt-ids and --canvases");
  no_positional(o, "replay");
  dg_model *m = load_model(o, 0);
  dg_gen_params gp = gen_params(m, o);
  size_t np, ncv, nu = 0;
  int32_t *prompt = parse_ids(o->prompt_ids, &np);
  size_t len;
  int32_t *canv = read_all(o->canvases, &len);
  dg_model_info info;
  dg_model_get_info(m, &info);
  if (len % (4 * (size_t)info.canvas_length)) {
    fprintf(stderr, "dgemma: %s has %zu bytes, not a whole number of int32 canvases of %d ids\n", o->canvases, len,
            info.canvas_length);
    return 2;
  }
  ncv = len / 4;
  float *uni = NULL;
  if (o->uniforms) {
    uni = read_all(o->uniforms, &len);
    if (len % 4) { fprintf(stderr, "dgemma: %s is not float32 data\n", o->uniforms); return 2; }
    nu = len / 4;
  }
  gp.replay_canvases = canv;
  gp.replay_canvases_len = ncv;
  gp.replay_uniforms = uni;
  gp.replay_uniforms_len = nu;
  gp.proposal = uni ? DG_PROPOSAL_REPLAY_UNIFORM : DG_PROPOSAL_ARGMAX;
  dg_context_params cp = dg_context_default_params();
  cp.max_context = context_size(np, &gp, info.canvas_length);
  dg_context *ctx = NULL;
  dg_status st;
  if ((st = dg_context_new(m, &cp, &ctx))) die("context", st);
  dg_gen_result r;
  if ((st = dg_generate(ctx, prompt, np, &gp, &r))) die("replay", st);
  for (int32_t i = 0; i < r.n_tokens; i++) printf("%s%d", i ? "," : "", r.tokens[i]);
  printf("\n");
  fflush(stdout);
  fprintf(stderr, "dgemma: %d blocks, %d denoising steps\n", r.n_blocks, r.n_steps);
  dg_gen_result_free(&r);
  free(prompt); free(canv); free(uni);
  dg_context_free(ctx);
  dg_model_free(m);
  return 0;
}

/* --gen-kwargs as the configuration key of an eval output file: the JSON
 * re-printed without spaces, so that spellings of the same object match.
 * Returns NULL without --gen-kwargs; free with cJSON_free. */
static char *gen_kwargs_key(const opts *o) {
  if (!o->gen_kwargs) return NULL;
  cJSON *j = cJSON_Parse(o->gen_kwargs); /* already validated by gen_params */
  char *k = j ? cJSON_PrintUnformatted(j) : NULL;
  cJSON_Delete(j);
  return k;
}

static int cmd_eval(const opts *o) {
  if (o->positional && !strcmp(o->positional, "gsm8k")) {
    if (o->file) usage_exit("eval gsm8k reads --data DIR (test.jsonl, train.jsonl), not --file");
    if (o->greedy && o->sample) usage_exit("--greedy and --sample exclude each other");
    eval_opts eo = {0};
    eo.what = "gsm8k";
    eo.out = o->out;
    eo.limit = (int)o->limit;
    eo.progress = 1;
    eo.tty = isatty(2);
    eo.data = o->data;
    eo.summary = o->summary;
    /* canonical path in the configuration key, so that a rerun spelling the directory differently resumes */
    char model_real[PATH_MAX];
    eo.model_dir = o->model ? o->model : default_model();
    if (realpath(eo.model_dir, model_real)) eo.model_dir = model_real;
    eo.gen_kwargs = o->gen_kwargs;
    eo.chat = o->chat;
    eo.shots = o->shots_set ? o->shots : -1;
    eo.reference_kernels = o->ref;
    eo.seed = o->seed_set ? o->seed : 42; /* vLLM's harness default */
    gsm8k_inputs in;
    if (dg_cli_gsm8k_load(&eo, &in)) return 1; /* data errors before the (slow) model load */
    dg_model *m = load_model(o, 1);
    eo.gen = gen_params(m, o);
    char *kw = gen_kwargs_key(o);
    if (kw) eo.gen_kwargs = kw;
    if (!o->max_new_set) eo.gen.max_new_tokens = 256; /* vLLM's harness: max_tokens 256 */
    /* vLLM's harness samples at temperature 0: argmax proposals (spec 6.3) unless --sample */
    eo.gen.proposal = o->sample ? DG_PROPOSAL_SAMPLE : DG_PROPOSAL_ARGMAX;
    int rc = dg_cli_gsm8k(m, &eo, &in);
    cJSON_free(kw);
    gsm8k_set_free(&in.test);
    gsm8k_set_free(&in.train);
    dg_model_free(m);
    return rc;
  }
  if (!o->positional || !o->file) usage_exit("eval needs gsm8k, or problems|text and --file F.jsonl");
  if (o->summary || o->chat || o->shots_set || o->data || o->sample)
    usage_exit("--summary, --chat, --shots, --data and --sample are options of eval gsm8k, not of eval problems|text");
  dg_model *m = load_model(o, 1);
  eval_opts eo = {.what = o->positional, .file = o->file, .out = o->out, .gen = gen_params(m, o),
                  .seed = o->seed_set ? o->seed : 0, .limit = (int)o->limit, .progress = isatty(2), .shots = -1,
                  .gen_kwargs = o->gen_kwargs, .reference_kernels = o->ref};
  /* canonical model path in the configuration key of `eval problems -o` (resume) */
  char model_real[PATH_MAX];
  eo.model_dir = o->model ? o->model : default_model();
  if (realpath(eo.model_dir, model_real)) eo.model_dir = model_real;
  char *kw = gen_kwargs_key(o);
  if (kw) eo.gen_kwargs = kw;
  int rc = dg_cli_eval(m, &eo);
  cJSON_free(kw);
  dg_model_free(m);
  return rc;
}

static int cmd_bench(const opts *o) {
  no_positional(o, "bench");
  bench_opts bo = {0};
  bo.model_dir = o->model ? o->model : default_model();
  bo.protocol = o->protocol;
  bo.reps = o->reps;
  bo.warmup = o->warmup - 1; /* stored + 1 so that 0 means "not given" (-1: the default) */
  bo.prompt_tokens = o->prompt_tokens;
  bo.gen_tokens = o->max_new_set ? (int)o->max_new : 0;
  bo.out = o->out;
  bo.seed = o->seed_set ? (uint64_t)o->seed : 0;
  bo.tty = isatty(2);
  bo.canvases = o->canvases;
  bo.gen_kwargs = o->gen_kwargs;
  bo.rows = o->rows;
  bo.formats = o->formats;
  bo.moe_tokens = o->moe_tokens;
  bo.quick = o->quick;
  bo.n_threads = o->threads;
  bo.device = o->device;
  bo.cuda_device = o->cuda_device;
  char err[256];
  if (bench_check_opts(&bo, err, sizeof err)) { /* before the model loads */
    fprintf(stderr, "dgemma bench: %s\n", err);
    return 2;
  }
  /* the ceiling sweep needs no model (it builds its own matrices at the MoE's shapes) */
  dg_model *m = o->protocol && !strcmp(o->protocol, "ceiling") ? NULL : load_model(o, 1);
  int rc = dg_cli_bench(m, &bo);
  dg_model_free(m);
  return rc;
}

/* ---- quantize -------------------------------------------------------------- */

typedef struct bar_state { int tty; int last; } bar_state;

/* A progress bar on stderr (redrawn in place on a terminal, else one line per 10%). */
static int quant_progress(int64_t done, int64_t total, const char *tensor, void *ud) {
  bar_state *b = ud;
  int pct = total > 0 ? (int)(100.0 * (double)done / (double)total) : 100;
  if (b->tty) {
    char bar[41];
    int fill = pct * 40 / 100;
    for (int i = 0; i < 40; i++) bar[i] = i < fill ? '#' : '.';
    bar[40] = 0;
    fprintf(stderr, "\r[%s] %3d%% %-60.60s", bar, pct, tensor);
    if (done >= total) fprintf(stderr, "\n");
  } else if (pct / 10 != b->last / 10 || done >= total) {
    fprintf(stderr, "%3d%% %s\n", pct, tensor);
  }
  b->last = pct;
  return 0;
}

/* The progress bar, and a stop after SIGINT/SIGTERM (the library then removes its temporary directory). */
static int mk_progress(int64_t done, int64_t total, const char *tensor, void *ud) {
  quant_progress(done, total, tensor, ud);
  return g_stop_sig != 0;
}

/* dgemma mkrandom OUT_DIR: dg_mkrandom with a progress bar, then what was written. */
static int cmd_mkrandom(const opts *o) {
  if (!o->positional) usage_exit("mkrandom needs OUT_DIR");
  dg_mkrandom_params mp = dg_mkrandom_default_params();
  if (o->config) mp.config = o->config;
  mp.source_dir = o->source;
  if (o->bits) mp.bits = o->bits;
  if (o->group_size) mp.group_size = o->group_size;
  mp.recipe = o->recipe;
  mp.seed = o->seed_set ? (uint64_t)o->seed : 0;
  mp.n_threads = o->threads;
  mp.dry_run = o->dry_run;
  if (mp.n_threads <= 0) {
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    mp.n_threads = nc > 0 ? (int)nc : 1;
  }
  bar_state bs = {isatty(2), -1};
  mp.progress = mk_progress;
  mp.user_data = &bs;
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  dg_mkrandom_result r;
  dg_status st = dg_mkrandom(o->positional, &mp, &r);
  if (st == DG_ERR_ABORTED && g_stop_sig) {
    fprintf(stderr, "\ndgemma: mkrandom: interrupted (%s); nothing was left in %s\n", strsignal(g_stop_sig),
            o->positional);
    return 128 + g_stop_sig;
  }
  if (st) die("mkrandom", st);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  fprintf(stderr,
          "dgemma: %s%s: %.3f %s parameters (config %s, seed %llu), %d tensors, %d matrices quantized, %d kept in bf16 "
          "(input dim not a multiple of the group size), %.2f GB in %d shard(s), %d tokenizer file(s) copied, "
          "%.1f s\n",
          o->positional, mp.dry_run ? " (dry run, nothing written)" : "",
          r.n_params >= 1e9 ? r.n_params / 1e9 : r.n_params / 1e6, r.n_params >= 1e9 ? "B" : "M", mp.config, (unsigned long long)mp.seed, r.n_tensors, r.n_quantized,
          r.n_indivisible, r.bytes_out / 1e9, r.n_shards, r.n_copied,
          (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
  return 0;
}

static int cmd_quantize(const opts *o) {
  if (!o->positional || !o->positional2) usage_exit("quantize needs IN_DIR and OUT_DIR");
  dg_quantize_params qp = dg_quantize_default_params();
  if (o->bits) qp.bits = o->bits;
  if (o->group_size) qp.group_size = o->group_size;
  qp.recipe = o->recipe;
  qp.n_threads = o->threads;
  if (qp.n_threads <= 0) {
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    qp.n_threads = nc > 0 ? (int)nc : 1;
  }
  bar_state bs = {isatty(2), -1};
  qp.progress = mk_progress;
  qp.user_data = &bs;
  dg_quantize_result r;
  dg_status st = dg_quantize(o->positional, o->positional2, &qp, &r);
  if (st == DG_ERR_ABORTED && g_stop_sig) {
    fprintf(stderr, "\ndgemma: quantize: interrupted (%s); nothing was left in %s\n", strsignal(g_stop_sig),
            o->positional2);
    return 128 + g_stop_sig;
  }
  if (st) die("quantize", st);
  fprintf(stderr,
          "dgemma: %d matrices quantized, %d kept in float by the recipe, %d kept in float (input dim not a multiple "
          "of the group size); %.2f MB -> %.2f MB in %d shard(s): %s\n",
          r.n_quantized, r.n_kept_float, r.n_indivisible, r.bytes_in / 1e6, r.bytes_out / 1e6, r.n_shards,
          o->positional2);
  return 0;
}

int main(int argc, char **argv) {
  if (argc < 2) usage_exit(NULL);
  opts o;
  const char *cmd = argv[1];
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) usage_exit(NULL);
  if (!strcmp(cmd, "--version")) { printf("dgemma %s\n", DGEMMA_VERSION); return close_stdout(0); }
  if (!strcmp(cmd, "serve")) return close_stdout(dg_cli_serve(argc - 1, argv + 1, default_model()));
  parse_opts(argc, argv, &o);
  /* every command's standard output is checked at the end (close_stdout) */
  if (!strcmp(cmd, "run")) return close_stdout(cmd_run(&o));
  if (!strcmp(cmd, "info")) return close_stdout(cmd_info(&o));
  if (!strcmp(cmd, "tokenize")) return close_stdout(cmd_tokenize(&o));
  if (!strcmp(cmd, "logits")) return close_stdout(cmd_logits(&o));
  if (!strcmp(cmd, "replay")) return close_stdout(cmd_replay(&o));
  if (!strcmp(cmd, "eval")) return close_stdout(cmd_eval(&o));
  if (!strcmp(cmd, "bench")) return close_stdout(cmd_bench(&o));
  if (!strcmp(cmd, "quantize")) { catch_stop_signals(0); return close_stdout(cmd_quantize(&o)); }
  if (!strcmp(cmd, "mkrandom")) { catch_stop_signals(0); return close_stdout(cmd_mkrandom(&o)); }
  if (!strcmp(cmd, "qreport")) {
    no_positional(&o, "qreport");
    qreport_opts qo = {o.recipes, o.bits, o.group_size, o.threads, o.seed_set ? (uint64_t)o.seed : 0};
    return close_stdout(dg_cli_qreport(o.model ? o.model : default_model(), &qo));
  }
  fprintf(stderr, "dgemma: unknown command \"%s\"\n", cmd);
  usage_exit(NULL);
  return 2;
}
