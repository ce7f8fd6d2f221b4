"""Transformers vs dgemma on the 1,000 held-out problems: Wilson 95 % intervals per step count, for 1-2 and
3-4 steps and overall, and whether each implementation's accuracy lies inside the other's interval.
python3 crosscheck.py items.jsonl.gz (eval_hf) reference.jsonl (dgemma, turbo table's reference row)"""
import gzip, json, math, sys
def load(p):
    op = gzip.open if p.endswith(".gz") else open
    return {d["id"]: d for d in map(json.loads, op(p, "rt"))}
def wilson(k, n, z=1.959964):
    p = k / n; c = z * z / n
    mid = (p + c / 2) / (1 + c); h = z * math.sqrt(p * (1 - p) / n + c / (4 * n)) / (1 + c)
    return mid - h, mid + h
H, D = load(sys.argv[1]), load(sys.argv[2])
assert sorted(H) == sorted(D) == list(range(1000))
groups = [("%d" % s, {s}) for s in range(1, 9)] + [("1-2", {1, 2}), ("3-4", {3, 4}), ("all", set(range(1, 9)))]
print("| steps | Transformers (correct / n, Wilson 95 %) | dgemma | each inside the other's interval |")
print("|---|---|---|---|")
for name, ss in groups:
    ids = [i for i in H if H[i]["steps"] in ss]
    n = len(ids); kh = sum(H[i]["correct"] for i in ids); kd = sum(D[i]["correct"] for i in ids)
    lh, hh = wilson(kh, n); ld, hd = wilson(kd, n)
    ok = (ld <= kh / n <= hd) and (lh <= kd / n <= hh)
    print("| %s | %d / %d (%.1f %%, %.1f–%.1f) | %d / %d (%.1f %%, %.1f–%.1f) | %s |" % (
        name, kh, n, 100 * kh / n, 100 * lh, 100 * hh, kd, n, 100 * kd / n, 100 * ld, 100 * hd, "yes" if ok else "NO"))
both = sum(H[i]["correct"] and D[i]["correct"] for i in H); only_h = sum(H[i]["correct"] and not D[i]["correct"] for i in H)
only_d = sum(D[i]["correct"] and not H[i]["correct"] for i in H)
print("\nper problem: both right %d, only Transformers %d, only dgemma %d, both wrong %d" % (both, only_h, only_d, 1000 - both - only_h - only_d))
