#!/usr/bin/env python3
"""seeds.py OUT_DIR: write the seed corpus of every fuzz harness (fuzz/README.md)
from the repository's fixtures, and one libFuzzer dictionary per harness.

  OUT_DIR/<harness>/   seed inputs (file names are content hashes)
  OUT_DIR/<harness>.dict  JSON punctuation plus every key and string value of
                          that harness's JSON seeds, in libFuzzer's dict syntax

Sources (run from the repository root): models/dgemma-small (config.json,
generation_config.json, tokenizer.json, the safetensors shards and index),
tests/fixtures/golden/*/ (configs and safetensors), and
tests/fixtures/tokenizer/small_golden.json (texts and ids), tests/fixtures/gsm8k. Large files are
shrunk (tensor shapes clipped, vocabularies cut) so that each seed stays small
enough to mutate quickly; everything else is the fixture's own structure.
Plain python3, no third-party packages. Deterministic."""
import glob
import hashlib
import json
import os
import random
import struct
import sys

OUT = sys.argv[1]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
rng = random.Random(16)
seeds = {}  # harness -> list of bytes
dict_words = {}  # harness -> set of str


def add(h, data, words_from_json=True):
    if isinstance(data, str):
        data = data.encode()
    seeds.setdefault(h, []).append(data)
    if words_from_json:
        try:
            collect(h, json.loads(data))
        except (ValueError, UnicodeDecodeError):
            pass


def collect(h, v):
    w = dict_words.setdefault(h, set())
    if isinstance(v, dict):
        for k, x in v.items():
            if len(k) < 48:
                w.add(k)
            collect(h, x)
    elif isinstance(v, list):
        for x in v[:64]:
            collect(h, x)
    elif isinstance(v, str) and len(v) < 32:
        w.add(v)


def jdump(v, indent=None):
    return json.dumps(v, indent=indent, ensure_ascii=False)


# ---- safetensors ----------------------------------------------------------
DSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
         "U16": 2, "U32": 4, "U64": 8, "BOOL": 1}


def st_file(tensors, meta=None, pad=True):
    """tensors: [(name, dtype, shape)]; data random; header padded to 8 bytes."""
    hdr, off, blobs = {}, 0, []
    if meta is not None:
        hdr["__metadata__"] = meta
    for name, dt, shape in tensors:
        n = DSIZE[dt]
        for s in shape:
            n *= s
        hdr[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
        blobs.append(bytes(rng.getrandbits(8) for _ in range(n)))
    h = json.dumps(hdr, separators=(",", ":")).encode()
    if pad:
        h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def st_read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n))


st_paths = sorted(glob.glob("tests/fixtures/golden/*/*.safetensors")) + sorted(
    glob.glob("models/dgemma-small/*.safetensors"))
for p in st_paths:
    hdr = st_read_header(p)
    meta = hdr.pop("__metadata__", None)
    ts = sorted(hdr.items(), key=lambda kv: kv[1]["data_offsets"][0])
    ts = [(k, v["dtype"], v["shape"]) for k, v in ts]
    # the fixture's first tensors, each dim clipped to 2 (keeps names, dtypes, ranks)
    add("safetensors", st_file([(k, d, [min(s, 2) for s in sh]) for k, d, sh in ts[:12]], meta), False)
    # all of its tensors, dims clipped to 1 (the whole header structure)
    if len(ts) <= 400:
        add("safetensors", st_file([(k, d, [min(s, 1) for s in sh]) for k, d, sh in ts], meta), False)
# hand-made corner cases
add("safetensors", st_file([]), False)
add("safetensors", st_file([], {"format": "pt"}), False)
add("safetensors", st_file([(d.lower() + ".t", d, [2]) for d in DSIZE], {"format": "pt", "k": "v"}), False)
add("safetensors", st_file([("scalar", "F32", []), ("empty", "BF16", [0, 3]), ("z", "U8", [0])]), False)
add("safetensors", st_file([("t", "F32", [1, 1, 1, 1, 1, 1, 1, 2])], pad=False), False)
w = dict_words.setdefault("safetensors", set())
w.update(["__metadata__", "dtype", "shape", "data_offsets", "format", "pt"] + list(DSIZE))

# ---- model.safetensors.index.json (the harness's shards: fuzz_st_index.c) ----
S1, S2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
add("st_index", open("models/dgemma-small/model.safetensors.index.json", "rb").read())
add("st_index", jdump({"metadata": {"total_size": 42}, "weight_map": {
    "a.weight": S1, "b.bias": S1, "c.weight": S2, "d": S2}}, 2))
add("st_index", jdump({"weight_map": {"a.weight": S1}}))
add("st_index", jdump({"weight_map": {"c.weight": S2, "d": S2, "b.bias": S1}}))
add("st_index", jdump({"weight_map": {}}))

# ---- config.json and its quantization block -------------------------------
cfg_paths = ["models/dgemma-small/config.json"] + sorted(glob.glob("tests/fixtures/golden/*/config.json"))
for p in cfg_paths:
    raw = open(p, "rb").read()
    add("config", raw)
    add("quant", raw)
    c = json.loads(raw)
    tc = c.get("text_config")
    if isinstance(tc, dict):  # the bare text-config form
        t = dict(tc)
        t["model_type"] = "diffusion_gemma_text"
        add("config", jdump(t))
        # quantized variants, as dgemma quantize / mlx-lm write them
        q = {"group_size": 64, "bits": 4, "mode": "affine",
             "model.decoder.embed_tokens": {"group_size": 32, "bits": 8},
             "model.encoder.layers.0.router.proj": False}
        for key in ("quantization", "quantization_config"):
            v = dict(c)
            v[key] = q
            add("quant", jdump(v))
            add("config", jdump(v))
        v = dict(c)
        v["text_config"] = dict(tc, quantization={"bits": 6, "group_size": 128})
        add("quant", jdump(v))
        v = dict(c)
        v["quantization_config"] = {"quant_method": "gptq", "bits": 4}
        add("quant", jdump(v))

# ---- generation_config.json and --gen-kwargs ------------------------------
GEN_KEYS = ["max_new_tokens", "max_denoising_steps", "entropy_bound", "sampler_config", "t_min", "t_max",
            "stability_threshold", "confidence_threshold", "eos_token_id", "pad_token_id", "seed", "proposal",
            "linear_temperature_schedule_config", "diffusion_stopping_config"]
gen_paths = ["models/dgemma-small/generation_config.json"] + sorted(
    glob.glob("tests/fixtures/golden/*/generation_config.json"))
for p in gen_paths:
    raw = open(p, "rb").read()
    add("gen_config", raw)
    g = json.loads(raw)
    add("gen_kwargs", jdump({k: v for k, v in g.items() if k in GEN_KEYS}))
turbo = {"diffusion_turbo": True, "turbo_topk": 8, "turbo_monotone": True, "turbo_eos_early_stop": True,
         "turbo_steps": 4, "turbo_accept": "confidence", "turbo_threshold": [0.9, 0.5, 2], "turbo_repair": True,
         "turbo_compact": True, "turbo_repeat_guard": 3, "turbo_sc": "adaptive", "turbo_sc_tail_mass": 0.01,
         "turbo_bucket": True, "turbo_head_rows": 3}
add("gen_kwargs", jdump(turbo))
add("gen_kwargs", jdump({"diffusion_turbo": True, "turbo_steps": None, "turbo_accept": "entropy-bound",
                         "turbo_threshold": 0.9, "turbo_sc": "topk"}))
add("gen_kwargs", jdump({"entropy_bound": 0.2, "proposal": "argmax", "seed": 1234, "eos_token_id": 1}))
add("gen_kwargs", jdump({"proposal": "sample", "eos_token_id": []}))
add("gen_config", jdump(dict(json.loads(open(gen_paths[0]).read()), **turbo)))

# ---- tokenizer.json (the bundled model's, cut to a few hundred ids) -------
tok = json.load(open("models/dgemma-small/tokenizer.json"))


def cut_tokenizer(t, n_ids, drop=()):
    t = json.loads(json.dumps(t))
    voc = {k: v for k, v in t["model"]["vocab"].items() if v < n_ids}
    t["model"]["vocab"] = voc
    merges = []
    for m in t["model"]["merges"]:
        a, b = m.split(" ", 1) if isinstance(m, str) else m
        if a in voc and b in voc and a + b in voc:
            merges.append(m)
    t["model"]["merges"] = merges
    t["added_tokens"] = [a for a in t["added_tokens"] if a["id"] < n_ids]
    for k in drop:
        t[k] = None
    return t


add("tokenizer_json", jdump(cut_tokenizer(tok, 300)))
add("tokenizer_json", jdump(cut_tokenizer(tok, 600), 1))
add("tokenizer_json", jdump(cut_tokenizer(tok, 120, ("normalizer", "pre_tokenizer", "decoder"))))
t = cut_tokenizer(tok, 200)
t["model"]["merges"] = [m.split(" ", 1) if isinstance(m, str) else m for m in t["model"]["merges"]]
add("tokenizer_json", jdump(t))  # merges as pairs, the newer tokenizers layout

# ---- texts: encode/decode and the chat template ---------------------------
gold = json.load(open("tests/fixtures/tokenizer/small_golden.json"))
texts = [c["text"] for c in gold["cases"]]
for i, s in enumerate(texts):
    b = s.encode()
    add("tokenize", bytes([i % 4]) + b, False)
for c in gold["decode_cases"]:
    add("tokenize", bytes([3]) + struct.pack("<%di" % len(c["ids"]), *c["ids"]), False)
for i in range(0, len(texts) - 2, 3):  # (flag, [role byte, content] ... separated by NUL)
    msgs = [bytes([(i + k) % 5]) + texts[i + k].encode() for k in range(3)]
    add("chat", bytes([i % 2]) + b"\0".join(msgs), False)
add("chat", b"\x00\x00You are terse.\x00\x02Hi there\x00\x03<|channel>thought\nx<channel|>Hello!\x00\x02Bye", False)
add("chat", b"\x01\x02What is 2+2?", False)
for h in ("tokenize", "chat"):
    dict_words.setdefault(h, set()).update(
        ["<bos>", "<eos>", "<pad>", "<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|think|>", "\n", "\u2581",
         "<0x0A>", "<start_of_turn>"])

# ---- GSM8K data and resumable results (fuzz_gsm8k.c: byte 0 = reader) -------
for p in sorted(glob.glob("tests/fixtures/gsm8k/*.jsonl")):
    raw = open(p, "rb").read()
    add("gsm8k", b"\x00" + raw, False)
    for line in raw.splitlines():
        if line.strip():
            collect("gsm8k", json.loads(line))
res = [{"idx": i, "config": "cfg", "pred": (None if i == 2 else str(5 * i)), "correct": i % 2 == 0, "tokens": 64,
        "forwards": 9, "blocks": 1, "seconds": 0.25} for i in range(4)]
body = "".join(json.dumps(r) + "\n" for r in res)
add("gsm8k", b"\x01" + body.encode(), False)
add("gsm8k", b"\x01" + (body + json.dumps(dict(res[0], idx=70))).encode(), False)  # torn last line
add("gsm8k", b"\x01" + (body + json.dumps(dict(res[1], config="other")) + "\n").encode(), False)
collect("gsm8k", res[0])
dict_words.setdefault("gsm8k", set()).update(["####", "Question", "Assistant:", "<|separator|>", "1,000", "007"])

# ---- HTTP request bodies of dgemma serve (fuzz_serve_req.c: byte 0 even = chat, odd = completions) ----
chat_bodies = [
    {"messages": [{"role": "user", "content": "What is 7 times 8?"}]},
    {"model": "dgemma-small", "messages": [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": [{"type": "text", "text": "hi there"}]},
                                            {"role": "assistant", "content": "Hello"},
                                            {"role": "user", "content": "again, then stop. END"}],
     "max_completion_tokens": 64, "seed": 7, "stop": ["END", "\n\n"], "stream": True,
     "stream_options": {"include_usage": True}, "temperature": 0.5, "n": 1, "top_p": 1, "user": "u1",
     "dgemma": {"gen_kwargs": dict(turbo, max_denoising_steps=8), "draft": True, "think": False}},
    {"messages": [{"role": "user", "content": "x"}], "max_tokens": 16, "temperature": 0, "logprobs": False,
     "presence_penalty": 0, "frequency_penalty": 0, "stop": "x", "dgemma": {"gen_kwargs": {"entropy_bound": 0.2}}},
]
compl_bodies = [
    {"prompt": "Sam has 23 apples.", "max_tokens": 32, "stop": "apples"},
    {"model": None, "prompt": ["one prompt \ufffd"], "echo": False, "stream": False, "seed": 0,
     "dgemma": {"gen_kwargs": {"diffusion_turbo": True, "turbo_head_rows": 4}}},
]
for b in chat_bodies:
    add("serve_req", b"\x00" + jdump(b).encode(), False)
    collect("serve_req", b)
for b in compl_bodies:
    add("serve_req", b"\x01" + jdump(b).encode(), False)
    collect("serve_req", b)

# ---- write ----------------------------------------------------------------
PUNCT = ['{', '}', '[', ']', ':', ',', '"', 'true', 'false', 'null', '0', '-1', '1e400', '0.5', '"\\u0000"',
         '"\\ud800"', '4294967296', '9007199254740993', '1e-400']
for h, lst in seeds.items():
    d = os.path.join(OUT, h)
    os.makedirs(d, exist_ok=True)
    for b in lst:
        with open(os.path.join(d, hashlib.sha1(b).hexdigest()), "wb") as f:
            f.write(b)
    words = sorted(dict_words.get(h, set()))
    with open(os.path.join(OUT, h + ".dict"), "w") as f:
        for wd in (PUNCT if h not in ("tokenize", "chat") else []) + words:
            if h not in ("tokenize", "chat") and wd not in PUNCT:
                wd = json.dumps(wd)  # a JSON string token, quotes included
            esc = "".join(c if 32 <= ord(c) < 127 and c not in '"\\' else
                          "".join("\\x%02x" % x for x in c.encode()) for c in wd)
            f.write('"%s"\n' % esc)
    print("seeds: %-15s %3d inputs, %4d dictionary entries" % (h, len(lst), len(words)))
