/* Learning-rate scale of a Muon matrix from its true [out, in] shape. */
#ifndef KERNELS_LR_SCALE_H
#define KERNELS_LR_SCALE_H

#include <stdint.h>

/* Same values as shardopt_lr_scale_t. */
enum lr_scale_kind {
    LR_SCALE_RMS_NORM = 0,
    LR_SCALE_SPECTRAL_NORM = 1,
    LR_SCALE_JORDAN = 2,
    LR_SCALE_NONE = 3
};

/* rms_norm 0.2*sqrt(max(A,B)) (matches AdamW's update RMS), spectral_norm sqrt(A/B),
 * jordan sqrt(max(1, A/B)), none 1. */
double lr_scale_factor(int kind, int64_t out_dim, int64_t in_dim);

#endif
