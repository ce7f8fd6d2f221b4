/* test_fuzz_regress.c: what the fuzz harnesses of fuzz/ found, replayed in the
 * normal test suite, and the in-memory parser entry points they drive.
 *
 *   make build/tests/test_fuzz_regress && build/tests/test_fuzz_regress
 *
 * Each finding has its input committed under fuzz/regress/<harness>/ (the
 * harnesses replay those under clang's ASan+UBSan in `make test`); here each
 * is checked for the status and the message the fixed parser gives. The
 * in-memory entry points (dg_st_open_memory, dg_tokenizer_load_text,
 * dg_gen_config_parse, dg_quant_config_parse) must agree with the file
 * readers on the bundled model's files. Run from the repository root.
 */
#include "testutil.h"

#include <cjson/cJSON.h>

#include "io/config.h"
#include "io/quant.h"
#include "io/safetensors.h"
#include "io/tokenizer.h"

#define SMALL "models/dgemma-small"

#define assert_err_has(s)                                                                     \
  do {                                                                                        \
    if (!strstr(dg_last_error(), (s))) fail_msg("message \"%s\" lacks \"%s\"", dg_last_error(), (s)); \
  } while (0)

static char *read_or_fail(const char *path, size_t *len) {
  char *t = dg_test_read_file(path, len);
  if (!t) fail_msg("cannot read %s", path);
  return t;
}

/* fuzz/regress/quant/bits-outside-int: "bits": 49007199254740993 was converted
 * to int before its range was checked (undefined behaviour; UBSan
 * float-cast-overflow). Now a range error naming the value. */
static void test_quant_bits_outside_int(void **state) {
  (void)state;
  size_t len = 0;
  char *t = read_or_fail("fuzz/regress/quant/bits-outside-int", &len);
  dg_quant_config qc;
  assert_int_equal(dg_quant_config_parse("config.json", t, len, &qc), DG_ERR_CONFIG);
  assert_err_has("config.json: quantization.bits = 4.90072e+16 is not supported");
  assert_null(qc.ov);
  free(t);
  struct { const char *json, *msg; } bad[] = {
    {"{\"quantization\": {\"bits\": 1e300}}", "quantization.bits = 1e+300 is not supported"},
    {"{\"quantization\": {\"bits\": -1e300}}", "quantization.bits = -1e+300 is not supported"},
    {"{\"quantization\": {\"bits\": 1e400}}", "quantization.bits = inf is not supported"},
    {"{\"quantization\": {\"group_size\": 4294967360}}", "quantization.group_size = 4.29497e+09 is not supported"},
    {"{\"quantization\": {\"bits\": 4, \"m.x\": {\"group_size\": -4294967232}}}",
     "quantization[\"m.x\"].group_size = -4.29497e+09 is not supported"},
    {"{\"quantization\": {\"bits\": 2147483652}}", "quantization.bits = 2.14748e+09 is not supported"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    if (dg_quant_config_parse("config.json", bad[i].json, strlen(bad[i].json), &qc) != DG_ERR_CONFIG)
      fail_msg("%s: accepted", bad[i].json);
    assert_err_has(bad[i].msg);
  }
  /* in range: still the supported-value check */
  const char *j = "{\"quantization\": {\"bits\": 5}}";
  assert_int_equal(dg_quant_config_parse("config.json", j, strlen(j), &qc), DG_ERR_CONFIG);
  assert_err_has("quantization.bits = 5 is not supported (2, 3, 4, 6 or 8)");
  j = "{\"quantization\": {\"bits\": 8, \"group_size\": 32, \"m.x\": {\"bits\": 3}, \"m.y\": false}}";
  assert_dg_ok(dg_quant_config_parse("config.json", j, strlen(j), &qc));
  int b = 0, g = 0;
  assert_int_equal(dg_quant_config_lookup(&qc, "m.x", &b, &g), 1);
  assert_int_equal(b, 3);
  assert_int_equal(g, 32);
  assert_int_equal(dg_quant_config_lookup(&qc, "m.y", &b, &g), 0);
  assert_int_equal(dg_quant_config_lookup(&qc, "m.z", &b, &g), 1);
  assert_int_equal(b, 8);
  dg_quant_config_free(&qc);
}

/* fuzz/regress/tokenize/fuse-of-no-token: decoding no token (or only dropped
 * special tokens) ran the Fuse decoder over an empty list, which left the
 * byte store NULL and added an offset to it (UBSan: applying zero offset to
 * null pointer). The answer is "". */
static void test_decode_nothing(void **state) {
  (void)state;
  dg_tokenizer *t = NULL;
  assert_dg_ok(dg_tokenizer_load(SMALL "/tokenizer.json", 4096, &t));
  char *out = NULL;
  assert_dg_ok(dg_tokenizer_decode(t, NULL, 0, 1, &out));
  assert_string_equal(out, "");
  free(out);
  const int32_t specials[] = {2, 105, 106, 1}; /* <bos> <|turn> <turn|> <eos> */
  assert_dg_ok(dg_tokenizer_decode(t, specials, 4, 0, &out));
  assert_string_equal(out, "");
  free(out);
  assert_dg_ok(dg_tokenizer_decode(t, specials, 4, 1, &out));
  assert_string_equal(out, "<bos><|turn><turn|><eos>");
  free(out);
  dg_tokenizer_free(t);
}

/* The bundled model's config.json with text_config edited by `edit`, parsed. */
static dg_status parse_edited_config(void (*edit)(cJSON *tc), dg_config *cfg) {
  char *text = read_or_fail(SMALL "/config.json", NULL);
  cJSON *j = cJSON_Parse(text);
  free(text);
  assert_non_null(j);
  edit(cJSON_GetObjectItemCaseSensitive(j, "text_config"));
  char *out = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  dg_status st = dg_config_parse("config.json", out, strlen(out), cfg);
  cJSON_free(out);
  return st;
}

static void edit_tiny_hidden(cJSON *tc) {
  cJSON_DeleteItemFromObjectCaseSensitive(tc, "head_dim");
  cJSON_DeleteItemFromObjectCaseSensitive(tc, "per_layer_config");
  cJSON_ReplaceItemInObjectCaseSensitive(tc, "hidden_size", cJSON_CreateNumber(2));
}

static void edit_nothing(cJSON *tc) { (void)tc; }

/* fuzz/regress/config/head-dim-zero: without head_dim, a layer's head_dim is
 * hidden_size / num_attention_heads, which was accepted as 0 for
 * hidden_size < num_attention_heads (zero-width attention heads downstream).
 * Now refused, naming the layer and both sizes. */
static void test_config_head_dim_zero(void **state) {
  (void)state;
  size_t len = 0;
  char *t = read_or_fail("fuzz/regress/config/head-dim-zero", &len);
  dg_config cfg;
  dg_status st = dg_config_parse("config.json", t, len, &cfg);
  free(t);
  assert_int_not_equal(st, DG_OK); /* as found it also repeats keys: refused for that first now */
  assert_int_equal(parse_edited_config(edit_tiny_hidden, &cfg), DG_ERR_CONFIG);
  assert_err_has("config.json: layer 0 has head_dim = 0 (hidden_size = 2 / num_attention_heads = 4, no head_dim given)");
  assert_dg_ok(parse_edited_config(edit_nothing, &cfg));
  assert_int_equal(cfg.head_dim[0], 64);
  assert_int_equal(cfg.head_dim[2], 128);
}

/* The same input also had repeated keys ("hidden_size": 002 and later 257):
 * cJSON's lookups took the first, Python's json (Transformers) the last. Every
 * JSON reader of configs refuses a repeated key now, naming it and its object. */
static void test_repeated_keys(void **state) {
  (void)state;
  size_t len = 0;
  char *t = read_or_fail("fuzz/regress/config/head-dim-zero", &len);
  dg_config cfg;
  assert_int_equal(dg_config_parse("config.json", t, len, &cfg), DG_ERR_JSON);
  assert_err_has("config.json: key \"hidden_size\" appears twice in the top-level object");
  free(t);
  const char *c = "{\"model_type\": \"diffusion_gemma\", \"text_config\": {\"vocab_size\": 8, \"rope_parameters\": "
                  "{\"full_attention\": {\"rope_theta\": 1, \"rope_theta\": 2}}}}";
  assert_int_equal(dg_config_parse("config.json", c, strlen(c), &cfg), DG_ERR_JSON);
  assert_err_has("config.json: key \"rope_theta\" appears twice in \"full_attention\"");
  dg_gen_params p;
  const char *g = "{\"t_min\": 0.1, \"t_max\": 0.9, \"t_min\": 0.5}";
  assert_int_equal(dg_gen_config_parse("generation_config.json", g, strlen(g), &p), DG_ERR_JSON);
  assert_err_has("generation_config.json: key \"t_min\" appears twice");
  dg_gen_params_reference_defaults(&p);
  const float t_min = p.t_min;
  assert_int_equal(dg_gen_params_apply_json(&p, "{\"seed\": 1, \"t_min\": 0.2, \"seed\": 2}"), DG_ERR_JSON);
  assert_err_has("gen-kwargs: key \"seed\" appears twice");
  assert_true(p.t_min == t_min); /* untouched */
  dg_quant_config qc;
  const char *q = "{\"quantization\": {\"bits\": 4, \"m.x\": {\"bits\": 8}, \"m.x\": false}}";
  assert_int_equal(dg_quant_config_parse("config.json", q, strlen(q), &qc), DG_ERR_CONFIG);
  assert_err_has("config.json: quantization: key \"m.x\" appears twice in \"quantization\"");
  assert_null(qc.ov);
  /* the same key in different objects is fine */
  g = "{\"t_min\": 0.1, \"linear_temperature_schedule_config\": {\"t_min\": 0.1, \"t_max\": 0.2}}";
  assert_dg_ok(dg_gen_config_parse("generation_config.json", g, strlen(g), &p));
}

/* dg_st_open_memory over a shard read into memory gives the tensors
 * dg_st_open_file gives, with data pointers into the caller's buffer; and it
 * applies the same checks (a truncated image is refused). */
static void test_st_open_memory(void **state) {
  (void)state;
  const char *path = SMALL "/model-00002-of-00002.safetensors";
  size_t len = 0;
  char *buf = read_or_fail(path, &len);
  dg_safetensors *a = NULL, *b = NULL;
  assert_dg_ok(dg_st_open_file(path, &a));
  assert_dg_ok(dg_st_open_memory("shard2", buf, len, &b));
  assert_int_equal(dg_st_count(a), dg_st_count(b));
  assert_true(dg_st_count(a) > 0);
  for (size_t i = 0; i < dg_st_count(a); i++) {
    const dg_tensor *x = dg_st_at(a, i), *y = dg_st_at(b, i);
    assert_string_equal(x->name, y->name);
    assert_int_equal(x->dtype, y->dtype);
    assert_int_equal(x->ndim, y->ndim);
    assert_memory_equal(x->shape, y->shape, sizeof x->shape);
    assert_int_equal(x->nbytes, y->nbytes);
    assert_string_equal(y->file, "shard2");
    assert_true((const char *)y->data >= buf && (const char *)y->data + y->nbytes <= buf + len);
    assert_memory_equal(x->data, y->data, x->nbytes);
  }
  dg_st_close(a);
  dg_st_close(b);
  assert_int_equal(dg_st_open_memory("shard2", buf, len - 1, &b), DG_ERR_SAFETENSORS);
  assert_null(b);
  assert_err_has("shard2");
  assert_int_equal(dg_st_open_memory("x", NULL, 5, &b), DG_ERR_INVALID_ARG);
  assert_int_equal(dg_st_open_memory("empty", NULL, 0, &b), DG_ERR_SAFETENSORS);
  assert_err_has("empty: file is 0 bytes");
  free(buf);
}

/* dg_tokenizer_load_text, dg_gen_config_parse and dg_quant_config_parse agree
 * with their file readers. */
static void test_text_entry_points(void **state) {
  (void)state;
  size_t len = 0;
  char *text = read_or_fail(SMALL "/tokenizer.json", &len);
  dg_tokenizer *a = NULL, *b = NULL;
  assert_dg_ok(dg_tokenizer_load(SMALL "/tokenizer.json", 4096, &a));
  assert_dg_ok(dg_tokenizer_load_text("tok", text, len, 4096, &b));
  assert_int_equal(dg_tokenizer_n_ids(a), dg_tokenizer_n_ids(b));
  const char *s = "Sam has 23 apples. <|turn>user\nHow many?";
  int32_t *ia = NULL, *ib = NULL;
  size_t na = 0, nb = 0;
  assert_dg_ok(dg_tokenizer_encode(a, s, strlen(s), 1, &ia, &na));
  assert_dg_ok(dg_tokenizer_encode(b, s, strlen(s), 1, &ib, &nb));
  assert_int_equal(na, nb);
  assert_true(na > 5);
  assert_memory_equal(ia, ib, na * sizeof *ia);
  free(ia);
  free(ib);
  dg_tokenizer_free(a);
  dg_tokenizer_free(b);
  assert_int_equal(dg_tokenizer_load_text("tok", text, len / 2, 4096, &b), DG_ERR_JSON);
  assert_null(b);
  assert_err_has("tok: JSON syntax error");
  free(text);

  text = read_or_fail(SMALL "/generation_config.json", &len);
  dg_gen_params p, q;
  int found = 0;
  assert_dg_ok(dg_gen_config_load(SMALL "/generation_config.json", &p, &found));
  assert_int_equal(found, 1);
  memset(&q, 0x5a, sizeof q);
  assert_dg_ok(dg_gen_config_parse("gen", text, len, &q));
  assert_int_equal(p.max_denoising_steps, q.max_denoising_steps);
  assert_int_equal(p.max_denoising_steps, 48);
  assert_int_equal(p.n_stop_ids, q.n_stop_ids);
  assert_memory_equal(p.stop_ids, q.stop_ids, sizeof p.stop_ids);
  assert_true(p.t_min == q.t_min && p.t_max == q.t_max && p.entropy_bound == q.entropy_bound);
  assert_int_equal(dg_gen_config_parse("gen", "{\"t_min\": 2, \"t_max\": 1}", 24, &q), DG_ERR_CONFIG);
  assert_err_has("gen: t_max = 1 is below t_min = 2");
  assert_int_equal(dg_gen_config_parse("gen", "{} x", 4, &q), DG_ERR_JSON);
  assert_err_has("gen: trailing data");
  free(text);

  const char *j = "{\"quantization\": {\"bits\": 6, \"group_size\": 128}}";
  dg_quant_config qc;
  assert_dg_ok(dg_quant_config_parse("cfg", j, strlen(j), &qc));
  assert_int_equal(qc.present, 1);
  assert_int_equal(qc.bits, 6);
  assert_int_equal(qc.group_size, 128);
  dg_quant_config_free(&qc);
  assert_dg_ok(dg_quant_config_load(SMALL "/config.json", &qc)); /* the bundled model is not quantized */
  assert_int_equal(qc.present, 0);
  dg_quant_config_free(&qc);
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_quant_bits_outside_int),
    cmocka_unit_test(test_decode_nothing),
    cmocka_unit_test(test_config_head_dim_zero),
    cmocka_unit_test(test_repeated_keys),
    cmocka_unit_test(test_st_open_memory),
    cmocka_unit_test(test_text_entry_points),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
