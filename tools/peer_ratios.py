#!/usr/bin/env python3
"""peer_ratios.py: dgemma's bench rows beside Transformers' (tools/peer_transformers.py) from the same command, as
the ratios issue 12 asks for: the decoder step >= 12x Transformers, vLLM's protocol >= 15x.

  python3 tools/peer_ratios.py DGEMMA.jsonl PEER.jsonl [--json OUT.jsonl]

DGEMMA.jsonl: `dgemma bench -o` rows (other lines, such as the call scripts' {"kind": "run"} lines, are skipped);
the step row of the peer's prompt length (protocol "step", prompt_tokens) and the vllm row are used, the last of
each if there are several. PEER.jsonl: the peer's rows (protocols prefill, step, step_generate, vllm; a row with
"error" is shown as such). Lines, each "x faster" = the peer's time / dgemma's (tok/s: dgemma's / the peer's):

  step             dgemma's step median (interval between step callbacks: self-conditioning, decoder pass,
                   sampler) against the peer's `step` (decoder forward with self-conditioning, no sampler: the
                   ratio's lower side) and `step_generate` (forward + Transformers' sampler inside generate():
                   dgemma's definition) -> target 12x
  prefill          dgemma's step-row prefill median against the peer's prefill protocol (and its step row's)
  vllm             tok/s -> target 15x
  memory           device memory in use: dgemma's rows' device_used_bytes, the peer's peak allocated and total - free

A ratio is marked "not comparable" when the two rows come from different GPUs (their "gpu" fields), when the peer's
generation stopped early or its model has another weight count than the 26B-A4B's (more than 0.1 % off), and "peer
not grouped_mm" when the peer's experts implementation was another (design.md's peer is grouped_mm); such a line
has no verdict. Without torch.
"""

import argparse
import json
import sys

TARGETS = {"step": 12.0, "vllm": 15.0}
TEXT_PARAMS = 25250986752  # the 26B-A4B's text weights without layer scalars (peer_transformers.expected_text_params)
GIB = 1073741824.0


def read_rows(path):
    """The JSON objects of a JSON-lines file that have a "protocol" field, in order."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                r = json.loads(line)
            except ValueError as e:
                raise ValueError("%s:%d: not JSON (%s)" % (path, n, e)) from None
            if isinstance(r, dict) and "protocol" in r:
                out.append(r)
    return out


def last(rows, protocol, **match):
    """The last row of the protocol whose fields equal match (None if none)."""
    found = None
    for r in rows:
        if r.get("protocol") == protocol and all(r.get(k) == v for k, v in match.items()):
            found = r
    return found


def ratios(dg, peer):
    """The comparison lines: dicts with line, dgemma, peer, unit, ratio (or None), target (or None), met (or
    None), note."""
    out = []
    P = next((r.get("prompt_tokens") for r in peer if "prompt_tokens" in r), 1024)
    dstep = last(dg, "step", prompt_tokens=P)
    dvllm = last(dg, "vllm")

    def note_for(d, p):
        notes = []
        if p is None:
            notes.append("no peer row")
        elif "error" in p:
            notes.append("peer: " + str(p["error"])[:200])
        if d is None:
            notes.append("no dgemma row")
        if d is not None and p is not None and "error" not in p and d.get("gpu") and p.get("gpu") \
                and d["gpu"] != p["gpu"]:
            notes.append("not comparable: dgemma on %s, the peer on %s" % (d["gpu"], p["gpu"]))
        if p is not None and "error" not in p and p.get("experts_implementation") not in (None, "grouped_mm"):
            notes.append("peer not grouped_mm (%s)" % p.get("experts_implementation"))
        if p is not None and p.get("stopped_early"):
            notes.append("not comparable: the peer stopped early (%s tokens)" % p.get("generated_tokens"))
        if p is not None and "text_params" in p and abs(p["text_params"] - TEXT_PARAMS) > 1e-3 * TEXT_PARAMS:
            notes.append("not comparable: the peer has %s text weights, not the 26B-A4B's %s" % (
                format(p["text_params"], ","), format(TEXT_PARAMS, ",")))
        return notes

    def add(line, d, dkey, p, pkey, unit, target, higher_better=False):
        notes = note_for(d, p)
        dv = d.get(dkey) if d is not None else None
        pv = p.get(pkey) if p is not None and "error" not in p else None
        ratio = None
        if dv and pv:
            ratio = dv / pv if higher_better else pv / dv
        comparable = ratio is not None and not any(n.startswith(("not comparable", "peer not")) for n in notes)
        out.append({"line": line, "dgemma": dv, "peer": pv, "unit": unit, "ratio": ratio, "target": target,
                    "met": (ratio >= target) if (target and comparable) else None, "note": "; ".join(notes)})

    pstep, pgen, ppre, pvllm = (last(peer, p) for p in ("step", "step_generate", "prefill", "vllm"))
    add("step after %d: dgemma vs Transformers' forward (no sampler)" % P, dstep, "step_median_s", pstep,
        "step_median_s", "s", TARGETS["step"])
    add("step after %d: dgemma vs Transformers' generate step (forward + sampler)" % P, dstep, "step_median_s", pgen,
        "step_median_s", "s", TARGETS["step"])
    add("prefill of %d: dgemma vs Transformers' encoder" % P, dstep, "prefill_median_s", ppre, "prefill_median_s",
        "s", None)
    add("prefill of %d: dgemma vs Transformers' step-protocol prefill" % P, dstep, "prefill_median_s", pstep,
        "prefill_median_s", "s", None)
    add("vllm protocol (1024 in, 1024 out, 16 steps)", dvllm, "tok_per_s", pvllm, "tok_per_s", "tok/s",
        TARGETS["vllm"], higher_better=True)
    for name, p in (("prefill", ppre), ("step", pstep), ("step_generate", pgen), ("vllm", pvllm)):
        if p is None or "device_peak_allocated_bytes" not in p:
            continue
        d = dvllm if name == "vllm" else dstep
        line = "device memory, %s: dgemma in use vs Transformers' peak allocated (and total - free)" % name
        out.append({"line": line,
                    "dgemma": d.get("device_used_bytes") if d else None, "peer": p["device_peak_allocated_bytes"],
                    "peer_used": p.get("device_used_bytes"), "unit": "bytes", "ratio": None, "target": None,
                    "met": None, "note": "; ".join(note_for(d, p))})
    return out


def fmt(v, unit):
    if v is None:
        return "-"
    if unit == "s":
        return "%.3f ms" % (v * 1e3)
    if unit == "bytes":
        return "%.2f GiB" % (v / GIB)
    return "%.1f %s" % (v, unit)


def table(lines):
    out = ["| line | dgemma | Transformers | x faster | target | met | note |", "|---|---|---|---|---|---|---|"]
    for r in lines:
        peer = fmt(r["peer"], r["unit"])
        if r.get("peer_used") is not None:
            peer += " (%s)" % fmt(r["peer_used"], r["unit"])
        out.append("| %s | %s | %s | %s | %s | %s | %s |" % (
            r["line"], fmt(r["dgemma"], r["unit"]), peer, "-" if r["ratio"] is None else "%.2fx" % r["ratio"],
            "-" if r["target"] is None else ">= %gx" % r["target"],
            "-" if r["met"] is None else ("yes" if r["met"] else "no"), r["note"].replace("|", "/") or "-"))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dgemma", help="dgemma bench's JSON lines")
    ap.add_argument("peer", help="peer_transformers.py's JSON lines")
    ap.add_argument("--json", help="the lines as JSON lines")
    a = ap.parse_args(argv)
    try:
        dg, peer = read_rows(a.dgemma), read_rows(a.peer)
    except (OSError, ValueError) as e:
        print("peer_ratios.py: %s" % e, file=sys.stderr)
        return 1
    lines = ratios(dg, peer)
    print("\n".join(table(lines)))
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            for r in lines:
                f.write(json.dumps(r, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
