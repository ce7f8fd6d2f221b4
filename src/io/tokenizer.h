/* tokenizer.h: the DiffusionGemma tokenizer (a Hugging Face `tokenizers` BPE
 * read from tokenizer.json) and the Gemma 4 chat template (spec section 2).
 *
 * What it is: an exact re-implementation of the parts of the `tokenizers`
 * library that Gemma's tokenizer.json uses (added-token matching, a Replace
 * normalizer, a Split pre-tokenizer, BPE with byte fallback, and the
 * Replace/ByteFallback/Fuse decoder), so ids equal the library's ids with
 * add_special_tokens=False. What it is not: a general `tokenizers` clone;
 * anything else in a file (another model type, a regex, a Unicode normalizer)
 * is rejected at load time with DG_ERR_TOKENIZER naming the field.
 *
 * DiffusionGemma names (spec section 2 table) are applied by id at load time,
 * over whatever names the file has (Google's Gemma 3 tokenizer.json calls id
 * 105 "<start_of_turn>"; here it becomes the special token "<|turn>", and the
 * literal text "<start_of_turn>" is plain text).
 *
 * All functions are thread-safe on a loaded tokenizer (it is read-only).
 * Errors: every fallible function returns a dg_status and records a message
 * with dg_seterr (see dg_error.h); nothing prints, nothing exits.
 */
#ifndef DG_TOKENIZER_H
#define DG_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "dgemma.h"

typedef struct dg_tokenizer dg_tokenizer;

/* Load a Hugging Face tokenizer.json.
 *  model_vocab: the model's vocab_size. Added tokens with id >= model_vocab are
 *    dropped (their text is then plain text; Gemma 3's file has
 *    "<image_soft_token>" at 262144, one past the 262144-id model vocabulary).
 *    A BPE model vocab entry with id >= model_vocab is DG_ERR_VOCAB_MISMATCH.
 *    model_vocab <= 0 means "no limit".
 *  The DiffusionGemma special-token names (spec section 2) replace the file's
 *  names for those ids (in model.vocab and added_tokens, for ids present in the
 *  file), and those ids become special added tokens.
 *  Added-token ids must be the ids the `tokenizers` library (0.23) itself
 *  gives on loading: the vocab id when the content is in model.vocab, else
 *  (number of model.vocab entries) + (number of such new tokens before it);
 *  otherwise DG_ERR_TOKENIZER: the file would mean two different things.
 * Errors: DG_ERR_INVALID_ARG (NULL path/out), DG_ERR_NOT_FOUND, DG_ERR_IO,
 *  DG_ERR_JSON (with the byte offset), DG_ERR_TOKENIZER (missing or malformed
 *  field; unsupported model type / normalizer / pre_tokenizer / decoder /
 *  added-token option, naming the field and value), DG_ERR_VOCAB_MISMATCH,
 *  DG_ERR_OUT_OF_MEMORY. *out is NULL on failure.
 * Cost for the 33 MB Gemma file: 0.25-0.4 s (over half of it cJSON parsing),
 * ~240 MB peak RSS while loading (the cJSON tree), ~45 MB kept (hash tables). */
dg_status dg_tokenizer_load(const char *path, int32_t model_vocab, dg_tokenizer **out);

/* The same from the text of a tokenizer.json already in memory (len bytes,
 * need not be NUL-terminated); `path` stands for the file in messages. Used
 * by dg_tokenizer_load and the fuzz harness (fuzz/fuzz_tokenizer_json.c).
 * Errors: as dg_tokenizer_load without DG_ERR_NOT_FOUND and DG_ERR_IO. */
dg_status dg_tokenizer_load_text(const char *path, const char *text, size_t len, int32_t model_vocab,
                                 dg_tokenizer **out);

/* Free a tokenizer (NULL is a no-op). */
void dg_tokenizer_free(dg_tokenizer *t);

/* Encode UTF-8 text (len bytes; no <bos> is added, no post-processor runs).
 *  parse_special = 1: special added tokens written in the text are matched, as
 *    the `tokenizers` library does with add_special_tokens=False;
 *  parse_special = 0: they stay plain text, as with the library's
 *    `encode_special_tokens = True`.
 *  Non-special added tokens (e.g. "\n" = 107) are always matched.
 *  *ids is malloc'd (free with dg_free/free; may be NULL when *n_ids == 0).
 * Errors: DG_ERR_INVALID_ARG (NULL argument; invalid UTF-8, naming the byte
 *  offset), DG_ERR_TOKENIZER (a character needs "unk_token" but the vocab lacks
 *  it), DG_ERR_OUT_OF_MEMORY. */
dg_status dg_tokenizer_encode(const dg_tokenizer *t, const char *text, size_t len,
                              int parse_special, int32_t **ids, size_t *n_ids);

/* Decode ids to UTF-8 with the file's decoder (Gemma: Replace "▁" -> " ",
 * ByteFallback, Fuse; a run of byte tokens that is not valid UTF-8 becomes one
 * U+FFFD per byte, as in the library). keep_special = 0 drops special tokens.
 * With no decoder in the file, pieces are joined with " " (library behaviour).
 * *out is malloc'd and NUL-terminated (a decoded <0x00> byte truncates it).
 * Errors: DG_ERR_INVALID_ARG (NULL argument; an id outside [0, n_ids), naming
 *  the id and its position), DG_ERR_OUT_OF_MEMORY. */
dg_status dg_tokenizer_decode(const dg_tokenizer *t, const int32_t *ids, size_t n_ids,
                              int keep_special, char **out);

/* Exact piece -> id lookup (added tokens first, then model.vocab, like the
 * library's token_to_id); -1 if absent. piece is NUL-terminated. */
int32_t dg_tokenizer_piece_id(const dg_tokenizer *t, const char *piece);

/* The piece (token string) of an id, owned by the tokenizer; NULL if id is out
 * of range or unused. Byte tokens read "<0x41>"; "▁" is the space marker. */
const char *dg_tokenizer_piece(const dg_tokenizer *t, int32_t id);

/* Number of ids: max id + 1 after dropping (262144 for Gemma). */
int32_t dg_tokenizer_n_ids(const dg_tokenizer *t);

/* 1 if id is a special added token (dropped by decode with keep_special = 0,
 * matched in text only with parse_special = 1); 0 otherwise or out of range. */
int dg_tokenizer_is_special(const dg_tokenizer *t, int32_t id);

/* Check that s[0..n) is valid UTF-8 (no overlongs, surrogates or code points
 * above U+10FFFF). Returns DG_OK or DG_ERR_INVALID_ARG with the message
 * "<what>: invalid UTF-8 at byte offset N". */
dg_status dg_utf8_validate(const char *s, size_t n, const char *what);

/* Render a conversation with the Gemma 4 large-model chat template (the one
 * DiffusionGemma ships; text-only subset, add_generation_prompt always on)
 * straight to ids:
 *   <bos>
 *   [<|turn>system\n [<|think|>\n] {first system/developer message, trimmed} <turn|>\n]
 *       (present if messages[0] is system/developer or enable_thinking)
 *   per remaining message: <|turn>{role}\n{content}<turn|>\n
 *       role "assistant" -> "model"; user/system/developer content is trimmed
 *       (Python str.strip); model content has every <|channel>...<channel|>
 *       span removed (template macro strip_thinking) and is trimmed; an
 *       assistant message right after an assistant message continues its turn
 *       (no second <|turn>model\n), as the template does;
 *   <|turn>model\n, then <|channel>thought\n<channel|> unless enable_thinking.
 * Control tokens are emitted by id; text between them is encoded with
 * parse_special = 0, so user text that looks like a control token stays text.
 * Otherwise the ids equal tokenizing the rendered string with special parsing.
 * Roles: "system", "developer", "user", "assistant", "model".
 * Errors: DG_ERR_INVALID_ARG (NULL argument, no messages, unknown role, invalid
 *  UTF-8 naming the message and offset), DG_ERR_TOKENIZER (a control token the
 *  template needs is not in the vocabulary), DG_ERR_OUT_OF_MEMORY. */
dg_status dg_chat_render(const dg_tokenizer *t, const dg_chat_message *msgs, size_t n_msgs,
                         int enable_thinking, int32_t **ids, size_t *n_ids);

#endif
