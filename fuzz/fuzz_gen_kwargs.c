/* fuzz_gen_kwargs.c: libFuzzer harness of the CLI's --gen-kwargs JSON
 * (dg_gen_params_apply_json in src/io/config.c, strict: unknown keys are errors;
 * the turbo keys included). Input: the argument's bytes (cut at the first NUL,
 * as a command line would). Properties: an error has a message and leaves the
 * parameters untouched; accepted values keep t_min <= t_max and the stop-id
 * count in range. */
#include "io/config.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  char *s = fz_text(d, n);
  dg_gen_params p, before;
  dg_gen_params_reference_defaults(&p);
  dg_turbo_default_params(&p.turbo);
  before = p;
  dg_status rc = dg_gen_params_apply_json(&p, s);
  fz_check_error(rc);
  if (rc != DG_OK) {
    if (memcmp(&p, &before, sizeof p)) fz_fail("error %s changed the parameters", dg_status_str(rc));
  } else {
    if (!(p.t_min <= p.t_max)) fz_fail("t_min %g > t_max %g", p.t_min, p.t_max);
    if (p.n_stop_ids < 0 || p.n_stop_ids > DG_MAX_STOP_IDS) fz_fail("n_stop_ids %d", p.n_stop_ids);
  }
  free(s);
  return 0;
}
