#!/usr/bin/env python3
"""Plot train.py's run logs to a PNG (matplotlib, headless): the whole curve across runs.

    python3 plot_loss.py WORK/train/train_log.csv WORK/loss.png
    python3 plot_loss.py CKPT/train_log.csv OLD1.csv OLD2.csv ... OUT.png

Several logs are merged by runlog.merge_logs (logs with a 'run' column carry global steps; older
single-run logs are placed after the logs before them). Panels: total / diffusion / AR loss with
the learning rate, diffusion loss per data source, and the probe accuracy where logged; dotted
vertical lines mark where a new run (resumed training) starts.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import runlog  # noqa: E402


def _f(r, k):
    v = r.get(k, "")
    return float(v) if v not in ("", None) else None


def run_starts(rows):
    """Steps where the run (or the source log) changes."""
    out, prev = [], None
    for r in rows:
        key = (r.get("source"), r.get("run", ""))
        if prev is not None and key != prev:
            out.append(r["step"])
        prev = key
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) < 2:
        sys.exit("usage: plot_loss.py train_log.csv [more.csv ...] out.png")
    logs = [runlog.read_log(p) for p in argv[:-1]]
    rows = runlog.merge_logs(logs)
    if not rows:
        sys.exit("plot_loss: %s have no rows" % argv[:-1])
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    step = [r["step"] for r in rows]
    probe = [(r["step"], _f(r, "probe_acc"), _f(r, "probe_acc_12")) for r in rows if _f(r, "probe_acc") is not None]
    fig, axes = plt.subplots(1, 3 if probe else 2, figsize=(16 if probe else 11, 4))
    ax1, ax2 = axes[0], axes[1]
    for key, style in (("loss", "k-"), ("diffusion", "b-"), ("ar", "g-")):
        pts = [(s, _f(r, key)) for s, r in zip(step, rows) if _f(r, key) is not None]
        ax1.plot([p[0] for p in pts], [p[1] for p in pts], style, label=key, lw=1)
    ax1.set_yscale("log")
    ax1.set_xlabel("step")
    ax1.set_ylabel("nats/token")
    ax1.set_title("training loss (diffusion + AR co-loss)")
    lr = [(s, _f(r, "lr")) for s, r in zip(step, rows) if _f(r, "lr") is not None]
    if lr:
        axr = ax1.twinx()
        axr.plot([p[0] for p in lr], [p[1] for p in lr], color="orange", lw=0.8, label="lr")
        axr.set_ylabel("learning rate", color="orange")
    ax1.legend(loc="upper right")
    ax1.grid(alpha=0.3)
    keys = []
    for r in rows:
        keys += [k for k in r if k.startswith("diffusion_") and k not in keys]
    for key in keys:
        pts = [(s, _f(r, key)) for s, r in zip(step, rows) if _f(r, key)]
        ax2.plot([p[0] for p in pts], [p[1] for p in pts], label=key[len("diffusion_"):], lw=1)
    ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_title("diffusion loss per data source")
    ax2.legend()
    ax2.grid(alpha=0.3)
    if probe:
        ax3 = axes[2]
        ax3.plot([p[0] for p in probe], [p[1] for p in probe], "k.-", label="all steps")
        ax3.plot([p[0] for p in probe], [p[2] for p in probe], "r.-", label="1-2 steps")
        ax3.set_ylim(0, 1)
        ax3.set_xlabel("step")
        ax3.set_title("probe accuracy (validation problems, greedy)")
        ax3.legend()
        ax3.grid(alpha=0.3)
    for s in run_starts(rows):
        for ax in axes:
            ax.axvline(s, color="grey", ls=":", lw=0.8)
    fig.tight_layout()
    fig.savefig(argv[-1], dpi=110)
    print("plot_loss: wrote %s (%d points from %d logs, last step %d, final loss %s)" % (
        argv[-1], len(rows), len(logs), step[-1], rows[-1].get("loss")), flush=True)


if __name__ == "__main__":
    main()
