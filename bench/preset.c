#include "preset.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file_read.h"
#include "base/log.h"
#include "runtime/config/json_strict.h"

#define MAX_DIMS 32
/* A dim, a shape entry, and a tensor's element count stay below 2^40 (a terabyte of fp32
 * elements), the model's total below 2^50, its layers at most 2^16: so no product of them wraps
 * int64 (a preset is a file anyone can hand --preset), and what a tool allocates from them is
 * checked against memory by the tool. */
#define PRESET_DIM_MAX    ((int64_t)1 << 40)
#define PRESET_TOTAL_MAX  ((int64_t)1 << 50)
#define PRESET_LAYERS_MAX (1 << 16)

struct dims {
    char name[MAX_DIMS][32];
    int64_t value[MAX_DIMS];
    int n;
};

/* A JSON number usable as a dim: whole, 0..PRESET_DIM_MAX (NaN, 1e308 and -1 are not; the cast
 * of 1e308 to int64 is undefined). */
static int dim_ok(double v)
{
    return v >= 0 && v <= (double)PRESET_DIM_MAX && v == (double)(int64_t)v;
}

static int64_t *dim_find(struct dims *d, const char *name)
{
    for (int i = 0; i < d->n; i++)
        if (strcmp(d->name[i], name) == 0)
            return &d->value[i];
    return NULL;
}

/* "a*b*4": product of dim names and integers. */
static int expr_eval(struct dims *d, const char *s, int64_t *out)
{
    char buf[128], *save = NULL;
    int64_t v = 1;
    /* "" or "h*" or "h**h" evaluated to 1 or dropped the empty factor (strtok skips it), and
     * strtoll took " 5" and "+5": a product of digits and dim names, nothing else */
    if (s[0] == '\0' || s[0] == '*' || s[strlen(s) - 1] == '*' || strstr(s, "**") != NULL ||
        strlen(s) >= sizeof buf)
        return -1;
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok_r(buf, "*", &save); tok != NULL; tok = strtok_r(NULL, "*", &save)) {
        int64_t f;
        if (strspn(tok, "0123456789") == strlen(tok)) {
            f = strtoll(tok, NULL, 10); /* past int64: LLONG_MAX, refused below */
        } else {
            int64_t *dv = dim_find(d, tok);
            if (dv == NULL)
                return -1;
            f = *dv;
        }
        if (__builtin_mul_overflow(v, f, &v) || v > PRESET_DIM_MAX)
            return -1;
    }
    *out = v;
    return 0;
}

int preset_file_read(const char *path, char **text)
{
    /* the library's reader: a FIFO given as --preset or --machine made fopen wait for a writer
     * for good, and its ftell of -1 sized the buffer; it is a regular file or refused at once */
    struct file_read_error e;
    size_t len;
    return file_read_text(path, 64u << 20, text, &len, &e) == 0 ? 0 : -1;
}

int preset_json_read(const char *path, const char *what, cJSON **root, char *err, size_t errlen)
{
    /* the library's strict reader: cJSON alone took a key twice (the first won, the second was
     * dropped without a word), text after the value, NaN and control bytes */
    struct file_read_error e;
    char *text = NULL, why[160];
    size_t len = 0;
    *root = NULL;
    if (file_read_text(path, 64u << 20, &text, &len, &e) != 0) {
        snprintf(err, errlen, "%s %s: cannot read", what, path);
        return -1;
    }
    const shardopt_status_t st = json_strict_parse(text, len, 0, root, why, sizeof why);
    free(text);
    if (st != SHARDOPT_OK) {
        snprintf(err, errlen, "%s %s: not JSON (%s)", what, path, why);
        return -1;
    }
    return 0;
}

int preset_name_ok(const char *s)
{
    /* printed as they are in tables, messages and JSON outputs (shardopt-plan --json, ckpt_bench,
     * ckpt_index_sim's index): a control byte (an escape sequence) rewrote the terminal, a quote
     * or a backslash made the JSON invalid; UTF-8 is already checked by the strict parser */
    if (s[0] == '\0')
        return 0;
    for (const unsigned char *c = (const unsigned char *)s; *c != '\0'; c++)
        if (*c < 0x20 || *c == 0x7f || *c == '"' || *c == '\\')
            return 0;
    return 1;
}

int preset_keys_known(const cJSON *obj, const char *const *known, const char **bad)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, obj)
    {
        int found = 0;
        for (int i = 0; known[i] != NULL && !found; i++)
            found = strcmp(e->string, known[i]) == 0;
        if (!found) {
            *bad = e->string;
            return 0;
        }
    }
    return 1;
}

static int tensor_add(struct preset *p, const char *prefix, const cJSON *e, struct dims *d,
                      char *err, size_t errlen)
{
    static const char *const keys[] = {"name", "shape", "placement", NULL};
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(e, "placement");
    const char *bad = NULL;
    char shown[64];
    struct preset_tensor *t;

    if (!cJSON_IsObject(e) || !cJSON_IsString(name) || !cJSON_IsArray(shape) ||
        cJSON_GetArraySize(shape) < 1 || cJSON_GetArraySize(shape) > 3) {
        snprintf(err, errlen, "a tensor entry needs \"name\" and a \"shape\" of 1-3 dims");
        return -1;
    }
    if (!preset_name_ok(name->valuestring) ||
        strlen(prefix) + strlen(name->valuestring) >= sizeof t->name) {
        log_escape(shown, sizeof shown, name->valuestring, strlen(name->valuestring));
        snprintf(err, errlen,
                 "tensor name '%s': accepted 1..%zu bytes with the layer prefix, no control bytes, "
                 "quotes or backslashes",
                 shown, sizeof t->name - 1);
        return -1;
    }
    /* a typo ("experts", "sharding") planned the tensor as dense without a word */
    if (!preset_keys_known(e, keys, &bad) ||
        (pl != NULL && (!cJSON_IsString(pl) || (strcmp(pl->valuestring, "expert") != 0 &&
                                                strcmp(pl->valuestring, "dense") != 0)))) {
        snprintf(err, errlen,
                 "tensor '%s%s': %s%.40s%s: accepted keys name, shape and placement (\"dense\", "
                 "the default, or \"expert\")",
                 prefix, name->valuestring, bad != NULL ? "unknown key '" : "placement",
                 bad != NULL ? bad : "", bad != NULL ? "'" : " not dense or expert");
        return -1;
    }
    if ((p->n & (p->n - 1)) == 0) { /* grow at powers of two */
        void *nt = realloc(p->t, sizeof(*p->t) * (size_t)(p->n ? 2 * p->n : 64));
        if (nt == NULL) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
        p->t = nt;
    }
    t = &p->t[p->n];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s%s", prefix, name->valuestring);
    t->ndim = cJSON_GetArraySize(shape);
    t->expert = pl != NULL && strcmp(pl->valuestring, "expert") == 0;
    if (t->expert && t->ndim != 3) {
        snprintf(err, errlen, "tensor '%s': placement expert needs a shape of 3 dims [E, out, in]",
                 t->name);
        return -1;
    }
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        const cJSON *s = cJSON_GetArrayItem(shape, i);
        if (cJSON_IsNumber(s) && dim_ok(s->valuedouble))
            t->shape[i] = (int64_t)s->valuedouble;
        else if (!cJSON_IsString(s) || expr_eval(d, s->valuestring, &t->shape[i]) != 0) {
            snprintf(err, errlen,
                     "tensor '%s': shape entry %d is not a whole number in 0..2^40 or a product "
                     "of known dims within it",
                     t->name, i);
            return -1;
        }
        /* the runtime refuses a 0-sized dim at register (an expert stack of E = 0 too): a plan
         * of such a model was a plan of one that cannot run */
        if (t->shape[i] < 1) {
            snprintf(err, errlen,
                     "tensor '%s': shape entry %d is 0: every dim must be 1..2^40, as the "
                     "runtime's register takes",
                     t->name, i);
            return -1;
        }
        if (__builtin_mul_overflow(numel, t->shape[i], &numel) || numel > PRESET_DIM_MAX) {
            snprintf(err, errlen, "tensor '%s': more than 2^40 elements", t->name);
            return -1;
        }
    }
    if (p->total + numel > PRESET_TOTAL_MAX) {
        snprintf(err, errlen, "tensor '%s': the model passes 2^50 elements", t->name);
        return -1;
    }
    p->total += numel;
    p->n++;
    return 0;
}

/* A layer kind's list: absent (need 0) or an array of tensor entries; needed when a layer of
 * its kind exists ("moe_mlps" for "moe_mlp", or a number, planned a model without them). */
static int list_add(struct preset *p, const char *prefix, const cJSON *root, const char *key,
                    int need, struct dims *d, char *err, size_t errlen)
{
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, key), *e;
    if ((list == NULL && need) || (list != NULL && !cJSON_IsArray(list))) {
        snprintf(err, errlen, "\"%s\" must be an array of tensor entries%s", key,
                 need ? " (a layer of its kind is counted in dims)" : "");
        return -1;
    }
    cJSON_ArrayForEach(e, list)
    {
        if (tensor_add(p, prefix, e, d, err, errlen) != 0)
            return -1;
    }
    return 0;
}

/* width_dims / expert_dims: absent, or an array naming dims (a name not among them, or a
 * number, was skipped without a word and the knob did not scale what it says) */
static int dims_names_check(struct dims *d, const cJSON *root, const char *key, char *err,
                            size_t errlen)
{
    const cJSON *names = cJSON_GetObjectItemCaseSensitive(root, key), *e;
    int ok = names == NULL || cJSON_IsArray(names);
    cJSON_ArrayForEach(e, names)
    {
        ok = ok && cJSON_IsString(e) && dim_find(d, e->valuestring) != NULL;
    }
    if (!ok)
        snprintf(err, errlen, "\"%s\" must be an array of names in \"dims\"", key);
    return ok ? 0 : -1;
}

static void dims_divide(struct dims *d, const cJSON *names, int div)
{
    const cJSON *e;
    if (div <= 1)
        return;
    cJSON_ArrayForEach(e, names)
    {
        int64_t *v = cJSON_IsString(e) ? dim_find(d, e->valuestring) : NULL;
        if (v != NULL)
            *v = *v / div > 0 ? *v / div : 1;
    }
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(((const struct preset_tensor *)a)->name, ((const struct preset_tensor *)b)->name);
}

/* Two tensors of one name (an entry twice, or a global entry spelt like a layer's): the
 * runtime's register refuses the second; a copy sorted by name finds them in n log n. */
static const char *name_repeated(const struct preset *p, char *err, size_t errlen)
{
    if (p->n < 2) /* and p->t may be NULL: no memcpy from it */
        return NULL;
    struct preset_tensor *s = malloc(sizeof *s * (size_t)p->n);
    if (s == NULL) {
        snprintf(err, errlen, "out of memory");
        return err;
    }
    memcpy(s, p->t, sizeof *s * (size_t)p->n);
    qsort(s, (size_t)p->n, sizeof *s, name_cmp);
    const char *why = NULL;
    for (int i = 1; i < p->n && why == NULL; i++)
        if (strcmp(s[i - 1].name, s[i].name) == 0) {
            snprintf(err, errlen, "tensor '%s' is listed twice: names are unique", s[i].name);
            why = err;
        }
    free(s);
    return why;
}

int preset_load(const char *name, const char *dir, const struct preset_scale *scale,
                struct preset *out, char *err, size_t errlen)
{
    static const char *const keys[] = {"name",        "source", "dims",      "width_dims",
                                       "expert_dims", "global", "attention", "dense_mlp",
                                       "moe_mlp",     NULL};
    char path[1024];
    cJSON *root = NULL;
    struct dims d = {.n = 0};
    struct preset p = {0};
    const char *bad = NULL;
    int rc = -1;

    if (strchr(name, '/') != NULL || strstr(name, ".json") != NULL)
        snprintf(path, sizeof path, "%s", name);
    else
        snprintf(path, sizeof path, "%s/%s.json", dir, name);
    if (preset_json_read(path, "preset", &root, err, errlen) != 0)
        return -1;
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(root, "dims"), *e;
    if (!cJSON_IsObject(dims)) {
        snprintf(err, errlen, "preset %s: not JSON with a \"dims\" object", path);
        goto out;
    }
    if (!preset_keys_known(root, keys, &bad)) {
        snprintf(err, errlen,
                 "preset %s: unknown key '%.40s' (accepted: name, source, dims, width_dims, "
                 "expert_dims, global, attention, dense_mlp, moe_mlp)",
                 path, bad);
        goto out;
    }
    cJSON_ArrayForEach(e, dims)
    {
        if (d.n == MAX_DIMS || !cJSON_IsNumber(e) || !dim_ok(e->valuedouble) ||
            strlen(e->string) >= sizeof d.name[0]) {
            snprintf(err, errlen,
                     "preset %s: dims must be at most %d whole numbers in 0..2^40 (\"%.40s\" is "
                     "not), each named in under %zu bytes",
                     path, MAX_DIMS, e->string != NULL ? e->string : "?", sizeof d.name[0]);
            goto out;
        }
        snprintf(d.name[d.n], sizeof d.name[d.n], "%s", e->string);
        d.value[d.n++] = (int64_t)e->valuedouble;
    }
    char e1[256] = "";
    if (dims_names_check(&d, root, "width_dims", e1, sizeof e1) != 0 ||
        dims_names_check(&d, root, "expert_dims", e1, sizeof e1) != 0) {
        snprintf(err, errlen, "preset %s: %s", path, e1);
        goto out;
    }
    dims_divide(&d, cJSON_GetObjectItemCaseSensitive(root, "width_dims"), scale->width_div);
    dims_divide(&d, cJSON_GetObjectItemCaseSensitive(root, "expert_dims"), scale->experts_div);
    int64_t *dl = dim_find(&d, "dense_layers"), *ml = dim_find(&d, "moe_layers");
    if (dl == NULL || ml == NULL) {
        snprintf(err, errlen, "preset %s: dims need dense_layers and moe_layers", path);
        goto out;
    }
    if (scale->layers > 0 && *ml > 0)
        *ml = scale->layers;
    else if (scale->layers > 0) /* a dense model: the knob counts its (dense) layers */
        *dl = scale->layers;
    if (*dl > PRESET_LAYERS_MAX || *ml > PRESET_LAYERS_MAX || *dl + *ml > PRESET_LAYERS_MAX) {
        snprintf(err, errlen, "preset %s: dense_layers + moe_layers past %d", path,
                 PRESET_LAYERS_MAX);
        goto out;
    }
    p.dense_layers = (int)*dl;
    p.moe_layers = (int)*ml;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(root, "name");
    if (nm != NULL && (!cJSON_IsString(nm) || !preset_name_ok(nm->valuestring) ||
                       strlen(nm->valuestring) >= sizeof p.name)) {
        snprintf(err, errlen,
                 "preset %s: \"name\" must be text of 1..%zu bytes, no control bytes, quotes or "
                 "backslashes",
                 path, sizeof p.name - 1);
        goto out;
    }
    snprintf(p.name, sizeof p.name, "%s", nm != NULL ? nm->valuestring : "?");

    char e2[256] = "";
    if (list_add(&p, "", root, "global", 0, &d, e2, sizeof e2))
        goto bad_entry;
    for (int l = 0; l < p.dense_layers + p.moe_layers; l++) {
        char prefix[48];
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        if (list_add(&p, prefix, root, "attention", 0, &d, e2, sizeof e2) ||
            list_add(&p, prefix, root, l < p.dense_layers ? "dense_mlp" : "moe_mlp", 1, &d, e2,
                     sizeof e2))
            goto bad_entry;
    }
    if (name_repeated(&p, e2, sizeof e2) != NULL)
        goto bad_entry;
    *out = p;
    rc = 0;
    goto out;
bad_entry:
    snprintf(err, errlen, "preset %s: %s", path, e2);
    free(p.t);
out:
    cJSON_Delete(root);
    return rc;
}

void preset_free(struct preset *p)
{
    free(p->t);
    p->t = NULL;
    p->n = 0;
}
