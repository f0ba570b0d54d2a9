"""`ampp train --model gpt-*` in torch.nn: the same GPT-2-style decoder with the same parameter names, so a
state dict moves between the two as it is. Eager PyTorch as nanoGPT writes it (pre-LayerNorm blocks, causal
F.scaled_dot_product_attention, exact GELU, an output head tied to the token embedding), with ampp's one
change to the attention on CPU unless widen_attention=False.

    from gpt import Gpt, PRESETS
    model = Gpt(**PRESETS["gpt-tiny"])
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# The presets of include/ampp/train/gpt.h.
PRESETS = {
    "gpt-tiny": dict(vocab_size=256, context=64, n_layer=2, n_head=4, n_embd=128),
    "gpt-mini": dict(vocab_size=256, context=128, n_layer=4, n_head=4, n_embd=256),
    "gpt2-124m": dict(vocab_size=50257, context=1024, n_layer=12, n_head=12, n_embd=768),
}


def _linear(n_in, n_out, std):
    layer = nn.Linear(n_in, n_out)
    nn.init.normal_(layer.weight, 0.0, std)
    nn.init.zeros_(layer.bias)
    return layer


def widened_attention(q, k, v):
    """ampp's attention: on CPU, bf16/fp16 q, k, v widened to float32 for the fused kernel (2.7x faster there,
    as precise) outside autocast, the output rounded back (src/ampp/train/gpt.cpp)."""
    if q.device.type != "cpu" or q.dtype not in (torch.bfloat16, torch.float16):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with torch.autocast("cpu", enabled=False):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True).to(q.dtype)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, proj_std, widen=True):
        super().__init__()
        self.n_head = n_head
        self.widen = widen
        self.c_attn = _linear(n_embd, 3 * n_embd, 0.02)
        self.c_proj = _linear(n_embd, n_embd, proj_std)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (y.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for y in (q, k, v))
        if self.widen:
            y = widened_attention(q, k, v)
        else:  # nanoGPT as written
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Mlp(nn.Module):
    def __init__(self, n_embd, proj_std):
        super().__init__()
        self.c_fc = _linear(n_embd, 4 * n_embd, 0.02)
        self.c_proj = _linear(4 * n_embd, n_embd, proj_std)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, n_layer, widen=True):
        super().__init__()
        proj_std = 0.02 / math.sqrt(2 * n_layer)
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, proj_std, widen)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = Mlp(n_embd, proj_std)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocab_size=256, context=64, n_layer=2, n_head=4, n_embd=128, widen_attention=True):
        """widen_attention: ampp's attention (widened_attention); False: F.scaled_dot_product_attention on the
        inputs as they are, as nanoGPT writes it."""
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(context, n_embd)
        nn.init.normal_(self.wte.weight, 0.0, 0.02)
        nn.init.normal_(self.wpe.weight, 0.0, 0.02)
        self.h = nn.ModuleList(Block(n_embd, n_head, n_layer, widen_attention) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, tokens):
        x = self.wte(tokens) + self.wpe(torch.arange(tokens.shape[1], device=tokens.device))
        for block in self.h:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # the head is the token embedding (tied)
