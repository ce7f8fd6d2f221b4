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
 * DG_ERR_IO (cannot open, not a regular file, larger than max_bytes, read
 * failure), DG_ERR_OUT_OF_MEMORY. *buf is NULL on failure. */
dg_status dg_read_file(const char *path, uint64_t max_bytes, char **buf, size_t *len);

#endif
