"""A cheap, deterministic accuracy probe for the training log (not the reference sampler).

Answers a fixed list of problems (train.py: the first --probe-n validation problems, never the
held-out set) with a greedy iterative-refinement decoder over fastfwd.OwnForward: each canvas of
C tokens starts from fixed uniform noise (its own torch.Generator, so the training random streams
are untouched), then `iters` times the decoder's argmax replaces the whole canvas, each pass
self-conditioned on the previous pass's logits; the canvas is then appended to the context and
the next canvas starts, until a stop id appears or `max_blocks` canvases are written. All prompts
go in one right-padded batch: the encoder runs causally over the padded batch and each row's
canvas attends to its own context only (hfmodel.decoder_mask), as in training.

Its accuracy tracks learning between runs at a cost of a few forwards; the model card's numbers
come from eval_hf.py / dgemma eval with the reference sampler.
"""

import torch

import common
import hfmodel


@torch.no_grad()
def greedy_answers(own, prompts, C, V, iters=8, max_blocks=3, seed=0, device=None, autocast=None):
    """prompts: list of id lists. Returns the generated ids per prompt, cut before the first stop id."""
    dev = device or own.E.device
    B = len(prompts)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    ctx = [list(p) for p in prompts]
    done = [False] * B
    out = [[] for _ in range(B)]
    for _ in range(max_blocks):
        rows = [i for i in range(B) if not done[i]]
        if not rows:
            break
        L = max(len(ctx[i]) for i in rows)
        seq = torch.full((len(rows), L), common.PAD, dtype=torch.long)
        for r, i in enumerate(rows):
            seq[r, :len(ctx[i])] = torch.tensor(ctx[i])
        b = torch.tensor([len(ctx[i]) for i in rows])
        seq, b = seq.to(dev), b.to(dev)
        canvas = torch.randint(V, (len(rows), C), generator=gen).to(dev)
        pos = b[:, None] + torch.arange(C, device=dev)[None]
        mask = hfmodel.decoder_mask(b, L, C)["full_attention"]
        scm = torch.ones(len(rows), dtype=torch.bool, device=dev)
        ctx_mgr = autocast if autocast is not None else torch.autocast("cpu", enabled=False)
        with ctx_mgr:
            state = own.encode(seq)
            logits = None
            for _ in range(iters):
                logits = own.decode(state, canvas, mask, pos, logits, scm if logits is not None else None)
                canvas = logits.argmax(-1)
        canvas = canvas.tolist()
        for r, i in enumerate(rows):
            blk = canvas[r]
            stop = next((j for j, t in enumerate(blk) if t in common.STOP_IDS), None)
            out[i].extend(blk if stop is None else blk[:stop])
            ctx[i].extend(blk)
            if stop is not None:
                done[i] = True
    return [common.cut_at_stop(o) for o in out]


def probe_accuracy(own, problems, encode, decode, C, V, **kw):
    """{"acc", "acc_12", "n", "n_12"}: share of problems whose parsed final answer is correct
    (all, and those of 1-2 steps). encode/decode: text <-> ids of the model's tokenizer."""
    prompts = [common.prompt_ids(encode, p["question"]) for p in problems]
    ans = greedy_answers(own, prompts, C, V, **kw)
    ok = [common.parse_final_answer(decode(a)) == p["final"] for a, p in zip(ans, problems)]
    ok12 = [k for k, p in zip(ok, problems) if p["steps"] <= 2]
    return {"acc": sum(ok) / max(1, len(ok)), "acc_12": sum(ok12) / max(1, len(ok12)),
            "n": len(ok), "n_12": len(ok12)}
