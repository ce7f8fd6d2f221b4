/* dg_json.c: checks over parsed cJSON trees shared by the JSON readers. */
#include "dg_json.h"

#include <stdlib.h>
#include <string.h>

static int cmp_key(const void *a, const void *b) {
  return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

const cJSON *dg_json_repeated_key(const cJSON *v, const char **parent, int *oom) {
  if (!v || !(cJSON_IsObject(v) || cJSON_IsArray(v))) return NULL;
  int n = 0;
  for (const cJSON *e = v->child; e; e = e->next) n++;
  if (cJSON_IsObject(v) && n > 1) {
    const cJSON **k = malloc((size_t)n * sizeof *k);
    if (!k) { *oom = 1; return NULL; }
    int m = 0;
    for (const cJSON *e = v->child; e; e = e->next) k[m++] = e;
    qsort(k, (size_t)n, sizeof *k, cmp_key);
    const cJSON *dup = NULL;
    for (int i = 1; i < n && !dup; i++)
      if (!strcmp(k[i - 1]->string, k[i]->string)) dup = k[i];
    free(k);
    if (dup) { *parent = v->string; return dup; }
  }
  for (const cJSON *e = v->child; e; e = e->next) {
    const cJSON *d = dg_json_repeated_key(e, parent, oom);
    if (d || *oom) return d;
  }
  return NULL;
}
