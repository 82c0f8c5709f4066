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
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0)) {
        fprintf(stderr, "shardopt-plan: machine file %s: \"%s\" must be a number > 0\n", path, key);
        exit(2);
    }
    return v->valuedouble;
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
    m->gpus_per_node = (int)json_rate(root, "gpus_per_node", path);
    const cJSON *sl = cJSON_GetObjectItemCaseSensitive(root, "slots");
    m->slots = cJSON_IsNumber(sl) ? (int)sl->valuedouble : 0;
    cJSON_Delete(root);
}
