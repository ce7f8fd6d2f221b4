/* test_cli.c: the CLI when it is interrupted or cannot write (issue 16).
 *
 * Checks:
 *   - quantize, mkrandom and logits interrupted by SIGINT and by SIGTERM at
 *     random moments (a few runs each, seed printed): the exit status is 130
 *     or 143 and nothing partial is left (no output directory, an empty one
 *     left empty, an existing -o file byte for byte as before, no temporary
 *     sibling); a run the signal reached only after its output was complete
 *     exits 0 with the complete output. A rerun after an interruption works.
 *   - `run` and `tokenize` with stdout on /dev/full: exit 1 and a message.
 *   - with {"eos_token_id": []} the token count of a generation (library
 *     n_visible and the summary of `dgemma run`) is the number of tokens the
 *     detokenizer shows, not every canvas position.
 * The models are the bundled one and `mkrandom --config small`, one thread. */
#include "testutil.h"

#include <errno.h>
#include <signal.h>
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
static int run_signalled(const char *const *argv, int sig, long delay_us, int *sent) {
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
    execv(g_exe, (char *const *)argv);
    _exit(127);
  }
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
  for (int i = 0; i < 4; i++) {
    const int sig = i % 2 ? SIGTERM : SIGINT;
    /* run 0 at once (always interrupted), the others at a random moment of a whole run */
    const long delay = i == 0 ? 0 : (long)((double)rand() / RAND_MAX * T * 1e6);
    snprintf(out, sizeof out, "%s/%s-%d", g_dir, name, i);
    const int pre_empty = i == 1; /* an empty directory given as OUT_DIR stays, empty */
    if (pre_empty) assert_int_equal(mkdir(out, 0755), 0);
    writer_argv(w, out, argv);
    int sent;
    st = run_signalled(argv, sig, delay, &sent);
    char *e = read_err();
    assert_true(WIFEXITED(st));
    const int code = WEXITSTATUS(st);
    printf("# %s run %d: %s after %.3f s of %.3f s -> exit %d\n", name, i, sig == SIGINT ? "SIGINT" : "SIGTERM",
           delay / 1e6, T, code);
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
  for (int i = 0; i < 4; i++) {
    const int sig = i % 2 ? SIGTERM : SIGINT;
    const long delay = i == 0 ? 0 : (long)((double)rand() / RAND_MAX * T * 1e6);
    f = fopen(out, "w");
    fputs(previous, f);
    fclose(f);
    int sent;
    st = run_signalled(argv, sig, delay, &sent);
    assert_true(WIFEXITED(st));
    const int code = WEXITSTATUS(st);
    printf("# logits run %d: %s after %.3f s of %.3f s -> exit %d\n", i, sig == SIGINT ? "SIGINT" : "SIGTERM",
           delay / 1e6, T, code);
    size_t len = 0;
    char *got = dg_test_read_file(out, &len);
    assert_non_null(got);
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

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_quantize_interrupted),
      cmocka_unit_test(test_mkrandom_interrupted),
      cmocka_unit_test(test_logits_interrupted),
      cmocka_unit_test(test_stdout_full),
      cmocka_unit_test(test_eos_empty_count),
  };
  return cmocka_run_group_tests(tests, setup, teardown);
}
