/* envsw.c: see envsw.h. */
#include "base/envsw.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dg_error.h"

int dg_env_quote(const char *s, char *v, size_t n) {
  size_t k = 0;
  const unsigned char *c = (const unsigned char *)s;
  for (; *c && k + 5 < n; c++)
    k += (size_t)(*c < 0x20 || *c == 0x7f || *c == '"' || *c == '\\' ? snprintf(v + k, n - k, "\\x%02x", *c)
                                                                      : snprintf(v + k, n - k, "%c", *c));
  v[k] = '\0';
  return *c != 0;
}

/* The index of the word v[0..len) in s's list, or -1. */
static int word_index(const dg_sw *s, const char *v, size_t len) {
  for (int i = 0; i < s->nwords; i++)
    if (strlen(s->words[i]) == len && !memcmp(s->words[i], v, len)) return i;
  return -1;
}

static long word_val(const dg_sw *s, int i) { return s->vals ? s->vals[i] : i; }

/* Whether v is one integer to its end, within s's range and step; *n the integer. */
static int int_ok(const dg_sw *s, const char *v, long *n) {
  char *end = NULL;
  errno = 0;
  *n = strtol(v, &end, 10);
  const long step = s->step > 1 ? s->step : 1;
  return end != v && !*end && !errno && *n >= s->lo && *n <= s->hi && *n % step == 0;
}

/* The refusal: 'NAME="v" is not ALLOWED (WHAT)'. */
static dg_status refuse(const dg_sw *s, const char *v) {
  char q[64], allowed[512];
  const int cut = dg_env_quote(v, q, sizeof q);
  size_t k = 0;
  switch (s->kind) {
  case DG_SW_ONOFF: snprintf(allowed, sizeof allowed, "0 or 1"); break;
  case DG_SW_INT:
    if (s->step > 1) snprintf(allowed, sizeof allowed, "a multiple of %ld in [%ld, %ld]", s->step, s->lo, s->hi);
    else snprintf(allowed, sizeof allowed, "an integer in [%ld, %ld]", s->lo, s->hi);
    break;
  case DG_SW_WORD:
  case DG_SW_WORD2:
    allowed[0] = '\0';
    if (s->nwords > 1 || s->kind == DG_SW_WORD2) k += (size_t)snprintf(allowed, sizeof allowed, "one of ");
    for (int i = 0; i < s->nwords && k < sizeof allowed; i++)
      k += (size_t)snprintf(allowed + k, sizeof allowed - k, "%s%s", i ? ", " : "", s->words[i]);
    if (s->kind == DG_SW_WORD2 && k < sizeof allowed)
      snprintf(allowed + k, sizeof allowed - k, ", or two of them joined by a comma");
    break;
  }
  return dg_seterr(DG_ERR_INVALID_ARG, "%s=\"%s%s\" is not %s (%s)", s->name, q, cut ? "..." : "", allowed, s->what);
}

int dg_sw_ok(const dg_sw *s, const char *v, long out[2]) {
  long a = s->def, b = s->def;
  int ok = 1;
  if (v && *v) {
    switch (s->kind) {
    case DG_SW_ONOFF:
      ok = (v[0] == '0' || v[0] == '1') && !v[1];
      if (ok) a = b = v[0] - '0';
      break;
    case DG_SW_INT: {
      long n = 0;
      ok = int_ok(s, v, &n);
      if (ok) a = b = n;
      break;
    }
    case DG_SW_WORD: {
      const int i = word_index(s, v, strlen(v));
      ok = i >= 0;
      if (ok) a = b = word_val(s, i);
      break;
    }
    case DG_SW_WORD2: {
      const char *comma = strchr(v, ',');
      const int i = word_index(s, v, comma ? (size_t)(comma - v) : strlen(v));
      const int j = comma ? word_index(s, comma + 1, strlen(comma + 1)) : i;
      ok = i >= 0 && j >= 0;
      if (ok) {
        a = word_val(s, i);
        b = word_val(s, j);
      }
      break;
    }
    }
  }
  if (ok && out) {
    out[0] = a;
    out[1] = b;
  }
  return ok;
}

dg_status dg_sw_parse(const dg_sw *s, const char *v, long out[2]) {
  if (dg_sw_ok(s, v, out)) return DG_OK;
  if (out) out[0] = out[1] = s->def;
  return refuse(s, v);
}

dg_status dg_sw_read(const dg_sw *s, long out[2]) { return dg_sw_parse(s, getenv(s->name), out); }
