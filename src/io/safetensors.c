/* safetensors.c: strict mmap-based safetensors reader and a small writer.
 *
 * Reading a file, in order:
 *   1. open + fstat + mmap(PROT_READ, MAP_PRIVATE) the whole file;
 *   2. read the u64 header length N and copy the N header bytes out;
 *   3. check the header bytes ourselves (UTF-8, leading '{', plain-integer
 *      numbers, no control characters) where cJSON is more lenient than the
 *      reference serde_json parser;
 *   4. parse it with cJSON and check every entry (dtype, shape, offsets);
 *   5. sort the tensors by offset and check that they tile the data region.
 * The data region itself is never touched, only mapped. The rules follow the
 * reference Rust library (huggingface/safetensors, Metadata::validate); see
 * safetensors.h for the full list.
 *
 * A sharded checkpoint is the same thing repeated per shard, followed by the
 * cross-checks against model.safetensors.index.json.
 *
 * Not handled: big-endian hosts (the format is little-endian and so are all
 * our targets), files that shrink while mapped (SIGBUS, as with any mmap).
 */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "base/dg_error.h"
#include "base/dg_io.h"
#include "base/dg_json.h"

#define ST_MAX_HEADER 100000000ull     /* same limit as the reference library */
#define ST_MAX_INDEX  100000000ull     /* cap for model.safetensors.index.json */
#define ST_MAX_INT    9007199254740992.0 /* 2^53: doubles are exact below this */
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

/* ------------------------------------------------------------------------- */
/* The container object                                                      */
/* ------------------------------------------------------------------------- */

typedef struct st_file {
  char *path;             /* as opened (dir + "/" + shard for sharded models) */
  const uint8_t *map;     /* [size] read-only mapping of the whole file (or the
                           * caller's buffer, dg_st_open_memory) */
  size_t size;            /* file size in bytes */
  int mapped;             /* 1: map is ours to munmap */
  char **meta_keys;       /* [n_meta] __metadata__ keys, in header order */
  char **meta_vals;       /* [n_meta] their values */
  size_t n_meta;
} st_file;

typedef struct st_name_ix { const char *name; size_t i; } st_name_ix;

struct dg_safetensors {
  st_file *files;         /* [n_files] */
  size_t n_files, cap_files;
  dg_tensor *tensors;     /* [n_tensors] file by file, each in offset order */
  size_t n_tensors, cap_tensors;
  st_name_ix *by_name;    /* [n_tensors] (name, index into tensors), sorted by name */
};

static void st_free_strings(char **s, size_t n) {
  if (!s) return;
  for (size_t i = 0; i < n; i++) free(s[i]);
  free(s);
}

void dg_st_close(dg_safetensors *st) {
  if (!st) return;
  for (size_t i = 0; i < st->n_files; i++) {
    st_file *f = &st->files[i];
    if (f->map && f->mapped) munmap((void *)f->map, f->size);
    st_free_strings(f->meta_keys, f->n_meta);
    st_free_strings(f->meta_vals, f->n_meta);
    free(f->path);
  }
  for (size_t i = 0; i < st->n_tensors; i++) free((char *)st->tensors[i].name);
  free(st->files);
  free(st->tensors);
  free(st->by_name);
  free(st);
}

size_t dg_st_count(const dg_safetensors *st) { return st ? st->n_tensors : 0; }

const dg_tensor *dg_st_at(const dg_safetensors *st, size_t i) {
  return (st && i < st->n_tensors) ? &st->tensors[i] : NULL;
}

const dg_tensor *dg_st_find(const dg_safetensors *st, const char *name) {
  if (!st || !name || !st->by_name) return NULL;
  size_t lo = 0, hi = st->n_tensors; /* binary search over by_name[lo, hi) */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int c = strcmp(name, st->by_name[mid].name);
    if (c == 0) return &st->tensors[st->by_name[mid].i];
    if (c < 0) hi = mid;
    else lo = mid + 1;
  }
  return NULL;
}

size_t dg_st_drop_pages(const dg_safetensors *st, const void *p, size_t n) {
  if (!st || !p || !n) return 0;
  const uintptr_t a = (uintptr_t)p, pg = (uintptr_t)sysconf(_SC_PAGESIZE);
  for (size_t i = 0; i < st->n_files; i++) {
    const st_file *f = &st->files[i];
    const uintptr_t m = (uintptr_t)f->map;
    if (!f->mapped || a < m || a - m > f->size || n > f->size - (a - m)) continue;
    const uintptr_t lo = (a + pg - 1) / pg * pg, hi = (a + n) / pg * pg; /* whole pages inside */
    if (hi <= lo || madvise((void *)lo, hi - lo, MADV_DONTNEED)) return 0;
    return hi - lo;
  }
  return 0;
}

const char *dg_st_metadata(const dg_safetensors *st, const char *key) {
  if (!st || !key || st->n_files == 0) return NULL;
  const st_file *f = &st->files[0];
  for (size_t i = 0; i < f->n_meta; i++)
    if (strcmp(f->meta_keys[i], key) == 0) return f->meta_vals[i];
  return NULL;
}

/* ------------------------------------------------------------------------- */
/* Small helpers                                                             */
/* ------------------------------------------------------------------------- */

/* 1 if s[0..n) is valid UTF-8 (no overlongs, surrogates or > U+10FFFF, as
 * Rust's str::from_utf8); else 0 and *bad = offset of the first bad byte. */
static int st_utf8_valid(const uint8_t *s, size_t n, size_t *bad) {
  size_t i = 0;
  while (i < n) {
    uint8_t c = s[i];
    size_t len;
    uint32_t cp, min;
    if (c < 0x80) { i++; continue; }
    else if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else { *bad = i; return 0; }
    if (n - i < len) { *bad = i; return 0; }
    for (size_t k = 1; k < len; k++) {
      if ((s[i + k] & 0xC0) != 0x80) { *bad = i; return 0; }
      cp = (cp << 6) | (s[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { *bad = i; return 0; }
    i += len;
  }
  return 1;
}

static int st_is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }


/* Read a JSON number that must be an integer in [0, 2^53). Returns NULL and
 * sets *out if fine, else a short description of what is wrong. */
static const char *st_get_uint(const cJSON *v, uint64_t *out) {
  if (!cJSON_IsNumber(v)) return "is not a number";
  double d = v->valuedouble;
  if (d != d) return "is not a number";
  if (d < 0) return "is negative";
  if (d >= ST_MAX_INT) return "is 2^53 or larger";
  if ((double)(uint64_t)d != d) return "is not an integer"; /* cast is exact: 0 <= d < 2^53 */
  *out = (uint64_t)d;
  return NULL;
}

/* "[2, 3]" into buf (cut short if it does not fit; 256 bytes hold 8 dims). */
static const char *st_fmt_shape(char *buf, size_t cap, const int64_t *shape, int ndim) {
  size_t n = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && n < cap; i++)
    n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", (long long)shape[i]);
  if (n < cap) snprintf(buf + n, cap - n, "]");
  return buf;
}

/* *out = element count * dtype size of a shape. Returns 0 on u64 overflow. */
static int st_nbytes(const int64_t *shape, int ndim, size_t esize, uint64_t *out) {
  uint64_t n = esize;
  for (int i = 0; i < ndim; i++) {
    uint64_t d = (uint64_t)shape[i];
    if (d != 0 && n > UINT64_MAX / d) return 0;
    n *= d;
  }
  *out = n;
  return 1;
}

static char *st_join(const char *dir, const char *name) {
  size_t ld = strlen(dir), ln = strlen(name);
  int slash = ld > 0 && dir[ld - 1] != '/';
  char *p = malloc(ld + (size_t)slash + ln + 1);
  if (!p) return NULL;
  memcpy(p, dir, ld);
  if (slash) p[ld] = '/';
  memcpy(p + ld + (size_t)slash, name, ln + 1);
  return p;
}

static dg_status st_oom(const char *what) {
  return dg_seterr(DG_ERR_OUT_OF_MEMORY, "%s: out of memory", what);
}

/* Map an errno from open() to a status + message. */
static dg_status st_open_err(const char *path, int err) {
  if (err == ENOENT || err == ENOTDIR)
    return dg_seterr(DG_ERR_NOT_FOUND, "%s: no such file", path);
  return dg_seterr(DG_ERR_IO, "%s: cannot open: %s", path, strerror(err));
}

/* ------------------------------------------------------------------------- */
/* Header checks that cJSON does not do                                      */
/* ------------------------------------------------------------------------- */

/* Classify the JSON number token s[0..n): 1 = integer -?(0|[1-9][0-9]*),
 * 2 = valid JSON number with a fraction or exponent, 0 = not valid JSON
 * (leading zeros, "1.", "-", "1e"; cJSON's strtod accepts some of these). */
static int st_number_kind(const char *s, size_t n) {
  size_t i = 0, d;
  if (i < n && s[i] == '-') i++;
  if (i >= n || s[i] < '0' || s[i] > '9') return 0;
  if (s[i] == '0') i++;
  else while (i < n && s[i] >= '0' && s[i] <= '9') i++;
  if (i == n) return 1;
  if (s[i] == '.') {
    for (d = ++i; i < n && s[i] >= '0' && s[i] <= '9';) i++;
    if (i == d) return 0;
  }
  if (i < n && (s[i] == 'e' || s[i] == 'E')) {
    i++;
    if (i < n && (s[i] == '+' || s[i] == '-')) i++;
    for (d = i; i < n && s[i] >= '0' && s[i] <= '9';) i++;
    if (i == d) return 0;
  }
  return i == n ? 2 : 0;
}

/* Walk the raw header text s[0..n) (already accepted by cJSON) and enforce
 * what serde_json enforces and cJSON does not: no raw control characters or
 * \u0000 inside strings, only space/tab/CR/LF between tokens, no leading
 * zeros; and, as serde does for its usize fields, numbers inside "shape" and
 * "data_offsets" written as plain integers -?(0|[1-9][0-9]*) (cJSON would give
 * us 5.0 == 5). Errors name the enclosing tensor and field: the last object
 * keys seen at depth 1 and 2. */
static dg_status st_scan_header(const char *path, const char *s, size_t n) {
  int depth = 0;
  const char *k1 = "", *k2 = ""; /* last keys at depth 1 (tensor) and 2 (field) */
  int k1n = 0, k2n = 0;
  size_t i = 0;
  while (i < n) {
    unsigned char c = (unsigned char)s[i];
    if (c == '"') {
      size_t start = ++i;
      while (i < n && s[i] != '"') {
        unsigned char d = (unsigned char)s[i];
        if (d < 0x20)
          return dg_seterr(DG_ERR_SAFETENSORS,
                           "%s: header: tensor \"%.*s\": raw control character 0x%02x in a string at byte %zu",
                           path, k1n, k1, d, i);
        if (d == '\\') {
          if (i + 5 < n && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0)
            return dg_seterr(DG_ERR_SAFETENSORS,
                             "%s: header: tensor \"%.*s\": \\u0000 in a string at byte %zu",
                             path, k1n, k1, i);
          i++; /* skip the escaped character (cJSON validated the escape) */
        }
        i++;
      }
      if (i >= n)
        return dg_seterr(DG_ERR_SAFETENSORS, "%s: header: unterminated string at byte %zu", path, start - 1);
      size_t len = i - start;
      i++; /* closing quote */
      size_t j = i;
      while (j < n && st_is_ws((unsigned char)s[j])) j++;
      if (j < n && s[j] == ':' && len <= (size_t)INT32_MAX) { /* it was a key */
        if (depth == 1) { k1 = s + start; k1n = (int)len; k2 = ""; k2n = 0; }
        else if (depth == 2) { k2 = s + start; k2n = (int)len; }
      }
      continue;
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
      size_t start = i;
      while (i < n && s[i] && strchr("0123456789+-.eE", s[i])) i++;
      int len = (int)(i - start < 64 ? i - start : 64); /* for messages */
      int kind = st_number_kind(s + start, i - start);
      /* Only shape and data_offsets hold numbers we read; fields we ignore may
       * hold any JSON number, as with the reference. */
      int ours = depth >= 3 && ((k2n == 5 && memcmp(k2, "shape", 5) == 0) ||
                                (k2n == 12 && memcmp(k2, "data_offsets", 12) == 0));
      if (kind == 0)
        return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%.*s\": field \"%.*s\": %.*s is not a valid JSON number",
                         path, k1n, k1, k2n, k2, len, s + start);
      if (kind == 2 && ours)
        return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%.*s\": field \"%.*s\": number %.*s is not a plain integer",
                         path, k1n, k1, k2n, k2, len, s + start);
      continue;
    }
    if (c == '{' || c == '[') depth++;
    else if (c == '}' || c == ']') depth--;
    else if (c == ',' || c == ':' || st_is_ws(c) || (c >= 'a' && c <= 'z')) { /* true/false/null */ }
    else
      return dg_seterr(DG_ERR_SAFETENSORS, "%s: header: unexpected byte 0x%02x at byte %zu", path, c, i);
    i++;
  }
  return DG_OK;
}

/* ------------------------------------------------------------------------- */
/* One file                                                                  */
/* ------------------------------------------------------------------------- */

static dg_status st_parse_metadata(st_file *f, const cJSON *meta) {
  if (cJSON_IsNull(meta)) return DG_OK; /* the reference accepts null */
  if (!cJSON_IsObject(meta))
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: \"__metadata__\" is %s, not an object of strings",
                     f->path, dg_json_kind(meta));
  size_t n = (size_t)cJSON_GetArraySize(meta);
  f->meta_keys = calloc(n ? n : 1, sizeof(char *));
  f->meta_vals = calloc(n ? n : 1, sizeof(char *));
  if (!f->meta_keys || !f->meta_vals) return st_oom(f->path);
  const cJSON *kv;
  cJSON_ArrayForEach(kv, meta) {
    if (!cJSON_IsString(kv))
      return dg_seterr(DG_ERR_SAFETENSORS, "%s: \"__metadata__\" key \"%s\": value is %s, not a string",
                       f->path, kv->string, dg_json_kind(kv));
    for (size_t i = 0; i < f->n_meta; i++)
      if (strcmp(f->meta_keys[i], kv->string) == 0)
        return dg_seterr(DG_ERR_SAFETENSORS, "%s: \"__metadata__\" key \"%s\" appears twice",
                         f->path, kv->string);
    char *k = strdup(kv->string), *v = strdup(kv->valuestring);
    if (!k || !v) { free(k); free(v); return st_oom(f->path); }
    f->meta_keys[f->n_meta] = k;
    f->meta_vals[f->n_meta] = v;
    f->n_meta++;
  }
  return DG_OK;
}

/* Validate one tensor entry and fill *t (name not set). data_size: bytes in
 * the file's data region; data: its first byte. */
static dg_status st_parse_entry(const char *path, const cJSON *e, const uint8_t *data,
                                uint64_t data_size, dg_tensor *t) {
  const char *name = e->string;
  if (!cJSON_IsObject(e))
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": entry is %s, not an object",
                     path, name, dg_json_kind(e));

  /* Pick the three fields; a repeated one is an error (serde rejects it too),
   * unknown ones are ignored (as the reference does). */
  const cJSON *dtype = NULL, *shape = NULL, *offs = NULL, *c;
  cJSON_ArrayForEach(c, e) {
    const cJSON **slot = strcmp(c->string, "dtype") == 0 ? &dtype
                       : strcmp(c->string, "shape") == 0 ? &shape
                       : strcmp(c->string, "data_offsets") == 0 ? &offs : NULL;
    if (!slot) continue;
    if (*slot)
      return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": field \"%s\" appears twice",
                       path, name, c->string);
    *slot = c;
  }

  /* dtype */
  if (!dtype)
    return dg_seterr(DG_ERR_TENSOR_DTYPE, "%s: tensor \"%s\": field \"dtype\" missing", path, name);
  if (!cJSON_IsString(dtype))
    return dg_seterr(DG_ERR_TENSOR_DTYPE, "%s: tensor \"%s\": field \"dtype\" is %s, not a string",
                     path, name, dg_json_kind(dtype));
  if (!dg_dtype_parse(dtype->valuestring, &t->dtype))
    return dg_seterr(DG_ERR_TENSOR_DTYPE, "%s: tensor \"%s\": dtype \"%s\" is not supported",
                     path, name, dtype->valuestring);

  /* shape */
  if (!shape)
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": field \"shape\" missing", path, name);
  if (!cJSON_IsArray(shape))
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": field \"shape\" is %s, not an array",
                     path, name, dg_json_kind(shape));
  int ndim = cJSON_GetArraySize(shape);
  if (ndim > DG_MAX_DIMS)
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": shape has %d dims (at most %d supported)",
                     path, name, ndim, DG_MAX_DIMS);
  t->ndim = 0;
  cJSON_ArrayForEach(c, shape) {
    uint64_t d = 0;
    const char *why = st_get_uint(c, &d);
    if (why) {
      if (cJSON_IsNumber(c))
        return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": shape[%d] = %.17g %s",
                         path, name, t->ndim, c->valuedouble, why);
      return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": shape[%d] is %s, not an integer",
                       path, name, t->ndim, dg_json_kind(c));
    }
    t->shape[t->ndim++] = (int64_t)d;
  }

  /* data_offsets */
  if (!offs)
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": field \"data_offsets\" missing", path, name);
  if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2)
    return dg_seterr(DG_ERR_SAFETENSORS,
                     "%s: tensor \"%s\": field \"data_offsets\" is %s of %d items, not [begin, end]",
                     path, name, dg_json_kind(offs), cJSON_IsArray(offs) ? cJSON_GetArraySize(offs) : 1);
  uint64_t be[2] = {0, 0};
  for (int i = 0; i < 2; i++) {
    c = cJSON_GetArrayItem(offs, i);
    const char *why = st_get_uint(c, &be[i]);
    if (why) {
      if (cJSON_IsNumber(c))
        return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": data_offsets[%d] = %.17g %s",
                         path, name, i, c->valuedouble, why);
      return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": data_offsets[%d] is %s, not an integer",
                       path, name, i, dg_json_kind(c));
    }
  }
  if (be[0] > be[1])
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": data_offsets [%llu, %llu] have begin > end",
                     path, name, (unsigned long long)be[0], (unsigned long long)be[1]);
  if (be[1] > data_size)
    return dg_seterr(DG_ERR_SAFETENSORS,
                     "%s: tensor \"%s\": data_offsets end %llu is past the data region (%llu bytes)",
                     path, name, (unsigned long long)be[1], (unsigned long long)data_size);

  /* size = prod(shape) * dtype size must be exactly end - begin */
  char sbuf[256];
  uint64_t nbytes = 0;
  if (!st_nbytes(t->shape, t->ndim, dg_dtype_size(t->dtype), &nbytes))
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\": shape %s x %s overflows 64 bits",
                     path, name, st_fmt_shape(sbuf, sizeof sbuf, t->shape, t->ndim),
                     dg_dtype_name(t->dtype));
  if (be[1] - be[0] != nbytes)
    return dg_seterr(DG_ERR_SAFETENSORS,
                     "%s: tensor \"%s\": data_offsets [%llu, %llu] hold %llu bytes but shape %s x %s needs %llu",
                     path, name, (unsigned long long)be[0], (unsigned long long)be[1],
                     (unsigned long long)(be[1] - be[0]), st_fmt_shape(sbuf, sizeof sbuf, t->shape, t->ndim),
                     dg_dtype_name(t->dtype), (unsigned long long)nbytes);
  t->data = data + be[0];
  t->nbytes = (size_t)nbytes;
  return DG_OK;
}

/* Order tensors by (begin, end); ties (zero-size tensors at one offset) by name. */
static int st_cmp_offset(const void *a, const void *b) {
  const dg_tensor *x = a, *y = b;
  uintptr_t bx = (uintptr_t)x->data, by = (uintptr_t)y->data;
  if (bx != by) return bx < by ? -1 : 1;
  if (x->nbytes != y->nbytes) return x->nbytes < y->nbytes ? -1 : 1;
  return strcmp(x->name, y->name);
}

static int st_cmp_name_ix(const void *a, const void *b) {
  return strcmp(((const st_name_ix *)a)->name, ((const st_name_ix *)b)->name);
}

/* (name, index) of st->tensors[from, n_tensors) sorted by name, then a check
 * for repeated names. *out is set even on a duplicate error (caller frees). */
static dg_status st_sorted_index(dg_safetensors *st, size_t from, st_name_ix **out) {
  size_t n = st->n_tensors - from;
  st_name_ix *idx = malloc((n ? n : 1) * sizeof *idx);
  *out = idx;
  if (!idx) return st_oom("safetensors index");
  for (size_t i = 0; i < n; i++) idx[i] = (st_name_ix){st->tensors[from + i].name, from + i};
  qsort(idx, n, sizeof *idx, st_cmp_name_ix);
  for (size_t i = 1; i < n; i++) {
    const dg_tensor *a = &st->tensors[idx[i - 1].i], *b = &st->tensors[idx[i].i];
    if (strcmp(a->name, b->name) != 0) continue;
    if (a->file == b->file)
      return dg_seterr(DG_ERR_SAFETENSORS, "%s: tensor \"%s\" appears twice in the header", a->file, a->name);
    return dg_seterr(DG_ERR_SAFETENSORS, "tensor \"%s\" is present in two shards: %s and %s",
                     a->name, a->file, b->file);
  }
  return DG_OK;
}

/* Append a tensor slot; returns NULL when out of memory. */
static dg_tensor *st_push_tensor(dg_safetensors *st) {
  if (st->n_tensors == st->cap_tensors) {
    size_t cap = st->cap_tensors ? 2 * st->cap_tensors : 64;
    dg_tensor *p = realloc(st->tensors, cap * sizeof *p);
    if (!p) return NULL;
    st->tensors = p;
    st->cap_tensors = cap;
  }
  dg_tensor *t = &st->tensors[st->n_tensors];
  memset(t, 0, sizeof *t);
  return t;
}

/* Check the entries of a parsed header (root, a JSON object) and append its
 * tensors to st in offset order. data: first byte of the data region. */
static dg_status st_check_entries(dg_safetensors *st, st_file *f, const cJSON *root,
                                  const uint8_t *data, uint64_t data_size) {
  const char *path = f->path;
  dg_status rc;

  /* Entries: "__metadata__" or a tensor. */
  size_t first = st->n_tensors; /* this file's tensors are [first, n_tensors) */
  int seen_meta = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, root) {
    if (strcmp(e->string, "__metadata__") == 0) {
      if (seen_meta) return dg_seterr(DG_ERR_SAFETENSORS, "%s: \"__metadata__\" appears twice", path);
      seen_meta = 1;
      DG_TRY(st_parse_metadata(f, e));
      continue;
    }
    dg_tensor *t = st_push_tensor(st);
    if (!t) return st_oom(path);
    DG_TRY(st_parse_entry(path, e, data, data_size, t));
    t->file = path;
    if (!(t->name = strdup(e->string))) return st_oom(path);
    st->n_tensors++; /* committed only when complete, so close() frees only valid names */
  }

  /* Repeated names within this file. */
  st_name_ix *idx = NULL;
  rc = st_sorted_index(st, first, &idx);
  free(idx);
  if (rc != DG_OK) return rc;

  /* Sorted by offset, the tensors must tile [0, data_size) exactly: the
   * reference rejects gaps, overlaps and uncovered trailing bytes alike. */
  size_t nt = st->n_tensors - first;
  dg_tensor *ts = nt ? st->tensors + first : NULL; /* tensors may still be NULL */
  if (nt > 1) qsort(ts, nt, sizeof *ts, st_cmp_offset);
  uint64_t cursor = 0;     /* end of the previous tensor */
  const char *prev = NULL; /* its name */
  for (size_t i = 0; i < nt; i++) {
    uint64_t b = (uint64_t)((const uint8_t *)ts[i].data - data), en = b + ts[i].nbytes;
    if (b < cursor)
      return dg_seterr(DG_ERR_SAFETENSORS,
                       "%s: tensor \"%s\": data_offsets [%llu, %llu] overlap tensor \"%s\" (which ends at %llu)",
                       path, ts[i].name, (unsigned long long)b, (unsigned long long)en, prev,
                       (unsigned long long)cursor);
    if (b > cursor && prev)
      return dg_seterr(DG_ERR_SAFETENSORS,
                       "%s: tensor \"%s\": data_offsets begin %llu leaves a %llu-byte gap after tensor \"%s\" (which ends at %llu)",
                       path, ts[i].name, (unsigned long long)b, (unsigned long long)(b - cursor), prev,
                       (unsigned long long)cursor);
    if (b > cursor)
      return dg_seterr(DG_ERR_SAFETENSORS,
                       "%s: tensor \"%s\": data_offsets begin %llu leaves a gap at the start of the data region",
                       path, ts[i].name, (unsigned long long)b);
    cursor = en;
    prev = ts[i].name;
  }
  if (cursor != data_size && prev)
    return dg_seterr(DG_ERR_SAFETENSORS,
                     "%s: tensor \"%s\": data_offsets end %llu is the last, but the data region has %llu bytes (%llu not covered by any tensor)",
                     path, prev, (unsigned long long)cursor, (unsigned long long)data_size,
                     (unsigned long long)(data_size - cursor));
  if (cursor != data_size)
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: no tensors (data_offsets), but the data region has %llu bytes",
                     path, (unsigned long long)data_size);
  return DG_OK;
}

/* Parse and validate the header of the mapped file f; appends its tensors
 * (in offset order) to st. */
static dg_status st_parse_file(dg_safetensors *st, st_file *f) {
  const char *path = f->path;
  if (f->size < 8)
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: file is %zu bytes, shorter than the 8-byte header length",
                     path, f->size);
  uint64_t n = 0; /* header length, u64 little-endian */
  for (int i = 0; i < 8; i++) n |= (uint64_t)f->map[i] << (8 * i);
  if (n == 0) return dg_seterr(DG_ERR_SAFETENSORS, "%s: header length is 0", path);
  if (n > ST_MAX_HEADER)
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: header length %llu exceeds the %llu-byte limit",
                     path, (unsigned long long)n, ST_MAX_HEADER);
  if (n > f->size - 8)
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: header length %llu is past the end of the file (%zu bytes)",
                     path, (unsigned long long)n, f->size);
  const uint8_t *hdr = f->map + 8;
  const uint8_t *data = hdr + n;               /* data region */
  uint64_t data_size = f->size - 8 - n;
  size_t bad = 0;
  if (!st_utf8_valid(hdr, (size_t)n, &bad))
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: header is not valid UTF-8 (byte 0x%02x at header offset %zu)",
                     path, hdr[bad], bad);
  if (hdr[0] != '{')
    return dg_seterr(DG_ERR_SAFETENSORS, "%s: header is not a JSON object: it does not start with '{' (first byte 0x%02x)",
                     path, hdr[0]);

  /* cJSON wants a NUL-terminated copy; the header is small next to the data. */
  char *text = malloc((size_t)n + 1);
  if (!text) return st_oom(path);
  memcpy(text, hdr, (size_t)n);
  text[n] = 0;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0);
  dg_status rc = DG_OK;
  if (!root) {
    rc = dg_seterr(DG_ERR_JSON, "%s: header is not valid JSON (error near header byte %td)",
                   path, end ? end - text : (ptrdiff_t)-1);
    goto done;
  }
  for (const char *p = end; p < text + n; p++) {
    if (!st_is_ws((unsigned char)*p)) {
      rc = dg_seterr(DG_ERR_SAFETENSORS, "%s: header: unexpected byte 0x%02x after the JSON object (header byte %td)",
                     path, (unsigned char)*p, p - text);
      goto done;
    }
  }
  if (!cJSON_IsObject(root)) { /* unreachable after the '{' check; kept as a guard */
    rc = dg_seterr(DG_ERR_SAFETENSORS, "%s: header is %s, not a JSON object", path, dg_json_kind(root));
    goto done;
  }
  if ((rc = st_scan_header(path, text, (size_t)(end - text))) != DG_OK) goto done;

  rc = st_check_entries(st, f, root, data, data_size);

done:
  cJSON_Delete(root);
  free(text);
  return rc;
}

/* Map `path` and append it (and its tensors) to st. */
static dg_status st_add_file(dg_safetensors *st, const char *path) {
  if (st->n_files == st->cap_files) {
    size_t cap = st->cap_files ? 2 * st->cap_files : 4;
    st_file *p = realloc(st->files, cap * sizeof *p);
    if (!p) return st_oom(path);
    st->files = p;
    st->cap_files = cap;
  }
  st_file *f = &st->files[st->n_files];
  memset(f, 0, sizeof *f);
  if (!(f->path = strdup(path))) return st_oom(path);
  st->n_files++; /* from here dg_st_close cleans up f */

  /* O_NONBLOCK: a FIFO with no writer is refused below, not waited on (dg_read_file likewise) */
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return st_open_err(path, errno);
  struct stat sb;
  if (fstat(fd, &sb) != 0) {
    int err = errno;
    close(fd);
    return dg_seterr(DG_ERR_IO, "%s: cannot stat: %s", path, strerror(err));
  }
  if (!S_ISREG(sb.st_mode)) {
    close(fd);
    return dg_seterr(DG_ERR_IO, "%s: not a regular file", path);
  }
#if SIZE_MAX < UINT64_MAX
  if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
    close(fd);
    return dg_seterr(DG_ERR_IO, "%s: file of %lld bytes does not fit the address space", path,
                     (long long)sb.st_size);
  }
#endif
  f->size = (size_t)sb.st_size;
  if (f->size >= 8) { /* mmap of 0 bytes fails; short files are rejected in st_parse_file */
    void *m = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      int err = errno;
      close(fd);
      return dg_seterr(DG_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, f->size, strerror(err));
    }
    f->map = m;
    f->mapped = 1;
    /* Hints only: weights are streamed once in order at first use, then kept. */
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    (void)madvise(m, f->size, MADV_WILLNEED);
  }
  close(fd); /* the mapping keeps the file alive */
  return st_parse_file(st, f);
}

static dg_safetensors *st_new(void) { return calloc(1, sizeof(dg_safetensors)); }

/* Build the by-name index over everything loaded (reports cross-shard twins). */
static dg_status st_finish(dg_safetensors *st) {
  free(st->by_name);
  st->by_name = NULL;
  return st_sorted_index(st, 0, &st->by_name);
}

dg_status dg_st_open_file(const char *path, dg_safetensors **out) {
  if (!out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_open_file: out is NULL");
  *out = NULL;
  if (!path) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_open_file: path is NULL");
  dg_safetensors *st = st_new();
  if (!st) return st_oom(path);
  dg_status rc = st_add_file(st, path);
  if (rc == DG_OK) rc = st_finish(st);
  if (rc != DG_OK) {
    dg_st_close(st);
    return rc;
  }
  *out = st;
  return DG_OK;
}

dg_status dg_st_open_memory(const char *name, const void *buf, size_t size, dg_safetensors **out) {
  if (!out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_open_memory: out is NULL");
  *out = NULL;
  if (!name || (!buf && size)) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_open_memory: NULL argument");
  dg_safetensors *st = st_new();
  if (!st || !(st->files = calloc(1, sizeof *st->files)) || !(st->files[0].path = strdup(name))) {
    dg_st_close(st);
    return st_oom(name);
  }
  st->n_files = st->cap_files = 1;
  st->files[0].map = buf;
  st->files[0].size = size;
  dg_status rc = st_parse_file(st, &st->files[0]);
  if (rc == DG_OK) rc = st_finish(st);
  if (rc != DG_OK) {
    dg_st_close(st);
    return rc;
  }
  *out = st;
  return DG_OK;
}

/* ------------------------------------------------------------------------- */
/* Sharded directories                                                       */
/* ------------------------------------------------------------------------- */


static int st_cmp_str(const void *a, const void *b) {
  return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* A shard name must name a file inside the model directory. */
static int st_plain_name(const char *s) {
  return s[0] && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..") && strcmp(s, ".") != 0;
}

/* The index's weight_map: parse ipath's text, check it is a non-empty object
 * of plain shard file names, and return it (inside *root, which the caller
 * deletes). Errors name ipath and the entry. */
static dg_status st_index_map(const char *ipath, const char *text, size_t len, cJSON **root,
                              const cJSON **wm_out) {
  const char *end = NULL;
  *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!*root)
    return dg_seterr(DG_ERR_JSON, "%s: not valid JSON (error near byte %td)", ipath,
                     end ? end - text : (ptrdiff_t)-1);
  const ptrdiff_t tail = dg_json_trailing(text, len, end); /* a second value or a stale tail */
  if (tail >= 0) return dg_seterr(DG_ERR_JSON, "%s: trailing data after the JSON value at byte %td", ipath, tail);
  if (!cJSON_IsObject(*root))
    return dg_seterr(DG_ERR_JSON, "%s: top level is %s, not an object", ipath, dg_json_kind(*root));
  /* cJSON's lookups take a repeated key's first value, Transformers' json.load its last: two weight_maps would
   * load different tensors there and here (weight_map's own repeats: st_index_shards, "listed twice") */
  int oom = 0;
  const cJSON *dup = dg_json_repeated_member(*root, &oom);
  if (oom) return st_oom(ipath);
  if (dup)
    return dg_seterr(DG_ERR_JSON, "%s: key \"%s\" appears twice in the top-level object (which value is meant?)", ipath,
                     dup->string);
  const cJSON *wm = cJSON_GetObjectItemCaseSensitive(*root, "weight_map");
  if (!cJSON_IsObject(wm))
    return dg_seterr(DG_ERR_CONFIG, "%s: field \"weight_map\" is %s, not an object", ipath,
                     wm ? dg_json_kind(wm) : "missing");
  if (cJSON_GetArraySize(wm) == 0) /* would open nothing (fuzz/regress/st_index) */
    return dg_seterr(DG_ERR_CONFIG, "%s: field \"weight_map\" is empty: it lists no tensor", ipath);
  *wm_out = wm;
  return DG_OK;
}

/* The shard file names of weight_map wm (n_map entries), checked one by one
 * (a string, a plain file name) and no tensor listed twice: shards[] gets
 * the sorted unique names (*n_shards of them), names[] the sorted tensor
 * names; both arrays hold n_map slots and point into wm. */
static dg_status st_index_shards(const char *ipath, const cJSON *wm, size_t n_map, const char **shards,
                                 const char **names, size_t *n_shards) {
  size_t k = 0;
  const cJSON *e;
  cJSON_ArrayForEach(e, wm) {
    if (!cJSON_IsString(e))
      return dg_seterr(DG_ERR_CONFIG, "%s: weight_map[\"%s\"] is %s, not a shard file name", ipath,
                       e->string, dg_json_kind(e));
    if (!st_plain_name(e->valuestring))
      return dg_seterr(DG_ERR_CONFIG, "%s: weight_map[\"%s\"]: shard \"%s\" is not a plain file name",
                       ipath, e->string, e->valuestring);
    names[k] = e->string;
    shards[k] = e->valuestring;
    k++;
  }
  qsort(names, n_map, sizeof *names, st_cmp_str);
  for (size_t i = 1; i < n_map; i++)
    if (strcmp(names[i - 1], names[i]) == 0)
      return dg_seterr(DG_ERR_CONFIG, "%s: weight_map lists tensor \"%s\" twice", ipath, names[i]);
  qsort(shards, n_map, sizeof *shards, st_cmp_str);
  size_t n = 0;
  for (size_t i = 0; i < n_map; i++)
    if (n == 0 || strcmp(shards[n - 1], shards[i]) != 0) shards[n++] = shards[i];
  *n_shards = n;
  return DG_OK;
}

/* Map every shard of dir into st, in file-name order: files[i] is shards[i]. */
static dg_status st_map_shards(dg_safetensors *st, const char *dir, const char *ipath, const char **shards,
                               size_t n_shards) {
  for (size_t i = 0; i < n_shards; i++) {
    char *spath = st_join(dir, shards[i]);
    if (!spath) return st_oom(ipath);
    dg_status rc = st_add_file(st, spath);
    free(spath);
    if (rc == DG_ERR_NOT_FOUND) dg_prefixerr(rc, "%s: shard \"%s\"", ipath, shards[i]);
    if (rc != DG_OK) return rc;
  }
  return st_finish(st);
}

/* Every tensor weight_map lists must be in the shard it names. */
static dg_status st_check_index(const dg_safetensors *st, const char *ipath, const cJSON *wm, const char **shards,
                                size_t n_shards) {
  const cJSON *e;
  cJSON_ArrayForEach(e, wm) {
    const char **s = bsearch(&e->valuestring, shards, n_shards, sizeof *shards, st_cmp_str);
    if (!s) return dg_seterr(DG_ERR_CONFIG, "%s: internal: shard \"%s\" lost", ipath, e->valuestring);
    const st_file *want = &st->files[s - shards];
    const dg_tensor *t = dg_st_find(st, e->string);
    if (!t)
      return dg_seterr(DG_ERR_TENSOR_MISSING, "%s: tensor \"%s\" is listed for shard \"%s\" but %s does not hold it",
                       ipath, e->string, e->valuestring, want->path);
    if (t->file != want->path)
      return dg_seterr(DG_ERR_TENSOR_MISSING,
                       "%s: tensor \"%s\" is listed for shard \"%s\" but %s does not hold it (%s does)",
                       ipath, e->string, e->valuestring, want->path, t->file);
  }
  return DG_OK;
}

/* The unsharded case: dir/model.safetensors. */
static dg_status st_open_single(const char *dir, dg_safetensors **out) {
  char *single = st_join(dir, ST_SINGLE_NAME);
  if (!single) return st_oom(dir);
  dg_status rc = dg_st_open_file(single, out);
  free(single);
  if (rc == DG_ERR_NOT_FOUND)
    return dg_seterr(DG_ERR_NOT_FOUND, "%s: neither %s nor %s exists", dir, ST_INDEX_NAME, ST_SINGLE_NAME);
  return rc;
}

dg_status dg_st_open_dir(const char *dir, dg_safetensors **out) {
  if (!out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_open_dir: out is NULL");
  *out = NULL;
  if (!dir) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_open_dir: dir is NULL");

  char *ipath = st_join(dir, ST_INDEX_NAME);
  if (!ipath) return st_oom(dir);
  char *text = NULL;
  size_t len = 0;
  dg_status rc = dg_read_file(ipath, ST_MAX_INDEX, &text, &len);
  if (rc == DG_ERR_NOT_FOUND) { /* not sharded: a single model.safetensors */
    free(ipath);
    return st_open_single(dir, out);
  }
  if (rc != DG_OK) { free(ipath); return rc; }

  cJSON *root = NULL;
  const cJSON *wm = NULL;
  const char **shards = NULL;  /* [n_map] shard name per weight_map entry, then sorted unique */
  const char **names = NULL;   /* [n_map] tensor names, sorted */
  dg_safetensors *st = NULL;
  size_t n_map = 0, n_shards = 0;
  if ((rc = st_index_map(ipath, text, len, &root, &wm)) != DG_OK) goto done;
  n_map = (size_t)cJSON_GetArraySize(wm);
  shards = malloc(n_map * sizeof *shards);
  names = malloc(n_map * sizeof *names);
  if (!shards || !names) { rc = st_oom(ipath); goto done; }
  if ((rc = st_index_shards(ipath, wm, n_map, shards, names, &n_shards)) != DG_OK) goto done;
  if (!(st = st_new())) { rc = st_oom(ipath); goto done; }
  if ((rc = st_map_shards(st, dir, ipath, shards, n_shards)) != DG_OK) goto done;
  if ((rc = st_check_index(st, ipath, wm, shards, n_shards)) != DG_OK) goto done;
  *out = st;
  st = NULL;

done:
  dg_st_close(st);
  free(names);
  free(shards);
  cJSON_Delete(root);
  free(text);
  free(ipath);
  return rc;
}

/* ------------------------------------------------------------------------- */
/* Writer                                                                    */
/* ------------------------------------------------------------------------- */

/* Growable string for the JSON header. */
typedef struct st_buf { char *p; size_t len, cap; int oom; } st_buf;

static void sb_put(st_buf *b, const char *s, size_t n) {
  if (b->oom) return;
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + n + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) { b->oom = 1; return; }
    b->p = p;
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = 0;
}

static void sb_puts(st_buf *b, const char *s) { sb_put(b, s, strlen(s)); }

static void sb_putu(st_buf *b, unsigned long long v) {
  char tmp[32];
  int n = snprintf(tmp, sizeof tmp, "%llu", v);
  sb_put(b, tmp, (size_t)n);
}

/* A JSON string literal: escapes '"', '\\' and control characters. */
static void sb_putstr(st_buf *b, const char *s) {
  sb_put(b, "\"", 1);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      char esc[2] = {'\\', (char)c};
      sb_put(b, esc, 2);
    } else if (c < 0x20) {
      char esc[8];
      snprintf(esc, sizeof esc, "\\u%04x", c);
      sb_put(b, esc, 6);
    } else {
      sb_put(b, (const char *)&c, 1);
    }
  }
  sb_put(b, "\"", 1);
}

static int st_cmp_tensor_ptr_name(const void *a, const void *b) {
  return strcmp((*(const dg_tensor *const *)a)->name, (*(const dg_tensor *const *)b)->name);
}

/* Argument checks for dg_st_write. */
static dg_status st_write_check(const char *path, const dg_tensor *tensors, size_t n,
                                const char *const *mk, const char *const *mv, size_t n_meta, int need_data) {
  size_t bad;
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++) {
    const dg_tensor *t = &tensors[i];
    if (!t->name)
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensors[%zu]: name is NULL", path, i);
    if (!st_utf8_valid((const uint8_t *)t->name, strlen(t->name), &bad))
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor \"%s\": name is not valid UTF-8 (byte %zu)", path, t->name, bad);
    if (strcmp(t->name, "__metadata__") == 0)
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor name \"__metadata__\" is reserved", path);
    if ((unsigned)t->dtype >= DG_DTYPE_COUNT)
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor \"%s\": dtype %d is not a dg_dtype", path, t->name, (int)t->dtype);
    if (t->ndim < 0 || t->ndim > DG_MAX_DIMS)
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor \"%s\": ndim %d outside [0, %d]", path, t->name, t->ndim, DG_MAX_DIMS);
    for (int d = 0; d < t->ndim; d++)
      if (t->shape[d] < 0 || (double)t->shape[d] >= ST_MAX_INT)
        return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor \"%s\": shape[%d] = %lld is outside [0, 2^53)",
                         path, t->name, d, (long long)t->shape[d]);
    uint64_t nb = 0;
    char sbuf[256];
    if (!st_nbytes(t->shape, t->ndim, dg_dtype_size(t->dtype), &nb) || nb != t->nbytes)
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor \"%s\": nbytes %zu != shape %s x %s",
                       path, t->name, t->nbytes, st_fmt_shape(sbuf, sizeof sbuf, t->shape, t->ndim),
                       dg_dtype_name(t->dtype));
    if (need_data && t->nbytes && !t->data)
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor \"%s\": data is NULL", path, t->name);
    total += nb;
    if ((double)total >= ST_MAX_INT)
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor \"%s\": data region reaches 2^53 bytes", path, t->name);
  }
  for (size_t i = 0; i < n_meta; i++) {
    if (!mk || !mv || !mk[i] || !mv[i])
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: __metadata__ entry %zu: key or value is NULL", path, i);
    if (!st_utf8_valid((const uint8_t *)mk[i], strlen(mk[i]), &bad) ||
        !st_utf8_valid((const uint8_t *)mv[i], strlen(mv[i]), &bad))
      return dg_seterr(DG_ERR_INVALID_ARG, "%s: __metadata__ key \"%s\": not valid UTF-8", path, mk[i]);
    for (size_t j = 0; j < i; j++)
      if (strcmp(mk[i], mk[j]) == 0)
        return dg_seterr(DG_ERR_INVALID_ARG, "%s: __metadata__ key \"%s\" given twice", path, mk[i]);
  }
  /* Repeated tensor names: sort pointers by name. */
  const dg_tensor **ptrs = malloc((n ? n : 1) * sizeof *ptrs);
  if (!ptrs) return st_oom(path);
  for (size_t i = 0; i < n; i++) ptrs[i] = &tensors[i];
  qsort(ptrs, n, sizeof *ptrs, st_cmp_tensor_ptr_name);
  for (size_t i = 1; i < n; i++) {
    if (strcmp(ptrs[i - 1]->name, ptrs[i]->name) == 0) {
      dg_status rc = dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor \"%s\" given twice", path, ptrs[i]->name);
      free(ptrs);
      return rc;
    }
  }
  free(ptrs);
  return DG_OK;
}

/* The header of dg_st_write / dg_st_create into *b (padded to 8 bytes). */
static dg_status st_header(const char *path, const dg_tensor *tensors, size_t n, const char *const *meta_keys,
                           const char *const *meta_vals, size_t n_meta, st_buf *out) {
  /* Header: {"__metadata__":{...},"name":{"dtype":..,"shape":[..],"data_offsets":[b,e]},...} */
  st_buf b = {0};
  sb_puts(&b, "{");
  if (n_meta) {
    sb_puts(&b, "\"__metadata__\":{");
    for (size_t i = 0; i < n_meta; i++) {
      if (i) sb_puts(&b, ",");
      sb_putstr(&b, meta_keys[i]);
      sb_puts(&b, ":");
      sb_putstr(&b, meta_vals[i]);
    }
    sb_puts(&b, "}");
  }
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++) {
    const dg_tensor *t = &tensors[i];
    if (i || n_meta) sb_puts(&b, ",");
    sb_putstr(&b, t->name);
    sb_puts(&b, ":{\"dtype\":\"");
    sb_puts(&b, dg_dtype_name(t->dtype));
    sb_puts(&b, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
      if (d) sb_puts(&b, ",");
      sb_putu(&b, (unsigned long long)t->shape[d]);
    }
    sb_puts(&b, "],\"data_offsets\":[");
    sb_putu(&b, off);
    sb_puts(&b, ",");
    off += t->nbytes;
    sb_putu(&b, off);
    sb_puts(&b, "]}");
  }
  sb_puts(&b, "}");
  while (!b.oom && b.len % 8) sb_puts(&b, " "); /* data region starts 8-aligned */
  if (b.oom) { free(b.p); return st_oom(path); }
  if (b.len > ST_MAX_HEADER) {
    free(b.p);
    return dg_seterr(DG_ERR_INVALID_ARG, "%s: header of %zu bytes exceeds the %llu-byte limit",
                     path, b.len, ST_MAX_HEADER);
  }
  *out = b;
  return DG_OK;
}

dg_status dg_st_write(const char *path, const dg_tensor *tensors, size_t n,
                      const char *const *meta_keys, const char *const *meta_vals, size_t n_meta) {
  if (!path) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_write: path is NULL");
  if (n && !tensors) return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensors is NULL but n = %zu", path, n);
  DG_TRY(st_write_check(path, tensors, n, meta_keys, meta_vals, n_meta, 1));
  st_buf b;
  DG_TRY(st_header(path, tensors, n, meta_keys, meta_vals, n_meta, &b));

  FILE *fp = fopen(path, "wb");
  if (!fp) {
    int err = errno;
    free(b.p);
    return dg_seterr(DG_ERR_IO, "%s: cannot create: %s", path, strerror(err));
  }
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
  int ok = fwrite(len8, 1, 8, fp) == 8 && fwrite(b.p, 1, b.len, fp) == b.len;
  for (size_t i = 0; ok && i < n; i++)
    if (tensors[i].nbytes) ok = fwrite(tensors[i].data, 1, tensors[i].nbytes, fp) == tensors[i].nbytes;
  int err = errno;
  if (fclose(fp) != 0 && ok) { ok = 0; err = errno; }
  free(b.p);
  if (!ok) {
    unlink(path);
    return dg_seterr(DG_ERR_IO, "%s: write failed: %s", path, strerror(err));
  }
  return DG_OK;
}

/* ---- streaming writer ---------------------------------------------------- */

struct dg_st_out {
  char *path;
  int fd;
  size_t n;
  uint64_t *offset;   /* [n] absolute file offset of each tensor's data */
  uint64_t *nbytes;   /* [n] */
  uint64_t data_bytes, written; /* written: sum of bytes passed to dg_st_out_pwrite (atomic) */
};

dg_status dg_st_create(const char *path, const dg_tensor *tensors, size_t n, const char *const *meta_keys,
                       const char *const *meta_vals, size_t n_meta, dg_st_out **out) {
  if (!out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_create: out is NULL");
  *out = NULL;
  if (!path) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_create: path is NULL");
  if (n && !tensors) return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensors is NULL but n = %zu", path, n);
  DG_TRY(st_write_check(path, tensors, n, meta_keys, meta_vals, n_meta, 0));
  st_buf b;
  DG_TRY(st_header(path, tensors, n, meta_keys, meta_vals, n_meta, &b));
  dg_st_out *o = calloc(1, sizeof *o);
  if (o) {
    o->path = strdup(path);
    o->offset = malloc((n ? n : 1) * sizeof *o->offset);
    o->nbytes = malloc((n ? n : 1) * sizeof *o->nbytes);
  }
  if (!o || !o->path || !o->offset || !o->nbytes) {
    if (o) { free(o->path); free(o->offset); free(o->nbytes); }
    free(o);
    free(b.p);
    return st_oom(path);
  }
  o->n = n;
  uint64_t off = 8 + (uint64_t)b.len;
  for (size_t i = 0; i < n; i++) {
    o->offset[i] = off;
    o->nbytes[i] = tensors[i].nbytes;
    off += tensors[i].nbytes;
  }
  o->data_bytes = off - 8 - (uint64_t)b.len;
  o->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  int ok = o->fd >= 0, err = errno;
  uint8_t len8[8];
  for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)b.len >> (8 * i));
  if (ok) ok = pwrite(o->fd, len8, 8, 0) == 8 && pwrite(o->fd, b.p, b.len, 8) == (ssize_t)b.len;
  /* the final size up front: a short disk fails here rather than half way (posix_fallocate
   * reserves the blocks where the file system can; ftruncate alone leaves a sparse file) */
  if (ok) {
    int fe = posix_fallocate(o->fd, 0, (off_t)off);
    if (fe == EOPNOTSUPP || fe == EINVAL) ok = ftruncate(o->fd, (off_t)off) == 0;
    else if (fe) { ok = 0; errno = fe; }
  }
  if (!ok) err = errno;
  free(b.p);
  if (!ok) {
    if (o->fd >= 0) { close(o->fd); unlink(path); }
    dg_status st = dg_seterr(DG_ERR_IO, "%s: cannot create (%llu bytes): %s", path, (unsigned long long)off,
                             strerror(err));
    free(o->path); free(o->offset); free(o->nbytes); free(o);
    return st;
  }
  *out = o;
  return DG_OK;
}

uint64_t dg_st_out_offset(const dg_st_out *o, size_t i) { return o && i < o->n ? o->offset[i] : 0; }

dg_status dg_st_out_pwrite(dg_st_out *o, size_t i, uint64_t off, const void *data, size_t nbytes) {
  if (!o || i >= o->n || (nbytes && !data))
    return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_out_pwrite: bad argument (tensor %zu)", i);
  if (off > o->nbytes[i] || nbytes > o->nbytes[i] - off)
    return dg_seterr(DG_ERR_INVALID_ARG, "%s: tensor %zu: bytes [%llu, %llu) outside its %llu bytes", o->path, i,
                     (unsigned long long)off, (unsigned long long)(off + nbytes), (unsigned long long)o->nbytes[i]);
  const char *p = data;
  uint64_t at = o->offset[i] + off;
  size_t left = nbytes;
  while (left) {
    ssize_t w = pwrite(o->fd, p, left, (off_t)at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return dg_seterr(DG_ERR_IO, "%s: write failed: %s", o->path, w < 0 ? strerror(errno) : "no progress");
    p += w;
    at += (uint64_t)w;
    left -= (size_t)w;
  }
  __atomic_fetch_add(&o->written, (uint64_t)nbytes, __ATOMIC_RELAXED);
  return DG_OK;
}

static void st_out_free(dg_st_out *o) {
  free(o->path);
  free(o->offset);
  free(o->nbytes);
  free(o);
}

dg_status dg_st_out_close(dg_st_out *o) {
  if (!o) return dg_seterr(DG_ERR_INVALID_ARG, "dg_st_out_close: NULL");
  dg_status st = DG_OK;
  if (o->written != o->data_bytes)
    st = dg_seterr(DG_ERR_IO, "%s: %llu of %llu data bytes were written", o->path, (unsigned long long)o->written,
                   (unsigned long long)o->data_bytes);
  if (close(o->fd) != 0 && !st) st = dg_seterr(DG_ERR_IO, "%s: close failed: %s", o->path, strerror(errno));
  if (st) unlink(o->path);
  st_out_free(o);
  return st;
}

void dg_st_out_abort(dg_st_out *o) {
  if (!o) return;
  close(o->fd);
  unlink(o->path);
  st_out_free(o);
}
