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

/* A name component that a wrapper adds, not the model: torch.compile's _orig_mod, FSDP1's
 * _fsdp_wrapped_module, activation checkpointing's _checkpoint_wrapped_module anywhere, and
 * DDP's / DataParallel's module before the model's first component. */
static int wrapper_component(const char *c, size_t len, int leading)
{
    static const char *const anywhere[] = {"_orig_mod", "_fsdp_wrapped_module",
                                           "_checkpoint_wrapped_module"};
    if (leading && len == 6 && memcmp(c, "module", 6) == 0)
        return 1;
    for (size_t i = 0; i < sizeof anywhere / sizeof anywhere[0]; i++)
        if (strlen(anywhere[i]) == len && memcmp(c, anywhere[i], len) == 0)
            return 1;
    return 0;
}

/* name equals want once the wrappers' components are left out: a trainer that registers
 * model.named_parameters() of a DDP- or compile-wrapped model has module.output.weight for
 * llama's head, which =output.weight is there to send to AdamW (before, it went to Muon,
 * silently). Compared component by component, nothing allocated. shardopt.torch has a twin,
 * _unwrapped in python/shardopt/_torch_classify.py, that cannot be this one: it classifies each
 * tensor before any runtime exists (AdamW and Muon go to different runtimes) and tries every
 * pattern, substring ones too, on the unwrapped name, where this file tries substrings on the name
 * as registered and =exact on both; one shared rule would move tensors between AdamW and Muon on
 * one side or the other. */
static int equals_unwrapped(const char *name, const char *want)
{
    const char *w = want;
    int leading = 1;
    if (strcmp(name, want) == 0) /* =module.x names a model's own module component */
        return 1;
    for (const char *c = name;;) {
        const char *dot = strchr(c, '.');
        const size_t len = dot != NULL ? (size_t)(dot - c) : strlen(c);
        if (dot != NULL && wrapper_component(c, len, leading)) {
            c = dot + 1;
            continue;
        }
        leading = 0;
        /* this component must be want's next one, followed there by the same separator */
        if (strncmp(c, w, len) != 0 || w[len] != (dot != NULL ? '.' : '\0'))
            return 0;
        if (dot == NULL)
            return 1;
        w += len + 1;
        c = dot + 1;
    }
}

static int entry_matches(const char *name, const char *entry)
{
    return entry[0] == '=' ? equals_unwrapped(name, entry + 1)
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
