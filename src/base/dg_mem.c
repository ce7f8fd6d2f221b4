/* dg_mem.c: see dg_mem.h. */
#include "base/dg_mem.h"
#include "backend/switches.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

int dg_big_alloc_wants_huge(void) { return dg_sw_get(DG_SW_THP) == 1; }

#ifdef MADV_HUGEPAGE
#define DG_MADV_HUGEPAGE MADV_HUGEPAGE
static int sys_advise(void *addr, size_t length, int advice) { return madvise(addr, length, advice); }
#else /* no THP in these headers: the advice always fails, the memory is used in small pages */
#define DG_MADV_HUGEPAGE 14 /* Linux's value; only a test's advise function sees it */
static int sys_advise(void *addr, size_t length, int advice) { (void)addr; (void)length; (void)advice; return -1; }
#endif

void *dg_big_alloc_with(size_t bytes, int want_huge, dg_advise_fn advise, int *huge) {
  if (huge) *huge = 0;
  if (!bytes) return NULL;
  if (!want_huge) {
    if (bytes > SIZE_MAX - 63) return NULL;
    return aligned_alloc(64, (bytes + 63) / 64 * 64);
  }
  if (bytes > SIZE_MAX - (DG_HUGE_PAGE - 1)) return NULL;
  const size_t n = (bytes + DG_HUGE_PAGE - 1) / DG_HUGE_PAGE * DG_HUGE_PAGE;
  void *p = aligned_alloc(DG_HUGE_PAGE, n);
  if (!p) return NULL;
  const int ok = (advise ? advise : sys_advise)(p, n, DG_MADV_HUGEPAGE) == 0;
  if (huge) *huge = ok;
  return p;
}

void *dg_big_alloc(size_t bytes, int *huge) { return dg_big_alloc_with(bytes, dg_big_alloc_wants_huge(), NULL, huge); }
