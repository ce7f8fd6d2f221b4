/* dg_error.h: internal status/error helpers shared by every dgemma source file.
 *
 * The library never prints or exits. A failing function records a human-readable
 * message (naming the file, field or tensor and the offending value) in a
 * thread-local buffer and returns a dg_status; the CLI prints dg_last_error().
 */
#ifndef DG_ERROR_H
#define DG_ERROR_H

#include "dgemma.h"

#if defined(__GNUC__)
#define DG_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define DG_PRINTF(a, b)
#endif

/* Record a formatted message for status `st` and return `st`.
 * Usage: return dg_seterr(DG_ERR_CONFIG, "%s: field \"%s\" missing", path, name); */
dg_status dg_seterr(dg_status st, const char *fmt, ...) DG_PRINTF(2, 3);

/* Prefix the current message with "prefix: " (used when a lower layer's error
 * is passed up with more context); returns st unchanged. */
dg_status dg_prefixerr(dg_status st, const char *fmt, ...) DG_PRINTF(2, 3);

/* Clear the thread-local message. */
void dg_clearerr(void);

/* Propagate a non-OK status. */
#define DG_TRY(expr)                                                           \
  do {                                                                         \
    dg_status dg_try_st_ = (expr);                                             \
    if (dg_try_st_ != DG_OK) return dg_try_st_;                                \
  } while (0)

#endif
