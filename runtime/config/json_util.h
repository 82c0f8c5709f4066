/* Small cJSON helpers shared by the strict readers (config files, safetensors headers) and the
 * checkpoint writer. */
#ifndef RUNTIME_JSON_UTIL_H
#define RUNTIME_JSON_UTIL_H

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>

#include "base/mem.h"

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

/* Attach item to parent (under key, or appended when key is NULL) and return it; on any failure
 * clear *ok and return NULL. cJSON's own Add calls drop what they cannot attach, and an item
 * given to cJSON_AddItemTo* that fails stays ours to free: a document built without checking
 * each step would be written short or leak. */
static inline cJSON *json_put(int *ok, cJSON *parent, const char *key, cJSON *item)
{
    const int added = parent != NULL && item != NULL &&
                      (key != NULL ? cJSON_AddItemToObject(parent, key, item)
                                   : cJSON_AddItemToArray(parent, item));
    if (!added) {
        cJSON_Delete(item);
        *ok = 0;
        return NULL;
    }
    return item;
}

/* A non-negative integer written as plain digits, what the strict readers take (json_strict.h):
 * cJSON_CreateNumber prints any value past INT_MAX through "%1.15g" where 15 digits give it back,
 * so a count from 1e15 up with zeros at its end came out as 1e+15 or 4.50359962737044e+15, and a
 * checkpoint holding such a step count (shardopt_param_set_step takes up to 2^53 - 1) was
 * refused by its own load. Every integer a checkpoint writes goes through this. NULL when out of
 * memory (json_put then fails the document). */
static inline cJSON *json_uint(uint64_t v)
{
    char t[24];
    snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    return cJSON_CreateRaw(t);
}

/* cJSON_Parse* returned NULL: was it out of memory rather than bad text? Call with errno
 * cleared before the parse; malloc (and base/mem.h) set ENOMEM. */
static inline int json_parse_oom(void) { return errno == ENOMEM; }

/* "N bytes" for a cJSON allocation that failed: its size when it came through base/mem.h (cJSON
 * is routed there while SHARDOPT_FAULT=alloc is armed, base/fault.c), else unknown. Clear with
 * mem_failed_clear() before the cJSON calls. */
static inline const char *json_oom_bytes(char *buf, size_t len)
{
    const size_t n = mem_failed_bytes();
    if (n > 0)
        snprintf(buf, len, "%zu bytes", n);
    else
        snprintf(buf, len, "an unknown number of bytes (inside cJSON)");
    return buf;
}

#endif
