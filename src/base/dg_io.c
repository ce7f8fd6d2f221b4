/* dg_io.c: dg_read_file (see dg_io.h). */
#include "base/dg_io.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/dg_error.h"

dg_status dg_read_file(const char *path, uint64_t max_bytes, char **buf, size_t *len) {
  *buf = NULL;
  /* O_NONBLOCK: the open of a FIFO with no writer returns at once (and is refused below as not a
   * regular file) instead of waiting for a writer for ever; it changes nothing for a regular file */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT || errno == ENOTDIR) return dg_seterr(DG_ERR_NOT_FOUND, "%s: no such file", path);
    return dg_seterr(DG_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
  }
  struct stat sb;
  if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
    close(fd);
    return dg_seterr(DG_ERR_IO, "%s: not a readable regular file", path);
  }
  if (max_bytes && (uint64_t)sb.st_size > max_bytes) {
    close(fd);
    return dg_seterr(DG_ERR_IO, "%s: %lld bytes is more than the %llu allowed", path, (long long)sb.st_size,
                     (unsigned long long)max_bytes);
  }
  size_t n = (size_t)sb.st_size, got = 0;
  char *p = malloc(n + 1);
  if (!p) {
    close(fd);
    return dg_seterr(DG_ERR_OUT_OF_MEMORY, "%s: cannot allocate %zu bytes", path, n + 1);
  }
  while (got < n) {
    ssize_t r = read(fd, p + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      int err = r < 0 ? errno : EIO;
      free(p);
      close(fd);
      return dg_seterr(DG_ERR_IO, "%s: read failed: %s", path, strerror(err));
    }
    got += (size_t)r;
  }
  close(fd);
  p[n] = 0;
  *buf = p;
  if (len) *len = n;
  return DG_OK;
}

/* The directory out_dir names, in dir (cap bytes): out_dir without trailing slashes or, when that is a
 * symbolic link to a directory, the directory it resolves to (realpath), so that the temporary sibling is made
 * and renamed beside the real directory (a rename over the link itself fails with ENOTDIR, after all the
 * work: review aud16). Returns its length, 0 if empty or too long. */
static int outdir_target(const char *out_dir, char *dir, size_t cap) {
  int n = snprintf(dir, cap, "%s", out_dir ? out_dir : "");
  if (n <= 0 || (size_t)n >= cap) return 0;
  while (n > 1 && dir[n - 1] == '/') dir[--n] = 0; /* "out/" names "out" */
  struct stat lsb, sb;
  char real[PATH_MAX];
  if (lstat(dir, &lsb) == 0 && S_ISLNK(lsb.st_mode) && stat(dir, &sb) == 0 && S_ISDIR(sb.st_mode) &&
      realpath(dir, real) && strlen(real) < cap)
    n = snprintf(dir, cap, "%s", real);
  return n;
}

dg_status dg_outdir_begin(const char *out_dir, char *tmp, size_t cap, void (*announce)(const char *tmp, void *ud),
                          void *ud) {
  char dir[4096];
  int n = outdir_target(out_dir, dir, sizeof dir);
  if (n <= 0) return dg_seterr(DG_ERR_INVALID_ARG, "output directory name empty or too long");
  struct stat sb;
  if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
    return dg_seterr(DG_ERR_INVALID_ARG, "%s: exists and is not a directory", out_dir);
  if (lstat(dir, &sb) == 0 && S_ISLNK(sb.st_mode)) /* a link outdir_target did not resolve: to nothing */
    return dg_seterr(DG_ERR_INVALID_ARG, "%s: a symbolic link to a directory that does not exist (make the directory "
                     "it names, or name another output)", out_dir);
  char *slash = strrchr(dir, '/');
  const char *name = slash ? slash + 1 : dir;
  if (!*name || !strcmp(name, ".") || !strcmp(name, ".."))
    return dg_seterr(DG_ERR_INVALID_ARG, "%s: name a new directory (not \"/\", \".\" or \"..\")", out_dir);
  if (slash) *slash = 0;
  const char *parent = slash ? (slash == dir ? "/" : dir) : ".";
  n = snprintf(tmp, cap, "%s%s.%s.tmp-XXXXXX", parent, !strcmp(parent, "/") ? "" : "/", name);
  if (n < 0 || (size_t)n >= cap) return dg_seterr(DG_ERR_INVALID_ARG, "%s: path too long", out_dir);
  /* mkdtemp's job, with the name announced before mkdir makes it */
  static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  int err = EEXIST;
  for (int attempt = 0; attempt < 100 && err == EEXIST; attempt++) {
    unsigned char rnd[6];
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) { /* no entropy call: time and pid */
      struct timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      uint64_t x = (uint64_t)ts.tv_nsec * 6364136223846793005ull ^ (uint64_t)getpid() << 20 ^ (uint64_t)attempt;
      for (int k = 0; k < 6; k++, x >>= 8) rnd[k] = (unsigned char)x;
    }
    for (int k = 0; k < 6; k++) tmp[n - 6 + k] = abc[rnd[k] % (sizeof abc - 1)];
    if (announce) announce(tmp, ud);
    err = mkdir(tmp, 0700) == 0 ? 0 : errno;
  }
  if (err) {
    if (announce) announce(NULL, ud);
    snprintf(tmp, cap, "%s", parent);
    return dg_seterr(DG_ERR_IO, "%s: cannot create a temporary directory in %s: %s", out_dir, tmp, strerror(err));
  }
  return DG_OK;
}

dg_status dg_outdir_commit(const char *tmp, const char *out_dir) {
  mode_t um = umask(0); /* mkdtemp makes it 0700; give it what mkdir(out_dir, 0755) would */
  umask(um);
  if (chmod(tmp, 0755 & ~um) != 0)
    return dg_seterr(DG_ERR_IO, "%s: cannot set permissions: %s", tmp, strerror(errno));
  char dir[4096];
  if (outdir_target(out_dir, dir, sizeof dir) <= 0)
    return dg_seterr(DG_ERR_INVALID_ARG, "output directory name empty or too long");
  if (rename(tmp, dir) != 0) {
    int err = errno;
    if (err == ENOTEMPTY || err == EEXIST)
      return dg_seterr(DG_ERR_IO, "%s: output directory is not empty (something was written there meanwhile)", out_dir);
    return dg_seterr(DG_ERR_IO, "%s: cannot rename %s to it: %s", out_dir, tmp, strerror(err));
  }
  return DG_OK;
}

void dg_outdir_discard(const char *tmp) {
  DIR *d = opendir(tmp);
  if (d) {
    struct dirent *e;
    char path[4352];
    while ((e = readdir(d))) {
      if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
      snprintf(path, sizeof path, "%s/%s", tmp, e->d_name);
      unlink(path);
    }
    closedir(d);
  }
  rmdir(tmp);
}
