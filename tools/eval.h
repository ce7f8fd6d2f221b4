/* eval.h: `dgemma eval` (tools/eval.c), called from the CLI's main. */
#ifndef DG_CLI_EVAL_H
#define DG_CLI_EVAL_H

#include "dgemma.h"

typedef struct eval_opts {
  const char *what;       /* "problems" or "text" */
  const char *file;       /* JSONL input */
  const char *out;        /* per-item JSONL output (problems), or NULL */
  dg_gen_params gen;      /* generation parameters (model defaults + CLI options) */
  long long seed;         /* base seed; problem i uses seed + id */
  int limit;              /* 0 = all lines */
  int progress;           /* progress on stderr */
} eval_opts;

/* Run the evaluation; prints a markdown table to stdout. Exits on bad input. */
int dg_cli_eval(dg_model *m, const eval_opts *o);

#endif
