#!/usr/bin/env bash
# plots.sh IN_DIR OUT_DIR: PNG plots of benchmark results with gnuplot (a docs
# tool: the build and the tests never need it; Debian package `gnuplot`).
#
# Reads every *.jsonl file in IN_DIR and plots what it finds:
#   rows {"protocol": "ceiling", ...}  (dgemma bench --protocol ceiling [--device cuda] -o, and the PyTorch
#                                       anchors of scripts/torch_anchors.py -o: "impl" keeps them apart)
#     -> ceiling_gbs.png       GB/s of weights read vs M, against the roofline, one panel per shape
#     -> ceiling_fraction.png  fraction of the roofline reached vs M
#   rows {"protocol": "batch", ...}    (dgemma bench --protocol batch -o)
#     -> batch_toks.png        aggregate and per-canvas tok/s vs B, with the floor's tok/s (and that of
#                              its bytes term alone, where the rows have floor_bytes_s)
#   rows {"config": NAME, "tok_s": X, "accuracy": A, "acc_lo": L, "acc_hi": H}
#     -> turbo_accuracy.png    accuracy (with its interval) vs tok/s per turbo configuration
# Series are kept apart by device, impl + kernel and format (ceiling) or device, model
# and --gen-kwargs (batch), so CPU and GPU rows can share a file or directory.
# A malformed line is an error naming the file and line. Plots without data are skipped.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: scripts/plots.sh IN_DIR OUT_DIR" >&2
  exit 2
fi
IN=$1
OUT=$2
command -v gnuplot >/dev/null 2>&1 || { echo "plots.sh: gnuplot not found (Debian: apt-get install gnuplot)" >&2; exit 1; }
command -v python3 >/dev/null 2>&1 || { echo "plots.sh: python3 not found" >&2; exit 1; }
[ -d "$IN" ] || { echo "plots.sh: $IN is not a directory" >&2; exit 1; }
mkdir -p "$OUT"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

python3 - "$IN" "$OUT" "$WORK" <<'PY'
import glob, json, math, os, subprocess, sys

in_dir, out_dir, work = sys.argv[1:4]
ceil, batch, turbo = [], [], []
files = sorted(glob.glob(os.path.join(in_dir, "*.jsonl")))
if not files:
    sys.exit(f"plots.sh: no *.jsonl files in {in_dir}")
for path in files:
    with open(path, encoding="utf-8") as f:
        for ln, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                r = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"plots.sh: {path} line {ln}: not JSON ({e.msg})")
            if not isinstance(r, dict):
                sys.exit(f"plots.sh: {path} line {ln}: not a JSON object")
            p = r.get("protocol")
            try:
                if p == "ceiling":
                    # impl: "dgemma" (absent in older rows) or a PyTorch anchor (scripts/torch_anchors.py)
                    ceil.append((r["device"], r.get("impl", "dgemma") + " " + r["kernel"], r["shape"], r["format"],
                                 float(r["M"]), float(r["gb_s"]), float(r["roofline_gb_s"]), float(r["fraction"])))
                elif p == "batch":
                    batch.append((r["device"], r.get("model", ""), r.get("gen_kwargs", ""), int(r["B"]),
                                  float(r["tok_per_s"]), float(r["per_canvas_tok_per_s"]), float(r["floor_tok_per_s"]),
                                  float(r["min_s"]), float(r["max_s"]), float(r["median_s"]),
                                  float(r["generated_tokens"]) / float(r["floor_bytes_s"])
                                  if float(r.get("floor_bytes_s", 0)) > 0 else 0.0))
                elif "config" in r and "accuracy" in r:
                    turbo.append((str(r["config"]), float(r["tok_s"]), float(r["accuracy"]),
                                  float(r.get("acc_lo", r["accuracy"])), float(r.get("acc_hi", r["accuracy"]))))
            except (KeyError, TypeError, ValueError) as e:
                sys.exit(f"plots.sh: {path} line {ln}: missing or bad field {e}")

def q(s):  # a gnuplot string literal
    return '"' + str(s).replace("\\", "\\\\").replace('"', '\\"') + '"'

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
made = []

def gnuplot(name, script):
    gp = os.path.join(work, name + ".gp")
    with open(gp, "w") as f:
        f.write(script)
    subprocess.run(["gnuplot", gp], check=True)
    made.append(os.path.join(out_dir, name + ".png"))

if ceil:
    shapes = [s for s in ("expert_gate_up", "expert_down", "experts_all", "moe_gathered") if any(c[2] == s for c in ceil)]
    series = []  # (device, kernel, format) in first-seen order
    for c in ceil:
        k = (c[0], c[1], c[3])
        if k not in series:
            series.append(k)
    titles = {"expert_gate_up": "expert gate/up [1408 x 2816]", "expert_down": "expert down [2816 x 704]",
              "experts_all": "128 experts, gate/up + down, M rows each",
              "moe_gathered": "gathered MoE (128 experts, top-8)"}
    for what, col in (("gbs", 5), ("fraction", 7)):
        panels = []
        for s in shapes:
            plots = []
            for i, k in enumerate(series):
                rows = sorted((c for c in ceil if c[2] == s and (c[0], c[1], c[3]) == k), key=lambda c: c[4])
                if not rows:
                    continue
                fn = os.path.join(work, f"ceil_{s}_{i}.dat")
                with open(fn, "w") as f:
                    for c in rows:
                        f.write(f"{c[4]} {c[5]} {c[6]} {c[7]}\n")
                lbl = f"{k[2]} ({k[0]} {k[1]})" if len(set((x[0], x[1]) for x in series)) > 1 else k[2]
                color = COLORS[i % len(COLORS)]
                if what == "gbs":
                    plots.append(f"{q(fn)} using 1:2 with linespoints lw 2 pt 7 lc rgb {q(color)} title {q(lbl)}")
                    plots.append(f"{q(fn)} using 1:3 with linespoints dt 2 lw 1.5 pt 6 ps 0.7 lc rgb {q(color)} notitle")
                else:
                    plots.append(f"{q(fn)} using 1:(100*$4) with linespoints lw 2 pt 7 lc rgb {q(color)} title {q(lbl)}")
            if plots:
                panels.append((s, plots))
        n = len(panels)
        ylabel = "GB/s of weights read (dashed, open: roofline)" if what == "gbs" else "% of the roofline reached"
        ms = [c[4] for c in ceil]
        key = "top right" if what == "gbs" else "bottom right"
        sc = [f"set terminal pngcairo size {560 * n},480 font 'Sans,10' noenhanced",
              f"set output {q(os.path.join(out_dir, 'ceiling_' + what + '.png'))}",
              f"set multiplot layout 1,{n}", "set logscale x 2", "set grid", f"set key {key} font 'Sans,9'",
              f"set xrange [{min(ms) / 1.25}:{max(ms) * 1.25}]",
              "set xlabel 'M (activation rows per weight)'", f"set ylabel {q(ylabel)}"]
        sc.append("set logscale y" if what == "gbs" else "set yrange [0:*]")
        for s, plots in panels:
            sc.append(f"set title {q(titles.get(s, s))}")
            sc.append("plot " + ", \\\n     ".join(plots))
        sc.append("unset multiplot")
        gnuplot("ceiling_" + what, "\n".join(sc) + "\n")

if batch:
    groups = []
    for b in batch:
        k = b[:3]
        if k not in groups:
            groups.append(k)
    plots = []
    for i, k in enumerate(groups):
        rows = sorted((b for b in batch if b[:3] == k), key=lambda b: b[3])
        fn = os.path.join(work, f"batch_{i}.dat")
        with open(fn, "w") as f:
            for b in rows:
                # aggregate tok/s at min and max wall time give the spread
                lo, hi = b[4] * b[9] / b[8], b[4] * b[9] / b[7]
                f.write(f"{b[3]} {b[4]} {b[5]} {b[6]} {lo} {hi} {b[10]}\n")
        name = os.path.basename(k[1].rstrip("/")) or "model"
        tag = f"{k[0]}, {name}" + (f", {k[2]}" if k[2] else "")
        color = COLORS[i % len(COLORS)]
        plots.append(f"{q(fn)} using 1:2:5:6 with yerrorlines lw 2 pt 7 lc rgb {q(color)} title {q('aggregate (' + tag + ')')}")
        plots.append(f"{q(fn)} using 1:3 with linespoints lw 1.5 pt 6 dt 3 lc rgb {q(color)} title {q('per canvas')}")
        plots.append(f"{q(fn)} using 1:4 with linespoints lw 1.5 pt 4 dt 2 lc rgb {q(color)} title {q('floor (aggregate)')}")
        if all(b[10] > 0 for b in rows):  # the bytes term alone: weights read once per batched pass
            plots.append(f"{q(fn)} using 1:7 with linespoints lw 1 pt 2 dt 4 lc rgb {q(color)} "
                         f"title {q('bytes term of the floor alone')}")
    sc = ["set terminal pngcairo size 720,480 font 'Sans,10' noenhanced",
          f"set output {q(os.path.join(out_dir, 'batch_toks.png'))}",
          "set logscale x 2", "set logscale y", "set grid", "set key outside bottom center horizontal font 'Sans,9'",
          "set xlabel 'B (canvases generated together)'", "set ylabel 'tokens/s'",
          "set title 'Multi-canvas batching (dg\\_generate\\_batch, turbo engine)'",
          "plot " + ", \\\n     ".join(plots)]
    gnuplot("batch_toks", "\n".join(sc) + "\n")

if turbo:
    fn = os.path.join(work, "turbo.dat")
    with open(fn, "w") as f:
        for t in turbo:
            f.write(f"{t[1]} {100 * t[2]} {100 * t[3]} {100 * t[4]} {q(t[0])}\n")
    sc = ["set terminal pngcairo size 720,480 font 'Sans,10' noenhanced",
          f"set output {q(os.path.join(out_dir, 'turbo_accuracy.png'))}",
          "set grid", "set key off", "set xlabel 'tokens/s'", "set ylabel 'accuracy, % (95% interval)'",
          "set title 'Accuracy vs speed of the turbo configurations'", "set xrange [0:*]", "set offsets 0, graph 0.4, graph 0.1, graph 0.1",
          f"plot {q(fn)} using 1:2:3:4 with yerrorbars pt 7 ps 1.2 lw 1.5 lc rgb '#1f77b4', \\\n"
          f"     {q(fn)} using 1:2:5 with labels left offset 1,0.5 font 'Sans,9'"]
    gnuplot("turbo_accuracy", "\n".join(sc) + "\n")

for m in made:
    print(m)
if not made:
    sys.exit(f"plots.sh: nothing to plot in {in_dir} (no ceiling, batch or turbo-table rows)")
PY
