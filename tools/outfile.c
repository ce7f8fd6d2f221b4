/* outfile.c: interruption and output files of the CLI commands (outfile.h). */
#include "outfile.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

volatile sig_atomic_t g_stop_sig = 0;
/* 0: the command has stop points (g_stop_sig); a second signal ends it at once, removing the
 *    temporary file and directory first.
 * 1: the command has no stop point; the handler removes the temporary file and exits at once.
 * 2: the output is being renamed into place, or is in place; the handler only records the signal. */
static volatile sig_atomic_t g_stop_mode = 0;
/* The temporary output file and the library's temporary output directory (quantize, mkrandom).
 * A signal may come on any thread, while either name is being written: the handler reads a
 * name only while its flag (__atomic) is 1, which is set after the name is complete and
 * cleared before it changes, so it never acts on a half-written path (the prefix of one could
 * name the user's own directory). */
static char g_tmp_path[PATH_MAX + 32];
static int g_tmp_path_set;
static char g_tmp_dir[PATH_MAX + 32];
static int g_tmp_dir_set;
static char g_target[PATH_MAX];         /* what it is renamed to: the path, or the file its symlink names */
static int g_direct;                    /* the path is a device or FIFO: written in place, no temporary file */
static int g_open_status = 1;           /* out_open's exit status for out_try_open's last failure */

static int flag_get(int *f) { return __atomic_load_n(f, __ATOMIC_SEQ_CST); }
static void flag_put(int *f, int v) { __atomic_store_n(f, v, __ATOMIC_SEQ_CST); }

static void tmp_path_forget(void) {
  flag_put(&g_tmp_path_set, 0);
  g_tmp_path[0] = 0;
}

/* Remove the files of the flat directory `dir`, then the directory, with system calls only (in a
 * signal handler: no opendir/readdir, which may allocate). Listed again from the start until a
 * pass removes nothing, as entries are removed while the directory is being read. */
static void remove_dir_now(const char *dir) {
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[8192] __attribute__((aligned(8)));
    for (int pass = 0; pass < 16; pass++) {
      int removed = 0;
      long n;
      if (lseek(fd, 0, SEEK_SET) != 0) break;
      while ((n = syscall(SYS_getdents64, fd, buf, sizeof buf)) > 0)
        for (long off = 0; off < n;) {
          /* struct linux_dirent64: d_ino (8), d_off (8), d_reclen (2), d_type (1), d_name */
          unsigned short reclen;
          memcpy(&reclen, buf + off + 16, sizeof reclen);
          const char *name = buf + off + 19;
          off += reclen;
          if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2]))) continue;
          removed += unlinkat(fd, name, 0) == 0;
        }
      if (!removed) break;
    }
    close(fd);
  }
  rmdir(dir);
}

static void on_stop_signal(int sig) {
  const int mode = g_stop_mode;
  /* no stop point, or a second signal before the command reached its stop point */
  if (mode == 1 || (mode == 0 && g_stop_sig)) {
    if (flag_get(&g_tmp_path_set)) unlink(g_tmp_path); /* async-signal-safe, as are the calls of remove_dir_now and _exit */
    if (flag_get(&g_tmp_dir_set)) remove_dir_now(g_tmp_dir);
    if (mode == 0) {
      static const char msg[] = "\ndgemma: interrupted again: stopped at once, the partial output removed\n";
      ssize_t w = write(2, msg, sizeof msg - 1);
      (void)w;
    }
    _exit(128 + sig);
  }
  g_stop_sig = sig;
}

const int out_stop_sigs[OUT_N_STOP_SIGS] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};

void out_catch_stop_sigs(void (*handler)(int), struct sigaction old[OUT_N_STOP_SIGS]) {
  struct sigaction sa, prev;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = handler;
  sigemptyset(&sa.sa_mask);
  for (int k = 0; k < OUT_N_STOP_SIGS; k++) {
    sigaction(out_stop_sigs[k], NULL, &prev);
    if (old) old[k] = prev;
    if (prev.sa_handler != SIG_IGN) sigaction(out_stop_sigs[k], &sa, NULL);
  }
}

void catch_stop_signals(int immediate) {
  g_stop_mode = immediate ? 1 : 0;
  /* SIGHUP too: a closed terminal or a dropped ssh session is an interruption like Ctrl-C (its default action
   * left a partial temporary directory, review rev16); under nohup it stays ignored. SIGPIPE as well: the reader
   * of a pipe the command writes to has gone (`dgemma quantize ... 2>&1 | head -1`), which ends the pipeline as
   * Ctrl-C would; its default action killed quantize at its next progress line with the temporary directory
   * left (review aud16). Exit status 141 either way; ignored when the command was started with it ignored */
  out_catch_stop_sigs(on_stop_signal, NULL);
}

void out_track_dir(const char *tmp_dir, void *user_data) {
  (void)user_data;
  flag_put(&g_tmp_dir_set, 0);
  if (!tmp_dir || snprintf(g_tmp_dir, sizeof g_tmp_dir, "%s", tmp_dir) >= (int)sizeof g_tmp_dir) {
    g_tmp_dir[0] = 0;
    return;
  }
  flag_put(&g_tmp_dir_set, 1);
}

/* An exit that is not a signal (die, a usage error) removes the temporary file too. */
static void remove_tmp_at_exit(void) {
  if (flag_get(&g_tmp_path_set)) unlink(g_tmp_path);
}

FILE *out_try_open(const char *path, const char *who) {
  g_open_status = 1;
  g_direct = 0;
  if (!strcmp(path, "-")) { /* standard output: written in place, as a FIFO is; out_commit flushes, never closes it */
    tmp_path_forget();
    g_direct = 1;
    return stdout;
  }
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
    tmp_path_forget();
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
  /* mkstemp fills in the name where the handler reads it, the flag set before: a signal from the
   * moment the file exists removes it (before that, the name names nothing of ours) */
  tmp_path_forget();
  memcpy(g_tmp_path, tmpl, sizeof tmpl);
  flag_put(&g_tmp_path_set, 1);
  int fd = mkstemp(g_tmp_path);
  if (fd < 0) {
    const int err = errno;
    tmp_path_forget();
    fprintf(stderr, "%s: cannot write %s: cannot create a temporary file %s: %s\n", who, path, tmpl, strerror(err));
    return NULL;
  }
  mode_t um = umask(0); /* mkstemp makes it 0600; give it what fopen(path, "w") would */
  umask(um);
  fchmod(fd, 0666 & ~um);
  static int registered = 0;
  if (!registered) { atexit(remove_tmp_at_exit); registered = 1; }
  FILE *f = fdopen(fd, "wb");
  if (!f) {
    fprintf(stderr, "%s: cannot write %s: %s\n", who, path, strerror(errno));
    close(fd);
    unlink(g_tmp_path);
    tmp_path_forget();
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
  if (g_direct) { /* a device, FIFO or standard output: nothing to rename */
    if (f != stdout && fclose(f) != 0 && !bad) { bad = 1; err = errno; }
    g_direct = 0;
    if (bad)
      fprintf(stderr, "dgemma: cannot write %s: %s\n", f == stdout ? "standard output (-o -)" : path,
              strerror(err ? err : EIO));
    return bad;
  }
  if (!bad && fsync(fileno(f)) != 0 && errno != EINVAL) { bad = 1; err = errno; }
  if (fclose(f) != 0 && !bad) { bad = 1; err = errno; }
  if (!bad) {
    const sig_atomic_t mode = g_stop_mode;
    g_stop_mode = 2; /* from here a signal no longer removes the file: it is complete */
    if (rename(g_tmp_path, g_target) != 0) { bad = 1; err = errno; g_stop_mode = mode; }
    else tmp_path_forget();
    /* renamed: the command's output is in place and mode 2 stays, so a signal from here on is
     * only recorded and the command ends with its own status. Were mode 1 restored, a signal
     * between the rename and the exit would end it with 128 + sig over a complete new file, the
     * exit status saying "interrupted, the old file kept" (a CI run of test_logits_interrupted
     * caught one at 0.075 s of a 0.075 s run). */
  }
  if (bad) {
    fprintf(stderr, "dgemma: cannot write %s: %s\n", path, strerror(err ? err : EIO));
    unlink(g_tmp_path);
    tmp_path_forget();
    return 1;
  }
  return 0;
}

void out_discard(FILE *f) {
  if (!f) return;
  if (f != stdout) fclose(f);
  g_direct = 0;
  if (flag_get(&g_tmp_path_set)) unlink(g_tmp_path);
  tmp_path_forget();
}
