#!/usr/bin/env python3
"""Stage 3: train the small DiffusionGemma with the block-diffusion objective, export it, check it.

    python3 train.py --data WORK/data --tokenizer WORK/tokenizer --out WORK/train --minutes 6

Objective (our own code, after the public TRL recipe examples/scripts/sft_diffusion_gemma.py and
the spec, section 5):
  * each example is a token sequence starting with <bos>: a chat conversation rendered by ids
    (common.chat_ids: prompt, answer, <turn|>) or a window of Shakespeare text;
  * a block boundary b is drawn: for chat, b = response_start + k * C with k uniform over the
    response's blocks (exactly where generation starts each canvas); for Shakespeare, b uniform in
    [1, len - C];
  * the clean canvas is the C tokens from b, filled with <eos> past the end of the response;
  * corruption level t ~ U(eps, 1) per example; each canvas position is replaced, with probability
    t, by a token drawn uniformly from the whole vocabulary (no mask token);
  * the encoder runs once, causally, over the whole clean sequence; the decoder sees the encoder
    K/V of positions < b only (4D mask) plus the whole canvas, at positions b .. b+C-1;
  * self-conditioning: a first no-grad decoder pass gives logits (softcapped, not
    temperature-scaled); the second pass is conditioned on them for a random half of the examples;
  * loss = mean cross-entropy over all C canvas positions (corrupted or not) + ar_weight * the
    autoregressive next-token loss of the encoder (lm_head on the encoder's last hidden state).
AdamW with fp32 master weights, bf16 autocast on CUDA, linear warmup then cosine decay over
--schedule-steps global steps (one schedule across runs) or, without it, over this run's time
budget (--minutes) or --max-steps. The loss is logged to train_log.csv every --log-every steps.
At the end the model is exported (hfmodel.export) to OUT/model, reloaded with from_pretrained and
checked with Transformers' own generate (hfmodel.hf_check).

One schedule across many time-boxed runs (each GPU command is limited to 10 minutes):
    train.py ... --schedule-steps 8000 --ckpt CK --minutes 8          # run 1: fresh, saves CK
    train.py ... --resume-train CK --ckpt CK --minutes 8              # run 2, 3, ...: continue
--ckpt writes a checkpoint (ckpt.py: weights, AdamW state, global step, random states, data
sampler and curriculum state, the run config) every --ckpt-every steps and at the end, and
appends the run log to CK/train_log.csv. --resume-train restores all of it: the same learning-rate
schedule (no new warm-up), the same data and noise streams; the schedule, data and model settings
come from the checkpoint (command-line values that differ are reported and ignored). Every
--probe-every steps the log gets a probe accuracy (probe.py: greedy decoding of the first
--probe-n validation problems, never the held-out set), and each logged row has examples/s,
tokens/s, TFLOP/s (runlog.step_flops) and MFU against --peak-tflops (or the detected GPU's).
"""

import argparse
import csv
import json
import math
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import runlog  # noqa: E402
import schedule  # noqa: E402

os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="train the small DiffusionGemma")
    ap.add_argument("--data", required=True, help="prepare_data.py output")
    ap.add_argument("--tokenizer", required=True, help="dir with tokenizer.json (+ tokenizer_config.json)")
    ap.add_argument("--out", required=True, help="output dir: model/, train_log.csv, train_summary.json")
    ap.add_argument("--minutes", type=float, default=6.0, help="training-loop time budget (0: no limit)")
    ap.add_argument("--max-steps", type=int, default=0, help="step budget (0: no limit)")
    ap.add_argument("--resume", default=None, help="continue from an exported model directory")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--grad-clip", type=float, default=1.0)
    ap.add_argument("--eps", type=float, default=1e-3, help="minimum corruption level")
    ap.add_argument("--sc-prob", type=float, default=0.5, help="self-conditioning probability")
    ap.add_argument("--ar-weight", type=float, default=1.0, help="weight of the encoder AR co-loss")
    ap.add_argument("--mix", default="problems:0.65,gsm8k:0.1,shakespeare:0.25",
                    help="rows per batch by source (fractions); sources: problems, gsm8k, shakespeare and the "
                         "curriculum pools of prepare_data.py (ops1: single operations, short: 2-3 steps)")
    ap.add_argument("--mix-schedule", default=None,
                    help="curriculum: source shares by global step, 'STEP=src:p,...;STEP=src:p,...' (linear "
                         "between keypoints, first STEP 0); replaces --mix (schedule.MixSchedule)")
    ap.add_argument("--schedule-steps", type=int, default=0,
                    help="length of the cosine schedule in global steps, spanning resumed runs (0: this run's "
                         "--minutes / --max-steps, as before); needed with --ckpt")
    ap.add_argument("--ckpt", default=None, help="write a training checkpoint here (ckpt.py) every --ckpt-every "
                    "steps and at the end; the run log is appended to CKPT/train_log.csv")
    ap.add_argument("--resume-train", default=None, help="continue the training of a checkpoint directory")
    ap.add_argument("--ckpt-every", type=int, default=500, help="checkpoint every N global steps (0: at the end only)")
    ap.add_argument("--ckpt-dtype", choices=["fp32", "bf16"], default="fp32",
                    help="precision of the saved weights and AdamW moments (fp32: exact resume)")
    ap.add_argument("--ckpt-moments", choices=["keep", "drop"], default="keep")
    ap.add_argument("--probe-every", type=int, default=0, help="probe accuracy every N global steps (0: off)")
    ap.add_argument("--probe-n", type=int, default=200, help="validation problems in the probe")
    ap.add_argument("--probe-iters", type=int, default=8, help="refinement passes per canvas in the probe")
    ap.add_argument("--peak-tflops", type=float, default=0.0,
                    help="peak bf16 TFLOP/s for MFU (0: detect from the GPU name, runlog.PEAK_TFLOPS)")
    ap.add_argument("--amp", choices=["bf16", "off"], default="bf16", help="autocast dtype (CUDA and CPU)")
    ap.add_argument("--compile", choices=["off", "on"], default="off",
                    help="torch.compile our own forward (--forward own; torch 2.x; falls back to eager when the "
                         "probe step fails). Batch lengths are multiples of --len-multiple, so few shapes occur")
    ap.add_argument("--no-export", action="store_true", help="skip the export and HF check at the end")
    ap.add_argument("--batch-mode", choices=["mixed", "single"], default="mixed",
                    help="mixed: every batch has --mix rows of each source; single: each batch is one source, "
                         "drawn with the --mix probabilities (tighter padding)")
    ap.add_argument("--no-truncate", action="store_true",
                    help="keep chat tokens past the canvas (they only feed the encoder's AR loss)")
    ap.add_argument("--len-multiple", type=int, default=32, help="pad batch length to a multiple of this")
    ap.add_argument("--max-len", type=int, default=448, help="drop chat sequences longer than this")
    ap.add_argument("--sh-len", type=int, default=192, help="Shakespeare window length (with <bos>)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--vision", choices=["auto", "none", "tiny"], default="auto")
    ap.add_argument("--experts-impl", choices=["eager", "grouped_mm"], default=None,
                    help="MoE experts implementation (default: Transformers' own, with a fallback to eager)")
    ap.add_argument("--forward", choices=["public", "own"], default="public",
                    help="training forward: Transformers' public forward, or our own (fastfwd.py) over the same "
                         "parameters, checked against it at start-up (falls back to public on a mismatch)")
    ap.add_argument("--no-check", action="store_true", help="skip the consistency and HF checks")
    import hfmodel
    hfmodel.add_arch_args(ap)
    return ap.parse_args(argv)


def log(msg):
    print("train: " + msg, flush=True)


# chat sources: file under --data (prepare_data.py); "shakespeare" is the raw text stream
CHAT_SOURCES = {"problems": "problems_train.jsonl", "gsm8k": "gsm8k_train.jsonl",
                "ops1": "problems_ops1.jsonl", "short": "problems_short.jsonl"}


def load_data(a, tok, C, names=("problems", "gsm8k")):
    """Pre-tokenise the chat sources in `names` and the Shakespeare stream once. Returns numpy-free
    python lists (moved to the device by Batcher)."""
    t0 = time.time()
    cache = {}

    def enc_many(texts):
        todo = [t for t in set(texts) if t not in cache]
        for t, e in zip(todo, tok.encode_batch(todo, add_special_tokens=False)):
            cache[t] = e.ids

    def enc(t):
        if t not in cache:
            cache[t] = tok.encode(t, add_special_tokens=False).ids
        return cache[t]

    groups = {}
    seqs, starts = [], []
    dropped = {}
    unknown = [n for n in names if n not in CHAT_SOURCES and n != "shakespeare"]
    if unknown:
        sys.exit("train: unknown data source(s) %s (known: %s, shakespeare)" % (unknown, ", ".join(CHAT_SOURCES)))
    for name in [n for n in CHAT_SOURCES if n in names]:
        path = os.path.join(a.data, CHAT_SOURCES[name])
        if not os.path.exists(path):
            sys.exit("train: source %s needs %s (prepare_data.py --pools)" % (name, path))
        rows = common.read_jsonl(path)
        enc_many([r["question"] for r in rows] + [r["answer"] for r in rows])
        idx = []
        for r in rows:
            ids, rs = common.chat_ids(enc, r["question"], r["answer"])
            if len(ids) > a.max_len:
                dropped[name] = dropped.get(name, 0) + 1
                continue
            idx.append(len(seqs))
            seqs.append(ids)
            starts.append(rs)
        groups[name] = idx
    cache.clear()
    with open(os.path.join(a.data, "shakespeare_train.txt"), encoding="utf-8") as f:
        lines = f.read().split("\n")
    stream = []
    for i, e in enumerate(tok.encode_batch(lines, add_special_tokens=False)):
        if i:
            stream.append(common.NEWLINE)
        stream.extend(e.ids)
    lens = [len(s) for s in seqs]
    log("data: %s chat sequences (dropped longer than %d: %s), max len %d, mean %.1f; shakespeare %d tokens; "
        "%.1fs" % ({k: len(v) for k, v in groups.items()}, a.max_len, dropped or "none", max(lens),
                   sum(lens) / len(lens), len(stream), time.time() - t0))
    return {"seqs": seqs, "starts": starts, "groups": groups, "stream": stream, "dropped": dropped}


class Batcher:
    """Draws training batches on the device, one block each row. The source shares follow a
    schedule.MixSchedule by global step (set_step): "mixed" batches hold rows of every source in
    proportion, "single" batches are one source drawn with those probabilities. Random draws: the
    device's torch generator and self.rng (random.Random), both saved in checkpoints."""

    def __init__(self, torch, data, mix, B, C, sh_len, device, mode="mixed", truncate=True, len_multiple=1,
                 seed=0):
        import random
        self.t = torch
        self.B, self.C, self.sh_len, self.dev = B, C, sh_len, device
        self.mode, self.truncate, self.mult = mode, truncate, max(1, len_multiple)
        self.rng = random.Random(seed)
        self.sched = mix if isinstance(mix, schedule.MixSchedule) else schedule.MixSchedule(
            ",".join("%s:%r" % (n, p) for n, p in mix))
        mix = self.sched.shares(0)
        seqs = data["seqs"]
        W = max(max(len(s) for s in seqs), sh_len)
        tok = torch.zeros(len(seqs), W, dtype=torch.int32)
        for i, s in enumerate(seqs):
            tok[i, :len(s)] = torch.tensor(s, dtype=torch.int32)
        self.tok = tok.to(device)
        self.len = torch.tensor([len(s) for s in seqs], device=device)
        self.rs = torch.tensor(data["starts"], device=device)
        self.groups = {k: torch.tensor(v, device=device) for k, v in data["groups"].items()}
        self.stream = torch.tensor(data["stream"], device=device)
        self.names = list(self.sched.names)
        self.src_id = {n: i for i, n in enumerate(self.names)}
        # what the sampler's indices refer to: a resumed run on other data continues another stream
        self.fingerprint = {"groups": {k: len(v) for k, v in data["groups"].items()},
                            "tokens": sum(len(x) for x in seqs), "stream": len(data["stream"])}
        self.set_step(0)

    def set_step(self, step):
        """Source shares of global step `step` (the curriculum)."""
        shares = self.sched.shares(step)
        self.plan = [(n, c) for n, c in schedule.batch_counts(shares, self.B) if c > 0]
        self.probs = [(n, p) for n, p in shares if p > 0]

    def next(self):
        """(seq [B, L], lens [B], b [B], tgt [B, C], src [B]). Chat rows are cut after the canvas
        (b + C) unless truncation is off: those tokens only feed the encoder's AR loss. L is rounded
        up to --len-multiple so that few distinct shapes reach the kernels."""
        t, C, dev = self.t, self.C, self.dev
        plan = self.plan
        if self.mode == "single":
            r, acc = self.rng.random() * sum(p for _, p in self.probs), 0.0
            pick = self.probs[-1][0]
            for n, p in self.probs:
                acc += p
                if r < acc:
                    pick = n
                    break
            plan = [(pick, self.B)]
        chat_idx, chat_src, sh_n, sh_src = [], [], 0, None
        for name, n in plan:
            if name == "shakespeare":
                sh_n, sh_src = n, self.src_id[name]
            else:
                g = self.groups[name]
                chat_idx.append(g[t.randint(len(g), (n,), device=dev)])
                chat_src.append(t.full((n,), self.src_id[name], device=dev))
        parts_seq, parts_len, parts_b, parts_src = [], [], [], []
        Lmax = self.sh_len if sh_n else 0
        if chat_idx:
            ci = t.cat(chat_idx)
            cl, rs = self.len[ci], self.rs[ci]
            nb = (cl - rs - 1).clamp(min=0) // C + 1
            k = (t.rand(len(ci), device=dev) * nb).long()
            bb = rs + k * C
            if self.truncate:
                cl = t.minimum(cl, bb + C)
            parts_b.append(bb)
            parts_len.append(cl)
            parts_src.append(t.cat(chat_src))
            Lmax = max(Lmax, int(cl.max()))
            Lmax = min(-(-Lmax // self.mult) * self.mult, self.tok.shape[1])
            seq = self.tok[ci, :Lmax].long()
            if self.truncate:  # tokens past the (truncated) length become padding
                seq = t.where(t.arange(Lmax, device=dev)[None] < cl[:, None], seq, t.zeros_like(seq))
            if seq.shape[1] < Lmax:
                seq = t.nn.functional.pad(seq, (0, Lmax - seq.shape[1]), value=common.PAD)
            parts_seq.append(seq)
        if sh_n:
            M = self.stream.numel()
            s = t.randint(M - self.sh_len + 1, (sh_n,), device=dev)
            body = self.stream[s[:, None] + t.arange(self.sh_len - 1, device=dev)[None]]
            seq = t.cat([t.full((sh_n, 1), common.BOS, device=dev), body], 1)
            seq = t.nn.functional.pad(seq, (0, Lmax - self.sh_len), value=common.PAD)
            parts_seq.append(seq)
            parts_len.append(t.full((sh_n,), self.sh_len, device=dev))
            parts_b.append(t.randint(1, self.sh_len - C + 1, (sh_n,), device=dev))
            parts_src.append(t.full((sh_n,), sh_src, device=dev))
        seq = t.cat(parts_seq)
        lens = t.cat(parts_len)
        b = t.cat(parts_b)
        src = t.cat(parts_src)
        pos = b[:, None] + t.arange(C, device=dev)[None]
        valid = pos < lens[:, None]
        tgt = t.where(valid, seq.gather(1, pos.clamp(max=seq.shape[1] - 1)), t.full_like(pos, common.EOS))
        return seq, lens, b, tgt, src


# Settings a resumed run takes from its checkpoint (they define the schedule, the data stream and the
# model); the command line sets only this run's budget, outputs, probes and implementation choices.
RESUME_KEEP = ("batch", "lr", "min_lr_ratio", "warmup", "weight_decay", "grad_clip", "eps", "sc_prob", "ar_weight",
               "mix", "mix_schedule", "batch_mode", "no_truncate", "len_multiple", "max_len", "sh_len", "seed",
               "schedule_steps", "forward", "amp")


def flop_dims(model):
    """runlog.step_flops dims read from the weights (as fastfwd does): per layer (heads, kv heads,
    head dim, has v_proj)."""
    dec = model.model.decoder
    layers = []
    for layer in dec.layers:
        at = layer.self_attn
        d = at.q_norm.weight.shape[0]
        layers.append((at.q_proj.weight.shape[0] // d, at.k_proj.weight.shape[0] // d, d,
                       getattr(at, "v_proj", None) is not None))
    l0 = dec.layers[0]
    tc = model.config.text_config
    k = getattr(tc, "top_k_experts", None) or tc.to_dict()["top_k_experts"]
    return {"H": dec.embed_tokens.weight.shape[1], "V": dec.embed_tokens.weight.shape[0],
            "I": l0.mlp.gate_proj.weight.shape[0], "Im": l0.experts.gate_up_proj.shape[1] // 2,
            "E": l0.experts.gate_up_proj.shape[0], "k": int(k), "layers": layers}


class Trainer:
    """The training step, its schedule and its state (module doc). Works on any model that
    hfmodel.Forward drives (Transformers' DiffusionGemma, or standin.StandIn with --forward own)."""

    def __init__(self, a, torch, model, fwd, batcher, V, C, dev, log=print):
        self.a, self.t, self.model, self.fwd, self.batcher = a, torch, model, fwd, batcher
        self.V, self.C, self.dev, self.log = V, C, dev, log
        self.params = [p for p in model.parameters() if p.requires_grad]
        decay = [p for p in self.params if p.ndim >= 2]
        no_decay = [p for p in self.params if p.ndim < 2]
        groups = [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        try:
            self.opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.98), eps=1e-8, fused=dev.type == "cuda")
        except (TypeError, RuntimeError):
            self.opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.98), eps=1e-8)
        self.amp = (torch.autocast(device_type=dev.type, dtype=torch.bfloat16) if a.amp == "bf16"
                    else torch.autocast(device_type=dev.type, enabled=False))
        self.step, self.run, self.examples = 0, 0, 0
        self.dims = flop_dims(model)

    # -- the objective ----------------------------------------------------------------------------
    def compute_loss(self, seq, lens, b, tgt):
        """(loss, diffusion loss, ar loss, per-position ce [B, C], rows with self-conditioning)."""
        t, F, a, dev, C, V, fwd = self.t, self.t.nn.functional, self.a, self.dev, self.C, self.V, self.fwd
        B, L = seq.shape
        tlev = a.eps + (1 - a.eps) * t.rand(B, 1, device=dev)
        corrupt = t.rand(B, C, device=dev) < tlev
        noisy = t.where(corrupt, t.randint(V, (B, C), device=dev), tgt)
        pos = b[:, None] + t.arange(C, device=dev)[None]
        import hfmodel
        mask = hfmodel.decoder_mask(b, L, C)
        scm = t.rand(B, device=dev) < a.sc_prob
        with self.amp:
            state, _ = fwd.encode(seq)
            # The first (no-grad) pass is only needed for the rows that use self-conditioning; the
            # other rows get zeros, which the self-conditioning mask ignores.
            sc_rows = scm.nonzero().flatten()
            sc_logits = None
            if sc_rows.numel() > 0:
                with t.no_grad():
                    sub = fwd._rows(fwd.detach(state), sc_rows)
                    sc_sub, _ = fwd.decode(sub, noisy[sc_rows], {k: v[sc_rows] for k, v in mask.items()},
                                           pos[sc_rows])
                    sc_logits = sc_sub.new_zeros((B,) + sc_sub.shape[1:])
                    sc_logits[sc_rows] = sc_sub
            logits, enc_h = fwd.decode(state, noisy, mask, pos, sc_logits, scm if sc_logits is not None else None)
            if enc_h is None:
                enc_h = state.get("h")
        ce = F.cross_entropy(logits.reshape(-1, V), tgt.reshape(-1), reduction="none").view(B, C)
        diff = ce.mean()
        loss = diff
        ar = t.zeros((), device=dev)
        if a.ar_weight > 0 and enc_h is not None:
            with self.amp:
                enc_logits = fwd.logits(enc_h[:, :-1])
            valid = t.arange(1, L, device=dev)[None] < lens[:, None]
            ar_t = t.where(valid, seq[:, 1:], t.full_like(seq[:, 1:], -100))
            ar = F.cross_entropy(enc_logits.reshape(-1, V), ar_t.reshape(-1), ignore_index=-100)
            loss = loss + a.ar_weight * ar
        return loss, diff, ar, ce, int(sc_rows.numel())

    def lr(self, elapsed=0.0):
        a = self.a
        return schedule.lr_at(self.step, a.lr, a.warmup, a.min_lr_ratio, a.schedule_steps, elapsed,
                              a.minutes * 60.0, a.max_steps)

    def train_step(self, elapsed=0.0):
        """One optimizer step at global step self.step. Returns a dict of detached results."""
        lr = self.lr(elapsed)
        for g in self.opt.param_groups:
            g["lr"] = lr
        self.batcher.set_step(self.step)
        seq, lens, b, tgt, src = self.batcher.next()
        self.opt.zero_grad(set_to_none=True)
        loss, diff, ar, ce, n_sc = self.compute_loss(seq, lens, b, tgt)
        loss.backward()
        gn = self.t.nn.utils.clip_grad_norm_(self.params, self.a.grad_clip)
        self.opt.step()
        self.step += 1
        B, L = seq.shape
        self.examples += B
        flops = runlog.step_flops(self.dims, B, L, self.C, n_sc, ar=self.a.ar_weight > 0)
        return {"lr": lr, "loss": loss.detach(), "diffusion": diff.detach(), "ar": ar.detach(), "gn": gn.detach(),
                "ce_rows": ce.detach().mean(1), "src": src, "tokens": B * L, "examples": B, "flops": flops}

    # -- checkpoints ------------------------------------------------------------------------------
    def state(self):
        return {"step": self.step, "run": self.run, "examples": self.examples, "mix_schedule": self.batcher.sched.spec,
                "data": self.batcher.fingerprint}

    def save(self, path, side_dir=None):
        import ckpt
        args = {k: v for k, v in vars(self.a).items()}
        return ckpt.save(path, self.model.state_dict(), self.opt.state_dict(), self.state(),
                         ckpt.rng_state(self.batcher.rng), args, self.a.ckpt_dtype, self.a.ckpt_moments,
                         side_dir=side_dir, log=self.log)

    def restore(self, st, rng=True):
        """Optimizer, step counters and (rng=True) the random streams from a checkpoint; the weights
        are loaded by ckpt.restore_model when the model is built."""
        import ckpt
        ckpt.restore_optimizer(self.opt, st, self.log)
        tr = st["trainer"]
        self.step, self.run, self.examples = tr["step"], tr["run"], tr["examples"]
        if tr.get("data") not in (None, self.batcher.fingerprint):
            self.log("WARNING: the training data differ from the checkpoint's (%s, now %s): the data stream "
                     "does not continue the same" % (tr["data"], self.batcher.fingerprint))
        if rng:
            ckpt.set_rng_state(st["rng"], self.batcher.rng)
        self.batcher.set_step(self.step)


def apply_checkpoint_args(a, st, log):
    """Take RESUME_KEEP and the architecture from the checkpoint's run config; report differences."""
    import hfmodel
    old = st["args"]
    keys = list(RESUME_KEEP) + list(hfmodel.DEFAULTS)
    diff = [(k, getattr(a, k, None), old[k]) for k in keys if k in old and getattr(a, k, None) != old[k]]
    for k in keys:
        if k in old:
            setattr(a, k, old[k])
    if diff:
        log("resumed run keeps the checkpoint's settings: %s" % ", ".join(
            "%s %r (command line %r)" % (k, o, n) for k, n, o in diff))


def maybe_compile(torch, fwd, a, log):
    """torch.compile our own forward's encode/decode (--compile on). Returns an undo function or None."""
    if a.compile != "on":
        return None
    own = fwd.own
    if own is None:
        log("--compile on: only our own forward (--forward own) is compiled; running eagerly")
        return None
    if not hasattr(torch, "compile"):
        log("--compile on: torch %s has no torch.compile; running eagerly" % torch.__version__)
        return None
    enc, dec = own.encode, own.decode
    try:
        import torch._dynamo as dynamo
        dynamo.config.cache_size_limit = max(64, getattr(dynamo.config, "cache_size_limit", 8))
        # dynamic=None (torch's default): a dimension that changes between calls (the batch length,
        # the number of self-conditioned rows in the no-grad pass) is recompiled once as dynamic
        # instead of once per value
        own.encode = torch.compile(enc)
        own.decode = torch.compile(dec)
    except Exception as e:  # noqa: BLE001 - fall back to eager
        own.encode, own.decode = enc, dec
        log("torch.compile failed (%s: %s); running eagerly" % (type(e).__name__, e))
        return None
    log("torch.compile: our own forward's encode and decode (automatic dynamic shapes)")

    def undo():
        own.encode, own.decode = enc, dec
    return undo


class RunLog:
    """Accumulates train_step results between log rows and writes them (runlog.append_log)."""

    def __init__(self, trainer, path, peak, t0):
        self.tr, self.path, self.peak = trainer, path, peak
        self.cols = (["run", "step", "elapsed_s", "lr", "loss", "diffusion", "ar", "grad_norm"]
                     + ["diffusion_" + n for n in trainer.batcher.names]
                     + ["examples_per_s", "tokens_per_s", "tflops_per_s", "mfu", "probe_acc", "probe_acc_12", "mix"])
        self.t0 = self.last_t = t0
        self.reset()

    def reset(self):
        t = self.tr.t
        n = len(self.tr.batcher.names)
        self.acc = {"loss": 0.0, "diffusion": 0.0, "ar": 0.0, "gn": 0.0, "n": 0, "ex": 0, "tok": 0, "flops": 0.0}
        self.src_sum = t.zeros(n, device=self.tr.dev)
        self.src_cnt = t.zeros(n, device=self.tr.dev)

    def add(self, r):
        for k in ("loss", "diffusion", "ar"):
            self.acc[k] += r[k]
        self.acc["gn"] += r["gn"]
        self.acc["n"] += 1
        self.acc["ex"] += r["examples"]
        self.acc["tok"] += r["tokens"]
        self.acc["flops"] += r["flops"]
        self.last_lr = r["lr"]
        with self.tr.t.no_grad():
            self.src_sum.index_add_(0, r["src"], r["ce_rows"].float())
            self.src_cnt.index_add_(0, r["src"], self.tr.t.ones_like(r["ce_rows"]).float())

    def row(self, now, probe=None):
        """Write one row for the steps since the last one; returns it."""
        acc, n = self.acc, max(1, self.acc["n"])
        dt = max(1e-9, now - self.last_t)
        per_src = (self.src_sum / self.src_cnt.clamp(min=1)).tolist()
        shares = self.tr.batcher.sched.shares(self.tr.step)
        r = {"run": self.tr.run, "step": self.tr.step, "elapsed_s": round(now - self.t0, 2), "lr": self.last_lr,
             "loss": float(acc["loss"]) / n, "diffusion": float(acc["diffusion"]) / n, "ar": float(acc["ar"]) / n,
             "grad_norm": float(acc["gn"]) / n, "examples_per_s": round(acc["ex"] / dt, 1),
             "tokens_per_s": round(acc["tok"] / dt, 1), "tflops_per_s": acc["flops"] / dt / 1e12,
             "mfu": runlog.mfu(acc["flops"], dt, self.peak),
             "mix": " ".join("%s:%.3f" % (k, v) for k, v in shares if v > 0)}
        for nm, v in zip(self.tr.batcher.names, per_src):
            r["diffusion_" + nm] = v
        if probe:
            r["probe_acc"], r["probe_acc_12"] = probe["acc"], probe["acc_12"]
        runlog.append_log(self.path, [r], self.cols)
        self.last_t = now
        self.reset()
        return r


def build_model(a, torch, V, st, log):
    """(model, C): from a checkpoint (its config.json, else the architecture args), an exported
    directory (--resume) or fresh."""
    import ckpt
    import hfmodel
    if st is not None:
        cfg_path = os.path.join(a.resume_train, "config.json")
        if os.path.exists(cfg_path):
            from transformers import DiffusionGemmaConfig
            model = hfmodel._instantiate(DiffusionGemmaConfig.from_pretrained(a.resume_train), a.experts_impl)
            hfmodel.ensure_tied(model, log)
        else:
            model, _ = hfmodel.new_model(V, a, a.vision, a.seed, log, experts=a.experts_impl)
        ckpt.restore_model(model, st)
        log("resumed %s: global step %d, run %d" % (a.resume_train, st["trainer"]["step"], st["trainer"]["run"]))
        return model, model.config.canvas_length
    if a.resume:
        model, _ = hfmodel.load_model(a.resume, torch.float32, log)
        model.float()
        if a.experts_impl:
            hfmodel.set_experts_impl(model, a.experts_impl, log)
        with open(os.path.join(a.resume, "config.json")) as f:
            rtc = json.load(f).get("text_config", {})
        a.global_head_dim = rtc.get("global_head_dim") or a.global_head_dim
        a.global_kv_heads = rtc.get("num_global_key_value_heads") or a.global_kv_heads
        return model, model.config.canvas_length
    model, _ = hfmodel.new_model(V, a, a.vision, a.seed, log, experts=a.experts_impl)
    return model, a.canvas


def startup_checks(a, torch, model, fwd, trainer, data, C, log):
    """The probe step (with the experts / own-forward / compile fallbacks) and the consistency check.
    Returns (probe loss, consistency results)."""
    import hfmodel
    batcher = trainer.batcher

    def probe():
        seq, lens, b, tgt, _ = batcher.next()
        loss = trainer.compute_loss(seq[:8], lens[:8], b[:8], tgt[:8])[0]
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss)
    if a.forward == "own" and a.no_check:
        sys.exit("train: --forward own is only used after the start-up consistency check; drop --no-check")
    undo = maybe_compile(torch, fwd, a, log)
    try:
        l0 = hfmodel.with_experts_fallback(model, probe, "training probe step", log)
    except Exception:  # noqa: BLE001 - compiled or own forward failed: fall back
        traceback.print_exc()
        if undo is not None:
            undo()
            log("the compiled forward failed in the probe step: running eagerly")
        elif fwd.own is not None:
            log("our own forward failed in the probe step: training with the public forward")
            fwd.use_public()
        else:
            raise
        l0 = hfmodel.with_experts_fallback(model, probe, "training probe step", log)
    log("probe step ok: loss %.3f (ln V = %.3f); experts implementation %r" % (
        l0, math.log(trainer.V), hfmodel.experts_impl(model)))
    consistency = None
    if a.no_check:
        return l0, consistency
    long_ex = max(data["groups"]["problems"][:5000] if "problems" in data["groups"] else
                  next(iter(data["groups"].values()))[:5000], key=lambda i: len(data["seqs"][i]))
    try:
        consistency, worst = hfmodel.with_experts_fallback(
            model, lambda: hfmodel.consistency_check(model, data["seqs"][long_ex], data["starts"][long_ex], C,
                                                     log, impl=a.forward, train_fwd=fwd), "consistency check", log)
        tol = 2e-3
        fast_bad = any(v["fast_vs_public"] > tol for v in consistency.values())
        if fwd.own is not None and fast_bad:
            fwd.use_public()
            log("our own forward disagrees with Transformers' public forward: training with the public forward")
        elif fwd.fast and fast_bad and all(v["public_vs_cache"] <= tol for v in consistency.values()):
            fwd.use_public()
            log("the fast training path disagrees with the inference path but the public forward agrees: "
                "training with the public forward")
    except Exception as e:  # noqa: BLE001 - report, do not stop the run
        traceback.print_exc()
        consistency = {"error": "%s: %s" % (type(e).__name__, e)}
        log("consistency check FAILED to run: %s" % consistency["error"])
        if fwd.own is not None:
            fwd.use_public()
            log("our own forward is unverified: training with the public forward")
    return l0, consistency


def probe_problems(a):
    """The fixed probe set: --probe-n validation problems spread evenly over the file (25 per step
    count in problems_val.jsonl), never held-out problems."""
    path = os.path.join(a.data, "problems_val.jsonl")
    if a.probe_every <= 0 or not os.path.exists(path):
        return []
    val = common.read_jsonl(path)
    stride = max(1, len(val) // max(1, a.probe_n))
    return val[::stride][:a.probe_n]


def train_loop(a, trainer, rl, probe_fn, ckpt_dir, side_dir, log):
    """Steps until this run's time (--minutes) or step (--max-steps) budget or the end of
    --schedule-steps; logs, probes and checkpoints on global step multiples. Returns (steps, failure)."""
    torch = trainer.t
    budget = a.minutes * 60.0
    t0, first = time.time(), trainer.step
    failure = None
    try:
        while True:
            elapsed = time.time() - t0
            done = trainer.step - first
            if ((budget > 0 and elapsed >= budget) or (a.max_steps > 0 and done >= a.max_steps)
                    or (a.schedule_steps > 0 and trainer.step >= a.schedule_steps)):
                break
            r = trainer.train_step(elapsed)
            rl.add(r)
            s = trainer.step
            probe = probe_fn() if (probe_fn is not None and a.probe_every > 0 and s % a.probe_every == 0) else None
            if s % a.log_every == 0 or s == first + 1 or probe:
                row = rl.row(time.time(), probe)
                if s % (a.log_every * 10) == 0 or s == first + 1 or probe:
                    log("step %d  %.0fs  lr %.2e  loss %.4f  diffusion %.4f  ar %.4f  |g| %.2f  %.0f ex/s  "
                        "%.1f TFLOP/s%s%s" % (
                            s, row["elapsed_s"], row["lr"], row["loss"], row["diffusion"], row["ar"],
                            row["grad_norm"], row["examples_per_s"], row["tflops_per_s"],
                            "" if row["mfu"] is None else "  MFU %.1f%%" % (100 * row["mfu"]),
                            "" if not probe else "  probe %.3f (1-2 steps %.3f)" % (probe["acc"], probe["acc_12"])))
            if ckpt_dir and a.ckpt_every > 0 and s % a.ckpt_every == 0:
                trainer.save(ckpt_dir, side_dir)
    except Exception as e:  # noqa: BLE001 - export what we have, then fail
        failure = e
        traceback.print_exc()
    if rl.acc["n"]:
        rl.row(time.time())
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return trainer.step - first, time.time() - t0, failure


def main(argv=None):
    a = parse_args(argv)
    import torch
    from tokenizers import Tokenizer
    import ckpt
    import hfmodel
    import transformers

    t_all = time.time()
    os.makedirs(a.out, exist_ok=True)
    if a.ckpt:
        os.makedirs(a.ckpt, exist_ok=True)
    st = ckpt.load(a.resume_train) if a.resume_train else None
    if st is not None:
        apply_checkpoint_args(a, st, log)
    if a.ckpt and a.schedule_steps <= 0:
        sys.exit("train: --ckpt needs --schedule-steps (the step-based schedule that resumed runs continue)")
    sched = schedule.MixSchedule(a.mix_schedule or a.mix)
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev_name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    log("torch %s, transformers %s, device %s" % (torch.__version__, transformers.__version__, dev_name))
    tok_dir = next(d for d in (a.resume_train, a.resume, a.tokenizer)
                   if d and os.path.exists(os.path.join(d, "tokenizer.json")))
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    V = tok.get_vocab_size(with_added_tokens=True)
    model, C = build_model(a, torch, V, st, log)
    if model.config.text_config.vocab_size != V:
        sys.exit("train: tokenizer has %d ids, model vocab_size %d" % (V, model.config.text_config.vocab_size))
    window = model.config.text_config.sliding_window
    if max(a.max_len, a.sh_len) >= window - 1:
        sys.exit("train: contexts up to %d must stay below sliding_window - 1 = %d so that training (decoder "
                 "sees the whole context) matches inference (window-1 cached positions)"
                 % (max(a.max_len, a.sh_len), window - 1))
    model.to(dev)
    total, text_p, vision_p = hfmodel.count_params(model)
    log("parameters: %d total, %d text, %d vision; bf16 %.2f MiB; config: %s" % (
        total, text_p, vision_p, total * 2 / 2**20, json.dumps({k: getattr(a, k) for k in hfmodel.DEFAULTS})))

    data = load_data(a, tok, C, sched.names)
    batcher = Batcher(torch, data, sched, a.batch, C, a.sh_len, dev, mode=a.batch_mode, truncate=not a.no_truncate,
                      len_multiple=a.len_multiple, seed=a.seed)
    log("batches of %d rows (%s), source shares by step: %s; chat rows cut after the canvas: %s"
        % (a.batch, a.batch_mode, sched.spec, not a.no_truncate))
    fwd = hfmodel.Forward(model, log, impl=a.forward)
    trainer = Trainer(a, torch, model, fwd, batcher, V, C, dev, log)
    l0, consistency = startup_checks(a, torch, model, fwd, trainer, data, C, log)
    if st is not None:
        trainer.restore(st)     # after the start-up checks, which draw random numbers
    trainer.run += 1
    peak = a.peak_tflops or runlog.detect_peak_tflops(dev_name)
    log("FLOPs per step: runlog.step_flops (model FLOPs, top-%d experts); MFU against %s" % (
        trainer.dims["k"], "%.1f TFLOP/s" % peak if peak else "no peak (unknown device; --peak-tflops)"))

    probe_set = probe_problems(a)
    probe_fn = None
    if probe_set:
        import fastfwd
        import probe as probe_mod
        own = fwd.own or fastfwd.OwnForward(model)
        enc = lambda t: tok.encode(t, add_special_tokens=False).ids  # noqa: E731

        def probe_fn():
            return probe_mod.probe_accuracy(own, probe_set, enc, lambda ids: tok.decode(ids, skip_special_tokens=False),
                                            C, V, iters=a.probe_iters, device=dev, autocast=trainer.amp)
        log("probe: %d validation problems every %d steps (greedy refinement, %d passes per canvas)"
            % (len(probe_set), a.probe_every, a.probe_iters))

    csv_path = os.path.join(a.ckpt or a.out, "train_log.csv")
    if not a.ckpt and os.path.exists(csv_path):
        os.remove(csv_path)     # without a checkpoint the log is this run's alone, as before
    rl = RunLog(trainer, csv_path, peak, time.time())
    model.train()
    steps, train_s, failure = train_loop(a, trainer, rl, probe_fn, a.ckpt, tok_dir, log)
    log("trained %d steps in %.1fs (%.2f steps/s); global step %d, run %d"
        % (steps, train_s, steps / max(train_s, 1e-9), trainer.step, trainer.run))
    if a.ckpt and failure is None and steps > 0:
        if a.ckpt_every <= 0 or trainer.step % a.ckpt_every:    # else saved by the loop at this step
            trainer.save(a.ckpt, tok_dir)
        if hasattr(model.config, "save_pretrained"):
            model.config.save_pretrained(a.ckpt)
    if a.ckpt and os.path.abspath(a.ckpt) != os.path.abspath(a.out):
        import shutil
        shutil.copy(csv_path, os.path.join(a.out, "train_log.csv"))
    if steps == 0:
        raise SystemExit("train: no step completed") from failure

    sizes, check = {}, None
    if not a.no_export:
        model.eval()
        model_dir = os.path.join(a.out, "model")
        sizes = hfmodel.export(model, model_dir, tok_dir, a, log=log)
        if not a.no_check:
            held = common.read_jsonl(os.path.join(a.data, "problems_heldout.jsonl"))
            check = hfmodel.hf_check(model_dir, model, held, log)
    summary = {
        "transformers": transformers.__version__, "torch": torch.__version__, "device": dev_name,
        "args": vars(a), "vocab_size": V, "canvas_length": C,
        "params_total": total, "params_text": text_p, "params_vision": vision_p,
        "model_files": sizes, "model_bytes": sum(sizes.values()),
        "steps": steps, "global_step": trainer.step, "run": trainer.run, "train_seconds": round(train_s, 1),
        "wall_seconds": round(time.time() - t_all, 1), "examples_seen": steps * a.batch,
        "examples_total": trainer.examples, "data_dropped_long": data["dropped"], "probe_loss": l0,
        "consistency": consistency, "hf_check": check,
        "failure": None if failure is None else "%s: %s" % (type(failure).__name__, failure),
    }
    with open(os.path.join(a.out, "train_summary.json"), "w") as f:
        json.dump(summary, f, indent=1, default=str)
    log("done in %.1fs; summary in %s" % (time.time() - t_all, os.path.join(a.out, "train_summary.json")))
    if failure is not None:
        raise SystemExit("train: training stopped early: %s" % failure)


if __name__ == "__main__":
    main()
