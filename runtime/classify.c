#include "runtime/classify.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "shardopt.h"

/* The next entry of patterns at *p, spaces around it trimmed ("embed, lm_head" is two entries,
 * the second "lm_head"), into entry; advances *p. Returns 0 at the end. */
static int next_entry(const char **p, char *entry, size_t cap)
{
    const char *s = *p;
    if (*s == '\0')
        return 0;
    const char *end = strchr(s, ',');
    size_t len = end != NULL ? (size_t)(end - s) : strlen(s);
    *p = end != NULL ? end + 1 : s + len;
    while (len > 0 && isspace((unsigned char)*s)) {
        s++;
        len--;
    }
    while (len > 0 && isspace((unsigned char)s[len - 1]))
        len--;
    if (len >= cap)
        len = cap - 1;
    memcpy(entry, s, len);
    entry[len] = '\0';
    return 1;
}

static int entry_matches(const char *name, const char *entry)
{
    return entry[0] == '=' ? strcmp(name, entry + 1) == 0
                           : (entry[0] != '\0' && strstr(name, entry) != NULL);
}

int classify_name_matches(const char *name, const char *patterns)
{
    const char *p = patterns;
    char entry[SHARDOPT_PATTERNS_MAX];
    while (next_entry(&p, entry, sizeof entry))
        if (entry_matches(name, entry))
            return 1;
    return 0;
}

int classify_unmatched(const char *patterns, const char *const *names, int n, char *out, size_t len)
{
    const char *p = patterns;
    char entry[SHARDOPT_PATTERNS_MAX];
    int count = 0;
    size_t o = 0;
    out[0] = '\0';
    while (next_entry(&p, entry, sizeof entry)) {
        int hit = entry[0] == '\0'; /* an empty entry (",,") matches nothing by design */
        for (int i = 0; i < n && !hit; i++)
            hit = entry_matches(names[i], entry);
        if (hit)
            continue;
        if (o < len)
            o += (size_t)snprintf(out + o, len - o, "%s'%s'", count ? ", " : "", entry);
        count++;
    }
    return count;
}

int classify_auto_is_muon(const char *name, int ndim, const int64_t *shape, const char *patterns)
{
    const int matrix = ndim >= 2 && shape[ndim - 2] > 1 && shape[ndim - 1] > 1;
    return matrix && !classify_name_matches(name, patterns);
}
