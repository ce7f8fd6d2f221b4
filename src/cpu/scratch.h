/* scratch.h: the CPU kernels' per-thread scratch (the dequantization buffers of
 * matmul_driver.h, the quantized or bf16 activations of the avx512lp/avx2lp
 * products), kept for the thread's life so that a product allocates
 * nothing once its thread has run one of that size: no heap call per
 * denoising step (issue 13). Internal to src/cpu/. */
#ifndef DG_CPU_SCRATCH_H
#define DG_CPU_SCRATCH_H

#include <stddef.h>

/* QDEQ, ROWS: matmul_driver.h; LPX: a low-precision product's activations (the
 * calling thread's, shared by the product's threads while it runs); LPROW: the
 * per-thread row buffers of quantizing them; LPW: the per-thread transposed (packed) weights of
 * avx512lp's 4-row blocks; LPIL: the per-thread rows copied out of an interleaved pack (cpu/pack.c); AMXX, AMXW:
 * the AMX path's activation tiles (the calling thread's) and a 16-row block's weight tiles (matmul_avx512lp.c). */
enum {
  DG_KSCRATCH_QDEQ = 0, DG_KSCRATCH_ROWS = 1, DG_KSCRATCH_LPX = 2, DG_KSCRATCH_LPROW = 3, DG_KSCRATCH_LPW = 4,
  DG_KSCRATCH_LPIL = 5, DG_KSCRATCH_AMXX = 6, DG_KSCRATCH_AMXW = 7,
  DG_KSCRATCH_SLOTS = 8
};

/* The calling thread's scratch of slot `slot`, at least `bytes` bytes, 64-byte
 * aligned, its contents undefined; it stays valid until the same thread asks
 * for the same slot again. Grown (freed and reallocated) when too small; freed
 * when the thread exits. NULL when out of memory. */
void *dg_kscratch(int slot, size_t bytes);

/* n (<= 8) buffers of bytes[i] bytes, each 64-byte aligned, carved from the calling
 * thread's scratch of slot `slot` (dg_kscratch: same lifetime), written to parts[i].
 * Returns 0, or -1 (parts untouched) when out of memory or n is out of range. */
int dg_kscratch_parts(int slot, int n, const size_t *bytes, void **parts);

#endif
