#!/usr/bin/env python3
"""Deterministic generator of multi-step arithmetic word problems (1..8 steps).

Pure Python (no third-party modules): it runs under plain python3 in CI as well
as on the GPU machine. The design (templates, operand ranges, how the number of
steps is chosen, the disjointness rule) is documented in docs/small-model.md,
section "Generated arithmetic problems"; the constants below are the source of
truth for it.

A problem is one start sentence, one sentence per step and a question:

    Mia has 23 apples. She buys 14 more apples. Then she gives 5 apples to
    Leo. How many apples does Mia have now?

and its worked solution has one line per step, numbers zero-padded to three
digits (LINE_FORMAT), plus the final line with the plain number:

    023 + 014 = 037
    037 - 005 = 032
    #### 32

Records (JSONL): {"question", "answer", "steps", "final", "start", "ops"}, where
"ops" is the structured list [[op, operand, result], ...] the text was made
from (the test recomputes every answer from it).

Usage:
    python3 gen_problems.py --out DIR [--train-n 100000]
writes DIR/problems_train.jsonl and DIR/problems_heldout.jsonl and prints the
disjointness report.
"""

import argparse
import json
import os
import random
import re
import sys
import unicodedata

TRAIN_SEED = 1234
HELDOUT_SEED = 5678
TRAIN_N = 100_000          # documented training-set size
HELDOUT_PER_STEPS = 125    # held-out problems per step count (1..8) -> 1000
VAL_SEED = 9012            # validation set: picks among training variants, never the held-out set
VAL_PER_STEPS = 25         # validation problems per step count -> 200
MIN_STEPS, MAX_STEPS = 1, 8

# Operand ranges (every intermediate value stays in [VMIN, VMAX]).
START_RANGE = (2, 60)      # the starting quantity
ADD_MAX = 30               # + b, b in [1, ADD_MAX], result <= VMAX
SUB_MAX = 30               # - b, b in [1, min(SUB_MAX, v - 1)], result >= 1
MUL_RANGE = (2, 4)         # * k, only while v <= MUL_VMAX and v * k <= VMAX
MUL_VMAX = 40
DIV_RANGE = (2, 5)         # / k, exact division only, result >= 1
VMIN, VMAX = 1, 200
# Relative weights of the operations among those allowed at the current value.
OP_WEIGHTS = {"+": 35, "-": 35, "*": 15, "/": 15}

NAMES = [("Mia", "she", "her"), ("Leo", "he", "him"), ("Ava", "she", "her"), ("Sam", "he", "him"),
         ("Zoe", "she", "her"), ("Max", "he", "him"), ("Lily", "she", "her"), ("Ben", "he", "him"),
         ("Nora", "she", "her"), ("Omar", "he", "him"), ("Ruby", "she", "her"), ("Tom", "he", "him")]
ITEMS = ["apples", "marbles", "stickers", "books", "pencils", "coins", "cookies", "stamps",
         "shells", "cards", "eggs", "balloons"]

START_TEMPLATES = ["{N} has {a} {x}.", "{N} starts with {a} {x}.", "{N} owns {a} {x}."]
STEP_TEMPLATES = {
    "+": ["{P} buys {b} more {x}.", "{P} finds {b} more {x}.", "{O} gives {o} {b} {x}.",
          "{P} gets {b} more {x}."],
    "-": ["{P} gives {b} {x} to {O}.", "{P} loses {b} {x}.", "{P} sells {b} {x}.",
          "{P} gives away {b} {x}."],
    "*": ["{P} gets {b} times as many {x} as before.", "The number of {x} {p} has grows {b} times."],
    "/": ["{P} splits the {x} into {b} equal groups and keeps one group.",
          "{P} divides the {x} into {b} equal piles and keeps one pile."],
}
# Solution lines write every number with 3 digits, zero-padded ("035 - 026 = 009"): values stay
# in 1..200, so every line has the same token layout and the canvas positions of digits, operators
# and line ends follow from the number of steps alone. A diffusion decoder writes all canvas
# positions in parallel; with natural numbers the length of each result shifts everything after it
# and the model must settle lengths before digits. The final line stays natural: "#### 9".
LINE_FORMAT = "%03d %s %03d = %03d"
THEN_PROB = 0.5            # "Then " before a step sentence (never the first one)
QUESTION_TEMPLATES = ["How many {x} does {N} have now?", "How many {x} does {N} have at the end?"]


def _apply(v, op, b):
    if op == "+":
        return v + b
    if op == "-":
        return v - b
    if op == "*":
        return v * b
    if op == "/":
        if v % b:
            raise ValueError("inexact division %d / %d" % (v, b))
        return v // b
    raise ValueError("unknown op %r" % op)


def _allowed_ops(v):
    ops = []
    if v + 1 <= VMAX:
        ops.append("+")
    if v - 1 >= VMIN:
        ops.append("-")
    if v <= MUL_VMAX and v * MUL_RANGE[0] <= VMAX:
        ops.append("*")
    if any(v % k == 0 and v // k >= VMIN for k in range(DIV_RANGE[0], DIV_RANGE[1] + 1)):
        ops.append("/")
    return ops


def has_carry(v, op, b):
    """Whether the column arithmetic of v op b (3-digit numbers) carries (+) or borrows (-) in any
    column. Only + and - are considered; * and / return False."""
    if op not in "+-":
        return False
    c = 0
    for _ in range(3):
        dv, db = v % 10, b % 10
        c = (1 if dv + db + c >= 10 else 0) if op == "+" else (1 if dv - db - c < 0 else 0)
        if c:
            return True
        v, b = v // 10, b // 10
    return False


def _pick_operand(rng, v, op, carry_frac=None):
    if carry_frac is not None and op in "+-":
        # Curriculum pools: with probability carry_frac the operand is drawn among those that carry
        # or borrow (when any exists), so that column arithmetic is over-represented. Without
        # carry_frac no extra random number is drawn (the committed sets stay byte-identical).
        hi = min(ADD_MAX, VMAX - v) if op == "+" else min(SUB_MAX, v - VMIN)
        if rng.random() < carry_frac:
            cands = [b for b in range(1, hi + 1) if has_carry(v, op, b)]
            if cands:
                return rng.choice(cands)
        return rng.randint(1, hi)
    if op == "+":
        return rng.randint(1, min(ADD_MAX, VMAX - v))
    if op == "-":
        return rng.randint(1, min(SUB_MAX, v - VMIN))
    if op == "*":
        return rng.randint(MUL_RANGE[0], min(MUL_RANGE[1], VMAX // v))
    ks = [k for k in range(DIV_RANGE[0], DIV_RANGE[1] + 1) if v % k == 0 and v // k >= VMIN]
    return rng.choice(ks)


def _cap(s):
    return s[0].upper() + s[1:]


def generate_problem(rng, steps, carry_frac=None):
    """One problem with exactly `steps` operations, drawn from `rng` (random.Random).
    carry_frac (curriculum pools only): probability that a + or - step draws its operand among
    those that carry or borrow; None keeps the original draw (no extra random numbers)."""
    if not MIN_STEPS <= steps <= MAX_STEPS:
        raise ValueError("steps must be in [%d, %d]" % (MIN_STEPS, MAX_STEPS))
    name, subj, obj = rng.choice(NAMES)
    other = rng.choice([n for n in NAMES if n[0] != name])[0]
    item = rng.choice(ITEMS)
    v = rng.randint(*START_RANGE)
    start = v
    sentences = [rng.choice(START_TEMPLATES).format(N=name, a=v, x=item)]
    ops, lines = [], []
    for s in range(steps):
        allowed = _allowed_ops(v)
        op = rng.choices(allowed, weights=[OP_WEIGHTS[o] for o in allowed])[0]
        b = _pick_operand(rng, v, op, carry_frac)
        r = _apply(v, op, b)
        assert VMIN <= r <= VMAX
        sent = rng.choice(STEP_TEMPLATES[op]).format(P=_cap(subj), p=subj, O=other, o=obj, b=b, x=item)
        if s > 0 and rng.random() < THEN_PROB:
            sent = "Then " + sent[0].lower() + sent[1:] if not sent.startswith(other) else "Then " + sent
        sentences.append(sent)
        lines.append(LINE_FORMAT % (v, op, b, r))
        ops.append([op, b, r])
        v = r
    sentences.append(rng.choice(QUESTION_TEMPLATES).format(N=name, x=item))
    lines.append("#### %d" % v)
    return {"question": " ".join(sentences), "answer": "\n".join(lines), "steps": steps,
            "final": v, "start": start, "ops": ops}


def generate_train(n=TRAIN_N, seed=TRAIN_SEED):
    """Training set: problem i has rng.randint(1, 8) steps (uniform), one stream."""
    rng = random.Random(seed)
    return [generate_problem(rng, rng.randint(MIN_STEPS, MAX_STEPS)) for _ in range(n)]


# ---- disjointness -------------------------------------------------------------

_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
_DIGITS = re.compile(r"\d+")
_SPACE = re.compile(r"\s+")


def normalize_question(q):
    """The normal form two questions are compared in (docs/small-model.md):
    NFKC, case-folded, thousands separators between digits removed ("1,000" ->
    "1000"), every digit run rewritten as its integer value ("012" -> "12"),
    every whitespace run -> one space, stripped."""
    s = unicodedata.normalize("NFKC", q).casefold()
    s = _THOUSANDS.sub("", s)
    s = _DIGITS.sub(lambda m: str(int(m.group())), s)
    return _SPACE.sub(" ", s).strip()


def template_skeleton(q):
    """Numbers -> N (reported only: train and held-out share templates by design)."""
    return _SPACE.sub(" ", _DIGITS.sub("N", q)).strip()


def check_disjoint(train, heldout):
    """Held-out items that share a question with the training set.

    Returns a list of (heldout_index, kind) with kind "exact" (identical strings)
    or "normalized" (equal after normalize_question only). Empty = disjoint."""
    exact = set(p["question"] for p in train)
    norm = set(normalize_question(p["question"]) for p in train)
    bad = []
    for i, p in enumerate(heldout):
        if p["question"] in exact:
            bad.append((i, "exact"))
        elif normalize_question(p["question"]) in norm:
            bad.append((i, "normalized"))
    return bad


def generate_heldout(train, per_steps=HELDOUT_PER_STEPS, seed=HELDOUT_SEED):
    """Held-out set: for steps = 1..8 in order, draw problems with that many steps
    from one rng stream, dropping any whose normalized question is in the training
    set or already in the held-out set, until `per_steps` are kept.
    Returns (items, dropped) where dropped counts the discarded draws."""
    rng = random.Random(seed)
    taken = set(normalize_question(p["question"]) for p in train)
    out, dropped = [], 0
    for steps in range(MIN_STEPS, MAX_STEPS + 1):
        kept = 0
        while kept < per_steps:
            p = generate_problem(rng, steps)
            key = normalize_question(p["question"])
            if key in taken:
                dropped += 1
                continue
            taken.add(key)
            out.append(p)
            kept += 1
    return out, dropped


def generate_validation(train, heldout, per_steps=VAL_PER_STEPS, seed=VAL_SEED):
    """Validation set (seed VAL_SEED): drawn like the held-out set, disjoint from both the
    training and the held-out questions. Used to choose between training variants so that the
    held-out set is only ever used for the final report. Returns (items, dropped)."""
    return generate_heldout(list(train) + list(heldout), per_steps, seed)


# Curriculum pools (training only): single operations first, carries and borrows over-represented,
# then short chains. Drawn after the held-out and validation sets, so their draws that collide
# with those sets (normalised question) are dropped here: disjoint by construction, tested.
POOLS = {
    # name: (seed, n, min_steps, max_steps, carry_frac)
    "ops1": (4321, 50_000, 1, 1, 0.7),
    "short": (4322, 50_000, 2, 3, 0.5),
}


def generate_pool(name, exclude, n=None):
    """Training pool `name` of POOLS: n problems (default the pool's size) with a uniform number of
    steps in [min_steps, max_steps] and the pool's carry_frac, skipping any draw whose normalised
    question is in `exclude` (the held-out and validation problems). Returns (items, dropped)."""
    seed, size, lo, hi, carry = POOLS[name]
    n = size if n is None else n
    rng = random.Random(seed)
    taken = set(normalize_question(p["question"]) for p in exclude)
    out, dropped = [], 0
    while len(out) < n:
        p = generate_problem(rng, rng.randint(lo, hi), carry)
        if normalize_question(p["question"]) in taken:
            dropped += 1
            continue
        out.append(p)
    return out, dropped


def carry_share(problems):
    """Fraction of the + and - steps of `problems` that carry or borrow (reported, tested)."""
    n = k = 0
    for p in problems:
        v = p["start"]
        for op, b, r in p["ops"]:
            if op in "+-":
                n += 1
                k += has_carry(v, op, b)
            v = r
    return k / n if n else 0.0


def verify_problem(p):
    """Recompute the answer from the structured ops; raise AssertionError on any mismatch."""
    v = p["start"]
    lines = p["answer"].split("\n")
    assert len(p["ops"]) == p["steps"] == len(lines) - 1, p
    for (op, b, r), line in zip(p["ops"], lines):
        nv = _apply(v, op, b)
        assert nv == r, (p, op, b, r)
        assert line == LINE_FORMAT % (v, op, b, r), (line, p)
        assert VMIN <= nv <= VMAX
        v = nv
    assert lines[-1] == "#### %d" % v and p["final"] == v, p
    nums = [int(x) for x in _DIGITS.findall(p["question"])]
    assert nums == [p["start"]] + [o[1] for o in p["ops"]], (nums, p)


def write_jsonl(path, items):
    with open(path, "w", encoding="utf-8") as f:
        for it in items:
            f.write(json.dumps(it, ensure_ascii=False) + "\n")


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("--train-n", type=int, default=TRAIN_N)
    ap.add_argument("--heldout-per-steps", type=int, default=HELDOUT_PER_STEPS)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    train = generate_train(a.train_n)
    held, dropped = generate_heldout(train, a.heldout_per_steps)
    bad = check_disjoint(train, held)
    if bad:
        sys.exit("gen_problems: held-out shares %d questions with train: %s" % (len(bad), bad[:5]))
    tr_sk = set(template_skeleton(p["question"]) for p in train)
    shared_sk = sum(template_skeleton(p["question"]) in tr_sk for p in held)
    write_jsonl(os.path.join(a.out, "problems_train.jsonl"), train)
    write_jsonl(os.path.join(a.out, "problems_heldout.jsonl"), held)
    print("gen_problems: train %d (seed %d), held-out %d (seed %d, %d per step count, %d draws dropped "
          "as train/held-out duplicates); exact/normalized overlap 0; held-out sharing a template "
          "skeleton with train: %d (by design)" % (len(train), TRAIN_SEED, len(held), HELDOUT_SEED,
                                                    a.heldout_per_steps, dropped, shared_sk), flush=True)


if __name__ == "__main__":
    main()
