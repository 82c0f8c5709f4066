/* shardopt-plan's machine file (the JSON files in bench/machines): its rates and counts read and
 * checked, apart from the model of a step that uses them (plan_model.c). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/plan_model.h"
#include "bench/preset.h"

static double json_rate(const cJSON *root, const char *key, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0 && v->valuedouble <= 1e12)) {
        fprintf(stderr, "shardopt-plan: machine file %s: \"%s\" must be a number in (0, 1e12]\n",
                path, key);
        exit(2);
    }
    return v->valuedouble;
}

/* A count the machine file gives (gpus_per_node, slots): a whole number in lo..hi; the cast of
 * 1e308 or 0.5 to int was undefined or 0, and a division by it followed. */
static int json_count(const cJSON *root, const char *key, int lo, int hi, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi) ||
        v->valuedouble != (double)(int)v->valuedouble) {
        fprintf(stderr, "shardopt-plan: machine file %s: \"%s\" must be a whole number in %d..%d\n",
                path, key, lo, hi);
        exit(2);
    }
    return (int)v->valuedouble;
}

void plan_model_machine_load(const char *path, struct machine *m)
{
    char *text = NULL;
    if (preset_file_read(path, &text) != 0) {
        fprintf(stderr, "shardopt-plan: machine file %s: cannot read\n", path);
        exit(2);
    }
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        fprintf(stderr, "shardopt-plan: machine file %s: not a JSON object\n", path);
        exit(2);
    }
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    snprintf(m->name, sizeof m->name, "%s", cJSON_IsString(nm) ? nm->valuestring : path);
    m->gemm_tflops = json_rate(root, "gemm_bf16_tflops", path);
    m->ns_fraction = json_rate(root, "ns_gemm_fraction", path);
    m->hbm_gbps = json_rate(root, "hbm_gbps", path);
    m->intra_gbps = json_rate(root, "intra_node_gbps", path);
    m->inter_gbps = json_rate(root, "inter_node_gbps", path);
    m->host_link_gbps = json_rate(root, "host_link_gbps", path);
    m->host_mem_gbps = json_rate(root, "host_mem_gbps", path);
    m->gpus_per_node = json_count(root, "gpus_per_node", 1, 1024, path);
    m->slots = cJSON_GetObjectItemCaseSensitive(root, "slots") != NULL
                   ? json_count(root, "slots", 0, 1 << 20, path)
                   : 0;
    cJSON_Delete(root);
}
