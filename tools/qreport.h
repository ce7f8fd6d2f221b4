/* qreport.h: `dgemma qreport` (tools/qreport.c), called from the CLI's main. */
#ifndef DG_CLI_QREPORT_H
#define DG_CLI_QREPORT_H

#include <stdint.h>

typedef struct qreport_opts {
  const char *recipes;  /* "R1;R2;..." (dg_quant_recipe_parse syntax), NULL = the built-in list */
  int bits, group_size; /* defaults under the recipes; 0 = 4 / 64 */
  int threads;          /* 0 = all cores */
  uint64_t seed;        /* noise canvases and greedy generation */
} qreport_opts;

/* Quantize the float model in model_dir with every recipe and print the
 * markdown table of KL divergence / top-1 agreement against it. Exits on
 * errors (CLI helper). */
int dg_cli_qreport(const char *model_dir, const qreport_opts *o);

#endif
