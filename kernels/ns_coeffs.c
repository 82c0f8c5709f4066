#include "ns_coeffs.h"

#include <math.h>
#include <stddef.h>

#include "dtype.h"

static const double quintic[5][3] = {
    {4.0848, -6.8946, 2.9270}, {3.9505, -6.3029, 2.6377}, {3.7418, -5.5913, 2.3037},
    {2.8769, -3.1427, 1.2046}, {2.8366, -3.0525, 1.2012},
};

static const double jordan[1][3] = {{3.4445, -4.7750, 2.0315}};

/* Amsel et al. 2025, with the 1.01 safety factor already folded into the values. */
static const double polar_express[8][3] = {
    {8.2051604140, -22.9019349871, 16.4607249102}, {4.0663951599, -2.8611540868, 0.5183995227},
    {3.9095949044, -2.8233517350, 0.5250369769},   {3.2855640172, -2.4153019596, 0.4852940655},
    {2.2778732871, -1.6198217653, 0.3984807870},   {1.8725756513, -1.2307042575, 0.3585161621},
    {1.8564371098, -1.2132392819, 0.3567997894},   {1.875, -1.25, 0.375},
};

/* For X scaled by AOL (ns_precondition = aol, |X|_2 <= 1 with its smallest singular values
 * about 2-3x larger than under Frobenius scaling, measured on log-uniform spectra), 4 steps in
 * place of quintic's 5. Derived here (tools/ns_aol_coeffs.py with its defaults): the
 * composition f of the four odd quintics maximizes its slope at 0 (the lift of the smallest
 * singular values: f'(0) = 228, quintic's 5 steps give 493 on a start 2-3x smaller) subject to
 * f <= 1.135 on [0, 1] and f >= 0.6 on [0.003, 1], both also with each step's input off by 1 %,
 * and no prefix of the steps below 0.1 on [0.05, 1] (quintic's first step dips to 0.117). Without
 * the last two conditions the search found a schedule whose first step sends 1 to 0.027 and whose
 * later ones lift it back steeply: in bf16 its band's top rose from 1.135 to 1.23. Quintic's 5
 * steps settle in [0.98, 1.145] above 0.003; this schedule in [0.60, 1.135]: one step fewer at a
 * wider settled band, like Jordan's (docs/config.md has the measured bands). Turbo-Muon
 * (Boissin et al. 2025, arXiv 2512.04632) drops one of five steps after AOL the same way; these
 * values are ours, not theirs. */
static const double aol[4][3] = {
    {4.5999, -8.2316, 3.7445},
    {4.1835, -6.0801, 2.2557},
    {4.1682, -5.7314, 2.0656},
    {2.8417, -2.9995, 0.9546},
};

void ns_coeffs_step_range(int table, int *min, int *max)
{
    *min = table == NS_TABLE_POLAR_EXPRESS ? 5 : 1;
    *max = table == NS_TABLE_POLAR_EXPRESS ? 8 : NS_TABLE_MAX_STEPS;
}

int ns_coeffs_fill(int table, int steps, const double (*custom)[3], float out[][3])
{
    const double(*t)[3];
    int len, lo, hi;

    switch (table) {
    case NS_TABLE_QUINTIC:
        t = quintic;
        len = 5;
        break;
    case NS_TABLE_JORDAN:
        t = jordan;
        len = 1;
        break;
    case NS_TABLE_POLAR_EXPRESS:
        t = polar_express;
        len = 8;
        break;
    case NS_TABLE_AOL:
        t = aol;
        len = 4;
        break;
    case NS_TABLE_CUSTOM:
        t = custom;
        len = steps;
        break;
    default: return -1;
    }
    ns_coeffs_step_range(table, &lo, &hi);
    if (steps < lo || steps > hi || t == NULL)
        return -1;
    for (int i = 0; i < steps; i++) {
        const double *c = t[i < len ? i : len - 1];
        for (int j = 0; j < 3; j++)
            out[i][j] = (float)c[j];
    }
    return 0;
}

double ns_coeffs_default_norm_scale(int table)
{
    return table == NS_TABLE_POLAR_EXPRESS ? 1.01 : 1.0;
}

/* max |a + b t + c t^2| over t in [0, T] */
static double quad_absmax(double a, double b, double c, double T)
{
    double best = fabs(a), e = fabs(a + b * T + c * T * T);
    if (e > best)
        best = e;
    if (c != 0.0) {
        const double v = -b / (2.0 * c);
        if (v > 0.0 && v < T && fabs(a + b * v + c * v * v) > best)
            best = fabs(a + b * v + c * v * v);
    }
    return best;
}

/* max |s (a + b s^2 + c s^4)| over s in [0, S]: the ends and where its derivative, a + 3b t +
 * 5c t^2 with t = s^2, is 0 */
static double odd_absmax(double a, double b, double c, double S)
{
    double best = fabs(S * (a + b * S * S + c * S * S * S * S)), t[2];
    int nt = 0;
    if (c != 0.0) {
        const double disc = 9.0 * b * b - 20.0 * a * c;
        if (disc >= 0.0) {
            t[nt++] = (-3.0 * b + sqrt(disc)) / (10.0 * c);
            t[nt++] = (-3.0 * b - sqrt(disc)) / (10.0 * c);
        }
    } else if (b != 0.0) {
        t[nt++] = -a / (3.0 * b);
    }
    for (int i = 0; i < nt; i++)
        if (t[i] > 0.0 && t[i] < S * S) {
            const double s = sqrt(t[i]), v = fabs(s * (a + b * t[i] + c * t[i] * t[i]));
            if (v > best)
                best = v;
        }
    return best;
}

double ns_coeffs_output_bound(const float (*coeffs)[3], int steps, double s0)
{
    double s = s0;
    for (int k = 0; k < steps && s <= 1e30; k++)
        s = odd_absmax(coeffs[k][0], coeffs[k][1], coeffs[k][2], s);
    return s <= 1e30 ? s : INFINITY;
}

int ns_coeffs_output_norm_ok(const float (*coeffs)[3], int steps, float norm_scale, int64_t m,
                             double sumsq)
{
    const double s0 = norm_scale > 0.0f && norm_scale < 1.0f ? 1.0 / norm_scale : 1.0;
    const double s = ns_coeffs_output_bound(coeffs, steps, s0);
    return isfinite(sumsq) && sumsq <= NS_COEFFS_GUARD_SLACK * (double)m * s * s;
}

static int force_on;
static uint32_t force_mask;

void ns_coeffs_gram_restarts_force(int on, uint32_t mask)
{
    force_on = on;
    force_mask = mask;
}

/* the rule of ns_coeffs_gram_restarts; first_alone: also a restart before step 1 (the first
 * step then runs alone, the standard step's products), the exposure counted from there */
static uint32_t restarts_rule(const float (*coeffs)[3], int steps, int64_t rows, int64_t cols,
                              int first_alone)
{
    const int64_t m = rows < cols ? rows : cols, n = rows < cols ? cols : rows;
    uint32_t mask = 0;
    /* s bounds the singular values step k sees: the tables are designed for [0, 1] (|X|_2 <= 1
     * after either scaling, up to norm_scale), then each step's image of the last bound; capped,
     * as a table that sends them that far diverges whatever the algorithm */
    double s = 1.0, exposure = 1.0;

    for (int k = 0; k < steps && k < 32; k++) {
        const double a = coeffs[k][0], b = coeffs[k][1], c = coeffs[k][2];
        /* past 5 steps also before step 5 and every 2 steps after it: the exposure bound alone
         * let quintic's table, its last triple repeated, reach |O| 1.4e4 times the fp64 result at
         * 12 steps in bf16 on a matrix with one small singular value (test_xcheck,
         * gram_bf16_long_schedules_stay_bounded); errors carried over restarts add up too */
        const int long_tail = steps > 5 && k >= 5 && (k - 5) % 2 == 0;
        if (k > 0 && ((first_alone && k == 1) || n < 2 * m || m <= NS_COEFFS_GRAM_SMALL_M ||
                      long_tail || !(exposure <= NS_COEFFS_GRAM_EXPOSURE))) {
            mask |= 1u << k;
            exposure = 1.0;
        }
        exposure *= quad_absmax(a, b, c, s * s);
        s = odd_absmax(a, b, c, s);
        if (!(s <= 1e4))
            s = 1e4;
    }
    return mask;
}

uint32_t ns_coeffs_gram_restarts(const float (*coeffs)[3], int steps, int64_t rows, int64_t cols)
{
    return force_on ? force_mask : restarts_rule(coeffs, steps, rows, cols, 0);
}

/* the longest run of steps between restarts in mask */
static int longest_segment(uint32_t mask, int steps)
{
    int best = 0, len = 0;
    for (int k = 0; k < steps; k++) {
        len = k > 0 && k < 32 && (mask >> k & 1u) ? 1 : len + 1;
        best = len > best ? len : best;
    }
    return best;
}

uint32_t ns_coeffs_gram_restarts_for(const float (*coeffs)[3], int steps, int64_t rows,
                                     int64_t cols, int compute)
{
    const uint32_t mask = ns_coeffs_gram_restarts(coeffs, steps, rows, cols);
    if (force_on || compute != KDT_F32 || longest_segment(mask, steps) < 3)
        return mask;
    return restarts_rule(coeffs, steps, rows, cols, 1);
}
