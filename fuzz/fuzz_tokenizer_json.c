/* fuzz_tokenizer_json.c: libFuzzer harness of tokenizer.json loading
 * (dg_tokenizer_load_text in src/io/tokenizer.c) with the real model vocabulary
 * size (262,144). Input: the text of a tokenizer.json. Properties: an error
 * has a message and no object; a loaded tokenizer encodes a fixed text (plain
 * words, the control tokens, multi-byte characters) and the input itself when
 * it is valid UTF-8, to ids inside [0, n_ids), and decodes them again. */
#include "fuzz.h"
#include "io/tokenizer.h"

static void use(const dg_tokenizer *t, const char *s, size_t n) {
  for (int special = 0; special < 2; special++) {
    int32_t *ids = NULL;
    size_t m = 0;
    dg_status rc = dg_tokenizer_encode(t, s, n, special, &ids, &m);
    fz_check_error(rc);
    if (rc == DG_OK) {
      for (size_t i = 0; i < m; i++)
        if (ids[i] < 0 || ids[i] >= dg_tokenizer_n_ids(t)) fz_fail("id %d outside [0, %d)", ids[i], dg_tokenizer_n_ids(t));
      char *out = NULL;
      rc = dg_tokenizer_decode(t, ids, m, special, &out);
      fz_check_error(rc);
      if (rc != DG_OK && rc != DG_ERR_INVALID_ARG) fz_fail("decode: %s", dg_status_str(rc));
      free(out);
    } else if (rc != DG_ERR_TOKENIZER) {
      fz_fail("encode of valid UTF-8: %s: %s", dg_status_str(rc), dg_last_error());
    }
    free(ids);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  dg_tokenizer *t = (dg_tokenizer *)1;
  dg_status rc = dg_tokenizer_load_text("tokenizer.json", (const char *)d, n, 262144, &t);
  fz_check_error(rc);
  if (rc != DG_OK) {
    if (t) fz_fail("error %s but an object", dg_status_str(rc));
    return 0;
  }
  static const char sample[] = "<bos><|turn>user\nHello,  world!\t12345 caf\xc3\xa9 \xe2\x96\x81 \xf0\x9f\x99\x82<turn|>\n";
  use(t, sample, sizeof sample - 1);
  if (n <= 4096 && dg_utf8_validate((const char *)d, n, "input") == DG_OK) use(t, (const char *)d, n);
  for (int32_t id = 0; id < dg_tokenizer_n_ids(t) && id < 512; id++) {
    const char *p = dg_tokenizer_piece(t, id);
    if (p && dg_tokenizer_piece_id(t, p) < 0) fz_fail("piece of id %d not found back", id);
  }
  dg_tokenizer_free(t);
  return 0;
}
