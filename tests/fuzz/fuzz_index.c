/* Fuzz target: a checkpoint's index.json (the checks shardopt_load applies before it reads any
 * shard), with its integrity record taken as matching (ckpt_index_check): the structure is what
 * is fuzzed. Byte mutations of a valid index almost never get past the JSON and the top level, so
 * the libFuzzer build adds a structure-aware mutator (LLVMFuzzerCustomMutator): half the time it
 * parses the input and changes one field of one record (a params entry, a tensor, a shard, the
 * layout) to a value from a list of hostile ones, or drops, copies or moves one, and prints the
 * index again; otherwise libFuzzer's own byte mutations. The committed corpus holds whole valid
 * indexes (ok-*) for it to start from.
 *
 * Oracle, on every accepted input: each params step is an integer below 2^53 (what
 * shardopt_param_set_step takes: a run resumed through it counts past the index's step),
 * and the shards of every tensor of at most 2^16 elements cover each element exactly once
 * (counted element by element, apart from the library's corner check; an index of format_version
 * 4 has none: tests/fuzz/fuzz_writer_index.c fuzzes the writers' records); else abort. */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "fuzz.h"
#include "runtime/checkpoint/checkpoint.h"
#include "runtime/checkpoint/checkpoint_index.h"

static void check(int ok)
{
    if (!ok)
        abort();
}

static int64_t num(const cJSON *v) { return (int64_t)cJSON_GetNumberValue(v); }

/* What ckpt_index_check accepted keeps the promises the loader relies on. */
static void oracle(const char *text)
{
    cJSON *root = cJSON_Parse(text);
    check(root != NULL);
    const cJSON *e, *s;
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "params"))
    {
        const double ps = cJSON_GetNumberValue(cJSON_GetObjectItem(e, "step"));
        check(ps >= 0 && ps < (double)CKPT_STEP_LIMIT && ps == floor(ps));
    }
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "tensors"))
    {
        const cJSON *shape = cJSON_GetObjectItem(e, "shape");
        const int nd = cJSON_GetArraySize(shape);
        int64_t dim[3] = {1, 1, 1}, vol = 1;
        for (int d = 0; d < nd; d++) {
            dim[3 - nd + d] = num(cJSON_GetArrayItem(shape, d));
            vol = dim[3 - nd + d] > 0 && vol <= 65536 ? vol * dim[3 - nd + d] : 0;
        }
        if (vol == 0 || vol > 65536 || cJSON_GetObjectItem(e, "shards") == NULL)
            continue; /* format_version 4: the shards are in the writers' indexes */
        unsigned char *seen = calloc((size_t)vol, 1);
        check(seen != NULL);
        cJSON_ArrayForEach(s, cJSON_GetObjectItem(e, "shards"))
        {
            int64_t lo[3] = {0, 0, 0}, len[3] = {1, 1, 1};
            for (int d = 0; d < nd; d++) {
                lo[3 - nd + d] = num(cJSON_GetArrayItem(cJSON_GetObjectItem(s, "offset"), d));
                len[3 - nd + d] = num(cJSON_GetArrayItem(cJSON_GetObjectItem(s, "shape"), d));
            }
            for (int64_t a = lo[0]; a < lo[0] + len[0]; a++)
                for (int64_t b = lo[1]; b < lo[1] + len[1]; b++)
                    for (int64_t c = lo[2]; c < lo[2] + len[2]; c++) {
                        check(a < dim[0] && b < dim[1] && c < dim[2]);
                        check(seen[(a * dim[1] + b) * dim[2] + c]++ == 0);
                    }
        }
        for (int64_t i = 0; i < vol; i++)
            check(seen[i] == 1);
        free(seen);
    }
    cJSON_Delete(root);
}

shardopt_status_t fuzz_one(const uint8_t *data, size_t size)
{
    char *text = fuzz_text(data, size);
    if (text == NULL)
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    shardopt_status_t st = ckpt_index_check(text, size);
    if (st == SHARDOPT_OK)
        oracle(text);
    free(text);
    return st;
}

#ifdef SHARDOPT_LIBFUZZER
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);
size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed);

static unsigned rnd(unsigned *state, unsigned n)
{
    *state = *state * 1103515245u + 12345u;
    return n ? (*state >> 8) % n : 0;
}

/* A random element of an array or member of an object; NULL when it has none. */
static cJSON *pick(cJSON *arr, unsigned *r)
{
    const int n = cJSON_GetArraySize(arr);
    return n > 0 ? cJSON_GetArrayItem(arr, (int)rnd(r, (unsigned)n)) : NULL;
}

/* A hostile replacement for a number v. */
static cJSON *bad_number(double v, unsigned *r)
{
    static const char *const raw[] = {
        "-1",  "2.5", "1e300", "-0", "99999999999999999999", "4294967296", "9007199254740993",
        "0.0", "1e2", "007"};
    switch (rnd(r, 8)) {
    case 0: return cJSON_CreateNumber(v + 1);
    case 1: return cJSON_CreateNumber(v - 1);
    case 2: return cJSON_CreateNumber(v * 2);
    case 3: return cJSON_CreateNumber(0);
    case 4: return cJSON_CreateNumber(floor(v / 2));
    case 5: return cJSON_CreateString("3");
    case 6: return cJSON_CreateNull();
    default: return cJSON_CreateRaw(raw[rnd(r, sizeof raw / sizeof raw[0])]);
    }
}

/* A field of obj (a number, an array of numbers, or a string) changed. */
static void mutate_field(cJSON *obj, unsigned *r)
{
    cJSON *f = pick(obj, r);
    if (f == NULL)
        return;
    if (cJSON_IsArray(f) && cJSON_GetArraySize(f) > 0 && rnd(r, 4) != 0) {
        const int i = (int)rnd(r, (unsigned)cJSON_GetArraySize(f));
        cJSON_ReplaceItemInArray(f, i,
                                 bad_number(cJSON_GetNumberValue(cJSON_GetArrayItem(f, i)), r));
    } else if (cJSON_IsNumber(f)) {
        cJSON_ReplaceItemViaPointer(obj, f, bad_number(f->valuedouble, r));
    } else if (cJSON_IsString(f)) {
        static const char *const s[] = {"", "..", "a/b", "F64", "muon", "adamw", "exp_avg"};
        char buf[512];
        if (rnd(r, 2))
            snprintf(buf, sizeof buf, "%s", s[rnd(r, sizeof s / sizeof s[0])]);
        else
            snprintf(buf, sizeof buf, "%.400sx", f->valuestring);
        cJSON_ReplaceItemViaPointer(obj, f, cJSON_CreateString(buf));
    } else if (rnd(r, 2)) {
        cJSON_DeleteItemFromObject(obj, f->string);
    }
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed)
{
    unsigned r = seed;
    cJSON *root = rnd(&r, 2) ? cJSON_ParseWithLength((const char *)data, size) : NULL;
    if (root == NULL)
        return LLVMFuzzerMutate(data, size, max_size);
    cJSON *tensors = cJSON_GetObjectItem(root, "tensors");
    cJSON *t = pick(tensors, &r), *shards = cJSON_GetObjectItem(t, "shards");
    cJSON *sh = pick(shards, &r);
    switch (rnd(&r, 7)) {
    case 0: mutate_field(pick(cJSON_GetObjectItem(root, "params"), &r), &r); break;
    case 1: mutate_field(t, &r); break;
    case 2: mutate_field(sh, &r); break;
    case 3: mutate_field(cJSON_GetObjectItem(root, "layout"), &r); break;
    case 4: mutate_field(root, &r); break;
    case 5: /* a shard twice */
        if (sh != NULL)
            cJSON_AddItemToArray(shards, cJSON_Duplicate(sh, 1));
        break;
    default: /* one shard's offset moved along one dimension */
        if (sh != NULL) {
            cJSON *off = cJSON_GetObjectItem(sh, "offset");
            const int n = cJSON_GetArraySize(off);
            if (n > 0) {
                const int d = (int)rnd(&r, (unsigned)n);
                const double v = cJSON_GetNumberValue(cJSON_GetArrayItem(off, d));
                cJSON_ReplaceItemInArray(off, d, cJSON_CreateNumber(v + (rnd(&r, 2) ? 1.0 : -1.0)));
            }
        }
    }
    char *out = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    size_t n = out != NULL ? strlen(out) : 0;
    if (out == NULL || n > max_size) {
        free(out);
        return LLVMFuzzerMutate(data, size, max_size);
    }
    memcpy(data, out, n);
    free(out);
    return n;
}
#endif
