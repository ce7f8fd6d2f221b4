/* cliarg.c: see cliarg.h. */
#include "cliarg.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int cli_parse_ll(const char *s, long long lo, long long hi, long long *v) {
  const char *p = s;
  if (*p == '+' || *p == '-') p++;
  if (!is_digit(*p)) return -1;
  while (is_digit(*p)) p++;
  if (*p) return -1;
  char *end;
  errno = 0;
  const long long x = strtoll(s, &end, 10);
  if (errno || *end || x < lo || x > hi) return -1;
  *v = x;
  return 0;
}

int cli_parse_double(const char *s, double lo, double hi, double *v) {
  const char *p = s;
  int digits = 0;
  if (*p == '+' || *p == '-') p++;
  while (is_digit(*p)) p++, digits++;
  if (*p == '.')
    for (p++; is_digit(*p); p++) digits++;
  if (!digits) return -1;
  if (*p == 'e' || *p == 'E') {
    p++;
    if (*p == '+' || *p == '-') p++;
    if (!is_digit(*p)) return -1;
    while (is_digit(*p)) p++;
  }
  if (*p) return -1;
  char *end;
  errno = 0;
  const double x = strtod(s, &end);
  if (errno || *end || !(x >= lo && x <= hi)) return -1; /* overflow (ERANGE) and NaN are out of range */
  *v = x;
  return 0;
}

const char *cli_quote(const char *s, size_t max, char *buf, size_t cap) {
  size_t n = 0, i = 0;
  for (; s[i] && i < max; i++) {
    const unsigned char c = (unsigned char)s[i];
    char e[8];
    if (c == '\n') strcpy(e, "\\n");
    else if (c == '\t') strcpy(e, "\\t");
    else if (c == '\r') strcpy(e, "\\r");
    else if (c == '\\') strcpy(e, "\\\\");
    else if (c < 0x20 || c == 0x7f) snprintf(e, sizeof e, "\\x%02x", c);
    else { e[0] = (char)c; e[1] = 0; }
    const size_t k = strlen(e);
    if (n + k + 4 > cap) break; /* room for "..." and the NUL */
    memcpy(buf + n, e, k);
    n += k;
  }
  if (s[i] && n + 4 <= cap) { memcpy(buf + n, "...", 3); n += 3; }
  buf[n] = 0;
  return buf;
}
