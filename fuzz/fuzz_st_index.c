/* fuzz_st_index.c: libFuzzer harness of model.safetensors.index.json
 * (dg_st_open_dir in src/io/safetensors.c). At start it makes a temporary model
 * directory with two small shards (model-00001-of-00002.safetensors: "a.weight"
 * F32 [2, 3], "b.bias" BF16 [3]; model-00002-of-00002.safetensors: "c.weight"
 * U8 [4], "d" I64 scalar); each input is written there as the index and the
 * directory opened. Properties: an error has a message and no object; when
 * accepted, every weight_map tensor is found. The directory is removed at exit. */
#include <fcntl.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fuzz.h"
#include "io/safetensors.h"

static char g_dir[256], g_index[320];

static void cleanup(void) {
  char p[400];
  const char *f[] = {"model.safetensors.index.json", "model-00001-of-00002.safetensors",
                     "model-00002-of-00002.safetensors"};
  for (int i = 0; i < 3; i++) {
    snprintf(p, sizeof p, "%s/%s", g_dir, f[i]);
    unlink(p);
  }
  rmdir(g_dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/dg-fuzz-index-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(g_dir)) { perror("mkdtemp"); exit(1); }
  atexit(cleanup);
  snprintf(g_index, sizeof g_index, "%s/model.safetensors.index.json", g_dir);
  static float a[6] = {1, 2, 3, 4, 5, 6};
  static uint16_t b[3] = {0x3f80, 0x4000, 0x4040};
  static uint8_t c[4] = {1, 2, 3, 4};
  static int64_t dd = 7;
  dg_tensor s1[2] = {{.name = "a.weight", .dtype = DG_F32, .ndim = 2, .shape = {2, 3}, .data = a, .nbytes = 24},
                     {.name = "b.bias", .dtype = DG_BF16, .ndim = 1, .shape = {3}, .data = b, .nbytes = 6}};
  dg_tensor s2[2] = {{.name = "d", .dtype = DG_I64, .ndim = 0, .data = &dd, .nbytes = 8},
                     {.name = "c.weight", .dtype = DG_U8, .ndim = 1, .shape = {4}, .data = c, .nbytes = 4}};
  char p[400];
  snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", g_dir);
  if (dg_st_write(p, s1, 2, NULL, NULL, 0)) { fprintf(stderr, "%s\n", dg_last_error()); exit(1); }
  snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", g_dir);
  if (dg_st_write(p, s2, 2, NULL, NULL, 0)) { fprintf(stderr, "%s\n", dg_last_error()); exit(1); }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  int fd = open(g_index, O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || write(fd, d, n) != (ssize_t)n || close(fd) != 0) { perror(g_index); abort(); }
  dg_safetensors *st = (dg_safetensors *)1;
  dg_status rc = dg_st_open_dir(g_dir, &st);
  fz_check_error(rc);
  if (rc != DG_OK) {
    if (st) fz_fail("error %s but an object", dg_status_str(rc));
    return 0;
  }
  size_t cnt = dg_st_count(st);
  if (cnt != 2 && cnt != 4) fz_fail("%zu tensors, the shards hold 2 each", cnt);
  cJSON *j = cJSON_ParseWithLength((const char *)d, n); /* accepted, so it parses */
  if (!j) fz_fail("accepted index does not parse");
  const cJSON *e;
  cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(j, "weight_map"))
    if (!dg_st_find(st, e->string)) fz_fail("weight_map tensor \"%s\" not found", e->string);
  cJSON_Delete(j);
  dg_st_close(st);
  return 0;
}
