#include "preset.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/file_read.h"

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
    snprintf(buf, sizeof buf, "%s", s);
    for (char *tok = strtok_r(buf, "*", &save); tok != NULL; tok = strtok_r(NULL, "*", &save)) {
        char *end;
        long long lit = strtoll(tok, &end, 10);
        int64_t f;
        if (*end == '\0' && end != tok && lit >= 0) {
            f = lit;
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

static int tensor_add(struct preset *p, const char *prefix, const cJSON *e, struct dims *d,
                      char *err, size_t errlen)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(e, "placement");
    struct preset_tensor *t;

    if (!cJSON_IsString(name) || !cJSON_IsArray(shape) || cJSON_GetArraySize(shape) < 1 ||
        cJSON_GetArraySize(shape) > 3) {
        snprintf(err, errlen, "a tensor entry needs \"name\" and a \"shape\" of 1-3 dims");
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
    t->expert = cJSON_IsString(pl) && strcmp(pl->valuestring, "expert") == 0;
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

static int list_add(struct preset *p, const char *prefix, const cJSON *list, struct dims *d,
                    char *err, size_t errlen)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, list)
    {
        if (tensor_add(p, prefix, e, d, err, errlen) != 0)
            return -1;
    }
    return 0;
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

int preset_load(const char *name, const char *dir, const struct preset_scale *scale,
                struct preset *out, char *err, size_t errlen)
{
    char path[1024], *text = NULL;
    cJSON *root = NULL;
    struct dims d = {.n = 0};
    struct preset p = {0};
    int rc = -1;

    if (strchr(name, '/') != NULL || strstr(name, ".json") != NULL)
        snprintf(path, sizeof path, "%s", name);
    else
        snprintf(path, sizeof path, "%s/%s.json", dir, name);
    if (preset_file_read(path, &text) != 0) {
        snprintf(err, errlen, "preset %s: cannot read", path);
        return -1;
    }
    root = cJSON_Parse(text);
    const cJSON *dims = cJSON_GetObjectItemCaseSensitive(root, "dims"), *e;
    if (!cJSON_IsObject(dims)) {
        snprintf(err, errlen, "preset %s: not JSON with a \"dims\" object", path);
        goto out;
    }
    cJSON_ArrayForEach(e, dims)
    {
        if (d.n == MAX_DIMS || !cJSON_IsNumber(e) || !dim_ok(e->valuedouble)) {
            snprintf(err, errlen,
                     "preset %s: dims must be at most %d whole numbers in 0..2^40 (\"%s\" is "
                     "not)",
                     path, MAX_DIMS, e->string != NULL ? e->string : "?");
            goto out;
        }
        snprintf(d.name[d.n], sizeof d.name[d.n], "%s", e->string);
        d.value[d.n++] = (int64_t)e->valuedouble;
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
    snprintf(p.name, sizeof p.name, "%s", cJSON_IsString(nm) ? nm->valuestring : "?");

    char e2[256] = "";
    if (list_add(&p, "", cJSON_GetObjectItemCaseSensitive(root, "global"), &d, e2, sizeof e2))
        goto bad_entry;
    for (int l = 0; l < p.dense_layers + p.moe_layers; l++) {
        char prefix[48];
        snprintf(prefix, sizeof prefix, "model.layers.%d.", l);
        if (list_add(&p, prefix, cJSON_GetObjectItemCaseSensitive(root, "attention"), &d, e2,
                     sizeof e2) ||
            list_add(&p, prefix,
                     cJSON_GetObjectItemCaseSensitive(root,
                                                      l < p.dense_layers ? "dense_mlp" : "moe_mlp"),
                     &d, e2, sizeof e2))
            goto bad_entry;
    }
    *out = p;
    rc = 0;
    goto out;
bad_entry:
    snprintf(err, errlen, "preset %s: %s", path, e2);
    free(p.t);
out:
    cJSON_Delete(root);
    free(text);
    return rc;
}

void preset_free(struct preset *p)
{
    free(p->t);
    p->t = NULL;
    p->n = 0;
}
