#!/usr/bin/env python3
"""tokenizer_goldens.py: golden token ids from the real Hugging Face `tokenizers`
library, for tests/test_tokenizer.c.

    python3 tools/tokenizer_goldens.py [--model-vocab N] TOKENIZER_JSON OUT_JSON [TOKENIZER_JSON OUT_JSON ...]

For each tokenizer.json it applies the same patch as dgemma's C loader
(src/io/tokenizer.c, dg_tokenizer_load):
  * the DiffusionGemma special-token names (spec section 2) replace the file's
    names for those ids, in model.vocab and in added_tokens, and those tokens
    become special (a table id present only in model.vocab is appended to
    added_tokens as a special token);
  * added tokens with id >= N (default 262144, the model's vocab_size) are
    dropped, and so are model.vocab entries with such ids;
then builds tokenizers.Tokenizer.from_str(...) and records, for a corpus of hard
strings: the text, ids with special parsing (add_special_tokens=False), ids with
`encode_special_tokens = True`, and decode(ids, skip_special_tokens=False/True);
plus a few decode-only id lists (byte tokens that are not valid UTF-8, ...).

Self-checks (assert): renamed tokens map to their ids, literal "<start_of_turn>"
is no longer a token, the spec's three chat sequences are reproduced from their
rendered strings (for a 262144-id vocabulary), and each output is < 200 KB.

Needs only Python 3 and `tokenizers` (no network, no numpy). Written for
tokenizers 0.23 (it also runs on 0.15+, where `encode_special_tokens` exists).
"""
import hashlib
import json
import sys

import tokenizers
from tokenizers import Tokenizer

# Spec section 2: DiffusionGemma names of these ids (applied by id).
NAMES = {
    46: "<|tool>", 47: "<tool|>", 48: "<|tool_call>", 49: "<tool_call|>",
    50: "<|tool_response>", 51: "<tool_response|>", 52: '<|"|>', 98: "<|think|>",
    100: "<|channel>", 101: "<channel|>", 105: "<|turn>", 106: "<turn|>",
    255999: "<|image>", 258882: "<image|>", 258880: "<|image|>",
    256000: "<|audio>", 258883: "<audio|>", 258881: "<|audio|>",
}

# Spec section 2: verified chat-template token sequences (rendered strings here).
CHAT = [
    ("<bos><|turn>user\nWrite a long essay about Portugal.<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
     [2, 105, 2364, 107, 6974, 496, 1440, 20494, 1003, 23613, 236761, 106, 107, 105, 4368, 107, 100, 45518, 107, 101]),
    ("<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nWrite a long essay about Portugal.<turn|>\n<|turn>model\n",
     [2, 105, 9731, 107, 98, 107, 106, 107, 105, 2364, 107, 6974, 496, 1440, 20494, 1003, 23613, 236761, 106, 107,
      105, 4368, 107]),
    ("<bos><|turn>user\nWhy is the sky blue?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>",
     [2, 105, 2364, 107, 11355, 563, 506, 7217, 3730, 236881, 106, 107, 105, 4368, 107, 100, 45518, 107, 101]),
]


def pseudo_random_text(n, alphabet, seed=12345):
    """Deterministic whitespace-free text (a 32-bit LCG, no `random` state)."""
    out, x = [], seed
    for _ in range(n):
        x = (1103515245 * x + 12345) & 0x7FFFFFFF
        out.append(alphabet[(x >> 8) % len(alphabet)])
    return "".join(out)


def corpus():
    c = [
        "", "Hello world", "The quick brown fox jumps over the lazy dog.",
        # whitespace
        " ", "   ", "  leading spaces", "trailing spaces   ", "a  b   c    d     e", "hello \nworld",
        "end. \n\n  next", " \n \n ", "\t", "\ttab\tseparated\t\tvalues\t", "line1\r\nline2\r\n\r\n", "\r",
        "a\n\n\nb", "\n" * 40, " " * 100, "\t" * 50, "\n \n\t\n", "x\u00a0y", "\u3000ideographic\u3000space",
        "line\u2028sep", "\u200bzero\u200bwidth", "\ufeffBOM at start", "\x0bvertical\x0cform feed",
        # code
        "def f(x):\n    if x:\n        return x * 2\n    return None\n",
        "int main(void) {\n\treturn 0;\n}\n",
        "    indented = {'a': [1, 2, 3], \"b\": None}  # comment\n",
        "for (i = 0; i < n; i++) { sum += a[i] << 2; }",
        '{"key": "value", "list": [true, false, null], "n": -1.5e-3}',
        "<html><body><div class=\"x\">Hi</div></body></html>",
        "<table><tr><td>1</td></tr></table>", "SELECT * FROM t WHERE a <> 'b';",
        # scripts
        "日本語のテキストです。", "中文分词测试，你好世界！", "안녕하세요 세계", "مرحبا بالعالم", "שלום עולם",
        "नमस्ते दुनिया", "สวัสดีชาวโลก", "Γειά σου Κόσμε", "Привет, мир!", "Ünïcödé façade naïve résumé",
        # emoji
        "😀", "👍🏽", "👨\u200d👩\u200d👧\u200d👦", "🏳\ufe0f\u200d🌈", "I ❤\ufe0f NY 🗽", "🇵🇹🇯🇵", "🙂" * 50,
        # combining characters
        "e\u0301", "Cafe\u0301 vs Caf\u00e9", "a\u0300\u0301\u0302\u0303\u0304", "Z\u0351\u036b\u0343a\u0352l\u0352g\u0352o",
        # byte fallback candidates
        "\U00020000\U0002A6D6\U0002B740", "\U0010FFFD", "\U000F0000", "\ue000\uf8ff", "\x01\x02\x03\x7f",
        "\x1b[31mred\x1b[0m", "\U0001D11E music", "\u0378\u0379 unassigned",
        # control-token look-alikes
        "<start_of_turn>", "<end_of_turn>", "<start_of_turn>user\nhi<end_of_turn>\n", "<|turn>", "<turn|>",
        "<|turn>user\nhi<turn|>\n", "<<|turn>>", "<|turn><|turn>", "<eos>", "<bos>", "<pad>", "<unk>", "<mask>",
        "<unused40>", "<unused0>", "<unused99>", "<image_soft_token>", "x<image_soft_token>y", "<start_of_image>",
        "<end_of_image>", "<|image|>", "<|image>", "<|audio|>", "<|think|>", '<|"|>', "<|channel>thought\n<channel|>",
        "<|tool_call>call:f{a:1}<tool_call|>", "[multimodal]", "<0x41>", "<0x41><0x42>", "<0xFF>",
        "\u2581", "\u2581\u2581hello\u2581", "\u2581 \u2581", "a\u2581\u2581\u2581b", "<bos>text<eos>",
        # long / whitespace-free
        "a" * 1000, "Supercalifragilisticexpialidocious" * 20, "ab" * 1500,
        pseudo_random_text(3000, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.,;:!?"),
        pseudo_random_text(500, "日本語中文한국어"),
        # numbers, urls
        "1234567890", "3.14159265358979", "1,000,000", "-42", "0x1F", "1e-10", "2024-01-01T12:34:56Z",
        "https://example.com/path/to/page?query=1&b=two#frag", "mailto:someone@example.org",
        "C:\\Windows\\System32\\drivers", "$100 & 50% off!!!",
        # chat prompts as plain text
        "Write a long essay about Portugal.", "Why is the sky blue?", "What is 12 plus 30?",
    ]
    c += [s for s, _ in CHAT]
    return c


def patch(d, model_vocab):
    """The C loader's patch; returns the patched dict (d is modified)."""
    model = d["model"]
    vocab = model["vocab"]
    if model_vocab > 0:
        for k in [k for k, i in vocab.items() if i >= model_vocab]:
            del vocab[k]
    by_id = {i: k for k, i in vocab.items()}
    for i, name in NAMES.items():
        if i in by_id and by_id[i] != name:
            if name in vocab:
                raise SystemExit(f"rename of id {i} to {name!r} collides with vocab id {vocab[name]}")
            del vocab[by_id[i]]
            vocab[name] = i
    added, seen = [], set()
    for a in d.get("added_tokens") or []:
        a = dict(a)
        if a["id"] in NAMES:
            a["content"] = NAMES[a["id"]]
            a["special"] = True
        if model_vocab > 0 and a["id"] >= model_vocab:
            continue
        added.append(a)
        seen.add(a["id"])
    vocab_ids = set(vocab.values())
    for i, name in NAMES.items():
        if i in vocab_ids and i not in seen:
            added.append({"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True})
    d["added_tokens"] = added
    return d


def goldens(path, model_vocab):
    raw = open(path, "rb").read()
    d = patch(json.loads(raw), model_vocab)
    tok = Tokenizer.from_str(json.dumps(d))
    assert hasattr(tok, "encode_special_tokens"), "this tokenizers has no encode_special_tokens"

    # the patch took effect
    vocab_ids = set(d["model"]["vocab"].values())
    for i, name in NAMES.items():
        if i in vocab_ids or i in {a["id"] for a in d["added_tokens"]}:
            got = tok.token_to_id(name)
            assert got == i, f"{name!r}: token_to_id {got}, expected {i}"
    assert tok.token_to_id("<start_of_turn>") is None

    def enc(text, encode_special):
        tok.encode_special_tokens = encode_special
        try:
            return tok.encode(text, add_special_tokens=False).ids
        finally:
            tok.encode_special_tokens = False

    if tok.get_vocab_size(with_added_tokens=True) >= 262144:
        for text, ids in CHAT:
            got = enc(text, False)
            assert got == ids, f"chat sequence mismatch for {text!r}:\n got {got}\nwant {ids}"
        assert enc("<|turn>", True) != [105] and enc("<|turn>", False) == [105]
        assert all(i < 262144 for i in enc("<image_soft_token>", False))

    cases = []
    for text in corpus():
        ids = enc(text, False)
        cases.append({
            "text": text,
            "ids": ids,
            "ids_nospecial": enc(text, True),
            "decode_keep": tok.decode(ids, skip_special_tokens=False),
            "decode_skip": tok.decode(ids, skip_special_tokens=True),
        })

    # decode-only: byte tokens (valid and invalid UTF-8 runs), specials, "▁"
    b = tok.token_to_id("<0x00>")
    id_lists = [[2, 105, 106, 1, 0, 3], list(range(46, 53)) + [98, 100, 101]]
    if b is not None:
        id_lists += [[b + 0xE4, b + 0xB8, b + 0xAD], [b + 0xE4, b + 0xB8], [b + 0xFF],
                     [b + 0x41, b + 0xC3, b + 0x41], [b + 0xE4, 2, b + 0xB8, b + 0xAD],
                     [b + 0x80, b + 0x80, b + 0x80, b + 0x80]]
    sp = tok.token_to_id("\u2581")
    if sp is not None:
        id_lists += [[sp], [sp, sp, 2, sp]]
    n = tok.get_vocab_size(with_added_tokens=True)
    id_lists += [[n - 1], [n - 2, n - 1, 0]]
    dcases = [{"ids": ids, "decode_keep": tok.decode(ids, skip_special_tokens=False),
               "decode_skip": tok.decode(ids, skip_special_tokens=True)} for ids in id_lists]

    return {
        "generator": "tools/tokenizer_goldens.py",
        "tokenizers_version": tokenizers.__version__,
        "tokenizer": path,
        "sha256": hashlib.sha256(raw).hexdigest(),
        "model_vocab": model_vocab,
        "n_ids": n,
        "cases": cases,
        "decode_cases": dcases,
    }


def main(argv):
    model_vocab = 262144
    if len(argv) >= 2 and argv[0] == "--model-vocab":
        model_vocab = int(argv[1])
        argv = argv[2:]
    if not argv or len(argv) % 2:
        raise SystemExit(__doc__)
    for path, out in zip(argv[0::2], argv[1::2]):
        g = goldens(path, model_vocab)
        text = json.dumps(g, ensure_ascii=True, indent=None, separators=(",", ":"))
        assert len(text) < 200_000, f"{out}: {len(text)} bytes, over the 200 KB budget"
        with open(out, "w") as f:
            f.write(text + "\n")
        print(f"{out}: {len(g['cases'])} cases, {len(g['decode_cases'])} decode cases, {len(text)} bytes "
              f"(tokenizers {g['tokenizers_version']}, {path} sha256 {g['sha256'][:12]}...)")


if __name__ == "__main__":
    main(sys.argv[1:])
