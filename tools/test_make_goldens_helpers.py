#!/usr/bin/env python3
"""Tests of the pure-Python parts of tools/make_goldens.py (no torch needed).

Run: python3 tools/test_make_goldens_helpers.py
"""

import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_goldens as mg  # noqa: E402


class Helpers(unittest.TestCase):
    def test_expected_output_no_eos(self):
        out, at = mg.expected_output([[5, 6, 7], [8, 9, 10]], [1], 0)
        self.assertEqual(out, [5, 6, 7, 8, 9, 10])
        self.assertIsNone(at)

    def test_expected_output_eos_in_block2(self):
        blocks = [[5, 6, 7, 8], [9, 1, 4, 1], [3, 3, 3, 3]]
        out, at = mg.expected_output(blocks, [1, 99], 0)
        self.assertEqual(out, [5, 6, 7, 8, 9, 1, 0, 0])  # stops after block 2, pads after the first EOS
        self.assertEqual(at, (1, 1))

    def test_expected_output_eos_last_position(self):
        out, at = mg.expected_output([[2, 3, 1]], [1], 0)
        self.assertEqual(out, [2, 3, 1])
        self.assertEqual(at, (0, 2))

    def test_choose_eos_in_block2(self):
        a = [[10, 11, 12, 13], [14, 15, 16, 17]]
        c = [[10, 15, 12, 13], [14, 16, 20, 17]]
        t, both = mg.choose_eos_in_block2([a, c], 4, 30)
        # 16 is interior in both modes' block 2 and absent from both block 1s; 15 is in c's block 1
        self.assertEqual((t, both), (16, True))
        t, both = mg.choose_eos_in_block2([a, [[1, 2, 3, 4]]], 4, 30)
        self.assertEqual((t, both), (15, False))
        t, both = mg.choose_eos_in_block2([[[1, 2, 3, 4]]], 4, 30)
        self.assertEqual((t, both), (None, False))

    def test_choose_eos_skips_edges_and_first_block(self):
        a = [[3, 4, 5, 6], [7, 3, 8, 9]]  # 3 in block 1; 7 and 9 at the edges; 8 interior
        t, _ = mg.choose_eos_in_block2([a], 4, 10)
        self.assertEqual(t, 8)

    def test_unused_ids(self):
        self.assertEqual(mg.unused_ids([[1, 2, 4], [3]], 10, 2), [5, 6])
        self.assertEqual(mg.unused_ids([[1, 2, 3]], 4, 2), [])

    def test_generation_config_layouts(self):
        g = dict(max_new_tokens=27, max_denoising_steps=5, entropy_bound=8.0, t_min=0.3, t_max=1.1,
                 stability_threshold=1, confidence_threshold=1e-9)
        flat = mg.generation_config_dict(g, "flat", [7, 9], 0, "5.17.0")
        self.assertEqual(flat["sampler_config"], {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": 8.0})
        self.assertEqual((flat["t_min"], flat["t_max"]), (0.3, 1.1))
        self.assertEqual(flat["stability_threshold"], 1)
        self.assertEqual(flat["eos_token_id"], [7, 9])
        nested = mg.generation_config_dict(g, "nested", [7, 9], 0, "5.17.0")
        self.assertNotIn("t_min", nested)
        self.assertEqual(nested["linear_temperature_schedule_config"]["t_max"], 1.1)
        self.assertEqual(nested["diffusion_stopping_config"]["confidence_threshold"], 1e-9)
        json.dumps(flat)
        json.dumps(nested)

    def test_stability_flags(self):
        rows = [[1, 2], [1, 2], [1, 2], [3, 4], [3, 4]]
        blocks = [0, 0, 0, 1, 1]
        self.assertEqual(mg.stability_flags(rows, blocks, 1), [False, True, True, False, True])
        self.assertEqual(mg.stability_flags(rows, blocks, 2), [False, False, True, False, False])
        self.assertEqual(mg.stability_flags(rows, blocks, 0), [True] * 5)

    def test_clean_json(self):
        self.assertEqual(mg.clean_json({"a": float("inf"), "b": [1.5, float("nan")]}), {"a": None, "b": [1.5, None]})

    def test_fixture_specs(self):
        names = set()
        for spec in mg.FIXTURES:
            self.assertNotIn(spec["name"], names)
            names.add(spec["name"])
            t = spec["text"]
            self.assertEqual(t["layer_types"][-1], mg.F, "the last layer must be full attention")
            self.assertEqual(t["num_attention_heads"] % t["num_key_value_heads"], 0)
            self.assertEqual(t["num_attention_heads"] % t["num_global_key_value_heads"], 0)
            self.assertLess(t["top_k_experts"], t["num_experts"])
            g = spec["gen"]
            self.assertIsInstance(g["entropy_bound"], float)
            self.assertIsInstance(g["confidence_threshold"], float)
            self.assertGreater(g["confidence_threshold"], 0.0)
            self.assertIsInstance(g["stability_threshold"], int)
            self.assertLess(g["t_min"], g["t_max"])
            self.assertGreaterEqual(-(-g["max_new_tokens"] // spec["canvas_length"]), 2, "need >= 2 blocks")
            if spec["expect"] == "fixed":
                self.assertTrue(g["stability_threshold"] > g["max_denoising_steps"] or g["confidence_threshold"] < 1e-6)
            for knobs in spec.get("knob_candidates") or [spec["init"]]:
                for k in ("embed_std", "router_std", "branch_mult", "final_mult"):
                    self.assertIn(k, knobs)
                self.assertTrue(set(knobs) <= {"embed_std", "router_std", "branch_mult", "final_mult", "qk_norm_mult",
                                               "sc_mult"} | set(mg.GEN_KNOB_KEYS), knobs)
                self.assertTrue(0.0 < float(knobs.get("sc_mult", 1.0)) <= 1.0)
                gk = mg.apply_gen_knobs(g, knobs)
                self.assertLess(gk["t_min"], gk["t_max"])
                self.assertIsInstance(gk["entropy_bound"], float)
                self.assertGreater(gk["entropy_bound"], 0.0)
                self.assertIsInstance(gk["confidence_threshold"], float)
                if spec["expect"] == "fixed":
                    self.assertTrue(gk["stability_threshold"] > gk["max_denoising_steps"]
                                    or gk["confidence_threshold"] < 1e-6)
            if spec.get("knob_candidates") and spec.get("init"):
                self.assertEqual(spec["knob_candidates"][0], spec["init"], "the original knobs come first")
        self.assertTrue(any(s["text"]["sliding_window"] < s["prompt_len"] for s in mg.FIXTURES))
        self.assertTrue(any(s["gen_layout"] == "nested" for s in mg.FIXTURES))
        self.assertTrue(any(s["gen_layout"] == "flat" for s in mg.FIXTURES))
        self.assertTrue(any(s["expect"] == "early_stop" for s in mg.FIXTURES))
        self.assertTrue(any(s["eos_mode"] == "in_block2" for s in mg.FIXTURES))

    def test_fixture_b_candidates_keep_what_b_is_for(self):
        b = next(s for s in mg.FIXTURES if s["name"] == "dg_b_mqa_nested")
        self.assertTrue(b.get("require_strict"))
        t = b["text"]
        self.assertEqual(t["num_global_key_value_heads"], 1)
        self.assertEqual(t["num_key_value_heads"], 1)
        self.assertEqual(t["layer_types"], [mg.S, mg.F, mg.S, mg.F])
        self.assertEqual(b["gen_layout"], "nested")
        self.assertEqual(b["gen"]["max_new_tokens"], 27)
        self.assertEqual(-(-b["gen"]["max_new_tokens"] // b["canvas_length"]), 3)
        cands = b["knob_candidates"]
        self.assertEqual(cands[0], dict(embed_std=0.25, router_std=1.0, branch_mult=1.0, final_mult=1.0))
        for k in cands:
            self.assertEqual(k["router_std"], 1.0)  # soft routing
            gk = mg.apply_gen_knobs(b["gen"], k)
            self.assertGreaterEqual(gk["entropy_bound"], 4.0)  # several positions accepted per step
            self.assertGreaterEqual(gk["t_min"], 0.3)
            self.assertEqual(gk["max_denoising_steps"], 5)
            self.assertLess(gk["confidence_threshold"], 1e-6)  # fixed step count

    def test_apply_gen_knobs(self):
        g = dict(max_new_tokens=27, max_denoising_steps=5, entropy_bound=8.0, t_min=0.3, t_max=1.1,
                 stability_threshold=1, confidence_threshold=1e-9)
        gk = mg.apply_gen_knobs(g, dict(embed_std=0.2, t_min=0.5, entropy_bound=6))
        self.assertEqual(gk["t_min"], 0.5)
        self.assertEqual(gk["entropy_bound"], 6.0)
        self.assertIsInstance(gk["entropy_bound"], float)
        self.assertNotIn("embed_std", gk)
        self.assertEqual(g["t_min"], 0.3)  # not modified in place
        self.assertEqual(mg.apply_gen_knobs(g, None), g)

    @staticmethod
    def _trace():
        return {
            "canvas": [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 1, 1], [2, 2, 2]],
            "proposal": [[1, 1, 1]] * 5, "argmax": [[3, 3, 3]] * 5,
            "accepted": [[True, False, False]] * 5, "stop": [False] * 5, "blocks": [0, 0, 0, 1, 1],
            "new": [3, 3, 3, 3, 3, 3], "steps_per_block": [3, 2], "canvases_used": 7, "uniforms_used": 0,
        }

    def test_first_trace_divergence(self):
        a = self._trace()
        self.assertIsNone(mg.first_trace_divergence(a, self._trace()))
        b = self._trace()
        b["argmax"] = [list(r) for r in b["argmax"]]
        b["argmax"][4][2] = 7
        b["argmax"][2][1] = 9
        d = mg.first_trace_divergence(a, b)
        self.assertEqual(d, {"step": 2, "block": 0, "step_in_block": 2, "position": 1, "what": "argmax"})
        b = self._trace()
        b["accepted"] = [list(r) for r in b["accepted"]]
        b["accepted"][3][0] = False
        d = mg.first_trace_divergence(a, b)
        self.assertEqual((d["step"], d["block"], d["step_in_block"], d["position"], d["what"]), (3, 1, 0, 0, "accepted"))
        b = self._trace()
        b["stop"] = [False, True, False, False, False]
        self.assertEqual(mg.first_trace_divergence(a, b)["what"], "stop flag")
        b = self._trace()
        for k in ("canvas", "proposal", "argmax", "accepted", "stop", "blocks"):
            b[k] = b[k][:4]
        d = mg.first_trace_divergence(a, b)
        self.assertEqual((d["step"], d["block"], d["step_in_block"], d["position"]), (4, 1, 1, -1))
        self.assertIn("number of decoder calls", d["what"])
        b = self._trace()
        b["new"] = [3, 3, 3, 3, 4, 3]
        d = mg.first_trace_divergence(a, b)
        self.assertEqual((d["step"], d["position"], d["what"]), (None, 4, "generated ids"))
        b = self._trace()
        b["uniforms_used"] = 5
        self.assertIn("uniforms_used", mg.first_trace_divergence(a, b)["what"])
        self.assertIn("identical", mg.fmt_div(None))
        self.assertIn("block 1, step 0 of the block (decoder call 3), position 0: argmax",
                      mg.fmt_div({"step": 3, "block": 1, "step_in_block": 0, "position": 0, "what": "argmax"}))
        self.assertIn("generated ids", mg.fmt_div({"step": None, "block": None, "step_in_block": None,
                                                   "position": 4, "what": "generated ids"}))

    def test_select_candidate(self):
        def s(**kw):
            base = dict(evaluated=True, robust=False, robust_partial=False, hard_failures=0, strict_ok=False,
                        strict_score=None)
            base.update(kw)
            return base
        ok = s(robust=True, robust_partial=True, strict_ok=True, strict_score=3.0)
        weak = s(robust=True, robust_partial=True, strict_ok=False, strict_score=0.5)
        weaker = s(robust=True, robust_partial=True, strict_ok=False, strict_score=0.1)
        bad = s(strict_score=0.001)
        skipped = dict(evaluated=False)
        self.assertEqual(mg.select_candidate([bad, weak, ok], True), 2)
        self.assertEqual(mg.select_candidate([bad, weak, ok], False), 1)
        self.assertEqual(mg.select_candidate([bad, weaker, weak], True), 2)  # best strict score among robust
        self.assertEqual(mg.select_candidate([skipped, bad, s(strict_score=5.0)], True), 1)  # none robust: first
        self.assertEqual(mg.select_candidate([skipped], True), None)
        hard = s(robust=True, strict_ok=True, strict_score=9.0, hard_failures=1)
        self.assertEqual(mg.select_candidate([hard, weaker], True), 1)  # robust without hard failures first
        self.assertEqual(mg.select_candidate([hard, bad], True), 0)
        partial = s(robust_partial=True, strict_score=2.0)
        self.assertEqual(mg.select_candidate([bad, partial], True), 1)
        self.assertTrue(mg.candidate_accepted(ok, True))
        self.assertFalse(mg.candidate_accepted(weak, True))
        self.assertTrue(mg.candidate_accepted(weak, False))
        self.assertFalse(mg.candidate_accepted(skipped, False))

    def test_strict_thresholds(self):
        self.assertEqual(set(mg.STRICT_SAFETY), {"fp64", "embed_perturbed"})
        self.assertLessEqual(mg.ROBUST_EMBED_REL, 1e-5)

    def test_fmt_table(self):
        t = mg.fmt_table([["a", 1], ["bbb", 22]], ["x", "y"])
        self.assertEqual(len(t.splitlines()), 4)


if __name__ == "__main__":
    unittest.main()
