/* outfile.c: interruption and output files of the CLI commands (outfile.h). */
#include "outfile.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

volatile sig_atomic_t g_stop_sig = 0;
/* 1: the command has no stop point; the handler removes g_tmp_path and exits at once.
 * 2: the output is being renamed into place; the handler only records the signal. */
static volatile sig_atomic_t g_stop_mode = 0;
static char g_tmp_path[PATH_MAX + 32]; /* the temporary output file, "" if none */
static char g_target[PATH_MAX];         /* what it is renamed to: the path, or the file its symlink names */
static int g_direct;                    /* the path is a device or FIFO: written in place, no temporary file */
static int g_open_status = 1;           /* out_open's exit status for out_try_open's last failure */

static void on_stop_signal(int sig) {
  g_stop_sig = sig;
  if (g_stop_mode == 1) {
    if (g_tmp_path[0]) unlink(g_tmp_path); /* async-signal-safe, as is _exit */
    _exit(128 + sig);
  }
  signal(sig, SIG_DFL); /* a second signal ends the process at once */
}

void catch_stop_signals(int immediate) {
  g_stop_mode = immediate ? 1 : 0;
  struct sigaction sa, old;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  const int sigs[2] = {SIGINT, SIGTERM};
  for (int k = 0; k < 2; k++) {
    sigaction(sigs[k], NULL, &old);
    if (old.sa_handler != SIG_IGN) sigaction(sigs[k], &sa, NULL);
  }
}

/* An exit that is not a signal (die, a usage error) removes the temporary file too. */
static void remove_tmp_at_exit(void) {
  if (g_tmp_path[0]) unlink(g_tmp_path);
}

FILE *out_try_open(const char *path, const char *who) {
  g_open_status = 1;
  g_direct = 0;
  const char *base = strrchr(path, '/');
  if (!*(base ? base + 1 : path)) {
    fprintf(stderr, "%s: %s: names a directory, not a file\n", who, path);
    g_open_status = 2;
    return NULL;
  }
  struct stat sb, lsb;
  const int exists = stat(path, &sb) == 0;
  if (exists && S_ISDIR(sb.st_mode)) {
    fprintf(stderr, "%s: cannot write %s: it is a directory\n", who, path);
    return NULL;
  }
  if (exists && !S_ISREG(sb.st_mode)) {
    /* a device or FIFO (-o /dev/null, a pipe): written in place; a temporary file renamed over it
     * would replace the device node itself (as root, /dev/null became a regular file) */
    FILE *f = fopen(path, "wb");
    if (!f) fprintf(stderr, "%s: cannot write %s: %s\n", who, path, strerror(errno));
    g_direct = f != NULL;
    g_tmp_path[0] = 0;
    return f;
  }
  /* a symlink to a file: the file it names is replaced, not the link */
  const char *target = path;
  char resolved[PATH_MAX];
  if (exists && lstat(path, &lsb) == 0 && S_ISLNK(lsb.st_mode) && realpath(path, resolved)) target = resolved;
  if (snprintf(g_target, sizeof g_target, "%s", target) >= (int)sizeof g_target) {
    fprintf(stderr, "%s: %s: path too long\n", who, path);
    return NULL;
  }
  const char *slash = strrchr(g_target, '/');
  int dlen = slash ? (int)(slash - g_target) + 1 : 0;
  char tmpl[sizeof g_tmp_path];
  if (snprintf(tmpl, sizeof tmpl, "%.*s.%s.tmp-XXXXXX", dlen, g_target, slash ? slash + 1 : g_target) >=
      (int)sizeof tmpl) {
    fprintf(stderr, "%s: %s: path too long\n", who, path);
    return NULL;
  }
  int fd = mkstemp(tmpl);
  if (fd < 0) {
    fprintf(stderr, "%s: cannot write %s: cannot create a temporary file %s: %s\n", who, path, tmpl, strerror(errno));
    return NULL;
  }
  mode_t um = umask(0); /* mkstemp makes it 0600; give it what fopen(path, "w") would */
  umask(um);
  fchmod(fd, 0666 & ~um);
  memcpy(g_tmp_path, tmpl, sizeof tmpl);
  static int registered = 0;
  if (!registered) { atexit(remove_tmp_at_exit); registered = 1; }
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    fprintf(stderr, "%s: cannot write %s: %s\n", who, path, strerror(errno));
    close(fd);
    unlink(g_tmp_path);
    g_tmp_path[0] = 0;
  }
  return f;
}

FILE *out_open(const char *path) {
  FILE *f = out_try_open(path, "dgemma");
  if (!f) exit(g_open_status);
  return f;
}

int out_commit(FILE *f, const char *path) {
  int bad = fflush(f) != 0 || ferror(f);
  int err = errno;
  if (g_direct) { /* a device or FIFO: nothing to rename */
    if (fclose(f) != 0 && !bad) { bad = 1; err = errno; }
    g_direct = 0;
    if (bad) fprintf(stderr, "dgemma: cannot write %s: %s\n", path, strerror(err ? err : EIO));
    return bad;
  }
  if (!bad && fsync(fileno(f)) != 0 && errno != EINVAL) { bad = 1; err = errno; }
  if (fclose(f) != 0 && !bad) { bad = 1; err = errno; }
  if (!bad) {
    g_stop_mode = 2; /* from here a signal no longer removes the file: it is complete */
    if (rename(g_tmp_path, g_target) != 0) { bad = 1; err = errno; g_stop_mode = 1; }
  }
  if (bad) {
    fprintf(stderr, "dgemma: cannot write %s: %s\n", path, strerror(err ? err : EIO));
    unlink(g_tmp_path);
    g_tmp_path[0] = 0;
    return 1;
  }
  g_tmp_path[0] = 0;
  return 0;
}

void out_discard(FILE *f) {
  if (!f) return;
  fclose(f);
  g_direct = 0;
  if (g_tmp_path[0]) unlink(g_tmp_path);
  g_tmp_path[0] = 0;
}
