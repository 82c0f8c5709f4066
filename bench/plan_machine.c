/* shardopt-plan's machine file (the JSON files in bench/machines): its rates and counts read and
 * checked, apart from the model of a step that uses them (plan_model.c). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "bench/plan_model.h"
#include "bench/preset.h"

/* A rate: a denormal one (1e-320) passed "> 0" and made every time of the table inf with exit
 * 0; 1e-6 (a kB/s, a MFLOP/s) is far below any machine. ns_gemm_fraction is a share of the GEMM
 * rate: at most 1. */
static double json_rate(const cJSON *root, const char *key, double hi, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 1e-6 && v->valuedouble <= hi)) {
        fprintf(stderr, "shardopt-plan: machine file %s: \"%s\" must be a number in [1e-06, %g]\n",
                path, key, hi);
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

/* The keys a machine file may hold: these, and "<one of them>_source" (text saying where its
 * number comes from). A key spelt wrong ("slot") was ignored and its default planned. */
static const char *machine_key_unknown(const cJSON *root)
{
    static const char *const keys[] = {"name",
                                       "about",
                                       "gemm_bf16_tflops",
                                       "ns_gemm_fraction",
                                       "hbm_gbps",
                                       "intra_node_gbps",
                                       "inter_node_gbps",
                                       "host_link_gbps",
                                       "host_mem_gbps",
                                       "gpus_per_node",
                                       "slots",
                                       NULL};
    const cJSON *e;
    cJSON_ArrayForEach(e, root)
    {
        const size_t n = strlen(e->string);
        int known = 0;
        for (int i = 0; keys[i] != NULL && !known; i++)
            known = strcmp(e->string, keys[i]) == 0 ||
                    (n == strlen(keys[i]) + 7 && strncmp(e->string, keys[i], n - 7) == 0 &&
                     strcmp(e->string + n - 7, "_source") == 0 && cJSON_IsString(e));
        if (!known)
            return e->string;
    }
    return NULL;
}

void plan_model_machine_load(const char *path, struct machine *m)
{
    char err[512];
    cJSON *root = NULL;
    if (preset_json_read(path, "machine file", &root, err, sizeof err) != 0) {
        fprintf(stderr, "shardopt-plan: %s\n", err);
        exit(2);
    }
    if (!cJSON_IsObject(root)) {
        fprintf(stderr, "shardopt-plan: machine file %s: not a JSON object\n", path);
        exit(2);
    }
    const char *bad = machine_key_unknown(root);
    if (bad != NULL) {
        char shown[64];
        log_escape(shown, sizeof shown, bad, strlen(bad));
        fprintf(stderr,
                "shardopt-plan: machine file %s: unknown key '%s' (accepted: name, about, "
                "gemm_bf16_tflops, ns_gemm_fraction, hbm_gbps, intra_node_gbps, "
                "inter_node_gbps, host_link_gbps, host_mem_gbps, gpus_per_node, slots, and "
                "<key>_source text)\n",
                path, shown);
        exit(2);
    }
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    if (nm != NULL && (!cJSON_IsString(nm) || !preset_name_ok(nm->valuestring) ||
                       strlen(nm->valuestring) >= sizeof m->name)) {
        fprintf(stderr,
                "shardopt-plan: machine file %s: \"name\" must be text of 1..%zu bytes, no "
                "control bytes, quotes or backslashes\n",
                path, sizeof m->name - 1);
        exit(2);
    }
    /* unnamed: the path, where a table and a JSON string can show it as it is */
    snprintf(m->name, sizeof m->name, "%s",
             nm != NULL             ? nm->valuestring
             : preset_name_ok(path) ? path
                                    : "(unnamed)");
    m->gemm_tflops = json_rate(root, "gemm_bf16_tflops", 1e12, path);
    m->ns_fraction = json_rate(root, "ns_gemm_fraction", 1, path);
    m->hbm_gbps = json_rate(root, "hbm_gbps", 1e12, path);
    m->intra_gbps = json_rate(root, "intra_node_gbps", 1e12, path);
    m->inter_gbps = json_rate(root, "inter_node_gbps", 1e12, path);
    m->host_link_gbps = json_rate(root, "host_link_gbps", 1e12, path);
    m->host_mem_gbps = json_rate(root, "host_mem_gbps", 1e12, path);
    m->gpus_per_node = json_count(root, "gpus_per_node", 1, 1024, path);
    m->slots = cJSON_GetObjectItemCaseSensitive(root, "slots") != NULL
                   ? json_count(root, "slots", 0, 1 << 20, path)
                   : 0;
    cJSON_Delete(root);
}
