/* gsm8k.h: the model-independent part of `dgemma eval gsm8k` (tools/gsm8k.c):
 * data loading, prompt construction, answer extraction, stop-string cutting,
 * Wilson intervals, the resumable per-item JSONL and the evaluation loop.
 * The loop calls a generator function, so tests drive it with canned outputs
 * and the CLI (tools/eval.c) with the model. Nothing here prints except the
 * loop's progress bar (stderr) and summary (the FILE given). */
#ifndef DG_CLI_GSM8K_H
#define DG_CLI_GSM8K_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* One GSM8K record: {"question": ..., "answer": ...}; label = answer value of
 * the gold answer (gsm8k_answer_value), canonical decimal digits. */
typedef struct gsm8k_item {
  char *question;
  char *answer;
  char label[64];
} gsm8k_item;

typedef struct gsm8k_set {
  gsm8k_item *items;
  int n;
} gsm8k_set;

/* Load a GSM8K JSONL file: one {"question": string, "answer": string} object
 * per line (blank lines skipped). max_items > 0 stops after that many records.
 * Returns 0, or -1 with a message in err naming the file, the line and what is
 * wrong (missing file, malformed JSON, missing field, a gold answer without a
 * number, no records). */
int gsm8k_load(const char *path, int max_items, gsm8k_set *out, char *err, size_t errlen);
void gsm8k_set_free(gsm8k_set *s);

/* vLLM's get_answer_value (tests/evals/gsm8k/gsm8k_eval.py): drop every ','
 * then take the last run of ASCII digits; Python's ast.literal_eval rejects
 * leading zeros ("007" is a SyntaxError there), so such a run is invalid,
 * while "0", "00" are 0. No sign, no decimals: "-3" -> 3, "2.5" -> 5.
 * Writes the canonical digits to out and returns 1, or returns 0 (INVALID). */
int gsm8k_answer_value(const char *s, char *out, size_t outlen);

/* The default stop strings of vLLM's harness: "Question", "Assistant:", "<|separator|>". */
extern const char *const gsm8k_stop_strings[];
extern const int gsm8k_n_stop_strings;

/* Byte offset where text must be cut: the earliest occurrence of any of the
 * stop strings (the string itself excluded, as vLLM returns it), or
 * strlen(text) if none occurs. *which (may be NULL) gets the index of the stop
 * string that matched, or -1. */
size_t gsm8k_stop_cut(const char *text, const char *const *stops, int n_stops, int *which);

/* The k-shot prefix of vLLM's harness from train items 0..k-1:
 * "Question: {q}\nAnswer: {a}\n\n" each. Returns a malloc'd string, or NULL
 * if train holds fewer than k items. */
char *gsm8k_fewshot_prefix(const gsm8k_set *train, int k);

/* prefix + "Question: {question}\nAnswer:" (malloc'd). */
char *gsm8k_prompt(const char *prefix, const char *question);

/* Wilson score interval for k successes in n trials, z = 1.959964 (95%).
 * n = 0 gives [0, 1]. */
void gsm8k_wilson(int k, int n, double *lo, double *hi);

/* ---- the evaluation loop ------------------------------------------------- */

/* What a generator returns for one prompt. text is malloc'd (freed by the
 * loop): the decoded output up to the first stop id, possibly longer than the
 * stop-string cut (the loop cuts it). */
typedef struct gsm8k_gen_out {
  char *text;
  int32_t tokens;   /* generated tokens, pads excluded, up to and including a stop id */
  int32_t forwards; /* decoder forwards */
  int32_t blocks;   /* canvases */
  int eos;          /* 1 if a stop id ended generation */
  double seconds;   /* wall time of this generation, prefill included */
} gsm8k_gen_out;

/* Generate for one prompt (the user text in chat mode, the whole completion
 * prompt otherwise), item index idx. Return 0 with *out filled, 1 if
 * interrupted (nothing to record), -1 on failure with a message in err. */
typedef int (*gsm8k_gen_fn)(void *ud, const char *prompt, int idx, gsm8k_gen_out *out, char *err, size_t errlen);

typedef struct gsm8k_run_opts {
  const gsm8k_set *test;    /* items to evaluate (already cut to --limit) */
  const gsm8k_set *train;   /* few-shot source */
  int shots;                /* k */
  int chat;                 /* 1 = prompts go through the chat template (generator's business) */
  const char *out_path;     /* per-item JSONL (appended; resumed); NULL = none */
  const char *config;       /* configuration key written to every line; resume requires equality */
  int progress;             /* 0 none, 1 progress on stderr (redrawn when tty = 1) */
  int tty;
} gsm8k_run_opts;

/* Totals over every item of the configuration (resumed ones included). */
typedef struct gsm8k_summary {
  int n, correct, invalid, resumed, n_target; /* n_target = items asked for */
  int interrupted;
  int64_t tokens, forwards, blocks;
  double seconds;           /* sum of per-item generation times */
  double acc, lo, hi;       /* accuracy and its Wilson 95% interval */
} gsm8k_summary;

/* Read an existing per-item JSONL for resuming: marks done[idx] for every
 * complete line with idx < n_done and adds it to *s (lines beyond, from a run
 * with a larger --limit, stay in the file uncounted). A last line without its
 * newline (an interrupted write: '{"idx":' or a prefix of it) is dropped: the
 * file is truncated to the last complete line; one that does not start so is
 * not ours and is an error. A missing file is not an error. Returns 0, or -1 with
 * err set: a line that is not a JSON object with the expected fields, a
 * repeated idx, or a line written by another configuration. */
int gsm8k_resume_read(const char *path, const char *config, uint8_t *done, int n_done, gsm8k_summary *s, char *err,
                      size_t errlen);

/* Run the evaluation: for every test item not already in out_path, build the
 * prompt, call gen, cut at the stop strings, extract the answer, append one
 * JSON line (flushed) and update *s. Returns 0 when every item is done, 1 if
 * the generator reported an interruption (partial results kept), -1 on error
 * (err set; lines already written are kept). */
int gsm8k_run(const gsm8k_run_opts *o, gsm8k_gen_fn gen, void *ud, gsm8k_summary *s, char *err, size_t errlen);

/* Markdown summary (a heading line, a one-row table and notes) to f. */
void gsm8k_summary_markdown(FILE *f, const char *title, const gsm8k_summary *s);

/* The summary as one JSON object (malloc'd string), with title and config. */
char *gsm8k_summary_json(const char *title, const char *config, const gsm8k_summary *s);

#endif
