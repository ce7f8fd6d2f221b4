/* outfile.h: interruption and output files of the CLI commands (tools/ only;
 * the library never touches signals).
 *
 * SIGINT, SIGTERM, SIGHUP and SIGPIPE (a pipe's reader gone) end a command with status 128 + the signal
 * (130, 143, 129, 141),
 * leaving what was there before: an output file is written to a temporary
 * name in its directory (".<name>.tmp-XXXXXX") and renamed over the target
 * only when complete (out_open / out_commit; through a symlink, the file it
 * names is replaced; a device or FIFO such as /dev/null is written in place); quantize and mkrandom stop at
 * their next progress call (g_stop_sig) and the library removes its temporary
 * directory; a second signal before that ends the process at once, after
 * removing the directory the library reported (out_track_dir). A signal that
 * the process was started with ignored (a background job) stays ignored. One
 * output file and one output directory at a time per process. */
#ifndef DG_TOOLS_OUTFILE_H
#define DG_TOOLS_OUTFILE_H

#include <signal.h>
#include <stdio.h>

/* The SIGINT/SIGTERM/SIGHUP/SIGPIPE received since catch_stop_signals, 0 if none. */
extern volatile sig_atomic_t g_stop_sig;

/* The signals that stop a command: SIGINT, SIGTERM, SIGHUP, SIGPIPE. */
#define OUT_N_STOP_SIGS 4
extern const int out_stop_sigs[OUT_N_STOP_SIGS];

/* Install handler for each of out_stop_sigs that the process was not started with ignored (a background job,
 * nohup: it stays ignored); the earlier dispositions into old[] if old is not NULL (sigaction them back to
 * restore). */
void out_catch_stop_sigs(void (*handler)(int), struct sigaction old[OUT_N_STOP_SIGS]);

/* Install the SIGINT/SIGTERM/SIGHUP/SIGPIPE handlers. immediate = 1: the command has no stop
 * point; the handler removes the temporary output file and exits at once
 * with 128 + the signal. immediate = 0: it only records the signal in
 * g_stop_sig; a second one removes the temporary file and directory and
 * exits at once with 128 + the signal. */
void catch_stop_signals(int immediate);

/* The library's temporary output directory, NULL once it is renamed or
 * removed: the on_tmp_dir callback of dg_quantize_params and
 * dg_mkrandom_params (user_data unused). */
void out_track_dir(const char *tmp_dir, void *user_data);

/* A temporary file next to `path`, opened for writing before any long work;
 * the target is not touched. `path` "-" is standard output (written in place; out_commit
 * flushes it and leaves it open). NULL after a message on stderr naming the file
 * and the reason ("<who>: cannot write PATH: ...") if it cannot be made
 * (path names a directory, the directory is missing or not writable). */
FILE *out_try_open(const char *path, const char *who);
/* The same, exiting (status 1, or 2 for a path ending in '/') on failure. */
FILE *out_open(const char *path);

/* Flush, fsync and close the temporary file and rename it to `path`.
 * Returns 0, or 1 after a message naming the file and the error (the
 * temporary file is removed, `path` left as it was). Call it last: once
 * the file is renamed, SIGINT, SIGTERM, SIGHUP and SIGPIPE are only recorded (g_stop_sig),
 * so an exit status of 128 + sig always means the old file was kept. */
int out_commit(FILE *f, const char *path);

/* Close the temporary file and remove it, leaving `path` as it was (an
 * error path). NULL is a no-op. */
void out_discard(FILE *f);

#endif
