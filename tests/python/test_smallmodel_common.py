"""Torch-free parts of the small-model tools: ids and names, chat rendering, data helpers,
answer parsing, Wilson intervals, the bigram baseline, Shakespeare windows, tokenizer.json layout.

Plain python3, no third-party modules:  python3 -m unittest discover -s tests/python -v
"""

import json
import math
import os
import py_compile
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.path.join(ROOT, "tools", "smallmodel")
sys.path.insert(0, TOOLS)
import common as c  # noqa: E402
import train_tokenizer as tt  # noqa: E402  (imports `tokenizers` lazily)

SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")


def fake_encode(text):
    """Stand-in encoder: one id per character (>= 1000), "\\n" -> 107 as in the real tokenizer."""
    return [c.NEWLINE if ch == "\n" else 1000 + ord(ch) for ch in text]


class Ids(unittest.TestCase):
    def test_reserved(self):
        r = c.reserved_tokens()
        self.assertEqual([i for i, _, _ in r], list(range(108)))
        names = {i: n for i, n, _ in r}
        want = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>", 4: "<mask>", 46: "<|tool>", 47: "<tool|>",
                48: "<|tool_call>", 49: "<tool_call|>", 50: "<|tool_response>", 51: "<tool_response|>",
                52: '<|"|>', 98: "<|think|>", 100: "<|channel>", 101: "<channel|>", 105: "<|turn>",
                106: "<turn|>", 107: "\n", 6: "<unused0>", 99: "<unused93>"}
        for i, n in want.items():
            self.assertEqual(names[i], n)
        self.assertEqual(len(set(names.values())), 108)
        special = {i for i, _, s in r if s}
        self.assertEqual(special, {0, 1, 2, 3, 46, 47, 48, 49, 50, 51, 52, 98, 100, 101, 105, 106})
        self.assertEqual(c.STOP_IDS, (1, 106, 50))
        self.assertEqual(c.byte_token(0), "<0x00>")
        self.assertEqual(c.byte_token(255), "<0xFF>")


class Chat(unittest.TestCase):
    def test_prompt(self):
        p = c.prompt_ids(fake_encode, "Hi?")
        e = fake_encode
        self.assertEqual(p, [2, 105] + e("user") + [107] + e("Hi?") + [106, 107, 105] + e("model")
                         + [107, 100] + e("thought") + [107, 101])

    def test_chat(self):
        ids, rs = c.chat_ids(fake_encode, "Q", "a\nb")
        self.assertEqual(ids[:rs], c.prompt_ids(fake_encode, "Q"))
        self.assertEqual(ids[rs:], fake_encode("a") + [107] + fake_encode("b") + [106])
        self.assertEqual(ids[rs - 1], c.CHANNEL_END)

    def test_template_text(self):
        try:
            import jinja2
        except ImportError:
            self.skipTest("jinja2 not installed")
        t = jinja2.Environment().from_string(c.CHAT_TEMPLATE)
        s = t.render(bos_token="<bos>", add_generation_prompt=True, messages=[{"role": "user", "content": "Q"}])
        self.assertEqual(s, "<bos><|turn>user\nQ<turn|>\n<|turn>model\n<|channel>thought\n<channel|>")


class Data(unittest.TestCase):
    def test_clean_gsm8k(self):
        a = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nSo 48+24 = <<48+24=72>>72.\n#### 72"
        self.assertEqual(c.clean_gsm8k_answer(a), "Natalia sold 48/2 = 24 clips in May.\nSo 48+24 = 72.\n#### 72")

    def test_split_shakespeare(self):
        text = "".join("line %d\n" % i for i in range(100))
        tr, he = c.split_shakespeare(text)
        self.assertEqual(tr + he, text)
        self.assertTrue(he.startswith("line "))
        self.assertTrue(tr.endswith("\n"))
        self.assertGreaterEqual(len(tr), int(0.9 * len(text)))
        self.assertLess(len(tr) - int(0.9 * len(text)), 10)

    @unittest.skipUnless(os.path.exists(os.path.join(SHARED, "gsm8k", "train.jsonl")), "no shared data")
    def test_real_data(self):
        gsm, sh = c.find_data_files(SHARED)
        rows = c.read_jsonl(gsm)
        for r in rows:
            a = c.clean_gsm8k_answer(r["answer"])
            self.assertNotIn("<<", a)
            self.assertIsNotNone(c.parse_final_answer(a))
        with open(sh, encoding="utf-8") as f:
            tr, he = c.split_shakespeare(f.read())
        self.assertGreater(len(he), 100000)


class Eval(unittest.TestCase):
    def test_parse(self):
        self.assertEqual(c.parse_final_answer("3 + 4 = 7\n#### 7"), 7)
        self.assertEqual(c.parse_final_answer("#### 1,234"), 1234)
        self.assertEqual(c.parse_final_answer("x #### 5 then #### -3"), -3)
        self.assertEqual(c.parse_final_answer("it is 12 or 13"), 13)
        self.assertIsNone(c.parse_final_answer("no number"))
        self.assertEqual(c.parse_final_answer("####\n 8"), 8)

    def test_cut(self):
        self.assertEqual(c.cut_at_stop([5, 6, 0, 7, 106, 8, 1]), [5, 6, 7])
        self.assertEqual(c.cut_at_stop([5, 50, 6]), [5])
        self.assertEqual(c.cut_at_stop([5, 6]), [5, 6])

    def test_wilson(self):
        lo, hi = c.wilson(90, 100)
        self.assertAlmostEqual(lo, 0.8256, places=4)
        self.assertAlmostEqual(hi, 0.9448, places=4)
        lo, hi = c.wilson(0, 125)
        self.assertEqual(lo, 0.0)
        self.assertAlmostEqual(hi, 0.02979, places=4)
        self.assertEqual(c.wilson(0, 0), (0.0, 1.0))
        lo, hi = c.wilson(125, 125)
        self.assertAlmostEqual(hi, 1.0)

    def test_bigram(self):
        V = 7
        bg = c.Bigram([1, 2, 3, 1, 2, 4, 1, 2, 3], V)
        for prev in (1, 2, 5):
            self.assertAlmostEqual(sum(math.exp(-bg.nll(prev, t)) for t in range(V)), 1.0)
        self.assertAlmostEqual(bg.nll(1, 2), -math.log(4 / 10))
        self.assertAlmostEqual(bg.nll(6, 0), math.log(V))
        w = [{"context": [2, 1], "target": [2, 3]}]
        tot, n = c.bigram_window_nll(bg, w)
        self.assertEqual(n, 2)
        self.assertAlmostEqual(tot, bg.nll(1, 2) + bg.nll(2, 3))

    def test_windows(self):
        ids = list(range(10, 1010))
        w = c.shakespeare_windows(ids, 5, 8, 4, 77, 50)
        w2 = c.shakespeare_windows(ids, 5, 8, 4, 77, 50)
        self.assertEqual(w, w2)
        self.assertEqual(len(w), 5)
        for x in w:
            self.assertEqual(len(x["context"]), 8)
            self.assertEqual(x["context"][0], c.BOS)
            self.assertEqual(len(x["target"]), 4)
            self.assertEqual(x["target"][0], x["context"][-1] + 1)  # contiguous text
            self.assertEqual(len(x["noise"]), 4)
            self.assertTrue(all(0 <= t < 50 for t in x["noise"]))
        self.assertEqual(c.sequential_canvas([1, 2, 3], [7, 8, 9], 0), [7, 8, 9])
        self.assertEqual(c.sequential_canvas([1, 2, 3], [7, 8, 9], 2), [1, 2, 9])
        self.assertEqual(c.shakespeare_windows(ids[:5], 5, 8, 4, 0, 50), [])


class TokenizerLayout(unittest.TestCase):
    def test_build(self):
        learned = {"a": 0, "b": 1, "\u2581": 2, "1": 3, "ab": 4, "\u2581ab": 5}
        merges = [("a", "b"), ("\u2581", "ab")]
        j = tt.build_tokenizer_json(learned, merges)
        v = j["model"]["vocab"]
        self.assertEqual(v["<pad>"], 0)
        self.assertEqual(v["<|turn>"], 105)
        self.assertEqual(v["\n"], 107)
        self.assertEqual(v["<0x00>"], 108)
        self.assertEqual(v["<0xFF>"], 363)
        self.assertEqual(v["a"], 364)
        self.assertEqual(v["\u2581ab"], 369)
        self.assertEqual(sorted(v.values()), list(range(370)))
        self.assertEqual(j["normalizer"], {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})
        self.assertEqual(j["pre_tokenizer"], {"type": "Split", "pattern": {"String": " "},
                                              "behavior": "MergedWithPrevious", "invert": False})
        self.assertIsNone(j["post_processor"])
        m = j["model"]
        self.assertEqual((m["type"], m["byte_fallback"], m["fuse_unk"], m["unk_token"]), ("BPE", True, True, "<unk>"))
        self.assertEqual(m["merges"], [["a", "b"], ["\u2581", "ab"]])
        self.assertEqual([d["type"] for d in j["decoder"]["decoders"]], ["Replace", "ByteFallback", "Fuse"])
        added = {a["id"]: a for a in j["added_tokens"]}
        self.assertEqual(sorted(added), list(range(108)))
        self.assertTrue(added[105]["special"] and not added[107]["special"] and not added[4]["special"])
        json.dumps(j)
        with self.assertRaises(ValueError):
            tt.build_tokenizer_json(learned, [("a", "zz")])
        with self.assertRaises(ValueError):
            tt.build_tokenizer_json({"<eos>": 0}, [])


class Compiles(unittest.TestCase):
    def test_py_compile(self):
        with tempfile.TemporaryDirectory() as d:
            for fn in sorted(os.listdir(TOOLS)):
                if fn.endswith(".py"):
                    py_compile.compile(os.path.join(TOOLS, fn), cfile=os.path.join(d, fn + "c"), doraise=True)


if __name__ == "__main__":
    unittest.main()
