/* The smallest trainer: one 64 x 32 matrix and one bias on this process, two steps through the
 * installed library. Prints the library's version and the step count; exits 1 on any error. */
#include <shardopt.h>
#include <stdio.h>

static int check(shardopt_status_t st, const char *what)
{
    if (st != SHARDOPT_OK)
        fprintf(stderr, "consumer: %s: %s (%s)\n", what, shardopt_status_string(st),
                shardopt_last_error());
    return st != SHARDOPT_OK;
}

int main(int argc, char **argv)
{
    static float w[64 * 32], g[64 * 32], b[64], gb[64];
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt;
    shardopt_param_t pw, pb;
    int major, minor, patch, bad = 0;

    MPI_Init(&argc, &argv);
    for (int i = 0; i < 64 * 32; i++) {
        w[i] = (float)((i * 7) % 13) * 0.01f;
        g[i] = (float)((i * 5) % 11) * 0.1f - 0.5f;
    }
    for (int i = 0; i < 64; i++)
        gb[i] = 0.01f * (float)i;
    shardopt_get_version(&major, &minor, &patch);
    bad |= check(shardopt_init(MPI_COMM_SELF, &cfg, &rt), "init");
    shardopt_param_desc_t d = SHARDOPT_PARAM_DESC_INIT;
    d.name = "layers.0.mlp.up_proj.weight";
    d.ndim = 2;
    d.shape[0] = 64;
    d.shape[1] = 32;
    d.data = w;
    d.grad = g;
    bad |= check(shardopt_register(rt, &d, &pw), "register weight");
    d = (shardopt_param_desc_t)SHARDOPT_PARAM_DESC_INIT;
    d.name = "layers.0.mlp.up_proj.bias";
    d.ndim = 1;
    d.shape[0] = 64;
    d.data = b;
    d.grad = gb;
    bad |= check(shardopt_register(rt, &d, &pb), "register bias");
    bad |= check(shardopt_commit(rt), "commit");
    for (int s = 0; s < 2 && !bad; s++) {
        shardopt_step_args_t a = SHARDOPT_STEP_ARGS_INIT;
        a.lr = 0.02;
        bad |= check(shardopt_step(rt, &a), "step");
    }
    shardopt_stats_t st = SHARDOPT_STATS_INIT;
    bad |= check(shardopt_get_stats(rt, &st), "stats");
    printf("consumer: shardopt %d.%d.%d, %llu steps, %d Muon + %d AdamW parameters\n", major, minor,
           patch, (unsigned long long)st.steps, st.num_muon, st.num_adamw);
    shardopt_finalize(rt);
    MPI_Finalize();
    return bad;
}
