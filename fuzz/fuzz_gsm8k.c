/* fuzz_gsm8k.c: libFuzzer harness of the GSM8K files `dgemma eval gsm8k`
 * reads (tools/gsm8k.c): the data set JSONL (gsm8k_load) and the per-item
 * results JSONL that a rerun resumes (gsm8k_resume_read, which also truncates
 * a torn last line), plus the answer extraction and the stop-string cut over
 * the same bytes. Input: byte 0 picks the reader (bit 0), the rest is the
 * file, written to a temporary file per run. Properties: an error has a
 * message; loaded items have a label of digits only; a resume counts at most
 * n_done items, each once, and leaves the file no longer than it was, ending
 * in a newline (or empty); a refused resume leaves it byte for byte as it was
 * (its length); the stop cut lies inside the text. */
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz.h"
#include "gsm8k.h"

static char g_path[256];

static void cleanup(void) { unlink(g_path); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  const char *tmp = getenv("TMPDIR");
  snprintf(g_path, sizeof g_path, "%s/dg-fuzz-gsm8k-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  int fd = mkstemp(g_path);
  if (fd < 0) { perror("mkstemp"); exit(1); }
  close(fd);
  atexit(cleanup);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) {
  if (n == 0) return 0;
  const int mode = d[0] & 1;
  FILE *f = fopen(g_path, "wb");
  if (!f || fwrite(d + 1, 1, n - 1, f) != n - 1 || fclose(f) != 0) { perror(g_path); abort(); }
  char err[1024] = "";
  if (mode == 0) {
    gsm8k_set set;
    int rc = gsm8k_load(g_path, 0, &set, err, sizeof err);
    if (rc && !err[0]) fz_fail("gsm8k_load failed without a message");
    if (rc == 0) {
      for (int i = 0; i < set.n; i++)
        for (const char *p = set.items[i].label; *p; p++)
          if (*p < '0' || *p > '9') fz_fail("label \"%s\" is not digits", set.items[i].label);
      char *pre = gsm8k_fewshot_prefix(&set, set.n < 5 ? set.n : 5);
      if (pre && set.n) {
        char *pr = gsm8k_prompt(pre, set.items[0].question);
        if (!pr || !strstr(pr, "Answer:")) fz_fail("prompt");
        free(pr);
      }
      free(pre);
    }
    gsm8k_set_free(&set);
  } else {
    enum { N_DONE = 64 };
    uint8_t done[N_DONE] = {0};
    gsm8k_summary s;
    memset(&s, 0, sizeof s);
    int rc = gsm8k_resume_read(g_path, "cfg", done, N_DONE, &s, err, sizeof err);
    if (rc && !err[0]) fz_fail("gsm8k_resume_read failed without a message");
    int marked = 0;
    for (int i = 0; i < N_DONE; i++) marked += done[i];
    if (s.resumed != marked || s.resumed > N_DONE) fz_fail("resumed %d, marked %d", s.resumed, marked);
    struct stat sb;
    if (stat(g_path, &sb) != 0) fz_fail("file gone");
    if ((size_t)sb.st_size > n - 1) fz_fail("file grew to %lld bytes", (long long)sb.st_size);
    /* a refused file is left as it was (only a resumed one loses its torn last line) */
    if (rc && (size_t)sb.st_size != n - 1) fz_fail("refused, but the file went from %zu to %lld bytes", n - 1,
                                                   (long long)sb.st_size);
    if (rc == 0 && sb.st_size > 0) {
      f = fopen(g_path, "rb");
      fseek(f, -1, SEEK_END);
      if (fgetc(f) != '\n') fz_fail("resumed file does not end with a newline");
      fclose(f);
    }
  }
  char *text = fz_text(d + 1, n - 1);
  char label[64];
  if (gsm8k_answer_value(text, label, sizeof label))
    for (const char *p = label; *p; p++)
      if (*p < '0' || *p > '9') fz_fail("answer \"%s\" is not digits", label);
  int which = 0;
  size_t cut = gsm8k_stop_cut(text, gsm8k_stop_strings, gsm8k_n_stop_strings, &which);
  if (cut > strlen(text) || which < -1 || which >= gsm8k_n_stop_strings) fz_fail("stop cut %zu, which %d", cut, which);
  free(text);
  return 0;
}
