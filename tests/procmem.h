/* procmem.h: this process's memory from /proc (Linux), for test_turbo's
 * memory test and dev/mem_per_canvas.c; no cmocka, so a plain program can
 * include it. */
#ifndef DG_PROCMEM_H
#define DG_PROCMEM_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The value (kB) of the line of /proc/self/status starting with key (e.g.
 * "VmHWM:", the peak RSS since the last reset; "VmRSS:"); -1 when not there. */
static inline long dg_proc_kb(const char *key) {
  FILE *f = fopen("/proc/self/status", "r");
  if (!f) return -1;
  char line[256];
  long v = -1;
  size_t n = strlen(key);
  while (fgets(line, sizeof line, f))
    if (strncmp(line, key, n) == 0) v = strtol(line + n, NULL, 10);
  fclose(f);
  return v;
}

/* Reset VmHWM to the current RSS: write 5 to /proc/self/clear_refs (Linux >=
 * 4.0). 0 on success, -1 otherwise. */
static inline int dg_proc_hwm_reset(void) {
  FILE *f = fopen("/proc/self/clear_refs", "w");
  if (!f) return -1;
  int ok = fputs("5", f) >= 0;
  return fclose(f) == 0 && ok ? 0 : -1;
}

#endif
