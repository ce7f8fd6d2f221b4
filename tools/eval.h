/* eval.h: `dgemma eval` (tools/eval.c), called from the CLI's main. */
#ifndef DG_CLI_EVAL_H
#define DG_CLI_EVAL_H

#include "dgemma.h"
#include "gsm8k.h"

typedef struct eval_opts {
  const char *what;       /* "problems" or "text" */
  const char *file;       /* JSONL input */
  const char *out;        /* per-item JSONL output (problems), or NULL */
  dg_gen_params gen;      /* generation parameters (model defaults + CLI options) */
  long long seed;         /* base seed; problem i uses seed + id */
  int limit;              /* 0 = all lines */
  int progress;           /* progress on stderr */
  /* gsm8k only */
  const char *data;       /* directory with test.jsonl and train.jsonl, or NULL = find ../shared/data/gsm8k */
  const char *summary;    /* JSON summary file, or NULL */
  const char *model_dir;  /* for the configuration key and the title */
  const char *gen_kwargs; /* as given (configuration key) */
  int chat;               /* zero-shot chat variant (chat template, thinking off) */
  int shots;              /* -1 = default (5 completion, 0 chat) */
  int reference_kernels;  /* --ref (configuration key) */
  int tty;                /* stderr is a terminal */
} eval_opts;

/* Run the evaluation; prints a markdown table to stdout. Exits on bad input. */
int dg_cli_eval(dg_model *m, const eval_opts *o);

/* GSM8K data for `dgemma eval gsm8k`, loaded before the model so that data
 * errors come first. */
typedef struct gsm8k_inputs {
  gsm8k_set test, train;
  char dir[4096];
} gsm8k_inputs;

/* Find and load test.jsonl (cut to o->limit) and train.jsonl. Prints the
 * error and returns 1 on failure. */
int dg_cli_gsm8k_load(const eval_opts *o, gsm8k_inputs *in);

/* Run `dgemma eval gsm8k` on loaded inputs: per-item JSONL (-o, resumable),
 * markdown summary on stdout, JSON summary (--summary). Returns the exit
 * status: 0 done, 1 error, 130 interrupted by SIGINT, 143 by SIGTERM, 129 by SIGHUP, 141 by SIGPIPE (partial
 * results kept). */
int dg_cli_gsm8k(dg_model *m, const eval_opts *o, gsm8k_inputs *in);

#endif
