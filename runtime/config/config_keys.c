#include "runtime/config/config_keys.h"

#include <ctype.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "runtime/config/json_strict.h"

static const char *const ns_coeffs_names[] = {"quintic", "jordan", "polar_express",
                                              "custom",  "aol",    NULL};
static const char *const lr_scale_names[] = {"rms_norm", "spectral_norm", "jordan", "none", NULL};
static const char *const dtype_names[] = {"fp32", "bf16", NULL};
static const char *const rounding_names[] = {"nearest", "stochastic", NULL};
static const char *const backend_names[] = {"cpu", "cuda", NULL};
static const char *const nonfinite_names[] = {"skip", "error", "zero", NULL};
static const char *const bind_names[] = {"none", "auto", NULL};
static const char *const offload_names[] = {"none", "optimizer", "cpu", NULL};
static const char *const ns_compute_names[] = {"auto", "fp32", "bf16", NULL};
static const char *const comm_backend_names[] = {"nccl", "mpi", NULL};
static const char *const device_names[] = {"current", "local_rank", NULL};
static const char *const ns_strategy_names[] = {"gather", "sharded", "auto", NULL};
static const char *const ns_algorithm_names[] = {"standard", "gram", "auto", NULL};
static const char *const ns_precondition_names[] = {"frobenius", "aol", NULL};
static const char *const kernels_names[] = {"auto",   "reference", "portable",
                                            "avx512", "avx2",      NULL};

#define OFF(f) offsetof(shardopt_config_t, f)
/* clang-format off */
#define DBL(f, lo, hi, lo_open, hi_open, doc) \
    {#f, CFG_DOUBLE, OFF(f), NULL, lo, hi, lo_open, hi_open, 0, 0, doc}
#define INT(f, lo, hi, doc) {#f, CFG_INT, OFF(f), NULL, lo, hi, 0, 0, 0, 0, doc}
#define ENUM(f, names, doc) {#f, CFG_ENUM, OFF(f), names, 0, 0, 0, 0, 0, 0, doc}
/* clang-format on */

const struct config_key config_keys[] = {
    DBL(momentum, 0, 1, 0, 1, "Muon momentum mu"),
    {"nesterov", CFG_BOOL, OFF(nesterov), NULL, 0, 1, 0, 0, 0, 0, "Nesterov momentum for Muon"},
    DBL(weight_decay, 0, 1e6, 0, 0, "Muon decoupled weight decay"),
    ENUM(ns_coeffs, ns_coeffs_names, "Newton-Schulz coefficient table"),
    INT(ns_steps, 1, SHARDOPT_NS_MAX_STEPS, "Newton-Schulz iterations (polar_express: 5-8)"),
    /* the kernels take both epsilons as fp32: below FLT_MIN (1e-300 was taken) one is 0 or a
     * denormal flushed to 0, and a zero gradient gave 0/0, every weight NaN, the step OK */
    DBL(ns_eps, CONFIG_EPS_MIN, 1, 0, 0, "epsilon in U / (|U|_F * s + eps)"),
    {"ns_norm_scale", CFG_DOUBLE, OFF(ns_norm_scale), NULL, 0.5, 2, 0, 0, 1, 0,
     "s in U / (|U|_F * s + eps); 0 = the table's (1, polar_express 1.01)"},
    {"ns_custom_coeffs", CFG_COEFFS, OFF(ns_custom_coeffs), NULL, 0, 0, 0, 0, 0, 0,
     "(a, b, c) per step for ns_coeffs = custom"},
    ENUM(lr_scale, lr_scale_names, "Muon learning-rate scale by matrix shape"),
    DBL(adamw_beta1, 0, 1, 0, 1, "AdamW beta1"),
    DBL(adamw_beta2, 0, 1, 0, 1, "AdamW beta2"),
    DBL(adamw_eps, CONFIG_EPS_MIN, 1, 0, 0, "AdamW epsilon"),
    DBL(adamw_weight_decay, 0, 1e6, 0, 0, "AdamW decoupled weight decay"),
    {"adamw_patterns", CFG_STRING, OFF(adamw_patterns), NULL, 0, 0, 0, 0, 0, 0,
     "comma-separated names sent to AdamW under algo auto (substring, or =exact)"},
    ENUM(momentum_dtype, dtype_names, "Muon momentum storage dtype"),
    ENUM(momentum_rounding, rounding_names, "rounding into bf16 optimizer state"),
    ENUM(comm_dtype, dtype_names, "dtype of Newton-Schulz input and output"),
    ENUM(param_rounding, rounding_names, "rounding into bf16 parameters"),
    {"seed", CFG_U64, OFF(seed), NULL, 0, 0, 0, 0, 0, 0, "key of the stochastic-rounding bits"},
    ENUM(backend, backend_names, "compute backend"),
    ENUM(kernels, kernels_names, "CPU kernel implementations"),
    INT(num_threads, 0, 4096, "CPU threads for kernels and BLAS; 0 = leave as set"),
    INT(dp_replicate, 1, 1 << 20, "replicas holding identical shards"),
    {"dp_shard", CFG_INT, OFF(dp_shard), NULL, 1, 1 << 20, 0, 0, 1, -1,
     "ranks sharding parameters with cp; -1 = the rest"},
    INT(cp, 1, 1 << 20, "context-parallel size"),
    INT(ep, 1, 1 << 20, "expert-parallel size"),
    ENUM(nonfinite, nonfinite_names,
         "a NaN/Inf gradient: skip the step, fail it, or step with those elements as 0"),
    {"bucket_bytes", CFG_U64, OFF(bucket_bytes), NULL, 0, 0, 0, 0, 0, 0,
     "Muon matrices per exchange bucket, in comm-dtype bytes"},
    {"replica_split", CFG_BOOL, OFF(replica_split), NULL, 0, 1, 0, 0, 0, 0,
     "replicas split the Newton-Schulz work and all-gather the results"},
    ENUM(ns_strategy, ns_strategy_names, "gather whole matrices to an owner, or keep them sharded"),
    DBL(cost_gemm_gflops, 0, 1e9, 0, 0, "cost model GEMM GFLOP/s per rank (0: by where NS runs)"),
    DBL(cost_net_gbps, 0, 1e9, 0, 0, "cost model GB/s per rank (0: by where NS runs)"),
    ENUM(adam_state_dtype, dtype_names, "AdamW first moment storage dtype"),
    ENUM(adam_v_dtype, dtype_names, "AdamW second moment storage dtype"),
    INT(keep_last, 0, 1 << 20,
        "checkpoints: keep N step directories (the one just saved, the highest others); 0 = all"),
    {"load_allow_missing", CFG_BOOL, OFF(load_allow_missing), NULL, 0, 1, 0, 0, 0, 0,
     "load: tensors the checkpoint lacks keep their current state"},
    ENUM(bind, bind_names, "thread placement at init: none, or auto"),
    ENUM(offload, offload_names, "where optimizer state lives: none, optimizer, cpu"),
    {"debug_poison_staging", CFG_BOOL, OFF(debug_poison_staging), NULL, 0, 1, 0, 0, 0, 0,
     "fill offload staging slots with NaN when released"},
    ENUM(ns_compute, ns_compute_names, "Newton-Schulz arithmetic: auto, fp32 or bf16"),
    {"host_store_limit", CFG_U64, OFF(host_store_limit), NULL, 0, 0, 0, 0, 0, 0,
     "offload: most bytes of host store; 0 = no limit"},
    ENUM(comm_backend, comm_backend_names, "CUDA backend: exchanges over nccl, or mpi via host"),
    ENUM(device, device_names, "CUDA backend: the current device, or the node-local rank's"),
    /* 0 (never) or a real duration: a positive value below a millisecond (1e-300 was taken)
     * ends the job at the first wait that is not already complete */
    {"comm_timeout_s", CFG_DOUBLE, OFF(comm_timeout_s), NULL, 1e-3, 1e6, 0, 0, 1, 0,
     "seconds before a stuck wait ends the job (MPI_Abort) or fails it (NCCL); 0 = never"},
    INT(replica_check_every, 0, 1 << 30,
        "every N steps compare parameter checksums across replicas; 0 = never"),
    INT(check_state_every, 0, 1 << 30,
        "every N steps check parameters and optimizer state for NaN/Inf before the update; "
        "0 = never"),
    {"weight_decay_1d", CFG_BOOL, OFF(weight_decay_1d), NULL, 0, 1, 0, 0, 0, 0,
     "weight decay also on 1-D tensors (norms, biases); default 0: not on them"},
    {"param_stats", CFG_BOOL, OFF(param_stats), NULL, 0, 1, 0, 0, 0, 0,
     "keep each parameter's update RMS for shardopt_param_get_stats (a copy of the shards)"},
    {"ckpt_weights", CFG_BOOL, OFF(ckpt_weights), NULL, 0, 1, 0, 0, 0, 0,
     "save and load the registered parameters too, in the checkpoint's rank files"},
    /* Newton-Schulz arithmetic (issue 23) */
    ENUM(ns_algorithm, ns_algorithm_names,
         "Newton-Schulz on X (standard), on its Gram matrix (gram), or per shape (auto)"),
    ENUM(ns_precondition, ns_precondition_names,
         "scaling before Newton-Schulz: frobenius, or aol (rows; pairs with ns_coeffs = aol)"),
    /* joint Newton-Schulz planning (issue 22) */
    {"expert_moves", CFG_BOOL, OFF(expert_moves), NULL, 0, 1, 0, 0, 0, 0,
     "whole expert matrices may leave their holder for idle members when the cost model says so"},
    INT(ns_team_cap, 1, 64, /* PLAN_TEAM_MAX */
        "largest Newton-Schulz team of a dense matrix, a power of two; 1 = one owner per matrix"),
    DBL(ns_team_frac, 0, 1, 1, 0,
        "a dense matrix costlier than this x a rank's mean Newton-Schulz share may get a team"),
};

const size_t config_key_count = sizeof config_keys / sizeof config_keys[0];

const struct config_key *config_key_find(const char *name)
{
    for (size_t i = 0; i < config_key_count; i++)
        if (strcmp(config_keys[i].name, name) == 0)
            return &config_keys[i];
    return NULL;
}

shardopt_status_t config_key_fits(const struct config_key *k, const shardopt_config_t *cfg,
                                  const char *who)
{
    const size_t bytes = k->type == CFG_DOUBLE || k->type == CFG_U64 ? 8
                         : k->type == CFG_STRING                     ? SHARDOPT_PATTERNS_MAX
                         : k->type == CFG_COEFFS                     ? sizeof cfg->ns_custom_coeffs
                                                                     : sizeof(int);
    if (k->offset + bytes <= cfg->size)
        return SHARDOPT_OK;
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT,
                    "%s: key '%s' lies past the end of this config (size %zu; the key ends at "
                    "byte %zu): the struct was built against an older shardopt.h, which has no "
                    "such field; rebuild against this header, or leave the key out",
                    who, k->name, cfg->size, k->offset + bytes);
}

void config_key_env_name(const struct config_key *k, char *out, size_t len)
{
    size_t o = (size_t)snprintf(out, len, "SHARDOPT_");
    for (const char *p = k->name; *p && o + 1 < len; p++)
        out[o++] = (char)toupper((unsigned char)*p);
    out[o < len ? o : len - 1] = '\0';
}

void config_key_accepted(const struct config_key *k, char *out, size_t len)
{
    switch (k->type) {
    case CFG_DOUBLE:
    case CFG_INT:
        if (k->has_special)
            snprintf(out, len, "%.10g or %s%.10g, %.10g%s", k->special, k->min_open ? "(" : "[",
                     k->min, k->max, k->max_open ? ")" : "]");
        else
            snprintf(out, len, "%s%.10g, %.10g%s", k->min_open ? "(" : "[", k->min, k->max,
                     k->max_open ? ")" : "]");
        break;
    case CFG_BOOL: snprintf(out, len, "true/false (1/0)"); break;
    case CFG_ENUM: {
        size_t o = (size_t)snprintf(out, len, "one of");
        for (int i = 0; k->enum_names[i] != NULL && o < len; i++)
            o += (size_t)snprintf(out + o, len - o, "%s %s", i ? "," : "", k->enum_names[i]);
        break;
    }
    case CFG_U64:
        snprintf(out, len, "an integer in [0, 2^64) (decimal digits; 5.0 or 1e3 below 2^53)");
        break;
    case CFG_STRING:
        snprintf(out, len, "UTF-8 text of at most %d bytes without control characters",
                 SHARDOPT_PATTERNS_MAX - 1);
        break;
    case CFG_COEFFS:
        snprintf(out, len,
                 "1-%d (a, b, c) triples, each number in [-%g, %g], e.g. "
                 "\"3.4445,-4.775,2.0315;...\", or %s (no table)",
                 SHARDOPT_NS_MAX_STEPS, NS_COEFF_MAX, NS_COEFF_MAX, CONFIG_COEFFS_UNUSED);
        break;
    }
}

static const void *field(const shardopt_config_t *cfg, const struct config_key *k)
{
    return (const char *)cfg + k->offset;
}

static void *field_mut(shardopt_config_t *cfg, const struct config_key *k)
{
    return (char *)cfg + k->offset;
}

static int in_range(const struct config_key *k, double v)
{
    if (isnan(v))
        return 0;
    if (k->has_special && v == k->special)
        return 1;
    if (k->min_open ? !(v > k->min) : !(v >= k->min))
        return 0;
    if (k->max_open ? !(v < k->max) : !(v <= k->max))
        return 0;
    return 1;
}

/* The refusal of a value, naming the key's source, the value and what the key accepts; an
 * integer key given a number that is not integral says so (fail_integers). */
static shardopt_status_t fail_accepted(const struct config_key *k, const char *source,
                                       const char *value, const char *what, const char *how)
{
    char acc[160];
    config_key_accepted(k, acc, sizeof acc);
    return log_fail(SHARDOPT_ERR_INVALID_ARGUMENT, "config %s = %s: accepted %s%s%s", source, value,
                    what, acc, how);
}

static shardopt_status_t fail_value(const struct config_key *k, const char *source,
                                    const char *value)
{
    return fail_accepted(k, source, value, "", "");
}

/* s is valid UTF-8 without control characters, as every parameter name is (register refuses
 * the rest): a pattern with them matches nothing, and config_print wrote its bytes raw */
static int text_is_name_like(const char *s)
{
    const unsigned char *p = (const unsigned char *)s;
    const size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        if (p[i] < 0x20 || p[i] == 0x7f)
            return 0;
        const size_t k = p[i] < 0x80 ? 1 : json_strict_utf8_seq_len(p + i, n - i);
        if (k == 0)
            return 0;
        i += k;
    }
    return 1;
}

shardopt_status_t config_key_check(const struct config_key *k, const shardopt_config_t *cfg,
                                   const char *source)
{
    char val[256];
    int ok = 1;

    switch (k->type) {
    case CFG_DOUBLE: ok = in_range(k, *(const double *)field(cfg, k)); break;
    case CFG_INT: ok = in_range(k, *(const int *)field(cfg, k)); break;
    case CFG_BOOL: ok = *(const int *)field(cfg, k) == 0 || *(const int *)field(cfg, k) == 1; break;
    case CFG_ENUM: {
        int v = *(const int *)field(cfg, k), n = 0;
        while (k->enum_names[n] != NULL)
            n++;
        ok = v >= 0 && v < n;
        break;
    }
    case CFG_STRING:
        ok = memchr(field(cfg, k), '\0', SHARDOPT_PATTERNS_MAX) != NULL &&
             text_is_name_like(field(cfg, k));
        break;
    case CFG_U64:
    case CFG_COEFFS: break; /* any value is representable; coeffs are checked with ns_steps */
    }
    if (ok)
        return SHARDOPT_OK;
    if (k->type == CFG_STRING && memchr(field(cfg, k), '\0', SHARDOPT_PATTERNS_MAX) == NULL)
        snprintf(val, sizeof val, "(not NUL-terminated)");
    else if (k->type == CFG_STRING)
        snprintf(val, sizeof val, "'%.200s'", (const char *)field(cfg, k));
    else
        config_key_format(k, cfg, val, sizeof val);
    return fail_value(k, source, val);
}

/* Length of the decimal number at s: [+-]digits[.digits][(e|E)[+-]digits], ".5" and "5." too;
 * 0 when there is none. strtod alone would also take hex ("0x1p-1"), "inf", "nan" and leading
 * whitespace, none of which a JSON file can say, and strtoll skips leading whitespace: env and
 * config_set values are held to this grammar so they accept what the file does. */
static size_t decimal_len(const char *s, int integer)
{
    const char *p = s;
    int digits = 0;

    if (*p == '+' || *p == '-')
        p++;
    for (; *p >= '0' && *p <= '9'; p++)
        digits++;
    if (!integer && *p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++)
            digits++;
    if (digits == 0)
        return 0;
    if (!integer && (*p == 'e' || *p == 'E')) {
        const char *e = p + 1;
        if (*e == '+' || *e == '-')
            e++;
        if (*e >= '0' && *e <= '9') {
            while (*e >= '0' && *e <= '9')
                e++;
            p = e;
        }
    }
    return (size_t)(p - s);
}

static int parse_double(const char *s, double *out)
{
    char *end;
    size_t n = decimal_len(s, 0);
    if (n == 0 || s[n] != '\0')
        return 0;
    errno = 0;
    *out = strtod(s, &end);
    /* a number below the smallest normal double comes back 0 (or denormal) with ERANGE: a
     * comm_timeout_s of 1e-400 read as 0 waited forever instead of failing at once */
    if (errno == ERANGE && fabs(*out) < DBL_MIN)
        return 0;
    return end == s + n;
}

/* The whole of s a decimal number (decimal_len's grammar) whose value is an integer in
 * [lo, hi]: "5.0", "5e0", "4.", "1e3"; 0 for "5.5", "1e400", "1e-400" (ERANGE) or junk. */
static int integral_text(const char *s, double lo, double hi, double *out)
{
    const size_t n = decimal_len(s, 0);
    if (n == 0 || s[n] != '\0')
        return 0;
    errno = 0;
    const double v = strtod(s, NULL);
    if (errno == ERANGE || v != floor(v) || !(v >= lo && v <= hi))
        return 0;
    *out = v;
    return 1;
}

static shardopt_status_t fail_integers(const struct config_key *k, const char *source,
                                       const char *value)
{
    return fail_accepted(k, source, value, "integers ", " (an integral number: 5, 5.0 or 5e0)");
}

static int parse_coeffs(const char *s, double (*c)[3], int *steps)
{
    int n = 0;
    const char *p = s;

    while (*p != '\0') {
        if (n == SHARDOPT_NS_MAX_STEPS)
            return 0;
        for (int j = 0; j < 3; j++) {
            char *end;
            while (*p == ' ')
                p++;
            size_t len = decimal_len(p, 0);
            errno = 0;
            double v = strtod(p, &end);
            /* below the smallest normal double: refused as parse_double refuses it */
            if (len == 0 || end != p + len || !(fabs(v) <= NS_COEFF_MAX) ||
                (errno == ERANGE && fabs(v) < DBL_MIN))
                return 0;
            c[n][j] = v;
            p = end;
            while (*p == ' ')
                p++;
            if (j < 2 && *p++ != ',')
                return 0;
        }
        n++;
        if (*p == ';')
            p++;
        else if (*p != '\0')
            return 0;
    }
    *steps = n;
    return n > 0;
}

shardopt_status_t config_key_parse(const struct config_key *k, const char *text,
                                   shardopt_config_t *cfg, int *steps_p, const char *source)
{
    char quoted[300];
    snprintf(quoted, sizeof quoted, "'%.256s'", text);

    switch (k->type) {
    case CFG_DOUBLE: {
        double v;
        if (!parse_double(text, &v) || !in_range(k, v))
            return fail_value(k, source, quoted);
        *(double *)field_mut(cfg, k) = v;
        return SHARDOPT_OK;
    }
    case CFG_INT: {
        char *end;
        size_t n = decimal_len(text, 1);
        errno = 0;
        long long v = strtoll(text, &end, 10);
        if (n == 0 || end != text + n || *end != '\0') {
            /* "5.0", "5e0", "4.": a JSON file takes an integral number for an int key, so the
             * text of config_set and SHARDOPT_<KEY> does too (it refused "5.0" as "accepted
             * [1, 16]", a range 5.0 lies in); "5.5" is refused as the file refuses it */
            double dv;
            if (!integral_text(text, -2147483648.0, 2147483647.0, &dv)) {
                const size_t nd = decimal_len(text, 0); /* a number, or no number at all */
                return nd > 0 && text[nd] == '\0' ? fail_integers(k, source, quoted)
                                                  : fail_value(k, source, quoted);
            }
            if (!in_range(k, dv))
                return fail_value(k, source, quoted);
            *(int *)field_mut(cfg, k) = (int)dv;
            return SHARDOPT_OK;
        }
        if (n == 0 || end != text + n || *end != '\0' || errno == ERANGE || !in_range(k, (double)v))
            return fail_value(k, source, quoted);
        *(int *)field_mut(cfg, k) = (int)v;
        return SHARDOPT_OK;
    }
    case CFG_BOOL: {
        static const char *const yes[] = {"1", "true", "yes", "on"};
        static const char *const no[] = {"0", "false", "no", "off"};
        for (int i = 0; i < 4; i++) {
            if (strcmp(text, yes[i]) == 0) {
                *(int *)field_mut(cfg, k) = 1;
                return SHARDOPT_OK;
            }
            if (strcmp(text, no[i]) == 0) {
                *(int *)field_mut(cfg, k) = 0;
                return SHARDOPT_OK;
            }
        }
        return fail_value(k, source, quoted);
    }
    case CFG_ENUM:
        for (int i = 0; k->enum_names[i] != NULL; i++)
            if (strcmp(text, k->enum_names[i]) == 0) {
                *(int *)field_mut(cfg, k) = i;
                return SHARDOPT_OK;
            }
        return fail_value(k, source, quoted);
    case CFG_U64: {
        char *end;
        errno = 0;
        if (text[0] < '0' || text[0] > '9')
            return fail_value(k, source, quoted);
        unsigned long long v = strtoull(text, &end, 10);
        double dv;
        /* an integral number below 2^53 written with a fraction or an exponent ("5.0", "1e3"),
         * as a JSON file takes it (exact in a double there) */
        if (*end != '\0' && integral_text(text, 0, 9007199254740991.0, &dv)) {
            *(uint64_t *)field_mut(cfg, k) = (uint64_t)dv;
            return SHARDOPT_OK;
        }
        if (*end != '\0' || errno == ERANGE)
            return fail_value(k, source, quoted);
        *(uint64_t *)field_mut(cfg, k) = v;
        return SHARDOPT_OK;
    }
    case CFG_STRING:
        if (strlen(text) >= SHARDOPT_PATTERNS_MAX || !text_is_name_like(text))
            return fail_value(k, source, quoted);
        strcpy((char *)field_mut(cfg, k), text);
        return SHARDOPT_OK;
    case CFG_COEFFS: {
        double c[SHARDOPT_NS_MAX_STEPS][3] = {{0}};
        int steps = 0;
        /* what config_key_format prints for a table not in use (ns_coeffs other than custom):
         * taken back as no table, ns_steps left alone, so that shardopt_config_print's output
         * (or a checkpoint's config) sets back key by key */
        if (strcmp(text, CONFIG_COEFFS_UNUSED) != 0 && !parse_coeffs(text, c, &steps))
            return fail_value(k, source, quoted);
        memcpy(field_mut(cfg, k), c, sizeof c);
        if (steps_p != NULL)
            *steps_p = steps;
        return SHARDOPT_OK;
    }
    }
    return log_fail(SHARDOPT_ERR_INTERNAL, "config key '%s' has no parser", k->name);
}

/* Shortest text that reads back as the same double (0.95, not 0.94999999999999996). */
static void format_double(double v, char *out, size_t len)
{
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(out, len, "%.*g", prec, v);
        if (strtod(out, NULL) == v || isnan(v))
            return;
    }
}

void config_key_format(const struct config_key *k, const shardopt_config_t *cfg, char *out,
                       size_t len)
{
    switch (k->type) {
    case CFG_DOUBLE: format_double(*(const double *)field(cfg, k), out, len); break;
    case CFG_INT: snprintf(out, len, "%d", *(const int *)field(cfg, k)); break;
    case CFG_BOOL: {
        /* a flag other than 0 or 1 (a binding's int) shows as the number validate refuses: it
         * printed "nesterov = true: accepted true/false" for 7 */
        const int v = *(const int *)field(cfg, k);
        if (v == 0 || v == 1)
            snprintf(out, len, "%s", v ? "true" : "false");
        else
            snprintf(out, len, "%d", v);
        break;
    }
    case CFG_ENUM: {
        int v = *(const int *)field(cfg, k), n = 0;
        while (k->enum_names[n] != NULL)
            n++;
        if (v >= 0 && v < n)
            snprintf(out, len, "%s", k->enum_names[v]);
        else
            snprintf(out, len, "%d", v);
        break;
    }
    case CFG_U64:
        snprintf(out, len, "%llu", (unsigned long long)*(const uint64_t *)field(cfg, k));
        break;
    case CFG_STRING:
        snprintf(out, len, "%.*s", SHARDOPT_PATTERNS_MAX - 1, (const char *)field(cfg, k));
        break;
    case CFG_COEFFS: {
        const double(*c)[3] = field(cfg, k);
        int steps = cfg->ns_coeffs == SHARDOPT_NS_CUSTOM ? cfg->ns_steps : 0;
        size_t o = 0;
        out[0] = '\0';
        if (steps < 1 || steps > SHARDOPT_NS_MAX_STEPS) {
            snprintf(out, len, CONFIG_COEFFS_UNUSED);
            break;
        }
        /* each number as it round-trips (format_double): with 9 digits two ranks whose
         * coefficients differed (straddling the midpoint of two floats: different fp32 tables
         * in Newton-Schulz) printed the same text, so init's agreement took them */
        char num[3][32];
        for (int i = 0; i < steps && o < len; i++) {
            for (int j = 0; j < 3; j++)
                format_double(c[i][j], num[j], sizeof num[j]);
            o += (size_t)snprintf(out + o, len - o, "%s%s,%s,%s", i ? ";" : "", num[0], num[1],
                                  num[2]);
        }
        break;
    }
    }
}
