/* bf16 Newton-Schulz's run in the step (ns_bf16.h): the iterations, the Gram algorithm and AOL
 * over the oneDNN primitives ns_bf16_prepare made at commit (ns_bf16.c), executed only. */
#include <cblas.h>
#include <math.h>
#include <oneapi/dnnl/dnnl.h>
#include <stdlib.h>
#include <string.h>

#include "../dtype.h"
#include "../ns_coeffs.h"
#include "base/status.h"
#include "ns_bf16.h"
#include "ns_bf16_plan.h"
#include "ns_common.h"

/* A product oneDNN has no bf16 implementation for on this CPU (mm_make): the bf16 operands widened
 * to fp32 (exactly), multiplied by sgemm with fp32 accumulation and rounded to bf16 once, after
 * the output scale and the sum post-op, as oneDNN's matmul does: the same arithmetic up to the
 * order of the fp32 sums. Deterministic for a fixed BLAS thread count, as the fp32 kernels are. */
static int mm_fallback(struct ns_bf16 *b, const struct mm *x, const uint16_t *src,
                       const uint16_t *wei, uint16_t *dst)
{
    const int64_t M = x->M, K = x->K, N = x->N;
    float *a = b->fb_buf, *w = a + M * K, *c = w + K * N;
    if (a == NULL || (size_t)(M * K + K * N + M * N) > b->fb_have)
        return -1; /* not prepared: a bug, which the caller reports */
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++)
            a[i * K + k] = f32_from_bf16(src[i * x->lda + k]);
#pragma omp parallel for schedule(static)
    for (int64_t k = 0; k < K; k++) /* wei_t: element (k, j) of W is row j's k-th of X */
        for (int64_t j = 0; j < N; j++)
            w[k * N + j] = f32_from_bf16(x->wei_t ? wei[j * x->ldb + k] : wei[k * x->ldb + j]);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)M, (blasint)N, (blasint)K, 1.0f,
                a, (blasint)K, w, (blasint)N, 0.0f, c, (blasint)N);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float v = x->oscale * c[i * N + j];
            if (x->sum != 0.0f)
                v += x->sum * f32_from_bf16(dst[i * x->ldc + j]);
            dst[i * x->ldc + j] = bf16_from_f32(v);
        }
    return 0;
}

static int mm_run(struct ns_bf16 *b, const struct mm *x, const void *src, const void *wei,
                  void *dst)
{
    if (x->fb)
        return mm_fallback(b, x, src, wei, dst);
    dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, x->src},
                               {DNNL_ARG_WEIGHTS, x->wei},
                               {DNNL_ARG_DST, x->dst},
                               {DNNL_ARG_SCRATCHPAD, b->scratch_mem}};
    if (dnnl_memory_set_data_handle(x->src, (void *)src) != dnnl_success ||
        dnnl_memory_set_data_handle(x->wei, (void *)wei) != dnnl_success ||
        dnnl_memory_set_data_handle(x->dst, dst) != dnnl_success ||
        dnnl_primitive_execute(x->p, b->stream, 4, args) != dnnl_success)
        return -1;
    return dnnl_stream_wait(b->stream) == dnnl_success ? 0 : -1;
}

/* memcpy split over the OpenMP threads (the copies that feed the sum post-ops) */
static void copy_par(void *dst, const void *src, size_t bytes)
{
    const size_t chunk = 1 << 16;
    const int64_t nchunks = (int64_t)((bytes + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < nchunks; c++) {
        const size_t off = (size_t)c * chunk, len = bytes - off < chunk ? bytes - off : chunk;
        memcpy((char *)dst + off, (const char *)src + off, len);
    }
}

/* A = X X^T (both halves) */
static int gram_bf16(struct ns_bf16 *b, const struct plan *p, const uint16_t *X, uint16_t *A)
{
    const int64_t m = p->m, n = p->n;
    int rc = 0;
    for (int i = 0; i < p->nrow && rc == 0; i++) {
        const int64_t r0 = (int64_t)i * p->block;
        rc = mm_run(b, &p->gram[i], X + r0 * n, X + r0 * n, A + r0 * m + r0);
    }
    if (p->variant == NS_VARIANT_SYMMETRIC)
        ns_mirror_upper(A, m, sizeof(uint16_t));
    return rc;
}

static int iterate(struct ns_bf16 *b, const struct plan *p, int s, const uint16_t *X, uint16_t *Y,
                   uint16_t *A, uint16_t *B, int have_A)
{
    const int64_t m = p->m, n = p->n;
    const int u = p->uniq[s];
    int rc = 0;
    for (int i = 0; i < p->nrow && rc == 0 && !have_A; i++) {
        const int64_t r0 = (int64_t)i * p->block;
        rc = mm_run(b, &p->gram[i], X + r0 * n, X + r0 * n, A + r0 * m + r0);
    }
    if (p->variant == NS_VARIANT_SYMMETRIC) {
        ns_mirror_upper(A, m, sizeof(uint16_t));
        /* the sum post-op reads only what the block rows write: B[r0:r1, r0:m] */
#pragma omp parallel for schedule(static)
        for (int64_t r = 0; r < m; r++) {
            const int64_t c0 = r / p->block * p->block;
            memcpy(B + r * m + c0, A + r * m + c0, sizeof(uint16_t) * (size_t)(m - c0));
        }
    } else {
        copy_par(B, A, sizeof(uint16_t) * (size_t)(m * m));
    }
    for (int i = 0; i < p->nrow && rc == 0; i++) {
        const int64_t r0 = (int64_t)i * p->block;
        rc = mm_run(b, &p->aa[i][u], A + r0 * m, A + r0, B + r0 * m + r0);
    }
    if (p->variant == NS_VARIANT_SYMMETRIC)
        ns_mirror_upper(B, m, sizeof(uint16_t));
    copy_par(Y, X, sizeof(uint16_t) * (size_t)(m * n));
    return rc == 0 ? mm_run(b, &p->bx[u], B, X, Y) : rc;
}

/* C = P Q of commuting symmetric m x m matrices: the upper block rows, mirrored */
static int symmul_bf16(struct ns_bf16 *b, const struct plan *p, const uint16_t *P,
                       const uint16_t *Q, uint16_t *C)
{
    const int64_t m = p->m;
    int rc = 0;
    for (int i = 0; i < p->nrow && rc == 0; i++) {
        const int64_t r0 = (int64_t)i * p->block;
        rc = mm_run(b, &p->pq[i], P + r0 * m, Q + r0, C + r0 * m + r0);
    }
    if (p->variant == NS_VARIANT_SYMMETRIC)
        ns_mirror_upper(C, m, sizeof(uint16_t));
    return rc;
}

/* Z = a I + b R + c R R: the A A product of the standard step (c R R + b Z over a copy of R), then
 * a on the diagonal, rounded once more */
static int poly_bf16(struct ns_bf16 *b, const struct plan *p, int s, const uint16_t *R, uint16_t *Z)
{
    const int64_t m = p->m;
    const int u = p->uniq[s];
    int rc = 0;
    copy_par(Z, R, sizeof(uint16_t) * (size_t)(m * m));
    for (int i = 0; i < p->nrow && rc == 0; i++) {
        const int64_t r0 = (int64_t)i * p->block;
        rc = mm_run(b, &p->aa[i][u], R + r0 * m, R + r0, Z + r0 * m + r0);
    }
    if (p->variant == NS_VARIANT_SYMMETRIC)
        ns_mirror_upper(Z, m, sizeof(uint16_t));
    for (int64_t i = 0; i < m; i++)
        Z[i * m + i] = bf16_from_f32(f32_from_bf16(Z[i * m + i]) + p->coeffs[s][0]);
    return rc;
}

/* Gram Newton-Schulz in bf16 (kernels/cpu/ns_gram.c has the algorithm and which products are
 * halved): R, Z, Q and every m x m product in bf16 with fp32 accumulation, like X in the
 * standard bf16 path; the restarts (ns_coeffs_gram_restarts) bound what their rounding grows into
 * (measured in a bf16 simulation: all of it in bf16 is within 1.4x of standard bf16's error against
 * fp64, and keeping R, Z, Q in fp32 would put 14m^3 of the work on the fp32 rate, 1.6x slower
 * here). *X ends as the result. */
static int run_gram_bf16(struct ns_bf16 *b, const struct plan *p, int steps, int have_R,
                         uint16_t **X, uint16_t **Y, uint16_t *R, uint16_t *Z, uint16_t *Q,
                         uint16_t *T)
{
    const uint32_t restarts =
        ns_coeffs_gram_restarts((const float(*)[3])p->coeffs, steps, p->m, p->n);
    int have_Q = 0, rc = have_R ? 0 : gram_bf16(b, p, *X, R);
    uint16_t *t;

    for (int it = 0; it < steps && rc == 0; it++) {
        if (restarts >> it & 1u) {
            rc = mm_run(b, &p->qx, Q, *X, *Y);
            t = *X;
            *X = *Y;
            *Y = t;
            if (rc == 0)
                rc = gram_bf16(b, p, *X, R);
            have_Q = 0;
        }
        if (rc == 0)
            rc = poly_bf16(b, p, it, R, Z);
        const uint16_t *zk;
        if (!have_Q) {
            t = Q;
            Q = Z;
            Z = t;
            zk = Q;
            have_Q = 1;
        } else {
            if (rc == 0)
                rc = mm_run(b, &p->full, Z, Q, T);
            t = Q;
            Q = T;
            T = t;
            zk = Z;
        }
        if (rc == 0 && it + 1 < steps && !(restarts >> (it + 1) & 1u)) {
            rc = mm_run(b, &p->full, zk, R, T);
            if (rc == 0)
                rc = symmul_bf16(b, p, T, zk, R);
        }
    }
    if (rc == 0)
        rc = mm_run(b, &p->qx, Q, *X, *Y);
    t = *X;
    *X = *Y;
    *Y = t;
    return rc;
}

void ns_bf16_aol(int64_t m, int64_t n, double eps, const float *xf, uint16_t *X, uint16_t *A,
                 double *d)
{
    for (int64_t i = 0; i < m; i++) {
        double s = 0.0;
        for (int64_t j = 0; j < m; j++)
            s += fabs((double)f32_from_bf16(A[i * m + j]));
        d[i] = 1.0 / sqrt(s + eps);
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++)
            X[i * n + j] = bf16_from_f32((float)(xf[i * n + j] * d[i]));
        for (int64_t j = 0; j < m; j++)
            A[i * m + j] = bf16_from_f32((float)(f32_from_bf16(A[i * m + j]) * (d[i] * d[j])));
    }
}

/* xf <- X, exactly */
static void to_f32(const uint16_t *X, float *xf, size_t mn)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < mn; i++)
        xf[i] = f32_from_bf16(X[i]);
}

/* matrix k normalized into xf and X, AOL-scaled with its Gram matrix left in A (returns 1) or
 * not (0); -1 when a product failed. d: m doubles of scratch */
static int load_bf16(struct ns_bf16 *b, const struct plan *p, const struct ns_args *a, int64_t k,
                     float *xf, uint16_t *X, uint16_t *A, double *d)
{
    const size_t mn = (size_t)(p->m * p->n);
    ns_load_normalized(a, k, xf);
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < mn; i++)
        X[i] = bf16_from_f32(xf[i]);
    if (a->precondition != NS_PRECOND_AOL)
        return 0;
    if (gram_bf16(b, p, X, A) != 0)
        return -1;
    ns_bf16_aol(p->m, p->n, (double)a->eps, xf, X, A, d);
    return 1;
}

int ns_bf16_run(const struct kernel_ctx *ctx, const struct ns_args *a,
                const struct ns_workspace *ws, ns_fp32_fn fp32)
{
    struct ns_bf16 *b = ws->bf16;
    int64_t m, n;

    (void)ctx; /* oneDNN's OpenMP threads are the process's */
    ns_work_shape(a, &m, &n);
    if (b == NULL || m > n || ws->floats < ns_workspace_floats(a->rows, a->cols) ||
        (a->precondition != NS_PRECOND_FROBENIUS && a->precondition != NS_PRECOND_AOL))
        return -1;
    const struct plan *p =
        ns_bf16_plan_find(b, m, n, a->variant, a->block, a->algorithm, a->coeffs, a->steps);
    if (p == NULL)
        return -1;
    /* fp32 staging for the shared load and store, then X, Y (m x n) and A, B (m x m) in bf16
     * (Gram: R, Z, Q, T), then AOL's m doubles: 8mn + 8m^2 + 8m bytes of the 8mn + 16m^2 an
     * fp32 workspace holds */
    float *xf = ws->buf;
    const size_t mn = (size_t)(m * n);

    for (int64_t k = 0; k < a->batch; k++) {
        uint16_t *X = (uint16_t *)(xf + m * n), *Y = X + m * n, *A = Y + m * n, *B = A + m * m;
        uint16_t *Q = B + m * m, *T = Q + m * m;
        double *d = (double *)(void *)(T + m * m); /* 8-byte aligned: an even count of floats */
        int have_A = load_bf16(b, p, a, k, xf, X, A, d);

        if (have_A < 0)
            return -1;
        int standard = a->algorithm != NS_ALGO_GRAM;
        if (!standard) {
            if (run_gram_bf16(b, p, a->steps, have_A, &X, &Y, A, B, Q, T) != 0)
                return -1;
            to_f32(X, xf, mn);
            /* checked on its fp32 copy (the same values; fp32 sums run 4x faster in ns_bench
             * than bf16 ones). The input is still in a->in (matrix k's output is not written
             * yet): a result outside what Newton-Schulz can give is recomputed by the standard
             * algorithm, on this plan's own standard primitives (a Gram plan has them) */
            if (!ns_gram_guard_ok(xf, KDT_F32, m, n, a)) {
                X = (uint16_t *)(xf + m * n);
                Y = X + m * n;
                A = Y + m * n;
                B = A + m * m;
                if ((have_A = load_bf16(b, p, a, k, xf, X, A, d)) < 0)
                    return -1;
                standard = 1;
                if (a->guard_fallbacks != NULL)
                    (*a->guard_fallbacks)++;
            }
        }
        if (standard) {
            for (int s = 0; s < a->steps; s++) {
                if (iterate(b, p, s, X, Y, A, B, have_A && s == 0) != 0)
                    return -1;
                uint16_t *t = X;
                X = Y;
                Y = t;
            }
            to_f32(X, xf, mn);
            /* the input is still in place: a diverged result is recomputed in fp32, matrix k
             * alone (its products overwrite this workspace, which the next matrix sets again) */
            if (fp32 != NULL && !ns_gram_guard_ok(xf, KDT_F32, m, n, a)) {
                struct ns_args one = *a;
                one.batch = 1;
                one.compute = KDT_F32;
                one.variant = NS_VARIANT_PLAIN;
                one.algorithm = NS_ALGO_STANDARD;
                one.in = (const char *)a->in + (size_t)k * mn * kdtype_size(a->in_dtype);
                one.out = (char *)a->out + (size_t)k * mn * kdtype_size(a->out_dtype);
                if (fp32(ctx, &one, ws) != 0)
                    return -1;
                if (a->guard_fallbacks != NULL)
                    (*a->guard_fallbacks)++;
                continue;
            }
        }
        ns_store_output(a, k, xf);
    }
    return 0;
}

int ns_bf16_shard_gram(struct ns_bf16 *b, const struct ns_bf16_shard *p, const uint16_t *x,
                       uint16_t *A)
{
    return mm_run(b, &p->gram, x, x, A);
}

int ns_bf16_shard_update(struct ns_bf16 *b, const struct ns_bf16_shard *p, int s, const uint16_t *A,
                         const uint16_t *x, uint16_t *B, uint16_t *y)
{
    const int64_t m = p->m, n = p->n;
    const int u = p->uniq[s];
    copy_par(B, A, sizeof(uint16_t) * (size_t)(m * m));
    int rc = mm_run(b, &p->aa[u], A, A, B);
    copy_par(y, x, sizeof(uint16_t) * (size_t)(m * n));
    return rc == 0 ? mm_run(b, &p->bx[u], B, x, y) : rc;
}
