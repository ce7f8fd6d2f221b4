"""scripts/turbo_table.py: the statistics of the turbo table, and the driver run on a fake `dgemma`.

The expected values are worked out by hand in the comments; plain python3:
    python3 -m unittest discover -s tests/python -v
"""

import importlib.util
import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(ROOT, "scripts", "turbo_table.py")
spec = importlib.util.spec_from_file_location("turbo_table", DRIVER)
tt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tt)

# A fake `dgemma eval problems`: answers problem i correctly when (i + salt) % 3 != 0, where the
# salt comes from --gen-kwargs ({"salt": k}); records its arguments; one token per 0.1 s.
FAKE = r'''#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "args": args}) + "\n")
if "--boom" in args:
    sys.exit(1)
kw = json.loads(args[args.index("--gen-kwargs") + 1]) if "--gen-kwargs" in args else {}
salt = kw.get("salt", 0)
out = args[args.index("-o") + 1]
lim = int(args[args.index("--limit") + 1]) if "--limit" in args else 0
rows = [json.loads(l) for l in open(args[args.index("--file") + 1]).read().splitlines() if l.strip()]
with open(out, "a") as f:
    for i, r in enumerate(rows):
        if lim and i >= lim:
            break
        ok = (i + salt) % 3 != 0
        f.write(json.dumps({"id": i, "config": "fake", "steps": r["steps"], "final": r["final"],
                            "pred": r["final"] if ok else None, "correct": ok, "tokens": 10, "forwards": 4 + salt,
                            "blocks": 1, "positions": 64 * (4 + salt), "seconds": 1.0 + salt}) + "\n")
'''


def read(path):
    with open(path) as f:
        return f.read()


class TestStatistics(unittest.TestCase):
    def test_mcnemar_exact(self):
        # b = 3, c = 10, n = 13: P(X <= 3) = (1 + 13 + 78 + 286) / 2^13 = 378 / 8192; two-sided: 756 / 8192
        self.assertAlmostEqual(tt.mcnemar_exact(3, 10), 756 / 8192, places=12)
        self.assertAlmostEqual(tt.mcnemar_exact(10, 3), 756 / 8192, places=12)
        # b = 0, c = 10: 2 / 2^10
        self.assertAlmostEqual(tt.mcnemar_exact(0, 10), 2 / 1024, places=12)
        # b = c: the two tails overlap at the middle and the doubled tail exceeds 1: capped
        self.assertEqual(tt.mcnemar_exact(5, 5), 1.0)
        self.assertEqual(tt.mcnemar_exact(0, 0), 1.0)

    def test_wilson(self):
        # k = 0: the interval starts at 0; k = n: it ends at 1
        lo, hi = tt.wilson(0, 10)
        self.assertAlmostEqual(lo, 0.0, places=12)
        self.assertAlmostEqual(hi, 1.959963984540054 ** 2 / (10 + 1.959963984540054 ** 2), places=12)
        # 43 of 250 (the bundled model's held-out 1-2 step figure): 13.0 % .. 22.4 % as docs/small-model.md says
        lo, hi = tt.wilson(43, 250)
        self.assertEqual(round(100 * lo, 1), 13.0)
        self.assertEqual(round(100 * hi, 1), 22.4)

    def test_paired_diff(self):
        # n = 100, b = 10, c = 4: d = -0.06; var = 14/100 - 0.0036 = 0.1364; se = sqrt(0.1364 / 100)
        d, lo, hi = tt.paired_diff(10, 4, 100)
        se = math.sqrt(0.1364 / 100)
        self.assertAlmostEqual(d, -0.06, places=12)
        self.assertAlmostEqual(lo, -0.06 - 1.959963984540054 * se, places=12)
        self.assertAlmostEqual(hi, -0.06 + 1.959963984540054 * se, places=12)

    def test_summarize_and_compare(self):
        mk = lambda i, ok, st, tok, sec: {"id": i, "correct": ok, "steps": st, "tokens": tok, "seconds": sec,
                                          "forwards": 5, "blocks": 1, "positions": 320, "pred": 1 if ok else None}
        base = {0: mk(0, True, 1, 100, 100.0), 1: mk(1, True, 1, 10, 1.0), 2: mk(2, False, 2, 10, 2.0),
                3: mk(3, True, 3, 10, 4.0)}
        s = tt.summarize(base, warmup=1)
        self.assertEqual((s["n"], s["correct"]), (4, 3))
        self.assertEqual(s["per_steps"], {"1": {"correct": 2, "n": 2}, "2": {"correct": 0, "n": 1},
                                          "3": {"correct": 1, "n": 1}})
        self.assertAlmostEqual(s["acc_12"], 2 / 3)
        # warm-up item 0 excluded: 30 tokens in 7 s; per-item 10, 5, 2.5 -> median 5
        self.assertAlmostEqual(s["tok_s"], 30 / 7)
        self.assertAlmostEqual(s["tok_s_median"], 5.0)
        self.assertEqual(s["no_answer"], 1)
        other = dict(base)
        other[1] = mk(1, False, 1, 10, 1.0)
        other[2] = mk(2, True, 2, 10, 2.0)
        other[3] = mk(3, False, 3, 10, 4.0)
        c = tt.compare(base, other)
        self.assertEqual((c["n_paired"], c["only_base"], c["only_this"]), (4, 2, 1))
        self.assertAlmostEqual(c["mcnemar_p"], 1.0)  # 2 * P(X <= 1 | n = 3) = 2 * 4/8 = 1


class TestDriver(unittest.TestCase):
    def test_fresh_process_per_config_and_table(self):
        with tempfile.TemporaryDirectory() as d:
            fake = os.path.join(d, "dgemma")
            with open(fake, "w") as f:
                f.write(FAKE)
            os.chmod(fake, 0o755)
            probs = os.path.join(d, "p.jsonl")
            with open(probs, "w") as f:
                for i in range(12):
                    f.write(json.dumps({"question": "q%d" % i, "steps": 1 + i % 2, "final": i}) + "\n")
            env = dict(os.environ, FAKE_LOG=os.path.join(d, "log.jsonl"))
            out = os.path.join(d, "out")
            r = subprocess.run([sys.executable, DRIVER, "--dgemma", fake, "--file", probs, "--out", out,
                                "--limit", "9", "--config", "ref=", "--config", 'fast={"salt": 1}', "--", "-t", "1"],
                               env=env, capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, r.stderr)
            calls = [json.loads(l) for l in read(env["FAKE_LOG"]).splitlines()]
            self.assertEqual(len(calls), 2)
            self.assertNotEqual(calls[0]["pid"], calls[1]["pid"])
            self.assertIn("-t", calls[0]["args"])
            self.assertNotIn("--gen-kwargs", calls[0]["args"])
            self.assertEqual(calls[1]["args"][calls[1]["args"].index("--gen-kwargs") + 1], '{"salt": 1}')
            rows = [json.loads(l) for l in read(os.path.join(out, "turbo_table.jsonl")).splitlines()]
            self.assertEqual([x["config"] for x in rows], ["ref", "fast"])
            # ref: i % 3 != 0 over 0..8 -> 6 right; fast: (i + 1) % 3 != 0 -> 6 right
            self.assertEqual(rows[0]["correct"], 6)
            self.assertEqual(rows[1]["correct"], 6)
            # only ref right: i % 3 == 2 (i = 2, 5, 8); only fast right: i % 3 == 0 (0, 3, 6)
            self.assertEqual((rows[1]["only_base"], rows[1]["only_this"]), (3, 3))
            # tok/s without the first (warm-up) problem: ref 10 tokens / 1 s, fast 10 / 2 s
            self.assertAlmostEqual(rows[0]["tok_s"], 10.0)
            self.assertAlmostEqual(rows[1]["tok_s"], 5.0)
            self.assertIn("| fast | 9 |", read(os.path.join(out, "turbo_table.md")))
            self.assertIn("0.50x", r.stdout)

    def test_paired_diff_clipped(self):
        # n = 2, b = 1, c = 0: d = -0.5, var = 0.5 - 0.25, se = sqrt(0.125): -0.5 - 1.96 se < -1, clipped
        d, lo, hi = tt.paired_diff(1, 0, 2)
        self.assertEqual((d, lo), (-0.5, -1.0))
        self.assertLessEqual(hi, 1.0)

    def test_missing_inputs(self):
        r = subprocess.run([sys.executable, DRIVER, "--file", "/nonexistent/p.jsonl"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("no such problems file", r.stderr)
        r = subprocess.run([sys.executable, DRIVER, "--analyze-only", "--out", "/nonexistent/dir"],
                           capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not a directory of earlier runs", r.stderr)

    def test_bad_config(self):
        r = subprocess.run([sys.executable, DRIVER, "--config", "x={not json"], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("not JSON", r.stderr)


if __name__ == "__main__":
    unittest.main()
