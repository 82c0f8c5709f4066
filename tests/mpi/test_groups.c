/* Groups over real communicators: for every valid layout of the world, each group's members are
 * the world ranks docs/design.md (Process groups) names, in rank order; trainer-built groups are
 * accepted when consistent and refused on every rank when not; invalid layouts fail on every rank.
 */
#include <math.h>

#include "fixture.h"
#include "runtime/config/config_agree.h"
#include "runtime/config/config_keys.h"
#include "runtime/runtime.h"

static int world, me;

/* Every test starts by reading the world (after MPI_Init, which precedes the tests). */
static void world_read(void)
{
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
}

/* The world ranks of comm's members, in comm rank order. */
static void members(MPI_Comm comm, int *out, int *n)
{
    MPI_Group g, wg;
    int ranks[64];
    MPI_Comm_size(comm, n);
    for (int i = 0; i < *n; i++)
        ranks[i] = i;
    MPI_Comm_group(comm, &g);
    MPI_Comm_group(MPI_COMM_WORLD, &wg);
    MPI_Group_translate_ranks(g, *n, ranks, wg, out);
    MPI_Group_free(&g);
    MPI_Group_free(&wg);
}

/* Written from docs/design.md (Process groups), independently of sharding/mesh.c. */
static void expect_groups(const struct groups *g, int R, int E)
{
    const int S = world / R, rep = me / S, d = me % S;
    int got[64], n;

    members(g->dense, got, &n);
    EXPECT_EQ_INT(n, S);
    for (int i = 0; i < n; i++)
        EXPECT_EQ_INT(got[i], rep * S + i);
    members(g->ep, got, &n);
    EXPECT_EQ_INT(n, E);
    for (int i = 0; i < n; i++)
        EXPECT_EQ_INT(got[i], rep * S + (d / E) * E + i);
    members(g->xs, got, &n);
    EXPECT_EQ_INT(n, S / E);
    for (int i = 0; i < n; i++)
        EXPECT_EQ_INT(got[i], rep * S + i * E + d % E);
    members(g->rep, got, &n);
    EXPECT_EQ_INT(n, R);
    for (int i = 0; i < n; i++)
        EXPECT_EQ_INT(got[i], i * S + d);
}

TEST(every_valid_layout_builds_the_design_groups)
{
    world_read();
    int layouts = 0;
    for (int R = 1; R <= world; R++)
        for (int C = 1; C <= world; C++)
            for (int E = 1; E <= world; E++) {
                if (world % (R * C) != 0)
                    continue;
                const int S = world / R;
                if (S % E != 0 || (E > 1 && E % C != 0))
                    continue;
                shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
                cfg.dp_replicate = R;
                cfg.cp = C;
                cfg.ep = E;
                shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
                shardopt_stats_t st = SHARDOPT_STATS_INIT;
                expect_groups(&rt->groups, R, E);
                EXPECT_EQ_INT(shardopt_get_stats(rt, &st), SHARDOPT_OK);
                EXPECT_EQ_INT(st.rank, me);
                EXPECT_EQ_INT(st.world, world);
                EXPECT_EQ_INT(st.dense_size, S);
                EXPECT_EQ_INT(st.ep_rank, (me % S) % E);
                EXPECT_EQ_INT(st.expert_shard_rank, (me % S) / E);
                shardopt_finalize(rt);
                layouts++;
            }
    EXPECT_TRUE(layouts >= 2);
}

TEST(invalid_layouts_fail_everywhere_with_numbers)
{
    world_read();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = NULL;
    cfg.dp_replicate = world;
    cfg.cp = 2;
    EXPECT_EQ_INT(shardopt_init(MPI_COMM_WORLD, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "is not a multiple of");
    EXPECT_TRUE(rt == NULL);
    cfg = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    cfg.ep = world + 1;
    EXPECT_EQ_INT(shardopt_init(MPI_COMM_WORLD, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "must divide dp_shard x cp");
    cfg = (shardopt_config_t)SHARDOPT_CONFIG_INIT;
    cfg.dp_shard = world;
    cfg.cp = 2;
    EXPECT_EQ_INT(shardopt_init(MPI_COMM_WORLD, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "but the communicator has");
}

/* Build the trainer's groups for dp_replicate R and ep E with our own splits. */
static void trainer_groups(int R, int E, shardopt_groups_t *g, int with_ep, int with_xs)
{
    const int S = world / R, rep = me / S, d = me % S;
    MPI_Comm_split(MPI_COMM_WORLD, rep, d, &g->dense_shard);
    g->ep = g->expert_shard = g->replicate = MPI_COMM_NULL;
    if (with_ep)
        MPI_Comm_split(MPI_COMM_WORLD, rep * S + d / E, d % E, &g->ep);
    if (with_xs)
        MPI_Comm_split(MPI_COMM_WORLD, rep * S + d % E, d / E, &g->expert_shard);
    if (R > 1)
        MPI_Comm_split(MPI_COMM_WORLD, d, rep, &g->replicate);
}

static void trainer_groups_free(shardopt_groups_t *g)
{
    MPI_Comm *c[] = {&g->dense_shard, &g->ep, &g->expert_shard, &g->replicate};
    for (int i = 0; i < 4; i++)
        if (*c[i] != MPI_COMM_NULL)
            MPI_Comm_free(c[i]);
}

TEST(trainer_groups_are_taken_and_checked)
{
    world_read();
    const int R = world >= 4 ? 2 : 1, E = 2;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    for (int variant = 0; variant < 3; variant++) {
        shardopt_groups_t tg = SHARDOPT_GROUPS_INIT;
        shardopt_runtime_t rt = NULL;
        /* all given; EP only (expert shard group derived); expert shard only (EP derived) */
        trainer_groups(R, E, &tg, variant != 2, variant != 1);
        ASSERT_EQ_INT(shardopt_init_from_groups(&tg, &cfg, &rt), SHARDOPT_OK);
        expect_groups(&rt->groups, R, E);
        shardopt_stats_t st = SHARDOPT_STATS_INIT;
        shardopt_get_stats(rt, &st);
        EXPECT_EQ_INT(st.rank, me);
        EXPECT_EQ_INT(st.dp_replicate, R);
        shardopt_finalize(rt);
        trainer_groups_free(&tg);
    }
}

TEST(inconsistent_trainer_groups_fail_on_every_rank)
{
    world_read();
    const int S = world, d = me;
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_groups_t tg = SHARDOPT_GROUPS_INIT;
    shardopt_runtime_t rt = NULL;
    /* EP groups strided like the expert shard groups: the two no longer form a grid */
    MPI_Comm_split(MPI_COMM_WORLD, 0, d, &tg.dense_shard);
    MPI_Comm_split(MPI_COMM_WORLD, d % 2, d / 2, &tg.ep);
    MPI_Comm_split(MPI_COMM_WORLD, d % 2, d / 2, &tg.expert_shard);
    (void)S;
    EXPECT_EQ_INT(shardopt_init_from_groups(&tg, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "inconsistent groups");
    EXPECT_TRUE(rt == NULL);
    trainer_groups_free(&tg);
}

/* An intercommunicator (the world's two halves) given to init or as a trainer's group: refused
 * on every rank before any communication, naming the field (before, the first all-reduce on it
 * ended the job with MPI_ERR_BUFFER) */
TEST(intercommunicators_are_refused_naming_the_field)
{
    world_read();
    MPI_Comm half, inter;
    const int left = me < world / 2;
    MPI_Comm_split(MPI_COMM_WORLD, left, me, &half);
    MPI_Intercomm_create(half, 0, MPI_COMM_WORLD, left ? world / 2 : 0, 17, &inter);
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    shardopt_runtime_t rt = NULL;
    EXPECT_EQ_INT(shardopt_init(inter, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "init: comm is an intercommunicator");
    EXPECT_TRUE(rt == NULL);
    shardopt_groups_t tg = SHARDOPT_GROUPS_INIT;
    tg.dense_shard = half;
    tg.replicate = inter;
    EXPECT_EQ_INT(shardopt_init_from_groups(&tg, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "groups.replicate is an intercommunicator");
    tg = (shardopt_groups_t)SHARDOPT_GROUPS_INIT;
    tg.dense_shard = inter;
    EXPECT_EQ_INT(shardopt_init_from_groups(&tg, &cfg, &rt), SHARDOPT_ERR_INVALID_ARGUMENT);
    EXPECT_STR_CONTAINS(shardopt_last_error(), "groups.dense_shard is an intercommunicator");
    EXPECT_TRUE(rt == NULL);
    MPI_Comm_free(&inter);
    MPI_Comm_free(&half);
}

/* A config refused on one rank only (its own validation) fails init on every rank in the same
 * call, with that rank's message; before, the other ranks went on into MPI_Comm_split without
 * it and hung. Both entry points. */
TEST(a_config_refused_on_one_rank_fails_init_on_every_rank)
{
    world_read();
    for (int from_groups = 0; from_groups < 2; from_groups++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        shardopt_runtime_t rt = NULL;
        shardopt_groups_t tg = SHARDOPT_GROUPS_INIT;
        if (me == world - 1)
            cfg.momentum = 1.5;
        shardopt_status_t st;
        if (from_groups) {
            trainer_groups(1, 1, &tg, 0, 0);
            st = shardopt_init_from_groups(&tg, &cfg, &rt);
        } else {
            st = shardopt_init(MPI_COMM_WORLD, &cfg, &rt);
        }
        EXPECT_EQ_INT(st, SHARDOPT_ERR_INVALID_ARGUMENT);
        EXPECT_STR_CONTAINS(shardopt_last_error(), "momentum = 1.5");
        if (me != world - 1) {
            char who[64];
            snprintf(who, sizeof who, "%s: rank %d: config momentum",
                     from_groups ? "init_from_groups" : "init", world - 1);
            EXPECT_STR_CONTAINS(shardopt_last_error(), who);
        }
        EXPECT_TRUE(rt == NULL);
        if (from_groups)
            trainer_groups_free(&tg);
    }
}

/* Valid configs that differ between ranks (a seed, the momentum dtype) fail init with
 * ERR_MISMATCH on every rank, naming the key and both values; thread counts may differ. */
TEST(configs_that_differ_between_ranks_fail_init_on_every_rank)
{
    world_read();
    for (int k = 0; k < 3; k++) {
        shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
        shardopt_runtime_t rt = NULL;
        if (me == world - 1) {
            if (k == 0)
                cfg.seed = 7;
            else if (k == 1)
                cfg.momentum_dtype = SHARDOPT_DTYPE_BF16;
            else
                cfg.num_threads = 1; /* a per-node choice */
        }
        shardopt_status_t st = shardopt_init(MPI_COMM_WORLD, &cfg, &rt);
        if (k == 2) {
            EXPECT_EQ_INT(st, SHARDOPT_OK);
            shardopt_finalize(rt);
            continue;
        }
        char want[128];
        snprintf(want, sizeof want,
                 k == 0 ? "seed differs between ranks: rank 0 has 0, rank %d has 7"
                        : "momentum_dtype differs between ranks: rank 0 has "
                          "fp32, rank %d has bf16",
                 world - 1);
        EXPECT_EQ_INT(st, SHARDOPT_ERR_MISMATCH);
        EXPECT_STR_CONTAINS(shardopt_last_error(), want);
        EXPECT_TRUE(rt == NULL);
    }
}

/* cfg's field of key k changed as little as its type allows: a double by one ulp, an int, enum
 * or flag by one, a string by a letter, the custom coefficients from just below the midpoint of
 * two floats to just above it (so the fp32 table Newton-Schulz runs differs) */
static void nudge(const struct config_key *k, shardopt_config_t *cfg)
{
    char *f = (char *)cfg + k->offset;
    switch (k->type) {
    case CFG_DOUBLE: *(double *)f = nextafter(*(double *)f, INFINITY); break;
    case CFG_INT:
    case CFG_BOOL:
    case CFG_ENUM: *(int *)f += 1; break;
    case CFG_U64: *(uint64_t *)f += 1; break;
    case CFG_STRING: strcat(f, "x"); break;
    case CFG_COEFFS: /* two ulps: over the midpoint itself, which rounds to the even float */
        ((double *)f)[0] = nextafter(nextafter(((double *)f)[0], INFINITY), INFINITY);
        break;
    }
}

/* Every key of the table is compared across ranks, the last one (ns_team_frac, the 54th) as the
 * first, to the last bit: the agreement held a fixed 64 CRCs and clamped the key count to it, so
 * a key past the 64th went uncompared as the table grew (checked: with the clamp at 40, keys 41
 * to 54 differed unnoticed); and it printed custom coefficients with 9 digits, so coefficients
 * that round to different fp32 tables agreed and each rank ran its own Newton-Schulz. */
TEST(every_config_key_is_compared_across_ranks_to_the_last_bit)
{
    world_read();
    if (world < 2)
        return;
    shardopt_config_t base = SHARDOPT_CONFIG_INIT;
    base.ns_coeffs = SHARDOPT_NS_CUSTOM; /* so the coefficients are printed, not "(unused)" */
    const float lo = 3.4445f, hi = nextafterf(lo, INFINITY);
    const double mid = ((double)lo + (double)hi) / 2; /* exact in double */
    base.ns_custom_coeffs[0][0] = nextafter(mid, -INFINITY);
    struct groups g = {0}; /* timeout_s 0: no deadline, as init leaves it before commit */
    ASSERT_EQ_INT(groups_create(MPI_COMM_WORLD, &base, &g), SHARDOPT_OK);
    int compared = 0;
    for (size_t i = 0; i < config_key_count; i++) {
        const struct config_key *k = &config_keys[i];
        shardopt_config_t cfg = base;
        if (me == world - 1)
            nudge(k, &cfg);
        if (k->type == CFG_COEFFS && me == world - 1) /* rounds to the other float */
            EXPECT_TRUE((float)cfg.ns_custom_coeffs[0][0] != (float)base.ns_custom_coeffs[0][0]);
        const shardopt_status_t st = config_agree(&g, &cfg, "agree");
        if (strcmp(k->name, "num_threads") == 0 || strcmp(k->name, "bind") == 0) {
            EXPECT_EQ_INT(st, SHARDOPT_OK); /* per-node choices */
            continue;
        }
        char want[128];
        snprintf(want, sizeof want, "config %s differs between ranks", k->name);
        EXPECT_EQ_INT(st, SHARDOPT_ERR_MISMATCH);
        EXPECT_STR_CONTAINS(shardopt_last_error(), want);
        compared++;
    }
    EXPECT_EQ_INT(compared, (int)config_key_count - 2);
    EXPECT_EQ_INT(config_agree(&g, &base, "agree"), SHARDOPT_OK);
    groups_free(&g);
}

TEST(layout_print_lists_every_rank_in_order)
{
    world_read();
    shardopt_config_t cfg = SHARDOPT_CONFIG_INIT;
    cfg.ep = 2;
    shardopt_runtime_t rt = fixture_runtime_on(MPI_COMM_WORLD, &cfg);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    EXPECT_EQ_INT(shardopt_layout_print(rt, f), SHARDOPT_OK);
    fclose(f);
    if (me == 0) {
        char want[64];
        const char *prev = buf;
        EXPECT_STR_CONTAINS(buf, "ranks = dp_replicate 1");
        for (int r = 0; r < world; r++) { /* each rank's line, after the one before it */
            snprintf(want, sizeof want, "rank %4d: replica 0, dp_shard %d", r, r);
            EXPECT_STR_CONTAINS(buf, want);
            const char *at = strstr(buf, want);
            EXPECT_TRUE(at != NULL && at >= prev);
            prev = at != NULL ? at : prev;
        }
    } else {
        EXPECT_EQ_INT(len, 0);
    }
    free(buf);
    shardopt_finalize(rt);
}
