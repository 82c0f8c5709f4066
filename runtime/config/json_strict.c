/* Strict JSON: a byte scan for what cJSON lets through, then cJSON on exactly the text's bytes,
 * then the end of the text and the keys of every object. */
#include "runtime/config/json_strict.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "runtime/config/json_util.h"

static shardopt_status_t fail(char *err, size_t errlen, shardopt_status_t status, const char *fmt,
                              ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return status;
}

size_t json_strict_utf8_seq_len(const unsigned char *s, size_t n)
{
    unsigned c = s[0];
    size_t len;
    unsigned min, cp;

    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF)
        len = 2, min = 0x80, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF)
        len = 3, min = 0x800, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4)
        len = 4, min = 0x10000, cp = c & 0x07;
    else
        return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return len;
}

static int is_blank(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
static int is_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* s[0, n) is a number as JSON writes it: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static int number_is_json(const unsigned char *s, size_t n)
{
    size_t i = 0;
    if (i < n && s[i] == '-')
        i++;
    if (i < n && s[i] == '0')
        i++;
    else if (i < n && s[i] >= '1' && s[i] <= '9')
        while (i < n && is_digit(s[i]))
            i++;
    else
        return 0;
    if (i < n && s[i] == '.') {
        size_t d = ++i;
        while (i < n && is_digit(s[i]))
            i++;
        if (i == d)
            return 0;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        size_t d = i;
        while (i < n && is_digit(s[i]))
            i++;
        if (i == d)
            return 0;
    }
    return i == n;
}

/* The byte checks; cJSON checks the grammar of everything else. */
static shardopt_status_t scan(const unsigned char *s, size_t n, unsigned flags, char *err,
                              size_t errlen)
{
    int in_string = 0;
    char num[1024];
    for (size_t i = 0; i < n;) {
        const unsigned char c = s[i];
        if (c == 0)
            return fail(err, errlen, SHARDOPT_ERR_CORRUPT, "byte %zu is a NUL byte", i);
        if (c >= 0x80) {
            const size_t k = json_strict_utf8_seq_len(s + i, n - i);
            if (k == 0)
                return fail(err, errlen, SHARDOPT_ERR_CORRUPT, "byte %zu: invalid UTF-8", i);
            i += k;
        } else if (in_string) {
            if (c < 0x20)
                return fail(err, errlen, SHARDOPT_ERR_CORRUPT,
                            "byte %zu: unescaped control character 0x%02x in a string", i, c);
            /* cJSON would end the string at the NUL this escape makes: a key or value cut short */
            if (c == '\\' && i + 6 <= n && s[i + 1] == 'u' && memcmp(s + i + 2, "0000", 4) == 0)
                return fail(err, errlen, SHARDOPT_ERR_CORRUPT, "byte %zu: \\u0000 in a string", i);
            in_string = c != '"';
            /* an escape's second byte is never the string's end (a non-ASCII one is checked as
             * UTF-8 above, and cJSON refuses the escape) */
            i += c == '\\' && i + 1 < n && s[i + 1] < 0x80 ? 2 : 1;
        } else if (c == '"') {
            in_string = 1;
            i++;
        } else if (c < 0x20 && !is_blank(c)) {
            return fail(err, errlen, SHARDOPT_ERR_CORRUPT, "byte %zu: control character 0x%02x", i,
                        c);
        } else if (c == '-' || is_digit(c)) {
            size_t j = i;
            while (j < n && s[j] != 0 && strchr("0123456789+-.eE", s[j]) != NULL)
                j++;
            const int len = (int)(j - i < 40 ? j - i : 40);
            int plain = 1;
            for (size_t k = i; k < j; k++)
                plain &= is_digit(s[k]);
            plain &= s[i] != '0' || j - i == 1;
            if ((flags & JSON_STRICT_CALLER_CHECKS) == 0) {
                if (!number_is_json(s + i, j - i))
                    return fail(err, errlen, SHARDOPT_ERR_CORRUPT,
                                "byte %zu: number '%.*s' is not written as JSON writes numbers", i,
                                len, (const char *)s + i);
                if (j - i >= sizeof num)
                    return fail(err, errlen, SHARDOPT_ERR_CORRUPT,
                                "byte %zu: number '%.*s...' of %zu characters: at most %zu", i, len,
                                (const char *)s + i, j - i, sizeof num - 1);
                /* below the smallest normal double it reads as 0 (or a denormal): a key
                 * written 1e-400 would hold 0, which often means "never" or "off" */
                memcpy(num, s + i, j - i);
                num[j - i] = '\0';
                errno = 0;
                const double v = strtod(num, NULL);
                if (errno == ERANGE && fabs(v) < DBL_MIN)
                    return fail(err, errlen, SHARDOPT_ERR_CORRUPT,
                                "byte %zu: number '%.*s' is too small for a double (it would "
                                "read as %g)",
                                i, len, (const char *)s + i, v);
                if ((flags & JSON_STRICT_INTEGERS) && !plain)
                    return fail(err, errlen, SHARDOPT_ERR_CORRUPT,
                                "byte %zu: number '%.*s' is not a non-negative integer written "
                                "in plain digits (every number here is one)",
                                i, len, (const char *)s + i);
            }
            i = j;
        } else {
            i++;
        }
    }
    return SHARDOPT_OK;
}

static int by_key(const void *a, const void *b)
{
    return strcmp((*(const cJSON *const *)a)->string, (*(const cJSON *const *)b)->string);
}

/* A key given twice would be read as whichever the reader looks up first: refused everywhere.
 * Objects of a few keys compare pairwise; larger ones (a header's tensors) sort. cJSON's nesting
 * limit bounds the recursion. */
static shardopt_status_t keys_unique(const cJSON *v, char *err, size_t errlen)
{
    if (cJSON_IsObject(v)) {
        const int n = cJSON_GetArraySize(v);
        const cJSON *dup = NULL;
        if (n <= 16) {
            for (const cJSON *a = v->child; a != NULL && dup == NULL; a = a->next)
                for (const cJSON *b = a->next; b != NULL && dup == NULL; b = b->next)
                    if (strcmp(a->string, b->string) == 0)
                        dup = b;
        } else {
            const cJSON **by = mem_malloc(sizeof(*by) * (size_t)n);
            if (by == NULL)
                return fail(err, errlen, SHARDOPT_ERR_OUT_OF_MEMORY,
                            "out of memory allocating %zu bytes to check an object's %d keys",
                            sizeof(*by) * (size_t)n, n);
            int k = 0;
            for (const cJSON *a = v->child; a != NULL; a = a->next)
                by[k++] = a;
            qsort(by, (size_t)n, sizeof(*by), by_key);
            for (int i = 1; i < n && dup == NULL; i++)
                if (strcmp(by[i - 1]->string, by[i]->string) == 0)
                    dup = by[i];
            free(by);
        }
        if (dup != NULL)
            return fail(err, errlen, SHARDOPT_ERR_CORRUPT,
                        "key '%.128s' appears twice in one object", dup->string);
    }
    for (const cJSON *c = v->child; c != NULL; c = c->next) {
        const shardopt_status_t st = keys_unique(c, err, errlen);
        if (st != SHARDOPT_OK)
            return st;
    }
    return SHARDOPT_OK;
}

shardopt_status_t json_strict_parse(const char *text, size_t len, unsigned flags, cJSON **out,
                                    char *err, size_t errlen)
{
    const unsigned char *s = (const unsigned char *)text;
    const char *end = NULL;
    char nb[64];
    size_t first = 0;

    if (text == NULL || out == NULL)
        return fail(err, errlen, SHARDOPT_ERR_CORRUPT, "no text");
    shardopt_status_t st = scan(s, len, flags, err, errlen);
    if (st != SHARDOPT_OK)
        return st;
    while (first < len && is_blank(s[first]))
        first++;
    if (first == len)
        return fail(err, errlen, SHARDOPT_ERR_CORRUPT, "byte %zu: no JSON value (only blanks)",
                    len);
    /* cJSON skips a byte-order mark; JSON text starts with a value */
    if (strchr("{[\"-0123456789tfn", s[first]) == NULL)
        return fail(err, errlen, SHARDOPT_ERR_CORRUPT, "byte %zu: not the start of a JSON value",
                    first);
    mem_failed_clear();
    errno = 0;
    cJSON *root = cJSON_ParseWithLengthOpts(text + first, len - first, &end, 0);
    if (root == NULL && json_parse_oom())
        return fail(err, errlen, SHARDOPT_ERR_OUT_OF_MEMORY, "out of memory allocating %s",
                    json_oom_bytes(nb, sizeof nb));
    if (root == NULL)
        return fail(err, errlen, SHARDOPT_ERR_CORRUPT, "byte %zu: not valid JSON",
                    end != NULL && end >= text && end <= text + len ? (size_t)(end - text) : first);
    for (size_t i = (size_t)(end - text); i < len; i++)
        if (!is_blank(s[i])) {
            st = fail(err, errlen, SHARDOPT_ERR_CORRUPT, "byte %zu: text after the JSON %s", i,
                      cJSON_IsObject(root) ? "object" : "value");
            cJSON_Delete(root);
            return st;
        }
    if ((flags & JSON_STRICT_CALLER_CHECKS) == 0) {
        st = keys_unique(root, err, errlen);
        if (st != SHARDOPT_OK) {
            cJSON_Delete(root);
            return st;
        }
    }
    *out = root;
    return SHARDOPT_OK;
}
