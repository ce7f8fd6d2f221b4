/* serve.h: `dgemma serve`, an OpenAI-compatible HTTP server (libmicrohttpd,
 * cJSON) with continuous batching of canvases (dg_batch, turbo engine).
 *
 * Two parts:
 *  - tools/serve_req.c: request parsing and response pieces on plain strings
 *    (no sockets): the OpenAI request fields, their limits, the mapping onto
 *    dg_gen_params, stop strings, error JSON. Unit-tested in tests/test_serve.c.
 *  - tools/serve.c: the HTTP endpoints (libmicrohttpd, one thread per
 *    connection), the scheduler thread that owns the model's passes, metrics,
 *    the live canvas page, and the CLI command.
 *
 * Protocol (docs: README "Serving"): POST /v1/chat/completions, POST
 * /v1/completions, GET /v1/models, GET /health, GET /metrics, GET / (page).
 * Field semantics follow OpenAI's API reference (platform.openai.com/docs/
 * api-reference/chat); extensions live under the request key "dgemma". */
#ifndef DG_SERVE_H
#define DG_SERVE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "dgemma.h"

#define DG_SRV_MAX_STOP 4 /* OpenAI: up to 4 stop sequences */

typedef enum dg_srv_kind { DG_SRV_CHAT = 0, DG_SRV_COMPLETION = 1 } dg_srv_kind;

/* Limits a request must respect; violations are 4xx answers. */
typedef struct dg_srv_limits {
  size_t max_body;       /* request body bytes (413 above) */
  int32_t max_messages;  /* chat messages per request */
  int32_t max_tokens;    /* largest max_tokens / max_completion_tokens accepted */
  int32_t max_context;   /* prompt tokens + generated canvases must fit (400 context_length_exceeded) */
} dg_srv_limits;

/* An OpenAI error answer: HTTP status, message, and the fields of OpenAI's
 * error object ({"error": {"message", "type", "param", "code"}}). */
typedef struct dg_srv_error {
  int status;            /* 400, 401, 404, 405, 413, 429, 500, 503 */
  char message[512];
  char param[64];        /* "" = null */
  char code[64];         /* "" = null */
} dg_srv_error;

/* Set *e (printf-style message) and return status. */
int dg_srv_fail(dg_srv_error *e, int status, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* The error body {"error": {...}} (type from the status: invalid_request_error,
 * authentication_error, not_found_error, server_error, ...); malloc'd, NULL
 * when out of memory. */
char *dg_srv_error_json(const dg_srv_error *e);

typedef struct dg_srv_request {
  dg_srv_kind kind;
  char *model;                /* "model", NULL if absent */
  dg_chat_message *msgs;      /* chat: [n_msgs], strings owned by the request */
  int32_t n_msgs;
  char *prompt;               /* completions: the prompt text */
  int32_t max_tokens;         /* max_tokens / max_completion_tokens; 0 = absent (the server's default applies) */
  int has_seed;
  uint64_t seed;
  char *stop[DG_SRV_MAX_STOP];
  int32_t n_stop;
  int stream, include_usage;  /* stream; stream_options.include_usage */
  int has_temperature;
  double temperature;         /* 0 = argmax proposals; > 0 scales the checkpoint's schedule (dg_srv_gen_params) */
  char *gen_kwargs;           /* extension dgemma.gen_kwargs, printed JSON, NULL if absent */
  int draft;                  /* extension dgemma.draft: an SSE event "dgemma.canvas" after each denoising step */
  int think;                  /* extension dgemma.think: thinking on in the chat template */
} dg_srv_request;

/* Parse and check a request body of `kind` against lim: JSON object, known
 * fields only (unknown ones are refused, naming them), types and ranges,
 * message roles and contents (string, or an array of {"type": "text"}
 * parts), stop (string or up to 4 strings), n = 1, unsupported sampling
 * options (top_p != 1, penalties != 0, logprobs, tools, ...) refused. Returns
 * 0 with *out filled, or an HTTP status with *err (out is then empty). */
int dg_srv_parse(dg_srv_kind kind, const char *body, size_t len, const dg_srv_limits *lim, dg_srv_request *out,
                 dg_srv_error *err);
void dg_srv_request_free(dg_srv_request *r);

/* The request's generation parameters: defaults (the server's --gen-kwargs
 * over the checkpoint's generation_config), then dgemma.gen_kwargs, then the
 * OpenAI fields: max_tokens -> max_new_tokens (the engine rounds up to whole
 * canvases; the server cuts the text at max_tokens), seed, temperature 0 ->
 * argmax proposals, temperature T > 0 -> t_min, t_max multiplied by T (T = 1
 * keeps the checkpoint's schedule, 0.8 -> 0.4 for DiffusionGemma). A
 * max_new_tokens above lim->max_tokens is refused. Returns 0 or 400 with *err. */
int dg_srv_gen_params(const dg_srv_request *r, const dg_gen_params *defaults, const dg_srv_limits *lim,
                      dg_gen_params *out, dg_srv_error *err);

/* Stop strings on generated text t[n]: if one of stop[ns] occurs, *hit = 1
 * and the return is where the earliest one starts (the text to emit ends
 * there). Otherwise *hit = 0 and the return is the length that is safe to
 * emit now: n when final, else n minus the longest suffix of t that is a
 * proper prefix of a stop string (it may still become one). An empty stop
 * string never matches. */
size_t dg_srv_stop_scan(const char *t, size_t n, char *const *stop, int32_t ns, int final, int *hit);

/* Length of t[n] without a trailing run of U+FFFD (byte-fallback tokens of a
 * character whose remaining bytes are still to come). */
size_t dg_srv_stable_len(const char *t, size_t n);

/* ---- the server ---------------------------------------------------------- */

typedef struct dg_serve_opts {
  const char *model_id;    /* the name /v1/models lists and requests may give (default: the directory's name) */
  const char *host;        /* bind address, default "127.0.0.1" */
  int port;                /* 0 = an ephemeral port (dg_server_port tells which) */
  int max_batch;           /* canvases denoised together, >= 1 */
  int max_queue;           /* requests waiting beyond the batch before 503s */
  const char *api_key;     /* NULL = no auth; else "Authorization: Bearer KEY" on /v1/ and /metrics */
  const char *gen_kwargs;  /* server defaults over the checkpoint's (dg_gen_params_apply_json) */
  int timeout_s;           /* idle connection timeout (a stalled request is closed), seconds */
  int cache_slots;         /* prompt cache: finished contexts kept (least recently used evicted), each at most one
                              request's KV cache; a request starts from the one sharing the longest token prefix
                              with its prompt and prefills only the rest (dg_context_copy_prefix); 0 = off */
  dg_srv_limits lim;
  FILE *log;               /* one line per request, NULL = quiet */
} dg_serve_opts;

dg_serve_opts dg_serve_default_opts(void);

typedef struct dg_server dg_server;

/* Start serving model m (loaded by the caller, kept until dg_server_stop):
 * the scheduler thread and the HTTP daemon. Errors: DG_ERR_INVALID_ARG (bad
 * options, --gen-kwargs), DG_ERR_IO (the address cannot be bound),
 * DG_ERR_BACKEND (built without libmicrohttpd), DG_ERR_OUT_OF_MEMORY. */
dg_status dg_server_start(dg_model *m, const dg_serve_opts *o, dg_server **out);
/* The bound TCP port. */
int dg_server_port(const dg_server *s);
/* Stop accepting, end every request (waiting ones get 503), join the threads, free. */
void dg_server_stop(dg_server *s);

/* `dgemma serve` (argv[0] = "serve"): options, model load, serve until
 * SIGINT/SIGTERM. Returns the exit status. */
int dg_cli_serve(int argc, char **argv, const char *default_model);

#endif
