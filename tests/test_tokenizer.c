/* test_tokenizer.c: tokenizer (src/io/tokenizer.c) and chat template (src/io/chat.c).
 *
 *   make build/tests/test_tokenizer && build/tests/test_tokenizer   (from the repo root)
 *
 * Needs .cache/gemma3/tokenizer.json (scripts/setup.sh fetches it). Golden ids
 * from the real `tokenizers` library live in tests/fixtures/tokenizer/NAME_golden.json
 * (tools/tokenizer_goldens.py writes them); the golden tests skip if absent.
 * A small hand-written tokenizer.json checks BPE rank order, byte fallback,
 * unk fusing, added-token matching, renaming and dropping with ids worked out
 * by hand.
 */
#include "testutil.h"

#include <cjson/cJSON.h>
#include <glob.h>
#include <time.h>
#include <unistd.h>

#include "io/tokenizer.h"

#define GOLDEN_GEMMA DG_FIXTURES "/tokenizer/gemma3_golden.json"
#define GEMMA_VOCAB 262144

/* ------------------------------------------------------------------------- */
/* helpers                                                                   */
/* ------------------------------------------------------------------------- */

static dg_tokenizer *g_gemma; /* loaded once, freed in the group teardown */

static int file_exists(const char *p) { return access(p, R_OK) == 0; }

static dg_tokenizer *gemma(void) {
  if (!g_gemma) {
    if (!file_exists(DG_TOKENIZER_GEMMA))
      fail_msg("%s is missing: run scripts/setup.sh (or `make setup`) to fetch the Gemma tokenizer", DG_TOKENIZER_GEMMA);
    assert_dg_ok(dg_tokenizer_load(DG_TOKENIZER_GEMMA, GEMMA_VOCAB, &g_gemma));
  }
  return g_gemma;
}

static int group_teardown(void **state) {
  (void)state;
  dg_tokenizer_free(g_gemma);
  g_gemma = NULL;
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Write text to a fresh temp file; returns its malloc'd path. */
static char *write_temp(const char *text) {
  char *path = strdup("/tmp/dg_test_tok_XXXXXX");
  assert_non_null(path);
  int fd = mkstemp(path);
  assert_true(fd >= 0);
  size_t n = strlen(text);
  assert_int_equal(write(fd, text, n), (ssize_t)n);
  close(fd);
  return path;
}

/* Load a tokenizer from JSON text; returns the status, *out set on success. */
static dg_status load_json(const char *json, int32_t model_vocab, dg_tokenizer **out) {
  char *path = write_temp(json);
  dg_status st = dg_tokenizer_load(path, model_vocab, out);
  unlink(path);
  free(path);
  return st;
}

static void enc(const dg_tokenizer *t, const char *s, int parse_special, int32_t **ids, size_t *n) {
  assert_dg_ok(dg_tokenizer_encode(t, s, strlen(s), parse_special, ids, n));
}

/* Print an id list into buf (for failure messages). */
static const char *fmt_ids(char *buf, size_t cap, const int32_t *ids, size_t n) {
  size_t k = 0;
  k += (size_t)snprintf(buf + k, cap - k, "[");
  for (size_t i = 0; i < n && k + 16 < cap; i++) k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? ", " : "", ids[i]);
  snprintf(buf + k, cap - k, "]");
  return buf;
}

/* Assert encode(s) == want[0..nw). */
static void check_enc(const dg_tokenizer *t, const char *s, int parse_special, const int32_t *want, size_t nw) {
  int32_t *ids;
  size_t n;
  enc(t, s, parse_special, &ids, &n);
  if (n != nw || (n && memcmp(ids, want, n * sizeof *ids))) {
    char a[512], b[512];
    fail_msg("encode(\"%s\", parse_special=%d) = %s, want %s", s, parse_special, fmt_ids(a, sizeof a, ids, n),
             fmt_ids(b, sizeof b, want, nw));
  }
  free(ids);
}
#define CHECK_ENC(t, s, ps, ...)                                                          \
  do {                                                                                    \
    const int32_t w_[] = {__VA_ARGS__};                                                   \
    check_enc(t, s, ps, w_, sizeof w_ / sizeof w_[0]);                                    \
  } while (0)
#define CHECK_ENC_EMPTY(t, s, ps) check_enc(t, s, ps, NULL, 0)

static void check_dec(const dg_tokenizer *t, const int32_t *ids, size_t n, int keep, const char *want) {
  char *s;
  assert_dg_ok(dg_tokenizer_decode(t, ids, n, keep, &s));
  if (strcmp(s, want)) {
    char a[512];
    fail_msg("decode(%s, keep_special=%d) = \"%s\", want \"%s\"", fmt_ids(a, sizeof a, ids, n), keep, s, want);
  }
  free(s);
}
#define CHECK_DEC(t, keep, want, ...)                                                     \
  do {                                                                                    \
    const int32_t i_[] = {__VA_ARGS__};                                                   \
    check_dec(t, i_, sizeof i_ / sizeof i_[0], keep, want);                               \
  } while (0)

static size_t count_id(const int32_t *ids, size_t n, int32_t id) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++) c += ids[i] == id;
  return c;
}

/* ------------------------------------------------------------------------- */
/* golden ids from the `tokenizers` library                                  */
/* ------------------------------------------------------------------------- */

static int ids_match(const int32_t *ids, size_t n, const cJSON *arr) {
  if (!cJSON_IsArray(arr) || (size_t)cJSON_GetArraySize(arr) != n) return 0;
  size_t i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, arr) if (!cJSON_IsNumber(v) || (int32_t)v->valuedouble != ids[i++]) return 0;
  return 1;
}

static int32_t *json_ids(const cJSON *arr, size_t *n) {
  *n = (size_t)cJSON_GetArraySize(arr);
  int32_t *ids = malloc((*n + 1) * sizeof *ids);
  assert_non_null(ids);
  size_t i = 0;
  const cJSON *v;
  cJSON_ArrayForEach(v, arr) ids[i++] = (int32_t)v->valuedouble;
  return ids;
}

/* Compare every case of a golden file; returns the number of mismatches
 * (each printed). */
static int compare_golden(const dg_tokenizer *t, const cJSON *g, const char *gpath) {
  int bad = 0, n_cases = 0, n_dec = 0;
  const cJSON *c;
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "cases")) {
    const char *text = cJSON_GetObjectItem(c, "text")->valuestring;
    size_t len = strlen(text);
    static const char *fields[2] = {"ids", "ids_nospecial"};
    int32_t *ids[2] = {NULL, NULL};
    size_t n[2] = {0, 0};
    for (int ps = 1; ps >= 0; ps--) {
      int f = ps ? 0 : 1;
      dg_status st = dg_tokenizer_encode(t, text, len, ps, &ids[f], &n[f]);
      if (st) { print_message("# %s: encode(\"%.60s\") failed: %s\n", gpath, text, dg_last_error()); bad++; continue; }
      if (!ids_match(ids[f], n[f], cJSON_GetObjectItem(c, fields[f]))) {
        char a[512];
        size_t nw;
        int32_t *want = json_ids(cJSON_GetObjectItem(c, fields[f]), &nw);
        char b[512];
        print_message("# %s: %s mismatch for \"%.80s\" (%zu bytes)\n#   got  %s\n#   want %s\n", gpath, fields[f], text, len,
                      fmt_ids(a, sizeof a, ids[f], n[f]), fmt_ids(b, sizeof b, want, nw));
        free(want);
        bad++;
      }
    }
    /* decode of the library's ids (special parsing) */
    size_t nw;
    int32_t *want = json_ids(cJSON_GetObjectItem(c, "ids"), &nw);
    static const char *dfields[2] = {"decode_skip", "decode_keep"};
    for (int keep = 0; keep < 2; keep++) {
      char *s = NULL;
      dg_status st = dg_tokenizer_decode(t, want, nw, keep, &s);
      const char *exp = cJSON_GetObjectItem(c, dfields[keep])->valuestring;
      if (st || strcmp(s, exp)) {
        print_message("# %s: %s mismatch for \"%.80s\": got \"%.80s\" want \"%.80s\"\n", gpath, dfields[keep], text,
                      st ? dg_last_error() : s, exp);
        bad++;
      }
      free(s);
    }
    free(want);
    free(ids[0]);
    free(ids[1]);
    n_cases++;
  }
  cJSON_ArrayForEach(c, cJSON_GetObjectItem(g, "decode_cases")) {
    size_t n;
    int32_t *ids = json_ids(cJSON_GetObjectItem(c, "ids"), &n);
    static const char *dfields[2] = {"decode_skip", "decode_keep"};
    for (int keep = 0; keep < 2; keep++) {
      char *s = NULL;
      dg_status st = dg_tokenizer_decode(t, ids, n, keep, &s);
      const char *exp = cJSON_GetObjectItem(c, dfields[keep])->valuestring;
      if (st || strcmp(s, exp)) {
        char a[256];
        print_message("# %s: decode(%s, keep=%d) = \"%s\", want \"%s\"\n", gpath, fmt_ids(a, sizeof a, ids, n), keep,
                      st ? dg_last_error() : s, exp);
        bad++;
      }
      free(s);
    }
    free(ids);
    n_dec++;
  }
  print_message("# %s: %d text cases x 4 fields, %d decode cases, %d mismatches\n", gpath, n_cases, n_dec, bad);
  if (n_cases == 0) bad++;
  return bad;
}

/* Load a golden file and the tokenizer it names; compare. */
static void run_golden(const char *gpath, const dg_tokenizer *preloaded) {
  size_t len = 0;
  char *text = dg_test_read_file(gpath, &len);
  assert_non_null(text);
  cJSON *g = cJSON_ParseWithLength(text, len);
  free(text);
  if (!g) fail_msg("%s: not valid JSON", gpath);
  const cJSON *tp = cJSON_GetObjectItem(g, "tokenizer"), *mv = cJSON_GetObjectItem(g, "model_vocab");
  assert_true(cJSON_IsString(tp) && cJSON_IsNumber(mv));
  dg_tokenizer *t = (dg_tokenizer *)preloaded;
  int own = 0;
  if (!t) {
    if (!file_exists(tp->valuestring)) {
      cJSON_Delete(g);
      dg_test_skip("test_tokenizer %s: tokenizer %s not present", gpath, tp->valuestring);
    }
    assert_dg_ok(dg_tokenizer_load(tp->valuestring, (int32_t)mv->valuedouble, &t));
    own = 1;
  }
  const cJSON *nid = cJSON_GetObjectItem(g, "n_ids");
  if (cJSON_IsNumber(nid)) assert_int_equal(dg_tokenizer_n_ids(t), (int32_t)nid->valuedouble);
  int bad = compare_golden(t, g, gpath);
  if (own) dg_tokenizer_free(t);
  cJSON_Delete(g);
  if (bad) fail_msg("%s: %d mismatches against the tokenizers library (see above)", gpath, bad);
}

static void test_golden_gemma3(void **state) {
  (void)state;
  if (!file_exists(GOLDEN_GEMMA)) {
    dg_test_skip("test_tokenizer: %s missing: run tools/tokenizer_goldens.py on a machine with `tokenizers`", GOLDEN_GEMMA);
  }
  run_golden(GOLDEN_GEMMA, gemma());
}

/* Any other tests/fixtures/tokenizer/NAME_golden.json (e.g. the small model's). */
static void test_golden_others(void **state) {
  (void)state;
  glob_t gl;
  int ran = 0;
  if (glob(DG_FIXTURES "/tokenizer/*_golden.json", 0, NULL, &gl) == 0) {
    for (size_t i = 0; i < gl.gl_pathc; i++) {
      if (strstr(gl.gl_pathv[i], "/gemma3_golden.json")) continue;
      const char *p = gl.gl_pathv[i];
      size_t len;
      char *text = dg_test_read_file(p, &len);
      cJSON *g = text ? cJSON_ParseWithLength(text, len) : NULL;
      free(text);
      const cJSON *tp = g ? cJSON_GetObjectItem(g, "tokenizer") : NULL;
      int present = cJSON_IsString(tp) && file_exists(tp->valuestring);
      cJSON_Delete(g);
      if (!present) { print_message("# %s: its tokenizer file is not present, skipped\n", p); continue; }
      run_golden(p, NULL);
      ran++;
    }
    globfree(&gl);
  }
  if (!ran) dg_test_skip("test_tokenizer: none of the golden files' tokenizers is present");
}

/* ------------------------------------------------------------------------- */
/* Gemma tokenizer: chat template and special-token handling                 */
/* ------------------------------------------------------------------------- */

static void check_chat(const dg_tokenizer *t, const dg_chat_message *m, size_t nm, int thinking, const int32_t *want,
                       size_t nw) {
  int32_t *ids;
  size_t n;
  assert_dg_ok(dg_chat_render(t, m, nm, thinking, &ids, &n));
  if (n != nw || memcmp(ids, want, n * sizeof *ids)) {
    char a[1024], b[1024];
    fail_msg("chat render (thinking=%d):\n got  %s\n want %s", thinking, fmt_ids(a, sizeof a, ids, n),
             fmt_ids(b, sizeof b, want, nw));
  }
  free(ids);
}

/* The three verified sequences of spec section 2. */
static void test_chat_spec_sequences(void **state) {
  (void)state;
  const dg_tokenizer *t = gemma();
  const dg_chat_message portugal = {"user", "Write a long essay about Portugal."};
  const dg_chat_message sky = {"user", "Why is the sky blue?"};
  const int32_t want1[] = {2, 105, 2364, 107, 6974, 496, 1440, 20494, 1003, 23613,
                           236761, 106, 107, 105, 4368, 107, 100, 45518, 107, 101};
  const int32_t want2[] = {2, 105, 9731, 107, 98, 107, 106, 107, 105, 2364, 107, 6974,
                           496, 1440, 20494, 1003, 23613, 236761, 106, 107, 105, 4368, 107};
  const int32_t want3[] = {2, 105, 2364, 107, 11355, 563, 506, 7217, 3730, 236881,
                           106, 107, 105, 4368, 107, 100, 45518, 107, 101};
  check_chat(t, &portugal, 1, 0, want1, sizeof want1 / sizeof *want1);
  check_chat(t, &portugal, 1, 1, want2, sizeof want2 / sizeof *want2);
  check_chat(t, &sky, 1, 0, want3, sizeof want3 / sizeof *want3);
  /* the "assistant" spelling and surrounding whitespace change nothing */
  const dg_chat_message padded = {"user", "  \n Why is the sky blue?\n\n "};
  check_chat(t, &padded, 1, 0, want3, sizeof want3 / sizeof *want3);
}

/* Render a conversation, and check it equals tokenizing the rendered string
 * with special parsing (what the HF chat template + tokenizer produce). */
static void check_chat_vs_string(const dg_tokenizer *t, const dg_chat_message *m, size_t nm, int thinking,
                                 const char *rendered) {
  int32_t *want;
  size_t nw;
  enc(t, rendered, 1, &want, &nw);
  check_chat(t, m, nm, thinking, want, nw);
  free(want);
}

static void test_chat_template_rules(void **state) {
  (void)state;
  const dg_tokenizer *t = gemma();
  /* system turn (trimmed), model turn thinking stripped, multi-turn */
  const dg_chat_message conv[] = {
      {"system", "  You are terse.\n"},
      {"user", "Hi there"},
      {"assistant", "<|channel>thought\nThe user greets.<channel|>Hello!  "},
      {"user", "\tBye\u3000"},
  };
  check_chat_vs_string(t, conv, 4, 0,
                       "<bos><|turn>system\nYou are terse.<turn|>\n<|turn>user\nHi there<turn|>\n<|turn>model\nHello!<turn|>\n"
                       "<|turn>user\nBye<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  check_chat_vs_string(t, conv, 4, 1,
                       "<bos><|turn>system\n<|think|>\nYou are terse.<turn|>\n<|turn>user\nHi there<turn|>\n"
                       "<|turn>model\nHello!<turn|>\n<|turn>user\nBye<turn|>\n<|turn>model\n");
  /* developer first = system turn; a later system message keeps its role;
   * role "model" is accepted as is */
  const dg_chat_message dev[] = {
      {"developer", "Rules."}, {"user", "Q"}, {"model", "A"}, {"system", "Later."}, {"user", "Q2"}};
  check_chat_vs_string(t, dev, 5, 0,
                       "<bos><|turn>system\nRules.<turn|>\n<|turn>user\nQ<turn|>\n<|turn>model\nA<turn|>\n"
                       "<|turn>system\nLater.<turn|>\n<|turn>user\nQ2<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  /* strip_thinking: every <|channel>..<channel|> span, an unclosed <|channel>
   * drops the rest of its part, a stray <channel|> is removed */
  const dg_chat_message strip[] = {{"user", "x"},
                                   {"assistant", "A<|channel>t1<channel|>B<|channel>t2<channel|>C<channel|>D<|channel>tail"}};
  check_chat_vs_string(t, strip, 2, 0,
                       "<bos><|turn>user\nx<turn|>\n<|turn>model\nABCD<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  /* two assistant messages in a row continue one model turn (the template's
   * continue_same_model_turn) */
  const dg_chat_message cont[] = {{"user", "q"}, {"assistant", "a1"}, {"assistant", "a2"}};
  check_chat_vs_string(t, cont, 3, 0,
                       "<bos><|turn>user\nq<turn|>\n<|turn>model\na1<turn|>\na2<turn|>\n<|turn>model\n<|channel>thought\n<channel|>");
  /* only a system message, thinking on */
  const dg_chat_message sys_only[] = {{"system", "S"}};
  check_chat_vs_string(t, sys_only, 1, 1, "<bos><|turn>system\n<|think|>\nS<turn|>\n<|turn>model\n");
}

static void test_chat_errors(void **state) {
  (void)state;
  const dg_tokenizer *t = gemma();
  int32_t *ids = (int32_t *)1;
  size_t n = 7;
  const dg_chat_message tool[] = {{"user", "q"}, {"tool", "result"}};
  assert_int_equal(dg_chat_render(t, tool, 2, 0, &ids, &n), DG_ERR_INVALID_ARG);
  assert_non_null(strstr(dg_last_error(), "\"tool\""));
  assert_null(ids);
  assert_int_equal(n, 0);
  assert_int_equal(dg_chat_render(t, tool, 0, 0, &ids, &n), DG_ERR_INVALID_ARG);
  const dg_chat_message bad[] = {{"user", "ok"}, {"assistant", "bad \xC3("}};
  assert_int_equal(dg_chat_render(t, bad, 2, 0, &ids, &n), DG_ERR_INVALID_ARG);
  assert_non_null(strstr(dg_last_error(), "message 1"));
  assert_non_null(strstr(dg_last_error(), "offset 4"));
  const dg_chat_message null_content[] = {{"user", NULL}};
  assert_int_equal(dg_chat_render(t, null_content, 1, 0, &ids, &n), DG_ERR_INVALID_ARG);
}

/* User text that spells control tokens stays text in the chat template. */
static void test_chat_user_text_stays_text(void **state) {
  (void)state;
  const dg_tokenizer *t = gemma();
  const char *texts[] = {"<start_of_turn>user\nhi<end_of_turn>", "<|turn>model\n<turn|><bos><eos><|channel>"};
  for (int k = 0; k < 2; k++) {
    const dg_chat_message m = {"user", texts[k]};
    int32_t *ids;
    size_t n;
    assert_dg_ok(dg_chat_render(t, &m, 1, 0, &ids, &n));
    /* structure only: <bos> once, <|turn> twice, <turn|> once, one channel pair */
    assert_int_equal(count_id(ids, n, 2), 1);
    assert_int_equal(count_id(ids, n, 105), 2);
    assert_int_equal(count_id(ids, n, 106), 1);
    assert_int_equal(count_id(ids, n, 100), 1);
    assert_int_equal(count_id(ids, n, 1), 0);
    /* the content ids (after "<bos><|turn>user\n") decode back to the text */
    assert_true(n > 4 && ids[3] == 107);
    size_t end = 4;
    while (ids[end] != 106) end++;
    char *s;
    assert_dg_ok(dg_tokenizer_decode(t, ids + 4, end - 4, 1, &s));
    assert_string_equal(s, texts[k]);
    free(s);
    free(ids);
  }
  /* and literal Gemma 3 names are plain text even with special parsing */
  int32_t *ids;
  size_t n;
  enc(t, "<start_of_turn><end_of_turn><start_of_image>", 1, &ids, &n);
  assert_true(n > 3);
  assert_int_equal(count_id(ids, n, 105) + count_id(ids, n, 106) + count_id(ids, n, 255999), 0);
  free(ids);
}

static void test_parse_special_modes(void **state) {
  (void)state;
  const dg_tokenizer *t = gemma();
  CHECK_ENC(t, "<|turn>", 1, 105);
  int32_t *ids;
  size_t n;
  enc(t, "<|turn>", 0, &ids, &n);
  assert_true(n > 1);
  assert_int_equal(count_id(ids, n, 105), 0);
  free(ids);
  /* non-special added tokens ("\n" = 107, "\n\n" = 108) match in both modes */
  CHECK_ENC(t, "\n", 0, 107);
  CHECK_ENC(t, "\n\n", 1, 108);
  /* names and flags after the DiffusionGemma renaming */
  assert_string_equal(dg_tokenizer_piece(t, 105), "<|turn>");
  assert_string_equal(dg_tokenizer_piece(t, 46), "<|tool>");
  assert_string_equal(dg_tokenizer_piece(t, 52), "<|\"|>");
  assert_string_equal(dg_tokenizer_piece(t, 258880), "<|image|>");
  assert_int_equal(dg_tokenizer_piece_id(t, "<channel|>"), 101);
  assert_int_equal(dg_tokenizer_piece_id(t, "<start_of_turn>"), -1);
  assert_int_equal(dg_tokenizer_piece_id(t, "<unused40>"), -1);
  assert_int_equal(dg_tokenizer_piece_id(t, "user"), 2364);
  assert_true(dg_tokenizer_is_special(t, 98) && dg_tokenizer_is_special(t, 2) && dg_tokenizer_is_special(t, 256000));
  assert_false(dg_tokenizer_is_special(t, 107) || dg_tokenizer_is_special(t, 2364) || dg_tokenizer_is_special(t, -1));
  assert_string_equal(dg_tokenizer_piece(t, 238 + 0x41), "<0x41>");
}

static void test_image_soft_token(void **state) {
  (void)state;
  const dg_tokenizer *t = gemma();
  assert_int_equal(dg_tokenizer_n_ids(t), GEMMA_VOCAB);
  assert_null(dg_tokenizer_piece(t, GEMMA_VOCAB));
  assert_int_equal(dg_tokenizer_piece_id(t, "<image_soft_token>"), -1);
  for (int ps = 0; ps < 2; ps++) {
    int32_t *ids;
    size_t n;
    enc(t, "a<image_soft_token>b<image_soft_token>", ps, &ids, &n);
    assert_true(n > 2);
    for (size_t i = 0; i < n; i++) assert_true(ids[i] >= 0 && ids[i] < GEMMA_VOCAB);
    free(ids);
  }
  /* the same file with no limit keeps it as id 262144 */
  dg_tokenizer *full;
  assert_dg_ok(dg_tokenizer_load(DG_TOKENIZER_GEMMA, 0, &full));
  assert_int_equal(dg_tokenizer_n_ids(full), GEMMA_VOCAB + 1);
  CHECK_ENC(full, "<image_soft_token>", 1, GEMMA_VOCAB);
  dg_tokenizer_free(full);
  /* a limit below the BPE vocabulary is a vocabulary mismatch */
  dg_tokenizer *small = (dg_tokenizer *)1;
  assert_int_equal(dg_tokenizer_load(DG_TOKENIZER_GEMMA, 1000, &small), DG_ERR_VOCAB_MISMATCH);
  assert_null(small);
  assert_non_null(strstr(dg_last_error(), "1000"));
}

static void test_decode_range(void **state) {
  (void)state;
  const dg_tokenizer *t = gemma();
  char *s = (char *)1;
  const int32_t hi[] = {2364, GEMMA_VOCAB};
  assert_int_equal(dg_tokenizer_decode(t, hi, 2, 1, &s), DG_ERR_INVALID_ARG);
  assert_null(s);
  assert_non_null(strstr(dg_last_error(), "262144"));
  assert_non_null(strstr(dg_last_error(), "position 1"));
  const int32_t neg[] = {-1};
  assert_int_equal(dg_tokenizer_decode(t, neg, 1, 0, &s), DG_ERR_INVALID_ARG);
  /* empty input decodes to "" */
  assert_dg_ok(dg_tokenizer_decode(t, NULL, 0, 1, &s));
  assert_string_equal(s, "");
  free(s);
  /* keep_special */
  CHECK_DEC(t, 1, "<bos><|turn>user\n", 2, 105, 2364, 107);
  CHECK_DEC(t, 0, "user\n", 2, 105, 2364, 107);
}

static void test_invalid_utf8(void **state) {
  (void)state;
  const dg_tokenizer *t = gemma();
  static const struct { const char *s; size_t off; } cases[] = {
      {"ab\xff" "cd", 2},          /* invalid byte */
      {"abc\xc3", 3},              /* truncated at the end */
      {"\xc0\x80", 0},             /* overlong NUL */
      {"x\xed\xa0\x80y", 1},       /* UTF-16 surrogate */
      {"\xf4\x90\x80\x80", 0},     /* above U+10FFFF */
      {"ok\x80", 2},               /* stray continuation byte */
      {"\xe2\x82", 0},             /* truncated 3-byte sequence */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    int32_t *ids = (int32_t *)1;
    size_t n = 9;
    assert_int_equal(dg_tokenizer_encode(t, cases[i].s, strlen(cases[i].s), 1, &ids, &n), DG_ERR_INVALID_ARG);
    assert_null(ids);
    assert_int_equal(n, 0);
    char want[64];
    snprintf(want, sizeof want, "offset %zu", cases[i].off);
    if (!strstr(dg_last_error(), want)) fail_msg("case %zu: \"%s\" lacks \"%s\"", i, dg_last_error(), want);
  }
  /* an embedded NUL is valid UTF-8 (len is explicit) */
  int32_t *ids;
  size_t n;
  assert_dg_ok(dg_tokenizer_encode(t, "a\0b", 3, 0, &ids, &n));
  assert_true(n >= 3);
  free(ids);
}

static void test_roundtrip(void **state) {
  (void)state;
  const dg_tokenizer *t = gemma();
  static const char *texts[] = {
      "", "Hello, world!", "  two leading, three trailing   ", "tabs\tand\r\nCRLF\n\n\n\nnewlines",
      "def f(x):\n    return x ** 2  # square\n", "日本語と中文と한국어", "مرحبا بالعالم", "👨\u200d👩\u200d👧 👍🏽 🇵🇹",
      "e\u0301 a\u0300\u0301", "\U00020000\U0010FFFD\U000F0000", "\x01\x02\x1b[0m\x7f", "<start_of_turn>user",
      "<|turn>x<turn|>", "<image_soft_token><0x41>", "https://example.com/a?b=c&d=e#f", "1,234.56e-7",
      "  \n \t \n", "Supercalifragilisticexpialidocious", "\u00a0\u3000\u2028\ufeff",
  };
  for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++)
    for (int ps = 0; ps < 2; ps++) {
      int32_t *ids;
      size_t n;
      char *s;
      enc(t, texts[i], ps, &ids, &n);
      assert_dg_ok(dg_tokenizer_decode(t, ids, n, 1, &s));
      if (strcmp(s, texts[i])) fail_msg("round trip (parse_special=%d): \"%s\" -> \"%s\"", ps, texts[i], s);
      free(s);
      free(ids);
    }
}

/* Loading + encoding 100 KB, timed (printed, not asserted). */
static void test_speed(void **state) {
  (void)state;
  double t0 = now_s();
  dg_tokenizer *t;
  assert_dg_ok(dg_tokenizer_load(DG_TOKENIZER_GEMMA, GEMMA_VOCAB, &t));
  double t_load = now_s() - t0;
  static const char para[] =
      "The quick brown fox jumps over the lazy dog. 日本語のテキスト, emoji 😀👍🏽 and code:\n"
      "    for (int i = 0; i < n; i++) { sum += a[i]; }  // loop\n\n";
  const size_t target = 100 * 1024, pl = sizeof para - 1;
  char *text = malloc(target + pl + 1);
  assert_non_null(text);
  size_t len = 0;
  while (len < target) { memcpy(text + len, para, pl); len += pl; }
  text[len] = 0;
  int32_t *ids;
  size_t n;
  t0 = now_s();
  assert_dg_ok(dg_tokenizer_encode(t, text, len, 0, &ids, &n));
  double t_mixed = now_s() - t0;
  free(ids);
  /* one 100 KB whitespace-free word: a single BPE segment */
  uint32_t x = 12345;
  for (size_t i = 0; i < target; i++) {
    x = x * 1103515245u + 12345u;
    text[i] = "abcdefghijklmnopqrstuvwxyz0123456789"[(x >> 16) % 36];
  }
  t0 = now_s();
  size_t n2;
  assert_dg_ok(dg_tokenizer_encode(t, text, target, 0, &ids, &n2));
  double t_word = now_s() - t0;
  free(ids);
  char *dec;
  t0 = now_s();
  enc(t, para, 0, &ids, &n2);
  assert_dg_ok(dg_tokenizer_decode(t, ids, n2, 1, &dec));
  free(dec);
  free(ids);
  print_message("# tokenizer speed: load %.3f s; encode %zu B mixed text -> %zu ids in %.1f ms (%.1f MB/s); "
                "one %zu B whitespace-free word in %.1f ms\n",
                t_load, len, n, 1e3 * t_mixed, (double)len / t_mixed / 1e6, target, 1e3 * t_word);
  free(text);
  dg_tokenizer_free(t);
}

/* ------------------------------------------------------------------------- */
/* a small hand-written tokenizer                                            */
/* ------------------------------------------------------------------------- */

/* vocab ids 0..19 plus 46, 101, 105, 106 (24 entries); merges by rank:
 *   0: a+b=ab   1: b+c=bc   2: ab+c=abc   3: ▁+a=▁a   4: c+d=cd
 * byte tokens only for 0xC3, 0xA9 (é), 0xE2, 0x82 (not 0xAC: € is unk);
 * added: <pad> <eos> <bos> <unk> [X] (special), "\n" and "X]" (not special),
 * <unused40> at 46 and <start_of_turn> at 105, <end_of_turn> at 106 (renamed
 * by id to <|tool>, <|turn>, <turn|>); 101 "<unused95>" only in the vocab
 * (renamed <channel|> and made special); <soft> at 24 (special, not in the
 * vocab: tokenizers 0.23 numbers such tokens from the vocab's entry count). */
#define NOFLAGS "\"single_word\": false, \"lstrip\": false, \"rstrip\": false, "
static const char TINY_HEAD[] =
    "{\"version\": \"1.0\", \"truncation\": null, \"padding\": null,\n"
    " \"added_tokens\": [\n"
    "  {\"id\": 0, \"content\": \"<pad>\", " NOFLAGS "\"special\": true, \"normalized\": false},\n"
    "  {\"id\": 1, \"content\": \"<eos>\", " NOFLAGS "\"special\": true, \"normalized\": false},\n"
    "  {\"id\": 2, \"content\": \"<bos>\", " NOFLAGS "\"special\": true, \"normalized\": false},\n"
    "  {\"id\": 3, \"content\": \"<unk>\", " NOFLAGS "\"special\": true, \"normalized\": false},\n"
    "  {\"id\": 15, \"content\": \"\\n\", " NOFLAGS "\"special\": false, \"normalized\": false},\n"
    "  {\"id\": 16, \"content\": \"[X]\", " NOFLAGS "\"special\": true, \"normalized\": false},\n"
    "  {\"id\": 19, \"content\": \"X]\", " NOFLAGS "\"special\": false, \"normalized\": false},\n"
    "  {\"id\": 46, \"content\": \"<unused40>\", " NOFLAGS "\"special\": false, \"normalized\": false},\n"
    "  {\"id\": 105, \"content\": \"<start_of_turn>\", " NOFLAGS "\"special\": true, \"normalized\": false},\n"
    "  {\"id\": 106, \"content\": \"<end_of_turn>\", " NOFLAGS "\"special\": true, \"normalized\": false},\n"
    "  {\"id\": ";
static const char TINY_TAIL[] =
    ", \"content\": \"<soft>\", " NOFLAGS "\"special\": true, \"normalized\": false}],\n"
    " \"normalizer\": {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"},\n"
    " \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \" \"},\n"
    "   \"behavior\": \"MergedWithPrevious\", \"invert\": false},\n"
    " \"post_processor\": null,\n"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [\n"
    "   {\"type\": \"Replace\", \"pattern\": {\"String\": \"\\u2581\"}, \"content\": \" \"},\n"
    "   {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}]},\n"
    " \"model\": {\"type\": \"BPE\", \"dropout\": null, \"unk_token\": \"<unk>\", \"continuing_subword_prefix\": null,\n"
    "   \"end_of_word_suffix\": null, \"fuse_unk\": true, \"byte_fallback\": true, \"ignore_merges\": false,\n"
    "   \"vocab\": {\"<pad>\": 0, \"<eos>\": 1, \"<bos>\": 2, \"<unk>\": 3, \"<0xC3>\": 4, \"<0xA9>\": 5, \"<0xE2>\": 6,\n"
    "     \"a\": 7, \"b\": 8, \"c\": 9, \"\\u2581\": 10, \"ab\": 11, \"bc\": 12, \"abc\": 13, \"\\u2581a\": 14, \"\\n\": 15,\n"
    "     \"[X]\": 16, \"d\": 17, \"cd\": 18, \"X]\": 19, \"<unused40>\": 46, \"<unused95>\": 101, \"<start_of_turn>\": 105,\n"
    "     \"<end_of_turn>\": 106},\n"
    "   \"merges\": [[\"a\", \"b\"], [\"b\", \"c\"], [\"ab\", \"c\"], [\"\\u2581\", \"a\"], [\"c\", \"d\"]]}}\n";

static char *tiny_json(int soft_id) {
  size_t cap = sizeof TINY_HEAD + sizeof TINY_TAIL + 16;
  char *s = malloc(cap);
  assert_non_null(s);
  snprintf(s, cap, "%s%d%s", TINY_HEAD, soft_id, TINY_TAIL);
  return s;
}

static void test_tiny_bpe(void **state) {
  (void)state;
  char *json = tiny_json(24);
  dg_tokenizer *t;
  assert_dg_ok(load_json(json, 0, &t));
  free(json);
  assert_int_equal(dg_tokenizer_n_ids(t), 107);

  /* BPE: lowest rank first, leftmost on ties */
  CHECK_ENC(t, "abc", 1, 13);      /* a b c -> ab c (rank 0) -> abc (rank 2) */
  CHECK_ENC(t, "bcab", 1, 12, 11); /* (a,b) rank 0 before (b,c) rank 1 */
  CHECK_ENC(t, " abc", 1, 10, 13); /* ▁ a b c: ab, then abc; ▁a (rank 3) never forms */
  CHECK_ENC(t, "abcd", 1, 13, 17); /* abc takes the c before c+d (rank 4) */
  CHECK_ENC(t, "bcd", 1, 12, 17);
  CHECK_ENC(t, "cd", 1, 18);
  CHECK_ENC(t, " a", 1, 14);
  CHECK_ENC(t, "a a", 1, 7, 14);   /* one segment: a ▁ a -> a ▁a */
  CHECK_ENC_EMPTY(t, "", 1);
  /* byte fallback; a character whose bytes are not all in the vocab is unk,
   * and consecutive unks fuse */
  CHECK_ENC(t, "\xC3\xA9", 1, 4, 5);
  CHECK_ENC(t, "a\xC3\xA9", 1, 7, 4, 5);
  CHECK_ENC(t, "\xE2\x82\xAC", 1, 3);
  CHECK_ENC(t, "\xE2\x82\xAC\xE2\x82\xACzz", 1, 3);
  CHECK_ENC(t, "a\xE2\x82\xAC" "b", 1, 7, 3, 8);
  /* the library adds byte-fallback tokens without flushing a pending unk:
   * "€é€" -> é's bytes first, then one fused unk (checked against 0.23) */
  CHECK_ENC(t, "\xE2\x82\xAC\xC3\xA9\xE2\x82\xAC", 1, 4, 5, 3);
  /* added tokens: special only with parse_special; "\n" always */
  CHECK_ENC(t, "a[X]b", 1, 7, 16, 8);
  CHECK_ENC(t, "a[X]b", 0, 7, 3, 8);   /* a skipped special match stays text whole: */
  CHECK_ENC(t, "a[X]bX]", 0, 7, 3, 8, 19); /* its "X]" is not matched, a later one is */
  CHECK_ENC(t, "a\nb", 0, 7, 15, 8);
  CHECK_ENC(t, "\n\nab", 1, 15, 15, 11);
  /* renamed by id: old names are plain text, new names match */
  CHECK_ENC(t, "<|turn>a<turn|>", 1, 105, 7, 106);
  CHECK_ENC(t, "<|turn>a<turn|>", 0, 3, 7, 3);
  CHECK_ENC(t, "<start_of_turn>", 1, 3, 7, 3); /* "<st" unk, a, "rt_of_turn>" unk */
  CHECK_ENC(t, "<|tool><channel|>", 1, 46, 101);
  CHECK_ENC(t, "<soft>", 1, 24);
  CHECK_ENC(t, "<|tool><channel|>", 0, 3, 9, 3, 7, 3);
  assert_string_equal(dg_tokenizer_piece(t, 105), "<|turn>");
  assert_string_equal(dg_tokenizer_piece(t, 101), "<channel|>");
  assert_null(dg_tokenizer_piece(t, 50)); /* unused id */
  assert_int_equal(dg_tokenizer_piece_id(t, "<start_of_turn>"), -1);
  assert_int_equal(dg_tokenizer_piece_id(t, "<turn|>"), 106);
  assert_int_equal(dg_tokenizer_piece_id(t, "abc"), 13);
  assert_true(dg_tokenizer_is_special(t, 46) && dg_tokenizer_is_special(t, 101) && dg_tokenizer_is_special(t, 106));
  assert_false(dg_tokenizer_is_special(t, 15) || dg_tokenizer_is_special(t, 13));

  /* decode: ▁ -> space, byte runs fused, invalid runs -> one U+FFFD per byte */
  CHECK_DEC(t, 1, " abc", 10, 13);
  CHECK_DEC(t, 1, "a\xC3\xA9 ", 7, 4, 5, 10);
  CHECK_DEC(t, 1, "\xEF\xBF\xBD", 4);
  CHECK_DEC(t, 1, "\xEF\xBF\xBD\xEF\xBF\xBD" "a", 5, 4, 7);
  CHECK_DEC(t, 1, "<|turn>a<turn|>\n", 105, 7, 106, 15);
  CHECK_DEC(t, 0, "a\n", 105, 7, 106, 15);
  CHECK_DEC(t, 0, "ab", 7, 46, 3, 8, 50); /* <|tool> and <unk> are special; 50 is unused */
  CHECK_DEC(t, 1, "a<|tool><unk>b", 7, 46, 3, 8, 50);
  char *s;
  const int32_t out_of_range[] = {107};
  assert_int_equal(dg_tokenizer_decode(t, out_of_range, 1, 1, &s), DG_ERR_INVALID_ARG);

  /* the chat template needs <|channel> (100), which this vocabulary lacks */
  const dg_chat_message m = {"user", "ab"};
  int32_t *ids;
  size_t n;
  assert_int_equal(dg_chat_render(t, &m, 1, 0, &ids, &n), DG_ERR_TOKENIZER);
  assert_non_null(strstr(dg_last_error(), "<|channel>"));
  assert_int_equal(dg_chat_render(t, &m, 1, 1, &ids, &n), DG_ERR_TOKENIZER);
  assert_non_null(strstr(dg_last_error(), "<|think|>"));
  dg_tokenizer_free(t);
}

static void test_tiny_drop_and_ids(void **state) {
  (void)state;
  /* a dense vocab (a=0 b=1 ab=2) and a special added token at 3, the id the
   * library gives it */
  static const char fmt[] =
      "{\"added_tokens\": [{\"id\": %d, \"content\": \"<soft>\", \"single_word\": false, \"lstrip\": false,"
      " \"rstrip\": false, \"normalized\": false, \"special\": true}],"
      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\", \"b\"]]}}";
  char json[512];
  snprintf(json, sizeof json, fmt, 3);
  dg_tokenizer *t;
  assert_dg_ok(load_json(json, 0, &t));
  assert_int_equal(dg_tokenizer_n_ids(t), 4);
  CHECK_ENC(t, "ab<soft>", 1, 2, 3);
  dg_tokenizer_free(t);
  /* model_vocab 3: <soft> is dropped and its text is plain text (here: no
   * unk_token, so unknown characters vanish, as in the library) */
  assert_dg_ok(load_json(json, 3, &t));
  assert_int_equal(dg_tokenizer_n_ids(t), 3);
  CHECK_ENC(t, "ab<soft>", 1, 2);
  assert_int_equal(dg_tokenizer_piece_id(t, "<soft>"), -1);
  dg_tokenizer_free(t);
  /* model_vocab 2: model.vocab has id 2 */
  t = (dg_tokenizer *)1;
  assert_int_equal(load_json(json, 2, &t), DG_ERR_VOCAB_MISMATCH);
  assert_null(t);
  assert_non_null(strstr(dg_last_error(), "model.vocab"));
  /* an added-token id the library would not give it (it gives 3) */
  snprintf(json, sizeof json, fmt, 7);
  assert_int_equal(load_json(json, 0, &t), DG_ERR_TOKENIZER);
  assert_non_null(strstr(dg_last_error(), "<soft>"));
  assert_non_null(strstr(dg_last_error(), "id 3"));
  /* the tiny tokenizer (sparse vocab) with <soft> at 107 is rejected too */
  char *tj = tiny_json(107);
  assert_int_equal(load_json(tj, 0, &t), DG_ERR_TOKENIZER);
  assert_non_null(strstr(dg_last_error(), "id 24"));
  free(tj);
}

/* ------------------------------------------------------------------------- */
/* broken files                                                              */
/* ------------------------------------------------------------------------- */

#define MODEL_OK "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [[\"a\", \"b\"]]}"

static void expect_load_error(const char *json, dg_status want, const char *needle1, const char *needle2) {
  dg_tokenizer *t = (dg_tokenizer *)1;
  dg_status st = load_json(json, 0, &t);
  if (st != want)
    fail_msg("loading %s: got %s (%s), want %s", json, dg_status_str(st), dg_last_error(), dg_status_str(want));
  assert_null(t);
  if (needle1 && !strstr(dg_last_error(), needle1)) fail_msg("message \"%s\" lacks \"%s\"", dg_last_error(), needle1);
  if (needle2 && !strstr(dg_last_error(), needle2)) fail_msg("message \"%s\" lacks \"%s\"", dg_last_error(), needle2);
}

static void test_broken_files(void **state) {
  (void)state;
  /* sanity: the minimal file loads, merges work, no decoder joins with " " */
  dg_tokenizer *t;
  assert_dg_ok(load_json("{" MODEL_OK "}", 0, &t));
  CHECK_ENC(t, "abab", 1, 2, 2);
  CHECK_DEC(t, 1, "a b ab", 0, 1, 2);
  dg_tokenizer_free(t);

  expect_load_error("{\"model\": ", DG_ERR_JSON, "offset", NULL);
  expect_load_error("[1, 2]", DG_ERR_TOKENIZER, "top level", NULL);
  expect_load_error("{\"added_tokens\": []}", DG_ERR_TOKENIZER, "\"model\"", "missing");
  expect_load_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", DG_ERR_TOKENIZER, "model.type", "WordPiece");
  expect_load_error("{\"model\": {\"vocab\": {}, \"merges\": []}}", DG_ERR_TOKENIZER, "model.type", "missing");
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": [\"a\"], \"merges\": []}}", DG_ERR_TOKENIZER, "model.vocab",
                    "not an object");
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"merges\": []}}", DG_ERR_TOKENIZER, "model.vocab", "missing");
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"x\"}, \"merges\": []}}", DG_ERR_TOKENIZER,
                    "model.vocab[\"a\"]", "a string \"x\"");
  /* the offending value quoted (review rev16: the messages named the field only) */
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 1099511627776}, \"merges\": []}}", DG_ERR_TOKENIZER,
                    "model.vocab[\"a\"] is a number 1.099511628e+12", NULL);
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -5}, \"merges\": []}}", DG_ERR_TOKENIZER,
                    "model.vocab[\"a\"] is a number -5", NULL);
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}", DG_ERR_TOKENIZER, "model.merges", "missing");
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": {}}}", DG_ERR_TOKENIZER,
                    "model.merges", "not an array");
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [[\"a\"]]}}",
                    DG_ERR_TOKENIZER, "model.merges[0]", NULL);
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\", 7]}}",
                    DG_ERR_TOKENIZER, "model.merges[0]", "ab"); /* "ab" is not in the vocab */
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"ab\": 1}, \"merges\": [[\"a\", \"zz\"]]}}",
                    DG_ERR_TOKENIZER, "model.merges[0]", "\"zz\"");
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}", DG_ERR_TOKENIZER,
                    "id 0", NULL);
  expect_load_error("{" MODEL_OK ", \"normalizer\": {\"type\": \"NFKC\"}}", DG_ERR_TOKENIZER, "normalizer.type", "NFKC");
  expect_load_error("{" MODEL_OK ", \"normalizer\": {\"type\": \"Replace\","
                    " \"pattern\": {\"Regex\": \"\\\\s\"}, \"content\": \"x\"}}",
                    DG_ERR_TOKENIZER, "normalizer.pattern", "Regex");
  expect_load_error("{" MODEL_OK ", \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", DG_ERR_TOKENIZER, "pre_tokenizer.type",
                    "ByteLevel");
  expect_load_error("{" MODEL_OK ", \"pre_tokenizer\": {\"type\": \"Split\","
                    " \"pattern\": {\"String\": \" \"}, \"behavior\": \"Weird\"}}",
                    DG_ERR_TOKENIZER, "pre_tokenizer.behavior", "Weird");
  expect_load_error("{" MODEL_OK ", \"decoder\": {\"type\": \"Sequence\","
                    " \"decoders\": [{\"type\": \"Fuse\"}, {\"type\": \"Metaspace\"}]}}",
                    DG_ERR_TOKENIZER, "decoder.decoders[1].type", "Metaspace");
  expect_load_error("{" MODEL_OK ", \"added_tokens\": {}}", DG_ERR_TOKENIZER, "added_tokens", NULL);
  expect_load_error("{" MODEL_OK ", \"added_tokens\": [{\"content\": \"x\"}]}", DG_ERR_TOKENIZER, "added_tokens[0].id is missing", NULL);
  expect_load_error("{" MODEL_OK ", \"added_tokens\": [{\"id\": 2.5, \"content\": \"x\"}]}", DG_ERR_TOKENIZER,
                    "added_tokens[0].id is a number 2.5", NULL);
  expect_load_error("{" MODEL_OK ", \"added_tokens\": [{\"id\": 3, \"content\": \"x\", \"single_word\": true}]}",
                    DG_ERR_TOKENIZER, "single_word", NULL);
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"dropout\": 0.1, \"vocab\": {}, \"merges\": []}}", DG_ERR_TOKENIZER,
                    "dropout", NULL);

  /* a second JSON value after the object, and keys given twice (cJSON's lookups take the first value, the
   * tokenizers library refuses them or keeps the last; review rev16): refused, the key and its object named */
  expect_load_error("{" MODEL_OK "}\n{\"model\": null}", DG_ERR_JSON, "trailing data", "byte offset");
  expect_load_error("{" MODEL_OK "} x", DG_ERR_JSON, "trailing data", NULL);
  expect_load_error("{" MODEL_OK ", \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}}", DG_ERR_JSON,
                    "\"model\" appears twice", "top-level object");
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"merges\": [[\"a\", \"a\"]]}}",
                    DG_ERR_JSON, "\"merges\" appears twice in \"model\"", NULL);
  expect_load_error("{" MODEL_OK ", \"decoder\": {\"type\": \"Fuse\", \"type\": \"Strip\"}}", DG_ERR_JSON,
                    "\"type\" appears twice in \"decoder\"", NULL);
  expect_load_error("{" MODEL_OK ", \"added_tokens\": [{\"id\": 3, \"id\": 4, \"content\": \"x\"}]}", DG_ERR_JSON,
                    "\"id\" appears twice in an object under \"added_tokens\"", NULL);
  /* model.vocab's repeats stay load_vocab's: the same id again loads, another id is refused */
  assert_dg_ok(load_json("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"a\": 0}, \"merges\": []}}", 0, &t));
  dg_tokenizer_free(t);
  expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"a\": 1}, \"merges\": []}}",
                    DG_ERR_TOKENIZER, "\"a\" has two ids", NULL);

  /* an empty vocabulary loads (every character is then dropped: no unk) */
  assert_dg_ok(load_json("{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}", 0, &t));
  assert_int_equal(dg_tokenizer_n_ids(t), 0);
  CHECK_ENC_EMPTY(t, "abc", 1);
  dg_tokenizer_free(t);

  dg_tokenizer *t2 = (dg_tokenizer *)1;
  assert_int_equal(dg_tokenizer_load("/nonexistent/dir/tokenizer.json", 0, &t2), DG_ERR_NOT_FOUND);
  assert_null(t2);
  assert_non_null(strstr(dg_last_error(), "/nonexistent/dir/tokenizer.json"));
  assert_int_equal(dg_tokenizer_load("/tmp", 0, &t2), DG_ERR_IO);
  assert_int_equal(dg_tokenizer_load(NULL, 0, &t2), DG_ERR_INVALID_ARG);
}

/* Split behaviours and normalized added tokens (not used by Gemma's file,
 * supported with the library's semantics). Expected ids by hand. */
static void test_tiny_pipeline_variants(void **state) {
  (void)state;
  /* vocab: a=0 b=1 -=2 ab=3 a-=4 -b=5; merges a+b, a+-, -+b; normalizer Q -> qq;
   * added token 6 "Q" with normalized = true: it is matched as "qq" (its
   * normalized form) in normalized text */
  static const char fmt[] =
      "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\","
      "   \"invert\": false},"
      " \"added_tokens\": [{\"id\": 6, \"content\": \"Q\", " NOFLAGS "\"special\": false, \"normalized\": true}],"
      " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"pattern\": {\"String\": \"Q\"},"
      "   \"content\": \"qq\"}]},"
      " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"-\": 2, \"ab\": 3, \"a-\": 4, \"-b\": 5},"
      "   \"merges\": [[\"a\", \"b\"], [\"a\", \"-\"], [\"-\", \"b\"]]}}";
  static const struct { const char *behavior; int32_t want[8]; size_t n; } cases[] = {
      /* "a-b--ab" splits into a | - | b | - | - | ab (- are the matches) */
      {"Isolated", {0, 2, 1, 2, 2, 3}, 6},         /* a - b - - ab */
      {"Removed", {0, 1, 3}, 3},                   /* a b ab */
      {"MergedWithPrevious", {4, 1, 2, 2, 3}, 5},  /* a- b- - ab ("b-" has no merge) */
      {"MergedWithNext", {0, 5, 2, 2, 3}, 5},      /* a -b - -ab ("-ab" -> - ab) */
      {"Contiguous", {0, 2, 1, 2, 2, 3}, 6},       /* a - b -- ab */
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char json[1024];
    snprintf(json, sizeof json, fmt, cases[i].behavior);
    dg_tokenizer *t;
    assert_dg_ok(load_json(json, 0, &t));
    int32_t *ids;
    size_t n;
    enc(t, "a-b--ab", 1, &ids, &n);
    char a[256], b[256];
    if (n != cases[i].n || memcmp(ids, cases[i].want, n * sizeof *ids))
      fail_msg("Split %s: got %s want %s", cases[i].behavior, fmt_ids(a, sizeof a, ids, n),
               fmt_ids(b, sizeof b, cases[i].want, cases[i].n));
    free(ids);
    CHECK_ENC(t, "aQ", 1, 0, 6);   /* "aQ" -> "aqq": "qq" is the added token */
    CHECK_ENC(t, "qqab", 0, 6, 3); /* raw "qq" normalizes to itself */
    dg_tokenizer_free(t);
  }
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tiny_bpe),
      cmocka_unit_test(test_tiny_drop_and_ids),
      cmocka_unit_test(test_tiny_pipeline_variants),
      cmocka_unit_test(test_broken_files),
      cmocka_unit_test(test_chat_spec_sequences),
      cmocka_unit_test(test_chat_template_rules),
      cmocka_unit_test(test_chat_errors),
      cmocka_unit_test(test_chat_user_text_stays_text),
      cmocka_unit_test(test_parse_special_modes),
      cmocka_unit_test(test_image_soft_token),
      cmocka_unit_test(test_decode_range),
      cmocka_unit_test(test_invalid_utf8),
      cmocka_unit_test(test_roundtrip),
      cmocka_unit_test(test_golden_gemma3),
      cmocka_unit_test(test_golden_others),
      cmocka_unit_test(test_speed),
  };
  return cmocka_run_group_tests(tests, NULL, group_teardown);
}
