/* dg_io.c: dg_read_file (see dg_io.h). */
#include "dg_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dg_error.h"

dg_status dg_read_file(const char *path, uint64_t max_bytes, char **buf, size_t *len) {
  *buf = NULL;
  int fd = open(path, O_RDONLY | O_CLOEXEC);
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
