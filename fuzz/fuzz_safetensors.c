/* fuzz_safetensors.c: libFuzzer harness of the safetensors header parser
 * (src/io/safetensors.c through dg_st_open_memory: the same checks as a file).
 * Input: a whole .safetensors file image. Properties: an error has a message
 * and no object; an accepted file's tensors lie inside the input, tile the
 * data region, have nbytes = prod(shape) * dtype size and are found by name. */
#include "fuzz.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  /* a copy of exactly n bytes, so that ASan sees any read past the input */
  uint8_t *buf = malloc(n ? n : 1);
  if (!buf) abort();
  if (n) memcpy(buf, d, n);
  dg_safetensors *st = (dg_safetensors *)1;
  dg_status rc = dg_st_open_memory("fuzz.safetensors", buf, n, &st);
  fz_check_error(rc);
  if (rc != DG_OK) {
    if (st) fz_fail("error %s but an object", dg_status_str(rc));
    free(buf);
    return 0;
  }
  uint64_t hlen = 0;
  for (int i = 0; i < 8; i++) hlen |= (uint64_t)buf[i] << (8 * i);
  const uint8_t *data = buf + 8 + hlen, *end = buf + n;
  size_t covered = 0;
  for (size_t i = 0; i < dg_st_count(st); i++) {
    const dg_tensor *t = dg_st_at(st, i);
    if (!t || !t->name) fz_fail("tensor %zu missing", i);
    if (dg_st_find(st, t->name) != t) fz_fail("tensor \"%s\" not found by name", t->name);
    if (t->ndim < 0 || t->ndim > DG_MAX_DIMS) fz_fail("ndim %d", t->ndim);
    uint64_t e = 1;
    for (int k = 0; k < t->ndim; k++) {
      if (t->shape[k] < 0) fz_fail("negative dim");
      e *= (uint64_t)t->shape[k];
    }
    if (e * dg_dtype_size(t->dtype) != t->nbytes) fz_fail("nbytes %zu != prod(shape) * size", t->nbytes);
    const uint8_t *p = t->data;
    if (t->nbytes && (p < data || p + t->nbytes > end)) fz_fail("tensor \"%s\" outside the data region", t->name);
    if (t->nbytes) {
      volatile uint8_t x = p[0] ^ p[t->nbytes - 1]; /* ASan checks both ends */
      (void)x;
    }
    covered += t->nbytes;
  }
  if (covered != (size_t)(end - data)) fz_fail("tensors cover %zu of %td data bytes", covered, end - data);
  (void)dg_st_metadata(st, "format");
  dg_st_close(st);
  free(buf);
  return 0;
}
