/* Each rank's kind of CPU kernels, compared at init. Bits are per kind of CPU (docs/design.md,
 * Determinism): the elementwise tables agree bitwise, but Newton-Schulz's BLAS and oneDNN sum in
 * another order on another CPU, so a job whose ranks run different kinds agrees across layouts
 * to rounding only, and replicas whose owners differ in kind drift apart. Nothing refuses that
 * (no key asks for strict bitwise results); rank 0 warns, naming two ranks and their kinds. */
#ifndef RUNTIME_CPU_KINDS_H
#define RUNTIME_CPU_KINDS_H

#include "runtime/runtime.h"

/* This rank's kind as text: the elementwise table, and where Newton-Schulz runs on the CPU the
 * OpenBLAS core and (ns_compute bf16) whether bf16 is native. "" when no CPU kernel runs the
 * step (backend = cuda without offload = cpu). */
void cpu_kinds_of(const struct shardopt_runtime *rt, char *buf, size_t len);

/* Collective over the runtime: one all-reduce of two words when every rank has the same kind;
 * two more, and rank 0's warning, when they differ. ERR_COMM (agreed) when an all-reduce fails.
 * *mixed (may be NULL) is set to 1 on every rank when the kinds differ, else 0. */
shardopt_status_t cpu_kinds_agree(shardopt_runtime_t rt, int *mixed);

#endif
