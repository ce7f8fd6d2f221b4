#!/usr/bin/env python3
"""eval_configs.py: run several `dgemma eval gsm8k` configurations, each in its
own process, and collect their summaries into one markdown table.

  scripts/eval_configs.py [--dgemma build/dgemma] [--out DIR] [--limit N] [-m MODEL]
                          [--config NAME=ARGS ...] [-- ARGS for every configuration]

Without --config the configurations are
  5shot         eval gsm8k                 (vLLM harness: 5-shot completion, argmax proposals)
  chat0         eval gsm8k --chat          (zero-shot chat, thinking off)
  5shot-sample  eval gsm8k --sample        (reference multinomial proposals)
Each writes DIR/NAME.jsonl (per item; rerunning resumes it), DIR/NAME.json
(summary) and DIR/NAME.log (stderr). The table goes to stdout and DIR/summary.md.
Exit status 1 if any configuration failed (its row says so). Plain python3.
"""

import argparse
import json
import os
import shlex
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_CONFIGS = [("5shot", ""), ("chat0", "--chat"), ("5shot-sample", "--sample")]


def parse_args(argv):
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dgemma", default=os.path.join(ROOT, "build", "dgemma"))
    ap.add_argument("--out", default="eval-runs")
    ap.add_argument("--limit", type=int, default=0, help="items per configuration (0 = all 1,319)")
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("--config", action="append", default=[], metavar="NAME=ARGS")
    a = ap.parse_args(argv)
    configs = []
    for c in a.config:
        name, sep, args = c.partition("=")
        if not sep or not name or "/" in name:
            ap.error("--config expects NAME=ARGS, got %r" % c)
        configs.append((name, args))
    a.configs = configs or DEFAULT_CONFIGS
    if len({n for n, _ in a.configs}) != len(a.configs):
        ap.error("configuration names must be distinct")
    a.extra = extra
    return a


def run_config(a, name, args):
    """Run one configuration in a fresh process; returns (status, summary dict or None)."""
    base = os.path.join(a.out, name)
    cmd = [a.dgemma, "eval", "gsm8k"] + shlex.split(args) + a.extra
    if a.model:
        cmd += ["-m", a.model]
    if a.limit:
        cmd += ["--limit", str(a.limit)]
    cmd += ["-o", base + ".jsonl", "--summary", base + ".json"]
    if os.path.exists(base + ".json"):
        os.remove(base + ".json")  # a stale summary must not stand in for a failed run
    print("eval_configs: %s: %s" % (name, " ".join(shlex.quote(c) for c in cmd)), file=sys.stderr, flush=True)
    with open(base + ".log", "w") as log:
        rc = subprocess.call(cmd, stdout=subprocess.DEVNULL, stderr=log)
    summary = None
    if os.path.exists(base + ".json"):
        with open(base + ".json") as f:
            summary = json.load(f)
    status = "ok" if rc == 0 else ("interrupted" if rc in (130, 143) else "failed (exit %d, see %s.log)" % (rc, base))
    return status, summary, cmd


def table(rows):
    out = ["| configuration | items | correct | accuracy | Wilson 95% | no answer | tok/s | forwards/block | "
           "tokens/forward | status |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for name, status, s in rows:
        if s is None:
            out.append("| %s | | | | | | | | | %s |" % (name, status))
            continue
        out.append("| %s | %d/%d | %d | %.1f%% | %.1f–%.1f%% | %d | %.1f | %.2f | %.2f | %s |" % (
            name, s["items"], s["items_target"], s["correct"], 100 * s["accuracy"], 100 * s["wilson_lo"],
            100 * s["wilson_hi"], s["no_answer"], s["tok_per_s"], s["forwards_per_block"], s["tokens_per_forward"],
            status))
    return "\n".join(out) + "\n"


def main(argv):
    a = parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    rows, cmds = [], []
    for name, args in a.configs:
        status, summary, cmd = run_config(a, name, args)
        rows.append((name, status, summary))
        cmds.append("- `%s`: `%s`" % (name, " ".join(shlex.quote(c) for c in cmd)))
    text = table(rows) + "\n" + "\n".join(cmds) + "\n"
    sys.stdout.write(text)
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    return 0 if all(st == "ok" for _, st, _ in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
