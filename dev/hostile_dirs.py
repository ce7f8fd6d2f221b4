#!/usr/bin/env python3
"""dev/hostile_dirs.py BIN OUTDIR [NAME...]: hostile model directories (copies of models/dgemma-small with one thing
broken: safetensors headers cut, lengths, shapes that overflow, offsets; index.json entries; config.json and
generation_config.json values; tokenizer.json structure and ids), each loaded by `BIN run -m DIR -p hi -n 8 -s 1 -t 1`;
prints the exit status and the last two stderr lines per case, "BAD" first where the status is a signal (or >= 128),
a timeout, or a sanitizer report (run it with an ASan build too). A case's directory is kept only when BAD. NAME:
only the cases whose name contains one of them. A newcomer's check of issue 16 (review rev16)."""
import json, os, shutil, struct, subprocess, sys
BIN, OUT = sys.argv[1], sys.argv[2]
SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'models', 'dgemma-small')
S1 = 'model-00001-of-00002.safetensors'
def st_parts(path):
    b = open(path, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:]
def st_write(path, hdr, data, raw_hdr=None, n_override=None):
    h = raw_hdr if raw_hdr is not None else json.dumps(hdr).encode()
    n = len(h) if n_override is None else n_override
    open(path, 'wb').write(struct.pack('<Q', n) + h + data)
cases = []
def case(name):
    def deco(f): cases.append((name, f)); return f
    return deco
def hd(d): return st_parts(os.path.join(d, S1))
E = 'model.decoder.embed_tokens.weight'
G = 'model.decoder.layers.0.experts.gate_up_proj'
@case('st_truncated_header')
def _(d):
    p = os.path.join(d, S1); b = open(p, 'rb').read(); open(p, 'wb').write(b[:8 + 100])
@case('st_4_bytes')
def _(d): open(os.path.join(d, S1), 'wb').write(b'\x10\x00\x00\x00')
@case('st_header_len_huge')
def _(d):
    h, data = hd(d); st_write(os.path.join(d, S1), h, data, n_override=1 << 63)
@case('st_header_len_zero')
def _(d):
    h, data = hd(d); st_write(os.path.join(d, S1), h, data, n_override=0)
@case('st_header_len_past_file')
def _(d):
    h, data = hd(d); st_write(os.path.join(d, S1), h, b'', n_override=len(json.dumps(h)) + 1000)
@case('st_header_not_json')
def _(d):
    h, data = hd(d); st_write(os.path.join(d, S1), None, data, raw_hdr=b'{"a": [1, 2,' + b' ' * 100)
@case('st_header_array')
def _(d):
    h, data = hd(d); st_write(os.path.join(d, S1), None, data, raw_hdr=b'[1, 2, 3]')
@case('st_shape_overflow_2^64')
def _(d):
    h, data = hd(d); h[E]['shape'] = [1 << 32, 1 << 31]; h[E]['data_offsets'] = [0, 0]; st_write(os.path.join(d, S1), h, data)
@case('st_shape_overflow_exact')
def _(d):  # 2^62 * 2 * 2 bytes = 2^64 -> 0 mod 2^64, with offsets as for 2 097 152 bytes
    h, data = hd(d); h[E]['shape'] = [1 << 62, 2, 2 ** 0]; st_write(os.path.join(d, S1), h, data)
@case('st_shape_overflow_wrap_to_size')
def _(d):  # product * 2 = 2^64 + 2097152 -> wraps to the true byte size
    h, data = hd(d); n = ((1 << 64) + 2097152) // 2; h[E]['shape'] = [n]; st_write(os.path.join(d, S1), h, data)
@case('st_shape_negative')
def _(d):
    h, data = hd(d); h[E]['shape'] = [-4096, -256]; st_write(os.path.join(d, S1), h, data)
@case('st_shape_float')
def _(d):
    h, data = hd(d); h[E]['shape'] = [4096.5, 256]; st_write(os.path.join(d, S1), h, data)
@case('st_shape_1e30')
def _(d):
    h, data = hd(d); s = json.dumps(h).replace('"shape": [4096, 256]', '"shape": [1e30, 256]', 1).encode(); st_write(os.path.join(d, S1), None, data, raw_hdr=s)
@case('st_dtype_unknown')
def _(d):
    h, data = hd(d); h[E]['dtype'] = 'Q9'; st_write(os.path.join(d, S1), h, data)
@case('st_offsets_reversed')
def _(d):
    h, data = hd(d); a, b = h[E]['data_offsets']; h[E]['data_offsets'] = [b, a]; st_write(os.path.join(d, S1), h, data)
@case('st_offsets_past_end')
def _(d):
    h, data = hd(d); h[G]['data_offsets'] = [len(data) - 100, len(data) - 100 + 1048576]; st_write(os.path.join(d, S1), h, data)
@case('st_offsets_overlap')
def _(d):
    h, data = hd(d); o = h[E]['data_offsets']; h[G]['data_offsets'] = [o[0], o[0] + 1048576]; st_write(os.path.join(d, S1), h, data)
@case('st_offsets_huge')
def _(d):
    h, data = hd(d); h[G]['data_offsets'] = [(1 << 64) - 1048576, (1 << 64) ]; st_write(os.path.join(d, S1), h, data)
@case('st_duplicate_key')
def _(d):
    h, data = hd(d); s = json.dumps(h); t = json.dumps({E: h[E]})[1:-1]; s = s[:-1] + ', ' + t + '}'; st_write(os.path.join(d, S1), None, data, raw_hdr=s.encode())
@case('st_embed_wrong_shape')
def _(d):
    h, data = hd(d); h[E]['shape'] = [4096, 128]; h[E]['data_offsets'] = [0, 4096 * 128 * 2]; st_write(os.path.join(d, S1), h, data)
@case('st_metadata_not_object')
def _(d):
    h, data = hd(d); h['__metadata__'] = 5; st_write(os.path.join(d, S1), h, data)
@case('st_data_cut')
def _(d):
    p = os.path.join(d, S1); b = open(p, 'rb').read(); open(p, 'wb').write(b[:len(b) // 2])
def idx(d, f):
    p = os.path.join(d, 'model.safetensors.index.json'); j = json.load(open(p)); f(j); open(p, 'w').write(json.dumps(j))
@case('idx_missing_shard')
def _(d): idx(d, lambda j: j['weight_map'].__setitem__(E, 'model-00009-of-00009.safetensors'))
@case('idx_traversal')
def _(d): idx(d, lambda j: j['weight_map'].__setitem__(E, '../../../../etc/passwd'))
@case('idx_abs_path')
def _(d): idx(d, lambda j: j['weight_map'].__setitem__(E, '/etc/passwd'))
@case('idx_value_number')
def _(d): idx(d, lambda j: j['weight_map'].__setitem__(E, 5))
@case('idx_bad_json')
def _(d): open(os.path.join(d, 'model.safetensors.index.json'), 'a').write(',,')
@case('idx_tensor_not_in_shard')
def _(d): idx(d, lambda j: j['weight_map'].__setitem__('model.decoder.nonexistent.weight', S1))
def cfg(d, f, raw=None):
    p = os.path.join(d, 'config.json')
    if raw is not None: open(p, 'w').write(raw); return
    j = json.load(open(p)); f(j['text_config'] if 'text_config' in j else j, j); open(p, 'w').write(json.dumps(j))
@case('cfg_trailing_comma')
def _(d): cfg(d, None, raw=open(os.path.join(d, 'config.json')).read().rstrip().rstrip('}') + ',}')
@case('cfg_empty')
def _(d): cfg(d, None, raw='')
@case('cfg_array')
def _(d): cfg(d, None, raw='[]')
for k, v in [('hidden_size', 0), ('hidden_size', -256), ('hidden_size', 1e30), ('hidden_size', '256'), ('hidden_size', 2**31),
             ('hidden_size', 2**40), ('hidden_size', 255), ('num_hidden_layers', 10**9), ('num_hidden_layers', 0),
             ('vocab_size', 2**31 - 1), ('vocab_size', 2**40), ('vocab_size', 0), ('head_dim', 2**20), ('num_attention_heads', 2**20),
             ('num_key_value_heads', 3), ('num_experts', 0), ('top_k_experts', 1000), ('sliding_window', -1),
             ('sliding_window', 2**62), ('max_position_embeddings', 0), ('max_position_embeddings', 2**62),
             ('rms_norm_eps', -1.0), ('rms_norm_eps', 1e308), ('layer_types', ['sliding_attention']), ('layer_types', 'full'),
             ('intermediate_size', 2**40), ('moe_intermediate_size', 0), ('final_logit_softcapping', -30.0), ('hidden_size', 2.5)]:
    def mk(k=k, v=v):
        def f(d): cfg(d, lambda t, j: t.__setitem__(k, v))
        return f
    cases.append((f'cfg_{k}={json.dumps(v)[:20]}', mk()))
@case('cfg_canvas_0')
def _(d): cfg(d, lambda t, j: j.__setitem__('canvas_length', 0))
@case('cfg_canvas_2^40')
def _(d): cfg(d, lambda t, j: j.__setitem__('canvas_length', 2**40))
@case('cfg_canvas_-1')
def _(d): cfg(d, lambda t, j: j.__setitem__('canvas_length', -1))
@case('cfg_no_text_config')
def _(d): cfg(d, lambda t, j: j.pop('text_config'))
@case('cfg_rope_theta_neg')
def _(d): cfg(d, None, raw=open(os.path.join(d, 'config.json')).read().replace('"rope_theta": ', '"rope_theta": -', 1))
def tok(d, raw=None, f=None):
    p = os.path.join(d, 'tokenizer.json')
    if raw is not None: open(p, 'w').write(raw); return
    j = json.load(open(p)); f(j); open(p, 'w').write(json.dumps(j))
@case('tok_truncated')
def _(d): s = open(os.path.join(d, 'tokenizer.json')).read(); tok(d, raw=s[:len(s) // 2])
@case('tok_empty')
def _(d): tok(d, raw='')
@case('tok_array')
def _(d): tok(d, raw='[1]')
@case('tok_no_model')
def _(d): tok(d, f=lambda j: j.pop('model'))
@case('tok_vocab_id_huge')
def _(d): tok(d, f=lambda j: j['model']['vocab'].__setitem__('zzzhuge', 2**40))
@case('tok_vocab_id_negative')
def _(d): tok(d, f=lambda j: j['model']['vocab'].__setitem__('zzzneg', -5))
@case('tok_vocab_id_dup')
def _(d): tok(d, f=lambda j: j['model']['vocab'].__setitem__('zzzdup', 7))
@case('tok_vocab_empty')
def _(d): tok(d, f=lambda j: j['model'].__setitem__('vocab', {}))
@case('tok_merge_unknown')
def _(d): tok(d, f=lambda j: j['model']['merges'].insert(0, ['qqqx', 'qqqy'] if isinstance(j['model']['merges'][0], list) else 'qqqx qqqy'))
@case('tok_merge_bad_form')
def _(d): tok(d, f=lambda j: j['model']['merges'].insert(0, 'nospace'))
@case('tok_added_id_huge')
def _(d): tok(d, f=lambda j: j['added_tokens'].append({'id': 2**31 + 5, 'content': '<zz>', 'special': True}))
@case('tok_added_id_past_vocab')
def _(d): tok(d, f=lambda j: j['added_tokens'].append({'id': 5000, 'content': '<zz>', 'special': True}))
@case('tok_model_type_wordpiece')
def _(d): tok(d, f=lambda j: j['model'].__setitem__('type', 'WordPiece'))
def gen(d, raw):
    open(os.path.join(d, 'generation_config.json'), 'w').write(raw)
@case('gen_bad_json')
def _(d): gen(d, '{"eos_token_id": [1,}')
@case('gen_eos_huge')
def _(d): gen(d, '{"eos_token_id": 1e12}')
@case('gen_eos_string')
def _(d): gen(d, '{"eos_token_id": "x"}')
@case('gen_eos_neg')
def _(d): gen(d, '{"eos_token_id": [-3]}')
@case('gen_steps_huge')
def _(d): gen(d, '{"max_denoising_steps": 1e300}')
@case('gen_temperature_neg')
def _(d): gen(d, '{"temperature": -1}')
@case('gen_empty')
def _(d): gen(d, '')
want = sys.argv[3:] if len(sys.argv) > 3 else None
for name, f in cases:
    if want and not any(w in name for w in want): continue
    d = os.path.join(OUT, name.replace('/', '_'))
    shutil.rmtree(d, ignore_errors=True); shutil.copytree(SRC, d); f(d)
    try:
        r = subprocess.run([BIN, 'run', '-m', d, '-p', 'hi', '-n', '8', '-s', '1', '-t', '1'], capture_output=True, timeout=120)
        rc, err = r.returncode, r.stderr.decode(errors='replace').strip().splitlines()
    except subprocess.TimeoutExpired:
        rc, err = 'TIMEOUT', []
    bad = (not isinstance(rc, int)) or rc < 0 or rc >= 128 or any('Sanitizer' in l or 'runtime error' in l for l in err)
    msg = ' | '.join(err[-2:])[:400]
    print(f"{'BAD ' if bad else ''}{name}: rc {rc}: {msg}", flush=True)
    if not bad: shutil.rmtree(d, ignore_errors=True)
