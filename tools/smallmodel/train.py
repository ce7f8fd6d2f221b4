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
AdamW with fp32 master weights, bf16 autocast, linear warmup then cosine decay over the time
budget (--minutes) or --max-steps. The loss is logged to train_log.csv every --log-every steps.
At the end the model is exported (hfmodel.export) to OUT/model, reloaded with from_pretrained and
checked with Transformers' own generate (hfmodel.hf_check).
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
                    help="rows per batch by source (fractions)")
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


def load_data(a, tok, C):
    """Pre-tokenise everything once. Returns numpy-free python lists (moved to the GPU by Batcher)."""
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
    for name, path in (("problems", "problems_train.jsonl"), ("gsm8k", "gsm8k_train.jsonl")):
        rows = common.read_jsonl(os.path.join(a.data, path))
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
    """Draws training batches on the GPU: a fixed number of rows per source (--mix), one block each."""

    def __init__(self, torch, data, mix, B, C, sh_len, device, mode="mixed", truncate=True, len_multiple=1,
                 seed=0):
        import random
        self.t = torch
        self.B, self.C, self.sh_len, self.dev = B, C, sh_len, device
        self.mode, self.truncate, self.mult = mode, truncate, max(1, len_multiple)
        self.rng = random.Random(seed)
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
        names = [k for k, _ in mix]
        counts = [int(round(p * B)) for _, p in mix]
        counts[-1] = B - sum(counts[:-1])
        self.plan = [(n, c) for n, c in zip(names, counts) if c > 0]
        self.src_id = {n: i for i, n in enumerate(names)}
        self.names = names
        self.probs = [(n, p) for n, p in mix if p > 0]

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


def main(argv=None):
    a = parse_args(argv)
    import torch
    import torch.nn.functional as F
    from tokenizers import Tokenizer
    import hfmodel
    import transformers

    t_all = time.time()
    os.makedirs(a.out, exist_ok=True)
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    log("torch %s, transformers %s, device %s" % (torch.__version__, transformers.__version__,
                                                  torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"))
    tok_dir = a.resume if a.resume and os.path.exists(os.path.join(a.resume, "tokenizer.json")) else a.tokenizer
    tok = Tokenizer.from_file(os.path.join(tok_dir, "tokenizer.json"))
    V = tok.get_vocab_size(with_added_tokens=True)

    if a.resume:
        model, _ = hfmodel.load_model(a.resume, torch.float32, log)
        model.float()
        if a.experts_impl:
            hfmodel.set_experts_impl(model, a.experts_impl, log)
        C = model.config.canvas_length
        with open(os.path.join(a.resume, "config.json")) as f:
            rtc = json.load(f).get("text_config", {})
        a.global_head_dim = rtc.get("global_head_dim") or a.global_head_dim
        a.global_kv_heads = rtc.get("num_global_key_value_heads") or a.global_kv_heads
    else:
        model, _ = hfmodel.new_model(V, a, a.vision, a.seed, log, experts=a.experts_impl)
        C = a.canvas
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
        total, text_p, vision_p, total * 2 / 2**20,
        json.dumps({k: getattr(a, k) for k in hfmodel.DEFAULTS} if not a.resume else {"resume": a.resume})))

    data = load_data(a, tok, C)
    mix = [(k, float(v)) for k, v in (x.split(":") for x in a.mix.split(","))]
    batcher = Batcher(torch, data, mix, a.batch, C, a.sh_len, dev, mode=a.batch_mode, truncate=not a.no_truncate,
                      len_multiple=a.len_multiple, seed=a.seed)
    if a.batch_mode == "single":
        log("batches of %d rows from one source each, drawn with probabilities %s; chat rows cut after the canvas: %s"
            % (a.batch, batcher.probs, not a.no_truncate))
    else:
        log("mix per batch of %d: %s; chat rows cut after the canvas: %s" % (a.batch, batcher.plan, not a.no_truncate))

    fwd = hfmodel.Forward(model, log, impl=a.forward)
    autocast = (torch.autocast(device_type="cuda", dtype=torch.bfloat16) if dev.type == "cuda"
                else torch.autocast(device_type="cpu", dtype=torch.bfloat16))

    def compute_loss(seq, lens, b, tgt):
        """(loss, diffusion loss, ar loss, per-position ce [B, C]) for one batch (see module doc)."""
        B, L = seq.shape
        tlev = a.eps + (1 - a.eps) * torch.rand(B, 1, device=dev)
        corrupt = torch.rand(B, C, device=dev) < tlev
        noisy = torch.where(corrupt, torch.randint(V, (B, C), device=dev), tgt)
        pos = b[:, None] + torch.arange(C, device=dev)[None]
        mask = hfmodel.decoder_mask(b, L, C)
        scm = torch.rand(B, device=dev) < a.sc_prob
        with autocast:
            state, _ = fwd.encode(seq)
            # The first (no-grad) pass is only needed for the rows that use self-conditioning; the
            # other rows get zeros, which the self-conditioning mask ignores.
            sc_rows = scm.nonzero().flatten()
            sc_logits = None
            if sc_rows.numel() > 0:
                with torch.no_grad():
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
        ar = torch.zeros((), device=dev)
        if a.ar_weight > 0 and enc_h is not None:
            with autocast:
                enc_logits = fwd.logits(enc_h[:, :-1])
            valid = torch.arange(1, L, device=dev)[None] < lens[:, None]
            ar_t = torch.where(valid, seq[:, 1:], torch.full_like(seq[:, 1:], -100))
            ar = F.cross_entropy(enc_logits.reshape(-1, V), ar_t.reshape(-1), ignore_index=-100)
            loss = loss + a.ar_weight * ar
        return loss, diff, ar, ce

    # Probe: one small forward + backward under autocast; an experts implementation that cannot run
    # it (dtype/device limits of grouped_mm) is replaced by eager before training starts.
    def probe():
        seq, lens, b, tgt, _ = batcher.next()
        loss, _, _, _ = compute_loss(seq[:8], lens[:8], b[:8], tgt[:8])
        loss.backward()
        model.zero_grad(set_to_none=True)
        return float(loss)
    t_probe = time.time()
    if a.forward == "own" and a.no_check:
        sys.exit("train: --forward own is only used after the start-up consistency check; drop --no-check")
    try:
        l0 = hfmodel.with_experts_fallback(model, probe, "training probe step", log)
    except Exception:  # noqa: BLE001 - our own forward failed: use Transformers' instead
        if fwd.own is None:
            raise
        traceback.print_exc()
        log("our own forward failed in the probe step: training with the public forward")
        fwd.use_public()
        l0 = hfmodel.with_experts_fallback(model, probe, "training probe step", log)
    log("probe step ok: loss %.3f (ln V = %.3f), %.1fs; experts implementation %r" % (
        l0, math.log(V), time.time() - t_probe, hfmodel.experts_impl(model)))

    consistency = None
    if not a.no_check:
        long_ex = max(data["groups"]["problems"][:5000], key=lambda i: len(data["seqs"][i]))
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

    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": a.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.98), eps=1e-8, fused=dev.type == "cuda")
    except (TypeError, RuntimeError):
        opt = torch.optim.AdamW(groups, lr=a.lr, betas=(0.9, 0.98), eps=1e-8)
    budget = a.minutes * 60.0

    def lr_at(step, elapsed):
        fr = []
        if budget > 0:
            fr.append(elapsed / budget)
        if a.max_steps > 0:
            fr.append(step / a.max_steps)
        frac = min(1.0, max(fr) if fr else 0.0)
        warm = min(1.0, (step + 1) / max(1, a.warmup))
        return a.lr * warm * (a.min_lr_ratio + (1 - a.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))

    csv_path = os.path.join(a.out, "train_log.csv")
    fcsv = open(csv_path, "w", newline="")
    wr = csv.writer(fcsv)
    cols = ["step", "elapsed_s", "lr", "loss", "diffusion", "ar", "grad_norm"] + \
           ["diffusion_" + n for n in batcher.names] + ["examples_per_s"]
    wr.writerow(cols)
    model.train()
    step, t0 = 0, time.time()
    acc = {"loss": 0.0, "diffusion": 0.0, "ar": 0.0, "gn": 0.0, "n": 0}
    src_sum = torch.zeros(len(batcher.names), device=dev)
    src_cnt = torch.zeros(len(batcher.names), device=dev)
    last_log_t, last_log_step = t0, 0
    failure = None
    try:
        while True:
            elapsed = time.time() - t0
            if (budget > 0 and elapsed >= budget) or (a.max_steps > 0 and step >= a.max_steps):
                break
            lr = lr_at(step, elapsed)
            for g in opt.param_groups:
                g["lr"] = lr
            seq, lens, b, tgt, src = batcher.next()
            opt.zero_grad(set_to_none=True)
            loss, diff, ar, ce = compute_loss(seq, lens, b, tgt)
            loss.backward()
            gn = torch.nn.utils.clip_grad_norm_(params, a.grad_clip)
            opt.step()
            step += 1
            with torch.no_grad():
                row = ce.detach().mean(1)
                src_sum.index_add_(0, src, row)
                src_cnt.index_add_(0, src, torch.ones_like(row))
            acc["loss"] += loss.detach()
            acc["diffusion"] += diff.detach()
            acc["ar"] += ar.detach()
            acc["gn"] += gn.detach()
            acc["n"] += 1
            if step % a.log_every == 0 or step == 1:
                n = acc["n"]
                now = time.time()
                eps_ = (step - last_log_step) * a.batch / max(1e-9, now - last_log_t)
                per_src = (src_sum / src_cnt.clamp(min=1)).tolist()
                vals = [step, round(now - t0, 2), lr, float(acc["loss"]) / n, float(acc["diffusion"]) / n,
                        float(acc["ar"]) / n, float(acc["gn"]) / n] + per_src + [round(eps_, 1)]
                wr.writerow(["%.6g" % v if isinstance(v, float) else v for v in vals])
                fcsv.flush()
                if step % (a.log_every * 10) == 0 or step == 1:
                    log("step %d  %.0fs  lr %.2e  loss %.4f  diffusion %.4f  ar %.4f  |g| %.2f  %s  %.0f ex/s"
                        % (step, now - t0, lr, vals[3], vals[4], vals[5], vals[6],
                           " ".join("%s %.3f" % (nm, v) for nm, v in zip(batcher.names, per_src)), eps_))
                acc = {"loss": 0.0, "diffusion": 0.0, "ar": 0.0, "gn": 0.0, "n": 0}
                src_sum.zero_()
                src_cnt.zero_()
                last_log_t, last_log_step = now, step
    except Exception as e:  # noqa: BLE001 - export what we have, then fail
        failure = e
        traceback.print_exc()
    fcsv.close()
    train_s = time.time() - t0
    log("trained %d steps in %.1fs (%.2f steps/s)" % (step, train_s, step / max(train_s, 1e-9)))
    if step == 0:
        raise SystemExit("train: no step completed") from failure

    model.eval()
    model_dir = os.path.join(a.out, "model")
    sizes = hfmodel.export(model, model_dir, tok_dir, a, log=log)
    check = None
    if not a.no_check:
        held = common.read_jsonl(os.path.join(a.data, "problems_heldout.jsonl"))
        check = hfmodel.hf_check(model_dir, model, held, log)
    summary = {
        "transformers": transformers.__version__, "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "args": vars(a), "vocab_size": V, "canvas_length": C,
        "params_total": total, "params_text": text_p, "params_vision": vision_p,
        "model_files": sizes, "model_bytes": sum(sizes.values()),
        "steps": step, "train_seconds": round(train_s, 1), "wall_seconds": round(time.time() - t_all, 1),
        "examples_seen": step * a.batch, "data_dropped_long": data["dropped"],
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
