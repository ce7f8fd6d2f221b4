/* fuzz_chat.c: libFuzzer harness of the chat template (dg_chat_render in
 * src/io/chat.c) over arbitrary messages, with the bundled model's tokenizer (or
 * DG_FUZZ_TOKENIZER's). Input: byte 0 bit 0 = enable_thinking; the rest is
 * split at 0x00 bytes into messages, each starting with a role byte (mod 6:
 * system, developer, user, assistant, model, or an unknown role "tool").
 * Properties: rendering fails exactly when there is no message, a role is
 * unknown or a content is invalid UTF-8; the ids start with <bos>, end with
 * the generation prompt, and lie in [0, n_ids). */
#include "fuzz.h"
#include "io/tokenizer.h"

static dg_tokenizer *g_tok;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *path = getenv("DG_FUZZ_TOKENIZER");
  if (!path || !*path) path = "models/dgemma-small/tokenizer.json";
  if (dg_tokenizer_load(path, 262144, &g_tok)) {
    fprintf(stderr, "fuzz_chat: %s\n", dg_last_error());
    exit(1);
  }
  return 0;
}

#define MAX_MSGS 64

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  if (n == 0) return 0;
  static const char *roles[6] = {"system", "developer", "user", "assistant", "model", "tool"};
  int thinking = d[0] & 1;
  char *s = fz_text(d + 1, n - 1);
  dg_chat_message msgs[MAX_MSGS];
  size_t nm = 0;
  int valid = 1;
  for (char *p = s; p < s + (n - 1) && nm < MAX_MSGS;) {
    size_t l = strlen(p);
    if (l > 0) {
      int r = (unsigned char)p[0] % 6;
      msgs[nm].role = roles[r];
      msgs[nm].content = p + 1;
      if (r == 5 || dg_utf8_validate(p + 1, l - 1, "content") != DG_OK) valid = 0;
      nm++;
    }
    p += l + 1;
  }
  if (nm == 0) valid = 0;
  int32_t *ids = NULL;
  size_t m = 0;
  dg_status rc = dg_chat_render(g_tok, msgs, nm, thinking, &ids, &m);
  fz_check_error(rc);
  if ((rc == DG_OK) != valid) fz_fail("render %s on %s messages: %s", dg_status_str(rc), valid ? "valid" : "invalid", dg_last_error());
  if (rc == DG_OK) {
    if (m < 3 || ids[0] != dg_tokenizer_piece_id(g_tok, "<bos>")) fz_fail("no <bos> first");
    for (size_t i = 0; i < m; i++)
      if (ids[i] < 0 || ids[i] >= dg_tokenizer_n_ids(g_tok)) fz_fail("id %d outside range", ids[i]);
    int32_t last = ids[m - 1];
    int32_t want = thinking ? dg_tokenizer_piece_id(g_tok, "\n") : dg_tokenizer_piece_id(g_tok, "<channel|>");
    if (last != want) fz_fail("last id %d, want %d", last, want);
  }
  free(ids);
  free(s);
  return 0;
}
