"""Generated arithmetic problems: held-out vs training disjointness, answer correctness, coverage.

Plain python3, no third-party modules:  python3 -m unittest discover -s tests/python -v
Generates both sets at the documented sizes (gen_problems.TRAIN_N, HELDOUT_PER_STEPS).
"""

import collections
import os
import re
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "smallmodel"))
import gen_problems as gp  # noqa: E402

COMMITTED_HELDOUT = os.path.join(ROOT, "tools", "smallmodel", "data", "problems_heldout.jsonl")


class Problems(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.train = gp.generate_train()
        cls.held, cls.dropped = gp.generate_heldout(cls.train)

    def test_documented_sizes(self):
        self.assertEqual(len(self.train), gp.TRAIN_N)
        self.assertGreaterEqual(gp.HELDOUT_PER_STEPS, 100)
        self.assertEqual(len(self.held), 8 * gp.HELDOUT_PER_STEPS)
        self.assertNotEqual(gp.TRAIN_SEED, gp.HELDOUT_SEED)

    def test_step_coverage(self):
        held = collections.Counter(p["steps"] for p in self.held)
        self.assertEqual(held, {s: gp.HELDOUT_PER_STEPS for s in range(1, 9)})
        train = collections.Counter(p["steps"] for p in self.train)
        self.assertEqual(set(train), set(range(1, 9)))
        for s in range(1, 9):  # uniform 1..8: each near 1/8
            self.assertGreater(train[s], len(self.train) / 8 * 0.9)

    def test_disjoint_exact_and_normalized(self):
        self.assertEqual(gp.check_disjoint(self.train, self.held), [])
        norm_train = set(gp.normalize_question(p["question"]) for p in self.train)
        self.assertTrue(all(gp.normalize_question(p["question"]) not in norm_train for p in self.held))
        # held-out questions are also unique among themselves
        self.assertEqual(len(set(gp.normalize_question(p["question"]) for p in self.held)), len(self.held))

    def test_validation_disjoint_from_train_and_heldout(self):
        val, _ = gp.generate_validation(self.train, self.held)
        self.assertEqual(collections.Counter(p["steps"] for p in val), {s: gp.VAL_PER_STEPS for s in range(1, 9)})
        self.assertEqual(gp.check_disjoint(self.train, val), [])
        self.assertEqual(gp.check_disjoint(self.held, val), [])
        self.assertNotIn(gp.VAL_SEED, (gp.TRAIN_SEED, gp.HELDOUT_SEED))
        for p in val:
            gp.verify_problem(p)

    def test_check_detects_collisions(self):
        q = self.train[7]["question"]
        exact = dict(self.held[0], question=q)
        fmt = re.sub(r"\d+", lambda m: "0" + m.group(), q).replace(". ", ".   ")  # 012, extra spaces
        variant = dict(self.held[1], question=fmt)
        bad = gp.check_disjoint(self.train, [exact, variant, self.held[2]])
        self.assertEqual(bad, [(0, "exact"), (1, "normalized")])
        self.assertEqual(gp.normalize_question("Mia has 1,000  apples."), gp.normalize_question("mia has 1000 apples."))
        self.assertNotEqual(gp.normalize_question("Mia has 12 apples."), gp.normalize_question("Mia has 13 apples."))

    def test_answers_recomputed(self):
        for p in self.held:
            gp.verify_problem(p)
        for p in self.train[::7]:
            gp.verify_problem(p)

    def test_operand_ranges_and_format(self):
        for p in self.held + self.train[:20000]:
            v = p["start"]
            self.assertTrue(gp.START_RANGE[0] <= v <= gp.START_RANGE[1])
            for op, b, r in p["ops"]:
                if op == "+":
                    self.assertTrue(1 <= b <= gp.ADD_MAX)
                elif op == "-":
                    self.assertTrue(1 <= b <= gp.SUB_MAX and r >= 1)
                elif op == "*":
                    self.assertTrue(gp.MUL_RANGE[0] <= b <= gp.MUL_RANGE[1] and v <= gp.MUL_VMAX)
                else:
                    self.assertTrue(gp.DIV_RANGE[0] <= b <= gp.DIV_RANGE[1] and v % b == 0)
                self.assertTrue(gp.VMIN <= r <= gp.VMAX)
                v = r
            self.assertTrue(p["answer"].endswith("#### %d" % p["final"]))
            self.assertEqual(p["question"].count("?"), 1)

    def test_deterministic(self):
        again, _ = gp.generate_heldout(self.train)
        self.assertEqual(again, self.held)
        self.assertEqual(gp.generate_train(50), self.train[:50])

    def test_has_carry(self):
        # column arithmetic on 3-digit numbers: units, tens and chained carries / borrows
        for v, op, b, want in ((13, "+", 2, False), (18, "+", 5, True), (95, "+", 10, True), (40, "+", 30, False),
                               (13, "-", 4, True), (20, "-", 1, True), (29, "-", 15, False), (105, "-", 10, True),
                               (100, "-", 1, True), (40, "*", 3, False), (40, "/", 4, False)):
            self.assertEqual(gp.has_carry(v, op, b), want, (v, op, b))

    def test_curriculum_pools(self):
        """Pools (shortened to 4,000 problems each for CI time): disjoint from the held-out and
        validation questions, within their step range, answers correct, carries over-represented."""
        val, _ = gp.generate_validation(self.train, self.held)
        base = gp.carry_share(self.train[:20000])
        for name, (_, _, lo, hi, carry) in gp.POOLS.items():
            items, dropped = gp.generate_pool(name, self.held + val, n=4000)
            self.assertEqual(len(items), 4000)
            self.assertEqual(gp.check_disjoint(items, self.held), [])
            self.assertEqual(gp.check_disjoint(items, val), [])
            self.assertEqual(set(p["steps"] for p in items), set(range(lo, hi + 1)))
            for p in items:
                gp.verify_problem(p)
            share = gp.carry_share(items)
            # natural share about 0.42; with carry_frac c the share is about c + (1 - c) * 0.42 minus the
            # values with no carrying operand (16 %): 0.71 for ops1 (c 0.7), 0.63 for short (c 0.5)
            self.assertGreater(share, base + 0.15, name)
            self.assertGreater(share, carry * 0.9, name)
            again, _ = gp.generate_pool(name, self.held + val, n=50)
            self.assertEqual(again, items[:50])

    def test_pool_excludes_collisions(self):
        # a pool asked to exclude its own first draws drops exactly those and keeps the rest in order
        first, _ = gp.generate_pool("ops1", [], n=30)
        items, dropped = gp.generate_pool("ops1", first[:10], n=30)
        self.assertEqual(dropped, 10)
        self.assertEqual(gp.check_disjoint(items, first[:10]), [])
        self.assertEqual(items[:20], first[10:30])

    @unittest.skipUnless(os.path.exists(COMMITTED_HELDOUT), "no committed held-out file")
    def test_committed_heldout_matches(self):
        self.assertEqual(gp.read_jsonl(COMMITTED_HELDOUT), self.held)


if __name__ == "__main__":
    unittest.main()
