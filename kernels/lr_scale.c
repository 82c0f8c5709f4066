#include "lr_scale.h"

#include <math.h>

double lr_scale_factor(int kind, int64_t out_dim, int64_t in_dim)
{
    const double a = (double)out_dim, b = (double)in_dim;
    switch (kind) {
    case LR_SCALE_RMS_NORM: return 0.2 * sqrt(a > b ? a : b);
    case LR_SCALE_SPECTRAL_NORM: return sqrt(a / b);
    case LR_SCALE_JORDAN: return sqrt(a / b > 1.0 ? a / b : 1.0);
    default: return 1.0;
    }
}
