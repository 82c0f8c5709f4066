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
    struct kernel_ops ops = *kernel_ops_cpu_ref();
    ops.copy = log_copy;
    ops.alloc = slot_alloc;
    struct staging s;
    for (int i = 0; i < NCHUNK * CHUNK_ELEMS; i++) {
        host_m[i] = (float)i;
        host_v[i] = (float)(3 * i);
    }
    ASSERT_EQ_INT(staging_init(&s, &ops, NULL, 512, 1), 0);
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
    struct kernel_ops ops = *kernel_ops_cpu_ref();
    struct staging s;
    ASSERT_EQ_INT(staging_init(&s, &ops, NULL, 512, 0), 0);
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
