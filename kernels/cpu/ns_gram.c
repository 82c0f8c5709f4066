/* Gram Newton-Schulz and AOL preconditioning on the CPU, over a table of products
 * (struct ns_products: the reference's, OpenBLAS's plain and symmetric ones).
 *
 * Standard Newton-Schulz on X (m x n, m <= n) multiplies X by p_k(X X^T) = a I + b A + c A A
 * each step, so every iterate is X_k = Q_k X with Q_k a polynomial in G = X X^T. Gram
 * Newton-Schulz keeps only the m x m matrices: with R_k = X_k X_k^T and Z_k = p_k(R_k),
 *   Q_{k+1} = Z_k Q_k,   R_{k+1} = Z_k R_k Z_k,
 * all polynomials in G (so they commute and every product is symmetric in exact arithmetic),
 * and forms Q X once at the end: per step about 6m^3 instead of 4m^2 n + 2m^3 (ns_flops_total
 * has the count). R = (Z R) Z rather than Z^2 R: the sandwich keeps R symmetric positive
 * semi-definite under rounding where Z^2 R need not.
 *
 * Which products are formed as symmetric (upper half, mirrored): X X^T, R R and (Z R) Z, but not
 * Z Q or Z R. Those two are symmetric only because Z and R (or Q) commute, and Z = p(R) rounded
 * commutes with R only to rounding; keeping just their upper half throws away the half that
 * says so. Measured in a bf16 simulation on condition number 1e4 (128 x 512): 0.098 relative
 * Frobenius against fp64 with full Z Q and Z R, 0.166 with all five halved (standard bf16:
 * 0.081); halving X X^T, R R and (Z R) Z changes nothing measurable.
 *
 * In exact arithmetic the result is the standard one. In floating point G's small eigenvalues
 * carry absolute errors of eps |G|, which the steps amplify as they lift them (each step by
 * p_k(0)^2 = a_k^2: 16 for quintic's first, 67 for polar_express's), and a negative one, which
 * rounding makes of a zero or tiny one, grows without bound. Dao AI Lab's Gram Newton-Schulz and
 * DeepSpeed's ns_method = gram restart after the second step: X <- Q X, G = X X^T, Q = I, which
 * costs one more pass over X (3 m^2 n) and bounds what the early errors can grow into. One
 * restart after step 2 is not enough for every table: polar_express's 8 steps then run 6 more
 * steps on one R (growth 101 in the small singular values) and in bf16 diverge on inputs with
 * near-zero singular values (a random square matrix: relative error 79). So the restarts come
 * from the table (ns_coeffs_gram_restarts_for, this path's fp32 schedule): whenever a segment's
 * growth would pass a bound, and at every step where the shape is not wide (n < 2 m) or small (m <=
 * 64, where the steeper tables diverged in bf16 on spread spectra), and every 2 steps past 5; in
 * fp32, where that leaves a segment of three steps (quintic's), the first step runs alone, before
 * step 1.
 *
 * Where the fp32 error comes from, measured at 300 x 700, condition number 1e4, quintic, against
 * the fp64 iteration (standard fp32: 9.1e-6): every fp32 Q X is one GEMM whose terms cancel
 * (Q's eigenvalues reach 16-493 where X's singular values are small, the product's are near 1),
 * so its accumulation error, amplified by the steps after it, is 4-5e-6 on its own (Gram with R,
 * Z, Q and G all in double, no restart, one fp32 Q X: 4.9e-6; the restart's fp32 Q X adds as much
 * again). Of the m x m matrices, R's update (Z R) Z in fp32 costs most, then G, then Q and Z. All
 * of them in double is 0.74-0.78x the symmetric standard iteration's speed at 1408 x 4096 (double
 * GEMMs at half the rate), and still 1.03e-5 from standard; with that Q X summed in double over
 * blocks of 32 of its inner dimension, 9.5e-6 from standard. The fp32 schedule above reaches
 * 8.65e-6 from fp64 and 7.25e-6 from standard (its first step is standard's, rounding included)
 * for one more restart (3 m^2 n) and 5 m^3 fewer. The code here is our own, written from the
 * iteration above. */

#include "../ns_coeffs.h"
#include "ns_common.h"

/* one matrix, the standard algorithm from an A already formed (AOL) or not */
static void run_standard(const struct kernel_ctx *ctx, const struct ns_args *a, int64_t m,
                         int64_t n, const struct ns_products *p, int have_A, float **x, float **y,
                         float *A, float *B)
{
    for (int it = 0; it < a->steps; it++) {
        if (it > 0 || !have_A)
            p->gram(ctx, *x, m, n, A);
        p->update(ctx, A, a->coeffs[it], *x, m, n, B, *y);
        float *t = *x;
        *x = *y;
        *y = t;
    }
}

/* one matrix, the Gram algorithm; R holds G = X X^T when have_R */
static void run_gram(const struct kernel_ctx *ctx, const struct ns_args *a, int64_t m, int64_t n,
                     const struct ns_products *p, int have_R, float **x, float **y, float *R,
                     float *Z, float *Q, float *T)
{
    /* fp32's schedule: quintic's first step alone (ns_coeffs_gram_restarts_for says why) */
    const uint32_t restarts = ns_coeffs_gram_restarts_for(a->coeffs, a->steps, m, n, KDT_F32);
    int have_Q = 0;

    if (!have_R)
        p->gram(ctx, *x, m, n, R);
    for (int it = 0; it < a->steps; it++) {
        if (restarts >> it & 1u) { /* X <- Q X, G from it, Q = I */
            p->apply(ctx, Q, *x, m, n, *y);
            float *t = *x;
            *x = *y;
            *y = t;
            p->gram(ctx, *x, m, n, R);
            have_Q = 0;
        }
        p->poly(ctx, R, a->coeffs[it], m, Z);
        const float *zk; /* the buffer holding Z_it */
        float *t;
        if (!have_Q) { /* Q = Z: swap the buffers */
            t = Q;
            Q = Z;
            Z = t;
            zk = Q;
            have_Q = 1;
        } else { /* Q = Z Q */
            p->mul(ctx, Z, Q, m, T);
            t = Q;
            Q = T;
            T = t;
            zk = Z;
        }
        if (it + 1 < a->steps && !(restarts >> (it + 1) & 1u)) { /* R = (Z R) Z */
            p->mul(ctx, zk, R, m, T);
            p->symmul(ctx, T, zk, m, R);
        }
    }
    p->apply(ctx, Q, *x, m, n, *y);
    float *t = *x;
    *x = *y;
    *y = t;
}

/* matrix k normalized into x, AOL-scaled with its Gram matrix left in R (returns 1) or not (0);
 * d: m doubles of scratch */
static int load(const struct kernel_ctx *ctx, const struct ns_args *a, int64_t k, int64_t m,
                int64_t n, const struct ns_products *p, float *x, float *R, float *d)
{
    ns_load_normalized(a, k, x);
    if (a->precondition != NS_PRECOND_AOL)
        return 0;
    p->gram(ctx, x, m, n, R);
    ns_aol_scale(m, n, (double)a->eps, x, R, (double *)(void *)d); /* 2m^2 floats free */
    return 1;
}

int ns_run_products(const struct kernel_ctx *ctx, const struct ns_args *a,
                    const struct ns_workspace *ws, const struct ns_products *p)
{
    int64_t m, n;

    ns_work_shape(a, &m, &n);
    if (m > n || ws->floats < ns_workspace_floats(a->rows, a->cols) ||
        (a->algorithm != NS_ALGO_STANDARD && a->algorithm != NS_ALGO_GRAM) ||
        (a->precondition != NS_PRECOND_FROBENIUS && a->precondition != NS_PRECOND_AOL))
        return -1;
    for (int64_t k = 0; k < a->batch; k++) {
        float *x = ws->buf, *y = x + m * n;
        float *R = y + m * n, *Z = R + m * m, *Q = Z + m * m, *T = Q + m * m;
        int have_R = load(ctx, a, k, m, n, p, x, R, Q);

        if (a->algorithm == NS_ALGO_GRAM) {
            run_gram(ctx, a, m, n, p, have_R, &x, &y, R, Z, Q, T);
            /* the input is still in a->in (matrix k's output is not written yet): a result
             * outside what Newton-Schulz can give is recomputed by the standard algorithm */
            if (!ns_gram_guard_ok(x, KDT_F32, m, n, a)) {
                x = ws->buf;
                y = x + m * n;
                have_R = load(ctx, a, k, m, n, p, x, R, Q);
                run_standard(ctx, a, m, n, p, have_R, &x, &y, R, Z);
                if (a->guard_fallbacks != NULL)
                    (*a->guard_fallbacks)++;
            }
        } else {
            run_standard(ctx, a, m, n, p, have_R, &x, &y, R, Z);
        }
        ns_store_output(a, k, x);
    }
    return 0;
}
