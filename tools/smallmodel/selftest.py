#!/usr/bin/env python3
"""Torch-dependent checks of the training machinery (needs torch only: no Transformers, no
tokenizers, no data files): run on the GPU machine or by a developer with torch.

    OMP_NUM_THREADS=1 python3 tools/smallmodel/selftest.py [--steps 12] [--device cpu|cuda]

On a tiny stand-in model (standin.py: the DiffusionGemma parameter tree) trained with our own
forward on synthetic token data and a two-keypoint curriculum:
  1. resume: N steps in one run vs N/2 + checkpoint (fp32) + a fresh process state (new model,
     trainer, disturbed random streams) + resume + N/2: per-step losses and final weights equal bit
     for bit; with a bf16 checkpoint and with moments dropped, the loss differences are reported;
  2. the checkpoint stores tied weights once (size within 5 % of 12 bytes per parameter);
  3. the FLOP count: runlog.step_flops with the dims read from the weights equals the one from
     the text config, and (torch >= 2.1) matches torch's FlopCounterMode on a training step within
     1 % (attention on the math backend, so that it is counted as plain products);
  4. the probe: deterministic, leaves the training random streams untouched;
  5. --compile on falls back cleanly where torch.compile is missing or fails;
  6. on the CPU: train.main end to end and train_chunk.sh three times, under stubs for the
     tokenizer, the model and the consistency check (no Transformers needed).
On CUDA, bit equality needs deterministic kernels: torch.use_deterministic_algorithms is set with
warn_only, and where a kernel has no deterministic form the resume check fails by rounding (its
message gives the largest difference). Exit status 1 on any failure.
"""

import argparse
import copy
import os
import random
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import torch  # noqa: E402

import ckpt  # noqa: E402
import common  # noqa: E402
import hfmodel  # noqa: E402
import runlog  # noqa: E402
import standin  # noqa: E402
import train  # noqa: E402

V = 160          # above the reserved ids (0..107)
TINY = ["--hidden", "32", "--layers", "2", "--pattern", "SF", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
        "--global-kv-heads", "1", "--global-head-dim", "32", "--intermediate", "64", "--moe-intermediate", "16",
        "--experts", "4", "--top-k", "2", "--canvas", "8"]
SCHED = "0=ops1:0.7,problems:0.1,shakespeare:0.2;6=problems:0.7,ops1:0.1,shakespeare:0.2"
FAILS = []


def check(ok, what):
    print("selftest: %s %s" % ("ok  " if ok else "FAIL", what), flush=True)
    if not ok:
        FAILS.append(what)


def synthetic_data(seed=0):
    """Chat-like sequences (prompt then response) in two groups and a text stream."""
    r = random.Random(seed)
    seqs, starts, groups = [], [], {"problems": [], "ops1": []}
    for g, n in (("problems", 40), ("ops1", 40)):
        for _ in range(n):
            p = [common.BOS] + [r.randrange(108, V) for _ in range(r.randint(5, 12))]
            resp = [r.randrange(108, V) for _ in range(r.randint(3, 14))] + [common.TURN_END]
            groups[g].append(len(seqs))
            seqs.append(p + resp)
            starts.append(len(p))
    stream = [r.randrange(108, V) for _ in range(600)]
    return {"seqs": seqs, "starts": starts, "groups": groups, "stream": stream, "dropped": {}}


def make(a, dev, data, seed=0):
    model = standin.StandIn(hfmodel.text_config_dict(V, a), a.canvas, seed=seed).to(dev)
    fwd = hfmodel.Forward(model, log=lambda m: None, impl="own")
    batcher = train.Batcher(torch, data, train.schedule.MixSchedule(a.mix_schedule), a.batch, a.canvas, a.sh_len, dev,
                            mode=a.batch_mode, len_multiple=a.len_multiple, seed=a.seed)
    return train.Trainer(a, torch, model, fwd, batcher, V, a.canvas, dev, log=lambda m: None)


def args(extra=()):
    return train.parse_args(["--data", "-", "--tokenizer", "-", "--out", "-", "--batch", "8", "--len-multiple", "8",
                             "--sh-len", "24", "--max-len", "64", "--warmup", "3", "--schedule-steps", "12",
                             "--lr", "3e-3", "--mix-schedule", SCHED, "--batch-mode", "single", "--amp", "off",
                             "--minutes", "0"] + TINY + list(extra))


def run_steps(tr, n):
    return [float(tr.train_step()["loss"]) for _ in range(n)]


def test_resume(dev, n, tmp, amp="off"):
    data = synthetic_data()
    a = args(["--schedule-steps", str(n), "--amp", amp])
    torch.manual_seed(0)
    ref = make(a, dev, data)
    ref_losses = run_steps(ref, n)
    torch.manual_seed(0)
    first = make(a, dev, data)
    half = run_steps(first, n // 2)
    check(half == ref_losses[:n // 2], "first half of the split run equals the single run")
    results = {}
    for dtype, moments in (("fp32", "keep"), ("bf16", "keep"), ("fp32", "drop"), ("bf16", "drop")):
        path = os.path.join(tmp, "ck_%s_%s" % (dtype, moments))
        a2 = copy.copy(a)
        a2.ckpt_dtype, a2.ckpt_moments = dtype, moments
        first.a = a2
        size = first.save(path)
        st = ckpt.load(path)
        torch.manual_seed(1234)                     # a new process: other seeds, other draws
        res = make(a, dev, data, seed=99)
        res.batcher.next()
        torch.rand(5)
        ckpt.restore_model(res.model, st)
        res.restore(st)
        results[(dtype, moments)] = (run_steps(res, n - n // 2), res, size, st)
    rest, res, size, st = results[("fp32", "keep")]
    dmax = max(abs(x - y) for x, y in zip(rest, ref_losses[n // 2:]))
    check(rest == ref_losses[n // 2:], "fp32 checkpoint: resumed losses equal the single run bit for bit (%d steps; "
          "max abs difference %.3g)" % (n - n // 2, dmax))
    same_w = all(torch.equal(p, q) for p, q in zip(ref.model.state_dict().values(), res.model.state_dict().values()))
    check(same_w, "fp32 checkpoint: final weights equal bit for bit")
    n_params = sum(p.numel() for p in ref.model.parameters())
    stored = {}
    for v in list(st["model"].values()) + [x for s in st["optimizer"]["state"].values() for x in s.values()]:
        if torch.is_tensor(v) and v.dim() > 0:
            stored[v.data_ptr()] = v.numel() * v.element_size()
    n_buf = sum(b.numel() for b in ref.model.buffers())
    check(sum(stored.values()) == 12 * n_params + 4 * n_buf,
          "fp32 checkpoint stores tied weights once: %d tensor bytes for %d parameters (+ %d buffer values); "
          "state.pt %d bytes" % (sum(stored.values()), n_params, n_buf, size))
    check(res.step == n and res.run == 0, "step counter continues (%d)" % res.step)
    for key in (("bf16", "keep"), ("fp32", "drop"), ("bf16", "drop")):
        rest2 = results[key][0]
        d = max(abs(x - y) / abs(y) for x, y in zip(rest2, ref_losses[n // 2:]))
        print("selftest: info %s weights and moments, moments %s: resumed losses differ from the single run by "
              "up to %.2e relative; checkpoint %d bytes" % (key[0], key[1], d, results[key][2]))
    print("selftest: info losses %s" % ", ".join("%.5f" % x for x in ref_losses))
    return ref


def test_flops(tr, dev):
    a = tr.a
    d_w = train.flop_dims(tr.model)
    d_c = runlog.dims_from_text_config(hfmodel.text_config_dict(V, a))
    check(d_w == d_c, "FLOP dims from the weights equal those from the text config")
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        print("selftest: skip FlopCounterMode comparison (torch %s has no torch.utils.flop_counter)" % torch.__version__)
        return
    seen = {}
    orig = tr.compute_loss

    def spy(seq, lens, b, tgt):
        out = orig(seq, lens, b, tgt)
        seen["shape"], seen["n_sc"] = tuple(seq.shape), out[4]
        return out
    tr.compute_loss = spy
    import contextlib
    math_only = contextlib.nullcontext()
    try:    # attention as plain products (the math backend), counted like every other product
        from torch.nn.attention import SDPBackend, sdpa_kernel
        math_only = sdpa_kernel(SDPBackend.MATH)
    except ImportError:
        pass
    with math_only, FlopCounterMode(display=False) as fc:
        tr.train_step()
    tr.compute_loss = orig
    B, L = seen["shape"]
    got = fc.get_total_flops()
    counts = fc.get_flop_counts().get("Global", {})
    attn_ops = {str(k): v for k, v in counts.items() if "scaled_dot_product" in str(k)}
    if attn_ops:
        # fused attention kernels are counted apart, their backward with recomputation (2.5x the
        # forward, not 2x): compare everything else with the formula without attention
        want = runlog.step_flops(d_w, B, L, a.canvas, seen["n_sc"], moe="dense", attn="none")
        got -= sum(attn_ops.values())
        what = "without attention (attention kernels counted: %s)" % {k: "%.3g" % v for k, v in attn_ops.items()}
    else:
        want = runlog.step_flops(d_w, B, L, a.canvas, seen["n_sc"], moe="dense", attn="full")
        what = "with full attention (attention as plain products)"
    check(abs(got - want) <= 0.01 * want, "step_flops (dense MoE) %s: %.6g vs FlopCounterMode %.6g" % (
        what, want, got))


def test_probe(tr, dev):
    import probe
    probs = [{"question": "q%d" % i, "final": i, "steps": 1 + i % 3} for i in range(6)]
    enc = lambda t: [108 + (ord(c) % 50) for c in t]  # noqa: E731
    dec = lambda ids: " ".join(str(i) for i in ids)   # noqa: E731
    own = tr.fwd.own
    rs = torch.get_rng_state()
    r1 = probe.probe_accuracy(own, probs, enc, dec, tr.C, V, iters=3, device=dev)
    r2 = probe.probe_accuracy(own, probs, enc, dec, tr.C, V, iters=3, device=dev)
    check(r1 == r2 and r1["n"] == 6 and r1["n_12"] == 4, "probe is deterministic (%s)" % r1)
    check(torch.equal(rs, torch.get_rng_state()), "probe leaves the torch random stream untouched")


def test_compile(tr):
    a = copy.copy(tr.a)
    a.compile = "on"
    msgs = []
    undo = train.maybe_compile(torch, tr.fwd, a, msgs.append)
    if undo is None:
        check(not hasattr(torch, "compile") or msgs, "--compile on without torch.compile: eager (%s)" % msgs)
        return
    try:
        loss = float(tr.train_step()["loss"])
        check(loss == loss, "compiled training step runs (loss %.4f)" % loss)
    except Exception as e:  # noqa: BLE001 - the fallback train.py takes
        undo()
        print("selftest: info torch.compile failed here (%s); train.py would fall back to eager" % type(e).__name__)
    undo()


class _Enc:
    def __init__(self, ids):
        self.ids = ids


class _CharTokenizer:
    """Stand-in for tokenizers.Tokenizer: one id per ASCII character (108 + code), "\n" = 107."""

    @classmethod
    def from_file(cls, path):
        return cls()

    def get_vocab_size(self, with_added_tokens=True):
        return 108 + 128

    def encode(self, text, add_special_tokens=False):
        return _Enc([common.NEWLINE if c == "\n" else 108 + (ord(c) % 128) for c in text])

    def encode_batch(self, texts, add_special_tokens=False):
        return [self.encode(t) for t in texts]

    def decode(self, ids, skip_special_tokens=False):
        return "".join("\n" if i == common.NEWLINE else chr(i - 108) if i >= 108 else "" for i in ids)


def _install_stubs():
    """train.main's imports and model construction without Transformers / tokenizers: stand-ins
    for the Tokenizer, the model (standin.StandIn) and the consistency check (our own forward is
    the only forward the stand-in has)."""
    import types
    sys.modules.setdefault("transformers", types.SimpleNamespace(__version__="none (selftest stub)"))
    sys.modules.setdefault("tokenizers", types.SimpleNamespace(Tokenizer=_CharTokenizer, __version__="stub"))
    hfmodel.new_model = lambda V, a, vision="auto", seed=0, log=print, experts=None: (
        standin.StandIn(hfmodel.text_config_dict(V, a), a.canvas, seed=seed), None)
    hfmodel.consistency_check = lambda *a, **k: ({"plain": {"fast_vs_public": 0.0, "public_vs_cache": 0.0}}, 0.0)


def as_python(argv):
    """selftest.py --as-python SCRIPT ARGS | -c CODE: run a tool under the stubs (PYTHON for the
    shell scripts); train_tokenizer.py writes a placeholder tokenizer.json."""
    _install_stubs()
    if argv[0] == "-c":
        sys.argv = ["-c"] + argv[2:]
        exec(compile(argv[1], "<stub -c>", "exec"), {"__name__": "__main__"})
        return 0
    script = argv[0]
    if os.path.basename(script) == "train_tokenizer.py":
        out = argv[argv.index("--out") + 1]
        os.makedirs(out, exist_ok=True)
        open(os.path.join(out, "tokenizer.json"), "w").write("{}")
        return 0
    import runpy
    sys.argv = argv
    runpy.run_path(script, run_name="__main__")
    return 0


def test_chunks(tmp):
    """train_chunk.sh three times under the stubs: fresh, resumed on the same machine, and resumed
    on a 'fresh machine' from the packed parts of the second call."""
    import subprocess
    data_in = os.path.join(tmp, "in")
    os.makedirs(os.path.join(data_in, "gsm8k"))
    os.makedirs(os.path.join(data_in, "text", "tinyshakespeare"))
    common.write_jsonl(os.path.join(data_in, "gsm8k", "train.jsonl"),
                       [{"question": "What is %d + 1?" % i, "answer": "<<%d+1=%d>>\n#### %d" % (i, i + 1, i + 1)}
                        for i in range(30)])
    with open(os.path.join(data_in, "text", "tinyshakespeare", "input.txt"), "w") as f:
        f.write("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 40)
    work, ck = os.path.join(tmp, "work"), os.path.join(tmp, "ck")
    env = dict(os.environ, PYTHON="%s %s --as-python" % (sys.executable, os.path.abspath(__file__)))
    sh = os.path.join(HERE, "train_chunk.sh")
    first = ["--", "--batch", "8", "--len-multiple", "32", "--sh-len", "48", "--max-len", "400", "--warmup", "4",
             "--schedule-steps", "12", "--forward", "own", "--amp", "off", "--max-steps", "6", "--log-every", "2",
             "--mix-schedule", "0=ops1:0.5,problems:0.3,gsm8k:0.1,shakespeare:0.1;6=problems:0.9,shakespeare:0.1",
             "--batch-mode", "single", "--ckpt-every", "0"] + TINY
    outs = []
    for i, (ckdir, parts) in enumerate(((ck, None), (ck, None), (os.path.join(tmp, "ck_fresh"), "out1"))):
        out = os.path.join(tmp, "out%d" % i)
        cmd = ["bash", sh, "--ckpt", ckdir, "--minutes", "0", "--data", data_in, "--work", work, "--out", out]
        if parts:
            cmd += ["--parts", os.path.join(tmp, parts)]
        if i == 0:
            subprocess.run([sys.executable, os.path.join(HERE, "prepare_data.py"), "--data", data_in, "--out",
                            os.path.join(work, "data"), "--train-n", "300", "--pool-n", "200"], check=True,
                           stdout=subprocess.DEVNULL)
        r = subprocess.run(cmd + (first if i == 0 else ["--", "--max-steps", "3", "--probe-every", "0"]), env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        outs.append(out)
        if r.returncode != 0:
            print(r.stdout[-3000:])
        check(r.returncode == 0, "train_chunk.sh call %d exits 0" % (i + 1))
    files = sorted(os.listdir(outs[1]))
    check(len(files) <= 8 and any(f.startswith("ckpt.tar.part-") for f in files) and "train_log.csv" in files,
          "train_chunk.sh packs at most 8 files: %s" % files)
    m1 = ckpt.load(ck)["trainer"]
    m2 = ckpt.load(os.path.join(tmp, "ck_fresh"))
    check(m1["step"] == 9 and m1["run"] == 2, "second call resumed on the same machine: step %d, run %d"
          % (m1["step"], m1["run"]))
    check(m2["trainer"]["step"] == 12 and m2["trainer"]["run"] == 3 and m2["dtype"] == "fp32",
          "third call resumed from the packed parts on a fresh checkpoint dir: step %d, run %d"
          % (m2["trainer"]["step"], m2["trainer"]["run"]))
    log = runlog.read_log(os.path.join(outs[2], "train_log.csv"))
    check([r["run"] for r in log][-1] == "3" and log[-1]["step"] == "12" and log[0]["run"] == "1",
          "the log carried in the parts holds all three runs (%d rows)" % len(log))


def _stub_env(tmp):
    import gen_problems as gp
    _install_stubs()
    data = os.path.join(tmp, "data")
    os.makedirs(data)
    train_p = gp.generate_train(40)
    held, _ = gp.generate_heldout(train_p, 2)
    val, _ = gp.generate_validation(train_p, held, 2)
    common.write_jsonl(os.path.join(data, "problems_train.jsonl"), train_p)
    common.write_jsonl(os.path.join(data, "problems_val.jsonl"), val)
    common.write_jsonl(os.path.join(data, "problems_ops1.jsonl"), gp.generate_pool("ops1", held + val, 40)[0])
    with open(os.path.join(data, "shakespeare_train.txt"), "w") as f:
        f.write("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 20)
    tokd = os.path.join(tmp, "tok")
    os.makedirs(tokd)
    open(os.path.join(tokd, "tokenizer.json"), "w").write("{}")
    return data, tokd


def test_main(tmp):
    """train.main end to end (stubs above): a 16-step schedule as one run and as 8 + resume + 8,
    with checkpoints, probes, the curriculum and the run log."""
    data, tokd = _stub_env(tmp)
    common_args = ["--data", data, "--tokenizer", tokd, "--batch", "8", "--len-multiple", "32", "--sh-len", "48",
                   "--max-len", "400", "--warmup", "4", "--schedule-steps", "16", "--forward", "own", "--amp", "off",
                   "--mix-schedule", "0=ops1:0.6,problems:0.2,shakespeare:0.2;8=problems:0.8,shakespeare:0.2",
                   "--batch-mode", "single", "--minutes", "0", "--log-every", "2", "--probe-every", "4",
                   "--probe-n", "8", "--probe-iters", "2", "--no-export", "--ckpt-every", "4"] + TINY
    one, two = os.path.join(tmp, "one"), os.path.join(tmp, "two")
    train.main(common_args + ["--out", one, "--ckpt", one + "/ck", "--max-steps", "16"])
    train.main(common_args + ["--out", two, "--ckpt", two + "/ck", "--max-steps", "8"])
    train.main(common_args + ["--out", two, "--ckpt", two + "/ck", "--resume-train", two + "/ck", "--max-steps", "8",
                              "--lr", "1"])
    a = runlog.read_log(os.path.join(one, "ck", "train_log.csv"))
    b = runlog.read_log(os.path.join(two, "ck", "train_log.csv"))
    check([r["run"] for r in b].count("2") > 0 and b[-1]["step"] == "16" and a[-1]["step"] == "16",
          "main: the resumed run continues to global step 16 as run 2 in the same log")
    ra = {r["step"]: r for r in a}
    rb = {r["step"]: r for r in b if r["run"] == "2"}
    same = [s for s in ("12", "14", "16") if ra[s]["loss"] == rb[s]["loss"] and ra[s]["lr"] == rb[s]["lr"]]
    check(len(same) == 3, "main: logged loss and lr of steps 12, 14, 16 equal in the single and the resumed run "
          "(%s vs %s)" % ([ra[s]["loss"] for s in ("12", "14", "16")], [rb[s]["loss"] for s in ("12", "14", "16")]))
    probes = [r["step"] for r in b if r["probe_acc"] != ""]
    check(probes == ["4", "8", "12", "16"], "main: probe accuracy logged at global steps %s" % probes)
    check("ops1" in b[0]["mix"] and "ops1" not in b[-1]["mix"], "main: the curriculum moves from %r to %r"
          % (b[0]["mix"], b[-1]["mix"]))
    st = ckpt.load(os.path.join(two, "ck"))
    check(st["trainer"]["step"] == 16 and st["trainer"]["run"] == 2 and st["args"]["lr"] != 1,
          "main: checkpoint at step 16, run 2, the schedule's lr kept (%r)" % st["args"]["lr"])


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--as-python":
        return as_python(argv[1:])
    ap = argparse.ArgumentParser(description="torch checks of the small-model training machinery")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--skip-compile", action="store_true")
    ap.add_argument("--amp", choices=["off", "bf16"], default="off", help="autocast in the resume test")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    dev = torch.device(a.device)
    print("selftest: torch %s on %s" % (torch.__version__, dev), flush=True)
    if dev.type == "cuda":
        # bit equality on the GPU needs deterministic kernels (cuBLAS workspace, no atomics); where
        # torch has none (warn_only) the resume check can fail by rounding: read its max difference
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.use_deterministic_algorithms(True, warn_only=True)
    with tempfile.TemporaryDirectory() as tmp:
        tr = test_resume(dev, a.steps, tmp, a.amp)
    if dev.type == "cpu":
        with tempfile.TemporaryDirectory() as tmp:
            test_main(tmp)
        with tempfile.TemporaryDirectory() as tmp:
            test_chunks(tmp)
    test_flops(tr, dev)
    test_probe(tr, dev)
    if not a.skip_compile:
        test_compile(tr)
    print("selftest: %s" % ("all passed" if not FAILS else "%d FAILED: %s" % (len(FAILS), FAILS)), flush=True)
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
