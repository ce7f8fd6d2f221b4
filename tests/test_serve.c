/* test_serve.c: `dgemma serve` (tools/serve.c, tools/serve_req.c).
 *
 * Checks:
 *   - request parsing without sockets: fields, types, ranges, unknown fields,
 *     limits (413, message count, max_tokens), the OpenAI error JSON, the
 *     mapping of temperature / seed / max_tokens / dgemma.gen_kwargs onto
 *     dg_gen_params, stop strings (hit, hold-back of a partial match),
 *     incomplete characters held back;
 *   - the server on an ephemeral loopback port with the bundled model, real
 *     HTTP through libcurl: health, models, metrics, 404/405; chat and
 *     completions, streamed and not, whose text equals the engine's own
 *     dg_generate of the same prompt and settings (seeded); usage and
 *     finish_reason; stop strings; max_tokens cut; the reference sampler;
 *     draft-canvas events; 4 concurrent streams each equal to its own run
 *     alone, in fewer batched steps than their forwards added up; a client
 *     that disconnects (its canvas cancelled); Bearer auth; malformed JSON,
 *     wrong types, unknown fields, an oversized body and a stalled partial
 *     request answered 4xx or closed, the server still serving afterwards;
 *   - the ends of requests: \u0000 in a string refused by its field; a
 *     completion prompt beyond the context (param "prompt"); a non-streaming
 *     client that gives up (cancelled, no 5xx counted); the server stopped
 *     with a stream running and one queued (error event, then data: [DONE];
 *     the queued one logged with 0 s);
 *   - the prompt cache: follow-up turns, a diverging request and a continued
 *     completion prefill only what the cache lacks, their answers bit for bit
 *     a fresh run's, also with 0 slots; usage counts visible tokens only. */
#include "testutil.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <time.h>

#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "serve.h"

#ifdef DG_HAVE_CURL
#include <curl/curl.h>
#endif

#define SMALL "models/dgemma-small"
#define TURBO "{\"diffusion_turbo\": true, \"turbo_accept\": \"confidence\", \"turbo_threshold\": [0.95, 0.80, 8], " \
              "\"turbo_repair\": true, \"turbo_compact\": true}"

static dg_srv_limits lim(void) {
  dg_srv_limits l = {4096, 4, 512, 4096};
  return l;
}

/* Parse body as kind; expect status want (0 = accepted) and, on error, param and code. */
static void expect_parse(dg_srv_kind kind, const char *body, int want, const char *param, const char *code) {
  dg_srv_limits l = lim();
  dg_srv_request r;
  dg_srv_error e;
  memset(&e, 0, sizeof e);
  int st = dg_srv_parse(kind, body, strlen(body), &l, &r, &e);
  if (st != want) fail_msg("%s: status %d, expected %d (%s)", body, st, want, e.message);
  if (want && param) assert_string_equal(e.param, param);
  if (want && code) assert_string_equal(e.code, code);
  if (want) assert_true(e.message[0]);
  if (!st) dg_srv_request_free(&r);
}

static void test_parse(void **state) {
  (void)state;
  dg_srv_limits l = lim();
  dg_srv_request r;
  dg_srv_error e;
  const char *ok = "{\"model\": \"m\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                   "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi \"}, {\"type\": \"text\", \"text\": \"there\"}]}], "
                   "\"max_completion_tokens\": 70, \"seed\": 9, \"stop\": [\"\\n\\n\", \"END\"], \"stream\": true, "
                   "\"stream_options\": {\"include_usage\": true}, \"temperature\": 0, \"top_p\": 1, \"n\": 1, \"user\": \"u\", "
                   "\"dgemma\": {\"draft\": true, \"think\": false, \"gen_kwargs\": {\"diffusion_turbo\": true}}}";
  assert_int_equal(dg_srv_parse(DG_SRV_CHAT, ok, strlen(ok), &l, &r, &e), 0);
  assert_string_equal(r.model, "m");
  assert_int_equal(r.n_msgs, 2);
  assert_string_equal(r.msgs[0].role, "system");
  assert_string_equal(r.msgs[1].content, "Hi there");
  assert_int_equal(r.max_tokens, 70);
  assert_true(r.has_seed);
  assert_int_equal((int)r.seed, 9);
  assert_int_equal(r.n_stop, 2);
  assert_string_equal(r.stop[1], "END");
  assert_true(r.stream && r.include_usage && r.draft && !r.think);
  assert_true(r.has_temperature && r.temperature == 0.0);
  assert_string_equal(r.gen_kwargs, "{\"diffusion_turbo\":true}");
  /* onto the generation parameters */
  dg_gen_params d;
  memset(&d, 0, sizeof d);
  d.max_new_tokens = 256;
  d.t_min = 0.4f;
  d.t_max = 0.8f;
  d.proposal = DG_PROPOSAL_SAMPLE;
  dg_gen_params g;
  assert_int_equal(dg_srv_gen_params(&r, &d, &l, &g, &e), 0);
  assert_int_equal(g.max_new_tokens, 70);
  assert_int_equal((int)g.seed, 9);
  assert_int_equal(g.proposal, DG_PROPOSAL_ARGMAX);
  assert_true(g.turbo.enabled);
  r.temperature = 0.5;
  assert_int_equal(dg_srv_gen_params(&r, &d, &l, &g, &e), 0);
  assert_int_equal(g.proposal, DG_PROPOSAL_SAMPLE);
  assert_true(fabsf(g.t_min - 0.2f) < 1e-6f && fabsf(g.t_max - 0.4f) < 1e-6f);
  d.max_new_tokens = 1000; /* the default above the limit, no max_tokens in the request */
  r.max_tokens = 0;
  assert_int_equal(dg_srv_gen_params(&r, &d, &l, &g, &e), 400);
  assert_non_null(strstr(e.message, "1000"));
  free(r.gen_kwargs);
  r.gen_kwargs = strdup("{\"no_such_key\": 1}");
  r.max_tokens = 10;
  assert_int_equal(dg_srv_gen_params(&r, &d, &l, &g, &e), 400);
  assert_string_equal(e.param, "dgemma.gen_kwargs");
  assert_non_null(strstr(e.message, "no_such_key"));
  dg_srv_request_free(&r);

  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", 0, NULL, NULL);
  expect_parse(DG_SRV_COMPLETION, "{\"prompt\": [\"Once\"], \"max_tokens\": 3}", 0, NULL, NULL);
  expect_parse(DG_SRV_CHAT, "{\"messages\": [", 400, "", "invalid_json");
  expect_parse(DG_SRV_CHAT, "[1, 2]", 400, "", "invalid_json");
  expect_parse(DG_SRV_CHAT, "", 400, "", "invalid_json");
  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"foo\": 1}", 400, "foo", "unknown_parameter");
  expect_parse(DG_SRV_CHAT, "{}", 400, "messages", "missing_required_parameter");
  expect_parse(DG_SRV_CHAT, "{\"messages\": \"hi\"}", 400, "messages", "invalid_type");
  expect_parse(DG_SRV_CHAT, "{\"messages\": []}", 400, "messages", "invalid_value");
  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"robot\", \"content\": \"x\"}]}", 400, "messages[0]", "invalid_value");
  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", 400, "messages[0].content", "invalid_type");
  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", 400,
               "messages[0].content", "unsupported_content");
  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\", \"tool_calls\": []}]}", 400,
               "messages[0]", "unknown_parameter");
  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"user\"}]}", 400, "messages[0]", "missing_required_parameter");
  expect_parse(DG_SRV_CHAT,
               "{\"messages\": [{\"role\": \"user\", \"content\": \"1\"}, {\"role\": \"user\", \"content\": \"2\"}, "
               "{\"role\": \"user\", \"content\": \"3\"}, {\"role\": \"user\", \"content\": \"4\"}, {\"role\": \"user\", \"content\": \"5\"}]}",
               400, "messages", "too_many_messages");
  const char *msg = "\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]";
  char b[512];
#define BAD(extra, param, code)                                                  \
  do {                                                                           \
    snprintf(b, sizeof b, "{%s, %s}", msg, extra);                               \
    expect_parse(DG_SRV_CHAT, b, 400, param, code);                              \
  } while (0)
  BAD("\"max_tokens\": \"10\"", "max_tokens", "invalid_type");
  BAD("\"max_tokens\": 0", "max_tokens", "invalid_value");
  BAD("\"max_tokens\": 1.5", "max_tokens", "invalid_type");
  BAD("\"max_tokens\": 513", "max_tokens", "invalid_value");
  BAD("\"seed\": -1", "seed", "invalid_value");
  BAD("\"temperature\": 2.5", "temperature", "invalid_value");
  BAD("\"temperature\": \"hot\"", "temperature", "invalid_type");
  BAD("\"top_p\": 0.9", "top_p", "unsupported_value");
  BAD("\"presence_penalty\": 0.5", "presence_penalty", "unsupported_value");
  BAD("\"n\": 2", "n", "invalid_value");
  BAD("\"logprobs\": true", "logprobs", "unsupported_value");
  BAD("\"stream\": 1", "stream", "invalid_type");
  BAD("\"stream_options\": {\"include_usage\": true}", "stream_options", "invalid_value");
  BAD("\"stop\": [\"a\", \"b\", \"c\", \"d\", \"e\"]", "stop", "invalid_value");
  BAD("\"stop\": [3]", "stop", "invalid_type");
  BAD("\"stop\": \"\"", "stop", "invalid_value");
  BAD("\"model\": 7", "model", "invalid_type");
  BAD("\"dgemma\": {\"turbo\": true}", "dgemma", "unknown_parameter");
  BAD("\"dgemma\": {\"gen_kwargs\": \"{}\"}", "dgemma.gen_kwargs", "invalid_type");
  BAD("\"tools\": []", "tools", "unknown_parameter");
  /* a name given twice (session 27: a fuzzed body with two dgemma.gen_kwargs leaked the first one's copy) */
  BAD("\"dgemma\": {\"gen_kwargs\": {}, \"draft\": true, \"gen_kwargs\": {}}", "dgemma", "invalid_value");
  BAD("\"dgemma\": {\"think\": true, \"think\": false}", "dgemma", "invalid_value");
  BAD("\"seed\": 1, \"seed\": 2", "seed", "invalid_value");
#undef BAD
  expect_parse(DG_SRV_COMPLETION, "{\"prompt\": 5}", 400, "prompt", "invalid_type");
  expect_parse(DG_SRV_COMPLETION, "{\"prompt\": \"\"}", 400, "prompt", "invalid_value");
  expect_parse(DG_SRV_COMPLETION, "{\"prompt\": \"x\", \"echo\": true}", 400, "echo", "unsupported_value");
  expect_parse(DG_SRV_COMPLETION, "{\"prompt\": \"x\", \"messages\": []}", 400, "messages", "unknown_parameter");
  /* \u0000 in a string: cJSON would end the string there and drop the rest, so it is refused by its field */
  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"user\", "
                            "\"content\": \"abc\\u0000 the rest\"}]}", 400, "messages[1].content", "invalid_value");
  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
                            "{\"type\": \"text\", \"text\": \"\\u0000\"}]}]}", 400, "messages[0].content[1].text", "invalid_value");
  expect_parse(DG_SRV_COMPLETION, "{\"prompt\": \"Once\\u0000 upon\"}", 400, "prompt", "invalid_value");
  expect_parse(DG_SRV_COMPLETION, "{\"prompt\": \"x\", \"stop\": [\"a\", \"\\u0000\"]}", 400, "stop[1]", "invalid_value");
  /* an escaped backslash before "u0000" is text, and \u0001 is a character: both accepted, carried whole */
  const char *bs = "{\"prompt\": \"a\\\\u0000b\\u0001c\"}";
  assert_int_equal(dg_srv_parse(DG_SRV_COMPLETION, bs, strlen(bs), &l, &r, &e), 0);
  assert_string_equal(r.prompt, "a\\u0000b\001c");
  dg_srv_request_free(&r);
  expect_parse(DG_SRV_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"dgemma\": {\"gen_kwargs\": "
                            "{\"eos_token_id\": [1], \"x\\u0000\": 1}}}", 400, "dgemma.gen_kwargs.x", "invalid_value");
  /* the body limit */
  char *big = malloc(5000);
  memset(big, ' ', 4999);
  big[4999] = 0;
  memcpy(big, "{\"prompt\": \"x\"}", 15);
  expect_parse(DG_SRV_COMPLETION, big, 413, "", "request_too_large");
  free(big);

  /* the error object */
  dg_srv_fail(&e, 400, "max_tokens", "invalid_value", "'max_tokens' = %d is outside", 0);
  char *j = dg_srv_error_json(&e);
  cJSON *o = cJSON_Parse(j), *er = cJSON_GetObjectItem(o, "error");
  assert_non_null(er);
  assert_string_equal(cJSON_GetObjectItem(er, "message")->valuestring, "'max_tokens' = 0 is outside");
  assert_string_equal(cJSON_GetObjectItem(er, "type")->valuestring, "invalid_request_error");
  assert_string_equal(cJSON_GetObjectItem(er, "param")->valuestring, "max_tokens");
  assert_string_equal(cJSON_GetObjectItem(er, "code")->valuestring, "invalid_value");
  cJSON_Delete(o);
  free(j);
  dg_srv_fail(&e, 401, NULL, NULL, "no key");
  j = dg_srv_error_json(&e);
  o = cJSON_Parse(j);
  er = cJSON_GetObjectItem(o, "error");
  assert_string_equal(cJSON_GetObjectItem(er, "type")->valuestring, "authentication_error");
  assert_true(cJSON_IsNull(cJSON_GetObjectItem(er, "param")) && cJSON_IsNull(cJSON_GetObjectItem(er, "code")));
  cJSON_Delete(o);
  free(j);
}

static void test_stop_scan(void **state) {
  (void)state;
  char *stop[2] = {"END", "\n\n"};
  int hit;
  const char *t = "one two END three";
  assert_int_equal(dg_srv_stop_scan(t, strlen(t), stop, 2, 0, &hit), 8);
  assert_true(hit);
  t = "a\n\nb END";
  assert_int_equal(dg_srv_stop_scan(t, strlen(t), stop, 2, 0, &hit), 1); /* the earliest of both */
  assert_true(hit);
  t = "one two EN"; /* "EN" may become "END": held back until more text or the end */
  assert_int_equal(dg_srv_stop_scan(t, strlen(t), stop, 2, 0, &hit), 8);
  assert_false(hit);
  assert_int_equal(dg_srv_stop_scan(t, strlen(t), stop, 2, 1, &hit), 10);
  t = "line\n";
  assert_int_equal(dg_srv_stop_scan(t, strlen(t), stop, 2, 0, &hit), 4);
  assert_int_equal(dg_srv_stop_scan(t, strlen(t), stop, 0, 0, &hit), 5);
  /* an empty stop string never matches and holds nothing back (fuzz_serve_req: the hold-back loop
   * started at strlen - 1 = SIZE_MAX and ran for ever; input in fuzz/regress/serve_req) */
  char *empty[2] = {"", "END"};
  t = "abc EN";
  assert_int_equal(dg_srv_stop_scan(t, strlen(t), empty, 2, 0, &hit), 4);
  assert_false(hit);
  assert_int_equal(dg_srv_stop_scan(t, strlen(t), empty, 1, 0, &hit), 6);
  assert_false(hit);
  assert_int_equal(dg_srv_stable_len("ab\xEF\xBF\xBD\xEF\xBF\xBD", 8), 2);
  assert_int_equal(dg_srv_stable_len("ab\xC3\xA9", 4), 4);
}

/* ---- the server over HTTP ------------------------------------------------ */

#ifndef DG_HAVE_CURL
static void test_http(void **state) {
  (void)state;
  dg_test_skip("test_serve was built without libcurl (libcurl4-openssl-dev; scripts/setup.sh installs it)");
}
static void test_openai_client(void **state) {
  (void)state;
  dg_test_skip("test_serve was built without libcurl (libcurl4-openssl-dev; scripts/setup.sh installs it)");
}
static void test_cancel_and_stop(void **state) {
  (void)state;
  dg_test_skip("test_serve was built without libcurl (libcurl4-openssl-dev; scripts/setup.sh installs it)");
}
static void test_prompt_cache(void **state) {
  (void)state;
  dg_test_skip("test_serve was built without libcurl (libcurl4-openssl-dev; scripts/setup.sh installs it)");
}
#else

static dg_model *g_m;

typedef struct http_resp {
  long status;
  char *body;
  size_t n;
  int abort_after; /* > 0: stop reading once this many bytes came (a client that goes away);
                    * < 0: give up after -abort_after ms (a client that stops waiting) */
} http_resp;

static size_t on_data(char *p, size_t sz, size_t nm, void *ud) {
  http_resp *r = ud;
  size_t k = sz * nm;
  char *b = realloc(r->body, r->n + k + 1);
  if (!b) return 0;
  r->body = b;
  memcpy(r->body + r->n, p, k);
  r->n += k;
  r->body[r->n] = 0;
  if (r->abort_after > 0 && r->n >= (size_t)r->abort_after) return 0;
  return k;
}

/* One request; body NULL = GET. Returns the response (body "" when empty). */
static http_resp http(int port, const char *method, const char *path, const char *body, const char *auth, int abort_after) {
  http_resp r = {0, NULL, 0, abort_after};
  char url[256];
  snprintf(url, sizeof url, "http://127.0.0.1:%d%s", port, path);
  CURL *c = curl_easy_init();
  struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
  if (auth) h = curl_slist_append(h, auth);
  curl_easy_setopt(c, CURLOPT_URL, url);
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
  curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
  if (body) {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
  }
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &r);
  curl_easy_setopt(c, CURLOPT_TIMEOUT, 1200L); /* the ASan build on a loaded 2-core machine took over 300 s */
  if (abort_after < 0) curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)-abort_after);
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK && !(abort_after > 0 && rc == CURLE_WRITE_ERROR) && !(abort_after < 0 && rc == CURLE_OPERATION_TIMEDOUT))
    fail_msg("%s %s: %s", method, path, curl_easy_strerror(rc));
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
  curl_slist_free_all(h);
  curl_easy_cleanup(c);
  if (!r.body) r.body = strdup("");
  return r;
}

/* The error object of a 4xx/5xx answer: checks its shape, returns error.code ("" if null). */
static const char *error_code(const http_resp *r, char *buf, size_t n) {
  cJSON *o = cJSON_Parse(r->body), *e = cJSON_GetObjectItem(o, "error");
  if (!e) fail_msg("status %ld without an error object: %s", r->status, r->body);
  assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "message")));
  assert_true(cJSON_IsString(cJSON_GetObjectItem(e, "type")));
  const cJSON *c = cJSON_GetObjectItem(e, "code");
  snprintf(buf, n, "%s", cJSON_IsString(c) ? c->valuestring : "");
  cJSON_Delete(o);
  return buf;
}

/* The engine's own answer for a chat (kind 0) or completion prompt: text of the first
 * max_tokens valid tokens, their count, the visible ones among them (usage's completion_tokens:
 * dg_gen_result.n_visible; an answer cut at max_tokens in these tests is text, every token shown),
 * the finish reason as the server names it. A fresh context: no prompt cache. */
typedef struct expect {
  char *text;
  int32_t n_prompt, n_tokens, n_steps, n_visible;
  const char *finish;
} expect;

static expect engine_run(int32_t *ids, size_t n, int32_t max_tokens, uint64_t seed, const char *kwargs, int32_t **toks);

/* The engine's answer to a conversation of n messages. */
static expect engine_chat(const dg_chat_message *msgs, size_t n_msgs, int32_t max_tokens, uint64_t seed,
                          const char *kwargs) {
  int32_t *ids = NULL;
  size_t n = 0;
  assert_dg_ok(dg_chat_apply(g_m, msgs, n_msgs, 0, &ids, &n));
  return engine_run(ids, n, max_tokens, seed, kwargs, NULL);
}

/* engine_answer of a completion prompt; if ids is not NULL, its prompt ids (<bos> first) in *ids[*n] and
 * the generated tokens in *toks (malloc'd). */
static expect engine_completion(const char *prompt, int32_t max_tokens, uint64_t seed, const char *kwargs, int32_t **ids,
                                size_t *n, int32_t **toks) {
  int32_t *t = NULL;
  size_t k = 0;
  assert_dg_ok(dg_tokenize(g_m, prompt, strlen(prompt), 1, &t, &k));
  int32_t *p = malloc((k + 1) * sizeof *p);
  p[0] = 2;
  memcpy(p + 1, t, k * sizeof *p);
  dg_free(t);
  if (ids) {
    *ids = malloc((k + 1) * sizeof **ids);
    memcpy(*ids, p, (k + 1) * sizeof *p);
    *n = k + 1;
  }
  return engine_run(p, k + 1, max_tokens, seed, kwargs, ids ? toks : NULL);
}

static expect engine_answer(const char *user, const char *completion, int32_t max_tokens, uint64_t seed,
                            const char *kwargs) {
  if (!user) return engine_completion(completion, max_tokens, seed, kwargs, NULL, NULL, NULL);
  dg_chat_message msg = {"user", user};
  return engine_chat(&msg, 1, max_tokens, seed, kwargs);
}

/* engine_answer of the prompt ids[n] (freed here); toks (if not NULL): the generated tokens (malloc'd). */
static expect engine_run(int32_t *ids, size_t n, int32_t max_tokens, uint64_t seed, const char *kwargs, int32_t **toks) {
  expect x = {0};
  dg_gen_params gp = dg_gen_default_params(g_m);
  assert_dg_ok(dg_gen_params_apply_json(&gp, TURBO));
  if (kwargs) assert_dg_ok(dg_gen_params_apply_json(&gp, kwargs));
  gp.max_new_tokens = max_tokens;
  gp.seed = seed;
  dg_context *ctx;
  assert_dg_ok(dg_context_new(g_m, NULL, &ctx));
  dg_gen_result r;
  assert_dg_ok(dg_generate(ctx, ids, n, &gp, &r));
  int32_t nv = r.n_valid < max_tokens ? r.n_valid : max_tokens;
  assert_dg_ok(dg_detokenize(g_m, r.tokens, (size_t)nv, 0, &x.text));
  x.n_prompt = (int32_t)n;
  x.n_tokens = nv;
  x.n_visible = r.n_valid <= max_tokens ? r.n_visible : max_tokens;
  if (toks) {
    *toks = malloc((size_t)r.n_tokens * sizeof **toks);
    memcpy(*toks, r.tokens, (size_t)r.n_tokens * sizeof **toks);
  }
  x.n_steps = r.n_steps;
  x.finish = r.n_valid > max_tokens ? "length"
             : r.finish_reason == DG_FINISH_STOP ? "stop" : r.finish_reason == DG_FINISH_REPETITION ? "repetition" : "length";
  dg_gen_result_free(&r);
  dg_context_free(ctx);
  dg_free(ids);
  return x;
}

/* A streamed body: the concatenated deltas (chat) or texts (completions), the finish reason,
 * the usage chunk's completion_tokens (-1 if none), the number of draft events; checks the
 * framing (every event "data: JSON" or "event: dgemma.canvas", [DONE] last). */
typedef struct sse_sum {
  char text[8192];
  char finish[32];
  int completion_tokens, n_draft, n_chunks, role_first, done_last;
} sse_sum;

static sse_sum parse_sse(const char *body, int chat) {
  sse_sum s;
  memset(&s, 0, sizeof s);
  s.completion_tokens = -1;
  char *copy = strdup(body), *save = NULL;
  int idx = 0;
  for (char *ev = strtok_r(copy, "\n", &save); ev; ev = strtok_r(NULL, "\n", &save)) {
    if (ev[0] == ':') continue; /* keep-alive comment */
    if (!strncmp(ev, "event: ", 7)) {
      assert_string_equal(ev + 7, "dgemma.canvas");
      char *data = strtok_r(NULL, "\n", &save);
      assert_non_null(data);
      assert_memory_equal(data, "data: ", 6);
      cJSON *o = cJSON_Parse(data + 6);
      assert_non_null(o);
      assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "draft")), 64);
      assert_int_equal(cJSON_GetArraySize(cJSON_GetObjectItem(o, "settled")), 64);
      assert_true(cJSON_IsNumber(cJSON_GetObjectItem(o, "step")));
      cJSON_Delete(o);
      s.n_draft++;
      continue;
    }
    if (strncmp(ev, "data: ", 6)) fail_msg("unexpected SSE line \"%s\"", ev);
    assert_false(s.done_last); /* nothing after [DONE] */
    if (!strcmp(ev + 6, "[DONE]")) { s.done_last = 1; continue; }
    cJSON *o = cJSON_Parse(ev + 6);
    if (!o) fail_msg("SSE data is not JSON: %s", ev);
    if (cJSON_GetObjectItem(o, "error")) fail_msg("error in stream: %s", ev);
    assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, chat ? "chat.completion.chunk" : "text_completion");
    const cJSON *u = cJSON_GetObjectItem(o, "usage");
    if (cJSON_IsObject(u)) s.completion_tokens = cJSON_GetObjectItem(u, "completion_tokens")->valueint;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    if (c) {
      const cJSON *d = chat ? cJSON_GetObjectItem(c, "delta") : c;
      if (chat && idx == 0) s.role_first = cJSON_IsString(cJSON_GetObjectItem(d, "role"));
      const cJSON *t = cJSON_GetObjectItem(d, chat ? "content" : "text");
      if (cJSON_IsString(t)) strncat(s.text, t->valuestring, sizeof s.text - strlen(s.text) - 1);
      const cJSON *f = cJSON_GetObjectItem(c, "finish_reason");
      if (cJSON_IsString(f)) snprintf(s.finish, sizeof s.finish, "%s", f->valuestring);
      s.n_chunks++;
    }
    idx++;
    cJSON_Delete(o);
  }
  free(copy);
  return s;
}

static double metric(int port, const char *name) {
  http_resp r = http(port, "GET", "/metrics", NULL, NULL, 0);
  assert_int_equal(r.status, 200);
  char pat[128];
  snprintf(pat, sizeof pat, "\n%s ", name);
  const char *p = strstr(r.body, pat);
  if (!p) fail_msg("metric %s not in\n%s", name, r.body);
  double v = atof(p + strlen(pat));
  free(r.body);
  return v;
}

typedef struct conc_arg {
  int port;
  char body[512];
  http_resp r;
} conc_arg;

static void *conc_thread(void *p) {
  conc_arg *a = p;
  a->r = http(a->port, "POST", "/v1/chat/completions", a->body, NULL, 0);
  return NULL;
}

static const char *Q[4] = {"What is 7 times 8?", "Tom has 23 apples and buys 14 more. How many apples does he have?",
                           "Write a line about the sea.", "What is 12 plus 30?"};

static void check_chat_json(const http_resp *r, const expect *x) {
  if (r->status != 200) fail_msg("status %ld: %s", r->status, r->body);
  cJSON *o = cJSON_Parse(r->body);
  assert_non_null(o);
  assert_string_equal(cJSON_GetObjectItem(o, "object")->valuestring, "chat.completion");
  const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
  const cJSON *msg = cJSON_GetObjectItem(c, "message");
  assert_string_equal(cJSON_GetObjectItem(msg, "role")->valuestring, "assistant");
  assert_string_equal(cJSON_GetObjectItem(msg, "content")->valuestring, x->text);
  assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, x->finish);
  const cJSON *u = cJSON_GetObjectItem(o, "usage");
  assert_int_equal(cJSON_GetObjectItem(u, "prompt_tokens")->valueint, x->n_prompt);
  assert_int_equal(cJSON_GetObjectItem(u, "completion_tokens")->valueint, x->n_visible);
  assert_int_equal(cJSON_GetObjectItem(u, "total_tokens")->valueint, x->n_prompt + x->n_visible);
  cJSON_Delete(o);
}

/* usage.prompt_tokens_details.cached_tokens of a JSON answer. */
static int cached_tokens(const char *body) {
  cJSON *o = cJSON_Parse(body);
  const cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens_details");
  if (!cJSON_IsNumber(cJSON_GetObjectItem(d, "cached_tokens"))) fail_msg("no usage.prompt_tokens_details.cached_tokens: %s", body);
  int k = cJSON_GetObjectItem(d, "cached_tokens")->valueint;
  cJSON_Delete(o);
  return k;
}

/* Load the bundled model into g_m (or skip the test) and start a server with o on it (skipped without
 * libmicrohttpd). */
static dg_server *serve_small(const dg_serve_opts *o) {
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 2;
  if (access(SMALL "/config.json", R_OK) || dg_model_load(SMALL, &mp, &g_m) != DG_OK)
    dg_test_skip("the bundled model %s does not load", SMALL);
  signal(SIGPIPE, SIG_IGN);
  dg_server *srv = NULL;
  dg_status st = dg_server_start(g_m, o, &srv);
  if (st == DG_ERR_BACKEND) {
    dg_model_free(g_m);
    dg_test_skip("dgemma was built without libmicrohttpd (libmicrohttpd-dev; scripts/setup.sh installs it)");
  }
  assert_int_equal(st, DG_OK);
  return srv;
}

static void test_http(void **state) {
  (void)state;
  dg_serve_opts o = dg_serve_default_opts();
  o.port = 0;
  o.model_id = "dgemma-small";
  o.gen_kwargs = TURBO;
  o.max_batch = 4;
  o.timeout_s = 2;
  o.lim.max_body = 8192;
  o.lim.max_tokens = 1024;
  dg_server *srv = serve_small(&o);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  const int port = dg_server_port(srv);
  assert_true(port > 0);
  printf("# server on 127.0.0.1:%d\n", port);
  char code[64];

  http_resp r = http(port, "GET", "/health", NULL, NULL, 0);
  assert_int_equal(r.status, 200);
  assert_string_equal(r.body, "{\"status\":\"ok\"}");
  free(r.body);
  r = http(port, "GET", "/v1/models", NULL, NULL, 0);
  assert_int_equal(r.status, 200);
  cJSON *mo = cJSON_Parse(r.body);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(mo, "data"), 0), "id")->valuestring,
                      "dgemma-small");
  cJSON_Delete(mo);
  free(r.body);
  r = http(port, "GET", "/", NULL, NULL, 0);
  assert_int_equal(r.status, 200);
  assert_non_null(strstr(r.body, "dgemma.canvas"));
  free(r.body);
  r = http(port, "GET", "/v1/nothing", NULL, NULL, 0);
  assert_int_equal(r.status, 404);
  assert_string_equal(error_code(&r, code, sizeof code), "not_found");
  free(r.body);
  r = http(port, "GET", "/v1/chat/completions", NULL, NULL, 0);
  assert_int_equal(r.status, 405);
  free(r.body);

  /* non-streaming chat = the engine's own run */
  expect x0 = engine_answer(Q[0], NULL, 64, 0, NULL);
  char body[1024];
  snprintf(body, sizeof body, "{\"model\": \"dgemma-small\", \"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], "
                              "\"max_tokens\": 64, \"seed\": 0}", Q[0]);
  r = http(port, "POST", "/v1/chat/completions", body, NULL, 0);
  check_chat_json(&r, &x0);
  printf("# chat: \"%s\" -> %d tokens, finish %s\n", Q[0], x0.n_tokens, x0.finish);
  free(r.body);
  /* streamed: the same text in chunks, role first, finish, usage, [DONE] */
  snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": 64, \"seed\": 0, "
                              "\"stream\": true, \"stream_options\": {\"include_usage\": true}}", Q[0]);
  r = http(port, "POST", "/v1/chat/completions", body, NULL, 0);
  assert_int_equal(r.status, 200);
  sse_sum s = parse_sse(r.body, 1);
  assert_string_equal(s.text, x0.text);
  assert_string_equal(s.finish, x0.finish);
  assert_int_equal(s.completion_tokens, x0.n_visible);
  assert_true(s.role_first && s.done_last);
  assert_int_equal(s.n_draft, 0);
  free(r.body);

  /* max_tokens below one canvas: cut at 5 tokens, finish length */
  expect x5 = engine_answer(Q[1], NULL, 5, 3, NULL);
  snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": 5, \"seed\": 3}", Q[1]);
  r = http(port, "POST", "/v1/chat/completions", body, NULL, 0);
  assert_string_equal(x5.finish, "length");
  assert_int_equal(x5.n_tokens, 5);
  check_chat_json(&r, &x5);
  free(r.body);

  /* completions, 2 canvases, streamed with draft events; then a stop string from its own text */
  expect xc = engine_answer(NULL, "Once upon a time", 128, 5, NULL);
  r = http(port, "POST", "/v1/completions",
           "{\"prompt\": \"Once upon a time\", \"max_tokens\": 128, \"seed\": 5, \"stream\": true, \"dgemma\": {\"draft\": true}}",
           NULL, 0);
  assert_int_equal(r.status, 200);
  s = parse_sse(r.body, 0);
  assert_string_equal(s.text, xc.text);
  assert_string_equal(s.finish, xc.finish);
  assert_true(s.n_draft >= 2); /* at least one denoising step per canvas */
  printf("# completion streamed: %d chunks, %d draft-canvas events, finish %s\n", s.n_chunks, s.n_draft, s.finish);
  free(r.body);
  size_t L = strlen(xc.text);
  assert_true(L > 12);
  char stop[8];
  memcpy(stop, xc.text + L / 2, 3); /* three bytes from the middle of the text */
  stop[3] = 0;
  int ascii = 1;
  for (int i = 0; i < 3; i++) ascii &= (unsigned char)stop[i] >= 0x20 && (unsigned char)stop[i] < 0x7F && stop[i] != '"' && stop[i] != '\\';
  if (ascii) {
    const char *cut = strstr(xc.text, stop);
    snprintf(body, sizeof body, "{\"prompt\": \"Once upon a time\", \"max_tokens\": 128, \"seed\": 5, \"stop\": \"%s\"}", stop);
    r = http(port, "POST", "/v1/completions", body, NULL, 0);
    assert_int_equal(r.status, 200);
    cJSON *co = cJSON_Parse(r.body);
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(co, "choices"), 0);
    assert_int_equal(strlen(cJSON_GetObjectItem(c, "text")->valuestring), (size_t)(cut - xc.text));
    assert_memory_equal(cJSON_GetObjectItem(c, "text")->valuestring, xc.text, (size_t)(cut - xc.text));
    assert_string_equal(cJSON_GetObjectItem(c, "finish_reason")->valuestring, "stop");
    int ct = cJSON_GetObjectItem(cJSON_GetObjectItem(co, "usage"), "completion_tokens")->valueint;
    assert_true(ct >= 1 && ct <= xc.n_tokens);
    printf("# stop \"%s\": text cut at byte %d of %zu, %d of %d tokens\n", stop, (int)(cut - xc.text), L, ct, xc.n_tokens);
    cJSON_Delete(co);
    free(r.body);
  }

  /* the reference sampler through the extension (runs alone, through dg_generate) */
  const char *ref = "{\"diffusion_turbo\": false, \"max_denoising_steps\": 3}";
  expect xr = engine_answer(Q[3], NULL, 64, 1, ref);
  snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": 64, \"seed\": 1, "
                              "\"dgemma\": {\"gen_kwargs\": %s}}", Q[3], ref);
  r = http(port, "POST", "/v1/chat/completions", body, NULL, 0);
  check_chat_json(&r, &xr);
  free(r.body);

  /* 4 concurrent streams: each equals its own run alone; they shared batched steps */
  expect xs[4];
  conc_arg ca[4];
  pthread_t th[4];
  int sum_steps = 0;
  for (int i = 0; i < 4; i++) {
    xs[i] = engine_answer(Q[i], NULL, 128, 10 + (uint64_t)i, NULL);
    ca[i].port = port;
    snprintf(ca[i].body, sizeof ca[i].body, "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": 128, "
                                            "\"seed\": %d, \"stream\": true, \"stream_options\": {\"include_usage\": true}}", Q[i], 10 + i);
  }
  const double steps0 = metric(port, "dgemma_step_seconds_count");
  for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, conc_thread, &ca[i]);
  for (int i = 0; i < 4; i++) pthread_join(th[i], NULL);
  const double steps1 = metric(port, "dgemma_step_seconds_count");
  for (int i = 0; i < 4; i++) {
    assert_int_equal(ca[i].r.status, 200);
    s = parse_sse(ca[i].r.body, 1);
    assert_string_equal(s.text, xs[i].text);
    assert_string_equal(s.finish, xs[i].finish);
    assert_int_equal(s.completion_tokens, xs[i].n_visible);
    assert_true(s.done_last);
    free(ca[i].r.body);
  }
  for (int i = 0; i < 4; i++) sum_steps += xs[i].n_steps; /* the forwards each needed alone */
  printf("# 4 concurrent streams: each equals its own run; %.0f batched steps for %d forwards\n", steps1 - steps0, sum_steps);
  assert_true(steps1 - steps0 < sum_steps);

  /* a client that goes away after the first bytes: its canvas is cancelled, the server goes on */
  const double cancelled0 = metric(port, "dgemma_requests_total{outcome=\"cancelled\"}");
  r = http(port, "POST", "/v1/chat/completions",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell a long story.\"}], \"max_tokens\": 1024, \"stream\": true, "
           "\"dgemma\": {\"draft\": true, \"gen_kwargs\": {\"eos_token_id\": []}}}", NULL, 300);
  free(r.body);
  double cancelled1 = cancelled0;
  for (int k = 0; k < 100 && cancelled1 == cancelled0; k++) {
    usleep(100000);
    cancelled1 = metric(port, "dgemma_requests_total{outcome=\"cancelled\"}");
  }
  assert_true(cancelled1 == cancelled0 + 1);
  assert_true(metric(port, "dgemma_active_canvases") == 0);

  /* bad requests over HTTP: 4xx with an error body */
  r = http(port, "POST", "/v1/chat/completions", "{\"messages\": [", NULL, 0);
  assert_int_equal(r.status, 400);
  assert_string_equal(error_code(&r, code, sizeof code), "invalid_json");
  free(r.body);
  r = http(port, "POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": 1}]}", NULL, 0);
  assert_int_equal(r.status, 400);
  assert_string_equal(error_code(&r, code, sizeof code), "invalid_type");
  free(r.body);
  r = http(port, "POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"best_of\": 2}", NULL, 0);
  assert_int_equal(r.status, 400);
  assert_string_equal(error_code(&r, code, sizeof code), "unknown_parameter");
  free(r.body);
  r = http(port, "POST", "/v1/chat/completions", "{\"model\": \"gpt-4\", \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", NULL, 0);
  assert_int_equal(r.status, 404);
  assert_string_equal(error_code(&r, code, sizeof code), "model_not_found");
  free(r.body);
  r = http(port, "POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 5000}", NULL, 0);
  assert_int_equal(r.status, 400);
  free(r.body);
  /* a temperature so small that logits / T overflow fp32 (t_min = 0.4 * 1e-40, a denormal): 400 naming the field,
   * before any work (session 26: a turbo request answered 200 with a canvas of noise, accepted in one step) */
  r = http(port, "POST", "/v1/chat/completions",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 64, \"temperature\": 1e-40}", NULL, 0);
  printf("# temperature 1e-40: %ld %s\n", (long)r.status, r.body);
  assert_int_equal(r.status, 400);
  assert_string_equal(error_code(&r, code, sizeof code), "invalid_value");
  assert_non_null(strstr(r.body, "\"param\":\"temperature\""));
  assert_non_null(strstr(r.body, "is too small"));
  free(r.body);
  r = http(port, "POST", "/v1/chat/completions",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 64, \"stream\": true, "
           "\"dgemma\": {\"gen_kwargs\": {\"t_min\": 1e-39, \"t_max\": 0.5}}}", NULL, 0);
  printf("# gen_kwargs t_min 1e-39: %ld %s\n", (long)r.status, r.body);
  assert_int_equal(r.status, 400);
  assert_non_null(strstr(r.body, "\"param\":\"dgemma.gen_kwargs\""));
  assert_non_null(strstr(r.body, "is too small"));
  free(r.body);
  /* a valid temperature beside a gen_kwargs stop id outside the vocabulary: the field named is gen_kwargs */
  r = http(port, "POST", "/v1/chat/completions",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 64, \"temperature\": 0.5, "
           "\"dgemma\": {\"gen_kwargs\": {\"eos_token_id\": [99999]}}}", NULL, 0);
  printf("# temperature 0.5, eos_token_id [99999]: %ld %s\n", (long)r.status, r.body);
  assert_int_equal(r.status, 400);
  assert_non_null(strstr(r.body, "\"param\":\"dgemma.gen_kwargs\""));
  assert_non_null(strstr(r.body, "99999"));
  free(r.body);
  char *big = malloc(20000);
  memset(big, ' ', 19999);
  big[19999] = 0;
  memcpy(big, "{\"prompt\": \"x\"}", 15);
  r = http(port, "POST", "/v1/completions", big, NULL, 0);
  assert_int_equal(r.status, 413);
  assert_string_equal(error_code(&r, code, sizeof code), "request_too_large");
  free(r.body);
  free(big);
  /* a stalled partial request: headers and part of the body, then nothing; closed after the timeout */
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
  const char *part = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"mess";
  assert_int_equal(send(fd, part, strlen(part), 0), (ssize_t)strlen(part));
  struct timeval tv = {20, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  char buf[256];
  ssize_t got = recv(fd, buf, sizeof buf, 0);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  double waited = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
  printf("# stalled request: closed after %.1f s (recv %zd)\n", waited, got);
  assert_true(got <= 0 || !strncmp(buf, "HTTP/1.1 4", 10));
  assert_true(waited < 15);
  close(fd);
  r = http(port, "GET", "/health", NULL, NULL, 0); /* still serving */
  assert_int_equal(r.status, 200);
  free(r.body);
  assert_true(metric(port, "dgemma_http_responses_total{class=\"4xx\"}") >= 8);
  dg_server_stop(srv);

  /* Bearer auth */
  o.api_key = "s3cret";
  assert_dg_ok(dg_server_start(g_m, &o, &srv));
  const int p2 = dg_server_port(srv);
  r = http(p2, "GET", "/v1/models", NULL, NULL, 0);
  assert_int_equal(r.status, 401);
  assert_string_equal(error_code(&r, code, sizeof code), "invalid_api_key");
  free(r.body);
  r = http(p2, "GET", "/v1/models", NULL, "Authorization: Bearer wrong", 0);
  assert_int_equal(r.status, 401);
  free(r.body);
  r = http(p2, "POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", NULL, 0);
  assert_int_equal(r.status, 401);
  free(r.body);
  r = http(p2, "GET", "/v1/models", NULL, "Authorization: Bearer s3cret", 0);
  assert_int_equal(r.status, 200);
  free(r.body);
  r = http(p2, "GET", "/health", NULL, NULL, 0); /* health needs no key */
  assert_int_equal(r.status, 200);
  free(r.body);
  dg_server_stop(srv);

  free(x0.text); free(x5.text); free(xc.text); free(xr.text);
  for (int i = 0; i < 4; i++) free(xs[i].text);
  curl_global_cleanup();
  dg_model_free(g_m);
}

typedef struct stream_arg {
  int port;
  const char *body;
  http_resp r;
} stream_arg;

static void *stream_thread(void *p) {
  stream_arg *a = p;
  a->r = http(a->port, "POST", "/v1/chat/completions", a->body, NULL, 0);
  return NULL;
}

/* Poll metric name until it equals want (at most ~10 s). */
static void wait_metric(int port, const char *name, double want) {
  double v = metric(port, name);
  for (int k = 0; k < 200 && v != want; k++) {
    usleep(50000);
    v = metric(port, name);
  }
  if (v != want) fail_msg("metric %s = %g, expected %g", name, v, want);
}

/* The ends of requests: a completion prompt beyond --max-context (the error names "prompt"); a
 * non-streaming client that stops waiting (cancelled, not counted as a 5xx); the server stopped with
 * one stream running and one queued (both end with the error event and `data: [DONE]`; the queued
 * one's log line has 0 s, not the time since boot). */
static void test_cancel_and_stop(void **state) {
  (void)state;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 2;
  if (access(SMALL "/config.json", R_OK) || dg_model_load(SMALL, &mp, &g_m) != DG_OK)
    dg_test_skip("the bundled model %s does not load", SMALL);
  signal(SIGPIPE, SIG_IGN);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  char *logbuf = NULL;
  size_t loglen = 0;
  FILE *log = open_memstream(&logbuf, &loglen);
  assert_non_null(log);
  dg_serve_opts o = dg_serve_default_opts();
  o.port = 0;
  o.model_id = "dgemma-small";
  o.gen_kwargs = TURBO;
  o.max_batch = 1; /* a second request waits in the queue */
  o.timeout_s = 5;
  o.lim.max_context = 8192;
  o.log = log;
  dg_server *srv = NULL;
  dg_status st = dg_server_start(g_m, &o, &srv);
  if (st == DG_ERR_BACKEND) {
    dg_model_free(g_m);
    dg_test_skip("dgemma was built without libmicrohttpd (libmicrohttpd-dev; scripts/setup.sh installs it)");
  }
  assert_int_equal(st, DG_OK);
  const int port = dg_server_port(srv);

  /* a completion prompt + canvases beyond the context: 400 context_length_exceeded, param "prompt" */
  const size_t nw = 9000;
  char *big = malloc(nw * 3 + 64), *p = big;
  p += sprintf(p, "{\"prompt\": \"");
  for (size_t i = 0; i < nw; i++) p += sprintf(p, "a ");
  sprintf(p, "\", \"max_tokens\": 64}");
  http_resp r = http(port, "POST", "/v1/completions", big, NULL, 0);
  assert_int_equal(r.status, 400);
  cJSON *ro = cJSON_Parse(r.body), *eo = cJSON_GetObjectItem(ro, "error");
  printf("# completion of %zu words: %ld %s\n", nw, r.status, r.body);
  assert_string_equal(cJSON_GetObjectItem(eo, "code")->valuestring, "context_length_exceeded");
  assert_string_equal(cJSON_GetObjectItem(eo, "param")->valuestring, "prompt");
  cJSON_Delete(ro);
  free(r.body);
  free(big);

  /* a non-streaming client that gives up after 300 ms: cancelled, no 5xx counted (it got no answer) */
  const char *slow = "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell a long story.\"}], \"max_tokens\": 4096, "
                     "\"dgemma\": {\"gen_kwargs\": {\"eos_token_id\": [], \"turbo_repeat_guard\": 0}}}";
  const double c5 = metric(port, "dgemma_http_responses_total{class=\"5xx\"}");
  r = http(port, "POST", "/v1/chat/completions", slow, NULL, -300);
  assert_int_equal(r.status, 0); /* no response came */
  free(r.body);
  wait_metric(port, "dgemma_requests_total{outcome=\"cancelled\"}", 1);
  wait_metric(port, "dgemma_active_canvases", 0);
  assert_true(metric(port, "dgemma_http_responses_total{class=\"5xx\"}") == c5);

  /* stop with a stream running and one queued */
  const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell a long story.\"}], \"max_tokens\": 4096, "
                     "\"stream\": true, \"dgemma\": {\"draft\": true, \"gen_kwargs\": {\"eos_token_id\": [], \"turbo_repeat_guard\": 0}}}";
  stream_arg sa[2] = {{port, body, {0}}, {port, body, {0}}};
  pthread_t th[2];
  pthread_create(&th[0], NULL, stream_thread, &sa[0]);
  wait_metric(port, "dgemma_active_canvases", 1);
  pthread_create(&th[1], NULL, stream_thread, &sa[1]);
  wait_metric(port, "dgemma_queue_depth", 1);
  assert_true(metric(port, "dgemma_active_canvases") == 1); /* the first still runs */
  dg_server_stop(srv);
  for (int i = 0; i < 2; i++) {
    pthread_join(th[i], NULL);
    const char *b = sa[i].r.body;
    size_t n = strlen(b);
    printf("# stream %d (%s) after the stop: %zu bytes, ends \"%s\"\n", i, i ? "queued" : "running", n,
           n > 120 ? b + n - 120 : b);
    assert_int_equal(sa[i].r.status, 200);
    assert_non_null(strstr(b, "\"code\":\"cancelled\""));
    assert_true(n >= 14 && !strcmp(b + n - 14, "data: [DONE]\n\n"));
    free(sa[i].r.body);
  }
  fclose(log);
  /* every request's log line: a duration of seconds, the queued one's 0 */
  printf("# log:\n%s", logbuf);
  int lines = 0, queued = 0;
  for (char *l = strtok(logbuf, "\n"); l; l = strtok(NULL, "\n")) {
    const char *t = strstr(l, " steps, ");
    if (!t) continue;
    double sec = atof(t + 8);
    lines++;
    if (!(sec >= 0 && sec < 120)) fail_msg("log line with a duration of %g s: %s", sec, l);
    if (strstr(l, "0 canvases, 0 steps, 0.00 s")) queued++;
  }
  assert_int_equal(lines, 3);
  assert_int_equal(queued, 1);
  free(logbuf);
  curl_global_cleanup();
  dg_model_free(g_m);
}

/* The official openai npm client (tests/node/openai_client.cjs) against the server: models,
 * chat, a stream, completions and an error, its answers equal to the engine's own. */
static void test_openai_client(void **state) {
  (void)state;
  if (system("command -v node >/dev/null 2>&1") != 0) dg_test_skip("node is not installed (scripts/setup.sh installs npm)");
  if (access(".node/node_modules/openai/package.json", R_OK))
    dg_test_skip("the openai npm client is not in .node/ (scripts/setup.sh installs it)");
  dg_serve_opts o = dg_serve_default_opts();
  o.port = 0;
  o.model_id = "dgemma-small";
  o.gen_kwargs = TURBO;
  dg_server *srv = serve_small(&o);
  expect x0 = engine_answer(Q[0], NULL, 64, 0, NULL), xc = engine_answer(NULL, "Once upon a time", 128, 5, NULL);
  char tmpl[] = "/tmp/dgemma-test-openai-XXXXXX", cmd[512];
  int fd = mkstemp(tmpl);
  assert_true(fd >= 0);
  close(fd);
  snprintf(cmd, sizeof cmd, "NODE_PATH=.node/node_modules node tests/node/openai_client.cjs %d '%s' > %s", dg_server_port(srv),
           Q[0], tmpl);
  int rc = system(cmd);
  char *out = dg_test_read_file(tmpl, NULL);
  unlink(tmpl);
  if (rc != 0) fail_msg("%s: exit %d, output: %s", cmd, rc, out ? out : "");
  cJSON *j = cJSON_Parse(out);
  if (!j) fail_msg("the client printed no JSON: %s", out);
  assert_string_equal(cJSON_GetArrayItem(cJSON_GetObjectItem(j, "models"), 0)->valuestring, "dgemma-small");
  assert_string_equal(cJSON_GetObjectItem(j, "chat")->valuestring, x0.text);
  assert_string_equal(cJSON_GetObjectItem(j, "chat_finish")->valuestring, x0.finish);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "chat_usage"), "completion_tokens")->valueint, x0.n_visible);
  assert_string_equal(cJSON_GetObjectItem(j, "stream")->valuestring, x0.text);
  assert_string_equal(cJSON_GetObjectItem(j, "stream_finish")->valuestring, x0.finish);
  assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "stream_usage"), "completion_tokens")->valueint, x0.n_visible);
  assert_string_equal(cJSON_GetObjectItem(j, "completion")->valuestring, xc.text);
  assert_int_equal(cJSON_GetObjectItem(j, "error_status")->valueint, 400);
  assert_string_equal(cJSON_GetObjectItem(j, "error_code")->valuestring, "invalid_value");
  printf("# openai npm client: models, chat (%d tokens), stream (%d chunks), completion (%zu bytes), a 400 error: all as the engine\n",
         x0.n_tokens, cJSON_GetObjectItem(j, "stream_chunks")->valueint, strlen(xc.text));
  cJSON_Delete(j);
  free(out);
  free(x0.text);
  free(xc.text);
  dg_server_stop(srv);
  dg_model_free(g_m);
}

/* A chat body of msgs[n] (JSON-escaped by cJSON), malloc'd. */
static char *chat_body(const dg_chat_message *msgs, int n, int max_tokens, int seed, const char *kwargs) {
  cJSON *o = cJSON_CreateObject(), *a = cJSON_AddArrayToObject(o, "messages");
  for (int i = 0; i < n; i++) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", msgs[i].role);
    cJSON_AddStringToObject(m, "content", msgs[i].content);
    cJSON_AddItemToArray(a, m);
  }
  cJSON_AddNumberToObject(o, "max_tokens", max_tokens);
  cJSON_AddNumberToObject(o, "seed", seed);
  if (kwargs) cJSON_AddItemToObject(cJSON_AddObjectToObject(o, "dgemma"), "gen_kwargs", cJSON_Parse(kwargs));
  char *b = cJSON_PrintUnformatted(o);
  cJSON_Delete(o);
  return b;
}

/* POST msgs as a chat completion (chat_body's fields), check the answer against x, and
 * return its usage.prompt_tokens_details.cached_tokens. */
static int chat_cached(int port, const dg_chat_message *msgs, int n, int max_tokens, int seed, const char *kwargs,
                       const expect *x) {
  char *b = chat_body(msgs, n, max_tokens, seed, kwargs);
  http_resp r = http(port, "POST", "/v1/chat/completions", b, NULL, 0);
  free(b);
  check_chat_json(&r, x);
  const int c = cached_tokens(r.body);
  free(r.body);
  return c;
}

static int32_t lcp(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
  int32_t k = 0;
  while ((size_t)k < na && (size_t)k < nb && a[k] == b[k]) k++;
  return k;
}

/* The prompt cache (--cache-slots): a two-turn conversation's second request takes the first's
 * context and prefills only what follows the tokens they share (usage.prompt_tokens_details.
 * cached_tokens, dgemma_prompt_tokens_cached_total); a third request that diverges from the second's
 * tokens in its last question takes the prefix up to there; a completion that continues a cached
 * answer reuses its committed canvas; every answer equals the engine's own fresh run bit for bit (same
 * seed), and so does a server with 0 slots (nothing cached). And usage counts visible tokens (issue
 * 16): with {"eos_token_id": []} the <eos> canvases after an answer are not completion tokens. */
static void test_prompt_cache(void **state) {
  (void)state;
  dg_serve_opts o = dg_serve_default_opts();
  o.port = 0;
  o.gen_kwargs = TURBO;
  o.max_batch = 2;
  o.cache_slots = 2;
  dg_server *srv = serve_small(&o);
  curl_global_init(CURL_GLOBAL_DEFAULT);
  int port = dg_server_port(srv);
  http_resp r;
  char *b;
  const char *q1 = "Tom has 5 pens. He buys 3 more pens. How many pens does Tom have now?", *q2 = "How many pens does Tom have?";
  /* turn 1: nothing cached */
  dg_chat_message m1[1] = {{"user", q1}};
  expect x1 = engine_chat(m1, 1, 64, 7, NULL);
  assert_int_equal(chat_cached(port, m1, 1, 64, 7, NULL, &x1), 0);
  assert_true(x1.n_tokens <= 64); /* one canvas: the context keeps the prompt only (the last canvas is never committed) */
  /* turn 2: the conversation so far and a new question */
  dg_chat_message m2[3] = {{"user", q1}, {"assistant", x1.text}, {"user", q2}};
  expect x2 = engine_chat(m2, 3, 64, 8, NULL);
  const int c2 = chat_cached(port, m2, 3, 64, 8, NULL, &x2);
  int32_t *p1, *p2, *p3;
  size_t n1, n2, n3;
  assert_dg_ok(dg_chat_apply(g_m, m1, 1, 0, &p1, &n1));
  assert_dg_ok(dg_chat_apply(g_m, m2, 3, 0, &p2, &n2));
  /* the template writes the first answer without the empty thought channel of its generation prompt: the
   * tokens are shared up to turn 1's "<|turn>model\n" */
  assert_int_equal(c2, lcp(p1, n1, p2, n2));
  assert_true(c2 > 0 && c2 < (int)n1);
  /* a third request diverges from turn 2's cached tokens in its last question */
  dg_chat_message m3[3] = {{"user", q1}, {"assistant", x1.text}, {"user", "And how many does his sister have?"}};
  assert_dg_ok(dg_chat_apply(g_m, m3, 3, 0, &p3, &n3));
  int32_t want3 = lcp(p3, n3, p2, n2);
  if (lcp(p3, n3, p1, n1) > want3) want3 = lcp(p3, n3, p1, n1);
  assert_true(want3 > c2 && want3 < (int32_t)n2);
  expect x3 = engine_chat(m3, 3, 64, 9, NULL);
  const int c3 = chat_cached(port, m3, 3, 64, 9, NULL, &x3);
  assert_int_equal(c3, want3);
  printf("# prompt cache: turn 2 %d of %zu prompt tokens cached, a diverging turn 3 %d of %zu; answers as fresh runs\n", c2,
         n2, c3, n3);
  assert_true(metric(port, "dgemma_prompt_tokens_cached_total") == c2 + c3);
  assert_true(metric(port, "dgemma_prompt_cache_hits_total") == 2);
  assert_true(metric(port, "dgemma_prompt_cache_contexts") == 2); /* 3 finished, 2 slots */
  /* a completion that continues a 2-canvas answer: its first (committed) canvas comes from the cache */
  int32_t *ci, *ct, *ci2;
  size_t nci, nci2;
  expect xc = engine_completion("Once upon a time", 128, 5, NULL, &ci, &nci, &ct);
  assert_int_equal(xc.n_tokens, 128); /* no stop in 2 canvases: the first was committed */
  r = http(port, "POST", "/v1/completions", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 128, \"seed\": 5}", NULL, 0);
  assert_int_equal(r.status, 200);
  /* it shares only <bos> with the cached chats: below the cache's minimum, not reused (nor an LRU refresh) */
  assert_int_equal(cached_tokens(r.body), 0);
  free(r.body);
  char *first = NULL, prompt2[4096];
  assert_dg_ok(dg_detokenize(g_m, ct, 64, 0, &first));
  snprintf(prompt2, sizeof prompt2, "Once upon a time%s And then", first);
  expect xc2 = engine_completion(prompt2, 64, 6, NULL, &ci2, &nci2, NULL);
  int32_t *cached = malloc((nci + 64) * sizeof *cached);
  memcpy(cached, ci, nci * sizeof *cached);
  memcpy(cached + nci, ct, 64 * sizeof *cached);
  const int32_t want_c = lcp(cached, nci + 64, ci2, nci2);
  assert_true(want_c > (int32_t)nci); /* past the first prompt: into the committed canvas */
  cJSON *cb = cJSON_CreateObject();
  cJSON_AddStringToObject(cb, "prompt", prompt2);
  cJSON_AddNumberToObject(cb, "max_tokens", 64);
  cJSON_AddNumberToObject(cb, "seed", 6);
  b = cJSON_PrintUnformatted(cb);
  cJSON_Delete(cb);
  r = http(port, "POST", "/v1/completions", b, NULL, 0);
  free(b);
  assert_int_equal(r.status, 200);
  cJSON *co = cJSON_Parse(r.body);
  assert_string_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(co, "choices"), 0), "text")->valuestring,
                      xc2.text);
  cJSON_Delete(co);
  assert_int_equal(cached_tokens(r.body), want_c);
  printf("# completion continuing a 2-canvas answer: %d of %zu prompt tokens cached (%zu of the first prompt, %d of its "
         "committed canvas)\n", want_c, nci2, nci, want_c - (int)nci);
  free(r.body);
  dg_server_stop(srv);

  /* 0 slots: nothing cached, the same answers */
  o.cache_slots = 0;
  assert_dg_ok(dg_server_start(g_m, &o, &srv));
  port = dg_server_port(srv);
  for (int k = 0; k < 2; k++) assert_int_equal(chat_cached(port, m2, 3, 64, 8, NULL, &x2), 0);
  assert_true(metric(port, "dgemma_prompt_tokens_cached_total") == 0);
  assert_true(metric(port, "dgemma_prompt_cache_contexts") == 0);
  /* issue 16: without stop ids the <eos> canvases after the answer are hidden, not completion tokens */
  const char *kw = "{\"diffusion_turbo\": false, \"eos_token_id\": [], \"max_denoising_steps\": 4, \"proposal\": \"argmax\"}";
  dg_chat_message mq[1] = {{"user", Q[1]}};
  expect xe = engine_chat(mq, 1, 192, 3, kw);
  b = chat_body(mq, 1, 192, 3, kw);
  r = http(port, "POST", "/v1/chat/completions", b, NULL, 0);
  free(b);
  check_chat_json(&r, &xe); /* completion_tokens = the engine's n_visible */
  free(r.body);
  printf("# {\"eos_token_id\": []}: %d tokens generated, %d visible = usage.completion_tokens\n", xe.n_tokens, xe.n_visible);
  assert_true(xe.n_visible < xe.n_tokens);
  dg_server_stop(srv);
  free(x1.text); free(x2.text); free(x3.text); free(xc.text); free(xc2.text); free(xe.text);
  dg_free(p1); dg_free(p2); dg_free(p3); dg_free(first);
  free(ci); free(ct); free(ci2); free(cached);
  curl_global_cleanup();
  dg_model_free(g_m);
}
#endif

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_parse),
      cmocka_unit_test(test_stop_scan),
      cmocka_unit_test(test_http),
      cmocka_unit_test(test_openai_client),
      cmocka_unit_test(test_cancel_and_stop),
      cmocka_unit_test(test_prompt_cache),
  };
  if (getenv("DG_TEST_FILTER")) cmocka_set_test_filter(getenv("DG_TEST_FILTER")); /* e.g. "test_cancel*" */
  return cmocka_run_group_tests_name("serve", tests, NULL, NULL);
}
