"""Torch-free training schedules of the small model (tested in CI with plain python3).

* lr_at: the learning rate at a global step: linear warm-up, then cosine decay to min_lr_ratio *
  lr over schedule_steps steps (a step-based schedule spans several time-boxed runs: a resumed
  run continues it, with no new warm-up), or over the run's time budget (one run only).
* MixSchedule: the share of each data source by global step (the curriculum): keypoints
  "STEP=src:p,src:p;STEP=src:p,...", shares interpolated linearly between keypoints, constant
  after the last one; a plain --mix "src:p,..." is the one-keypoint schedule.
* batch_counts: rows per source for a batch of B rows (largest remainder).
"""

import math


def lr_at(step, lr, warmup, min_lr_ratio, schedule_steps=0, elapsed=0.0, budget_s=0.0, max_steps=0):
    """Learning rate for the step about to be taken (step counts completed steps, from 0).

    warm-up: lr * min(1, (step + 1) / warmup); decay: min_lr_ratio + (1 - min_lr_ratio) * (1 + cos(pi f)) / 2
    with f = step / schedule_steps when schedule_steps > 0 (deterministic, spans runs), otherwise
    f = max(elapsed / budget_s, step / max_steps) over the limits that are set (one run, as before);
    f is clipped to [0, 1]."""
    if schedule_steps > 0:
        frac = step / schedule_steps
    else:
        fr = []
        if budget_s > 0:
            fr.append(elapsed / budget_s)
        if max_steps > 0:
            fr.append(step / max_steps)
        frac = max(fr) if fr else 0.0
    frac = min(1.0, max(0.0, frac))
    warm = min(1.0, (step + 1) / max(1, warmup))
    return lr * warm * (min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def parse_mix(text):
    """'problems:0.65,gsm8k:0.1' -> [(name, share)] in the given order. Raises ValueError on bad input."""
    out = []
    for part in [x.strip() for x in text.split(",") if x.strip()]:
        name, sep, val = part.partition(":")
        if not sep or not name.strip():
            raise ValueError("mix entry %r is not NAME:SHARE" % part)
        p = float(val)
        if p < 0 or not math.isfinite(p):
            raise ValueError("mix share %r must be a finite number >= 0" % part)
        out.append((name.strip(), p))
    if not out or sum(p for _, p in out) <= 0:
        raise ValueError("mix %r has no positive share" % text)
    if len(set(n for n, _ in out)) != len(out):
        raise ValueError("mix %r names a source twice" % text)
    return out


class MixSchedule:
    """Data-source shares by global step. spec: 'src:p,...' (constant) or
    'STEP=src:p,...;STEP=src:p,...' with increasing steps, the first one 0. Shares of each keypoint
    are normalised to sum 1; a source absent from a keypoint has share 0 there."""

    def __init__(self, spec):
        self.spec = spec.strip()
        points = []
        for chunk in [c.strip() for c in self.spec.split(";") if c.strip()]:
            if "=" in chunk:
                st, _, mix = chunk.partition("=")
                step = int(st)
            else:
                step, mix = 0, chunk
            points.append((step, parse_mix(mix)))
        if not points:
            raise ValueError("empty mix schedule")
        steps = [s for s, _ in points]
        if steps[0] != 0 or any(b <= a for a, b in zip(steps, steps[1:])):
            raise ValueError("mix schedule steps must start at 0 and increase: %s" % steps)
        names = []
        for _, mix in points:
            names += [n for n, _ in mix if n not in names]
        self.names = names
        self.points = []
        for s, mix in points:
            tot = sum(p for _, p in mix)
            d = dict(mix)
            self.points.append((s, [d.get(n, 0.0) / tot for n in names]))

    def shares(self, step):
        """[(name, share)] at a global step (shares sum to 1)."""
        pts = self.points
        if step <= pts[0][0]:
            w = pts[0][1]
        elif step >= pts[-1][0]:
            w = pts[-1][1]
        else:
            i = max(k for k in range(len(pts)) if pts[k][0] <= step)
            (s0, w0), (s1, w1) = pts[i], pts[i + 1]
            t = (step - s0) / (s1 - s0)
            w = [a + (b - a) * t for a, b in zip(w0, w1)]
        return list(zip(self.names, w))


def batch_counts(shares, B):
    """Rows per source for a batch of B rows: floor(p * B) each, the remaining rows to the largest
    remainders (ties: listing order). Returns [(name, count)] with counts summing to B."""
    raw = [(n, p * B) for n, p in shares]
    counts = [int(math.floor(x)) for _, x in raw]
    left = B - sum(counts)
    order = sorted(range(len(raw)), key=lambda i: (-(raw[i][1] - counts[i]), i))
    for i in order[:left]:
        counts[i] += 1
    return [(n, c) for (n, _), c in zip(raw, counts)]
