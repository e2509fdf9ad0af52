"""Checks of the PyTorch reference itself, so a mistake in it cannot hide behind agreement.

Each check returns (name, ok, detail). They need no dtrain binary:
- gradients with accumulation equal float64 central finite differences of the batch-mean loss;
- the attention is causal (a later token never changes an earlier logit);
- grouped-query attention equals multi-head attention with each kv head repeated for its
  query group (query head h uses kv head h // (n_head / n_kv_head));
- RoPE scores depend only on the distance between positions;
- the GPT-2 GELU is HF's gelu_new formula.
"""
import math

import torch

import torch_model as tm
import torch_training as tt

_GPT2 = tm.ModelShape("gpt2", n_layer=2, n_head=2, n_kv_head=2, d_model=16, d_ff=64,
                      vocab_size=23, max_seq_len=8)
_LLAMA_GQA = tm.ModelShape("llama", n_layer=2, n_head=4, n_kv_head=2, d_model=16, d_ff=24,
                           vocab_size=23, max_seq_len=8, norm_eps=1e-6)


def _model64(shape, seed=1):
    model = tm.build_model(shape, torch.float64)
    tm.load_weights(model, tm.random_weights(model, seed))
    return model


def _tokens(shape, batch, seq_len, seed=2):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, shape.vocab_size, (batch, seq_len), generator=generator)


def check_finite_differences(shape, entries_per_tensor=2, step=1e-5):
    """Autograd through 2 accumulated micro-batches vs central differences of the whole-batch
    loss, on a few entries of every tensor."""
    model = _model64(shape)
    tokens = _tokens(shape, batch=4, seq_len=7)
    settings = tt.TrainSettings(steps=1, batch_size=4, micro_batch=2, seq_len=6)
    tt.forward_backward(model, tokens, settings)

    def batch_loss():
        with torch.no_grad():
            return tt.mean_cross_entropy(model(tokens[:, :-1]), tokens[:, 1:]).item()

    generator = torch.Generator().manual_seed(3)
    worst = 0.0
    for name, param in model.named_parameters():
        flat, grad = param.data.view(-1), param.grad.view(-1)
        for index in torch.randint(0, flat.numel(), (entries_per_tensor,), generator=generator):
            saved = flat[index].item()
            flat[index] = saved + step
            plus = batch_loss()
            flat[index] = saved - step
            minus = batch_loss()
            flat[index] = saved
            numeric = (plus - minus) / (2 * step)
            worst = max(worst, abs(numeric - grad[index].item()) / max(1e-3, abs(numeric)))
    return f"finite_differences_{shape.family}", worst < 1e-6, f"max rel err {worst:.1e}"


def check_causal(shape):
    model = _model64(shape)
    tokens = _tokens(shape, batch=2, seq_len=8)
    changed = tokens.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % shape.vocab_size
    with torch.no_grad():
        diff = (model(tokens)[:, :5] - model(changed)[:, :5]).abs().max().item()
    return f"causal_{shape.family}", diff == 0.0, f"max change before position 5: {diff:.1e}"


def check_gqa_is_repeated_mha(shape):
    gqa = _model64(shape)
    mha_shape = tm.ModelShape(**{**shape.__dict__, "n_kv_head": shape.n_head})
    mha = tm.build_model(mha_shape, torch.float64)
    group, D = shape.n_head // shape.n_kv_head, shape.head_dim
    weights = {}
    for name, param in gqa.named_parameters():
        if name.endswith(("k_proj.weight", "v_proj.weight")):  # (Hkv*D, C) -> (H*D, C)
            param = param.view(shape.n_kv_head, D, -1).repeat_interleave(group, dim=0)
            param = param.reshape(shape.n_head * D, -1)
        weights[name] = param.detach()
    tm.load_weights(mha, weights)
    tokens = _tokens(shape, batch=2, seq_len=8)
    with torch.no_grad():
        diff = (gqa(tokens) - mha(tokens)).abs().max().item()
    return "gqa_equals_repeated_mha", diff < 1e-12, f"max logit diff {diff:.1e}"


def check_rope_relative():
    """q at position p and k at p + d give the same score for every p."""
    D, T, d = 8, 12, 3
    cos, sin = tm.rope_cos_sin(T, D, 10000.0, torch.float64)
    generator = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, D, generator=generator, dtype=torch.float64)
    scores = [(tm.apply_rope(q, cos[p], sin[p]) * tm.apply_rope(k, cos[p + d], sin[p + d])).sum()
              for p in range(T - d)]
    spread = (max(scores) - min(scores)).item()
    # Position 1 must actually rotate (the check above also holds for no rotation at all).
    moved = (tm.apply_rope(q, cos[1], sin[1]) - q).abs().max().item()
    return "rope_relative_position", spread < 1e-12 and moved > 1e-3, f"score spread {spread:.1e}"


def check_gelu():
    x = torch.linspace(-6, 6, 1001, dtype=torch.float64)
    formula = 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
    diff = (tm.gelu_tanh(x) - formula).abs().max().item()
    return "gelu_tanh", diff < 1e-12, f"max diff {diff:.1e}"


def run_all():
    return [check_finite_differences(_GPT2), check_finite_differences(_LLAMA_GQA),
            check_causal(_GPT2), check_causal(_LLAMA_GQA), check_gqa_is_repeated_mha(_LLAMA_GQA),
            check_rope_relative(), check_gelu()]
