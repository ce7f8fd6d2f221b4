/* dg_mem.h: large anonymous buffers that the matrix products stream (weight
 * stacks, the CPU backend's pack), allocated so that the kernel may back them
 * with 2 MiB transparent huge pages when DGEMMA_THP=1 (opt-in).
 *
 * Why: with THP in "madvise" mode (/sys/kernel/mm/transparent_hugepage/enabled,
 * the default of many distributions) anonymous memory is mapped in 4 KiB pages
 * unless the program calls madvise(MADV_HUGEPAGE) on a 2 MiB-aligned range; a
 * matvec (M = 1) over a ~2 MB expert then touches ~550 pages per call, more
 * than the dTLB holds. Measured (session 20, 2-core Zen 5 EPYC, idle, five
 * alternations, docs/measurements.md issue 17): the 4-bit gate/up matvec 1.22x
 * with it, no other row changed beyond the noise, the same bits; but still
 * 0.75x ggml's q4_K (which uses 4 KiB pages too), so not the default. Cost:
 * the allocation is rounded up to a multiple of 2 MiB (at most 2 MiB - 1 bytes
 * more per buffer, all of it backed once touched) and aligned to 2 MiB.
 * File-backed mappings (a checkpoint mmap'd read-only, io/safetensors.c) get no
 * THP from madvise on ext4 and most filesystems; only anonymous copies are helped. */
#ifndef DG_MEM_H
#define DG_MEM_H

#include <stddef.h>

#define DG_HUGE_PAGE ((size_t)2 << 20)

/* The madvise-like call dg_big_alloc_with makes: (addr, length, advice) -> 0 or -1. */
typedef int (*dg_advise_fn)(void *addr, size_t length, int advice);

/* A buffer of at least `bytes` bytes (bytes > 0), its contents undefined, freed
 * with free(). With DGEMMA_THP=1 in the environment: aligned to DG_HUGE_PAGE, its
 * size rounded up to a multiple of DG_HUGE_PAGE, and madvise(MADV_HUGEPAGE)'d; a
 * failing madvise (no THP in the kernel: EINVAL) is ignored, the memory is usable
 * in 4 KiB pages. Otherwise (the default: session 20 measured gate/up M = 1 1.22x
 * with it on a Zen 5 EPYC, still 0.75x ggml's q4_K, so not made the default;
 * docs/measurements.md, issue 17): aligned_alloc(64, bytes rounded up to 64), no
 * madvise. NULL when out of memory or bytes is 0. *huge (if not NULL) is set to 1
 * when madvise succeeded, else 0. */
void *dg_big_alloc(size_t bytes, int *huge);

/* As dg_big_alloc with THP wanted (want_huge != 0) or not, `advise` in place
 * of madvise (NULL: madvise): the seam the tests use to make it fail. */
void *dg_big_alloc_with(size_t bytes, int want_huge, dg_advise_fn advise, int *huge);

/* 1 when DGEMMA_THP is "1" (read at each call; backend/switches.h), else 0 (unset, "0", or a value
 * dg_switches_check refuses). */
int dg_big_alloc_wants_huge(void);

#endif
