/* mem_per_canvas.c: host memory per turbo canvas of a model directory, by test_turbo_memory's
 * method (tests/test_turbo.c: the growth of the peak RSS, VmHWM reset through /proc/self/clear_refs,
 * of a B-canvas dg_generate_batch over a 1-canvas one, divided by B - 1; contexts, turbo state and
 * the batch's work context included, after a warm-up run that touches the weights), on any model
 * (test_turbo_memory synthesizes one of hidden size 16, so it sees only what scales with the
 * vocabulary). Public API only.
 *   cc -O2 -std=c11 -D_GNU_SOURCE -fopenmp -Iinclude -o build/mem_per_canvas dev/mem_per_canvas.c \
 *      build/libdgemma.a -lcjson -lm -fopenmp -ldl
 *   build/mem_per_canvas MODEL_DIR B STEPS THREADS ['{"diffusion_turbo": true}'] */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgemma.h"
#include "../tests/procmem.h"

static void hwm_reset(void) {
  if (dg_proc_hwm_reset() != 0) {
    fprintf(stderr, "mem_per_canvas: cannot reset VmHWM through /proc/self/clear_refs\n");
    exit(1);
  }
}

static void die(const char *what) {
  fprintf(stderr, "mem_per_canvas: %s: %s\n", what, dg_last_error());
  exit(1);
}

/* Peak RSS growth (kB) over B contexts and one dg_generate_batch of one canvas each. */
static long run(dg_model *m, const dg_model_info *in, int B, int steps, const char *kw) {
  dg_context *ctx[8];
  const int32_t *pr[8];
  size_t np[8];
  dg_gen_params gp[8];
  dg_gen_result r[8];
  int32_t prompt[8];
  for (int i = 0; i < 8; i++) prompt[i] = 2 + (i * 37) % (in->vocab_size - 2);
  dg_context_params cp = dg_context_default_params();
  cp.max_context = 8 + in->canvas_length;
  malloc_trim(0); /* the previous run's freed blocks back to the system */
  hwm_reset();
  const long base = dg_proc_kb("VmRSS:");
  for (int i = 0; i < B; i++) {
    if (dg_context_new(m, &cp, &ctx[i])) die("context");
    pr[i] = prompt;
    np[i] = 8;
    gp[i] = dg_gen_default_params(m);
    gp[i].max_new_tokens = in->canvas_length;
    gp[i].max_denoising_steps = steps;
    gp[i].n_stop_ids = 0;
    gp[i].seed = 5;
    if (dg_gen_params_apply_json(&gp[i], kw)) die("gen-kwargs");
  }
  if (dg_generate_batch(ctx, B, pr, np, gp, r)) die("generate");
  const long peak = dg_proc_kb("VmHWM:");
  for (int i = 0; i < B; i++) {
    dg_gen_result_free(&r[i]);
    dg_context_free(ctx[i]);
  }
  return peak - base;
}

int main(int argc, char **argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: mem_per_canvas MODEL_DIR B STEPS THREADS [GEN_KWARGS]\n");
    return 2;
  }
  const char *kw = argc > 5 ? argv[5] : "{\"diffusion_turbo\": true}";
  const int B = atoi(argv[2]), steps = atoi(argv[3]);
  if (B < 2 || B > 8 || steps < 1) {
    fprintf(stderr, "mem_per_canvas: B in [2, 8], STEPS >= 1\n");
    return 2;
  }
  dg_model_params mp = dg_model_default_params();
  mp.no_tokenizer = 1;
  mp.n_threads = atoi(argv[4]);
  dg_model *m;
  if (dg_model_load(argv[1], &mp, &m)) die("load");
  dg_model_info in;
  dg_model_get_info(m, &in);
  run(m, &in, 1, 1, kw); /* warm-up: the weights' pages */
  const long one = run(m, &in, 1, steps, kw), many = run(m, &in, B, steps, kw);
  printf("vocab %d, hidden %d, canvas %d, %d layers, %s: peak RSS +%.1f MB for one canvas, +%.1f MB for %d: "
         "%.1f MB per canvas (process peak %ld MB)\n",
         in.vocab_size, in.hidden_size, in.canvas_length, in.n_layers, kw, one / 1024.0, many / 1024.0, B,
         (double)(many - one) / 1024.0 / (B - 1), dg_proc_kb("VmHWM:") / 1024);
  dg_model_free(m);
  return 0;
}
