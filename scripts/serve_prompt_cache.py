#!/usr/bin/env python3
"""serve_prompt_cache.py [-m DIR] [-t THREADS] [-r REPS] [-w WORDS] [--slots N]: the prompt cache of
`dgemma serve` (--cache-slots) measured on a follow-up turn.

For --cache-slots 0 and then N (default 4), a fresh server (the turbo engine's recommended setting, or
--gen-kwargs)
gets REPS two-turn conversations after one warm-up conversation: turn 1 a user message of about
WORDS words (a different one per conversation, so conversations share nothing), turn 2 the
conversation so far and a short question. Per setting it prints, for turn 2: the prompt tokens, the
cached ones (usage.prompt_tokens_details.cached_tokens), the server's prefill time
(dgemma.prefill_seconds: the context, the cache copy, the prefill of what is not cached) and the
request's wall time at the client, as median [min - max] over the REPS conversations, and whether
every answer equals the other setting's (same seeds: the cache must not change a token). With --rss it
also prints the server's resident memory (VmRSS, /proc) after the last conversation of each setting:
the difference is what the cache's entries hold (REPS >= N leaves N conversations cached).
Needs python3 only (loopback HTTP); BIN (default build/dgemma) is the binary."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.request

TURBO = ('{"diffusion_turbo": true, "turbo_accept": "confidence", "turbo_threshold": [0.95, 0.80, 8], '
         '"turbo_repair": true, "turbo_compact": true}')
WORDS = ("the river runs past the old mill where the miller keeps his grain in wooden bins and counts "
         "the sacks each morning before the carts arrive from the farms on the hill").split()


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t0 = time.monotonic()
    with urllib.request.urlopen(req, timeout=600) as r:
        d = json.load(r)
    return d, time.monotonic() - t0


def conversation(port, k, words):
    first = f"Conversation {k}. Read this and answer my questions. " + " ".join(
        WORDS[(i * 7 + k) % len(WORDS)] for i in range(words))
    msgs = [{"role": "user", "content": first}]
    d1, _ = post(port, {"messages": msgs, "max_tokens": 64, "seed": k})
    msgs += [{"role": "assistant", "content": d1["choices"][0]["message"]["content"]},
             {"role": "user", "content": "Who counts the sacks?"}]
    d2, wall = post(port, {"messages": msgs, "max_tokens": 64, "seed": 1000 + k})
    u = d2["usage"]
    return {"prompt": u["prompt_tokens"], "cached": u["prompt_tokens_details"]["cached_tokens"],
            "prefill": d2["dgemma"]["prefill_seconds"] or float("nan"), "wall": wall,  # null: the reference sampler
            "answers": (d1["choices"][0]["message"]["content"], d2["choices"][0]["message"]["content"])}


def serve(args, slots):
    p = subprocess.Popen([args.bin, "serve", "-m", args.model, "-t", str(args.threads), "--port", "0",
                          "--cache-slots", str(slots), "--gen-kwargs", args.gen_kwargs, "--device", args.device, "--quiet"],
                         stderr=subprocess.PIPE, text=True, env=dict(os.environ, OMP_WAIT_POLICY="passive"))
    for line in p.stderr:  # "dgemma serve: http://127.0.0.1:PORT/ model ..."
        m = re.search(r"http://[0-9.]+:(\d+)/", line)
        if m:
            return p, int(m.group(1))
    p.wait()
    sys.exit(f"serve_prompt_cache.py: the server did not start (exit {p.returncode})")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def stat(xs, unit=""):
    return f"{statistics.median(xs):.4g}{unit} [{min(xs):.4g} - {max(xs):.4g}]"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-m", dest="model", default="models/dgemma-small")
    ap.add_argument("-t", dest="threads", type=int, default=1)
    ap.add_argument("-r", dest="reps", type=int, default=7)
    ap.add_argument("-w", dest="words", type=int, default=1500)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--device", default="cpu", help="the server's --device (cpu or cuda)")
    ap.add_argument("--bin", default=os.environ.get("BIN", "build/dgemma"))
    ap.add_argument("--gen-kwargs", default=TURBO, help="the server's --gen-kwargs (default: turbo's recommended "
                    "setting; '{}': the reference sampler)")
    ap.add_argument("--rss", action="store_true", help="print the server's VmRSS after each setting's runs")
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    runs, rss = {}, {}
    for slots in (0, args.slots):
        p, port = serve(args, slots)
        try:
            conversation(port, 10_000, args.words)  # warm-up
            runs[slots] = [conversation(port, k, args.words) for k in range(args.reps)]
            if args.rss:
                rss[slots] = rss_mib(p.pid)
        finally:
            p.terminate()
            p.wait()
        r = runs[slots]
        print(f"--cache-slots {slots}: turn 2 of {args.reps} conversations ({args.words}-word first turn, -t {args.threads}): "
              f"prompt {stat([x['prompt'] for x in r])} tokens, cached {stat([x['cached'] for x in r])}, "
              f"prefill {stat([1e3 * x['prefill'] for x in r], ' ms')}, request {stat([x['wall'] for x in r], ' s')}")
    a, b = runs[0], runs[args.slots]
    same = all(x["answers"] == y["answers"] for x, y in zip(a, b))
    ratio = statistics.median(x["prefill"] for x in a) / statistics.median(x["prefill"] for x in b)
    print(f"prefill of turn 2 without / with the cache: {ratio:.1f}x (medians); answers identical: {same}")
    if args.rss:
        print(f"server RSS after the runs: {rss[0]:.1f} MiB with --cache-slots 0, {rss[args.slots]:.1f} MiB with "
              f"{args.slots} ({rss[args.slots] - rss[0]:+.1f} MiB)")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
