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
#include <ftw.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

/* Skip the current test, saying why on a line "# SKIP <reason>": scripts/run_tests.sh
 * counts skipped tests and prints these reasons with its total. */
#define dg_test_skip(...)                                                      \
  do {                                                                         \
    printf("# SKIP ");                                                         \
    printf(__VA_ARGS__);                                                       \
    printf("\n");                                                              \
    fflush(stdout);                                                            \
    skip();                                                                    \
  } while (0)

static inline int dg_test_rm_entry_(const char *path, const struct stat *sb, int type, struct FTW *ftw) {
  (void)sb; (void)type; (void)ftw;
  remove(path); /* keep going: what cannot be removed is left */
  return 0;
}

/* Remove a directory tree (depth first, links not followed). Silent if it
 * does not exist. */
static inline void dg_test_rm_dir(const char *dir) {
  nftw(dir, dg_test_rm_entry_, 16, FTW_DEPTH | FTW_PHYS);
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

/* Run the CLI (the dgemma binary of the same build: <test binary dir>/../dgemma)
 * with ARGS through the shell; stdout and stderr go to files in tmpdir and
 * come back malloc'd in *out / *err (out may be NULL: stdout is dropped).
 * Returns the exit status, or -1 if the process did not exit normally. */
static inline int dg_test_run_cli(const char *tmpdir, const char *args, char **out, char **err) {
  char exe[1024], cmd[8192], of[512], ef[512];
  ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
  assert_true(k > 0);
  exe[k] = 0;
  *strrchr(exe, '/') = 0;
  snprintf(of, sizeof of, "%s/cli.out", tmpdir);
  snprintf(ef, sizeof ef, "%s/cli.err", tmpdir);
  snprintf(cmd, sizeof cmd, "%s/../dgemma %s >%s 2>%s", exe, args, out ? of : "/dev/null", ef);
  int rc = system(cmd);
  if (out) *out = dg_test_read_file(of, NULL);
  *err = dg_test_read_file(ef, NULL);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

#endif
