"""tools/smallmodel/ckpt_export.py: a bf16 checkpoint (torch.save's zip) exported as a HF directory without torch.

Plain python3 (no torch): the checkpoints here are written in torch.save's layout by a pickler that
stands in torch's globals with placeholder modules (torch._utils._rebuild_tensor_v2 and
torch.BFloat16Storage by name, storages as persistent ids ("storage", type, key, location, numel),
raw little-endian bytes in ARCHIVE/data/KEY), the layout torch 2.x writes (the step-4,699 pack of
session 23 reads the same way: 285 tensors, 127 of them tied).
"""

import io
import json
import os
import pickle
import shutil
import struct
import sys
import tarfile
import tempfile
import types
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools", "smallmodel"))
import ckpt_export as ce  # noqa: E402


def _fake_torch():
    """Placeholder modules so that pickle can name torch._utils._rebuild_tensor_v2 and torch.*Storage."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*a):
        raise AssertionError("never called while pickling")
    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2
    torch._utils = utils
    for name in ("BFloat16Storage", "FloatStorage"):
        setattr(torch, name, type(name, (), {"__module__": "torch", "__qualname__": name}))
    return torch, utils


class FakeStorage:
    def __init__(self, key, stype, raw, itemsize):
        self.key, self.stype, self.raw, self.itemsize = key, stype, raw, itemsize


class FakeTensor:
    def __init__(self, storage, offset, shape, stride):
        self.storage, self.offset, self.shape, self.stride = storage, offset, shape, stride

    def __reduce__(self):
        fn = sys.modules["torch._utils"]._rebuild_tensor_v2
        return (fn, (self.storage, self.offset, tuple(self.shape), tuple(self.stride), False, {}))


def torch_zip(state, archive="state"):
    """bytes of a torch.save-style zip of `state` (FakeTensor leaves)."""
    torch, utils = _fake_torch()
    saved = {k: sys.modules.get(k) for k in ("torch", "torch._utils")}
    sys.modules["torch"], sys.modules["torch._utils"] = torch, utils
    try:
        storages = {}

        class P(pickle.Pickler):
            def persistent_id(self, obj):
                if isinstance(obj, FakeStorage):
                    storages[obj.key] = obj.raw
                    return ("storage", getattr(torch, obj.stype), obj.key, "cpu", len(obj.raw) // obj.itemsize)
                return None

        buf = io.BytesIO()
        P(buf, protocol=2).dump(state)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        z.writestr(archive + "/data.pkl", buf.getvalue())
        z.writestr(archive + "/version", "3\n")
        for k, raw in storages.items():
            z.writestr("%s/data/%s" % (archive, k), raw)
    return out.getvalue()


def bf16_bytes(values):
    """bf16 bit patterns of floats that bf16 holds exactly (the upper half of their fp32 bits)."""
    return b"".join(struct.pack("<H", struct.unpack("<I", struct.pack("<f", v))[0] >> 16) for v in values)


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        hdr = json.loads(f.read(n))
        data = f.read()
    return hdr, {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in hdr.items() if k != "__metadata__"}


class Export(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ckpt_export_test_")
        # reference directory: two shards, as save_pretrained writes them (tied "emb2" not stored)
        self.ref = os.path.join(self.tmp, "ref")
        os.makedirs(self.ref)
        ce.write_safetensors(os.path.join(self.ref, "model-00001-of-00002.safetensors"),
                             {"emb": ("BF16", (2, 3), bytes(12)), "norm": ("BF16", (4,), bytes(8))})
        ce.write_safetensors(os.path.join(self.ref, "model-00002-of-00002.safetensors"),
                             {"scalar": ("BF16", (1,), bytes(2))})
        wm = {"emb": "model-00001-of-00002.safetensors", "norm": "model-00001-of-00002.safetensors",
              "scalar": "model-00002-of-00002.safetensors"}
        with open(os.path.join(self.ref, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_parameters": 10, "total_size": 22}, "weight_map": wm}, f)
        for fn, body in (("config.json", '{"model_type": "x"}'), ("generation_config.json", '{"g": 1}'),
                         ("tokenizer.json", '{"ref": true}'), ("tokenizer_config.json", '{"ref": true}')):
            with open(os.path.join(self.ref, fn), "w") as f:
                f.write(body)
        # checkpoint: emb (2x3) at offset 1 of a 7-element storage; "emb2" tied to it; norm; scalar
        self.emb_vals = [1.0, -2.0, 0.5, 3.0, -0.25, 8.0]
        s0 = FakeStorage("0", "BFloat16Storage", bf16_bytes([9.0] + self.emb_vals), 2)
        s1 = FakeStorage("1", "BFloat16Storage", bf16_bytes([1.5, 2.5, -1.0, 0.125]), 2)
        s2 = FakeStorage("2", "BFloat16Storage", bf16_bytes([0.75]), 2)
        self.model = {"emb": FakeTensor(s0, 1, (2, 3), (3, 1)), "emb2": FakeTensor(s0, 1, (2, 3), (3, 1)),
                      "norm": FakeTensor(s1, 0, (4,), (1,)), "scalar": FakeTensor(s2, 0, (1,), (1,))}
        self.trainer = {"step": 4699, "run": 2}

    def tearDown(self):
        shutil.rmtree(self.tmp)

    def write_ckpt(self, model, name="ck", tok=b'{"ckpt": true}'):
        d = os.path.join(self.tmp, name)
        os.makedirs(d)
        state = {"format": 1, "dtype": "bf16", "moments": "drop", "model": model, "optimizer": None,
                 "trainer": self.trainer, "rng": {"batcher": (3, (1, 2), None)}, "args": {"lr": 0.002}}
        with open(os.path.join(d, "state.pt"), "wb") as f:
            f.write(torch_zip(state))
        with open(os.path.join(d, "tokenizer.json"), "wb") as f:
            f.write(tok)
        return d

    def check_out(self, out):
        hdr1, t1 = read_safetensors(os.path.join(out, "model-00001-of-00002.safetensors"))
        hdr2, t2 = read_safetensors(os.path.join(out, "model-00002-of-00002.safetensors"))
        self.assertEqual(sorted(t1), ["emb", "norm"])
        self.assertEqual(sorted(t2), ["scalar"])
        self.assertEqual(t1["emb"], bf16_bytes(self.emb_vals))  # the view from offset 1, not the storage start
        self.assertEqual(t1["norm"], bf16_bytes([1.5, 2.5, -1.0, 0.125]))
        self.assertEqual(t2["scalar"], bf16_bytes([0.75]))
        self.assertEqual(hdr1["emb"]["shape"], [2, 3])
        self.assertEqual(hdr1["emb"]["dtype"], "BF16")
        self.assertEqual(hdr1["__metadata__"], {"format": "pt"})
        with open(os.path.join(out, "model-00001-of-00002.safetensors"), "rb") as f:
            self.assertEqual(struct.unpack("<Q", f.read(8))[0] % 8, 0)
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            idx = json.load(f)
        self.assertEqual(idx["metadata"], {"total_parameters": 10, "total_size": 22})
        with open(os.path.join(self.ref, "model.safetensors.index.json")) as f:
            self.assertEqual(idx["weight_map"], json.load(f)["weight_map"])
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f), {"model_type": "x"})
        with open(os.path.join(out, "tokenizer.json")) as f:
            self.assertEqual(json.load(f), {"ckpt": True})  # the checkpoint's tokenizer, not the reference's
        with open(os.path.join(out, "tokenizer_config.json")) as f:
            self.assertEqual(json.load(f), {"ref": True})  # absent from the checkpoint: the reference's

    def test_export_from_directory(self):
        src = self.write_ckpt(self.model)
        out = os.path.join(self.tmp, "out")
        r = ce.export(src, self.ref, out, log=lambda *a: None)
        self.assertEqual(r, {"step": 4699, "tensors": 3, "bytes": 22})
        self.check_out(out)

    def test_export_from_tar_parts(self):
        src = self.write_ckpt(self.model)
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tf:
            for fn in ("state.pt", "tokenizer.json"):
                tf.add(os.path.join(src, fn), arcname="./" + fn)
        raw = buf.getvalue()
        parts = os.path.join(self.tmp, "parts")
        os.makedirs(parts)
        cut = len(raw) // 3
        for i, (a, b) in enumerate(((0, cut), (cut, len(raw)))):
            with open(os.path.join(parts, "ckpt.tar.part-%02d" % i), "wb") as f:
                f.write(raw[a:b])
        out = os.path.join(self.tmp, "out")
        ce.export(parts, self.ref, out, log=lambda *a: None)
        self.check_out(out)

    def test_untied_extra_key_refused(self):
        m = dict(self.model)
        s = FakeStorage("9", "BFloat16Storage", bf16_bytes(self.emb_vals), 2)
        m["emb2"] = FakeTensor(s, 0, (2, 3), (3, 1))  # equal values, own storage: not tied
        src = self.write_ckpt(m)
        with self.assertRaisesRegex(ValueError, "emb2 is neither in .* nor tied"):
            ce.export(src, self.ref, os.path.join(self.tmp, "out"), log=lambda *a: None)

    def test_shape_mismatch_refused(self):
        m = dict(self.model)
        m["emb"] = FakeTensor(m["emb"].storage, 1, (3, 2), (2, 1))
        m["emb2"] = m["emb"]
        src = self.write_ckpt(m)
        with self.assertRaisesRegex(ValueError, r"tensor emb has shape \(3, 2\)"):
            ce.export(src, self.ref, os.path.join(self.tmp, "out"), log=lambda *a: None)

    def test_missing_tensor_refused(self):
        m = dict(self.model)
        del m["scalar"]
        src = self.write_ckpt(m)
        with self.assertRaisesRegex(ValueError, "lacks 1 tensors"):
            ce.export(src, self.ref, os.path.join(self.tmp, "out"), log=lambda *a: None)

    def test_fp32_refused(self):
        m = dict(self.model)
        m["scalar"] = FakeTensor(FakeStorage("5", "FloatStorage", struct.pack("<f", 0.75), 4), 0, (1,), (1,))
        src = self.write_ckpt(m)
        with self.assertRaisesRegex(ValueError, "scalar is F32"):
            ce.export(src, self.ref, os.path.join(self.tmp, "out"), log=lambda *a: None)

    def test_non_contiguous_refused(self):
        m = dict(self.model)
        m["emb"] = FakeTensor(m["emb"].storage, 1, (2, 3), (1, 2))  # a transposed view
        m["emb2"] = m["emb"]
        src = self.write_ckpt(m)
        with self.assertRaisesRegex(ValueError, "non-contiguous"):
            ce.export(src, self.ref, os.path.join(self.tmp, "out"), log=lambda *a: None)

    def test_foreign_global_refused(self):
        class Evil:
            def __reduce__(self):
                return (os.getcwd, ())
        src = self.write_ckpt(dict(self.model, evil=Evil()))
        with self.assertRaisesRegex(ValueError, "refusing to load global"):
            ce.read_checkpoint(src)

    def test_not_a_zip(self):
        with self.assertRaisesRegex(ValueError, "not a torch zip"):
            ce.load_state(io.BytesIO(b"plain pickle, not a zip"))


if __name__ == "__main__":
    unittest.main()
