/* kernels/cuda/ns_driver.h instantiated with plain host loops in place of cuBLAS and the CUDA
 * kernels, so that test_ns_driver checks the driver's products, leading dimensions, strides,
 * transposes and batch chunking on machines without a GPU. The host "device" does what the CUDA
 * one is specified to do: bf16 operands, fp32 accumulation, bf16 results, column-major GEMMs. */
#include <math.h>
#include <string.h>

#include "kernels/cuda/ns_driver.h"

extern "C" {
#include "kernels/cuda/lt_plan_cache.h"
}

extern "C" {
#include "kernels/elem_rules.h"
int ns_driver_host_run(const struct ns_args *a, void *ws, size_t ws_bytes, int *gemms,
                       int *mirrors);
size_t ns_driver_host_ws_bytes(int64_t rows, int64_t cols, int64_t batch);
int ns_driver_host_plans(const struct ns_args *a, void *ws, size_t ws_bytes, struct lt_slots *t,
                         int shapes_only);
int ns_driver_host_run_counts(const struct ns_args *a, void *ws, size_t ws_bytes, int counts[4]);
}

namespace
{

struct HostDev {
    int gemms, mirrors, diag_adds, aols;

    /* the norms, then AOL's row scales */
    size_t scratch_bytes(int64_t count, int64_t m) const
    {
        return (size_t)count * (1 + (size_t)m) * sizeof(double);
    }

    int gemm(int ta, int tb, int M, int N, int K, float alpha, const uint16_t *A, int lda,
             long long sA, const uint16_t *B, int ldb, long long sB, float beta,
             const uint16_t *Cin, uint16_t *C, int ldc, long long sC, int batch)
    {
        /* the BLAS contract: op(A) is M x K, op(B) K x N, leading dimensions at least the rows
         * of the stored (untransposed) operands */
        if (lda < (ta ? K : M) || ldb < (tb ? N : K) || ldc < M)
            return -1;
        gemms++;
        for (int z = 0; z < batch; z++) {
            const uint16_t *a = A + z * sA, *b = B + z * sB;
            uint16_t *c = C + z * sC;
            const uint16_t *cin = Cin + z * sC;
            for (int j = 0; j < N; j++)
                for (int i = 0; i < M; i++) {
                    float acc = 0.0f;
                    for (int k = 0; k < K; k++) {
                        const float x =
                            f32_from_bf16(ta ? a[k + (size_t)i * lda] : a[i + (size_t)k * lda]);
                        const float y =
                            f32_from_bf16(tb ? b[j + (size_t)k * ldb] : b[k + (size_t)j * ldb]);
                        acc = fmaf(x, y, acc);
                    }
                    const float old = beta != 0.0f ? f32_from_bf16(cin[i + (size_t)j * ldc]) : 0.0f;
                    c[i + (size_t)j * ldc] = bf16_from_f32(alpha * acc + beta * old);
                }
        }
        return 0;
    }

    int mirror(uint16_t *A, int64_t m, int64_t block, long long stride, int batch)
    {
        if (block < 1)
            return -1;
        mirrors++;
        for (int z = 0; z < batch; z++) {
            uint16_t *a = A + z * stride;
            for (int64_t c = 0; c < m; c++)
                for (int64_t r = 0; r < c / block * block; r++)
                    a[r + c * m] = a[c + r * m];
        }
        return 0;
    }

    int diag_add(uint16_t *Z, int64_t m, float c, long long stride, int batch)
    {
        diag_adds++;
        for (int z = 0; z < batch; z++)
            for (int64_t i = 0; i < m; i++) {
                uint16_t *p = Z + z * stride + i * m + i;
                *p = bf16_from_f32(f32_from_bf16(*p) + c);
            }
        return 0;
    }

    /* the load's fp32 value of X[k] at working (i, j), as the load rounds it before bf16 */
    static float loaded(const struct ns_args *a, int64_t k, int64_t i, int64_t j, double norm)
    {
        const size_t per = (size_t)(a->rows * a->cols);
        const int64_t r = a->transpose ? j : i, c = a->transpose ? i : j;
        return (
            float)((double)kload(a->in, a->in_dtype, (size_t)k * per + (size_t)(r * a->cols + c)) *
                   norm);
    }

    int aol(const struct ns_args *a, int64_t k0, int64_t count, int64_t m, int64_t n, uint16_t *x,
            uint16_t *A, void *scratch)
    {
        const double *norm = (const double *)scratch;
        double *d = (double *)scratch + count;
        aols++;
        for (int64_t k = 0; k < count; k++) {
            uint16_t *Ak = A + k * m * m;
            for (int64_t i = 0; i < m; i++) {
                double s = 0.0;
                for (int64_t j = 0; j < m; j++)
                    s += fabs((double)f32_from_bf16(Ak[i * m + j]));
                d[k * m + i] = 1.0 / sqrt(s + (double)a->eps);
            }
            for (int64_t i = 0; i < m; i++) {
                for (int64_t j = 0; j < n; j++)
                    x[(k * m + i) * n + j] = bf16_from_f32(
                        (float)((double)loaded(a, k0 + k, i, j, norm[k]) * d[k * m + i]));
                for (int64_t j = 0; j < m; j++)
                    Ak[i * m + j] = bf16_from_f32((float)((double)f32_from_bf16(Ak[i * m + j]) *
                                                          (d[k * m + i] * d[k * m + j])));
            }
        }
        return 0;
    }

    int load(const struct ns_args *a, int64_t k0, int64_t count, int64_t m, int64_t n, uint16_t *x,
             void *scratch)
    {
        const size_t per = (size_t)(a->rows * a->cols);
        double *norm = (double *)scratch;
        for (int64_t k = 0; k < count; k++) {
            const size_t base = (size_t)(k0 + k) * per;
            double ss = 0;
            for (size_t i = 0; i < per; i++) {
                const double v = kload(a->in, a->in_dtype, base + i);
                ss += v * v;
            }
            norm[k] = 1.0 / (sqrt(ss) * (double)a->norm_scale + (double)a->eps);
        }
        for (int64_t k = 0; k < count; k++)
            for (int64_t r = 0; r < a->rows; r++)
                for (int64_t c = 0; c < a->cols; c++) {
                    const size_t src = (size_t)(k0 + k) * per + (size_t)(r * a->cols + c);
                    const size_t dst = (size_t)(k * m * n) +
                                       (size_t)(a->transpose ? c * a->rows + r : r * a->cols + c);
                    x[dst] =
                        bf16_from_f32((float)((double)kload(a->in, a->in_dtype, src) * norm[k]));
                }
        return 0;
    }

    int sumsq(const uint16_t *x, int64_t count, long long stride, int batch, void *, double *out)
    {
        for (int z = 0; z < batch; z++) {
            double t = 0.0;
            for (int64_t i = 0; i < count; i++) {
                const double v = f32_from_bf16(x[z * stride + i]);
                t += v * v;
            }
            out[z] = t;
        }
        return 0;
    }

    int store(const struct ns_args *a, int64_t k0, int64_t count, int64_t m, int64_t n,
              const uint16_t *x)
    {
        const size_t per = (size_t)(a->rows * a->cols);
        for (int64_t k = 0; k < count; k++)
            for (int64_t r = 0; r < a->rows; r++)
                for (int64_t c = 0; c < a->cols; c++) {
                    const size_t src = (size_t)(k * m * n) +
                                       (size_t)(a->transpose ? c * a->rows + r : r * a->cols + c);
                    kstore_value(a->out, a->out_dtype,
                                 (size_t)(k0 + k) * per + (size_t)(r * a->cols + c),
                                 f32_from_bf16(x[src]));
                }
        return 0;
    }
};

/* The products' plan lookups alone, as ns_cuda.cu's lt_gemm makes them: each gemm's key from
 * its shape and its operands' addresses in the workspace, looked up in t (shapes_only: the key
 * without the alignments, what the product itself is). Nothing is computed or touched: ws is
 * only an address. */
struct PlanDev {
    struct lt_slots *t;
    int shapes_only;

    size_t scratch_bytes(int64_t count, int64_t m) const
    {
        return (size_t)count * (1 + (size_t)m) * sizeof(double);
    }

    int gemm(int ta, int tb, int M, int N, int K, float, const uint16_t *A, int lda, long long sA,
             const uint16_t *B, int ldb, long long sB, float beta, const uint16_t *Cin, uint16_t *C,
             int ldc, long long sC, int batch)
    {
        int fresh, evicted;
        struct lt_key key = lt_key_make(ta, tb, M, N, K, lda, ldb, ldc, sA, sB, sC, batch, A, B,
                                        beta != 0.0f ? Cin : C, C);
        if (shapes_only)
            key.align_a = key.align_b = key.align_c = key.align_d = 0;
        lt_slot_find(t, &key, &fresh, &evicted);
        return 0;
    }
    int mirror(uint16_t *, int64_t, int64_t, long long, int) { return 0; }
    int diag_add(uint16_t *, int64_t, float, long long, int) { return 0; }
    int aol(const struct ns_args *, int64_t, int64_t, int64_t, int64_t, uint16_t *, uint16_t *,
            void *)
    {
        return 0;
    }
    int load(const struct ns_args *, int64_t, int64_t, int64_t, int64_t, uint16_t *, void *)
    {
        return 0;
    }
    int store(const struct ns_args *, int64_t, int64_t, int64_t, int64_t, const uint16_t *)
    {
        return 0;
    }
    int sumsq(const uint16_t *, int64_t, long long, int batch, void *, double *out)
    {
        for (int z = 0; z < batch; z++)
            out[z] = 0.0; /* nothing computed: every result passes */
        return 0;
    }
};

} // namespace

int ns_driver_host_plans(const struct ns_args *a, void *ws, size_t ws_bytes, struct lt_slots *t,
                         int shapes_only)
{
    PlanDev d = {t, shapes_only};
    return ns_dev_run(d, a, ws, ws_bytes);
}

size_t ns_driver_host_ws_bytes(int64_t rows, int64_t cols, int64_t batch)
{
    const int64_t m = rows < cols ? rows : cols;
    return ns_dev_matrices_bytes(rows, cols, batch) +
           (size_t)batch * (1 + (size_t)m) * sizeof(double);
}

int ns_driver_host_run(const struct ns_args *a, void *ws, size_t ws_bytes, int *gemms, int *mirrors)
{
    HostDev d = {0, 0, 0, 0};
    const int rc = ns_dev_run(d, a, ws, ws_bytes);
    if (gemms != NULL)
        *gemms = d.gemms;
    if (mirrors != NULL)
        *mirrors = d.mirrors;
    return rc;
}

int ns_driver_host_run_counts(const struct ns_args *a, void *ws, size_t ws_bytes, int counts[4])
{
    HostDev d = {0, 0, 0, 0};
    const int rc = ns_dev_run(d, a, ws, ws_bytes);
    counts[0] = d.gemms;
    counts[1] = d.mirrors;
    counts[2] = d.diag_adds;
    counts[3] = d.aols;
    return rc;
}
