#!/usr/bin/env python3
# nc16_bad_dirs.py BIN [WORKDIR]: session 25 helper nc16's broken model directories beside dev/hostile_dirs.py (config.json and
# generation_config.json values, FIFOs, a directory, a symlink loop, a BOM); prints rc and the message per case, BAD for a
# signal, a status >= 128 or a timeout. Run: python3 docs/results/cpu-s25/nc16_bad_dirs.py build-cpu/dgemma /tmp/x
import json, os, shutil, subprocess, sys, struct
BIN=sys.argv[1]; SRC=os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', '..', '..', 'models', 'dgemma-small')); W=sys.argv[2] if len(sys.argv) > 2 else '/tmp/nc16/bad'
shutil.rmtree(W, ignore_errors=True); os.makedirs(W)
def mk(name):
    d=f'{W}/{name}'; os.makedirs(d)
    for f in os.listdir(SRC):
        if f.endswith('.safetensors'): os.symlink(f'{SRC}/{f}', f'{d}/{f}')
        else: shutil.copy(f'{SRC}/{f}', d)
    return d
def cfg(d, fn):
    c=json.load(open(f'{d}/config.json')); fn(c); open(f'{d}/config.json','w').write(json.dumps(c))
def gen(d, fn):
    c=json.load(open(f'{d}/generation_config.json')); fn(c); open(f'{d}/generation_config.json','w').write(json.dumps(c))
T=lambda c: c['text_config']
def st(k,v): return lambda c: T(c).__setitem__(k,v)
cases = {
 'layers_1e9': st('num_hidden_layers', 10**9),
 'layers_0': st('num_hidden_layers', 0),
 'hidden_2e31': st('hidden_size', 2**31),
 'heads_0': st('num_attention_heads', 0),
 'kvheads_gt_heads': st('num_key_value_heads', 8),
 'kv_not_divisor': st('num_key_value_heads', 3),
 'headdim_odd': st('head_dim', 63),
 'vocab_neg': st('vocab_size', -5),
 'vocab_float': st('vocab_size', 4096.5),
 'vocab_bool': st('vocab_size', True),
 'maxpos_0': st('max_position_embeddings', 0),
 'maxpos_lt_canvas': st('max_position_embeddings', 32),
 'window_0': st('sliding_window', 0),
 'window_neg': st('sliding_window', -1),
 'topk_gt_experts': st('top_k_experts', 9),
 'topk_0': st('top_k_experts', 0),
 'experts_0': st('num_experts', 0),
 'eps_neg': st('rms_norm_eps', -1.0),
 'softcap_neg': st('final_logit_softcapping', -30.0),
 'softcap_0': st('final_logit_softcapping', 0.0),
 'softcap_null': st('final_logit_softcapping', None),
 'act_relu': st('hidden_activation', 'relu'),
 'layer_type_bad': lambda c: T(c)['layer_types'].__setitem__(0, 'chunked_attention'),
 'layer_types_short': lambda c: T(c)['layer_types'].pop(),
 'rope_theta_0': lambda c: T(c)['rope_parameters']['sliding_attention'].__setitem__('rope_theta', 0.0),
 'rope_theta_neg': lambda c: T(c)['rope_parameters']['full_attention'].__setitem__('rope_theta', -1.0),
 'prf_2': lambda c: T(c)['rope_parameters']['full_attention'].__setitem__('partial_rotary_factor', 2.0),
 'prf_0': lambda c: T(c)['rope_parameters']['full_attention'].__setitem__('partial_rotary_factor', 0.0),
 'rope_type_yarn': lambda c: T(c)['rope_parameters']['full_attention'].__setitem__('rope_type', 'yarn'),
 'per_layer_idx_99': lambda c: T(c)['per_layer_config'].__setitem__('99', {'head_dim':128}),
 'per_layer_idx_neg': lambda c: T(c)['per_layer_config'].__setitem__('-1', {'head_dim':128}),
 'per_layer_idx_text': lambda c: T(c)['per_layer_config'].__setitem__('two', {'head_dim':128}),
 'canvas_0': lambda c: c.__setitem__('canvas_length', 0),
 'canvas_huge': lambda c: c.__setitem__('canvas_length', 1<<40),
 'canvas_str': lambda c: c.__setitem__('canvas_length', "64"),
 'text_config_list': lambda c: c.__setitem__('text_config', []),
 'bos_oob': st('bos_token_id', 5000),
 'pad_neg': st('pad_token_id', -1),
 'eos_oob': st('eos_token_id', 99999),
 'eos_list_oob': st('eos_token_id', [1, 99999]),
 'tie_false': lambda c: (c.__setitem__('tie_word_embeddings', False), T(c).__setitem__('tie_word_embeddings', False)),
 'dtype_f8': st('dtype', 'float8_e4m3fn'),
}
gcases = {
 'g_steps_0': lambda g: g.__setitem__('max_denoising_steps', 0),
 'g_steps_neg': lambda g: g.__setitem__('max_denoising_steps', -3),
 'g_tmin_gt_tmax': lambda g: g.update(t_min=2.0, t_max=0.1),
 'g_tmax_nan': lambda g: g.__setitem__('t_max', float('nan')),
 'g_eos_str': lambda g: g.__setitem__('eos_token_id', "1"),
 'g_eos_oob': lambda g: g.__setitem__('eos_token_id', [1, 70000]),
 'g_entropy_neg': lambda g: g['sampler_config'].__setitem__('entropy_bound', -1.0),
 'g_sampler_cls': lambda g: g['sampler_config'].__setitem__('_cls_name', 'Foo'),
 'g_conf_2': lambda g: g.__setitem__('confidence_threshold', 2.0),
 'g_stab_neg': lambda g: g.__setitem__('stability_threshold', -1),
 'g_maxnew_huge': lambda g: g.__setitem__('max_new_tokens', 1<<40),
}
def run(name, d):
    try:
        r=subprocess.run([BIN,'run','-m',d,'-p','hi','-n','64','-s','2','-t','1'],capture_output=True,timeout=60)
        rc=r.returncode; err=r.stderr.decode(errors='replace').strip().splitlines()
    except subprocess.TimeoutExpired: rc='TIMEOUT'; err=[]
    flag='BAD ' if (rc=='TIMEOUT' or (isinstance(rc,int) and (rc<0 or rc>=128)) or any('runtime error' in l or 'Sanitizer' in l for l in err)) else ''
    tail=' | '.join(l for l in err if not l.startswith('dgemma: ') or 'error' in l or 'cannot' in l or ':' in l)[-400:]
    print(f'{flag}{name}: rc={rc}: {tail}', flush=True)
for n,f in cases.items():
    d=mk(n); cfg(d,f); run(n,d)
for n,f in gcases.items():
    d=mk(n); gen(d,f); run(n,d)
# filesystem oddities
d=mk('config_dir'); os.remove(f'{d}/config.json'); os.mkdir(f'{d}/config.json'); run('config_dir',d)
d=mk('config_fifo'); os.remove(f'{d}/config.json'); os.mkfifo(f'{d}/config.json'); run('config_fifo',d)
d=mk('shard_fifo'); s='model-00002-of-00002.safetensors'; os.remove(f'{d}/{s}'); os.mkfifo(f'{d}/{s}'); run('shard_fifo',d)
d=mk('shard_dir'); os.remove(f'{d}/{s}'); os.mkdir(f'{d}/{s}'); run('shard_dir',d)
d=mk('shard_empty'); os.remove(f'{d}/{s}'); open(f'{d}/{s}','w').close(); run('shard_empty',d)
d=mk('tok_missing'); os.remove(f'{d}/tokenizer.json'); run('tok_missing',d)
d=mk('tok_fifo'); os.remove(f'{d}/tokenizer.json'); os.mkfifo(f'{d}/tokenizer.json'); run('tok_fifo',d)
d=mk('gen_fifo'); os.remove(f'{d}/generation_config.json'); os.mkfifo(f'{d}/generation_config.json'); run('gen_fifo',d)
d=mk('config_bom'); b=open(f'{d}/config.json','rb').read(); open(f'{d}/config.json','wb').write(b'\xef\xbb\xbf'+b); run('config_bom',d)
d=mk('config_symloop'); os.remove(f'{d}/config.json'); os.symlink('config.json', f'{d}/config.json'); run('config_symloop',d)
