"""A stand-in for Transformers' DiffusionGemmaForBlockDiffusion with the same parameter tree (names,
shapes, tied encoder/decoder weights), for tests of the training machinery where Transformers is
not installed (selftest.py on a CPU machine with Debian's torch). It has no forward of its own:
training runs fastfwd.OwnForward over its parameters, as train.py --forward own does over the real
model. It is never exported or shipped.
"""

import torch
from torch import nn


class _Cfg:
    """Attribute access plus to_dict(), like a Transformers config."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def to_dict(self):
        return {k: (v.to_dict() if isinstance(v, _Cfg) else v) for k, v in self.__dict__.items()}

    def get_text_config(self):
        return self.text_config


class _Norm(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))


def _lin(i, o):
    return nn.Linear(i, o, bias=False)


class _Attn(nn.Module):
    def __init__(self, H, nh, nkv, d, has_v):
        super().__init__()
        self.q_proj, self.k_proj, self.o_proj = _lin(H, nh * d), _lin(H, nkv * d), _lin(nh * d, H)
        self.v_proj = _lin(H, nkv * d) if has_v else None
        self.q_norm, self.k_norm = _Norm(d), _Norm(d)


class _Mlp(nn.Module):
    def __init__(self, H, I):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = _lin(H, I), _lin(H, I), _lin(I, H)


class _Router(nn.Module):
    def __init__(self, H, E):
        super().__init__()
        self.proj = _lin(H, E)
        self.scale = nn.Parameter(torch.ones(H))
        self.per_expert_scale = nn.Parameter(torch.ones(E))


class _Experts(nn.Module):
    def __init__(self, H, E, Im):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.randn(E, 2 * Im, H) * 0.02)
        self.down_proj = nn.Parameter(torch.randn(E, H, Im) * 0.02)


class _Layer(nn.Module):
    def __init__(self, tc, full):
        super().__init__()
        H = tc.hidden_size
        nkv, d = ((tc.num_global_key_value_heads, tc.global_head_dim) if full
                  else (tc.num_key_value_heads, tc.head_dim))
        self.self_attn = _Attn(H, tc.num_attention_heads, nkv, d, not full)
        self.mlp = _Mlp(H, tc.intermediate_size)
        self.router = _Router(H, tc.num_experts)
        self.experts = _Experts(H, tc.num_experts, tc.moe_intermediate_size)
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm_1", "pre_feedforward_layernorm_2", "post_feedforward_layernorm_2",
                  "post_feedforward_layernorm"):
            setattr(self, n, _Norm(H))
        self.register_buffer("layer_scalar", torch.ones(1))


class _Decoder(nn.Module):
    def __init__(self, tc):
        super().__init__()
        H = tc.hidden_size
        self.embed_tokens = nn.Embedding(tc.vocab_size, H)
        self.layers = nn.ModuleList([_Layer(tc, t == "full_attention") for t in tc.layer_types])
        self.norm = _Norm(H)
        sc = _Mlp(H, tc.intermediate_size)
        sc.pre_norm = _Norm(H)
        self.self_conditioning = sc

    def forward(self, *args, **kw):
        raise NotImplementedError("standin: train with fastfwd.OwnForward (train.py --forward own)")


class _EncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("layer_scalar", torch.ones(1))


class StandIn(nn.Module):
    """model.model.decoder / model.model.encoder.language_model / model.lm_head, as in Transformers,
    with the encoder's text weights and lm_head tied to the decoder's (spec 3.1)."""

    def __init__(self, text_config, canvas_length, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        tc = _Cfg(**text_config)
        self.config = _Cfg(text_config=tc, canvas_length=canvas_length)
        self.model = nn.Module()
        self.model.decoder = _Decoder(tc)
        enc = nn.Module()
        enc.language_model = nn.Module()
        enc.language_model.layers = nn.ModuleList([_EncoderLayer() for _ in tc.layer_types])
        self.model.encoder = enc
        self.lm_head = _lin(tc.hidden_size, tc.vocab_size)
        self.lm_head.weight = self.model.decoder.embed_tokens.weight
        for m in self.modules():
            if isinstance(m, nn.Linear) and m is not self.lm_head:
                nn.init.normal_(m.weight, std=0.02)
        nn.init.normal_(self.model.decoder.embed_tokens.weight, std=0.02)
