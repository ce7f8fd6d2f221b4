#!/usr/bin/env python3
"""ncu_sum.py CSV: Nsight Compute --csv rows of gpu__time_duration summed per kernel name (largest first),
then the launch sequence (id, us, kernel) of the first 700 launches."""
import csv, sys, collections
rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
h = rows[0]; ki = h.index("Kernel Name"); vi = h.index("Metric Value"); ii = h.index("ID")
t = collections.defaultdict(float); n = collections.Counter(); seq = []
for r in rows[1:]:
    try: v = float(r[vi].replace(",", ""))
    except ValueError: continue
    name = r[ki].split("(")[0]; t[name] += v; n[name] += 1; seq.append((int(r[ii]), name, v))
tot = sum(t.values())
print(f"{len(seq)} launches, {tot/1e6:.3f} ms GPU time")
for k, v in sorted(t.items(), key=lambda x: -x[1]):
    print(f"{v/1e6:9.3f} ms {100*v/tot:5.1f}% {n[k]:6d} x {v/n[k]/1e3:9.1f} us  {k[:110]}")
print("\n# launch sequence (id, kernel, us)")
for i, name, v in seq[:700]: print(f"{i} {v/1e3:.1f} {name[:90]}")
