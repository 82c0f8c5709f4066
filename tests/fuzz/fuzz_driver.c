/* test_fuzz_<target>: the committed corpus through one fuzz target's fuzz_one(), in the normal
 * build (and under ASan + UBSan in the sanitizer build). A file named ok-* must be accepted and
 * one named bad-* refused; files from the fuzzer (crash-*, or anything else) only must not
 * crash. Prints the counts.   test_fuzz_<target> DIR... */
#include <dirent.h>
#include <stdio.h>
#include <string.h>

#include "fuzz.h"

static int read_file(const char *path, uint8_t **data, size_t *size)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *data = malloc((size_t)(n > 0 ? n : 1));
    *size = n > 0 && *data != NULL ? fread(*data, 1, (size_t)n, f) : 0;
    fclose(f);
    return *data != NULL && (long)*size == (n > 0 ? n : 0) ? 0 : -1;
}

int main(int argc, char **argv)
{
    int files = 0, ok = 0, bad = 0, wrong = 0;
    setenv("SHARDOPT_LOG_FILE", "/dev/null", 1); /* refusals are expected here */
    for (int a = 1; a < argc; a++) {
        DIR *d = opendir(argv[a]);
        struct dirent *e;
        if (d == NULL) {
            fprintf(stderr, "fuzz corpus: cannot open %s\n", argv[a]);
            return 1;
        }
        while ((e = readdir(d)) != NULL) {
            char path[4096];
            uint8_t *data = NULL;
            size_t size = 0;
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", argv[a], e->d_name);
            if (read_file(path, &data, &size) != 0) {
                fprintf(stderr, "fuzz corpus: cannot read %s\n", path);
                free(data);
                closedir(d);
                return 1;
            }
            shardopt_status_t st = fuzz_one(data, size);
            free(data);
            files++;
            if (strncmp(e->d_name, "ok-", 3) == 0) {
                ok++;
                if (st != SHARDOPT_OK) {
                    fprintf(stderr, "%s: refused (%s), should be accepted\n", path,
                            shardopt_status_string(st));
                    wrong++;
                }
            } else if (strncmp(e->d_name, "bad-", 4) == 0) {
                bad++;
                if (st == SHARDOPT_OK) {
                    fprintf(stderr, "%s: accepted, should be refused\n", path);
                    wrong++;
                }
            }
        }
        closedir(d);
    }
    printf("fuzz corpus: %d files (%d must pass, %d must be refused), %d wrong\n", files, ok, bad,
           wrong);
    return wrong == 0 && files > 0 && ok > 0 && bad > 0 ? 0 : 1;
}
