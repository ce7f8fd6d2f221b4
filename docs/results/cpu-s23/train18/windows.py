"""The Shakespeare windows of eval_hf.py rebuilt without torch or tokenizers (session 23, train18):
the held-out tail of tinyshakespeare (common.split_shakespeare, 0.9), tokenized by `dgemma tokenize`
(whole text at once: "\\n" is an added token, so this equals eval_hf.py's line-by-line encoding joined
by id 107; checked on the first 400 lines), 128 windows, context 128, canvas 64, noise seed 1000,
V 4096 (common.shakespeare_windows). The bundled model scores 5.2761 nats/token on them with dgemma,
as on eval_hf.py's own file of 2026-11-30 (Transformers 5.276).
    python3 windows.py INPUT.txt DGEMMA MODEL OUT.jsonl"""
import os, subprocess, sys
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..", "tools", "smallmodel"))
import common  # noqa: E402
inp, dg, model, out = sys.argv[1:5]
text = open(inp, encoding="utf-8").read()
_, held = common.split_shakespeare(text, 0.9)
tmp = out + ".held.txt"
open(tmp, "w", encoding="utf-8").write(held)
ids = [int(x) for x in subprocess.run([dg, "tokenize", "-m", model, "-f", tmp], capture_output=True, text=True,
                                      check=True).stdout.strip().split(",")]
os.remove(tmp)
common.write_jsonl(out, common.shakespeare_windows(ids, 128, 128, 64, 1000, 4096))
print(len(held), "characters,", len(ids), "tokens")
