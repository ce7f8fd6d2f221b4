#!/usr/bin/env python3
"""peer_transformers.py: Transformers' own DiffusionGemma at the 26B-A4B shapes, timed as `dgemma bench` times.

Issue 12 (item 7) wants dgemma's decoder step and vLLM-protocol throughput as ratios against Transformers
**measured in the same run** (the design notes' "a peer run in the same command"). This script is that peer:
it builds `transformers.DiffusionGemmaForBlockDiffusion` with the exact 26B-A4B shapes of spec 1.2 (hidden 2816,
30 layers [S,S,S,S,S,F] x 5, 16 heads, 8 / 2 KV heads, head dims 256 / 512, window 1024, dense MLP 2112, 128
experts top-8 of width 704, vocabulary 262,144, canvas 256) with random bf16 weights made on the GPU, attention
`sdpa` and the experts implementation `grouped_mm` (its fastest; design.md; --experts), and measures the
protocols below. The build (--build; auto tries them in this order, each with one small forward after it):

  meta   the model constructed on the meta device (no memory; Transformers ties the encoder's text weights to
         the decoder's), then each distinct parameter allocated once on the GPU and initialised as Transformers
         initialises DiffusionGemma (normal(0, 0.02) matrices and expert stacks, the padding row zero, vectors
         one; a seeded CUDA generator), the buffers (rotary inv_freq, layer scalars) copied from a small twin
         built for real on the host (TWIN: narrow widths that no buffer's shape depends on; checked). ~47 GiB.
  cuda   Transformers' own construction and init under torch.device("cuda"). If the class builds the encoder's
         and the decoder's copies of the text weights before tying them (the encoder has its own layer modules:
         mkrandom's 30 encoder layer_scalars), the peak is ~101 GB = 94.06 GiB, design.md's "peak memory 94 GiB"
         of the first run to the hundredth: then an H200 only. (An inference from that arithmetic; the GPU call's
         "meta" build and its per-protocol peaks check it.)

Nothing of the 26B passes through host memory either way. The protocols:

  prefill        the encoder over P (1,024) prompt tokens into a fresh cache (model.model.encoder, as generate
                 calls it); CUDA events; --reps after --warmup.
  step           the prompt's cache prefilled (timed as dgemma's step row does: the prefill of every run), then
                 one canvas of 16 decoder steps, each model(decoder_input_ids=canvas, self_conditioning_logits=z,
                 past_key_values=cache, ...) with z = the previous step's logits / T_s (the first step without
                 self-conditioning, untimed as dgemma's first callback); the step = the interval between the
                 CUDA events recorded before consecutive steps (decoder forward with self-conditioning, LM head,
                 softcap, the division by T_s and the next random canvas): 15 per run, as dgemma's.
                 No sampler (Transformers' sampler runs inside generate; step_generate has it).
  step_generate  generate() of one canvas (256 tokens, 16 fixed steps) after the P-token prompt with the
                 model's forward wrapped: the host times (after torch.cuda.synchronize) of the starts of
                 consecutive decoder forwards: forward + Transformers' own sampler (EntropyBoundSampler,
                 multinomial, entropies, renoise), dgemma's definition of its step (the interval between step
                 callbacks, the host's sampler included): 14 per run (steps 2-16; the last step's end is
                 generate's epilogue, not counted); also each forward alone (15 per run) and the prefill (the
                 encoder call inside generate).
  vllm           vLLM's protocol through generate(): P = 1,024 in, G = 1,024 out (4 canvases), 16 fixed steps
                 (early stop disabled by stability_threshold = 17 > 16, as dgemma's vllm_params), stop ids off
                 (eos_token_id None, the model's generation_config's too; if this version refuses that,
                 [262144], an id the model cannot produce), batch 1, wall time of the call (prefill included;
                 torch.cuda.synchronize on both sides); tok/s = generated tokens / median. The row has the
                 decoder forwards and encoder passes counted (64 and 4 expected) and "stopped_early" if fewer
                 than G tokens came.

Every protocol also records the device memory: torch.cuda.max_memory_allocated / max_memory_reserved since the
protocol began, and total - free of torch.cuda.mem_get_info at its end with its objects still held (dgemma's
"device GiB": the CUDA context, the weights and every buffer). An out-of-memory error (the 26B bf16 weights are
~50.5 GB of an H100's 80) is caught per protocol: it is printed, a row with "error" is written, and the next
protocol runs. Any other error of a protocol is treated the same way (the row says which).

Output: a markdown table per protocol (printed as each finishes) and, with -o FILE, JSON lines, one object per
row, written as each protocol finishes, with dgemma bench's field names where they mean the same (protocol,
prompt_tokens, generated_tokens, warmup, reps, median_s / min_s / max_s, tok_per_s, prefill_median_s,
step_median_s, device_used_bytes, device_total_bytes, device, gpu) and the peer's own (peer, experts_implementation,
...). tools/peer_ratios.py puts dgemma's rows and these side by side.

The prompt: <bos> + the vllm filler text of tools/bench.c (kFiller) tokenized with `tokenizers` from
--tokenizer FILE (the Gemma tokenizer.json), repeated and cut to P, exactly dgemma's filler_prompt; without a
tokenizer, <bos> + seeded uniform ids in [3, 262144) (said in the rows: "prompt": "random").

Needs PyTorch with CUDA and Transformers with DiffusionGemma (written for torch 2.11 and transformers 5.17, the
GPU machine's); without them it says so and exits 1. Exit status: 0 if every protocol ran, 3 if one failed (its
row has "error"), 2 on bad arguments, 1 if the model could not be built.

  python3 tools/peer_transformers.py --protocols step,prefill,vllm --tokenizer .cache/gemma3/tokenizer.json \\
      -o /tmp/peer.jsonl
"""

import argparse
import gc
import json
import math
import os
import random
import re
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# ---- the 26B-A4B shapes (spec 1.1-1.2; the same values as `dgemma mkrandom`'s config, src/writers/mkrandom.c) ----

VOCAB = 262144
CANVAS = 256
PATTERN = "SSSSSF"
N_LAYERS = 30
PAD, EOS, BOS = 0, 1, 2


def layer_types(n=N_LAYERS, pattern=PATTERN):
    """[S,S,S,S,S,F] x 5 as Transformers' layer_types."""
    return ["full_attention" if c == "F" else "sliding_attention" for c in (pattern * n)[:n]]


def text_config():
    """DiffusionGemmaTextConfig's keyword arguments for the 26B-A4B text model (spec 1.2)."""
    return {
        "vocab_size": VOCAB, "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": N_LAYERS,
        "layer_types": layer_types(), "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256,
        "num_global_key_value_heads": 2, "global_head_dim": 512, "sliding_window": 1024,
        "max_position_embeddings": 262144,
        "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                               "rope_theta": 1000000.0}},
        "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0,
        "attention_bias": False, "attention_dropout": 0.0, "use_bidirectional_attention": "vision",
        "tie_word_embeddings": True, "pad_token_id": PAD, "eos_token_id": EOS, "bos_token_id": BOS,
        "initializer_range": 0.02,
    }


# Transformers' class always builds a vision tower (design.md): a tiny one (the text path never reads it) keeps
# the 26B-A4B text model alone in memory; the real checkpoint's tower (0.4-0.5 B parameters) is not built.
TINY_VISION = {"model_type": "gemma4_vision", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16, "patch_size": 4,
               "position_embedding_size": 64, "pooling_kernel_size": 2}


def intended_layers(tc):
    """Per layer (type, query width, key width, has v_proj) as the spec's weight table (3.1) gives them."""
    out = []
    for t in tc["layer_types"]:
        if t == "full_attention":
            d, kv = tc["global_head_dim"], tc["num_global_key_value_heads"]
        else:
            d, kv = tc["head_dim"], tc["num_key_value_heads"]
        out.append((t, tc["num_attention_heads"] * d, kv * d, t != "full_attention"))
    return out


def expected_text_params(tc):
    """The text model's weights (no layer_scalar, no vision tower), counted from the config as spec 3.1 lists
    them: 25,250,986,752 for the 26B-A4B (`dgemma mkrandom`'s 25,250,986,812 adds the 60 layer scalars of the
    decoder and the encoder)."""
    H, V, I = tc["hidden_size"], tc["vocab_size"], tc["intermediate_size"]
    E, IE = tc["num_experts"], tc["moe_intermediate_size"]
    n = V * H + H + H + 3 * I * H  # embedding (tied LM head), final norm, self-conditioning pre_norm and MLP
    for t, q, k, has_v in intended_layers(tc):
        d = tc["global_head_dim"] if t == "full_attention" else tc["head_dim"]
        attn = H * q + H * k + (H * k if has_v else 0) + q * H + 2 * d  # q, k, v, o, q_norm, k_norm
        n += attn + 3 * I * H + E * 2 * IE * H + E * H * IE + E * H + H + E + 7 * H
    return n


# ---- arguments ---------------------------------------------------------------------------------------

PROTOCOLS = ("prefill", "step", "step_generate", "vllm")
BUILDS = ("meta", "cuda")  # build_meta, build_cuda


def parse_protocols(s):
    """The comma-separated list of --protocols, in the order given, duplicates removed; ValueError naming the
    unknown one."""
    out = []
    for p in (x.strip() for x in s.split(",")):
        if not p:
            continue
        if p == "all":
            out += [q for q in PROTOCOLS if q not in out]
            continue
        if p not in PROTOCOLS:
            raise ValueError("unknown protocol %r (%s, all)" % (p, ", ".join(PROTOCOLS)))
        if p not in out:
            out.append(p)
    if not out:
        raise ValueError("no protocol in %r" % s)
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="peer_transformers.py", description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--protocols", default="prefill,step,step_generate,vllm",
                    help="comma-separated, run in this order: %s, or all (default: all four)" % ", ".join(PROTOCOLS))
    ap.add_argument("--prompt-tokens", type=int, default=1024, help="P, the prompt of every protocol (1024)")
    ap.add_argument("--gen-tokens", type=int, default=1024, help="G of the vllm protocol (1024: 4 canvases)")
    ap.add_argument("--steps", type=int, default=16, help="fixed denoising steps per canvas (16)")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per protocol (3)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed runs first (1)")
    ap.add_argument("--seed", type=int, default=0, help="weights, prompt and canvases (0)")
    ap.add_argument("--experts", default="grouped_mm",
                    help="Transformers' experts implementation (grouped_mm, its fastest; eager, ...; 'default': "
                         "whatever Transformers picks)")
    ap.add_argument("--attn", default="sdpa", help="attention implementation (sdpa)")
    ap.add_argument("--build", default="auto", choices=("auto",) + BUILDS,
                    help="meta: built without memory, tied, each distinct weight allocated once on the GPU (~47 GiB); "
                         "cuda: Transformers' construction on the GPU (both encoder and decoder copies before tying, "
                         "~94 GiB: an H200); auto (default): meta, then cuda")
    ap.add_argument("--tokenizer", help="tokenizer.json: the prompt is dgemma's vllm filler (else random ids)")
    ap.add_argument("--bench-c", default=os.path.join(ROOT, "tools", "bench.c"),
                    help="where the filler text is read from (tools/bench.c's kFiller)")
    ap.add_argument("--compile", action="store_true",
                    help="let generate() use torch.compile where it would (default: disable_compile=True, eager)")
    ap.add_argument("--deadline-s", type=float, default=0,
                    help="skip the protocols not started this many seconds after the start (0: none); each skipped "
                         "one gets a row with \"error\"")
    ap.add_argument("-o", "--out", help="JSON lines, one object per row, written as each protocol finishes")
    a = ap.parse_args(argv)
    try:
        a.protocol_list = parse_protocols(a.protocols)
    except ValueError as e:
        ap.error("--protocols: %s" % e)
    for name in ("prompt_tokens", "gen_tokens", "steps", "reps"):
        if getattr(a, name) < 1:
            ap.error("--%s must be >= 1 (got %d)" % (name.replace("_", "-"), getattr(a, name)))
    if a.warmup < 0:
        ap.error("--warmup must be >= 0 (got %d)" % a.warmup)
    if a.steps < 2:
        ap.error("--steps must be >= 2: the step is timed from the second step on (got %d)" % a.steps)
    if a.gen_tokens % CANVAS:
        ap.error("--gen-tokens must be a multiple of the canvas, %d (got %d)" % (CANVAS, a.gen_tokens))
    return a


# ---- the prompt --------------------------------------------------------------------------------------

def filler_text(bench_c):
    """kFiller of tools/bench.c (the vllm and step protocols' prompt text): the C string literals after
    `kFiller =` up to the `;`, concatenated, with \\" \\\\ \\n unescaped."""
    with open(bench_c, encoding="utf-8") as f:
        src = f.read()
    m = re.search(r"kFiller\s*=\s*((?:\s*\"(?:[^\"\\]|\\.)*\")+)\s*;", src)
    if not m:
        raise ValueError("%s: no `kFiller = \"...\";` found" % bench_c)
    parts = re.findall(r"\"((?:[^\"\\]|\\.)*)\"", m.group(1))
    esc = {"n": "\n", "t": "\t", "\"": "\"", "\\": "\\", "'": "'"}
    return "".join(re.sub(r"\\(.)", lambda e: esc.get(e.group(1), e.group(1)), p) for p in parts)


def prompt_ids(P, filler_ids=None, vocab=VOCAB, seed=0):
    """<bos> + filler_ids repeated and cut to P - 1 (dgemma's filler_prompt), or without filler_ids <bos> + P - 1
    seeded uniform ids in [3, vocab)."""
    if filler_ids is not None:
        if not filler_ids:
            raise ValueError("the filler text has no tokens")
        return [BOS] + [filler_ids[i % len(filler_ids)] for i in range(P - 1)]
    r = random.Random(seed)
    return [BOS] + [r.randrange(3, vocab) for _ in range(P - 1)]


def temperature(s, N, t_min=0.4, t_max=0.8):
    """The reference schedule (spec 6.1): T_s = t_min + (t_max - t_min) s / N for s = N (first step) .. 1."""
    return t_min + (t_max - t_min) * s / N


# ---- rows and tables ---------------------------------------------------------------------------------

def spread(ts):
    """(median, min, max) of a non-empty list of seconds."""
    return statistics.median(ts), min(ts), max(ts)


def step_fields(prefix, ts):
    m, lo, hi = spread(ts)
    return {prefix + "_median_s": m, prefix + "_min_s": lo, prefix + "_max_s": hi}


def memory_fields(mem):
    """mem: dict with peak_allocated, peak_reserved, used, total (bytes) or None."""
    if not mem:
        return {}
    return {"device_used_bytes": mem["used"], "device_total_bytes": mem["total"],
            "device_peak_allocated_bytes": mem["peak_allocated"], "device_peak_reserved_bytes": mem["peak_reserved"]}


def make_row(protocol, env, a, **fields):
    """One JSON row: protocol, the run's common fields (env: peer, versions, gpu, implementations, prompt), then
    the protocol's own fields."""
    row = {"protocol": protocol, "peer": "transformers", "canvas": CANVAS, "prompt_tokens": a.prompt_tokens,
           "warmup": a.warmup, "reps": a.reps}
    row.update(env)
    row.update(fields)
    return row


def error_row(protocol, env, a, err, mem=None):
    row = make_row(protocol, env, a, error=err)
    row.update(memory_fields(mem))
    return row


GIB = 1073741824.0


def mem_cells(r):
    if "device_used_bytes" not in r:
        return "- | - | -"
    return "%.2f | %.2f | %.2f" % (r["device_used_bytes"] / GIB, r["device_peak_allocated_bytes"] / GIB,
                                   r["device_peak_reserved_bytes"] / GIB)


MEM_HEAD = "device GiB (total - free) | peak allocated GiB | peak reserved GiB"


def table_lines(r):
    """The markdown table (header, rule, row) of one row, in dgemma bench's units (ms for steps and prefill, s
    and tok/s for the vllm protocol)."""
    p = r["protocol"]
    if "error" in r:
        return ["| protocol | error | %s |" % MEM_HEAD, "|---|---|---|---|---|",
                "| %s | %s | %s |" % (p, r["error"].replace("|", "/").replace("\n", " ")[:300], mem_cells(r))]
    if p == "prefill":
        return ["| protocol | P | prefill median ms | prefill spread ms | prefill tok/s | runs | %s |" % MEM_HEAD,
                "|---|---|---|---|---|---|---|---|---|",
                "| prefill | %d | %.3f | %.3f–%.3f | %.0f | %d | %s |" % (
                    r["prompt_tokens"], r["prefill_median_s"] * 1e3, r["prefill_min_s"] * 1e3,
                    r["prefill_max_s"] * 1e3, r["prompt_tokens"] / r["prefill_median_s"], r["reps"], mem_cells(r))]
    if p in ("step", "step_generate"):
        fwd = ("%.3f" % (r["forward_median_s"] * 1e3)) if "forward_median_s" in r else "-"
        pre = ("%.3f | %.3f–%.3f" % (r["prefill_median_s"] * 1e3, r["prefill_min_s"] * 1e3, r["prefill_max_s"] * 1e3)
               if "prefill_median_s" in r else "- | -")
        return ["| protocol | P | prefill median ms | prefill spread ms | step median ms | step spread ms "
                "| steps timed | forward median ms | %s |" % MEM_HEAD, "|---|---|---|---|---|---|---|---|---|---|---|",
                "| %s | %d | %s | %.3f | %.3f–%.3f | %d | %s | %s |" % (
                    p, r["prompt_tokens"], pre, r["step_median_s"] * 1e3, r["step_min_s"] * 1e3, r["step_max_s"] * 1e3,
                    r["steps_timed"], fwd, mem_cells(r))]
    if p == "vllm":
        passes = r["forwards"] + r["encoder_passes"]
        return ["| protocol | in | out | blocks | forwards | encoder passes | median s | spread s | tok/s | ms/forward "
                "| %s |" % MEM_HEAD, "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
                "| vllm | %d | %d | %d | %d | %d | %.3f | %.3f–%.3f | %.1f | %.1f | %s |" % (
                    r["prompt_tokens"], r["generated_tokens"], r["blocks"], r["forwards"], r["encoder_passes"],
                    r["median_s"], r["min_s"], r["max_s"], r["tok_per_s"],
                    1e3 * r["median_s"] / passes if passes else float("nan"), mem_cells(r))]
    raise ValueError("no table for protocol %r" % p)


class Rows:
    """Rows written as they come: printed as a table, appended to the JSON lines file (flushed)."""

    def __init__(self, path):
        self.rows = []
        self.f = open(path, "w", encoding="utf-8") if path else None

    def add(self, r):
        self.rows.append(r)
        print("\n" + "\n".join(table_lines(r)), flush=True)
        if self.f:
            self.f.write(json.dumps(r, sort_keys=True) + "\n")
            self.f.flush()

    def close(self):
        if self.f:
            self.f.close()


def log(*args):
    print("peer:", *args, flush=True)


def fail(msg):
    print("peer_transformers.py: %s" % msg, file=sys.stderr, flush=True)


# ---- torch side (nothing above needs torch) ----------------------------------------------------------

def is_oom(torch, e):
    t = getattr(torch.cuda, "OutOfMemoryError", None)
    return (t is not None and isinstance(e, t)) or "out of memory" in str(e).lower()


def experts_in_use(model):
    """The experts implementation(s) the model's MoE modules will dispatch on (their configs'
    _experts_implementation; Transformers 5 reads it at forward time), as a sorted list of strings; where the
    modules carry no config, the text config's (then the top config's)."""
    seen = set()
    for mod in model.modules():
        w = getattr(mod, "gate_up_proj", None)
        if w is None or getattr(w, "dim", lambda: 0)() != 3:
            continue
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_experts_implementation"):
            seen.add(str(cfg._experts_implementation))
    if not seen:
        for cfg in (model.config.get_text_config(), model.config):
            if hasattr(cfg, "_experts_implementation"):
                seen.add(str(cfg._experts_implementation))
                break
    return sorted(seen) or ["unknown"]


def set_experts(model, impl):
    """Ask for an experts implementation through the public call, then on every config that has the attribute
    (tools/smallmodel/hfmodel.py set_experts_impl does the same)."""
    try:
        model.set_experts_implementation(impl)
    except Exception:  # noqa: BLE001 - not in this version: the config attributes below
        pass
    cfgs = [model.config, model.config.get_text_config()]
    cfgs += [m.config for m in model.modules() if getattr(m, "config", None) is not None]
    for cfg in {id(c): c for c in cfgs}.values():
        if hasattr(cfg, "_experts_implementation"):
            try:
                cfg._experts_implementation = impl
            except Exception:  # noqa: BLE001
                pass


def from_config(torch, Cls, cfg, a, device):
    """Cls._from_config in bf16 under torch.device(device), with the attention and experts implementations asked
    for (keywords this version refuses are dropped, then set after: set_experts)."""
    kw = {"attn_implementation": a.attn, "dtype": torch.bfloat16}
    if a.experts != "default":
        kw["experts_implementation"] = a.experts
    with torch.device(device):
        try:
            return Cls._from_config(cfg, **kw)
        except TypeError:  # no experts_implementation keyword in this version
            kw.pop("experts_implementation", None)
            try:
                return Cls._from_config(cfg, **kw)
            except TypeError:  # nor dtype / attn_implementation: the constructor under bf16
                cfg._attn_implementation = a.attn
                dt = torch.get_default_dtype()
                torch.set_default_dtype(torch.bfloat16)
                try:
                    return Cls(cfg)
                finally:
                    torch.set_default_dtype(dt)


# The twin of the "meta" build: the same structure at small widths, built for real on the host, whose buffers
# (rotary inv_freq, layer scalars, embedding scales: values Transformers computes from the config, not weights)
# the big model takes. The widths changed here do not enter any buffer's shape (checked: a buffer whose twin has
# another shape fails the build); head_dim, global_head_dim, RoPE and hidden_size (the embedding scale) stay.
TWIN = {"vocab_size": 512, "num_experts": 8, "top_k_experts": 2, "moe_intermediate_size": 64,
        "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1, "num_global_key_value_heads": 1}


def init_param(torch, t, module, gen, std=0.02):
    """Transformers' initialisation of DiffusionGemma (docs/cuda.md, `dgemma mkrandom`'s "Values"): matrices and
    expert stacks ~ normal(0, std), an embedding's padding_idx row zero, every vector (RMSNorm weights,
    router.scale, router.per_expert_scale) one."""
    if t.dim() >= 2:
        t.normal_(0.0, std, generator=gen)
        pad = getattr(module, "padding_idx", None)
        if pad is not None and t.dim() == 2 and 0 <= pad < t.shape[0]:
            t[pad].zero_()
    else:
        t.fill_(1.0)


def twin_tensor(torch, v, tv, where):
    """The twin's tensor tv on the GPU in the meta tensor v's dtype; RuntimeError naming where if it has another
    shape or is missing."""
    if not isinstance(tv, torch.Tensor) or tuple(tv.shape) != tuple(v.shape):
        raise RuntimeError("tensor attribute %s %s: the twin has %s" % (
            where, tuple(v.shape), tuple(tv.shape) if isinstance(tv, torch.Tensor) else None))
    return tv.to(device="cuda", dtype=v.dtype)


def materialize(torch, m, twin, seed):
    """The meta model m made real on the GPU without a second copy of tied weights: each distinct parameter
    (by identity: the encoder's text weights are the decoder's once tied) allocated once on the GPU and
    initialised (init_param, a CUDA generator seeded with seed); every buffer and plain tensor attribute still on
    the meta device copied from the same module path of twin (same shape required), in the meta tensor's dtype.
    Returns (distinct parameters' values, buffers copied, tensor attributes copied)."""
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    memo = {}
    n = nb = nt = 0
    for _, mod in m.named_modules():
        for name, p in list(mod._parameters.items()):
            if p is None:
                continue
            new = memo.get(id(p))
            if new is None:
                t = torch.empty(tuple(p.shape), dtype=p.dtype, device="cuda")
                with torch.no_grad():
                    init_param(torch, t, mod, gen)
                new = torch.nn.Parameter(t, requires_grad=False)
                memo[id(p)] = new
                n += t.numel()
            mod._parameters[name] = new
    twin_mods = dict(twin.named_modules())
    for path, mod in m.named_modules():
        src = twin_mods.get(path)
        for name, b in list(mod._buffers.items()):
            if b is None or not b.is_meta:
                continue
            tb = src._buffers.get(name) if src is not None else None
            if tb is None or tuple(tb.shape) != tuple(b.shape):
                raise RuntimeError("buffer %s.%s %s: the twin has %s" % (
                    path, name, tuple(b.shape), None if tb is None else tuple(tb.shape)))
            mod._buffers[name] = tb.to(device="cuda", dtype=b.dtype)
            nb += 1
        for name, v in list(vars(mod).items()):
            if name.startswith("_"):
                continue
            tv = getattr(src, name, None) if src is not None else None
            if isinstance(v, torch.Tensor) and getattr(v, "is_meta", False):
                setattr(mod, name, twin_tensor(torch, v, tv, "%s.%s" % (path, name)))
                nt += 1
            elif isinstance(v, dict) and any(isinstance(x, torch.Tensor) and getattr(x, "is_meta", False)
                                             for x in v.values()):
                tv = tv if isinstance(tv, dict) else {}
                for k, x in list(v.items()):
                    if isinstance(x, torch.Tensor) and getattr(x, "is_meta", False):
                        v[k] = twin_tensor(torch, x, tv.get(k), "%s.%s[%r]" % (path, name, k))
                        nt += 1
    left = [k for k, t in list(m.named_parameters()) + list(m.named_buffers()) if t.is_meta]
    if left:
        raise RuntimeError("still on the meta device: %s" % left[:5])
    return n, nb, nt


def build_meta(torch, tf, cfg, vision, a, tc):
    """The model built on the meta device (no memory), its weights tied, then materialize(): ~47 GiB on the GPU,
    never the two copies (encoder and decoder) that a build under torch.device("cuda") makes before tying."""
    Cls, Cfg = tf.DiffusionGemmaForBlockDiffusion, tf.DiffusionGemmaConfig
    m = from_config(torch, Cls, cfg, a, "meta")
    try:
        m.tie_weights()
    except Exception as e:  # noqa: BLE001 - _from_config's post_init ties them already
        log("tie_weights on the meta model: %s: %s" % (type(e).__name__, e))
    distinct = {id(p): p.numel() for p in m.parameters()}
    total = sum(distinct.values())
    if total > 1.2 * expected_text_params(tc):
        raise RuntimeError("the meta model has %s distinct parameter values (the spec's text weights: %s): the "
                           "encoder's are not tied to the decoder's" % (format(total, ","),
                                                                       format(expected_text_params(tc), ",")))
    tcfg = Cfg(text_config=dict(tc, **TWIN), vision_config=(dict(vision) if vision else None), canvas_length=CANVAS,
               tie_word_embeddings=True, initializer_range=0.02)
    t0 = time.time()
    twin = from_config(torch, Cls, tcfg, a, "cpu")
    t1 = time.time()
    n, nb, nt = materialize(torch, m, twin, a.seed)
    torch.cuda.synchronize()
    log("meta build: twin built on the host in %.1f s; %s distinct parameter values allocated and initialised on the "
        "GPU, %d buffers and %d tensor attributes from the twin, in %.1f s" % (t1 - t0, format(n, ","), nb, nt,
                                                                              time.time() - t1))
    del twin
    return m


def build_cuda(torch, tf, cfg, a):
    """Transformers' own construction and init under torch.device("cuda"). The encoder's and the decoder's
    copies of the text weights both exist until they are tied (~101 GB = 94 GiB, design.md's "peak 94 GiB"):
    an H200 only."""
    m = from_config(torch, tf.DiffusionGemmaForBlockDiffusion, cfg, a, "cuda")
    torch.cuda.synchronize()
    where = sorted({str(p.device.type) for p in list(m.parameters()) + list(m.buffers())})
    if "meta" in where:  # not initialised (and the rotary buffers with them): no honest way on from here
        raise RuntimeError("parameters or buffers on the meta device after building under torch.device('cuda')")
    if where != ["cuda"]:
        log("built on %s, not the GPU (torch.device('cuda') ignored): moving the weights over" % where)
        m.to("cuda")
    return m


def build(torch, tf, a, way):
    """(model, info): the 26B-A4B model in bf16 on the GPU, eval mode, built the way asked: "meta" (built without
    memory, tied, each distinct weight allocated once on the GPU and initialised as Transformers does, buffers
    from a small twin) or "cuda" (Transformers' own construction on the GPU: both copies before tying, an H200
    only). A tiny vision tower first, then none (design.md: the class builds one)."""
    Cfg = tf.DiffusionGemmaConfig
    tc = text_config()
    want = intended_layers(tc)
    errors = []
    for vision in (TINY_VISION, None):
        try:
            cfg = Cfg(text_config=dict(tc), vision_config=(dict(vision) if vision else None), canvas_length=CANVAS,
                      tie_word_embeddings=True, initializer_range=0.02)
        except Exception as e:  # noqa: BLE001 - the next vision variant
            errors.append("config (vision %s): %s: %s" % ("tiny" if vision else "none", type(e).__name__, e))
            continue
        torch.manual_seed(a.seed)
        t0 = time.time()
        m = None
        try:
            m = build_meta(torch, tf, cfg, vision, a, tc) if way == "meta" else build_cuda(torch, tf, cfg, a)
        except Exception as e:  # noqa: BLE001 - the next vision variant
            oom = is_oom(torch, e)
            errors.append("%s build (vision %s): %s%s: %s" % (way, "tiny" if vision else "none",
                                                             "out of memory: " if oom else "", type(e).__name__,
                                                             str(e)[:300]))
            log(errors[-1])
            del e
            gc.collect()
            torch.cuda.empty_cache()
            if oom:  # it will not fit with another vision tower either
                break
            continue
        torch.cuda.synchronize()
        got = [(t, L.self_attn.q_proj.out_features, L.self_attn.k_proj.out_features,
                getattr(L.self_attn, "v_proj", None) is not None)
               for t, L in zip(tc["layer_types"], m.model.decoder.layers)]
        if got != want or len(m.model.decoder.layers) != len(want):
            bad = [(i, g, w) for i, (g, w) in enumerate(zip(got, want)) if g != w][:3]
            raise RuntimeError("layer shapes differ from the spec's (layer, got, wanted): %s; %d layers built"
                               % (bad, len(m.model.decoder.layers)))
        if a.experts != "default" and experts_in_use(m) != [a.experts]:
            set_experts(m, a.experts)
        m.eval()
        n = sum(p.numel() for name, p in m.named_parameters() if "vision" not in name and "layer_scalar" not in name)
        info = {"build_s": time.time() - t0, "build": way, "vision": "tiny gemma4_vision" if vision else "none",
                "text_params": n, "text_params_expected": expected_text_params(tc),
                "weights_bytes": sum(p.numel() * p.element_size() for p in m.parameters()),
                "dtypes": sorted({str(p.dtype).replace("torch.", "") for p in m.parameters()}),
                "allocated": torch.cuda.memory_allocated()}
        return m, info
    raise RuntimeError("; ".join(errors))


class Peer:
    """The model, its device and the helpers the protocols share."""

    def __init__(self, torch, tf, model, a):
        self.torch, self.tf, self.m, self.a = torch, tf, model, a
        self.dev = next(model.parameters()).device
        self.C = CANVAS
        self.V = VOCAB
        self.enc_prepare = True  # model._prepare_encoder_inputs usable (decided on the first call)
        self.dec_mask = True     # decoder.create_diffusion_decoder_attention_mask usable
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(a.seed)

    def new_cache(self):
        return self.tf.DynamicCache(config=self.m.config.get_text_config(decoder=True))

    def canvas(self):
        return self.torch.randint(self.V, (1, self.C), device=self.dev, generator=self.gen)

    def encode(self, cache, ids):
        """The encoder over ids [1, n] appended to cache at positions 0..n-1, masks as generate's prefill makes
        them (model._prepare_encoder_inputs where it exists; else the encoder builds its causal mask)."""
        torch = self.torch
        n = ids.shape[1]
        pos = torch.arange(0, n, dtype=torch.int32, device=self.dev).unsqueeze(0)
        mask = None
        if self.enc_prepare:
            try:
                _, mask = self.m._prepare_encoder_inputs(
                    input_ids=ids, attention_mask=torch.ones((1, n), dtype=torch.bool, device=self.dev),
                    encoder_position_ids=pos, past_key_values=cache, is_prefill=True, canvas_length=self.C,
                    batch_size=1)
            except Exception as e:  # noqa: BLE001 - this version has no such helper: the encoder's own mask
                log("model._prepare_encoder_inputs unusable (%s: %s): the encoder builds its mask" % (
                    type(e).__name__, str(e)[:200]))
                self.enc_prepare = False
                mask = None
        self.m.model.encoder(input_ids=ids, attention_mask=mask, past_key_values=cache, position_ids=pos)

    def decode(self, cache, canvas, P, sc):
        """One decoder step over canvas [1, C] at positions P..P+C-1 reading cache (left unchanged), with
        self-conditioning logits sc (None on a block's first step); the logits [1, C, V]."""
        torch = self.torch
        mm = torch.ones((1, P + self.C), dtype=torch.bool, device=self.dev)
        if self.dec_mask:
            try:
                mm = self.m.model.decoder.create_diffusion_decoder_attention_mask(
                    config=self.m.config, inputs_embeds=canvas.unsqueeze(-1), past_key_values=cache,
                    decoder_attention_mask=mm)
            except Exception as e:  # noqa: BLE001 - pass the 2D mask as make_goldens.py's decode does
                log("create_diffusion_decoder_attention_mask unusable (%s: %s): passing the 2D mask" % (
                    type(e).__name__, str(e)[:200]))
                self.dec_mask = False
        pos = torch.arange(P, P + self.C, dtype=torch.int32, device=self.dev).unsqueeze(0)
        out = self.m(decoder_input_ids=canvas, self_conditioning_logits=sc, decoder_attention_mask=mm,
                     past_key_values=cache, decoder_position_ids=pos)
        return out.logits

    def gen_config(self, G, eos):
        """generate()'s config: G tokens, --steps fixed steps (stability_threshold = steps + 1), the reference
        sampler's other defaults (spec 1.3), stop ids eos."""
        try:
            from transformers import DiffusionGemmaGenerationConfig as GC, EntropyBoundSamplerConfig as SC
        except ImportError:
            from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
                DiffusionGemmaGenerationConfig as GC, EntropyBoundSamplerConfig as SC)
        kw = dict(max_new_tokens=G, max_denoising_steps=self.a.steps, sampler_config=SC(entropy_bound=0.1),
                  t_min=0.4, t_max=0.8, stability_threshold=self.a.steps + 1, confidence_threshold=0.005,
                  eos_token_id=eos, pad_token_id=PAD, bos_token_id=BOS)
        opt = dict(return_dict_in_generate=True)
        if not self.a.compile:
            opt["disable_compile"] = True
        try:
            return GC(**kw, **opt)
        except (TypeError, ValueError):
            return GC(**kw)

    def memory(self):
        torch = self.torch
        free, total = torch.cuda.mem_get_info(self.dev)
        return {"used": total - free, "total": total, "peak_allocated": torch.cuda.max_memory_allocated(self.dev),
                "peak_reserved": torch.cuda.max_memory_reserved(self.dev)}


def run_prefill(peer, ids):
    torch, a = peer.torch, peer.a
    ts = []
    mem = None
    for r in range(a.warmup + a.reps):
        cache = peer.new_cache()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        e0.record()
        peer.encode(cache, ids)
        e1.record()
        e1.synchronize()
        if r >= a.warmup:
            ts.append(e0.elapsed_time(e1) * 1e-3)
        if r == a.warmup + a.reps - 1:
            mem = peer.memory()  # the last run's cache still held
        del cache
    f = step_fields("prefill", ts)
    f["prefill_tok_per_s"] = a.prompt_tokens / f["prefill_median_s"]
    return f, mem


def run_step(peer, ids):
    """Each run: a fresh cache, the prefill (CUDA events), then --steps decoder steps on that cache; events before
    every step and after the last; steps 2..N timed (N - 1 per run)."""
    torch, a = peer.torch, peer.a
    P, N = a.prompt_tokens, a.steps
    pre, stp = [], []
    mem = None
    for r in range(a.warmup + a.reps):
        cache = peer.new_cache()
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(N + 3)]
        torch.cuda.synchronize()
        ev[0].record()
        peer.encode(cache, ids)
        ev[1].record()
        canvas, sc = peer.canvas(), None
        for k in range(N):  # s = N - k remaining steps
            ev[2 + k].record()
            logits = peer.decode(cache, canvas, P, sc)
            sc = logits.float() / temperature(N - k, N)
            canvas = peer.canvas()
        ev[N + 2].record()
        ev[N + 2].synchronize()
        if r >= a.warmup:
            pre.append(ev[0].elapsed_time(ev[1]) * 1e-3)
            stp += [ev[2 + k].elapsed_time(ev[3 + k]) * 1e-3 for k in range(1, N)]
        if r == a.warmup + a.reps - 1:
            mem = peer.memory()
        del cache, logits, sc, canvas
    f = step_fields("prefill", pre)
    f.update(step_fields("step", stp))
    f["steps_timed"] = len(stp)
    f["timing"] = "cuda events; step k = the event before step k to the one before step k+1 (after the last)"
    return f, mem


class Marks:
    """model.forward replaced by a wrapper (generate calls it for every decoder step; make_goldens.py does the
    same) and hooks on model.model.encoder: counts the calls and, with sync, the host times after
    torch.cuda.synchronize at each decoder forward's start and end and each encoder call's start and end."""

    def __init__(self, peer, sync):
        self.peer, self.sync = peer, sync
        self.dec, self.enc = [], []  # (start, end) host seconds
        self.handles = []
        m = peer.m
        orig = m.forward
        torch = peer.torch

        def now():
            if sync:
                torch.cuda.synchronize()
            return time.perf_counter()

        def fwd(*args, **kwargs):
            t0 = now()
            out = orig(*args, **kwargs)
            self.dec.append((t0, now()))
            return out

        def pre(mod, args):
            self.enc.append([now(), None])

        def post(mod, args, out):
            self.enc[-1][1] = now()

        m.forward = fwd
        self.handles.append(m.model.encoder.register_forward_pre_hook(pre))
        self.handles.append(m.model.encoder.register_forward_hook(post))

    def remove(self):
        for h in self.handles:
            h.remove()
        try:
            del self.peer.m.forward
        except AttributeError:
            pass


# Stop ids off: None first (no stop ids; the model's generation_config has them set to None too, so that
# generate does not fill them in), then [262144], an id the model cannot produce (tried second: an id out of the
# vocabulary that some code indexed with would be a device-side assert, which ends the process's CUDA context).
# Either way a generation that stopped early shows: fewer new tokens than asked, "stopped_early" in the row.
EOS_CHOICES = (None, [VOCAB])


def generate_once(peer, ids, G, marks_sync, seed):
    """One generate() call with Marks installed: (wall seconds, new tokens, Marks). Stop ids: the first of
    EOS_CHOICES this version accepts (remembered on peer)."""
    torch = peer.torch
    choices = [peer.eos] if hasattr(peer, "eos") else list(EOS_CHOICES)
    try:
        peer.m.generation_config.eos_token_id = None
    except Exception:  # noqa: BLE001
        pass
    last = None
    for eos in choices:
        gc_ = peer.gen_config(G, eos)
        mk = Marks(peer, marks_sync)
        try:
            torch.manual_seed(seed)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = peer.m.generate(ids, generation_config=gc_)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
        except (TypeError, ValueError, IndexError) as e:
            if is_oom(torch, e) or hasattr(peer, "eos"):
                raise
            last = e
            log("generate with eos_token_id=%r failed (%s: %s); trying the next" % (
                eos, type(e).__name__, str(e)[:200]))
            continue
        finally:
            mk.remove()
        if not hasattr(peer, "eos"):
            peer.eos = eos
            log("generate: stop ids %r" % (eos,))
        seqs = out if torch.is_tensor(out) else out.sequences
        return t1 - t0, int(seqs.shape[1] - ids.shape[1]), mk
    raise last


def run_step_generate(peer, ids):
    a = peer.a
    N = a.steps
    pre, stp, fwd = [], [], []
    mem = None
    for r in range(a.warmup + a.reps):
        _, new, mk = generate_once(peer, ids, CANVAS, True, a.seed + r)
        if len(mk.dec) != N:
            raise RuntimeError("generate of one canvas made %d decoder forwards (wanted %d; %d encoder calls, %d new "
                               "tokens)" % (len(mk.dec), N, len(mk.enc), new))
        if r >= a.warmup:
            if mk.enc and mk.enc[0][1] is not None:  # the prefill, if generate called the encoder module
                pre.append(mk.enc[0][1] - mk.enc[0][0])
            starts = [d[0] for d in mk.dec]
            stp += [starts[k + 1] - starts[k] for k in range(1, N - 1)]
            fwd += [d[1] - d[0] for d in mk.dec[1:]]
        if r == a.warmup + a.reps - 1:
            mem = peer.memory()
    f = step_fields("prefill", pre) if pre else {}
    f.update(step_fields("step", stp))
    f.update(step_fields("forward", fwd))
    f["steps_timed"] = len(stp)
    f["forwards_timed"] = len(fwd)
    f["timing"] = ("host, torch.cuda.synchronize at each decoder forward's start and end inside generate(); step k "
                   "= start of forward k to start of forward k+1, k = 2..N-1 (forward + Transformers' sampler)")
    return f, mem


def run_vllm(peer, ids):
    """generate() of G tokens after the prompt, --warmup + --reps times (seed + run), each timed whole. The rows'
    counts are the timed runs' (the last one's if they differ: then "runs" lists every timed run's (tokens,
    forwards, encoder passes), tok_per_s is the median of the runs' own, and "stopped_early" is set)."""
    a = peer.a
    G = a.gen_tokens
    ts, runs = [], []
    for r in range(a.warmup + a.reps):
        wall, new, mk = generate_once(peer, ids, G, False, a.seed + r)
        if r >= a.warmup:
            ts.append(wall)
            runs.append((new, len(mk.dec), len(mk.enc)))
    mem = peer.memory()
    new, forwards, enc = runs[-1]
    m, lo, hi = spread(ts)
    f = {"prompt": "filler" if peer.filler else "random", "generated_tokens": new, "blocks": -(-new // CANVAS),
         "forwards": forwards, "encoder_passes": enc, "median_s": m, "min_s": lo, "max_s": hi,
         "tok_per_s": new / m, "timing": "host, torch.cuda.synchronize before and after generate()"}
    if len(set(runs)) > 1:
        f["runs"] = [list(x) for x in runs]
        f["tok_per_s"] = statistics.median(x[0] / t for x, t in zip(runs, ts))
    if min(x[0] for x in runs) < G:
        f["stopped_early"] = True
    return f, mem


def first_forward(torch, peer, env, a, ids_list):
    """One small forward (16 prompt tokens, one decoder step) before any protocol: a lurking meta tensor or an
    experts implementation that refuses bf16 on this GPU fails here, not mid-protocol. In the latter case the
    experts go eager and env says so. None if it ran, else the error as text."""
    ids = torch.tensor([ids_list[:16]], dtype=torch.long, device=peer.dev)

    def run():
        with torch.no_grad():
            c = peer.new_cache()
            peer.encode(c, ids)
            peer.decode(c, peer.canvas(), 16, None)
            del c
        torch.cuda.synchronize()
    try:
        run()
        return None
    except Exception as e:  # noqa: BLE001
        import traceback
        traceback.print_exc()
        first = "%s: %s" % (type(e).__name__, str(e)[:400])
        if a.experts in ("eager", "default") or is_oom(torch, e) or "meta" in str(e):
            return first
    log("a first forward failed with experts implementation %s (%s): eager instead; the rows say so" % (
        env["experts_implementation"], first))
    set_experts(peer.m, "eager")
    env["experts_implementation"] = "%s (fallback: %s failed)" % (",".join(experts_in_use(peer.m)), a.experts)
    try:
        run()
        return None
    except Exception as e:  # noqa: BLE001
        return "%s; with eager experts: %s: %s" % (first, type(e).__name__, str(e)[:400])


RUNNERS = {"prefill": run_prefill, "step": run_step, "step_generate": run_step_generate, "vllm": run_vllm}


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    t_start = time.time()
    rows = Rows(a.out)

    def setup_failed(msg):
        """Says why on stderr, writes an error row per protocol (tools/peer_ratios.py shows them), returns 1."""
        fail(msg)
        for p in a.protocol_list:
            rows.add(error_row(p, {"device": "cuda"}, a, msg))
        rows.close()
        return 1

    try:
        import torch
    except ImportError as e:
        return setup_failed("needs PyTorch with CUDA (import torch: %s). This is a GPU-machine script (torch 2.11, "
                            "transformers 5.17 there); the development machine has neither." % e)
    try:
        import transformers as tf
        tf.DiffusionGemmaForBlockDiffusion  # noqa: B018 - a Transformers without DiffusionGemma fails here
        tf.DiffusionGemmaConfig  # noqa: B018
        tf.DynamicCache  # noqa: B018
    except (ImportError, AttributeError) as e:
        return setup_failed("needs Transformers with DiffusionGemma (DiffusionGemmaForBlockDiffusion; 5.17 on the "
                            "GPU machine): %s: %s" % (type(e).__name__, e))
    if not torch.cuda.is_available():
        return setup_failed("torch.cuda.is_available() is False: no GPU, or a CPU-only PyTorch (torch %s)"
                            % torch.__version__)
    gpu = torch.cuda.get_device_name(0)
    log("torch %s, transformers %s, %s (%.1f GiB)" % (torch.__version__, tf.__version__, gpu,
                                                      torch.cuda.mem_get_info(0)[1] / GIB))
    filler = None
    if a.tokenizer:
        try:
            from tokenizers import Tokenizer
            text = filler_text(a.bench_c)
            filler = Tokenizer.from_file(a.tokenizer).encode(text, add_special_tokens=False).ids
            log("prompt: <bos> + dgemma's vllm filler (%d tokens from %s), repeated to %d" % (
                len(filler), a.tokenizer, a.prompt_tokens))
        except Exception as e:  # noqa: BLE001 - random ids instead, said in the rows
            log("no filler prompt (%s: %s): random ids" % (type(e).__name__, e))
            filler = None
    env = {"device": "cuda", "gpu": gpu, "torch_version": torch.__version__, "transformers_version": tf.__version__,
           "dtype": "bfloat16", "attn_implementation": a.attn, "experts_requested": a.experts,
           "prompt": "filler" if filler else "random", "seed": a.seed}
    ids_list = prompt_ids(a.prompt_tokens, filler, VOCAB, a.seed)
    errors = []
    peer = model = None
    for way in (BUILDS if a.build == "auto" else (a.build,)):
        if errors and "out of memory" in errors[-1] and way == "cuda" and "cuda build" in errors[-1]:
            continue
        try:
            model, info = build(torch, tf, a, way)
        except Exception as e:  # noqa: BLE001 - the next way
            errors.append("%s build: %s: %s" % (way, type(e).__name__, str(e)[:700]))
            del e
            continue
        env.update({"experts_implementation": ",".join(experts_in_use(model)), "text_params": info["text_params"],
                    "vision_tower": info["vision"], "weights_bytes": info["weights_bytes"], "build": info["build"]})
        log("model built (%s) in %.1f s, %.2f GiB allocated: %s text weights (spec: %s%s), %.2f GiB of weights "
            "(%s), vision tower: %s; experts implementation %s (asked %s), attention %s" % (
                info["build"], info["build_s"], info["allocated"] / GIB, format(info["text_params"], ","),
                format(info["text_params_expected"], ","),
                "" if info["text_params"] == info["text_params_expected"] else ": DIFFERENT",
                info["weights_bytes"] / GIB, "/".join(info["dtypes"]), info["vision"], env["experts_implementation"],
                a.experts, a.attn))
        peer = Peer(torch, tf, model, a)
        peer.filler = filler is not None
        err = first_forward(torch, peer, env, a, ids_list)
        if err is None:
            break
        errors.append("the first forward after the %s build failed: %s" % (way, err))
        log(errors[-1])
        peer = model = None
        gc.collect()
        torch.cuda.empty_cache()
    if peer is None:
        msg = "model not built: " + " | ".join(errors)
        fail(msg)
        for p in a.protocol_list:
            rows.add(error_row(p, env, a, msg[:1500]))
        rows.close()
        return 1
    ids = torch.tensor([ids_list], dtype=torch.long, device=peer.dev)
    failed = 0
    for p in a.protocol_list:
        if a.deadline_s > 0 and time.time() - t_start > a.deadline_s:
            rows.add(error_row(p, env, a, "skipped: %.0f s after the start, past --deadline-s %.0f" % (
                time.time() - t_start, a.deadline_s)))
            failed += 1
            continue
        log("%s ..." % p)
        t0 = time.time()
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(peer.dev)
        err = None
        try:
            with torch.no_grad():
                fields, mem = RUNNERS[p](peer, ids)
        except Exception as e:  # noqa: BLE001 - one protocol's failure (OOM above all) does not end the others
            err = "%s%s: %s" % ("out of memory: " if is_oom(torch, e) else "", type(e).__name__, str(e)[:600])
            import traceback
            traceback.print_exc()
        if err is not None:
            try:
                mem = peer.memory()  # the peak that failed; what is in use before the clean-up
            except Exception:  # noqa: BLE001
                mem = None
            gc.collect()
            torch.cuda.empty_cache()
            fail("%s: %s" % (p, err))
            rows.add(error_row(p, env, a, err, mem))
            failed += 1
            continue
        r = make_row(p, env, a, **fields)
        r.update(memory_fields(mem))
        r["wall_s"] = time.time() - t0
        rows.add(r)
    rows.close()
    log("done in %.1f s; %d of %d protocols failed" % (time.time() - t_start, failed, len(a.protocol_list)))
    return 3 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
