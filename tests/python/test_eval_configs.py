"""scripts/eval_configs.py: every configuration in its own process, summaries collected into one table.

Uses a fake `dgemma` (a small python script) that records its pid and arguments and writes a summary;
plain python3:  python3 -m unittest discover -s tests/python -v
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DRIVER = os.path.join(ROOT, "scripts", "eval_configs.py")

FAKE = r'''#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_LOG"], "a") as f:
    f.write(json.dumps({"pid": os.getpid(), "args": args}) + "\n")
if "--fail" in args:
    sys.stderr.write("dgemma eval: boom\n")
    sys.exit(1)
summary = args[args.index("--summary") + 1]
chat = "--chat" in args
s = {"title": "t", "config": "c", "items": 3, "items_target": 4, "correct": 2 if chat else 1, "accuracy": (2 if chat else 1) / 3,
     "wilson_lo": 0.05, "wilson_hi": 0.95, "no_answer": 1, "tokens": 30, "forwards": 12, "blocks": 3,
     "seconds": 3.0, "tok_per_s": 10.0, "forwards_per_block": 4.0, "tokens_per_forward": 2.5, "complete": False}
with open(summary, "w") as f:
    f.write(json.dumps(s) + "\n")
sys.exit(130 if "--stop" in args else 0)
'''


class EvalConfigs(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.fake = os.path.join(self.tmp.name, "dgemma")
        with open(self.fake, "w") as f:
            f.write(FAKE)
        os.chmod(self.fake, 0o755)
        self.log = os.path.join(self.tmp.name, "calls.jsonl")
        self.out = os.path.join(self.tmp.name, "runs")

    def tearDown(self):
        self.tmp.cleanup()

    def run_driver(self, *args):
        env = dict(os.environ, FAKE_LOG=self.log)
        p = subprocess.run([sys.executable, DRIVER, "--dgemma", self.fake, "--out", self.out] + list(args),
                           capture_output=True, text=True, env=env)
        with open(self.log) as f:
            calls = [json.loads(l) for l in f]
        return p, calls

    def test_default_configs_each_in_own_process(self):
        p, calls = self.run_driver("--limit", "4", "-m", "models/x", "--", "-t", "1")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(calls), 3)
        self.assertEqual(len({c["pid"] for c in calls}), 3)
        self.assertEqual(calls[0]["args"][:2], ["eval", "gsm8k"])
        self.assertIn("--chat", calls[1]["args"])
        self.assertIn("--sample", calls[2]["args"])
        for c, name in zip(calls, ["5shot", "chat0", "5shot-sample"]):
            a = c["args"]
            self.assertEqual(a[a.index("--limit") + 1], "4")
            self.assertEqual(a[a.index("-m") + 1], "models/x")
            self.assertEqual(a[a.index("-t") + 1], "1")
            self.assertEqual(a[a.index("-o") + 1], os.path.join(self.out, name + ".jsonl"))
        lines = p.stdout.splitlines()
        self.assertTrue(lines[0].startswith("| configuration | items | correct | accuracy | Wilson 95% |"))
        self.assertIn("| 5shot | 3/4 | 1 | 33.3% | 5.0–95.0% | 1 | 10.0 | 4.00 | 2.50 | ok |", lines)
        self.assertIn("| chat0 | 3/4 | 2 | 66.7% | 5.0–95.0% | 1 | 10.0 | 4.00 | 2.50 | ok |", lines)
        with open(os.path.join(self.out, "summary.md")) as f:
            self.assertEqual(f.read(), p.stdout)

    def test_failure_and_interruption_are_reported(self):
        p, calls = self.run_driver("--config", "good=", "--config", "bad=--fail", "--config", "cut=--stop")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(len(calls), 3)
        self.assertIn("| good | 3/4 | 1 |", p.stdout)
        self.assertRegex(p.stdout, r"\| bad \| (\| ){8}failed \(exit 1, see .*bad\.log\) \|")
        self.assertIn("| interrupted |", p.stdout)
        with open(os.path.join(self.out, "bad.log")) as f:
            self.assertIn("boom", f.read())

    def test_stale_summary_is_not_reused(self):
        os.makedirs(self.out)
        with open(os.path.join(self.out, "bad.json"), "w") as f:
            f.write("{}")
        p, _ = self.run_driver("--config", "bad=--fail")
        self.assertEqual(p.returncode, 1)
        self.assertFalse(os.path.exists(os.path.join(self.out, "bad.json")))

    def test_bad_config_syntax(self):
        p = subprocess.run([sys.executable, DRIVER, "--config", "noequals"], capture_output=True, text=True)
        self.assertEqual(p.returncode, 2)
        self.assertIn("NAME=ARGS", p.stderr)


if __name__ == "__main__":
    unittest.main()
