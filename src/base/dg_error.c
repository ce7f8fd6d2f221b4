/* dg_error.c: the thread-local error message behind dg_last_error(). */
#include "base/dg_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char dg_errbuf[1024];

dg_status dg_seterr(dg_status st, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(dg_errbuf, sizeof dg_errbuf, fmt, ap);
  va_end(ap);
  return st;
}

dg_status dg_prefixerr(dg_status st, const char *fmt, ...) {
  char prefix[512], old[sizeof dg_errbuf];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(prefix, sizeof prefix, fmt, ap);
  va_end(ap);
  memcpy(old, dg_errbuf, sizeof old);
  size_t lp = strlen(prefix), lo = strlen(old);
  if (lp > sizeof dg_errbuf - 3) lp = sizeof dg_errbuf - 3;
  memcpy(dg_errbuf, prefix, lp);
  memcpy(dg_errbuf + lp, ": ", 2);
  if (lo > sizeof dg_errbuf - 3 - lp) lo = sizeof dg_errbuf - 3 - lp; /* truncate the tail */
  memcpy(dg_errbuf + lp + 2, old, lo);
  dg_errbuf[lp + 2 + lo] = 0;
  return st;
}

void dg_clearerr(void) { dg_errbuf[0] = 0; }

const char *dg_last_error(void) { return dg_errbuf; }

const char *dg_status_str(dg_status st) {
  switch (st) {
  case DG_OK: return "ok";
  case DG_ERR_INVALID_ARG: return "invalid argument";
  case DG_ERR_NOT_FOUND: return "file not found";
  case DG_ERR_IO: return "i/o error";
  case DG_ERR_JSON: return "malformed JSON";
  case DG_ERR_CONFIG: return "invalid or missing config field";
  case DG_ERR_UNSUPPORTED_MODEL: return "unsupported model type";
  case DG_ERR_SAFETENSORS: return "malformed safetensors file";
  case DG_ERR_TENSOR_MISSING: return "tensor missing";
  case DG_ERR_TENSOR_DTYPE: return "tensor has the wrong dtype";
  case DG_ERR_TENSOR_SHAPE: return "tensor has the wrong shape";
  case DG_ERR_TOKENIZER: return "tokenizer error";
  case DG_ERR_VOCAB_MISMATCH: return "tokenizer and model vocabularies disagree";
  case DG_ERR_OUT_OF_MEMORY: return "out of memory";
  case DG_ERR_CONTEXT_FULL: return "context length exceeded";
  case DG_ERR_NUMERIC: return "non-finite value (NaN or Inf)";
  case DG_ERR_ABORTED: return "aborted by callback";
  case DG_ERR_REPLAY: return "replay stream exhausted or malformed";
  case DG_ERR_BACKEND: return "backend error";
  }
  return "unknown status";
}
