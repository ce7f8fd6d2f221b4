/* tokenizer.c: Hugging Face tokenizer.json (BPE) loader, encoder and decoder.
 *
 * The pipeline reproduces the `tokenizers` library (Rust crate, 0.15+) for the
 * subset Gemma uses; the library's behaviour is the spec:
 *
 *   encode(text):
 *     1. added tokens: leftmost-longest match of every added token whose
 *        "normalized" flag is false, in the raw text (aho-corasick
 *        LeftmostLongest in the library). A special token matched while
 *        parse_special = 0 is skipped: its bytes stay in the surrounding text.
 *     2. each text piece between matches is normalized (Replace ops), then
 *        searched again for "normalized": true added tokens.
 *     3. each remaining piece is pre-tokenized (Split on a literal string,
 *        five behaviours) into words; empty pieces are dropped.
 *     4. BPE per word: one symbol per character (vocab lookup, else its UTF-8
 *        bytes as "<0xHH>" tokens when byte_fallback, else unk, fused when
 *        fuse_unk), then merges applied lowest rank first (ties: leftmost),
 *        with a binary heap over a linked list: O(n log n) per word.
 *   decode(ids): pieces -> decoder chain (Replace, ByteFallback, Fuse) -> join.
 *
 * For Gemma's file the normalizer turns every " " into "▁" before the Split
 * pre-tokenizer looks for " ", so each text piece between added tokens is one
 * BPE word ("\n", tab runs and "▁▁" runs are added tokens and split it).
 *
 * Layout: utilities | string arena + maps | trie | loading | encoding |
 * decoding | lookups. The chat template is in chat.c.
 */
#include "io/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/dg_error.h"
#include "base/dg_io.h"
#include "base/dg_json.h"

/* ------------------------------------------------------------------------- */
/* DiffusionGemma special-token names, applied by id (spec section 2 table).  */
/* ------------------------------------------------------------------------- */
static const struct {
  int32_t id;
  const char *name;
} dg_special_names[] = {
    {46, "<|tool>"},        {47, "<tool|>"},           {48, "<|tool_call>"},
    {49, "<tool_call|>"},   {50, "<|tool_response>"},  {51, "<tool_response|>"},
    {52, "<|\"|>"},         {98, "<|think|>"},         {100, "<|channel>"},
    {101, "<channel|>"},    {105, "<|turn>"},          {106, "<turn|>"},
    {255999, "<|image>"},   {258882, "<image|>"},      {258880, "<|image|>"},
    {256000, "<|audio>"},   {258883, "<audio|>"},      {258881, "<|audio|>"},
};
#define DG_N_SPECIAL_NAMES (sizeof dg_special_names / sizeof dg_special_names[0])

static const char *special_name(int32_t id) {
  for (size_t i = 0; i < DG_N_SPECIAL_NAMES; i++)
    if (dg_special_names[i].id == id) return dg_special_names[i].name;
  return NULL;
}

/* ========================================================================= */
/* Utilities: growable buffers, hashing, UTF-8                               */
/* ========================================================================= */

typedef struct { char *p; size_t n, cap; } dg_buf;          /* bytes */
typedef struct { int32_t *p; size_t n, cap; } dg_ivec;      /* int32 */

/* Grow the array whose pointer is at pp (any T **) to hold need elements of
 * size elem; *cap is updated. 0 on success, -1 on overflow/OOM (array kept). */
static int grow(void *pp, size_t *cap, size_t need, size_t elem) {
  if (need <= *cap) return 0;
  size_t c = *cap ? *cap : 16;
  while (c < need) {
    if (c > SIZE_MAX / 2 / elem) return -1;
    c *= 2;
  }
  void *p;
  memcpy(&p, pp, sizeof p); /* (no T ** -> void ** aliasing) */
  void *q = realloc(p, c * elem);
  if (!q) return -1;
  memcpy(pp, &q, sizeof q);
  *cap = c;
  return 0;
}

static int buf_put(dg_buf *b, const void *s, size_t n) {
  if (grow(&b->p, &b->cap, b->n + n + 1, 1)) return -1;
  if (n) memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0; /* always NUL-terminated */
  return 0;
}

static int ivec_push(dg_ivec *v, int32_t x) {
  if (grow(&v->p, &v->cap, v->n + 1, sizeof(int32_t))) return -1;
  v->p[v->n++] = x;
  return 0;
}

static dg_status oom(void) { return dg_seterr(DG_ERR_OUT_OF_MEMORY, "tokenizer: out of memory"); }

/* FNV-1a, 64-bit: fine for short keys (token pieces). */
static uint64_t hash_bytes(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) { h ^= (uint8_t)s[i]; h *= 1099511628211ULL; }
  return h;
}

/* Fibonacci hashing of a 64-bit key. */
static uint64_t hash_u64(uint64_t k) { k ^= k >> 29; return k * 0x9E3779B97F4A7C15ULL; }

/* Length of the valid UTF-8 sequence at s[0..n), 0 if invalid (overlong,
 * surrogate, > U+10FFFF, truncated or stray continuation byte). */
static size_t utf8_len(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  if (c < 0xC2) return 0; /* continuation byte or overlong 2-byte lead */
  if (c < 0xE0) return (n >= 2 && (s[1] & 0xC0) == 0x80) ? 2 : 0;
  if (c < 0xF0) {
    if (n < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;  /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogate */
    return 3;
  }
  if (c < 0xF5) {
    if (n < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80) return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0;  /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* > U+10FFFF */
    return 4;
  }
  return 0;
}

/* Offset of the first invalid byte, or n if s is valid UTF-8. */
static size_t utf8_check(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  size_t i = 0;
  while (i < n) {
    if (u[i] < 0x80) { i++; continue; }
    size_t l = utf8_len(u + i, n - i);
    if (!l) return i;
    i += l;
  }
  return n;
}

dg_status dg_utf8_validate(const char *s, size_t n, const char *what) {
  if (!s && n) return dg_seterr(DG_ERR_INVALID_ARG, "%s: NULL text", what);
  size_t bad = s ? utf8_check(s, n) : 0;
  if (bad < n)
    return dg_seterr(DG_ERR_INVALID_ARG, "%s: invalid UTF-8 at byte offset %zu (byte 0x%02X)",
                     what, bad, (unsigned)(unsigned char)s[bad]);
  return DG_OK;
}

/* Decode one code point from valid UTF-8 (length l from utf8_len). */
static uint32_t utf8_cp(const unsigned char *s, size_t l) {
  switch (l) {
  case 1: return s[0];
  case 2: return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
  case 3: return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
  default:
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
           ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
  }
}

/* Rust char::is_whitespace (Unicode White_Space), for lstrip/rstrip. */
static int rust_is_ws(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

/* Find needle in hay (both with explicit lengths); NULL if absent. */
static const char *find_bytes(const char *hay, size_t hn, const char *nd, size_t nn) {
  if (nn == 0 || nn > hn) return NULL;
  return memmem(hay, hn, nd, nn);
}

/* ========================================================================= */
/* String arena and hash maps                                                */
/* ========================================================================= */

/* All strings (pieces, patterns) live in one arena, addressed by offset while
 * loading (the arena may move); pointers are only handed out after loading. */

/* String -> int32 map over arena strings (open addressing, linear probing;
 * one 24-byte slot per entry so a probe touches one cache line). */
typedef struct {
  uint64_t hash; /* 0 = empty slot (hashes are forced nonzero) */
  uint32_t off;  /* arena offset of the key */
  uint32_t len;  /* key length */
  int32_t val;
} dg_strslot;

typedef struct {
  dg_strslot *slot; /* [cap] */
  size_t cap, n;
} dg_strmap;

static int strmap_init(dg_strmap *m, size_t expect) {
  size_t cap = 16;
  while (cap < expect * 2 + 16) cap *= 2;
  m->slot = calloc(cap, sizeof *m->slot);
  m->cap = cap;
  m->n = 0;
  return m->slot ? 0 : -1;
}

static void strmap_free(dg_strmap *m) { free(m->slot); memset(m, 0, sizeof *m); }

static uint64_t strmap_h(const char *s, size_t n) { return hash_bytes(s, n) | 1; }

/* Slot of key s[0..n) or the empty slot where it would go. */
static dg_strslot *strmap_slot(const dg_strmap *m, const char *arena, const char *s, size_t n, uint64_t h) {
  size_t mask = m->cap - 1, i = (size_t)(h >> 7) & mask;
  for (;;) {
    dg_strslot *e = &m->slot[i];
    if (!e->hash || (e->hash == h && e->len == n && memcmp(arena + e->off, s, n) == 0)) return e;
    i = (i + 1) & mask;
  }
}

static int32_t strmap_get(const dg_strmap *m, const char *arena, const char *s, size_t n) {
  if (!m->cap) return -1;
  const dg_strslot *e = strmap_slot(m, arena, s, n, strmap_h(s, n));
  return e->hash ? e->val : -1;
}

static int strmap_grow(dg_strmap *m, const char *arena) {
  dg_strmap nm;
  if (strmap_init(&nm, m->cap)) return -1;
  for (size_t i = 0; i < m->cap; i++) {
    const dg_strslot *e = &m->slot[i];
    if (!e->hash) continue;
    *strmap_slot(&nm, arena, arena + e->off, e->len, e->hash) = *e;
    nm.n++;
  }
  strmap_free(m);
  *m = nm;
  return 0;
}

/* Insert or overwrite key (arena offset off, length n) -> val.
 * *old receives the previous value or -1. */
static int strmap_put(dg_strmap *m, const char *arena, uint32_t off, uint32_t n, int32_t val, int32_t *old) {
  if ((m->n + 1) * 2 > m->cap && strmap_grow(m, arena)) return -1;
  uint64_t h = strmap_h(arena + off, n);
  dg_strslot *e = strmap_slot(m, arena, arena + off, n, h);
  *old = e->hash ? e->val : -1;
  if (!e->hash) { e->hash = h; e->off = off; e->len = n; m->n++; }
  e->val = val;
  return 0;
}

/* uint64 -> uint64 map (merge pairs, trie edges). Key UINT64_MAX = empty. */
typedef struct {
  uint64_t *key, *val;
  size_t cap, n;
} dg_u64map;

static int u64map_init(dg_u64map *m, size_t expect) {
  size_t cap = 16;
  while (cap < expect * 2 + 16) cap *= 2;
  m->key = malloc(cap * sizeof *m->key);
  m->val = malloc(cap * sizeof *m->val);
  m->cap = cap;
  m->n = 0;
  if (!m->key || !m->val) return -1;
  memset(m->key, 0xFF, cap * sizeof *m->key);
  return 0;
}

static void u64map_free(dg_u64map *m) { free(m->key); free(m->val); memset(m, 0, sizeof *m); }

static size_t u64map_slot(const dg_u64map *m, uint64_t k) {
  size_t mask = m->cap - 1, i = (size_t)(hash_u64(k) >> 20) & mask;
  while (m->key[i] != UINT64_MAX && m->key[i] != k) i = (i + 1) & mask;
  return i;
}

/* 1 and *v if present, 0 otherwise. */
static inline int u64map_get(const dg_u64map *m, uint64_t k, uint64_t *v) {
  if (!m->cap) return 0;
  size_t i = u64map_slot(m, k);
  if (m->key[i] == UINT64_MAX) return 0;
  *v = m->val[i];
  return 1;
}

static int u64map_put(dg_u64map *m, uint64_t k, uint64_t v) {
  if ((m->n + 1) * 2 > m->cap) {
    dg_u64map nm;
    if (u64map_init(&nm, m->cap)) { u64map_free(&nm); return -1; }
    for (size_t i = 0; i < m->cap; i++)
      if (m->key[i] != UINT64_MAX) {
        size_t j = u64map_slot(&nm, m->key[i]);
        nm.key[j] = m->key[i]; nm.val[j] = m->val[i]; nm.n++;
      }
    u64map_free(m);
    *m = nm;
  }
  size_t i = u64map_slot(m, k);
  if (m->key[i] == UINT64_MAX) { m->key[i] = k; m->n++; }
  m->val[i] = v;
  return 0;
}

/* ========================================================================= */
/* Added-token trie (byte-wise; leftmost-longest matching)                    */
/* ========================================================================= */

typedef struct {
  dg_u64map edge;  /* (node << 8 | byte) -> child node */
  dg_ivec tok;     /* [n_nodes] index into dg_tokenizer.added, or -1 */
  uint8_t first[256]; /* 1 if some token starts with this byte */
  int empty;       /* 1 if no tokens */
} dg_trie;

static int trie_init(dg_trie *tr) {
  memset(tr, 0, sizeof *tr);
  tr->empty = 1;
  if (u64map_init(&tr->edge, 64)) return -1;
  return ivec_push(&tr->tok, -1); /* root */
}

static void trie_free(dg_trie *tr) { u64map_free(&tr->edge); free(tr->tok.p); memset(tr, 0, sizeof *tr); }

static int trie_add(dg_trie *tr, const char *s, size_t n, int32_t tok) {
  uint64_t node = 0, child;
  for (size_t i = 0; i < n; i++) {
    uint64_t k = node << 8 | (uint8_t)s[i];
    if (!u64map_get(&tr->edge, k, &child)) {
      child = tr->tok.n;
      if (ivec_push(&tr->tok, -1) || u64map_put(&tr->edge, k, child)) return -1;
    }
    node = child;
  }
  tr->tok.p[node] = tok; /* a later duplicate content wins */
  tr->first[(uint8_t)s[0]] = 1;
  tr->empty = 0;
  return 0;
}

/* Longest token starting at s[0]; returns its index and sets *len, or -1. */
static int32_t trie_longest(const dg_trie *tr, const char *s, size_t n, size_t *len) {
  uint64_t node = 0, child;
  int32_t best = -1;
  for (size_t i = 0; i < n; i++) {
    if (!u64map_get(&tr->edge, node << 8 | (uint8_t)s[i], &child)) break;
    node = child;
    if (tr->tok.p[node] >= 0) { best = tr->tok.p[node]; *len = i + 1; }
  }
  return best;
}

/* ========================================================================= */
/* The tokenizer                                                             */
/* ========================================================================= */

typedef struct {
  int32_t id;
  uint32_t off, len;   /* content in the arena (as written; the norm trie holds the normalized form) */
  uint8_t special, lstrip, rstrip, normalized;
} dg_added;

typedef struct { uint32_t pat_off, pat_len, rep_off, rep_len; } dg_replace;

enum { DG_SPLIT_REMOVED, DG_SPLIT_ISOLATED, DG_SPLIT_MERGED_PREV, DG_SPLIT_MERGED_NEXT, DG_SPLIT_CONTIGUOUS };
typedef struct { uint32_t pat_off, pat_len; int behavior; } dg_split;

enum { DG_DEC_REPLACE, DG_DEC_BYTE_FALLBACK, DG_DEC_FUSE };
typedef struct { int type; uint32_t pat_off, pat_len, rep_off, rep_len; } dg_decop;

struct dg_tokenizer {
  dg_buf arena;          /* every string, NUL-terminated each */
  int32_t n_ids;         /* max id + 1 */
  uint32_t *piece_off;   /* [n_ids] arena offset of the piece; UINT32_MAX = unused id */
  uint8_t *is_special;   /* [n_ids] */

  /* BPE model */
  dg_strmap vocab;       /* model.vocab (after renaming) */
  size_t n_vocab;        /* number of model.vocab entries */
  dg_u64map merges;      /* (a << 32 | b) -> (rank << 32 | merged id) */
  int32_t byte_id[256];  /* "<0xHH>" ids, -1 if absent */
  int32_t ascii_id[128]; /* single-character ASCII pieces, -1 if absent */
  int32_t unk_id;        /* -1: no unk_token; -2: unk_token not in vocab */
  int byte_fallback, fuse_unk, ignore_merges;

  /* added tokens */
  dg_added *added;
  size_t n_added;
  dg_strmap added_map;   /* content -> id */
  dg_trie trie_raw;      /* "normalized": false tokens, matched in raw text */
  dg_trie trie_norm;     /* "normalized": true tokens, matched after normalizing */

  /* pipeline */
  dg_replace *norm; size_t n_norm;
  dg_split *pretok; size_t n_pretok;
  dg_decop *dec; size_t n_dec;
  int has_decoder;
};

void dg_tokenizer_free(dg_tokenizer *t) {
  if (!t) return;
  free(t->arena.p);
  free(t->piece_off);
  free(t->is_special);
  strmap_free(&t->vocab);
  u64map_free(&t->merges);
  free(t->added);
  strmap_free(&t->added_map);
  trie_free(&t->trie_raw);
  trie_free(&t->trie_norm);
  free(t->norm);
  free(t->pretok);
  free(t->dec);
  free(t);
}

static const char *A(const dg_tokenizer *t, uint32_t off) { return t->arena.p + off; }

/* Append a string to the arena; *off receives its offset. */
static int arena_add(dg_tokenizer *t, const char *s, size_t n, uint32_t *off) {
  if (t->arena.n + n + 1 > UINT32_MAX) return -1;
  *off = (uint32_t)t->arena.n;
  if (buf_put(&t->arena, s, n)) return -1;
  t->arena.n++; /* keep the NUL that buf_put wrote */
  return 0;
}

/* ========================================================================= */
/* Loading                                                                   */
/* ========================================================================= */


/* Optional boolean field: absent/null -> def; otherwise must be a boolean. */
static dg_status json_bool(const cJSON *obj, const char *key, int def, int *out, const char *path, const char *where) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!v || cJSON_IsNull(v)) { *out = def; return DG_OK; }
  if (!cJSON_IsBool(v)) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.%s is not a boolean", path, where, key);
  *out = cJSON_IsTrue(v);
  return DG_OK;
}

/* Integer-valued JSON number in [0, INT32_MAX). */
static int json_id(const cJSON *v, int32_t *out) {
  if (!cJSON_IsNumber(v)) return -1;
  double d = v->valuedouble;
  if (!(d >= 0 && d < 2147483647.0) || (double)(int64_t)d != d) return -1;
  *out = (int32_t)d;
  return 0;
}

/* {"String": "x"} pattern of Replace/Split; Regex patterns are unsupported. */
static dg_status json_pattern(dg_tokenizer *t, const cJSON *obj, const char *path, const char *where,
                              uint32_t *off, uint32_t *len) {
  const cJSON *p = cJSON_GetObjectItemCaseSensitive(obj, "pattern");
  if (!cJSON_IsObject(p)) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.pattern missing or not an object", path, where);
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(p, "String");
  if (!s) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(p, "Regex");
    if (r) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.pattern is a Regex (\"%s\"): unsupported (only String patterns)",
                            path, where, cJSON_IsString(r) ? r->valuestring : "?");
    return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.pattern has no \"String\"", path, where);
  }
  if (!cJSON_IsString(s) || !s->valuestring[0])
    return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.pattern.String is not a non-empty string", path, where);
  if (arena_add(t, s->valuestring, strlen(s->valuestring), off)) return oom();
  *len = (uint32_t)strlen(s->valuestring);
  return DG_OK;
}

static dg_status json_string_field(dg_tokenizer *t, const cJSON *obj, const char *key, const char *path,
                                   const char *where, uint32_t *off, uint32_t *len) {
  const cJSON *s = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (!cJSON_IsString(s)) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.%s missing or not a string", path, where, key);
  size_t n = strlen(s->valuestring);
  if (arena_add(t, s->valuestring, n, off)) return oom();
  *len = (uint32_t)n;
  return DG_OK;
}

static const char *json_type(const cJSON *obj) {
  const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
  return cJSON_IsString(ty) ? ty->valuestring : NULL;
}

/* A "Sequence" node: call `load` on every element of n[key] (normalizers,
 * pretokenizers or decoders), naming each where[i] in messages. */
typedef dg_status (*node_loader)(dg_tokenizer *t, const cJSON *n, const char *path, const char *where);
static dg_status load_sequence(dg_tokenizer *t, const cJSON *n, const char *key, node_loader load, const char *path,
                               const char *where) {
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(n, key);
  if (!cJSON_IsArray(arr)) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.%s missing or not an array", path, where, key);
  char sub[160];
  int i = 0;
  const cJSON *c;
  cJSON_ArrayForEach(c, arr) {
    snprintf(sub, sizeof sub, "%s.%s[%d]", where, key, i++);
    DG_TRY(load(t, c, path, sub));
  }
  return DG_OK;
}

/* --- normalizer: Replace, or a Sequence of them ------------------------- */
static dg_status load_normalizer(dg_tokenizer *t, const cJSON *n, const char *path, const char *where) {
  if (!cJSON_IsObject(n)) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s is not an object", path, where);
  const char *ty = json_type(n);
  if (!ty) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.type missing", path, where);
  if (!strcmp(ty, "Sequence")) return load_sequence(t, n, "normalizers", load_normalizer, path, where);
  if (!strcmp(ty, "Replace")) {
    dg_replace r;
    DG_TRY(json_pattern(t, n, path, where, &r.pat_off, &r.pat_len));
    DG_TRY(json_string_field(t, n, "content", path, where, &r.rep_off, &r.rep_len));
    size_t cap = t->n_norm;
    if (grow(&t->norm, &cap, t->n_norm + 1, sizeof *t->norm)) return oom();
    t->norm[t->n_norm++] = r;
    return DG_OK;
  }
  return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.type \"%s\" is not supported (supported: Replace, Sequence)", path, where, ty);
}

/* --- pre_tokenizer: Split on a literal string, or a Sequence of them ----- */
static dg_status load_pretok(dg_tokenizer *t, const cJSON *n, const char *path, const char *where) {
  if (!cJSON_IsObject(n)) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s is not an object", path, where);
  const char *ty = json_type(n);
  if (!ty) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.type missing", path, where);
  if (!strcmp(ty, "Sequence")) return load_sequence(t, n, "pretokenizers", load_pretok, path, where);
  if (!strcmp(ty, "Split")) {
    dg_split s;
    DG_TRY(json_pattern(t, n, path, where, &s.pat_off, &s.pat_len));
    const cJSON *b = cJSON_GetObjectItemCaseSensitive(n, "behavior");
    if (!cJSON_IsString(b)) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.behavior missing or not a string", path, where);
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    s.behavior = -1;
    for (int i = 0; i < 5; i++)
      if (!strcmp(b->valuestring, names[i])) s.behavior = i;
    if (s.behavior < 0)
      return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.behavior \"%s\" is not supported", path, where, b->valuestring);
    int invert;
    DG_TRY(json_bool(n, "invert", 0, &invert, path, where));
    if (invert) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.invert = true is not supported", path, where);
    size_t cap = t->n_pretok;
    if (grow(&t->pretok, &cap, t->n_pretok + 1, sizeof *t->pretok)) return oom();
    t->pretok[t->n_pretok++] = s;
    return DG_OK;
  }
  return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.type \"%s\" is not supported (supported: Split, Sequence)", path, where, ty);
}

/* --- decoder: Replace, ByteFallback, Fuse, or a Sequence of them -------- */
static dg_status load_decoder(dg_tokenizer *t, const cJSON *n, const char *path, const char *where) {
  if (!cJSON_IsObject(n)) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s is not an object", path, where);
  const char *ty = json_type(n);
  if (!ty) return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.type missing", path, where);
  if (!strcmp(ty, "Sequence")) return load_sequence(t, n, "decoders", load_decoder, path, where);
  dg_decop op = {0};
  if (!strcmp(ty, "Replace")) {
    op.type = DG_DEC_REPLACE;
    DG_TRY(json_pattern(t, n, path, where, &op.pat_off, &op.pat_len));
    DG_TRY(json_string_field(t, n, "content", path, where, &op.rep_off, &op.rep_len));
  } else if (!strcmp(ty, "ByteFallback")) {
    op.type = DG_DEC_BYTE_FALLBACK;
  } else if (!strcmp(ty, "Fuse")) {
    op.type = DG_DEC_FUSE;
  } else {
    return dg_seterr(DG_ERR_TOKENIZER, "%s: %s.type \"%s\" is not supported (supported: Replace, ByteFallback, Fuse, Sequence)",
                     path, where, ty);
  }
  size_t cap = t->n_dec;
  if (grow(&t->dec, &cap, t->n_dec + 1, sizeof *t->dec)) return oom();
  t->dec[t->n_dec++] = op;
  return DG_OK;
}

/* --- model: BPE ---------------------------------------------------------- */
/* model's options: the three flags, and none of the BPE features the
 * encoder does not implement (dropout, subword prefix/suffix). */
static dg_status load_model_options(dg_tokenizer *t, const cJSON *m, const char *path) {
  DG_TRY(json_bool(m, "byte_fallback", 0, &t->byte_fallback, path, "model"));
  DG_TRY(json_bool(m, "fuse_unk", 0, &t->fuse_unk, path, "model"));
  DG_TRY(json_bool(m, "ignore_merges", 0, &t->ignore_merges, path, "model"));
  const cJSON *dr = cJSON_GetObjectItemCaseSensitive(m, "dropout");
  if (dr && !cJSON_IsNull(dr) && !(cJSON_IsNumber(dr) && dr->valuedouble == 0.0))
    return dg_seterr(DG_ERR_TOKENIZER, "%s: model.dropout is set: BPE dropout is not supported", path);
  static const char *unsup[] = {"continuing_subword_prefix", "end_of_word_suffix"};
  for (int i = 0; i < 2; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m, unsup[i]);
    if (v && !cJSON_IsNull(v) && !(cJSON_IsString(v) && !v->valuestring[0]))
      return dg_seterr(DG_ERR_TOKENIZER, "%s: model.%s is set: not supported", path, unsup[i]);
  }
  return DG_OK;
}

/* model.vocab: the first pass validates the ids (below the model's
 * vocab_size when model_vocab > 0) and finds the largest; the second fills
 * t->vocab, the arena and *vocab_piece ([*vocab_max + 1] id -> arena offset,
 * -1 unused; set before any later error, the caller frees it). */
static dg_status load_vocab(dg_tokenizer *t, const cJSON *m, const char *path, int32_t model_vocab,
                            int32_t **vocab_piece, int32_t *vocab_max) {
  const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(m, "vocab");
  if (!vocab) return dg_seterr(DG_ERR_TOKENIZER, "%s: model.vocab missing", path);
  if (!cJSON_IsObject(vocab)) return dg_seterr(DG_ERR_TOKENIZER, "%s: model.vocab is not an object", path);
  int32_t maxid = -1;
  size_t nv = 0;
  const cJSON *c;
  cJSON_ArrayForEach(c, vocab) {
    int32_t id;
    if (json_id(c, &id))
      return dg_seterr(DG_ERR_TOKENIZER, "%s: model.vocab[\"%s\"] is %s, not a valid id (an integer in [0, 2147483647))",
                       path, c->string, DG_JSON_DESC(c));
    if (model_vocab > 0 && id >= model_vocab)
      return dg_seterr(DG_ERR_VOCAB_MISMATCH, "%s: model.vocab[\"%s\"] = %d is >= the model's vocab_size %d",
                       path, c->string, id, model_vocab);
    if (id > maxid) maxid = id;
    nv++;
  }
  int32_t *vp = malloc(((size_t)maxid + 2) * sizeof *vp); /* id -> arena offset, -1 unused (+1: never 0 bytes) */
  if (!vp) return oom();
  *vocab_piece = vp;
  *vocab_max = maxid;
  for (int32_t i = 0; i <= maxid; i++) vp[i] = -1;
  if (strmap_init(&t->vocab, nv)) return oom();
  cJSON_ArrayForEach(c, vocab) {
    int32_t id = (int32_t)c->valuedouble, old;
    const char *name = special_name(id);
    if (!name) name = c->string;
    uint32_t off, len = (uint32_t)strlen(name);
    int32_t prev = strmap_get(&t->vocab, t->arena.p, name, len);
    if (prev >= 0 && prev != id)
      return dg_seterr(DG_ERR_TOKENIZER, "%s: model.vocab: token \"%s\" has two ids (%d and %d)", path, name, prev, id);
    if (prev == id) continue; /* duplicate JSON key with the same id */
    if (vp[id] >= 0)
      return dg_seterr(DG_ERR_TOKENIZER, "%s: model.vocab: id %d is used by both \"%s\" and \"%s\"", path, id,
                       A(t, (uint32_t)vp[id]), name);
    if (arena_add(t, name, len, &off) || strmap_put(&t->vocab, t->arena.p, off, len, id, &old)) return oom();
    vp[id] = (int32_t)off;
  }
  t->n_vocab = t->vocab.n;
  return DG_OK;
}

/* The unk token's id (-1 none, -2 named but not in the vocab) and the ids of
 * the byte-fallback pieces <0xXX> and of the single ASCII characters. */
static dg_status load_byte_tables(dg_tokenizer *t, const cJSON *m, const char *path) {
  const cJSON *unk = cJSON_GetObjectItemCaseSensitive(m, "unk_token");
  t->unk_id = -1;
  if (unk && !cJSON_IsNull(unk)) {
    if (!cJSON_IsString(unk)) return dg_seterr(DG_ERR_TOKENIZER, "%s: model.unk_token is not a string", path);
    int32_t id = strmap_get(&t->vocab, t->arena.p, unk->valuestring, strlen(unk->valuestring));
    t->unk_id = id >= 0 ? id : -2; /* -2: an error only if a character ever needs it */
  }
  for (int b = 0; b < 256; b++) {
    char nm[8];
    snprintf(nm, sizeof nm, "<0x%02X>", b);
    t->byte_id[b] = strmap_get(&t->vocab, t->arena.p, nm, 6);
  }
  for (int b = 0; b < 128; b++) {
    char ch = (char)b;
    t->ascii_id[b] = strmap_get(&t->vocab, t->arena.p, &ch, 1);
  }
  return DG_OK;
}

/* model.merges: [["a", "b"], ...] or ["a b", ...]; rank = position (a later
 * duplicate pair wins, as in the library's HashMap collect). Every part and
 * every merged token must be in the vocab. */
static dg_status load_merges(dg_tokenizer *t, const cJSON *m, const char *path) {
  const cJSON *merges = cJSON_GetObjectItemCaseSensitive(m, "merges");
  if (!merges) return dg_seterr(DG_ERR_TOKENIZER, "%s: model.merges missing", path);
  if (!cJSON_IsArray(merges)) return dg_seterr(DG_ERR_TOKENIZER, "%s: model.merges is not an array", path);
  if (u64map_init(&t->merges, (size_t)cJSON_GetArraySize(merges))) return oom();
  dg_buf cat = {0};
  size_t rank = 0;
  dg_status st = DG_OK;
  const cJSON *c;
  cJSON_ArrayForEach(c, merges) {
    const char *a = NULL, *b = NULL;
    size_t al = 0, bl = 0;
    if (cJSON_IsArray(c) && cJSON_GetArraySize(c) == 2 && cJSON_IsString(c->child) && cJSON_IsString(c->child->next)) {
      a = c->child->valuestring; al = strlen(a);
      b = c->child->next->valuestring; bl = strlen(b);
    } else if (cJSON_IsString(c)) {
      const char *sp = strchr(c->valuestring, ' ');
      if (sp && !strchr(sp + 1, ' ')) { a = c->valuestring; al = (size_t)(sp - a); b = sp + 1; bl = strlen(b); }
    }
    if (!a) {
      st = dg_seterr(DG_ERR_TOKENIZER, "%s: model.merges[%zu] is neither a [\"a\", \"b\"] pair of strings nor an \"a b\" string",
                     path, rank);
      break;
    }
    int32_t ia = strmap_get(&t->vocab, t->arena.p, a, al), ib = strmap_get(&t->vocab, t->arena.p, b, bl);
    if (ia < 0 || ib < 0) {
      st = dg_seterr(DG_ERR_TOKENIZER, "%s: model.merges[%zu]: \"%.*s\" is not in model.vocab", path, rank,
                     (int)(ia < 0 ? al : bl), ia < 0 ? a : b);
      break;
    }
    cat.n = 0;
    if (buf_put(&cat, a, al) || buf_put(&cat, b, bl)) { st = oom(); break; }
    int32_t im = strmap_get(&t->vocab, t->arena.p, cat.p, cat.n);
    if (im < 0) {
      st = dg_seterr(DG_ERR_TOKENIZER, "%s: model.merges[%zu]: merged token \"%s\" is not in model.vocab", path, rank, cat.p);
      break;
    }
    if (u64map_put(&t->merges, (uint64_t)ia << 32 | (uint32_t)ib, (uint64_t)rank << 32 | (uint32_t)im)) { st = oom(); break; }
    rank++;
  }
  free(cat.p);
  return st;
}

/* tokenizer.json's "model" (type BPE): options, vocab, byte tables, merges. */
static dg_status load_model(dg_tokenizer *t, const cJSON *root, const char *path, int32_t model_vocab,
                            int32_t **vocab_piece, int32_t *vocab_max) {
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(root, "model");
  if (!m) return dg_seterr(DG_ERR_TOKENIZER, "%s: field \"model\" missing", path);
  if (!cJSON_IsObject(m)) return dg_seterr(DG_ERR_TOKENIZER, "%s: field \"model\" is not an object", path);
  const char *ty = json_type(m);
  if (!ty) return dg_seterr(DG_ERR_TOKENIZER, "%s: model.type missing", path);
  if (strcmp(ty, "BPE")) return dg_seterr(DG_ERR_TOKENIZER, "%s: model.type \"%s\" is not supported (only BPE)", path, ty);

  DG_TRY(load_model_options(t, m, path));
  DG_TRY(load_vocab(t, m, path, model_vocab, vocab_piece, vocab_max));
  DG_TRY(load_byte_tables(t, m, path));
  return load_merges(t, m, path);
}

/* --- added tokens -------------------------------------------------------- */
static dg_status push_added(dg_tokenizer *t, size_t *cap, const dg_added *a) {
  if (grow(&t->added, cap, t->n_added + 1, sizeof *t->added)) return oom();
  t->added[t->n_added++] = *a;
  return DG_OK;
}

static dg_status load_added(dg_tokenizer *t, const cJSON *root, const char *path, int32_t model_vocab,
                            const int32_t *vocab_piece, int32_t vocab_max) {
  size_t cap = 0;
  if (strmap_init(&t->added_map, 64)) return oom();
  const cJSON *arr = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
  if (arr && !cJSON_IsNull(arr) && !cJSON_IsArray(arr))
    return dg_seterr(DG_ERR_TOKENIZER, "%s: added_tokens is not an array", path);
  /* tokenizers 0.23 (AddedVocabulary::add_tokens, one batch on load): a token
   * whose content is not in the vocab gets the next id from
   * max(#added ids so far = 0, number of model.vocab entries), in file order */
  int32_t next_new = (int32_t)t->n_vocab;
  size_t i = 0;
  const cJSON *c;
  if (cJSON_IsArray(arr)) cJSON_ArrayForEach(c, arr) {
    size_t idx = i++;
    if (!cJSON_IsObject(c)) return dg_seterr(DG_ERR_TOKENIZER, "%s: added_tokens[%zu] is not an object", path, idx);
    int32_t id;
    const cJSON *idv = cJSON_GetObjectItemCaseSensitive(c, "id");
    if (json_id(idv, &id))
      return dg_seterr(DG_ERR_TOKENIZER, "%s: added_tokens[%zu].id is %s, not a valid id (an integer in [0, 2147483647))",
                       path, idx, DG_JSON_DESC(idv));
    const cJSON *cont = cJSON_GetObjectItemCaseSensitive(c, "content");
    if (!cJSON_IsString(cont)) return dg_seterr(DG_ERR_TOKENIZER, "%s: added_tokens[%zu].content missing or not a string", path, idx);
    char where[64];
    snprintf(where, sizeof where, "added_tokens[%zu]", idx);
    int special, lstrip, rstrip, single_word, normalized;
    DG_TRY(json_bool(c, "special", 0, &special, path, where));
    DG_TRY(json_bool(c, "lstrip", 0, &lstrip, path, where));
    DG_TRY(json_bool(c, "rstrip", 0, &rstrip, path, where));
    DG_TRY(json_bool(c, "single_word", 0, &single_word, path, where));
    const char *content = cont->valuestring;
    const char *ren = special_name(id);
    if (ren) { content = ren; special = 1; }
    DG_TRY(json_bool(c, "normalized", !special, &normalized, path, where));
    if (model_vocab > 0 && id >= model_vocab) continue; /* dropped: its text is plain text */
    size_t len = strlen(content);
    if (!len) continue; /* the library ignores empty added tokens */
    if (single_word)
      return dg_seterr(DG_ERR_TOKENIZER, "%s: added_tokens[%zu] (\"%s\"): single_word = true is not supported", path, idx, content);
    /* the id the library gives it: an earlier added token with this content,
     * else the vocab id, else the next new id */
    int32_t lib = strmap_get(&t->added_map, t->arena.p, content, len);
    if (lib < 0) lib = strmap_get(&t->vocab, t->arena.p, content, len);
    if (lib < 0) {
      lib = next_new++;
      if (lib <= vocab_max && vocab_piece[lib] >= 0)
        return dg_seterr(DG_ERR_TOKENIZER, "%s: added_tokens[%zu] (\"%s\"): the tokenizers library would give it id %d, "
                         "which model.vocab uses for \"%s\"", path, idx, content, lib, A(t, (uint32_t)vocab_piece[lib]));
    }
    if (lib != id)
      return dg_seterr(DG_ERR_TOKENIZER,
                       "%s: added_tokens[%zu] (\"%s\") has id %d, but the tokenizers library would give it id %d",
                       path, idx, content, id, lib);
    dg_added a = {.id = id, .special = (uint8_t)special, .lstrip = (uint8_t)lstrip, .rstrip = (uint8_t)rstrip,
                  .normalized = (uint8_t)normalized};
    int32_t old;
    if (arena_add(t, content, len, &a.off)) return oom();
    a.len = (uint32_t)len;
    if (strmap_put(&t->added_map, t->arena.p, a.off, a.len, id, &old)) return oom();
    DG_TRY(push_added(t, &cap, &a));
  }
  /* table ids that exist only in model.vocab become special added tokens too */
  for (size_t k = 0; k < DG_N_SPECIAL_NAMES; k++) {
    int32_t id = dg_special_names[k].id;
    if (id > vocab_max || vocab_piece[id] < 0) continue;
    int have = 0;
    for (size_t j = 0; j < t->n_added; j++) have |= t->added[j].id == id;
    if (have) continue;
    dg_added a = {.id = id, .off = (uint32_t)vocab_piece[id], .special = 1};
    a.len = (uint32_t)strlen(A(t, a.off));
    int32_t old;
    if (strmap_put(&t->added_map, t->arena.p, a.off, a.len, id, &old)) return oom();
    DG_TRY(push_added(t, &cap, &a));
  }
  return DG_OK;
}

/* Apply the normalizer to s[0..n) into out (replacing its contents). */
static int normalize(const dg_tokenizer *t, const char *s, size_t n, dg_buf *out, dg_buf *tmp) {
  out->n = 0;
  if (buf_put(out, s, n)) return -1;
  for (size_t k = 0; k < t->n_norm; k++) {
    const dg_replace *r = &t->norm[k];
    const char *pat = A(t, r->pat_off), *rep = A(t, r->rep_off);
    if (!find_bytes(out->p, out->n, pat, r->pat_len)) continue;
    tmp->n = 0;
    size_t i = 0;
    while (i < out->n) {
      const char *q = find_bytes(out->p + i, out->n - i, pat, r->pat_len);
      size_t j = q ? (size_t)(q - out->p) : out->n;
      if (buf_put(tmp, out->p + i, j - i)) return -1;
      if (!q) break;
      if (buf_put(tmp, rep, r->rep_len)) return -1;
      i = j + r->pat_len;
    }
    dg_buf sw = *out; *out = *tmp; *tmp = sw;
  }
  return 0;
}

/* Build both tries; normalized tokens are matched by their normalized form. */
static dg_status build_tries(dg_tokenizer *t) {
  if (trie_init(&t->trie_raw) || trie_init(&t->trie_norm)) return oom();
  dg_buf nb = {0}, tmp = {0};
  for (size_t i = 0; i < t->n_added; i++) {
    dg_added *a = &t->added[i];
    int rc;
    if (!a->normalized) {
      rc = trie_add(&t->trie_raw, A(t, a->off), a->len, (int32_t)i);
    } else {
      uint32_t off;
      rc = normalize(t, A(t, a->off), a->len, &nb, &tmp);
      if (!rc && nb.n) rc = arena_add(t, nb.p, nb.n, &off) || trie_add(&t->trie_norm, nb.p, nb.n, (int32_t)i);
    }
    if (rc) { free(nb.p); free(tmp.p); return oom(); }
  }
  free(nb.p);
  free(tmp.p);
  return DG_OK;
}

dg_status dg_tokenizer_load(const char *path, int32_t model_vocab, dg_tokenizer **out) {
  if (out) *out = NULL;
  if (!path || !out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_tokenizer_load: NULL argument");
  char *data = NULL;
  size_t len = 0;
  DG_TRY(dg_read_file(path, 0, &data, &len));
  dg_status st = dg_tokenizer_load_text(path, data, len, model_vocab, out);
  free(data);
  return st;
}

/* A key repeated in an object of the file: cJSON's lookups take the first value, the tokenizers library refuses
 * (serde: "duplicate field") or keeps the last, so the file means two things. Every object is checked but
 * model.vocab, whose repeats load_vocab resolves (the same id again is accepted, another id refused). */
static dg_status check_repeats(const cJSON *root, const char *path) {
  int oom_ = 0;
  const char *parent = NULL, *under = NULL; /* under: the top-level member the repeat was found in */
  const cJSON *d = dg_json_repeated_member(root, &oom_);
  for (const cJSON *c = root->child; c && !d && !oom_; c = c->next) {
    under = c->string;
    if (strcmp(c->string, "model") != 0) { d = dg_json_repeated_key(c, &parent, &oom_); continue; }
    if ((d = dg_json_repeated_member(c, &oom_))) parent = "model";
    for (const cJSON *e = c->child; e && !d && !oom_; e = e->next)
      if (strcmp(e->string, "vocab") != 0) d = dg_json_repeated_key(e, &parent, &oom_);
  }
  if (oom_) return oom();
  if (!d) return DG_OK;
  if (parent) /* the object holding it has a key */
    return dg_seterr(DG_ERR_JSON, "%s: key \"%s\" appears twice in \"%s\" (which value is meant?)", path, d->string,
                     parent);
  if (under) /* an element of an array under a top-level member (added_tokens[i]) */
    return dg_seterr(DG_ERR_JSON, "%s: key \"%s\" appears twice in an object under \"%s\" (which value is meant?)",
                     path, d->string, under);
  return dg_seterr(DG_ERR_JSON, "%s: key \"%s\" appears twice in the top-level object (which value is meant?)", path,
                   d->string);
}

dg_status dg_tokenizer_load_text(const char *path, const char *data, size_t len, int32_t model_vocab,
                                 dg_tokenizer **out) {
  if (out) *out = NULL;
  if (!path || (!data && len) || !out) return dg_seterr(DG_ERR_INVALID_ARG, "dg_tokenizer_load_text: NULL argument");
  const char *text = data ? data : "", *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (!root) {
    const char *e = cJSON_GetErrorPtr();
    size_t off = (e && data && e >= data && e <= data + len) ? (size_t)(e - data) : 0;
    return dg_seterr(DG_ERR_JSON, "%s: JSON syntax error near byte offset %zu", path, off);
  }

  dg_status st = DG_OK;
  int32_t *vocab_piece = NULL, vocab_max = -1;
  dg_tokenizer *t = calloc(1, sizeof *t);
  if (!t) { cJSON_Delete(root); return oom(); }
  const ptrdiff_t tail = dg_json_trailing(text, len, end); /* a second value or a stale tail (the library refuses it) */
  if (tail >= 0) {
    st = dg_seterr(DG_ERR_JSON, "%s: trailing data after the JSON value at byte offset %td", path, tail);
    goto done;
  }
  if (!cJSON_IsObject(root)) { st = dg_seterr(DG_ERR_TOKENIZER, "%s: top level is not a JSON object", path); goto done; }
  if ((st = check_repeats(root, path))) goto done;

  st = load_model(t, root, path, model_vocab, &vocab_piece, &vocab_max);
  if (st) goto done;
  st = load_added(t, root, path, model_vocab, vocab_piece, vocab_max);
  if (st) goto done;

  const cJSON *n = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
  if (n && !cJSON_IsNull(n) && (st = load_normalizer(t, n, path, "normalizer"))) goto done;
  n = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
  if (n && !cJSON_IsNull(n) && (st = load_pretok(t, n, path, "pre_tokenizer"))) goto done;
  n = cJSON_GetObjectItemCaseSensitive(root, "decoder");
  t->has_decoder = n && !cJSON_IsNull(n);
  if (t->has_decoder && (st = load_decoder(t, n, path, "decoder"))) goto done;
  /* post_processor, truncation, padding: ignored (we never add <bos> here) */

  if ((st = build_tries(t))) goto done;

  /* id -> piece table: model.vocab, then added tokens (the library looks up
   * added tokens first) */
  int32_t maxid = vocab_max;
  for (size_t i = 0; i < t->n_added; i++)
    if (t->added[i].id > maxid) maxid = t->added[i].id;
  t->n_ids = maxid + 1;
  t->piece_off = malloc((size_t)(maxid + 1) * sizeof *t->piece_off + 1);
  t->is_special = calloc((size_t)maxid + 1, 1);
  if (!t->piece_off || !t->is_special) { st = oom(); goto done; }
  for (int32_t i = 0; i <= maxid; i++)
    t->piece_off[i] = (i <= vocab_max && vocab_piece[i] >= 0) ? (uint32_t)vocab_piece[i] : UINT32_MAX;
  for (size_t i = 0; i < t->n_added; i++) {
    t->piece_off[t->added[i].id] = t->added[i].off;
    t->is_special[t->added[i].id] = t->added[i].special;
  }

done:
  free(vocab_piece);
  cJSON_Delete(root);
  if (st) { dg_tokenizer_free(t); return st; }
  *out = t;
  return DG_OK;
}

/* ========================================================================= */
/* Encoding                                                                  */
/* ========================================================================= */

typedef struct { int32_t rank, pos, new_id; } dg_merge_ent;

typedef struct {
  const dg_tokenizer *t;
  int parse_special;
  dg_ivec out;            /* resulting ids */
  dg_buf norm, tmp;       /* normalized text, scratch */
  /* pre-tokenizer: word ranges [start, end) pairs, and split pieces */
  size_t *rg, n_rg, cap_rg;
  size_t *rg2, n_rg2, cap_rg2;
  size_t *pc, n_pc, cap_pc;   /* (start, end, is_match) triples */
  /* BPE scratch: symbols as a doubly linked list, and a min-heap of merges */
  int32_t *sym, *prev, *next;
  size_t cap_sym;
  dg_merge_ent *heap;
  size_t n_heap, cap_heap;
} dg_enc;

static void enc_free(dg_enc *e) {
  free(e->norm.p); free(e->tmp.p); free(e->rg); free(e->rg2); free(e->pc);
  free(e->sym); free(e->prev); free(e->next); free(e->heap);
}

static int merge_less(const dg_merge_ent *a, const dg_merge_ent *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(dg_enc *e, dg_merge_ent m) {
  size_t i = e->n_heap++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!merge_less(&m, &e->heap[p])) break;
    e->heap[i] = e->heap[p];
    i = p;
  }
  e->heap[i] = m;
}

static dg_merge_ent heap_pop(dg_enc *e) {
  dg_merge_ent top = e->heap[0], last = e->heap[--e->n_heap];
  size_t i = 0, n = e->n_heap;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const dg_merge_ent *best = &last;
    if (l < n && merge_less(&e->heap[l], best)) { m = l; best = &e->heap[l]; }
    if (r < n && merge_less(&e->heap[r], best)) { m = r; }
    if (m == i) break;
    e->heap[i] = e->heap[m];
    i = m;
  }
  if (n) e->heap[i] = last;
  return top;
}

/* Push the merge of symbols (pos, next[pos]) if the pair has one. */
static void try_pair(dg_enc *e, int32_t pos) {
  int32_t nx = e->next[pos];
  uint64_t v;
  if (nx < 0) return;
  if (u64map_get(&e->t->merges, (uint64_t)e->sym[pos] << 32 | (uint32_t)e->sym[nx], &v))
    heap_push(e, (dg_merge_ent){(int32_t)(v >> 32), pos, (int32_t)(uint32_t)v});
}

/* BPE of one word w[0..n) (valid UTF-8, normalized); appends ids. */
static dg_status bpe_word(dg_enc *e, const char *w, size_t n) {
  const dg_tokenizer *t = e->t;
  if (t->ignore_merges) {
    int32_t id = strmap_get(&t->vocab, t->arena.p, w, n);
    if (id >= 0) return ivec_push(&e->out, id) ? oom() : DG_OK;
  }
  if (n > e->cap_sym) { /* symbols: at most one per byte */
    size_t c = n > 2 * e->cap_sym ? n : 2 * e->cap_sym;
    int32_t *a = realloc(e->sym, c * sizeof *a);
    if (a) e->sym = a;
    int32_t *b = a ? realloc(e->prev, c * sizeof *b) : NULL;
    if (b) e->prev = b;
    int32_t *d = b ? realloc(e->next, c * sizeof *d) : NULL;
    if (!d) return oom();
    e->next = d;
    e->cap_sym = c;
  }
  if (grow(&e->heap, &e->cap_heap, 3 * n + 1, sizeof *e->heap)) return oom();

  /* 1. one symbol per character (library: BPE::merge_word) */
  size_t ns = 0;
  int unk_pending = 0;
  for (size_t i = 0; i < n;) {
    unsigned char c = (unsigned char)w[i];
    size_t cl = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    if (cl > n - i) cl = n - i; /* (only reachable with a malformed normalizer string) */
    int32_t id = c < 0x80 ? t->ascii_id[c] : strmap_get(&t->vocab, t->arena.p, w + i, cl);
    if (id >= 0) {
      if (unk_pending) { e->sym[ns++] = t->unk_id; unk_pending = 0; }
      e->sym[ns++] = id;
    } else {
      int bytes_ok = t->byte_fallback;
      for (size_t k = 0; bytes_ok && k < cl; k++) bytes_ok = t->byte_id[(unsigned char)w[i + k]] >= 0;
      if (bytes_ok) {
        /* (the library adds byte tokens without flushing a pending unk) */
        for (size_t k = 0; k < cl; k++) e->sym[ns++] = t->byte_id[(unsigned char)w[i + k]];
      } else if (t->unk_id == -2) {
        return dg_seterr(DG_ERR_TOKENIZER, "tokenizer: character at byte %zu of a word needs unk_token, which is not in model.vocab", i);
      } else if (t->unk_id >= 0) {
        if (unk_pending && !t->fuse_unk) e->sym[ns++] = t->unk_id;
        unk_pending = 1;
      } /* no unk_token: the character is dropped, as in the library */
    }
    i += cl;
  }
  if (unk_pending) e->sym[ns++] = t->unk_id;
  if (!ns) return DG_OK;

  /* 2. merges, lowest rank first, leftmost on ties (library: Word::merge_all) */
  for (size_t i = 0; i < ns; i++) {
    e->prev[i] = (int32_t)i - 1;
    e->next[i] = i + 1 < ns ? (int32_t)i + 1 : -1;
  }
  e->n_heap = 0;
  for (size_t i = 0; i + 1 < ns; i++) try_pair(e, (int32_t)i);
  while (e->n_heap) {
    dg_merge_ent m = heap_pop(e);
    int32_t p = m.pos, nx;
    if (e->sym[p] < 0 || (nx = e->next[p]) < 0) continue; /* removed, or last */
    uint64_t v;
    if (!u64map_get(&t->merges, (uint64_t)e->sym[p] << 32 | (uint32_t)e->sym[nx], &v) ||
        (int32_t)(uint32_t)v != m.new_id)
      continue; /* stale entry */
    e->sym[p] = m.new_id;
    e->sym[nx] = -1;
    e->next[p] = e->next[nx];
    if (e->next[p] >= 0) e->prev[e->next[p]] = p;
    if (e->prev[p] >= 0) try_pair(e, e->prev[p]);
    try_pair(e, p);
  }
  for (int32_t i = 0; i >= 0; i = e->next[i])
    if (ivec_push(&e->out, e->sym[i])) return oom();
  return DG_OK;
}


/* Pre-tokenize s[0..n) with the Split ops (library: NormalizedString::split
 * with a literal pattern), then BPE each non-empty piece. */
static dg_status enc_pretok(dg_enc *e, const char *s, size_t n) {
  const dg_tokenizer *t = e->t;
  if (!n) return DG_OK;
  if (!t->n_pretok) return bpe_word(e, s, n);
  e->n_rg = 0;
  if (grow(&e->rg, &e->cap_rg, 2, sizeof(size_t))) return oom();
  e->rg[e->n_rg++] = 0;
  e->rg[e->n_rg++] = n;
  for (size_t k = 0; k < t->n_pretok; k++) {
    const dg_split *sp = &t->pretok[k];
    const char *pat = A(t, sp->pat_off);
    e->n_rg2 = 0;
    for (size_t r = 0; r < e->n_rg; r += 2) {
      size_t a = e->rg[r], b = e->rg[r + 1];
      if (a == b) continue;
      /* 1. pieces covering [a, b): non-empty gaps and matches, in order */
      e->n_pc = 0;
      for (size_t i = a; i < b;) {
        const char *q = find_bytes(s + i, b - i, pat, sp->pat_len);
        size_t ms = q ? (size_t)(q - s) : b;
        if (grow(&e->pc, &e->cap_pc, e->n_pc + 6, sizeof(size_t))) return oom();
        if (ms > i) { e->pc[e->n_pc++] = i; e->pc[e->n_pc++] = ms; e->pc[e->n_pc++] = 0; }
        if (!q) break;
        e->pc[e->n_pc++] = ms; e->pc[e->n_pc++] = ms + sp->pat_len; e->pc[e->n_pc++] = 1;
        i = ms + sp->pat_len;
      }
      /* 2. fold them per behaviour (library: SplitDelimiterBehavior) */
      size_t np = e->n_pc / 3, base = e->n_rg2;
      if (grow(&e->rg2, &e->cap_rg2, e->n_rg2 + 2 * np, sizeof(size_t))) return oom();
      int prev_match = 0;
      if (sp->behavior == DG_SPLIT_MERGED_NEXT) {
        /* walk backwards: a match joins the piece after it */
        for (size_t j = np; j-- > 0;) {
          size_t ps = e->pc[3 * j], pe = e->pc[3 * j + 1];
          int m = (int)e->pc[3 * j + 2];
          if (m && !prev_match && e->n_rg2 > base) e->rg2[e->n_rg2 - 2] = ps;
          else { e->rg2[e->n_rg2++] = ps; e->rg2[e->n_rg2++] = pe; }
          prev_match = m;
        }
        /* restore left-to-right order */
        for (size_t x = base, y = e->n_rg2 - 2; e->n_rg2 > base && x < y; x += 2, y -= 2) {
          size_t s0 = e->rg2[x], s1 = e->rg2[x + 1];
          e->rg2[x] = e->rg2[y]; e->rg2[x + 1] = e->rg2[y + 1];
          e->rg2[y] = s0; e->rg2[y + 1] = s1;
        }
        continue;
      }
      for (size_t j = 0; j < np; j++) {
        size_t ps = e->pc[3 * j], pe = e->pc[3 * j + 1];
        int m = (int)e->pc[3 * j + 2], join = 0;
        switch (sp->behavior) {
        case DG_SPLIT_REMOVED: if (m) { prev_match = m; continue; } break;
        case DG_SPLIT_ISOLATED: break;
        case DG_SPLIT_MERGED_PREV: join = m && !prev_match && e->n_rg2 > base; break;
        case DG_SPLIT_CONTIGUOUS: join = m == prev_match && e->n_rg2 > base; break;
        }
        if (join) e->rg2[e->n_rg2 - 1] = pe;
        else { e->rg2[e->n_rg2++] = ps; e->rg2[e->n_rg2++] = pe; }
        prev_match = m;
      }
    }
    size_t *sw = e->rg; e->rg = e->rg2; e->rg2 = sw;
    size_t c = e->cap_rg; e->cap_rg = e->cap_rg2; e->cap_rg2 = c;
    e->n_rg = e->n_rg2;
  }
  for (size_t r = 0; r < e->n_rg; r += 2)
    if (e->rg[r + 1] > e->rg[r]) DG_TRY(bpe_word(e, s + e->rg[r], e->rg[r + 1] - e->rg[r]));
  return DG_OK;
}

typedef dg_status (*dg_text_fn)(dg_enc *e, const char *s, size_t n);

/* Split s[0..n) on the added tokens of trie tr (leftmost-longest, like the
 * library's aho-corasick LeftmostLongest find_iter), emitting token ids and
 * passing the text between them to on_text. A special token matched while
 * parse_special = 0 is skipped: its bytes stay part of the text around it. */
static dg_status scan_added(dg_enc *e, const dg_trie *tr, const char *s, size_t n, dg_text_fn on_text) {
  const dg_tokenizer *t = e->t;
  size_t seg = 0, i = 0; /* text not yet emitted starts at seg */
  while (i < n) {
    size_t len = 0;
    int32_t k = tr->first[(uint8_t)s[i]] ? trie_longest(tr, s + i, n - i, &len) : -1;
    if (k < 0) { i++; continue; }
    const dg_added *a = &t->added[k];
    if (a->special && !e->parse_special) { i += len; continue; }
    size_t start = i, end = i + len;
    if (a->lstrip) /* absorb whitespace before it, not before the previous match */
      while (start > seg) {
        size_t p = start - 1;
        while (p > seg && ((uint8_t)s[p] & 0xC0) == 0x80) p--;
        if (!rust_is_ws(utf8_cp((const unsigned char *)s + p, start - p))) break;
        start = p;
      }
    if (a->rstrip)
      while (end < n) {
        size_t l = utf8_len((const unsigned char *)s + end, n - end);
        if (!l || !rust_is_ws(utf8_cp((const unsigned char *)s + end, l))) break;
        end += l;
      }
    if (start > seg) DG_TRY(on_text(e, s + seg, start - seg));
    if (ivec_push(&e->out, a->id)) return oom();
    seg = i = end;
  }
  if (seg < n) DG_TRY(on_text(e, s + seg, n - seg));
  return DG_OK;
}

/* A piece of raw text between added tokens: normalize, match normalized
 * added tokens, pre-tokenize, BPE. */
static dg_status enc_text(dg_enc *e, const char *s, size_t n) {
  if (normalize(e->t, s, n, &e->norm, &e->tmp)) return oom();
  if (e->t->trie_norm.empty) return enc_pretok(e, e->norm.p, e->norm.n);
  /* e->norm stays untouched below: enc_pretok only uses the range buffers */
  return scan_added(e, &e->t->trie_norm, e->norm.p, e->norm.n, enc_pretok);
}

dg_status dg_tokenizer_encode(const dg_tokenizer *t, const char *text, size_t len, int parse_special,
                              int32_t **ids, size_t *n_ids) {
  if (ids) *ids = NULL;
  if (n_ids) *n_ids = 0;
  if (!t || !ids || !n_ids || (!text && len)) return dg_seterr(DG_ERR_INVALID_ARG, "dg_tokenizer_encode: NULL argument");
  DG_TRY(dg_utf8_validate(text, len, "tokenizer encode"));
  dg_enc e = {.t = t, .parse_special = parse_special != 0};
  dg_status st = DG_OK;
  if (len) st = scan_added(&e, &t->trie_raw, text, len, enc_text);
  enc_free(&e);
  if (st) { free(e.out.p); return st; }
  *ids = e.out.p;
  *n_ids = e.out.n;
  return DG_OK;
}

/* ========================================================================= */
/* Decoding                                                                  */
/* ========================================================================= */

/* A token list: spans (offset, length) into a byte store. */
typedef struct {
  dg_buf s;
  size_t *sp, n, cap; /* 2 entries per token */
} dg_toks;

static int toks_add(dg_toks *tl, const char *p, size_t n) {
  if (grow(&tl->sp, &tl->cap, tl->n + 2, sizeof(size_t))) return -1;
  tl->sp[tl->n++] = tl->s.n;
  tl->sp[tl->n++] = n;
  return buf_put(&tl->s, p, n);
}

static void toks_free(dg_toks *tl) { free(tl->s.p); free(tl->sp); memset(tl, 0, sizeof *tl); }

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* "<0xHH>" -> byte (library: len 6, "<0x" prefix, ">" suffix, then Rust's
 * u8::from_str_radix(&tok[3..5], 16), which also takes "+H"); -1 otherwise. */
static int byte_token(const char *p, size_t n) {
  if (n != 6 || memcmp(p, "<0x", 3) || p[5] != '>') return -1;
  if (p[3] == '+') return hexval(p[4]);
  int h = hexval(p[3]), l = hexval(p[4]);
  return (h < 0 || l < 0) ? -1 : h * 16 + l;
}

/* Flush pending byte-fallback bytes: one token if valid UTF-8, else one
 * U+FFFD per byte. */
static int flush_bytes(dg_toks *out, dg_buf *bytes) {
  if (!bytes->n) return 0;
  int rc = 0;
  if (utf8_check(bytes->p, bytes->n) == bytes->n) rc = toks_add(out, bytes->p, bytes->n);
  else for (size_t i = 0; i < bytes->n && !rc; i++) rc = toks_add(out, "\xEF\xBF\xBD", 3);
  bytes->n = 0;
  return rc;
}

static int dec_step(const dg_tokenizer *t, const dg_decop *op, const dg_toks *in, dg_toks *out) {
  dg_buf bytes = {0};
  int rc = 0;
  size_t nt = in->n / 2;
  if (op->type == DG_DEC_FUSE) {
    /* one token, the concatenation (empty with no input: s.p must not stay NULL,
     * the caller adds offsets to it; fuzz/regress/tokenize) */
    if (grow(&out->sp, &out->cap, 2, sizeof(size_t)) || buf_put(&out->s, "", 0)) return -1;
    out->sp[out->n++] = 0;
    for (size_t i = 0; i < nt && !rc; i++) rc = buf_put(&out->s, in->s.p + in->sp[2 * i], in->sp[2 * i + 1]);
    out->sp[out->n++] = out->s.n;
    return rc;
  }
  for (size_t i = 0; i < nt && !rc; i++) {
    const char *p = in->s.p + in->sp[2 * i];
    size_t n = in->sp[2 * i + 1];
    if (op->type == DG_DEC_BYTE_FALLBACK) {
      int b = byte_token(p, n);
      if (b >= 0) { char c = (char)b; rc = buf_put(&bytes, &c, 1); continue; }
      rc = flush_bytes(out, &bytes) || toks_add(out, p, n);
      continue;
    }
    /* Replace: every occurrence, left to right */
    const char *pat = A(t, op->pat_off), *rep = A(t, op->rep_off);
    if (grow(&out->sp, &out->cap, out->n + 2, sizeof(size_t))) { rc = -1; break; }
    size_t start = out->s.n, j = 0;
    while (j <= n && !rc) {
      const char *q = find_bytes(p + j, n - j, pat, op->pat_len);
      size_t k = q ? (size_t)(q - p) : n;
      rc = buf_put(&out->s, p + j, k - j);
      if (!q) break;
      if (!rc) rc = buf_put(&out->s, rep, op->rep_len);
      j = k + op->pat_len;
    }
    out->sp[out->n++] = start;
    out->sp[out->n++] = out->s.n - start;
  }
  if (!rc) rc = flush_bytes(out, &bytes);
  free(bytes.p);
  return rc;
}

dg_status dg_tokenizer_decode(const dg_tokenizer *t, const int32_t *ids, size_t n_ids, int keep_special, char **out) {
  if (out) *out = NULL;
  if (!t || !out || (!ids && n_ids)) return dg_seterr(DG_ERR_INVALID_ARG, "dg_tokenizer_decode: NULL argument");
  for (size_t i = 0; i < n_ids; i++)
    if (ids[i] < 0 || ids[i] >= t->n_ids)
      return dg_seterr(DG_ERR_INVALID_ARG, "tokenizer decode: id %d at position %zu is outside [0, %d)", ids[i], i, t->n_ids);
  dg_toks a = {0}, b = {0};
  int rc = 0;
  for (size_t i = 0; i < n_ids && !rc; i++) {
    uint32_t off = t->piece_off[ids[i]];
    if (off == UINT32_MAX || (!keep_special && t->is_special[ids[i]])) continue;
    rc = toks_add(&a, A(t, off), strlen(A(t, off)));
  }
  for (size_t k = 0; t->has_decoder && k < t->n_dec && !rc; k++) {
    rc = dec_step(t, &t->dec[k], &a, &b);
    dg_toks sw = a; a = b; b = sw;
    b.s.n = 0; b.n = 0;
  }
  dg_buf res = {0};
  for (size_t i = 0; i < a.n / 2 && !rc; i++) {
    if (!t->has_decoder && i) rc = buf_put(&res, " ", 1); /* no decoder: the library joins with " " */
    if (!rc) rc = buf_put(&res, a.s.p + a.sp[2 * i], a.sp[2 * i + 1]);
  }
  if (!rc && !res.p) rc = buf_put(&res, "", 0);
  toks_free(&a);
  toks_free(&b);
  if (rc) { free(res.p); return oom(); }
  *out = res.p;
  return DG_OK;
}

/* ========================================================================= */
/* Lookups                                                                   */
/* ========================================================================= */

int32_t dg_tokenizer_piece_id(const dg_tokenizer *t, const char *piece) {
  if (!t || !piece) return -1;
  size_t n = strlen(piece);
  int32_t id = strmap_get(&t->added_map, t->arena.p, piece, n);
  return id >= 0 ? id : strmap_get(&t->vocab, t->arena.p, piece, n);
}

const char *dg_tokenizer_piece(const dg_tokenizer *t, int32_t id) {
  if (!t || id < 0 || id >= t->n_ids || t->piece_off[id] == UINT32_MAX) return NULL;
  return A(t, t->piece_off[id]);
}

int32_t dg_tokenizer_n_ids(const dg_tokenizer *t) { return t ? t->n_ids : 0; }

int dg_tokenizer_is_special(const dg_tokenizer *t, int32_t id) {
  return t && id >= 0 && id < t->n_ids && t->is_special[id];
}
