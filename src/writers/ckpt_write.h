/* ckpt_write.h: what the two checkpoint writers, dg_quantize (quantize.c) and
 * dg_mkrandom (mkrandom.c), share: small output files, the copy of a source
 * directory's other files, the shard names and the index, the ".weight"
 * module name, and the parallel loop over a tensor's rows. The output
 * directory itself (written whole or not at all) is dg_io.h's dg_outdir_*. */
#ifndef DG_CKPT_WRITE_H
#define DG_CKPT_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"

struct cJSON;

/* 1 when s ends in suf. */
int dg_ckpt_has_suffix(const char *s, const char *suf);

/* 1 when dir holds anything besides "." and "..", 0 when it is empty, -1
 * when it cannot be opened (errno from opendir: ENOENT when absent). */
int dg_ckpt_dir_nonempty(const char *dir);

/* Write text to a new file at path, followed by "\n" when newline.
 * DG_ERR_IO "<path>: cannot create: <why>" or "<path>: write failed". */
dg_status dg_ckpt_write_text(const char *path, const char *text, int newline);

/* cJSON_Print(j) written as dg_ckpt_write_text does; DG_ERR_OUT_OF_MEMORY
 * "out of memory" when printing fails. */
dg_status dg_ckpt_write_json(const char *path, const struct cJSON *j, int newline);

/* Copy the file from (read whole, dg_read_file) to a new file to; the
 * errors name the file (dg_read_file's, or dg_ckpt_write_text's). */
dg_status dg_ckpt_copy_file(const char *from, const char *to);

/* Copy every regular file of from_dir whose name keep() accepts into
 * to_dir (same name); *n_copied (may be NULL) counts them. DG_ERR_IO
 * "<from_dir>: cannot list: <why>", or dg_ckpt_copy_file's error. */
dg_status dg_ckpt_copy_files(const char *from_dir, const char *to_dir, int (*keep)(const char *name), int *n_copied);

/* Shard s (0-based) of n_shards: "model.safetensors" when n_shards is 1,
 * else "model-%05d-of-%05d.safetensors" (Transformers' names). */
void dg_ckpt_shard_name(char *buf, size_t cap, int s, int n_shards);

/* A new model.safetensors.index.json object, {"metadata": {"total_size":
 * total_size}, "weight_map": {}}; *weight_map is its (empty) map. */
struct cJSON *dg_ckpt_index_new(int64_t total_size, struct cJSON **weight_map);

/* index written as dir/model.safetensors.index.json (dg_ckpt_write_json). */
dg_status dg_ckpt_write_index(const char *dir, const struct cJSON *index, int newline);

/* The module path of tensor name (cap bytes): name without a final
 * ".weight" (the key of a quantization block, the stem of <m>.scales). */
void dg_ckpt_module_name(char *module, size_t cap, const char *name);

/* fn(ctx, r, row) for every r in [0, rows), rows split statically over
 * n_threads OpenMP threads, row a float scratch of cols values private to
 * the thread. Returns 0, or -1 when a thread could not allocate its
 * scratch (its rows are then not visited). */
int dg_ckpt_rows_parallel(int64_t rows, int64_t cols, int n_threads, void (*fn)(void *ctx, int64_t r, float *row),
                          void *ctx);

#endif
