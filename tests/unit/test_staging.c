/* The staging pipeline of offload = optimizer on its own: the order of copies and kernels
 * (in(k+1) and out(k-1) around run(k)), at most three slots live, every byte in and out once,
 * counted by kind, and released slots poisoned so that reading state not copied in gives NaN. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "offload/staging.h"
#include "test.h"

#define NCHUNK      7
#define CHUNK_ELEMS 24

static char events[256];
static size_t nev;
static float host_m[NCHUNK * CHUNK_ELEMS], host_v[NCHUNK * CHUNK_ELEMS];
static unsigned char *slots[3];

static int slot_of(const void *p)
{
    for (int i = 0; i < 3; i++)
        if (slots[i] != NULL && (const unsigned char *)p >= slots[i] &&
            (const unsigned char *)p < slots[i] + 512)
            return i;
    return -1;
}

/* copy: 'i' into a slot, 'o' out of one (once per chunk: only the first segment logs) */
static void log_copy(const struct kernel_ctx *ctx, void *dst, const void *src, size_t bytes)
{
    (void)ctx;
    const int into = slot_of(dst) >= 0;
    const float *h = into ? src : dst;
    if ((h >= host_m && h < host_m + NCHUNK * CHUNK_ELEMS) && nev + 2 < sizeof events) {
        events[nev++] = into ? 'i' : 'o';
        events[nev++] = (char)('0' + (h - host_m) / CHUNK_ELEMS);
    }
    memcpy(dst, src, bytes);
}

static void *slot_alloc(size_t bytes)
{
    void *p = malloc(bytes);
    for (int i = 0; i < 3; i++)
        if (slots[i] == NULL) {
            slots[i] = p;
            break;
        }
    return p;
}

static int next_chunk(void *arg, struct stream_chunk *c)
{
    int *k = arg;
    if (*k == NCHUNK)
        return 0;
    memset(c, 0, sizeof *c);
    c->nseg = 2;
    c->host[0] = host_m + *k * CHUNK_ELEMS;
    c->host[1] = host_v + *k * CHUNK_ELEMS;
    c->bytes[0] = c->bytes[1] = CHUNK_ELEMS * sizeof(float);
    c->kind[0] = STAGE_EXP_AVG;
    c->kind[1] = STAGE_EXP_AVG_SQ;
    c->off = (size_t)*k;
    (*k)++;
    return 1;
}

static int poisoned_reads;

/* the kernel: m += 1, v *= 2; and a peek past the chunk's v, which was never copied in */
static void run_chunk(void *arg, const struct stream_chunk *c, void *const dev[2])
{
    (void)arg;
    float *m = dev[0], *v = dev[1];
    if (nev + 2 < sizeof events) {
        events[nev++] = 'r';
        events[nev++] = (char)('0' + c->off);
    }
    for (int i = 0; i < CHUNK_ELEMS; i++) {
        m[i] += 1.0f;
        v[i] *= 2.0f;
    }
    poisoned_reads += isnan(v[CHUNK_ELEMS]);
}

TEST(stream_order_bytes_peak_and_poison)
{
    struct device_ops ops = *device_ops_cpu();
    ops.copy = log_copy;
    ops.alloc = slot_alloc;
    struct staging s;
    for (int i = 0; i < NCHUNK * CHUNK_ELEMS; i++) {
        host_m[i] = (float)i;
        host_v[i] = (float)(3 * i);
    }
    ASSERT_EQ_INT(staging_init(&s, &ops, NULL, 512, 1), SHARDOPT_OK);
    /* two 96-byte segments, the second at byte 128: 512 - 64 bytes of room take 56 elements */
    EXPECT_EQ_INT(staging_chunk_elems(&s, 4, 4), 56);
    int k = 0;
    staging_stream(&s, next_chunk, run_chunk, &k);
    events[nev] = '\0';
    /* in(k+1) and out(k-1) are issued before run(k); the last chunk goes out after its run */
    EXPECT_STR_CONTAINS(events, "i0i1r0i2o0r1i3o1r2i4o2r3i5o3r4i6o4r5o5r6o6");
    EXPECT_EQ_INT(strlen(events), 42);
    for (int i = 0; i < NCHUNK * CHUNK_ELEMS; i++) {
        EXPECT_TRUE(host_m[i] == (float)i + 1.0f);
        EXPECT_TRUE(host_v[i] == (float)(6 * i));
    }
    EXPECT_EQ_INT(s.in[STAGE_EXP_AVG], NCHUNK * CHUNK_ELEMS * 4);
    EXPECT_EQ_INT(s.out[STAGE_EXP_AVG_SQ], NCHUNK * CHUNK_ELEMS * 4);
    EXPECT_EQ_INT(s.in[STAGE_MOMENTUM] + s.in[STAGE_NS_U], 0);
    /* three chunks of 128 + 96 bytes live at once, never more */
    EXPECT_EQ_INT(s.peak, 3 * (128 + 96));
    /* every peek past v read poison, and every slot is poison again */
    EXPECT_EQ_INT(poisoned_reads, NCHUNK);
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 512; b++)
            if (slots[i][b] != 0xff) {
                EXPECT_TRUE(slots[i][b] == 0xff);
                break;
            }
    staging_counts_reset(&s);
    EXPECT_EQ_INT(s.in[STAGE_EXP_AVG] + s.peak, 0);
    staging_free(&s);
}

TEST(stream_of_nothing_and_of_one_chunk)
{
    struct device_ops ops = *device_ops_cpu();
    struct staging s;
    ASSERT_EQ_INT(staging_init(&s, &ops, NULL, 512, 0), SHARDOPT_OK);
    int k = NCHUNK;
    nev = 0;
    staging_stream(&s, next_chunk, run_chunk, &k);
    EXPECT_EQ_INT(s.in[STAGE_EXP_AVG] + s.out[STAGE_EXP_AVG], 0);
    k = NCHUNK - 1;
    staging_stream(&s, next_chunk, run_chunk, &k);
    EXPECT_EQ_INT(s.in[STAGE_EXP_AVG], CHUNK_ELEMS * 4);
    EXPECT_EQ_INT(s.out[STAGE_EXP_AVG], CHUNK_ELEMS * 4);
    EXPECT_EQ_INT(s.peak, 128 + 96);
    staging_free(&s);
}

/* ---- the order the copy lanes see: a device model with vector clocks ----
 * Each lane (0 compute, 1 copy-in, 2 copy-out) runs its operations in order; vc[l][j] is the
 * last operation of lane j that lane l's next operation is ordered after (its own count
 * included). lane_record snapshots the lane's clock into event (lane, tag); lane_wait merges the
 * event into the waiter's. So each copy and kernel carries exactly what it waits for. */
#define VC_CHUNKS 16
static long vc[KERNEL_LANES][KERNEL_LANES], vc_ev[KERNEL_LANES][KERNEL_LANE_TAGS][KERNEL_LANES];
static long in_first[VC_CHUNKS], in_last[VC_CHUNKS], out_first[VC_CHUNKS], out_last[VC_CHUNKS];
static long run_seq[VC_CHUNKS];     /* the kernel's position on the compute lane */
static long run_dep_in[VC_CHUNKS];  /* the copy-in it waits for (last one) */
static long out_dep_run[VC_CHUNKS]; /* the kernel a copy-out waits for */
static long in_dep_out[VC_CHUNKS];  /* the copy-out a copy-in waits for */
static float vc_host[VC_CHUNKS * CHUNK_ELEMS], vc_host_v[VC_CHUNKS * CHUNK_ELEMS];
static int vc_chunks; /* chunks per stream call */
static int vc_base;   /* first chunk index of this call */

static int vc_chunk_of(const void *h)
{
    const float *f = h;
    if (f >= vc_host && f < vc_host + VC_CHUNKS * CHUNK_ELEMS)
        return (int)((f - vc_host) / CHUNK_ELEMS);
    if (f >= vc_host_v && f < vc_host_v + VC_CHUNKS * CHUNK_ELEMS)
        return (int)((f - vc_host_v) / CHUNK_ELEMS);
    return -1;
}

static void vc_copy_on(const struct kernel_ctx *ctx, int lane, void *dst, const void *src,
                       size_t bytes)
{
    (void)ctx;
    const long seq = ++vc[lane][lane];
    if (lane == 1) {
        const int k = vc_chunk_of(src);
        in_first[k] = in_first[k] ? in_first[k] : seq;
        in_last[k] = seq;
        if (in_dep_out[k] == 0)
            in_dep_out[k] = vc[1][2];
    } else if (lane == 2) {
        const int k = vc_chunk_of(dst);
        out_first[k] = out_first[k] ? out_first[k] : seq;
        out_last[k] = seq;
        if (out_dep_run[k] == 0)
            out_dep_run[k] = vc[2][0];
    }
    memcpy(dst, src, bytes);
}

static void vc_lane_record(const struct kernel_ctx *ctx, int lane, int tag)
{
    (void)ctx;
    memcpy(vc_ev[lane][tag], vc[lane], sizeof vc[lane]);
}

static void vc_lane_wait(const struct kernel_ctx *ctx, int waiter, int signaler, int tag)
{
    (void)ctx;
    for (int j = 0; j < KERNEL_LANES; j++)
        if (vc_ev[signaler][tag][j] > vc[waiter][j])
            vc[waiter][j] = vc_ev[signaler][tag][j];
}

static int vc_next(void *arg, struct stream_chunk *c)
{
    int *k = arg;
    if (*k == vc_base + vc_chunks)
        return 0;
    memset(c, 0, sizeof *c);
    c->nseg = 2;
    c->host[0] = vc_host + *k * CHUNK_ELEMS;
    c->host[1] = vc_host_v + *k * CHUNK_ELEMS;
    c->bytes[0] = c->bytes[1] = CHUNK_ELEMS * sizeof(float);
    c->kind[0] = STAGE_EXP_AVG;
    c->kind[1] = STAGE_EXP_AVG_SQ;
    c->off = (size_t)*k;
    (*k)++;
    return 1;
}

static void vc_run(void *arg, const struct stream_chunk *c, void *const dev[2])
{
    (void)arg;
    float *m = dev[0];
    run_seq[c->off] = ++vc[0][0];
    run_dep_in[c->off] = vc[0][1];
    for (int i = 0; i < CHUNK_ELEMS; i++)
        m[i] += 1.0f;
}

/* Two stream calls (two buckets of one step), 5 and 4 chunks: every stage waits for the stage
 * of its own chunk before it and for nothing queued after that, and the compute stream waits
 * for the copy-out lane only at staging_join. */
TEST(stream_waits_cover_their_own_chunk_only_and_join_once)
{
    struct device_ops ops = *device_ops_cpu();
    ops.caps |= DEVICE_CAP_COPY_LANES;
    ops.copy_on = vc_copy_on;
    ops.lane_record = vc_lane_record;
    ops.lane_wait = vc_lane_wait;
    struct staging s;
    ASSERT_EQ_INT(staging_init(&s, &ops, NULL, 512, 0), SHARDOPT_OK);
    for (int i = 0; i < VC_CHUNKS * CHUNK_ELEMS; i++)
        vc_host[i] = (float)i;
    const int calls[2] = {5, 4};
    int k = 0;
    for (int c = 0; c < 2; c++) {
        vc_base = k;
        vc_chunks = calls[c];
        staging_stream(&s, vc_next, vc_run, &k);
        /* the call's last copy-out is queued and not waited for: the next bucket's kernels
         * run beside it */
        EXPECT_TRUE(out_last[k - 1] > 0);
        EXPECT_TRUE(vc[0][2] < out_last[k - 1]);
    }
    const int n = k;
    ASSERT_EQ_INT(n, 9);
    for (int j = 0; j < n; j++) {
        /* run(j) after in(j), and not after in(j+1) (queued before run(j) on the host) */
        EXPECT_TRUE(run_dep_in[j] >= in_last[j]);
        if (j + 1 < n)
            EXPECT_TRUE(run_dep_in[j] < in_first[j + 1]);
        /* out(j) after run(j), not after run(j+1) */
        EXPECT_TRUE(out_dep_run[j] >= run_seq[j]);
        if (j + 1 < n)
            EXPECT_TRUE(out_dep_run[j] < run_seq[j + 1]);
    }
    /* a copy-in into a used slot waits for that slot's last copy-out and not for the one
     * queued after it; the slots go round across the calls, so the second call's first chunk
     * takes the slot freed first (restarting at slot 0 put its third chunk, queued in order
     * behind the second, after the first call's last copy-out) */
    for (int j = 0; j < n; j++) {
        if (j < STAGING_SLOTS) {
            EXPECT_EQ_INT(in_dep_out[j], 0); /* a fresh slot waits for nothing */
            continue;
        }
        EXPECT_TRUE(in_dep_out[j] >= out_last[j - STAGING_SLOTS]);
        EXPECT_TRUE(in_dep_out[j] < out_first[j - STAGING_SLOTS + 1]);
    }
    staging_join(&s);
    EXPECT_EQ_INT(vc[0][2], out_last[n - 1]); /* every copy-out, once */
    staging_join(&s);                         /* nothing new queued: no second wait */
    EXPECT_EQ_INT(vc[0][2], out_last[n - 1]);
    for (int i = 0; i < n * CHUNK_ELEMS; i++)
        if (vc_host[i] != (float)i + 1.0f) {
            EXPECT_TRUE(vc_host[i] == (float)i + 1.0f);
            break;
        }
    staging_free(&s);
}
