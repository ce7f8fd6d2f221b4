"""Model-side helpers for the small DiffusionGemma: config, construction, the training forward
paths, export to a Hugging Face directory and the reload/generate check.

Everything here goes through Transformers' own DiffusionGemma classes
(transformers.DiffusionGemmaForBlockDiffusion). The one re-implementation, the optional
training forward of fastfwd.py (Forward(impl="own")), runs over the same parameters and is
only used after consistency_check has compared it with Transformers' forward.
"""

import copy
import inspect
import json
import os
import shutil
import time

import torch

import common

# ---- configuration ----------------------------------------------------------------------

# The default small config: every architectural feature of DiffusionGemma kept (sliding + full
# layers, K=V on full layers, GQA, partial "proportional" rope on full layers, dense MLP + top-k
# MoE in every layer, self-conditioning, tied embeddings, final softcap).
DEFAULTS = {
    "hidden": 256, "layers": 6, "pattern": "SSFSSF", "heads": 4, "kv_heads": 2, "head_dim": 64,
    "global_kv_heads": 1, "global_head_dim": 128, "intermediate": 512, "moe_intermediate": 128,
    "experts": 8, "top_k": 2, "window": 512, "canvas": 64, "softcap": 30.0,
}

# A tiny Gemma-4 vision tower, used only if this Transformers version cannot build the model
# without one (vision_config=None). The text engine ignores it.
TINY_VISION = {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "patch_size": 4,
               "position_embedding_size": 64, "pooling_kernel_size": 2}

# Reference sampler defaults (spec section 1.3).
GEN_DEFAULTS = {"max_new_tokens": 256, "max_denoising_steps": 48, "entropy_bound": 0.1, "t_min": 0.4,
                "t_max": 0.8, "stability_threshold": 1, "confidence_threshold": 0.005,
                "eos_token_id": list(common.STOP_IDS), "pad_token_id": common.PAD, "bos_token_id": common.BOS}


def add_arch_args(ap):
    g = ap.add_argument_group("architecture (defaults: the bundled model)")
    for k, v in DEFAULTS.items():
        g.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)


def text_config_dict(vocab_size, a):
    n = a.layers
    pat = (a.pattern * n)[:n]
    layer_types = ["full_attention" if c == "F" else "sliding_attention" for c in pat]
    if layer_types[-1] != "full_attention":
        raise ValueError("the last layer must be full attention (pattern %r)" % a.pattern)
    return {
        "vocab_size": vocab_size, "hidden_size": a.hidden, "intermediate_size": a.intermediate,
        "num_hidden_layers": n, "layer_types": layer_types,
        "num_attention_heads": a.heads, "num_key_value_heads": a.kv_heads, "head_dim": a.head_dim,
        "num_global_key_value_heads": a.global_kv_heads, "global_head_dim": a.global_head_dim,
        "sliding_window": a.window, "max_position_embeddings": 131072,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                               "rope_theta": 1000000.0}},
        "num_experts": a.experts, "top_k_experts": a.top_k, "moe_intermediate_size": a.moe_intermediate,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "final_logit_softcapping": a.softcap,
        "attention_bias": False, "attention_dropout": 0.0, "use_bidirectional_attention": "vision",
        "tie_word_embeddings": True, "pad_token_id": common.PAD, "eos_token_id": common.EOS,
        "bos_token_id": common.BOS, "initializer_range": 0.02,
    }


def build_config(vocab_size, a, vision):
    from transformers import DiffusionGemmaConfig
    return DiffusionGemmaConfig(text_config=text_config_dict(vocab_size, a),
                                vision_config=(dict(TINY_VISION) if vision else None),
                                canvas_length=a.canvas, tie_word_embeddings=True, initializer_range=0.02)


def _instantiate(config, experts=None):
    from transformers import DiffusionGemmaForBlockDiffusion as Cls
    kw = {"experts_implementation": experts} if experts else {}
    try:
        m = Cls._from_config(config, attn_implementation="sdpa", dtype=torch.float32, **kw)
    except TypeError:
        config._attn_implementation = "sdpa"
        m = Cls(config)
        if experts:
            set_experts_impl(m, experts)
    return m.float()


def new_model(vocab_size, a, vision="auto", seed=0, log=print, experts=None):
    """(model, config): a freshly initialised fp32 model with sdpa attention.
    vision: "none" | "tiny" | "auto" (try without a vision tower first).
    experts: None (Transformers' default) or an experts implementation name."""
    torch.manual_seed(seed)
    tries = {"none": [False], "tiny": [True], "auto": [False, True]}[vision]
    err = None
    for with_vision in tries:
        try:
            config = build_config(vocab_size, a, with_vision)
            m = _instantiate(config, experts)
        except Exception as e:  # noqa: BLE001 - report and fall back to the tiny vision tower
            err = e
            log("building with vision=%s failed: %s: %s" % (with_vision, type(e).__name__, e))
            continue
        log("model built %s vision tower" % ("with a tiny" if with_vision else "without a"))
        ensure_tied(m, log)
        return m, config
    raise err


def load_model(path, dtype=torch.bfloat16, log=print):
    from transformers import DiffusionGemmaForBlockDiffusion as Cls
    try:
        m, info = Cls.from_pretrained(path, dtype=dtype, attn_implementation="sdpa", output_loading_info=True)
    except TypeError:
        m, info = Cls.from_pretrained(path, torch_dtype=dtype, attn_implementation="sdpa",
                                      output_loading_info=True)
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    log("loaded %s (%s)%s" % (path, dtype, (": loading info %s" % {k: sorted(map(str, v))[:8] for k, v in bad.items()})
                              if bad else ", no missing/unexpected keys"))
    ensure_tied(m, log)
    return m, info


def ensure_tied(model, log=print):
    """The encoder's text weights are the decoder's and lm_head is the decoder embedding (spec 3.1).
    Check that, tie again if needed, and return the number of weights that had to be re-tied."""
    enc = model.model.encoder.language_model
    dec = model.model.decoder
    decp = dict(dec.named_parameters())

    def untied():
        out = [n for n, p in enc.named_parameters() if n in decp and decp[n] is not p]
        if model.lm_head.weight is not dec.embed_tokens.weight:
            out.append("lm_head.weight")
        return out

    bad = untied()
    if bad:
        model.tie_weights()
        bad = untied()
    fixed = len(bad)
    for n in bad:
        if n == "lm_head.weight":
            model.lm_head.weight = dec.embed_tokens.weight
            continue
        mod_path, attr = n.rsplit(".", 1)
        setattr(enc.get_submodule(mod_path), attr, decp[n])
    if untied():
        raise RuntimeError("could not tie encoder/decoder weights: %s" % untied()[:5])
    if fixed:
        log("re-tied %d encoder/decoder weights by hand" % fixed)
    return fixed


def experts_impl(model):
    return getattr(model.config.get_text_config(), "_experts_implementation", None)


def set_experts_impl(model, impl, log=print):
    """Switch the MoE experts implementation (Transformers 5 dispatches on config._experts_implementation
    at forward time; its default is "grouped_mm")."""
    try:
        model.set_experts_implementation(impl)
    except Exception:  # noqa: BLE001 - older/newer API: set the config attribute directly
        pass
    cfgs = [model.config, model.config.get_text_config()]
    cfgs += [m.config for m in model.modules() if getattr(m, "config", None) is not None]
    for cfg in {id(c): c for c in cfgs}.values():
        if hasattr(cfg, "_experts_implementation"):
            try:
                cfg._experts_implementation = impl
            except Exception:  # noqa: BLE001
                pass
    log("experts implementation now %r" % experts_impl(model))


def with_experts_fallback(model, fn, what, log=print):
    """Run fn(); if it raises while a non-eager experts implementation is active, switch to "eager"
    and run it again (the grouped_mm kernels may not take every dtype/device combination)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001
        cur = experts_impl(model)
        if cur in (None, "eager"):
            raise
        log("%s failed with experts implementation %r (%s: %s); retrying with eager"
            % (what, cur, type(e).__name__, str(e)[:300]))
        set_experts_impl(model, "eager", log)
        return fn()


def probe_forward(model, log=print):
    """One tiny forward (no autocast) so that an unusable experts implementation is replaced now."""
    dev = next(model.parameters()).device
    V = model.config.text_config.vocab_size
    C = model.config.canvas_length

    def run():
        with torch.no_grad():
            model(input_ids=torch.tensor([[common.BOS, common.TURN]], device=dev),
                  decoder_input_ids=torch.randint(V, (1, C), device=dev))
    with_experts_fallback(model, run, "probe forward (%s)" % next(model.parameters()).dtype, log)
    log("experts implementation: %r; attention: %r" % (experts_impl(model),
                                                       getattr(model.config, "_attn_implementation", None)))


def count_params(model):
    total = sum(p.numel() for p in model.parameters())
    vision = sum(p.numel() for n, p in model.named_parameters() if ".vision_tower." in n or ".embed_vision." in n)
    return total, total - vision, vision


def softcap(x, cap):
    return torch.tanh(x / cap) * cap


# ---- forward paths used by training and evaluation ---------------------------------------

def decoder_mask(b, L, C):
    """4D boolean masks for the decoder when the encoder ran over the whole sequence [B, L]:
    canvas queries see context keys j < b[row] and every canvas key (bidirectional)."""
    B = b.shape[0]
    ctx = torch.arange(L, device=b.device)[None, :] < b[:, None]
    m = torch.cat([ctx, torch.ones(B, C, dtype=torch.bool, device=b.device)], 1)
    m = m[:, None, None, :].expand(B, 1, C, L + C)
    return {"full_attention": m, "sliding_attention": m}


class Forward:
    """Training forward with one encoder pass shared by the two decoder passes (fast path:
    model.model.encoder returns `encoder_kv` and the decoder takes `encoder_kv=`), or, if this
    Transformers version lacks that, the public DiffusionGemmaForBlockDiffusion.forward."""

    def __init__(self, model, log=print, impl="public"):
        """impl "public": Transformers' forward (or its encoder_kv fast path where it exists);
        impl "own": fastfwd.OwnForward over the same parameters (checked by consistency_check)."""
        self.m = model
        self.cap = model.config.text_config.final_logit_softcapping
        dec_params = inspect.signature(model.model.decoder.forward).parameters
        self.own = None
        if impl == "own":
            import fastfwd
            try:
                self.own = fastfwd.OwnForward(model)
            except Exception as e:  # noqa: BLE001 - report and use Transformers' forward
                log("our own forward could not be built (%s: %s): using the public forward" % (type(e).__name__, e))
        self.hf_fast = "encoder_kv" in dec_params
        self.fast = self.own is not None or self.hf_fast
        self.hf_sc_mask_ok = ("self_conditioning_mask" in dec_params and
                              "self_conditioning_mask" in inspect.signature(model.forward).parameters)
        self.sc_mask_ok = self.own is not None or self.hf_sc_mask_ok
        log("training forward: %s; self_conditioning_mask %s" % (
            "our own (fastfwd.py: encoder once, dense tiny MoE, flash attention)" if self.own is not None else
            "fast path (encoder once, encoder_kv tensors to the decoder)" if self.fast else "public forward",
            "supported" if self.sc_mask_ok else "not supported (rows split)"))

    def use_public(self):
        """Fall back to Transformers' public forward."""
        self.own = None
        self.fast = False
        self.sc_mask_ok = self.hf_sc_mask_ok

    def logits(self, h):
        return softcap(self.m.lm_head(h).float(), self.cap)

    def encode(self, seq):
        """(state, encoder_logits_or_None). The encoder is causal over the whole sequence."""
        if self.own is not None:
            return self.own.encode(seq), None
        if not self.fast:
            return {"seq": seq}, None
        out = self.m.model.encoder(input_ids=seq)
        kv = getattr(out, "encoder_kv", None)
        if kv is None:
            self.fast = False
            return {"seq": seq}, None
        return {"kv": kv, "h": out.last_hidden_state}, None

    @staticmethod
    def detach(state):
        if "kv" in state:
            return {"kv": [(k.detach(), v.detach()) for k, v in state["kv"]]}
        return state

    def _call(self, state, canvas, mask, pos, sc, scm):
        kw = {"decoder_input_ids": canvas, "decoder_attention_mask": mask, "decoder_position_ids": pos}
        if sc is not None:
            kw["self_conditioning_logits"] = sc
            if scm is not None:
                kw["self_conditioning_mask"] = scm
        if "kv" in state and self.own is not None:
            m = mask["full_attention"] if isinstance(mask, dict) else mask
            return self.own.decode(state, canvas, m, pos, sc, scm), None
        if "kv" in state:
            h = self.m.model.decoder(encoder_kv=state["kv"], **kw).last_hidden_state
            return self.logits(h), None
        out = self.m(input_ids=state["seq"], **kw)
        return out.logits.float(), getattr(out, "encoder_last_hidden_state", None)

    def decode(self, state, canvas, mask, pos, sc=None, scm=None):
        """(logits [B, C, V] fp32 softcapped, encoder hidden or None (public path only))."""
        if sc is None or scm is None or self.sc_mask_ok:
            return self._call(state, canvas, mask, pos, sc, scm)
        # no per-row mask: run the rows with and without self-conditioning separately
        B = canvas.shape[0]
        on = scm.nonzero().flatten()
        off = (~scm).nonzero().flatten()
        logits = None
        hid = None
        for rows, use in ((on, True), (off, False)):
            if rows.numel() == 0:
                continue
            sub = self._rows(state, rows)
            m = {k: v[rows] for k, v in mask.items()}
            lg, h = self._call(sub, canvas[rows], m, pos[rows], sc[rows] if use else None, None)
            if logits is None:
                logits = lg.new_empty((B,) + lg.shape[1:])
                if h is not None:
                    hid = h.new_empty((B,) + h.shape[1:])
            logits[rows] = lg
            if h is not None and hid is not None:
                hid[rows] = h
        return logits, hid

    @staticmethod
    def _rows(state, rows):
        if "kv" in state:
            return {"kv": [(k[rows], v[rows]) for k, v in state["kv"]]}
        return {"seq": state["seq"][rows]}


@torch.no_grad()
def consistency_check(model, seq, resp_start, C, log=print, sc_check=True, impl="public", train_fwd=None):
    """On one chat sequence (fp32, eval mode), compare the decoder logits of the second response
    block (or the first if there is one) computed three ways:
      A. training fast path: encoder over the whole sequence, decoder masked to the prefix;
      B. public forward in training mode (no cache) with the same mask and positions;
      C. inference: encoder over the prefix only into a DynamicCache, decoder reads the cache.
    Also with self-conditioning logits. Returns the max abs differences."""
    tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        return _consistency_check(model, seq, resp_start, C, log, sc_check, impl, train_fwd)
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def _consistency_check(model, seq, resp_start, C, log, sc_check, impl="public", train_fwd=None):
    from transformers import DynamicCache
    was_training = model.training
    model.eval()
    dev = next(model.parameters()).device
    V = model.config.text_config.vocab_size
    L = len(seq)
    b = resp_start + C if L - resp_start > C else resp_start
    s = torch.tensor([seq], device=dev)
    g = torch.Generator(device="cpu").manual_seed(0)
    canvas = torch.randint(V, (1, C), generator=g).to(dev)
    pos = (b + torch.arange(C, device=dev))[None]
    mask = decoder_mask(torch.tensor([b], device=dev), L, C)
    fwd = Forward(model, log=lambda *_: None, impl=impl)
    res = {}
    sc = None
    if fwd.own is not None:
        # The AR co-loss reads the encoder's last hidden state: find out whether Transformers'
        # encoder returns it before or after the final norm, and check ours against it.
        hf_h = getattr(model(input_ids=s, decoder_input_ids=canvas, decoder_attention_mask=mask,
                             decoder_position_ids=pos), "encoder_last_hidden_state", None)
        if hf_h is not None:
            diffs = {}
            scale = hf_h.float().abs().max().item() or 1.0
            for normed in (True, False):  # relative to the largest |value|: raw states are large
                fwd.own.ar_normed = normed
                diffs[normed] = (fwd.own.encode(s)["h"].float() - hf_h.float()).abs().max().item() / scale
            fwd.own.ar_normed = min(diffs, key=diffs.get)
            if train_fwd is not None and train_fwd.own is not None:
                train_fwd.own.ar_normed = fwd.own.ar_normed
            res["encoder_hidden"] = {"fast_vs_public": diffs[fwd.own.ar_normed], "fast_vs_cache": 0.0,
                                     "public_vs_cache": 0.0}
            log("own forward: encoder last hidden state %s the final norm (max relative diff %.2e; other %.2e)"
                % ("after" if fwd.own.ar_normed else "before", diffs[fwd.own.ar_normed],
                   diffs[not fwd.own.ar_normed]))
    for tag in (("plain", "self-conditioned") if sc_check else ("plain",)):
        st, _ = fwd.encode(s)
        a, _ = fwd.decode(st, canvas, mask, pos, sc)
        kw = {} if sc is None else {"self_conditioning_logits": sc}
        bb = model(input_ids=s, decoder_input_ids=canvas, decoder_attention_mask=mask, decoder_position_ids=pos,
                   **kw).logits.float()
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        c = model(input_ids=s[:, :b], past_key_values=cache, decoder_input_ids=canvas, **kw).logits.float()
        res[tag] = {"fast_vs_public": (a - bb).abs().max().item(), "fast_vs_cache": (a - c).abs().max().item(),
                    "public_vs_cache": (bb - c).abs().max().item()}
        sc = c / 0.8  # a temperature-scaled signal, as the sampler would pass
    model.train(was_training)
    worst = max(max(v.values()) for v in res.values())
    log("consistency (fp32, context %d of %d, canvas %d, training path %s): %s -> %s" % (
        b, L, C, "fast" if fwd.fast else "public",
        json.dumps({k: {kk: "%.2e" % vv for kk, vv in v.items()} for k, v in res.items()}),
        "OK" if worst < 2e-3 else "MISMATCH"))
    return res, worst


# ---- export ----------------------------------------------------------------------------

def make_generation_config():
    try:
        from transformers import DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig
    except ImportError:
        from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
            DiffusionGemmaGenerationConfig, EntropyBoundSamplerConfig)
    d = GEN_DEFAULTS
    return DiffusionGemmaGenerationConfig(
        max_new_tokens=d["max_new_tokens"], max_denoising_steps=d["max_denoising_steps"],
        sampler_config=EntropyBoundSamplerConfig(entropy_bound=d["entropy_bound"]), t_min=d["t_min"],
        t_max=d["t_max"], stability_threshold=d["stability_threshold"],
        confidence_threshold=d["confidence_threshold"], eos_token_id=d["eos_token_id"],
        pad_token_id=d["pad_token_id"], bos_token_id=d["bos_token_id"])


def export(model, out_dir, tokenizer_dir, a, shard_mib=15, log=print):
    """Save a standard Hugging Face directory: config.json, generation_config.json, bf16 safetensors
    (sharded with model.safetensors.index.json when larger than shard_mib MiB), tokenizer.json and
    tokenizer_config.json. `model` is cast to bf16 in place."""
    t0 = time.time()
    os.makedirs(out_dir, exist_ok=True)
    for fn in os.listdir(out_dir):
        if fn.endswith(".safetensors") or fn == "model.safetensors.index.json":
            os.remove(os.path.join(out_dir, fn))
    model.to(torch.bfloat16)
    gen = make_generation_config()
    model.generation_config = gen
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out_dir, max_shard_size=shard_mib * 2**20)
    gen.save_pretrained(out_dir)
    # config.json: keep what Transformers wrote, add the explicit full-layer geometry keys
    cpath = os.path.join(out_dir, "config.json")
    with open(cpath) as f:
        cfg = json.load(f)
    tc = cfg.setdefault("text_config", {})
    added = []
    for k, v in (("global_head_dim", a.global_head_dim), ("num_global_key_value_heads", a.global_kv_heads)):
        if tc.get(k) is None:
            tc[k] = v
            added.append(k)
    cfg["architectures"] = ["DiffusionGemmaForBlockDiffusion"]
    with open(cpath, "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
    # generation_config.json: check the reference defaults are all stated explicitly
    gpath = os.path.join(out_dir, "generation_config.json")
    with open(gpath) as f:
        g = json.load(f)
    want = dict(GEN_DEFAULTS)
    want.pop("entropy_bound")
    fixed_g = [k for k, v in want.items() if g.get(k) != v]
    for k in fixed_g:
        g[k] = want[k]
    sc = g.get("sampler_config")
    if not isinstance(sc, dict) or sc.get("entropy_bound") != GEN_DEFAULTS["entropy_bound"]:
        g["sampler_config"] = {"entropy_bound": GEN_DEFAULTS["entropy_bound"], "_cls_name": "EntropyBoundSamplerConfig"}
        fixed_g.append("sampler_config")
    with open(gpath, "w") as f:
        json.dump(g, f, indent=2, sort_keys=True)
    for fn in ("tokenizer.json", "tokenizer_config.json"):
        src = os.path.join(tokenizer_dir, fn)
        if os.path.exists(src) and os.path.abspath(src) != os.path.abspath(os.path.join(out_dir, fn)):
            shutil.copy(src, os.path.join(out_dir, fn))
    files = sorted(os.listdir(out_dir))
    sizes = {fn: os.path.getsize(os.path.join(out_dir, fn)) for fn in files}
    log("exported %s in %.1fs: %s%s%s" % (out_dir, time.time() - t0,
                                          ", ".join("%s %.2f MiB" % (k, v / 2**20) for k, v in sizes.items()),
                                          "; added to config.json: %s" % added if added else "",
                                          "; set in generation_config.json: %s" % fixed_g if fixed_g else ""))
    return sizes


def generate_answers(model, tok, questions, seed=0, batch=None, max_new_tokens=None, log=None):
    """Reference-sampler answers with Transformers' own generate (default generation config).
    batch=None: one call per question; otherwise left-padded batches with an attention_mask.
    Returns [(generated_ids_until_stop, text)], and tokens_per_forward (list or None)."""
    enc = lambda t: tok.encode(t, add_special_tokens=False).ids  # noqa: E731
    dev = next(model.parameters()).device
    prompts = [common.prompt_ids(enc, q) for q in questions]
    out, tpf = [], []
    bs = batch or 1
    kw = {} if max_new_tokens is None else {"max_new_tokens": max_new_tokens}
    for i in range(0, len(prompts), bs):
        chunk = prompts[i:i + bs]
        P = max(len(p) for p in chunk)
        ids = torch.tensor([[common.PAD] * (P - len(p)) + p for p in chunk], device=dev)
        am = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in chunk], device=dev)
        torch.manual_seed(seed + i)
        if len(chunk) > 1 or batch:
            kw2 = dict(kw, attention_mask=am)
        else:
            kw2 = kw
        try:
            gc = copy.deepcopy(model.generation_config)
            gc.return_dict_in_generate = True  # to get tokens_per_forward
            res = model.generate(ids, generation_config=gc, **kw2)
        except (TypeError, ValueError, AttributeError) as e:
            if log:
                log("generate with return_dict_in_generate failed (%s: %s); plain call" % (type(e).__name__, e))
            torch.manual_seed(seed + i)
            res = model.generate(ids, **kw2)
        seqs = res if torch.is_tensor(res) else res.sequences
        t = None if torch.is_tensor(res) else getattr(res, "tokens_per_forward", None)
        for r in range(len(chunk)):
            gen = common.cut_at_stop(seqs[r, P:].tolist())
            out.append((gen, tok.decode(gen, skip_special_tokens=False)))
            tpf.append(None if t is None else float(t[r]))
    return out, tpf


def hf_check(out_dir, ref_model, heldout, log=print, n=3):
    """Reload the exported directory with from_pretrained, compare its logits with the in-memory
    bf16 model, and generate a few held-out answers (batch 1 and one left-padded batch)."""
    from tokenizers import Tokenizer
    dev = next(ref_model.parameters()).device
    m, info = load_model(out_dir, torch.bfloat16, log)
    m.to(dev).eval()
    ref_model.eval()
    if experts_impl(m) != experts_impl(ref_model):
        set_experts_impl(m, experts_impl(ref_model), log)
    probe_forward(m, log)
    tok = Tokenizer.from_file(os.path.join(out_dir, "tokenizer.json"))
    enc = lambda t: tok.encode(t, add_special_tokens=False).ids  # noqa: E731
    C = m.config.canvas_length
    V = m.config.text_config.vocab_size
    p = torch.tensor([common.prompt_ids(enc, heldout[0]["question"])], device=dev)
    canvas = torch.randint(V, (1, C), generator=torch.Generator().manual_seed(1)).to(dev)
    with torch.no_grad():
        d = (m(input_ids=p, decoder_input_ids=canvas).logits.float()
             - ref_model(input_ids=p, decoder_input_ids=canvas).logits.float()).abs().max().item()
    log("reloaded vs in-memory bf16 logits: max abs diff %.3g" % d)
    pick = []
    for s in (1, 2, 8):
        pick += [x for x in heldout if x["steps"] == s][:1]
    pick = pick[:n]
    t0 = time.time()
    single, tpf = generate_answers(m, tok, [x["question"] for x in pick], seed=0, log=log)
    batched, _ = generate_answers(m, tok, [x["question"] for x in pick], seed=0, batch=len(pick), log=log)
    samples = []
    for x, (ids1, t1), (_, t2), tp in zip(pick, single, batched, tpf):
        pred = common.parse_final_answer(t1)
        samples.append({"steps": x["steps"], "question": x["question"], "reference": x["answer"],
                        "generated": t1, "generated_batched": t2, "pred": pred, "final": x["final"],
                        "tokens_per_forward": tp})
        log("generate (%d steps) Q: %s\n    A: %r  [pred %s, truth %s]\n    A (left-padded batch): %r"
            % (x["steps"], x["question"], t1[:400], pred, x["final"], t2[:400]))
    log("HF generate check: %d answers in %.1fs" % (len(pick) * 2, time.time() - t0))
    try:
        from transformers import AutoTokenizer
        at = AutoTokenizer.from_pretrained(out_dir)
        msgs = [{"role": "user", "content": pick[0]["question"]}]
        ids = at.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        ok = list(ids) == common.prompt_ids(enc, pick[0]["question"])
        log("AutoTokenizer + chat_template %s the id rendering" % ("matches" if ok else "DIFFERS from"))
    except Exception as e:  # noqa: BLE001 - optional convenience only
        ok = None
        log("AutoTokenizer check skipped: %s: %s" % (type(e).__name__, e))
    return {"reload_max_abs_diff": d,
            "loading_info": {k: (sorted(map(str, v)) if isinstance(v, (list, set, tuple)) else str(v))
                             for k, v in info.items() if v},
            "samples": samples, "autotokenizer_chat_template_ok": ok}
