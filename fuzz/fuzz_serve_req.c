/* fuzz_serve_req.c: libFuzzer harness of the HTTP request handling of
 * `dgemma serve` without sockets (tools/serve_req.c): dg_srv_parse of a
 * /v1/chat/completions or /v1/completions body (byte 0 picks the endpoint:
 * even = chat, odd = completions; the rest is the body, not NUL-terminated,
 * as libmicrohttpd hands it over), then on success dg_srv_gen_params over the
 * reference defaults (dgemma.gen_kwargs included) and dg_srv_stop_scan /
 * dg_srv_stable_len over the request's own text; on failure
 * dg_srv_error_json. Properties: a refusal has a 4xx status and a message,
 * its JSON parses back with that message, and the request is left empty; an
 * accepted request has its prompt or 1..max_messages messages, at most
 * DG_SRV_MAX_STOP non-empty stop strings, max_tokens within the limit, a
 * temperature in [0, 2]; the stop scan returns a length within the text, a
 * hit where a stop string starts (none earlier), and without a hit an
 * emittable prefix that contains no whole stop string; the same scan on raw
 * pieces of the input (empty stop strings included) ends and holds them too. */
#include <cjson/cJSON.h>

#include "io/config.h"
#include "fuzz.h"
#include "serve.h"

static void check_scan(const char *t, char *const *stop, int32_t ns) {
  const size_t n = strlen(t);
  for (int final = 0; final < 2; final++) {
    int hit = -1;
    size_t k = dg_srv_stop_scan(t, n, stop, ns, final, &hit);
    if (k > n) fz_fail("stop scan returned %zu for %zu bytes", k, n);
    if (hit != 0 && hit != 1) fz_fail("stop scan hit flag %d", hit);
    if (final && !hit && k != n) fz_fail("final scan without a hit kept %zu of %zu bytes", k, n);
    int starts = 0;
    for (int32_t s = 0; s < ns; s++) {
      size_t l = strlen(stop[s]);
      if (!l) continue; /* an empty stop string never matches */
      if (hit && k + l <= n && !memcmp(t + k, stop[s], l)) starts = 1;
      for (size_t i = 0; i + l <= n; i++) /* the earliest occurrence is the cut; none without a hit */
        if (!memcmp(t + i, stop[s], l) && (!hit || i < k))
          fz_fail("stop string %d occurs at %zu (cut %zu, hit %d)", s, i, k, hit);
    }
    if (hit && !starts) fz_fail("stop scan hit at %zu where no stop string starts", k);
  }
  size_t st = dg_srv_stable_len(t, n);
  if (st > n || (n - st) % 3) fz_fail("stable length %zu of %zu bytes", st, n);
}

/* The stop scan on its own: text = the input up to its first '\n' (at most 256 bytes), stop strings
 * = the next up to 4 '\n'-separated pieces, empty ones included (the function takes any strings;
 * the parser only ever hands it non-empty ones). */
static void scan_raw(const uint8_t *d, size_t n) {
  char *s = fz_text(d, n > 1024 ? 1024 : n), *pieces[1 + DG_SRV_MAX_STOP];
  int k = 0;
  for (char *p = s; k < 1 + DG_SRV_MAX_STOP; k++) {
    pieces[k] = p;
    char *nl = strchr(p, '\n');
    if (!nl) { k++; break; }
    *nl = 0;
    p = nl + 1;
  }
  if (strlen(pieces[0]) > 256) pieces[0][256] = 0;
  check_scan(pieces[0], pieces + 1, k - 1);
  free(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  if (n < 1) return 0;
  scan_raw(d + 1, n - 1);
  const dg_srv_kind kind = d[0] & 1 ? DG_SRV_COMPLETION : DG_SRV_CHAT;
  /* the body in its own allocation of exactly n - 1 bytes: a read past it is an ASan error */
  char *body = malloc(n - 1 ? n - 1 : 1);
  if (!body) abort();
  memcpy(body, d + 1, n - 1);
  const dg_srv_limits lim = {4096, 8, 8192, 16384};
  dg_srv_request r;
  dg_srv_error e;
  memset(&e, 0, sizeof e);
  int rc = dg_srv_parse(kind, body, n - 1, &lim, &r, &e);
  if (rc) {
    if (rc != e.status || rc < 400 || rc > 499) fz_fail("refusal status %d (error status %d)", rc, e.status);
    if (!e.message[0]) fz_fail("status %d without a message", rc);
    if (r.model || r.msgs || r.prompt || r.n_stop || r.gen_kwargs) fz_fail("a refused request kept fields");
    char *j = dg_srv_error_json(&e);
    cJSON *o = cJSON_Parse(j);
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(o, "error"), "message");
    if (!cJSON_IsString(m) || strcmp(m->valuestring, e.message)) fz_fail("error JSON does not carry the message: %s", j);
    cJSON_Delete(o);
    free(j);
    free(body);
    return 0;
  }
  if (kind == DG_SRV_CHAT) {
    if (r.n_msgs < 1 || r.n_msgs > lim.max_messages || !r.msgs) fz_fail("%d messages accepted", r.n_msgs);
    for (int32_t i = 0; i < r.n_msgs; i++)
      if (!r.msgs[i].role || !r.msgs[i].content) fz_fail("message %d without role or content", i);
  } else if (!r.prompt || !r.prompt[0]) {
    fz_fail("completion accepted without a prompt");
  }
  if (r.n_stop < 0 || r.n_stop > DG_SRV_MAX_STOP) fz_fail("%d stop strings", r.n_stop);
  for (int32_t s = 0; s < r.n_stop; s++)
    if (!r.stop[s] || !r.stop[s][0]) fz_fail("stop string %d empty", s);
  if (r.max_tokens < 0 || r.max_tokens > lim.max_tokens) fz_fail("max_tokens %d", r.max_tokens);
  if (r.has_temperature && !(r.temperature >= 0.0 && r.temperature <= 2.0)) fz_fail("temperature %g", r.temperature);
  dg_gen_params def, p;
  dg_gen_params_reference_defaults(&def);
  dg_turbo_default_params(&def.turbo);
  def.max_new_tokens = 256;
  memset(&e, 0, sizeof e);
  rc = dg_srv_gen_params(&r, &def, &lim, &p, &e);
  if (rc) {
    if (rc != 400 || !e.message[0]) fz_fail("gen params status %d, message \"%s\"", rc, e.message);
  } else {
    if (p.max_new_tokens > lim.max_tokens) fz_fail("max_new_tokens %d above the limit", p.max_new_tokens);
    if (r.max_tokens > 0 && p.max_new_tokens != r.max_tokens) fz_fail("max_tokens %d not applied", r.max_tokens);
  }
  check_scan(kind == DG_SRV_CHAT ? r.msgs[0].content : r.prompt, r.stop, r.n_stop);
  dg_srv_request_free(&r);
  free(body);
  return 0;
}
