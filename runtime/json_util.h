/* Small cJSON helpers shared by the strict readers (config files, safetensors headers). */
#ifndef RUNTIME_JSON_UTIL_H
#define RUNTIME_JSON_UTIL_H

#include <cjson/cJSON.h>

/* "a number", "a string", ... for messages that say what a value was instead. */
static inline const char *json_type_name(const cJSON *v)
{
    if (cJSON_IsNumber(v))
        return "a number";
    if (cJSON_IsString(v))
        return "a string";
    if (cJSON_IsBool(v))
        return "a boolean";
    if (cJSON_IsArray(v))
        return "an array";
    if (cJSON_IsObject(v))
        return "an object";
    return "null";
}

#endif
