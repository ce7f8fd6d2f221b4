#!/usr/bin/env python3
"""dev/sigstress.py BIN N [SEED]: quantize / mkrandom / logits of dgemma interrupted by SIGINT, SIGTERM or SIGHUP at a uniformly random
moment of [0, 1.15 T] counted from the spawn (so also before the handler is installed), T a whole run's wall time;
checks: exit 0 and the whole output, or an interruption (128+sig, or killed by the signal) and nothing left
(no output, no temporary entry; logits: the old -o file byte for byte). Prints each failure and a tally.
A newcomer's check of issue 16 beside tests/test_cli.c (review rev16): the signal may come before the handler is
installed, and mkrandom-mid (the 26B's 2-layer cut with 16 experts, a 32,768 vocabulary: ~10 s on 2 busy cores)
is interrupted inside shard writes of tens of MB. Scratch in $SIGSTRESS_DIR (default /tmp/sigstress), removed first."""
import os, random, shutil, signal, subprocess, sys, time, json
BIN, N = sys.argv[1], int(sys.argv[2]); seed = int(sys.argv[3]) if len(sys.argv) > 3 else int(time.time())
random.seed(seed); print(f"seed {seed}", flush=True)
W = os.environ.get('SIGSTRESS_DIR', '/tmp/sigstress'); shutil.rmtree(W, ignore_errors=True); os.makedirs(W)
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..'); SMALL = os.path.join(ROOT, 'models', 'dgemma-small')
# a mid-size mkrandom config: the 26B's 2-layer cut with 16 experts and a 32,768 vocabulary (~0.3 GB)
c = json.load(open(os.path.join(ROOT, 'dev', 'cfg_26b_2layers.json'))); t = c['text_config']
t['num_experts'] = 16; t['top_k_experts'] = 4; t['vocab_size'] = 32768
json.dump(c, open(f'{W}/mid.json', 'w'))
open(f'{W}/canvas.i32', 'wb').write(b''.join(((5 + i * 37) % 4096).to_bytes(4, 'little') for i in range(64)))
open(f'{W}/prompt.i32', 'wb').write(b''.join(((5 + i * 37) % 4096).to_bytes(4, 'little') for i in range(400)))
def listing(d):
    return sorted((f, os.path.getsize(os.path.join(d, f))) for f in os.listdir(d))
jobs = {
  'quantize': lambda out: [BIN, 'quantize', SMALL, out, '-t', '1'],
  'mkrandom': lambda out: [BIN, 'mkrandom', out, '--config', 'small', '-t', '1'],
  'mkrandom-mid': lambda out: [BIN, 'mkrandom', out, '--config', f'{W}/mid.json', '-t', '2'],
  'logits': lambda out: [BIN, 'logits', '-m', SMALL, '-t', '1', '--prompt-ids', f'@{W}/prompt.i32', '--canvas-ids',
                         f'@{W}/canvas.i32', '-o', out],
}
PREV = b'the previous content\n'
bad = 0
for name, argv in jobs.items():
    P = f'{W}/{name}'; os.makedirs(P)
    ref = f'{P}/ref' + ('.f32' if name == 'logits' else '')
    t0 = time.monotonic(); r = subprocess.run(argv(ref), capture_output=True); T = time.monotonic() - t0
    assert r.returncode == 0, (name, r.stderr[-300:])
    want = os.path.getsize(ref) if name == 'logits' else listing(ref)
    tally = {}
    for i in range(N):
        sig = random.choice([signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
        delay = random.uniform(0, 1.15 * T)
        out = f'{P}/out{i}' + ('.f32' if name == 'logits' else '')
        if name == 'logits': open(out, 'wb').write(PREV)
        p = subprocess.Popen(argv(out), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             preexec_fn=lambda: [signal.signal(x, signal.SIG_DFL) for x in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)])
        time.sleep(delay)
        try: p.send_signal(sig)
        except ProcessLookupError: pass
        err = p.communicate()[1].decode(errors='replace'); rc = p.returncode
        kind = 'done' if rc == 0 else 'handled' if rc == 128 + sig else 'killed' if rc == -sig else f'rc{rc}'
        tally[kind] = tally.get(kind, 0) + 1
        tmp = [f for f in os.listdir(P) if '.tmp-' in f]
        msg = None
        if tmp: msg = f'temporary entries left: {tmp}'
        elif rc == 0:
            got = os.path.getsize(out) if name == 'logits' else listing(out)
            if got != want: msg = f'exit 0 but the output differs: {got} vs {want}'
        elif kind in ('handled', 'killed'):
            if name == 'logits':
                if open(out, 'rb').read() != PREV: msg = 'interrupted but the -o file changed'
            elif os.path.exists(out): msg = f'interrupted but {out} exists: {os.listdir(out)}'
        else: msg = f'exit {rc}: {err[-300:]}'
        if msg:
            bad += 1; print(f'FAIL {name} run {i}: {signal.Signals(sig).name} at {delay:.3f} s of {T:.3f} s: {msg}', flush=True)
        for f in os.listdir(P):
            if f.startswith('out'): shutil.rmtree(f'{P}/{f}', ignore_errors=True) if os.path.isdir(f'{P}/{f}') else os.remove(f'{P}/{f}')
    print(f'{name}: T {T:.3f} s, {N} runs: {tally}', flush=True)
print(f'{bad} failures'); sys.exit(1 if bad else 0)
