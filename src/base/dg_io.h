/* dg_io.h: reading small whole files (JSON configs, tokenizer.json, the
 * safetensors index). Big tensor data is mmap'd by safetensors.c instead. */
#ifndef DG_IO_H
#define DG_IO_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"

/* Read the regular file `path` into a malloc'd NUL-terminated buffer
 * (*len bytes, not counting the NUL; len may be NULL). max_bytes > 0 caps the
 * size. Errors (message names the path): DG_ERR_NOT_FOUND (no such file),
 * DG_ERR_IO (cannot open, not a regular file: a FIFO or device is refused
 * without waiting on it, larger than max_bytes, read failure),
 * DG_ERR_OUT_OF_MEMORY. *buf is NULL on failure. */
dg_status dg_read_file(const char *path, uint64_t max_bytes, char **buf, size_t *len);

/* An output directory written whole or not at all (dg_quantize, dg_mkrandom):
 * everything goes into a fresh temporary sibling that is renamed to out_dir
 * only once complete, so an error or an interruption leaves no partial
 * out_dir, and a rerun is not refused.
 *
 * dg_outdir_begin creates "<parent>/.<name>.tmp-XXXXXX" next to out_dir (its
 * path in tmp, cap bytes); announce (may be NULL) is given each name just
 * before the directory is made under it (again if a name is taken), so that
 * a caller that removes it from a signal handler knows it from the moment it
 * exists; after a failure announce(NULL). out_dir itself must be absent or an empty
 * directory (the caller checks emptiness, with its own message); a file in
 * its place is DG_ERR_INVALID_ARG. DG_ERR_IO if the sibling cannot be made. A symbolic link to a
 * directory stands for that directory: the sibling is made beside it and renamed over it (the link stays);
 * a link to nothing is DG_ERR_INVALID_ARG (before any work: a rename over it fails).
 * dg_outdir_commit renames tmp to out_dir (an empty out_dir is replaced;
 * one that became non-empty meanwhile is DG_ERR_IO, tmp then left to the
 * caller's dg_outdir_discard). dg_outdir_discard removes tmp and the plain
 * files in it (the writers make no subdirectories); silent. */
dg_status dg_outdir_begin(const char *out_dir, char *tmp, size_t cap, void (*announce)(const char *tmp, void *ud),
                          void *ud);
dg_status dg_outdir_commit(const char *tmp, const char *out_dir);
void dg_outdir_discard(const char *tmp);

#endif
