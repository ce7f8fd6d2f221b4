#!/usr/bin/env python3
"""scaling.py (run in this folder): the side-by-side's GFLOP/s medians per column at -t 1 (sbs_t1, 3 runs) and -t 2
(sbs_t2, 5 runs) from the tables main_rN.md, and their ratio (2.00 = perfect on 2 cores); generic columns left out."""
import glob, statistics as st
def load(d):
    res = {}
    for fn in sorted(glob.glob(f"{d}/main_r*.md")):
        hdr = None
        for line in open(fn):
            if line.startswith("| shape"):
                hdr = [c.strip() for c in line.strip().strip("|").split("|")]
            elif hdr and (line.startswith("| gate_up") or line.startswith("| down")):
                c = [x.strip() for x in line.strip().strip("|").split("|")]
                for h, v in zip(hdr, c):
                    if h.endswith("GFLOP/s") and v != "-":
                        res.setdefault((c[0].split()[0], int(c[1]), h[:-8]), []).append(float(v))
    return {k: st.median(v) for k, v in res.items()}
t1, t2 = load("sbs_t1"), load("sbs_t2")
for k in sorted(t2):
    if "generic" in k[2] or k not in t1: continue
    print(f"{k[0]:8s} M={k[1]:4d} {k[2]:28s} t1 {t1[k]:7.1f} t2 {t2[k]:7.1f} GFLOP/s  x{t2[k]/t1[k]:.2f}")
