#!/usr/bin/env python3
"""Export a bf16 training checkpoint (ckpt.py's format) as a Hugging Face model directory, without torch.

The GPU calls bring back the checkpoint as bf16 weights without AdamW moments
(`ckpt.tar.part-NN`, train_chunk.sh's pack). Only `train_chunk.sh --final` exports a model, and it
needs torch and Transformers; this CPU machine has neither. This tool reads the checkpoint's
`state.pt` (torch.save's zip: `data.pkl` plus one raw file per storage) with a restricted
unpickler that rebuilds tensors as (dtype, shape, bytes) and never imports torch, and writes the
same files `hfmodel.export` writes:

  model-0000K-of-0000N.safetensors + model.safetensors.index.json   the weights, bf16, split into
      shards exactly as the reference directory's index assigns them (same names, same shapes)
  config.json, generation_config.json   copied from the reference directory (the architecture must
      match: every tensor's name and shape is checked against the reference shards' headers)
  tokenizer.json, tokenizer_config.json   from the checkpoint (the tokenizer its ids come from)

Checkpoint keys that the reference does not store must be tied weights (the encoder's text layers
and lm_head share storage with the decoder's in the state dict; save_pretrained stores them once):
each is checked to alias a stored key's storage, offset and shape, else the export fails.

    python3 ckpt_export.py SRC --like models/dgemma-small --out DIR
    SRC: a checkpoint directory (state.pt, tokenizer.json, ...) or a directory of
         ckpt.tar.part-NN files (concatenated in name order and read as one tar)

Errors (bad zip, unknown storage type, a non-bf16 or non-contiguous tensor, a missing or
mis-shaped tensor, an untied extra key) raise ValueError with the tensor named.
Safetensors layout: 8-byte little-endian header length, JSON header ({name: {dtype, shape,
data_offsets}}, "__metadata__": {"format": "pt"}), padded with spaces to a multiple of 8, then the
data (the format's public specification, huggingface/safetensors README).
"""

import argparse
import collections
import glob
import io
import json
import os
import pickle
import shutil
import struct
import sys
import tarfile
import zipfile

# storage class name -> (safetensors dtype, bytes per element)
STORAGES = {"BFloat16Storage": ("BF16", 2), "FloatStorage": ("F32", 4), "HalfStorage": ("F16", 2),
            "DoubleStorage": ("F64", 8), "LongStorage": ("I64", 8), "IntStorage": ("I32", 4),
            "ShortStorage": ("I16", 2), "CharStorage": ("I8", 1), "ByteStorage": ("U8", 1),
            "BoolStorage": ("BOOL", 1)}
SIDE_FILES = ("tokenizer.json", "tokenizer_config.json")


class Storage:
    """One torch storage: its key in the zip, dtype name, element size and raw bytes."""

    def __init__(self, key, dtype, itemsize, raw):
        self.key, self.dtype, self.itemsize, self.raw = key, dtype, itemsize, raw


class Tensor:
    """A tensor view: storage, element offset, shape, strides (in elements)."""

    def __init__(self, storage, offset, shape, stride):
        self.storage, self.offset = storage, int(offset)
        self.shape, self.stride = tuple(int(d) for d in shape), tuple(int(s) for s in stride)

    @property
    def dtype(self):
        return self.storage.dtype

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def contiguous(self):
        want, acc = [], 1
        for d in reversed(self.shape):
            want.append(acc)
            acc *= d
        want.reverse()
        return all(d == 1 or s == w for d, s, w in zip(self.shape, self.stride, want))

    def data(self):
        """The tensor's bytes in row-major order (contiguous tensors only)."""
        if not self.contiguous():
            raise ValueError("non-contiguous tensor shape %s stride %s" % (self.shape, self.stride))
        a = self.offset * self.storage.itemsize
        b = a + self.numel() * self.storage.itemsize
        if b > len(self.storage.raw):
            raise ValueError("tensor shape %s at offset %d runs past its storage (%d bytes)"
                             % (self.shape, self.offset, len(self.storage.raw)))
        return self.storage.raw[a:b]

    def aliases(self, other):
        return (self.storage is other.storage and self.offset == other.offset
                and self.shape == other.shape and self.stride == other.stride)


class _StorageType:
    def __init__(self, name):
        self.name = name


class _Opaque:
    """Stand-in for torch objects the export does not need (e.g. generator states)."""

    def __init__(self, *a, **k):
        self.args = a

    def __setstate__(self, state):
        self.state = state


def _rebuild_tensor_v2(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    return Tensor(storage, offset, size, stride)


def load_state(fileobj):
    """Unpickle a torch.save zip (file object or path) into plain Python objects; tensors become
    Tensor. Only torch._utils._rebuild_tensor_v2, torch.*Storage, collections.OrderedDict and
    opaque torch objects are resolved; any other non-builtin global raises pickle's error."""
    try:
        z = zipfile.ZipFile(fileobj)
    except zipfile.BadZipFile as e:
        raise ValueError("state.pt is not a torch zip checkpoint: %s" % e)
    pkls = [n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
    if len(pkls) != 1:
        raise ValueError("state.pt: expected one data.pkl, found %d" % len(pkls))
    prefix = pkls[0][:-len("data.pkl")]
    storages = {}

    class Unpickler(pickle.Unpickler):
        def find_class(self, module, name):
            if module == "torch._utils" and name == "_rebuild_tensor_v2":
                return _rebuild_tensor_v2
            if module == "torch" and name.endswith("Storage"):
                if name not in STORAGES:
                    raise ValueError("state.pt: unsupported storage type torch.%s" % name)
                return _StorageType(name)
            if module == "collections" and name == "OrderedDict":
                return collections.OrderedDict
            if module.startswith("torch"):
                return _Opaque
            if module in ("builtins", "_codecs", "copyreg"):
                return super().find_class(module, name)
            raise ValueError("state.pt: refusing to load global %s.%s" % (module, name))

        def persistent_load(self, pid):
            if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
                raise ValueError("state.pt: unexpected persistent id %r" % (pid,))
            _, stype, key, _location, _numel = pid
            if key not in storages:
                dtype, itemsize = STORAGES[stype.name]
                storages[key] = Storage(key, dtype, itemsize, z.read("%sdata/%s" % (prefix, key)))
            return storages[key]

    with z.open(pkls[0]) as f:
        return Unpickler(f).load()


def read_checkpoint(src):
    """(state dict of the checkpoint, {side file name: bytes}) from a checkpoint directory or a
    directory of ckpt.tar.part-NN files."""
    if os.path.exists(os.path.join(src, "state.pt")):
        with open(os.path.join(src, "state.pt"), "rb") as f:
            st = load_state(io.BytesIO(f.read()))
        side = {}
        for fn in SIDE_FILES:
            if os.path.exists(os.path.join(src, fn)):
                with open(os.path.join(src, fn), "rb") as f:
                    side[fn] = f.read()
        return st, side
    parts = sorted(glob.glob(os.path.join(src, "ckpt.tar.part-*")))
    if not parts:
        raise ValueError("%s holds neither state.pt nor ckpt.tar.part-*" % src)
    buf = io.BytesIO()
    for p in parts:
        with open(p, "rb") as f:
            buf.write(f.read())
    buf.seek(0)
    st, side = None, {}
    with tarfile.open(fileobj=buf, mode="r:") as tf:
        for m in tf.getmembers():
            base = os.path.basename(m.name)
            if not m.isfile():
                continue
            if base == "state.pt":
                st = load_state(io.BytesIO(tf.extractfile(m).read()))
            elif base in SIDE_FILES:
                side[base] = tf.extractfile(m).read()
    if st is None:
        raise ValueError("%s: the parts' tar holds no state.pt" % src)
    return st, side


def _safetensors_header(path):
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) != 8:
            raise ValueError("%s: too short for a safetensors file" % path)
        n = struct.unpack("<Q", head)[0]
        return json.loads(f.read(n))


def write_safetensors(path, tensors):
    """Write {name: (dtype, shape, bytes)} (in the given order) as one safetensors file."""
    header, off = {}, 0
    for name, (dtype, shape, raw) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        off += len(raw)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _name, (_d, _s, raw) in tensors.items():
            f.write(raw)


def export(src, like, out, log=print):
    """Write the HF directory `out` from checkpoint `src`, shaped like reference directory `like`.
    Returns {"step", "tensors", "bytes"}."""
    st, side = read_checkpoint(src)
    if not isinstance(st, dict) or "model" not in st:
        raise ValueError("%s: not a ckpt.py checkpoint (no 'model')" % src)
    sd = st["model"]
    with open(os.path.join(like, "model.safetensors.index.json")) as f:
        ref_map = json.load(f)["weight_map"]
    ref_hdr = {}
    for shard in sorted(set(ref_map.values())):
        for k, v in _safetensors_header(os.path.join(like, shard)).items():
            if k != "__metadata__":
                ref_hdr[k] = v
    missing = [k for k in ref_map if k not in sd]
    if missing:
        raise ValueError("checkpoint lacks %d tensors of %s, e.g. %s" % (len(missing), like, missing[:3]))
    for k in ref_map:
        t = sd[k]
        if t.dtype != "BF16":
            raise ValueError("tensor %s is %s, this export writes bf16 checkpoints only "
                             "(ckpt.py convert --dtype bf16 first)" % (k, t.dtype))
        if list(t.shape) != list(ref_hdr[k]["shape"]):
            raise ValueError("tensor %s has shape %s, %s has %s" % (k, t.shape, like, ref_hdr[k]["shape"]))
    for k in sd:
        if k in ref_map:
            continue
        if not any(sd[k].aliases(sd[r]) for r in ref_map):
            raise ValueError("checkpoint tensor %s is neither in %s nor tied to a tensor there" % (k, like))
    os.makedirs(out, exist_ok=True)
    for fn in os.listdir(out):
        if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(out, fn))
    shards = collections.OrderedDict()
    for k in sorted(ref_map):
        shards.setdefault(ref_map[k], collections.OrderedDict())[k] = ("BF16", sd[k].shape, sd[k].data())
    total = 0
    for shard in sorted(shards):
        write_safetensors(os.path.join(out, shard), shards[shard])
        total += sum(len(v[2]) for v in shards[shard].values())
    # the names and shapes equal the reference's (checked above), so its parameter count holds
    # (Transformers counts parameters, not buffers such as layer_scalar: 12 fewer than the tensors)
    with open(os.path.join(like, "model.safetensors.index.json")) as f:
        nparams = json.load(f)["metadata"].get("total_parameters", 0)
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_parameters": nparams, "total_size": total},
                   "weight_map": {k: ref_map[k] for k in sorted(ref_map)}}, f, indent=2)
    for fn in ("config.json", "generation_config.json"):
        shutil.copy(os.path.join(like, fn), os.path.join(out, fn))
    for fn in SIDE_FILES:
        if fn in side:
            with open(os.path.join(out, fn), "wb") as f:
                f.write(side[fn])
        else:
            shutil.copy(os.path.join(like, fn), os.path.join(out, fn))
            log("ckpt_export: the checkpoint has no %s; copied %s's" % (fn, like))
    step = (st.get("trainer") or {}).get("step")
    log("ckpt_export: %s (global step %s) -> %s: %d tensors, %d elements, %.2f MiB bf16 in %d shards"
        % (src, step, out, len(ref_map), sum(sd[k].numel() for k in ref_map), total / 2**20, len(shards)))
    return {"step": step, "tensors": len(ref_map), "bytes": total}


def main(argv=None):
    ap = argparse.ArgumentParser(description="export a bf16 training checkpoint as a HF directory (no torch)")
    ap.add_argument("src", help="checkpoint directory (state.pt) or directory of ckpt.tar.part-NN")
    ap.add_argument("--like", required=True, help="reference model directory of the same architecture")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    try:
        export(a.src, a.like, a.out)
    except (ValueError, OSError) as e:
        print("ckpt_export: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
