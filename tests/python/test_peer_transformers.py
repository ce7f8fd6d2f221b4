"""tools/peer_transformers.py and tools/peer_ratios.py without torch (issue 12 item 7's peer).

The development machine has neither PyTorch nor Transformers, so this test checks what can be checked here:
  - the 26B-A4B config against the spec's numbers and against `dgemma mkrandom`'s built-in config.json
    (src/writers/mkrandom.c), and the weight count against mkrandom's 25,250,986,812;
  - arguments, the filler prompt read from tools/bench.c, the temperature schedule;
  - the JSON rows' field names against dgemma bench's (tools/bench.c), the tables;
  - main() without torch (a clear message, exit 1, an error row per protocol);
  - main() end to end against a fake `torch` and `transformers` injected into sys.modules: a fake model whose
    decoder forward takes 78 ms, encoder 90 ms per 1,024 tokens and generate's sampler 3 ms per step on a fake
    clock (CUDA events and time.perf_counter read it), so that every protocol's medians, counts and the
    interval arithmetic are checked exactly; and an out-of-memory error in one protocol (an error row, the
    others still measured, exit 3);
  - peer_ratios.py on such rows beside dgemma rows of the layout session 29's H100 calls wrote.

plain python3:  python3 -m unittest discover -s tests/python -v
"""

import contextlib
import io
import json
import os
import re
import shutil
import sys
import tempfile
import types
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import peer_ratios as pr  # noqa: E402
import peer_transformers as pt  # noqa: E402

BENCH_C = os.path.join(ROOT, "tools", "bench.c")
MKRANDOM_C = os.path.join(ROOT, "src", "writers", "mkrandom.c")

# ---- a fake torch ------------------------------------------------------------------------------------

FWD_S, ENC_S_PER_1024, SAMPLER_S = 0.078, 0.090, 0.003


class Clock:
    t = 0.0


class DType:
    def __init__(self, name, size):
        self.name, self.size = name, size

    def __str__(self):
        return "torch." + self.name


class Device:
    def __init__(self, kind):
        self.type = str(kind).split(":")[0]

    def __enter__(self):
        FakeTorch.default_device.append(self)
        return self

    def __exit__(self, *exc):
        FakeTorch.default_device.pop()


class Tensor:
    """Shape, dtype, device and what was done to it (init: "normal" / a fill value; value: where a buffer's
    content came from)."""

    def __init__(self, shape, dtype=None, device=None, value=None):
        self.shape = tuple(shape)
        self.dtype = dtype or FakeTorch.float32
        self.device = device if isinstance(device, Device) else Device(device or "cpu")
        self.init, self.value, self.zero_rows = None, value, []

    @property
    def is_meta(self):
        return self.device.type == "meta"

    def unsqueeze(self, d):
        s = list(self.shape)
        s.insert(d if d >= 0 else len(s) + 1 + d, 1)
        return Tensor(s, self.dtype, self.device)

    def float(self):
        return Tensor(self.shape, FakeTorch.float32, self.device)

    def __truediv__(self, x):
        return Tensor(self.shape, self.dtype, self.device)

    def __getitem__(self, idx):
        if isinstance(idx, int):  # a row: zero_() is recorded on this tensor
            parent = self
            return types.SimpleNamespace(zero_=lambda: parent.zero_rows.append(idx))
        s = list(self.shape)
        for i, sl in enumerate(idx if isinstance(idx, tuple) else (idx,)):
            if isinstance(sl, slice):
                s[i] = len(range(*sl.indices(s[i])))
        return Tensor(s, self.dtype, self.device)

    def normal_(self, mean, std, generator=None):
        assert not self.is_meta and (mean, std) == (0.0, 0.02)
        self.init = "normal"
        return self

    def fill_(self, v):
        self.init = v
        return self

    def to(self, device=None, dtype=None):
        if isinstance(device, DType):
            device, dtype = None, device
        t = Tensor(self.shape, dtype or self.dtype, device or self.device, self.value)
        t.init = self.init
        return t

    def numel(self):
        n = 1
        for x in self.shape:
            n *= x
        return n

    def element_size(self):
        return self.dtype.size

    def dim(self):
        return len(self.shape)


class OOM(RuntimeError):
    pass


class Event:
    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        self.t = Clock.t

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return (other.t - self.t) * 1e3


class Cuda:
    OutOfMemoryError = OOM
    Event = Event
    available = True
    peak = 0

    @staticmethod
    def is_available():
        return Cuda.available

    @staticmethod
    def get_device_name(i=0):
        return "Fake H100"

    @staticmethod
    def mem_get_info(dev=None):
        return 30 * 2**30, 80 * 2**30

    @staticmethod
    def synchronize():
        pass

    @staticmethod
    def empty_cache():
        pass

    @staticmethod
    def reset_peak_memory_stats(dev=None):
        Cuda.peak = 0

    @staticmethod
    def max_memory_allocated(dev=None):
        return 48 * 2**30

    @staticmethod
    def max_memory_reserved(dev=None):
        return 49 * 2**30

    @staticmethod
    def memory_allocated(dev=None):
        return 47 * 2**30


class FakeTorch(types.ModuleType):
    __version__ = "0.fake"
    float32, bfloat16 = DType("float32", 4), DType("bfloat16", 2)
    int32, long, bool = DType("int32", 4), DType("int64", 8), DType("bool", 1)
    cuda = Cuda
    default_device = []
    dtype_default = None

    def __init__(self):
        super().__init__("torch")
        FakeTorch.default_device = []
        FakeTorch.dtype_default = FakeTorch.float32

    @staticmethod
    def current_device():
        return FakeTorch.default_device[-1] if FakeTorch.default_device else Device("cpu")

    device = Device
    Tensor = Tensor
    nn = types.SimpleNamespace(Parameter=lambda t, requires_grad=True: t)

    @staticmethod
    def empty(shape, dtype=None, device=None):
        return Tensor(shape, dtype, device)

    @staticmethod
    def Generator(device=None):  # noqa: N802
        return types.SimpleNamespace(manual_seed=lambda s: None)

    @staticmethod
    def manual_seed(s):
        pass

    @staticmethod
    def get_default_dtype():
        return FakeTorch.dtype_default

    @staticmethod
    def set_default_dtype(d):
        FakeTorch.dtype_default = d

    @staticmethod
    def randint(high, size, device=None, generator=None):
        return Tensor(size, FakeTorch.long, device)

    @staticmethod
    def arange(a, b, dtype=None, device=None):
        return Tensor((b - a,), dtype, device)

    @staticmethod
    def ones(shape, dtype=None, device=None):
        return Tensor(shape, dtype, device)

    @staticmethod
    def tensor(data, dtype=None, device=None):
        return Tensor((len(data), len(data[0])), dtype, device)

    @staticmethod
    def no_grad():
        return contextlib.nullcontext()

    @staticmethod
    def is_tensor(x):
        return isinstance(x, Tensor)


# ---- a fake transformers -----------------------------------------------------------------------------

class TextConfig(types.SimpleNamespace):
    pass


class Config:
    def __init__(self, text_config, vision_config=None, canvas_length=256, **kw):
        self.text = TextConfig(**text_config)
        self.vision = vision_config
        self.canvas_length = canvas_length
        self._experts_implementation = None

    def get_text_config(self, decoder=False):
        return self.text


class Cache:
    def __init__(self, config=None):
        self.length = 0


class FMod:
    """A fake nn.Module: _parameters and _buffers dicts read through attribute access, as torch's."""

    def __init__(self, **kw):
        self._parameters, self._buffers = {}, {}
        self.__dict__.update(kw)

    def __getattr__(self, name):
        for d in ("_parameters", "_buffers"):
            if name in self.__dict__.get(d, {}):
                return self.__dict__[d][name]
        raise AttributeError(name)


class Module(FMod):
    """__call__ runs the pre-hooks, self.forward (an instance attribute wins, as in torch) and the hooks."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self._pre, self._post = [], []

    def register_forward_pre_hook(self, fn):
        self._pre.append(fn)
        return types.SimpleNamespace(remove=lambda: self._pre.remove(fn))

    def register_forward_hook(self, fn):
        self._post.append(fn)
        return types.SimpleNamespace(remove=lambda: self._post.remove(fn))

    def __call__(self, *args, **kwargs):
        for h in list(self._pre):
            h(self, args)
        out = self.forward(*args, **kwargs)
        for h in list(self._post):
            h(self, args, out)
        return out


class Encoder(Module):
    calls = []

    def forward(self, input_ids=None, attention_mask=None, past_key_values=None, position_ids=None):
        n = input_ids.shape[1]
        assert position_ids.shape == (1, n), position_ids.shape
        past_key_values.length += n
        Clock.t += ENC_S_PER_1024 * n / 1024
        Encoder.calls.append(n)


class Layer:
    def __init__(self, t, tc):
        d, kv = (tc.global_head_dim, tc.num_global_key_value_heads) if t == "full_attention" else \
            (tc.head_dim, tc.num_key_value_heads)
        ns = types.SimpleNamespace
        self.self_attn = ns(q_proj=ns(out_features=tc.num_attention_heads * d), k_proj=ns(out_features=kv * d),
                            v_proj=None if t == "full_attention" else ns(out_features=kv * d))


class Model(Module):
    """The text weights as: the embedding (V x H, padding_idx 0), 30 expert stacks (E x 2 IE x H) and one vector
    holding the rest (so that the count is the spec's); the encoder's embedding the decoder's (tied) unless
    Model.untied; a rotary buffer computed from the config (with a plain-attribute alias, as Transformers' rotary
    modules keep original_inv_freq), a layer-scalar buffer, a tiny vision weight. Built on meta, its values are
    meta until the peer materialises them; built on the host or the GPU, Transformers' init and buffers."""
    fail = {}         # protocol -> exception class, raised by generate (vllm: G > 256) or forward
    untied = False    # the meta model's encoder keeps its own copy (the "meta" build must refuse it)
    cuda_oom = False  # a build under torch.device("cuda") of the 26B runs out of memory (an H100)
    builds = []       # (device type, vocab) of every _from_config
    enc_direct = False  # generate calls the encoder's forward itself (no module hooks fire)
    short = False       # generate stops after 2 canvases (an EOS the stop ids let through)

    def __init__(self, config, experts):
        super().__init__()
        dev = FakeTorch.current_device()
        self.config = config
        tc = config.text
        tc._experts_implementation = experts
        V, H, E, IE = tc.vocab_size, tc.hidden_size, tc.num_experts, tc.moe_intermediate_size
        real = dev.type != "meta"

        def w(shape, dtype=FakeTorch.bfloat16):
            t = Tensor(shape, dtype, dev)
            if real:
                t.init = "normal" if len(shape) >= 2 else 1.0
            return t
        self.embed = FMod(padding_idx=0)
        self.embed._parameters["weight"] = w((V, H))
        if real:
            self.embed.weight.zero_rows.append(0)
        self.experts = []
        for _ in range(tc.num_hidden_layers):
            e = FMod(config=tc)
            e._parameters["gate_up_proj"] = w((E, 2 * IE, H))
            self.experts.append(e)
        n_rest = pt.expected_text_params(vars(tc)) - V * H - tc.num_hidden_layers * E * 2 * IE * H
        self.rest = FMod()
        self.rest._parameters["weight"] = w((n_rest,))
        self.enc_embed, self.enc_rest = self.embed, self.rest
        if Model.untied and not real:  # the encoder's own copy of every text weight
            self.enc_embed = FMod(padding_idx=0)
            self.enc_embed._parameters["weight"] = w((V, H))
            self.enc_rest = FMod()
            self.enc_rest._parameters["weight"] = w((pt.expected_text_params(vars(tc)) - V * H,))
        self.rotary = FMod()
        inv = Tensor((tc.global_head_dim // 8,), FakeTorch.float32, dev, None if not real else "rope(%d)" % tc.head_dim)
        self.rotary._buffers["inv_freq"] = inv
        self.rotary.original_inv_freq = inv
        self.rotary.per_type = {"full_attention": Tensor((16,), FakeTorch.float32, dev, "rope(512)" if real else None)}
        self.scalars = FMod()
        self.scalars._buffers["layer_scalar"] = Tensor((1,), FakeTorch.bfloat16, dev, 1.0 if real else None)
        self.vision = FMod()
        self.vision._parameters["w"] = w((7,))
        dec = types.SimpleNamespace(layers=[Layer(t, tc) for t in tc.layer_types],
                                    create_diffusion_decoder_attention_mask=lambda **kw: Tensor((1, 1, 256, 1)))
        self.model = types.SimpleNamespace(encoder=Encoder(), decoder=dec)
        self.dtype = FakeTorch.bfloat16
        self.generation_config = types.SimpleNamespace(eos_token_id=[1, 106, 50])
        self.decoder_calls = []

    @classmethod
    def _from_config(cls, config, attn_implementation=None, dtype=None, experts_implementation=None):
        dev = FakeTorch.current_device().type
        Model.builds.append((dev, config.text.vocab_size))
        assert dtype is FakeTorch.bfloat16
        assert dev in ("meta", "cuda") or config.text.vocab_size < 1000, "the 26B built on %s" % dev
        if dev == "cuda" and Model.cuda_oom and config.text.vocab_size == pt.VOCAB:
            raise OOM("CUDA out of memory. Tried to allocate 1.38 GiB")
        return cls(config, experts_implementation)

    def named_modules(self):
        mods = [("", self), ("model.decoder.embed_tokens", self.embed), ("model.decoder.rest", self.rest),
                ("model.encoder.language_model.embed_tokens", self.enc_embed),
                ("model.encoder.language_model.rest", self.enc_rest),
                ("model.decoder.rotary_emb", self.rotary), ("model.decoder.scalars", self.scalars),
                ("model.encoder.vision_tower", self.vision)]
        mods += [("model.decoder.layers.%d.experts" % i, e) for i, e in enumerate(self.experts)]
        seen, out = set(), []
        for name, m in mods:
            if id(m) not in seen:
                seen.add(id(m))
                out.append((name, m))
        return iter(out)

    def _named(self, kind):
        seen, out = set(), []
        for path, m in self.named_modules():
            for k, t in getattr(m, kind).items():
                if id(t) not in seen:
                    seen.add(id(t))
                    out.append(((path + "." if path else "") + k, t))
        return out

    def named_parameters(self):
        return iter(self._named("_parameters"))

    def named_buffers(self):
        return iter(self._named("_buffers"))

    def parameters(self):
        return iter(t for _, t in self._named("_parameters"))

    def buffers(self):
        return iter(t for _, t in self._named("_buffers"))

    def modules(self):
        return iter(m for _, m in self.named_modules())

    def tie_weights(self):
        pass

    def eval(self):
        return self

    def set_experts_implementation(self, impl):
        for e in self.experts:
            e.config._experts_implementation = impl

    def _prepare_encoder_inputs(self, input_ids=None, **kw):
        return input_ids, Tensor((1, 1, input_ids.shape[1], input_ids.shape[1]))

    def check_real(self):
        """What a forward needs: nothing on meta, the buffers computed from the config, the weights initialised."""
        for name, t in self._named("_parameters") + self._named("_buffers"):
            assert not t.is_meta and t.device.type == "cuda", name
        assert self.rotary.inv_freq.value == "rope(256)" and not self.rotary.original_inv_freq.is_meta
        assert self.rotary.per_type["full_attention"].value == "rope(512)"
        assert self.scalars.layer_scalar.value == 1.0
        assert self.embed.weight.init == "normal" and self.embed.weight.zero_rows == [0]
        assert self.experts[0].gate_up_proj.init == "normal" and self.rest.weight.init == 1.0

    def forward(self, decoder_input_ids=None, self_conditioning_logits=None, decoder_attention_mask=None,
                past_key_values=None, decoder_position_ids=None):
        if "forward" in Model.fail:
            raise Model.fail["forward"]("CUDA out of memory. Tried to allocate 1.00 GiB")
        self.check_real()
        assert decoder_input_ids.shape == (1, 256)
        assert past_key_values.length > 0, "decoder called before the prefill"
        self.decoder_calls.append(self_conditioning_logits is not None)
        Clock.t += FWD_S
        return types.SimpleNamespace(logits=Tensor((1, 256, pt.VOCAB), FakeTorch.float32))

    def generate(self, ids, generation_config=None):
        g = generation_config.kw
        G, N = g["max_new_tokens"], g["max_denoising_steps"]
        assert g["stability_threshold"] == N + 1 and g["eos_token_id"] is None
        if G > 256 and "vllm" in Model.fail:
            raise Model.fail["vllm"]("CUDA out of memory. Tried to allocate 20.00 GiB")
        cache = Cache()
        P = ids.shape[1]
        enc = self.model.encoder.forward if Model.enc_direct else self.model.encoder
        enc(input_ids=ids, past_key_values=cache, position_ids=Tensor((1, P)))
        blocks = min(G // 256, 2) if Model.short else G // 256
        for b in range(blocks):
            if b:
                enc(input_ids=Tensor((1, 256)), past_key_values=cache, position_ids=Tensor((1, 256)))
            for s in range(N):
                self(decoder_input_ids=Tensor((1, 256)), self_conditioning_logits=None, past_key_values=cache)
                Clock.t += SAMPLER_S
        return types.SimpleNamespace(sequences=Tensor((1, P + 256 * blocks)))


class GenConfig:
    def __init__(self, **kw):
        self.kw = kw


def fake_transformers():
    tf = types.ModuleType("transformers")
    tf.__version__ = "5.fake"
    tf.DiffusionGemmaForBlockDiffusion = Model
    tf.DiffusionGemmaConfig = Config
    tf.DynamicCache = Cache
    tf.DiffusionGemmaGenerationConfig = GenConfig
    tf.EntropyBoundSamplerConfig = lambda entropy_bound: ("eb", entropy_bound)
    return tf


class FakeTime:
    """time for peer_transformers: perf_counter on the fake clock, time() real."""

    @staticmethod
    def perf_counter():
        return Clock.t

    time = staticmethod(__import__("time").time)


@contextlib.contextmanager
def faked(torch_ok=True):
    saved = {k: sys.modules.get(k) for k in ("torch", "transformers")}
    sys.modules["torch"] = FakeTorch() if torch_ok else None
    sys.modules["transformers"] = fake_transformers()
    old_time = pt.time
    pt.time = FakeTime
    Clock.t = 0.0
    Encoder.calls = []
    try:
        yield
    finally:
        pt.time = old_time
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


def run_main(args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = pt.main(args)
    return rc, out.getvalue(), err.getvalue()


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(x) for x in f if x.strip()]


# ---- the tests ---------------------------------------------------------------------------------------

class Config26B(unittest.TestCase):
    def test_spec_values(self):
        tc = pt.text_config()
        self.assertEqual((tc["hidden_size"], tc["num_hidden_layers"], tc["vocab_size"]), (2816, 30, 262144))
        self.assertEqual((tc["num_attention_heads"], tc["num_key_value_heads"], tc["num_global_key_value_heads"]),
                         (16, 8, 2))
        self.assertEqual((tc["head_dim"], tc["global_head_dim"], tc["sliding_window"]), (256, 512, 1024))
        self.assertEqual((tc["intermediate_size"], tc["moe_intermediate_size"], tc["num_experts"], tc["top_k_experts"]),
                         (2112, 704, 128, 8))
        full = [i for i, t in enumerate(tc["layer_types"]) if t == "full_attention"]
        self.assertEqual(full, [5, 11, 17, 23, 29])
        self.assertEqual(pt.CANVAS, 256)

    def test_same_as_mkrandom_config(self):
        """Every scalar text_config value mkrandom.c's built-in 26B config.json states is ours too."""
        with open(MKRANDOM_C) as f:
            src = f.read()
        head = src[src.index("static const char REAL_HEAD[]"):src.index("static const char SMALL_CONFIG[]")]
        text = head[head.index('\\"text_config\\"'):]
        pairs = re.findall(r'\\"(\w+)\\": ([-0-9.e]+|true|false|\\"[^\\]*\\")', text)
        self.assertGreaterEqual(len(pairs), 18)
        tc = pt.text_config()
        checked = 0
        for k, v in pairs:
            if k in ("model_type", "dtype"):
                continue
            want = json.loads(v.replace('\\"', '"'))
            self.assertIn(k, tc, k)
            self.assertEqual(tc[k], want, k)
            checked += 1
        self.assertGreaterEqual(checked, 18)
        # the RoPE block (TEXT_IDS_ROPE) and the special ids
        self.assertIn('\\"full_attention\\": {\\"rope_type\\": \\"proportional\\", \\"partial_rotary_factor\\": 0.25, '
                      '\\"rope_theta\\": 1000000.0}', src)
        self.assertEqual(tc["rope_parameters"]["full_attention"],
                         {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0})
        self.assertEqual(tc["rope_parameters"]["sliding_attention"], {"rope_type": "default", "rope_theta": 10000.0})

    def test_weight_count(self):
        n = pt.expected_text_params(pt.text_config())
        self.assertEqual(n, 25250986752)
        self.assertEqual(n + 60, 25250986812)  # docs/cuda.md: mkrandom's count with both sets of layer scalars

    def test_intended_layers(self):
        L = pt.intended_layers(pt.text_config())
        self.assertEqual(L[0], ("sliding_attention", 4096, 2048, True))
        self.assertEqual(L[5], ("full_attention", 8192, 1024, False))


class Arguments(unittest.TestCase):
    def test_protocols(self):
        self.assertEqual(pt.parse_protocols("step,prefill,vllm"), ["step", "prefill", "vllm"])
        self.assertEqual(pt.parse_protocols("vllm, step,vllm,"), ["vllm", "step"])
        self.assertEqual(pt.parse_protocols("all"), list(pt.PROTOCOLS))
        with self.assertRaisesRegex(ValueError, "unknown protocol 'p512'"):
            pt.parse_protocols("step,p512")
        with self.assertRaises(ValueError):
            pt.parse_protocols(" , ")

    def test_defaults_and_refusals(self):
        a = pt.parse_args([])
        self.assertEqual((a.prompt_tokens, a.gen_tokens, a.steps, a.reps, a.warmup, a.experts, a.attn),
                         (1024, 1024, 16, 3, 1, "grouped_mm", "sdpa"))
        self.assertEqual(a.protocol_list, ["prefill", "step", "step_generate", "vllm"])
        for bad in (["--reps", "0"], ["--steps", "1"], ["--gen-tokens", "1000"], ["--warmup", "-1"],
                    ["--protocols", "foo"]):
            with contextlib.redirect_stderr(io.StringIO()) as e, self.assertRaises(SystemExit) as cm:
                pt.parse_args(bad)
            self.assertEqual(cm.exception.code, 2, bad)
            self.assertIn("error", e.getvalue())

    def test_filler_and_prompt(self):
        text = pt.filler_text(BENCH_C)
        self.assertTrue(text.startswith("The harbour town woke slowly. Fishing boats"), text[:60])
        self.assertTrue(text.endswith("apples, cheese, rope and paint. "), text[-40:])
        self.assertEqual(len(text), 397)  # strlen(kFiller) of the C compiler (gcc, 2026-12-06)
        ids = pt.prompt_ids(10, [5, 6, 7])
        self.assertEqual(ids, [2, 5, 6, 7, 5, 6, 7, 5, 6, 7])
        r1, r2 = pt.prompt_ids(1024, None, seed=3), pt.prompt_ids(1024, None, seed=3)
        self.assertEqual(r1, r2)
        self.assertEqual((len(r1), r1[0]), (1024, 2))
        self.assertTrue(all(3 <= x < pt.VOCAB for x in r1[1:]))
        self.assertNotEqual(r1, pt.prompt_ids(1024, None, seed=4))

    def test_temperature(self):
        self.assertAlmostEqual(pt.temperature(16, 16), 0.8)
        self.assertAlmostEqual(pt.temperature(1, 16), 0.425)
        self.assertAlmostEqual(pt.temperature(24, 48), 0.6)  # spec 6.1's middle value


class NoTorch(unittest.TestCase):
    def test_clear_failure(self):
        d = tempfile.mkdtemp(prefix="pe12_")
        self.addCleanup(shutil.rmtree, d, True)
        out = os.path.join(d, "p.jsonl")
        with faked(torch_ok=False):
            rc, so, se = run_main(["--protocols", "step,vllm", "-o", out])
        self.assertEqual(rc, 1)
        self.assertIn("needs PyTorch with CUDA", se)
        rows = read_jsonl(out)
        self.assertEqual([r["protocol"] for r in rows], ["step", "vllm"])
        self.assertTrue(all("needs PyTorch" in r["error"] for r in rows))

    def test_no_gpu(self):
        with faked():
            Cuda.available = False
            try:
                rc, so, se = run_main(["--protocols", "step"])
            finally:
                Cuda.available = True
        self.assertEqual(rc, 1)
        self.assertIn("torch.cuda.is_available() is False", se)


class FakeRun(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="pe12_")
        self.addCleanup(shutil.rmtree, self.dir, True)
        self.out = os.path.join(self.dir, "peer.jsonl")
        Model.fail, Model.untied, Model.cuda_oom, Model.builds = {}, False, False, []
        Model.enc_direct = Model.short = False

    def tearDown(self):
        Model.fail, Model.untied, Model.cuda_oom = {}, False, False
        Model.enc_direct = Model.short = False

    def test_generate_without_encoder_hooks_and_early_stop(self):
        """generate calling the encoder's forward itself: step_generate without a prefill, vllm without encoder
        passes; a generation that stops after 2 canvases: "stopped_early", tok/s of the tokens that came."""
        Model.enc_direct = Model.short = True
        with faked():
            rc, so, se = run_main(["--protocols", "step_generate,vllm", "--reps", "2", "--warmup", "0",
                                   "-o", self.out])
        self.assertEqual(rc, 0, se)
        sg, v = read_jsonl(self.out)
        self.assertNotIn("prefill_median_s", sg)
        self.assertAlmostEqual(sg["step_median_s"], FWD_S + SAMPLER_S, places=9)
        self.assertIn("| step_generate | 1024 | - | - | 81.000 |", so)
        self.assertEqual((v["generated_tokens"], v["forwards"], v["encoder_passes"], v["stopped_early"]),
                         (512, 32, 0, True))
        wall = ENC_S_PER_1024 * (1 + 1 / 4) + 32 * (FWD_S + SAMPLER_S)
        self.assertAlmostEqual(v["tok_per_s"], 512 / wall, places=6)

    def test_all_protocols(self):
        with faked():
            rc, so, se = run_main(["--protocols", "all", "--reps", "3", "--warmup", "1", "-o", self.out])
        self.assertEqual(rc, 0, se + so)
        rows = {r["protocol"]: r for r in read_jsonl(self.out)}
        self.assertEqual(sorted(rows), sorted(pt.PROTOCOLS))
        for r in rows.values():
            self.assertNotIn("error", r)
            self.assertEqual((r["experts_implementation"], r["gpu"], r["device"], r["prompt"]),
                             ("grouped_mm", "Fake H100", "cuda", "random"))
            self.assertEqual(r["text_params"], 25250986752)
            self.assertEqual((r["device_peak_allocated_bytes"], r["device_used_bytes"]), (48 * 2**30, 50 * 2**30))
        pre, st, sg, v = rows["prefill"], rows["step"], rows["step_generate"], rows["vllm"]
        self.assertAlmostEqual(pre["prefill_median_s"], ENC_S_PER_1024, places=9)
        self.assertAlmostEqual(pre["prefill_tok_per_s"], 1024 / ENC_S_PER_1024, places=3)
        # step: forward only (no sampler in this protocol), 15 per run
        self.assertEqual(st["steps_timed"], 45)
        self.assertAlmostEqual(st["step_median_s"], FWD_S, places=9)
        self.assertAlmostEqual(st["step_max_s"], FWD_S, places=9)
        self.assertAlmostEqual(st["prefill_median_s"], ENC_S_PER_1024, places=9)
        # step_generate: forward + sampler, 14 per run; forwards alone 15 per run
        self.assertEqual((sg["steps_timed"], sg["forwards_timed"]), (42, 45))
        self.assertAlmostEqual(sg["step_median_s"], FWD_S + SAMPLER_S, places=9)
        self.assertAlmostEqual(sg["forward_median_s"], FWD_S, places=9)
        self.assertAlmostEqual(sg["prefill_median_s"], ENC_S_PER_1024, places=9)
        # vllm: 1024 tokens, 64 forwards, 4 encoder passes, wall = prefill + 3 commits + 64 (forward + sampler)
        self.assertEqual((v["generated_tokens"], v["blocks"], v["forwards"], v["encoder_passes"]), (1024, 4, 64, 4))
        wall = ENC_S_PER_1024 + 3 * ENC_S_PER_1024 / 4 + 64 * (FWD_S + SAMPLER_S)
        self.assertAlmostEqual(v["median_s"], wall, places=9)
        self.assertAlmostEqual(v["tok_per_s"], 1024 / wall, places=6)
        self.assertNotIn("stopped_early", v)
        # the tables
        self.assertIn("| step | 1024 | 90.000 | 90.000–90.000 | 78.000 | 78.000–78.000 | 45 | - |", so)
        self.assertIn("| step_generate | 1024 | 90.000 | 90.000–90.000 | 81.000 | 81.000–81.000 | 42 | 78.000 |", so)
        self.assertIn("| vllm | 1024 | 1024 | 4 | 64 | 4 | %.3f |" % wall, so)
        self.assertIn("experts implementation grouped_mm (asked grouped_mm)", so)
        self.assertIn("25,250,986,752 text weights (spec: 25,250,986,752)", so)
        # the 26B's text weights + the fake vision weight's 7; the rotary and layer-scalar buffers; the rotary's
        # original_inv_freq alias and its dict-held tensor
        self.assertRegex(so, r"meta build: twin built on the host in [0-9.]+ s; 25,250,986,759 distinct parameter "
                             r"values allocated and initialised on the GPU, 2 buffers and 2 tensor attributes")
        # built on meta, the twin on the host; nothing of the 26B on the host
        self.assertEqual(Model.builds, [("meta", pt.VOCAB), ("cpu", 512)])
        self.assertTrue(all(r["build"] == "meta" for r in rows.values()))

    def test_build_fallbacks(self):
        """meta refused (the encoder untied) -> Transformers' own build on the GPU; that out of memory (an H100)
        -> no model, a row per protocol saying so."""
        Model.untied = True
        with faked():
            rc, so, se = run_main(["--protocols", "prefill", "--reps", "1", "--warmup", "0", "-o", self.out])
        self.assertEqual(rc, 0, se)
        self.assertIn("the encoder's are not tied to the decoder's", so)
        self.assertEqual(read_jsonl(self.out)[0]["build"], "cuda")
        # meta with the tiny vision tower and without one (both refused), then cuda with the tiny one
        self.assertEqual(Model.builds, [("meta", pt.VOCAB), ("meta", pt.VOCAB), ("cuda", pt.VOCAB)])
        Model.cuda_oom, Model.builds = True, []
        with faked():
            rc, so, se = run_main(["--protocols", "prefill,vllm", "-o", self.out])
        self.assertEqual(rc, 1)
        # meta (refused, both vision variants), cuda (out of memory: not tried again without the vision tower)
        self.assertEqual(Model.builds, [("meta", pt.VOCAB), ("meta", pt.VOCAB), ("cuda", pt.VOCAB)])
        rows = read_jsonl(self.out)
        self.assertEqual(len(rows), 2)
        self.assertIn("model not built: meta build: RuntimeError: meta build (vision tiny): RuntimeError: the meta "
                      "model has", rows[0]["error"])
        self.assertIn("| cuda build: RuntimeError: cuda build (vision tiny): out of memory: OOM: CUDA out of memory",
                      rows[0]["error"])

    def test_twin_buffer_shapes_are_checked(self):
        """A twin whose buffer has another shape than the big model's is refused (then the cuda build)."""
        saved = dict(pt.TWIN)
        pt.TWIN["global_head_dim"] = 256
        try:
            with faked():
                rc, so, se = run_main(["--protocols", "prefill", "--reps", "1", "--warmup", "0", "-o", self.out])
        finally:
            pt.TWIN.clear()
            pt.TWIN.update(saved)
        self.assertEqual(rc, 0, se)
        self.assertIn("meta build (vision tiny): RuntimeError: buffer model.decoder.rotary_emb.inv_freq (64,): the "
                      "twin has (32,)", so)
        self.assertEqual(read_jsonl(self.out)[0]["build"], "cuda")

    def test_field_names_are_dgemma_benchs(self):
        """The fields the peer shares with dgemma bench's rows are spelled as tools/bench.c writes them."""
        with open(BENCH_C) as f:
            src = f.read()
        keys = set(re.findall(r'cJSON_Add\w+ToObject\(j, "(\w+)"', src))
        shared = ["protocol", "prompt", "canvas", "prompt_tokens", "generated_tokens", "blocks", "forwards", "warmup",
                  "reps", "median_s", "min_s", "max_s", "tok_per_s", "prefill_median_s", "prefill_min_s",
                  "prefill_max_s", "steps_timed", "step_median_s", "step_min_s", "step_max_s", "device_used_bytes",
                  "device_total_bytes", "device", "gpu"]
        for k in shared:
            self.assertIn(k, keys, k)
        with faked():
            rc, so, se = run_main(["--protocols", "step,vllm", "--reps", "1", "--warmup", "0", "-o", self.out])
        self.assertEqual(rc, 0, se)
        rows = read_jsonl(self.out)
        got = set().union(*[set(r) for r in rows])
        self.assertTrue({k for k in shared if k != "prompt"} <= got, sorted(set(shared) - got))

    def test_out_of_memory_in_one_protocol(self):
        Model.fail = {"vllm": OOM}
        with faked():
            rc, so, se = run_main(["--protocols", "vllm,step", "--reps", "1", "--warmup", "0", "-o", self.out])
        self.assertEqual(rc, 3)
        rows = read_jsonl(self.out)
        self.assertEqual([r["protocol"] for r in rows], ["vllm", "step"])
        self.assertTrue(rows[0]["error"].startswith("out of memory: OOM: CUDA out of memory"), rows[0]["error"])
        self.assertEqual(rows[0]["device_peak_allocated_bytes"], 48 * 2**30)
        self.assertNotIn("error", rows[1])
        self.assertAlmostEqual(rows[1]["step_median_s"], FWD_S, places=9)
        self.assertIn("vllm: out of memory", se)
        self.assertIn("1 of 2 protocols failed", so)

    def test_first_forward_failure_is_reported(self):
        Model.fail = {"forward": ValueError}
        with faked():
            rc, so, se = run_main(["--protocols", "step", "--experts", "eager", "-o", self.out])
        self.assertEqual(rc, 1)
        rows = read_jsonl(self.out)
        self.assertIn("the first forward after the meta build failed: ValueError", rows[0]["error"])
        self.assertIn("the first forward after the cuda build failed: ValueError", rows[0]["error"])

    def test_experts_fallback_to_eager(self):
        """grouped_mm refused at the first forward: eager, and every row says so (peer_ratios flags it)."""
        class Refuse(Model):
            def forward(self, *a, **k):
                if self.experts[0].config._experts_implementation == "grouped_mm":
                    raise RuntimeError("grouped_mm: unsupported dtype")
                return Model.forward(self, *a, **k)
        with faked():
            sys.modules["transformers"].DiffusionGemmaForBlockDiffusion = Refuse
            rc, so, se = run_main(["--protocols", "step", "--reps", "1", "--warmup", "0", "-o", self.out])
        self.assertEqual(rc, 0, se)
        r = read_jsonl(self.out)[0]
        self.assertEqual(r["experts_implementation"], "eager (fallback: grouped_mm failed)")
        self.assertAlmostEqual(r["step_median_s"], FWD_S, places=9)

    def test_deadline(self):
        with faked():
            rc, so, se = run_main(["--protocols", "prefill,vllm", "--reps", "1", "--deadline-s", "1e-9",
                                   "-o", self.out])
        self.assertEqual(rc, 3)
        rows = read_jsonl(self.out)
        self.assertTrue(all(r["error"].startswith("skipped:") for r in rows), rows)


# ---- peer_ratios.py ----------------------------------------------------------------------------------

DG_STEP = {"protocol": "step", "prompt_tokens": 1024, "prefill_median_s": 0.0404, "step_median_s": 0.01254,
           "device_used_bytes": 18885705728, "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}
DG_VLLM = {"protocol": "vllm", "prompt": "filler", "prompt_tokens": 1024, "generated_tokens": 1024,
           "tok_per_s": 1147.05, "device_used_bytes": 19510657024, "device": "cuda", "gpu": "NVIDIA H100 80GB HBM3"}


def peer_rows(gpu="NVIDIA H100 80GB HBM3", experts="grouped_mm"):
    common = {"peer": "transformers", "gpu": gpu, "experts_implementation": experts, "prompt_tokens": 1024,
              "device_peak_allocated_bytes": 50 * 2**30, "device_used_bytes": 52 * 2**30}
    return [dict(common, protocol="prefill", prefill_median_s=0.0900),
            dict(common, protocol="step", prefill_median_s=0.0910, step_median_s=0.0780),
            dict(common, protocol="step_generate", prefill_median_s=0.0920, step_median_s=0.1505),
            dict(common, protocol="vllm", tok_per_s=70.0)]


class Ratios(unittest.TestCase):
    def lines(self, dg, peer):
        return {r["line"].split(":")[0] + ":" + r["line"].split(":")[1][:22]: r for r in pr.ratios(dg, peer)}

    def test_ratios_and_targets(self):
        dg = [{"kind": "run"}, DG_STEP, dict(DG_STEP, prompt_tokens=8192, step_median_s=0.5), DG_VLLM]
        out = pr.ratios([r for r in dg if "protocol" in r], peer_rows())
        by = {r["line"]: r for r in out}
        fwd = by["step after 1024: dgemma vs Transformers' forward (no sampler)"]
        self.assertAlmostEqual(fwd["ratio"], 0.0780 / 0.01254)
        self.assertFalse(fwd["met"])  # 6.2x < 12x
        gen = by["step after 1024: dgemma vs Transformers' generate step (forward + sampler)"]
        self.assertAlmostEqual(gen["ratio"], 0.1505 / 0.01254)
        self.assertTrue(gen["met"])  # 12.0x
        self.assertAlmostEqual(by["prefill of 1024: dgemma vs Transformers' encoder"]["ratio"], 0.09 / 0.0404)
        v = by["vllm protocol (1024 in, 1024 out, 16 steps)"]
        self.assertAlmostEqual(v["ratio"], 1147.05 / 70.0)
        self.assertTrue(v["met"])  # 16.4x
        mem = [r for r in out if r["unit"] == "bytes"]
        self.assertEqual(len(mem), 4)
        t = "\n".join(pr.table(out))
        self.assertIn("| 12.54 ms |", t.replace("12.540 ms", "12.54 ms"))
        self.assertIn("| 16.39x | >= 15x | yes |", t)
        self.assertIn("| 50.00 GiB (52.00 GiB) |", t)

    def test_not_comparable(self):
        out = pr.ratios([DG_STEP, DG_VLLM], peer_rows(gpu="NVIDIA H200", experts="eager (fallback: grouped_mm failed)"))
        for r in out:
            if r["target"]:
                self.assertIsNone(r["met"], r)
                self.assertIn("not comparable: dgemma on NVIDIA H100 80GB HBM3, the peer on NVIDIA H200", r["note"])
                self.assertIn("peer not grouped_mm", r["note"])

    def test_stopped_early_and_wrong_model(self):
        peer = peer_rows()
        peer[3] = dict(peer[3], stopped_early=True, generated_tokens=512)
        peer[1] = dict(peer[1], text_params=3500000)
        by = {r["line"][:20]: r for r in pr.ratios([DG_STEP, DG_VLLM], peer)}
        self.assertIsNone(by["vllm protocol (1024 "]["met"])
        self.assertIn("the peer stopped early (512 tokens)", by["vllm protocol (1024 "]["note"])
        step = [r for r in pr.ratios([DG_STEP, DG_VLLM], peer) if "forward (no sampler)" in r["line"]][0]
        self.assertIsNone(step["met"])
        self.assertIn("the peer has 3,500,000 text weights", step["note"])
        self.assertEqual(pr.TEXT_PARAMS, pt.expected_text_params(pt.text_config()))

    def test_errors_and_missing(self):
        peer = peer_rows()
        peer[3] = {"protocol": "vllm", "error": "out of memory: OutOfMemoryError: CUDA out of memory"}
        out = pr.ratios([DG_STEP], peer)
        v = [r for r in out if r["line"].startswith("vllm")][0]
        self.assertEqual((v["ratio"], v["met"], v["dgemma"], v["peer"]), (None, None, None, None))
        self.assertIn("peer: out of memory", v["note"])
        self.assertIn("no dgemma row", v["note"])

    def test_cli(self):
        d = tempfile.mkdtemp(prefix="pe12_")
        self.addCleanup(shutil.rmtree, d, True)
        a, b, j = (os.path.join(d, x) for x in ("dg.jsonl", "peer.jsonl", "r.jsonl"))
        with open(a, "w") as f:
            f.write('{"kind": "run", "run": "step", "rc": 0}\n' + json.dumps(DG_STEP) + "\n" + json.dumps(DG_VLLM) + "\n")
        with open(b, "w") as f:
            f.write("".join(json.dumps(r) + "\n" for r in peer_rows()))
        so = io.StringIO()
        with contextlib.redirect_stdout(so):
            rc = pr.main([a, b, "--json", j])
        self.assertEqual(rc, 0)
        self.assertIn("| line | dgemma | Transformers | x faster | target | met | note |", so.getvalue())
        self.assertEqual(len(read_jsonl(j)), 9)
        with open(b, "a") as f:
            f.write("not json\n")
        with contextlib.redirect_stderr(io.StringIO()) as e:
            self.assertEqual(pr.main([a, b]), 1)
        self.assertIn("peer.jsonl:5: not JSON", e.getvalue())


if __name__ == "__main__":
    unittest.main()
