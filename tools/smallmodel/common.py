"""Torch-free helpers shared by the small-model tools (and tested in CI with plain python3).

Token ids and names follow DiffusionGemma (docs/small-model.md, spec section 2): the small
model's tokenizer keeps them, so one chat template serves the small and the real model.
"""

import glob
import json
import math
import os
import random
import re

PAD, EOS, BOS, UNK, MASK = 0, 1, 2, 3, 4
TOOL, TOOL_END, TOOL_CALL, TOOL_CALL_END, TOOL_RESP, TOOL_RESP_END, ESCAPE = 46, 47, 48, 49, 50, 51, 52
THINK, CHANNEL, CHANNEL_END, TURN, TURN_END, NEWLINE = 98, 100, 101, 105, 106, 107
STOP_IDS = (EOS, TURN_END, TOOL_RESP)   # generation_config eos_token_id
N_RESERVED = 108                        # ids 0..107: control, unused and "\n"
BYTE_BASE = N_RESERVED                  # "<0x00>" .. "<0xFF>" at 108..363
FIRST_LEARNED = BYTE_BASE + 256         # learned BPE pieces start here

_NAMED = {PAD: "<pad>", EOS: "<eos>", BOS: "<bos>", UNK: "<unk>", MASK: "<mask>", 5: "[multimodal]",
          TOOL: "<|tool>", TOOL_END: "<tool|>", TOOL_CALL: "<|tool_call>", TOOL_CALL_END: "<tool_call|>",
          TOOL_RESP: "<|tool_response>", TOOL_RESP_END: "<tool_response|>", ESCAPE: '<|"|>',
          THINK: "<|think|>", CHANNEL: "<|channel>", CHANNEL_END: "<channel|>", TURN: "<|turn>",
          TURN_END: "<turn|>", NEWLINE: "\n"}
# special=true: the DiffusionGemma control tokens; as in Gemma's tokenizer.json, <mask>,
# [multimodal], the <unusedN> and "\n" are added tokens with special=false.
_SPECIAL = {PAD, EOS, BOS, UNK, TOOL, TOOL_END, TOOL_CALL, TOOL_CALL_END, TOOL_RESP, TOOL_RESP_END, ESCAPE,
            THINK, CHANNEL, CHANNEL_END, TURN, TURN_END}


def reserved_tokens():
    """[(id, content, special)] for ids 0..107. Unnamed ids keep Gemma's names <unused{id-6}>."""
    return [(i, _NAMED.get(i, "<unused%d>" % (i - 6)), i in _SPECIAL) for i in range(N_RESERVED)]


def byte_token(b):
    return "<0x%02X>" % b


# ---- chat rendering (by ids) ----------------------------------------------------------
# "<bos><|turn>user\n{question}<turn|>\n<|turn>model\n<|channel>thought\n<channel|>{answer}<turn|>"
# Control tokens are written by id; each text segment is encoded on its own with
# encode(text) -> list of ids (no BOS added). "\n" inside text is the added token 107.

def prompt_ids(encode, question):
    """Prompt ending with the generation prompt (thinking off)."""
    return ([BOS, TURN] + encode("user") + [NEWLINE] + encode(question) + [TURN_END, NEWLINE, TURN]
            + encode("model") + [NEWLINE, CHANNEL] + encode("thought") + [NEWLINE, CHANNEL_END])


def chat_ids(encode, question, answer):
    """(ids, response_start): the full training sequence and the index of its first answer token.
    The response is encode(answer) + [<turn|>]; the canvas past it is filled with <eos>."""
    p = prompt_ids(encode, question)
    return p + encode(answer) + [TURN_END], len(p)


CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|turn>"
    "{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{{ message['content'] | trim }}<turn|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|turn>model\n<|channel>thought\n<channel|>{% endif %}")


# ---- data ------------------------------------------------------------------------------

_CALC = re.compile(r"<<[^<>]*>>")


def clean_gsm8k_answer(a):
    """Strip calculator annotations <<48/2=24>>; keep the text and the final '#### N' line."""
    return _CALC.sub("", a).strip()


def split_shakespeare(text, frac=0.9):
    """(train, heldout): the held-out tail starts at the first line start at or after
    character floor(frac * len(text)); train is everything before it."""
    cut = int(len(text) * frac)
    nl = text.find("\n", cut - 1) if cut > 0 else -1
    start = len(text) if nl < 0 else nl + 1
    return text[:start], text[start:]


def find_data_files(data_dir):
    """Locate GSM8K train.jsonl and tinyshakespeare input.txt anywhere under data_dir
    (the lead copies ../shared/data/{gsm8k/train.jsonl,text/tinyshakespeare/input.txt})."""
    def pick(patterns):
        for pat in patterns:
            hits = sorted(glob.glob(os.path.join(data_dir, pat), recursive=True))
            if hits:
                return hits[0]
        return None
    gsm = pick(["gsm8k/train.jsonl", "**/gsm8k/train.jsonl", "**/train.jsonl", "gsm8k_train.jsonl"])
    sh = pick(["text/tinyshakespeare/input.txt", "tinyshakespeare/input.txt", "**/input.txt",
               "tinyshakespeare.txt"])
    if not gsm or not sh:
        raise FileNotFoundError("under %s: gsm8k train.jsonl %s, tinyshakespeare input.txt %s"
                                % (data_dir, gsm or "missing", sh or "missing"))
    return gsm, sh


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_jsonl(path, items):
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")


# ---- evaluation ------------------------------------------------------------------------

_INT = re.compile(r"-?\d[\d,]*")


def parse_final_answer(text):
    """Integer after the last '####', else the last integer in the text; None if none."""
    if "####" in text:
        tail = text.rsplit("####", 1)[1]
        m = _INT.search(tail)
        if m:
            return _to_int(m.group())
    nums = _INT.findall(text)
    return _to_int(nums[-1]) if nums else None


def _to_int(s):
    s = s.replace(",", "")
    try:
        return int(s)
    except ValueError:
        return None


def cut_at_stop(ids, stop_ids=STOP_IDS, pad=PAD):
    """Generated ids up to (excluding) the first stop id; pads dropped."""
    out = []
    for t in ids:
        if t in stop_ids:
            break
        if t != pad:
            out.append(t)
    return out


def wilson(k, n, z=1.959963984540054):
    """Wilson score interval (lo, hi) for k successes in n trials (95% by default)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    lo = 0.0 if k == 0 else max(0.0, mid - half)
    hi = 1.0 if k == n else min(1.0, mid + half)
    return (lo, hi)


class Bigram:
    """Add-one smoothed bigram model over a vocabulary of V ids."""

    def __init__(self, ids, V):
        self.V = V
        self.uni = {}
        self.bi = {}
        for a, b in zip(ids, ids[1:]):
            self.uni[a] = self.uni.get(a, 0) + 1
            self.bi[(a, b)] = self.bi.get((a, b), 0) + 1

    def nll(self, prev, tok):
        return -math.log((self.bi.get((prev, tok), 0) + 1) / (self.uni.get(prev, 0) + self.V))


def shakespeare_windows(ids, n, ctx_len, canvas, seed, V):
    """Up to n non-overlapping evaluation windows over the held-out token ids.

    Window w: context = [<bos>] + ids[s : s + ctx_len - 1], target = ids[s + ctx_len - 1 : ... + canvas],
    noise = canvas uniform ids in [0, V) from random.Random(seed + w) (the positions >= i of the
    canvas that scores target token i). Windows are spaced evenly over the text."""
    span = ctx_len - 1 + canvas
    count = min(n, len(ids) // span)
    if count <= 0:
        return []
    stride = len(ids) // count
    out = []
    for w in range(count):
        s = w * stride
        ctx = [BOS] + ids[s:s + ctx_len - 1]
        tgt = ids[s + ctx_len - 1:s + span]
        rng = random.Random(seed + w)
        out.append({"window": w, "start": s, "context": ctx, "target": tgt,
                    "noise": [rng.randrange(V) for _ in range(canvas)]})
    return out


def sequential_canvas(target, noise, i):
    """The canvas that scores target[i]: clean target[:i], noise[i:]."""
    return list(target[:i]) + list(noise[i:])


def bigram_window_nll(bigram, windows):
    """Total nats and token count of the bigram model on the windows' targets
    (the first target token is conditioned on the last context token)."""
    tot, n = 0.0, 0
    for w in windows:
        prev = w["context"][-1]
        for t in w["target"]:
            tot += bigram.nll(prev, t)
            prev = t
            n += 1
    return tot, n
