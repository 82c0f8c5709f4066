/* The cost model's rates when the config leaves cost_gemm_gflops / cost_net_gbps at 0 (their
 * default): those of where Newton-Schulz runs. A GPU prices an exchange element about 3,000 times
 * dearer in Newton-Schulz FLOPs than the CPU rates do, and the plans commit chooses by them (the
 * union plan, expert moves, teams, ns_strategy auto) move bytes to save FLOPs at the CPU's: on
 * a GPU they would slow the step. Shared by commit and shardopt-plan (which models GPUs). */
#ifndef SHARDOPT_CONFIG_COST_H
#define SHARDOPT_CONFIG_COST_H

/* Newton-Schulz on the CPU: an OpenBLAS GEMM rank, a 200 Gb/s link shared by a node's ranks */
#define COST_CPU_GFLOPS 100.0
#define COST_CPU_GBPS   25.0
/* on a device: an H200's bf16 GEMM (790 TFLOP/s measured through PyTorch) at the 80 % Newton-
 * Schulz reaches, and one 400 Gb/s NIC per GPU (the bundled h200 machine file's figures) */
#define COST_DEVICE_GFLOPS 632000.0
#define COST_DEVICE_GBPS   50.0

/* value when set (> 0), else the default of where Newton-Schulz runs */
static inline double config_cost_rate(double value, int ns_on_device, double cpu, double device)
{
    return value > 0 ? value : ns_on_device ? device : cpu;
}

#endif
