/* bf16 Newton-Schulz (ns_bf16.h): the oneDNN engine, and the plans ns_bf16_prepare makes at
 * commit (one matmul primitive per product, per working shape, variant and coefficient set, and
 * the scratchpad they share); running them in the step is ns_bf16_run.c. */
#include "ns_bf16.h"

#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdio.h>
#if defined(__x86_64__) && defined(__clang__)
#include <cpuid.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../dtype.h"
#include "../ns_coeffs.h"
#include "base/mem.h"
#include "base/status.h"
#include "ns_bf16_plan.h"
#include "ns_common.h"

static const char *dnnl_what(dnnl_status_t s)
{
    switch (s) {
    case dnnl_out_of_memory: return "out of memory";
    case dnnl_invalid_arguments: return "invalid arguments";
    case dnnl_unimplemented: return "no implementation";
    default: return "error";
    }
}

shardopt_status_t ns_bf16_create(struct ns_bf16 **out)
{
    struct ns_bf16 *b = mem_calloc(1, sizeof *b);
    dnnl_status_t s = dnnl_success;

    *out = NULL;
    if (b == NULL)
        return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "bf16 Newton-Schulz: out of memory allocating %zu bytes for its state",
                          sizeof *b);
    s = dnnl_engine_create(&b->engine, dnnl_cpu, 0);
    if (s == dnnl_success)
        s = dnnl_stream_create(&b->stream, b->engine, dnnl_stream_default_flags);
    if (s != dnnl_success) {
        ns_bf16_destroy(b);
        return status_set(SHARDOPT_ERR_INTERNAL, "bf16 Newton-Schulz: oneDNN CPU engine: %s",
                          dnnl_what(s));
    }
    *out = b;
    return SHARDOPT_OK;
}

static void mm_free(struct mm *x)
{
    if (x->p != NULL)
        dnnl_primitive_destroy(x->p);
    if (x->src != NULL)
        dnnl_memory_destroy(x->src);
    if (x->wei != NULL)
        dnnl_memory_destroy(x->wei);
    if (x->dst != NULL)
        dnnl_memory_destroy(x->dst);
    memset(x, 0, sizeof *x);
}

static void plan_free(struct plan *p)
{
    for (int i = 0; i < p->nrow; i++) {
        mm_free(&p->gram[i]);
        for (int s = 0; s < p->steps; s++)
            mm_free(&p->aa[i][s]);
    }
    for (int s = 0; s < p->steps; s++)
        mm_free(&p->bx[s]);
    for (int i = 0; i < p->nrow; i++)
        mm_free(&p->pq[i]);
    mm_free(&p->qx);
    mm_free(&p->full);
    free(p);
}

static void shard_free(struct ns_bf16_shard *p)
{
    mm_free(&p->gram);
    for (int s = 0; s < p->steps; s++) {
        mm_free(&p->aa[s]);
        mm_free(&p->bx[s]);
    }
    free(p);
}

void ns_bf16_destroy(struct ns_bf16 *b)
{
    if (b == NULL)
        return;
    for (int i = 0; i < b->nplans; i++)
        plan_free(b->plans[i]);
    free(b->plans);
    for (int i = 0; i < b->nshards; i++)
        shard_free(b->shards[i]);
    free(b->shards);
    if (b->scratch_mem != NULL)
        dnnl_memory_destroy(b->scratch_mem);
    free(b->scratch);
    free(b->fb_buf);
    if (b->stream != NULL)
        dnnl_stream_destroy(b->stream);
    if (b->engine != NULL)
        dnnl_engine_destroy(b->engine);
    free(b);
}

static int fallback_forced; /* ns_bf16_fallback_force */

void ns_bf16_fallback_force(int on) { fallback_forced = on != 0; }

int ns_bf16_fallback_count(const struct ns_bf16 *b) { return b != NULL ? b->fallbacks : 0; }

/* A rows x cols view of bf16 storage with leading dimension ld: element (i, j) at i * ld + j,
 * or, transposed, at j * ld + i (X^T read from the rows of X). */
static dnnl_status_t view_md(dnnl_memory_desc_t *md, int64_t rows, int64_t cols, int64_t ld,
                             int transposed)
{
    const dnnl_dims_t dims = {rows, cols};
    const dnnl_dims_t strides = {transposed ? 1 : ld, transposed ? ld : 1};
    return dnnl_memory_desc_init_by_strides(md, 2, dims, dnnl_bf16, strides);
}

/* dst[M x N] (ld ldc) = oscale * src[M x K] (ld lda) * wei[K x N] (+ sum * dst), wei read from
 * rows of ld ldb, or from its transpose's rows when wei_t (X X^T takes X's rows as columns). */
static shardopt_status_t mm_make(struct ns_bf16 *b, struct mm *x, int64_t M, int64_t K, int64_t N,
                                 int64_t lda, int64_t ldb, int wei_t, int64_t ldc, float oscale,
                                 float sum)
{
    dnnl_memory_desc_t a, w, c;
    dnnl_matmul_desc_t md;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    dnnl_status_t s;

    s = view_md(&a, M, K, lda, 0);
    if (s == dnnl_success)
        s = view_md(&w, K, N, ldb, wei_t);
    if (s == dnnl_success)
        s = view_md(&c, M, N, ldc, 0);
    if (s == dnnl_success)
        s = dnnl_matmul_desc_init(&md, &a, &w, NULL, &c);
    if (s == dnnl_success)
        s = dnnl_primitive_attr_create(&attr);
    if (s == dnnl_success)
        s = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user);
    if (s == dnnl_success && oscale != 1.0f)
        s = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &oscale);
    if (s == dnnl_success && sum != 0.0f) {
        s = dnnl_post_ops_create(&po);
        if (s == dnnl_success)
            s = dnnl_post_ops_append_sum(po, sum);
        if (s == dnnl_success)
            s = dnnl_primitive_attr_set_post_ops(attr, po);
    }
    if (s == dnnl_success)
        s = fallback_forced ? dnnl_unimplemented
                            : dnnl_primitive_desc_create(&pd, &md, attr, b->engine, NULL);
    if (s == dnnl_unimplemented) { /* this CPU: the fp32 sgemm fallback (ns_bf16_plan.h) */
        *x = (struct mm){.fb = 1,
                         .wei_t = wei_t,
                         .M = M,
                         .K = K,
                         .N = N,
                         .lda = lda,
                         .ldb = ldb,
                         .ldc = ldc,
                         .oscale = oscale,
                         .sum = sum};
        const size_t need = (size_t)(M * K + K * N + M * N);
        if (need > b->fb_floats)
            b->fb_floats = need;
        if (b->impl[0] == '\0')
            snprintf(b->impl, sizeof b->impl, "fp32 sgemm on bf16 values (no oneDNN bf16)");
        b->primitives++;
        b->fallbacks++;
        s = dnnl_success;
    } else if (s == dnnl_success)
        s = dnnl_primitive_create(&x->p, pd);
    if (s == dnnl_success && !x->fb)
        s = dnnl_memory_create(&x->src, &a, b->engine, DNNL_MEMORY_NONE);
    if (s == dnnl_success && !x->fb)
        s = dnnl_memory_create(&x->wei, &w, b->engine, DNNL_MEMORY_NONE);
    if (s == dnnl_success && !x->fb)
        s = dnnl_memory_create(&x->dst, &c, b->engine, DNNL_MEMORY_NONE);
    if (s == dnnl_success && !x->fb) {
        const char *impl = NULL;
        const dnnl_memory_desc_t *sp =
            dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
        const size_t need = sp != NULL ? dnnl_memory_desc_get_size(sp) : 0;
        if (need > b->scratch_bytes)
            b->scratch_bytes = need; /* allocated once the plan is complete */
        if (b->impl[0] == '\0' &&
            dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &impl) == dnnl_success)
            snprintf(b->impl, sizeof b->impl, "%s", impl);
        b->primitives++;
    }
    if (pd != NULL)
        dnnl_primitive_desc_destroy(pd);
    if (po != NULL)
        dnnl_post_ops_destroy(po);
    if (attr != NULL)
        dnnl_primitive_attr_destroy(attr);
    if (s != dnnl_success) /* this CPU, not this matrix; or out of memory inside oneDNN */
        return status_set(s == dnnl_unimplemented   ? SHARDOPT_ERR_UNSUPPORTED
                          : s == dnnl_out_of_memory ? SHARDOPT_ERR_OUT_OF_MEMORY
                                                    : SHARDOPT_ERR_INTERNAL,
                          "bf16 Newton-Schulz: oneDNN matmul [%lld x %lld] x [%lld x %lld]: %s",
                          (long long)M, (long long)K, (long long)K, (long long)N, dnnl_what(s));
    return SHARDOPT_OK;
}

/* uniq[s]: the first step with step s's triple (one primitive per distinct triple) */
static void uniq_of(const float (*coeffs)[3], int steps, int *uniq)
{
    for (int s = 0; s < steps; s++) {
        uniq[s] = s;
        for (int t = 0; t < s; t++)
            if (memcmp(coeffs[t], coeffs[s], sizeof(float) * 3) == 0) {
                uniq[s] = t;
                break;
            }
    }
}

struct plan *ns_bf16_plan_find(const struct ns_bf16 *b, int64_t m, int64_t n, int variant,
                               int block, int algorithm, const float (*coeffs)[3], int steps)
{
    for (int i = 0; i < b->nplans; i++) {
        const struct plan *p = b->plans[i];
        if (p->m == m && p->n == n && p->variant == variant && p->algorithm == algorithm &&
            (variant == NS_VARIANT_PLAIN || p->block == block) && p->steps == steps &&
            memcmp(p->coeffs, coeffs, sizeof(float) * 3 * (size_t)steps) == 0)
            return b->plans[i];
    }
    return NULL;
}

static shardopt_status_t scratch_fit(struct ns_bf16 *b)
{
    const dnnl_dims_t dims = {(int64_t)(b->scratch_bytes ? b->scratch_bytes : 1)};
    dnnl_memory_desc_t md;

    if (b->fb_floats > b->fb_have) { /* at commit, as the scratchpad: the step allocates nothing */
        size_t fb_bytes = 0;
        if (b->fb_floats > SIZE_MAX / sizeof(float) ||
            !mem_align_up(b->fb_floats * sizeof(float), 64, &fb_bytes))
            return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "bf16 Newton-Schulz: the fp32 fallback's operands, %zu floats, "
                              "pass SIZE_MAX bytes",
                              b->fb_floats);
        free(b->fb_buf);
        b->fb_have = 0;
        b->fb_buf = mem_aligned_alloc(64, fb_bytes);
        if (b->fb_buf == NULL)
            return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                              "bf16 Newton-Schulz: out of memory allocating %zu bytes for the "
                              "fp32 fallback's operands",
                              b->fb_floats * sizeof(float));
        b->fb_have = b->fb_floats;
    }
    if (b->scratch_mem != NULL) {
        const dnnl_memory_desc_t *have;
        dnnl_memory_get_memory_desc(b->scratch_mem, &have);
        if (dnnl_memory_desc_get_size(have) >= b->scratch_bytes)
            return SHARDOPT_OK;
        dnnl_memory_destroy(b->scratch_mem);
        b->scratch_mem = NULL;
    }
    size_t bytes = 0; /* a whole number of cache lines, and one more */
    if (!mem_align_up(b->scratch_bytes, 64, &bytes) || bytes > SIZE_MAX - 64)
        return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "bf16 Newton-Schulz: a scratchpad of %zu bytes passes SIZE_MAX",
                          b->scratch_bytes);
    bytes += 64;
    free(b->scratch);
    b->scratch = mem_aligned_alloc(64, bytes);
    if (b->scratch == NULL)
        return status_set(
            SHARDOPT_ERR_OUT_OF_MEMORY,
            "bf16 Newton-Schulz: out of memory allocating %zu bytes for the scratchpad", bytes);
    if (dnnl_memory_desc_init_by_tag(&md, 1, dims, dnnl_u8, dnnl_a) != dnnl_success ||
        dnnl_memory_create(&b->scratch_mem, &md, b->engine, b->scratch) != dnnl_success)
        return status_set(SHARDOPT_ERR_INTERNAL, "bf16 Newton-Schulz: scratchpad of %zu bytes",
                          b->scratch_bytes);
    return SHARDOPT_OK;
}

shardopt_status_t ns_bf16_prepare(struct ns_bf16 *b, int64_t rows, int64_t cols, int variant,
                                  int block, int algorithm, const float (*coeffs)[3], int steps)
{
    const int64_t m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
    struct plan *p;
    shardopt_status_t rc = SHARDOPT_OK;

    /* the runtime resolved these: another value is a bug, not a user's choice */
    if (variant != NS_VARIANT_PLAIN && variant != NS_VARIANT_SYMMETRIC)
        return status_set(SHARDOPT_ERR_INTERNAL, "bf16 Newton-Schulz: unknown variant %d", variant);
    if (algorithm != NS_ALGO_STANDARD && algorithm != NS_ALGO_GRAM)
        return status_set(SHARDOPT_ERR_INTERNAL, "bf16 Newton-Schulz: unknown algorithm %d",
                          algorithm);
    if (steps < 1 || steps > NS_TABLE_MAX_STEPS)
        return status_set(SHARDOPT_ERR_INTERNAL, "bf16 Newton-Schulz: %d steps", steps);
    if (variant == NS_VARIANT_SYMMETRIC && (block < 1 || (m + block - 1) / block > BF16_MAX_ROWS))
        return status_set(SHARDOPT_ERR_INTERNAL,
                          "bf16 Newton-Schulz: block %d for %lld rows (at most %d block rows)",
                          block, (long long)m, BF16_MAX_ROWS);
    if (ns_bf16_plan_find(b, m, n, variant, block, algorithm, coeffs, steps) != NULL)
        return SHARDOPT_OK;
    if (b->nplans == b->cap) {
        int cap = b->cap ? 2 * b->cap : 8;
        struct plan **np = mem_realloc(b->plans, sizeof(*np) * (size_t)cap);
        if (np == NULL)
            return status_set(
                SHARDOPT_ERR_OUT_OF_MEMORY,
                "bf16 Newton-Schulz: out of memory allocating %zu bytes for the plan list",
                sizeof(*np) * (size_t)cap);
        b->plans = np;
        b->cap = cap;
    }
    p = mem_calloc(1, sizeof *p);
    if (p == NULL)
        return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "bf16 Newton-Schulz: out of memory allocating %zu bytes for a plan",
                          sizeof *p);
    p->m = m;
    p->n = n;
    p->variant = variant;
    p->algorithm = algorithm;
    p->block = variant == NS_VARIANT_SYMMETRIC ? block : (int)m;
    p->nrow = variant == NS_VARIANT_SYMMETRIC ? (int)((m + block - 1) / block) : 1;
    p->steps = steps;
    memcpy(p->coeffs, coeffs, sizeof(float) * 3 * steps);
    uniq_of(coeffs, steps, p->uniq);
    for (int i = 0; i < p->nrow && rc == SHARDOPT_OK; i++) {
        const int64_t r0 = (int64_t)i * p->block;
        const int64_t M = (r0 + p->block < m ? r0 + p->block : m) - r0, N = m - r0;
        /* A[r0:r1, r0:m] = X[r0:r1, :] X[r0:m, :]^T;  B[r0:r1, r0:m] = c A[r0:r1, :] A[:, r0:m]
         * + b B[r0:r1, r0:m] (B holding a copy of A) */
        rc = mm_make(b, &p->gram[i], M, n, N, n, n, 1, m, 1.0f, 0.0f);
        for (int s = 0; s < steps && rc == SHARDOPT_OK; s++)
            if (p->uniq[s] == s)
                rc =
                    mm_make(b, &p->aa[i][s], M, m, N, m, m, 0, m, p->coeffs[s][2], p->coeffs[s][1]);
        /* C[r0:r1, r0:m] = P[r0:r1, :] Q[:, r0:m] */
        if (algorithm == NS_ALGO_GRAM && rc == SHARDOPT_OK)
            rc = mm_make(b, &p->pq[i], M, m, N, m, m, 0, m, 1.0f, 0.0f);
    }
    if (algorithm == NS_ALGO_GRAM && rc == SHARDOPT_OK) /* Y = Q X */
        rc = mm_make(b, &p->qx, m, m, n, m, n, 0, n, 1.0f, 0.0f);
    if (algorithm == NS_ALGO_GRAM && rc == SHARDOPT_OK) /* C = P Q */
        rc = mm_make(b, &p->full, m, m, m, m, m, 0, m, 1.0f, 0.0f);
    /* Y = B X + a Y (Y holding a copy of X) */
    for (int s = 0; s < steps && rc == SHARDOPT_OK; s++)
        if (p->uniq[s] == s)
            rc = mm_make(b, &p->bx[s], m, m, n, m, n, 0, n, 1.0f, p->coeffs[s][0]);
    b->plans[b->nplans++] = p; /* freed with b even when incomplete */
    if (rc == SHARDOPT_OK)
        rc = scratch_fit(b);
    if (rc != SHARDOPT_OK) {
        b->nplans--;
        plan_free(p);
    }
    return rc;
}

const struct ns_bf16_shard *ns_bf16_shard_find(const struct ns_bf16 *b, int64_t m, int64_t n,
                                               const float (*coeffs)[3], int steps)
{
    for (int i = 0; b != NULL && i < b->nshards; i++) {
        const struct ns_bf16_shard *p = b->shards[i];
        if (p->m == m && p->n == n && p->steps == steps &&
            memcmp(p->coeffs, coeffs, sizeof(float) * 3 * (size_t)steps) == 0)
            return p;
    }
    return NULL;
}

shardopt_status_t ns_bf16_shard_prepare(struct ns_bf16 *b, int64_t m, int64_t n,
                                        const float (*coeffs)[3], int steps)
{
    shardopt_status_t rc = SHARDOPT_OK;

    if (steps < 1 || steps > NS_TABLE_MAX_STEPS || m < 1 || n < 1)
        return status_set(SHARDOPT_ERR_INTERNAL,
                          "bf16 Newton-Schulz: a team block of %lld x %lld, %d steps", (long long)m,
                          (long long)n, steps);
    if (ns_bf16_shard_find(b, m, n, coeffs, steps) != NULL)
        return SHARDOPT_OK;
    if (b->nshards == b->shard_cap) {
        int cap = b->shard_cap ? 2 * b->shard_cap : 8;
        struct ns_bf16_shard **np = mem_realloc(b->shards, sizeof(*np) * (size_t)cap);
        if (np == NULL)
            return status_set(
                SHARDOPT_ERR_OUT_OF_MEMORY,
                "bf16 Newton-Schulz: out of memory allocating %zu bytes for the team plan list",
                sizeof(*np) * (size_t)cap);
        b->shards = np;
        b->shard_cap = cap;
    }
    struct ns_bf16_shard *p = mem_calloc(1, sizeof *p);
    if (p == NULL)
        return status_set(SHARDOPT_ERR_OUT_OF_MEMORY,
                          "bf16 Newton-Schulz: out of memory allocating %zu bytes for a team plan",
                          sizeof *p);
    p->m = m;
    p->n = n;
    p->steps = steps;
    memcpy(p->coeffs, coeffs, sizeof(float) * 3 * (size_t)steps);
    uniq_of(coeffs, steps, p->uniq);
    /* A = X X^T, the block's part of the team's Gram matrix */
    rc = mm_make(b, &p->gram, m, n, m, n, n, 1, m, 1.0f, 0.0f);
    for (int s = 0; s < steps && rc == SHARDOPT_OK; s++) {
        if (p->uniq[s] != s)
            continue;
        /* B = c A A + b B (B a copy of A); then Y = B X + a Y (Y a copy of X). Every block,
         * narrower than m or not: the fp32 kernels' narrow form Y = a X + A (b X + c A X)
         * (kernels/ns_shape.h, ns_shard_narrow), with V = b X + c A X rounded to bf16 in place
         * of B, doubled the error: the team iteration measured 1.12e-2 against fp64 at 128 x
         * 384 in blocks narrower than m instead of 5.6e-3 (test_ns_bf16), and bf16+AOL teams
         * 1.36e-2 against one owner instead of 9.2e-3 (test_ns_teams), too close to the bound
         * of 1.5e-2. Its FLOPs are counted so (ns_shard_iter_flops' narrow_ok 0). */
        rc = mm_make(b, &p->aa[s], m, m, m, m, m, 0, m, p->coeffs[s][2], p->coeffs[s][1]);
        if (rc == SHARDOPT_OK)
            rc = mm_make(b, &p->bx[s], m, m, n, m, n, 0, n, 1.0f, p->coeffs[s][0]);
    }
    b->shards[b->nshards++] = p; /* freed with b even when incomplete */
    if (rc == SHARDOPT_OK)
        rc = scratch_fit(b);
    if (rc != SHARDOPT_OK) {
        b->nshards--;
        shard_free(p);
    }
    return rc;
}

int ns_bf16_primitive_count(const struct ns_bf16 *b) { return b != NULL ? b->primitives : 0; }

/* A 16 x 16 plan prepared: 1 if it could be (and, with onednn, none of it fell back). */
static int probe(char *why, size_t len, int onednn)
{
    static const float c[NS_TABLE_MAX_STEPS][3] = {{3.4445f, -4.7750f, 2.0315f}};
    char was[1024];
    struct ns_bf16 *b = NULL;
    /* a question, not a failure: the thread's last error is left as it was */
    snprintf(was, sizeof was, "%s", shardopt_last_error());
    int ok = ns_bf16_create(&b) == SHARDOPT_OK &&
             ns_bf16_prepare(b, 16, 16, NS_VARIANT_PLAIN, 0, NS_ALGO_STANDARD, c, 1) == SHARDOPT_OK;
    if (!ok)
        snprintf(why, len, "%s", shardopt_last_error());
    else if (onednn && b->fallbacks > 0) {
        snprintf(why, len, "oneDNN has no bf16 matmul on this CPU (it needs AVX-512)");
        ok = 0;
    }
    status_set(SHARDOPT_OK, "%s", was);
    ns_bf16_destroy(b);
    return ok;
}

int ns_bf16_available(char *why, size_t len) { return probe(why, len, 0); }

int ns_bf16_onednn(char *why, size_t len) { return probe(why, len, 1); }

const char *ns_bf16_impl(const struct ns_bf16 *b) { return b != NULL ? b->impl : ""; }

int ns_bf16_native(void)
{
#if defined(__x86_64__) && defined(__clang__)
    /* clang 14 knows neither feature name of __builtin_cpu_supports: read CPUID (leaf 7.1 EAX
     * bit 5 AVX512_BF16, leaf 7.0 EDX bit 22 AMX-BF16); avx512f says the OS saves the state */
    unsigned a = 0, b = 0, c = 0, d = 0;
    __builtin_cpu_init();
    const int bf16 = __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 5 & 1u);
    const int amx = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1u);
    return (bf16 && __builtin_cpu_supports("avx512f")) || amx;
#elif defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#else
    return 0;
#endif
}
