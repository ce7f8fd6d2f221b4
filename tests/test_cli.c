/* test_cli.c: the CLI when it is interrupted or cannot write (issue 16), and
 * as a user drives it (issue 15).
 *
 * Checks:
 *   - quantize, mkrandom and logits interrupted by SIGINT, SIGTERM and SIGHUP at
 *     random moments (a few runs each, seed printed): the exit status is 130,
 *     143 or 129 and nothing partial is left (no output directory, an empty one
 *     left empty, an existing -o file byte for byte as before, no temporary
 *     sibling); a run the signal reached only after its output was complete
 *     exits 0 with the complete output. A rerun after an interruption works.
 *     `eval gsm8k --summary` the same way: the old summary or a whole new one.
 *     A second SIGINT (SIGTERM) while quantize or mkrandom is on its way to
 *     its stop point: exit 130 (143) at once and nothing left.
 *   - -o through a symlink, to a FIFO or to a device: the link, FIFO or device
 *     stays (the file behind the link gets the output), a full device is exit 1.
 *   - quantize and mkrandom into a symlink to an empty directory: the directory it names gets the output,
 *     the link stays; a link to nothing is refused before any work.
 *   - `run` and `tokenize` with stdout on /dev/full: exit 1 and a message.
 *   - quantize and mkrandom with their output piped into `head -1`: exit 141, nothing left.
 *   - a file past the size limit (ulimit -f): quantize, mkrandom, logits -o and tokenize's stdout exit 1
 *     with "File too large", nothing partial left (SIGXFSZ had killed them silently).
 *   - with {"eos_token_id": []} the token count of a generation (library
 *     n_visible and the summary of `dgemma run`) is the number of tokens the
 *     detokenizer shows, not every canvas position; the same for the summaries
 *     and -o lines of `eval problems` and `eval gsm8k`.
 *   - issue 15: every command's --help (stdout, exit 0, its own text), --version
 *     anywhere, options of other commands and unknown ones refused in one line
 *     (exit 2, before a model loads), prompts from -p, -f, -p - and a pipe (the
 *     same answer; a 1 MB prompt through stdin read whole, an endless one refused past 256 MiB), --json (parsed, its
 *     text and tokens checked against the library), --stop (a string spanning
 *     two blocks, several strings, one that never comes), --temp (the schedule's
 *     temperatures seen with -v), tokenize --pieces and detokenize, -t capped at
 *     the cores, the passive OpenMP wait policy, info on a quantized model and a
 *     model without a tokenizer. An empty file, directory or id list ("-o ''",
 *     --prompt-ids "", an empty @FILE) is a usage error naming the option.
 * The models are the bundled one and `mkrandom --config small`, one thread.
 * DG_TEST_FILTER=NAME runs the tests matching NAME (cmocka's filter). */
#include "testutil.h"
#include "cpu/kernels.h" /* dg_kernels_avx512lp: whether this CPU has the opt-in set */

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pty.h>
#include <sched.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>

#define SMALL "models/dgemma-small"

static char g_dir[256];
static char g_exe[1024];
static unsigned g_seed;

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/dgemma-test-cli-XXXXXX");
  if (!mkdtemp(g_dir)) return -1;
  ssize_t k = readlink("/proc/self/exe", g_exe, sizeof g_exe - 16);
  if (k <= 0) return -1;
  g_exe[k] = 0;
  *strrchr(g_exe, '/') = 0;
  strcat(g_exe, "/../dgemma");
  g_seed = (unsigned)time(NULL) ^ (unsigned)getpid();
  printf("# random interruption moments: seed %u\n", g_seed);
  srand(g_seed);
  return 0;
}

static int teardown(void **state) {
  (void)state;
  dg_test_rm_dir(g_dir);
  return 0;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* 1 if process pid has a handler installed for sig (SigCgt in /proc/PID/status). */
static int catches(pid_t pid, int sig) {
  char p[64], line[256];
  snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  unsigned long long mask = 0;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "SigCgt:", 7)) mask = strtoull(line + 7, NULL, 16);
  fclose(f);
  return (int)((mask >> (sig - 1)) & 1);
}

static double g_after_handler; /* seconds from the handler seen to the exit (last run_signalled with sig) */

/* Run dgemma with argv (NULL-terminated, argv[0] ignored), stdout and stderr
 * to g_dir/cli.out and cli.err, SIGINT/SIGTERM at their default as at an
 * interactive shell. sig > 0: once dgemma has its handler for sig, wait
 * delay_us and send it (if the process has not ended yet; *sent says);
 * delay_us < 0: send nothing, only time the run from then (g_after_handler).
 * Returns the wait status. */
/* Start g_exe with argv, its stdout and stderr in g_dir/cli.out and cli.err, SIGINT and SIGTERM at their
 * default actions (a test run from a script may inherit them ignored); returns the child's pid. */
static pid_t spawn_cli(const char *const *argv) {
  fflush(stdout); /* or the child's freopen writes the parent's buffered lines again */
  char of[512], ef[512];
  snprintf(of, sizeof of, "%s/cli.out", g_dir);
  snprintf(ef, sizeof ef, "%s/cli.err", g_dir);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen(of, "w", stdout) || !freopen(ef, "w", stderr)) _exit(126);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    execv(g_exe, (char *const *)argv);
    _exit(127);
  }
  return pid;
}

static int run_signalled(const char *const *argv, int sig, long delay_us, int *sent) {
  const pid_t pid = spawn_cli(argv);
  int status = 0;
  if (sent) *sent = 0;
  double t0 = 0;
  g_after_handler = 0;
  if (sig > 0) {
    for (;;) {
      pid_t w = waitpid(pid, &status, WNOHANG);
      if (w == pid) return status; /* ended before its handler was seen: no signal */
      if (catches(pid, sig)) break;
      usleep(500);
    }
    t0 = now_s();
    if (delay_us > 0) usleep((useconds_t)delay_us);
    if (delay_us >= 0 && kill(pid, sig) == 0 && sent) *sent = 1;
  }
  assert_int_equal(waitpid(pid, &status, 0), pid);
  if (sig > 0) g_after_handler = now_s() - t0;
  return status;
}

static char *read_err(void) {
  char ef[512];
  snprintf(ef, sizeof ef, "%s/cli.err", g_dir);
  char *e = dg_test_read_file(ef, NULL);
  return e ? e : strdup("");
}

static void write_file(const char *path, const char *text, size_t len); /* below */

/* Entries of g_dir whose name holds ".tmp-" (temporary siblings and files). */
static int count_tmp_entries(void) {
  DIR *d = opendir(g_dir);
  assert_non_null(d);
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d)))
    if (strstr(e->d_name, ".tmp-")) {
      printf("# left behind: %s/%s\n", g_dir, e->d_name);
      n++;
    }
  closedir(d);
  return n;
}

static long long file_size(const char *path) {
  struct stat sb;
  return stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
}

static int n_entries(const char *dir) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  struct dirent *e;
  int n = 0;
  while ((e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  closedir(d);
  return n;
}

/* ---- interrupted writers of an output directory (quantize, mkrandom) ------------ */

static const char *sig_name(int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGTERM ? "SIGTERM" : "SIGHUP"; }

typedef enum { W_QUANTIZE, W_MKRANDOM } writer;

static void writer_argv(writer w, const char *out, const char **argv) {
  int k = 0;
  argv[k++] = "dgemma";
  if (w == W_QUANTIZE) { argv[k++] = "quantize"; argv[k++] = SMALL; argv[k++] = out; }
  else { argv[k++] = "mkrandom"; argv[k++] = out; argv[k++] = "--config"; argv[k++] = "small"; }
  argv[k++] = "-t";
  argv[k++] = "1";
  argv[k] = NULL;
}

static void interrupted_dir_writer(writer w) {
  const char *name = w == W_QUANTIZE ? "quantize" : "mkrandom";
  const char *argv[12];
  char ref[512], out[600], shard[700], ref_shard[600];
  /* a complete run: its duration bounds the random moments, its shard size is what a complete one has */
  snprintf(ref, sizeof ref, "%s/%s-ref", g_dir, name);
  writer_argv(w, ref, argv);
  int st = run_signalled(argv, SIGINT, -1, NULL);
  const double T = g_after_handler; /* the time in which a signal is handled */
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  snprintf(ref_shard, sizeof ref_shard, "%s/model.safetensors", ref);
  const long long ref_size = file_size(ref_shard);
  assert_true(ref_size > 0);
  const int ref_files = n_entries(ref);
  int interrupted = 0, completed = 0;
  for (int i = 0; i < 6; i++) {
    /* SIGHUP (a closed terminal) as well: its default action left the partial temporary directory (review rev16) */
    const int sig = (const int[]){SIGINT, SIGTERM, SIGHUP}[i % 3];
    /* runs 0-2 at once, one per signal (always interrupted: a signal without a handler, as SIGHUP had, ends the
     * run unsent), the others at a random moment of a whole run */
    const long delay = i < 3 ? 0 : (long)((double)rand() / RAND_MAX * T * 1e6);
    snprintf(out, sizeof out, "%s/%s-%d", g_dir, name, i);
    const int pre_empty = i == 1; /* an empty directory given as OUT_DIR stays, empty */
    if (pre_empty) assert_int_equal(mkdir(out, 0755), 0);
    writer_argv(w, out, argv);
    int sent;
    st = run_signalled(argv, sig, delay, &sent);
    char *e = read_err();
    assert_true(WIFEXITED(st));
    const int code = WEXITSTATUS(st);
    printf("# %s run %d: %s after %.3f s of %.3f s -> exit %d\n", name, i, sig_name(sig), delay / 1e6, T, code);
    if (i < 3 && code != 128 + sig) fail_msg("%s run %d: %s at once: exit %d, want %d", name, i, sig_name(sig), code, 128 + sig);
    if (code == 128 + sig) {
      interrupted++;
      if (!strstr(e, "interrupted") || !strstr(e, "nothing was left in")) fail_msg("%s: stderr: %s", name, e);
      if (pre_empty) assert_int_equal(n_entries(out), 0);
      else if (n_entries(out) >= 0) fail_msg("%s run %d: interrupted, but %s exists", name, i, out);
    } else {
      if (code != 0) fail_msg("%s run %d: exit %d (want 0 or %d); stderr: %s", name, i, code, 128 + sig, e);
      completed++; /* the signal came after the rename: the output is whole */
      snprintf(shard, sizeof shard, "%s/model.safetensors", out);
      assert_true(file_size(shard) == ref_size);
      assert_int_equal(n_entries(out), ref_files);
    }
    free(e);
    assert_int_equal(count_tmp_entries(), 0);
  }
  printf("# %s: %d interrupted, %d completed before the signal\n", name, interrupted, completed);
  assert_true(interrupted >= 1);
  /* a rerun after an interruption is not refused and writes the whole directory */
  snprintf(out, sizeof out, "%s/%s-0", g_dir, name);
  writer_argv(w, out, argv);
  st = run_signalled(argv, 0, 0, NULL);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 0);
  snprintf(shard, sizeof shard, "%s/model.safetensors", out);
  assert_true(file_size(shard) == ref_size);
  assert_int_equal(n_entries(out), ref_files);
}

static void test_quantize_interrupted(void **state) {
  (void)state;
  interrupted_dir_writer(W_QUANTIZE);
}

static void test_mkrandom_interrupted(void **state) {
  (void)state;
  interrupted_dir_writer(W_MKRANDOM);
}

/* 1 if g_dir holds a temporary sibling of the output directory named `name` (".NAME.tmp-"). */
static int has_tmp_of(const char *name) {
  char pre[300];
  snprintf(pre, sizeof pre, ".%s.tmp-", name);
  DIR *d = opendir(g_dir);
  if (!d) return 0;
  struct dirent *e;
  int found = 0;
  while ((e = readdir(d)))
    found |= strncmp(e->d_name, pre, strlen(pre)) == 0;
  closedir(d);
  return found;
}

/* 1 while sig is pending for pid (sent, not yet delivered: SigPnd or ShdPnd in /proc/PID/status). */
static int pending(pid_t pid, int sig) {
  char p[64], line[256];
  snprintf(p, sizeof p, "/proc/%d/status", (int)pid);
  FILE *f = fopen(p, "r");
  if (!f) return 0;
  unsigned long long mask = 0;
  while (fgets(line, sizeof line, f))
    if (!strncmp(line, "SigPnd:", 7) || !strncmp(line, "ShdPnd:", 7)) mask |= strtoull(line + 7, NULL, 16);
  fclose(f);
  return (int)((mask >> (sig - 1)) & 1);
}

/* A second signal before the stop point (a user pressing Ctrl-C again while the command finishes
 * its tensor) ends the process at once, but not before the temporary directory is removed: once
 * the temporary sibling exists, the signal is sent, and sent again as soon as the first has been
 * delivered (the command is then still on its way to its next progress call). It left
 * ".NAME.tmp-XXXXXX" with a partial shard (the second signal had the default action). Exit 130
 * or 143, no output, no temporary sibling. */
static void interrupted_twice(writer w) {
  const char *name = w == W_QUANTIZE ? "quantize" : "mkrandom";
  const char *argv[12];
  char out[600], base[64];
  int landed = 0;
  for (int i = 0; i < 20 && landed < 4; i++) {
    const int sig = i % 2 ? SIGTERM : SIGINT;
    snprintf(base, sizeof base, "%s-twice-%d", name, i);
    snprintf(out, sizeof out, "%s/%s", g_dir, base);
    writer_argv(w, out, argv);
    const pid_t pid = spawn_cli(argv);
    int status = 0, sent = 0;
    for (;;) { /* until the temporary directory appears (then signal) or the process ends */
      if (waitpid(pid, &status, WNOHANG) == pid) break;
      if (has_tmp_of(base)) {
        sent = kill(pid, sig) == 0;
        while (sent && pending(pid, sig)) usleep(10);
        sent = sent && kill(pid, sig) == 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        break;
      }
      usleep(100);
    }
    if (!WIFEXITED(status)) fail_msg("%s run %d: ended by signal %d, not an exit", name, i, WTERMSIG(status));
    const int code = WEXITSTATUS(status);
    printf("# %s twice run %d: %s -> exit %d\n", name, i,
           !sent ? "no second signal sent" : sig == SIGINT ? "SIGINT twice" : "SIGTERM twice", code);
    if (code == 128 + sig) {
      landed++;
      if (n_entries(out) >= 0) fail_msg("%s run %d: interrupted, but %s exists", name, i, out);
    } else if (code != 0) {
      char *e = read_err();
      fail_msg("%s run %d: exit %d; stderr: %s", name, i, code, e);
    }
    assert_int_equal(count_tmp_entries(), 0);
  }
  printf("# %s: %d runs interrupted twice\n", name, landed);
  assert_true(landed >= 1);
}

static void test_interrupted_twice(void **state) {
  (void)state;
  interrupted_twice(W_QUANTIZE);
  interrupted_twice(W_MKRANDOM);
}

/* ---- logits -o ------------------------------------------------------------------- */

static void test_logits_interrupted(void **state) {
  (void)state;
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.no_tokenizer = 1;
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  dg_model_info info;
  dg_model_get_info(m, &info);
  dg_model_free(m);
  const long long want = (long long)info.canvas_length * info.vocab_size * 4;
  /* ids as files: a 200-token prompt and one canvas */
  char pids[600], cids[600], out[600], bad[600];
  int32_t ids[256];
  for (int i = 0; i < 256; i++) ids[i] = 5 + (i * 37) % (info.vocab_size - 5);
  snprintf(pids, sizeof pids, "%s/prompt.i32", g_dir);
  snprintf(cids, sizeof cids, "%s/canvas.i32", g_dir);
  FILE *f = fopen(pids, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(ids, 4, 200, f), 200);
  fclose(f);
  f = fopen(cids, "wb");
  assert_int_equal(fwrite(ids, 4, (size_t)info.canvas_length, f), (size_t)info.canvas_length);
  fclose(f);
  char pa[620], ca[620];
  snprintf(pa, sizeof pa, "@%s", pids);
  snprintf(ca, sizeof ca, "@%s", cids);
  snprintf(out, sizeof out, "%s/logits.f32", g_dir);
  const char *previous = "the previous content of the -o file\n";
  const char *argv[] = {"dgemma", "logits", "-m", SMALL, "-t", "1", "--prompt-ids", pa, "--canvas-ids", ca, "-o", out, NULL};
  /* bad inputs leave an existing -o file untouched: a wrong canvas length, an id past the vocabulary */
  f = fopen(out, "w");
  fputs(previous, f);
  fclose(f);
  const char *argv_bad[] = {"dgemma", "logits", "-m", SMALL, "-t", "1", "--prompt-ids", pa, "--canvas-ids", "1,2,3", "-o", out, NULL};
  int st = run_signalled(argv_bad, 0, 0, NULL);
  char *e = read_err();
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  assert_non_null(strstr(e, "--canvas-ids has 3 ids; the model's canvas_length is 64"));
  free(e);
  snprintf(bad, sizeof bad, "3,%d", info.vocab_size);
  const char *argv_bad2[] = {"dgemma", "logits", "-m", SMALL, "-t", "1", "--prompt-ids", bad, "--canvas-ids", ca, "-o", out, NULL};
  st = run_signalled(argv_bad2, 0, 0, NULL);
  e = read_err();
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  assert_non_null(strstr(e, "--prompt-ids id 4096 (index 1) is outside the vocabulary [0, 4096)"));
  free(e);
  /* a prompt one id too long for the canvas to fit under max_position_embeddings: refused before any prefill (issue
   * 16: the check came after a full prefill), the -o file untouched */
  const size_t nlong = (size_t)(info.max_position_embeddings - info.canvas_length + 1);
  char lids[620], la[640], want_msg[300];
  snprintf(lids, sizeof lids, "%s/prompt-long.i32", g_dir);
  f = fopen(lids, "wb");
  assert_non_null(f);
  for (size_t i = 0; i < nlong; i++) assert_int_equal(fwrite(&ids[i % 256], 4, 1, f), 1);
  fclose(f);
  snprintf(la, sizeof la, "@%s", lids);
  const char *argv_bad3[] = {"dgemma", "logits", "-m", SMALL, "-t", "1", "--prompt-ids", la, "--canvas-ids", ca, "-o", out, NULL};
  st = run_signalled(argv_bad3, 0, 0, NULL);
  e = read_err();
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 2);
  snprintf(want_msg, sizeof want_msg, "--prompt-ids has %zu ids: the canvas would take positions %zu..%d, past the model's "
           "max_position_embeddings %d", nlong, nlong, info.max_position_embeddings, info.max_position_embeddings);
  if (!strstr(e, want_msg)) fail_msg("expected \"%s\" in: %s", want_msg, e);
  free(e);
  remove(lids);
  char *now = dg_test_read_file(out, NULL);
  assert_string_equal(now, previous);
  free(now);
  assert_int_equal(count_tmp_entries(), 0);
  /* a complete run (duration T) */
  char ref[620];
  snprintf(ref, sizeof ref, "%s/logits-ref.f32", g_dir);
  argv[11] = ref;
  st = run_signalled(argv, SIGINT, -1, NULL);
  const double T = g_after_handler;
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_true(file_size(ref) == want);
  argv[11] = out;
  int interrupted = 0;
  /* runs 0-2 at once, one per signal (SIGINT, SIGTERM, SIGHUP: always interrupted); 3-5 at a random moment of a
   * whole run; 6-9 in its last tenth, around the rename of the temporary file (a signal just after it must not end
   * the command with 128 + sig over the new file: exit 128 + sig means the old file was kept) */
  for (int i = 0; i < 10; i++) {
    const int sig = (const int[]){SIGINT, SIGTERM, SIGHUP}[i % 3];
    const double u = (double)rand() / RAND_MAX;
    const long delay = i < 3 ? 0 : (long)((i < 6 ? u : 0.9 + 0.1 * u) * T * 1e6);
    f = fopen(out, "w");
    fputs(previous, f);
    fclose(f);
    int sent;
    st = run_signalled(argv, sig, delay, &sent);
    assert_true(WIFEXITED(st));
    const int code = WEXITSTATUS(st);
    printf("# logits run %d: %s after %.3f s of %.3f s -> exit %d\n", i, sig_name(sig), delay / 1e6, T, code);
    size_t len = 0;
    char *got = dg_test_read_file(out, &len);
    assert_non_null(got);
    if (i < 3 && code != 128 + sig) fail_msg("logits run %d: %s at once: exit %d, want %d", i, sig_name(sig), code, 128 + sig);
    if (code == 128 + sig) {
      interrupted++;
      assert_string_equal(got, previous); /* the old file, byte for byte */
    } else {
      if (code != 0) { e = read_err(); fail_msg("logits run %d: exit %d; stderr: %s", i, code, e); }
      assert_true((long long)len == want); /* the whole new file */
    }
    free(got);
    assert_int_equal(count_tmp_entries(), 0);
  }
  assert_true(interrupted >= 1);
}

/* ---- eval --summary ----------------------------------------------------------------- */

/* `eval gsm8k --summary FILE` interrupted by SIGINT/SIGTERM at random moments (seed printed): exit 128 +
 * sig with FILE byte for byte as before, or exit 0 with a whole new summary of every item; no
 * temporary file left, never killed by the signal (review finding: an interrupted run replaced the
 * file with the summary of the items done so far, "complete": false, and exited 130/143). */
static void test_eval_summary_interrupted(void **state) {
  (void)state;
  char summ[600], *e;
  snprintf(summ, sizeof summ, "%s/summary.json", g_dir);
  const char *previous = "{\"the previous summary\": true}\n";
  const char *argv[] = {"dgemma", "eval", "gsm8k", "-m", SMALL, "--data", "tests/fixtures/gsm8k", "-t", "1", "-n", "64",
                        "-s", "8", "--summary", summ, NULL};
  /* a complete run (duration T from the handler seen) */
  int st = run_signalled(argv, SIGINT, -1, NULL);
  const double T = g_after_handler;
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  char *full = dg_test_read_file(summ, NULL);
  assert_non_null(strstr(full, "\"items\":4,\"items_target\":4"));
  assert_non_null(strstr(full, "\"complete\":true"));
  free(full);
  int interrupted = 0;
  /* run 0 at once; 1-5 at a random moment of a whole run; 6-9 from 0.9 T to 1.1 T, around the summary's rename */
  for (int i = 0; i < 10; i++) {
    const int sig = i % 2 ? SIGTERM : SIGINT;
    const double u = (double)rand() / RAND_MAX;
    const long delay = i == 0 ? 0 : (long)((i < 6 ? u : 0.9 + 0.2 * u) * T * 1e6);
    write_file(summ, previous, strlen(previous));
    int sent;
    st = run_signalled(argv, sig, delay, &sent);
    if (!WIFEXITED(st)) fail_msg("eval run %d: killed by signal %d", i, WIFSIGNALED(st) ? WTERMSIG(st) : -1);
    const int code = WEXITSTATUS(st);
    printf("# eval --summary run %d: %s after %.3f s of %.3f s -> exit %d\n", i, sig == SIGINT ? "SIGINT" : "SIGTERM",
           delay / 1e6, T, code);
    char *got = dg_test_read_file(summ, NULL);
    assert_non_null(got);
    if (code == 128 + sig) {
      interrupted++;
      e = read_err();
      if (strcmp(got, previous) || !strstr(e, "not written (interrupted): a file there is kept as it was"))
        fail_msg("eval run %d: exit %d, summary \"%s\" (want the previous one), stderr: %s", i, code, got, e);
      free(e);
    } else {
      if (code != 0) { e = read_err(); fail_msg("eval run %d: exit %d; stderr: %s", i, code, e); }
      assert_non_null(strstr(got, "\"items\":4,\"items_target\":4")); /* the whole new summary */
      assert_non_null(strstr(got, "\"complete\":true"));
    }
    free(got);
    assert_int_equal(count_tmp_entries(), 0);
  }
  assert_true(interrupted >= 1);
}

/* ---- -o through a symlink, to a FIFO, to a device ------------------------------------ */

/* The atomic output (a temporary file renamed) must not replace what -o names when it is not a
 * plain file: a symlink keeps pointing at its file, which gets the whole output; a FIFO (and, when
 * this test runs as root, a character device made like /dev/null) stays what it is and is written
 * in place; a full device (like /dev/full) is a write error, exit 1. Before, each was replaced by a
 * regular file (as root, `-o /dev/null` would have replaced the system's /dev/null). */
static void test_output_targets(void **state) {
  (void)state;
  dg_model_info info;
  {
    dg_model *m = NULL;
    dg_model_params mp = dg_model_default_params();
    mp.no_tokenizer = 1;
    mp.n_threads = 1;
    assert_dg_ok(dg_model_load(SMALL, &mp, &m));
    dg_model_get_info(m, &info);
    dg_model_free(m);
  }
  const long long want = (long long)info.canvas_length * info.vocab_size * 4;
  char ca[4096] = "";
  for (int i = 0; i < info.canvas_length; i++)
    snprintf(ca + strlen(ca), sizeof ca - strlen(ca), "%s%d", i ? "," : "", 5 + i);
  char out[600], real[600], got[600];
  const char *argv[] = {"dgemma", "logits", "-m", SMALL, "-t", "1", "--prompt-ids", "2,3,4", "--canvas-ids", ca,
                        "-o", out, NULL};
  struct stat sb;
  /* a symlink (relative, as ln -s makes them) */
  snprintf(real, sizeof real, "%s/real.f32", g_dir);
  snprintf(out, sizeof out, "%s/link.f32", g_dir);
  FILE *f = fopen(real, "w");
  fputs("old\n", f);
  fclose(f);
  assert_int_equal(symlink("real.f32", out), 0);
  int st = run_signalled(argv, 0, 0, NULL);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(lstat(out, &sb), 0);
  if (!S_ISLNK(sb.st_mode)) fail_msg("-o through a symlink replaced the link with a regular file");
  assert_true(file_size(real) == want);
  assert_int_equal(count_tmp_entries(), 0);
  /* a FIFO, read by a child while dgemma writes */
  snprintf(out, sizeof out, "%s/fifo", g_dir);
  snprintf(got, sizeof got, "%s/fifo.got", g_dir);
  assert_int_equal(mkfifo(out, 0644), 0);
  fflush(stdout);
  pid_t reader = fork();
  assert_true(reader >= 0);
  if (reader == 0) {
    int in = open(out, O_RDONLY), o = open(got, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    char buf[65536];
    ssize_t k;
    while (in >= 0 && o >= 0 && (k = read(in, buf, sizeof buf)) > 0)
      if (write(o, buf, (size_t)k) != k) _exit(1);
    _exit(in >= 0 && o >= 0 ? 0 : 1);
  }
  st = run_signalled(argv, 0, 0, NULL);
  int fifo_kept = lstat(out, &sb) == 0 && S_ISFIFO(sb.st_mode);
  int rst = 0;
  if (!fifo_kept) kill(reader, SIGKILL); /* it waits on a FIFO nobody opens any more */
  assert_int_equal(waitpid(reader, &rst, 0), reader);
  if (!fifo_kept) fail_msg("-o on a FIFO replaced it with a regular file");
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_true(WIFEXITED(rst) && WEXITSTATUS(rst) == 0);
  assert_true(file_size(got) == want);
  assert_int_equal(count_tmp_entries(), 0);
  /* character devices: a null one and a full one (mknod needs root) */
  snprintf(out, sizeof out, "%s/null", g_dir);
  if (mknod(out, S_IFCHR | 0666, makedev(1, 3)) != 0) {
    printf("# -o on a device not tried: mknod: %s (not root)\n", strerror(errno));
    return;
  }
  st = run_signalled(argv, 0, 0, NULL);
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  assert_int_equal(lstat(out, &sb), 0);
  if (!S_ISCHR(sb.st_mode)) fail_msg("-o on a character device replaced it with a regular file");
  snprintf(out, sizeof out, "%s/full", g_dir);
  assert_int_equal(mknod(out, S_IFCHR | 0666, makedev(1, 7)), 0);
  st = run_signalled(argv, 0, 0, NULL);
  char *e = read_err();
  assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
  assert_non_null(strstr(e, "No space left on device"));
  free(e);
  assert_int_equal(lstat(out, &sb), 0);
  assert_true(S_ISCHR(sb.st_mode));
  assert_int_equal(count_tmp_entries(), 0);
}

/* An output directory given as a symbolic link to an empty directory (a models folder linked to a bigger
 * disk): quantize and mkrandom write into the directory the link names and the link stays a link, as -o
 * through a link replaces the file it names. Before, both did all their work and then failed to rename
 * their temporary directory over the link ("Not a directory"; review aud16). */
static void test_outdir_symlink(void **state) {
  (void)state;
  for (int w = 0; w < 2; w++) {
    char real[700], sub[600], link[600], shard[800];
    snprintf(sub, sizeof sub, "%s/disk-%d", g_dir, w);
    snprintf(real, sizeof real, "%s/out", sub);
    snprintf(link, sizeof link, "%s/linked-%d", g_dir, w);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(mkdir(real, 0755), 0);
    assert_int_equal(symlink(real, link), 0);
    char link_slash[700];
    snprintf(link_slash, sizeof link_slash, "%s%s", link, w ? "/" : ""); /* "DIR/" names DIR as well */
    const char *argv[12];
    writer_argv(w ? W_MKRANDOM : W_QUANTIZE, link_slash, argv);
    const int st = run_signalled(argv, 0, 0, NULL);
    char *e = read_err();
    printf("# %s into a symlink to an empty directory: exit %d\n", argv[1], WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) printf("# stderr: %s", e);
    free(e);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    struct stat sb;
    assert_int_equal(lstat(link, &sb), 0);
    assert_true(S_ISLNK(sb.st_mode));
    snprintf(shard, sizeof shard, "%s/model.safetensors", real);
    assert_true(file_size(shard) > 0);
    assert_true(n_entries(real) >= 2); /* config.json and the shard at least */
    assert_int_equal(n_entries(sub), 1);  /* no temporary sibling beside the real directory */
    assert_int_equal(count_tmp_entries(), 0);
  }
  /* a link to nothing: refused before any work (it did all of it, then failed to rename over the link) */
  char dang[600];
  snprintf(dang, sizeof dang, "%s/dangling", g_dir);
  assert_int_equal(symlink("/nonexistent/aud16/dir", dang), 0);
  const char *argv[12];
  writer_argv(W_MKRANDOM, dang, argv);
  const int st = run_signalled(argv, 0, 0, NULL);
  char *e = read_err();
  printf("# mkrandom into a dangling symlink: exit %d, %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1, e);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 1);
  assert_non_null(strstr(e, "a symbolic link to a directory that does not exist"));
  assert_null(strstr(e, "%")); /* refused before the first tensor's progress line */
  free(e);
  struct stat sb;
  assert_int_equal(lstat(dang, &sb), 0);
  assert_true(S_ISLNK(sb.st_mode));
  assert_int_equal(count_tmp_entries(), 0);
}

/* ---- the reader of a pipe gone (`| head -1`) ------------------------------------------ */

/* quantize and mkrandom print their progress while they write: once the reader is gone they end with status 141
 * (128 + SIGPIPE, what the shell reports for a process SIGPIPE killed) and leave nothing: no output directory, no
 * temporary sibling. Before, SIGPIPE's default action killed them at their next progress line with the temporary
 * directory left behind (review aud16; `bench -o F | head -1` left its temporary file the same way when a row
 * came before the file was complete: not tested here, bench --quick prints its rows at the end). */
static void test_reader_gone(void **state) {
  (void)state;
  char out[600];
  for (int w = 0; w < 2; w++) {
    const char *argv[12];
    snprintf(out, sizeof out, "%s/head-%d", g_dir, w);
    writer_argv(w ? W_MKRANDOM : W_QUANTIZE, out, argv);
    const int st = dg_test_run_reader_gone(g_exe, argv);
    printf("# %s 2>&1 | head -1: %s %d\n", argv[1], WIFEXITED(st) ? "exit" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 128 + SIGPIPE);
    assert_int_equal(n_entries(out), -1);
    assert_int_equal(count_tmp_entries(), 0);
  }
}

/* ---- write errors on stdout -------------------------------------------------------- */

static void test_stdout_full(void **state) {
  (void)state;
  if (access("/dev/full", W_OK) != 0) dg_test_skip("test_cli: /dev/full is not available");
  const char *cmds[] = {"run -m " SMALL " -t 1 -n 64 -s 2 -p hi", "tokenize -m " SMALL " hello"};
  for (int i = 0; i < 2; i++) {
    char cmd[2048], ef[512];
    snprintf(ef, sizeof ef, "%s/full.err", g_dir);
    snprintf(cmd, sizeof cmd, "%s %s >/dev/full 2>%s", g_exe, cmds[i], ef);
    int rc = system(cmd);
    char *e = dg_test_read_file(ef, NULL);
    printf("# dgemma %s > /dev/full: exit %d, %s", cmds[i], WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, e ? e : "(no stderr)\n");
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 1);
    assert_non_null(e);
    assert_non_null(strstr(e, "cannot write to standard output: No space left on device"));
    free(e);
  }
}

/* ---- a file past the size limit (ulimit -f) --------------------------------------------- */

/* Run dgemma with argv under RLIMIT_FSIZE = limit bytes and SIGXFSZ at its default action (as a shell with
 * `ulimit -f` starts it); stdout to out_path (NULL: g_dir/cli.out), stderr to g_dir/cli.err. Returns the
 * wait status. */
static int run_fsize_limited(const char *const *argv, rlim_t limit, const char *out_path) {
  fflush(stdout);
  char of[512], ef[512];
  snprintf(of, sizeof of, "%s/cli.out", g_dir);
  snprintf(ef, sizeof ef, "%s/cli.err", g_dir);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    if (!freopen(out_path ? out_path : of, "w", stdout) || !freopen(ef, "w", stderr)) _exit(126);
    signal(SIGXFSZ, SIG_DFL);
    struct rlimit rl = {limit, limit};
    if (setrlimit(RLIMIT_FSIZE, &rl) != 0) _exit(125);
    execv(g_exe, (char *const *)argv);
    _exit(127);
  }
  int status = 0;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  return status;
}

/* A write past RLIMIT_FSIZE is a write error like a full disk: exit 1, "File too large" on stderr,
 * nothing partial left (no output directory, the old -o file byte for byte, no temporary sibling). Before,
 * SIGXFSZ's default action killed the process (status 128 + 25) without a message, and quantize and
 * mkrandom left their temporary directory with a truncated shard (review aud16). */
static void test_file_size_limit(void **state) {
  (void)state;
  char out[600];
  for (int w = 0; w < 2; w++) { /* quantize (a 5.6 MB shard), mkrandom (3.7 MB) past a 64 KiB limit */
    const char *argv[12];
    snprintf(out, sizeof out, "%s/fsize-%d", g_dir, w);
    writer_argv(w ? W_MKRANDOM : W_QUANTIZE, out, argv);
    const int st = run_fsize_limited(argv, 64 << 10, NULL);
    char *e = read_err();
    printf("# %s past a 64 KiB file size limit: %s %d; %s", argv[1], WIFEXITED(st) ? "exit" : "signal",
           WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), strstr(e, "dgemma: ") ? strstr(e, "dgemma: ") : "\n");
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 1);
    assert_non_null(strstr(e, "File too large"));
    free(e);
    assert_int_equal(n_entries(out), -1);
    assert_int_equal(count_tmp_entries(), 0);
  }
  /* logits over an existing -o file: 64 canvas rows of the bundled model's logits past a 4 KiB limit */
  char ids[1024];
  int k = 0;
  for (int i = 0; i < 64; i++) k += snprintf(ids + k, sizeof ids - (size_t)k, "%s%d", i ? "," : "", 100 + i);
  snprintf(out, sizeof out, "%s/fsize-logits.bin", g_dir);
  write_file(out, "old", 3);
  const char *la[] = {"dgemma", "logits", "-m", SMALL, "-t", "1", "--prompt-ids", "2,105,2364", "--canvas-ids", ids,
                      "-o", out, NULL};
  int st = run_fsize_limited(la, 4 << 10, NULL);
  char *e = read_err();
  printf("# logits -o past a 4 KiB limit: %s %d; %s", WIFEXITED(st) ? "exit" : "signal",
         WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), e);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 1);
  assert_non_null(strstr(e, "File too large"));
  free(e);
  size_t n = 0;
  char *old = dg_test_read_file(out, &n);
  assert_non_null(old);
  assert_int_equal(n, 3);
  assert_memory_equal(old, "old", 3);
  free(old);
  assert_int_equal(count_tmp_entries(), 0);
  /* standard output to a file: tokenize's ids of "1 2 ... 3000" (about 55 KB) past a 4 KiB limit */
  char *text = malloc(20000);
  assert_non_null(text);
  k = 0;
  for (int i = 1; i <= 3000; i++) k += snprintf(text + k, 20000 - (size_t)k, "%d ", i);
  char so[600];
  snprintf(so, sizeof so, "%s/fsize-stdout.txt", g_dir);
  const char *ta[] = {"dgemma", "tokenize", "-m", SMALL, "-p", text, NULL};
  st = run_fsize_limited(ta, 4 << 10, so);
  free(text);
  e = read_err();
  printf("# tokenize > a file past a 4 KiB limit: %s %d; %s", WIFEXITED(st) ? "exit" : "signal",
         WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), e);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 1);
  assert_non_null(strstr(e, "cannot write to standard output: File too large"));
  free(e);
}

/* ---- the token count without stop ids ------------------------------------------- */

/* Tokens of ids[0..n) the detokenizer shows (each alone, special tokens dropped). */
static int count_shown(const dg_model *m, const int32_t *ids, int n) {
  int k = 0;
  for (int i = 0; i < n; i++) {
    char *t = NULL;
    assert_dg_ok(dg_detokenize(m, &ids[i], 1, 0, &t));
    k += t[0] != 0;
    dg_free(t);
  }
  return k;
}

static void test_eos_empty_count(void **state) {
  (void)state;
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  const char *q = "What is 7 times 8?";
  dg_chat_message msg = {"user", q};
  int32_t *ids = NULL;
  size_t n = 0;
  assert_dg_ok(dg_chat_apply(m, &msg, 1, 0, &ids, &n));
  dg_context_params cp = dg_context_default_params();
  cp.max_context = (int32_t)n + 192;
  dg_context *ctx = NULL;
  assert_dg_ok(dg_context_new(m, &cp, &ctx));
  dg_gen_params gp = dg_gen_default_params(m);
  assert_dg_ok(dg_gen_params_apply_json(&gp, "{\"eos_token_id\": [], \"max_new_tokens\": 192, \"max_denoising_steps\": 4}"));
  gp.proposal = DG_PROPOSAL_ARGMAX;
  dg_gen_result r;
  assert_dg_ok(dg_generate(ctx, ids, n, &gp, &r));
  const int shown = count_shown(m, r.tokens, r.n_valid);
  printf("# eos_token_id []: %d tokens emitted, %d shown, n_visible %d\n", r.n_valid, shown, r.n_visible);
  assert_int_equal(r.n_valid, 192); /* nothing stops it: every canvas is emitted */
  assert_int_equal(r.n_visible, shown);
  assert_true(r.n_visible < r.n_valid); /* the model writes hidden <eos> after its answer */
  const int want = r.n_visible;
  dg_gen_result_free(&r);
  /* with the stop ids: the text up to the stop id, and the stop id itself */
  gp = dg_gen_default_params(m);
  gp.max_new_tokens = 192;
  gp.max_denoising_steps = 4;
  gp.proposal = DG_PROPOSAL_ARGMAX;
  dg_context_reset(ctx);
  assert_dg_ok(dg_generate(ctx, ids, n, &gp, &r));
  const int shown2 = count_shown(m, r.tokens, r.n_valid);
  printf("# default stop ids: %d tokens up to the stop, %d shown, n_visible %d, finished %d\n", r.n_valid, shown2,
         r.n_visible, r.finished);
  assert_int_equal(r.n_visible, shown2 + (r.finished && !count_shown(m, &r.tokens[r.n_valid - 1], 1)));
  dg_gen_result_free(&r);
  dg_free(ids);
  dg_context_free(ctx);
  dg_model_free(m);
  /* the summary of `dgemma run` counts the same tokens */
  char args[512], *out = NULL, *err = NULL;
  snprintf(args, sizeof args,
           "run -m %s -t 1 -n 192 -s 4 --greedy --gen-kwargs '{\"eos_token_id\": []}' -p '%s'", SMALL, q);
  assert_int_equal(dg_test_run_cli(g_dir, args, &out, &err), 0);
  int tokens = -1, blocks = -1;
  const char *sum = strstr(err, "dgemma: ");
  assert_non_null(sum);
  assert_int_equal(sscanf(sum, "dgemma: %d tokens, %d blocks", &tokens, &blocks), 2);
  printf("# dgemma run summary: %d tokens, %d blocks\n", tokens, blocks);
  assert_int_equal(blocks, 3);
  assert_int_equal(tokens, want);
  free(out);
  free(err);
}

/* ---- the command line as users of llama.cpp and mlx-lm expect it (issue 15) ------------- */

/* s in single quotes for the shell */
static void shell_quote(const char *s, char *q, size_t cap) {
  size_t n = 0;
  q[n++] = '\'';
  for (; *s && n + 5 < cap; s++) {
    if (*s == '\'') { memcpy(q + n, "'\\''", 4); n += 4; }
    else q[n++] = *s;
  }
  q[n++] = '\'';
  q[n] = 0;
}

/* dgemma ARGS: exit status, stdout and stderr (malloc'd, "" if empty). */
static int cli(const char *args, char **out, char **err) {
  int rc = dg_test_run_cli(g_dir, args, out, err);
  if (out && !*out) *out = strdup("");
  if (!*err) *err = strdup("");
  return rc;
}

static int count_char(const char *s, char c) {
  int n = 0;
  for (; *s; s++) n += *s == c;
  return n;
}

static const char *const kCmds[] = {"run",  "chat",  "info",     "tokenize", "detokenize", "logits",
                                    "replay", "eval", "bench",    "quantize", "mkrandom",   "qreport"};

static void test_help(void **state) {
  (void)state;
  char args[256], *out, *err;
  /* the global help, three spellings: stdout, exit 0, every command listed */
  const char *global[] = {"--help", "-h", "help"};
  for (int i = 0; i < 3; i++) {
    assert_int_equal(cli(global[i], &out, &err), 0);
    assert_string_equal(err, "");
    assert_non_null(strstr(out, "usage: dgemma COMMAND"));
    for (size_t k = 0; k < sizeof kCmds / sizeof kCmds[0]; k++) {
      char line[64];
      snprintf(line, sizeof line, "\n  %s ", kCmds[k]);
      if (!strstr(out, line)) fail_msg("dgemma %s does not list %s:\n%s", global[i], kCmds[k], out);
    }
    assert_non_null(strstr(out, "DGEMMA_MODEL"));
    assert_non_null(strstr(out, "\n  DGEMMA_API_KEY    the key `dgemma serve` requires without --api-key"));
    assert_non_null(strstr(out, "\n  OMP_NUM_THREADS   the default of -t (more than the cores available is capped"));
    free(out);
    free(err);
  }
  /* each command's own help: stdout, exit 0, its usage line, shorter than the old shared 54 lines,
   * the same as `dgemma help CMD`, and different from every other command's */
  char *helps[sizeof kCmds / sizeof kCmds[0]];
  for (size_t k = 0; k < sizeof kCmds / sizeof kCmds[0]; k++) {
    snprintf(args, sizeof args, "%s --help", kCmds[k]);
    assert_int_equal(cli(args, &out, &err), 0);
    assert_string_equal(err, "");
    char want[64];
    snprintf(want, sizeof want, "usage: dgemma %s ", kCmds[k]);
    if (strncmp(out, want, strlen(want))) fail_msg("dgemma %s --help starts with: %.80s", kCmds[k], out);
    const int lines = count_char(out, '\n');
    printf("# dgemma %s --help: %d lines\n", kCmds[k], lines);
    assert_true(lines >= 6 && lines < 40);
    free(err);
    char *out2;
    snprintf(args, sizeof args, "help %s", kCmds[k]);
    assert_int_equal(cli(args, &out2, &err), 0);
    assert_string_equal(out2, out);
    free(out2);
    free(err);
    for (size_t j = 0; j < k; j++) assert_string_not_equal(helps[j], out);
    helps[k] = out;
  }
  /* what each help is about */
  assert_non_null(strstr(helps[0], "--temp T"));
  assert_non_null(strstr(helps[0], "T * t_min/t_max"));
  assert_non_null(strstr(helps[0], "--stop STRING"));
  assert_non_null(strstr(helps[0], "--json"));
  assert_non_null(strstr(helps[1], "/reset"));
  assert_null(strstr(helps[2], "--temp"));
  assert_non_null(strstr(helps[3], "--pieces"));
  /* the control tokens of this model's chat template (src/io/chat.c), not Gemma 3's <start_of_turn> */
  assert_non_null(strstr(helps[3], "<|turn>"));
  assert_null(strstr(helps[3], "<start_of_turn>"));
  assert_non_null(strstr(helps[0], "(default, and 0: the cores available;")); /* what -t 0 means */
  assert_non_null(strstr(helps[1], "capped there, with a warning")); /* chat -c above the model's positions */
  /* bench describes the vllm shape in canvases (the loaded model's), not only the 26B's 1024/1024 */
  assert_non_null(strstr(helps[8], "vllm: a prompt of 4 canvases, 4 canvases generated"));
  assert_non_null(strstr(helps[8], "--prompt-tokens P    vllm: prompt length"));
  assert_non_null(strstr(helps[9], "--recipe SPEC"));
  assert_null(strstr(helps[9], "--prompt"));
  for (size_t k = 0; k < sizeof kCmds / sizeof kCmds[0]; k++) free(helps[k]);
  /* serve parses its own options (tools/serve.c): its help the same way, before a model loads */
  assert_int_equal(cli("serve -m /nonexistent --help", &out, &err), 0);
  assert_string_equal(err, "");
  if (strncmp(out, "usage: dgemma serve ", 20)) fail_msg("dgemma serve --help: stdout \"%.80s\"", out);
  assert_non_null(strstr(out, "/v1/chat/completions"));
  /* with its defaults, as every other command's help */
  assert_non_null(strstr(out, "--port P             TCP port (default 8080;"));
  assert_non_null(strstr(out, "--max-batch N        canvases denoised together (default 4)"));
  assert_non_null(strstr(out, "--max-context N      prompt + generated canvases per request, in positions (default 16384)"));
  assert_non_null(strstr(out, "--timeout S          idle connection timeout in seconds (default 30;"));
  free(err);
  char *out2;
  assert_int_equal(cli("help serve", &out2, &err), 0);
  assert_string_equal(out2, out);
  assert_string_equal(err, "");
  free(out2);
  free(out);
  free(err);
  /* what the help names is what tokenize --special reads: <|turn> is one control id */
  assert_int_equal(cli("tokenize -m " SMALL " --special '<|turn>'", &out, &err), 0);
  printf("# tokenize --special '<|turn>': %s", out);
  assert_true(strlen(out) > 1 && !strchr(out, ','));
  free(out);
  free(err);
  /* --version anywhere, before anything is loaded (the model does not exist) */
  const char *ver[] = {"--version", "run -m /nonexistent -p hi --version", "info --version -m /nonexistent",
                       "quantize --version", "bench --protocol ceiling --version", "serve -m /nonexistent --version"};
  for (int i = 0; i < 6; i++) {
    assert_int_equal(cli(ver[i], &out, &err), 0);
    if (strcmp(out, "dgemma " DGEMMA_VERSION "\n")) fail_msg("dgemma %s: stdout \"%s\"", ver[i], out);
    assert_string_equal(err, "");
    free(out);
    free(err);
  }
}

/* Options of another command, unknown options and contradictions: exit 2 before any model is loaded
 * (-m names none that exists: loading would exit 1), one line on stderr naming the option and the help. */
static void test_rejected_options(void **state) {
  (void)state;
  static const char *cases[][2] = {
      {"run -m /nonexistent -p hi --bits 4 --recipe foo --limit 3 --reps 9",
       "dgemma run: --bits is not an option of run (it is one of quantize, mkrandom, qreport); see `dgemma run --help`"},
      {"info -m /nonexistent -p x --greedy", "dgemma info: -p is not an option of info (it is one of run, tokenize)"},
      {"info -m /nonexistent --greedy", "dgemma info: --greedy is not an option of info"},
      {"tokenize -m /nonexistent -t 2 hi", "dgemma tokenize: -t is not an option of tokenize"},
      {"quantize /nonexistent /tmp/x --prompt hi", "dgemma quantize: --prompt is not an option of quantize"},
      {"eval gsm8k -m /nonexistent --stop x", "dgemma eval: --stop is not an option of eval (it is one of run)"},
      {"run -m /nonexistent -p hi --frobnicate", "dgemma run: unknown option --frobnicate; see `dgemma run --help`"},
      {"run -m /nonexistent -p hi -n", "dgemma run: -n needs a value"},
      {"run -m /nonexistent -p hi --temp -1", "dgemma run: --temp expects a number in [0, 100], got \"-1\""},
      {"run -m /nonexistent -p hi --temp warm", "--temp expects a number"},
      {"run -m /nonexistent -p hi --stop ''", "--stop needs a non-empty string"},
      {"run -m /nonexistent --raw --system be brief -p hi", "--raw sends the prompt without the chat template"},
      {"run -m /nonexistent --raw --think -p hi", "--system and --think cannot apply"},
      {"bench -m /nonexistent --protocol vllm --gen-kwargs '{'", "--gen-kwargs is read by --protocol batch"},
      {"bench -m /nonexistent --protocol p512 --gen-kwargs '{\"seed\": 1}'", "--gen-kwargs is read by --protocol batch"},
      {"bench -m /nonexistent --protocol vllm --profile", "--profile times the CUDA backend's stages: add --device cuda"},
      {"bench -m /nonexistent --protocol batch --profile", "--profile times the CUDA backend's stages: add --device cuda"},
      {"frobnicate -m x", "dgemma: unknown command \"frobnicate\"; see `dgemma --help`"},
      {"serve -m /nonexistent --frobnicate", "dgemma serve: unknown option --frobnicate; see `dgemma serve --help`"},
      {"serve -m /nonexistent --port", "dgemma serve: --port needs a value; see `dgemma serve --help`"},
      /* the newcomer review of the CLI: numbers are plain decimal, the value named in one line */
      {"run -m /nonexistent -p hi --temp 0x10",
       "dgemma run: --temp expects a number in [0, 100], got \"0x10\"; see `dgemma run --help`"},
      {"run -m /nonexistent -p hi --temp inf", "--temp expects a number in [0, 100], got \"inf\""},
      {"run -m /nonexistent -p hi --temp 1.5x", "--temp expects a number in [0, 100], got \"1.5x\""},
      {"run -m /nonexistent -p hi -n 0x10", "dgemma run: -n expects an integer in [1, 16777216], got \"0x10\""},
      {"run -m /nonexistent -p hi -n ' 64'", "-n expects an integer in [1, 16777216], got \" 64\""},
      {"run -m /nonexistent -p hi -s 4k", "-s expects an integer in [1, 1048576], got \"4k\""},
      /* a newline in a quoted value is escaped: the message stays one line */
      {"run -m /nonexistent -p hi -n '4\n2'", "-n expects an integer in [1, 16777216], got \"4\\n2\"; see"},
      {"run -m /nonexistent -p hi '--fo\no'", "dgemma run: unknown option --fo\\no; see `dgemma run --help`"},
      {"run -m /nonexistent --device 'gpu\n'", "--device expects cpu, cuda or cuda:N, got \"gpu\\n\"; see `dgemma run --help`"},
      /* usage errors exit 2, whichever layer finds them */
      {"quantize /nonexistent /tmp/x --bits 5",
       "dgemma quantize: --bits expects 2, 3, 4, 6 or 8, got \"5\"; see `dgemma quantize --help`"},
      {"quantize /nonexistent /tmp/x --group-size 48", "--group-size expects 32, 64 or 128, got \"48\""},
      {"quantize /nonexistent /tmp/x --recipe experts=5", "dgemma quantize: --recipe: recipe \"experts=5\": experts=5: bits 5"},
      {"mkrandom /tmp/x --recipe foo --dry-run", "dgemma mkrandom: --recipe: recipe \"foo\""},
      /* empty prompts are refused (llama.cpp would generate from <bos> alone: --raw '<bos>' does that) */
      {"run -m /nonexistent -p ''", "dgemma run: the prompt is empty; for a generation from <bos> alone: --raw '<bos>'"},
      {"run -m /nonexistent < /dev/null", "the prompt is empty (nothing on standard input)"},
      {"run -m /nonexistent -f /dev/null", "the prompt is empty (the file holds no text)"},
      /* bench: --profile does not apply to the ceiling protocol, whatever the device; --prompt-tokens only to vllm */
      {"bench -m /nonexistent --protocol ceiling --profile",
       "dgemma bench: --profile splits the vllm, p512, batch and step rows into stages, not --protocol ceiling; see `dgemma bench --help`"},
      {"bench -m /nonexistent --protocol ceiling --profile --device cuda", "--profile splits the vllm, p512, batch and step rows"},
      {"bench -m /nonexistent --protocol p512 --prompt-tokens 64", "--prompt-tokens sets the prompt of --protocol vllm"},
      /* serve: every usage error ends with the help tail, and its numbers are decimal too */
      {"serve -m /nonexistent --port 0x10",
       "dgemma serve: --port expects an integer in [0, 65535], got \"0x10\"; see `dgemma serve --help`"},
      {"serve -m /nonexistent --device gpu",
       "dgemma serve: --device expects cpu, cuda or cuda:N, got \"gpu\"; see `dgemma serve --help`"},
      {"serve -m /nonexistent extra", "dgemma serve: unexpected argument \"extra\"; see `dgemma serve --help`"},
      /* --host: an IPv4 address, said before the model loads (review brk31: "localhost" or "::1" loaded the model,
       * then "cannot start on localhost:8080: invalid argument") */
      {"serve -m /nonexistent --host localhost",
       "dgemma serve: --host expects an IPv4 address (127.0.0.1: this machine only, 0.0.0.0: every interface), got "
       "\"localhost\"; see `dgemma serve --help`"},
      {"serve -m /nonexistent --host ::1", "dgemma serve: --host expects an IPv4 address"},
      /* the second newcomer review: the text given once (a repeated -p or -f is refused, not the last
       * kept), a "+" sign said, --opt=value read as --opt value (a flag takes none), id lists without
       * empty items */
      {"run -m /nonexistent -p a -p b",
       "dgemma run: -p given twice; give the text once: -p TEXT, -p -, -f FILE or an argument; see `dgemma run --help`"},
      {"run -m /nonexistent --prompt a --prompt b", "dgemma run: --prompt given twice; give the text once"},
      {"run -m /nonexistent -f /etc/hostname -f /etc/hostname", "dgemma run: -f given twice; give the text once"},
      {"tokenize -m /nonexistent -p a -p b", "dgemma tokenize: -p given twice; give the text once"},
      {"run -m /nonexistent -p hi -f /etc/hostname",
       "dgemma run: give the text once: -p TEXT, -p -, -f FILE or an argument, not both -p and -f; see `dgemma run --help`"},
      {"run -m /nonexistent -p hi there", "give the text once: -p TEXT, -p -, -f FILE or an argument, not both -p and an argument;"},
      {"run -m /nonexistent -p hi -f /etc/hostname there", "or an argument, not -p, -f and an argument; see"},
      {"run -m /nonexistent -p hi -n +5",
       "dgemma run: -n expects an integer in [1, 16777216], got \"+5\" (write it without the + sign); see `dgemma run --help`"},
      {"run -m /nonexistent -p hi --temp +1", "--temp expects a number in [0, 100], got \"+1\" (write it without the + sign)"},
      {"run -m /nonexistent -p hi --temp=-1", "dgemma run: --temp expects a number in [0, 100], got \"-1\"; see"},
      {"run -m /nonexistent -p hi --max-new-tokens=0x10", "--max-new-tokens expects an integer in [1, 16777216], got \"0x10\""},
      {"run -m /nonexistent -p hi --greedy=1", "dgemma run: --greedy takes no value (got \"--greedy=1\"); see `dgemma run --help`"},
      {"run -m /nonexistent -p hi --frob=1", "dgemma run: unknown option --frob; see"},
      {"info -m /nonexistent --bits=4", "dgemma info: --bits is not an option of info"},
      {"run -m /nonexistent --stop= -p hi", "--stop needs a non-empty string"},
      {"logits -m " SMALL " -t 1 --prompt-ids 1,,2 --canvas-ids 1 -o /dev/null",
       "dgemma logits: bad id list near \",2\" (decimal ids separated by one comma)"},
      {"logits -m " SMALL " -t 1 --prompt-ids 1,2, --canvas-ids 1 -o /dev/null", "bad id list: it ends with a comma"},
      {"logits -m " SMALL " -t 1 --prompt-ids +1 --canvas-ids 1 -o /dev/null", "bad id list near \"+1\""},
      {"serve -m /nonexistent --port=0x10", "dgemma serve: --port expects an integer in [0, 65535], got \"0x10\""},
      {"serve -m /nonexistent --port +80", "dgemma serve: --port expects an integer in [0, 65535], got \"+80\""},
      {"serve -m /nonexistent --quiet=1", "dgemma serve: --quiet takes no value, got \"--quiet=1\"; see `dgemma serve --help`"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out, *err;
    int rc = cli(cases[i][0], &out, &err);
    printf("# dgemma %s -> %d: %s", cases[i][0], rc, err);
    if (rc != 2 || !strstr(err, cases[i][1]) || count_char(err, '\n') != 1 || *out)
      fail_msg("dgemma %s: exit %d (want 2), stdout \"%s\", stderr \"%s\" (want one line with \"%s\")", cases[i][0], rc,
               out, err, cases[i][1]);
    free(out);
    free(err);
  }
}

/* Found trying the CLI as a new user (issue 16 item 7): usage errors in one line, exit 2, before a model
 * loads (-m /nonexistent: a load would fail with exit 1): a joined short option ("-n64") says how to
 * write it; `eval foo` names foo and the three evaluations (it loaded the model first and left gsm8k
 * out); `qreport --recipes` with an empty recipe ("", "mlx;") compared nothing and exited 0, and a bad
 * recipe was found only after the float model's runs; a directory given for a file. */
static void test_new_user_findings(void **state) {
  (void)state;
  static const char *cases[][2] = {
      {"run -m /nonexistent -n64 -p hi", "dgemma run: unknown option -n64 (write -n 64, with a space); see"},
      {"eval gsm8k -m /nonexistent -o/tmp/x", "dgemma eval: unknown option -o/tmp/x (write -o /tmp/x, with a space)"},
      {"run -m /nonexistent -vv -p hi", "dgemma run: unknown option -vv; see `dgemma run --help`"},
      {"eval foo -m /nonexistent", "dgemma eval: unknown evaluation \"foo\" (gsm8k, problems or text); see"},
      {"eval foo -m /nonexistent -f /nonexistent.jsonl", "dgemma eval: unknown evaluation \"foo\" (gsm8k, problems or text)"},
      {"qreport -m /nonexistent --recipes ''", "dgemma qreport: --recipes \"\": recipe 1 is empty"},
      {"qreport -m /nonexistent --recipes 'mlx;'", "dgemma qreport: --recipes \"mlx;\": recipe 2 is empty"},
      {"qreport -m /nonexistent --recipes 'mlx;;all=8'", "recipe 2 is empty (recipes are separated by one ';')"},
      {"qreport -m /nonexistent --recipes 'mlx;foo'",
       "dgemma qreport: --recipes: recipe \"foo\": \"foo\" is neither CLASS=SPEC nor a preset (mlx)"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out, *err;
    int rc = cli(cases[i][0], &out, &err);
    printf("# dgemma %s -> %d: %s", cases[i][0], rc, err);
    if (rc != 2 || !strstr(err, cases[i][1]) || count_char(err, '\n') != 1 || *out)
      fail_msg("dgemma %s: exit %d (want 2), stdout \"%s\", stderr \"%s\" (want one line with \"%s\")", cases[i][0], rc,
               out, err, cases[i][1]);
    free(out);
    free(err);
  }
  /* a directory where a file is wanted: `eval problems|text -f DIR` said "no problems to evaluate (empty
   * file)"; `eval gsm8k --summary DIR` failed only after the whole run (here: before the model loads) */
  char *dcases[3][2];
  assert_true(asprintf(&dcases[0][0], "eval gsm8k -m /nonexistent --data tests/fixtures/gsm8k --summary %s", g_dir) > 0);
  assert_true(asprintf(&dcases[0][1], "dgemma eval: cannot write %s: it is a directory", g_dir) > 0);
  assert_true(asprintf(&dcases[1][0], "eval problems -m %s -t 1 -f %s", SMALL, g_dir) > 0);
  assert_true(asprintf(&dcases[1][1], "dgemma eval: cannot read %s: it is a directory", g_dir) > 0);
  assert_true(asprintf(&dcases[2][0], "eval text -m %s -t 1 -f %s", SMALL, g_dir) > 0);
  assert_true(asprintf(&dcases[2][1], "dgemma eval: cannot read %s: it is a directory", g_dir) > 0);
  for (int i = 0; i < 3; i++) {
    char *out, *err;
    int rc = cli(dcases[i][0], &out, &err);
    printf("# dgemma %s -> %d: %s", dcases[i][0], rc, err);
    if (rc != 1 || !strstr(err, dcases[i][1]) || count_char(err, '\n') != 1)
      fail_msg("dgemma %s: exit %d (want 1), stderr \"%s\" (want one line with \"%s\")", dcases[i][0], rc, err,
               dcases[i][1]);
    free(out);
    free(err);
    free(dcases[i][0]);
    free(dcases[i][1]);
  }
  assert_int_equal(count_tmp_entries(), 0);
  /* a FIFO as --summary is opened once, after the run (a check opening it before would end the reader's input) */
  char fifo[600], got[600], args[4096], exe[1024], *out, *err;
  snprintf(fifo, sizeof fifo, "%s/summary.fifo", g_dir);
  snprintf(got, sizeof got, "%s/summary.got", g_dir);
  assert_int_equal(mkfifo(fifo, 0600), 0);
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 16);
  assert_true(n > 0);
  exe[n] = 0;
  *strrchr(exe, '/') = 0;
  snprintf(args, sizeof args, "--version >/dev/null; cat %s > %s & timeout 120 %s/../dgemma eval gsm8k -m %s -t 1 --data "
           "tests/fixtures/gsm8k --limit 1 -n 64 -s 1 --summary %s; s=$?; wait; exit $s", fifo, got, exe, SMALL, fifo);
  assert_int_equal(cli(args, &out, &err), 0);
  char *js = dg_test_read_file(got, NULL);
  assert_non_null(js);
  assert_non_null(strstr(js, "\"items\":1,\"items_target\":1"));
  free(js);
  free(out);
  free(err);
  unlink(fifo);
}

/* An empty --recipe (an unset shell variable) or an empty item in one (",,", a leading or trailing comma) is a
 * usage error naming it, before any file is read (session 26: the library skips empty items and takes "" for the
 * default, so quantize and mkrandom wrote a checkpoint with another recipe than the one meant; qreport's
 * --recipes already refused an empty recipe). */
static void test_recipe_empty_items(void **state) {
  (void)state;
  char outd[600], *cases[7][2], *out, *err;
  snprintf(outd, sizeof outd, "%s/recipe-out", g_dir);
  int n = 0;
  assert_true(asprintf(&cases[n][0], "quantize %s %s -t 1 --recipe ''", SMALL, outd) > 0);
  assert_true(asprintf(&cases[n++][1], "dgemma quantize: --recipe needs a recipe (CLASS=BITS, ...), got \"\"") > 0);
  assert_true(asprintf(&cases[n][0], "quantize %s %s -t 1 --recipe ' '", SMALL, outd) > 0);
  assert_true(asprintf(&cases[n++][1], "dgemma quantize: --recipe needs a recipe (CLASS=BITS, ...), got \" \"") > 0);
  assert_true(asprintf(&cases[n][0], "quantize %s %s -t 1 --recipe ,,", SMALL, outd) > 0);
  assert_true(asprintf(&cases[n++][1], "dgemma quantize: --recipe \",,\": item 1 is empty (items are separated by one ',')") > 0);
  assert_true(asprintf(&cases[n][0], "quantize %s %s -t 1 --recipe experts=3,,attn=8", SMALL, outd) > 0);
  assert_true(asprintf(&cases[n++][1], "dgemma quantize: --recipe \"experts=3,,attn=8\": item 2 is empty") > 0);
  assert_true(asprintf(&cases[n][0], "quantize %s %s -t 1 --recipe experts=3,", SMALL, outd) > 0);
  assert_true(asprintf(&cases[n++][1], "dgemma quantize: --recipe \"experts=3,\": item 2 is empty") > 0);
  assert_true(asprintf(&cases[n][0], "mkrandom %s --config small -t 1 --recipe ,experts=3", outd) > 0);
  assert_true(asprintf(&cases[n++][1], "dgemma mkrandom: --recipe \",experts=3\": item 1 is empty") > 0);
  assert_true(asprintf(&cases[n][0], "qreport -m /nonexistent --recipes 'mlx;experts=3,,sc=4'") > 0);
  assert_true(asprintf(&cases[n++][1], "dgemma qreport: --recipes: a recipe \"experts=3,,sc=4\": item 2 is empty") > 0);
  for (int i = 0; i < n; i++) {
    int rc = cli(cases[i][0], &out, &err);
    printf("# dgemma %s -> %d: %s", cases[i][0], rc, err);
    struct stat sb;
    const int made = stat(outd, &sb) == 0;
    if (made) dg_test_rm_dir(outd);
    if (rc != 2 || !strstr(err, cases[i][1]) || count_char(err, '\n') != 1 || *out || made)
      fail_msg("dgemma %s: exit %d (want 2), stdout \"%s\", stderr \"%s\" (want one line with \"%s\"), output %s", cases[i][0],
               rc, out, err, cases[i][1], made ? "written" : "not written");
    free(out);
    free(err);
    free(cases[i][0]);
    free(cases[i][1]);
  }
  /* white space around items stays allowed, as the library takes it */
  int rc = cli("quantize " SMALL " /nonexistent-dir/q -t 1 --recipe 'mlx, experts=3 '", &out, &err);
  printf("# --recipe 'mlx, experts=3 ' -> %d: %s", rc, err);
  assert_int_equal(rc, 1); /* past the recipe check: the output's directory does not exist */
  assert_null(strstr(err, "--recipe"));
  free(out);
  free(err);
}

/* A prompt or text that is not UTF-8 is refused naming where it came from (session 26: "dgemma: prompt: invalid
 * argument" and the library's "chat message 0 content: ..." named neither the file nor -p nor standard input). */
static void test_invalid_utf8_source(void **state) {
  (void)state;
  char in[600], *cases[5][2], *out, *err;
  snprintf(in, sizeof in, "%s/latin1.txt", g_dir);
  write_file(in, "caf\xe9 au lait\n", 13);
  assert_true(asprintf(&cases[0][0], "run -m %s -t 1 -n 64 -f %s", SMALL, in) > 0);
  assert_true(asprintf(&cases[0][1], "dgemma run: cannot tokenize the prompt from %s (chat message 0): invalid argument: "
                                     "chat message 0 content: invalid UTF-8 at byte offset 3 (byte 0xE9)", in) > 0);
  assert_true(asprintf(&cases[1][0], "run -m %s -t 1 -n 64 --system hi < %s", SMALL, in) > 0);
  assert_true(asprintf(&cases[1][1], "dgemma run: cannot tokenize the prompt from standard input (chat message 1; --system "
                                     "is message 0)") > 0);
  assert_true(asprintf(&cases[2][0], "run -m %s -t 1 -n 64 --raw -p \"$(cat %s)\"", SMALL, in) > 0);
  assert_true(asprintf(&cases[2][1], "dgemma run: cannot tokenize the prompt from -p: invalid argument: tokenizer encode: "
                                     "invalid UTF-8 at byte offset 3") > 0);
  assert_true(asprintf(&cases[3][0], "tokenize -m %s -f %s", SMALL, in) > 0);
  assert_true(asprintf(&cases[3][1], "dgemma tokenize: cannot tokenize the text from %s: invalid argument", in) > 0);
  assert_true(asprintf(&cases[4][0], "tokenize -m %s \"$(cat %s)\"", SMALL, in) > 0);
  assert_true(asprintf(&cases[4][1], "dgemma tokenize: cannot tokenize the text from the argument: invalid argument") > 0);
  for (int i = 0; i < 5; i++) {
    int rc = cli(cases[i][0], &out, &err);
    printf("# dgemma %s -> %d: %s", cases[i][0], rc, err);
    if (rc != 1 || !strstr(err, cases[i][1]) || count_char(err, '\n') != 1 || *out)
      fail_msg("dgemma %s: exit %d (want 1), stdout \"%s\", stderr \"%s\" (want one line with \"%s\")", cases[i][0], rc,
               out, err, cases[i][1]);
    free(out);
    free(err);
    free(cases[i][0]);
    free(cases[i][1]);
  }
  unlink(in);
}

/* Standard input or a file holding a NUL byte is refused as soon as the NUL is read, naming the source and the
 * offset (exit 1): `run < /dev/zero`, `run -f /dev/zero` and `tokenize -f /dev/urandom` had read until memory ran
 * out (the NUL was looked for only after the whole stream), and `detokenize` dropped the ids after a NUL. */
static void test_nul_streams(void **state) {
  (void)state;
  char exe[1024], ids[600], args[2048], *out, *err;
  dg_test_cli_exe(exe, sizeof exe);
  snprintf(ids, sizeof ids, "%s/nul-ids.txt", g_dir);
  write_file(ids, "5,6\0,7\n", 7);
  char *cases[4][2];
  assert_true(asprintf(&cases[0][0], "run -m %s -t 1 -n 64 < /dev/zero", SMALL) > 0);
  assert_true(asprintf(&cases[0][1], "dgemma run: standard input holds a NUL byte at offset 0 (text expected)") > 0);
  assert_true(asprintf(&cases[1][0], "run -m %s -t 1 -n 64 -f /dev/zero", SMALL) > 0);
  assert_true(asprintf(&cases[1][1], "dgemma run: /dev/zero holds a NUL byte at offset 0 (text expected)") > 0);
  assert_true(asprintf(&cases[2][0], "tokenize -m %s -f /dev/urandom", SMALL) > 0);
  assert_true(asprintf(&cases[2][1], "dgemma tokenize: /dev/urandom holds a NUL byte at offset") > 0);
  assert_true(asprintf(&cases[3][0], "detokenize -m %s < %s", SMALL, ids) > 0);
  assert_true(asprintf(&cases[3][1], "dgemma detokenize: standard input holds a NUL byte at offset 3 (text expected)") > 0);
  for (int i = 0; i < 4; i++) {
    /* timeout: an endless read (the defect) ends with 124 */
    snprintf(args, sizeof args, "--version >/dev/null; timeout 20 %s %s", exe, cases[i][0]);
    int rc = cli(args, &out, &err);
    printf("# dgemma %s -> %d: %s", cases[i][0], rc, err);
    if (rc != 1 || !strstr(err, cases[i][1]) || count_char(err, '\n') != 1 || *out)
      fail_msg("dgemma %s: exit %d (want 1), stdout \"%.100s\", stderr \"%s\" (want one line with \"%s\")", cases[i][0], rc,
               out, err, cases[i][1]);
    free(out);
    free(err);
    free(cases[i][0]);
    free(cases[i][1]);
  }
  unlink(ids);
}

/* serve's options that name something must not be empty (a shell variable that was not set): exit 2, one line,
 * before the model loads or a socket opens (session 26: `--api-key ''` started a server without authentication,
 * -m '' looked for "/config.json", --host '' failed as "invalid argument", --model-id '' served the name ""). */
static void test_serve_empty_values(void **state) {
  (void)state;
  static const char *cases[][2] = {
      {"--api-key ''", "dgemma serve: --api-key needs a key (leave --api-key out for none), got an empty string"},
      {"--api-key=", "dgemma serve: --api-key needs a key"},
      {"-m ''", "dgemma serve: -m needs a model directory, got an empty string"},
      {"--host ''", "dgemma serve: --host needs an address, got an empty string"},
      {"--model-id ''", "dgemma serve: --model-id needs a name, got an empty string"},
  };
  char exe[1024], args[2048], *out, *err;
  dg_test_cli_exe(exe, sizeof exe);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    /* timeout: a server that started (the defect) is stopped, exit 124 */
    snprintf(args, sizeof args, "--version >/dev/null; timeout 20 %s serve -t 1 --port 0 %s", exe, cases[i][0]);
    int rc = cli(args, &out, &err);
    printf("# dgemma serve %s -> %d: %s", cases[i][0], rc, err);
    if (rc != 2 || !strstr(err, cases[i][1]) || count_char(err, '\n') != 1 || *out)
      fail_msg("dgemma serve %s: exit %d (want 2), stdout \"%s\", stderr \"%s\" (want one line with \"%s\")", cases[i][0],
               rc, out, err, cases[i][1]);
    free(out);
    free(err);
  }
}

/* logits --sc-logits holding a NaN or an infinity: refused naming the file, the value and its [row, id] (exit 2, as
 * the file's other checks), no output file (session 26: all-NaN logits were written, exit 0). */
static void test_sc_logits_nonfinite(void **state) {
  (void)state;
  char canvas[64 * 2 + 1] = "", sc[600], outf[600], args[4096];
  for (int k = 0; k < 64; k++) strcat(canvas, k ? ",4" : "4");
  snprintf(sc, sizeof sc, "%s/sc-nonfinite.f32", g_dir);
  snprintf(outf, sizeof outf, "%s/sc-nonfinite-out.f32", g_dir);
  const size_t CV = (size_t)64 * 4096; /* [canvas_length, vocab] of the bundled model */
  float *z = calloc(CV, sizeof(float));
  assert_non_null(z);
  const float bad[3] = {NAN, INFINITY, -INFINITY};
  for (int k = 0; k < 3; k++) {
    z[(size_t)3 * 4096 + 100] = bad[k];
    write_file(sc, (const char *)z, CV * sizeof(float));
    snprintf(args, sizeof args, "logits -m %s -t 1 --prompt-ids 2,105 --canvas-ids %s --sc-logits %s -o %s", SMALL, canvas,
             sc, outf);
    char *out, *err;
    int rc = cli(args, &out, &err);
    printf("# --sc-logits with %g at [3, 100] -> %d: %s", (double)bad[k], rc, err);
    struct stat sb;
    assert_int_equal(rc, 2);
    assert_non_null(strstr(err, "is not finite"));
    assert_non_null(strstr(err, "at [3, 100]"));
    assert_non_null(strstr(err, sc));
    assert_int_equal(count_char(err, '\n'), 1);
    assert_int_equal(stat(outf, &sb), -1);
    free(out);
    free(err);
  }
  free(z);
  unlink(sc);
}

/* --temp so small that logits / T overflow fp32 (1e-38: t_min 5e-39, a denormal): a usage error naming --temp,
 * before the prefill, for both samplers (session 26: the reference sampler failed after the prefill with
 * "non-finite logits", the turbo engine printed a canvas of noise and exit 0); 1e-30 still generates. */
static void test_tiny_temperature(void **state) {
  (void)state;
  static const char *cases[][2] = {
      {"run -m " SMALL " -t 1 -n 64 -p hi --temp 1e-38", "dgemma run: --temp 1e-38: invalid argument: t_min = "},
      {"run -m " SMALL " -t 1 -n 64 -p hi --temp 1e-38 --gen-kwargs '{\"diffusion_turbo\": true}'",
       "dgemma run: --gen-kwargs with --temp 1e-38: invalid argument: t_min = "},
      {"run -m " SMALL " -t 1 -n 64 -p hi --gen-kwargs '{\"t_min\": 1e-40, \"t_max\": 0.5}'",
       "dgemma run: --gen-kwargs: invalid argument: t_min = "},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    char *out, *err;
    int rc = cli(cases[i][0], &out, &err);
    printf("# dgemma %s -> %d: %s", cases[i][0], rc, err);
    if (rc != 2 || !strstr(err, cases[i][1]) || !strstr(err, "is too small") || count_char(err, '\n') != 1 || *out)
      fail_msg("dgemma %s: exit %d (want 2), stdout \"%s\", stderr \"%s\" (want one line with \"%s\")", cases[i][0], rc,
               out, err, cases[i][1]);
    free(out);
    free(err);
  }
  char *out, *err;
  assert_int_equal(cli("run -m " SMALL " -t 1 -n 64 -p hi --temp 1e-30", &out, &err), 0);
  assert_non_null(strstr(err, "finish reason"));
  free(out);
  free(err);
}

/* "-o -" (session 26, issue nb26): logits writes the logits to standard output, byte for byte what -o FILE
 * writes, and no file named "-" appears in the working directory (one did: out_open took "-" as a file name);
 * a terminal as standard output is refused (binary float32). bench -o -, eval -o - and eval --summary - are
 * refused in one line (exit 2, before a model loads): their tables go to standard output, and eval reads its -o
 * file back to resume; they too had written a file named "-". */
static void test_dash_output(void **state) {
  (void)state;
  char canvas[64 * 2 + 1] = "", args[4096], exe[1024], model[1024], file[600], piped[600], dash[600];
  for (int k = 0; k < 64; k++) strcat(canvas, k ? ",4" : "4");
  dg_test_cli_exe(exe, sizeof exe);
  assert_non_null(realpath(SMALL, model));
  snprintf(file, sizeof file, "%s/dash-file.f32", g_dir);
  snprintf(piped, sizeof piped, "%s/dash-stdout.f32", g_dir);
  snprintf(dash, sizeof dash, "%s/-", g_dir);
  char *out, *err;
  snprintf(args, sizeof args, "logits -m %s -t 1 --prompt-ids 2,105 --canvas-ids %s -o %s", model, canvas, file);
  assert_int_equal(cli(args, &out, &err), 0);
  free(out);
  free(err);
  /* in g_dir, so that a file named "-" would land there */
  snprintf(args, sizeof args, "--version >/dev/null; (cd %s && %s logits -m %s -t 1 --prompt-ids 2,105 --canvas-ids %s -o - > %s)",
           g_dir, exe, model, canvas, piped);
  int rc = cli(args, &out, &err);
  printf("# logits -o - > FILE -> %d: %s", rc, err);
  struct stat sb;
  const int made_dash = stat(dash, &sb) == 0;
  unlink(dash);
  assert_int_equal(rc, 0);
  assert_false(made_dash);
  assert_non_null(strstr(err, "logits to standard output"));
  size_t n_file = 0, n_piped = 0;
  char *a = dg_test_read_file(file, &n_file), *b = dg_test_read_file(piped, &n_piped);
  assert_non_null(a);
  assert_non_null(b);
  assert_int_equal(n_file, (size_t)64 * 4096 * sizeof(float)); /* [canvas_length, vocab] of the bundled model */
  assert_int_equal(n_piped, n_file);
  assert_memory_equal(a, b, n_file);
  free(a);
  free(b);
  free(out);
  free(err);
  unlink(file);
  unlink(piped);
  static const char *cases[][2] = {
      {"bench -m /nonexistent -o -", "dgemma bench: -o -: standard output holds the benchmark's table; give a file name"},
      {"eval gsm8k -m /nonexistent -o -", "dgemma eval: -o -: standard output holds the evaluation's table"},
      {"eval gsm8k -m /nonexistent --out=-", "dgemma eval: --out -: standard output holds the evaluation's table"},
      {"eval gsm8k -m /nonexistent --summary -", "dgemma eval: --summary -: standard output holds the evaluation's table"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(args, sizeof args, "--version >/dev/null; cd %s && %s %s", g_dir, exe, cases[i][0]);
    rc = cli(args, &out, &err);
    printf("# dgemma %s -> %d: %s", cases[i][0], rc, err);
    const int made = stat(dash, &sb) == 0;
    unlink(dash);
    if (rc != 2 || !strstr(err, cases[i][1]) || count_char(err, '\n') != 1 || *out || made)
      fail_msg("dgemma %s: exit %d (want 2), stdout \"%s\", stderr \"%s\" (want one line with \"%s\"), a file \"-\" %s",
               cases[i][0], rc, out, err, cases[i][1], made ? "made" : "not made");
    free(out);
    free(err);
  }
  /* standard output full: exit 1, the message names it */
  snprintf(args, sizeof args, "--version >/dev/null; (%s logits -m %s -t 1 --prompt-ids 2,105 --canvas-ids %s -o - > /dev/full)",
           exe, model, canvas);
  rc = cli(args, &out, &err);
  printf("# logits -o - > /dev/full -> %d: %s", rc, err);
  assert_int_equal(rc, 1);
  assert_non_null(strstr(err, "dgemma: cannot write standard output (-o -): No space left on device"));
  free(out);
  free(err);
  /* a terminal as standard output: refused before the model loads */
  int master = -1;
  pid_t pid = forkpty(&master, NULL, NULL, NULL);
  assert_true(pid >= 0);
  if (pid == 0) {
    execl(exe, "dgemma", "logits", "-m", "/nonexistent", "--prompt-ids", "2", "--canvas-ids", "4", "-o", "-", (char *)NULL);
    _exit(127);
  }
  char tty[4096];
  size_t nt = 0;
  for (;;) {
    ssize_t k = read(master, tty + nt, sizeof tty - 1 - nt);
    if (k <= 0) break;
    nt += (size_t)k;
  }
  tty[nt] = 0;
  int st;
  waitpid(pid, &st, 0);
  close(master);
  printf("# logits -o - on a terminal -> %d: %s", WIFEXITED(st) ? WEXITSTATUS(st) : -1, tty);
  assert_true(WIFEXITED(st));
  assert_int_equal(WEXITSTATUS(st), 2);
  assert_non_null(strstr(tty, "dgemma logits: -o -: standard output is a terminal"));
}

/* An empty file, directory or id list ("-o ''", a shell variable that was not set) is a usage error
 * naming the option: exit 2, one line, nothing on stdout, before a model loads where the model is not
 * needed to tell (review finding: `logits -o ''` said ": names a directory, not a file", `--prompt-ids ""`
 * wrote logits of an empty prompt, `eval --summary ''` failed only after the whole run). */
static void test_empty_values(void **state) {
  (void)state;
  char empty[512], canvas[64 * 2 + 1] = "", *cases[24][2];
  snprintf(empty, sizeof empty, "%s/empty.i32", g_dir);
  write_file(empty, "", 0);
  for (int k = 0; k < 64; k++) strcat(canvas, k ? ",4" : "4");
  int n = 0;
#define CASE(...) assert_true(asprintf(&cases[n++][0], __VA_ARGS__) > 0)
#define WANT(...) assert_true(asprintf(&cases[n - 1][1], __VA_ARGS__) > 0)
  CASE("logits -m %s -t 1 --prompt-ids 2,3 --canvas-ids %s -o ''", SMALL, canvas);
  WANT("dgemma logits: -o needs a file name, got an empty string; see `dgemma logits --help`");
  CASE("logits -m %s -t 1 --prompt-ids 2,3 --canvas-ids %s --out=", SMALL, canvas);
  WANT("dgemma logits: --out needs a file name, got an empty string");
  CASE("logits -m %s -t 1 --prompt-ids '' --canvas-ids %s -o %s/l.bin", SMALL, canvas, g_dir);
  WANT("dgemma logits: --prompt-ids needs at least one id (LIST or @FILE), got an empty string");
  CASE("logits -m %s -t 1 --prompt-ids @%s --canvas-ids %s -o %s/l.bin", SMALL, empty, canvas, g_dir);
  WANT("dgemma logits: --prompt-ids @%s holds no ids", empty);
  CASE("logits -m %s -t 1 --prompt-ids ' ' --canvas-ids %s -o %s/l.bin", SMALL, canvas, g_dir);
  WANT("dgemma logits: --prompt-ids \" \" holds no ids (the encoder needs at least one)");
  CASE("logits -m %s -t 1 --prompt-ids @ --canvas-ids %s -o %s/l.bin", SMALL, canvas, g_dir);
  WANT("dgemma logits: an @FILE id list needs a file name after the @");
  CASE("logits -m %s -t 1 --prompt-ids 2 --canvas-ids '' -o %s/l.bin", SMALL, g_dir);
  WANT("dgemma logits: --canvas-ids needs the canvas ids (LIST or @FILE), got an empty string");
  CASE("replay -m %s -t 1 --prompt-ids '' --canvases %s", SMALL, empty);
  WANT("dgemma replay: --prompt-ids needs at least one id");
  CASE("replay -m %s -t 1 --prompt-ids @%s --canvases %s", SMALL, empty, empty);
  WANT("dgemma replay: --prompt-ids @%s holds no ids", empty);
  /* a file without end (issue 16, session 25's review): refused at the option's limit, not read until the OOM killer */
  CASE("replay -m %s -t 1 --prompt-ids @/dev/zero --canvases %s", SMALL, empty);
  WANT("dgemma: /dev/zero holds more than 67108864 bytes, the most an @FILE id list reads");
  CASE("logits -m %s -t 1 --prompt-ids 2,3 --canvas-ids %s --sc-logits /dev/zero -o %s/l.bin", SMALL, canvas, g_dir);
  WANT("bytes, the most --sc-logits (float32 [canvas, vocab]) reads");
  CASE("replay -m %s -t 1 --prompt-ids 2 --canvases /dev/zero", SMALL);
  WANT("dgemma: /dev/zero holds more than 268435456 bytes, the most --canvases reads");
  CASE("replay -m %s -t 1 --prompt-ids 2 --canvases %s --uniforms /dev/zero", SMALL, empty);
  WANT("dgemma: /dev/zero holds more than 268435456 bytes, the most --uniforms reads");
  CASE("eval gsm8k -m %s -o ''", SMALL);
  WANT("dgemma eval: -o needs a file name, got an empty string");
  CASE("eval gsm8k -m %s --summary ''", SMALL);
  WANT("dgemma eval: --summary needs a file name, got an empty string");
  CASE("eval gsm8k -m %s --data ''", SMALL);
  WANT("dgemma eval: --data needs a directory, got an empty string");
  CASE("eval problems -m %s -f ''", SMALL);
  WANT("dgemma eval: -f needs a file name, got an empty string");
  CASE("bench -m %s -o ''", SMALL);
  WANT("dgemma bench: -o needs a file name, got an empty string");
  CASE("run -m '' -p hi");
  WANT("dgemma run: -m needs a model directory, got an empty string");
  CASE("run -m %s -f ''", SMALL);
  WANT("dgemma run: -f needs a file name, got an empty string");
  CASE("quantize %s ''", SMALL);
  WANT("dgemma quantize: OUT_DIR is an empty string");
  CASE("quantize '' %s/q", g_dir);
  WANT("dgemma quantize: IN_DIR is an empty string");
  CASE("mkrandom ''");
  WANT("dgemma mkrandom: OUT_DIR is an empty string");
#undef CASE
#undef WANT
  for (int i = 0; i < n; i++) {
    char *out, *err;
    const double t0 = now_s();
    int rc = cli(cases[i][0], &out, &err);
    printf("# dgemma %.80s... -> %d (%.2f s): %s", cases[i][0], rc, now_s() - t0, err);
    if (rc != 2 || !strstr(err, cases[i][1]) || count_char(err, '\n') != 1 || *out)
      fail_msg("dgemma %s: exit %d (want 2), stdout \"%s\", stderr \"%s\" (want one line with \"%s\")", cases[i][0], rc,
               out, err, cases[i][1]);
    free(out);
    free(err);
    free(cases[i][0]);
    free(cases[i][1]);
  }
  struct stat sb;
  assert_int_equal(stat(g_dir, &sb), 0);
  char l[600];
  snprintf(l, sizeof l, "%s/l.bin", g_dir);
  assert_int_equal(access(l, F_OK), -1); /* nothing was written */
}

/* A --gen-kwargs that does not apply is a usage error in every command that reads it: exit 2, one
 * line naming the option and the field (the model loads first: the defaults are the checkpoint's). */
static void test_gen_kwargs_exit(void **state) {
  (void)state;
  static const char *cmds[] = {"run -p hi", "chat", "replay --prompt-ids 2 --canvases /nonexistent",
                               "eval problems --file /nonexistent.jsonl", "bench --protocol batch", "serve --port 0"};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
    char args[2048], exe[1024], *out, *err;
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 16);
    assert_true(k > 0);
    exe[k] = 0;
    *strrchr(exe, '/') = 0;
    /* under timeout(1): a serve that took the kwargs would not end by itself */
    snprintf(args, sizeof args, "--version >/dev/null; timeout 120 %s/../dgemma %s -m %s --gen-kwargs '{\"no_such_key\": 1}' "
             "< /dev/null", exe, cmds[i], SMALL);
    int rc = cli(args, &out, &err);
    printf("# dgemma %s -> %d: %s", args, rc, err);
    char want[64];
    snprintf(want, sizeof want, "dgemma %.*s: --gen-kwargs: ", (int)strcspn(cmds[i], " "), cmds[i]);
    if (rc != 2 || strncmp(err, want, strlen(want)) || !strstr(err, "no_such_key") || count_char(err, '\n') != 1)
      fail_msg("dgemma %s: exit %d (want 2), stderr \"%s\" (want one line \"%s...no_such_key...\")", args, rc, err, want);
    free(out);
    free(err);
  }
}

/* A --gen-kwargs value the model refuses (a stop id or pad id outside its vocabulary) is a usage error
 * quoting it, before a prefill: exit 2 and one line (review finding: exit 1 with a two-line
 * "generate: invalid argument" after the prompt was encoded). dg_gen_params_check is the library's. */
static void test_gen_kwargs_vocab(void **state) {
  (void)state;
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  dg_gen_params gp = dg_gen_default_params(m);
  assert_dg_ok(dg_gen_params_check(m, &gp));
  assert_dg_ok(dg_gen_params_apply_json(&gp, "{\"eos_token_id\": [1, 4096]}")); /* no model there: a valid id */
  assert_int_equal(dg_gen_params_check(m, &gp), DG_ERR_INVALID_ARG);
  assert_non_null(strstr(dg_last_error(), "stop id (eos_token_id) 4096 is outside the vocabulary [0, 4096)"));
  gp = dg_gen_default_params(m);
  gp.pad_id = 5000;
  assert_int_equal(dg_gen_params_check(m, &gp), DG_ERR_INVALID_ARG);
  assert_non_null(strstr(dg_last_error(), "pad_token_id 5000 is outside the vocabulary [0, 4096)"));
  dg_model_free(m);
  static const char *cmds[] = {"run -p hi", "replay --prompt-ids 2 --canvases /nonexistent",
                               "eval problems --file /nonexistent.jsonl", "bench --protocol batch", "serve --port 0"};
  char exe[1024];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 16);
  assert_true(n > 0);
  exe[n] = 0;
  *strrchr(exe, '/') = 0;
  static const char *kw[][2] = {{"{\"eos_token_id\": [99999]}", "stop id (eos_token_id) 99999 is outside the vocabulary"},
                                {"{\"pad_token_id\": 4096}", "pad_token_id 4096 is outside the vocabulary [0, 4096)"}};
  for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
    for (size_t k = 0; k < 2; k++) {
      char args[2048], *out, *err;
      /* under timeout(1): a serve that took the kwargs would not end by itself */
      snprintf(args, sizeof args, "--version >/dev/null; timeout 120 %s/../dgemma %s -m %s -t 1 --gen-kwargs '%s' < /dev/null",
               exe, cmds[i], SMALL, kw[k][0]);
      int rc = cli(args, &out, &err);
      printf("# dgemma %s -> %d: %s", args, rc, err);
      char want[64];
      snprintf(want, sizeof want, "dgemma %.*s: --gen-kwargs: ", (int)strcspn(cmds[i], " "), cmds[i]);
      if (rc != 2 || strncmp(err, want, strlen(want)) || !strstr(err, kw[k][1]) || count_char(err, '\n') != 1 || *out)
        fail_msg("dgemma %s: exit %d (want 2), stderr \"%s\" (want one line \"%s...%s\")", args, rc, err, want, kw[k][1]);
      free(out);
      free(err);
    }
}

#define RUN_FAST "run -m " SMALL " -t 1 -n 64 -s 4 --greedy"
static const char kQuestion[] = "Sam has 23 apples. He buys 14 more apples. How many apples does Sam have now?";

static void write_file(const char *path, const char *text, size_t len) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(text, 1, len, f), len);
  assert_int_equal(fclose(f), 0);
}

/* -p TEXT, -f FILE, -p - and a pipe give the same answer; a 1 MB prompt arrives whole through stdin. */
static void test_prompt_sources(void **state) {
  (void)state;
  char args[2048], path[512], *ref, *out, *err;
  snprintf(args, sizeof args, RUN_FAST " -p '%s'", kQuestion);
  assert_int_equal(cli(args, &ref, &err), 0);
  printf("# -p: %s", ref);
  assert_true(strlen(ref) > 1);
  free(err);
  snprintf(path, sizeof path, "%s/prompt.txt", g_dir);
  char text[256];
  snprintf(text, sizeof text, "%s\n", kQuestion); /* the trailing newline of a file is dropped */
  write_file(path, text, strlen(text));
  const char *fmt[] = {RUN_FAST " -f %s", RUN_FAST " -p - < %s", RUN_FAST " < %s"};
  for (int i = 0; i < 4; i++) {
    if (i < 3) snprintf(args, sizeof args, fmt[i], path);
    else { /* a pipe: `cat FILE | dgemma run ...` (the shell runs the dgemma of dg_test_run_cli first, harmlessly) */
      char exe[1024];
      ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 16);
      exe[k] = 0;
      *strrchr(exe, '/') = 0;
      snprintf(args, sizeof args, "--version >/dev/null; cat %s | %s/../dgemma " RUN_FAST, path, exe);
    }
    assert_int_equal(cli(args, &out, &err), 0);
    if (strcmp(out, ref)) fail_msg("%s: \"%s\", with -p: \"%s\"; stderr %s", args, out, ref, err);
    free(out);
    free(err);
  }
  free(ref);
  /* tokenize: -f keeps the file as it is, so its ids are those of the text with its newline */
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  int32_t *ids;
  size_t n;
  assert_dg_ok(dg_tokenize(m, text, strlen(text), 0, &ids, &n));
  char want[4096] = "";
  for (size_t i = 0; i < n; i++) snprintf(want + strlen(want), sizeof want - strlen(want), "%s%d", i ? "," : "", ids[i]);
  strcat(want, "\n");
  dg_free(ids);
  snprintf(args, sizeof args, "tokenize -m %s -f %s", SMALL, path);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_string_equal(out, want);
  free(out);
  free(err);
  /* 1 MB through stdin: every byte is read (the token count in the message is that of the whole text),
   * and a prompt past the model's positions is refused before any prefill */
  const size_t big = 1 << 20;
  char *btext = malloc(big + 1);
  for (size_t i = 0; i < big; i++) btext[i] = "Sam has 23 apples and buys 14 more. "[i % 36];
  btext[big] = 0;
  snprintf(path, sizeof path, "%s/big.txt", g_dir);
  write_file(path, btext, big);
  dg_chat_message msg = {"user", btext};
  assert_dg_ok(dg_chat_apply(m, &msg, 1, 0, &ids, &n));
  dg_free(ids);
  dg_model_info info;
  dg_model_get_info(m, &info);
  snprintf(args, sizeof args, "run -m %s -t 1 -p - < %s", SMALL, path);
  assert_int_equal(cli(args, &out, &err), 2);
  printf("# 1 MB prompt on stdin: %s", err);
  char expect[256];
  snprintf(expect, sizeof expect, "the prompt has %zu tokens", n);
  assert_non_null(strstr(err, expect));
  snprintf(expect, sizeof expect, "past the model's max_position_embeddings %d", info.max_position_embeddings);
  assert_non_null(strstr(err, expect));
  assert_true(n > (size_t)info.max_position_embeddings);
  free(out);
  free(err);
  /* and the same megabyte through tokenize's stdin: the ids of the whole text */
  size_t nt;
  assert_dg_ok(dg_tokenize(m, btext, big, 0, &ids, &nt));
  snprintf(args, sizeof args, "tokenize -m %s < %s", SMALL, path);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_int_equal(count_char(out, ',') + 1, (int)nt);
  dg_free(ids);
  free(out);
  free(err);
  free(btext);
  /* a NUL byte and an empty prompt are refused clearly */
  snprintf(path, sizeof path, "%s/nul.txt", g_dir);
  write_file(path, "ab\0cd", 5);
  snprintf(args, sizeof args, "run -m %s -f %s", SMALL, path);
  assert_int_equal(cli(args, &out, &err), 1);
  assert_non_null(strstr(err, "holds a NUL byte at offset 2"));
  free(out);
  free(err);
  /* text that never ends (yes(1) on stdin, -f /dev/stdin): refused past 256 MiB (exit 2), before the model loads;
   * it had grown the buffer until the OOM killer ended the process. Under a 1.5 GiB address space limit (not with
   * ASan, whose shadow needs terabytes of it), so that the old behaviour fails fast ("out of memory", exit 1). */
  const char *endless[] = {"run -t 1", "tokenize", "run -t 1 -f /dev/stdin", "detokenize", "chat -t 1"};
  for (size_t i = 0; i < sizeof endless / sizeof *endless; i++) {
    /* chat reads a line at a time: one line without a newline (it had ended the chat silently, exit 0, once
     * getline's allocation failed) */
    const char *feed = !strncmp(endless[i], "chat", 4) ? "yes 2>/dev/null | tr -d '\\n'" : "yes 2>/dev/null";
    char exe[1024], cmd[2048], ef[512];
    dg_test_cli_exe(exe, sizeof exe);
    snprintf(ef, sizeof ef, "%s/endless.err", g_dir);
#if defined(__SANITIZE_ADDRESS__)
    const char *lim = ""; /* ASan reserves terabytes of address space for its shadow */
#else
    const char *lim = "ulimit -v 1572864;";
#endif
    snprintf(cmd, sizeof cmd, "%s | (%s exec %s %s -m %s) >/dev/null 2>%s", feed, lim, exe, endless[i], SMALL, ef);
    int rc = system(cmd);
    err = dg_test_read_file(ef, NULL);
    printf("# yes | dgemma %s: %s", endless[i], err);
    assert_true(WIFEXITED(rc));
    assert_int_equal(WEXITSTATUS(rc), 2);
    if (!strstr(err, "holds more than 268435456 bytes, the most a text read takes")) fail_msg("%s: %s", endless[i], err);
    free(err);
  }
  dg_model_free(m);
}

static cJSON *run_json(const char *args, char **err) {
  char *out;
  int rc = cli(args, &out, err);
  if (rc != 0) fail_msg("%s: exit %d: %s", args, rc, *err);
  cJSON *j = cJSON_Parse(out);
  if (!j) fail_msg("%s: stdout is not JSON: %s", args, out);
  /* one object and nothing else on stdout */
  assert_true(cJSON_IsObject(j));
  assert_int_equal(count_char(out, '\n'), 1);
  free(out);
  return j;
}

static const char *jstr(const cJSON *j, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  if (!cJSON_IsString(v)) fail_msg("JSON field \"%s\" missing or not a string", k);
  return v->valuestring;
}

static double jnum(const cJSON *j, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, k);
  if (!cJSON_IsNumber(v)) fail_msg("JSON field \"%s\" missing or not a number", k);
  return v->valuedouble;
}

/* ids of a JSON "tokens" array -> the library's text of them */
static char *json_tokens_text(const dg_model *m, const cJSON *j, size_t upto, size_t *n_out) {
  const cJSON *tk = cJSON_GetObjectItemCaseSensitive(j, "tokens");
  assert_true(cJSON_IsArray(tk));
  size_t n = (size_t)cJSON_GetArraySize(tk);
  if (upto && upto < n) n = upto;
  int32_t *ids = malloc((n + 1) * sizeof *ids);
  for (size_t i = 0; i < n; i++) ids[i] = (int32_t)cJSON_GetArrayItem(tk, (int)i)->valueint;
  char *t = NULL;
  assert_dg_ok(dg_detokenize(m, ids, n, 0, &t));
  free(ids);
  if (n_out) *n_out = (size_t)cJSON_GetArraySize(tk);
  return t;
}

/* The library's generation of the chat message q with {"eos_token_id": []}, 192 tokens, 4 steps,
 * argmax, seed: *n_valid, *n_visible and the text (malloc'd). */
static char *gen_eos_empty(const char *q, uint64_t seed, int *n_valid, int *n_visible) {
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  dg_chat_message msg = {"user", q};
  int32_t *ids = NULL;
  size_t n = 0;
  assert_dg_ok(dg_chat_apply(m, &msg, 1, 0, &ids, &n));
  dg_context_params cp = dg_context_default_params();
  cp.max_context = (int32_t)n + 192;
  dg_context *ctx = NULL;
  assert_dg_ok(dg_context_new(m, &cp, &ctx));
  dg_gen_params gp = dg_gen_default_params(m);
  assert_dg_ok(dg_gen_params_apply_json(&gp, "{\"eos_token_id\": [], \"max_new_tokens\": 192, \"max_denoising_steps\": 4}"));
  gp.proposal = DG_PROPOSAL_ARGMAX;
  gp.seed = seed;
  dg_gen_result r;
  assert_dg_ok(dg_generate(ctx, ids, n, &gp, &r));
  char *text = NULL;
  assert_dg_ok(dg_detokenize(m, r.tokens, (size_t)r.n_valid, 0, &text));
  char *ret = strdup(text);
  *n_valid = r.n_valid;
  *n_visible = r.n_visible;
  dg_free(text);
  dg_gen_result_free(&r);
  dg_free(ids);
  dg_context_free(ctx);
  dg_model_free(m);
  return ret;
}

/* "tokens": N of the first JSON line of path */
static int jsonl_tokens(const char *path) {
  char *s = dg_test_read_file(path, NULL);
  assert_non_null(s);
  char *nl = strchr(s, '\n');
  assert_non_null(nl);
  *nl = 0;
  cJSON *j = cJSON_Parse(s);
  assert_non_null(j);
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(j, "tokens");
  assert_true(cJSON_IsNumber(t));
  const int v = (int)t->valuedouble;
  cJSON_Delete(j);
  free(s);
  return v;
}

/* `dgemma eval problems` and `eval gsm8k` with {"eos_token_id": []}: the tokens of the summary and of
 * the -o lines are the generated text (n_visible), not the hidden <eos> canvases after the answer
 * (review finding: 384 "tokens" for 2 problems whose answers were 145 tokens, tok/s inflated). */
static void test_eval_eos_empty_count(void **state) {
  (void)state;
  int n_valid = 0, want = 0;
  char *text = gen_eos_empty("What is 7 times 8?", 0, &n_valid, &want);
  printf("# problems: library %d tokens emitted, n_visible %d\n", n_valid, want);
  assert_int_equal(n_valid, 192);
  assert_true(want > 0 && want < n_valid); /* the model writes hidden <eos> after its answer */
  free(text);
  char path[512], items[512], args[2048], *out = NULL, *err = NULL;
  snprintf(path, sizeof path, "%s/problems.jsonl", g_dir);
  const char *line = "{\"id\": 0, \"steps\": 1, \"final\": 56, \"question\": \"What is 7 times 8?\"}\n";
  write_file(path, line, strlen(line));
  snprintf(items, sizeof items, "%s/problems_items.jsonl", g_dir);
  unlink(items);
  snprintf(args, sizeof args,
           "eval problems -m %s -t 1 -f %s -n 192 -s 4 --greedy --gen-kwargs '{\"eos_token_id\": []}' -o %s", SMALL,
           path, items);
  assert_int_equal(cli(args, &out, &err), 0);
  long long tokens = -1;
  const char *sum = strstr(out, "1 problems (0 resumed");
  assert_non_null(sum);
  assert_int_equal(sscanf(sum, "1 problems (0 resumed from the output file); %lld tokens", &tokens), 1);
  printf("# eval problems: summary %lld tokens, -o line %d\n", tokens, jsonl_tokens(items));
  assert_int_equal(tokens, want);
  assert_int_equal(jsonl_tokens(items), want);
  free(out);
  free(err);
  /* gsm8k --chat: the user message "Question: Q\nAnswer:", seed 42 + item 0 */
  const char *q = "What is 7 times 8?";
  char msg[256];
  snprintf(msg, sizeof msg, "Question: %s\nAnswer:", q);
  text = gen_eos_empty(msg, 42, &n_valid, &want);
  printf("# gsm8k: library %d tokens emitted, n_visible %d\n", n_valid, want);
  assert_int_equal(n_valid, 192);
  assert_true(want > 0 && want < n_valid);
  /* no stop string: the harness runs it to the end as the library did */
  assert_null(strstr(text, "Question"));
  assert_null(strstr(text, "Assistant:"));
  free(text);
  char data[300];
  snprintf(data, sizeof data, "%s/gsm8k", g_dir);
  mkdir(data, 0755);
  snprintf(path, sizeof path, "%s/test.jsonl", data);
  line = "{\"question\": \"What is 7 times 8?\", \"answer\": \"7 * 8 = 56\\n#### 56\"}\n";
  write_file(path, line, strlen(line));
  snprintf(path, sizeof path, "%s/train.jsonl", data);
  write_file(path, line, strlen(line));
  snprintf(items, sizeof items, "%s/gsm8k_items.jsonl", g_dir);
  unlink(items);
  snprintf(args, sizeof args,
           "eval gsm8k --chat -m %s -t 1 --data %s -n 192 -s 4 --gen-kwargs '{\"eos_token_id\": []}' -o %s", SMALL,
           data, items);
  assert_int_equal(cli(args, &out, &err), 0);
  /* | items | correct | accuracy | Wilson 95% | no answer | tokens | ... */
  sum = strstr(out, "\n| 1 |");
  assert_non_null(sum);
  const char *c = sum + 1;
  for (int k = 0; k < 5 && c; k++) c = strchr(c + 1, '|'); /* the 6th bar: tokens */
  assert_non_null(c);
  tokens = strtoll(c + 1, NULL, 10);
  printf("# eval gsm8k: summary %lld tokens, -o line %d\n", tokens, jsonl_tokens(items));
  assert_int_equal(tokens, want);
  assert_int_equal(jsonl_tokens(items), want);
  free(out);
  free(err);
}

/* --json: one object whose text is the streamed text, tokens decode to it, counts and timings add up. */
static void test_json(void **state) {
  (void)state;
  char args[1024], *out, *err;
  snprintf(args, sizeof args, RUN_FAST " -p '%s'", kQuestion);
  assert_int_equal(cli(args, &out, &err), 0);
  free(err);
  snprintf(args, sizeof args, RUN_FAST " --json -p '%s'", kQuestion);
  cJSON *j = run_json(args, &err);
  const char *text = jstr(j, "text");
  printf("# --json text \"%s\", finish %s\n", text, jstr(j, "finish_reason"));
  /* the streamed answer is the JSON text plus the final newline */
  assert_int_equal(strlen(out), strlen(text) + 1);
  assert_memory_equal(out, text, strlen(text));
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  char *t = json_tokens_text(m, j, 0, NULL);
  assert_string_equal(t, text);
  dg_free(t);
  assert_string_equal(jstr(j, "finish_reason"), "stop"); /* the small model ends its answer */
  assert_string_equal(jstr(j, "sampler"), "reference");
  /* what ran: RUN_FAST has --greedy, so argmax proposals; stop_string is there, null, without a --stop match */
  assert_string_equal(jstr(j, "proposal"), "argmax");
  assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "stop_string")));
  assert_non_null(strstr(err, "reference sampler, argmax proposals"));
  const int blocks = (int)jnum(j, "blocks"), steps = (int)jnum(j, "steps");
  assert_int_equal(blocks, 1);
  assert_true(steps >= 1 && steps <= 4 * blocks);
  dg_chat_message msg = {"user", kQuestion};
  int32_t *ids;
  size_t n;
  assert_dg_ok(dg_chat_apply(m, &msg, 1, 0, &ids, &n));
  dg_free(ids);
  assert_int_equal((int)jnum(j, "prompt_tokens"), (int)n);
  assert_true(jnum(j, "n_tokens") >= 1);
  const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "timings");
  assert_true(cJSON_IsObject(tm));
  const double pre = jnum(tm, "prefill_s"), gen = jnum(tm, "generation_s"), tot = jnum(tm, "total_s");
  assert_true(pre > 0 && gen > 0 && fabs(tot - pre - gen) < 1e-3);
  assert_true(fabs(jnum(tm, "generation_tok_per_s") - jnum(j, "n_tokens") / gen) < 1e-6 * (1 + jnum(j, "n_tokens") / gen));
  /* the stderr summary reports prefill and generation apart */
  int tokens, nb;
  double gs, tps, ps;
  size_t pn;
  const char *l1 = strstr(err, "dgemma: "), *l2 = strstr(err, "dgemma: prompt ");
  assert_non_null(l1);
  assert_non_null(l2);
  assert_int_equal(sscanf(l1, "dgemma: %d tokens, %d blocks, %*d denoising steps, %*f tokens/forward, %lf s, %lf tok/s (generation)",
                          &tokens, &nb, &gs, &tps), 4);
  assert_int_equal(sscanf(l2, "dgemma: prompt %zu tokens, prefill %lf s", &pn, &ps), 2);
  assert_int_equal(tokens, (int)jnum(j, "n_tokens"));
  assert_int_equal(pn, n);
  free(out);
  free(err);
  cJSON_Delete(j);
  dg_model_free(m);
}

/* --stop: the answer ends before the first stop string, also one that spans two blocks (held back when
 * a block ends inside it), the generation ends there; a string that never comes changes nothing. */
static void test_stop(void **state) {
  (void)state;
  char args[1024], *out, *err;
  /* raw text without stop ids: two full canvases of text */
  const char *base = "run -m " SMALL " -t 1 -n 128 -s 4 --greedy --raw -p ROMEO: --gen-kwargs '{\"eos_token_id\": []}'";
  snprintf(args, sizeof args, "%s --json", base);
  cJSON *j = run_json(args, &err);
  free(err);
  const char *T = jstr(j, "text");
  assert_int_equal((int)jnum(j, "blocks"), 2);
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  dg_model_info info;
  dg_model_get_info(m, &info);
  char *B1 = json_tokens_text(m, j, (size_t)info.canvas_length, NULL); /* the first block's text */
  const size_t L1 = strlen(B1), LT = strlen(T);
  assert_true(L1 > 0 && LT > L1 && !strncmp(T, B1, L1));
  /* a stop string whose first occurrence starts in block 1 and ends in block 2 */
  char S[32] = "";
  for (size_t k = 1; k <= 8 && !*S; k++)
    for (size_t q = 1; q <= 8 && !*S && k <= L1 && L1 + q <= LT; q++) {
      char c[32];
      memcpy(c, T + L1 - k, k + q);
      c[k + q] = 0;
      if (strstr(T, c) == T + L1 - k) memcpy(S, c, k + q + 1);
    }
  if (!*S) fail_msg("no string spans the block boundary of \"%s\" at %zu", T, L1);
  const size_t at = (size_t)(strstr(T, S) - T);
  printf("# stop string spanning the blocks: \"%s\" at byte %zu (block 1 has %zu bytes)\n", S, at, L1);
  /* streamed: exactly the text before S, then the newline */
  char q[64];
  shell_quote(S, q, sizeof q);
  snprintf(args, sizeof args, "%s --stop %s --stop 'never in this text %%'", base, q);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_int_equal(strlen(out), at + 1);
  assert_memory_equal(out, T, at);
  assert_non_null(strstr(err, "finish reason stop_string"));
  assert_non_null(strstr(err, " 2 blocks"));
  free(out);
  free(err);
  /* --json: the same text, the tokens up to the one that completes S */
  snprintf(args, sizeof args, "%s --json --stop %s", base, q);
  cJSON *js = run_json(args, &err);
  free(err);
  assert_string_equal(jstr(js, "finish_reason"), "stop_string");
  assert_string_equal(jstr(js, "stop_string"), S);
  assert_string_equal(jstr(js, "proposal"), "argmax");
  assert_int_equal(strlen(jstr(js, "text")), at);
  assert_memory_equal(jstr(js, "text"), T, at);
  size_t nk;
  char *tt = json_tokens_text(m, js, 0, &nk);
  assert_true(strlen(tt) >= at + strlen(S) && !strncmp(tt, T, at + strlen(S))); /* they reach the end of S */
  dg_free(tt);
  tt = json_tokens_text(m, js, nk - 1, NULL);
  assert_true(strlen(tt) < at + strlen(S)); /* and not one token further */
  dg_free(tt);
  cJSON_Delete(js);
  /* the earliest of several stop strings wins, and generation ends in the first block */
  char first[3] = {T[1], T[2], 0}; /* occurs at byte 1 (or earlier) */
  shell_quote(first, q, sizeof q);
  snprintf(args, sizeof args, "%s --stop never-here --stop %s", base, q);
  assert_int_equal(cli(args, &out, &err), 0);
  const size_t at1 = (size_t)(strstr(T, first) - T);
  assert_int_equal(strlen(out), at1 + 1);
  assert_memory_equal(out, T, at1);
  assert_non_null(strstr(err, " 1 blocks"));
  free(out);
  free(err);
  /* a stop string that never comes: the whole text (what was held back is written at the end) */
  snprintf(args, sizeof args, "%s --stop 'never in this text %%'", base);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_int_equal(strlen(out), LT + 1);
  assert_memory_equal(out, T, LT);
  assert_non_null(strstr(err, "finish reason length"));
  free(out);
  free(err);
  dg_free(B1);
  cJSON_Delete(j);
  dg_model_free(m);
}

/* --temp: the schedule's first and last temperatures (from -v), and --temp 0 = --greedy. */
static void test_temp(void **state) {
  (void)state;
  char args[1024], *out, *err, *ref;
  const double temps[] = {1.0, 2.0, 0.4};
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "run -m %s -t 1 -n 64 -s 4 -v --temp %g --gen-kwargs '{\"stability_threshold\": 9}' -p hi",
             SMALL, temps[i]);
    assert_int_equal(cli(args, &out, &err), 0);
    /* T_s = t_min + (t_max - t_min) s / N, s = N..1, with t_max = T and t_min = T * 0.4 / 0.8 */
    const double tmax = temps[i], tmin = temps[i] * 0.5;
    float t0 = -1, t3 = -1;
    const char *p0 = strstr(err, "[block 0 step  0 T="), *p3 = strstr(err, "[block 0 step  3 T=");
    assert_non_null(p0);
    assert_non_null(p3);
    sscanf(p0, "[block 0 step  0 T=%f", &t0);
    sscanf(p3, "[block 0 step  3 T=%f", &t3);
    printf("# --temp %g: first step T=%.3f, last T=%.3f\n", temps[i], t0, t3);
    assert_true(fabs(t0 - tmax) < 1e-3);
    assert_true(fabs(t3 - (tmin + (tmax - tmin) / 4)) < 1e-3);
    free(out);
    free(err);
  }
  snprintf(args, sizeof args, RUN_FAST " -p '%s'", kQuestion);
  assert_int_equal(cli(args, &ref, &err), 0);
  free(err);
  snprintf(args, sizeof args, "run -m %s -t 1 -n 64 -s 4 --temp 0 -p '%s'", SMALL, kQuestion);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_string_equal(out, ref);
  free(out);
  free(err);
  free(ref);
}

/* tokenize --pieces and detokenize, against the library; a bad id is refused. */
static void test_pieces_detokenize(void **state) {
  (void)state;
  const char *text = "Hello world,\n 23 apples\tand \\ more";
  char path[512], args[8192], *out, *err;
  snprintf(path, sizeof path, "%s/pieces.txt", g_dir);
  write_file(path, text, strlen(text));
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  int32_t *ids;
  size_t n;
  assert_dg_ok(dg_tokenize(m, text, strlen(text), 0, &ids, &n));
  snprintf(args, sizeof args, "tokenize -m %s --pieces -f %s", SMALL, path);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_int_equal(count_char(out, '\n'), (int)n); /* one line per token, newline pieces escaped */
  char *line = out;
  int saw_newline_piece = 0;
  for (size_t i = 0; i < n; i++) {
    char *nl = strchr(line, '\n');
    *nl = 0;
    const char *piece = dg_token_piece(m, ids[i]);
    assert_non_null(piece);
    char want[256];
    snprintf(want, sizeof want, "%d\t%s", ids[i], !strcmp(piece, "\n") ? "\\n" : piece);
    saw_newline_piece |= !strcmp(piece, "\n");
    if (strcmp(line, want)) fail_msg("token %zu: \"%s\", want \"%s\"", i, line, want);
    line = nl + 1;
  }
  assert_true(saw_newline_piece);
  assert_null(dg_token_piece(m, -1));
  assert_null(dg_token_piece(m, 1 << 30));
  free(out);
  free(err);
  /* detokenize: the ids of tokenize, as an argument and through a pipe, give the text back */
  char ids_arg[4096] = "";
  for (size_t i = 0; i < n; i++)
    snprintf(ids_arg + strlen(ids_arg), sizeof ids_arg - strlen(ids_arg), "%s%d", i ? "," : "", ids[i]);
  snprintf(args, sizeof args, "detokenize -m %s %s", SMALL, ids_arg);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_int_equal(strlen(out), strlen(text) + 1);
  assert_memory_equal(out, text, strlen(text));
  free(out);
  free(err);
  snprintf(path, sizeof path, "%s/ids.txt", g_dir);
  for (char *c = ids_arg; *c; c++)
    if (*c == ',') *c = (c - ids_arg) % 3 ? '\n' : ' '; /* white space separates them too */
  write_file(path, ids_arg, strlen(ids_arg));
  snprintf(args, sizeof args, "detokenize -m %s < %s", SMALL, path);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_int_equal(strlen(out), strlen(text) + 1);
  assert_memory_equal(out, text, strlen(text));
  free(out);
  free(err);
  snprintf(args, sizeof args, "detokenize -m %s 5,4096", SMALL);
  assert_int_equal(cli(args, &out, &err), 2);
  assert_non_null(strstr(err, "id 1: \"4096\" is not an id in [0, 4096)"));
  free(out);
  free(err);
  /* "--" ends the options (as in getopt): the same text after it */
  for (char *c = ids_arg; *c; c++)
    if (*c == '\n' || *c == ' ') *c = ','; /* the list of the file above, as one argument again */
  snprintf(args, sizeof args, "detokenize -m %s -- %s", SMALL, ids_arg);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_int_equal(strlen(out), strlen(text) + 1);
  assert_memory_equal(out, text, strlen(text));
  free(out);
  free(err);
  /* a bad id with a newline and hex: one line, the word quoted with the newline escaped */
  snprintf(args, sizeof args, "detokenize -m %s '5\n0x6'", SMALL);
  assert_int_equal(cli(args, &out, &err), 2);
  printf("# detokenize '5\\n0x6': %s", err);
  assert_string_equal(err, "dgemma detokenize: id 1: \"0x6\" is not an id in [0, 4096)\n");
  free(out);
  free(err);
  dg_free(ids);
  dg_model_free(m);
}

/* The newcomer review of the CLI: DGEMMA_KERNELS that cannot be honoured is said (library status,
 * CLI warning, info names the set that runs); DGEMMA_MODEL named when it is what failed; bench checks
 * its options against the model before measuring anything; --device cuda without a GPU says so; chat
 * -c above the model says so; --raw '<bos>' is the generation from <bos> alone. */
static void test_review_findings(void **state) {
  (void)state;
  char args[1024], want[512], *out, *err;
  const char *saved = getenv("DGEMMA_KERNELS");
  char *keep = saved ? strdup(saved) : NULL;
  /* the library: the default set, and DG_ERR_INVALID_ARG with one line for a name it cannot honour */
  unsetenv("DGEMMA_KERNELS");
  const char *best, *name;
  assert_dg_ok(dg_cpu_kernels(&best));
  printf("# best exact CPU kernels: %s\n", best);
  assert_true(!strcmp(best, "avx512") || !strcmp(best, "avx2") || !strcmp(best, "ref"));
  setenv("DGEMMA_KERNELS", "bogus", 1);
  assert_int_equal(dg_cpu_kernels(&name), DG_ERR_INVALID_ARG);
  assert_string_equal(name, best);
  snprintf(want, sizeof want, "DGEMMA_KERNELS=\"bogus\" is not one of ref, avx2, avx512, avx512lp, avx2lp (the CPU "
           "kernel set; unset: the best exact set this CPU has)");
  assert_string_equal(dg_last_error(), want);
  setenv("DGEMMA_KERNELS", "ref", 1);
  assert_dg_ok(dg_cpu_kernels(&name));
  assert_string_equal(name, "ref");
  /* the CLI: a name of no kernel set refused (exit 1, the load's line, no warning before it); a set this CPU lacks
   * a warning naming the variable and its value, and info's line of the set that runs */
  const int have_lp = dg_kernels_avx512lp() != NULL, have_lp2 = dg_kernels_avx2lp() != NULL;
  static const char *vals[] = {"bogus", "AVX512", "avx512lp", "ref", "bad\nvalue", "avx2lp"};
  for (int i = 0; i < 6; i++) {
    setenv("DGEMMA_KERNELS", vals[i], 1);
    snprintf(args, sizeof args, "info -m %s -t 1", SMALL);
    const int named = !strcmp(vals[i], "ref") || !strcmp(vals[i], "avx512lp") || !strcmp(vals[i], "avx2lp");
    assert_int_equal(cli(args, &out, &err), named ? 0 : 1);
    printf("# DGEMMA_KERNELS=%s: %s", vals[i], err);
    if (!named) {
      snprintf(want, sizeof want, "  DGEMMA_KERNELS=\"%s\" is not one of ref, avx2, avx512, avx512lp, avx2lp (the CPU "
               "kernel set; unset: the best exact set this CPU has)\n",
               !strcmp(vals[i], "bad\nvalue") ? "bad\\x0avalue" : vals[i]);
      if (!strstr(err, want)) fail_msg("info with DGEMMA_KERNELS=%s: stderr \"%s\" (want \"%s\")", vals[i], err, want);
      assert_null(strstr(err, "warning"));
      assert_null(strstr(out, "cpu kernels:"));
      free(out);
      free(err);
      continue;
    }
    const int honoured = !strcmp(vals[i], "ref") || (!strcmp(vals[i], "avx512lp") && have_lp) ||
                         (!strcmp(vals[i], "avx2lp") && have_lp2);
    if (honoured) {
      assert_string_equal(err, "");
      snprintf(want, sizeof want, "\ncpu kernels: %s (DGEMMA_KERNELS)\n", vals[i]);
    } else {
      if (!strcmp(vals[i], "avx512lp"))
        snprintf(want, sizeof want, "dgemma: warning: DGEMMA_KERNELS=avx512lp: this CPU lacks AVX-512 BF16 and VNNI; "
                 "using the %s kernels\n", best);
      else if (!strcmp(vals[i], "avx2lp"))
        snprintf(want, sizeof want, "dgemma: warning: DGEMMA_KERNELS=avx2lp: this CPU lacks AVX2 and FMA; "
                 "using the %s kernels\n", best);
      assert_string_equal(err, want);
      snprintf(want, sizeof want, "\ncpu kernels: %s (the best this CPU has; DGEMMA_KERNELS ignored)\n", best);
    }
    if (!strstr(out, want)) fail_msg("info with DGEMMA_KERNELS=%s: %s (want \"%s\")", vals[i], out, want);
    free(out);
    free(err);
  }
  unsetenv("DGEMMA_KERNELS");
  snprintf(args, sizeof args, "info -m %s -t 1", SMALL);
  assert_int_equal(cli(args, &out, &err), 0);
  snprintf(want, sizeof want, "\ncpu kernels: %s (the best this CPU has)\n", best);
  assert_non_null(strstr(out, want));
  free(out);
  free(err);
  if (keep) setenv("DGEMMA_KERNELS", keep, 1);
  free(keep);
  /* DGEMMA_MODEL that does not exist: the hint names it, not the bundled model */
  setenv("DGEMMA_MODEL", "/nonexistent-dgemma-model", 1);
  assert_int_equal(cli("info", &out, &err), 1);
  printf("# DGEMMA_MODEL=/nonexistent-dgemma-model dgemma info:\n%s", err);
  assert_non_null(strstr(err, "no -m given, so $DGEMMA_MODEL: /nonexistent-dgemma-model;"));
  assert_null(strstr(err, "bundled"));
  free(out);
  free(err);
  unsetenv("DGEMMA_MODEL");
  /* bench: a prompt or a generation past the model's positions is a usage error found before the
   * ceilings are measured (nothing on stdout) */
  static const char *bench[][2] = {
      {"--protocol vllm --prompt-tokens 200000", "dgemma bench: the vllm row needs 200256 positions (prompt 200000 "
                                                 "(--prompt-tokens) + 256 generated, in canvases of 64), past the "
                                                 "model's max_position_embeddings 131072: lower --prompt-tokens or -n"},
      {"--protocol p512 -n 200000", "dgemma bench: -n 200000: the p512 rows need"},
      {"-n 200000", "dgemma bench: the vllm row needs"},
  };
  for (int i = 0; i < 3; i++) {
    snprintf(args, sizeof args, "bench -m %s -t 1 %s", SMALL, bench[i][0]);
    const double t0 = now_s();
    const int rc = cli(args, &out, &err);
    printf("# dgemma %s -> %d in %.2f s: %s", args, rc, now_s() - t0, err);
    assert_int_equal(rc, 2);
    assert_string_equal(out, "");
    assert_int_equal(strncmp(err, bench[i][1], strlen(bench[i][1])), 0);
    assert_int_equal(count_char(err, '\n'), 1);
    free(out);
    free(err);
  }
  /* --device cuda where it cannot run: the device is blamed, not the model path */
  char dev[256];
  if (dg_device_info(DG_DEVICE_CUDA, 0, dev, sizeof dev) != DG_OK) {
    const char *cmds[] = {"run -p hi", "info", "serve --port 0"};
    for (int i = 0; i < 3; i++) {
      snprintf(args, sizeof args, "%s -m %s --device cuda", cmds[i], SMALL);
      assert_int_equal(cli(args, &out, &err), 1);
      printf("# dgemma %s: %s", args, err);
      snprintf(want, sizeof want, "dgemma %.*s: --device cuda:0: ", (int)strcspn(cmds[i], " "), cmds[i]);
      if (strncmp(err, want, strlen(want)) || strstr(err, "cannot load model") || count_char(err, '\n') != 1)
        fail_msg("%s: stderr \"%s\" (want one line \"%s...\")", args, err, want);
      free(out);
      free(err);
    }
  } else {
    printf("# a CUDA device is here (%s): the no-GPU messages are not checked\n", dev);
  }
  /* chat -c above the model's positions: said on stderr, the chat goes on */
  snprintf(args, sizeof args, "chat -m %s -t 1 -c 1000000 < /dev/null", SMALL);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_string_equal(err, "dgemma chat: -c 1000000 is more than the model's 131072 positions (max_position_embeddings); "
                           "using 131072\n");
  free(out);
  free(err);
  /* what the empty-prompt message recommends works: one prompt token, <bos> */
  snprintf(args, sizeof args, "run -m %s -t 1 -n 64 -s 2 --greedy --json --raw '<bos>'", SMALL);
  cJSON *j = run_json(args, &err);
  assert_int_equal((int)jnum(j, "prompt_tokens"), 1);
  assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(j, "stop_string")));
  cJSON_Delete(j);
  free(err);
}

/* Threads: -t above the cores is capped with a warning; the wait policy is passive unless set. */
static void test_threads(void **state) {
  (void)state;
  char args[512], *out, *err;
  cpu_set_t cs;
  assert_int_equal(sched_getaffinity(0, sizeof cs, &cs), 0);
  const int cores = CPU_COUNT(&cs);
  snprintf(args, sizeof args, "info -m %s -t 1000", SMALL);
  const char *saved = getenv("OMP_WAIT_POLICY");
  char *keep = saved ? strdup(saved) : NULL;
  unsetenv("OMP_WAIT_POLICY");
  assert_int_equal(cli(args, &out, &err), 0);
  char want[256];
  snprintf(want, sizeof want, "dgemma: -t 1000 is more than the %d core(s) available to this process; using %d\n", cores,
           cores);
  assert_string_equal(err, want);
  snprintf(want, sizeof want, "cpu: %d threads, %d core(s) available, OpenMP wait policy passive\n", cores, cores);
  if (!strstr(out, want)) fail_msg("info: %s (want \"%s\")", out, want);
  free(out);
  free(err);
  setenv("OMP_WAIT_POLICY", "active", 1); /* the user's choice is kept */
  snprintf(args, sizeof args, "info -m %s -t 1", SMALL);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_string_equal(err, "");
  assert_non_null(strstr(out, "cpu: 1 threads"));
  assert_non_null(strstr(out, "OpenMP wait policy active\n"));
  free(out);
  free(err);
  if (keep) setenv("OMP_WAIT_POLICY", keep, 1);
  else unsetenv("OMP_WAIT_POLICY");
  free(keep);
  /* OMP_NUM_THREADS, the default of -t, is capped as -t is (info and serve); an explicit -t wins */
  const char *omp = getenv("OMP_NUM_THREADS");
  char *keep_omp = omp ? strdup(omp) : NULL;
  setenv("OMP_NUM_THREADS", "1000", 1);
  snprintf(args, sizeof args, "info -m %s", SMALL);
  assert_int_equal(cli(args, &out, &err), 0);
  printf("# OMP_NUM_THREADS=1000 dgemma info: %s", err);
  snprintf(want, sizeof want, "dgemma: OMP_NUM_THREADS=1000 is more than the %d core(s) available to this process; "
           "using %d\n", cores, cores);
  assert_string_equal(err, want);
  snprintf(want, sizeof want, "cpu: %d threads, %d core(s) available", cores, cores);
  if (!strstr(out, want)) fail_msg("info: %s (want \"%s\")", out, want);
  free(out);
  free(err);
  snprintf(args, sizeof args, "info -m %s -t 1", SMALL);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_string_equal(err, "");
  assert_non_null(strstr(out, "cpu: 1 threads"));
  free(out);
  free(err);
  /* serve: said before the model loads (the model does not exist: exit 1 after the line) */
  assert_int_equal(cli("serve -m /nonexistent --port 0", &out, &err), 1);
  snprintf(want, sizeof want, "dgemma serve: OMP_NUM_THREADS=1000 is more than the %d core(s) available to this process; "
           "using %d\n", cores, cores);
  if (strncmp(err, want, strlen(want))) fail_msg("serve: stderr \"%s\" (want \"%s...\")", err, want);
  free(out);
  free(err);
  if (keep_omp) setenv("OMP_NUM_THREADS", keep_omp, 1);
  else unsetenv("OMP_NUM_THREADS");
  free(keep_omp);
}

/* info on a quantized model, and a model without a tokenizer (mkrandom --config small). */
static void test_info_and_no_tokenizer(void **state) {
  (void)state;
  char args[1024], dir[512], *out, *err;
  snprintf(args, sizeof args, "info -m %s", SMALL);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_non_null(strstr(out, "max context 131072 positions"));
  assert_non_null(strstr(out, "weights: bf16\n"));
  assert_non_null(strstr(out, "tokenizer: tokenizer.json\n"));
  free(out);
  free(err);
  snprintf(dir, sizeof dir, "%s/info-q", g_dir);
  snprintf(args, sizeof args, "quantize %s %s -t 1 --recipe experts=3", SMALL, dir);
  assert_int_equal(cli(args, &out, &err), 0);
  free(out);
  free(err);
  snprintf(args, sizeof args, "info -m %s", dir);
  assert_int_equal(cli(args, &out, &err), 0);
  printf("# info of the quantized copy:\n%s", out);
  assert_null(strstr(out, "weights bf16"));
  assert_non_null(strstr(out, "matrices MLX affine-quantized (3..4 bits; scales and biases bf16), the other tensors bf16"));
  free(out);
  free(err);
  snprintf(dir, sizeof dir, "%s/notok", g_dir);
  snprintf(args, sizeof args, "mkrandom %s --config small -t 1", dir);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_non_null(strstr(err, "note: no tokenizer.json in"));
  assert_null(strstr(err, "bench work"));
  free(out);
  free(err);
  snprintf(args, sizeof args, "run -m %s -p hi", dir);
  assert_int_equal(cli(args, &out, &err), 1);
  assert_non_null(strstr(err, "tokenizer.json: no such file"));
  assert_non_null(strstr(err, "`dgemma run` needs the model's tokenizer"));
  free(out);
  free(err);
  snprintf(args, sizeof args, "info -m %s", dir);
  assert_int_equal(cli(args, &out, &err), 0);
  assert_non_null(strstr(out, "tokenizer: none (the commands of text refuse this model; info, logits and replay work on ids)"));
  free(out);
  free(err);
  /* bench needs the tokenizer too (its prompts are text): the messages had said it "works on ids" */
  snprintf(args, sizeof args, "bench -m %s --quick --protocol vllm -t 1", dir);
  assert_int_equal(cli(args, &out, &err), 1);
  printf("# bench on a model without a tokenizer:\n%s", err);
  assert_non_null(strstr(err, "`dgemma bench` needs the model's tokenizer; info, logits and replay work on ids"));
  assert_null(strstr(err, "bench work"));
  free(out);
  free(err);
  assert_int_equal(cli("mkrandom --help", &out, &err), 0);
  assert_null(strstr(out, "bench work"));
  assert_non_null(strstr(out, "bench, serve, qreport) refuse it; info, logits and replay work on ids."));
  free(out);
  free(err);
}

/* ---- dgemma chat through a pseudo-terminal ------------------------------------------------ */

typedef struct pty_session {
  pid_t pid;
  int fd;
  char *buf; /* everything the terminal showed, '\r' removed */
  size_t len, cap;
} pty_session;

static void pty_start(pty_session *s, const char *const *argv) {
  fflush(stdout);
  memset(s, 0, sizeof *s);
  s->pid = forkpty(&s->fd, NULL, NULL, NULL);
  assert_true(s->pid >= 0);
  if (s->pid == 0) {
    signal(SIGINT, SIG_DFL);
    execv(g_exe, (char *const *)argv);
    _exit(127);
  }
  s->cap = 1 << 16;
  s->buf = malloc(s->cap);
  s->buf[0] = 0;
}

/* The pty waits' timeouts only bound a hang: the callers' figures are what an idle machine needs a few times over, and
 * each is stretched PTY_SLACK times more so that a loaded machine (CI beside builds: load 5-7 on 2 cores, the ASan
 * build) does not fail a test that is merely slow (sessions 16 and 17 saw test_review2_findings fail so under load
 * and pass alone). */
#define PTY_SLACK 5.0

/* Read until `want` appears at or after offset `from`; returns its offset, or fails after PTY_SLACK x timeout_s. */
static size_t pty_expect(pty_session *s, size_t from, const char *want, double timeout_s) {
  const double t0 = now_s();
  timeout_s *= PTY_SLACK;
  for (;;) {
    char *hit = s->len >= from ? strstr(s->buf + from, want) : NULL;
    if (hit) return (size_t)(hit - s->buf);
    const double left = timeout_s - (now_s() - t0);
    if (left <= 0) fail_msg("chat: no \"%s\" after %.0f s; the terminal showed:\n%s", want, timeout_s, s->buf + from);
    struct pollfd p = {s->fd, POLLIN, 0};
    if (poll(&p, 1, (int)(left * 1000) + 1) <= 0) continue;
    char tmp[4096];
    ssize_t k = read(s->fd, tmp, sizeof tmp);
    if (k <= 0) fail_msg("chat: the terminal closed before \"%s\"; it showed:\n%s", want, s->buf + from);
    for (ssize_t i = 0; i < k; i++) {
      if (tmp[i] == '\r') continue;
      if (s->len + 2 > s->cap) s->buf = realloc(s->buf, s->cap *= 2);
      s->buf[s->len++] = tmp[i];
    }
    s->buf[s->len] = 0;
  }
}

static void pty_send(pty_session *s, const char *text) {
  assert_int_equal(write(s->fd, text, strlen(text)), (ssize_t)strlen(text));
}

/* Send a message and return the answer the terminal showed (malloc'd): what follows the echoed
 * line up to the newline before the "(dgemma: ...)" summary, which is followed by the next prompt.
 * The line may be echoed twice (by the terminal, when it arrives before the line editor takes
 * the terminal, and by the editor): the answer starts after the last echo. */
static char *pty_turn(pty_session *s, const char *message) {
  const size_t from = s->len;
  pty_send(s, message);
  pty_send(s, "\n");
  char echo_line[512];
  snprintf(echo_line, sizeof echo_line, "%s\n", message);
  size_t echo = pty_expect(s, from, echo_line, 30) + strlen(echo_line);
  size_t sum = pty_expect(s, echo, "\n(dgemma: ", 120);
  pty_expect(s, sum, ")\n> ", 30);
  for (char *e; (e = strstr(s->buf + echo, echo_line)) && (size_t)(e - s->buf) < sum;)
    echo = (size_t)(e - s->buf) + strlen(echo_line);
  return strndup(s->buf + echo, sum - echo);
}

static int pty_finish(pty_session *s) {
  int status;
  const double t0 = now_s();
  while (waitpid(s->pid, &status, WNOHANG) == 0) {
    if (now_s() - t0 > 30 * PTY_SLACK) { kill(s->pid, SIGKILL); fail_msg("chat did not leave after /quit"); }
    char tmp[4096];
    struct pollfd p = {s->fd, POLLIN, 0};
    if (poll(&p, 1, 50) > 0 && read(s->fd, tmp, sizeof tmp) <= 0) usleep(10000);
  }
  close(s->fd);
  free(s->buf);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The library's answer to a token sequence (fresh context, the chat's settings): its text, and its
 * tokens up to the stop id in *ans (malloc'd). */
static char *lib_answer(const dg_model *m, const int32_t *ids, size_t n, int32_t **ans, size_t *n_ans, int *finished) {
  dg_context_params cp = dg_context_default_params();
  cp.max_context = (int32_t)n + 64;
  dg_context *ctx = NULL;
  assert_dg_ok(dg_context_new(m, &cp, &ctx));
  dg_gen_params gp = dg_gen_default_params(m);
  gp.max_new_tokens = 64;
  gp.max_denoising_steps = 4;
  gp.proposal = DG_PROPOSAL_ARGMAX;
  dg_gen_result r;
  assert_dg_ok(dg_generate(ctx, ids, n, &gp, &r));
  char *text = NULL;
  assert_dg_ok(dg_detokenize(m, r.tokens, (size_t)r.n_valid, 0, &text));
  if (ans) {
    *ans = malloc((size_t)r.n_valid * sizeof **ans);
    memcpy(*ans, r.tokens, (size_t)r.n_valid * sizeof **ans);
    *n_ans = (size_t)r.n_valid;
    *finished = r.finished;
  }
  dg_gen_result_free(&r);
  dg_context_free(ctx);
  return text;
}

static int32_t one_id(const dg_model *m, const char *piece) {
  int32_t *ids;
  size_t n;
  assert_dg_ok(dg_tokenize(m, piece, strlen(piece), 1, &ids, &n));
  assert_int_equal(n, 1);
  int32_t id = ids[0];
  dg_free(ids);
  return id;
}

/* Two turns: the second answer is the model's answer to the whole conversation (first question, first
 * answer, second question) and differs from its answer to the second question alone; /reset forgets. */
static void test_chat(void **state) {
  (void)state;
  const char *q1 = "Tom has 5 pens. He buys 3 more pens. How many pens does Tom have now?";
  const char *q2 = "How many pens does Tom have?";
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  /* what the answers must be */
  int32_t *p1, *p2, *a1, *conv;
  size_t n1, n2, na1;
  dg_chat_message msg1 = {"user", q1}, msg2 = {"user", q2};
  assert_dg_ok(dg_chat_apply(m, &msg1, 1, 0, &p1, &n1));
  assert_dg_ok(dg_chat_apply(m, &msg2, 1, 0, &p2, &n2));
  int a1_finished = 0;
  char *e1 = lib_answer(m, p1, n1, &a1, &na1, &a1_finished);
  const int32_t end_turn = one_id(m, "<turn|>"), nl = one_id(m, "\n");
  /* the conversation as the template has it: turn 1, the answer closed by <turn|>\n, turn 2 (no second <bos>) */
  conv = malloc((n1 + na1 + 2 + n2) * sizeof *conv);
  size_t nc = 0;
  for (size_t i = 0; i < n1; i++) conv[nc++] = p1[i];
  size_t keep = na1; /* a stop id other than <turn|> (e.g. <eos>) is replaced by <turn|> */
  if (a1_finished && keep && a1[keep - 1] != end_turn) keep--;
  for (size_t i = 0; i < keep; i++) conv[nc++] = a1[i];
  if (!keep || conv[nc - 1] != end_turn) conv[nc++] = end_turn;
  conv[nc++] = nl;
  for (size_t i = 1; i < n2; i++) conv[nc++] = p2[i];
  char *e2 = lib_answer(m, conv, nc, NULL, NULL, NULL);
  char *e2_alone = lib_answer(m, p2, n2, NULL, NULL, NULL);
  printf("# answer 1: \"%s\"\n# answer 2 in the conversation: \"%s\"\n# answer 2 alone: \"%s\"\n", e1, e2, e2_alone);
  assert_string_not_equal(e2, e2_alone); /* the first turn changes the second answer */
  /* the chat in a terminal */
  const char *argv[] = {"dgemma", "chat", "-m", SMALL, "-t", "1", "-n", "64", "-s", "4", "--greedy", NULL};
  pty_session s;
  pty_start(&s, argv);
  pty_expect(&s, 0, "> ", 60);
  char *c1 = pty_turn(&s, q1);
  char *c2 = pty_turn(&s, q2);
  size_t from = s.len;
  pty_send(&s, "/reset\n");
  pty_expect(&s, pty_expect(&s, from, "(conversation forgotten)\n", 30), "> ", 30);
  char *c3 = pty_turn(&s, q2);
  from = s.len;
  pty_send(&s, "/quit\n");
  assert_int_equal(pty_finish(&s), 0);
  printf("# chat: \"%s\" / \"%s\" / after /reset \"%s\"\n", c1, c2, c3);
  assert_string_equal(c1, e1);
  assert_string_equal(c2, e2);
  assert_string_equal(c3, e2_alone);
  free(c1); free(c2); free(c3);
  dg_free(e1); dg_free(e2); dg_free(e2_alone);
  dg_free(p1); dg_free(p2);
  free(a1); free(conv);
  dg_model_free(m);
}

/* Ctrl-C at the chat's prompt (no answer running) discards the line and asks again; the conversation stays
 * (session 26: it ended the chat with exit 0 and no message, so a Ctrl-C meant for an answer that had just
 * ended lost the whole conversation). */
static void test_chat_ctrl_c_at_prompt(void **state) {
  (void)state;
  const char *argv[] = {"dgemma", "chat", "-m", SMALL, "-t", "1", "-n", "64", "-s", "4", "--greedy", NULL};
  pty_session s;
  pty_start(&s, argv);
  size_t at = pty_expect(&s, 0, "> ", 60);
  pty_send(&s, "half a li");
  at = pty_expect(&s, at, "half a li", 20);
  /* libedit echoed the keys and waits in read(), which the signal interrupts (a Ctrl-C that lands while it is
   * busy with a key is seen only at the next key: the read is not interrupted; STATUS.md) */
  usleep(300000);
  pty_send(&s, "\x03");
  at = pty_expect(&s, at, "(Ctrl-C: /quit or Ctrl-D leaves)\n", 20);
  pty_expect(&s, at, "> ", 10);
  assert_int_equal(kill(s.pid, 0), 0); /* still running */
  char *a = pty_turn(&s, "Tom has 5 pens. How many pens does Tom have?");
  printf("# after Ctrl-C at the prompt: \"%s\"\n", a);
  assert_non_null(strstr(s.buf, "context ")); /* the turn ran: its summary line */
  free(a);
  pty_send(&s, "/quit\n");
  assert_int_equal(pty_finish(&s), 0);
}

/* A chat line holding a NUL byte (standard input not a terminal) is skipped with a message naming the line and
 * the offset; the chat goes on (session 26: the message was cut at the NUL silently, "a\0b" answered as "a"). */
static void test_chat_nul_line(void **state) {
  (void)state;
  char in[600], args[2048], *out, *err;
  snprintf(in, sizeof in, "%s/chat-nul.txt", g_dir);
  write_file(in, "a\0b\nTom has 5 pens. How many pens does Tom have?\n", 49);
  snprintf(args, sizeof args, "chat -m %s -t 1 -n 64 -s 4 --greedy < %s", SMALL, in);
  int rc = cli(args, &out, &err);
  printf("# chat with a NUL line -> %d: stderr %s", rc, err);
  assert_int_equal(rc, 0);
  assert_non_null(strstr(err, "dgemma chat: input line 1 holds a NUL byte at offset 1 (text expected); skipped\n"));
  int answers = 0; /* one summary line "(dgemma: N tokens, ..." per answer */
  for (const char *p = err; (p = strstr(p, "(dgemma: ")); p++) answers++;
  assert_int_equal(answers, 1);
  free(out);
  free(err);
  unlink(in);
}

/* Ctrl-C stops a long answer without leaving the chat. */
static void test_chat_interrupt(void **state) {
  (void)state;
  const char *argv[] = {"dgemma", "chat", "-m", SMALL, "-t", "1", "-n", "1024", "-s", "48", "--gen-kwargs",
                        "{\"eos_token_id\": [], \"stability_threshold\": 100}", NULL};
  pty_session s;
  pty_start(&s, argv);
  pty_expect(&s, 0, "> ", 60);
  size_t from = s.len;
  pty_send(&s, "Tell me a long story.\n");
  usleep(800000);
  const double t0 = now_s();
  pty_send(&s, "\x03");
  size_t at = pty_expect(&s, from, "(stopped; this turn is forgotten)\n", 20);
  pty_expect(&s, at, "> ", 10);
  const double dt = now_s() - t0;
  printf("# Ctrl-C: stopped %.2f s after it (a whole answer takes about 16 canvases x 48 steps)\n", dt);
  assert_true(dt < 5);
  assert_int_equal(kill(s.pid, 0), 0); /* still running */
  pty_send(&s, "/quit\n");
  assert_int_equal(pty_finish(&s), 0);
}

/* The second newcomer review: --opt=value; -f - reads stdin; a 1-token prompt has no prefill rate;
 * the prefill progress and the summary count the same tokens; detokenize refuses empty ids and signs;
 * -m FILE is said to be a file; a model without generation_config.json is warned about (the library
 * says so in dg_model_info, the CLI prints). */
static void test_review2_findings(void **state) {
  (void)state;
  char args[2048], path[512], dir[512], want[1024], *ref, *out, *err;
  /* --opt=value is --opt value, for every long option taking a value */
  snprintf(args, sizeof args, "run -m %s -t 1 -n 64 -s 4 --seed 7 --temp 0.5 -p '%s'", SMALL, kQuestion);
  assert_int_equal(cli(args, &ref, &err), 0);
  free(err);
  snprintf(args, sizeof args, "run --model=%s --threads=1 --max-new-tokens=64 --steps=4 --seed=7 --temp=0.5 "
           "--prompt='%s'", SMALL, kQuestion);
  assert_int_equal(cli(args, &out, &err), 0);
  printf("# --temp=0.5 and the rest as --opt=value: %s", out);
  assert_true(strlen(ref) > 1);
  assert_string_equal(out, ref);
  free(out);
  free(err);
  free(ref);
  /* -f - reads standard input, as -p - does */
  snprintf(path, sizeof path, "%s/q.txt", g_dir);
  write_file(path, kQuestion, strlen(kQuestion));
  snprintf(args, sizeof args, RUN_FAST " -p - < %s", path);
  assert_int_equal(cli(args, &ref, &err), 0);
  free(err);
  snprintf(args, sizeof args, RUN_FAST " -f - < %s", path);
  assert_int_equal(cli(args, &out, &err), 0);
  if (strcmp(out, ref)) fail_msg("-f -: \"%s\", -p -: \"%s\"; stderr %s", out, ref, err);
  free(out);
  free(err);
  free(ref);
  snprintf(args, sizeof args, RUN_FAST " -f - < /dev/null");
  assert_int_equal(cli(args, &out, &err), 2);
  assert_non_null(strstr(err, "the prompt is empty (nothing on standard input)"));
  free(out);
  free(err);
  /* a 1-token prompt: nothing is prefilled, so no rate (not "0.0 tok/s"); --json says null */
  snprintf(args, sizeof args, "run -m %s -t 1 -n 64 -s 2 --greedy --raw '<bos>'", SMALL);
  assert_int_equal(cli(args, &out, &err), 0);
  printf("# --raw '<bos>':\n%s", err);
  assert_non_null(strstr(err, "\ndgemma: prompt 1 token, prefill "));
  assert_non_null(strstr(err, " s (no rate: the only token goes with the first canvas); "));
  assert_null(strstr(err, " 0.0 tok/s")); /* the space: "1600.0 tok/s", a generation rate, matched without it */
  free(out);
  free(err);
  snprintf(args, sizeof args, "run -m %s -t 1 -n 64 -s 2 --greedy --json --raw '<bos>'", SMALL);
  cJSON *j = run_json(args, &err);
  const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "timings");
  assert_true(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(tm, "prefill_tok_per_s")));
  assert_int_equal((int)jnum(tm, "prefill_tokens"), 0);
  cJSON_Delete(j);
  free(err);
  /* a long prompt on a terminal: the progress line's count is the summary's prefilled count, the
   * prompt's tokens but the last (which goes with the first canvas) */
  char *big = malloc(16384);
  big[0] = 0;
  for (int i = 0; i < 95; i++) strcat(big, "Sam has 23 apples and buys 14 more. ");
  snprintf(path, sizeof path, "%s/long.txt", g_dir);
  write_file(path, big, strlen(big));
  dg_model *m = NULL;
  dg_model_params mp = dg_model_default_params();
  mp.n_threads = 1;
  assert_dg_ok(dg_model_load(SMALL, &mp, &m));
  int32_t *ids;
  size_t n;
  dg_chat_message msg = {"user", big};
  assert_dg_ok(dg_chat_apply(m, &msg, 1, 0, &ids, &n));
  dg_free(ids);
  free(big);
  assert_true(n > 1024); /* prefill() shows progress past 2 chunks of 512 */
  const char *argv[] = {"dgemma", "run", "-m", SMALL, "-t", "1", "-n", "64", "-s", "1", "--greedy", "-f", path, NULL};
  pty_session ps;
  pty_start(&ps, argv);
  pty_expect(&ps, 0, " s in all\n", 120);
  const char *last = NULL;
  for (const char *h = ps.buf; (h = strstr(h, "dgemma: prefill ")); h++) last = h;
  assert_non_null(last);
  size_t k1, k2, pn, pk;
  assert_int_equal(sscanf(last, "dgemma: prefill %zu/%zu tokens", &k1, &k2), 2);
  const char *sum = strstr(ps.buf, "dgemma: prompt ");
  assert_non_null(sum);
  double ps_s;
  assert_int_equal(sscanf(sum, "dgemma: prompt %zu tokens, prefill %lf s (%zu tokens,", &pn, &ps_s, &pk), 3);
  printf("# %zu-token prompt on a terminal: progress %zu/%zu, summary: %.*s\n", n, k1, k2, (int)strcspn(sum, "\n"), sum);
  assert_int_equal(pn, n);
  assert_int_equal(k1, n - 1);
  assert_int_equal(k2, n - 1);
  assert_int_equal(pk, n - 1);
  assert_int_equal(pty_finish(&ps), 0);
  /* detokenize: an empty id (two commas, a leading or trailing one) and a sign are refused */
  static const char *bad[][2] = {
      {"5,,6", "dgemma detokenize: id 1 is empty (two commas at byte 2); separate ids by one comma or by white space\n"},
      {"'5, ,6'", "dgemma detokenize: id 1 is empty (two commas at byte 3);"},
      {",5", "dgemma detokenize: id 0 is empty (a comma before the first id at byte 0);"},
      {"5,6,", "dgemma detokenize: the ids end with a comma (byte 4): an empty id\n"},
      {"+5", "dgemma detokenize: id 0: \"+5\" is not an id in [0, 4096) (write it without the + sign)\n"},
      {"5,-6", "dgemma detokenize: id 1: \"-6\" is not an id in [0, 4096)\n"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    snprintf(args, sizeof args, "detokenize -m %s %s", SMALL, bad[i][0]);
    const int rc = cli(args, &out, &err);
    printf("# detokenize %s -> %d: %s", bad[i][0], rc, err);
    if (rc != 2 || strncmp(err, bad[i][1], strlen(bad[i][1])) || count_char(err, '\n') != 1 || *out)
      fail_msg("detokenize %s: exit %d, stdout \"%s\", stderr \"%s\" (want \"%s\")", bad[i][0], rc, out, err, bad[i][1]);
    free(out);
    free(err);
  }
  snprintf(args, sizeof args, "detokenize -m %s '5, 6\n7 ,8'", SMALL); /* one comma, white space around it */
  assert_int_equal(cli(args, &out, &err), 0);
  const int32_t ok_ids[] = {5, 6, 7, 8};
  char *t;
  assert_dg_ok(dg_detokenize(m, ok_ids, 4, 0, &t));
  snprintf(want, sizeof want, "%s\n", t);
  assert_string_equal(out, want);
  dg_free(t);
  free(out);
  free(err);
  /* -m FILE: the file is said not to be a directory (library and CLI), not "FILE/config.json: no such file" */
  dg_model *fm = NULL;
  assert_int_equal(dg_model_load(SMALL "/config.json", &mp, &fm), DG_ERR_NOT_FOUND);
  assert_null(fm);
  assert_string_equal(dg_last_error(), SMALL "/config.json is not a directory (a model directory holds config.json, "
                                            "the safetensors files and tokenizer.json)");
  assert_int_equal(cli("info -m " SMALL "/config.json", &out, &err), 1);
  printf("# info -m FILE:\n%s", err);
  assert_non_null(strstr(err, "  " SMALL "/config.json is not a directory ("));
  assert_null(strstr(err, "config.json/config.json"));
  free(out);
  free(err);
  /* run and tokenize (they need a tokenizer) -m FILE: the same line, and no hint that the tokenizer is
   * missing (the hint matched "tokenizer.json" in the not-a-directory line) */
  assert_int_equal(cli("run -m " SMALL "/config.json -p hi", &out, &err), 1);
  assert_non_null(strstr(err, "  " SMALL "/config.json is not a directory ("));
  assert_null(strstr(err, "needs the model's tokenizer"));
  free(out);
  free(err);
  assert_int_equal(cli("tokenize -m " SMALL "/config.json hi", &out, &err), 1);
  assert_non_null(strstr(err, "  " SMALL "/config.json is not a directory ("));
  assert_null(strstr(err, "needs the model's tokenizer"));
  free(out);
  free(err);
  /* serve --max-context past the model's positions (131,072): said, not capped quietly (review brk31); a
   * --gen-kwargs refused after that line ends the command before it listens */
  assert_int_equal(cli("serve -m " SMALL " --port 0 --max-context 200000 --gen-kwargs '{\"bogus\": 1}'", &out, &err), 2);
  printf("# serve --max-context 200000:\n%s", err);
  assert_non_null(strstr(err, "dgemma serve: --max-context 200000 is more than the model's 131072 positions "
                              "(max_position_embeddings); using 131072\n"));
  free(out);
  free(err);
  assert_int_equal(cli("serve -m " SMALL " --port 0 --max-context 100000 --gen-kwargs '{\"bogus\": 1}'", &out, &err), 2);
  assert_null(strstr(err, "--max-context"));
  free(out);
  free(err);
  /* a model without generation_config.json: the library says so, the generating commands warn once */
  dg_model_info info;
  dg_model_get_info(m, &info);
  assert_int_equal(info.has_generation_config, 1);
  snprintf(dir, sizeof dir, "%s/nogen", g_dir);
  assert_int_equal(mkdir(dir, 0755), 0);
  static const char *files[] = {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"};
  char cwd[1024];
  assert_non_null(getcwd(cwd, sizeof cwd));
  for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
    char src[2048], dst[1024];
    snprintf(src, sizeof src, "%s/%s/%s", cwd, SMALL, files[i]);
    snprintf(dst, sizeof dst, "%s/%s", dir, files[i]);
    assert_int_equal(symlink(src, dst), 0);
  }
  dg_model *nm = NULL;
  assert_dg_ok(dg_model_load(dir, &mp, &nm));
  dg_model_get_info(nm, &info);
  assert_int_equal(info.has_generation_config, 0);
  dg_gen_params gp = dg_gen_default_params(nm);
  char ids_s[128] = "";
  for (int i = 0; i < gp.n_stop_ids; i++) snprintf(ids_s + strlen(ids_s), sizeof ids_s - strlen(ids_s), "%s%d", i ? ", " : "", gp.stop_ids[i]);
  assert_true(gp.n_stop_ids >= 1);
  dg_model_free(nm);
  snprintf(want, sizeof want, "dgemma: warning: %s has no generation_config.json: the generation defaults are the "
           "built-in ones and the stop ids only config.json's eos_token_id (%s)\n", dir, ids_s);
  const char *cmds[] = {"info -t 1", "run -t 1 -n 64 -s 1 --greedy -p hi"};
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof args, "%s -m %s", cmds[i], dir);
    assert_int_equal(cli(args, &out, &err), 0);
    printf("# %s:\n%s", args, err);
    if (strncmp(err, want, strlen(want))) fail_msg("%s: stderr \"%s\" (want it to start with \"%s\")", args, err, want);
    assert_int_equal(count_char(err, '\n'), i == 0 ? 1 : 4); /* the warning (and run's 3 summary lines) */
    free(out);
    free(err);
  }
  snprintf(args, sizeof args, "tokenize -m %s hi", dir); /* a command that does not generate says nothing */
  assert_int_equal(cli(args, &out, &err), 0);
  assert_string_equal(err, "");
  free(out);
  free(err);
  snprintf(args, sizeof args, "info -t 1 -m %s", SMALL); /* the bundled model has one: no warning */
  assert_int_equal(cli(args, &out, &err), 0);
  assert_string_equal(err, "");
  free(out);
  free(err);
  dg_model_free(m);
}

/* run with its standard input on a terminal and no prompt: a usage error, not a wait for input. */
static void test_no_prompt_on_terminal(void **state) {
  (void)state;
  const char *argv[] = {"dgemma", "run", "-m", "/nonexistent", NULL};
  pty_session s;
  pty_start(&s, argv);
  pty_expect(&s, 0, "dgemma run: no prompt given: -p TEXT, -p - (standard input), -f FILE, or a pipe; see `dgemma run "
                    "--help`\n", 20);
  assert_int_equal(pty_finish(&s), 2);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quantize_interrupted),
      cmocka_unit_test(test_mkrandom_interrupted),
      cmocka_unit_test(test_interrupted_twice),
      cmocka_unit_test(test_logits_interrupted),
      cmocka_unit_test(test_eval_summary_interrupted),
      cmocka_unit_test(test_output_targets),
      cmocka_unit_test(test_outdir_symlink),
      cmocka_unit_test(test_stdout_full),
      cmocka_unit_test(test_file_size_limit),
      cmocka_unit_test(test_reader_gone),
      cmocka_unit_test(test_eos_empty_count),
      cmocka_unit_test(test_eval_eos_empty_count),
      cmocka_unit_test(test_help),
      cmocka_unit_test(test_rejected_options),
      cmocka_unit_test(test_empty_values),
      cmocka_unit_test(test_dash_output),
      cmocka_unit_test(test_tiny_temperature),
      cmocka_unit_test(test_sc_logits_nonfinite),
      cmocka_unit_test(test_serve_empty_values),
      cmocka_unit_test(test_nul_streams),
      cmocka_unit_test(test_invalid_utf8_source),
      cmocka_unit_test(test_recipe_empty_items),
      cmocka_unit_test(test_new_user_findings),
      cmocka_unit_test(test_gen_kwargs_exit),
      cmocka_unit_test(test_gen_kwargs_vocab),
      cmocka_unit_test(test_prompt_sources),
      cmocka_unit_test(test_json),
      cmocka_unit_test(test_stop),
      cmocka_unit_test(test_temp),
      cmocka_unit_test(test_pieces_detokenize),
      cmocka_unit_test(test_threads),
      cmocka_unit_test(test_info_and_no_tokenizer),
      cmocka_unit_test(test_review_findings),
      cmocka_unit_test(test_review2_findings),
      cmocka_unit_test(test_chat),
      cmocka_unit_test(test_chat_interrupt),
      cmocka_unit_test(test_chat_nul_line),
      cmocka_unit_test(test_chat_ctrl_c_at_prompt),
      cmocka_unit_test(test_no_prompt_on_terminal),
  };
  if (getenv("DG_TEST_FILTER")) cmocka_set_test_filter(getenv("DG_TEST_FILTER")); /* e.g. "test_stop" */
  return cmocka_run_group_tests(tests, setup, teardown);
}
