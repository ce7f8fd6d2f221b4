/* dg_json.c: checks over parsed cJSON trees shared by the JSON readers. */
#include "base/dg_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_key(const void *a, const void *b) {
  return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

const cJSON *dg_json_repeated_member(const cJSON *v, int *oom) {
  if (!v || !cJSON_IsObject(v)) return NULL;
  int n = 0;
  for (const cJSON *e = v->child; e; e = e->next) n++;
  if (n < 2) return NULL;
  const cJSON **k = malloc((size_t)n * sizeof *k);
  if (!k) { *oom = 1; return NULL; }
  int m = 0;
  for (const cJSON *e = v->child; e; e = e->next) k[m++] = e;
  qsort(k, (size_t)n, sizeof *k, cmp_key);
  const cJSON *dup = NULL;
  for (int i = 1; i < n && !dup; i++)
    if (!strcmp(k[i - 1]->string, k[i]->string)) dup = k[i];
  free(k);
  return dup;
}

const cJSON *dg_json_repeated_key(const cJSON *v, const char **parent, int *oom) {
  if (!v || !(cJSON_IsObject(v) || cJSON_IsArray(v))) return NULL;
  const cJSON *dup = dg_json_repeated_member(v, oom);
  if (dup) { *parent = v->string; return dup; }
  if (*oom) return NULL;
  for (const cJSON *e = v->child; e; e = e->next) {
    const cJSON *d = dg_json_repeated_key(e, parent, oom);
    if (d || *oom) return d;
  }
  return NULL;
}

const char *dg_json_desc(const cJSON *v, char *buf, size_t cap) {
  if (!v || cJSON_IsNull(v) || !(cJSON_IsBool(v) || cJSON_IsNumber(v) || cJSON_IsString(v) || cJSON_IsArray(v) ||
                                 cJSON_IsObject(v))) {
    snprintf(buf, cap, "%s", dg_json_kind(v));
    return buf;
  }
  if (cJSON_IsNumber(v)) { /* cJSON would print an infinity as null */
    snprintf(buf, cap, "a number %.10g", v->valuedouble);
    return buf;
  }
  char *text = cJSON_PrintUnformatted(v); /* strings quoted, control characters escaped */
  if (!text) {
    snprintf(buf, cap, "%s", dg_json_kind(v));
    return buf;
  }
  const size_t keep = 40;
  if (strlen(text) > keep) {
    size_t n = keep;
    while (n > 0 && ((unsigned char)text[n] & 0xC0) == 0x80) n--; /* not inside a UTF-8 sequence */
    snprintf(buf, cap, "%s %.*s...", dg_json_kind(v), (int)n, text);
  } else {
    snprintf(buf, cap, "%s %s", dg_json_kind(v), text);
  }
  cJSON_free(text);
  return buf;
}
