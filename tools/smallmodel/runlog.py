"""Torch-free run bookkeeping of the small model's training (tested in CI with plain python3):
the FLOP count of one training step, MFU, and the run log CSV that accumulates across runs.

FLOP count (model FLOPs: matrix products and attention only; norms, rope, softmax, activations
and the optimizer are left out; one multiply-add = 2 FLOPs). Per token of a decoder-stack pass
over the text model (dims from the text config):
  per layer: attention projections H * (nh*d + 2*nkv*d + nh*d) on sliding layers; full layers have
             no v_proj (K = V): H * (nh*d + nkv*d + nh*d);
             dense MLP 3 * H * I; router H * E; MoE top_k * 3 * H * Im ("active") or
             E * 3 * H * Im ("dense": what our own forward executes);
  attention per layer: 2 * nh * d * keys (Q K^T and P V), keys = (L + 1) / 2 on average for the
             causal encoder over L tokens ("causal") or L for a full count ("full", what a kernel
             without causal skipping and torch's FLOP counter count), L + C for a canvas query
             (every context key is computed, masked or not);
  lm_head (tied embedding) H * V per scored position;
  self-conditioning input (main decoder pass, when used): V * H (softmax(logits) @ E) + 3 * H * I (its MLP).
A training step: encoder over B x L tokens with gradients (+ the AR head on B x (L - 1)), a no-grad
decoder pass over the n_sc self-conditioned rows (B_sc x C), the main decoder pass over B x C with
gradients. FLOPs = 2 * MACs for a forward; a pass with gradients costs 3x its forward (backward
= 2x forward: gradients of inputs and of weights), except softmax(logits) @ E of the
self-conditioning input, whose input carries no gradient: 2x (forward and the gradient of E).
"""

import csv
import os

# Peak dense bf16 tensor throughput (TFLOP/s) by device-name substring: NVIDIA's spec sheets for
# H100/H200 SXM (989.4 dense, without sparsity). docs/measurements.md measured 787-816 TFLOP/s on
# this workplace's H200 for large bf16 GEMMs: pass --peak-tflops 800 to compare with that instead.
PEAK_TFLOPS = (("H200", 989.4), ("H100", 989.4), ("A100", 312.0))


def detect_peak_tflops(device_name):
    """Peak bf16 TFLOP/s for a device name, or None if unknown (MFU is then left empty)."""
    for key, val in PEAK_TFLOPS:
        if device_name and key in device_name:
            return val
    return None


def dims_from_text_config(tc):
    """Dims for step_flops from a text config dict (config.json's text_config, or
    hfmodel.text_config_dict). Layer i is full attention if layer_types[i] == 'full_attention'."""
    layers = []
    for t in tc["layer_types"]:
        if t == "full_attention":
            layers.append((tc["num_attention_heads"], tc["num_global_key_value_heads"], tc["global_head_dim"], False))
        else:
            layers.append((tc["num_attention_heads"], tc["num_key_value_heads"], tc["head_dim"], True))
    return {"H": tc["hidden_size"], "V": tc["vocab_size"], "I": tc["intermediate_size"],
            "Im": tc["moe_intermediate_size"], "E": tc["num_experts"], "k": tc["top_k_experts"], "layers": layers}


def token_macs(d, moe="active"):
    """Multiply-adds per token of one pass through the layers (no attention scores, no lm_head)."""
    H = d["H"]
    experts = d["k"] if moe == "active" else d["E"]
    tot = 0
    for nh, nkv, hd, has_v in d["layers"]:
        tot += H * (nh * hd + (2 if has_v else 1) * nkv * hd + nh * hd)
        tot += 3 * H * d["I"] + H * d["E"] + experts * 3 * H * d["Im"]
    return tot


def attn_macs(d, queries, keys):
    """Multiply-adds of Q K^T and P V over all layers for `queries` queries of `keys` keys each."""
    return sum(2 * nh * hd * queries * keys for nh, _, hd, _ in d["layers"])


def step_flops(d, B, L, C, n_sc, ar=True, sc=True, moe="active", attn="causal"):
    """FLOPs of one training step (see the module doc): batch B, padded length L, canvas C,
    n_sc rows in the self-conditioning pass; ar: encoder AR loss computed; sc: the main pass takes
    self-conditioning input (when any row uses it); attn: "causal", "full" or "none" (attention
    scores left out, to compare with counters that report attention kernels apart)."""
    if not (B > 0 and L > 0 and C > 0 and 0 <= n_sc <= B):
        raise ValueError("step_flops: need B, L, C > 0 and 0 <= n_sc <= B (got %s)" % ((B, L, C, n_sc),))
    H, V = d["H"], d["V"]
    per_tok = token_macs(d, moe)
    if attn not in ("causal", "full", "none"):
        raise ValueError("step_flops: attn must be causal, full or none (got %r)" % (attn,))
    enc_keys = {"causal": (L + 1) / 2.0, "full": float(L), "none": 0.0}[attn]
    dec_keys = 0 if attn == "none" else L + C
    enc = B * L * per_tok + attn_macs(d, B * L, enc_keys) + (B * (L - 1) * H * V if ar else 0)
    dec_one = C * per_tok + attn_macs(d, C, dec_keys) + C * H * V      # one row of a decoder pass
    sc_pass = n_sc * dec_one
    use_sc = sc and n_sc > 0
    main = B * dec_one + (B * C * 3 * H * d["I"] if use_sc else 0)
    soft = B * C * V * H if use_sc else 0                             # softmax(logits) @ E
    return 2.0 * (3 * enc + sc_pass + 3 * main + 2 * soft)


def mfu(flops, seconds, peak_tflops):
    """Model FLOPs utilisation: flops / seconds / (peak_tflops * 1e12), or None without a peak."""
    if not peak_tflops or seconds <= 0:
        return None
    return flops / seconds / (peak_tflops * 1e12)


# ---- the run log ------------------------------------------------------------------------------

def read_log(path):
    """Rows (dicts of strings) of a train_log.csv; [] if the file does not exist."""
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def append_log(path, rows, cols):
    """Append rows (dicts) to the CSV at path. A file written by an earlier run keeps its rows;
    if rows bring columns it lacks, the file is rewritten with the union of the columns (old
    rows get empty cells). Column order: the existing header, then new columns in `cols` order."""
    old_cols = []
    if os.path.exists(path):
        with open(path, newline="") as f:
            old_cols = next(csv.reader(f), [])
    new = [c for c in cols if c not in old_cols]
    if old_cols and new:
        old = read_log(path)
        _write(path, old_cols + new, old)
        old_cols = old_cols + new
    header = old_cols or list(cols)
    exists = os.path.exists(path) and os.path.getsize(path) > 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=header, extrasaction="raise")
        if not exists:
            w.writeheader()
        for r in rows:
            w.writerow({k: _cell(r.get(k)) for k in header})


def _cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "%.6g" % v
    return v


def _write(path, cols, rows):
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k, "") for k in cols})
    os.replace(tmp, path)


def merge_logs(logs):
    """One curve from several run logs (lists of row dicts, oldest first).

    Logs with a 'run' column carry global steps (train.py with a checkpoint): a step logged twice
    (a run resumed from an earlier checkpoint than the last logged step) keeps the later log's row.
    Logs without it (one run each, steps from 1) are placed after everything before them: their
    steps are offset by the largest step so far. Returns rows sorted by step, each with 'step' an
    int and a 'source' index (which log it came from)."""
    by_step = {}
    top = 0
    for i, rows in enumerate(logs):
        if not rows:
            continue
        offset = 0 if "run" in rows[0] and rows[0].get("run", "") != "" else top
        for r in rows:
            s = int(float(r["step"])) + offset
            by_step[s] = dict(r, step=s, source=i)
            top = max(top, s)
    return [by_step[s] for s in sorted(by_step)]
