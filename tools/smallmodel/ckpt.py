#!/usr/bin/env python3
"""Training checkpoints of the small model: one schedule across many time-boxed runs.

A checkpoint is a directory:
  state.pt       torch.save of {"format", "model" (state dict), "optimizer" (AdamW state dict or None),
                 "trainer" (global step, run counter, examples, batcher and curriculum state),
                 "rng" (torch CPU / CUDA generator states, the batcher's random.Random state),
                 "args" (the run config, vars(train.py args))}
  meta.json      the same minus the tensors (readable without torch)
  tokenizer.json, tokenizer_config.json   the tokenizer the ids come from
  train_log.csv  the run log, appended by every run (runlog.append_log)

Precision (--ckpt-dtype): "fp32" keeps the fp32 master weights and AdamW moments as they are,
so a resumed run continues bit for bit (selftest.py checks it); "bf16" rounds weights and moments
to bf16 (6 bytes per parameter instead of 12: the 9.9 M-parameter model takes 57 MiB instead of
114 MiB). moments="drop" leaves the AdamW state out (2 or 4 bytes per parameter): the resumed run
starts AdamW afresh at the saved step of the same learning-rate schedule.
Tied parameters (encoder = decoder text weights, lm_head = embedding) are stored once.

    python3 ckpt.py convert SRC DST [--dtype bf16] [--moments drop]   (a smaller copy to carry)
    python3 ckpt.py info DIR
"""

import argparse
import json
import os
import shutil
import sys

FORMAT = 1
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json", "train_log.csv")


def _torch():
    import torch
    return torch


def _cast_tree(obj, dtype, memo):
    """Copy of a nested dict/list with floating tensors moved to the CPU and cast to dtype;
    tensors sharing storage (tied weights) stay shared (memo by data_ptr, shape, stride)."""
    torch = _torch()
    if torch.is_tensor(obj):
        key = (obj.data_ptr(), tuple(obj.shape), tuple(obj.stride()), str(obj.dtype))
        if key not in memo:
            t = obj.detach().to("cpu")
            if t.is_floating_point() and dtype is not None and t.dim() > 0:
                t = t.to(dtype)
            elif t.data_ptr() == obj.data_ptr():
                t = t.clone()
            memo[key] = t
        return memo[key]
    if isinstance(obj, dict):
        return {k: _cast_tree(v, dtype, memo) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_cast_tree(v, dtype, memo) for v in obj)
    return obj


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    return repr(obj)


def rng_state(batch_rng=None):
    """The random generators training draws from: torch CPU, every CUDA device, the batcher's
    random.Random."""
    torch = _torch()
    st = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        st["torch_cuda"] = torch.cuda.get_rng_state_all()
    if batch_rng is not None:
        st["batcher"] = batch_rng.getstate()
    return st


def set_rng_state(st, batch_rng=None):
    torch = _torch()
    torch.set_rng_state(st["torch_cpu"])
    if "torch_cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["torch_cuda"])
    if batch_rng is not None and "batcher" in st:
        batch_rng.setstate(st["batcher"])


def save(path, model_sd, optim_sd, trainer, rng, args, dtype="fp32", moments="keep", side_dir=None, log=print):
    """Write checkpoint directory `path` (atomically: state.pt.tmp then rename). dtype "fp32" | "bf16"
    for weights and moments; moments "keep" | "drop". side_dir: copy SIDE_FILES from there when it
    is another directory. Returns the size of state.pt in bytes."""
    torch = _torch()
    if dtype not in ("fp32", "bf16") or moments not in ("keep", "drop"):
        raise ValueError("ckpt.save: dtype must be fp32|bf16 and moments keep|drop (got %s, %s)" % (dtype, moments))
    os.makedirs(path, exist_ok=True)
    cast = None if dtype == "fp32" else torch.bfloat16
    memo = {}
    state = {"format": FORMAT, "dtype": dtype, "moments": moments,
             "model": _cast_tree(model_sd, cast, memo),
             "optimizer": None if (moments == "drop" or optim_sd is None) else _cast_tree(optim_sd, cast, memo),
             "trainer": trainer, "rng": rng, "args": args}
    tmp = os.path.join(path, "state.pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, os.path.join(path, "state.pt"))
    meta = {k: _jsonable(v) for k, v in state.items() if k not in ("model", "optimizer", "rng")}
    meta["state_bytes"] = os.path.getsize(os.path.join(path, "state.pt"))
    with open(os.path.join(path, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    if side_dir and os.path.abspath(side_dir) != os.path.abspath(path):
        for fn in SIDE_FILES:
            if os.path.exists(os.path.join(side_dir, fn)):
                shutil.copy(os.path.join(side_dir, fn), os.path.join(path, fn))
    log("checkpoint %s: step %s, %s weights, moments %s, %.1f MiB" % (
        path, trainer.get("step"), dtype, moments, meta["state_bytes"] / 2**20))
    return meta["state_bytes"]


def exists(path):
    return bool(path) and os.path.exists(os.path.join(path, "state.pt"))


def load(path):
    """The state dict written by save (tensors on the CPU, in their stored dtype)."""
    torch = _torch()
    fn = os.path.join(path, "state.pt")
    if not os.path.exists(fn):
        raise FileNotFoundError("no checkpoint at %s (state.pt missing)" % path)
    try:
        st = torch.load(fn, map_location="cpu", weights_only=False)
    except TypeError:  # torch < 1.13 has no weights_only
        st = torch.load(fn, map_location="cpu")
    if st.get("format") != FORMAT:
        raise ValueError("checkpoint %s has format %r, this code reads %d" % (path, st.get("format"), FORMAT))
    return st


def restore_model(model, st):
    """Load the checkpoint's weights into `model` (cast to each parameter's dtype); strict."""
    torch = _torch()
    sd = model.state_dict()
    missing = [k for k in sd if k not in st["model"]]
    extra = [k for k in st["model"] if k not in sd]
    if missing or extra:
        raise ValueError("checkpoint does not fit the model: missing %s, unexpected %s" % (missing[:5], extra[:5]))
    with torch.no_grad():
        for k, v in sd.items():
            v.copy_(st["model"][k].to(v.dtype))


def restore_optimizer(opt, st, log=print):
    """Load the AdamW state (moments cast to the parameters' dtype and device by torch), keeping this
    run's implementation flags (fused / foreach). Returns False when the checkpoint has none."""
    if st.get("optimizer") is None:
        log("checkpoint has no optimizer moments (saved with moments=drop): AdamW starts afresh")
        return False
    flags = [{k: g[k] for k in ("fused", "foreach", "capturable") if k in g} for g in opt.param_groups]
    opt.load_state_dict(st["optimizer"])
    for g, f in zip(opt.param_groups, flags):
        g.update(f)
    return True


def convert(src, dst, dtype="bf16", moments="keep", log=print):
    """A copy of checkpoint src at dst with another precision (e.g. bf16 to carry it back)."""
    st = load(src)
    if st["dtype"] == "bf16" and dtype == "fp32":
        log("ckpt convert: %s is bf16 already; fp32 does not restore the rounded bits" % src)
    return save(dst, st["model"], st["optimizer"], st["trainer"], st["rng"], st["args"], dtype, moments,
                side_dir=src, log=log)


def main(argv=None):
    ap = argparse.ArgumentParser(description="training checkpoints of the small model")
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("convert", help="copy a checkpoint with another precision")
    c.add_argument("src")
    c.add_argument("dst")
    c.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16")
    c.add_argument("--moments", choices=["keep", "drop"], default="keep")
    i = sub.add_parser("info", help="print meta.json")
    i.add_argument("dir")
    a = ap.parse_args(argv)
    if a.cmd == "convert":
        convert(a.src, a.dst, a.dtype, a.moments)
    else:
        with open(os.path.join(a.dir, "meta.json")) as f:
            print(f.read())


if __name__ == "__main__":
    sys.exit(main())
