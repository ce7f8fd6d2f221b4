"""Per-line accuracy of dgemma's held-out answers by the line's depth in the dependency chain of its canvas.
python3 lines.py problems_heldout.jsonl items.jsonl. A solution line j (0-based, 14 tokens a line) has its
result digits in canvas 1 for j <= 3 and in canvas 2 for 4 <= j <= 7 (line 4 straddles the boundary: its
operands in canvas 1, its result in canvas 2). Depth = j + 1 in canvas 1, j - 3 in canvas 2. A line counts
when every earlier line of the problem is right (the conditional error of that line)."""
import collections, json, re, sys
H = [json.loads(l) for l in open(sys.argv[1])]
I = {}
for l in open(sys.argv[2]):
    d = json.loads(l); I[d["id"]] = d
tot = collections.Counter(); bad = collections.Counter()
for i, h in enumerate(H):
    ref = h["answer"].split("\n")[:-1]
    gen = I[i]["generated"].split("\n")
    for j, r in enumerate(ref):
        g = gen[j] if j < len(gen) else ""
        depth = (1, j + 1) if j <= 3 else (2, j - 3)
        key = (h["steps"] <= 4 and "1-4 steps" or "5-8 steps", depth)
        tot[key] += 1
        if g != r:
            bad[key] += 1
            break
for k in sorted(tot):
    print("%s canvas %d depth %d: %4d lines, %3d wrong (%.1f %%)" % (k[0], k[1][0], k[1][1], tot[k], bad[k], 100.0 * bad[k] / tot[k]))
