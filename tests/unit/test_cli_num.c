/* tools/cli_num.h, the number parsing every tool shares: the whole argument, decimal, inside the
 * option's range, or a refusal (atoi took "12abc" as 12, strtol " 5", "+5" and saturated past
 * 2^63; strtod took "nan", "inf" and "1e999"). */
#include "test.h"
#include "tools/cli_num.h"

TEST(integers_are_whole_decimal_and_in_range)
{
    long long v = 0;
    int i = 0;
    EXPECT_EQ_INT(cli_parse_ll_in("12", 1, 100, &v), 0);
    EXPECT_EQ_INT(v, 12);
    EXPECT_EQ_INT(cli_parse_ll_in("-1", -1, 100, &v), 0);
    EXPECT_EQ_INT(v, -1);
    EXPECT_EQ_INT(cli_parse_ll_in("9223372036854775807", 0, LLONG_MAX, &v), 0);
    const char *bad[] = {"12abc",
                         "",
                         " 5",
                         "5 ",
                         "+5",
                         "1e3",
                         "0x10",
                         "-",
                         "--5",
                         "nan",
                         "9223372036854775808",
                         "-9223372036854775809",
                         "99999999999999999999"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        EXPECT_EQ_INT(cli_parse_ll_in(bad[k], LLONG_MIN, LLONG_MAX, &v), -1);
    EXPECT_EQ_INT(cli_parse_ll_in(NULL, 0, 1, &v), -1);
    EXPECT_EQ_INT(cli_parse_ll_in("0", 1, 100, &v), -1);
    EXPECT_EQ_INT(cli_parse_ll_in("101", 1, 100, &v), -1);
    /* an int option: a value past int's range is refused, never wrapped */
    EXPECT_EQ_INT(cli_parse_int_in("2147483648", INT_MIN, INT_MAX, &i), -1);
    EXPECT_EQ_INT(cli_parse_int_in("4294967297", INT_MIN, INT_MAX, &i), -1);
    EXPECT_EQ_INT(cli_parse_int_in("2147483647", 1, INT_MAX, &i), 0);
    EXPECT_EQ_INT(i, INT_MAX);
}

TEST(numbers_are_finite_whole_and_in_range)
{
    double d = 0;
    EXPECT_EQ_INT(cli_parse_double_in("0.5", 0, 1, &d), 0);
    EXPECT_TRUE(d == 0.5);
    EXPECT_EQ_INT(cli_parse_double_in("1e-3", 0, 1, &d), 0);
    const char *bad[] = {"nan", "NaN", "inf", "-inf", "1e999", "", " 1", "1x", "0.5 ", "1,2"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        EXPECT_EQ_INT(cli_parse_double_in(bad[k], -1e308, 1e308, &d), -1);
    EXPECT_EQ_INT(cli_parse_double_in("1.5", 0, 1, &d), -1);
    EXPECT_EQ_INT(cli_parse_double_in("-0.1", 0, 1, &d), -1);
}

TEST(lists_have_no_empty_item_and_at_most_cap)
{
    long long v[4];
    EXPECT_EQ_INT(cli_parse_list_in("1,2,3", 1, 10, v, 4), 3);
    EXPECT_EQ_INT(v[2], 3);
    EXPECT_EQ_INT(cli_parse_list_in("7", 1, 10, v, 4), 1);
    const char *bad[] = {"",
                         ",",
                         "1,",
                         ",1",
                         "1,,2",
                         "1,x",
                         "1, 2",
                         "1,11",
                         "0",
                         "1,2,3,4,5",
                         "123456789012345678901234567890"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        EXPECT_EQ_INT(cli_parse_list_in(bad[k], 1, 10, v, 4), -1);
}

TEST(memory_checks_refuse_what_no_machine_holds)
{
    EXPECT_TRUE(cli_mem_total() > 0);
    EXPECT_TRUE(cli_mem_fits(1024));
    EXPECT_TRUE(!cli_mem_fits(1e30));
    EXPECT_TRUE(!cli_mem_fits(-1));
    EXPECT_TRUE(!cli_mem_fits(NAN));
    EXPECT_TRUE(!cli_mem_fits(INFINITY));
}
