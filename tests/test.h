/* A tiny test harness: TEST(name) { ... } registers a test; EXPECT_* record a failure with file,
 * line and both values and go on; ASSERT_* also leave the test. main() runs every test, or the
 * ones named on the command line, and exits 0 (all passed), 1 (a failure) or 77 (skipped). */
#ifndef SHARDOPT_TEST_H
#define SHARDOPT_TEST_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*test_fn_t)(void);
void test_register(const char *name, test_fn_t fn);
extern int test_failures; /* failures in the current test */
extern int test_checks;   /* checks evaluated so far, in all tests */
extern int test_quiet;    /* print failures only (ranks other than 0) */

/* Skip the whole executable: exit 77 with a one-line reason on stderr. */
void test_skip(const char *reason) __attribute__((noreturn));

#define TEST(name)                                                                                 \
    static void test_##name(void);                                                                 \
    __attribute__((constructor)) static void test_reg_##name(void)                                 \
    {                                                                                              \
        test_register(#name, test_##name);                                                         \
    }                                                                                              \
    static void test_##name(void)

#define TEST_FAIL_(...)                                                                            \
    do {                                                                                           \
        fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                            \
        fprintf(stderr, __VA_ARGS__);                                                              \
        fputc('\n', stderr);                                                                       \
        test_failures++;                                                                           \
    } while (0)

#define EXPECT_TRUE(c)                                                                             \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(c))                                                                                  \
            TEST_FAIL_("expected true: %s", #c);                                                   \
    } while (0)

#define ASSERT_TRUE(c)                                                                             \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(c)) {                                                                                \
            TEST_FAIL_("assertion failed: %s", #c);                                                \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define EXPECT_EQ_INT(a, b)                                                                        \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        test_checks++;                                                                             \
        if (a_ != b_)                                                                              \
            TEST_FAIL_("%s == %s: %lld vs %lld", #a, #b, a_, b_);                                  \
    } while (0)

#define ASSERT_EQ_INT(a, b)                                                                        \
    do {                                                                                           \
        long long a_ = (long long)(a), b_ = (long long)(b);                                        \
        test_checks++;                                                                             \
        if (a_ != b_) {                                                                            \
            TEST_FAIL_("%s == %s: %lld vs %lld", #a, #b, a_, b_);                                  \
            return;                                                                                \
        }                                                                                          \
    } while (0)

#define EXPECT_EQ_U16(a, b)                                                                        \
    do {                                                                                           \
        unsigned a_ = (uint16_t)(a), b_ = (uint16_t)(b);                                           \
        test_checks++;                                                                             \
        if (a_ != b_)                                                                              \
            TEST_FAIL_("%s == %s: 0x%04x vs 0x%04x", #a, #b, a_, b_);                              \
    } while (0)

#define EXPECT_EQ_U32(a, b)                                                                        \
    do {                                                                                           \
        unsigned long a_ = (uint32_t)(a), b_ = (uint32_t)(b);                                      \
        test_checks++;                                                                             \
        if (a_ != b_)                                                                              \
            TEST_FAIL_("%s == %s: 0x%08lx vs 0x%08lx", #a, #b, a_, b_);                            \
    } while (0)

/* |a - b| <= tol */
#define EXPECT_NEAR(a, b, tol)                                                                     \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b), t_ = (double)(tol);                             \
        test_checks++;                                                                             \
        if (!(fabs(a_ - b_) <= t_))                                                                \
            TEST_FAIL_("%s ~ %s: %.9g vs %.9g (|diff| %.3g > %.3g)", #a, #b, a_, b_,               \
                       fabs(a_ - b_), t_);                                                         \
    } while (0)

/* |a - b| <= rtol * max(|a|, |b|) + atol */
#define EXPECT_CLOSE(a, b, rtol, atol)                                                             \
    do {                                                                                           \
        double a_ = (double)(a), b_ = (double)(b);                                                 \
        double m_ = fabs(a_) > fabs(b_) ? fabs(a_) : fabs(b_);                                     \
        test_checks++;                                                                             \
        if (!(fabs(a_ - b_) <= (rtol)*m_ + (atol)))                                                \
            TEST_FAIL_("%s ~ %s: %.9g vs %.9g", #a, #b, a_, b_);                                   \
    } while (0)

#define EXPECT_STR_CONTAINS(hay, needle)                                                           \
    do {                                                                                           \
        const char *h_ = (hay), *n_ = (needle);                                                    \
        test_checks++;                                                                             \
        if (h_ == NULL || strstr(h_, n_) == NULL)                                                  \
            TEST_FAIL_("expected \"%s\" to contain \"%s\"", h_ ? h_ : "(null)", n_);               \
    } while (0)

/* Deterministic test data: xorshift64*, uniform in [-1, 1). */
static inline double test_rand(uint64_t *s)
{
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (double)((*s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

#endif
