/* cliarg.h: the command line's number parsing and message quoting, shared by
 * tools/dgemma.c and tools/serve.c (tools/ only; the library never sees argv).
 *
 * Numbers on the command line are plain decimal, as a user types them: strtoll
 * and strtod alone also take leading white space, hexadecimal ("0x10"),
 * "inf" and "nan", which no option of dgemma means. */
#ifndef DG_TOOLS_CLIARG_H
#define DG_TOOLS_CLIARG_H

#include <stddef.h>

#include "dgemma.h"

/* s is a decimal integer (-?[0-9]+, nothing before or after; no "+" sign) in
 * [lo, hi]: 0 and *v set; else -1 (*v untouched). */
int cli_parse_ll(const char *s, long long lo, long long hi, long long *v);

/* s is a decimal number (-?digits[.digits][(e|E)[+-]?digits], at least one
 * digit before the exponent, nothing before or after; no "+" sign, hex, inf or nan) in
 * [lo, hi]: 0 and *v set; else -1 (*v untouched). */
int cli_parse_double(const char *s, double lo, double hi, double *v);

/* s (at most max bytes of it) for a one-line message, into buf[cap] and
 * returned: a newline, tab or CR is written \n, \t, \r, another control byte
 * \xNN, a backslash \\ (so the message stays one line and reads back
 * unambiguously), and "..." follows a cut text.
 * buf is always NUL-terminated (cap >= 8). */
const char *cli_quote(const char *s, size_t max, char *buf, size_t cap);

/* Threads for a command given -t requested (0 = the default: OpenMP's,
 * i.e. OMP_NUM_THREADS when set, else the cores available): more than the
 * cores this process may run on (its affinity mask) only makes threads wait
 * for each other, so the count is capped there. Returns the count to use
 * (requested itself, 0 included, when no cap applies); when capped, a one-line
 * warning without the trailing newline naming -t or OMP_NUM_THREADS and its
 * value is written to warn[cap] (else warn[0] = 0). */
int cli_threads(int requested, char *warn, size_t cap);

/* A model loaded from dir without generation_config.json (dg_model_info's
 * has_generation_config = 0): one line for a warning, without the trailing
 * newline, into buf[cap] naming the file and the stop ids taken instead
 * (config.json's eos_token_id), and 1; else 0 (buf[0] = 0). */
int cli_no_gen_config(const dg_model *m, const char *dir, char *buf, size_t cap);

/* Cores this process may run on (its affinity mask), at least 1. */
int cli_available_cores(void);

#endif
