/* cliarg.h: the command line's number parsing and message quoting, shared by
 * tools/dgemma.c and tools/serve.c (tools/ only; the library never sees argv).
 *
 * Numbers on the command line are plain decimal, as a user types them: strtoll
 * and strtod alone also take leading white space, hexadecimal ("0x10"),
 * "inf" and "nan", which no option of dgemma means. */
#ifndef DG_TOOLS_CLIARG_H
#define DG_TOOLS_CLIARG_H

#include <stddef.h>

/* s is a decimal integer ([+-]?[0-9]+, nothing before or after) in [lo, hi]:
 * 0 and *v set; else -1 (*v untouched). */
int cli_parse_ll(const char *s, long long lo, long long hi, long long *v);

/* s is a decimal number ([+-]?digits[.digits][(e|E)[+-]?digits], at least one
 * digit before the exponent, nothing before or after; no hex, inf or nan) in
 * [lo, hi]: 0 and *v set; else -1 (*v untouched). */
int cli_parse_double(const char *s, double lo, double hi, double *v);

/* s (at most max bytes of it) for a one-line message, into buf[cap] and
 * returned: a newline, tab or CR is written \n, \t, \r, another control byte
 * \xNN, a backslash \\ (so the message stays one line and reads back
 * unambiguously), and "..." follows a cut text.
 * buf is always NUL-terminated (cap >= 8). */
const char *cli_quote(const char *s, size_t max, char *buf, size_t cap);

#endif
