/* fuzz.h: helpers shared by the libFuzzer harnesses of fuzz/ (see
 * fuzz/README.md). A harness checks properties of the parser's answer as
 * well as memory safety: a broken property calls fz_fail, which aborts, and
 * libFuzzer then saves the input as a crash. */
#ifndef DG_FUZZ_H
#define DG_FUZZ_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dgemma.h"

#define fz_fail(...)                                                                                \
  do {                                                                                              \
    fprintf(stderr, "%s:%d: property broken: ", __FILE__, __LINE__);                                \
    fprintf(stderr, __VA_ARGS__);                                                                   \
    fprintf(stderr, "\n");                                                                          \
    abort();                                                                                        \
  } while (0)

/* A failing parser call must leave a message naming what was wrong. */
static inline void fz_check_error(dg_status st) {
  if (st != DG_OK && dg_last_error()[0] == 0) fz_fail("status %s without a message", dg_status_str(st));
}

/* A malloc'd NUL-terminated copy of the input (the parsers take text). */
static inline char *fz_text(const uint8_t *d, size_t n) {
  char *s = malloc(n + 1);
  if (!s) abort();
  if (n) memcpy(s, d, n);
  s[n] = 0;
  return s;
}

#endif
