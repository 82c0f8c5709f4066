/* A small MoE model for the training demo, forward and backward written out by hand over BLAS.
 * It knows nothing of MPI or shardopt: parameters are full tensors, gradients are the sums over
 * the tokens given, divided by a caller-chosen token count (the global batch), so that summing
 * the ranks' gradients gives the gradient of the global mean loss.
 *
 *   h0 = embed[token]
 *   n1 = rmsnorm(h0) * attn_norm
 *   q, k, v = n1 Wq^T + bq, n1 Wk^T + bk, n1 Wv^T + bv
 *   h1 = h0 + (tanh(q * k) * v) Wo^T + bo       a per-token gate in place of attention, so that
 *                                               token shards are independent (no KV exchange)
 *   n2 = rmsnorm(h1) * mlp_norm
 *   top-k experts of n2 Wr^T, weights = softmax over the k chosen logits
 *   h2 = h1 + sum_k w_k swiglu_e(n2) + swiglu_shared(n2)
 *                                               swiglu(x) = (silu(x Wg^T) * (x Wu^T)) Wd^T
 *   y  = (rmsnorm(h2) * final_norm) Wlm^T
 *   loss = sum over tokens and outputs of (y - target)^2 / (2 * count * out)
 *
 * Expert stacks are [E, out, in] like the runtime's expert placement. */
#ifndef SHARDOPT_EXAMPLE_MOE_MODEL_H
#define SHARDOPT_EXAMPLE_MOE_MODEL_H

#include <stdint.h>

struct moe_dims {
    int vocab, hidden, ffn, experts, topk, out;
};

enum moe_kind { MOE_DENSE, MOE_EXPERT, MOE_REPLICATED };

struct moe_tensor {
    char name[64];
    int ndim;
    int64_t shape[3];
    int64_t numel;
    enum moe_kind kind; /* how a trainer would place it: FSDP-sharded, expert stack, replicated */
    float *w, *g;       /* full parameter and full gradient */
};

enum {
    P_EMBED,
    P_ATTN_NORM,
    P_WQ,
    P_BQ,
    P_WK,
    P_BK,
    P_WV,
    P_BV,
    P_WO,
    P_BO,
    P_MLP_NORM,
    P_ROUTER,
    P_XG,
    P_XU,
    P_XD,
    P_SG,
    P_SU,
    P_SD,
    P_FINAL_NORM,
    P_LM_HEAD,
    MOE_NPARAMS
};

struct moe_model {
    struct moe_dims d;
    struct moe_tensor p[MOE_NPARAMS];
    int64_t total; /* parameters */
    void *scratch; /* activations, sized for up to `max_tokens` tokens */
    int max_tokens;
};

/* Allocates parameters (initialised from seed: scaled uniform matrices, zero biases, unit norms)
 * and activation scratch for up to max_tokens tokens. Returns 0, or -1 when out of memory. */
int moe_model_init(struct moe_model *m, const struct moe_dims *d, uint64_t seed, int max_tokens);
void moe_model_free(struct moe_model *m);

/* y[n, out] for n tokens (n <= max_tokens). */
void moe_forward(struct moe_model *m, const int *tokens, int n, float *y);

/* Forward and backward on n tokens against target[n, out]: adds the gradient of
 * sum (y - target)^2 / (2 * count * out) into every p[i].g (callers zero them first) and
 * returns that sum (this batch's share of the mean loss). */
double moe_forward_backward(struct moe_model *m, const int *tokens, int n, const float *target,
                            double count);

/* Zero every gradient. */
void moe_zero_grad(struct moe_model *m);

#endif
