/* safetensors headers, read: with cJSON plus the checks the format needs, so that a damaged or
 * hostile file is refused with a message before a single byte of it is trusted. The checks the
 * writer (safetensors_write.c) shares are here too: what may be written is what is read. */
#include <cjson/cJSON.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "runtime/checkpoint/safetensors.h"
#include "runtime/config/json_strict.h"
#include "runtime/config/json_util.h"

size_t st_dtype_size(int dtype) { return dtype == ST_DTYPE_BF16 ? 2 : 4; }

const char *st_dtype_name(int dtype)
{
    switch (dtype) {
    case ST_DTYPE_F32: return "F32";
    case ST_DTYPE_BF16: return "BF16";
    }
    return "?";
}

/* ---- shared checks ---- */

long st_utf8_error(const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = json_strict_utf8_seq_len((const unsigned char *)s + i, n - i);
        if (k == 0)
            return (long)i;
        i += k;
    }
    return -1;
}

/* NULL when name may name a tensor, else what is wrong with it. Control characters are refused
 * because names end up in log lines and error messages. */
const char *st_name_problem(const char *name)
{
    size_t len = strlen(name);

    if (len == 0)
        return "is empty";
    if (len > ST_NAME_MAX)
        return "is longer than 255 bytes";
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];
        if (c < 0x20 || c == 0x7F)
            return "contains a control character";
    }
    return NULL;
}

/* Byte size of a shape, 0 when it would not fit in 64 bits. Each factor is checked before the
 * multiplication, and a zero dimension makes the size 0 whatever the others are. */
int st_shape_bytes(const int64_t *shape, int ndim, int dtype, uint64_t *bytes)
{
    uint64_t numel = 1;

    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) {
            *bytes = 0;
            return 1;
        }
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (numel > UINT64_MAX / d)
            return 0;
        numel *= d;
    }
    if (numel > UINT64_MAX / st_dtype_size(dtype))
        return 0;
    *bytes = numel * st_dtype_size(dtype);
    return 1;
}

static void shape_format(const int64_t *shape, int ndim, char *buf, size_t len)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used +=
            (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
}

/* ---- reading ---- */

struct st_parse {
    char *err;
    size_t errlen;
    uint64_t file_size, data_start;
};

__attribute__((format(printf, 2, 3))) static shardopt_status_t refuse(struct st_parse *ps,
                                                                      const char *fmt, ...)
{
    va_list ap;
    if (ps->err != NULL && ps->errlen > 0) {
        va_start(ap, fmt);
        vsnprintf(ps->err, ps->errlen, fmt, ap);
        va_end(ap);
    }
    return SHARDOPT_ERR_CORRUPT;
}

/* The request that failed is the last one mem.h saw in this thread (or cJSON's, unknown). */
static shardopt_status_t out_of_memory(struct st_parse *ps, const char *what)
{
    char nb[64];
    if (ps->err != NULL && ps->errlen > 0)
        snprintf(ps->err, ps->errlen, "out of memory allocating %s for the header's %s",
                 json_oom_bytes(nb, sizeof nb), what);
    return SHARDOPT_ERR_OUT_OF_MEMORY;
}

static shardopt_status_t len_check(struct st_parse *ps, uint64_t json_len)
{
    if (ps->file_size < 8)
        return refuse(ps, "file is %llu bytes, shorter than the 8-byte header length",
                      (unsigned long long)ps->file_size);
    if (json_len > ps->file_size - 8)
        return refuse(ps, "header length %llu is larger than the file (%llu bytes) allows",
                      (unsigned long long)json_len, (unsigned long long)ps->file_size);
    if (json_len > ST_HEADER_MAX)
        return refuse(ps, "header length %llu is above the limit of %llu bytes",
                      (unsigned long long)json_len, ST_HEADER_MAX);
    return SHARDOPT_OK;
}

shardopt_status_t st_header_len(const unsigned char first8[8], uint64_t file_size,
                                uint64_t *json_len, char *err, size_t errlen)
{
    struct st_parse ps = {err, errlen, file_size, 0};
    shardopt_status_t status;
    uint64_t n = 0;

    if (file_size >= 8)
        for (int i = 7; i >= 0; i--)
            n = (n << 8) | first8[i];
    status = len_check(&ps, n);
    if (status == SHARDOPT_OK)
        *json_len = n;
    return status;
}

/* Numbers that are not plain digits ("2.0", "1e3", "-0", "007"), in text json_strict_parse
 * accepted: the first is noted in *num_at and *num_len, not refused here: the tree checks name the
 * tensor for most bad numbers, and these pass them as integral. */
static void numbers_scan(const unsigned char *s, size_t n, size_t *num_at, size_t *num_len)
{
    int in_string = 0;

    *num_at = SIZE_MAX;
    for (size_t i = 0; i < n && *num_at == SIZE_MAX;) {
        unsigned char c = s[i];
        if (in_string) {
            in_string = c != '"';
            i += c == '\\' && i + 1 < n ? 2 : 1;
        } else if (c == '"') {
            in_string = 1;
            i++;
        } else if (c == '-' || (c >= '0' && c <= '9')) {
            size_t j = i;
            int plain = 1;
            while (j < n && strchr("0123456789+-.eE", s[j]) != NULL) {
                plain &= s[j] >= '0' && s[j] <= '9';
                j++;
            }
            if (!plain || (s[i] == '0' && j - i > 1)) {
                *num_at = i;
                *num_len = j - i;
            }
            i = j;
        } else {
            i++;
        }
    }
}

/* A non-negative integral number below 2^53 (where doubles are exact); refuses NaN, Inf, 1.5,
 * -1, 1e300. */
static int json_u53(const cJSON *v, uint64_t *out)
{
    double d;

    if (!cJSON_IsNumber(v))
        return 0;
    d = v->valuedouble;
    if (!(d >= 0 && d < ST_U53_LIMIT) || (double)(uint64_t)d != d)
        return 0;
    *out = (uint64_t)d;
    return 1;
}

/* What a number or other value is, for messages. */
static void json_describe(const cJSON *v, char *buf, size_t len)
{
    if (cJSON_IsNumber(v)) {
        /* the short form when it reads back exactly: 1e+300, not 1.0000000000000001e+300 */
        snprintf(buf, len, "%.15g", v->valuedouble);
        if (strtod(buf, NULL) != v->valuedouble)
            snprintf(buf, len, "%.17g", v->valuedouble);
    } else {
        snprintf(buf, len, "%s", json_type_name(v));
    }
}

static shardopt_status_t dtype_from_json(struct st_parse *ps, const cJSON *v, struct st_tensor *t)
{
    if (!cJSON_IsString(v))
        return refuse(ps, "tensor '%s': dtype must be a string, got %s", t->name,
                      json_type_name(v));
    if (strcmp(v->valuestring, "F32") == 0)
        t->dtype = ST_DTYPE_F32;
    else if (strcmp(v->valuestring, "BF16") == 0)
        t->dtype = ST_DTYPE_BF16;
    else
        return refuse(ps, "tensor '%s': dtype '%.32s' is not supported (accepted: F32, BF16)",
                      t->name, v->valuestring);
    return SHARDOPT_OK;
}

static shardopt_status_t shape_from_json(struct st_parse *ps, const cJSON *v, struct st_tensor *t)
{
    int ndim;

    if (!cJSON_IsArray(v))
        return refuse(ps, "tensor '%s': shape must be an array, got %s", t->name,
                      json_type_name(v));
    ndim = cJSON_GetArraySize(v);
    if (ndim > ST_NDIM_MAX)
        return refuse(ps, "tensor '%s': shape has %d dimensions (accepted: 0-%d)", t->name, ndim,
                      ST_NDIM_MAX);
    for (int d = 0; d < ndim; d++) {
        const cJSON *x = cJSON_GetArrayItem(v, d);
        uint64_t dim;
        if (!json_u53(x, &dim)) {
            char what[40];
            json_describe(x, what, sizeof what);
            return refuse(ps,
                          "tensor '%s': shape[%d] must be a non-negative integer below 2^53, "
                          "got %s",
                          t->name, d, what);
        }
        t->shape[d] = (int64_t)dim;
    }
    t->ndim = ndim;
    return SHARDOPT_OK;
}

static shardopt_status_t offsets_from_json(struct st_parse *ps, const cJSON *v, struct st_tensor *t)
{
    const char *dt = st_dtype_name(t->dtype);
    uint64_t off[2], bytes;
    char shape[96];

    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 2)
        return refuse(ps, "tensor '%s': data_offsets must be an array of 2 integers, got %s%s",
                      t->name, json_type_name(v), cJSON_IsArray(v) ? " of another length" : "");
    for (int i = 0; i < 2; i++) {
        const cJSON *x = cJSON_GetArrayItem(v, i);
        if (!json_u53(x, &off[i])) {
            char what[40];
            json_describe(x, what, sizeof what);
            return refuse(ps,
                          "tensor '%s': data_offsets[%d] must be a non-negative integer below "
                          "2^53, got %s",
                          t->name, i, what);
        }
    }
    shape_format(t->shape, t->ndim, shape, sizeof shape);
    if (!st_shape_bytes(t->shape, t->ndim, t->dtype, &bytes))
        return refuse(ps, "tensor '%s': shape %s of %s is more than 2^64 bytes", t->name, shape,
                      dt);
    if (off[0] > off[1])
        return refuse(ps, "tensor '%s': data_offsets [%llu, %llu] begin after end", t->name,
                      (unsigned long long)off[0], (unsigned long long)off[1]);
    if (off[1] - off[0] != bytes)
        return refuse(ps,
                      "tensor '%s': data_offsets [%llu, %llu] span %llu bytes, shape %s of %s "
                      "needs %llu",
                      t->name, (unsigned long long)off[0], (unsigned long long)off[1],
                      (unsigned long long)(off[1] - off[0]), shape, dt, (unsigned long long)bytes);
    if (off[1] > ps->file_size - ps->data_start)
        return refuse(ps,
                      "tensor '%s': data_offsets [%llu, %llu] end past the end of the file (data "
                      "starts at byte %llu of %llu)",
                      t->name, (unsigned long long)off[0], (unsigned long long)off[1],
                      (unsigned long long)ps->data_start, (unsigned long long)ps->file_size);
    t->begin = off[0];
    t->end = off[1];
    return SHARDOPT_OK;
}

/* One entry of the top-level object: exactly dtype, shape and data_offsets. */
static shardopt_status_t tensor_from_json(struct st_parse *ps, const cJSON *item, int index,
                                          struct st_tensor *t)
{
    static const char *const names[3] = {"dtype", "shape", "data_offsets"};
    const cJSON *field[3] = {NULL, NULL, NULL};
    const char *problem = st_name_problem(item->string);
    shardopt_status_t status;

    if (problem != NULL)
        return refuse(ps, "tensor #%d: name %s", index, problem);
    memcpy(t->name, item->string, strlen(item->string) + 1);
    if (!cJSON_IsObject(item))
        return refuse(ps, "tensor '%s': must be an object with dtype, shape, data_offsets, got %s",
                      t->name, json_type_name(item));
    for (const cJSON *f = item->child; f != NULL; f = f->next) {
        int k = 0;
        while (k < 3 && strcmp(f->string, names[k]) != 0)
            k++;
        if (k == 3)
            return refuse(ps,
                          "tensor '%s': unknown field '%.64s' (accepted: dtype, shape, "
                          "data_offsets)",
                          t->name, f->string);
        if (field[k] != NULL)
            return refuse(ps, "tensor '%s': field %s appears twice", t->name, names[k]);
        field[k] = f;
    }
    for (int k = 0; k < 3; k++)
        if (field[k] == NULL)
            return refuse(ps, "tensor '%s': missing field %s", t->name, names[k]);
    status = dtype_from_json(ps, field[0], t);
    if (status == SHARDOPT_OK)
        status = shape_from_json(ps, field[1], t);
    if (status == SHARDOPT_OK)
        status = offsets_from_json(ps, field[2], t);
    return status;
}

/* "__metadata__": an object of strings. */
static shardopt_status_t meta_from_json(struct st_parse *ps, const cJSON *obj, struct st_header *h)
{
    int n;

    if (!cJSON_IsObject(obj))
        return refuse(ps, ST_META_KEY " must be an object of strings, got %s", json_type_name(obj));
    n = cJSON_GetArraySize(obj);
    if (n == 0)
        return SHARDOPT_OK;
    h->meta = mem_calloc((size_t)n, sizeof *h->meta);
    if (h->meta == NULL)
        return out_of_memory(ps, ST_META_KEY);
    for (const cJSON *v = obj->child; v != NULL; v = v->next) {
        struct st_meta *m = &h->meta[h->nmeta];
        size_t klen = strlen(v->string);
        if (klen > ST_KEY_MAX)
            return refuse(ps, ST_META_KEY " key '%.64s...' is %zu bytes (at most %d)", v->string,
                          klen, ST_KEY_MAX);
        if (!cJSON_IsString(v))
            return refuse(ps, ST_META_KEY " key '%s': value must be a string, got %s", v->string,
                          json_type_name(v));
        memcpy(m->key, v->string, klen + 1);
        m->value = mem_strdup(v->valuestring);
        if (m->value == NULL)
            return out_of_memory(ps, ST_META_KEY);
        h->nmeta++;
    }
    for (int i = 1; i < h->nmeta; i++) /* few keys: quadratic is fine, and no allocation */
        for (int j = 0; j < i; j++)
            if (strcmp(h->meta[i].key, h->meta[j].key) == 0)
                return refuse(ps, ST_META_KEY " key '%s' appears twice", h->meta[i].key);
    return SHARDOPT_OK;
}

/* qsort has no context argument: the tensor array travels in a struct with each index. */
struct st_ref {
    const struct st_tensor *t;
    int i;
};

static int cmp_ref_name(const void *a, const void *b)
{
    return strcmp(((const struct st_ref *)a)->t->name, ((const struct st_ref *)b)->t->name);
}

static int cmp_ref_offsets(const void *a, const void *b)
{
    const struct st_tensor *x = ((const struct st_ref *)a)->t, *y = ((const struct st_ref *)b)->t;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

/* Duplicate names and overlapping byte ranges, both by sorting; fills h->by_name. */
static shardopt_status_t tensors_cross_check(struct st_parse *ps, struct st_header *h)
{
    shardopt_status_t status = SHARDOPT_OK;
    struct st_ref *r;

    if (h->n == 0)
        return SHARDOPT_OK;
    r = mem_malloc((size_t)h->n * sizeof *r);
    h->by_name = mem_malloc((size_t)h->n * sizeof *h->by_name);
    if (r == NULL || h->by_name == NULL) {
        free(r);
        return out_of_memory(ps, "tensor index");
    }
    for (int i = 0; i < h->n; i++)
        r[i] = (struct st_ref){&h->t[i], i};
    qsort(r, (size_t)h->n, sizeof *r, cmp_ref_name);
    for (int i = 0; i < h->n; i++) {
        if (i > 0 && strcmp(r[i - 1].t->name, r[i].t->name) == 0) {
            status = refuse(ps, "tensor '%s' appears twice", r[i].t->name);
            goto out;
        }
        h->by_name[i] = r[i].i;
    }
    /* sorted by begin, ranges are disjoint exactly when each begins at or after the previous end */
    qsort(r, (size_t)h->n, sizeof *r, cmp_ref_offsets);
    for (int i = 1; i < h->n; i++) {
        const struct st_tensor *a = r[i - 1].t, *b = r[i].t;
        if (b->begin < a->end) {
            status =
                refuse(ps, "tensors '%s' [%llu, %llu] and '%s' [%llu, %llu]: data_offsets overlap",
                       a->name, (unsigned long long)a->begin, (unsigned long long)a->end, b->name,
                       (unsigned long long)b->begin, (unsigned long long)b->end);
            goto out;
        }
    }
out:
    free(r);
    return status;
}

/* The top-level object: "__metadata__" once, every other entry a tensor. */
static shardopt_status_t header_from_json(struct st_parse *ps, const cJSON *root,
                                          struct st_header *h)
{
    const cJSON *meta = NULL;
    shardopt_status_t status;
    int n = 0, ntotal = cJSON_GetArraySize(root);

    h->t = mem_calloc(ntotal > 0 ? (size_t)ntotal : 1, sizeof *h->t);
    if (h->t == NULL)
        return out_of_memory(ps, "tensor table");
    for (const cJSON *item = root->child; item != NULL; item = item->next, n++) {
        if (strcmp(item->string, ST_META_KEY) == 0) {
            if (meta != NULL)
                return refuse(ps, ST_META_KEY " appears twice");
            meta = item;
            continue;
        }
        status = tensor_from_json(ps, item, n, &h->t[h->n]);
        if (status != SHARDOPT_OK)
            return status;
        h->n++;
    }
    if (meta != NULL) {
        status = meta_from_json(ps, meta, h);
        if (status != SHARDOPT_OK)
            return status;
    }
    return tensors_cross_check(ps, h);
}

/* Parse the bytes as strict JSON (runtime/config/json_strict.h): from a NUL-terminated copy, so
 * that no version of cJSON can read past them. */
static shardopt_status_t header_tree(struct st_parse *ps, const char *json, size_t len,
                                     cJSON **root_p)
{
    size_t first = 0;
    char *copy;
    cJSON *root = NULL;

    while (first < len && strchr(" \t\n\r", json[first]) != NULL && json[first] != 0)
        first++;
    /* cJSON would skip a byte-order mark here, the reference reader refuses it */
    if (first >= len || json[first] != '{')
        return refuse(ps, "header must be a JSON object, it starts with %s",
                      first >= len ? "nothing" : "something else");
    copy = mem_malloc(len + 1);
    if (copy == NULL)
        return out_of_memory(ps, "header copy");
    memcpy(copy, json, len);
    copy[len] = 0;
    char why[200];
    const shardopt_status_t st =
        json_strict_parse(copy, len, JSON_STRICT_CALLER_CHECKS, &root, why, sizeof why);
    free(copy);
    if (st == SHARDOPT_ERR_OUT_OF_MEMORY)
        return out_of_memory(ps, "JSON tree");
    if (st != SHARDOPT_OK)
        return refuse(ps, "header %s", why);
    *root_p = root;
    return SHARDOPT_OK;
}

shardopt_status_t st_header_parse(const char *json, uint64_t json_len, uint64_t file_size,
                                  struct st_header *out, char *err, size_t errlen)
{
    struct st_parse ps = {err, errlen, file_size, 8 + json_len};
    struct st_header h = {0};
    shardopt_status_t status;
    size_t num_at, num_len = 0;
    cJSON *root = NULL;

    if (json == NULL || out == NULL)
        return refuse(&ps, "no header to parse");
    status = len_check(&ps, json_len); /* also bounds every allocation below */
    if (status != SHARDOPT_OK)
        return status;
    status = header_tree(&ps, json, (size_t)json_len, &root);
    if (status != SHARDOPT_OK)
        return status;
    numbers_scan((const unsigned char *)json, (size_t)json_len, &num_at, &num_len);
    h.data_start = ps.data_start;
    status = header_from_json(&ps, root, &h);
    cJSON_Delete(root);
    if (status == SHARDOPT_OK && num_at != SIZE_MAX)
        status = refuse(&ps, "header byte %zu: number '%.*s' is not written as plain digits",
                        num_at, (int)(num_len < 40 ? num_len : 40), json + num_at);
    if (status != SHARDOPT_OK) {
        st_header_free(&h);
        return status;
    }
    *out = h;
    return SHARDOPT_OK;
}

void st_header_free(struct st_header *h)
{
    if (h == NULL)
        return;
    for (int i = 0; i < h->nmeta; i++)
        free(h->meta[i].value);
    free(h->meta);
    free(h->t);
    free(h->by_name);
    memset(h, 0, sizeof *h);
}

const struct st_tensor *st_header_find(const struct st_header *h, const char *name)
{
    int lo = 0, hi;

    if (h == NULL || name == NULL || h->by_name == NULL)
        return NULL;
    hi = h->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        const struct st_tensor *t = &h->t[h->by_name[mid]];
        int c = strcmp(name, t->name);
        if (c == 0)
            return t;
        if (c < 0)
            hi = mid - 1;
        else
            lo = mid + 1;
    }
    return NULL;
}

uint64_t st_header_data_bytes(const struct st_header *h)
{
    uint64_t n = 0;
    for (int i = 0; i < h->n; i++)
        n += h->t[i].end - h->t[i].begin;
    return n;
}
