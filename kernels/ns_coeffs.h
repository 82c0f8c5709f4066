/* Newton-Schulz coefficient tables, by name. */
#ifndef KERNELS_NS_COEFFS_H
#define KERNELS_NS_COEFFS_H

#include "shardopt_types.h"

#define NS_TABLE_MAX_STEPS 16

/* The kernels' names for shardopt_ns_coeffs_t: the same values by construction. */
enum ns_table {
    NS_TABLE_QUINTIC = SHARDOPT_NS_QUINTIC,
    NS_TABLE_JORDAN = SHARDOPT_NS_JORDAN,
    NS_TABLE_POLAR_EXPRESS = SHARDOPT_NS_POLAR_EXPRESS,
    NS_TABLE_CUSTOM = SHARDOPT_NS_CUSTOM,
    NS_TABLE_AOL = SHARDOPT_NS_AOL
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
