#!/usr/bin/env python3
"""Stage 2: train the small model's byte-fallback BPE tokenizer (Hugging Face `tokenizers`).

    python3 train_tokenizer.py --data WORK/data --out WORK/tokenizer [--vocab 4096]

Layout of the saved tokenizer.json (docs/small-model.md, "Tokenizer"):
  ids 0..107     DiffusionGemma's control/unused tokens and "\\n" (107), as added tokens
  ids 108..363   the 256 byte-fallback pieces <0x00>..<0xFF>
  ids 364..V-1   learned BPE pieces (characters first, then merges in training order)
and exactly Gemma's pipeline: normalizer Replace(" " -> "▁"), pre-tokenizer Split(" ",
MergedWithPrevious) (a no-op after the normalizer), BPE with byte_fallback and fuse_unk,
decoder Replace("▁" -> " ") + ByteFallback + Fuse, no post-processor (no BOS is added).

Training uses another pre-tokenizer: Split on "▁" (merged with the next piece) and single
digits. A merge learned that way never contains "▁" except as its first character and never
contains a digit, so no merge can span a training pre-token boundary, and BPE over whole
segments (Gemma's pipeline) encodes exactly as BPE over the training pre-tokens. The script
checks that claim on a sample of the corpus (both pipelines, same vocab and merges) and fails
if any sequence differs.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402

META = "\u2581"
GEMMA_NORMALIZER = {"type": "Replace", "pattern": {"String": " "}, "content": META}
GEMMA_PRE_TOKENIZER = {"type": "Split", "pattern": {"String": " "}, "behavior": "MergedWithPrevious",
                       "invert": False}
GEMMA_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": META}, "content": " "},
    {"type": "ByteFallback"}, {"type": "Fuse"}]}


def corpus_lines(data_dir, n_problems):
    """Training text for the tokenizer, one line at a time (no "\\n": it is an added token)."""
    yield from ("user", "model", "thought", "system")
    probs = common.read_jsonl(os.path.join(data_dir, "problems_train.jsonl"))[:n_problems]
    for p in probs:
        yield p["question"]
        yield from p["answer"].split("\n")
    for r in common.read_jsonl(os.path.join(data_dir, "gsm8k_train.jsonl")):
        yield from r["question"].split("\n")
        yield from r["answer"].split("\n")
    with open(os.path.join(data_dir, "shakespeare_train.txt"), encoding="utf-8") as f:
        yield from f.read().split("\n")


def build_tokenizer_json(learned_vocab, merges):
    """The saved tokenizer.json dict from the trained pieces (piece -> trainer id) and merges."""
    vocab = {}
    added = []
    for i, content, special in common.reserved_tokens():
        vocab[content] = i
        added.append({"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": special})
    for b in range(256):
        vocab[common.byte_token(b)] = common.BYTE_BASE + b
    nid = common.FIRST_LEARNED
    for piece, _ in sorted(learned_vocab.items(), key=lambda kv: kv[1]):
        if piece in vocab:
            raise ValueError("learned piece %r collides with a reserved token" % piece)
        vocab[piece] = nid
        nid += 1
    for a, b in merges:
        if a not in vocab or b not in vocab or a + b not in vocab:
            raise ValueError("merge %r %r refers to a missing piece" % (a, b))
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
            "normalizer": GEMMA_NORMALIZER, "pre_tokenizer": GEMMA_PRE_TOKENIZER, "post_processor": None,
            "decoder": GEMMA_DECODER,
            "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
                      "ignore_merges": False, "vocab": vocab, "merges": [[a, b] for a, b in merges]}}


def tokenizer_config():
    """tokenizer_config.json for AutoTokenizer (optional: the tools load tokenizer.json directly)."""
    return {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
            "pad_token": "<pad>", "unk_token": "<unk>", "mask_token": "<mask>", "add_bos_token": False,
            "add_eos_token": False, "padding_side": "left", "clean_up_tokenization_spaces": False,
            "model_max_length": 131072, "chat_template": common.CHAT_TEMPLATE}


def _merges_from(model_json):
    out = []
    for m in model_json["merges"]:
        if isinstance(m, str):
            a, b = m.split(" ", 1)
        else:
            a, b = m
        out.append((a, b))
    return out


def verify(final_json, train_pre_tokenizer, samples, log):
    """Encode every sample with the saved (Gemma) pipeline and with the training pipeline over the
    same vocab and merges; every id sequence must agree. Also: decode round trip, digits are single
    tokens, and the chat prompt rendered as text encodes to the id rendering."""
    from tokenizers import Tokenizer
    final = Tokenizer.from_str(json.dumps(final_json))
    tj = dict(final_json)
    tj["pre_tokenizer"] = train_pre_tokenizer
    trainpipe = Tokenizer.from_str(json.dumps(tj))
    a = final.encode_batch(samples, add_special_tokens=False)
    b = trainpipe.encode_batch(samples, add_special_tokens=False)
    ntok, bad = 0, []
    for s, x, y in zip(samples, a, b):
        ntok += len(x.ids)
        if x.ids != y.ids:
            bad.append(s)
    if bad:
        raise SystemExit("train_tokenizer: %d of %d samples encode differently under the training and the "
                         "Gemma pipeline, e.g. %r" % (len(bad), len(samples), bad[0][:200]))
    log("pipeline check: %d samples, %d tokens, identical ids under both pipelines" % (len(samples), ntok))
    rt_bad = [s for s, x in zip(samples, a) if final.decode(x.ids, skip_special_tokens=False) != s]
    if rt_bad:
        raise SystemExit("train_tokenizer: decode(encode(s)) != s for %d samples, e.g. %r"
                         % (len(rt_bad), rt_bad[0][:200]))
    log("round trip: decode(encode(s)) == s for all %d samples" % len(samples))
    unk = sum(x.ids.count(common.UNK) for x in a)
    if unk:
        raise SystemExit("train_tokenizer: %d <unk> tokens in the sample (byte fallback broken?)" % unk)
    digits = final.encode("0123456789", add_special_tokens=False).ids
    if len(digits) != 10 or any(d < common.FIRST_LEARNED for d in digits):
        raise SystemExit("train_tokenizer: digits are not single learned tokens: %r" % digits)
    enc = lambda t: final.encode(t, add_special_tokens=False).ids  # noqa: E731
    q = "Mia has 23 apples.\nShe buys 14 more apples. How many apples does Mia have now?"
    text = ("<bos><|turn>user\n" + q + "<turn|>\n<|turn>model\n<|channel>thought\n<channel|>")
    if enc(text) != common.prompt_ids(enc, q):
        raise SystemExit("train_tokenizer: text chat prompt %r != id rendering %r"
                         % (enc(text), common.prompt_ids(enc, q)))
    if enc("\n") != [common.NEWLINE] or enc("<|turn>") != [common.TURN]:
        raise SystemExit("train_tokenizer: added tokens not matched")
    log("digits single tokens %s; chat prompt as text == id rendering; byte fallback: %r -> %r"
        % (digits, "é€", enc("é€")))
    return final


def main(argv=None):
    ap = argparse.ArgumentParser(description="train the small model's tokenizer")
    ap.add_argument("--data", required=True, help="prepare_data.py output")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab", type=int, default=4096, help="total vocabulary size")
    ap.add_argument("--limit-alphabet", type=int, default=160, help="most frequent characters kept")
    ap.add_argument("--problems", type=int, default=10000, help="generated problems in the tokenizer corpus")
    ap.add_argument("--check-samples", type=int, default=20000)
    a = ap.parse_args(argv)
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    t0 = time.time()
    log = lambda m: print("train_tokenizer: " + m, flush=True)  # noqa: E731
    os.makedirs(a.out, exist_ok=True)
    n_learn = a.vocab - common.FIRST_LEARNED
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Replace(" ", META)
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(META, "merged_with_next"),
                                                 pre_tokenizers.Digits(individual_digits=True)])
    trainer = trainers.BpeTrainer(vocab_size=n_learn, min_frequency=2, show_progress=False, special_tokens=[],
                                  limit_alphabet=a.limit_alphabet, max_token_length=16)
    tok.train_from_iterator(corpus_lines(a.data, a.problems), trainer=trainer)
    trained = json.loads(tok.to_str())
    learned = trained["model"]["vocab"]
    merges = _merges_from(trained["model"])
    log("trained %d pieces (%d merges) in %.1fs" % (len(learned), len(merges), time.time() - t0))
    final_json = build_tokenizer_json(learned, merges)
    V = len(final_json["model"]["vocab"])

    # Verification sample: held-out problems, train problems, GSM8K, Shakespeare (both parts).
    samples = []
    held = common.read_jsonl(os.path.join(a.data, "problems_heldout.jsonl"))
    samples += [p["question"] for p in held] + [p["answer"] for p in held]
    probs = common.read_jsonl(os.path.join(a.data, "problems_train.jsonl"))[:2000]
    samples += [p["question"] for p in probs] + [p["answer"] for p in probs]
    gsm = common.read_jsonl(os.path.join(a.data, "gsm8k_train.jsonl"))[:3000]
    samples += [r["question"] for r in gsm] + [r["answer"] for r in gsm]
    for name in ("shakespeare_train.txt", "shakespeare_heldout.txt"):
        with open(os.path.join(a.data, name), encoding="utf-8") as f:
            paras = f.read().split("\n\n")
        samples += paras[:3000]
    samples = [s for s in samples if s][:max(a.check_samples, len(held) * 2)]
    final = verify(final_json, trained["pre_tokenizer"], samples, log)

    with open(os.path.join(a.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(final_json, f, ensure_ascii=False, indent=1)
    with open(os.path.join(a.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(), f, ensure_ascii=False, indent=1)
    # compression stats
    stats = {}
    for name, texts in (("problems", [p["question"] + "\n" + p["answer"] for p in probs[:500]]),
                        ("gsm8k", [r["question"] + "\n" + r["answer"] for r in gsm[:500]])):
        n = sum(len(e.ids) for e in final.encode_batch(texts, add_special_tokens=False))
        stats[name] = round(sum(map(len, texts)) / n, 3)
    with open(os.path.join(a.data, "shakespeare_heldout.txt"), encoding="utf-8") as f:
        ht = f.read()
    stats["shakespeare_heldout"] = round(len(ht) / len(final.encode(ht, add_special_tokens=False).ids), 3)
    with open(os.path.join(a.out, "tokenizer_meta.json"), "w") as f:
        json.dump({"vocab_size": V, "learned": len(learned), "merges": len(merges),
                   "chars_per_token": stats}, f, indent=1)
    log("saved %s (vocab %d); chars/token %s; %.1fs" % (os.path.join(a.out, "tokenizer.json"), V, stats,
                                                          time.time() - t0))


if __name__ == "__main__":
    main()
