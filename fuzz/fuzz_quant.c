/* fuzz_quant.c: libFuzzer harness of the MLX quantization fields of
 * config.json ("quantization" / "quantization_config" / text_config's;
 * dg_quant_config_parse in src/io/quant.c). Properties: an error has a message
 * and leaves nothing allocated (LeakSanitizer); an accepted block has
 * supported bits and group sizes for its defaults and every override, and
 * dg_quant_config_lookup returns them. */
#include "fuzz.h"
#include "io/quant.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  dg_quant_config qc;
  dg_status rc = dg_quant_config_parse("config.json", (const char *)d, n, &qc);
  fz_check_error(rc);
  if (rc != DG_OK) {
    if (qc.ov || qc.n_ov) fz_fail("error %s but overrides kept", dg_status_str(rc));
    return 0;
  }
  if (qc.present && (!dg_quant_bits_ok(qc.bits) || !dg_quant_group_ok(qc.group_size)))
    fz_fail("accepted bits %d group %d", qc.bits, qc.group_size);
  for (int i = 0; i < qc.n_ov; i++) {
    const dg_quant_override *o = &qc.ov[i];
    if (o->quantized && (!dg_quant_bits_ok(o->bits) || !dg_quant_group_ok(o->group_size)))
      fz_fail("accepted override bits %d group %d", o->bits, o->group_size);
    for (int k = 0; k < i; k++) /* a repeated key: the first entry answers the lookup */
      if (!strcmp(qc.ov[k].path, o->path)) { o = &qc.ov[k]; break; }
    int b = 0, g = 0, q = dg_quant_config_lookup(&qc, o->path, &b, &g);
    if (q != o->quantized || (q && (b != o->bits || g != o->group_size)))
      fz_fail("lookup of \"%s\" gives (%d, %d, %d), its entry (%d, %d, %d)", o->path, q, b, g, o->quantized,
              o->bits, o->group_size);
  }
  dg_quant_config_free(&qc);
  return 0;
}
