/* dg_json.h: small helpers over cJSON shared by the config, safetensors and
 * tokenizer readers. */
#ifndef DG_JSON_H
#define DG_JSON_H

#include <cjson/cJSON.h>

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

#endif
