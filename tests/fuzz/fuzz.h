/* The fuzz targets' shared shape: each target file defines fuzz_one(), which feeds one input to
 * a parser of untrusted bytes and returns the shardopt status it gave. Built with
 * SHARDOPT_LIBFUZZER (make check-fuzz: clang, libFuzzer, ASan + UBSan) the file also defines
 * libFuzzer's entry points; otherwise fuzz_driver.c runs fuzz_one() over the committed corpus
 * (test_fuzz_corpus, in every build). */
#ifndef SHARDOPT_TESTS_FUZZ_H
#define SHARDOPT_TESTS_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "shardopt.h"

shardopt_status_t fuzz_one(const uint8_t *data, size_t size);

/* The input as a NUL-terminated string (the JSON parsers' form); NULL when out of memory. */
static inline char *fuzz_text(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text != NULL) {
        for (size_t i = 0; i < size; i++)
            text[i] = (char)data[i];
        text[size] = '\0';
    }
    return text;
}

#ifdef SHARDOPT_LIBFUZZER
int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
/* the library's error log would be most of the run's time: it goes to /dev/null */
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    setenv("SHARDOPT_LOG_FILE", "/dev/null", 1);
    return 0;
}
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    (void)fuzz_one(data, size);
    return 0;
}
#endif

#endif
