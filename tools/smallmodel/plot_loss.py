#!/usr/bin/env python3
"""Plot train_log.csv (written by train.py) to a PNG (matplotlib, headless).

    python3 plot_loss.py WORK/train/train_log.csv WORK/loss.png
"""

import csv
import sys


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        sys.exit("usage: plot_loss.py train_log.csv out.png")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(argv[0]) as f:
        rows = list(csv.DictReader(f))
    if not rows:
        sys.exit("plot_loss: %s has no rows" % argv[0])
    step = [int(r["step"]) for r in rows]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for key, style in (("loss", "k-"), ("diffusion", "b-"), ("ar", "g-")):
        ax1.plot(step, [float(r[key]) for r in rows], style, label=key, lw=1)
    ax1.set_yscale("log")
    ax1.set_xlabel("step")
    ax1.set_ylabel("nats/token")
    ax1.set_title("training loss (diffusion + AR co-loss)")
    ax1.legend()
    ax1.grid(alpha=0.3)
    for key in [k for k in rows[0] if k.startswith("diffusion_")]:
        ax2.plot(step, [float(r[key]) for r in rows], label=key[len("diffusion_"):], lw=1)
    ax2.set_yscale("log")
    ax2.set_xlabel("step")
    ax2.set_title("diffusion loss per data source")
    ax2.legend()
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(argv[1], dpi=110)
    print("plot_loss: wrote %s (%d points, last step %d, final loss %.4f)" % (
        argv[1], len(rows), step[-1], float(rows[-1]["loss"])), flush=True)


if __name__ == "__main__":
    main()
