/* test_eval.c: the GSM8K harness (tools/gsm8k.c) and the bench helpers
 * (tools/bench.c), without a model: answer extraction and stop-string cutting
 * on hand-worked cases, the exact 5-shot prompt text from a synthetic fixture
 * (tests/fixtures/gsm8k), Wilson intervals against textbook values, data
 * errors, and resuming an interrupted run through a fake generator. The CLI's
 * data and model errors are checked by running build/dgemma (no generation). */
#include "testutil.h"

#include <math.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"
#include "gsm8k.h"

#define FIX DG_FIXTURES "/gsm8k"

/* ---- answer extraction ------------------------------------------------------ */

static void check_answer(const char *text, const char *want) {
  char got[64] = "unset";
  int ok = gsm8k_answer_value(text, got, sizeof got);
  if (!want) {
    if (ok) fail_msg("\"%s\": expected INVALID, got \"%s\"", text, got);
  } else {
    if (!ok) fail_msg("\"%s\": expected \"%s\", got INVALID", text, want);
    if (strcmp(got, want)) fail_msg("\"%s\": expected \"%s\", got \"%s\"", text, want, got);
  }
}

static void test_answer_value(void **state) {
  (void)state;
  /* re.findall(r"\d+", s.replace(",", ""))[-1], then ast.literal_eval */
  check_answer("The answer is 18.", "18");
  check_answer("Janet sells 16 - 3 - 4 = <<16-3-4=9>>9 duck eggs a day.\n#### 18", "18");
  check_answer("He pays $1,234,567 in total", "1234567");
  check_answer("#### 2,400", "2400");
  check_answer("3 and then 1,2", "12");     /* commas dropped first: "12" */
  check_answer("it is 42, ", "42");         /* a trailing comma */
  check_answer("5, 6", "6");
  check_answer("x = -7", "7");              /* no sign */
  check_answer("about 2.5 hours", "5");     /* "2", "5": the last run */
  check_answer("0", "0");
  check_answer("00", "0");                  /* literal_eval("00") == 0 */
  check_answer("the code is 007", NULL);    /* SyntaxError in literal_eval: INVALID */
  check_answer("no digits here", NULL);
  check_answer("", NULL);
  check_answer("12 apples\n\nQuestion: 99", "99"); /* extraction alone does not cut */
  check_answer("\xd9\xa3 Arabic-Indic three is not ASCII", NULL);
}

static void test_stop_cut(void **state) {
  (void)state;
  const char *const *S = gsm8k_stop_strings;
  const int n = gsm8k_n_stop_strings;
  assert_int_equal(n, 3);
  assert_string_equal(S[0], "Question");
  assert_string_equal(S[1], "Assistant:");
  assert_string_equal(S[2], "<|separator|>");
  int which;
  const char *t1 = " 3 + 2 = 5\n#### 5\n\nQuestion: next one 7";
  assert_int_equal(gsm8k_stop_cut(t1, S, n, &which), 19);
  assert_int_equal(which, 0);
  const char *t2 = "x Assistant: y Question z";
  assert_int_equal(gsm8k_stop_cut(t2, S, n, &which), 2); /* the earliest of any stop string */
  assert_int_equal(which, 1);
  assert_int_equal(gsm8k_stop_cut("<|separator|>1", S, n, &which), 0);
  assert_int_equal(which, 2);
  assert_int_equal(gsm8k_stop_cut("question is lower case 4", S, n, &which), 24);
  assert_int_equal(which, -1);
  assert_int_equal(gsm8k_stop_cut("Assistant without colon", S, n, &which), 23);
  assert_int_equal(which, -1);
  /* cut, then extract: the 7 after the stop string must not count */
  char buf[64], got[16];
  strcpy(buf, t1);
  buf[gsm8k_stop_cut(buf, S, n, NULL)] = 0;
  assert_string_equal(buf, " 3 + 2 = 5\n#### 5\n\n");
  assert_true(gsm8k_answer_value(buf, got, sizeof got));
  assert_string_equal(got, "5");
}

/* ---- prompts ------------------------------------------------------------------ */

static void test_fewshot_prompt(void **state) {
  (void)state;
  gsm8k_set train, test;
  char err[512];
  assert_int_equal(gsm8k_load(FIX "/train.jsonl", 5, &train, err, sizeof err), 0);
  assert_int_equal(train.n, 5);
  assert_int_equal(gsm8k_load(FIX "/test.jsonl", 0, &test, err, sizeof err), 0);
  assert_int_equal(test.n, 4); /* the blank line is skipped */
  assert_string_equal(train.items[1].label, "2400");
  assert_string_equal(test.items[2].label, "2000");
  assert_string_equal(test.items[3].label, "0");
  char *prefix = gsm8k_fewshot_prefix(&train, 5);
  char *p = gsm8k_prompt(prefix, test.items[0].question);
  const char *want =
      "Question: Ann has 3 pens and buys 4 more. How many pens does she have?\n"
      "Answer: She has 3 + 4 = <<3+4=7>>7 pens.\n#### 7\n\n"
      "Question: A box holds 1,200 nails. How many nails are in 2 boxes?\n"
      "Answer: 2 * 1,200 = <<2*1200=2400>>2,400\n#### 2,400\n\n"
      "Question: Tom is 9. How old is he in 1 year?\n"
      "Answer: 9 + 1 = <<9+1=10>>10\n#### 10\n\n"
      "Question: What is 6 divided by 3?\n"
      "Answer: 6 / 3 = <<6/3=2>>2\n#### 2\n\n"
      "Question: Sue reads 5 pages a day for 4 days. How many pages?\n"
      "Answer: 5 * 4 = <<5*4=20>>20\n#### 20\n\n"
      "Question: Bo has 2 cats and 3 dogs. How many pets?\n"
      "Answer:";
  assert_string_equal(p, want);
  free(p);
  free(prefix);
  /* zero-shot (the chat variant's user text) */
  prefix = gsm8k_fewshot_prefix(&train, 0);
  p = gsm8k_prompt(prefix, test.items[1].question);
  assert_string_equal(p, "Question: A pie is cut into 8 slices and 3 are eaten. How many are left?\nAnswer:");
  free(p);
  free(prefix);
  assert_null(gsm8k_fewshot_prefix(&train, 6)); /* only 5 loaded */
  gsm8k_set_free(&train);
  gsm8k_set_free(&test);
}

/* ---- Wilson ------------------------------------------------------------------- */

static void test_wilson(void **state) {
  (void)state;
  double lo, hi;
  /* textbook values (e.g. Newcombe 1998, Table I style): 5/10 -> 0.2366-0.7634, 0/10 -> 0-0.2775 */
  gsm8k_wilson(5, 10, &lo, &hi);
  assert_true(fabs(lo - 0.236593090512564) < 1e-12 && fabs(hi - 0.763406909487436) < 1e-12);
  gsm8k_wilson(0, 10, &lo, &hi);
  assert_true(lo == 0.0 && fabs(hi - 0.277532799862889) < 1e-12);
  gsm8k_wilson(0, 2, &lo, &hi);
  assert_true(lo == 0.0 && fabs(hi - 0.657619772493347) < 1e-12);
  gsm8k_wilson(37, 1000, &lo, &hi); /* docs/measurements.md: 3.7 %, 2.7-5.1 % */
  assert_true(fabs(lo - 0.026961180875555) < 1e-12 && fabs(hi - 0.050582397482069) < 1e-12);
  gsm8k_wilson(1319, 1319, &lo, &hi);
  assert_true(fabs(lo - 0.997096055014696) < 1e-12 && fabs(hi - 1.0) < 1e-15);
  gsm8k_wilson(0, 0, &lo, &hi);
  assert_true(lo == 0.0 && hi == 1.0);
}

/* ---- data errors ------------------------------------------------------------------ */

static char g_dir[256];

static const char *tmp_file(const char *name, const char *content) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s", g_dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  fputs(content, f);
  fclose(f);
  return path;
}

static void expect_load_error(const char *name, const char *content, const char *needle) {
  gsm8k_set s;
  char err[1024] = "";
  const char *path = content ? tmp_file(name, content) : name;
  assert_int_equal(gsm8k_load(path, 0, &s, err, sizeof err), -1);
  if (!strstr(err, needle)) fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
  assert_null(s.items);
}

static void test_load_errors(void **state) {
  (void)state;
  expect_load_error("/nonexistent/gsm8k/test.jsonl", NULL, "cannot open /nonexistent/gsm8k/test.jsonl");
  expect_load_error("bad1.jsonl", "{\"question\": \"a\", \"answer\": \"#### 1\"}\n{\"question\": \"b\", \"answ\n",
                    "bad1.jsonl line 2: not a JSON object");
  expect_load_error("bad2.jsonl", "{\"question\": \"a\"}\n", "line 1: \"question\" and \"answer\" must both be strings");
  expect_load_error("bad3.jsonl", "{\"question\": \"a\", \"answer\": 5}\n", "line 1: \"question\" and \"answer\"");
  expect_load_error("bad4.jsonl", "\n{\"question\": \"a\", \"answer\": \"no number\"}\n",
                    "line 2: the gold answer holds no valid number");
  expect_load_error("empty.jsonl", "\n\n", "holds no records");
  expect_load_error("list.jsonl", "[1, 2]\n", "line 1: not a JSON object");
}

/* ---- the loop and resuming ---------------------------------------------------------- */

typedef struct fake {
  int calls[16], n_calls;
  int interrupt_at; /* idx at which to report an interruption (-1 never) */
  int fail_at;      /* idx at which to fail (-1 never) */
} fake;

/* Canned outputs: idx 0 right answer then a stop string and a wrong number; idx 1 wrong; idx 2 no number;
 * idx 3 right ("0") with the model's own stop id. */
static int fake_gen(void *ud, const char *prompt, int idx, gsm8k_gen_out *out, char *err, size_t errlen) {
  fake *f = ud;
  if (idx == f->interrupt_at) return 1;
  if (idx == f->fail_at) { snprintf(err, errlen, "fake failure at %d", idx); return -1; }
  assert_non_null(strstr(prompt, "Question: Sue reads")); /* 5-shot prefix present */
  f->calls[f->n_calls++] = idx;
  static const char *texts[] = {" 2 + 3 = 5\n#### 5\n\nQuestion: 123", " I think 4", " many", " 0 * 9 = 0. #### 0"};
  out->text = strdup(texts[idx]);
  out->tokens = 10 + idx;
  out->forwards = 4;
  out->blocks = 2;
  out->eos = idx == 3;
  out->seconds = 0.5;
  return 0;
}

static int count_lines(const char *path) {
  char *s = dg_test_read_file(path, NULL);
  int n = 0;
  for (char *p = s; p && *p; p++) n += *p == '\n';
  free(s);
  return n;
}

static void test_resume(void **state) {
  (void)state;
  gsm8k_set train, test;
  char err[1024] = "", out[512];
  assert_int_equal(gsm8k_load(FIX "/train.jsonl", 5, &train, err, sizeof err), 0);
  assert_int_equal(gsm8k_load(FIX "/test.jsonl", 0, &test, err, sizeof err), 0);
  snprintf(out, sizeof out, "%s/items.jsonl", g_dir);
  unlink(out);
  gsm8k_run_opts o = {&test, &train, 5, 0, out, "cfg-A", 0, 0};
  gsm8k_summary s;
  /* first run: interrupted at item 2; items 0 and 1 are kept */
  fake f = {.interrupt_at = 2, .fail_at = -1};
  assert_int_equal(gsm8k_run(&o, fake_gen, &f, &s, err, sizeof err), 1);
  assert_int_equal(s.n, 2);
  assert_int_equal(s.interrupted, 1);
  assert_int_equal(s.correct, 1);
  assert_int_equal(count_lines(out), 2);
  char *txt = dg_test_read_file(out, NULL);
  assert_non_null(strstr(txt, "\"idx\":0,\"config\":\"cfg-A\",\"label\":\"5\",\"pred\":\"5\",\"correct\":true,"
                              "\"stop\":\"Question\",\"output\":\" 2 + 3 = 5\\n#### 5\\n\\n\""));
  assert_non_null(strstr(txt, "\"idx\":1,\"config\":\"cfg-A\",\"label\":\"5\",\"pred\":\"4\",\"correct\":false,"
                              "\"stop\":\"length\""));
  free(txt);
  /* a torn write of item 2 (no newline) is dropped on resume */
  FILE *fp = fopen(out, "a");
  fputs("{\"idx\":2,\"config\":\"cfg-A\",\"lab", fp);
  fclose(fp);
  /* second run: only items 2 and 3 are generated; totals cover all four */
  fake g = {.interrupt_at = -1, .fail_at = -1};
  assert_int_equal(gsm8k_run(&o, fake_gen, &g, &s, err, sizeof err), 0);
  assert_int_equal(g.n_calls, 2);
  assert_int_equal(g.calls[0], 2);
  assert_int_equal(g.calls[1], 3);
  assert_int_equal(s.n, 4);
  assert_int_equal(s.resumed, 2);
  assert_int_equal(s.correct, 2);  /* items 0 and 3 */
  assert_int_equal(s.invalid, 1);  /* item 2 */
  assert_int_equal(s.tokens, 10 + 11 + 12 + 13);
  assert_int_equal(s.forwards, 16);
  assert_int_equal(s.blocks, 8);
  assert_true(fabs(s.seconds - 2.0) < 1e-9);
  assert_true(fabs(s.acc - 0.5) < 1e-12);
  assert_true(fabs(s.lo - 0.150038989) < 1e-8 && fabs(s.hi - 0.849961011) < 1e-8); /* Wilson 2/4 */
  assert_int_equal(count_lines(out), 4);
  txt = dg_test_read_file(out, NULL);
  assert_null(strstr(txt, "\"lab{")); /* the torn line is gone */
  assert_non_null(strstr(txt, "\"idx\":3,\"config\":\"cfg-A\",\"label\":\"0\",\"pred\":\"0\",\"correct\":true,\"stop\":\"eos\""));
  free(txt);
  /* third run: nothing left to do */
  fake h = {.interrupt_at = -1, .fail_at = -1};
  assert_int_equal(gsm8k_run(&o, fake_gen, &h, &s, err, sizeof err), 0);
  assert_int_equal(h.n_calls, 0);
  assert_int_equal(s.n, 4);
  assert_int_equal(s.resumed, 4);
  /* a smaller --limit ignores lines beyond it */
  gsm8k_set first2 = {test.items, 2};
  gsm8k_run_opts o2 = o;
  o2.test = &first2;
  assert_int_equal(gsm8k_run(&o2, fake_gen, &h, &s, err, sizeof err), 0);
  assert_int_equal(s.n, 2);
  assert_int_equal(s.n_target, 2);
  /* another configuration refuses the file */
  gsm8k_run_opts o3 = o;
  o3.config = "cfg-B";
  assert_int_equal(gsm8k_run(&o3, fake_gen, &h, &s, err, sizeof err), -1);
  assert_non_null(strstr(err, "written by another configuration"));
  assert_non_null(strstr(err, "cfg-A"));
  assert_int_equal(h.n_calls, 0);
  /* a generator failure keeps what was written */
  unlink(out);
  fake k = {.interrupt_at = -1, .fail_at = 1};
  assert_int_equal(gsm8k_run(&o, fake_gen, &k, &s, err, sizeof err), -1);
  assert_string_equal(err, "fake failure at 1");
  assert_int_equal(count_lines(out), 1);
  assert_int_equal(s.n, 1);
  gsm8k_set_free(&train);
  gsm8k_set_free(&test);
}

static void test_resume_malformed(void **state) {
  (void)state;
  uint8_t done[8] = {0};
  gsm8k_summary s;
  char err[1024];
  const char *p = tmp_file("r1.jsonl", "{\"idx\":0,\"config\":\"c\",\"pred\":null,\"correct\":false,\"tokens\":1,"
                                       "\"forwards\":1,\"blocks\":1,\"seconds\":1}\nnot json\n");
  memset(&s, 0, sizeof s);
  assert_int_equal(gsm8k_resume_read(p, "c", done, 8, &s, err, sizeof err), -1);
  assert_non_null(strstr(err, "r1.jsonl line 2 is not a gsm8k result line"));
  memset(done, 0, sizeof done);
  p = tmp_file("r2.jsonl", "{\"idx\":1,\"config\":\"c\",\"pred\":\"3\",\"correct\":true,\"tokens\":1,\"forwards\":1,"
                           "\"blocks\":1,\"seconds\":1}\n{\"idx\":1,\"config\":\"c\",\"pred\":\"3\",\"correct\":true,"
                           "\"tokens\":1,\"forwards\":1,\"blocks\":1,\"seconds\":1}\n");
  memset(&s, 0, sizeof s);
  assert_int_equal(gsm8k_resume_read(p, "c", done, 8, &s, err, sizeof err), -1);
  assert_non_null(strstr(err, "line 2: idx 1 appears twice"));
  memset(done, 0, sizeof done);
  p = tmp_file("r3.jsonl", "{\"idx\":-1,\"config\":\"c\",\"pred\":null,\"correct\":false,\"tokens\":1,\"forwards\":1,"
                           "\"blocks\":1,\"seconds\":1}\n");
  memset(&s, 0, sizeof s);
  assert_int_equal(gsm8k_resume_read(p, "c", done, 8, &s, err, sizeof err), -1);
  assert_non_null(strstr(err, "line 1 is not a gsm8k result line"));
  /* a device is refused, not read as one endless line (/dev/full and /dev/zero grew getline's
   * buffer until the process was killed) */
  memset(&s, 0, sizeof s);
  assert_int_equal(gsm8k_resume_read("/dev/full", "c", done, 8, &s, err, sizeof err), -1);
  assert_non_null(strstr(err, "-o /dev/full is not a regular file"));
  assert_int_equal(s.n, 0);
  /* counts past 2^53 are refused, not cast to int64_t (undefined; fuzz_gsm8k's finding
   * fuzz/regress/gsm8k/crash-tokens-4e32, whose first line this is, and the same in "tokens");
   * 2^53 itself is accepted */
  const char *huge[2] = {"{\"idx\": 0, \"config\": \"c\", \"pred\": \"0\", \"correct\": true, \"tokens\": 28, "
                         "\"forwards\": 444444444444444444444444444444449, \"blocks\": 1, \"seconds\": 0.25}\n",
                         "{\"idx\": 0, \"config\": \"c\", \"pred\": \"0\", \"correct\": true, \"tokens\": 4.4e32, "
                         "\"forwards\": 1, \"blocks\": 1, \"seconds\": 0.25}\n"};
  for (int k = 0; k < 2; k++) {
    memset(done, 0, sizeof done);
    memset(&s, 0, sizeof s);
    p = tmp_file("r4.jsonl", huge[k]);
    assert_int_equal(gsm8k_resume_read(p, "c", done, 8, &s, err, sizeof err), -1);
    assert_non_null(strstr(err, "r4.jsonl line 1 is not a gsm8k result line"));
    assert_int_equal(s.n, 0);
  }
  memset(done, 0, sizeof done);
  memset(&s, 0, sizeof s);
  p = tmp_file("r5.jsonl", "{\"idx\": 0, \"config\": \"c\", \"pred\": \"0\", \"correct\": true, "
                           "\"tokens\": 9007199254740992, \"forwards\": 1, \"blocks\": 1, \"seconds\": 0.25}\n");
  assert_int_equal(gsm8k_resume_read(p, "c", done, 8, &s, err, sizeof err), 0);
  assert_int_equal(s.n, 1);
  assert_true(s.tokens == 9007199254740992LL);
  /* a last line without a newline: dropped if it is the start of a result line ('{"idx":' or a prefix of it), an
   * error that leaves the file as it was if not (-o naming some other file; it was truncated away: review aud16) */
  memset(done, 0, sizeof done);
  memset(&s, 0, sizeof s);
  p = tmp_file("r6.jsonl", "{\"id");
  assert_int_equal(gsm8k_resume_read(p, "c", done, 8, &s, err, sizeof err), 0);
  size_t flen = 1;
  char *ft = dg_test_read_file(p, &flen);
  assert_non_null(ft);
  assert_int_equal(flen, 0);
  free(ft);
  p = tmp_file("r7.jsonl", "notes without a newline");
  assert_int_equal(gsm8k_resume_read(p, "c", done, 8, &s, err, sizeof err), -1);
  assert_non_null(strstr(err, "r7.jsonl line 1 has no newline and is not the start of a gsm8k result line"));
  ft = dg_test_read_file(p, &flen);
  assert_non_null(ft);
  assert_int_equal(flen, strlen("notes without a newline"));
  free(ft);
  /* a missing file is a fresh start */
  memset(&s, 0, sizeof s);
  assert_int_equal(gsm8k_resume_read("/nonexistent/items.jsonl", "c", done, 8, &s, err, sizeof err), 0);
  assert_int_equal(s.n, 0);
}

/* ---- the CLI's error paths (no generation) --------------------------------------------- */

/* Run the CLI next to this test binary (build/tests/test_eval -> build/dgemma); stderr to a file. */
static int run_cli(const char *args, char **stderr_text) { return dg_test_run_cli(g_dir, args, NULL, stderr_text); }

/* run_cli, keeping stdout too */
static int run_cli_out(const char *args, char **stdout_text, char **stderr_text) {
  return dg_test_run_cli(g_dir, args, stdout_text, stderr_text);
}

static void test_cli_errors(void **state) {
  (void)state;
  char args[1024], *e;
  assert_int_equal(run_cli("eval gsm8k --data /nonexistent/dir", &e), 1);
  assert_non_null(strstr(e, "cannot open /nonexistent/dir/test.jsonl"));
  free(e);
  /* malformed data: reported before the model is loaded, with file and line */
  char d[600];
  snprintf(d, sizeof d, "%s/baddata", g_dir);
  mkdir(d, 0700);
  snprintf(args, sizeof args, "%s/test.jsonl", d);
  FILE *f = fopen(args, "w");
  fputs("{\"question\": \"q\", \"answer\": \"#### 1\"}\n{oops\n", f);
  fclose(f);
  snprintf(args, sizeof args, "eval gsm8k -m /nonexistent/model --data %s", d);
  assert_int_equal(run_cli(args, &e), 1);
  assert_non_null(strstr(e, "test.jsonl line 2: not a JSON object"));
  free(e);
  /* good data, a model directory that does not load */
  snprintf(args, sizeof args, "eval gsm8k -m %s --data " FIX, g_dir);
  assert_int_equal(run_cli(args, &e), 1);
  assert_non_null(strstr(e, "cannot load model"));
  free(e);
  /* a train file too short for the shots asked */
  snprintf(args, sizeof args, "eval gsm8k --shots 9 -m %s --data " FIX, g_dir);
  assert_int_equal(run_cli(args, &e), 1);
  assert_non_null(strstr(e, "9-shot prompts need 9"));
  free(e);
  assert_int_equal(run_cli("bench --protocol vllm -m /nonexistent/model", &e), 1);
  assert_non_null(strstr(e, "cannot load model /nonexistent/model"));
  free(e);
}

/* The bundled model on the fixture, 1 canvas of 64 and 2 steps per item: a few seconds. */
#define FAST "eval gsm8k -m models/dgemma-small --data " FIX " -t 1 -n 64 -s 2 "

static void test_cli_resume(void **state) {
  (void)state;
  char args[2048], items[600], summ[600], *e;
  snprintf(items, sizeof items, "%s/cli_items.jsonl", g_dir);
  snprintf(summ, sizeof summ, "%s/cli_summary.json", g_dir);
  snprintf(args, sizeof args, FAST "--limit 2 -o %s --summary %s", items, summ);
  assert_int_equal(run_cli(args, &e), 0);
  free(e);
  assert_int_equal(count_lines(items), 2);
  char *first = dg_test_read_file(items, NULL);
  /* extend to 4 items: the 2 done are skipped and counted */
  snprintf(args, sizeof args, FAST "--limit 4 -o %s --summary %s", items, summ);
  assert_int_equal(run_cli(args, &e), 0);
  if (!strstr(e, "resuming: 2 of 4 items already in")) fail_msg("stderr: %s", e);
  free(e);
  assert_int_equal(count_lines(items), 4);
  char *all = dg_test_read_file(items, NULL);
  assert_memory_equal(all, first, strlen(first)); /* the first two lines untouched */
  for (int i = 0; i < 4; i++) {
    char key[32];
    snprintf(key, sizeof key, "{\"idx\":%d,", i);
    assert_non_null(strstr(all, key));
  }
  assert_non_null(strstr(all, "\"label\":\"2000\""));
  free(all);
  free(first);
  char *js = dg_test_read_file(summ, NULL);
  assert_non_null(strstr(js, "\"items\":4,\"items_target\":4,"));
  assert_non_null(strstr(js, "\"complete\":true"));
  free(js);
  /* another configuration on the same file is refused, the file unchanged */
  snprintf(args, sizeof args, FAST "--chat --limit 4 -o %s", items);
  assert_int_equal(run_cli(args, &e), 1);
  assert_non_null(strstr(e, "written by another configuration"));
  free(e);
  assert_int_equal(count_lines(items), 4);
}

/* `eval problems` on the committed held-out file (records without "id"): the record index
 * is the id (and seed + id the seed), as eval_hf.py numbers the same file; 1 canvas, 2 steps. */
static void test_cli_problems_ids(void **state) {
  (void)state;
  char args[2048], items[600], *e;
  snprintf(items, sizeof items, "%s/problems_items.jsonl", g_dir);
  snprintf(args, sizeof args,
           "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --limit 2 "
           "--file tools/smallmodel/data/problems_heldout.jsonl -o %s", items);
  int rc = run_cli(args, &e);
  if (rc != 0) fail_msg("exit %d, stderr: %s", rc, e);
  free(e);
  assert_int_equal(count_lines(items), 2);
  char *all = dg_test_read_file(items, NULL);
  char *l2 = strchr(all, '\n');
  assert_non_null(l2);
  *l2++ = 0;
  assert_non_null(strstr(all, "{\"id\":0,"));  /* line 1 of the held-out file */
  assert_non_null(strstr(all, "\"steps\":1,\"final\":9,"));
  assert_non_null(strstr(l2, "{\"id\":1,"));   /* line 2 */
  assert_non_null(strstr(l2, "\"steps\":1,\"final\":8,"));
  assert_non_null(strstr(all, "\"tokens\":"));
  assert_non_null(strstr(all, "\"forwards\":"));
  assert_non_null(strstr(all, "\"seconds\":"));
  free(all);
  /* a larger --limit resumes: only the third problem is generated */
  snprintf(args, sizeof args,
           "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --limit 3 "
           "--file tools/smallmodel/data/problems_heldout.jsonl -o %s", items);
  char *out = NULL;
  rc = run_cli_out(args, &out, &e);
  if (rc != 0) fail_msg("exit %d, stderr: %s", rc, e);
  assert_non_null(strstr(e, "2 problems resumed from"));
  assert_non_null(strstr(out, "3 problems (2 resumed from the output file)"));
  free(e);
  free(out);
  assert_int_equal(count_lines(items), 3);
  /* a smaller --limit counts only the problems within it (nothing generated, the file kept) */
  snprintf(args, sizeof args,
           "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --limit 1 "
           "--file tools/smallmodel/data/problems_heldout.jsonl -o %s", items);
  rc = run_cli_out(args, &out, &e);
  if (rc != 0) fail_msg("exit %d, stderr: %s", rc, e);
  assert_non_null(strstr(out, "1 problems (1 resumed from the output file)"));
  free(e);
  free(out);
  assert_int_equal(count_lines(items), 3);
  /* a torn last write ('{"id":' cut short, no newline) is dropped on resume; a file whose last line has no newline
   * and is not the start of a result line (-o naming some other file) is refused and kept byte for byte: it was
   * truncated away (review aud16) */
  FILE *f = fopen(items, "a");
  assert_non_null(f);
  fputs("{\"i", f);
  fclose(f);
  snprintf(args, sizeof args,
           "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --limit 3 "
           "--file tools/smallmodel/data/problems_heldout.jsonl -o %s", items);
  rc = run_cli_out(args, &out, &e);
  if (rc != 0) fail_msg("exit %d, stderr: %s", rc, e);
  assert_non_null(strstr(out, "3 problems (3 resumed from the output file)"));
  free(e);
  free(out);
  assert_int_equal(count_lines(items), 3);
  size_t tlen = 0;
  char *txt = dg_test_read_file(items, &tlen);
  assert_true(tlen >= 2 && !strcmp(txt + tlen - 2, "}\n")); /* the torn start is gone, the 3 lines whole */
  free(txt);
  char notes[600];
  snprintf(notes, sizeof notes, "%s/notes.txt", g_dir);
  f = fopen(notes, "w");
  assert_non_null(f);
  fputs("my notes, no newline at the end", f);
  fclose(f);
  snprintf(args, sizeof args,
           "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --limit 1 "
           "--file tools/smallmodel/data/problems_heldout.jsonl -o %s", notes);
  assert_int_equal(run_cli(args, &e), 1);
  assert_non_null(strstr(e, "line 1 has no newline and is not the start of a problems result line"));
  free(e);
  size_t nlen = 0;
  txt = dg_test_read_file(notes, &nlen);
  assert_non_null(txt);
  assert_int_equal(nlen, strlen("my notes, no newline at the end"));
  assert_memory_equal(txt, "my notes, no newline at the end", nlen);
  free(txt);
  /* the same ids from another problems file: refused, naming the id */
  char other[600];
  snprintf(other, sizeof other, "%s/other_problems.jsonl", g_dir);
  f = fopen(other, "w");
  assert_non_null(f);
  fputs("{\"id\": 0, \"question\": \"Tom has 5 pens. He buys 2 more pens. How many pens does Tom have?\", "
        "\"steps\": 1, \"final\": 7}\n", f);
  fclose(f);
  snprintf(args, sizeof args, "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --file %s -o %s", other, items);
  assert_int_equal(run_cli(args, &e), 1);
  assert_non_null(strstr(e, "problem id 0 is not the problem"));
  free(e);
  /* an id twice in the problems file: refused before a second answer is written */
  char dup[600], dupout[600];
  snprintf(dup, sizeof dup, "%s/dup_problems.jsonl", g_dir);
  snprintf(dupout, sizeof dupout, "%s/dup_items.jsonl", g_dir);
  f = fopen(dup, "w");
  assert_non_null(f);
  fputs("{\"id\": 7, \"question\": \"Tom has 5 pens. How many pens does Tom have?\", \"steps\": 1, \"final\": 5}\n"
        "{\"id\": 7, \"question\": \"Mia has 3 cards. How many cards does Mia have?\", \"steps\": 1, \"final\": 3}\n", f);
  fclose(f);
  snprintf(args, sizeof args, "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --file %s -o %s", dup, dupout);
  assert_int_equal(run_cli(args, &e), 1);
  assert_non_null(strstr(e, "line 2: problem id 7 appears twice"));
  free(e);
  assert_int_equal(count_lines(dupout), 1);
  /* -o on a device: refused by name (it read /dev/full as one endless line until killed) */
  snprintf(args, sizeof args, "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --file %s -o /dev/full", dup);
  assert_int_equal(run_cli(args, &e), 1);
  assert_non_null(strstr(e, "-o /dev/full is not a regular file"));
  free(e);
  /* a prompt longer than the first context (1024 + the canvases) is evaluated in a larger one, and a text window's
   * context longer than 4096 ids too (session 26: both ended the run with "context length exceeded", naming no
   * line); one past the model's 131072 positions is an error naming the file and the line */
  char longp[600], longt[600];
  snprintf(longp, sizeof longp, "%s/long_problems.jsonl", g_dir);
  snprintf(longt, sizeof longt, "%s/long_text.jsonl", g_dir);
  const int lens[2] = {1500, 131072 - 64 + 1}; /* the second: one position too many with -n 64 */
  for (int k = 0; k < 2; k++) {
    f = fopen(longp, "w");
    assert_non_null(f);
    fprintf(f, "{\"id\": 3, \"steps\": 1, \"final\": 5, \"prompt_ids\": [2");
    for (int i = 1; i < lens[k]; i++) fputs(",5", f);
    fputs("]}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --file %s", longp);
    int rc = run_cli(args, &e);
    printf("# eval problems, a prompt of %d ids -> %d: %s\n", lens[k], rc, e);
    if (k == 0) assert_int_equal(rc, 0);
    else {
      assert_int_equal(rc, 1);
      assert_non_null(strstr(e, "long_problems.jsonl line 1: problem id 3: a prompt of 131009 tokens + 1 canvas(es) of 64 "
                                "needs 131073 positions, past the model's max_position_embeddings 131072"));
    }
    free(e);
    f = fopen(longt, "w");
    assert_non_null(f);
    const int nctx = k == 0 ? 4200 : 131072 - 64 + 1; /* 4200 > the first context of 4096 */
    fprintf(f, "{\"context\": [2");
    for (int i = 1; i < nctx; i++) fputs(",5", f);
    fputs("], \"target\": [5", f);
    for (int i = 1; i < 64; i++) fputs(",5", f);
    fputs("], \"noise\": [4", f);
    for (int i = 1; i < 64; i++) fputs(",4", f);
    fputs("]}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "eval text -m models/dgemma-small -t 1 --file %s", longt);
    rc = run_cli(args, &e);
    printf("# eval text, a context of %d ids -> %d: %s\n", nctx, rc, e);
    if (k == 0) assert_int_equal(rc, 0);
    else {
      assert_int_equal(rc, 1);
      assert_non_null(strstr(e, "long_text.jsonl line 1: a context of 131009 ids + the canvas of 64 needs 131073 positions"));
    }
    free(e);
  }
  unlink(longp);
  unlink(longt);
  /* gsm8k-only options are refused, not ignored */
  snprintf(args, sizeof args, "eval problems --summary /tmp/x.json --file %s", dup);
  assert_int_equal(run_cli(args, &e), 2);
  assert_non_null(strstr(e, "options of eval gsm8k"));
  free(e);
  /* another configuration on the same file is refused, the file unchanged */
  snprintf(args, sizeof args,
           "eval problems -m models/dgemma-small -t 1 -n 64 -s 2 --limit 3 --gen-kwargs '{\"diffusion_turbo\": true}' "
           "--file tools/smallmodel/data/problems_heldout.jsonl -o %s", items);
  assert_int_equal(run_cli(args, &e), 1);
  assert_non_null(strstr(e, "written by another configuration"));
  free(e);
  assert_int_equal(count_lines(items), 3);
}

/* SIGINT, SIGTERM, SIGHUP or SIGPIPE during generation: exit status 128 + the signal (130, 143, 129, 141), a clear
 * message, the partial summary on stdout, and the -o journal whole: as many complete result lines as the message
 * counts, which a rerun resumes without writing anything. Before, SIGHUP (a closed terminal) and SIGPIPE (a pipe's
 * reader gone) killed eval at their default action, without the message or the partial summary (review aud16). */
static void cli_interrupt(int sig) {
  char exe[1024], errf[600], outf[600], items[600];
  dg_test_cli_exe(exe, sizeof exe);
  snprintf(errf, sizeof errf, "%s/int.err", g_dir);
  snprintf(outf, sizeof outf, "%s/int.out", g_dir);
  snprintf(items, sizeof items, "%s/int_items_%d.jsonl", g_dir, sig);
  /* the previous run's files would show its start line before this child has reopened them */
  unlink(errf);
  unlink(outf);
  unlink(items);
  pid_t pid = fork();
  assert_true(pid >= 0);
  if (pid == 0) {
    freopen(errf, "w", stderr);
    freopen(outf, "w", stdout);
    /* the default dispositions, as at an interactive shell: a test run launched in the
     * background inherits an ignored SIGINT, which dgemma (rightly) keeps ignoring */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGHUP, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    execl(exe, exe, "eval", "gsm8k", "-m", "models/dgemma-small", "--data", FIX, "-t", "1", "-n", "64", "-s", "48",
          "--limit", "4", "-o", items, (char *)NULL);
    _exit(127);
  }
  /* wait until the handler is installed (the start line), then interrupt */
  int started = 0;
  for (int i = 0; i < 600 && !started; i++) {
    char *e = dg_test_read_file(errf, NULL);
    started = e && strstr(e, "gsm8k: 4 items from");
    free(e);
    if (!started) usleep(100000);
  }
  assert_true(started);
  /* and until the first item is journaled (one 64-token canvas: about 2.5 s, 20 s under ASan, of the 4), so that there is something to keep */
  for (int i = 0; i < 1200 && count_lines(items) < 1; i++) usleep(50000);
  assert_true(count_lines(items) >= 1);
  kill(pid, sig);
  int status;
  assert_int_equal(waitpid(pid, &status, 0), pid);
  printf("# eval gsm8k -o, %s: %s %d\n", strsignal(sig), WIFEXITED(status) ? "exit" : "killed by signal",
         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 128 + sig); /* 130 SIGINT, 143 SIGTERM, 129 SIGHUP, 141 SIGPIPE */
  char *e = dg_test_read_file(errf, NULL), *o = dg_test_read_file(outf, NULL);
  int n_done = -1;
  const char *msg = strstr(e, "interrupted after ");
  if (!msg || sscanf(msg, "interrupted after %d of 4 items", &n_done) != 1 ||
      !strstr(e, "of 4 items; rerun the same command to resume"))
    fail_msg("stderr: %s", e);
  printf("# %d of 4 items done and journaled\n", n_done);
  assert_non_null(strstr(o, "(partial)"));
  assert_non_null(strstr(o, "INTERRUPTED: rerun the same command to resume"));
  free(e);
  free(o);
  assert_true(n_done >= 1);
  /* the journal: n_done whole lines, items 0 .. n_done - 1 in order, nothing torn after them */
  size_t len = 0;
  char *j = dg_test_read_file(items, &len);
  assert_non_null(j);
  assert_int_equal(count_lines(items), n_done);
  assert_true(len == 0 || j[len - 1] == '\n');
  const char *p = j;
  for (int i = 0; i < n_done; i++) {
    char key[32];
    snprintf(key, sizeof key, "{\"idx\":%d,", i);
    assert_memory_equal(p, key, strlen(key));
    p = strchr(p, '\n') + 1;
  }
  /* resumable: a rerun of the same configuration over the items done answers them from the file */
  char args[1024], want[64];
  snprintf(args, sizeof args, "eval gsm8k -m models/dgemma-small --data " FIX " -t 1 -n 64 -s 48 --limit %d -o %s",
           n_done, items);
  assert_int_equal(run_cli(args, &e), 0);
  snprintf(want, sizeof want, "resuming: %d of %d items already in", n_done, n_done);
  if (!strstr(e, want)) fail_msg("stderr: %s", e);
  free(e);
  size_t len2 = 0;
  char *j2 = dg_test_read_file(items, &len2);
  assert_int_equal(len2, len);
  assert_memory_equal(j2, j, len);
  free(j2);
  free(j);
}

static void test_cli_interrupt(void **state) {
  (void)state;
  cli_interrupt(SIGINT);
}

static void test_cli_terminate(void **state) {
  (void)state;
  cli_interrupt(SIGTERM);
}

static void test_cli_hangup(void **state) {
  (void)state;
  cli_interrupt(SIGHUP);
}

static void test_cli_broken_pipe(void **state) {
  (void)state;
  cli_interrupt(SIGPIPE);
}

/* The reader of eval's output gone (`dgemma eval gsm8k ... 2>&1 | head -1` once head has its line): stdout and
 * stderr into a pipe whose read end is closed before the child starts, SIGPIPE at its default action as a shell
 * starts it. Every write raises SIGPIPE: the start line stops the run, and the summary and the message after it
 * fail with EPIPE instead of killing eval; exit 141, the -o file there and empty (no item was done). Before, the
 * start line's SIGPIPE killed eval (review aud16); with SIGPIPE reset to its default after the first one, as a
 * second Ctrl-C is, the summary's write would kill it. */
static void test_cli_reader_gone(void **state) {
  (void)state;
  char exe[1024], items[600];
  dg_test_cli_exe(exe, sizeof exe);
  snprintf(items, sizeof items, "%s/gone_items.jsonl", g_dir);
  unlink(items);
  const char *const argv[] = {exe, "eval", "gsm8k", "-m", "models/dgemma-small", "--data", FIX, "-t", "1", "-n", "256",
                              "-s", "48", "--limit", "4", "-o", items, NULL};
  const int status = dg_test_run_reader_gone(exe, argv);
  printf("# eval gsm8k 2>&1 | (reader gone): %s %d\n", WIFEXITED(status) ? "exit" : "killed by signal",
         WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
  assert_true(WIFEXITED(status));
  assert_int_equal(WEXITSTATUS(status), 128 + SIGPIPE);
  assert_int_equal(access(items, F_OK), 0);
  assert_int_equal(count_lines(items), 0);
}

/* ---- bench helpers ------------------------------------------------------------------- */

static void test_bench_helpers(void **state) {
  (void)state;
  double v[] = {5, 1, 4, 2, 3};
  assert_true(bench_median(v, 5) == 3.0);
  double w[] = {4, 1, 3, 2};
  assert_true(bench_median(w, 4) == 2.5);
  assert_true(bench_median(w, 0) == 0.0);
  /* floor = max(bytes / bw, flops / rate) */
  bench_cost c = {.weight_bytes = 6e9, .kv_bytes = 1e9, .other_bytes = 1e9, .flops = 2e12};
  int mb;
  assert_true(fabs(bench_floor_s(&c, 4e9, 1e12, &mb) - 2.0) < 1e-12 && mb == 1);
  assert_true(fabs(bench_floor_s(&c, 8e9, 1e12, &mb) - 2.0) < 1e-12 && mb == 0);
  assert_true(fabs(bench_floor_s(&c, 16e9, 1e12, &mb) - 2.0) < 1e-12 && mb == 0);
}

/* The cost model on the bundled model, against a hand count from its config.json:
 * H 256, V 4096, I 512, IE 128, E 8 (top 2), 4 query heads; 4 sliding layers (D 64, 2 KV heads, v_proj)
 * and 2 full layers (D 128, 1 KV head, K = V: no v_proj); canvas 64. Per token:
 *   sliding: q 65,536 + k 32,768 + v 32,768 + o 65,536 + MLP 393,216 + router 2,048 + 2 experts 196,608 = 788,480
 *   full:    q 131,072 + k 32,768 + o 131,072 + MLP 393,216 + router 2,048 + experts 196,608 = 886,784
 *   layers 2 * 64 * (4 * 788,480 + 2 * 886,784) = 630,718,464
 *   attention (64 queries x 64 keys, QK and PV) 4*64*64*4*(4*64 + 2*128) = 33,554,432
 *   LM head + self-conditioning 2 * 64 * (2 * 4096 * 256 + 3 * 512 * 256) = 318,767,104
 *   total 983,040,000 FLOPs. */
static void test_bench_cost(void **state) {
  (void)state;
  dg_model_params mp = dg_model_default_params();
  mp.no_tokenizer = 1;
  mp.n_threads = 1;
  dg_model *m = NULL;
  assert_dg_ok(dg_model_load("models/dgemma-small", &mp, &m));
  dg_model_info info;
  assert_dg_ok(dg_model_get_info(m, &info));
  assert_string_equal(info.weight_dtype, "bf16");
  bench_cost c = bench_decoder_cost(m, 0);
  assert_true(fabs(c.flops - 983040000.0) < 1.0);
  /* bytes: every bf16 parameter once (experts: 1 - (3/4)^64 of them, i.e. all), the embedding twice
   * (LM head, self-conditioning); the norms (~0.2%) are not counted */
  double want = 2.0 * ((double)info.n_params + 4096.0 * 256.0);
  if (fabs(c.weight_bytes - want) > 0.005 * want) fail_msg("weight bytes %.0f vs %.0f", c.weight_bytes, want);
  assert_true(c.weight_bytes < want);
  assert_true(c.other_bytes == 64.0 * 4096 * 4); /* fp32 logits */
  /* K/V: 64 keys, sliding 2*64*2 (K and V) and full 1*128 (K = V) floats per key */
  assert_true(c.kv_bytes == 64.0 * 4 * (4 * 2 * 64 * 2 + 2 * 1 * 128));
  /* context grows the attention term only; a sliding layer's queries see at most its window (512) keys:
   * +448 keys per query on the 4 sliding layers, +1000 on the 2 full ones */
  bench_cost c2 = bench_decoder_cost(m, 1000);
  assert_true(c2.weight_bytes == c.weight_bytes);
  assert_true(fabs((c2.flops - c.flops) - 4.0 * 64 * 4 * (4 * 64 * 448 + 2 * 128 * 1000)) < 1.0);
  /* a 1-token encoder pass hits 2 of 8 experts in expectation */
  bench_cost e1 = bench_encoder_cost(m, 1, 0), e64 = bench_encoder_cost(m, 64, 0);
  assert_true(e1.weight_bytes < e64.weight_bytes);
  dg_model_free(m);
}

static int setup(void **state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/dgemma_test_eval_XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state) {
  (void)state;
  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_answer_value),   cmocka_unit_test(test_stop_cut),
      cmocka_unit_test(test_fewshot_prompt), cmocka_unit_test(test_wilson),
      cmocka_unit_test(test_load_errors),    cmocka_unit_test(test_resume),
      cmocka_unit_test(test_resume_malformed), cmocka_unit_test(test_cli_errors),
      cmocka_unit_test(test_cli_resume),     cmocka_unit_test(test_cli_problems_ids),
      cmocka_unit_test(test_cli_interrupt),
      cmocka_unit_test(test_cli_terminate),
      cmocka_unit_test(test_cli_hangup),
      cmocka_unit_test(test_cli_broken_pipe),
      cmocka_unit_test(test_cli_reader_gone),
      cmocka_unit_test(test_bench_helpers),  cmocka_unit_test(test_bench_cost),
  };
  if (getenv("DG_TEST_FILTER")) cmocka_set_test_filter(getenv("DG_TEST_FILTER")); /* e.g. "test_cli_problems_ids" */
  return cmocka_run_group_tests(tests, setup, teardown);
}
