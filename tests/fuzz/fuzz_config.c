/* Fuzz target: a JSON config file (shardopt_config_load_json's parser and checks). */
#include <string.h>

#include "fuzz.h"
#include "runtime/config/config.h"

shardopt_status_t fuzz_one(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (text == NULL)
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT, before;
    memcpy(&before, &cfg, sizeof cfg);
    shardopt_status_t st = config_json_text("fuzz.json", text, size, &cfg);
    /* a refused file leaves the config as it was, byte for byte */
    if (st != SHARDOPT_OK && memcmp(&before, &cfg, sizeof cfg) != 0)
        abort();
    free(text);
    return st;
}
