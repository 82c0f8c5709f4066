/* Fuzz target: a safetensors file as a checkpoint load reads it (the 8-byte header length, then
 * the JSON header checked against the file size). The input is the whole file. */
#include <string.h>

#include "fuzz.h"
#include "runtime/checkpoint/safetensors.h"

shardopt_status_t fuzz_one(const uint8_t *data, size_t size)
{
    unsigned char first8[8] = {0};
    uint64_t len = 0;
    char err[256];
    memcpy(first8, data, size < 8 ? size : 8);
    shardopt_status_t st = st_header_len(first8, size, &len, err, sizeof err);
    if (st != SHARDOPT_OK)
        return st;
    struct st_header h;
    memset(&h, 0, sizeof h);
    st = st_header_parse((const char *)data + 8, len, size, &h, err, sizeof err);
    if (st == SHARDOPT_OK) /* every tensor it accepted lies inside the file */
        for (int i = 0; i < h.n; i++)
            if (h.t[i].end > size - 8 - len || h.t[i].begin > h.t[i].end)
                abort();
    st_header_free(&h);
    return st;
}
