"""Our own training forward for DiffusionGemma, written from the spec (sections 4 and 5) over the
parameters of Transformers' DiffusionGemmaForBlockDiffusion (the same nn.Parameter objects, so
training it trains the Transformers model and hfmodel.export writes it unchanged).

Why: Transformers' public forward re-runs the encoder for every decoder pass and spends most of a
training step in small kernels, masks and MoE bookkeeping; a 10 M-parameter model then leaves the
H200 mostly idle. This module runs the encoder once per batch with flash attention (causal), keeps
its K/V (with gradients) for the two decoder passes, and computes the tiny MoE densely over all
experts with top-k weights (zero for unselected experts, so outputs and gradients equal the sparse
form).

It is never trusted blindly: hfmodel.consistency_check compares its decoder logits (and the
encoder's final hidden state used by the AR loss) with Transformers' public forward and with the
cached inference path, and train.py falls back to the public forward if they disagree.
"""

import math

import torch
import torch.nn.functional as F


def _rms(x, w=None, eps=1e-6):
    """RMSNorm (spec 4.1) in fp32, cast back; the weight multiplies directly (no 1 + w)."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if w is not None:
        y = y * w.float()
    return y.to(x.dtype)


def _cfg(tc, key):
    """A text-config value; falls back to the serialised dict where attribute access refuses."""
    try:
        return getattr(tc, key)
    except Exception:  # noqa: BLE001 - e.g. AmbiguousGlobalPerLayerAttributeError
        return tc.to_dict()[key]


def _gelu(x):
    return F.gelu(x, approximate="tanh")


def _torch_at_least(major, minor):
    try:
        v = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return v >= (major, minor)


# scaled_dot_product_attention with enable_gqa needs torch >= 2.5 (the GPU machine has 2.x);
# older torch (Debian's 1.13 on the CPU machines, for selftest.py) takes the explicit form below.
_SDPA_GQA = hasattr(F, "scaled_dot_product_attention") and _torch_at_least(2, 5)


def _attention(q, k, v, mask=None, causal=False):
    """Attention with scale 1 (spec 4.4: the q/k norms replace 1/sqrt(d)). q [B, nh, Tq, d],
    k, v [B, nkv, Tk, d] (nh a multiple of nkv: GQA), mask bool [B, 1, Tq, Tk] (True = attend) or
    causal. Returns [B, nh, Tq, d]."""
    if _SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=1.0,
                                              enable_gqa=q.shape[1] != k.shape[1])
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    s = q @ k.transpose(-1, -2)
    if causal:
        Tq, Tk = q.shape[2], k.shape[2]
        s = s.masked_fill(torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).triu(Tk - Tq + 1), float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s.float(), -1).to(v.dtype) @ v


class OwnForward:
    """encode(seq) -> state; decode(state, canvas, mask, pos, sc_logits, sc_mask) -> logits."""

    def __init__(self, model):
        tc = model.config.text_config
        self.tc = tc
        self.dec = model.model.decoder
        self.enc_layers = model.model.encoder.language_model.layers
        self.E = self.dec.embed_tokens.weight
        self.H = self.E.shape[1]
        self.eps = float(_cfg(tc, "rms_norm_eps"))
        self.cap = float(_cfg(tc, "final_logit_softcapping"))
        self.top_k = int(_cfg(tc, "top_k_experts"))
        # Per-layer attention geometry read from the weights themselves (Transformers 5.17 refuses
        # global access to per-layer config attributes such as num_key_value_heads):
        # head_dim = q_norm size, heads = q_proj rows / head_dim, KV heads = k_proj rows / head_dim.
        self.geo = []   # (n_heads, n_kv, head_dim) per layer
        for layer in self.dec.layers:
            at = layer.self_attn
            d = at.q_norm.weight.shape[0]
            self.geo.append((at.q_proj.weight.shape[0] // d, at.k_proj.weight.shape[0] // d, d))
        self.types = list(_cfg(tc, "layer_types"))
        rp = _cfg(tc, "rope_parameters")
        self.rope = {}
        for t in set(self.types):
            p = rp[t] if t in rp else rp
            theta = float(p.get("rope_theta", 10000.0))
            d = next(g[2] for g, tt in zip(self.geo, self.types) if tt == t)
            if p.get("rope_type", "default") == "proportional":
                # spec 4.3: rope_angles = int(factor * d / 2) rotated pairs, exponent over the full d
                n_rot = int(float(p.get("partial_rotary_factor", 1.0)) * d / 2)
            else:
                n_rot = d // 2
            inv = torch.zeros(d // 2, dtype=torch.float64)
            i = torch.arange(n_rot, dtype=torch.float64)
            inv[:n_rot] = theta ** (-2.0 * i / d)
            self.rope[t] = inv.float()
        self.embed_scale = float(torch.tensor(self.H ** 0.5, dtype=self.E.dtype))
        # Whether the encoder's last hidden state (the AR co-loss input) is taken after the final
        # norm; set by hfmodel.consistency_check to whatever Transformers' encoder returns.
        self.ar_normed = True

    # -- pieces ---------------------------------------------------------------------------------
    def _cos_sin(self, t, pos):
        """pos [B, T] -> cos, sin [B, 1, T, d] (rotate-half layout: angle i repeated at i and i + d/2)."""
        inv = self.rope[t].to(pos.device)
        ang = pos.float()[..., None] * inv
        ang = torch.cat([ang, ang], -1)[:, None]
        return ang.cos(), ang.sin()

    @staticmethod
    def _apply_rope(x, cos, sin):
        h = x.shape[-1] // 2
        rot = torch.cat([-x[..., h:], x[..., :h]], -1)
        return (x.float() * cos + rot.float() * sin).to(x.dtype)

    def _qkv(self, li, layer, a, pos):
        """a [B, T, H] normed input -> q [B, nh, T, d], k, v [B, nkv, T, d] (spec 4.4 step 2)."""
        at = layer.self_attn
        nh, nkv, d = self.geo[li]
        B, T, _ = a.shape
        q = at.q_proj(a).view(B, T, nh, d)
        k_raw = at.k_proj(a).view(B, T, nkv, d)
        v_raw = at.v_proj(a).view(B, T, nkv, d) if getattr(at, "v_proj", None) is not None else k_raw
        q = _rms(q, at.q_norm.weight, self.eps).transpose(1, 2)
        k = _rms(k_raw, at.k_norm.weight, self.eps).transpose(1, 2)
        v = _rms(v_raw, None, self.eps).transpose(1, 2)
        cos, sin = self._cos_sin(self.types[li], pos)
        return self._apply_rope(q, cos, sin), self._apply_rope(k, cos, sin), v

    def _ffn(self, layer, x, attn_out, scalar):
        """Residual, dense GeGLU, MoE and the layer scalar (spec 4.4 steps 4-7, 4.6)."""
        r = x + _rms(attn_out, layer.post_attention_layernorm.weight, self.eps)
        mlp = layer.mlp
        hd = _rms(r, layer.pre_feedforward_layernorm.weight, self.eps)
        m = mlp.down_proj(_gelu(mlp.gate_proj(hd)) * mlp.up_proj(hd))
        m = _rms(m, layer.post_feedforward_layernorm_1.weight, self.eps)
        # router on the un-normalised residual r, fp32 logits
        ro = layer.router
        u = _rms(r, None, self.eps) * ro.scale.to(r.dtype) * (self.H ** -0.5)
        s = F.linear(u.float(), ro.proj.weight.float())
        p = torch.softmax(s, -1)
        topv, topi = p.topk(self.top_k, -1)
        topv = topv / topv.sum(-1, keepdim=True)
        topv = topv * ro.per_expert_scale.float()[topi]
        # zeros of topv's dtype: under CUDA autocast softmax returns fp32 (p and topv agree); under
        # CPU autocast (torch 1.13) p stays bf16 while topv is promoted to fp32 by the scale
        w = torch.zeros(p.shape, dtype=topv.dtype, device=p.device).scatter(-1, topi, topv)   # [B, T, E]
        xe = _rms(r, layer.pre_feedforward_layernorm_2.weight, self.eps)
        ex = layer.experts
        Ei = ex.gate_up_proj.shape[1] // 2
        gu = torch.einsum("bth,eih->btei", xe, ex.gate_up_proj)
        act = _gelu(gu[..., :Ei]) * gu[..., Ei:]                               # [B, T, E, I]
        act = act * w.to(act.dtype)[..., None]
        g = torch.einsum("btei,ehi->bth", act, ex.down_proj)
        g = _rms(g, layer.post_feedforward_layernorm_2.weight, self.eps)
        out = r + _rms(m + g, layer.post_feedforward_layernorm.weight, self.eps)
        return out * scalar.to(out.dtype)

    def _attn_out(self, layer, o):
        B, nh, T, d = o.shape
        return layer.self_attn.o_proj(o.transpose(1, 2).reshape(B, T, nh * d))

    # -- encoder / decoder ------------------------------------------------------------------------
    def encode(self, seq):
        """seq [B, L] clean tokens -> {"kv": [(k, v)] per layer ([B, nkv, L, d]), "h": the last
        hidden state [B, L, H] (after the final norm if ar_normed)}. Causal over the whole sequence (contexts stay below the sliding window,
        which train.py enforces), as the encoder sees it at inference."""
        B, L = seq.shape
        pos = torch.arange(L, device=seq.device)[None].expand(B, L)
        x = F.embedding(seq, self.E) * self.embed_scale
        kv = []
        for li, layer in enumerate(self.dec.layers):
            a = _rms(x, layer.input_layernorm.weight, self.eps)
            q, k, v = self._qkv(li, layer, a, pos)
            kv.append((k, v))
            o = _attention(q, k, v, causal=True)
            x = self._ffn(layer, x, self._attn_out(layer, o), self.enc_layers[li].layer_scalar)
        return {"kv": kv, "h": _rms(x, self.dec.norm.weight, self.eps) if self.ar_normed else x}

    def soft_embedding(self, sc_logits, sc_mask):
        """Self-conditioning signal (spec 5): softmax(logits) . E * sqrt(H), zero where sc_mask is False."""
        P = torch.softmax(sc_logits.to(self.E.dtype).float(), -1).to(self.E.dtype)
        soft = (P @ self.E) * self.embed_scale
        if sc_mask is not None:
            soft = soft * sc_mask.to(soft.dtype)[:, None, None]
        return soft

    def decode(self, state, canvas, mask, pos, sc_logits=None, sc_mask=None):
        """canvas [B, C] at positions pos [B, C]; mask [B, 1, C, L + C] bool (context keys j < b and
        every canvas key); encoder K/V from state. Returns softcapped fp32 logits [B, C, V]."""
        e = F.embedding(canvas, self.E) * self.embed_scale
        sc = self.dec.self_conditioning
        if sc_logits is not None:
            soft = self.soft_embedding(sc_logits, sc_mask)
            hs = _rms(soft, sc.pre_norm.weight, self.eps)
            e = e + sc.down_proj(_gelu(sc.gate_proj(hs)) * sc.up_proj(hs))
        x = _rms(e, None, self.eps)
        for li, layer in enumerate(self.dec.layers):
            a = _rms(x, layer.input_layernorm.weight, self.eps)
            q, k, v = self._qkv(li, layer, a, pos)
            ck, cv = state["kv"][li]
            kk = torch.cat([ck.to(k.dtype), k], 2)
            vv = torch.cat([cv.to(v.dtype), v], 2)
            o = _attention(q, kk, vv, mask=mask)
            x = self._ffn(layer, x, self._attn_out(layer, o), layer.layer_scalar)
        h = _rms(x, self.dec.norm.weight, self.eps)
        return torch.tanh(F.linear(h, self.E).float() / self.cap) * self.cap
