#!/usr/bin/env python3
"""ncu_step_sum.py CSV[.gz] [--last N]: fold Nsight Compute's CSV of scripts/step_ncu_gpu.sh (one row per launch
and metric) into (1) a table per kernel over every launch (prefill and decoder passes alike: names alone do not say
which pass a launch belongs to): count, total and median duration, DRAM GB/s, grid, block, registers; and (2) the
last N launches (default 80) in order, i.e. the last decoder passes of the 2-layer model kernel by kernel."""
import csv, gzip, io, statistics, sys
from collections import OrderedDict, defaultdict


def short(name):
    n = name.split("(")[0]
    for pre in ("void ", "static "):
        n = n.replace(pre, "")
    return n[:70]


def main():
    path = sys.argv[1]
    last = int(sys.argv[sys.argv.index("--last") + 1]) if "--last" in sys.argv else 80
    raw = gzip.open(path, "rt") if path.endswith(".gz") else open(path)
    lines = [l for l in raw if l.startswith('"')]
    launches = OrderedDict()
    for r in csv.DictReader(io.StringIO("".join(lines))):
        lid = int(r["ID"])
        d = launches.setdefault(lid, {"name": short(r["Kernel Name"]), "grid": r.get("Grid Size", ""),
                                      "block": r.get("Block Size", "")})
        v = r["Metric Value"].replace(",", "")
        try:
            v = float(v)
        except ValueError:
            continue
        unit = r["Metric Unit"]
        m = r["Metric Name"]
        if m == "gpu__time_duration.sum":
            d["us"] = v * {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}.get(unit, 1e-3)
        elif m.startswith("dram__bytes"):
            scale = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9}.get(unit, 1)
            d[m.split(".")[0]] = v * scale
        elif m == "launch__registers_per_thread":
            d["regs"] = int(v)
        elif m.startswith("sm__throughput"):
            d["sm"] = v
    per = defaultdict(list)
    for d in launches.values():
        if "us" in d:
            per[d["name"]].append(d)
    tot = sum(d["us"] for d in launches.values() if "us" in d)
    if tot <= 0:
        sys.exit(f"{path}: no gpu__time_duration rows ({len(launches)} launches): nothing to fold")
    print(f"{len(launches)} launches, {tot / 1000:.3f} ms of kernel time\n")
    print("| kernel | launches | total ms | % | median us | DRAM GB/s (median) | grid | block | regs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, ds in sorted(per.items(), key=lambda kv: -sum(x["us"] for x in kv[1])):
        t = sum(x["us"] for x in ds)
        bw = [(x.get("dram__bytes_read", 0) + x.get("dram__bytes_write", 0)) / (x["us"] * 1e3) for x in ds if x["us"] > 0]
        print(f"| {name} | {len(ds)} | {t / 1000:.3f} | {100 * t / tot:.1f} | {statistics.median(x['us'] for x in ds):.1f} |"
              f" {statistics.median(bw) if bw else 0:.0f} | {ds[-1]['grid']} | {ds[-1]['block']} | {ds[-1].get('regs', '')} |")
    print(f"\nthe last {last} launches in order:\n")
    print("| id | kernel | us | DRAM MB | GB/s | SM % | grid | block | regs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for lid, d in list(launches.items())[-last:]:
        if "us" not in d:
            continue
        b = d.get("dram__bytes_read", 0) + d.get("dram__bytes_write", 0)
        print(f"| {lid} | {d['name']} | {d['us']:.1f} | {b / 1e6:.2f} | {b / (d['us'] * 1e3):.0f} | {d.get('sm', 0):.0f} |"
              f" {d['grid']} | {d['block']} | {d.get('regs', '')} |")


if __name__ == "__main__":
    main()
