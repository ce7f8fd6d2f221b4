/* ckpt_write.c: the pieces dg_quantize and dg_mkrandom share (ckpt_write.h). */
#include "writers/ckpt_write.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "base/dg_error.h"
#include "base/dg_io.h"

int dg_ckpt_has_suffix(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && !strcmp(s + a - b, suf);
}

int dg_ckpt_dir_nonempty(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *e;
  int nonempty = 0;
  while ((e = readdir(d))) nonempty |= strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return nonempty;
}

dg_status dg_ckpt_write_text(const char *path, const char *text, int newline) {
  FILE *f = fopen(path, "wb");
  if (!f) return dg_seterr(DG_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
  int ok = fputs(text, f) >= 0;
  if (newline) ok &= fputc('\n', f) != EOF;
  ok &= fclose(f) == 0;
  return ok ? DG_OK : dg_seterr(DG_ERR_IO, "%s: write failed", path);
}

dg_status dg_ckpt_write_json(const char *path, const cJSON *j, int newline) {
  char *js = cJSON_Print(j);
  dg_status st = js ? dg_ckpt_write_text(path, js, newline) : dg_seterr(DG_ERR_OUT_OF_MEMORY, "out of memory");
  free(js);
  return st;
}

dg_status dg_ckpt_copy_file(const char *from, const char *to) {
  char *buf = NULL;
  size_t len = 0;
  DG_TRY(dg_read_file(from, 0, &buf, &len));
  FILE *f = fopen(to, "wb");
  if (!f) { free(buf); return dg_seterr(DG_ERR_IO, "%s: cannot create: %s", to, strerror(errno)); }
  int ok = fwrite(buf, 1, len, f) == len;
  ok &= fclose(f) == 0;
  free(buf);
  return ok ? DG_OK : dg_seterr(DG_ERR_IO, "%s: write failed", to);
}

dg_status dg_ckpt_copy_files(const char *from_dir, const char *to_dir, int (*keep)(const char *name), int *n_copied) {
  DIR *d = opendir(from_dir);
  if (!d) return dg_seterr(DG_ERR_IO, "%s: cannot list: %s", from_dir, strerror(errno));
  struct dirent *e;
  char path[4096], path2[4096];
  dg_status st = DG_OK;
  while (!st && (e = readdir(d))) {
    if (!keep(e->d_name)) continue;
    snprintf(path, sizeof path, "%s/%s", from_dir, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    snprintf(path2, sizeof path2, "%s/%s", to_dir, e->d_name);
    st = dg_ckpt_copy_file(path, path2);
    if (n_copied) *n_copied += !st;
  }
  closedir(d);
  return st;
}

void dg_ckpt_shard_name(char *buf, size_t cap, int s, int n_shards) {
  if (n_shards == 1) snprintf(buf, cap, "model.safetensors");
  else snprintf(buf, cap, "model-%05d-of-%05d.safetensors", s + 1, n_shards);
}

cJSON *dg_ckpt_index_new(int64_t total_size, cJSON **weight_map) {
  cJSON *index = cJSON_CreateObject(), *meta = cJSON_AddObjectToObject(index, "metadata");
  *weight_map = cJSON_AddObjectToObject(index, "weight_map");
  cJSON_AddNumberToObject(meta, "total_size", (double)total_size);
  return index;
}

dg_status dg_ckpt_write_index(const char *dir, const cJSON *index, int newline) {
  char path[4096];
  snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
  return dg_ckpt_write_json(path, index, newline);
}

void dg_ckpt_module_name(char *module, size_t cap, const char *name) {
  snprintf(module, cap, "%s", name);
  if (dg_ckpt_has_suffix(module, ".weight")) module[strlen(module) - 7] = 0;
}

int dg_ckpt_rows_parallel(int64_t rows, int64_t cols, int n_threads, void (*fn)(void *ctx, int64_t r, float *row),
                          void *ctx) {
  int fail = 0;
#pragma omp parallel num_threads(n_threads)
  {
    float *row = malloc((size_t)cols * sizeof(float));
    if (!row) {
#pragma omp atomic write
      fail = 1;
    }
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++)
      if (row) fn(ctx, r, row);
    free(row);
  }
  return fail ? -1 : 0;
}
