#!/usr/bin/env python3
"""s27_sbs17_summary.py OUT NAME...: the side-by-side tables NAME_rN.md of dev/s27_sbs17.sh, per row (shape, M):
each variant's avx512lp GB/s (median [min-max] over the runs), its ratio to the fastest ggml path of the same run
(gate/up: fastest q4_K, the table's 'avx512lp / fastest q4_K'; down: the fastest 4.5-bit ggml path, q4_0), and the
per-round ratio of each later variant's GFLOP/s to the first's; then the gathered MoE and the copy ceilings. Gate/up
rows also print the ratio to the fastest 4.5-bit path (q4_K or q4_0: ggml's AMX q4_0 on the session-30 Intel VM)."""
import os, re, statistics as st, sys
out, names = sys.argv[1], sys.argv[2:]
runs = sorted({int(m.group(1)) for f in os.listdir(out) for m in [re.match(rf"{names[0]}_r(\d+)\.md$", f)] if m})
runs = [r for r in runs if all(os.path.exists(f"{out}/{n}_r{r}.md") for n in names)]
def parse(fn):
    rows, moe = {}, None
    for line in open(fn):
        if line.startswith("ratio "):  # the last kernel set against each ggml column (session 31)
            f = line.split()
            percol[(fn, "gate_up" if f[1] == "gate_up" else "down", int(f[2]))] = {k: float(v) for k, v in (x.split("=") for x in f[3:])}
        m = re.match(r"moe_gathered .* ([\d.]+) ms per call", line)
        if m: moe = float(m.group(1))
        if not (line.startswith("| gate_up") or line.startswith("| down")): continue
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        rat = c[-2] if c[0].startswith("gate_up") else c[-1]
        r45 = c[-1]  # vs the fastest 4.5-bit ggml path (q4_K or q4_0), both shapes
        rows[("gate_up" if c[0].startswith("gate_up") else "down", int(c[1]))] = (
            float(c[2]), float(c[3]), float(rat.split("x")[0]) if rat != "-" else None,
            float(r45.split("x")[0]) if r45 != "-" else None)
    return rows, moe
percol = {}
data = {n: [parse(f"{out}/{n}_r{r}.md") for r in runs] for n in names}
fmt = lambda v: f"{st.median(v):.2f} [{min(v):.2f}-{max(v):.2f}]"
print(f"runs {runs}; ratio = ggml's time / dgemma's (gate/up: fastest q4_K; down: fastest 4.5-bit, q4_0)")
for key in sorted(data[names[0]][0][0], key=lambda k: (k[0] != "gate_up", k[1])):
    print(f"{key[0]} M = {key[1]}")
    for n in names:
        g = [x[0][key][0] for x in data[n]]
        gf = [x[0][key][1] for x in data[n]]
        rr = [x[0][key][2] for x in data[n] if x[0][key][2] is not None]
        print(f"  {n:8s} GB/s {fmt(g)}  GFLOP/s {st.median(gf):.1f}  vs ggml {fmt(rr) if rr else '-'}x  each {rr}")
        if key[0] == "gate_up":  # session 30: the gate/up rows against q4_0 too (AMX q4_0 is ggml's fastest there)
            r4 = [x[0][key][3] for x in data[n] if x[0][key][3] is not None]
            if r4: print(f"  {'':8s} vs fastest 4.5-bit ggml {fmt(r4)}x  each {r4}")
        cols = sorted({c for r in runs for c in percol.get((f"{out}/{n}_r{r}.md",) + key, {})})
        for c in cols:  # against each ggml build and type of the run (session 31: q4_K@clang = AMX, q4_K@noamx = CPU_REPACK)
            v = [percol[(f"{out}/{n}_r{r}.md",) + key][c] for r in runs if c in percol.get((f"{out}/{n}_r{r}.md",) + key, {})]
            print(f"  {'':8s} vs {c:18s} {fmt(v)}x  each {v}")
    for n in names[1:]:
        r = [b[0][key][1] / a[0][key][1] for a, b in zip(data[names[0]], data[n])]
        print(f"  {n}/{names[0]} per round {[round(x, 2) for x in r]} median {st.median(r):.2f}")
print("gathered MoE, 256 tokens, ms per call:")
for n in names:
    v = [x[1] for x in data[n] if x[1] is not None]
    if v: print(f"  {n:8s} {fmt(v)}  each {v}")
print("copy ceilings of dgemma's processes (GB/s, before / after the sweep, per policy run):")
for n in names:
    s = []
    for r in runs:
        for fn in sorted(os.listdir(f"{out}/raw_{n}_r{r}")):
            if fn.startswith("dgemma_") and fn.endswith(".txt"):
                m = re.search(r"copy ([\d.]+) / ([\d.]+) GB/s", open(f"{out}/raw_{n}_r{r}/{fn}").read())
                if m: s.append(f"r{r} {m.group(1)}/{m.group(2)}")
    print(f"  {n:8s} " + ", ".join(s))
