/* dgemma.c: the command-line tool. The only place that prints and exits.
 *
 *   dgemma run      [-m DIR] -p PROMPT   generate (chat template, streamed); -f FILE, -p -, a pipe
 *   dgemma chat     [-m DIR]             multi-turn chat in the terminal (KV cache kept between turns)
 *   dgemma info     [-m DIR]             model summary
 *   dgemma tokenize [-m DIR] TEXT        ids (--pieces: and pieces) of TEXT (no BOS)
 *   dgemma detokenize [-m DIR] IDS       text of ids
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
 * `dgemma CMD --help` prints CMD's help (kCommands); each command accepts only
 * its own options (kOptions). Without -m the bundled small model is used
 * ($DGEMMA_MODEL, else models/dgemma-small next to the executable's ../, else
 * ./models/dgemma-small). */
#include <ctype.h>
#include <errno.h>
#include <sched.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <omp.h>
#include <signal.h>
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifdef DG_HAVE_LIBEDIT
#include <editline/readline.h>
#endif

#include "dgemma.h"
#include "dgemma_tools.h"
#include "bench.h"
#include "cliarg.h"
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

/* ---- commands, their options and their help ---------------------------------
 *
 * Every command has its own help (`dgemma CMD --help`, `dgemma help CMD`: on
 * stdout, exit 0) and its own set of options: an option of another command is
 * refused with a one-line hint (exit 2), as an unknown one is. Usage errors
 * print one line and the hint to stderr and exit 2. */

enum {
  C_RUN = 1 << 0, C_INFO = 1 << 1, C_TOKENIZE = 1 << 2, C_DETOKENIZE = 1 << 3, C_LOGITS = 1 << 4,
  C_REPLAY = 1 << 5, C_EVAL = 1 << 6, C_BENCH = 1 << 7, C_QUANTIZE = 1 << 8, C_MKRANDOM = 1 << 9,
  C_QREPORT = 1 << 10, C_CHAT = 1 << 11
};
#define C_LOADS (C_RUN | C_CHAT | C_INFO | C_TOKENIZE | C_DETOKENIZE | C_LOGITS | C_REPLAY | C_EVAL | C_BENCH | C_QREPORT)
#define C_FORWARD (C_RUN | C_CHAT | C_INFO | C_LOGITS | C_REPLAY | C_EVAL | C_BENCH)
#define C_ALL 0xfff

static const char kModelHelp[] =
    "  -m, --model DIR          Hugging Face DiffusionGemma directory (default: $DGEMMA_MODEL, else the bundled\n"
    "                           models/dgemma-small)\n";
static const char kForwardHelp[] =
    "  -t, --threads N          CPU threads (default, and 0: the cores available; more are capped with a warning)\n"
    "      --ref                the scalar fp32 oracle kernels (slow; for checking)\n"
    "      --device cpu|cuda[:N] where the forward pass runs (default cpu)\n";

typedef struct command {
  const char *name;
  unsigned bit;
  const char *summary; /* one line of `dgemma --help` */
  const char *usage;   /* the help's first lines */
  const char *options; /* its option list (the shared parts are appended per flags) */
  int model_opts, forward_opts; /* append kModelHelp / kForwardHelp */
} command;

static const command kCommands[] = {
    {"run", C_RUN, "generate text (chat template, streamed to stdout)",
     "usage: dgemma run [options] -p PROMPT | -p - | -f FILE | < FILE\n"
     "\n"
     "Generates an answer to PROMPT with the model's chat template and streams it to stdout block by\n"
     "block; a summary (prefill time, generation tok/s, denoising steps) goes to stderr. Without -p or\n"
     "-f the prompt is read from standard input when it is not a terminal (`echo hi | dgemma run`).\n"
     "A prompt read from a file or stdin loses one trailing newline.\n",
     "  -p, --prompt TEXT        the user message; \"-\" reads it from standard input\n"
     "  -f, --file FILE          read the user message from FILE (\"-\": standard input)\n"
     "      --system TEXT        a system message\n"
     "      --think              enable thinking in the chat template\n"
     "      --raw                PROMPT is raw text: no chat template, no BOS (excludes --system, --think)\n"
     "  -n, --max-new-tokens N   tokens to generate, rounded up to whole canvases (default: the model's\n"
     "                           generation_config, 256)\n"
     "  -s, --steps N            at most N denoising steps per canvas (default 48)\n"
     "      --temp T             temperature: the sampler's linear schedule runs from T down to\n"
     "                           T * t_min/t_max over the denoising steps (the checkpoint's 0.8 -> 0.4, so\n"
     "                           --temp 1 gives 1.0 -> 0.5); --temp 0 = argmax proposals (--greedy)\n"
     "      --greedy             argmax proposals instead of sampling\n"
     "      --seed N             random seed (default 0: runs are reproducible)\n"
     "      --stop STRING        end the answer before the first STRING (repeatable; the text shown stops\n"
     "                           there and generation ends after the block that holds it)\n"
     "      --json               print one JSON object instead of streaming: text, tokens, blocks, steps,\n"
     "                           timings, finish_reason\n"
     "      --gen-kwargs JSON    any generation_config field, e.g. '{\"entropy_bound\": 0.2}', or the turbo\n"
     "                           engine: '{\"diffusion_turbo\": true, \"turbo_accept\": \"confidence\"}' (README)\n"
     "  -v, --verbose            show the canvas as it denoises (stderr)\n",
     1, 1},
    {"chat", C_CHAT, "talk with the model in the terminal, turn after turn",
     "usage: dgemma chat [-m DIR] [options]\n"
     "\n"
     "Multi-turn chat: type a message, the answer streams back. The conversation stays in the KV\n"
     "cache (each turn prefills only its new tokens). /reset forgets it, /system TEXT sets the\n"
     "system message and starts over, /quit or Ctrl-D leaves, Ctrl-C stops the current answer (that\n"
     "turn is forgotten). Without a terminal, every line of standard input is a message.\n",
     "  -c, --ctx-size N         positions of the conversation (default 8192; more than the model's\n"
     "                           max_position_embeddings is capped there, with a warning)\n"
     "      --system TEXT        a system message\n"
     "  -n N, -s STEPS, --temp T, --greedy, --seed S, --gen-kwargs JSON   per answer, as for run\n",
     1, 1},
    {"info", C_INFO, "print the model configuration",
     "usage: dgemma info [-m DIR] [--device cuda[:N]]\n"
     "\n"
     "Prints the model's shapes, weights, maximum context and generation defaults. With --device cuda\n"
     "it also reports the GPU and checks one decoder step there against the CPU (exit 1 if they differ).\n",
     "", 1, 1},
    {"tokenize", C_TOKENIZE, "print the ids (or pieces) of a text",
     "usage: dgemma tokenize [-m DIR] [--special] [--pieces] TEXT | -p TEXT | -p - | -f FILE | < FILE\n"
     "\n"
     "Prints the comma-separated ids of TEXT (no BOS added); with --pieces one line per token,\n"
     "\"ID<TAB>PIECE\" (the vocabulary's string: \"\xe2\x96\x81\" marks a space, <0x0A> a byte; a newline,\n"
     "tab, CR, backslash or other control character in a piece is written \\n, \\t, \\r, \\\\, \\xNN).\n",
     "  -p, --prompt TEXT        the text (\"-\": standard input); or TEXT as the argument\n"
     "  -f, --file FILE          read the text from FILE, kept as is (\"-\": standard input)\n"
     "      --special            parse control tokens written in the text (<|turn>, <turn|>, ...)\n"
     "      --pieces             one \"ID<TAB>PIECE\" line per token\n",
     1, 0},
    {"detokenize", C_DETOKENIZE, "print the text of a list of ids",
     "usage: dgemma detokenize [-m DIR] [--special] IDS | < FILE\n"
     "\n"
     "Decodes ids (separated by commas, spaces or newlines: the output of `dgemma tokenize`) to text.\n"
     "Without IDS they are read from standard input.\n",
     "      --special            keep special tokens (by name) instead of dropping them\n", 1, 0},
    {"logits", C_LOGITS, "write decoder logits [canvas, vocab] as float32 (parity)",
     "usage: dgemma logits [-m DIR] --prompt-ids LIST|@FILE --canvas-ids LIST|@FILE [--sc-logits F] -o FILE\n"
     "\n"
     "One encoder pass over the prompt, one decoder step over the canvas; writes the logits as\n"
     "little-endian float32 [canvas_length, vocab] (docs/parity.md).\n",
     "      --prompt-ids LIST|@FILE   prompt ids: comma-separated, or @file of int32\n"
     "      --canvas-ids LIST|@FILE   canvas ids (canvas_length of them)\n"
     "      --sc-logits FILE          previous step's processed logits [C,V] float32 (self-conditioning)\n"
     "  -o, --out FILE                output file (written whole or not at all; \"-\": standard output)\n",
     1, 1},
    {"replay", C_REPLAY, "generate from injected random canvases/uniforms, print the ids (parity)",
     "usage: dgemma replay [-m DIR] --prompt-ids LIST|@FILE --canvases FILE [--uniforms FILE] [options]\n"
     "\n"
     "Generation with every random canvas read from --canvases (int32, canvas_length each, in draw\n"
     "order) and proposals by argmax or, with --uniforms, by inverse CDF (docs/parity.md).\n",
     "      --prompt-ids LIST|@FILE   prompt ids\n"
     "      --canvases [@]FILE        int32 canvases, C ids each, in draw order\n"
     "      --uniforms [@]FILE        float32 uniforms, C per step (else argmax proposals)\n"
     "  -n, --max-new-tokens N, -s, --steps N, --seed N, --greedy, --gen-kwargs JSON   as for run\n",
     1, 1},
    {"eval", C_EVAL, "GSM8K (vLLM harness) or held-out problems/text of the small model",
     "usage: dgemma eval gsm8k [-m DIR] [--data DIR] [--chat] [--shots K] [--limit N] [-o items.jsonl]\n"
     "       dgemma eval problems|text [-m DIR] -f F.jsonl [--limit N] [-o items.jsonl]\n"
     "\n"
     "Scores a model (docs/eval.md). gsm8k: 5-shot Question:/Answer: prompts (or --chat, zero-shot),\n"
     "answer = last integer, accuracy with a Wilson interval; -o keeps one line per item, a rerun\n"
     "resumes. problems|text: the inputs tools/smallmodel/eval_hf.py writes.\n",
     "      --data DIR           gsm8k: test.jsonl and train.jsonl (default ../shared/data/gsm8k)\n"
     "      --chat               gsm8k: zero-shot with the chat template\n"
     "      --shots K            gsm8k: few-shot examples (default 5)\n"
     "      --sample             gsm8k: sample proposals (default: argmax, vLLM's temperature 0)\n"
     "      --summary FILE       gsm8k: write the summary as JSON\n"
     "  -f, --file F.jsonl       problems|text: the input file\n"
     "      --limit N            the first N items\n"
     "  -o, --out FILE           per-item JSON lines (resumed by a rerun)\n"
     "  -n N, -s STEPS, --seed S, --greedy, --gen-kwargs JSON   as for run\n",
     1, 1},
    {"bench", C_BENCH, "throughput protocols against measured floors",
     "usage: dgemma bench [-m DIR] [--protocol vllm|p512|batch|step|ceiling|all] [options]\n"
     "\n"
     "vllm: a prompt of 4 canvases, 4 canvases generated, 16 fixed steps each (vLLM's 1024 in, 1024\n"
     "out at the 26B's canvas of 256; 256/256 for the bundled model's 64); p512: three chat prompts,\n"
     "512 generated tokens; batch: B canvases per forward (turbo engine); step: the prefill of P prompt\n"
     "tokens and the decoder step after it, for each P of --contexts; ceiling: the matrix kernels\n"
     "at the 26B's MoE shapes (no model needed). Each row is printed against a floor measured in the\n"
     "same command (docs/eval.md). The options are checked before anything is measured.\n",
     "      --protocol P         vllm, p512, batch, step, ceiling or all (default all: vllm, p512, batch)\n"
     "      --reps N, --warmup N timed repetitions and warm-up runs\n"
     "  -o, --out FILE           one JSON line per row\n"
     "      --prompt-tokens P    vllm: prompt length (default 4 canvases)\n"
     "  -n N                     tokens generated (default: vllm 4 canvases, p512 512, batch 4 canvases)\n"
     "      --seed S             random seed\n"
     "      --canvases 1,2,4,8   batch: the B values\n"
     "      --contexts 1024,...  step: the prompt lengths P (default 1024)\n"
     "      --gen-kwargs JSON    batch: generation settings (the other protocols fix theirs)\n"
     "      --rows 1,2,...,256, --formats bf16,8,4,3,2, --moe-tokens 256, --quick   ceiling sweep\n"
     "      --profile            vllm, p512, batch, step on --device cuda: one more run (batch: of each B; step:\n"
     "                           the first P's prefill) split into stages (GPU ms each)\n",
     1, 1},
    {"quantize", C_QUANTIZE, "MLX affine quantization of a float checkpoint",
     "usage: dgemma quantize IN_DIR OUT_DIR [--bits B] [--group-size G] [--recipe SPEC] [-t N]\n"
     "\n"
     "Writes an MLX affine-quantized copy of IN_DIR (docs/quantization.md). SPEC is a comma-separated\n"
     "list of CLASS=BITS, CLASS=BITS:GROUP or CLASS=bf16, CLASS one of embed, attn, mlp, router,\n"
     "experts, sc, all; the item mlx is mlx-vlm's layout. Example: \"mlx,experts=3\".\n",
     "      --bits B             default bits, 2..8 (default 4)\n"
     "      --group-size G       default group size 32, 64 or 128 (default 64)\n"
     "      --recipe SPEC        per-class bits (above)\n"
     "  -t, --threads N          CPU threads (default, and 0: every online core)\n",
     0, 0},
    {"mkrandom", C_MKRANDOM, "a random-weight checkpoint (26B-A4B shapes by default)",
     "usage: dgemma mkrandom OUT_DIR [--config real|small|FILE.json] [--source DIR] [--seed S] [options]\n"
     "\n"
     "Random weights drawn as Transformers initialises them, streamed to disk (docs/cuda.md). Default:\n"
     "the 26B-A4B config, experts 4-bit group 64, the rest bf16 (17.7 GB). --config small has a\n"
     "1024-id vocabulary that no tokenizer matches: the commands of text (run, chat, tokenize,\n"
     "detokenize, eval, bench, serve, qreport) refuse it; info, logits and replay work on ids.\n",
     "      --config C           real (default), small, or a config.json file\n"
     "      --source DIR         copy the tokenizer files from DIR\n"
     "      --seed S             reproducible byte for byte (any thread count)\n"
     "      --bits B, --group-size G, --recipe SPEC   as for quantize (default: experts only)\n"
     "      --dry-run            sizes only, nothing written\n"
     "  -t, --threads N          CPU threads (default, and 0: every online core)\n",
     0, 0},
    {"qreport", C_QREPORT, "quantization quality: KL and top-1 vs the float model",
     "usage: dgemma qreport [-m DIR] [--recipes \"R1;R2;...\"] [--bits B] [--group-size G] [-t N]\n"
     "\n"
     "Quantizes the model with each recipe in memory and compares its logits with the float model's.\n",
     "      --recipes \"R1;R2\"    recipes to compare (default: a standard set)\n"
     "      --bits B, --group-size G   defaults of the recipes\n"
     "      --seed S             random seed of the inputs\n"
     "  -t, --threads N          CPU threads (default, and 0: every online core)\n",
     1, 0},
};
#define N_COMMANDS ((int)(sizeof kCommands / sizeof kCommands[0]))

/* Every option: its spellings and the commands that take it. */
typedef struct option_def { const char *s, *l; unsigned cmds; } option_def;
static const option_def kOptions[] = {
    {"-m", "--model", C_LOADS},
    {"-p", "--prompt", C_RUN | C_TOKENIZE},
    {"-f", "--file", C_RUN | C_TOKENIZE | C_EVAL},
    {NULL, "--system", C_RUN | C_CHAT},
    {NULL, "--think", C_RUN},
    {NULL, "--raw", C_RUN},
    {NULL, "--stop", C_RUN},
    {NULL, "--temp", C_RUN | C_CHAT},
    {NULL, "--json", C_RUN},
    {"-n", "--max-new-tokens", C_RUN | C_CHAT | C_REPLAY | C_EVAL | C_BENCH},
    {"-s", "--steps", C_RUN | C_CHAT | C_REPLAY | C_EVAL},
    {NULL, "--seed", C_RUN | C_CHAT | C_REPLAY | C_EVAL | C_BENCH | C_MKRANDOM | C_QREPORT},
    {"-t", "--threads", C_FORWARD | C_QUANTIZE | C_MKRANDOM | C_QREPORT},
    {NULL, "--ref", C_FORWARD},
    {NULL, "--device", C_FORWARD},
    {NULL, "--greedy", C_RUN | C_CHAT | C_REPLAY | C_EVAL},
    {NULL, "--special", C_TOKENIZE | C_DETOKENIZE},
    {NULL, "--pieces", C_TOKENIZE},
    {NULL, "--gen-kwargs", C_RUN | C_CHAT | C_REPLAY | C_EVAL | C_BENCH},
    {"-v", "--verbose", C_RUN},
    {NULL, "--prompt-ids", C_LOGITS | C_REPLAY},
    {NULL, "--canvas-ids", C_LOGITS},
    {NULL, "--sc-logits", C_LOGITS},
    {"-o", "--out", C_LOGITS | C_EVAL | C_BENCH},
    {NULL, "--canvases", C_REPLAY | C_BENCH},
    {NULL, "--uniforms", C_REPLAY},
    {NULL, "--data", C_EVAL},
    {NULL, "--summary", C_EVAL},
    {NULL, "--chat", C_EVAL},
    {NULL, "--sample", C_EVAL},
    {NULL, "--shots", C_EVAL},
    {NULL, "--limit", C_EVAL},
    {NULL, "--protocol", C_BENCH},
    {NULL, "--rows", C_BENCH},
    {NULL, "--formats", C_BENCH},
    {NULL, "--moe-tokens", C_BENCH},
    {NULL, "--quick", C_BENCH},
    {NULL, "--profile", C_BENCH},
    {NULL, "--reps", C_BENCH},
    {NULL, "--warmup", C_BENCH},
    {NULL, "--prompt-tokens", C_BENCH},
    {NULL, "--contexts", C_BENCH},
    {NULL, "--bits", C_QUANTIZE | C_MKRANDOM | C_QREPORT},
    {NULL, "--group-size", C_QUANTIZE | C_MKRANDOM | C_QREPORT},
    {NULL, "--recipe", C_QUANTIZE | C_MKRANDOM},
    {NULL, "--recipes", C_QREPORT},
    {NULL, "--config", C_MKRANDOM},
    {NULL, "--source", C_MKRANDOM},
    {NULL, "--dry-run", C_MKRANDOM},
    {"-h", "--help", C_ALL},
    {NULL, "--version", C_ALL},
    {"-c", "--ctx-size", C_CHAT},
};

static const command *g_cmd; /* the command being run (NULL before it is known) */

static const command *find_command(const char *name) {
  for (int k = 0; k < N_COMMANDS; k++)
    if (!strcmp(kCommands[k].name, name)) return &kCommands[k];
  return NULL;
}

/* `dgemma --help`: the commands, the environment, where to read more. */
static void global_help(FILE *f) {
  fprintf(f,
          "usage: dgemma COMMAND [options]     (dgemma COMMAND --help: that command's options)\n"
          "\n"
          "Block-diffusion generation with DiffusionGemma models, on the CPU or an NVIDIA GPU.\n"
          "Example: dgemma run -p \"Why is the sky blue?\"   (or: echo \"Why?\" | dgemma run)\n"
          "\n"
          "commands:\n");
  for (int k = 0; k < N_COMMANDS; k++) fprintf(f, "  %-11s %s\n", kCommands[k].name, kCommands[k].summary);
  fprintf(f, "  %-11s %s\n", "serve", "OpenAI-compatible HTTP server with continuous batching (README, Serving)");
  fprintf(f,
          "\n"
          "  --version   print the version (any command accepts it)\n"
          "\n"
          "environment:\n"
          "  DGEMMA_MODEL      the model used without -m (default: the bundled models/dgemma-small, a 9.9 M\n"
          "                    parameter demo model whose arithmetic is weak; docs/small-model.md)\n"
          "  OMP_WAIT_POLICY   dgemma sets \"passive\" unless it is set (idle threads sleep: spinning ones are\n"
          "                    many times slower on a shared machine); \"active\" may help on an idle one\n"
          "  OMP_NUM_THREADS   the default of -t (more than the cores available is capped, as -t is)\n"
          "  DGEMMA_KERNELS    ref, avx2 or avx512: force a CPU kernel set (default: the best available);\n"
          "                    avx512lp: the lossy AVX-512 BF16/VNNI products (opt-in, where the CPU has them)\n"
          "                    avx2lp: the lossy AVX2 int8 (vpmaddubsw) quantized products (opt-in)\n"
          "  DGEMMA_API_KEY    the key `dgemma serve` requires without --api-key (\"Authorization: Bearer KEY\")\n"
          "  DGEMMA_CUDA_SYNC=1, DGEMMA_CUDA_MEM_LIMIT=BYTES   CUDA debugging, GPU sharing (README)\n");
}

static void command_help(const command *c, FILE *f) {
  fprintf(f, "%s\noptions:\n%s%s%s", c->usage, c->options, c->model_opts ? kModelHelp : "",
          c->forward_opts ? kForwardHelp : "");
  fprintf(f, "  -h, --help               this help\n");
}

/* A usage error: one line naming the problem and where the help is; exit 2. */
static void usage_exit(const char *msg) {
  if (g_cmd) {
    fprintf(stderr, "dgemma %s: %s; see `dgemma %s --help`\n", g_cmd->name, msg, g_cmd->name);
  } else {
    fprintf(stderr, "dgemma: %s; see `dgemma --help`\n", msg);
  }
  exit(2);
}

/* ---- small helpers ------------------------------------------------------- */

/* s for a one-line message (cli_quote: control characters escaped, cut after
 * 100 bytes); four calls' results can be used at once. */
static const char *q(const char *s) {
  static char buf[4][448];
  static int k;
  k = (k + 1) % 4;
  return cli_quote(s, 100, buf[k], sizeof buf[k]);
}

/* Whole file (a leading '@' is accepted and skipped), or exit naming the file and the reason. */
/* The whole of FILE (or @FILE) into one malloc'd buffer, at most max bytes: a larger file (or a device such as
 * /dev/zero, which never ends) is refused with a message naming the file, the option and the limit, instead of
 * growing the buffer until the allocation fails or the OOM killer ends the process (exit 2, as a file of the wrong
 * size); a file that cannot be opened or read exits 1. */
static void *read_all(const char *path, size_t *len, size_t max, const char *option) {
  if (path[0] == '@') path++;
  FILE *f = fopen(path, "rb");
  if (!f) { fprintf(stderr, "dgemma: cannot open %s: %s\n", path, strerror(errno)); exit(1); }
  size_t cap = 1 << 16, n = 0, k;
  char *buf = malloc(cap);
  while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
    n += k;
    if (n > max) {
      fprintf(stderr, "dgemma: %s holds more than %zu bytes, the most %s reads\n", path, max, option);
      exit(2); /* bad input, as a file of the wrong size */
    }
    if (n == cap) {
      size_t grow = cap > max / 2 ? max + 1 : 2 * cap; /* one byte past max shows a file that is too long */
      char *nb = realloc(buf, grow);
      if (!nb) { free(buf); buf = NULL; }
      buf = nb;
      cap = grow;
    }
  }
  if (!buf || ferror(f)) { fprintf(stderr, "dgemma: cannot read %s: %s\n", path, buf ? strerror(errno) : "out of memory"); exit(1); }
  fclose(f);
  *len = n;
  return buf;
}

/* read_all's limits: an id list (--prompt-ids/--canvas-ids @FILE) of at most 16 M int32 ids, past any context a
 * model here has; replay's canvases and uniforms 256 MiB (a 1,024-token replay of the 26B at 256 steps per block
 * records 4 MiB of canvases) */
#define CLI_IDS_MAX ((size_t)64 << 20)
#define CLI_REPLAY_MAX ((size_t)256 << 20)

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
    if (!arg[1]) usage_exit("an @FILE id list needs a file name after the @");
    size_t len;
    int32_t *ids = read_all(arg, &len, CLI_IDS_MAX, "an @FILE id list");
    if (len % 4) { fprintf(stderr, "dgemma: %s: size %zu is not a multiple of 4 (int32)\n", arg + 1, len); exit(1); }
    *n = len / 4;
    return ids;
  }
  size_t cap = 16, cnt = 0;
  int32_t *ids = malloc(cap * sizeof *ids);
  const char *p = arg;
  while (*p == ' ') p++;
  while (*p) { /* ids separated by one comma or by spaces: "1,,2", a sign, a trailing comma are refused */
    char *end = (char *)p;
    errno = 0;
    long v = *p == '-' || (*p >= '0' && *p <= '9') ? strtol(p, &end, 10) : 0;
    if (end == p || errno || v < INT32_MIN || v > INT32_MAX) {
      char msg[512];
      snprintf(msg, sizeof msg, "bad id list near \"%s\" (decimal ids separated by one comma)", q(p));
      free(ids); /* usage_exit does not return: nothing left for LeakSanitizer to report */
      usage_exit(msg);
    }
    if (cnt == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
    ids[cnt++] = (int32_t)v;
    p = end;
    while (*p == ' ') p++;
    if (*p == ',') {
      p++;
      while (*p == ' ') p++;
      if (!*p) {
        free(ids);
        usage_exit("bad id list: it ends with a comma (decimal ids separated by one comma)");
      }
    } else if (*p && (end == p)) { /* "1x": no separator */
      char msg[512];
      snprintf(msg, sizeof msg, "bad id list near \"%s\" (decimal ids separated by one comma)", q(p));
      free(ids);
      usage_exit(msg);
    }
  }
  *n = cnt;
  return ids;
}

/* $DGEMMA_MODEL when set and not empty, else NULL (the one reader of the variable). */
static const char *env_model(void) {
  const char *env = getenv("DGEMMA_MODEL");
  return env && *env ? env : NULL;
}

static const char *default_model(void) {
  static char buf[PATH_MAX + 64];
  const char *env = env_model();
  if (env) return env;
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

#define DG_CLI_MAX_STOPS 16

typedef struct opts {
  const char *model, *prompt, *system, *gen_kwargs, *prompt_ids, *canvas_ids, *sc_logits, *out, *canvases, *uniforms, *contexts;
  const char *file, *recipe, *recipes, *config, *source;
  long long ctx_size;              /* chat -c */
  const char *data, *summary, *protocol;
  const char *rows, *formats, *moe_tokens; /* bench --protocol ceiling */
  int quick;
  int profile; /* bench --profile */
  int chat, sample, shots_set, shots, reps, warmup, prompt_tokens;
  int bits, group_size;
  const char *positional2;
  int threads, ref, think, raw, verbose, greedy, special, dry_run;
  int pieces, json;                /* tokenize --pieces, run --json */
  const char *stops[DG_CLI_MAX_STOPS]; /* run --stop, in the order given */
  int n_stops;
  double temp;                     /* run --temp */
  int temp_set;
  int device, cuda_device; /* dg_device and CUDA ordinal (--device) */
  long long max_new, steps, seed, limit;
  int max_new_set, steps_set, seed_set;
  const char *positional;
} opts;

/* An integer option in [lo, hi]; anything else is a usage error naming the option. */
static long long parse_int(const char *s, const char *name, long long lo, long long hi) {
  long long v;
  if (cli_parse_ll(s, lo, hi, &v)) { /* decimal only: no "0x10", no white space, nothing after */
    char msg[640];
    snprintf(msg, sizeof msg, "%s expects an integer in [%lld, %lld], got \"%s\"%s", name, lo, hi, q(s),
             s[0] == '+' ? " (write it without the + sign)" : "");
    usage_exit(msg);
  }
  return v;
}

/* The value of an option that names a file or directory: an empty one ("-o ''", a variable that was
 * not set) is a usage error naming the option, before a model loads. */
static const char *nonempty(const char *v, const char *name, const char *what) {
  if (!*v) {
    char msg[256];
    snprintf(msg, sizeof msg, "%s needs %s, got an empty string", name, what);
    usage_exit(msg);
  }
  return v;
}

static void parse_opts(int argc, char **argv, opts *o) {
  memset(o, 0, sizeof *o);
  char msg[768];
  int only_args = 0; /* after "--": every word is an argument */
  for (int i = 2; i < argc; i++) {
    const char *a = argv[i];
    /* --name=value (getopt_long's spelling) is --name value; eq is the value, taken by ARG() */
    char name[64];
    const char *eq = NULL;
    int eq_used = 0;
    const char *e = !only_args && a[0] == '-' && a[1] == '-' ? strchr(a, '=') : NULL;
    if (e && (size_t)(e - a) < sizeof name) {
      memcpy(name, a, (size_t)(e - a));
      name[e - a] = 0;
      eq = e + 1;
      a = name;
    }
#define ARG() (eq ? (eq_used = 1, eq) \
               : i + 1 < argc ? argv[++i] : (snprintf(msg, sizeof msg, "%s needs a value", q(a)), usage_exit(msg), ""))
    if (!only_args && !strcmp(a, "--")) { only_args = 1; continue; }
    if (only_args) {
      if (!o->positional) o->positional = a;
      else if (!o->positional2 && !strcmp(argv[1], "quantize")) o->positional2 = a;
      else { snprintf(msg, sizeof msg, "unexpected argument \"%s\"", q(a)); usage_exit(msg); }
      continue;
    }
    if (a[0] == '-' && a[1]) { /* an option: is it one of this command's? */
      const option_def *d = NULL;
      for (size_t k = 0; k < sizeof kOptions / sizeof kOptions[0] && !d; k++)
        if ((kOptions[k].s && !strcmp(a, kOptions[k].s)) || !strcmp(a, kOptions[k].l)) d = &kOptions[k];
      if (!d) {
        /* "-n64": POSIX's joined short option, which dgemma does not take: say how to write it */
        const option_def *j = NULL;
        for (size_t k = 0; a[1] != '-' && a[2] && k < sizeof kOptions / sizeof kOptions[0] && !j; k++)
          if (kOptions[k].s && !strncmp(a, kOptions[k].s, 2) && (kOptions[k].cmds & g_cmd->bit) &&
              strcmp(kOptions[k].s, "-v") && strcmp(kOptions[k].s, "-h")) /* flags: no value to join */
            j = &kOptions[k];
        if (j) snprintf(msg, sizeof msg, "unknown option %s (write %s %s, with a space)", q(a), j->s, q(a + 2));
        else snprintf(msg, sizeof msg, "unknown option %s", q(a));
        usage_exit(msg);
      }
      if (!(d->cmds & g_cmd->bit)) {
        int n = snprintf(msg, sizeof msg, "%s is not an option of %s (it is one of", a, g_cmd->name);
        const char *sep = " ";
        for (int k = 0; k < N_COMMANDS; k++)
          if (d->cmds & kCommands[k].bit && n < (int)sizeof msg) {
            n += snprintf(msg + n, sizeof msg - (size_t)n, "%s%s", sep, kCommands[k].name);
            sep = ", ";
          }
        if (n < (int)sizeof msg) snprintf(msg + n, sizeof msg - (size_t)n, ")");
        usage_exit(msg);
      }
    }
#define FILEARG() nonempty(ARG(), a, "a file name")
    if (!strcmp(a, "-m") || !strcmp(a, "--model")) o->model = nonempty(ARG(), a, "a model directory");
    else if (!strcmp(a, "-p") || !strcmp(a, "--prompt") || !strcmp(a, "-f") || !strcmp(a, "--file")) {
      const char **dst = a[1] == 'p' || a[2] == 'p' ? &o->prompt : &o->file;
      if (*dst && g_cmd->bit != C_EVAL) { /* the text is given once (eval's -f is its data file, also once) */
        snprintf(msg, sizeof msg, "%s given twice; give the text once: -p TEXT, -p -, -f FILE or an argument", a);
        usage_exit(msg);
      }
      if (*dst) { snprintf(msg, sizeof msg, "%s given twice", a); usage_exit(msg); }
      *dst = dst == &o->file ? FILEARG() : ARG(); /* an empty -p is the prompt's own error */
    }
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
      else { snprintf(msg, sizeof msg, "--device expects cpu, cuda or cuda:N, got \"%s\"", q(d)); usage_exit(msg); }
    }
    else if (!strcmp(a, "--greedy")) o->greedy = 1;
    else if (!strcmp(a, "--special")) o->special = 1;
    else if (!strcmp(a, "--gen-kwargs")) o->gen_kwargs = ARG();
    else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) o->verbose = 1;
    else if (!strcmp(a, "--prompt-ids")) o->prompt_ids = nonempty(ARG(), a, "at least one id (LIST or @FILE)");
    else if (!strcmp(a, "--canvas-ids")) o->canvas_ids = nonempty(ARG(), a, "the canvas ids (LIST or @FILE)");
    else if (!strcmp(a, "--sc-logits")) o->sc_logits = FILEARG();
    else if (!strcmp(a, "-o") || !strcmp(a, "--out")) {
      o->out = FILEARG();
      /* "-" is standard output for logits only: bench and eval print their tables there, and eval reads its
       * -o file back to resume (a file named "-" had been written in the current directory) */
      if (!strcmp(o->out, "-") && g_cmd->bit != C_LOGITS) {
        snprintf(msg, sizeof msg, "%s -: standard output holds the %s's table; give a file name", a,
                 g_cmd->bit == C_EVAL ? "evaluation" : "benchmark");
        usage_exit(msg);
      }
    }
    else if (!strcmp(a, "--canvases")) o->canvases = FILEARG();
    else if (!strcmp(a, "--contexts")) o->contexts = ARG();
    else if (!strcmp(a, "--uniforms")) o->uniforms = FILEARG();
    else if (!strcmp(a, "--stop")) {
      const char *v = ARG();
      if (!*v) usage_exit("--stop needs a non-empty string");
      if (o->n_stops == DG_CLI_MAX_STOPS) usage_exit("at most 16 --stop strings");
      o->stops[o->n_stops++] = v;
    }
    else if (!strcmp(a, "--temp")) {
      const char *v = ARG();
      if (cli_parse_double(v, 0, 100, &o->temp)) { /* decimal only: no "0x10", "inf", "nan" */
        snprintf(msg, sizeof msg, "--temp expects a number in [0, 100], got \"%s\"%s", q(v),
                 v[0] == '+' ? " (write it without the + sign)" : "");
        usage_exit(msg);
      }
      o->temp_set = 1;
    }
    else if (!strcmp(a, "--json")) o->json = 1;
    else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) o->ctx_size = parse_int(ARG(), a, 1, INT32_MAX);
    else if (!strcmp(a, "--pieces")) o->pieces = 1;
    else if (!strcmp(a, "--data")) o->data = nonempty(ARG(), a, "a directory");
    else if (!strcmp(a, "--summary")) {
      o->summary = FILEARG();
      if (!strcmp(o->summary, "-")) usage_exit("--summary -: standard output holds the evaluation's table; give a file name");
    }
    else if (!strcmp(a, "--chat")) o->chat = 1;
    else if (!strcmp(a, "--sample")) o->sample = 1;
    else if (!strcmp(a, "--shots")) { o->shots = (int)parse_int(ARG(), a, 0, 64); o->shots_set = 1; }
    else if (!strcmp(a, "--protocol")) o->protocol = ARG();
    else if (!strcmp(a, "--rows")) o->rows = ARG();
    else if (!strcmp(a, "--formats")) o->formats = ARG();
    else if (!strcmp(a, "--moe-tokens")) o->moe_tokens = ARG();
    else if (!strcmp(a, "--quick")) o->quick = 1;
    else if (!strcmp(a, "--profile")) o->profile = 1;
    else if (!strcmp(a, "--reps")) o->reps = (int)parse_int(ARG(), a, 1, 1000);
    else if (!strcmp(a, "--warmup")) o->warmup = (int)parse_int(ARG(), a, 0, 100) + 1;
    else if (!strcmp(a, "--prompt-tokens")) o->prompt_tokens = (int)parse_int(ARG(), a, 1, 1 << 20);
    else if (!strcmp(a, "--limit")) o->limit = parse_int(ARG(), a, 1, INT32_MAX); /* absent = all */
    else if (!strcmp(a, "--bits")) { /* the MLX affine widths (src/io/quant.c): a usage error here, not a load error */
      const char *v = ARG();
      long long b;
      if (cli_parse_ll(v, 2, 8, &b) || b == 5 || b == 7) {
        snprintf(msg, sizeof msg, "--bits expects 2, 3, 4, 6 or 8, got \"%s\"", q(v));
        usage_exit(msg);
      }
      o->bits = (int)b;
    }
    else if (!strcmp(a, "--group-size")) {
      const char *v = ARG();
      long long g;
      if (cli_parse_ll(v, 32, 128, &g) || (g != 32 && g != 64 && g != 128)) {
        snprintf(msg, sizeof msg, "--group-size expects 32, 64 or 128, got \"%s\"", q(v));
        usage_exit(msg);
      }
      o->group_size = (int)g;
    }
    else if (!strcmp(a, "--recipe")) o->recipe = ARG();
    else if (!strcmp(a, "--recipes")) o->recipes = ARG();
    else if (!strcmp(a, "--config")) o->config = ARG();
    else if (!strcmp(a, "--source")) o->source = ARG();
    else if (!strcmp(a, "--dry-run")) o->dry_run = 1;
    else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { command_help(g_cmd, stdout); exit(close_stdout(0)); }
    else if (!strcmp(a, "--version")) { printf("dgemma %s\n", DGEMMA_VERSION); exit(close_stdout(0)); }
    else if (a[0] == '-' && a[1]) { snprintf(msg, sizeof msg, "unknown option %s", q(a)); usage_exit(msg); } /* not reached */
    else if (!o->positional) o->positional = a;
    else if (!o->positional2 && !strcmp(argv[1], "quantize")) o->positional2 = a;
    else { snprintf(msg, sizeof msg, "unexpected argument \"%s\"", q(a)); usage_exit(msg); }
    if (eq && !eq_used) { /* --greedy=1: a flag takes no value */
      snprintf(msg, sizeof msg, "%s takes no value (got \"%s\")", a, q(argv[i]));
      usage_exit(msg);
    }
#undef FILEARG
#undef ARG
  }
}

/* Reject a positional argument for commands that take none. */
static void no_positional(const opts *o, const char *cmd) {
  if (o->positional) {
    char msg[512];
    snprintf(msg, sizeof msg, "takes no argument \"%s\" (options only)", q(o->positional));
    usage_exit(msg);
  }
}

/* Cores this process may run on (its affinity mask), at least 1. */
static int available_cores(void) { return cli_available_cores(); }

/* -t (or OMP_NUM_THREADS, its default) above the available cores only makes threads wait for each
 * other: capped, with a warning (cli_threads). */
static void cap_threads(opts *o) {
  char warn[256];
  o->threads = cli_threads(o->threads, warn, sizeof warn);
  if (*warn) fprintf(stderr, "dgemma: %s\n", warn);
}

/* libgomp reads OMP_WAIT_POLICY once, as it is loaded, before main: to make
 * "passive" (idle threads sleep instead of spinning) the default, set it and
 * run this program again, once. Spinning threads made a generation 12-20x
 * slower on a machine whose cores were busy with other jobs (docs/eval.md).
 * A policy set by the user is kept. If the exec fails, dgemma goes on with
 * libgomp's default. */
static void reexec_with_passive_wait(char **argv) {
  if (getenv("OMP_WAIT_POLICY")) return;
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv("/proc/self/exe", argv);
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

/* --device cuda[:N] where it cannot run (a build without CUDA, no GPU, one too old): one line that says
 * so, exit 1 (before a model load could blame the model path). The GPU's line goes to buf when given. */
static void check_cuda(const opts *o, char *buf, size_t n) {
  char tmp[512];
  if (dg_device_info(DG_DEVICE_CUDA, o->cuda_device, buf ? buf : tmp, buf ? n : sizeof tmp)) {
    fprintf(stderr, "dgemma %s: --device cuda:%d: %s\n", g_cmd->name, o->cuda_device, dg_last_error());
    exit(1);
  }
}

/* A DGEMMA_KERNELS naming a set this CPU lacks: one warning line naming the variable, its value and the set used
 * instead; once per process. A name of no kernel set (or any other switch's bad value) is left to the load, which
 * refuses it (dg_switches_check). */
static void warn_kernels(void) {
  static int done;
  const char *name;
  if (!done++ && dg_switches_check(DG_DEVICE_CPU) == DG_OK && dg_cpu_kernels(&name))
    fprintf(stderr, "dgemma: warning: %s\n", dg_last_error());
}

static dg_model *load_model(const opts *o, int need_tokenizer) {
  if (!o->ref) warn_kernels();
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = o->threads;
  mp.reference_kernels = o->ref;
  mp.no_tokenizer = !need_tokenizer;
  mp.device = (dg_device)o->device;
  mp.cuda_device = o->cuda_device;
  dg_model *m = NULL;
  const char *dir = o->model ? o->model : default_model();
  if (mp.device == DG_DEVICE_CUDA) check_cuda(o, NULL, 0);
  dg_status st = dg_model_load(dir, &mp, &m);
  if (st) {
    fprintf(stderr, "dgemma: cannot load model %s\n", dir);
    const char *env = env_model();
    if (!o->model && st == DG_ERR_NOT_FOUND) {
      if (env)
        fprintf(stderr, "  (no -m given, so $DGEMMA_MODEL: %s; set it to a model directory, or pass -m MODEL_DIR)\n",
                env);
      else
        fprintf(stderr, "  (no -m given and the bundled model was not found; pass -m MODEL_DIR)\n");
    }
    const char *e = dg_last_error();
    fprintf(stderr, "dgemma: load: %s\n", dg_status_str(st));
    if (e && *e) fprintf(stderr, "  %s\n", e);
    /* "PATH/tokenizer.json: ...", the tokenizer's own errors; not "X is not a directory (... tokenizer.json)" */
    if (need_tokenizer && e && strstr(e, "tokenizer.json:"))
      fprintf(stderr, "  (`dgemma %s` needs the model's tokenizer; info, logits and replay work on ids without one)\n",
              g_cmd->name);
    exit(1);
  }
  char warn[1024]; /* a model without generation_config.json generates, but stops on fewer ids: say so */
  if ((g_cmd->bit & (C_RUN | C_CHAT | C_INFO | C_REPLAY | C_EVAL | C_BENCH)) && cli_no_gen_config(m, dir, warn, sizeof warn))
    fprintf(stderr, "dgemma: warning: %s\n", warn);
  return m;
}

static dg_gen_params gen_params(const dg_model *m, const opts *o) {
  dg_gen_params gp = dg_gen_default_params(m);
  if (o->gen_kwargs) {
    dg_status st = dg_gen_params_apply_json(&gp, o->gen_kwargs);
    if (st) { /* a usage error (exit 2), as in bench and serve: one line naming the field */
      fprintf(stderr, "dgemma %s: --gen-kwargs: %s: %s\n", g_cmd->name, dg_status_str(st), dg_last_error());
      exit(2);
    }
  }
  if (o->max_new_set) gp.max_new_tokens = (int32_t)o->max_new;
  if (o->steps_set) gp.max_denoising_steps = (int32_t)o->steps;
  if (o->seed_set) gp.seed = (uint64_t)o->seed;
  if (o->greedy) gp.proposal = DG_PROPOSAL_ARGMAX;
  /* --temp T: the linear schedule scaled to start at T, its shape kept (t_min = T * t_min / t_max);
   * T = 0: argmax proposals, the schedule unchanged (it still sets the entropies of acceptance) */
  if (o->temp_set && o->temp == 0) gp.proposal = DG_PROPOSAL_ARGMAX;
  else if (o->temp_set) {
    const double ratio = gp.t_max > 0 ? (double)gp.t_min / gp.t_max : 0.5;
    gp.t_max = (float)o->temp;
    gp.t_min = (float)(o->temp * ratio);
  }
  /* what the model refuses (a stop id outside its vocabulary, a --temp so small that logits / T overflow, ...) is
   * a usage error now, not after a prefill */
  dg_status st;
  if ((o->gen_kwargs || (o->temp_set && o->temp > 0)) && (st = dg_gen_params_check(m, &gp))) {
    if (o->gen_kwargs && o->temp_set)
      fprintf(stderr, "dgemma %s: --gen-kwargs with --temp %g: %s: %s\n", g_cmd->name, o->temp, dg_status_str(st),
              dg_last_error());
    else if (o->gen_kwargs) fprintf(stderr, "dgemma %s: --gen-kwargs: %s: %s\n", g_cmd->name, dg_status_str(st), dg_last_error());
    else fprintf(stderr, "dgemma %s: --temp %g: %s: %s\n", g_cmd->name, o->temp, dg_status_str(st), dg_last_error());
    exit(2);
  }
  return gp;
}

/* ---- prompts from files and standard input -------------------------------- */

/* The most read_stream takes: 256 MiB of text is more tokens than any model's positions (a token of the Gemma
 * tokenizer covers at most 93 bytes of text, its longest piece; 262,144 positions x 93 bytes = 23 MiB). */
#define CLI_TEXT_MAX ((size_t)256 << 20)

/* All of stream f (named `name` in messages), NUL-terminated; exits naming it on a read error, or at the first
 * NUL byte (every reader wants text, a C string: `run < /dev/zero` or `tokenize -f /dev/urandom` had read until
 * memory ran out before the NUL was looked for, and detokenize dropped the ids after a NUL silently), or past
 * CLI_TEXT_MAX bytes (exit 2, as read_all: `yes | dgemma run` grew its buffer until the OOM killer ended it). */
static char *read_stream(FILE *f, const char *name, size_t *len) {
  size_t cap = 1 << 16, n = 0, k;
  char *buf = malloc(cap + 1);
  while (buf && (k = fread(buf + n, 1, cap - n, f)) > 0) {
    const char *z = memchr(buf + n, 0, k);
    if (z) {
      fprintf(stderr, "dgemma %s: %s holds a NUL byte at offset %zu (text expected)\n", g_cmd->name, name,
              (size_t)(z - buf));
      exit(1);
    }
    n += k;
    if (n > CLI_TEXT_MAX) {
      fprintf(stderr, "dgemma %s: %s holds more than %zu bytes, the most a text read takes (more tokens than any "
              "model's positions)\n", g_cmd->name, name, CLI_TEXT_MAX);
      exit(2);
    }
    if (n == cap) {
      cap = cap > CLI_TEXT_MAX / 2 ? CLI_TEXT_MAX + 1 : 2 * cap; /* one byte past the limit shows a longer text */
      char *nb = realloc(buf, cap + 1);
      if (!nb) free(buf);
      buf = nb;
    }
  }
  if (!buf || ferror(f)) {
    fprintf(stderr, "dgemma %s: cannot read %s: %s\n", g_cmd->name, name, buf ? strerror(errno) : "out of memory");
    exit(1);
  }
  buf[n] = 0;
  *len = n;
  return buf;
}

/* The text of run/tokenize: -p TEXT, -p - (stdin), -f FILE, the argument, or
 * standard input when it is not a terminal. *owned says whether to free it.
 * strip_newline: a text read from a file or stdin loses one trailing "\n" (or
 * "\r\n"), as llama.cpp's -f does. A NUL byte is refused (the text is C string). */
static const char *input_text(const opts *o, int strip_newline, size_t *len, int *owned) {
  const char *given = o->prompt ? o->prompt : o->positional;
  if ((o->prompt && o->positional) || (o->file && given)) { /* two of them (a repeated -p or -f: parse_opts) */
    char msg[512];
    const char *got[3];
    int k = 0;
    if (o->prompt) got[k++] = "-p";
    if (o->file) got[k++] = "-f";
    if (o->positional) got[k++] = "an argument";
    snprintf(msg, sizeof msg, "give the text once: -p TEXT, -p -, -f FILE or an argument, not %s%s%s%s%s",
             k == 3 ? "" : "both ", got[0], k == 3 ? ", " : " and ", got[1], k == 3 ? " and an argument" : "");
    usage_exit(msg);
  }
  *owned = 0;
  if (given && strcmp(given, "-") != 0) {
    *len = strlen(given);
    return given;
  }
  char *text;
  const char *name;
  if (o->file && strcmp(o->file, "-") != 0) {
    FILE *f = fopen(o->file, "rb");
    if (!f) { fprintf(stderr, "dgemma %s: cannot open %s: %s\n", g_cmd->name, o->file, strerror(errno)); exit(1); }
    text = read_stream(f, o->file, len);
    fclose(f);
    name = o->file;
  } else {
    if (!given && !o->file && isatty(0)) { /* -p - and -f - read a terminal too, as cat(1) does */
      char msg[160];
      snprintf(msg, sizeof msg, "no %s given: -p TEXT, -p - (standard input), -f FILE, or a pipe",
               g_cmd->bit == C_RUN ? "prompt" : "text");
      usage_exit(msg);
    }
    text = read_stream(stdin, "standard input", len);
    name = "standard input";
  }
  size_t nul = strlen(text);
  if (nul != *len) {
    fprintf(stderr, "dgemma %s: %s holds a NUL byte at offset %zu (text expected)\n", g_cmd->name, name, nul);
    exit(1);
  }
  if (strip_newline && *len && text[*len - 1] == '\n') {
    text[--*len] = 0;
    if (*len && text[*len - 1] == '\r') text[--*len] = 0;
  }
  *owned = 1;
  return text;
}

/* ---- run ----------------------------------------------------------------- */

typedef struct stream_state {
  const dg_model *m;
  int32_t *ids;            /* the generated tokens so far (up to each block's first stop id) */
  size_t n, cap;
  char *text;              /* their text (dg_detokenize), owned */
  size_t printed;          /* bytes of text already written to stdout */
  int verbose;
  int quiet;               /* --json: nothing is streamed */
  int write_errno;         /* nonzero: writing stdout failed (generation stopped) */
  const char *const *stops; /* --stop strings */
  int n_stops;
  int stop_string;         /* index of the --stop string that ended the answer, -1 if none */
  size_t stop_at;          /* its byte offset in text */
  size_t block_start;      /* ids of the blocks before the last one */
  int32_t n_blocks, n_steps; /* counted here: an abort by --stop leaves no dg_gen_result */
  int64_t n_forwarded, n_step_calls; /* positions forwarded, summed over the denoising steps seen */
} stream_state;

/* Bytes at the end of text[0..len) that begin some stop string (held back: the next block may complete it). */
static size_t stop_holdback(const stream_state *s, size_t len) {
  size_t hold = 0;
  for (int k = 0; k < s->n_stops; k++) {
    size_t L = strlen(s->stops[k]);
    for (size_t h = L - 1; h > hold; h--)
      if (h <= len && !memcmp(s->text + len - h, s->stops[k], h)) { hold = h; break; }
  }
  return hold;
}

static int write_out(stream_state *s, size_t upto) {
  if (s->quiet || upto <= s->printed) return 0;
  errno = 0;
  int bad = fwrite(s->text + s->printed, 1, upto - s->printed, stdout) != upto - s->printed;
  s->printed = upto;
  bad |= fflush(stdout) != 0;
  if (bad) s->write_errno = errno ? errno : EIO; /* a full disk or /dev/full: stop, cmd_run reports it */
  return bad;
}

static int on_block(const dg_block_info *bi, void *ud) {
  stream_state *s = ud;
  if (s->n + (size_t)bi->n_valid > s->cap) {
    s->cap = (s->n + (size_t)bi->n_valid) * 2;
    s->ids = realloc(s->ids, s->cap * sizeof *s->ids);
  }
  s->block_start = s->n;
  memcpy(s->ids + s->n, bi->tokens, (size_t)bi->n_valid * sizeof(int32_t));
  s->n += (size_t)bi->n_valid;
  s->n_blocks++;
  s->n_steps += bi->n_steps;
  char *text = NULL;
  if (dg_detokenize(s->m, s->ids, s->n, 0, &text) != DG_OK) return 0;
  dg_free(s->text);
  s->text = text;
  size_t len = strlen(text), upto = len;
  for (int k = 0; k < s->n_stops; k++) { /* the earliest stop string wins */
    const char *hit = strstr(text, s->stops[k]);
    if (hit && (s->stop_string < 0 || (size_t)(hit - text) < s->stop_at)) {
      s->stop_string = k;
      s->stop_at = (size_t)(hit - text);
    }
  }
  if (s->stop_string >= 0) upto = s->stop_at;
  else upto = len - stop_holdback(s, len);
  if (write_out(s, upto)) return 1;
  return s->stop_string >= 0; /* a stop string: end the generation here */
}

static int on_step(const dg_step_info *si, void *ud) {
  stream_state *s = ud;
  s->n_forwarded += si->n_forwarded;
  s->n_step_calls++;
  if (!s->verbose) return 0;
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

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Prefill ids[0..n) into ctx; on a terminal, in chunks of 512 tokens with a progress line on stderr
 * when the prompt is long (the KV cache is appended to, so the result does not depend on the chunks). */
static void prefill(dg_context *ctx, const int32_t *ids, size_t n) {
  const size_t chunk = 512;
  const int progress = isatty(2) && n > 2 * chunk;
  const double t0 = now_s();
  dg_status st;
  for (size_t k = 0; k < n;) {
    size_t len = progress && n - k > chunk ? chunk : n - k;
    if ((st = dg_encode(ctx, ids + k, len))) die("prefill", st);
    k += len;
    if (progress) {
      double dt = now_s() - t0;
      fprintf(stderr, "\rdgemma: prefill %zu/%zu tokens (%3.0f%%), %.1f s, about %.0f s left ", k, n,
              100.0 * (double)k / (double)n, dt, k < n ? dt / (double)k * (double)(n - k) : 0.0);
    }
  }
  if (progress) fprintf(stderr, "\n");
}

static const char *finish_name(const stream_state *ss, dg_finish_reason f) {
  static const char *const why[] = {"length", "stop", "repetition"};
  if (ss->stop_string >= 0) return "stop_string";
  return (unsigned)f < 3 ? why[f] : "?";
}

/* Where input_text's text came from, for messages: "-p", "the argument", "standard input" or the file's name. */
static const char *text_source(const opts *o) {
  const char *given = o->prompt ? o->prompt : o->positional;
  if (given && strcmp(given, "-") != 0) return o->prompt ? "-p" : "the argument";
  if (o->file && strcmp(o->file, "-") != 0) return o->file;
  return "standard input";
}

/* A text the tokenizer or the chat template refused (invalid UTF-8): one message naming where the text came
 * from (the library's names the message and the byte offset), exit 1. */
static void die_text(const opts *o, const char *what, int chat, dg_status st) {
  fprintf(stderr, "dgemma %s: cannot tokenize %s from %s%s: %s: %s\n", g_cmd->name, what, text_source(o),
          !chat ? "" : o->system ? " (chat message 1; --system is message 0)" : " (chat message 0)", dg_status_str(st),
          dg_last_error());
  exit(1);
}

static int cmd_run(const opts *o) {
  if (o->raw && (o->system || o->think))
    usage_exit("--raw sends the prompt without the chat template, so --system and --think cannot apply");
  size_t plen;
  int owned;
  const char *prompt = input_text(o, 1, &plen, &owned);
  if (plen == 0) /* llama.cpp generates from <bos> alone here; an empty pipe or file is more often a mistake */
    usage_exit(o->file && strcmp(o->file, "-") ? "the prompt is empty (the file holds no text); for a generation from <bos> alone: --raw '<bos>'"
               : (!o->prompt && !o->positional) || (o->prompt && !strcmp(o->prompt, "-"))
                   ? "the prompt is empty (nothing on standard input); for a generation from <bos> alone: --raw '<bos>'"
                   : "the prompt is empty; for a generation from <bos> alone: --raw '<bos>'");
  dg_model *m = load_model(o, 1);
  dg_gen_params gp = gen_params(m, o);
  int32_t *ids = NULL;
  size_t n = 0;
  dg_status st;
  if (o->raw) {
    st = dg_tokenize(m, prompt, plen, 1, &ids, &n);
  } else {
    dg_chat_message msgs[2];
    size_t nm = 0;
    if (o->system) msgs[nm++] = (dg_chat_message){"system", o->system};
    msgs[nm++] = (dg_chat_message){"user", prompt};
    st = dg_chat_apply(m, msgs, nm, o->think, &ids, &n);
  }
  if (st == DG_ERR_INVALID_ARG) die_text(o, "the prompt", !o->raw, st); /* invalid UTF-8: say which input */
  if (st) die("prompt", st);
  if (owned) free((char *)prompt);
  if (n == 0) usage_exit("the prompt is empty (with --raw no BOS is added, so an empty text has no tokens)");
  dg_model_info info;
  dg_model_get_info(m, &info);
  const int32_t need = context_size(n, &gp, info.canvas_length);
  if (need > info.max_position_embeddings) {
    const int32_t C = info.canvas_length, nc = (gp.max_new_tokens + C - 1) / C;
    fprintf(stderr,
            "dgemma run: the prompt has %zu tokens; with %d canvas(es) of %d for -n %d the sequence needs %d "
            "positions, past the model's max_position_embeddings %d\n",
            n, nc, C, gp.max_new_tokens, need, info.max_position_embeddings);
    dg_free(ids);
    dg_model_free(m);
    return 2;
  }
  dg_context_params cp = dg_context_default_params();
  cp.max_context = need;
  dg_context *ctx = NULL;
  if ((st = dg_context_new(m, &cp, &ctx))) die("context", st);
  stream_state ss = {.m = m, .verbose = o->verbose, .quiet = o->json, .stops = o->stops, .n_stops = o->n_stops,
                     .stop_string = -1};
  gp.on_block = on_block;
  gp.on_step = on_step;
  gp.user_data = &ss;
  /* the prompt but its last token is prefilled here, timed apart from the generation (dg_generate needs one) */
  const double t0 = now_s();
  prefill(ctx, ids, n - 1);
  const double t1 = now_s();
  dg_gen_result r;
  st = dg_generate(ctx, ids + n - 1, 1, &gp, &r);
  const double t2 = now_s();
  int rc = 0;
  const int by_stop = st == DG_ERR_ABORTED && ss.stop_string >= 0 && !ss.write_errno;
  if (st && !by_stop) {
    if (st == DG_ERR_ABORTED && ss.write_errno) {
      fprintf(stderr, "dgemma: cannot write to standard output: %s (generation stopped)\n", strerror(ss.write_errno));
      rc = 1;
      goto out;
    }
    die("generate", st);
  }
  /* the tokens of the answer: all of them, or up to the one that completes the stop string */
  size_t kept = ss.n;
  int32_t visible = by_stop ? 0 : r.n_visible;
  if (by_stop) {
    const size_t stop_end = ss.stop_at + strlen(ss.stops[ss.stop_string]);
    for (size_t k = ss.block_start; k <= ss.n; k++) {
      char *t = NULL;
      if (dg_detokenize(m, ss.ids, k, 0, &t) != DG_OK) break;
      const size_t tl = strlen(t);
      dg_free(t);
      if (tl >= stop_end) { kept = k; break; }
    }
    visible = (int32_t)kept;
    ss.text[ss.stop_at] = 0; /* the answer ends before the stop string */
  } else if (!o->json) {
    write_out(&ss, ss.text ? strlen(ss.text) : 0); /* what was held back for a stop string that never came */
  }
  if (!by_stop) { /* the library's counts (those of the callbacks agree; these are the reference) */
    ss.n_blocks = r.n_blocks;
    ss.n_steps = r.n_steps;
  }
  const double gen_s = t2 - t1, pre_s = t1 - t0;
  const char *finish = finish_name(&ss, by_stop ? DG_FINISH_STOP : r.finish_reason);
  /* what ran: the sampler (reference or turbo) and how it proposed tokens (--greedy, --temp 0: argmax) */
  const char *proposal = gp.proposal == DG_PROPOSAL_ARGMAX ? "argmax" : "sample";
  if (o->json) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "text", ss.text ? ss.text : "");
    cJSON *tk = cJSON_AddArrayToObject(j, "tokens");
    for (size_t k = 0; k < kept; k++) cJSON_AddItemToArray(tk, cJSON_CreateNumber(ss.ids[k]));
    cJSON_AddNumberToObject(j, "n_tokens", visible);
    cJSON_AddNumberToObject(j, "prompt_tokens", (double)n);
    cJSON_AddNumberToObject(j, "blocks", ss.n_blocks);
    cJSON_AddNumberToObject(j, "steps", ss.n_steps);
    cJSON_AddStringToObject(j, "finish_reason", finish);
    if (by_stop) cJSON_AddStringToObject(j, "stop_string", ss.stops[ss.stop_string]);
    else cJSON_AddNullToObject(j, "stop_string"); /* always there: null when no --stop string ended the answer */
    cJSON_AddStringToObject(j, "sampler", gp.turbo.enabled ? "turbo" : "reference");
    cJSON_AddStringToObject(j, "proposal", proposal);
    cJSON_AddNumberToObject(j, "seed", (double)gp.seed);
    cJSON *tm = cJSON_AddObjectToObject(j, "timings");
    cJSON_AddNumberToObject(tm, "prefill_s", pre_s);
    cJSON_AddNumberToObject(tm, "generation_s", gen_s);
    cJSON_AddNumberToObject(tm, "total_s", t2 - t0);
    cJSON_AddNumberToObject(tm, "prefill_tokens", (double)(n - 1)); /* the last goes with the first canvas */
    if (n > 1 && pre_s > 0) cJSON_AddNumberToObject(tm, "prefill_tok_per_s", (double)(n - 1) / pre_s);
    else cJSON_AddNullToObject(tm, "prefill_tok_per_s"); /* nothing prefilled: no rate */
    cJSON_AddNumberToObject(tm, "generation_tok_per_s", gen_s > 0 ? visible / gen_s : 0.0);
    char *js = cJSON_PrintUnformatted(j);
    printf("%s\n", js);
    cJSON_free(js);
    cJSON_Delete(j);
  } else {
    printf("\n");
  }
  fflush(stdout); /* a failure here is reported by close_stdout at the end */
  /* generated text only (n_visible): hidden <eos>/pad canvases are not tokens the user got */
  fprintf(stderr, "dgemma: %d tokens, %d blocks, %d denoising steps, %.2f tokens/forward, %.2f s, %.1f tok/s "
          "(generation)\n",
          visible, ss.n_blocks, ss.n_steps, ss.n_steps ? (double)visible / ss.n_steps : 0.0, gen_s,
          gen_s > 0 ? visible / gen_s : 0.0);
  /* the prompt but its last token is prefilled (the count of the progress line); the last one is
   * encoded with the first canvas, in the generation's time */
  if (n > 1 && pre_s > 0)
    fprintf(stderr, "dgemma: prompt %zu tokens, prefill %.2f s (%zu tokens, %.1f tok/s; the last one goes with the "
            "first canvas); %.2f s in all\n", n, pre_s, n - 1, (double)(n - 1) / pre_s, t2 - t0);
  else
    fprintf(stderr, "dgemma: prompt %zu token%s, prefill %.2f s (no rate: %s); %.2f s in all\n", n, n == 1 ? "" : "s",
            pre_s, n == 1 ? "the only token goes with the first canvas" : "too fast to time", t2 - t0);
  fprintf(stderr, "dgemma: %s sampler, %s proposals, %.2f forwards/block, %.1f positions/forward, finish reason %s\n",
          gp.turbo.enabled ? "turbo" : "reference", gp.proposal == DG_PROPOSAL_ARGMAX ? "argmax" : "sampled", ss.n_blocks ? (double)ss.n_steps / ss.n_blocks : 0.0,
          by_stop ? (ss.n_step_calls ? (double)ss.n_forwarded / ss.n_step_calls : 0.0)
                  : r.n_steps ? (double)r.n_forwarded / r.n_steps : 0.0, finish);
  if (!by_stop) dg_gen_result_free(&r);
out:
  free(ss.ids);
  dg_free(ss.text);
  dg_free(ids);
  dg_context_free(ctx);
  dg_model_free(m);
  return rc;
}

/* ---- chat ------------------------------------------------------------------ *
 *
 * Multi-turn chat in the terminal. The conversation lives in the KV cache: each
 * turn appends only its new tokens (the previous answer's last, uncommitted
 * canvas up to its stop id, the turn's end, the new user turn) and generates on
 * top, so nothing is prefilled twice. Ctrl-C stops the current answer (the turn
 * is dropped: the cache is truncated back); /reset, /system TEXT, /quit. Lines
 * are read with libedit when the build has it (history, editing), else plainly;
 * without a terminal on stdin every line is a user message (scripts). */

static volatile sig_atomic_t g_chat_interrupt = 0;

static void on_chat_sigint(int sig) {
  (void)sig;
  g_chat_interrupt = 1;
}

static int chat_on_step(const dg_step_info *si, void *ud) {
  (void)si;
  (void)ud;
  return g_chat_interrupt != 0; /* Ctrl-C: stop within one denoising step */
}

/* One line from the user, malloc'd without its newline; NULL at the end of input. *nul: the offset of the
 * first NUL byte in it, -1 if none (the message would end there: getline reads past it, strlen does not). */
static char *chat_read_line(int tty, long *nul) {
  *nul = -1;
#ifdef DG_HAVE_LIBEDIT
  if (tty) {
    char *l = readline("> ");
    if (l && *l) add_history(l);
    return l;
  }
#endif
  if (tty) {
    fputs("> ", stdout);
    fflush(stdout);
  }
  /* a line of at most CLI_TEXT_MAX bytes (getline grew a line without a newline until memory ran out, then
   * ended the chat as if at the end of the input) */
  size_t cap = 256, k = 0;
  char *line = malloc(cap);
  int c = EOF;
  while (line && (c = getc(stdin)) != EOF) {
    if (k == CLI_TEXT_MAX) {
      fprintf(stderr, "dgemma chat: a line of standard input holds more than %zu bytes, the most a text read "
              "takes (more tokens than any model's positions)\n", CLI_TEXT_MAX);
      exit(2);
    }
    if (k + 2 > cap) {
      cap = cap > CLI_TEXT_MAX / 2 ? CLI_TEXT_MAX + 2 : 2 * cap;
      char *nb = realloc(line, cap);
      if (!nb) free(line);
      line = nb;
      if (!line) break;
    }
    line[k++] = (char)c;
    if (c == '\n') break;
  }
  if (!line) {
    fprintf(stderr, "dgemma chat: cannot read standard input: out of memory\n");
    exit(1);
  }
  if (c == EOF && (k == 0 || ferror(stdin))) { /* the end, or a read error: a partial line is dropped, as getline's */
    if (g_chat_interrupt) clearerr(stdin); /* Ctrl-C at the prompt (EINTR): the caller asks again */
    free(line);
    return NULL;
  }
  line[k] = 0;
  while (k > 0 && (line[k - 1] == '\n' || line[k - 1] == '\r')) line[--k] = 0;
  const char *z = memchr(line, 0, (size_t)k);
  if (z) *nul = (long)(z - line);
  return line;
}

/* The single id of a control token's text, -1 if the tokenizer has none. */
static int32_t control_id(const dg_model *m, const char *piece) {
  int32_t *ids = NULL, id = -1;
  size_t n = 0;
  if (dg_tokenize(m, piece, strlen(piece), 1, &ids, &n) == DG_OK && n == 1) id = ids[0];
  dg_free(ids);
  return id;
}

/* A line of the chat that is a command (or empty): 1 = leave, 2 = start the conversation over,
 * 0 = nothing more to do. *system is the system message (malloc'd or NULL). */
static int chat_command(const char *line, char **system) {
  int act = 0;
  if (!strcmp(line, "/quit") || !strcmp(line, "/exit")) return 1;
  if (!*line) return 0;
  if (!strcmp(line, "/reset")) {
    printf("(conversation forgotten)\n");
    act = 2;
  } else if (!strncmp(line, "/system", 7) && (line[7] == 0 || line[7] == ' ')) {
    const char *t = line + 7;
    while (*t == ' ') t++;
    free(*system);
    *system = *t ? strdup(t) : NULL;
    printf("(system message %s; the conversation starts over)\n", *system ? "set" : "cleared");
    act = 2;
  } else if (!strcmp(line, "/help")) {
    printf("(/reset forgets the conversation, /system [TEXT] sets or clears the system message and starts over, "
           "/quit leaves; Ctrl-C stops an answer)\n");
  } else {
    printf("(unknown command %s: /reset, /system [TEXT], /quit, /help)\n", line);
  }
  fflush(stdout);
  return act;
}

static int cmd_chat(const opts *o) {
  no_positional(o, "chat");
  dg_model *m = load_model(o, 1);
  dg_gen_params gp = gen_params(m, o);
  dg_model_info info;
  dg_model_get_info(m, &info);
  const int32_t C = info.canvas_length, n_canvases = (gp.max_new_tokens + C - 1) / C;
  int32_t cap = o->ctx_size ? (int32_t)o->ctx_size : 8192;
  if (cap > info.max_position_embeddings) {
    if (o->ctx_size) /* the default 8192 is capped quietly; an explicit -c says so */
      fprintf(stderr, "dgemma chat: -c %d is more than the model's %d positions (max_position_embeddings); using %d\n",
              cap, info.max_position_embeddings, info.max_position_embeddings);
    cap = info.max_position_embeddings;
  }
  if (cap < 2 * n_canvases * C) {
    char msg[200];
    snprintf(msg, sizeof msg, "-c %d is too small for -n %d (%d positions at least)", cap, gp.max_new_tokens,
             2 * n_canvases * C);
    usage_exit(msg);
  }
  dg_context_params cp = dg_context_default_params();
  cp.max_context = cap;
  cp.full_window_cache = 1; /* a turn is rolled back (dg_context_truncate) after an error or at its end */
  dg_context *ctx = NULL;
  dg_status st;
  if ((st = dg_context_new(m, &cp, &ctx))) die("context", st);
  const int32_t end_turn = control_id(m, "<turn|>"), newline = control_id(m, "\n");
  const int tty = isatty(0);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_chat_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  char *system = o->system ? strdup(o->system) : NULL;
  int32_t *tail = NULL; /* the previous answer's tokens not in the cache yet, and the turn's end */
  size_t n_tail = 0;
  if (tty)
    fprintf(stderr, "dgemma chat: %s, context %d positions. /reset forgets the conversation, /system TEXT sets "
            "a system message, /quit leaves (or Ctrl-D); Ctrl-C stops an answer.\n",
            o->model ? o->model : default_model(), cap);
  char *line;
  long nul;
  for (long lineno = 1;; lineno++) {
    g_chat_interrupt = 0;
    if (!(line = chat_read_line(tty, &nul))) {
      /* Ctrl-C at the prompt interrupts the read: it discards the line being typed and asks again, as a shell
       * does (it had ended the chat, exit 0, losing the conversation: also a Ctrl-C meant for an answer that had
       * just ended). Ctrl-D or the end of input leaves. */
      if (g_chat_interrupt && tty) {
        printf("(Ctrl-C: /quit or Ctrl-D leaves)\n");
        fflush(stdout);
        continue;
      }
      break;
    }
    if (nul >= 0) { /* the message would have been cut at the NUL, silently (run -f refuses such a file too) */
      fprintf(stderr, "dgemma chat: input line %ld holds a NUL byte at offset %ld (text expected); skipped\n", lineno,
              nul);
      free(line);
      continue;
    }
    if (line[0] == '/' || !*line) {
      const int act = chat_command(line, &system);
      free(line);
      if (act == 1) break;
      if (act == 2) { /* the conversation starts over */
        dg_context_reset(ctx);
        n_tail = 0;
      }
      continue;
    }
    /* the new tokens: the whole first turn, or the previous answer's tail and the user turn (no <bos>) */
    const int first = dg_context_length(ctx) == 0;
    dg_chat_message msgs[2];
    size_t nm = 0;
    if (first && system) msgs[nm++] = (dg_chat_message){"system", system};
    msgs[nm++] = (dg_chat_message){"user", line};
    int32_t *turn = NULL;
    size_t n_turn = 0;
    if ((st = dg_chat_apply(m, msgs, nm, 0, &turn, &n_turn))) {
      fprintf(stderr, "dgemma chat: %s: %s\n", dg_status_str(st), dg_last_error());
      free(line);
      continue;
    }
    free(line);
    const size_t skip = first ? 0 : 1; /* <bos> */
    const size_t n_new = n_tail + n_turn - skip;
    int32_t *ids = malloc(n_new * sizeof *ids);
    if (n_tail) memcpy(ids, tail, n_tail * sizeof *ids);
    memcpy(ids + n_tail, turn + skip, (n_turn - skip) * sizeof *ids);
    dg_free(turn);
    const int32_t len0 = dg_context_length(ctx);
    if ((int64_t)len0 + (int64_t)n_new + (int64_t)n_canvases * C > cap) {
      printf("(the conversation is full: %d + %zu tokens and %d for the answer exceed the context's %d positions; "
             "/reset starts over, -c sets a larger context)\n", len0, n_new, n_canvases * C, cap);
      fflush(stdout);
      free(ids);
      continue;
    }
    stream_state ss = {.m = m, .stop_string = -1};
    gp.on_block = on_block;
    gp.on_step = chat_on_step;
    gp.user_data = &ss;
    g_chat_interrupt = 0;
    const double t0 = now_s();
    st = dg_encode(ctx, ids, n_new - 1);
    const double t1 = now_s();
    dg_gen_result r;
    if (!st) st = dg_generate(ctx, ids + n_new - 1, 1, &gp, &r);
    const double t2 = now_s();
    free(ids);
    if (st) { /* interrupted, or a failure: the turn is dropped, the conversation stays as it was */
      dg_context_truncate(ctx, len0);
      printf("\n");
      if (st == DG_ERR_ABORTED && g_chat_interrupt) printf("(stopped; this turn is forgotten)\n");
      else fprintf(stderr, "dgemma chat: %s: %s (this turn is forgotten)\n", dg_status_str(st), dg_last_error());
      fflush(stdout);
      free(ss.ids);
      dg_free(ss.text);
      continue;
    }
    write_out(&ss, ss.text ? strlen(ss.text) : 0);
    printf("\n");
    fflush(stdout);
    /* what the cache lacks of the answer: the last canvas (never committed), up to its stop id */
    const int32_t in_cache = dg_context_length(ctx) - len0 - (int32_t)n_new;
    int32_t keep = r.n_valid;
    if (r.finished && keep > 0 && r.tokens[keep - 1] != end_turn) keep--; /* <eos> and the like: end the turn instead */
    if (in_cache > keep) dg_context_truncate(ctx, len0 + (int32_t)n_new + keep);
    const int32_t from = in_cache < keep ? in_cache : keep;
    n_tail = 0;
    tail = realloc(tail, ((size_t)(keep - from) + 2) * sizeof *tail);
    for (int32_t k = from; k < keep; k++) tail[n_tail++] = r.tokens[k];
    if ((n_tail == 0 || tail[n_tail - 1] != end_turn) && end_turn >= 0) tail[n_tail++] = end_turn;
    if (newline >= 0) tail[n_tail++] = newline;
    fprintf(stderr, "(dgemma: %d tokens, %d blocks, %d steps, %.2f s, %.1f tok/s; prefill %zu tokens %.2f s; "
            "context %d/%d)\n", r.n_visible, r.n_blocks, r.n_steps, t2 - t1,
            t2 > t1 ? r.n_visible / (t2 - t1) : 0.0, n_new, t1 - t0, dg_context_length(ctx) + (int32_t)n_tail, cap);
    dg_gen_result_free(&r);
    free(ss.ids);
    dg_free(ss.text);
  }
  if (tty) printf("\n");
  free(tail);
  free(system);
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
    check_cuda(o, buf, sizeof buf);
    printf("device: cuda:%d %s\n", o->cuda_device, buf);
  }
  dg_model *m = load_model(o, 0);
  dg_model_info i;
  dg_model_get_info(m, &i);
  dg_gen_params gp = dg_gen_default_params(m);
  printf("vocab %d, hidden %d, layers %d (%d full), heads %d, kv heads %d/%d, head dim %d/%d, window %d\n",
         i.vocab_size, i.hidden_size, i.n_layers, i.n_full_layers, i.n_heads, i.n_kv_heads, i.n_global_kv_heads,
         i.head_dim, i.global_head_dim, i.sliding_window);
  printf("dense MLP %d, experts %d x %d (top-%d), canvas %d, max context %d positions, %.2f M text parameters\n",
         i.intermediate_size, i.n_experts, i.moe_intermediate_size, i.top_k_experts, i.canvas_length,
         i.max_position_embeddings, (double)i.n_params / 1e6);
  if (i.n_quantized) {
    char bits[32];
    if (i.quant_bits_min == i.quant_bits_max) snprintf(bits, sizeof bits, "%d bits", i.quant_bits_min);
    else snprintf(bits, sizeof bits, "%d..%d bits", i.quant_bits_min, i.quant_bits_max);
    printf("weights: %d matrices MLX affine-quantized (%s; scales and biases %s), the other tensors %s\n",
           i.n_quantized, bits, i.weight_dtype, i.weight_dtype);
  } else {
    printf("weights: %s\n", i.weight_dtype);
  }
  char tok[PATH_MAX + 32];
  snprintf(tok, sizeof tok, "%s/tokenizer.json", o->model ? o->model : default_model());
  const char *wait = getenv("OMP_WAIT_POLICY");
  printf("cpu: %d threads, %d core(s) available, OpenMP wait policy %s\n", o->threads ? o->threads : omp_get_max_threads(),
         available_cores(), wait ? wait : "(libgomp default)");
  { /* the kernel set that runs, and why: --ref, DGEMMA_KERNELS, or the best this CPU has */
    const char *kn, *env = getenv("DGEMMA_KERNELS");
    const int honoured = dg_cpu_kernels(&kn) == DG_OK;
    printf("cpu kernels: %s (%s)\n", i.cpu_kernels,
           o->ref ? "--ref" : env && *env ? honoured ? "DGEMMA_KERNELS" : "the best this CPU has; DGEMMA_KERNELS ignored"
                                          : "the best this CPU has");
  }
  printf("tokenizer: %s\n", access(tok, R_OK) == 0 ? "tokenizer.json"
                                                  : "none (the commands of text refuse this model; info, logits and "
                                                    "replay work on ids)");
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
  size_t len;
  int owned;
  const char *text = input_text(o, 0, &len, &owned);
  dg_model *m = load_model(o, 1);
  int32_t *ids;
  size_t n;
  dg_status st = dg_tokenize(m, text, len, o->special, &ids, &n);
  if (st == DG_ERR_INVALID_ARG) die_text(o, "the text", 0, st); /* invalid UTF-8: say which input */
  if (st) die("tokenize", st);
  if (owned) free((char *)text);
  if (o->pieces) {
    for (size_t i = 0; i < n; i++) {
      const char *p = dg_token_piece(m, ids[i]);
      printf("%d\t", ids[i]);
      for (const unsigned char *c = (const unsigned char *)(p ? p : ""); *c; c++) { /* one line per token */
        if (*c == '\n') fputs("\\n", stdout);
        else if (*c == '\t') fputs("\\t", stdout);
        else if (*c == '\r') fputs("\\r", stdout);
        else if (*c == '\\') fputs("\\\\", stdout);
        else if (*c < 0x20 || *c == 0x7f) printf("\\x%02x", *c);
        else putchar(*c);
      }
      putchar('\n');
    }
  } else {
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("\n");
  }
  dg_free(ids);
  dg_model_free(m);
  return 0;
}

/* dgemma detokenize IDS: ids separated by commas or white space (the argument, else standard input). */
static int cmd_detokenize(const opts *o) {
  size_t len = 0;
  char *buf = NULL;
  const char *src = o->positional;
  if (!src) {
    if (isatty(0)) usage_exit("detokenize needs ids: an argument \"1,2,3\" or a pipe");
    src = buf = read_stream(stdin, "standard input", &len);
  }
  dg_model *m = load_model(o, 1);
  dg_model_info info;
  dg_model_get_info(m, &info);
  size_t cap = 64, n = 0;
  int32_t *ids = malloc(cap * sizeof *ids);
  /* one comma at most between two ids (white space around it); "5,,6", a leading or a trailing comma
   * is an empty id, refused, as a sign or anything but decimal digits is */
  int comma = 0; /* a comma since the last id (or at the start) */
  for (const char *p = src;;) {
    for (; *p == ',' || *p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'; p++) {
      if (*p != ',') continue;
      if (comma || n == 0) {
        fprintf(stderr, "dgemma detokenize: id %zu is empty (%s at byte %zu); separate ids by one comma or by white "
                "space\n", n, n == 0 ? "a comma before the first id" : "two commas", (size_t)(p - src));
        free(ids);
        free(buf);
        dg_model_free(m);
        return 2;
      }
      comma = 1;
    }
    if (!*p) {
      if (comma) {
        fprintf(stderr, "dgemma detokenize: the ids end with a comma (byte %zu): an empty id\n", (size_t)(p - src));
        free(ids);
        free(buf);
        dg_model_free(m);
        return 2;
      }
      break;
    }
    comma = 0;
    char *end;
    errno = 0;
    long v = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : (end = (char *)p, 0); /* digits only: no sign */
    if (end == p || errno || v < 0 || v >= info.vocab_size || (*end && !strchr(", \t\r\n", *end))) {
      char word[64];
      fprintf(stderr, "dgemma detokenize: id %zu: \"%s\" is not an id in [0, %d)%s\n", n,
              cli_quote(p, strcspn(p, ", \t\r\n") < 20 ? strcspn(p, ", \t\r\n") : 20, word, sizeof word), info.vocab_size,
              *p == '+' ? " (write it without the + sign)" : "");
      free(ids);
      free(buf);
      dg_model_free(m);
      return 2;
    }
    if (n == cap) ids = realloc(ids, (cap *= 2) * sizeof *ids);
    ids[n++] = (int32_t)v;
    p = end;
  }
  char *text = NULL;
  dg_status st = dg_detokenize(m, ids, n, o->special, &text);
  if (st) die("detokenize", st);
  printf("%s\n", text);
  dg_free(text);
  free(ids);
  free(buf);
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
  const int to_stdout = !strcmp(o->out, "-");
  if (to_stdout && isatty(1)) usage_exit("-o -: standard output is a terminal, and the logits are binary float32; redirect it or give a file");
  catch_stop_signals(1); /* no stop point in a forward pass: the handler removes the temporary file and exits */
  size_t np, nc;
  int32_t *prompt = parse_ids(o->prompt_ids, &np); /* before the model loads: a bad list is told at once */
  int32_t *canvas = parse_ids(o->canvas_ids, &nc);
  if (!np) { /* "@empty.i32": the encoder needs a prompt (an empty literal list is parse_opts' error) */
    fprintf(stderr, "dgemma logits: --prompt-ids %s%s%s holds no ids (the encoder needs at least one)\n",
            o->prompt_ids[0] == '@' ? "" : "\"", q(o->prompt_ids), o->prompt_ids[0] == '@' ? "" : "\"");
    free(prompt); free(canvas);
    return 2;
  }
  dg_model *m = load_model(o, 0);
  dg_model_info info;
  dg_model_get_info(m, &info);
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
    sc = read_all(o->sc_logits, &len, CV * 4, "--sc-logits (float32 [canvas, vocab])");
    if (len != CV * 4) {
      fprintf(stderr, "dgemma: %s has %zu bytes; expected %zu (float32 [%d, %d])\n", o->sc_logits, len, CV * 4,
              info.canvas_length, info.vocab_size);
      goto out;
    }
    for (size_t k = 0; k < CV; k++) /* NaN or inf: every logit would be NaN (the library refuses it too) */
      if (!isfinite(sc[k])) {
        fprintf(stderr, "dgemma: --sc-logits %s: value %g at [%zu, %zu] (float32 [canvas, vocab]) is not finite\n",
                o->sc_logits, (double)sc[k], k / (size_t)info.vocab_size, k % (size_t)info.vocab_size);
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
    fprintf(stderr, "dgemma: cannot write %s: %s\n", to_stdout ? "standard output (-o -)" : o->out, strerror(errno));
    fclose(f);
    goto out; /* the temporary file is removed at exit */
  }
  if (out_commit(f, o->out)) goto out;
  fprintf(stderr, "dgemma: wrote [%d, %d] float32 logits to %s (encode %zu tokens %.3f s, decode %.3f s; wall times)\n",
          info.canvas_length, info.vocab_size, to_stdout ? "standard output" : o->out, np,
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
  size_t np, ncv, nu = 0;
  int32_t *prompt = parse_ids(o->prompt_ids, &np);
  if (!np) {
    fprintf(stderr, "dgemma replay: --prompt-ids %s%s%s holds no ids (generation needs a prompt)\n",
            o->prompt_ids[0] == '@' ? "" : "\"", q(o->prompt_ids), o->prompt_ids[0] == '@' ? "" : "\"");
    free(prompt);
    return 2;
  }
  dg_model *m = load_model(o, 0);
  dg_gen_params gp = gen_params(m, o);
  size_t len;
  int32_t *canv = read_all(o->canvases, &len, CLI_REPLAY_MAX, "--canvases");
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
    uni = read_all(o->uniforms, &len, CLI_REPLAY_MAX, "--uniforms");
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
    struct stat ss;
    const int special = stat(o->summary ? o->summary : "", &ss) == 0 && !S_ISREG(ss.st_mode) && !S_ISDIR(ss.st_mode);
    /* a --summary that cannot be written (a directory, no such folder) is told now, not after the run; a FIFO or a
     * device is written in place and opened only once (opening a FIFO twice would end its reader's input) */
    if (o->summary && !special) {
      FILE *probe = out_try_open(o->summary, "dgemma eval");
      if (!probe) {
        gsm8k_set_free(&in.test);
        gsm8k_set_free(&in.train);
        return 1;
      }
      out_discard(probe);
    }
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
  if (o->positional && strcmp(o->positional, "problems") && strcmp(o->positional, "text")) {
    char msg[256];
    snprintf(msg, sizeof msg, "unknown evaluation \"%s\" (gsm8k, problems or text)", q(o->positional));
    usage_exit(msg);
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
  bo.contexts = o->contexts;
  bo.gen_kwargs = o->gen_kwargs;
  bo.rows = o->rows;
  bo.formats = o->formats;
  bo.moe_tokens = o->moe_tokens;
  bo.quick = o->quick;
  bo.profile = o->profile;
  bo.n_threads = o->threads;
  bo.device = o->device;
  bo.cuda_device = o->cuda_device;
  if (o->gen_kwargs && o->protocol &&
      (!strcmp(o->protocol, "vllm") || !strcmp(o->protocol, "p512") || !strcmp(o->protocol, "ceiling")))
    usage_exit("--gen-kwargs is read by --protocol batch (and by the batch rows of all); vllm, p512 and ceiling "
               "fix their own settings");
  char err[256];
  if (bench_check_opts(&bo, err, sizeof err)) usage_exit(err); /* before the model loads */
  if (!o->ref && o->device != DG_DEVICE_CUDA) warn_kernels();
  /* the ceiling sweep needs no model (it builds its own matrices at the MoE's shapes) */
  dg_model *m = o->protocol && !strcmp(o->protocol, "ceiling") ? NULL : load_model(o, 1);
  int rc = dg_cli_bench(m, &bo);
  dg_model_free(m);
  return rc;
}

/* ---- quantize -------------------------------------------------------------- */

/* The items of a recipe, separated by one ',': an empty one (",,", a leading or trailing ',', only white space) is
 * a usage error naming it (the library skips empty items and takes "" for the default recipe, so
 * `--recipe "$R"` with R unset, or a stray comma, had quantized with another recipe than the one meant). */
static void check_recipe_items(const char *opt, const char *recipe) {
  char msg[768];
  int k = 0;
  for (const char *p = recipe;; k++) {
    const size_t n = strcspn(p, ",");
    size_t sp = 0;
    while (sp < n && isspace((unsigned char)p[sp])) sp++;
    if (sp == n) {
      if (!k && !p[n]) snprintf(msg, sizeof msg, "%s needs a recipe (CLASS=BITS, ...), got \"%s\"", opt, q(recipe));
      else snprintf(msg, sizeof msg, "%s \"%s\": item %d is empty (items are separated by one ',')", opt, q(recipe), k + 1);
      usage_exit(msg);
    }
    if (!p[n]) break;
    p += n + 1;
  }
}

/* A --recipe that does not parse is a usage error (exit 2), found before any file is read. */
static void check_recipe(const char *recipe, int bits, int group_size) {
  dg_quant_recipe r;
  if (recipe) check_recipe_items("--recipe", recipe);
  if (recipe && dg_quant_recipe_parse(recipe, bits, group_size, &r)) {
    char msg[768];
    snprintf(msg, sizeof msg, "--recipe: %s", q(dg_last_error()));
    usage_exit(msg);
  }
}

/* qreport --recipes "R1;R2;...": every recipe parses and none is empty (";;", a trailing ";", or ""
 * would compare nothing), a usage error before the float model runs. */
static void check_recipes(const char *recipes, int bits, int group_size) {
  if (!recipes) return;
  dg_quantize_params qp = dg_quantize_default_params();
  if (!bits) bits = qp.bits;
  if (!group_size) group_size = qp.group_size;
  char msg[900];
  int k = 0;
  for (const char *p = recipes;; k++) {
    const size_t n = strcspn(p, ";");
    char one[512];
    if (n >= sizeof one) { snprintf(msg, sizeof msg, "--recipes: recipe %d is too long", k + 1); usage_exit(msg); }
    memcpy(one, p, n);
    one[n] = 0;
    if (!one[strspn(one, " ")]) {
      snprintf(msg, sizeof msg, "--recipes \"%s\": recipe %d is empty (recipes are separated by one ';')", q(recipes),
               k + 1);
      usage_exit(msg);
    }
    check_recipe_items("--recipes: a recipe", one);
    dg_quant_recipe r;
    if (dg_quant_recipe_parse(one, bits, group_size, &r)) {
      snprintf(msg, sizeof msg, "--recipes: %s", q(dg_last_error()));
      usage_exit(msg);
    }
    if (!p[n]) break;
    p += n + 1;
  }
}

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

/* The progress bar, and a stop after SIGINT/SIGTERM/SIGHUP/SIGPIPE (the library then removes its temporary directory). */
static int mk_progress(int64_t done, int64_t total, const char *tensor, void *ud) {
  quant_progress(done, total, tensor, ud);
  return g_stop_sig != 0;
}

/* dgemma mkrandom OUT_DIR: dg_mkrandom with a progress bar, then what was written. */
static int cmd_mkrandom(const opts *o) {
  if (!o->positional) usage_exit("mkrandom needs OUT_DIR");
  if (!*o->positional) usage_exit("OUT_DIR is an empty string");
  dg_mkrandom_params mp = dg_mkrandom_default_params();
  if (o->config) mp.config = o->config;
  mp.source_dir = o->source;
  if (o->bits) mp.bits = o->bits;
  if (o->group_size) mp.group_size = o->group_size;
  mp.recipe = o->recipe;
  check_recipe(mp.recipe, mp.bits, mp.group_size);
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
  mp.on_tmp_dir = out_track_dir; /* a second Ctrl-C removes it before the process ends */
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
  char tok[PATH_MAX + 32];
  snprintf(tok, sizeof tok, "%s/tokenizer.json", o->positional);
  if (!mp.dry_run && access(tok, R_OK) != 0)
    fprintf(stderr, "dgemma: note: no tokenizer.json in %s (%s): the commands of text (run, chat, tokenize, "
            "detokenize, eval, bench, serve, qreport) refuse it; info, logits and replay work on ids\n", o->positional,
            mp.source_dir ? "--source held none" : "no --source DIR given");
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
  if (!*o->positional || !*o->positional2)
    usage_exit(*o->positional ? "OUT_DIR is an empty string" : "IN_DIR is an empty string");
  dg_quantize_params qp = dg_quantize_default_params();
  if (o->bits) qp.bits = o->bits;
  if (o->group_size) qp.group_size = o->group_size;
  qp.recipe = o->recipe;
  check_recipe(qp.recipe, qp.bits, qp.group_size);
  qp.n_threads = o->threads;
  if (qp.n_threads <= 0) {
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    qp.n_threads = nc > 0 ? (int)nc : 1;
  }
  bar_state bs = {isatty(2), -1};
  qp.progress = mk_progress;
  qp.user_data = &bs;
  qp.on_tmp_dir = out_track_dir; /* a second Ctrl-C removes it before the process ends */
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
  reexec_with_passive_wait(argv);
  /* A file past the size limit (ulimit -f, RLIMIT_FSIZE) is a write error like a full disk: with SIGXFSZ
   * ignored the write fails with EFBIG, which every writer reports with the file named and cleans up after;
   * at its default action the signal killed the process without a word, leaving quantize's and mkrandom's
   * temporary directory (review aud16) */
  signal(SIGXFSZ, SIG_IGN);
  if (argc < 2) {
    global_help(stderr);
    return 2;
  }
  opts o;
  const char *cmd = argv[1];
  if (!strcmp(cmd, "help") && argc > 2 && !strcmp(argv[2], "serve")) { /* serve parses its own options */
    char help[] = "--help", *av[2] = {argv[2], help};
    return close_stdout(dg_cli_serve(2, av, default_model()));
  }
  if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
    const command *c = argc > 2 && strcmp(cmd, "help") == 0 ? find_command(argv[2]) : NULL;
    if (argc > 2 && !strcmp(cmd, "help") && !c) {
      fprintf(stderr, "dgemma: unknown command \"%s\"; see `dgemma --help`\n", argv[2]);
      return 2;
    }
    if (c) command_help(c, stdout);
    else global_help(stdout);
    return close_stdout(0);
  }
  if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
    printf("dgemma %s\n", DGEMMA_VERSION);
    return close_stdout(0);
  }
  if (!strcmp(cmd, "serve")) return close_stdout(dg_cli_serve(argc - 1, argv + 1, default_model()));
  g_cmd = find_command(cmd);
  if (!g_cmd) {
    char msg[256];
    snprintf(msg, sizeof msg, "unknown command \"%.100s\"", cmd);
    for (int i = 2; i < argc; i++) /* `dgemma -m DIR --version` and the like */
      if (!strcmp(argv[i], "--version")) { printf("dgemma %s\n", DGEMMA_VERSION); return close_stdout(0); }
    usage_exit(msg);
  }
  parse_opts(argc, argv, &o);
  cap_threads(&o);
  /* every command's standard output is checked at the end (close_stdout) */
  if (!strcmp(cmd, "run")) return close_stdout(cmd_run(&o));
  if (!strcmp(cmd, "chat")) return close_stdout(cmd_chat(&o));
  if (!strcmp(cmd, "info")) return close_stdout(cmd_info(&o));
  if (!strcmp(cmd, "tokenize")) return close_stdout(cmd_tokenize(&o));
  if (!strcmp(cmd, "detokenize")) return close_stdout(cmd_detokenize(&o));
  if (!strcmp(cmd, "logits")) return close_stdout(cmd_logits(&o));
  if (!strcmp(cmd, "replay")) return close_stdout(cmd_replay(&o));
  if (!strcmp(cmd, "eval")) return close_stdout(cmd_eval(&o));
  if (!strcmp(cmd, "bench")) return close_stdout(cmd_bench(&o));
  if (!strcmp(cmd, "quantize")) { catch_stop_signals(0); return close_stdout(cmd_quantize(&o)); }
  if (!strcmp(cmd, "mkrandom")) { catch_stop_signals(0); return close_stdout(cmd_mkrandom(&o)); }
  /* qreport */
  no_positional(&o, "qreport");
  check_recipes(o.recipes, o.bits, o.group_size);
  warn_kernels();
  qreport_opts qo = {o.recipes, o.bits, o.group_size, o.threads, o.seed_set ? (uint64_t)o.seed : 0};
  return close_stdout(dg_cli_qreport(o.model ? o.model : default_model(), &qo));
}
