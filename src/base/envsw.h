/* envsw.h: the parser of dgemma's environment switches (DGEMMA_*): an on/off switch, an integer in a range (and a
 * multiple of a step), a word of a list, or one or two words of a list joined by a comma.
 *
 * One dg_sw describes one variable: what it accepts, what unset gives and what it sets (for the message). dg_sw_parse
 * reads a value; a value it does not accept gives DG_ERR_INVALID_ARG and one line in dg_last_error() naming the
 * variable, the value (quoted by dg_env_quote) and what is allowed, e.g.
 *   DGEMMA_GRAPHS_MAX="0" is not an integer in [1, 1024] (CUDA graphs kept per context; unset: 32)
 * The library's table of its switches is backend/switches.c; this file knows none of them.
 *
 * Rules common to every kind: a variable that is unset or set to "" gives the switch's default (def) and DG_OK.
 * Words are compared byte for byte (case matters, no blanks trimmed). Integers are read by strtol in base 10 to the
 * end of the value (a leading blank or '+' as strtol takes them; anything after the digits is refused), then checked
 * against [lo, hi] and the step. */
#ifndef DG_ENVSW_H
#define DG_ENVSW_H

#include <stddef.h>

#include "dgemma.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dg_sw_kind {
  DG_SW_ONOFF, /* "0" -> 0, "1" -> 1 */
  DG_SW_INT,   /* a decimal integer n with lo <= n <= hi and n % step == 0 -> n */
  DG_SW_WORD,  /* words[i] -> vals[i] (vals NULL: i) */
  DG_SW_WORD2, /* "a" -> (val(a), val(a)); "a,b" -> (val(a), val(b)); a and b words of the list */
} dg_sw_kind;

typedef struct dg_sw {
  const char *name;         /* the variable, e.g. "DGEMMA_GRAPHS_MAX" */
  dg_sw_kind kind;
  long lo, hi, step;        /* DG_SW_INT (step 0 or 1: any integer in [lo, hi]) */
  const char *const *words; /* DG_SW_WORD, DG_SW_WORD2: nwords words */
  int nwords;
  const int *vals;          /* the value of words[i]; NULL: i */
  long def;                 /* the value when unset or empty (any number: it need not be one of the accepted ones) */
  const char *what;         /* what the switch sets and what unset gives, the message's parenthesis:
                             * "CUDA graphs kept per context; unset: 32" */
} dg_sw;

/* The value v of switch s (v NULL: unset) into out[0] (and out[1]: the second word of DG_SW_WORD2; out[0] again for
 * every other kind). Returns DG_OK, or DG_ERR_INVALID_ARG when v is not one the switch accepts: out[0] = out[1] =
 * s->def and dg_last_error() holds the line 'NAME="v" is not ALLOWED (WHAT)', ALLOWED being "0 or 1", "an integer in
 * [lo, hi]", "a multiple of step in [lo, hi]", "one of w1, w2, ..." (a single word: just it) or "one of ... or two of
 * them joined by a comma". The value is quoted by dg_env_quote (control bytes, '"' and '\\' as \xHH) into 64 bytes, cut
 * with "..." where longer. out may be NULL (a check only). */
dg_status dg_sw_parse(const dg_sw *s, const char *v, long out[2]);

/* dg_sw_parse without the message: 1 when s accepts v (out[0], out[1] set as dg_sw_parse sets them), else 0 (out
 * untouched). Writes nothing to dg_last_error(). */
int dg_sw_ok(const dg_sw *s, const char *v, long out[2]);

/* dg_sw_parse of the environment's value of s->name (getenv at each call). */
dg_status dg_sw_read(const dg_sw *s, long out[2]);

/* An environment variable's value s quoted for a one-line message: control characters, '"' and '\\' as \\xHH, written
 * into v (n bytes, NUL-terminated) and cut where it would not fit; returns 1 if it was cut (print "..."), else 0. Used by
 * dg_sw_parse and the DGEMMA_KERNELS and DGEMMA_CPU_PACK errors. */
int dg_env_quote(const char *s, char *v, size_t n);

#ifdef __cplusplus
}
#endif

#endif
