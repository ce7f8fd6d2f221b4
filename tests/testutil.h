/* testutil.h: shared helpers for dgemma's cmocka tests.
 * Include this instead of <cmocka.h> (it pulls in the headers cmocka needs). */
#ifndef DG_TESTUTIL_H
#define DG_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <dirent.h>
#include <unistd.h>

#include "dgemma.h"

/* Tests run from the repository root (scripts/run_tests.sh cds there). */
#define DG_TOKENIZER_GEMMA ".cache/gemma3/tokenizer.json"
#define DG_FIXTURES "tests/fixtures"

/* Assert a dg_status is DG_OK, printing dg_last_error() otherwise. */
#define assert_dg_ok(expr)                                                     \
  do {                                                                         \
    dg_status st_ = (expr);                                                    \
    if (st_ != DG_OK)                                                          \
      fail_msg("%s -> %s: %s", #expr, dg_status_str(st_), dg_last_error());    \
  } while (0)

/* Remove a flat directory: its files, then the directory (tests write model
 * directories without subdirectories). Silent if it does not exist. */
static inline void dg_test_rm_dir(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return;
  struct dirent *e;
  char p[1024];
  while ((e = readdir(d))) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p) unlink(p);
  }
  closedir(d);
  rmdir(dir);
}

/* Read a whole file into a malloc'd buffer (NUL-terminated); NULL if absent. */
static inline char *dg_test_read_file(const char *path, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) { free(buf); buf = NULL; }
  fclose(f);
  if (buf) { buf[n] = 0; if (len) *len = (size_t)n; }
  return buf;
}

#endif
