/* Elementwise kernels (Muon momentum + pack, AdamW, apply): every variant against an fp64
 * computation written here, and every variant (AVX-512, AVX2) bit for bit against the reference,
 * with 1 and 2 threads, over tails, the threaded path, every dtype combination, stochastic rounding
 * and special values.
 *
 * One file, over 600 lines: every kernel is checked by the same fp64 computation and the same
 * variant-against-reference sweep (threads, tails, dtypes, special values); one suite keeps the
 * oracle and the sweep in one place for every kernel. */
#include <float.h>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/ops.h"
#include "test.h"

/* Around one and two vectors of 8 (AVX2) and 16 (AVX-512) lanes, and past the threading cut. */
static const size_t sizes[] = {1, 7, 8, 15, 16, 17, 1000, 100003};
#define NSIZES (sizeof sizes / sizeof sizes[0])

/* Elements past the end of every buffer that no kernel may touch. */
#define GUARD      19
#define GUARD_BYTE 0x3c /* 0.0115 as fp32 and bf16: a value a stray lane would compute with */

/* A buffer of n elements of dtype dt, one element past a 64-byte boundary (the kernels must not
 * assume alignment), followed by a guard region. */
struct tbuf {
    int dt;
    size_t n;
    unsigned char *mem;
    void *p;
};

static struct tbuf tbuf_new(int dt, size_t n)
{
    struct tbuf b = {dt, n, NULL, NULL};
    size_t es = kdtype_size(dt);
    b.mem = cpu_alloc((n + 1 + GUARD) * es);
    if (b.mem == NULL) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    b.p = b.mem + es;
    memset(b.mem, GUARD_BYTE, (n + 1 + GUARD) * es);
    return b;
}

static void tbuf_free(struct tbuf *b) { cpu_free(b->mem); }

static double tbuf_get(const struct tbuf *b, size_t i) { return kload(b->p, b->dt, i); }

static void tbuf_set(struct tbuf *b, size_t i, float v)
{
    if (b->dt == KDT_BF16)
        ((uint16_t *)b->p)[i] = bf16_from_f32(v);
    else
        ((float *)b->p)[i] = v;
}

/* Values uniform in [lo, hi), stored (rounded) in the buffer's dtype. */
static void tbuf_fill(struct tbuf *b, uint64_t *seed, double lo, double hi)
{
    for (size_t i = 0; i < b->n; i++)
        tbuf_set(b, i, (float)(lo + (hi - lo) * (test_rand(seed) + 1.0) / 2.0));
}

static void tbuf_copy(struct tbuf *dst, const struct tbuf *src)
{
    memcpy(dst->p, src->p, src->n * kdtype_size(src->dt));
}

static int tbuf_guard_intact(const struct tbuf *b)
{
    const unsigned char *g = (const unsigned char *)b->p + b->n * kdtype_size(b->dt);
    for (size_t k = 0; k < GUARD * kdtype_size(b->dt); k++)
        if (g[k] != GUARD_BYTE)
            return 0;
    return 1;
}

/* Bitwise equality of two buffers; on a mismatch names the first differing element. */
static void expect_same_bits(const struct tbuf *a, const struct tbuf *b, const char *what)
{
    size_t es = kdtype_size(a->dt);
    test_checks++;
    for (size_t i = 0; i < a->n; i++) {
        if (memcmp((const char *)a->p + i * es, (const char *)b->p + i * es, es) != 0) {
            uint32_t x = 0, y = 0;
            memcpy(&x, (const char *)a->p + i * es, es);
            memcpy(&y, (const char *)b->p + i * es, es);
            TEST_FAIL_("%s: n=%zu element %zu differs: 0x%08x vs 0x%08x", what, a->n, i,
                       (unsigned)x, (unsigned)y);
            return;
        }
    }
}

/* The variants under test: the reference, then AVX-512 and AVX2 each where the build and the CPU
 * have it. A CPU without one of them skips only that variant's checks, with a note. */
#define MAX_VARIANTS 3

static int variants(const struct kernel_ops *out[MAX_VARIANTS])
{
    int nv = 0;
    static int noted;
    out[nv++] = kernel_ops_cpu_ref();
    if (kernel_ops_cpu_avx512() != NULL)
        out[nv++] = kernel_ops_cpu_avx512();
    else if (!(noted & 1)) {
        noted |= 1;
        fprintf(stderr, "note: no AVX-512 kernels (build or CPU): not checking cpu-avx512\n");
    }
    if (kernel_ops_cpu_avx2() != NULL)
        out[nv++] = kernel_ops_cpu_avx2();
    else if (!(noted & 2)) {
        noted |= 2;
        fprintf(stderr, "note: no AVX2/FMA kernels (build or CPU): not checking cpu-avx2\n");
    }
    return nv;
}

/* Relative error of one rounding into a dtype: half an ulp, a whole one when stochastic. */
static double store_eps(int dt, int rounding)
{
    if (dt == KDT_F32)
        return 0x1p-24;
    return rounding == KROUND_STOCHASTIC ? 0x1p-7 : 0x1p-8;
}

#define U32 0x1p-24 /* relative error of one fp32 operation */

static const struct kernel_ctx ctx1 = {.threads = 1}, ctx2 = {.threads = 2};

static struct rng_stream test_stream(enum rng_kind kind, uint64_t step)
{
    return rng_stream_make(1234, rng_name_hash("layers.3.mlp.experts.w1"), kind, step);
}

/* A shard-like index map (runs of 37 elements, 101 apart) so stochastic rounding is keyed on
 * indices that are not the local ones. */
static const struct elem_index_map shard_map = {5, 37, 101};
static const struct elem_index_map whole_map = {0, UINT64_MAX, 0};

/* Index maps for stochastic rounding: short runs (a narrow column shard), long runs that start
 * inside an rng group at indices past 2^35 (the group counter's low word wraps), a whole
 * tensor. The kernels may draw short and long runs differently; the bits must not differ. */
static const struct elem_index_map sr_maps[] = {
    {5, 37, 101},
    {(1ull << 35) - 333, 1000, 5000},
    {0, UINT64_MAX, 0},
};
#define NMAPS (sizeof sr_maps / sizeof sr_maps[0])

/* ---------------- Muon momentum + pack ---------------- */

struct mom_case {
    struct tbuf grad, mom0, mom, out;
    struct momentum_args a;
};

static void mom_case_init(struct mom_case *c, size_t n, int gdt, int mdt, int odt, int nesterov,
                          int rounding, uint64_t seed)
{
    c->grad = tbuf_new(gdt, n);
    c->mom0 = tbuf_new(mdt, n);
    c->mom = tbuf_new(mdt, n);
    c->out = tbuf_new(odt, n);
    tbuf_fill(&c->grad, &seed, -2.0, 2.0);
    tbuf_fill(&c->mom0, &seed, -1.0, 1.0);
    tbuf_copy(&c->mom, &c->mom0);
    c->a = (struct momentum_args){
        .n = n,
        .grad = c->grad.p,
        .grad_dtype = gdt,
        .grad_scale = 0.7f,
        .mom = c->mom.p,
        .mom_dtype = mdt,
        .mom_rounding = rounding,
        .out = c->out.p,
        .out_dtype = odt,
        .mu = 0.95f,
        .nesterov = nesterov,
        .rng = test_stream(RNG_KIND_MOMENTUM, 17),
        .idx = shard_map,
    };
}

static void mom_case_reset(struct mom_case *c) { tbuf_copy(&c->mom, &c->mom0); }

static void mom_case_free(struct mom_case *c)
{
    tbuf_free(&c->grad);
    tbuf_free(&c->mom0);
    tbuf_free(&c->mom);
    tbuf_free(&c->out);
}

/* M and U against fp64; U is checked against the stored M, as the update rule defines it. */
static void mom_case_check_fp64(const struct mom_case *c, const char *variant)
{
    const struct momentum_args *a = &c->a;
    int bad = 0;
    for (size_t i = 0; i < a->n && bad < 3; i++) {
        double g = tbuf_get(&c->grad, i) * (double)a->grad_scale;
        double mu_m0 = (double)a->mu * tbuf_get(&c->mom0, i);
        double m = mu_m0 + g, ms = tbuf_get(&c->mom, i);
        double tol_m =
            store_eps(a->mom_dtype, a->mom_rounding) * fabs(m) + 2 * U32 * (fabs(mu_m0) + fabs(g));
        double u = a->nesterov ? (double)a->mu * ms + g : ms;
        double tol_u = store_eps(a->out_dtype, KROUND_NEAREST) * fabs(u) +
                       (a->nesterov ? 2 * U32 * (fabs(a->mu * ms) + fabs(g)) : 0.0);
        double mk = tbuf_get(&c->mom, i), uk = tbuf_get(&c->out, i);
        if (!(fabs(mk - m) <= tol_m) || !(fabs(uk - u) <= tol_u)) {
            TEST_FAIL_("%s momentum n=%zu g%d m%d o%d nes%d sr%d i=%zu: M %.9g vs %.9g, U %.9g vs "
                       "%.9g",
                       variant, a->n, a->grad_dtype, a->mom_dtype, a->out_dtype, a->nesterov,
                       a->mom_rounding, i, mk, m, uk, u);
            bad++;
        }
    }
    test_checks++;
    EXPECT_TRUE(tbuf_guard_intact(&c->mom) && tbuf_guard_intact(&c->out));
}

TEST(momentum_matches_fp64)
{
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    for (int v = 0; v < nv; v++)
        for (size_t s = 0; s < NSIZES; s++)
            for (int combo = 0; combo < 32; combo++) {
                struct mom_case c;
                mom_case_init(&c, sizes[s], combo & 1, combo >> 1 & 1, combo >> 2 & 1,
                              combo >> 3 & 1, combo >> 4 & 1, 11 + s);
                ops[v]->momentum(&ctx2, &c.a);
                mom_case_check_fp64(&c, ops[v]->name);
                mom_case_free(&c);
            }
}

/* Grad values that make the update overflow, vanish or turn into NaN, including NaNs whose
 * payload would round into the Inf pattern and NaNs with low payload bits. */
static const uint32_t special_f32[] = {
    0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u, 0x7fc01234u, 0x7fa00000u,
    0x7f800000u, 0xff800000u, 0x7f7fffffu, 0xff7fffffu, 0x00000001u, 0x80000001u,
    0x00000000u, 0x80000000u, 0x5f7fffffu, 0x7f7f8000u, 0x00008000u, 0x3f808000u,
};
#define NSPECIAL (sizeof special_f32 / sizeof special_f32[0])

/* Every `every`-th element becomes a special value (stored in the buffer's dtype as is). */
static void tbuf_sprinkle_specials(struct tbuf *b, size_t every)
{
    for (size_t i = 0, k = 0; i < b->n; i += every, k++) {
        uint32_t u = special_f32[k % NSPECIAL];
        if (b->dt == KDT_BF16)
            ((uint16_t *)b->p)[i] = (uint16_t)(u >> 16);
        else
            ((float *)b->p)[i] = f32_from_bits(u);
    }
}

/* Runs every variant with 1 and 2 threads and compares all outputs with the reference, 1 thread. */
static void mom_case_check_bitwise(struct mom_case *c)
{
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    struct tbuf mom_ref = tbuf_new(c->mom.dt, c->a.n), out_ref = tbuf_new(c->out.dt, c->a.n);

    mom_case_reset(c);
    kernel_ops_cpu_ref()->momentum(&ctx1, &c->a);
    tbuf_copy(&mom_ref, &c->mom);
    tbuf_copy(&out_ref, &c->out);
    for (int v = 0; v < nv; v++)
        for (int t = 1; t <= 2; t++) {
            char what[128];
            snprintf(what, sizeof what, "%s threads=%d momentum g%d m%d o%d nes%d sr%d run=%llu",
                     ops[v]->name, t, c->a.grad_dtype, c->a.mom_dtype, c->a.out_dtype,
                     c->a.nesterov, c->a.mom_rounding, (unsigned long long)c->a.idx.run);
            mom_case_reset(c);
            memset(c->out.p, 0, c->a.n * kdtype_size(c->out.dt));
            ops[v]->momentum(t == 1 ? &ctx1 : &ctx2, &c->a);
            expect_same_bits(&c->mom, &mom_ref, what);
            expect_same_bits(&c->out, &out_ref, what);
            EXPECT_TRUE(tbuf_guard_intact(&c->mom) && tbuf_guard_intact(&c->out));
        }
    tbuf_free(&mom_ref);
    tbuf_free(&out_ref);
}

TEST(momentum_bitwise_across_variants_and_threads)
{
    for (size_t s = 0; s < NSIZES; s++)
        for (int combo = 0; combo < 64; combo++) {
            struct mom_case c;
            mom_case_init(&c, sizes[s], combo & 1, combo >> 1 & 1, combo >> 2 & 1, combo >> 3 & 1,
                          combo >> 4 & 1, 100 + s);
            if (combo >> 5 & 1) {
                tbuf_sprinkle_specials(&c.grad, 5);
                tbuf_sprinkle_specials(&c.mom0, 7);
            }
            for (size_t mi = 0; mi < (c.a.mom_rounding == KROUND_STOCHASTIC ? NMAPS : 1); mi++) {
                c.a.idx = sr_maps[mi];
                mom_case_check_bitwise(&c);
            }
            mom_case_free(&c);
        }
}

/* With mu = 0 and scale 1 the momentum is the grad, rounded once into bf16 momentum and into the
 * bf16 pack: exact ties, ties at the top of the range and subnormal ties must round as
 * bf16_from_f32 does, in every variant. */
TEST(momentum_bf16_rounding_matches_bf16_from_f32)
{
    static const uint32_t ties[] = {
        0x3f808000u, 0x3f818000u, 0xbf808000u, 0xbf818000u, 0x00008000u, 0x00018000u,
        0x80018000u, 0x7f7f8000u, 0xff7f8000u, 0x7f7f7fffu, 0x7f7effffu, 0x7f7fffffu,
        0x00007fffu, 0x3f80ffffu, 0x3f807fffu, 0x3f800001u, 0x7f7e8000u, 0x00010000u,
    };
    const size_t nt = sizeof ties / sizeof ties[0];
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    for (int v = 0; v < nv; v++)
        for (int mdt = KDT_F32; mdt <= KDT_BF16; mdt++)
            for (size_t s = 0; s < NSIZES; s++) {
                struct mom_case c;
                mom_case_init(&c, sizes[s], KDT_F32, mdt, KDT_BF16, 0, KROUND_NEAREST, 7 + s);
                c.a.mu = 0.0f;
                c.a.grad_scale = 1.0f;
                for (size_t i = 0; i < c.a.n; i += 2)
                    ((float *)c.grad.p)[i] = f32_from_bits(ties[i / 2 % nt]);
                ops[v]->momentum(&ctx2, &c.a);
                size_t bad = 0;
                for (size_t i = 0; i < c.a.n; i++) {
                    float g = ((float *)c.grad.p)[i];
                    uint16_t want = bf16_from_f32(g);
                    bad += ((uint16_t *)c.out.p)[i] != want;
                    if (mdt == KDT_BF16)
                        bad += ((uint16_t *)c.mom.p)[i] != want;
                    else
                        bad += f32_bits(((float *)c.mom.p)[i]) != f32_bits(g);
                }
                EXPECT_EQ_INT(bad, 0);
                mom_case_free(&c);
            }
}

/* ---------------- AdamW ---------------- */

struct adamw_case {
    struct tbuf param0, param, grad, m0, m, v0, v;
    struct adamw_args a;
};

/* Scalars the way the runtime makes them: in double on the host, for step t. */
static void adamw_scalars(struct adamw_args *a, double lr, double wd, int t)
{
    const double b1 = 0.9, b2 = 0.95;
    a->beta1 = (float)b1;
    a->beta2 = (float)b2;
    a->one_minus_beta1 = (float)(1.0 - b1);
    a->one_minus_beta2 = (float)(1.0 - b2);
    a->eps = 1e-8f;
    a->step_size = (float)(lr / (1.0 - pow(b1, t)));
    a->bc2_rsqrt = (float)(1.0 / sqrt(1.0 - pow(b2, t)));
    a->decay = (float)(1.0 - lr * wd);
}

static void adamw_case_init(struct adamw_case *c, size_t n, int pdt, int gdt, int rounding,
                            uint64_t seed)
{
    c->param0 = tbuf_new(pdt, n);
    c->param = tbuf_new(pdt, n);
    c->grad = tbuf_new(gdt, n);
    c->m0 = tbuf_new(KDT_F32, n);
    c->m = tbuf_new(KDT_F32, n);
    c->v0 = tbuf_new(KDT_F32, n);
    c->v = tbuf_new(KDT_F32, n);
    tbuf_fill(&c->param0, &seed, -1.0, 1.0);
    tbuf_fill(&c->grad, &seed, -1.0, 1.0);
    tbuf_fill(&c->m0, &seed, -0.1, 0.1);
    tbuf_fill(&c->v0, &seed, 0.0, 0.01);
    c->a = (struct adamw_args){
        .n = n,
        .param = c->param.p,
        .param_dtype = pdt,
        .param_rounding = rounding,
        .grad = c->grad.p,
        .grad_dtype = gdt,
        .grad_scale = 0.7f,
        .exp_avg = c->m.p,
        .exp_avg_sq = c->v.p,
        .rng = test_stream(RNG_KIND_PARAM, 3),
        .idx = shard_map,
    };
    adamw_scalars(&c->a, 0.02, 0.1, 3);
}

static void adamw_case_reset(struct adamw_case *c)
{
    tbuf_copy(&c->param, &c->param0);
    tbuf_copy(&c->m, &c->m0);
    tbuf_copy(&c->v, &c->v0);
}

static void adamw_case_free(struct adamw_case *c)
{
    struct tbuf *all[] = {&c->param0, &c->param, &c->grad, &c->m0, &c->m, &c->v0, &c->v};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++)
        tbuf_free(all[k]);
}

/* m and v against fp64; W against fp64 from the stored m and v (each step checked on its own). */
static void adamw_case_check_fp64(const struct adamw_case *c, const char *variant)
{
    const struct adamw_args *a = &c->a;
    int bad = 0;
    for (size_t i = 0; i < a->n && bad < 3; i++) {
        double g = tbuf_get(&c->grad, i) * (double)a->grad_scale;
        double m1 = (double)a->beta1 * tbuf_get(&c->m0, i), m2 = (double)a->one_minus_beta1 * g;
        double v1 = (double)a->beta2 * tbuf_get(&c->v0, i), v2 = (double)a->one_minus_beta2 * g * g;
        double mk = tbuf_get(&c->m, i), vk = tbuf_get(&c->v, i);
        double w1 = tbuf_get(&c->param0, i) * (double)a->decay;
        double q = (double)a->step_size * mk / (sqrt(vk) * (double)a->bc2_rsqrt + (double)a->eps);
        double w = w1 - q, wk = tbuf_get(&c->param, i);
        int ok = fabs(mk - (m1 + m2)) <= 3 * U32 * (fabs(m1) + fabs(m2)) &&
                 fabs(vk - (v1 + v2)) <= 4 * U32 * (v1 + v2) &&
                 fabs(wk - w) <= store_eps(a->param_dtype, a->param_rounding) * fabs(w) +
                                     6 * U32 * (fabs(w1) + fabs(q));
        if (!ok) {
            TEST_FAIL_("%s adamw n=%zu p%d g%d sr%d i=%zu: m %.9g vs %.9g, v %.9g vs %.9g, W %.9g "
                       "vs %.9g",
                       variant, a->n, a->param_dtype, a->grad_dtype, a->param_rounding, i, mk,
                       m1 + m2, vk, v1 + v2, wk, w);
            bad++;
        }
    }
    test_checks++;
    EXPECT_TRUE(tbuf_guard_intact(&c->param) && tbuf_guard_intact(&c->m) &&
                tbuf_guard_intact(&c->v));
}

TEST(adamw_matches_fp64)
{
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    for (int v = 0; v < nv; v++)
        for (size_t s = 0; s < NSIZES; s++)
            for (int combo = 0; combo < 8; combo++) {
                struct adamw_case c;
                adamw_case_init(&c, sizes[s], combo & 1, combo >> 1 & 1, combo >> 2 & 1, 21 + s);
                adamw_case_reset(&c);
                ops[v]->adamw(&ctx2, &c.a);
                adamw_case_check_fp64(&c, ops[v]->name);
                adamw_case_free(&c);
            }
}

static void adamw_case_check_bitwise(struct adamw_case *c)
{
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    struct tbuf p_ref = tbuf_new(c->param.dt, c->a.n);
    struct tbuf m_ref = tbuf_new(KDT_F32, c->a.n), v_ref = tbuf_new(KDT_F32, c->a.n);

    adamw_case_reset(c);
    kernel_ops_cpu_ref()->adamw(&ctx1, &c->a);
    tbuf_copy(&p_ref, &c->param);
    tbuf_copy(&m_ref, &c->m);
    tbuf_copy(&v_ref, &c->v);
    for (int v = 0; v < nv; v++)
        for (int t = 1; t <= 2; t++) {
            char what[128];
            snprintf(what, sizeof what, "%s threads=%d adamw p%d g%d sr%d run=%llu", ops[v]->name,
                     t, c->a.param_dtype, c->a.grad_dtype, c->a.param_rounding,
                     (unsigned long long)c->a.idx.run);
            adamw_case_reset(c);
            ops[v]->adamw(t == 1 ? &ctx1 : &ctx2, &c->a);
            expect_same_bits(&c->param, &p_ref, what);
            expect_same_bits(&c->m, &m_ref, what);
            expect_same_bits(&c->v, &v_ref, what);
            EXPECT_TRUE(tbuf_guard_intact(&c->param) && tbuf_guard_intact(&c->m) &&
                        tbuf_guard_intact(&c->v));
        }
    tbuf_free(&p_ref);
    tbuf_free(&m_ref);
    tbuf_free(&v_ref);
}

TEST(adamw_bitwise_across_variants_and_threads)
{
    for (size_t s = 0; s < NSIZES; s++)
        for (int combo = 0; combo < 16; combo++) {
            struct adamw_case c;
            adamw_case_init(&c, sizes[s], combo & 1, combo >> 1 & 1, combo >> 2 & 1, 200 + s);
            if (combo >> 3 & 1) {
                tbuf_sprinkle_specials(&c.grad, 5);
                tbuf_sprinkle_specials(&c.m0, 7);
                tbuf_sprinkle_specials(&c.v0, 11);
                tbuf_sprinkle_specials(&c.param0, 13);
            }
            for (size_t mi = 0; mi < (c.a.param_rounding == KROUND_STOCHASTIC ? NMAPS : 1); mi++) {
                c.a.idx = sr_maps[mi];
                adamw_case_check_bitwise(&c);
            }
            adamw_case_free(&c);
        }
}

/* ---------------- apply ---------------- */

struct apply_case {
    struct tbuf param0, param, update;
    struct apply_args a;
};

static void apply_case_init(struct apply_case *c, size_t n, int pdt, int udt, int rounding,
                            uint64_t seed)
{
    c->param0 = tbuf_new(pdt, n);
    c->param = tbuf_new(pdt, n);
    c->update = tbuf_new(udt, n);
    tbuf_fill(&c->param0, &seed, -1.0, 1.0);
    tbuf_fill(&c->update, &seed, -1.0, 1.0);
    tbuf_copy(&c->param, &c->param0);
    c->a = (struct apply_args){
        .n = n,
        .param = c->param.p,
        .param_dtype = pdt,
        .param_rounding = rounding,
        .update = c->update.p,
        .update_dtype = udt,
        .alpha = (float)(0.02 * 0.2 * sqrt(4096.0)),
        .decay = (float)(1.0 - 0.02 * 0.1),
        .rng = test_stream(RNG_KIND_PARAM, 9),
        .idx = shard_map,
    };
}

static void apply_case_reset(struct apply_case *c) { tbuf_copy(&c->param, &c->param0); }

static void apply_case_free(struct apply_case *c)
{
    tbuf_free(&c->param0);
    tbuf_free(&c->param);
    tbuf_free(&c->update);
}

static void apply_case_check_fp64(const struct apply_case *c, const char *variant)
{
    const struct apply_args *a = &c->a;
    int bad = 0;
    for (size_t i = 0; i < a->n && bad < 3; i++) {
        double w1 = tbuf_get(&c->param0, i) * (double)a->decay;
        double w2 = (double)a->alpha * tbuf_get(&c->update, i);
        double w = w1 - w2, wk = tbuf_get(&c->param, i);
        double tol = store_eps(a->param_dtype, a->param_rounding) * fabs(w) +
                     2 * U32 * (fabs(w1) + fabs(w2));
        if (!(fabs(wk - w) <= tol)) {
            TEST_FAIL_("%s apply n=%zu p%d u%d sr%d i=%zu: W %.9g vs %.9g", variant, a->n,
                       a->param_dtype, a->update_dtype, a->param_rounding, i, wk, w);
            bad++;
        }
    }
    test_checks++;
    EXPECT_TRUE(tbuf_guard_intact(&c->param));
}

TEST(apply_matches_fp64)
{
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    for (int v = 0; v < nv; v++)
        for (size_t s = 0; s < NSIZES; s++)
            for (int combo = 0; combo < 8; combo++) {
                struct apply_case c;
                apply_case_init(&c, sizes[s], combo & 1, combo >> 1 & 1, combo >> 2 & 1, 31 + s);
                ops[v]->apply(&ctx2, &c.a);
                apply_case_check_fp64(&c, ops[v]->name);
                apply_case_free(&c);
            }
}

static void apply_case_check_bitwise(struct apply_case *c)
{
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    struct tbuf p_ref = tbuf_new(c->param.dt, c->a.n);

    apply_case_reset(c);
    kernel_ops_cpu_ref()->apply(&ctx1, &c->a);
    tbuf_copy(&p_ref, &c->param);
    for (int v = 0; v < nv; v++)
        for (int t = 1; t <= 2; t++) {
            char what[128];
            snprintf(what, sizeof what, "%s threads=%d apply p%d u%d sr%d run=%llu", ops[v]->name,
                     t, c->a.param_dtype, c->a.update_dtype, c->a.param_rounding,
                     (unsigned long long)c->a.idx.run);
            apply_case_reset(c);
            ops[v]->apply(t == 1 ? &ctx1 : &ctx2, &c->a);
            expect_same_bits(&c->param, &p_ref, what);
            EXPECT_TRUE(tbuf_guard_intact(&c->param));
        }
    tbuf_free(&p_ref);
}

TEST(apply_bitwise_across_variants_and_threads)
{
    for (size_t s = 0; s < NSIZES; s++)
        for (int combo = 0; combo < 16; combo++) {
            struct apply_case c;
            apply_case_init(&c, sizes[s], combo & 1, combo >> 1 & 1, combo >> 2 & 1, 300 + s);
            if (combo >> 3 & 1) {
                tbuf_sprinkle_specials(&c.update, 5);
                tbuf_sprinkle_specials(&c.param0, 7);
            }
            for (size_t mi = 0; mi < (c.a.param_rounding == KROUND_STOCHASTIC ? NMAPS : 1); mi++) {
                c.a.idx = sr_maps[mi];
                apply_case_check_bitwise(&c);
            }
            apply_case_free(&c);
        }
}

/* ---------------- stochastic rounding ---------------- */

/* Stochastic bf16 apply, element by element from the documented rule and the global index: the
 * bits must come from (stream, global index), nothing else. */
TEST(stochastic_apply_uses_global_index_bits)
{
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    for (int v = 0; v < nv; v++)
        for (size_t mi = 0; mi < NMAPS; mi++) {
            struct apply_case c;
            apply_case_init(&c, 100003, KDT_BF16, KDT_BF16, KROUND_STOCHASTIC, 41);
            c.a.idx = sr_maps[mi];
            ops[v]->apply(&ctx2, &c.a);
            size_t bad = 0;
            for (size_t i = 0; i < c.a.n; i++) {
                float w = fmaf(-c.a.alpha, (float)tbuf_get(&c.update, i),
                               (float)tbuf_get(&c.param0, i) * c.a.decay);
                uint16_t r = rng_bits16(&c.a.rng, elem_index_global(&c.a.idx, i));
                bad += ((uint16_t *)c.param.p)[i] != bf16_from_f32_sr(w, r);
            }
            EXPECT_EQ_INT(bad, 0);
            apply_case_free(&c);
        }
}

/* A [rows, cols] bf16 matrix updated whole, and again as column shards with their index maps:
 * every element gets the same bits either way. */
TEST(stochastic_rounding_independent_of_sharding)
{
    enum { ROWS = 37, COLS = 1001, SHARDS = 3 };
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    for (int v = 0; v < nv; v++) {
        struct apply_case whole;
        apply_case_init(&whole, ROWS * COLS, KDT_BF16, KDT_F32, KROUND_STOCHASTIC, 51);
        whole.a.idx = whole_map;
        ops[v]->apply(&ctx1, &whole.a);
        size_t bad = 0;
        for (int s = 0; s < SHARDS; s++) {
            size_t c0 = (size_t)COLS * s / SHARDS, c1 = (size_t)COLS * (s + 1) / SHARDS;
            size_t w = c1 - c0;
            struct apply_case part;
            apply_case_init(&part, ROWS * w, KDT_BF16, KDT_F32, KROUND_STOCHASTIC, 1);
            for (size_t r = 0; r < ROWS; r++)
                for (size_t k = 0; k < w; k++) {
                    ((uint16_t *)part.param.p)[r * w + k] =
                        ((uint16_t *)whole.param0.p)[r * COLS + c0 + k];
                    ((float *)part.update.p)[r * w + k] =
                        ((float *)whole.update.p)[r * COLS + c0 + k];
                }
            part.a.idx = (struct elem_index_map){c0, w, COLS};
            ops[v]->apply(&ctx1, &part.a);
            for (size_t r = 0; r < ROWS; r++)
                for (size_t k = 0; k < w; k++)
                    bad += ((uint16_t *)part.param.p)[r * w + k] !=
                           ((uint16_t *)whole.param.p)[r * COLS + c0 + k];
            apply_case_free(&part);
        }
        EXPECT_EQ_INT(bad, 0);
        apply_case_free(&whole);
    }
}

/* Stochastic rounding must actually be stochastic: it differs from nearest on a good share of
 * elements, and another step (another stream) draws other bits. */
TEST(stochastic_rounding_differs_from_nearest)
{
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    for (int v = 0; v < nv; v++) {
        const size_t n = 4096;
        struct mom_case near, sr, sr2;
        mom_case_init(&near, n, KDT_F32, KDT_BF16, KDT_F32, 0, KROUND_NEAREST, 61);
        mom_case_init(&sr, n, KDT_F32, KDT_BF16, KDT_F32, 0, KROUND_STOCHASTIC, 61);
        mom_case_init(&sr2, n, KDT_F32, KDT_BF16, KDT_F32, 0, KROUND_STOCHASTIC, 61);
        sr2.a.rng = test_stream(RNG_KIND_MOMENTUM, 18);
        ops[v]->momentum(&ctx1, &near.a);
        ops[v]->momentum(&ctx1, &sr.a);
        ops[v]->momentum(&ctx1, &sr2.a);
        size_t diff_near = 0, diff_step = 0;
        for (size_t i = 0; i < n; i++) {
            diff_near += ((uint16_t *)near.mom.p)[i] != ((uint16_t *)sr.mom.p)[i];
            diff_step += ((uint16_t *)sr2.mom.p)[i] != ((uint16_t *)sr.mom.p)[i];
        }
        /* With uniform discarded fractions a quarter of the elements round the other way;
         * a count near 0 means no randomness, near n/2 a biased draw. */
        EXPECT_TRUE(diff_near > n / 8 && diff_near < n / 2);
        EXPECT_TRUE(diff_step > n / 8);
        mom_case_free(&near);
        mom_case_free(&sr);
        mom_case_free(&sr2);
    }
}

/* NaN, +Inf and -Inf gradients (reaching the kernels only under nonfinite = zero) update as a
 * gradient of 0 would, bit for bit, in every variant: momentum and AdamW. Infinities alone too:
 * a NaN in a vector sends the vector variants to the reference for that block, an Inf does not. */
static void poison_grad(struct tbuf *g, struct tbuf *zeroed, size_t every, int inf_only)
{
    static const uint32_t bad[] = {0x7fc00000u, 0x7f800000u, 0xff800000u, 0xffc01234u};
    for (size_t i = 0, k = 0; i < g->n; i += every, k++) {
        const uint32_t u = inf_only ? bad[1 + k % 2] : bad[k % 4];
        if (g->dt == KDT_BF16) {
            ((uint16_t *)g->p)[i] = (uint16_t)(u >> 16);
            ((uint16_t *)zeroed->p)[i] = 0;
        } else {
            ((float *)g->p)[i] = f32_from_bits(u);
            ((float *)zeroed->p)[i] = 0.0f;
        }
    }
}

TEST(nonfinite_gradients_update_as_zero_in_every_variant)
{
    const struct kernel_ops *ops[MAX_VARIANTS];
    int nv = variants(ops);
    for (int v = 0; v < nv; v++)
        for (int combo = 0; combo < 16; combo++) {
            const int inf_only = combo >> 3 & 1;
            struct mom_case p, z;
            mom_case_init(&p, 1000, combo & 1, combo >> 1 & 1, combo >> 2 & 1, 1, 0, 5);
            mom_case_init(&z, 1000, combo & 1, combo >> 1 & 1, combo >> 2 & 1, 1, 0, 5);
            poison_grad(&p.grad, &z.grad, 3, inf_only);
            ops[v]->momentum(&ctx2, &p.a);
            ops[v]->momentum(&ctx2, &z.a);
            char what[96];
            snprintf(what, sizeof what, "%s momentum, non-finite grads vs 0, combo %d",
                     ops[v]->name, combo);
            expect_same_bits(&p.mom, &z.mom, what);
            expect_same_bits(&p.out, &z.out, what);
            mom_case_free(&p);
            mom_case_free(&z);

            struct adamw_case pa, za;
            adamw_case_init(&pa, 1000, combo & 1, combo >> 1 & 1, 0, 7);
            adamw_case_init(&za, 1000, combo & 1, combo >> 1 & 1, 0, 7);
            poison_grad(&pa.grad, &za.grad, 3, inf_only);
            ops[v]->adamw(&ctx2, &pa.a);
            ops[v]->adamw(&ctx2, &za.a);
            snprintf(what, sizeof what, "%s adamw, non-finite grads vs 0, combo %d", ops[v]->name,
                     combo);
            expect_same_bits(&pa.param, &za.param, what);
            expect_same_bits(&pa.m, &za.m, what);
            expect_same_bits(&pa.v, &za.v, what);
            adamw_case_free(&pa);
            adamw_case_free(&za);
        }
}
