/* fuzz_gen_config.c: libFuzzer harness of generation_config.json
 * (dg_gen_config_parse in src/io/config.c, flat and nested layouts). Properties:
 * an error has a message; accepted values are in the ranges the sampler needs
 * (t_min <= t_max, at most DG_MAX_STOP_IDS stop ids, each >= 0). */
#include "io/config.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  dg_gen_params p;
  dg_status rc = dg_gen_config_parse("generation_config.json", (const char *)d, n, &p);
  fz_check_error(rc);
  if (rc != DG_OK) return 0;
  if (!(p.t_min <= p.t_max)) fz_fail("t_min %g > t_max %g", p.t_min, p.t_max);
  if (p.n_stop_ids < 0 || p.n_stop_ids > DG_MAX_STOP_IDS) fz_fail("n_stop_ids %d", p.n_stop_ids);
  for (int i = 0; i < p.n_stop_ids; i++)
    if (p.stop_ids[i] < 0) fz_fail("stop id %d", p.stop_ids[i]);
  if (p.max_new_tokens < 0 || p.max_denoising_steps < 0) fz_fail("negative count");
  return 0;
}
