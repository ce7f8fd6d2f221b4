"""Torch-free parts of the small model's training: the learning-rate schedule across resumed runs,
the curriculum (mix schedule), batch composition, the FLOP count and the run log CSV.

Plain python3, no third-party modules:  python3 -m unittest discover -s tests/python -v
"""

import csv
import math
import os
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "smallmodel"))
import runlog  # noqa: E402
import schedule as sch  # noqa: E402

# the bundled model's text config (docs/small-model.md, "Architecture and size")
SMALL = {"vocab_size": 4096, "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
         "num_experts": 8, "top_k_experts": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
         "num_global_key_value_heads": 1, "global_head_dim": 128,
         "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2}


class LearningRate(unittest.TestCase):
    def test_warmup_then_cosine(self):
        lr = lambda s: sch.lr_at(s, 1e-3, 10, 0.1, schedule_steps=100)  # noqa: E731
        self.assertAlmostEqual(lr(0), 1e-4, places=12)            # (0 + 1) / 10 of the peak, f = 0
        self.assertAlmostEqual(lr(9), 1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.09))), places=12)
        self.assertAlmostEqual(lr(50), 1e-3 * 0.55, places=12)    # half way: (0.1 + 1) / 2
        self.assertAlmostEqual(lr(100), 1e-4, places=12)          # the floor
        self.assertAlmostEqual(lr(1000), 1e-4, places=12)         # clipped after the end

    def test_step_schedule_ignores_time(self):
        # a resumed run passes the global step: the same rate whatever the run's clock says
        a = sch.lr_at(300, 2e-3, 30, 0.1, schedule_steps=1000, elapsed=5.0, budget_s=480.0)
        b = sch.lr_at(300, 2e-3, 30, 0.1, schedule_steps=1000, elapsed=470.0, budget_s=480.0)
        self.assertEqual(a, b)

    def test_time_schedule_as_before(self):
        # no schedule_steps: the fraction of the run's budget (the old behaviour)
        self.assertAlmostEqual(sch.lr_at(100, 1e-3, 1, 0.1, elapsed=240.0, budget_s=480.0), 0.55e-3, places=12)
        self.assertAlmostEqual(sch.lr_at(5, 1e-3, 1, 0.1, max_steps=10), 0.55e-3, places=12)


class Curriculum(unittest.TestCase):
    def test_constant_mix(self):
        m = sch.MixSchedule("problems:0.65,gsm8k:0.1,shakespeare:0.25")
        self.assertEqual(m.names, ["problems", "gsm8k", "shakespeare"])
        for step in (0, 10, 10 ** 6):
            self.assertEqual([n for n, _ in m.shares(step)], m.names)
            self.assertAlmostEqual(dict(m.shares(step))["gsm8k"], 0.1)

    def test_keypoints_interpolate(self):
        m = sch.MixSchedule("0=ops1:0.8,shakespeare:0.2; 1000=ops1:0.2,problems:0.6,shakespeare:0.2;"
                            "3000=problems:8,shakespeare:2")
        self.assertEqual(m.names, ["ops1", "shakespeare", "problems"])
        self.assertEqual(dict(m.shares(0)), {"ops1": 0.8, "shakespeare": 0.2, "problems": 0.0})
        mid = dict(m.shares(500))
        self.assertAlmostEqual(mid["ops1"], 0.5)
        self.assertAlmostEqual(mid["problems"], 0.3)
        self.assertAlmostEqual(mid["shakespeare"], 0.2)
        end = dict(m.shares(2000))                 # half way from keypoint 2 to 3 (normalised 0.8/0.2)
        self.assertAlmostEqual(end["ops1"], 0.1)
        self.assertAlmostEqual(end["problems"], 0.7)
        self.assertEqual(dict(m.shares(10 ** 6)), {"ops1": 0.0, "shakespeare": 0.2, "problems": 0.8})
        for s in range(0, 4000, 37):
            self.assertAlmostEqual(sum(p for _, p in m.shares(s)), 1.0)

    def test_bad_specs(self):
        for bad in ("", "problems", "problems:-1", "problems:0", "5=problems:1", "0=a:1;0=b:1", "0=a:1;9=b:1;4=a:1",
                    "a:1,a:2"):
            with self.assertRaises(ValueError, msg=bad):
                sch.MixSchedule(bad)

    def test_batch_counts(self):
        self.assertEqual(sch.batch_counts([("a", 0.65), ("b", 0.1), ("c", 0.25)], 256),
                         [("a", 166), ("b", 26), ("c", 64)])  # 166.4, 25.6, 64: the 0.6 remainder wins
        for B in (1, 7, 64, 255):
            for shares in ([("a", 1 / 3), ("b", 1 / 3), ("c", 1 / 3)], [("a", 0.999), ("b", 0.001)]):
                c = sch.batch_counts(shares, B)
                self.assertEqual(sum(n for _, n in c), B)
                for (_, p), (_, n) in zip(shares, c):
                    self.assertLessEqual(abs(n - p * B), 1.0)


class Flops(unittest.TestCase):
    def test_token_macs_small_model(self):
        d = runlog.dims_from_text_config(SMALL)
        # sliding: q 256x256, k 256x128, v 256x128, o 256x256 = 196,608; full: q 256x512, k 256x128, o 512x256 = 294,912
        # dense MLP 3x256x512 = 393,216; router 256x8 = 2,048; MoE top-2: 2x3x256x128 = 196,608
        ffn = 393216 + 2048 + 196608
        self.assertEqual(runlog.token_macs(d), 4 * (196608 + ffn) + 2 * (294912 + ffn))
        self.assertEqual(runlog.token_macs(d, "dense") - runlog.token_macs(d), 6 * 6 * 3 * 256 * 128)

    def test_step_flops_by_hand(self):
        d = {"H": 4, "V": 10, "I": 6, "Im": 2, "E": 3, "k": 1, "layers": [(2, 1, 2, True)]}
        per_tok = 4 * (4 + 2 * 2 + 4) + 3 * 4 * 6 + 4 * 3 + 1 * 3 * 4 * 2       # 48 + 72 + 12 + 24 = 156
        self.assertEqual(runlog.token_macs(d), 156)
        B, L, C, nsc = 2, 5, 3, 1
        enc = B * L * 156 + 2 * 2 * 2 * (B * L) * (L + 1) / 2 + B * (L - 1) * 4 * 10
        dec_row = C * 156 + 2 * 2 * 2 * C * (L + C) + C * 4 * 10
        main = B * dec_row + B * C * 3 * 4 * 6          # + the self-conditioning MLP (3x: with gradients)
        soft = B * C * 10 * 4                            # softmax(logits) @ E: forward + dE only (2x)
        want = 2 * (3 * enc + nsc * dec_row + 3 * main + 2 * soft)
        self.assertEqual(runlog.step_flops(d, B, L, C, nsc), want)
        # attention left out: the same minus every Q K^T / P V product
        attn = 2 * 2 * 2 * (B * L) * (L + 1) / 2 * 3 + 2 * 2 * 2 * C * (L + C) * (nsc + 3 * B)
        self.assertEqual(runlog.step_flops(d, B, L, C, nsc, attn="none"), want - 2 * attn)
        # no self-conditioning rows: no sc pass and no sc input
        self.assertEqual(runlog.step_flops(d, B, L, C, 0), 2 * (3 * enc + 3 * B * dec_row))
        with self.assertRaises(ValueError):
            runlog.step_flops(d, 2, 5, 3, 3)
        with self.assertRaises(ValueError):
            runlog.step_flops(d, 2, 5, 3, 1, attn="half")

    def test_mfu_and_peak(self):
        self.assertAlmostEqual(runlog.mfu(989.4e12, 2.0, 989.4), 0.5)
        self.assertIsNone(runlog.mfu(1e12, 1.0, None))
        self.assertEqual(runlog.detect_peak_tflops("NVIDIA H200"), 989.4)
        self.assertIsNone(runlog.detect_peak_tflops("cpu"))


class Log(unittest.TestCase):
    def test_append_across_runs_and_new_columns(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "train_log.csv")
            runlog.append_log(p, [{"run": 1, "step": 10, "loss": 2.5}], ["run", "step", "loss"])
            runlog.append_log(p, [{"run": 2, "step": 20, "loss": 2.25, "probe_acc": 0.125}],
                              ["run", "step", "loss", "probe_acc"])
            with open(p, newline="") as f:
                rows = list(csv.reader(f))
            self.assertEqual(rows, [["run", "step", "loss", "probe_acc"], ["1", "10", "2.5", ""],
                                    ["2", "20", "2.25", "0.125"]])

    def test_merge_global_and_old_logs(self):
        old1 = [{"step": "1", "loss": "9"}, {"step": "10", "loss": "5"}]          # pre-checkpoint logs
        old2 = [{"step": "1", "loss": "6"}, {"step": "20", "loss": "4"}]
        new = [{"run": "1", "step": "5", "loss": "3"}, {"run": "1", "step": "40", "loss": "2"}]
        redo = [{"run": "2", "step": "40", "loss": "1.5"}, {"run": "2", "step": "50", "loss": "1"}]
        m = runlog.merge_logs([old1, old2, new, redo])
        self.assertEqual([(r["step"], r["loss"], r["source"]) for r in m],
                         [(1, "9", 0), (5, "3", 2), (10, "5", 0), (11, "6", 1), (30, "4", 1), (40, "1.5", 3),
                          (50, "1", 3)])


if __name__ == "__main__":
    unittest.main()
