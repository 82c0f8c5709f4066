/* Newton-Schulz coefficient tables, by name. */
#ifndef KERNELS_NS_COEFFS_H
#define KERNELS_NS_COEFFS_H

#define NS_TABLE_MAX_STEPS 16

/* Same values as shardopt_ns_coeffs_t. */
enum ns_table {
    NS_TABLE_QUINTIC = 0,
    NS_TABLE_JORDAN = 1,
    NS_TABLE_POLAR_EXPRESS = 2,
    NS_TABLE_CUSTOM = 3,
    NS_TABLE_AOL = 4
};

/* The triples for `steps` iterations of `table` (custom: taken from `custom`). Tables shorter
 * than steps repeat their last triple. Returns 0, or -1 for an unknown table or steps out of
 * 1..NS_TABLE_MAX_STEPS. */
int ns_coeffs_fill(int table, int steps, const double (*custom)[3], float out[][3]);

/* Frobenius-norm multiplier the table was designed for: 1.01 for polar_express (its safety
 * factor), 1 otherwise. */
double ns_coeffs_default_norm_scale(int table);

/* Steps the table accepts: [*min, *max]. */
void ns_coeffs_step_range(int table, int *min, int *max);

#endif
