/* Fuzz target: a checkpoint's index.json (the checks shardopt_load applies before it reads any
 * shard). */
#include <string.h>

#include "fuzz.h"
#include "runtime/checkpoint.h"

shardopt_status_t fuzz_one(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (text == NULL)
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    shardopt_status_t st = ckpt_index_check(text, size);
    free(text);
    return st;
}
