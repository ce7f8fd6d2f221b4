/* test_safetensors.c: the safetensors reader and writer (src/io/safetensors.c).
 *
 *   make build/tests/test_safetensors && build/tests/test_safetensors
 *
 * Every file is written under a fresh mkdtemp() directory, removed afterwards.
 * Covered: writer -> reader round trips of every dtype (0-d, zero-size, 8-d),
 * byte-exact agreement with the reference library's serialization, edge
 * cases the reference accepts, sharded directories, and two tables of broken
 * inputs (single files, hand-made byte by byte, and model directories), each
 * checked for its status and for a message naming the file and the culprit.
 */
#include "testutil.h"

#include <ftw.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "procmem.h"

static char g_tmp[256]; /* mkdtemp directory of the current test */

/* snprintf into an array, failing the test if it does not fit. */
#define FMT(buf, ...) assert_true(snprintf((buf), sizeof(buf), __VA_ARGS__) < (int)sizeof(buf))

/* ------------------------------------------------------------------------- */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------- */

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
  (void)sb; (void)flag; (void)ftw;
  return remove(path);
}

static int setup_tmp(void **state) {
  (void)state;
  FMT(g_tmp, "/tmp/dg_st_test_XXXXXX");
  return mkdtemp(g_tmp) ? 0 : -1;
}

static int teardown_tmp(void **state) {
  (void)state;
  return nftw(g_tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* g_tmp + "/" + name into a static rotating buffer (4 slots). */
static const char *tmp_path(const char *name) {
  static char buf[4][512];
  static int k = 0;
  k = (k + 1) % 4;
  FMT(buf[k], "%s/%s", g_tmp, name);
  return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  if (n) assert_int_equal(fwrite(p, 1, n, f), n);
  assert_int_equal(fclose(f), 0);
}

/* A safetensors file from header[0..hl) (hl 0: strlen): the u64 length field
 * (len_field, or hl if len_field < 0), the header, then data_len bytes 0,1,2,... */
static void write_st_n(const char *path, const char *header, size_t hl, long long len_field, size_t data_len) {
  if (!hl) hl = strlen(header);
  size_t n = 8 + hl + data_len;
  uint8_t *buf = malloc(n);
  assert_non_null(buf);
  uint64_t len = len_field < 0 ? (uint64_t)hl : (uint64_t)len_field;
  for (int i = 0; i < 8; i++) buf[i] = (uint8_t)(len >> (8 * i));
  memcpy(buf + 8, header, hl);
  for (size_t i = 0; i < data_len; i++) buf[8 + hl + i] = (uint8_t)i;
  write_bytes(path, buf, n);
  free(buf);
}

static void write_st(const char *path, const char *header, long long len_field, size_t data_len) {
  write_st_n(path, header, 0, len_field, data_len);
}

/* Fail unless dg_last_error() contains `needle`. */
#define assert_err_has(needle)                                                 \
  do {                                                                         \
    if (!strstr(dg_last_error(), (needle)))                                    \
      fail_msg("message \"%s\" lacks \"%s\"", dg_last_error(), (needle));     \
  } while (0)

/* ------------------------------------------------------------------------- */
/* dtypes                                                                    */
/* ------------------------------------------------------------------------- */

static void test_dtypes(void **state) {
  (void)state;
  static const struct { const char *name; size_t size; } want[DG_DTYPE_COUNT] = {
    [DG_F32] = {"F32", 4}, [DG_F16] = {"F16", 2}, [DG_BF16] = {"BF16", 2}, [DG_F64] = {"F64", 8},
    [DG_I64] = {"I64", 8}, [DG_I32] = {"I32", 4}, [DG_I16] = {"I16", 2},   [DG_I8] = {"I8", 1},
    [DG_U8] = {"U8", 1},   [DG_U16] = {"U16", 2}, [DG_U32] = {"U32", 4},   [DG_U64] = {"U64", 8},
    [DG_BOOL] = {"BOOL", 1},
  };
  for (int i = 0; i < DG_DTYPE_COUNT; i++) {
    dg_dtype t = DG_DTYPE_COUNT;
    assert_string_equal(dg_dtype_name((dg_dtype)i), want[i].name);
    assert_int_equal(dg_dtype_size((dg_dtype)i), want[i].size);
    assert_int_equal(dg_dtype_parse(want[i].name, &t), 1);
    assert_int_equal(t, i);
  }
  dg_dtype t = DG_F32;
  assert_int_equal(dg_dtype_parse("f32", &t), 0); /* case-sensitive */
  assert_int_equal(dg_dtype_parse("F8_E4M3", &t), 0);
  assert_int_equal(dg_dtype_parse("", &t), 0);
  assert_int_equal(dg_dtype_parse(NULL, &t), 0);
  assert_int_equal(t, DG_F32);
  assert_int_equal(dg_dtype_size(DG_DTYPE_COUNT), 0);
  assert_string_equal(dg_dtype_name(DG_DTYPE_COUNT), "?");
}

/* ------------------------------------------------------------------------- */
/* Round trips                                                               */
/* ------------------------------------------------------------------------- */

/* Tensors of every dtype and some awkward shapes; data is a byte pattern that
 * differs per tensor. Ordered by decreasing element size (aligned data). */
typedef struct rt_spec { const char *name; dg_dtype dtype; int ndim; int64_t shape[DG_MAX_DIMS]; } rt_spec;
static const rt_spec rt_specs[] = {
  {"f64.scalar", DG_F64, 0, {0}},
  {"i64", DG_I64, 2, {2, 3}},
  {"u64", DG_U64, 1, {5}},
  {"f32", DG_F32, 2, {3, 4}},
  {"f32.empty", DG_F32, 3, {3, 0, 2}},
  {"i32", DG_I32, 1, {7}},
  {"u32.scalar", DG_U32, 0, {0}},
  {"f16", DG_F16, 3, {2, 1, 3}},
  {"bf16", DG_BF16, 2, {4, 2}},
  {"bf16.empty", DG_BF16, 1, {0}},
  {"i16", DG_I16, 1, {3}},
  {"u16", DG_U16, 8, {1, 2, 1, 1, 2, 1, 1, 3}},
  {"i8", DG_I8, 1, {9}},
  {"u8", DG_U8, 2, {1, 1}},
  {"bool", DG_BOOL, 1, {4}},
  {"name with \"quotes\", \\ and \xc3\xa9", DG_U8, 1, {2}},
};
#define N_RT (sizeof rt_specs / sizeof rt_specs[0])

/* Fill tensors[] from rt_specs; returns the malloc'd data block. */
static uint8_t *rt_make(dg_tensor *ts) {
  size_t total = 0;
  for (size_t i = 0; i < N_RT; i++) {
    const rt_spec *s = &rt_specs[i];
    size_t n = dg_dtype_size(s->dtype);
    for (int d = 0; d < s->ndim; d++) n *= (size_t)s->shape[d];
    memset(&ts[i], 0, sizeof ts[i]);
    ts[i].name = s->name;
    ts[i].dtype = s->dtype;
    ts[i].ndim = s->ndim;
    memcpy(ts[i].shape, s->shape, sizeof s->shape);
    ts[i].nbytes = n;
    total += n;
  }
  uint8_t *block = malloc(total + 1);
  assert_non_null(block);
  size_t off = 0;
  for (size_t i = 0; i < N_RT; i++) {
    for (size_t k = 0; k < ts[i].nbytes; k++) block[off + k] = (uint8_t)(i * 37 + k * 11 + 1);
    if (ts[i].dtype == DG_BOOL)
      for (size_t k = 0; k < ts[i].nbytes; k++) block[off + k] &= 1;
    ts[i].data = ts[i].nbytes ? block + off : NULL;
    off += ts[i].nbytes;
  }
  return block;
}

/* Check that st holds exactly `want` (byte for byte), in the same order. */
static void rt_check(const dg_safetensors *st, const dg_tensor *want, size_t n, const char *file) {
  assert_int_equal(dg_st_count(st), n);
  for (size_t i = 0; i < n; i++) {
    const dg_tensor *t = dg_st_find(st, want[i].name);
    if (!t) fail_msg("tensor \"%s\" not found", want[i].name);
    assert_ptr_equal(dg_st_at(st, i), t); /* written contiguously in this order */
    assert_string_equal(t->name, want[i].name);
    assert_int_equal(t->dtype, want[i].dtype);
    assert_int_equal(t->ndim, want[i].ndim);
    for (int d = 0; d < t->ndim; d++) assert_int_equal(t->shape[d], want[i].shape[d]);
    assert_int_equal(t->nbytes, want[i].nbytes);
    if (t->nbytes) assert_memory_equal(t->data, want[i].data, t->nbytes);
    /* Ordered by decreasing dtype size, so every tensor is aligned. */
    assert_int_equal((uintptr_t)t->data % dg_dtype_size(t->dtype), 0);
    if (file) assert_string_equal(t->file, file);
  }
  assert_null(dg_st_at(st, n));
}

static void test_roundtrip_all_dtypes(void **state) {
  (void)state;
  dg_tensor ts[N_RT];
  uint8_t *block = rt_make(ts);
  const char *keys[] = {"format", "odd", "empty"};
  const char *vals[] = {"pt", "tab\there \"q\" \\ \x01 \xe2\x82\xac", ""};
  const char *path = tmp_path("all.safetensors");
  assert_dg_ok(dg_st_write(path, ts, N_RT, keys, vals, 3));

  /* Header length is a multiple of 8 and padded with spaces. */
  size_t flen = 0;
  char *raw = dg_test_read_file(path, &flen);
  assert_non_null(raw);
  uint64_t hl = 0;
  for (int i = 0; i < 8; i++) hl |= (uint64_t)(uint8_t)raw[i] << (8 * i);
  assert_int_equal(hl % 8, 0);
  assert_true(hl + 8 <= flen);
  size_t last = 8 + (size_t)hl - 1;
  while (raw[last] == ' ') last--;
  assert_int_equal(raw[last], '}');
  free(raw);

  dg_safetensors *st = NULL;
  assert_dg_ok(dg_st_open_file(path, &st));
  rt_check(st, ts, N_RT, path);
  assert_string_equal(dg_st_metadata(st, "format"), "pt");
  assert_string_equal(dg_st_metadata(st, "odd"), vals[1]);
  assert_string_equal(dg_st_metadata(st, "empty"), "");
  assert_null(dg_st_metadata(st, "missing"));
  assert_null(dg_st_find(st, "missing"));
  assert_null(dg_st_find(st, "F32")); /* case-sensitive */
  const dg_tensor *sc = dg_st_find(st, "f64.scalar");
  assert_int_equal(sc->ndim, 0);
  assert_int_equal(sc->nbytes, 8);
  dg_st_close(st);

  /* The same through dg_st_open_dir (single model.safetensors). */
  assert_int_equal(mkdir(tmp_path("single"), 0755), 0);
  const char *mpath = tmp_path("single/model.safetensors");
  assert_dg_ok(dg_st_write(mpath, ts, N_RT, NULL, NULL, 0));
  assert_dg_ok(dg_st_open_dir(tmp_path("single"), &st));
  rt_check(st, ts, N_RT, mpath);
  assert_null(dg_st_metadata(st, "format"));
  dg_st_close(st);
  free(block);
}

/* dg_st_drop_pages: after the pages of a tensor are dropped, RSS is lower by about the tensor's
 * size (RssFile counts the mapping's resident pages; the file is 4 MiB, so the drop is 1024 pages
 * less at most the 2 the tensor shares with the header and its neighbour), the tensor still
 * reads its bytes (faulted back in from the file), and a range in caller memory
 * (dg_st_open_memory) or outside the mappings is left alone (0 bytes). */
static void test_drop_pages(void **state) {
  (void)state;
  const size_t n = (size_t)4 << 20;
  uint8_t *d = malloc(n);
  assert_non_null(d);
  for (size_t i = 0; i < n; i++) d[i] = (uint8_t)(i * 131 + (i >> 12));
  dg_tensor t = {.name = "w", .dtype = DG_U8, .ndim = 1, .shape = {(int64_t)n}, .data = d, .nbytes = n};
  const char *path = tmp_path("drop.safetensors");
  assert_dg_ok(dg_st_write(path, &t, 1, NULL, NULL, 0));
  dg_safetensors *st = NULL;
  assert_dg_ok(dg_st_open_file(path, &st));
  const dg_tensor *w = dg_st_find(st, "w");
  assert_non_null(w);
  assert_memory_equal(w->data, d, n); /* every page resident */
  const long before = dg_proc_kb("VmRSS:");
  const size_t dropped = dg_st_drop_pages(st, w->data, n);
  const long after = dg_proc_kb("VmRSS:"), pg = sysconf(_SC_PAGESIZE);
  printf("# dg_st_drop_pages: %zu of %zu bytes advised, VmRSS %ld -> %ld kB\n", dropped, n, before, after);
  assert_true(dropped >= n - 2 * (size_t)pg && dropped <= n);
  assert_true(before - after >= (long)(dropped / 1024) * 9 / 10);
  assert_memory_equal(w->data, d, n); /* the same bytes, from the file */
  assert_int_equal(dg_st_drop_pages(st, d, n), 0); /* not a mapping of st */
  assert_int_equal(dg_st_drop_pages(st, (const char *)w->data + 1, n), 0); /* past the file's end */
  assert_int_equal(dg_st_drop_pages(NULL, w->data, n), 0);
  dg_st_close(st);
  size_t flen = 0;
  char *raw = dg_test_read_file(path, &flen);
  assert_non_null(raw);
  assert_dg_ok(dg_st_open_memory("mem", raw, flen, &st));
  w = dg_st_find(st, "w");
  assert_int_equal(dg_st_drop_pages(st, w->data, n), 0); /* caller memory: never advised */
  assert_memory_equal(w->data, d, n);
  dg_st_close(st);
  free(raw);
  free(d);
}

static void test_roundtrip_empty(void **state) {
  (void)state;
  const char *path = tmp_path("empty.safetensors");
  assert_dg_ok(dg_st_write(path, NULL, 0, NULL, NULL, 0));
  dg_safetensors *st = NULL;
  assert_dg_ok(dg_st_open_file(path, &st));
  assert_int_equal(dg_st_count(st), 0);
  assert_null(dg_st_at(st, 0));
  assert_null(dg_st_find(st, ""));
  dg_st_close(st);
  dg_st_close(NULL);
}

/* Our writer must produce the bytes the reference library documents for the
 * same content (its serialization tests): empty file, metadata only, and one
 * F32 [1,1,2,3] tensor "attn0" whose header gets 7 padding spaces. */
static void test_reference_bytes(void **state) {
  (void)state;
  static const struct { const char *header; } want[] = {
    {"{}      "},
    {"{\"__metadata__\":{\"framework\":\"pt\"}}     "},
    {"{\"attn0\":{\"dtype\":\"F32\",\"shape\":[1,1,2,3],\"data_offsets\":[0,24]}}       "},
  };
  const float vals[6] = {0, 1, 2, 3, 4, 5};
  const char *k[] = {"framework"}, *v[] = {"pt"};
  dg_tensor t = {.name = "attn0", .dtype = DG_F32, .ndim = 4, .shape = {1, 1, 2, 3},
                 .data = vals, .nbytes = sizeof vals};
  for (int c = 0; c < 3; c++) {
    const char *path = tmp_path("ref.safetensors");
    if (c == 0) assert_dg_ok(dg_st_write(path, NULL, 0, NULL, NULL, 0));
    if (c == 1) assert_dg_ok(dg_st_write(path, NULL, 0, k, v, 1));
    if (c == 2) assert_dg_ok(dg_st_write(path, &t, 1, NULL, NULL, 0));
    size_t n = 0;
    char *raw = dg_test_read_file(path, &n);
    size_t hl = strlen(want[c].header);
    assert_int_equal(n, 8 + hl + (c == 2 ? sizeof vals : 0));
    assert_int_equal((uint8_t)raw[0], hl);
    for (int i = 1; i < 8; i++) assert_int_equal(raw[i], 0);
    assert_memory_equal(raw + 8, want[c].header, hl);
    if (c == 2) assert_memory_equal(raw + 8 + hl, vals, sizeof vals);
    free(raw);
  }
}

/* Files the reference library accepts must open. */
static void test_valid_edge_cases(void **state) {
  (void)state;
  static const struct { const char *header; size_t data_len; size_t n_tensors; } ok[] = {
    /* Tensors listed out of offset order; whitespace between tokens; newline padding. */
    {"{\n\"b\" : {\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[2,4]},\r\n"
     "\t\"a\":{\"data_offsets\":[0,2],\"shape\":[2],\"dtype\":\"U8\"}}\n\n", 4, 2},
    /* Unknown fields are ignored; __metadata__ may be null. */
    {"{\"__metadata__\":null,\"a\":{\"dtype\":\"I16\",\"shape\":[1],\"data_offsets\":[0,2],\"extra\":[1.5,{}]}}", 2, 1},
    /* Zero-size tensors may share an offset, also with a following tensor. */
    {"{\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,4]},"
     "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
     "\"z2\":{\"dtype\":\"F64\",\"shape\":[0,9007199254740991],\"data_offsets\":[4,4]},"
     "\"b\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[4,8]}}", 8, 4},
    /* Escaped names. */
    {"{\"\\u00e9\\n\\\"x\\\"\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, 1},
    /* No tensors at all, no data. */
    {"{}", 0, 0},
  };
  for (size_t c = 0; c < sizeof ok / sizeof ok[0]; c++) {
    const char *path = tmp_path("edge.safetensors");
    write_st(path, ok[c].header, -1, ok[c].data_len);
    dg_safetensors *st = NULL;
    dg_status rc = dg_st_open_file(path, &st);
    if (rc != DG_OK) fail_msg("case %zu: %s: %s", c, dg_status_str(rc), dg_last_error());
    assert_int_equal(dg_st_count(st), ok[c].n_tensors);
    if (c == 0) {
      assert_string_equal(dg_st_at(st, 0)->name, "a"); /* offset order */
      assert_int_equal(((const uint8_t *)dg_st_find(st, "b")->data)[0], 2);
    }
    if (c == 2) {
      const dg_tensor *b = dg_st_find(st, "b");
      assert_int_equal(b->ndim, 0);
      assert_int_equal(((const uint8_t *)b->data)[0], 4);
      assert_int_equal(dg_st_find(st, "z2")->shape[1], 9007199254740991LL);
    }
    if (c == 3) assert_non_null(dg_st_find(st, "\xc3\xa9\n\"x\""));
    dg_st_close(st);
  }
}

/* ------------------------------------------------------------------------- */
/* Sharded directories                                                       */
/* ------------------------------------------------------------------------- */

/* Write dir/shard holding one F32 [2] tensor per comma-separated name; the
 * tensor's values encode its name's first char and position. */
static void write_shard(const char *dir, const char *shard, const char *names) {
  char path[512], buf[256];
  FMT(path, "%s/%s", dir, shard);
  FMT(buf, "%s", names);
  dg_tensor ts[8];
  float vals[8][2];
  size_t n = 0;
  for (char *tok = strtok(buf, ","); tok && n < 8; tok = strtok(NULL, ","), n++) {
    vals[n][0] = (float)tok[0];
    vals[n][1] = (float)n;
    ts[n] = (dg_tensor){.name = tok, .dtype = DG_F32, .ndim = 1, .shape = {2},
                        .data = vals[n], .nbytes = sizeof vals[n]};
  }
  const char *k[] = {"shard"}, *v[] = {shard};
  assert_dg_ok(dg_st_write(path, ts, n, k, v, 1));
}

static void write_text(const char *dir, const char *name, const char *text) {
  char path[512];
  FMT(path, "%s/%s", dir, name);
  write_bytes(path, text, strlen(text));
}

static void test_sharded(void **state) {
  (void)state;
  char dir[512];
  FMT(dir, "%s/sharded", g_tmp);
  assert_int_equal(mkdir(dir, 0755), 0);
  write_shard(dir, "model-00002-of-00002.safetensors", "c,d,extra");
  write_shard(dir, "model-00001-of-00002.safetensors", "b,a");
  write_text(dir, "model.safetensors.index.json",
             "{\"metadata\":{\"total_size\":40},\"weight_map\":{"
             "\"a\":\"model-00001-of-00002.safetensors\",\"c\":\"model-00002-of-00002.safetensors\","
             "\"b\":\"model-00001-of-00002.safetensors\",\"d\":\"model-00002-of-00002.safetensors\"}}");
  dg_safetensors *st = NULL;
  assert_dg_ok(dg_st_open_dir(dir, &st));
  assert_int_equal(dg_st_count(st), 5); /* "extra" is in a shard, not in weight_map: kept */
  static const char *order[] = {"b", "a", "c", "d", "extra"}; /* shard 1 then 2, offset order */
  for (int i = 0; i < 5; i++) {
    const dg_tensor *t = dg_st_at(st, (size_t)i);
    assert_string_equal(t->name, order[i]);
    assert_ptr_equal(dg_st_find(st, order[i]), t);
    assert_int_equal(t->dtype, DG_F32);
    assert_int_equal(t->nbytes, 8);
    const float *f = t->data;
    assert_true(f[0] == (float)order[i][0]);
    assert_true(f[1] == (float)(i < 2 ? i : i - 2));
    assert_non_null(strstr(t->file, i < 2 ? "model-00001-of-00002" : "model-00002-of-00002"));
  }
  /* __metadata__ of the first shard (by file name). */
  assert_string_equal(dg_st_metadata(st, "shard"), "model-00001-of-00002.safetensors");
  dg_st_close(st);

  /* A trailing slash on the directory is fine. */
  char dir2[520];
  FMT(dir2, "%s/", dir);
  assert_dg_ok(dg_st_open_dir(dir2, &st));
  assert_int_equal(dg_st_count(st), 5);
  dg_st_close(st);
}

/* ------------------------------------------------------------------------- */
/* Broken single files                                                       */
/* ------------------------------------------------------------------------- */

#define T_F32_1 "{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}"

typedef struct bad_file {
  const char *what;
  const char *header;     /* JSON header text */
  size_t hlen;            /* its length in bytes; 0 = strlen (set when it holds a NUL) */
  long long len_field;    /* header length to write; -1 = strlen(header) */
  size_t data_len;        /* data bytes after the header */
  dg_status want;
  const char *needle;     /* the tensor or field the message must name */
  const char *needle2;    /* and optionally the bad value / fault (NULL = none) */
} bad_file;

static const bad_file bad_files[] = {
  {"header length past EOF", "{}", 0, 1000, 0, DG_ERR_SAFETENSORS, "header length", "1000"},
  {"header length 0", "{}", 0, 0, 0, DG_ERR_SAFETENSORS, "header length", "0"},
  {"header length absurd", "{}", 0, 200000000, 0, DG_ERR_SAFETENSORS, "header length", "200000000"},
  {"non-JSON header", "{\"w\":{\"dtype\":\"F32\",", 0, -1, 0, DG_ERR_JSON, "header", "JSON"},
  {"header is a JSON array", "[1,2]", 0, -1, 0, DG_ERR_SAFETENSORS, "header", "object"},
  {"header starts with a space", " {}", 0, -1, 0, DG_ERR_SAFETENSORS, "header", "'{'"},
  {"header not UTF-8", "{\"w\xff\":" T_F32_1 "}", 0, -1, 4, DG_ERR_SAFETENSORS, "header", "UTF-8"},
  {"trailing bytes after the JSON", "{} x", 0, -1, 0, DG_ERR_SAFETENSORS, "header", "0x78"},
  {"control byte as whitespace", "{\x01}", 0, -1, 0, DG_ERR_SAFETENSORS, "header", "0x01"},
  {"leading zero in an ignored field", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"x\":01}}",
   0, -1, 4, DG_ERR_SAFETENSORS, "\"w\"", "not a valid JSON number"},
  {"NUL padding", "{}\0", 3, -1, 0, DG_ERR_SAFETENSORS, "header", "0x00"},
  {"entry not an object", "{\"w\":[0,4]}", 0, -1, 4, DG_ERR_SAFETENSORS, "\"w\"", "not an object"},
  {"unknown dtype", "{\"w\":{\"dtype\":\"F8_E4M3\",\"shape\":[1],\"data_offsets\":[0,1]}}", 0, -1, 1,
   DG_ERR_TENSOR_DTYPE, "\"w\"", "F8_E4M3"},
  {"missing dtype", "{\"w\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 0, -1, 4, DG_ERR_TENSOR_DTYPE, "\"w\"", "dtype"},
  {"dtype not a string", "{\"w\":{\"dtype\":4,\"shape\":[1],\"data_offsets\":[0,4]}}", 0, -1, 4,
   DG_ERR_TENSOR_DTYPE, "\"w\"", "dtype"},
  {"lowercase dtype", "{\"w\":{\"dtype\":\"f32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, -1, 4,
   DG_ERR_TENSOR_DTYPE, "\"w\"", "\"f32\""},
  {"negative shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,4]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "shape[0] = -2"},
  {"fractional shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.5],\"data_offsets\":[0,10]}}", 0, -1, 10,
   DG_ERR_SAFETENSORS, "\"w\"", "shape"},
  {"integral float shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "shape"},
  {"leading-zero shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[01],\"data_offsets\":[0,4]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "shape"},
  {"exponent offset", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4e0]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "data_offsets"},
  {"shape not an array", "{\"w\":{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "shape"},
  {"shape element not a number", "{\"w\":{\"dtype\":\"F32\",\"shape\":[null],\"data_offsets\":[0,4]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "shape[0]"},
  {"nine dims", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "9 dims"},
  {"missing shape", "{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 0, -1, 4, DG_ERR_SAFETENSORS, "\"w\"", "shape"},
  {"missing data_offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "data_offsets"},
  {"three offsets", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "data_offsets"},
  {"negative offset", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "data_offsets[0]"},
  {"offsets reversed", "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "[4, 0]"},
  {"offsets past end", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "past the data region"},
  {"offset 2^53", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,9007199254740993]}}", 0, -1, 1,
   DG_ERR_SAFETENSORS, "\"w\"", "data_offsets[1]"},
  {"size mismatch", "{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 0, -1, 8,
   DG_ERR_SAFETENSORS, "\"w\"", "needs 12"},
  {"size overflow", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0, -1, 0,
   DG_ERR_SAFETENSORS, "\"w\"", "overflows"},
  {"overlap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
              "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 0, -1, 12,
   DG_ERR_SAFETENSORS, "\"b\"", "overlap"},
  {"same offsets twice", "{\"a\":" T_F32_1 ",\"b\":" T_F32_1 "}", 0, -1, 4, DG_ERR_SAFETENSORS, "data_offsets", "overlap"},
  {"gap", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
          "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", 0, -1, 12,
   DG_ERR_SAFETENSORS, "\"b\"", "gap"},
  {"gap at start", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, -1, 8,
   DG_ERR_SAFETENSORS, "\"a\"", "gap"},
  {"uncovered trailing data", "{\"a\":" T_F32_1 "}", 0, -1, 8, DG_ERR_SAFETENSORS, "\"a\"", "not covered"},
  {"data but no tensors", "{}", 0, -1, 8, DG_ERR_SAFETENSORS, "data_offsets", "8 bytes"},
  {"duplicate name", "{\"w\":" T_F32_1 ",\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 0, -1, 8,
   DG_ERR_SAFETENSORS, "\"w\"", "twice"},
  {"duplicate field", "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 0, -1, 4,
   DG_ERR_SAFETENSORS, "\"w\"", "dtype"},
  {"metadata with a non-string value", "{\"__metadata__\":{\"format\":\"pt\",\"step\":1}}", 0, -1, 0,
   DG_ERR_SAFETENSORS, "__metadata__", "\"step\""},
  {"metadata not an object", "{\"__metadata__\":[\"pt\"]}", 0, -1, 0, DG_ERR_SAFETENSORS, "__metadata__", "an array"},
  {"metadata twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, -1, 0, DG_ERR_SAFETENSORS, "__metadata__", "twice"},
  {"metadata key twice", "{\"__metadata__\":{\"k\":\"a\",\"k\":\"b\"}}", 0, -1, 0, DG_ERR_SAFETENSORS, "__metadata__", "\"k\""},
  {"\\u0000 in a name", "{\"a\\u0000b\":" T_F32_1 "}", 0, -1, 4, DG_ERR_SAFETENSORS, "\\u0000", NULL},
  {"raw control char in a name", "{\"a\tb\":" T_F32_1 "}", 0, -1, 4, DG_ERR_SAFETENSORS, "control character", "0x09"},
};

static void test_bad_files(void **state) {
  (void)state;
  /* Truncated files: shorter than the 8-byte length field. */
  for (size_t len = 0; len < 8; len++) {
    char name[64];
    FMT(name, "trunc_%zu.safetensors", len);
    const char *path = tmp_path(name);
    write_bytes(path, "\x08\0\0\0\0\0\0\0", len);
    dg_safetensors *st = (dg_safetensors *)(uintptr_t)1;
    assert_int_equal(dg_st_open_file(path, &st), DG_ERR_SAFETENSORS);
    assert_null(st);
    assert_err_has(name);
    assert_err_has("header length");
  }
  for (size_t c = 0; c < sizeof bad_files / sizeof bad_files[0]; c++) {
    const bad_file *b = &bad_files[c];
    char name[64];
    FMT(name, "bad_%02zu.safetensors", c);
    const char *path = tmp_path(name);
    write_st_n(path, b->header, b->hlen, b->len_field, b->data_len);
    dg_safetensors *st = NULL;
    dg_status rc = dg_st_open_file(path, &st);
    if (rc != b->want)
      fail_msg("case \"%s\": got %s, want %s (%s)", b->what, dg_status_str(rc), dg_status_str(b->want),
               dg_last_error());
    assert_null(st);
    if (!strstr(dg_last_error(), name) || !strstr(dg_last_error(), b->needle) ||
        (b->needle2 && !strstr(dg_last_error(), b->needle2)))
      fail_msg("case \"%s\": message \"%s\" lacks \"%s\", \"%s\" or \"%s\"", b->what, dg_last_error(), name,
               b->needle, b->needle2 ? b->needle2 : "");
  }
  /* Not a file at all. */
  dg_safetensors *st = NULL;
  assert_int_equal(dg_st_open_file(tmp_path("nope.safetensors"), &st), DG_ERR_NOT_FOUND);
  assert_err_has("nope.safetensors");
  assert_int_equal(dg_st_open_file(g_tmp, &st), DG_ERR_IO);
  assert_err_has(g_tmp);
  assert_int_equal(dg_st_open_file(NULL, &st), DG_ERR_INVALID_ARG);
  assert_int_equal(dg_st_open_file("x", NULL), DG_ERR_INVALID_ARG);
}

/* ------------------------------------------------------------------------- */
/* Broken model directories                                                  */
/* ------------------------------------------------------------------------- */

#define S1 "model-00001-of-00002.safetensors"
#define S2 "model-00002-of-00002.safetensors"

typedef struct bad_dir {
  const char *what;
  const char *index;        /* model.safetensors.index.json text (NULL: none) */
  const char *shard[2];     /* shard files to create (NULL: none) ... */
  const char *tensors[2];   /* ... holding F32 [2] tensors with these names */
  const char *raw_shard;    /* if set: a file S1 with this (broken) header instead */
  dg_status want;
  const char *needle;       /* the file the message must name */
  const char *needle2;      /* the tensor or field it must name */
} bad_dir;

static const bad_dir bad_dirs[] = {
  {"neither file", NULL, {NULL, NULL}, {NULL, NULL}, NULL, DG_ERR_NOT_FOUND, "model.safetensors", "index.json"},
  {"index not JSON", "{\"weight_map\":{", {S1, NULL}, {"a", NULL}, NULL, DG_ERR_JSON,
   "model.safetensors.index.json", "JSON"},
  {"index is an array", "[]", {NULL, NULL}, {NULL, NULL}, NULL, DG_ERR_JSON, "model.safetensors.index.json", "object"},
  {"no weight_map", "{\"metadata\":{}}", {S1, NULL}, {"a", NULL}, NULL, DG_ERR_CONFIG,
   "model.safetensors.index.json", "weight_map"},
  {"weight_map not an object", "{\"weight_map\":[\"" S1 "\"]}", {S1, NULL}, {"a", NULL}, NULL, DG_ERR_CONFIG,
   "model.safetensors.index.json", "weight_map"},
  {"weight_map value not a string", "{\"weight_map\":{\"a\":1}}", {S1, NULL}, {"a", NULL}, NULL, DG_ERR_CONFIG,
   "model.safetensors.index.json", "weight_map[\"a\"]"},
  {"tensor listed twice", "{\"weight_map\":{\"a\":\"" S1 "\",\"a\":\"" S1 "\"}}", {S1, NULL}, {"a", NULL}, NULL,
   DG_ERR_CONFIG, "model.safetensors.index.json", "\"a\""},
  {"shard missing", "{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"" S2 "\"}}", {S1, NULL}, {"a", NULL}, NULL,
   DG_ERR_NOT_FOUND, S2, "shard"},
  {"tensor missing from its shard", "{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"" S1 "\"}}", {S1, NULL}, {"a", NULL},
   NULL, DG_ERR_TENSOR_MISSING, S1, "\"b\""},
  {"tensor in another shard", "{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"" S1 "\",\"c\":\"" S2 "\"}}",
   {S1, S2}, {"a", "b,c"}, NULL, DG_ERR_TENSOR_MISSING, S1, "\"b\""},
  {"tensor in two shards", "{\"weight_map\":{\"a\":\"" S1 "\",\"b\":\"" S2 "\"}}", {S1, S2}, {"a,x", "b,x"}, NULL,
   DG_ERR_SAFETENSORS, S2, "\"x\""},
  {"path traversal", "{\"weight_map\":{\"a\":\"../evil.safetensors\"}}", {S1, NULL}, {"a", NULL}, NULL,
   DG_ERR_CONFIG, "model.safetensors.index.json", "../evil.safetensors"},
  {"absolute shard path", "{\"weight_map\":{\"a\":\"/etc/passwd\"}}", {S1, NULL}, {"a", NULL}, NULL,
   DG_ERR_CONFIG, "model.safetensors.index.json", "/etc/passwd"},
  {"subdirectory shard", "{\"weight_map\":{\"a\":\"sub/x.safetensors\"}}", {S1, NULL}, {"a", NULL}, NULL,
   DG_ERR_CONFIG, "model.safetensors.index.json", "sub/x.safetensors"},
  {"shard name \"..\"", "{\"weight_map\":{\"a\":\"..\"}}", {S1, NULL}, {"a", NULL}, NULL,
   DG_ERR_CONFIG, "model.safetensors.index.json", "\"..\""},
  {"empty shard name", "{\"weight_map\":{\"a\":\"\"}}", {S1, NULL}, {"a", NULL}, NULL,
   DG_ERR_CONFIG, "model.safetensors.index.json", "weight_map[\"a\"]"},
  {"empty weight_map (found by fuzz/fuzz_st_index)", "{\"weight_map\": {}}", {S1, NULL}, {"a", NULL}, NULL,
   DG_ERR_CONFIG, "model.safetensors.index.json", "\"weight_map\" is empty"},
  /* review rev16: cJSON took the first value of a repeated key and ignored what follows the object; Python's
   * json.load (Transformers) keeps the last and refuses a second value */
  {"index with trailing data", "{\"weight_map\":{\"a\":\"" S1 "\"}}\n{\"weight_map\":{}}", {S1, NULL}, {"a", NULL}, NULL,
   DG_ERR_JSON, "model.safetensors.index.json", "trailing data after the JSON value at byte 56"},
  {"weight_map twice", "{\"weight_map\":{\"a\":\"" S1 "\"},\"weight_map\":{\"b\":\"" S1 "\"}}", {S1, NULL}, {"a", NULL},
   NULL, DG_ERR_JSON, "model.safetensors.index.json", "key \"weight_map\" appears twice"},
  {"broken shard", "{\"weight_map\":{\"w\":\"" S1 "\"}}", {NULL, NULL}, {NULL, NULL},
   "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", DG_ERR_SAFETENSORS, S1, "\"w\""},
};

static void test_bad_dirs(void **state) {
  (void)state;
  for (size_t c = 0; c < sizeof bad_dirs / sizeof bad_dirs[0]; c++) {
    const bad_dir *b = &bad_dirs[c];
    char dir[512];
    FMT(dir, "%s/dir_%02zu", g_tmp, c);
    assert_int_equal(mkdir(dir, 0755), 0);
    if (b->index) write_text(dir, "model.safetensors.index.json", b->index);
    for (int s = 0; s < 2; s++)
      if (b->shard[s]) write_shard(dir, b->shard[s], b->tensors[s]);
    if (b->raw_shard) {
      char path[600];
      FMT(path, "%s/%s", dir, S1);
      write_st(path, b->raw_shard, -1, 4);
    }
    dg_safetensors *st = (dg_safetensors *)(uintptr_t)1;
    dg_status rc = dg_st_open_dir(dir, &st);
    if (rc != b->want)
      fail_msg("case \"%s\": got %s, want %s (%s)", b->what, dg_status_str(rc), dg_status_str(b->want),
               dg_last_error());
    assert_null(st);
    if (!strstr(dg_last_error(), b->needle) || !strstr(dg_last_error(), b->needle2))
      fail_msg("case \"%s\": message \"%s\" lacks \"%s\" or \"%s\"", b->what, dg_last_error(), b->needle,
               b->needle2);
  }
  /* A directory that does not exist. */
  dg_safetensors *st = NULL;
  assert_int_equal(dg_st_open_dir(tmp_path("no_such_dir"), &st), DG_ERR_NOT_FOUND);
  assert_err_has("no_such_dir");
  assert_int_equal(dg_st_open_dir(NULL, &st), DG_ERR_INVALID_ARG);
}

/* ------------------------------------------------------------------------- */
/* Writer argument errors                                                    */
/* ------------------------------------------------------------------------- */

static void test_write_errors(void **state) {
  (void)state;
  const float v[4] = {1, 2, 3, 4};
  const char *path = tmp_path("w.safetensors");
  dg_tensor ok = {.name = "w", .dtype = DG_F32, .ndim = 2, .shape = {2, 2}, .data = v, .nbytes = sizeof v};
  struct { const char *what; dg_tensor t[2]; size_t n; const char *needle; } cases[] = {
    {"nbytes mismatch", {{.name = "w", .dtype = DG_F32, .ndim = 1, .shape = {3}, .data = v, .nbytes = 16}}, 1, "nbytes"},
    {"bad dtype", {{.name = "w", .dtype = DG_DTYPE_COUNT, .ndim = 1, .shape = {4}, .data = v, .nbytes = 16}}, 1, "dtype"},
    {"ndim 9", {{.name = "w", .dtype = DG_U8, .ndim = 9, .data = v, .nbytes = 1}}, 1, "ndim"},
    {"negative dim", {{.name = "w", .dtype = DG_U8, .ndim = 1, .shape = {-1}, .data = v, .nbytes = 0}}, 1, "shape[0]"},
    {"NULL data", {{.name = "w", .dtype = DG_F32, .ndim = 1, .shape = {4}, .data = NULL, .nbytes = 16}}, 1, "data"},
    {"NULL name", {{.name = NULL, .dtype = DG_F32, .ndim = 0, .data = v, .nbytes = 4}}, 1, "name"},
    {"reserved name", {{.name = "__metadata__", .dtype = DG_F32, .ndim = 0, .data = v, .nbytes = 4}}, 1, "__metadata__"},
    {"bad UTF-8 name", {{.name = "w\xc0\xaf", .dtype = DG_F32, .ndim = 0, .data = v, .nbytes = 4}}, 1, "UTF-8"},
    {"duplicate", {ok, ok}, 2, "twice"},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    dg_status rc = dg_st_write(path, cases[c].t, cases[c].n, NULL, NULL, 0);
    if (rc != DG_ERR_INVALID_ARG) fail_msg("case \"%s\": got %s", cases[c].what, dg_status_str(rc));
    assert_err_has("w.safetensors");
    assert_err_has(cases[c].needle);
  }
  const char *k2[] = {"k", "k"}, *v2[] = {"a", "b"};
  assert_int_equal(dg_st_write(path, &ok, 1, k2, v2, 2), DG_ERR_INVALID_ARG);
  assert_err_has("\"k\"");
  assert_int_equal(dg_st_write(path, &ok, 1, NULL, NULL, 1), DG_ERR_INVALID_ARG);
  assert_err_has("__metadata__");
  assert_int_equal(dg_st_write(tmp_path("no_dir/w.safetensors"), &ok, 1, NULL, NULL, 0), DG_ERR_IO);
  assert_err_has("no_dir/w.safetensors");
  assert_int_equal(dg_st_write(NULL, &ok, 1, NULL, NULL, 0), DG_ERR_INVALID_ARG);
  /* Nothing was left behind by the failed writes. */
  assert_int_equal(access(path, F_OK), -1);
  /* And the good tensor writes. */
  assert_dg_ok(dg_st_write(path, &ok, 1, NULL, NULL, 0));
}

int main(void) {
  const struct CMUnitTest tests[] = {
    cmocka_unit_test(test_dtypes),
    cmocka_unit_test_setup_teardown(test_roundtrip_all_dtypes, setup_tmp, teardown_tmp),
    cmocka_unit_test_setup_teardown(test_roundtrip_empty, setup_tmp, teardown_tmp),
    cmocka_unit_test_setup_teardown(test_drop_pages, setup_tmp, teardown_tmp),
    cmocka_unit_test_setup_teardown(test_reference_bytes, setup_tmp, teardown_tmp),
    cmocka_unit_test_setup_teardown(test_valid_edge_cases, setup_tmp, teardown_tmp),
    cmocka_unit_test_setup_teardown(test_sharded, setup_tmp, teardown_tmp),
    cmocka_unit_test_setup_teardown(test_bad_files, setup_tmp, teardown_tmp),
    cmocka_unit_test_setup_teardown(test_bad_dirs, setup_tmp, teardown_tmp),
    cmocka_unit_test_setup_teardown(test_write_errors, setup_tmp, teardown_tmp),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
