/* Fuzz target: a writer's shard records, rank-00000.index.json (checkpoint format_version 4), as
 * a load checks them (ckpt_writer_index_check) against a fixed index.json of a small model: two
 * parameters on 2 writers, "a" (Muon, [8, 16]: "a.momentum", F32) and "b" (AdamW, [300000]:
 * "b.exp_avg", "b.exp_avg_sq", F32, 2 blocks of CRCs for half of it). The committed corpus holds
 * valid records (ok-*) and refusals (bad-*).
 *
 * Oracle, on every accepted input: it is writer 0's (its "writer", "file" and "step" are the
 * index's), each record names a tensor of the index once, lies inside it and has one CRC per
 * 1 MiB block of its bytes; else abort. */
#include <cjson/cJSON.h>
#include <string.h>

#include "fuzz.h"
#include "runtime/checkpoint/checkpoint.h"

static const char index_json[] =
    "{\"format\":\"shardopt-checkpoint\",\"format_version\":4,\"weights\":false,\"step\":7,"
    "\"layout\":{\"ranks\":2,\"dp_replicate\":1,\"dp_shard\":2,\"cp\":1,\"ep\":1,"
    "\"block_bytes\":1048576},\"writers\":2,\"config\":{},"
    "\"params\":[{\"name\":\"a\",\"algo\":\"muon\",\"shape\":[8,16],\"step\":7},"
    "{\"name\":\"b\",\"algo\":\"adamw\",\"shape\":[300000],\"step\":7}],"
    "\"tensors\":[{\"name\":\"a.momentum\",\"param\":\"a\",\"dtype\":\"F32\",\"shape\":[8,16]},"
    "{\"name\":\"b.exp_avg\",\"param\":\"b\",\"dtype\":\"F32\",\"shape\":[300000]},"
    "{\"name\":\"b.exp_avg_sq\",\"param\":\"b\",\"dtype\":\"F32\",\"shape\":[300000]}]}";

static void check(int ok)
{
    if (!ok)
        abort();
}

static void oracle(const char *text)
{
    cJSON *root = cJSON_Parse(text), *e;
    check(root != NULL);
    check(cJSON_GetNumberValue(cJSON_GetObjectItem(root, "writer")) == 0);
    check(cJSON_GetNumberValue(cJSON_GetObjectItem(root, "step")) == 7);
    check(strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(root, "file")),
                 "rank-00000.safetensors") == 0);
    int seen[3] = {0, 0, 0};
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "shards"))
    {
        const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(e, "tensor"));
        check(name != NULL);
        const int t = strcmp(name, "a.momentum") == 0     ? 0
                      : strcmp(name, "b.exp_avg") == 0    ? 1
                      : strcmp(name, "b.exp_avg_sq") == 0 ? 2
                                                          : -1;
        check(t >= 0 && seen[t]++ == 0);
        const double shape[2] = {t == 0 ? 8 : 300000, 16};
        const cJSON *off = cJSON_GetObjectItem(e, "offset"), *len = cJSON_GetObjectItem(e, "shape");
        const int nd = t == 0 ? 2 : 1;
        check(cJSON_GetArraySize(off) == nd && cJSON_GetArraySize(len) == nd);
        double bytes = 4;
        for (int d = 0; d < nd; d++) {
            const double o = cJSON_GetNumberValue(cJSON_GetArrayItem(off, d));
            const double n = cJSON_GetNumberValue(cJSON_GetArrayItem(len, d));
            check(o >= 0 && n >= 0 && o + n <= shape[d]);
            bytes *= n;
        }
        const double blocks = (double)(((unsigned long long)bytes + (1u << 20) - 1) >> 20);
        check(cJSON_GetArraySize(cJSON_GetObjectItem(e, "block_crc32c")) == (int)blocks);
    }
    cJSON_Delete(root);
}

shardopt_status_t fuzz_one(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (text == NULL)
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    shardopt_status_t st = ckpt_writer_index_check(index_json, sizeof index_json - 1, text, size);
    check(st != SHARDOPT_ERR_INVALID_ARGUMENT); /* the fixed index.json is accepted */
    if (st == SHARDOPT_OK)
        oracle(text);
    free(text);
    return st;
}
