/* malloc_count.c: an LD_PRELOAD counter of heap calls (malloc, calloc, realloc, aligned_alloc,
 * posix_memalign, memalign), the total printed to stderr at exit. A lab tool:
 *   cc -O2 -shared -fPIC -o /tmp/mcount.so dev/malloc_count.c
 *   LD_PRELOAD=/tmp/mcount.so build-cpu/dgemma run ... 2>&1 >/dev/null | grep mcount
 * (glibc: it forwards to __libc_malloc and friends, so it needs no dlsym). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <errno.h>
extern void *__libc_malloc(size_t), *__libc_calloc(size_t, size_t), *__libc_realloc(void *, size_t),
    *__libc_memalign(size_t, size_t);
static atomic_long n;
void *malloc(size_t s) { n++; return __libc_malloc(s); }
void *calloc(size_t a, size_t b) { n++; return __libc_calloc(a, b); }
void *realloc(void *p, size_t s) { n++; return __libc_realloc(p, s); }
void *aligned_alloc(size_t a, size_t s) { n++; return __libc_memalign(a, s); }
void *memalign(size_t a, size_t s) { n++; return __libc_memalign(a, s); }
int posix_memalign(void **r, size_t a, size_t s) { n++; void *p = __libc_memalign(a, s); if (!p) return ENOMEM; *r = p; return 0; }
__attribute__((destructor)) static void done(void) { fprintf(stderr, "mcount %ld\n", (long)n); }
