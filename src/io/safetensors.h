/* safetensors.h: strict, mmap-based reader and small writer for the
 * safetensors container (https://github.com/huggingface/safetensors).
 *
 * File layout: 8 bytes N (u64 little-endian), N bytes of UTF-8 JSON header,
 * then the data region. The header maps each tensor name to
 * {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}
 * (byte offsets relative to the start of the data region), plus an optional
 * "__metadata__" object of string -> string.
 *
 * The reader maps a file read-only and validates the header the way the
 * reference Rust library does, and a little more strictly (see
 * dg_st_open_file). The data region is never read, only mapped: tensor data
 * pointers point into the mapping and stay valid until dg_st_close.
 *
 * This is not a general tensor library: no dtype conversion, no slicing, no
 * F8/F4 dtypes (they fail with DG_ERR_TENSOR_DTYPE).
 */
#ifndef DG_SAFETENSORS_H
#define DG_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"
#include "base/dtype.h" /* dg_dtype, dg_dtype_size/name/parse */

#define DG_MAX_DIMS 8

/* One tensor of an open container. All pointers are owned by the
 * dg_safetensors object and valid until dg_st_close. */
typedef struct dg_tensor {
  const char *name;           /* UTF-8, NUL-terminated (names never contain NUL) */
  dg_dtype dtype;
  int ndim;                   /* 0..DG_MAX_DIMS; 0 = scalar (one element) */
  int64_t shape[DG_MAX_DIMS]; /* [ndim] row-major dims, each >= 0; unused dims are 0 */
  const void *data;           /* [nbytes] into the read-only mapping. Aligned to
                               * dg_dtype_size(dtype) only if the writer aligned it
                               * (the reference writer and dg_st_write with tensors
                               * ordered by decreasing dtype size do); check before
                               * casting to a wider type. */
  size_t nbytes;              /* prod(shape) * dg_dtype_size(dtype); may be 0 */
  const char *file;           /* path of the shard holding it, as opened */
} dg_tensor;

/* An open container: one file, or every shard of a sharded checkpoint.
 * Read-only after opening, so it may be shared by several threads. */
typedef struct dg_safetensors dg_safetensors;

/* Open one .safetensors file: mmap read-only (MAP_PRIVATE), hint the kernel
 * (posix_fadvise SEQUENTIAL, madvise WILLNEED), parse and validate the header.
 * On success *out owns the mapping; free it with dg_st_close.
 *
 * Validation (the message names the file, the tensor or field, and the value):
 *  - file shorter than 8 bytes; header length 0, > 100,000,000 or past EOF;
 *  - header not valid UTF-8, not JSON (DG_ERR_JSON), not starting with '{',
 *    bytes other than space/tab/CR/LF between tokens or after the object,
 *    raw control characters or \u0000 inside strings, invalid JSON numbers
 *    that cJSON tolerates ("007", "1.");
 *  - shape/data_offsets numbers not written as plain integers ("5.0", "1e3");
 *  - a tensor entry that is not an object, a missing or repeated field;
 *  - dtype missing/not a string/unknown (DG_ERR_TENSOR_DTYPE);
 *  - shape not an array of at most DG_MAX_DIMS integers in [0, 2^53);
 *  - data_offsets not two integers in [0, 2^53) with begin <= end;
 *  - end past the data region; end - begin != prod(shape) * dtype size
 *    (overflow-checked);
 *  - sorted by offset, tensors must tile the data region exactly like the
 *    reference library requires: the first begins at 0, each begins where the
 *    previous ends (an earlier begin is an overlap, a later one a gap), and
 *    the last ends at the end of the file. Zero-size tensors may share an
 *    offset;
 *  - a repeated tensor name; "__metadata__" that is neither null nor an
 *    object of unique string keys with string values.
 * Errors: DG_ERR_INVALID_ARG (NULL argument), DG_ERR_NOT_FOUND (no such
 * file), DG_ERR_IO (open/stat/mmap failure, not a regular file),
 * DG_ERR_JSON (header is not JSON), DG_ERR_SAFETENSORS, DG_ERR_TENSOR_DTYPE,
 * DG_ERR_OUT_OF_MEMORY. On failure *out is NULL. */
dg_status dg_st_open_file(const char *path, dg_safetensors **out);

/* The same validation over a file image already in memory: buf[0..size) is
 * the whole file (header length, header, data region), borrowed, not copied:
 * it must stay valid and unchanged until dg_st_close, and tensor data
 * pointers point into it. `name` stands for the file in messages and in
 * dg_tensor.file. Used by the fuzz harness (fuzz/fuzz_safetensors.c) and by
 * tests. Errors: as dg_st_open_file without DG_ERR_NOT_FOUND and DG_ERR_IO
 * (buf NULL with size > 0 is DG_ERR_INVALID_ARG). */
dg_status dg_st_open_memory(const char *name, const void *buf, size_t size, dg_safetensors **out);

/* Open a Hugging Face model directory: if dir/model.safetensors.index.json
 * exists, open every shard named in its "weight_map" (tensor name -> shard
 * file name); otherwise open dir/model.safetensors.
 *  - Shard names must be plain file names: non-empty, no '/', no '\\', no "..".
 *  - Every tensor of weight_map must be in the shard it names; a tensor in two
 *    shards is an error. Tensors a shard holds but weight_map omits are kept.
 *  - Tensors are ordered shard by shard (shards sorted by file name), each
 *    shard in data-offset order. dg_st_metadata reads the first shard's.
 * Errors: as dg_st_open_file, plus DG_ERR_NOT_FOUND (neither file exists, or
 * a shard named by the index is missing), DG_ERR_JSON (index does not parse
 * or is not an object), DG_ERR_CONFIG (index lacks a "weight_map" object or it is empty, a
 * value is not a string, a tensor is listed twice, a shard name is not a
 * plain file name), DG_ERR_TENSOR_MISSING (a listed tensor is not in its
 * shard), DG_ERR_SAFETENSORS (a tensor present in two shards). */
dg_status dg_st_open_dir(const char *dir, dg_safetensors **out);

/* The tensor called `name` (exact, case-sensitive), or NULL if absent (no
 * error is recorded). O(log n). */
const dg_tensor *dg_st_find(const dg_safetensors *st, const char *name);
/* Number of tensors (over all shards). */
size_t dg_st_count(const dg_safetensors *st);
/* The i-th tensor in file order (see dg_st_open_dir); NULL if i >= count. */
const dg_tensor *dg_st_at(const dg_safetensors *st, size_t i);
/* Value of `key` in the first file's __metadata__, or NULL if absent. */
const char *dg_st_metadata(const dg_safetensors *st, const char *key);
/* Lets the resident pages of [p, p + n) leave this process's memory when the range lies inside
 * one of st's own file mappings (dg_st_open_file / dg_st_open_dir): madvise(MADV_DONTNEED) on
 * the whole pages inside the range (pages it shares with neighbouring bytes are kept). The
 * mappings are read-only and MAP_PRIVATE, so no page was ever copied on write: each is the page
 * cache's, RSS drops by those that were resident, and a later read of the range faults them
 * back in from the file, the same bytes (the data pointers stay valid). For a reader that has
 * its own copy of a tensor (the avx512lp kernels' pack, cpu/pack.c) and will not read it again.
 * A range in caller memory (dg_st_open_memory) or outside every mapping is left alone.
 * Returns the bytes advised (0 when none). */
size_t dg_st_drop_pages(const dg_safetensors *st, const void *p, size_t n);
/* Unmap every file and free everything; every dg_tensor pointer obtained from
 * st becomes invalid. NULL is a no-op. */
void dg_st_close(dg_safetensors *st);

/* Write a safetensors file readable by the reference library: the header
 * lists __metadata__ (if n_meta > 0) and then the tensors, padded with spaces
 * to a multiple of 8 bytes; tensor data follows contiguously in the given
 * order (data_offsets start at 0). To keep every tensor aligned to its dtype
 * size, pass tensors ordered by decreasing dg_dtype_size.
 * tensors[i].name, dtype, ndim, shape, data and nbytes are used (file is
 * ignored); data may be NULL only when nbytes is 0. meta_keys/meta_vals:
 * n_meta UTF-8 strings each (may be NULL when n_meta is 0).
 * Errors: DG_ERR_INVALID_ARG (NULL path/name/data/string, unknown dtype, ndim
 * outside [0, DG_MAX_DIMS], negative dim, nbytes != prod(shape) * dtype size,
 * repeated or reserved ("__metadata__") tensor name, repeated metadata key,
 * string that is not valid UTF-8), DG_ERR_IO (create/write failure; a
 * partially written file is removed), DG_ERR_OUT_OF_MEMORY. */
dg_status dg_st_write(const char *path, const dg_tensor *tensors, size_t n,
                      const char *const *meta_keys, const char *const *meta_vals, size_t n_meta);

/* Streaming writer: the same file as dg_st_write, with the data filled in
 * afterwards in any order (and from several threads), so that a tensor never
 * has to be held whole in memory (dgemma mkrandom).
 *
 * dg_st_create writes the header for tensors[0..n) (name, dtype, ndim, shape,
 * nbytes are used; data is ignored and may be NULL) exactly as dg_st_write
 * would, and gives the file its final size (posix_fallocate where the file
 * system supports it, so a full disk fails here). Errors: as dg_st_write.
 * dg_st_out_pwrite writes nbytes of tensor i's data starting `off` bytes into
 * the tensor; thread-safe for disjoint ranges. Errors: DG_ERR_INVALID_ARG (a
 * range outside the tensor), DG_ERR_IO.
 * dg_st_out_close closes the file; DG_ERR_IO (and the file removed) if the
 * bytes written do not add up to the data region, or close fails.
 * dg_st_out_abort closes and removes the file. Both free the writer. */
typedef struct dg_st_out dg_st_out;
dg_status dg_st_create(const char *path, const dg_tensor *tensors, size_t n, const char *const *meta_keys,
                       const char *const *meta_vals, size_t n_meta, dg_st_out **out);
/* Absolute file offset of tensor i's first data byte (0 if i is out of range). */
uint64_t dg_st_out_offset(const dg_st_out *o, size_t i);
dg_status dg_st_out_pwrite(dg_st_out *o, size_t i, uint64_t off, const void *data, size_t nbytes);
dg_status dg_st_out_close(dg_st_out *o);
void dg_st_out_abort(dg_st_out *o);

#endif /* DG_SAFETENSORS_H */
