#!/usr/bin/env python3
"""turbo_table.py: the reference sampler against turbo configurations on
held-out arithmetic problems (issue 6's measured table), each configuration in
a fresh `dgemma eval problems` process, then one table with accuracy per step
count, tok/s, forwards per block, and a paired comparison with the reference.

  scripts/turbo_table.py [--dgemma build/dgemma] [-m MODEL] [--file F.jsonl]
                         [--out DIR] [--limit N] [--config NAME=GEN_KWARGS ...]
                         [--analyze-only] [-- ARGS for every process, e.g. -t 1]

Without --config the configurations are DEFAULT_CONFIGS below: `reference`
(the model's generation config, spec 6.1) and turbo settings (spec 7, README
"Turbo engine"). The first configuration is the baseline of the paired test.

Per configuration: DIR/NAME.jsonl (per problem; a rerun resumes it), DIR/NAME.md
(dgemma's own summary), DIR/NAME.log (stderr). The table goes to stdout and
DIR/turbo_table.md; DIR/turbo_table.jsonl has one row per configuration (for
scripts/plots.sh: config, tok_s, accuracy, acc_lo, acc_hi, ...).

What each column is:
- accuracy per step count and overall, Wilson 95% intervals;
- tok/s: generated tokens (up to and including the stop id) over summed
  generation time (prefill included), the first --warmup problems of the file
  excluded; also the median over problems of each problem's tok/s;
- speed-up: tok/s over the baseline's tok/s (both measured in this run's
  processes, so only comparable when they ran under the same load);
- forwards per block: decoder forwards / canvases; positions per forward:
  canvas positions run through the decoder per forward (< C with turbo_compact);
- paired comparison with the baseline on the problems both answered: b = only
  the baseline right, c = only this configuration right, difference (c - b)/n
  with a 95% interval (normal approximation of the paired difference), and the
  exact two-sided McNemar p-value 2 * P(X <= min(b, c)), X ~ Binomial(b + c, 1/2).

Plain python3 (no third-party modules). Exit status 1 if a configuration failed.
"""

import argparse
import json
import math
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELDOUT = os.path.join(ROOT, "tools", "smallmodel", "data", "problems_heldout.jsonl")

_REC = '"diffusion_turbo": true, "turbo_accept": "confidence", "turbo_threshold": [0.95, 0.80, 8], "turbo_repair": true'
DEFAULT_CONFIGS = [
    ("reference", ""),
    # turbo with its defaults: entropy-bound acceptance, exact top-64 sampler chain, exact self-conditioning
    ("turbo-eb", '{"diffusion_turbo": true}'),
    # the write-up's recommended interactive setting (no turbo_steps flush)
    ("recommended", "{%s}" % _REC),
    # the write-up's whole engine: + compacted decoder (stale K/V), bucketing, top-K self-conditioning (lossy)
    ("writeup", '{%s, "turbo_compact": true, "turbo_bucket": true, "turbo_sc": "topk"}' % _REC),
    # ours: the same with adaptive self-conditioning (tail mass <= 0.01) instead of top-K
    ("best", '{%s, "turbo_compact": true, "turbo_bucket": true, "turbo_sc": "adaptive"}' % _REC),
]


def wilson(k, n, z=1.959963984540054):
    """Wilson score interval of k successes out of n (95% by default)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    z2 = z * z
    c = (p + z2 / (2 * n)) / (1 + z2 / n)
    h = z * math.sqrt(p * (1 - p) / n + z2 / (4.0 * n * n)) / (1 + z2 / n)
    return c - h, c + h


def mcnemar_exact(b, c):
    """Exact two-sided McNemar p-value: 2 * P(X <= min(b, c)), X ~ Bin(b + c, 1/2), capped at 1."""
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2.0 ** n
    return min(1.0, 2.0 * tail)


def paired_diff(b, c, n, z=1.959963984540054):
    """Paired accuracy difference (c - b) / n and its 95% interval (normal approximation)."""
    if n == 0:
        return 0.0, 0.0, 0.0
    d = (c - b) / n
    var = (b + c) / n - d * d
    se = math.sqrt(max(var, 0.0) / n)
    return d, max(-1.0, d - z * se), min(1.0, d + z * se)  # a difference of proportions lies in [-1, 1]


def median(xs):
    s = sorted(xs)
    if not s:
        return float("nan")
    m = len(s) // 2
    return s[m] if len(s) % 2 else 0.5 * (s[m - 1] + s[m])


def load_items(path):
    """Result lines of `dgemma eval problems -o`; a torn last line is ignored."""
    items = {}
    with open(path) as f:
        for line in f:
            if not line.endswith("\n") or not line.strip():
                continue
            r = json.loads(line)
            items[r["id"]] = r
    return items


def file_ids(path, limit):
    """The ids `dgemma eval problems` gives the first `limit` records of a problems file (all if 0):
    the record's "id", else its index among the non-blank lines."""
    ids = set()
    with open(path) as f:
        n = 0
        for line in f:
            if not line.strip():
                continue
            if limit and n >= limit:
                break
            r = json.loads(line)
            ids.add(r["id"] if "id" in r else n)
            n += 1
    return ids


def summarize(items, warmup):
    """Accuracy per step count and speed figures of one configuration's items (dict id -> record)."""
    ids = sorted(items)
    # with no more problems than --warmup, nothing is excluded (flagged in the row: warmup_excluded)
    timed = [items[i] for i in ids[warmup:]] if len(ids) > warmup else [items[i] for i in ids]
    s = {"n": len(ids), "correct": sum(1 for i in ids if items[i]["correct"]),
         "warmup_excluded": min(warmup, len(ids)) if len(ids) > warmup else 0}
    s["accuracy"] = s["correct"] / s["n"] if s["n"] else 0.0
    s["acc_lo"], s["acc_hi"] = wilson(s["correct"], s["n"])
    per = {}
    for i in ids:
        st = items[i]["steps"]
        k, n = per.get(st, (0, 0))
        per[st] = (k + (1 if items[i]["correct"] else 0), n + 1)
    s["per_steps"] = {str(st): {"correct": k, "n": n} for st, (k, n) in sorted(per.items())}
    k12 = sum(per.get(st, (0, 0))[0] for st in (1, 2))
    n12 = sum(per.get(st, (0, 0))[1] for st in (1, 2))
    s["acc_12"] = k12 / n12 if n12 else 0.0
    s["n_12"] = n12
    tok = sum(r["tokens"] for r in timed)
    sec = sum(r["seconds"] for r in timed)
    s["tok_s"] = tok / sec if sec > 0 else 0.0
    s["tok_s_median"] = median([r["tokens"] / r["seconds"] for r in timed if r["seconds"] > 0])
    s["seconds"] = sum(items[i]["seconds"] for i in ids)
    blocks = sum(items[i]["blocks"] for i in ids)
    fw = sum(items[i]["forwards"] for i in ids)
    s["forwards_per_block"] = fw / blocks if blocks else 0.0
    s["positions_per_forward"] = sum(items[i]["positions"] for i in ids) / fw if fw else 0.0
    s["no_answer"] = sum(1 for i in ids if items[i]["pred"] is None)
    return s


def compare(base, other):
    """Paired comparison on the ids both configurations answered."""
    common = sorted(set(base) & set(other))
    b = sum(1 for i in common if base[i]["correct"] and not other[i]["correct"])
    c = sum(1 for i in common if other[i]["correct"] and not base[i]["correct"])
    d, lo, hi = paired_diff(b, c, len(common))
    return {"n_paired": len(common), "only_base": b, "only_this": c, "diff": d, "diff_lo": lo, "diff_hi": hi,
            "mcnemar_p": mcnemar_exact(b, c)}


def table(rows, base_name):
    steps = sorted({int(k) for _, s, _ in rows if s for k in s["per_steps"]})
    head = ["configuration", "problems", "accuracy (Wilson 95%)", "1–2 steps"] + ["%d st." % k for k in steps] + [
        "tok/s", "median tok/s", "speed-up", "forwards/block", "positions/forward",
        "vs %s: only base / only this" % base_name, "difference (95%)", "McNemar p"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base_tok = next((s["tok_s"] for n, s, _ in rows if n == base_name and s), 0.0)
    for name, s, cmp in rows:
        if not s:
            out.append("| %s |" % name + " |" * (len(head) - 1))
            continue
        cells = [name, str(s["n"]), "%.1f%% (%.1f–%.1f)" % (100 * s["accuracy"], 100 * s["acc_lo"], 100 * s["acc_hi"]),
                 "%.1f%%" % (100 * s["acc_12"])]
        for k in steps:
            p = s["per_steps"].get(str(k))
            cells.append("%d/%d" % (p["correct"], p["n"]) if p else "")
        cells += ["%.1f" % s["tok_s"], "%.1f" % s["tok_s_median"],
                  "%.2fx" % (s["tok_s"] / base_tok) if base_tok > 0 else "",
                  "%.2f" % s["forwards_per_block"], "%.1f" % s["positions_per_forward"]]
        if cmp:
            cells += ["%d / %d" % (cmp["only_base"], cmp["only_this"]),
                      "%+.1f (%+.1f, %+.1f) pt" % (100 * cmp["diff"], 100 * cmp["diff_lo"], 100 * cmp["diff_hi"]),
                      "%.3g" % cmp["mcnemar_p"]]
        else:
            cells += ["—", "—", "—"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def parse_args(argv):
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dgemma", default=os.path.join(ROOT, "build", "dgemma"))
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--file", default=HELDOUT, help="problems JSONL (default: the committed held-out set)")
    ap.add_argument("--out", default="turbo-runs")
    ap.add_argument("--limit", type=int, default=0, help="first N problems of the file (0 = all)")
    ap.add_argument("--warmup", type=int, default=1, help="problems excluded from tok/s (default 1)")
    ap.add_argument("--config", action="append", default=[], metavar="NAME=GEN_KWARGS")
    ap.add_argument("--analyze-only", action="store_true", help="only build the table from DIR/NAME.jsonl")
    a = ap.parse_args(argv)
    configs = []
    for c in a.config:
        name, sep, kw = c.partition("=")
        if not sep or not name or "/" in name:
            ap.error("--config expects NAME=GEN_KWARGS (GEN_KWARGS may be empty: the reference), got %r" % c)
        if kw:
            try:
                json.loads(kw)
            except ValueError as e:
                ap.error("--config %s: GEN_KWARGS is not JSON: %s" % (name, e))
        configs.append((name, kw))
    a.configs = configs or DEFAULT_CONFIGS
    if len({n for n, _ in a.configs}) != len(a.configs):
        ap.error("configuration names must be distinct")
    if a.limit < 0 or a.warmup < 0:
        ap.error("--limit and --warmup must be >= 0")
    if not os.path.isfile(a.file):
        ap.error("--file %s: no such problems file" % a.file)
    if a.analyze_only and not os.path.isdir(a.out):
        ap.error("--analyze-only: %s is not a directory of earlier runs" % a.out)
    a.extra = extra
    return a


def run_config(a, name, kw):
    base = os.path.join(a.out, name)
    cmd = [a.dgemma, "eval", "problems", "--file", a.file, "-o", base + ".jsonl"] + a.extra
    if kw:
        cmd += ["--gen-kwargs", kw]
    if a.model:
        cmd += ["-m", a.model]
    if a.limit:
        cmd += ["--limit", str(a.limit)]
    print("turbo_table: %s: %s" % (name, " ".join(shlex.quote(c) for c in cmd)), file=sys.stderr, flush=True)
    with open(base + ".md", "w") as out, open(base + ".log", "w") as log:
        rc = subprocess.call(cmd, stdout=out, stderr=log)
    return rc, cmd


def main(argv):
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    status, cmds = {}, []
    for name, kw in a.configs:
        if a.analyze_only:
            status[name] = 0
            continue
        rc, cmd = run_config(a, name, kw)
        status[name] = rc
        cmds.append("- `%s`: `%s`" % (name, " ".join(shlex.quote(c) for c in cmd)))
    wanted = file_ids(a.file, a.limit)
    items = {}
    for name, _ in a.configs:
        path = os.path.join(a.out, name + ".jsonl")
        got = load_items(path) if os.path.exists(path) else {}
        items[name] = {i: r for i, r in got.items() if i in wanted}
    base_name = a.configs[0][0]
    rows, jrows = [], []
    for name, kw in a.configs:
        s = summarize(items[name], a.warmup) if items[name] else None
        cmp = compare(items[base_name], items[name]) if s and name != base_name and items[base_name] else None
        rows.append((name, s, cmp))
        if s:
            jrows.append(dict(config=name, gen_kwargs=kw, **s, **(cmp or {})))
    text = table(rows, base_name)
    failed = [n for n, rc in status.items() if rc != 0]
    if failed:
        text += "\nFAILED or interrupted: %s (see DIR/NAME.log; rerun to resume)\n" % ", ".join(failed)
    if cmds:
        text += "\n" + "\n".join(cmds) + "\n"
    sys.stdout.write(text)
    with open(os.path.join(a.out, "turbo_table.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "turbo_table.jsonl"), "w") as f:
        for r in jrows:
            f.write(json.dumps(r) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("turbo_table: interrupted; rerun the same command to resume", file=sys.stderr)
        sys.exit(130)
