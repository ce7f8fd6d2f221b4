/* dg_json.h: small helpers over cJSON shared by the config, safetensors and
 * tokenizer readers. */
#ifndef DG_JSON_H
#define DG_JSON_H

#include <cjson/cJSON.h>
#include <stddef.h>

/* What a JSON value is, for error messages ("a string", "an array", ...);
 * "missing" for NULL. */
static inline const char *dg_json_kind(const cJSON *v) {
  if (!v) return "missing";
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "invalid";
}

/* What a JSON value is and what it holds, for error messages that quote the
 * offending value: `a string "x"`, `a number 1.5`, `a boolean true`, `an array
 * [0.9]`, `null`, `missing`; a long value is cut after about 40 bytes ("...").
 * Written into buf (cap bytes, at least 64), which is returned. */
const char *dg_json_desc(const cJSON *v, char *buf, size_t cap);
/* dg_json_desc into a buffer that lives until the end of the enclosing block
 * (a message argument: dg_seterr(..., "got %s", DG_JSON_DESC(v))). */
#define DG_JSON_DESC(v) dg_json_desc((v), (char[128]){0}, 128)

/* The first repeated key found in an object of the tree under v (objects
 * checked depth first, each in O(k log k)), or NULL if every object's keys
 * are unique. cJSON keeps every repeat and its lookups return the first one,
 * whereas Python's json (Transformers, mlx-lm) keeps the last: a file with a
 * repeated key means two different things, so the readers refuse it. The
 * member returned is the repeat (its ->string is the key); *parent is then
 * the key of the object holding it (NULL: the top level, or an array
 * element). *oom is set to 1 (and NULL returned) when out of memory; it must
 * be 0 on entry. */
const cJSON *dg_json_repeated_key(const cJSON *v, const char **parent, int *oom);
/* The first repeated key among the members of the object v itself (its children only, in O(k log k)), or NULL
 * (also when v is not an object): for readers that check some objects of a file and not others (tokenizer.json's
 * model.vocab, whose repeats the tokenizer reader resolves itself). *oom as for dg_json_repeated_key. */
const cJSON *dg_json_repeated_member(const cJSON *v, int *oom);

/* Where a text's trailing data starts: the offset of the first byte of
 * text[end - text, len) that is not JSON whitespace (space, tab, newline,
 * carriage return), or -1 if there is none. end is where cJSON's parse of one
 * value stopped (cJSON_ParseWithLengthOpts' return_parse_end; NULL: -1). A
 * second value or a stale tail there is refused by Python's json too. */
static inline ptrdiff_t dg_json_trailing(const char *text, size_t len, const char *end) {
  for (const char *q = end; q && q < text + len; q++)
    if (*q != ' ' && *q != '\n' && *q != '\r' && *q != '\t') return q - text;
  return -1;
}

#endif
