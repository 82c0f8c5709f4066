/* safetensors headers: build -> parse round trips, and every refusal with its message.
 * One file, over 600 lines: a build and a parse of the same descriptions, each refusal beside the
 * round trip it departs from; the writer and the reader are tested against each other. */
#include "runtime/checkpoint/safetensors.h"
#include "test.h"

#define ERRLEN 512

/* A header of one F32 [2, 3] tensor: the base the refusal tests break one field of. */
#define GOOD_W "\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}"

/* Parse json as the header of a file that has data_bytes after it. */
static shardopt_status_t parse_text(const char *json, size_t len, uint64_t data_bytes,
                                    struct st_header *h, char *err)
{
    err[0] = 0;
    return st_header_parse(json, len, 8 + len + data_bytes, h, err, ERRLEN);
}

/* Refused as corrupt, with a message that contains both needles (the tensor and the field). */
#define EXPECT_REFUSED_LEN(json, len, data_bytes, needle1, needle2)                                \
    do {                                                                                           \
        char err_[ERRLEN];                                                                         \
        struct st_header h_ = {0};                                                                 \
        shardopt_status_t s_ = parse_text(json, len, data_bytes, &h_, err_);                       \
        EXPECT_EQ_INT(s_, SHARDOPT_ERR_CORRUPT);                                                   \
        EXPECT_STR_CONTAINS(err_, needle1);                                                        \
        EXPECT_STR_CONTAINS(err_, needle2);                                                        \
        if (s_ == SHARDOPT_OK)                                                                     \
            st_header_free(&h_);                                                                   \
    } while (0)

#define EXPECT_REFUSED(json, data_bytes, needle1, needle2)                                         \
    EXPECT_REFUSED_LEN(json, strlen(json), data_bytes, needle1, needle2)

static struct st_tensor tensor(const char *name, int dtype, int ndim, int64_t d0, int64_t d1,
                               int64_t d2)
{
    struct st_tensor t = {.dtype = dtype, .ndim = ndim, .shape = {d0, d1, d2}};
    snprintf(t.name, sizeof t.name, "%s", name);
    return t;
}

static uint64_t le64(const char *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | (unsigned char)p[i];
    return v;
}

/* ---- building and reading back ---- */

TEST(st_round_trip_names_dtypes_shapes_offsets_metadata)
{
    struct st_tensor t[4] = {
        tensor("layers.10.mlp.w.momentum", ST_DTYPE_BF16, 3, 4, 5, 6),
        tensor("a \"quoted\" \\ name \xc3\xa9", ST_DTYPE_F32, 2, 7, 3, 0),
        tensor("step", ST_DTYPE_F32, 0, 0, 0, 0), /* a scalar: 1 element */
        tensor("empty", ST_DTYPE_BF16, 2, 0, 9, 0),
    };
    char v0[] = "{\"shape\": [8, 6]}\nline\ttwo", v1[] = "1e3";
    struct st_meta meta[2] = {{"global", v0}, {"lr", v1}};
    char *buf = NULL, err[ERRLEN] = "";
    size_t len = 0;
    struct st_header h = {0};

    ASSERT_EQ_INT(st_header_build(t, 4, meta, 2, &buf, &len), SHARDOPT_OK);
    EXPECT_EQ_INT(t[0].begin, 0);
    EXPECT_EQ_INT(t[0].end, 240);
    EXPECT_EQ_INT(t[1].begin, 240);
    EXPECT_EQ_INT(t[1].end, 324);
    EXPECT_EQ_INT(t[2].end, 328);
    EXPECT_EQ_INT(t[3].begin, 328);
    EXPECT_EQ_INT(t[3].end, 328);
    EXPECT_EQ_INT(le64(buf), len - 8);

    uint64_t json_len = 0;
    ASSERT_EQ_INT(st_header_len((const unsigned char *)buf, len + 328, &json_len, err, ERRLEN),
                  SHARDOPT_OK);
    EXPECT_EQ_INT(json_len, len - 8);
    ASSERT_EQ_INT(st_header_parse(buf + 8, json_len, len + 328, &h, err, ERRLEN), SHARDOPT_OK);
    EXPECT_EQ_INT(h.data_start, len);
    ASSERT_EQ_INT(h.n, 4);
    for (int i = 0; i < 4; i++) {
        EXPECT_TRUE(strcmp(h.t[i].name, t[i].name) == 0);
        EXPECT_EQ_INT(h.t[i].dtype, t[i].dtype);
        EXPECT_EQ_INT(h.t[i].ndim, t[i].ndim);
        for (int d = 0; d < t[i].ndim; d++)
            EXPECT_EQ_INT(h.t[i].shape[d], t[i].shape[d]);
        EXPECT_EQ_INT(h.t[i].begin, t[i].begin);
        EXPECT_EQ_INT(h.t[i].end, t[i].end);
        EXPECT_TRUE(st_header_find(&h, t[i].name) == &h.t[i]);
    }
    EXPECT_TRUE(st_header_find(&h, "missing") == NULL);
    ASSERT_EQ_INT(h.nmeta, 2);
    EXPECT_TRUE(strcmp(h.meta[0].key, "global") == 0 && strcmp(h.meta[0].value, v0) == 0);
    EXPECT_TRUE(strcmp(h.meta[1].key, "lr") == 0 && strcmp(h.meta[1].value, v1) == 0);
    st_header_free(&h);
    EXPECT_TRUE(h.t == NULL && h.n == 0);
    free(buf);
}

TEST(st_build_pads_data_start_to_8_bytes_with_spaces)
{
    int bad = 0;
    for (int k = 1; k <= 24; k++) {
        char name[32];
        memset(name, 'x', (size_t)k);
        name[k] = 0;
        struct st_tensor t = tensor(name, ST_DTYPE_F32, 1, 3, 0, 0);
        char *buf = NULL;
        size_t len = 0;
        if (st_header_build(&t, 1, NULL, 0, &buf, &len) != SHARDOPT_OK) {
            bad++;
            continue;
        }
        size_t end = len;
        while (end > 8 && buf[end - 1] == ' ')
            end--;
        if (len % 8 != 0 || buf[end - 1] != '}' || len - end > 7)
            bad++;
        free(buf);
    }
    EXPECT_EQ_INT(bad, 0);
}

TEST(st_build_and_parse_an_empty_header)
{
    char *buf = NULL, err[ERRLEN];
    size_t len = 0;
    struct st_header h;
    ASSERT_EQ_INT(st_header_build(NULL, 0, NULL, 0, &buf, &len), SHARDOPT_OK);
    EXPECT_EQ_INT(len, 16);
    EXPECT_TRUE(memcmp(buf + 8, "{}      ", 8) == 0);
    ASSERT_EQ_INT(st_header_parse(buf + 8, len - 8, len, &h, err, ERRLEN), SHARDOPT_OK);
    EXPECT_EQ_INT(h.n, 0);
    EXPECT_EQ_INT(h.nmeta, 0);
    EXPECT_TRUE(st_header_find(&h, "w") == NULL);
    st_header_free(&h);
    free(buf);
}

TEST(st_find_many_tensors)
{
    enum { N = 300 };
    struct st_tensor *t = calloc(N, sizeof *t);
    char *buf = NULL, err[ERRLEN];
    size_t len = 0;
    struct st_header h;
    ASSERT_TRUE(t != NULL);
    for (int i = 0; i < N; i++) { /* names out of order, so that find cannot rely on file order */
        char name[32];
        snprintf(name, sizeof name, "p%d.exp_avg", (i * 37) % N);
        t[i] = tensor(name, i % 2, 1, i, 0, 0);
    }
    ASSERT_EQ_INT(st_header_build(t, N, NULL, 0, &buf, &len), SHARDOPT_OK);
    uint64_t data = t[N - 1].end;
    ASSERT_EQ_INT(st_header_parse(buf + 8, len - 8, len + data, &h, err, ERRLEN), SHARDOPT_OK);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const struct st_tensor *f = st_header_find(&h, t[i].name);
        if (f == NULL || f->begin != t[i].begin || f->end != t[i].end)
            bad++;
    }
    EXPECT_EQ_INT(bad, 0);
    st_header_free(&h);
    free(buf);
    free(t);
}

TEST(st_build_refuses_what_parse_would_refuse)
{
    char *buf = NULL;
    size_t len = 0;
    char val[] = "v";
    struct st_tensor bad[] = {
        tensor("dtype", 7, 1, 2, 0, 0),
        tensor("ndim", ST_DTYPE_F32, 4, 2, 2, 2),
        tensor("negative", ST_DTYPE_F32, 1, -2, 0, 0),
        tensor("", ST_DTYPE_F32, 1, 2, 0, 0),
        tensor("new\nline", ST_DTYPE_F32, 1, 2, 0, 0),
        tensor("__metadata__", ST_DTYPE_F32, 1, 2, 0, 0),
        tensor("bad utf-8 \xff", ST_DTYPE_F32, 1, 2, 0, 0),
        tensor("overflow", ST_DTYPE_F32, 3, 1 << 20, 1 << 20, 1 << 20),
        tensor("past 2^53 bytes", ST_DTYPE_F32, 2, 1 << 26, 1 << 26, 0),
        /* a zero dimension makes the size 0: the other dimension must still be writable */
        tensor("negative beside zero", ST_DTYPE_F32, 2, -1, 0, 0),
        tensor("2^53 beside zero", ST_DTYPE_F32, 2, 9007199254740992, 0, 0),
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        shardopt_status_t s = st_header_build(&bad[i], 1, NULL, 0, &buf, &len);
        if (s != SHARDOPT_ERR_INVALID_ARGUMENT)
            fprintf(stderr, "description %zu ('%s') accepted\n", i, bad[i].name);
        EXPECT_EQ_INT(s, SHARDOPT_ERR_INVALID_ARGUMENT);
    }
    struct st_tensor dup[2] = {tensor("w", ST_DTYPE_F32, 0, 0, 0, 0),
                               tensor("w", ST_DTYPE_BF16, 0, 0, 0, 0)};
    EXPECT_EQ_INT(st_header_build(dup, 2, NULL, 0, &buf, &len), SHARDOPT_ERR_INVALID_ARGUMENT);
    struct st_meta dupmeta[2] = {{"k", val}, {"k", val}};
    EXPECT_EQ_INT(st_header_build(NULL, 0, dupmeta, 2, &buf, &len), SHARDOPT_ERR_INVALID_ARGUMENT);
    struct st_meta nullval = {"k", NULL};
    EXPECT_EQ_INT(st_header_build(NULL, 0, &nullval, 1, &buf, &len), SHARDOPT_ERR_INVALID_ARGUMENT);
    /* a name that fills the whole array has no NUL: refused, not read past */
    struct st_tensor full = tensor("x", ST_DTYPE_F32, 0, 0, 0, 0);
    memset(full.name, 'x', sizeof full.name);
    EXPECT_EQ_INT(st_header_build(&full, 1, NULL, 0, &buf, &len), SHARDOPT_ERR_INVALID_ARGUMENT);
}

/* The lenient parts, stated: zero-size tensors share offsets, bytes may follow the last tensor,
 * keys may come in any order, blanks may surround the object. */
TEST(st_parse_accepts_reference_style_headers)
{
    const char *json =
        "  {\"__metadata__\":{\"format\":\"pt\"},"
        "\"b\":{\"data_offsets\":[24,24],\"shape\":[0],\"dtype\":\"BF16\"},"
        "\"z\":{\"dtype\":\"BF16\",\"shape\":[],\"data_offsets\":[24,26]}," GOOD_W "}   \n";
    char err[ERRLEN];
    struct st_header h;
    ASSERT_EQ_INT(parse_text(json, strlen(json), 100, &h, err), SHARDOPT_OK);
    EXPECT_EQ_INT(h.n, 3);
    EXPECT_TRUE(strcmp(h.t[0].name, "b") == 0 && h.t[0].ndim == 1 && h.t[0].shape[0] == 0);
    EXPECT_TRUE(h.t[1].ndim == 0 && h.t[1].begin == 24 && h.t[1].end == 26);
    EXPECT_EQ_INT(h.nmeta, 1);
    st_header_free(&h);
    st_header_free(NULL);
}

/* ---- step 1: the length ---- */

TEST(st_len_reads_little_endian)
{
    const unsigned char b[8] = {0x10, 0x01, 0, 0, 0, 0, 0, 0};
    uint64_t n = 0;
    char err[ERRLEN];
    EXPECT_EQ_INT(st_header_len(b, 8 + 0x110, &n, err, ERRLEN), SHARDOPT_OK);
    EXPECT_EQ_INT(n, 0x110);
}

TEST(st_len_refuses_file_shorter_than_8_bytes)
{
    const unsigned char b[8] = {0};
    uint64_t n = 77;
    char err[ERRLEN];
    EXPECT_EQ_INT(st_header_len(b, 7, &n, err, ERRLEN), SHARDOPT_ERR_CORRUPT);
    EXPECT_STR_CONTAINS(err, "7 bytes");
    EXPECT_EQ_INT(n, 77); /* outputs only on success */
}

TEST(st_len_refuses_length_past_the_file)
{
    const unsigned char b[8] = {0x11, 0x01, 0, 0, 0, 0, 0, 0};
    uint64_t n;
    char err[ERRLEN];
    EXPECT_EQ_INT(st_header_len(b, 8 + 0x110, &n, err, ERRLEN), SHARDOPT_ERR_CORRUPT);
    EXPECT_STR_CONTAINS(err, "header length 273");
    EXPECT_STR_CONTAINS(err, "file (280 bytes)");
    /* 2^64 - 1: no overflow in the comparison */
    const unsigned char ff[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff};
    EXPECT_EQ_INT(st_header_len(ff, UINT64_MAX, &n, err, ERRLEN), SHARDOPT_ERR_CORRUPT);
    EXPECT_STR_CONTAINS(err, "18446744073709551615");
    EXPECT_EQ_INT(st_header_len(ff, 8, &n, NULL, 0), SHARDOPT_ERR_CORRUPT);
}

TEST(st_len_refuses_length_above_the_limit)
{
    /* 100,000,001 = 0x05F5E101, in a file large enough to hold it */
    const unsigned char over[8] = {0x01, 0xE1, 0xF5, 0x05, 0, 0, 0, 0};
    const unsigned char at[8] = {0x00, 0xE1, 0xF5, 0x05, 0, 0, 0, 0};
    uint64_t n;
    char err[ERRLEN];
    EXPECT_EQ_INT(st_header_len(over, 1ull << 40, &n, err, ERRLEN), SHARDOPT_ERR_CORRUPT);
    EXPECT_STR_CONTAINS(err, "limit of 100000000");
    EXPECT_EQ_INT(st_header_len(at, 1ull << 40, &n, err, ERRLEN), SHARDOPT_OK);
}

TEST(st_parse_checks_the_length_itself)
{
    char err[ERRLEN];
    struct st_header h;
    const char *json = "{" GOOD_W "}";
    EXPECT_EQ_INT(st_header_parse(json, strlen(json), strlen(json) + 7, &h, err, ERRLEN),
                  SHARDOPT_ERR_CORRUPT);
    EXPECT_STR_CONTAINS(err, "larger than the file");
}

/* ---- step 2: the JSON ---- */

TEST(st_parse_accepts_the_base_header)
{
    char err[ERRLEN];
    struct st_header h;
    ASSERT_EQ_INT(parse_text("{" GOOD_W "}", strlen("{" GOOD_W "}"), 24, &h, err), SHARDOPT_OK);
    EXPECT_EQ_INT(h.n, 1);
    st_header_free(&h);
}

TEST(st_refuses_top_level_not_an_object)
{
    EXPECT_REFUSED("[" GOOD_W "]", 24, "header", "JSON object");
    EXPECT_REFUSED("\xef\xbb\xbf{" GOOD_W "}", 24, "header", "JSON object"); /* byte-order mark */
    EXPECT_REFUSED("      ", 24, "header", "JSON object");
}

TEST(st_refuses_invalid_json)
{
    EXPECT_REFUSED("{" GOOD_W, 24, "not valid JSON", "byte");
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[NaN],\"data_offsets\":[0,4]}}", 4,
                   "not valid JSON", "byte");
}

TEST(st_refuses_text_after_the_object)
{
    EXPECT_REFUSED("{" GOOD_W "} x", 24, "text after the JSON object", "byte");
    EXPECT_REFUSED("{" GOOD_W "}{}", 24, "text after the JSON object", "byte");
}

TEST(st_refuses_entry_not_an_object)
{
    EXPECT_REFUSED("{\"w\":[1,2]}", 24, "tensor 'w'", "must be an object");
}

TEST(st_refuses_missing_field)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"data_offsets\":[0,24]}}", 24, "tensor 'w'",
                   "missing field shape");
}

TEST(st_refuses_unknown_field)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"x\":1}}",
                   24, "tensor 'w'", "unknown field 'x'");
}

TEST(st_refuses_duplicate_field)
{
    EXPECT_REFUSED(
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"dtype\":\"F32\",\"data_offsets\":[0,24]}}", 24,
        "tensor 'w'", "dtype appears twice");
}

TEST(st_refuses_dtype_not_a_string)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":4,\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
                   "tensor 'w'", "dtype must be a string");
}

TEST(st_refuses_unsupported_dtype)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 24,
                   "tensor 'w'", "dtype 'F16' is not supported");
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"f32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
                   "tensor 'w'", "'f32'");
}

TEST(st_refuses_shape_not_an_array)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":6,\"data_offsets\":[0,24]}}", 24,
                   "tensor 'w'", "shape must be an array, got a number");
}

TEST(st_refuses_more_than_3_dimensions)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[1,2,3,1],\"data_offsets\":[0,24]}}", 24,
                   "tensor 'w'", "shape has 4 dimensions");
}

TEST(st_refuses_nested_shape_element)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[[2],3],\"data_offsets\":[0,24]}}", 24,
                   "tensor 'w'",
                   "shape[0] must be a non-negative integer below 2^53, got an array");
}

TEST(st_refuses_fractional_shape)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,12]}}", 24,
                   "tensor 'w'", "shape[1] must be a non-negative integer below 2^53, got 1.5");
}

TEST(st_refuses_negative_shape)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[-2,3],\"data_offsets\":[0,24]}}", 24,
                   "tensor 'w'", "shape[0] must be a non-negative integer below 2^53, got -2");
}

TEST(st_refuses_huge_and_infinite_shape)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,24]}}", 24,
                   "tensor 'w'", "shape[0] must be a non-negative integer below 2^53, got 1e+300");
    /* beyond double range: strtod gives inf */
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[1e400],\"data_offsets\":[0,24]}}", 24,
                   "tensor 'w'", "got inf");
    /* 2^53 itself: the first integer a double cannot tell from its neighbour */
    EXPECT_REFUSED(
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[9007199254740992],\"data_offsets\":[0,24]}}", 24,
        "tensor 'w'", "shape[0] must be a non-negative integer below 2^53");
    EXPECT_REFUSED(
        "{\"w\":{\"dtype\":\"F32\",\"shape\":[9007199254740993],\"data_offsets\":[0,24]}}", 24,
        "tensor 'w'", "shape[0] must be a non-negative integer below 2^53");
}

TEST(st_refuses_element_count_overflow)
{
    /* 2^32 * 2^32 elements: the count itself leaves 64 bits */
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296],"
                   "\"data_offsets\":[0,0]}}",
                   24, "tensor 'w'", "shape [4294967296, 4294967296] of BF16 is more than 2^64");
    /* 2^31 * 2^32 = 2^63 elements fit; times 4 bytes they do not */
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2147483648,4294967296,1],"
                   "\"data_offsets\":[0,0]}}",
                   24, "tensor 'w'", "of F32 is more than 2^64");
}

TEST(st_accepts_zero_dimension_beside_huge_ones)
{
    const char *json = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],"
                       "\"data_offsets\":[0,0]}}";
    char err[ERRLEN];
    struct st_header h;
    EXPECT_EQ_INT(parse_text(json, strlen(json), 0, &h, err), SHARDOPT_OK);
    st_header_free(&h);
}

TEST(st_refuses_offsets_not_a_pair)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0]}}", 24,
                   "tensor 'w'", "data_offsets must be an array of 2 integers");
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":{}}}", 24,
                   "tensor 'w'", "data_offsets must be an array of 2 integers, got an object");
}

TEST(st_refuses_offsets_not_integers)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[\"0\",24]}}", 24,
                   "tensor 'w'", "data_offsets[0] must be a non-negative integer");
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0.5,24.5]}}", 24,
                   "tensor 'w'", "data_offsets[0]");
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[-24,0]}}", 24,
                   "tensor 'w'",
                   "data_offsets[0] must be a non-negative integer below 2^53, "
                   "got -24");
}

TEST(st_refuses_begin_after_end)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[24,0]}}", 24,
                   "tensor 'w'", "data_offsets [24, 0] begin after end");
}

TEST(st_refuses_offsets_that_disagree_with_the_shape)
{
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,12]}}", 24,
                   "tensor 'w'",
                   "data_offsets [0, 12] span 12 bytes, shape [2, 3] of F32 needs 24");
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
                   "tensor 'w'", "shape [2, 3] of BF16 needs 12");
}

TEST(st_refuses_tensor_past_the_end_of_the_file)
{
    const char *json = "{" GOOD_W "}";
    size_t len = strlen(json);
    char msg[128];
    snprintf(msg, sizeof msg, "data starts at byte %zu of %zu", 8 + len, 8 + len + 23);
    EXPECT_REFUSED(json, 23, "tensor 'w': data_offsets [0, 24] end past the end of the file", msg);
}

TEST(st_refuses_overlapping_tensors)
{
    EXPECT_REFUSED("{\"b\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[20,44]}," GOOD_W "}",
                   44, "tensors 'w' [0, 24] and 'b' [20, 44]", "data_offsets overlap");
    /* an empty tensor inside another's bytes is refused too */
    EXPECT_REFUSED("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}," GOOD_W "}",
                   24, "'w' [0, 24] and 'e' [8, 8]", "overlap");
}

TEST(st_refuses_duplicate_names)
{
    EXPECT_REFUSED("{" GOOD_W ",\"w\":{\"dtype\":\"F32\",\"shape\":[6],\"data_offsets\":[24,48]}}",
                   48, "tensor 'w'", "appears twice");
}

TEST(st_refuses_empty_name)
{
    EXPECT_REFUSED("{\"\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
                   "tensor #0", "name is empty");
}

TEST(st_refuses_name_of_256_bytes)
{
    char json[512], name[257];
    memset(name, 'n', 256);
    name[256] = 0;
    snprintf(json, sizeof json,
             "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", name);
    EXPECT_REFUSED(json, 24, "tensor #0", "name is longer than 255 bytes");
    name[255] = 0; /* 255 is accepted */
    snprintf(json, sizeof json,
             "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", name);
    char err[ERRLEN];
    struct st_header h;
    EXPECT_EQ_INT(parse_text(json, strlen(json), 24, &h, err), SHARDOPT_OK);
    st_header_free(&h);
}

TEST(st_refuses_control_character_in_name)
{
    EXPECT_REFUSED(
        "{\"x\":{}, \"a\\nb\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
        "tensor 'x'", "missing field");
    EXPECT_REFUSED("{\"a\\u0007b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
                   24, "tensor #0", "name contains a control character");
    EXPECT_REFUSED("{\"a\\u007fb\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
                   24, "tensor #0", "name contains a control character");
    /* raw, unescaped: not JSON at all */
    EXPECT_REFUSED("{\"a\tb\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
                   "header byte 3", "unescaped control character 0x09 in a string");
}

TEST(st_refuses_nul_in_header)
{
    /* cJSON would cut the name at the NUL: "w\u0000x" would silently become "w" */
    EXPECT_REFUSED("{\"w\\u0000x\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
                   24, "header byte 3", "\\u0000 in a string");
    const char raw[] = "{" GOOD_W "}\0  ";
    char at[32];
    snprintf(at, sizeof at, "header byte %zu ", strlen(raw));
    EXPECT_REFUSED_LEN(raw, sizeof raw - 1, 24, at, "NUL byte");
    /* an escaped backslash before u0000 is not an escape */
    const char *ok = "{\"__metadata__\":{\"k\":\"\\\\u0000\"}," GOOD_W "}";
    char err[ERRLEN];
    struct st_header h;
    EXPECT_EQ_INT(parse_text(ok, strlen(ok), 24, &h, err), SHARDOPT_OK);
    if (h.nmeta == 1)
        EXPECT_TRUE(strcmp(h.meta[0].value, "\\u0000") == 0);
    st_header_free(&h);
}

TEST(st_refuses_invalid_utf8)
{
    EXPECT_REFUSED("{\"w\xc3\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
                   "header byte 3", "invalid UTF-8");
    /* overlong encodings of '/' and a UTF-16 surrogate, all refused by the reference reader */
    EXPECT_REFUSED(
        "{\"w\xe0\x80\xaf\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
        "header byte 3", "invalid UTF-8");
    EXPECT_REFUSED("{\"w\xc0\xaf\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}",
                   24, "header byte 3", "invalid UTF-8");
    EXPECT_REFUSED(
        "{\"w\xed\xa0\x80\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 24,
        "header byte 3", "invalid UTF-8");
}

TEST(st_refuses_control_character_between_tokens)
{
    EXPECT_REFUSED("{\x01" GOOD_W "}", 24, "header byte 1", "control character 0x01");
}

TEST(st_refuses_metadata_not_an_object)
{
    EXPECT_REFUSED("{\"__metadata__\":[\"a\"]," GOOD_W "}", 24, "__metadata__",
                   "must be an object of strings, got an array");
}

TEST(st_refuses_metadata_value_not_a_string)
{
    EXPECT_REFUSED("{\"__metadata__\":{\"a\":\"x\",\"step\":5}," GOOD_W "}", 24,
                   "__metadata__ key 'step'", "value must be a string, got a number");
    EXPECT_REFUSED("{\"__metadata__\":{\"shape\":{\"x\":\"1\"}}," GOOD_W "}", 24,
                   "__metadata__ key 'shape'", "value must be a string, got an object");
}

TEST(st_refuses_long_metadata_key)
{
    char json[512], key[65];
    memset(key, 'k', 64);
    key[64] = 0;
    snprintf(json, sizeof json, "{\"__metadata__\":{\"%s\":\"v\"}," GOOD_W "}", key);
    EXPECT_REFUSED(json, 24, "__metadata__ key", "is 64 bytes (at most 63)");
}

TEST(st_refuses_duplicate_metadata)
{
    EXPECT_REFUSED("{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"}," GOOD_W "}", 24,
                   "__metadata__ key 'k'", "appears twice");
    EXPECT_REFUSED("{\"__metadata__\":{},\"__metadata__\":{}," GOOD_W "}", 24, "__metadata__",
                   "appears twice");
}

TEST(st_refuses_deep_nesting)
{
    /* beyond cJSON's nesting limit: refused by the parser, without deep recursion */
    size_t depth = 100000;
    char *json = malloc(2 * depth + 16);
    ASSERT_TRUE(json != NULL);
    size_t n = (size_t)sprintf(json, "{\"w\":");
    memset(json + n, '[', depth);
    memset(json + n + depth, ']', depth);
    strcpy(json + n + 2 * depth, "}");
    EXPECT_REFUSED(json, 24, "not valid JSON", "byte");
    free(json);
}

TEST(st_refuses_numbers_not_written_as_digits)
{
    /* integral values, but not how an integer is written: the reference reader refuses them */
    const char *json = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2.0,3],\"data_offsets\":[0,24]}}";
    char at[32];
    snprintf(at, sizeof at, "header byte %d:", (int)(strstr(json, "2.0") - json));
    EXPECT_REFUSED(json, 24, at, "number '2.0' is not written as plain digits");
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,2.4e1]}}", 24,
                   "number '2.4e1'", "plain digits");
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[-0,24]}}", 24,
                   "number '-0'", "plain digits");
    EXPECT_REFUSED("{\"w\":{\"dtype\":\"F32\",\"shape\":[02,3],\"data_offsets\":[0,24]}}", 24,
                   "number '02'", "plain digits");
}
