#include "classify.h"

#include <string.h>

#include "shardopt.h"

int classify_name_matches(const char *name, const char *patterns)
{
    const char *p = patterns;
    while (*p != '\0') {
        const char *end = strchr(p, ',');
        size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
        char entry[SHARDOPT_PATTERNS_MAX];
        if (len >= sizeof entry)
            len = sizeof entry - 1;
        memcpy(entry, p, len);
        entry[len] = '\0';
        if (entry[0] == '=' ? strcmp(name, entry + 1) == 0
                            : (len > 0 && strstr(name, entry) != NULL))
            return 1;
        p = end != NULL ? end + 1 : p + strlen(p);
    }
    return 0;
}

int classify_auto_is_muon(const char *name, int ndim, const int64_t *shape, const char *patterns)
{
    const int matrix = ndim >= 2 && shape[ndim - 2] > 1 && shape[ndim - 1] > 1;
    return matrix && !classify_name_matches(name, patterns);
}
