/* cliarg.c: see cliarg.h. */
#include "cliarg.h"

#include <errno.h>
#include <omp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int is_digit(char c) { return c >= '0' && c <= '9'; }

int cli_parse_ll(const char *s, long long lo, long long hi, long long *v) {
  const char *p = s;
  if (*p == '-') p++;
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
  if (*p == '-') p++;
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

int cli_available_cores(void) {
  cpu_set_t cs;
  if (sched_getaffinity(0, sizeof cs, &cs) == 0 && CPU_COUNT(&cs) > 0) return CPU_COUNT(&cs);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? (int)n : 1;
}

int cli_threads(int requested, char *warn, size_t cap) {
  const int n = cli_available_cores();
  warn[0] = 0;
  if (requested > n) {
    snprintf(warn, cap, "-t %d is more than the %d core(s) available to this process; using %d", requested, n, n);
    return n;
  }
  const char *env = getenv("OMP_NUM_THREADS");
  if (requested == 0 && env && *env && omp_get_max_threads() > n) { /* the default of -t: OpenMP's */
    char v[64];
    snprintf(warn, cap, "OMP_NUM_THREADS=%s is more than the %d core(s) available to this process; using %d",
             cli_quote(env, 20, v, sizeof v), n, n);
    return n;
  }
  return requested;
}

int cli_no_gen_config(const dg_model *m, const char *dir, char *buf, size_t cap) {
  dg_model_info info;
  buf[0] = 0;
  if (dg_model_get_info(m, &info) != DG_OK || info.has_generation_config) return 0;
  const dg_gen_params gp = dg_gen_default_params(m);
  char d[448];
  int n = snprintf(buf, cap, "%s has no generation_config.json: the generation defaults are the built-in ones "
                   "and the stop ids only config.json's eos_token_id (", cli_quote(dir, 200, d, sizeof d));
  for (int k = 0; k < gp.n_stop_ids && n > 0 && (size_t)n < cap; k++)
    n += snprintf(buf + n, cap - (size_t)n, "%s%d", k ? ", " : "", gp.stop_ids[k]);
  if (n > 0 && (size_t)n < cap) snprintf(buf + n, cap - (size_t)n, "%s)", gp.n_stop_ids ? "" : "none");
  return 1;
}
