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
#include <signal.h>
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

/* The dgemma binary of the same build, <test binary dir>/../dgemma, into exe[n]. */
static inline void dg_test_cli_exe(char *exe, size_t n) {
  ssize_t k = readlink("/proc/self/exe", exe, n - 1);
  assert_true(k > 0);
  exe[k] = 0;
  *strrchr(exe, '/') = 0;
  strncat(exe, "/../dgemma", n - strlen(exe) - 1);
}

/* Run exe with argv (NULL-terminated), stdout and stderr into a pipe that has no reader any more (`dgemma ... 2>&1
 * | head -1` once head has its line, or `| true`: the read end is closed before the child starts, so its first
 * write fails, whatever the timing); SIGPIPE at its default action in the child, as a shell starts it. Returns the
 * wait status. */
static inline int dg_test_run_reader_gone(const char *exe, const char *const *argv) {
  fflush(stdout);
  int fd[2];
  assert_int_equal(pipe(fd), 0);
  close(fd[0]);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (dup2(fd[1], 1) < 0 || dup2(fd[1], 2) < 0) _exit(126);
    close(fd[1]);
    signal(SIGPIPE, SIG_DFL);
    execv(exe, (char *const *)argv);
    _exit(127);
  }
  close(fd[1]);
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return status;
}

/* Run the CLI (the dgemma binary of the same build: <test binary dir>/../dgemma)
 * with ARGS through the shell; stdout and stderr go to files in tmpdir and
 * come back malloc'd in *out / *err (out may be NULL: stdout is dropped).
 * Returns the exit status, or -1 if the process did not exit normally. */
static inline int dg_test_run_cli(const char *tmpdir, const char *args, char **out, char **err) {
  char exe[1024], cmd[8192], of[512], ef[512];
  dg_test_cli_exe(exe, sizeof exe);
  snprintf(of, sizeof of, "%s/cli.out", tmpdir);
  snprintf(ef, sizeof ef, "%s/cli.err", tmpdir);
  snprintf(cmd, sizeof cmd, "%s %s >%s 2>%s", exe, args, out ? of : "/dev/null", ef);
  int rc = system(cmd);
  if (out) *out = dg_test_read_file(of, NULL);
  *err = dg_test_read_file(ef, NULL);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

#endif
