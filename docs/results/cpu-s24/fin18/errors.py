"""Error kinds of the wrong held-out answers, per step count.
python3 errors.py problems_heldout.jsonl items.jsonl[.gz]   (eval_hf's items.jsonl or dgemma's -o file)
The first solution line that differs from the reference decides the kind:
  result digit(s): operands and operator as in the reference, result wrong (counted by how many of the
                   three digits differ, and which: hundreds/tens/units)
  operand: the line's first operand (the previous result carried down) or second operand (from the
           question) or operator differs
  format: a line that does not read 'ddd o ddd = ddd', or fewer lines than steps
  final line: every solution line right, '#### N' wrong."""
import collections, gzip, json, re, sys
LINE = re.compile(r"^(\d{3}) ([-+*/]) (\d{3}) = (\d{3})$")
H = [json.loads(l) for l in open(sys.argv[1])]
op = gzip.open if sys.argv[2].endswith(".gz") else open
I = {}
for l in op(sys.argv[2], "rt"):
    d = json.loads(l); I[d["id"]] = d
kinds = collections.defaultdict(collections.Counter)
digits = collections.Counter(); pos = collections.Counter(); depth = collections.Counter(); ops = collections.Counter(); off = collections.Counter()
n = collections.Counter()
for i, h in enumerate(H):
    d = I[i]; n[h["steps"]] += 1
    if d["correct"]:
        continue
    ref = h["answer"].split("\n")
    gen = d["generated"].split("\n")
    kind = None
    for j, r in enumerate(ref[:-1]):
        g = gen[j] if j < len(gen) else ""
        if g == r:
            continue
        mg, mr = LINE.match(g), LINE.match(r)
        if not mg:
            kind = "format"
        elif mg.group(1) != mr.group(1):
            kind = "operand (carried result)"
        elif mg.group(2) != mr.group(2) or mg.group(3) != mr.group(3):
            kind = "operand (from question)"
        else:
            a, b = mg.group(4), mr.group(4)
            nd = sum(x != y for x, y in zip(a, b))
            kind = "result digit(s)"
            digits[nd] += 1
            for k in range(3):
                if a[k] != b[k]:
                    pos["hundreds tens units".split()[k]] += 1
            depth[j + 1] += 1
            ops[mr.group(2)] += 1
            e = abs(int(a) - int(b)); off["1-9" if e < 10 else "10-99" if e < 100 else ">=100"] += 1
        break
    if kind is None:
        kind = "final line"
    kinds[h["steps"]][kind] += 1
K = ["result digit(s)", "operand (carried result)", "operand (from question)", "format", "final line"]
print("| steps | wrong / n | " + " | ".join(K) + " |")
print("|---|---|" + "---|" * len(K))
tot = collections.Counter()
for s in sorted(n):
    w = sum(kinds[s].values())
    print("| %d | %d / %d | %s |" % (s, w, n[s], " | ".join(str(kinds[s][k]) for k in K)))
    tot.update(kinds[s])
print("| all | %d / %d | %s |" % (sum(tot.values()), sum(n.values()), " | ".join(str(tot[k]) for k in K)))
print()
print("result-digit errors: digits wrong %s; position %s; line of the first error %s; operator %s; off by %s" % (
    dict(sorted(digits.items())), dict(pos), dict(sorted(depth.items())), dict(ops), dict(off)))
