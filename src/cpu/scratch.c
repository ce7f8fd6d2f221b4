/* scratch.c: the CPU kernels' per-thread scratch (scratch.h). A thread's
 * buffers hang off a _Thread_local pointer (so a leak checker sees them as
 * reachable while the thread lives) and a C11 tss key whose destructor frees
 * them when the thread exits (OpenMP's pool threads live until the process
 * ends). They are per thread, never shared, and hold no state between calls:
 * only memory, so that the products' dequantization buffers (a few KiB to
 * 256 KiB per thread) are not allocated and freed in every product. */
#include "cpu/scratch.h"

#include <stdlib.h>
#include <threads.h>

typedef struct kscratch {
  void *p[DG_KSCRATCH_SLOTS];
  size_t n[DG_KSCRATCH_SLOTS];
} kscratch;

static _Thread_local kscratch *tl_scratch;
static tss_t scratch_key;
static int scratch_key_ok;
static once_flag scratch_once = ONCE_FLAG_INIT;

static void scratch_free(void *v) {
  kscratch *s = v;
  if (!s) return;
  for (int i = 0; i < DG_KSCRATCH_SLOTS; i++) free(s->p[i]);
  free(s);
}

static void scratch_key_init(void) { scratch_key_ok = tss_create(&scratch_key, scratch_free) == thrd_success; }

void *dg_kscratch(int slot, size_t bytes) {
  if (slot < 0 || slot >= DG_KSCRATCH_SLOTS) return NULL;
  kscratch *s = tl_scratch;
  if (!s) {
    call_once(&scratch_once, scratch_key_init);
    if (!scratch_key_ok || !(s = calloc(1, sizeof *s))) return NULL;
    if (tss_set(scratch_key, s) != thrd_success) {
      free(s);
      return NULL;
    }
    tl_scratch = s;
  }
  if (s->n[slot] < bytes) {
    free(s->p[slot]);
    s->p[slot] = aligned_alloc(64, (bytes + 63) / 64 * 64);
    s->n[slot] = s->p[slot] ? bytes : 0;
  }
  return s->p[slot];
}

int dg_kscratch_parts(int slot, int n, const size_t *bytes, void **parts) {
  if (n < 1 || n > 8) return -1;
  size_t off[8], total = 0;
  for (int i = 0; i < n; i++) {
    off[i] = total;
    total += (bytes[i] + 63) / 64 * 64;
  }
  char *base = dg_kscratch(slot, total);
  if (!base) return -1;
  for (int i = 0; i < n; i++) parts[i] = base + off[i];
  return 0;
}
