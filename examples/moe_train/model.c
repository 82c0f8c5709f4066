#include "model.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RMS_EPS 1e-6f

/* Activations kept from the forward for the backward, n tokens at most max_tokens. */
struct acts {
    float *h0, *r1, *n1, *q, *k, *v, *gt, *a, *h1, *r2, *n2, *logits, *w, *h2, *r3, *n3, *y;
    int *top;              /* [n, topk] chosen experts */
    float *xug, *xuu, *xo; /* per (token, slot): expert gate/up pre-activations, output */
    float *sug, *suu, *sm; /* shared expert */
    int *list;             /* tokens*topk (token, slot) pairs grouped by expert */
    int *count;            /* [experts] */
    float *gx, *gf1, *gf2, *gf3, *gy; /* gather buffers: [n, hidden], [n, ffn] x3, [n, hidden] */
    float *d1, *d2, *d3, *d4, *dq, *dk, *dv; /* backward temporaries */
    float *dy, *dw, *dlogits;                /* [n, out], [n, topk], [n, experts] */
};

static float urand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void add_tensor(struct moe_model *m, int i, const char *name, int ndim, int64_t a, int64_t b,
                       int64_t c, enum moe_kind kind)
{
    struct moe_tensor *t = &m->p[i];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = a;
    t->shape[1] = ndim > 1 ? b : 1;
    t->shape[2] = ndim > 2 ? c : 1;
    t->numel = t->shape[0] * t->shape[1] * t->shape[2];
    t->kind = kind;
}

int moe_model_init(struct moe_model *m, const struct moe_dims *d, uint64_t seed, int max_tokens)
{
    memset(m, 0, sizeof *m);
    m->d = *d;
    m->max_tokens = max_tokens;
    const int H = d->hidden, F = d->ffn, E = d->experts;
    add_tensor(m, P_EMBED, "embed_tokens.weight", 2, d->vocab, H, 1, MOE_DENSE);
    add_tensor(m, P_ATTN_NORM, "layers.0.input_layernorm.weight", 1, H, 1, 1, MOE_REPLICATED);
    add_tensor(m, P_WQ, "layers.0.self_attn.q_proj.weight", 2, H, H, 1, MOE_DENSE);
    add_tensor(m, P_BQ, "layers.0.self_attn.q_proj.bias", 1, H, 1, 1, MOE_DENSE);
    add_tensor(m, P_WK, "layers.0.self_attn.k_proj.weight", 2, H, H, 1, MOE_DENSE);
    add_tensor(m, P_BK, "layers.0.self_attn.k_proj.bias", 1, H, 1, 1, MOE_DENSE);
    add_tensor(m, P_WV, "layers.0.self_attn.v_proj.weight", 2, H, H, 1, MOE_DENSE);
    add_tensor(m, P_BV, "layers.0.self_attn.v_proj.bias", 1, H, 1, 1, MOE_DENSE);
    add_tensor(m, P_WO, "layers.0.self_attn.o_proj.weight", 2, H, H, 1, MOE_DENSE);
    add_tensor(m, P_BO, "layers.0.self_attn.o_proj.bias", 1, H, 1, 1, MOE_DENSE);
    add_tensor(m, P_MLP_NORM, "layers.0.post_attention_layernorm.weight", 1, H, 1, 1,
               MOE_REPLICATED);
    add_tensor(m, P_ROUTER, "layers.0.mlp.gate.weight", 2, E, H, 1, MOE_DENSE);
    add_tensor(m, P_XG, "layers.0.mlp.experts.gate_proj", 3, E, F, H, MOE_EXPERT);
    add_tensor(m, P_XU, "layers.0.mlp.experts.up_proj", 3, E, F, H, MOE_EXPERT);
    add_tensor(m, P_XD, "layers.0.mlp.experts.down_proj", 3, E, H, F, MOE_EXPERT);
    add_tensor(m, P_SG, "layers.0.mlp.shared_expert.gate_proj.weight", 2, F, H, 1, MOE_DENSE);
    add_tensor(m, P_SU, "layers.0.mlp.shared_expert.up_proj.weight", 2, F, H, 1, MOE_DENSE);
    add_tensor(m, P_SD, "layers.0.mlp.shared_expert.down_proj.weight", 2, H, F, 1, MOE_DENSE);
    add_tensor(m, P_FINAL_NORM, "norm.weight", 1, H, 1, 1, MOE_REPLICATED);
    add_tensor(m, P_LM_HEAD, "lm_head.weight", 2, d->out, H, 1, MOE_DENSE);

    for (int i = 0; i < MOE_NPARAMS; i++) {
        struct moe_tensor *t = &m->p[i];
        t->w = malloc(sizeof(float) * (size_t)t->numel);
        t->g = calloc((size_t)t->numel, sizeof(float));
        if (t->w == NULL || t->g == NULL)
            return -1;
        m->total += t->numel;
        /* matrices: uniform with variance 1/in; the embedding: variance 1; biases 0, norms 1 */
        const int64_t in = t->shape[t->ndim - 1];
        const float s = i == P_EMBED ? sqrtf(3.0f) : t->ndim == 1 ? 0.0f : sqrtf(3.0f / (float)in);
        const int is_norm = i == P_ATTN_NORM || i == P_MLP_NORM || i == P_FINAL_NORM;
        for (int64_t j = 0; j < t->numel; j++)
            t->w[j] = is_norm ? 1.0f : s * urand(&seed);
    }

    struct acts *a = calloc(1, sizeof *a);
    m->scratch = a;
    if (a == NULL)
        return -1;
    const size_t n = (size_t)max_tokens, K = (size_t)d->topk;
    float **fh[] = {&a->h0, &a->n1, &a->q,  &a->k,  &a->v,  &a->gt, &a->a,  &a->h1, &a->n2,
                    &a->h2, &a->n3, &a->gx, &a->gy, &a->d1, &a->d2, &a->dq, &a->dk, &a->dv};
    for (size_t i = 0; i < sizeof fh / sizeof fh[0]; i++)
        if ((*fh[i] = malloc(sizeof(float) * n * (size_t)H)) == NULL)
            return -1;
    float **ff[] = {&a->sug, &a->suu, &a->sm, &a->gf1, &a->gf2, &a->gf3, &a->d3, &a->d4};
    for (size_t i = 0; i < sizeof ff / sizeof ff[0]; i++)
        if ((*ff[i] = malloc(sizeof(float) * n * (size_t)F)) == NULL)
            return -1;
    a->r1 = malloc(sizeof(float) * n);
    a->r2 = malloc(sizeof(float) * n);
    a->r3 = malloc(sizeof(float) * n);
    a->logits = malloc(sizeof(float) * n * (size_t)E);
    a->w = malloc(sizeof(float) * n * K);
    a->y = malloc(sizeof(float) * n * (size_t)d->out);
    a->top = malloc(sizeof(int) * n * K);
    a->xug = malloc(sizeof(float) * n * K * (size_t)F);
    a->xuu = malloc(sizeof(float) * n * K * (size_t)F);
    a->xo = malloc(sizeof(float) * n * K * (size_t)H);
    a->list = malloc(sizeof(int) * n * K);
    a->count = malloc(sizeof(int) * (size_t)E);
    a->dy = malloc(sizeof(float) * n * (size_t)d->out);
    a->dw = malloc(sizeof(float) * n * K);
    a->dlogits = malloc(sizeof(float) * n * (size_t)E);
    if (!a->r1 || !a->r2 || !a->r3 || !a->logits || !a->w || !a->y || !a->top || !a->xug ||
        !a->xuu || !a->xo || !a->list || !a->count || !a->dy || !a->dw || !a->dlogits)
        return -1;
    return 0;
}

void moe_model_free(struct moe_model *m)
{
    for (int i = 0; i < MOE_NPARAMS; i++) {
        free(m->p[i].w);
        free(m->p[i].g);
    }
    struct acts *a = m->scratch;
    if (a != NULL) {
        void *all[] = {a->h0,  a->r1,  a->n1, a->q,    a->k,      a->v,      a->gt,
                       a->a,   a->h1,  a->r2, a->n2,   a->logits, a->w,      a->h2,
                       a->r3,  a->n3,  a->y,  a->top,  a->xug,    a->xuu,    a->xo,
                       a->sug, a->suu, a->sm, a->list, a->count,  a->gx,     a->gf1,
                       a->gf2, a->gf3, a->gy, a->d1,   a->d2,     a->d3,     a->d4,
                       a->dq,  a->dk,  a->dv, a->dy,   a->dw,     a->dlogits};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            free(all[i]);
        free(a);
    }
    memset(m, 0, sizeof *m);
}

void moe_zero_grad(struct moe_model *m)
{
    for (int i = 0; i < MOE_NPARAMS; i++)
        memset(m->p[i].g, 0, sizeof(float) * (size_t)m->p[i].numel);
}

/* C[M,N] = beta C + A[M,K] B[N,K]^T  (activations times a weight [out, in]) */
static void mm_nt(int M, int N, int K, const float *A, const float *B, float beta, float *C)
{
    if (M > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, A, K, B, K, beta, C, N);
}

/* C[M,N] = beta C + A[M,K] B[K,N]  (gradients times a weight) */
static void mm_nn(int M, int N, int K, const float *A, const float *B, float beta, float *C)
{
    if (M > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A, K, B, N, beta, C,
                    N);
}

/* C[M,N] += A[K,M]^T B[K,N]  (weight gradients: dY^T X over K tokens) */
static void mm_tn_acc(int M, int N, int K, const float *A, const float *B, float *C)
{
    if (K > 0)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, 1.0f, A, M, B, N, 1.0f, C, N);
}

static void add_bias(int n, int width, const float *b, float *x)
{
    for (int t = 0; t < n; t++)
        for (int j = 0; j < width; j++)
            x[(size_t)t * width + j] += b[j];
}

static void bias_grad(int n, int width, const float *d, float *gb)
{
    for (int t = 0; t < n; t++)
        for (int j = 0; j < width; j++)
            gb[j] += d[(size_t)t * width + j];
}

static void rmsnorm(int n, int H, const float *x, const float *g, float *r, float *y)
{
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * H;
        double ss = 0;
        for (int j = 0; j < H; j++)
            ss += (double)xt[j] * xt[j];
        r[t] = 1.0f / sqrtf((float)(ss / H) + RMS_EPS);
        for (int j = 0; j < H; j++)
            y[(size_t)t * H + j] = xt[j] * r[t] * g[j];
    }
}

/* dy -> dx (added into dx) and dg (added) for y = x * r * g */
static void rmsnorm_back(int n, int H, const float *x, const float *g, const float *r,
                         const float *dy, float *dx, float *dg)
{
    for (int t = 0; t < n; t++) {
        const float *xt = x + (size_t)t * H, *dyt = dy + (size_t)t * H;
        double dot = 0;
        for (int j = 0; j < H; j++) {
            dg[j] += dyt[j] * xt[j] * r[t];
            dot += (double)dyt[j] * g[j] * xt[j] * r[t];
        }
        const float mean = (float)(dot / H);
        for (int j = 0; j < H; j++) {
            const float xhat = xt[j] * r[t];
            dx[(size_t)t * H + j] += r[t] * (dyt[j] * g[j] - xhat * mean);
        }
    }
}

static float sigm(float x) { return 1.0f / (1.0f + expf(-x)); }

/* m = silu(ug) * uu */
static void swiglu_mid(size_t n, const float *ug, const float *uu, float *m)
{
    for (size_t i = 0; i < n; i++)
        m[i] = ug[i] * sigm(ug[i]) * uu[i];
}

/* dm -> dug, duu */
static void swiglu_mid_back(size_t n, const float *ug, const float *uu, const float *dm, float *dug,
                            float *duu)
{
    for (size_t i = 0; i < n; i++) {
        const float s = sigm(ug[i]);
        duu[i] = dm[i] * ug[i] * s;
        dug[i] = dm[i] * uu[i] * s * (1.0f + ug[i] * (1.0f - s));
    }
}

static void forward(struct moe_model *m, const int *tokens, int n)
{
    struct acts *a = m->scratch;
    const int H = m->d.hidden, F = m->d.ffn, E = m->d.experts, K = m->d.topk;
#define P(i) (m->p[(i)].w)
    for (int t = 0; t < n; t++)
        memcpy(a->h0 + (size_t)t * H, P(P_EMBED) + (size_t)tokens[t] * H, sizeof(float) * H);
    rmsnorm(n, H, a->h0, P(P_ATTN_NORM), a->r1, a->n1);
    mm_nt(n, H, H, a->n1, P(P_WQ), 0.0f, a->q);
    mm_nt(n, H, H, a->n1, P(P_WK), 0.0f, a->k);
    mm_nt(n, H, H, a->n1, P(P_WV), 0.0f, a->v);
    add_bias(n, H, P(P_BQ), a->q);
    add_bias(n, H, P(P_BK), a->k);
    add_bias(n, H, P(P_BV), a->v);
    for (size_t i = 0; i < (size_t)n * H; i++) {
        a->gt[i] = tanhf(a->q[i] * a->k[i]);
        a->a[i] = a->gt[i] * a->v[i];
    }
    memcpy(a->h1, a->h0, sizeof(float) * (size_t)n * H);
    mm_nt(n, H, H, a->a, P(P_WO), 1.0f, a->h1);
    add_bias(n, H, P(P_BO), a->h1);
    rmsnorm(n, H, a->h1, P(P_MLP_NORM), a->r2, a->n2);

    /* router: top-k by logit (ties to the lower index), softmax over the chosen */
    mm_nt(n, E, H, a->n2, P(P_ROUTER), 0.0f, a->logits);
    for (int t = 0; t < n; t++) {
        const float *lg = a->logits + (size_t)t * E;
        int *top = a->top + (size_t)t * K;
        for (int s = 0; s < K; s++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int u = 0; u < s; u++)
                    taken |= top[u] == e;
                if (!taken && (best < 0 || lg[e] > lg[best]))
                    best = e;
            }
            top[s] = best;
        }
        float mx = lg[top[0]], sum = 0;
        for (int s = 0; s < K; s++)
            sum += (a->w[(size_t)t * K + s] = expf(lg[top[s]] - mx));
        for (int s = 0; s < K; s++)
            a->w[(size_t)t * K + s] /= sum;
    }

    /* shared expert on every token */
    mm_nt(n, F, H, a->n2, P(P_SG), 0.0f, a->sug);
    mm_nt(n, F, H, a->n2, P(P_SU), 0.0f, a->suu);
    swiglu_mid((size_t)n * F, a->sug, a->suu, a->sm);
    memcpy(a->h2, a->h1, sizeof(float) * (size_t)n * H);
    mm_nt(n, H, F, a->sm, P(P_SD), 1.0f, a->h2);

    /* routed experts: group (token, slot) pairs by expert, one GEMM per expert */
    int off = 0;
    for (int e = 0; e < E; e++) {
        int c = 0;
        for (int t = 0; t < n; t++)
            for (int s = 0; s < K; s++)
                if (a->top[(size_t)t * K + s] == e)
                    a->list[off + c++] = t * K + s;
        a->count[e] = c;
        for (int i = 0; i < c; i++)
            memcpy(a->gx + (size_t)i * H, a->n2 + (size_t)(a->list[off + i] / K) * H,
                   sizeof(float) * H);
        const size_t xo = (size_t)e * F * H;
        mm_nt(c, F, H, a->gx, P(P_XG) + xo, 0.0f, a->gf1);
        mm_nt(c, F, H, a->gx, P(P_XU) + xo, 0.0f, a->gf2);
        swiglu_mid((size_t)c * F, a->gf1, a->gf2, a->gf3);
        mm_nt(c, H, F, a->gf3, P(P_XD) + xo, 0.0f, a->gy);
        for (int i = 0; i < c; i++) {
            const int ts = a->list[off + i], t = ts / K;
            memcpy(a->xug + (size_t)ts * F, a->gf1 + (size_t)i * F, sizeof(float) * F);
            memcpy(a->xuu + (size_t)ts * F, a->gf2 + (size_t)i * F, sizeof(float) * F);
            memcpy(a->xo + (size_t)ts * H, a->gy + (size_t)i * H, sizeof(float) * H);
            const float w = a->w[ts];
            for (int j = 0; j < H; j++)
                a->h2[(size_t)t * H + j] += w * a->gy[(size_t)i * H + j];
        }
        off += c;
    }
    rmsnorm(n, H, a->h2, P(P_FINAL_NORM), a->r3, a->n3);
    mm_nt(n, m->d.out, H, a->n3, P(P_LM_HEAD), 0.0f, a->y);
#undef P
}

void moe_forward(struct moe_model *m, const int *tokens, int n, float *y)
{
    struct acts *a = m->scratch;
    forward(m, tokens, n);
    memcpy(y, a->y, sizeof(float) * (size_t)n * m->d.out);
}

double moe_forward_backward(struct moe_model *m, const int *tokens, int n, const float *target,
                            double count)
{
    struct acts *a = m->scratch;
    const int H = m->d.hidden, F = m->d.ffn, E = m->d.experts, K = m->d.topk, O = m->d.out;
#define P(i) (m->p[(i)].w)
#define G(i) (m->p[(i)].g)
    forward(m, tokens, n);

    double loss = 0;
    float *dy = a->dy;
    const double scale = 1.0 / (count * O);
    for (size_t i = 0; i < (size_t)n * O; i++) {
        const double diff = (double)a->y[i] - target[i];
        loss += 0.5 * diff * diff * scale;
        dy[i] = (float)(diff * scale);
    }
    mm_tn_acc(O, H, n, dy, a->n3, G(P_LM_HEAD));
    float *dn = a->d2; /* d n3 */
    mm_nn(n, H, O, dy, P(P_LM_HEAD), 0.0f, dn);
    float *dh2 = a->dq; /* reused: q, k, v gradients come later */
    memset(dh2, 0, sizeof(float) * (size_t)n * H);
    rmsnorm_back(n, H, a->h2, P(P_FINAL_NORM), a->r3, dn, dh2, G(P_FINAL_NORM));

    /* dh1 = dh2 (residual) + through n2; dn2 collects shared expert, experts and router */
    float *dn2 = a->dk;
    memset(dn2, 0, sizeof(float) * (size_t)n * H);

    /* shared expert */
    float *dm = a->d3, *dug = a->d4, *duu = a->gf3;
    mm_tn_acc(H, F, n, dh2, a->sm, G(P_SD));
    mm_nn(n, F, H, dh2, P(P_SD), 0.0f, dm);
    swiglu_mid_back((size_t)n * F, a->sug, a->suu, dm, dug, duu);
    mm_tn_acc(F, H, n, dug, a->n2, G(P_SG));
    mm_tn_acc(F, H, n, duu, a->n2, G(P_SU));
    mm_nn(n, H, F, dug, P(P_SG), 1.0f, dn2);
    mm_nn(n, H, F, duu, P(P_SU), 1.0f, dn2);

    /* routed experts; dw[t, s] = <dh2[t], o[t, s]> for the router */
    float *dw = a->dw;
    for (int ts = 0; ts < n * K; ts++) {
        const int t = ts / K;
        double s = 0;
        for (int j = 0; j < H; j++)
            s += (double)dh2[(size_t)t * H + j] * a->xo[(size_t)ts * H + j];
        dw[ts] = (float)s;
    }
    int off = 0;
    for (int e = 0; e < E; e++) {
        const int c = a->count[e];
        const size_t xo = (size_t)e * F * H;
        float *gdo = a->gy, *gm = a->gf3, *gdm = a->d3, *gdug = a->d4, *gduu = a->gf2;
        for (int i = 0; i < c; i++) {
            const int ts = a->list[off + i], t = ts / K;
            memcpy(a->gx + (size_t)i * H, a->n2 + (size_t)t * H, sizeof(float) * H);
            memcpy(a->gf1 + (size_t)i * F, a->xug + (size_t)ts * F, sizeof(float) * F);
            memcpy(gduu + (size_t)i * F, a->xuu + (size_t)ts * F, sizeof(float) * F);
            for (int j = 0; j < H; j++)
                gdo[(size_t)i * H + j] = a->w[ts] * dh2[(size_t)t * H + j];
        }
        /* gf1 = ug, gduu holds uu until swiglu_mid_back overwrites it (read first) */
        swiglu_mid((size_t)c * F, a->gf1, gduu, gm);
        mm_tn_acc(H, F, c, gdo, gm, G(P_XD) + xo);
        mm_nn(c, F, H, gdo, P(P_XD) + xo, 0.0f, gdm);
        for (size_t i = 0; i < (size_t)c * F; i++) {
            const float ug = a->gf1[i], uu = gduu[i], s = sigm(ug);
            gduu[i] = gdm[i] * ug * s;
            gdug[i] = gdm[i] * uu * s * (1.0f + ug * (1.0f - s));
        }
        mm_tn_acc(F, H, c, gdug, a->gx, G(P_XG) + xo);
        mm_tn_acc(F, H, c, gduu, a->gx, G(P_XU) + xo);
        mm_nn(c, H, F, gdug, P(P_XG) + xo, 0.0f, gdo);
        mm_nn(c, H, F, gduu, P(P_XU) + xo, 1.0f, gdo);
        for (int i = 0; i < c; i++) {
            const int t = a->list[off + i] / K;
            for (int j = 0; j < H; j++)
                dn2[(size_t)t * H + j] += gdo[(size_t)i * H + j];
        }
        off += c;
    }
    /* router: softmax over the chosen logits */
    float *dlogits = a->dlogits;
    memset(dlogits, 0, sizeof(float) * (size_t)n * E);
    for (int t = 0; t < n; t++) {
        const float *w = a->w + (size_t)t * K, *g = dw + (size_t)t * K;
        double wg = 0;
        for (int s = 0; s < K; s++)
            wg += (double)w[s] * g[s];
        for (int s = 0; s < K; s++)
            dlogits[(size_t)t * E + a->top[(size_t)t * K + s]] = (float)(w[s] * (g[s] - wg));
    }
    mm_tn_acc(E, H, n, dlogits, a->n2, G(P_ROUTER));
    mm_nn(n, H, E, dlogits, P(P_ROUTER), 1.0f, dn2);

    float *dh1 = dh2; /* residual: dh1 = dh2 + d(through n2) */
    rmsnorm_back(n, H, a->h1, P(P_MLP_NORM), a->r2, dn2, dh1, G(P_MLP_NORM));

    /* attention-like block */
    float *da = a->gx; /* the expert gather buffer is free again */
    mm_tn_acc(H, H, n, dh1, a->a, G(P_WO));
    bias_grad(n, H, dh1, G(P_BO));
    mm_nn(n, H, H, dh1, P(P_WO), 0.0f, da);
    float *dq = a->d1, *dk = a->d2, *dv = a->dv;
    for (size_t i = 0; i < (size_t)n * H; i++) {
        const float gt = a->gt[i], dp = da[i] * a->v[i] * (1.0f - gt * gt);
        dv[i] = da[i] * gt;
        dq[i] = dp * a->k[i];
        dk[i] = dp * a->q[i];
    }
    mm_tn_acc(H, H, n, dq, a->n1, G(P_WQ));
    mm_tn_acc(H, H, n, dk, a->n1, G(P_WK));
    mm_tn_acc(H, H, n, dv, a->n1, G(P_WV));
    bias_grad(n, H, dq, G(P_BQ));
    bias_grad(n, H, dk, G(P_BK));
    bias_grad(n, H, dv, G(P_BV));
    float *dn1 = a->dk;
    mm_nn(n, H, H, dq, P(P_WQ), 0.0f, dn1);
    mm_nn(n, H, H, dk, P(P_WK), 1.0f, dn1);
    mm_nn(n, H, H, dv, P(P_WV), 1.0f, dn1);
    float *dh0 = dh1; /* residual again */
    rmsnorm_back(n, H, a->h0, P(P_ATTN_NORM), a->r1, dn1, dh0, G(P_ATTN_NORM));
    for (int t = 0; t < n; t++)
        for (int j = 0; j < H; j++)
            G(P_EMBED)[(size_t)tokens[t] * H + j] += dh0[(size_t)t * H + j];
#undef P
#undef G
    return loss;
}
