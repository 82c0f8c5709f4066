#include "test.h"

#define MAX_TESTS 512

static struct {
    const char *name;
    test_fn_t fn;
} tests[MAX_TESTS];
static int ntests;
int test_failures;
int test_checks;
int test_quiet;

void test_register(const char *name, test_fn_t fn)
{
    if (ntests == MAX_TESTS) {
        fprintf(stderr, "too many tests\n");
        exit(2);
    }
    tests[ntests].name = name;
    tests[ntests].fn = fn;
    ntests++;
}

void test_skip(const char *reason)
{
    fprintf(stderr, "SKIP: %s\n", reason);
    exit(77);
}

int test_main(int argc, char **argv)
{
    int failed = 0, ran = 0;

    for (int i = 0; i < ntests; i++) {
        int selected = argc <= 1;
        for (int a = 1; a < argc; a++)
            if (strcmp(argv[a], tests[i].name) == 0)
                selected = 1;
        if (!selected)
            continue;
        int before = test_checks;
        test_failures = 0;
        tests[i].fn();
        ran++;
        if (test_checks == before) {
            fprintf(stderr, "%s: checked nothing\n", tests[i].name);
            test_failures++;
        }
        if (!test_quiet || test_failures)
            printf("%-48s %s\n", tests[i].name, test_failures ? "FAIL" : "ok");
        if (test_failures)
            failed++;
    }
    if (!test_quiet || failed)
        printf("%d/%d passed, %d checks\n", ran - failed, ran, test_checks);
    if (ran == 0) {
        fprintf(stderr, "no test matched\n");
        return 1;
    }
    return failed ? 1 : 0;
}
