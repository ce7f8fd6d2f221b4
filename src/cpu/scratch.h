/* scratch.h: the CPU kernels' per-thread scratch (the dequantization buffers of
 * matmul_driver.h), kept for the thread's life so that a product allocates
 * nothing once its thread has run one of that size: no heap call per
 * denoising step (issue 13). Internal to src/cpu/. */
#ifndef DG_CPU_SCRATCH_H
#define DG_CPU_SCRATCH_H

#include <stddef.h>

enum { DG_KSCRATCH_QDEQ = 0, DG_KSCRATCH_ROWS = 1, DG_KSCRATCH_SLOTS = 2 };

/* The calling thread's scratch of slot `slot`, at least `bytes` bytes, 64-byte
 * aligned, its contents undefined; it stays valid until the same thread asks
 * for the same slot again. Grown (freed and reallocated) when too small; freed
 * when the thread exits. NULL when out of memory. */
void *dg_kscratch(int slot, size_t bytes);

#endif
