/* fuzz_tokenize.c: libFuzzer harness of tokenizer encode and decode on
 * arbitrary bytes (src/io/tokenizer.c), with a real tokenizer loaded once: the
 * bundled model's (models/dgemma-small/tokenizer.json, run from the repository
 * root) or the one named by DG_FUZZ_TOKENIZER (e.g. Gemma's
 * .cache/gemma3/tokenizer.json). Input: byte 0 holds the flags (bit 0
 * parse_special, bit 1 keep_special), the rest is text; the same bytes are
 * also read as int32 ids for decode. Properties: encode fails exactly on
 * invalid UTF-8; ids lie in [0, n_ids); decoding them succeeds; with no
 * special token, no U+2581 and no NUL in the text, decode(encode(text)) is
 * the text; decode of arbitrary ids fails exactly when one is out of range. */
#include "fuzz.h"
#include "io/tokenizer.h"

static dg_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *path = getenv("DG_FUZZ_TOKENIZER");
  if (!path || !*path) path = "models/dgemma-small/tokenizer.json";
  if (dg_tokenizer_load(path, 262144, &g_tok)) {
    fprintf(stderr, "fuzz_tokenize: %s\n", dg_last_error());
    exit(1);
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  if (n == 0) return 0;
  int parse_special = d[0] & 1, keep_special = (d[0] >> 1) & 1;
  const char *s = (const char *)d + 1;
  size_t len = n - 1;
  int valid = dg_utf8_validate(s, len, "text") == DG_OK;
  int32_t *ids = NULL;
  size_t m = 0;
  dg_status rc = dg_tokenizer_encode(g_tok, s, len, parse_special, &ids, &m);
  fz_check_error(rc);
  if ((rc == DG_OK) != valid) fz_fail("encode %s on %s UTF-8", dg_status_str(rc), valid ? "valid" : "invalid");
  if (rc == DG_OK) {
    int plain = !memchr(s, 0, len) && !memmem(s, len, "\xe2\x96\x81", 3);
    for (size_t i = 0; i < m; i++) {
      if (ids[i] < 0 || ids[i] >= dg_tokenizer_n_ids(g_tok)) fz_fail("id %d outside [0, %d)", ids[i], dg_tokenizer_n_ids(g_tok));
      if (dg_tokenizer_is_special(g_tok, ids[i])) plain = 0;
    }
    char *out = NULL;
    rc = dg_tokenizer_decode(g_tok, ids, m, keep_special, &out);
    fz_check_error(rc);
    if (rc != DG_OK) fz_fail("decode of encoded ids: %s", dg_last_error());
    if (plain && (strlen(out) != len || memcmp(out, s, len)))
      fz_fail("decode(encode(text)) differs: %zu bytes in, %zu out", len, strlen(out));
    free(out);
  }
  free(ids);

  /* the bytes as ids */
  size_t k = len / 4;
  int32_t *raw = malloc((k ? k : 1) * sizeof *raw);
  if (!raw) abort();
  memcpy(raw, s, k * 4);
  int in_range = 1;
  for (size_t i = 0; i < k; i++) {
    if (i % 2 == 0 && raw[i] < 0) raw[i] = (int32_t)((uint32_t)raw[i] >> 1) % dg_tokenizer_n_ids(g_tok);
    if (raw[i] < 0 || raw[i] >= dg_tokenizer_n_ids(g_tok)) in_range = 0;
  }
  char *out = NULL;
  rc = dg_tokenizer_decode(g_tok, raw, k, keep_special, &out);
  fz_check_error(rc);
  if ((rc == DG_OK) != in_range) fz_fail("decode %s with ids %s range", dg_status_str(rc), in_range ? "in" : "out of");
  free(out);
  free(raw);
  return 0;
}
