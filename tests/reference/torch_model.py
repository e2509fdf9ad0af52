"""A minimal PyTorch GPT-2 and Llama, the independent reference dtrain is checked against.

Parameter names and shapes are exactly those of Hugging Face transformers checkpoints
(GPT2Model without prefix, LlamaForCausalLM), so weights move between this model and dtrain
through safetensors files unchanged. Written for reading, not speed: attention is the
explicit masked softmax, every formula is spelled out. Works in float32 and float64.

Inside bf16_activations(), every tensor dtrain stores in bf16 at run.precision bf16 (the
activations, and in backward their gradients) is rounded to bfloat16 where dtrain stores it
(stored), while the arithmetic stays float32: what dtrain's kernels compute from bf16 inputs.
"""
import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class ModelShape:
    family: str  # gpt2 | llama
    n_layer: int
    n_head: int
    n_kv_head: int  # llama grouped-query attention; equal to n_head for gpt2
    d_model: int
    d_ff: int
    vocab_size: int
    max_seq_len: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self):
        return self.d_model // self.n_head


def _bf16(x):
    """x rounded to bfloat16 (to nearest even) and back."""
    return x.to(torch.bfloat16).to(x.dtype)


class _RoundedToBf16(torch.autograd.Function):
    """The value rounded to bfloat16 (to nearest even) and back, and so is its gradient."""

    @staticmethod
    def forward(ctx, x):
        return _bf16(x)

    @staticmethod
    def backward(ctx, grad):
        return _bf16(grad)


_bf16_activations = False


@contextlib.contextmanager
def bf16_activations(enabled=True):
    global _bf16_activations
    saved, _bf16_activations = _bf16_activations, enabled
    try:
        yield
    finally:
        _bf16_activations = saved


def stored(x):
    """x as dtrain stores it: rounded to bf16 inside bf16_activations(), else unchanged."""
    return _RoundedToBf16.apply(x) if _bf16_activations else x


def build_model(shape, dtype=torch.float32):
    model = Gpt2(shape) if shape.family == "gpt2" else Llama(shape)
    return model.to(dtype)


def causal_attention(q, k, v):
    """q (B, H, T, D), k and v (B, H, T, D) -> (B, H, T, D); softmax(q k^T / sqrt(D)) v."""
    T = q.shape[2]
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
    future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    return F.softmax(scores, dim=-1) @ v


def split_heads(x, n_head):
    """(B, T, n_head * D) -> (B, n_head, T, D)."""
    B, T, _ = x.shape
    return x.view(B, T, n_head, -1).transpose(1, 2)


def merge_heads(x):
    """(B, H, T, D) -> (B, T, H * D)."""
    B, H, T, D = x.shape
    return x.transpose(1, 2).reshape(B, T, H * D)


# ---------------------------------------------------------------------------------------------
# GPT-2


class Conv1D(nn.Module):
    """HF GPT-2's linear layer: the weight is stored (in, out), so y = x @ W + b."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_in, n_out))
        self.bias = nn.Parameter(torch.zeros(n_out))

    def forward(self, x):
        return x @ self.weight + self.bias


def gelu_tanh(x):
    """HF's gelu_new, the approximation GPT-2 was trained with:
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). PyTorch's fused kernel computes exactly
    that (reference_checks.check_gelu compares it with the formula) several times faster,
    which keeps the benchmark peer fair."""
    return F.gelu(x, approximate="tanh")


class _GeluOfSums(torch.autograd.Function):
    """GPT-2's GELU as dtrain fuses it into the GEMMs around it (cuBLASLt's GELU_AUX and DGELU
    epilogues): the GELU of the up-projection's float32 sums u, rounded once, u stored rounded;
    backward, the down-projection's float32 input gradient times GELU' at the stored u, rounded
    once."""

    @staticmethod
    def forward(ctx, u):
        stored_u = _bf16(u)
        ctx.save_for_backward(stored_u)
        return _bf16(gelu_tanh(u))

    @staticmethod
    def backward(ctx, grad):
        (stored_u,) = ctx.saved_tensors
        with torch.enable_grad():
            x = stored_u.detach().requires_grad_()
            (dx,) = torch.autograd.grad(gelu_tanh(x), x, grad)
        return _bf16(dx)


def gelu_of_sums(u):
    """gelu_tanh(u) of the up-projection's output u, inside bf16_activations() as dtrain stores
    it (_GeluOfSums)."""
    return _GeluOfSums.apply(u) if _bf16_activations else gelu_tanh(u)


class Gpt2Attention(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.n_head = shape.n_head
        self.c_attn = Conv1D(shape.d_model, 3 * shape.d_model)
        self.c_proj = Conv1D(shape.d_model, shape.d_model)

    def forward(self, x):  # x (B, T, C)
        q, k, v = stored(self.c_attn(x)).split(x.shape[-1], dim=-1)
        y = stored(causal_attention(*(split_heads(t, self.n_head) for t in (q, k, v))))
        return stored(self.c_proj(merge_heads(y)))


class Gpt2Mlp(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.c_fc = Conv1D(shape.d_model, shape.d_ff)
        self.c_proj = Conv1D(shape.d_ff, shape.d_model)

    def forward(self, x):
        return stored(self.c_proj(gelu_of_sums(self.c_fc(x))))


class Gpt2Block(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.ln_1 = nn.LayerNorm(shape.d_model, eps=shape.norm_eps)
        self.attn = Gpt2Attention(shape)
        self.ln_2 = nn.LayerNorm(shape.d_model, eps=shape.norm_eps)
        self.mlp = Gpt2Mlp(shape)

    def forward(self, x):
        x = stored(x + self.attn(stored(self.ln_1(x))))
        return stored(x + self.mlp(stored(self.ln_2(x))))


class Gpt2(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.wte = nn.Embedding(shape.vocab_size, shape.d_model)
        self.wpe = nn.Embedding(shape.max_seq_len, shape.d_model)
        self.h = nn.ModuleList(Gpt2Block(shape) for _ in range(shape.n_layer))
        self.ln_f = nn.LayerNorm(shape.d_model, eps=shape.norm_eps)

    def forward(self, tokens):  # tokens (B, T) -> logits (B, T, V)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = stored(self.wte(tokens) + self.wpe(positions))
        for block in self.h:
            x = block(x)
        return stored(self.ln_f(x)) @ self.wte.weight.T  # the output head is tied to the embedding


# ---------------------------------------------------------------------------------------------
# Llama


class RmsNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    """HF's convention: the head's two halves (x1, x2) become (-x2, x1)."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(seq_len, head_dim, theta, dtype, device=None):
    """cos and sin (T, D) of angle pos * theta^(-2i/D), each frequency used for both halves."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype=dtype, device=device), angles.sin().to(dtype=dtype, device=device)


def apply_rope(x, cos, sin):  # x (B, H, T, D), cos and sin (T, D)
    return x * cos + rotate_half(x) * sin


class LlamaAttention(nn.Module):
    def __init__(self, shape):
        super().__init__()
        D = shape.head_dim
        self.shape = shape
        self.q_proj = nn.Linear(shape.d_model, shape.n_head * D, bias=False)
        self.k_proj = nn.Linear(shape.d_model, shape.n_kv_head * D, bias=False)
        self.v_proj = nn.Linear(shape.d_model, shape.n_kv_head * D, bias=False)
        self.o_proj = nn.Linear(shape.n_head * D, shape.d_model, bias=False)

    def forward(self, x):  # x (B, T, C)
        s = self.shape
        cos, sin = rope_cos_sin(x.shape[1], s.head_dim, s.rope_theta, x.dtype, x.device)
        # dtrain's qkv is stored, then rotated in place (stored again).
        q = stored(apply_rope(split_heads(stored(self.q_proj(x)), s.n_head), cos, sin))
        k = stored(apply_rope(split_heads(stored(self.k_proj(x)), s.n_kv_head), cos, sin))
        v = split_heads(stored(self.v_proj(x)), s.n_kv_head)
        # Grouped-query attention: query head h reads kv head h // (n_head / n_kv_head).
        group = s.n_head // s.n_kv_head
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return stored(self.o_proj(stored(merge_heads(causal_attention(q, k, v)))))


class LlamaMlp(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, shape):
        super().__init__()
        self.gate_proj = nn.Linear(shape.d_model, shape.d_ff, bias=False)
        self.up_proj = nn.Linear(shape.d_model, shape.d_ff, bias=False)
        self.down_proj = nn.Linear(shape.d_ff, shape.d_model, bias=False)

    def forward(self, x):
        gate, up = stored(self.gate_proj(x)), stored(self.up_proj(x))
        return stored(self.down_proj(stored(F.silu(gate) * up)))


class LlamaBlock(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.input_layernorm = RmsNorm(shape.d_model, shape.norm_eps)
        self.self_attn = LlamaAttention(shape)
        self.post_attention_layernorm = RmsNorm(shape.d_model, shape.norm_eps)
        self.mlp = LlamaMlp(shape)

    def forward(self, x):
        x = stored(x + self.self_attn(stored(self.input_layernorm(x))))
        return stored(x + self.mlp(stored(self.post_attention_layernorm(x))))


class LlamaModel(nn.Module):
    """The body; its parameters sit under "model." as in LlamaForCausalLM."""

    def __init__(self, shape):
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.d_model)
        self.layers = nn.ModuleList(LlamaBlock(shape) for _ in range(shape.n_layer))
        self.norm = RmsNorm(shape.d_model, shape.norm_eps)

    def forward(self, tokens):
        x = stored(self.embed_tokens(tokens))
        for block in self.layers:
            x = block(x)
        return stored(self.norm(x))


class Llama(nn.Module):
    def __init__(self, shape):
        super().__init__()
        self.model = LlamaModel(shape)
        self.lm_head = nn.Linear(shape.d_model, shape.vocab_size, bias=False)

    def forward(self, tokens):  # tokens (B, T) -> logits (B, T, V)
        return self.lm_head(self.model(tokens))


# ---------------------------------------------------------------------------------------------
# Weights


def is_norm_weight(name):
    return ("ln_" in name or "norm" in name) and name.endswith(".weight")


def random_weights(model, seed, std=0.02):
    """{HF name: float32 tensor}: norm weights 1 + N(0, 0.1), everything else N(0, std).

    Norm weights and biases are randomized rather than left at 1 and 0 so a transposed or
    misnamed one shows up in the comparison."""
    generator = torch.Generator().manual_seed(seed)
    weights = {}
    for name, param in model.named_parameters():
        noise = torch.randn(param.shape, generator=generator, dtype=torch.float64)
        weights[name] = (1.0 + 0.1 * noise if is_norm_weight(name) else std * noise).float()
    return weights


def load_weights(model, weights):
    """Copies {HF name: tensor} into the model (converting dtype); names must match exactly."""
    params = dict(model.named_parameters())
    if set(params) != set(weights):
        missing, extra = set(params) - set(weights), set(weights) - set(params)
        raise ValueError(f"weight names differ: missing {sorted(missing)}, extra {sorted(extra)}")
    with torch.no_grad():
        for name, param in params.items():
            if tuple(weights[name].shape) != tuple(param.shape):
                raise ValueError(f"{name}: shape {tuple(weights[name].shape)}, "
                                 f"expected {tuple(param.shape)}")
            param.copy_(weights[name])
