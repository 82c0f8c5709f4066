/* safetensors headers, written: by hand (exact integers, our escaping), refusing any description
 * that would make a file the reader (safetensors_read.c) refuses. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "runtime/checkpoint/safetensors.h"

static int utf8_valid(const char *s) { return st_utf8_error(s) < 0; }

struct sbuf {
    char *p;
    size_t len, cap;
    int oom;
};

static void sbuf_put(struct sbuf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n)
            cap *= 2;
        char *p = mem_realloc(b->p, cap);
        if (p == NULL) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
}

static void sbuf_puts(struct sbuf *b, const char *s) { sbuf_put(b, s, strlen(s)); }

static void sbuf_u64(struct sbuf *b, uint64_t v)
{
    char t[24];
    int n = snprintf(t, sizeof t, "%llu", (unsigned long long)v);
    sbuf_put(b, t, (size_t)n);
}

/* A JSON string: quotes, backslashes and control characters escaped, UTF-8 passed through. */
static void sbuf_json_string(struct sbuf *b, const char *s)
{
    sbuf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            sbuf_put(b, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sbuf_put(b, esc, 6);
        } else {
            sbuf_put(b, (const char *)&c, 1);
        }
    }
    sbuf_put(b, "\"", 1);
}

static int cmp_tensor_name(const void *a, const void *b)
{
    return strcmp((*(const struct st_tensor *const *)a)->name,
                  (*(const struct st_tensor *const *)b)->name);
}

static int cmp_meta_key(const void *a, const void *b)
{
    return strcmp((*(const struct st_meta *const *)a)->key,
                  (*(const struct st_meta *const *)b)->key);
}

/* 1 when two of n pointers (to structs whose first member is the char array compared) are equal;
 * -1 when the scratch array cannot be allocated. */
static int has_duplicates(const void *base, size_t size, int n,
                          int (*cmp)(const void *, const void *))
{
    const void **v;
    int dup = 0;

    if (n < 2)
        return 0;
    v = mem_malloc((size_t)n * sizeof(*v));
    if (v == NULL)
        return -1;
    for (int i = 0; i < n; i++)
        v[i] = (const char *)base + (size_t)i * size;
    qsort(v, (size_t)n, sizeof(*v), cmp);
    for (int i = 1; i < n && !dup; i++)
        dup = cmp(&v[i - 1], &v[i]) == 0;
    free(v);
    return dup;
}

/* Everything st_header_parse would refuse in a description, and the offsets of a back-to-back
 * layout. */
static shardopt_status_t build_check(struct st_tensor *t, int n, const struct st_meta *meta,
                                     int nmeta)
{
    uint64_t offset = 0;
    int dup;

    if (n < 0 || nmeta < 0 || (n > 0 && t == NULL) || (nmeta > 0 && meta == NULL))
        return SHARDOPT_ERR_INVALID_ARGUMENT;
    for (int i = 0; i < n; i++) {
        uint64_t bytes;
        if (memchr(t[i].name, 0, sizeof t[i].name) == NULL || st_name_problem(t[i].name) ||
            !utf8_valid(t[i].name) || strcmp(t[i].name, ST_META_KEY) == 0)
            return SHARDOPT_ERR_INVALID_ARGUMENT;
        if ((t[i].dtype != ST_DTYPE_F32 && t[i].dtype != ST_DTYPE_BF16) || t[i].ndim < 0 ||
            t[i].ndim > ST_NDIM_MAX)
            return SHARDOPT_ERR_INVALID_ARGUMENT;
        for (int d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0 || (double)t[i].shape[d] >= ST_U53_LIMIT)
                return SHARDOPT_ERR_INVALID_ARGUMENT;
        if (!st_shape_bytes(t[i].shape, t[i].ndim, t[i].dtype, &bytes) ||
            bytes >= (uint64_t)ST_U53_LIMIT - offset)
            return SHARDOPT_ERR_INVALID_ARGUMENT;
        t[i].begin = offset;
        t[i].end = offset += bytes;
    }
    for (int i = 0; i < nmeta; i++)
        if (memchr(meta[i].key, 0, sizeof meta[i].key) == NULL || !utf8_valid(meta[i].key) ||
            meta[i].value == NULL || !utf8_valid(meta[i].value))
            return SHARDOPT_ERR_INVALID_ARGUMENT;
    dup = has_duplicates(t, sizeof *t, n, cmp_tensor_name);
    if (dup == 0)
        dup = has_duplicates(meta, sizeof *meta, nmeta, cmp_meta_key);
    if (dup < 0)
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    return dup ? SHARDOPT_ERR_INVALID_ARGUMENT : SHARDOPT_OK;
}

static void build_tensor(struct sbuf *b, const struct st_tensor *t)
{
    sbuf_json_string(b, t->name);
    sbuf_puts(b, ":{\"dtype\":\"");
    sbuf_puts(b, st_dtype_name(t->dtype));
    sbuf_puts(b, "\",\"shape\":[");
    for (int d = 0; d < t->ndim; d++) {
        if (d)
            sbuf_put(b, ",", 1);
        sbuf_u64(b, (uint64_t)t->shape[d]);
    }
    sbuf_puts(b, "],\"data_offsets\":[");
    sbuf_u64(b, t->begin);
    sbuf_put(b, ",", 1);
    sbuf_u64(b, t->end);
    sbuf_puts(b, "]}");
}

shardopt_status_t st_header_build(struct st_tensor *t, int n, const struct st_meta *meta, int nmeta,
                                  char **out, size_t *out_len)
{
    struct sbuf b = {0};
    shardopt_status_t status;
    uint64_t json_len;

    if (out == NULL || out_len == NULL)
        return SHARDOPT_ERR_INVALID_ARGUMENT;
    status = build_check(t, n, meta, nmeta);
    if (status != SHARDOPT_OK)
        return status;

    sbuf_put(&b, "\0\0\0\0\0\0\0\0", 8); /* the length, filled in below */
    sbuf_put(&b, "{", 1);
    if (nmeta > 0) {
        sbuf_puts(&b, "\"" ST_META_KEY "\":{");
        for (int i = 0; i < nmeta; i++) {
            if (i)
                sbuf_put(&b, ",", 1);
            sbuf_json_string(&b, meta[i].key);
            sbuf_put(&b, ":", 1);
            sbuf_json_string(&b, meta[i].value);
        }
        sbuf_puts(&b, n > 0 ? "}," : "}");
    }
    for (int i = 0; i < n; i++) {
        if (i)
            sbuf_put(&b, ",", 1);
        build_tensor(&b, &t[i]);
    }
    sbuf_put(&b, "}", 1);
    /* the data area starts 8-byte aligned, as the reference writer pads it */
    while (!b.oom && b.len % 8 != 0) /* out of memory, sbuf_put adds nothing: never ends */
        sbuf_put(&b, " ", 1);
    if (b.oom) {
        free(b.p);
        return SHARDOPT_ERR_OUT_OF_MEMORY;
    }
    json_len = b.len - 8;
    if (json_len > ST_HEADER_MAX) {
        free(b.p);
        return SHARDOPT_ERR_INVALID_ARGUMENT;
    }
    for (int i = 0; i < 8; i++)
        b.p[i] = (char)(unsigned char)(json_len >> (8 * i));
    *out = b.p;
    *out_len = b.len;
    return SHARDOPT_OK;
}
