#!/usr/bin/env python3
"""Stage 4: evaluate an exported small model with Transformers on the GPU machine.

    python3 eval_hf.py --model WORK/train/model --data WORK/data --out WORK/eval

1. Held-out generated problems (problems_heldout.jsonl, 125 per step count 1..8, seed 5678):
   Transformers' own generate (the reference sampler, the model's generation_config.json:
   48 steps, entropy bound 0.1, T 0.8 -> 0.4, stable-and-confident stop, max_new_tokens 256),
   prompts rendered by ids (thinking off), left-padded batches with an attention_mask, one
   torch.manual_seed(seed + batch_start) per batch. The answer is the integer after the last "####"
   (else the last integer) of the text up to the first stop id. Accuracy per step count with
   Wilson 95% intervals.
2. Held-out Shakespeare tail (shakespeare_heldout.txt): per-token sequential code length in nats.
   Windows: context = <bos> + 127 tokens, target = the next C tokens. Target token i is scored
   with ONE decoder pass whose canvas holds the clean target[:i] and fixed uniform noise at
   positions >= i (no self-conditioning): -log p(target[i] | context, target[:i], noise). These C
   conditionals chain into a code for the window, so the average is comparable with an
   autoregressive model. Baselines on the same tokens: the same architecture untrained (fresh
   init, seed 0) and an add-one smoothed bigram of the Shakespeare training text (same tokenizer).
Writes results.json, results.md, items.jsonl (one line per problem), prompts.jsonl and
shakespeare_windows.jsonl (the exact inputs, noise included, for dgemma's own eval).
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402


def log(msg):
    print("eval: " + msg, flush=True)


def seq_loss(torch, model, windows, C, chunk_rows=1024):
    """Mean nats/token of the sequential canvas code over the windows (see module doc)."""
    dev = next(model.parameters()).device
    per_win = max(1, chunk_rows // C)
    tot, n = 0.0, 0
    per_window = []
    for i in range(0, len(windows), per_win):
        ws = windows[i:i + per_win]
        ctx, canv, tgt = [], [], []
        for w in ws:
            for j in range(C):
                ctx.append(w["context"])
                canv.append(common.sequential_canvas(w["target"], w["noise"], j))
                tgt.append(w["target"][j])
        ctx = torch.tensor(ctx, device=dev)
        canv = torch.tensor(canv, device=dev)
        tgt_t = torch.tensor(tgt, device=dev)
        with torch.no_grad():
            logits = model(input_ids=ctx, decoder_input_ids=canv).logits.float()
        lp = torch.log_softmax(logits, -1)
        rows = torch.arange(len(tgt), device=dev)
        cols = torch.tensor([j for _ in ws for j in range(C)], device=dev)
        nll = -lp[rows, cols, tgt_t]
        nll = nll.view(len(ws), C)
        for k in range(len(ws)):
            per_window.append(float(nll[k].mean()))
        tot += float(nll.sum())
        n += nll.numel()
    return tot / n, n, per_window


def main(argv=None):
    ap = argparse.ArgumentParser(description="evaluate the small model with Transformers")
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--per-step", type=int, default=0, help="problems per step count (0: all)")
    ap.add_argument("--gen-batch", type=int, default=256)
    ap.add_argument("--max-new-tokens", type=int, default=0, help="0: the generation config's")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sh-windows", type=int, default=128)
    ap.add_argument("--sh-ctx", type=int, default=128, help="context length incl. <bos>")
    ap.add_argument("--sh-seed", type=int, default=1000)
    ap.add_argument("--problems-file", default="problems_heldout.jsonl",
                    help="problems file under --data (problems_val.jsonl to choose between variants)")
    ap.add_argument("--skip-problems", action="store_true")
    ap.add_argument("--skip-shakespeare", action="store_true")
    ap.add_argument("--skip-untrained", action="store_true")
    a = ap.parse_args(argv)

    import torch
    import transformers
    from tokenizers import Tokenizer
    import hfmodel

    t_all = time.time()
    os.makedirs(a.out, exist_ok=True)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model, _ = hfmodel.load_model(a.model, torch.bfloat16, log)
    model.to(dev).eval()
    hfmodel.probe_forward(model, log)
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    enc = lambda t: tok.encode(t, add_special_tokens=False).ids  # noqa: E731
    C = model.config.canvas_length
    V = model.config.text_config.vocab_size
    gc = model.generation_config
    try:
        gen_cfg = json.loads(gc.to_json_string())
    except Exception:  # noqa: BLE001 - informational only
        gen_cfg = str(gc)
    results = {"model": os.path.abspath(a.model), "transformers": transformers.__version__, "torch": torch.__version__,
               "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "seed": a.seed,
               "generation_config": gen_cfg, "canvas_length": C, "vocab_size": V}

    # ---- 1. held-out problems --------------------------------------------------------------
    held = common.read_jsonl(os.path.join(a.data, a.problems_file))
    results["problems_file"] = a.problems_file
    for i, p in enumerate(held):
        p["id"] = i
    if a.per_step:
        keep = []
        for s in range(1, 9):
            keep += [p for p in held if p["steps"] == s][:a.per_step]
        held = keep
    common.write_jsonl(os.path.join(a.out, "prompts.jsonl"),
                       [{"id": p["id"], "steps": p["steps"], "question": p["question"], "final": p["final"],
                         "prompt_ids": common.prompt_ids(enc, p["question"])} for p in held])
    if not a.skip_problems:
        t0 = time.time()
        order = sorted(held, key=lambda p: (len(common.prompt_ids(enc, p["question"])), p["id"]))
        items = []
        tpf_all = []
        for i in range(0, len(order), a.gen_batch):
            chunk = order[i:i + a.gen_batch]
            outs, tpf = hfmodel.generate_answers(model, tok, [p["question"] for p in chunk], seed=a.seed + i,
                                                 batch=len(chunk),
                                                 max_new_tokens=a.max_new_tokens or None, log=log)
            for p, (ids, text), t in zip(chunk, outs, tpf):
                pred = common.parse_final_answer(text)
                items.append({"id": p["id"], "steps": p["steps"], "question": p["question"], "final": p["final"],
                              "pred": pred, "correct": pred == p["final"], "generated": text,
                              "generated_ids": ids, "tokens_per_forward": t})
                if t is not None:
                    tpf_all.append(t)
            log("generated %d/%d (%.1fs)" % (min(i + a.gen_batch, len(order)), len(order), time.time() - t0))
        items.sort(key=lambda x: x["id"])
        common.write_jsonl(os.path.join(a.out, "items.jsonl"), items)
        per = {}
        for s in range(1, 9):
            xs = [x for x in items if x["steps"] == s]
            k = sum(x["correct"] for x in xs)
            lo, hi = common.wilson(k, len(xs))
            per[s] = {"n": len(xs), "correct": k, "acc": k / len(xs) if xs else None, "wilson95": [lo, hi]}
        k = sum(x["correct"] for x in items)
        one_two = [x for x in items if x["steps"] <= 2]
        k12 = sum(x["correct"] for x in one_two)
        results["problems"] = {
            "n": len(items), "correct": k, "acc": k / len(items), "wilson95": list(common.wilson(k, len(items))),
            "steps_1_2": {"n": len(one_two), "correct": k12, "acc": k12 / max(1, len(one_two)),
                          "wilson95": list(common.wilson(k12, len(one_two)))},
            "per_steps": per, "seconds": round(time.time() - t0, 1),
            "mean_tokens_per_forward": (sum(tpf_all) / len(tpf_all)) if tpf_all else None,
            "samples": [{"steps": x["steps"], "question": x["question"], "generated": x["generated"],
                         "final": x["final"], "correct": x["correct"]}
                        for s in (1, 2, 4, 8) for x in [y for y in items if y["steps"] == s][:1]]}
        log("problems: %d/%d correct (%.1f%%); steps 1-2: %.1f%%; %.1fs" % (
            k, len(items), 100 * k / len(items), 100 * k12 / max(1, len(one_two)), time.time() - t0))

    # ---- 2. Shakespeare held-out tail ---------------------------------------------------------
    if a.skip_shakespeare:
        finish(a, results, t_all)
        return
    t0 = time.time()
    with open(os.path.join(a.data, "shakespeare_heldout.txt"), encoding="utf-8") as f:
        held_text = f.read()
    with open(os.path.join(a.data, "shakespeare_train.txt"), encoding="utf-8") as f:
        train_text = f.read()

    def enc_text(text):
        out = []
        for i, e in enumerate(tok.encode_batch(text.split("\n"), add_special_tokens=False)):
            if i:
                out.append(common.NEWLINE)
            out.extend(e.ids)
        return out

    held_ids = enc_text(held_text)
    windows = common.shakespeare_windows(held_ids, a.sh_windows, a.sh_ctx, C, a.sh_seed, V)
    common.write_jsonl(os.path.join(a.out, "shakespeare_windows.jsonl"), windows)
    trained, ntok, per_win = seq_loss(torch, model, windows, C)
    bigram = common.Bigram(enc_text(train_text), V)
    btot, bn = common.bigram_window_nll(bigram, windows)
    sh = {"windows": len(windows), "context_len": a.sh_ctx, "canvas": C, "tokens": ntok, "noise_seed": a.sh_seed,
          "heldout_tokens": len(held_ids), "trained_nats_per_token": trained,
          "bigram_nats_per_token": btot / bn, "uniform_nats_per_token": math.log(V),
          "trained_per_window": per_win}
    if not a.skip_untrained:
        torch.manual_seed(0)
        from transformers import DiffusionGemmaForBlockDiffusion as Cls
        try:
            fresh = Cls._from_config(model.config, attn_implementation="sdpa", dtype=torch.float32)
        except TypeError:
            fresh = Cls(model.config)
        hfmodel.ensure_tied(fresh, log)
        fresh.to(torch.bfloat16).to(dev).eval()
        if hfmodel.experts_impl(fresh) != hfmodel.experts_impl(model):
            hfmodel.set_experts_impl(fresh, hfmodel.experts_impl(model), log)
        sh["untrained_nats_per_token"], _, _ = seq_loss(torch, fresh, windows, C)
        del fresh
    results["shakespeare"] = sh
    log("shakespeare held-out (%d windows, %d tokens): trained %.3f, untrained %s, bigram %.3f, uniform %.3f "
        "nats/token; %.1fs" % (len(windows), ntok, trained,
                               "%.3f" % sh["untrained_nats_per_token"] if "untrained_nats_per_token" in sh
                               else "-", sh["bigram_nats_per_token"], math.log(V), time.time() - t0))
    finish(a, results, t_all)


def finish(a, results, t_all):
    """Write results.json and results.md under --out and print the markdown."""
    results["seconds"] = round(time.time() - t_all, 1)
    with open(os.path.join(a.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = render_md(results)
    with open(os.path.join(a.out, "results.md"), "w") as f:
        f.write(md)
    print(md, flush=True)


def render_md(r):
    out = ["## Transformers evaluation (%s, transformers %s, torch %s)" % (r["device"], r["transformers"],
                                                                          r["torch"]), ""]
    p = r.get("problems")
    if p:
        out += ["%s generated problems (`%s`), reference sampler (default generation config), seed %d:" % (
                    "Validation" if "val" in r.get("problems_file", "") else "Held-out",
                    r.get("problems_file", "problems_heldout.jsonl"), r["seed"]),
                "", "| steps | n | correct | accuracy | Wilson 95% |", "|---|---|---|---|---|"]
        for s in range(1, 9):
            x = p["per_steps"][s] if s in p["per_steps"] else p["per_steps"][str(s)]
            out.append("| %d | %d | %d | %.1f%% | %.1f%% – %.1f%% |" % (
                s, x["n"], x["correct"], 100 * (x["acc"] or 0), 100 * x["wilson95"][0], 100 * x["wilson95"][1]))
        q = p["steps_1_2"]
        out.append("| 1–2 | %d | %d | %.1f%% | %.1f%% – %.1f%% |" % (
            q["n"], q["correct"], 100 * q["acc"], 100 * q["wilson95"][0], 100 * q["wilson95"][1]))
        out.append("| all | %d | %d | %.1f%% | %.1f%% – %.1f%% |" % (
            p["n"], p["correct"], 100 * p["acc"], 100 * p["wilson95"][0], 100 * p["wilson95"][1]))
        if p.get("mean_tokens_per_forward"):
            out += ["", "Mean tokens per decoder forward: %.2f" % p["mean_tokens_per_forward"]]
        out.append("")
    s = r.get("shakespeare")
    if not s:
        return "\n".join(out) + "\n"
    out += ["Held-out Shakespeare tail, sequential canvas code length (%d windows, context %d, canvas %d, "
            "%d tokens):" % (s["windows"], s["context_len"], s["canvas"], s["tokens"]), "",
            "| model | nats/token |", "|---|---|",
            "| trained | %.3f |" % s["trained_nats_per_token"]]
    if "untrained_nats_per_token" in s:
        out.append("| same architecture, untrained | %.3f |" % s["untrained_nats_per_token"])
    out += ["| add-one bigram of the training text | %.3f |" % s["bigram_nats_per_token"],
            "| uniform over the vocabulary | %.3f |" % s["uniform_nats_per_token"], ""]
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    main()
