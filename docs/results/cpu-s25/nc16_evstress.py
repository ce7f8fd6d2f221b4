#!/usr/bin/env python3
# nc16_evstress.py BIN N SEED: eval gsm8k -o F --summary S (3 fixture items) interrupted by SIGINT or SIGTERM at a random moment of
# [0, 1.1 T]; checks: exit 0 / 128+sig, no temporary file, every line of F valid JSON, S written only by a whole run. Scratch /tmp/nc16/evs.
import os, random, signal, subprocess, sys, time, json, glob
BIN=sys.argv[1]; N=int(sys.argv[2]); random.seed(int(sys.argv[3])); W='/tmp/nc16/evs'; os.makedirs(W, exist_ok=True)
for f in glob.glob(W+'/*')+glob.glob(W+'/.*'): os.remove(f)
argv=lambda o,s: [BIN,'eval','gsm8k','--data',os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'tests', 'fixtures', 'gsm8k'),'--limit','3','-n','64','-t','1','-o',o,'--summary',s]
t0=time.monotonic(); r=subprocess.run(argv(W+'/ref.jsonl',W+'/ref.json'),capture_output=True); T=time.monotonic()-t0; assert r.returncode==0, r.stderr
bad=0; tally={}
for i in range(N):
    sig=random.choice([signal.SIGINT,signal.SIGTERM]); d=random.uniform(0,1.1*T)
    o=f'{W}/o{i}.jsonl'; s=f'{W}/s{i}.json'; open(s,'w').write('PREV')
    p=subprocess.Popen(argv(o,s),stdout=subprocess.DEVNULL,stderr=subprocess.PIPE); time.sleep(d)
    try: p.send_signal(sig)
    except ProcessLookupError: pass
    err=p.communicate()[1].decode(errors='replace'); rc=p.returncode
    k='done' if rc==0 else 'handled' if rc==128+sig else 'killed' if rc==-sig else f'rc{rc}'; tally[k]=tally.get(k,0)+1
    msg=None
    tmp=[f for f in os.listdir(W) if '.tmp-' in f]
    if tmp: msg=f'tmp left {tmp}'
    if os.path.exists(o):
        try: n=sum(1 for l in open(o) if json.loads(l) is not None)
        except Exception as e: msg=f'-o has a broken line: {e}'
    sc=open(s).read()
    if rc==0 and sc=='PREV': msg='done but the summary not written'
    if rc!=0 and sc!='PREV': msg='interrupted but the summary changed'
    if k.startswith('rc'): msg=f'{k}: {err[-200:]}'
    if msg: bad+=1; print(f'FAIL run {i} {signal.Signals(sig).name} at {d:.2f}/{T:.2f}: {msg}')
print(f'eval: T {T:.2f} s, {N} runs: {tally}, {bad} failures')
