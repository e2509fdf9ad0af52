"""dtrain's training semantics in PyTorch: loss, gradient accumulation, clipping, AdamW, LR.

What dtrain promises, stated once here:
- the step's loss is the mean cross-entropy over all batch * seq_len tokens; with gradient
  accumulation over batch / micro_batch micro-batches the gradient is that of the same mean;
- clipping is torch.nn.utils.clip_grad_norm_ on the global L2 norm (0 disables it);
- torch.optim.AdamW with two groups: no weight decay for biases and norm weights;
- the learning rate at 0-based step s is warmup, then cosine, linear or constant (lr_at);
- at run.precision bf16 the model computes with its parameters rounded to bfloat16 while the
  optimizer updates float32 masters (rounded_parameters), and its activations, the logits the
  loss reads and all their gradients are stored in bfloat16 (torch_model.bf16_activations).
"""
import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import torch_model as tm


@dataclass
class TrainSettings:
    steps: int
    batch_size: int
    micro_batch: int
    seq_len: int
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 0
    schedule: str = "cosine"  # cosine | linear | constant
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # 0 disables clipping


def lr_at(step, t):
    if step < t.warmup_steps:
        return t.lr * (step + 1) / t.warmup_steps
    progress = (step - t.warmup_steps) / max(1, t.steps - t.warmup_steps)
    if t.schedule == "cosine":
        return t.min_lr + 0.5 * (t.lr - t.min_lr) * (1 + math.cos(math.pi * progress))
    if t.schedule == "linear":
        return t.lr + (t.min_lr - t.lr) * progress
    return t.lr


def is_no_decay(name):
    """The recipe's default no_decay globs ["*.bias", "*norm*"] in HF names; GPT-2's LayerNorms
    are named ln_1, ln_2, ln_f, which dtrain calls norms."""
    return name.endswith(".bias") or "ln_" in name or "norm" in name


def make_adamw(model, t, **options):
    """`options` go to torch.optim.AdamW as they are (the benchmark's fused=True on PyTorch 2)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if is_no_decay(name) else decay).append(param)
    groups = [{"params": decay, "weight_decay": t.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=t.lr, betas=(t.beta1, t.beta2), eps=t.eps, **options)


def mean_cross_entropy(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def forward_backward(model, tokens, t):
    """tokens (batch, seq_len + 1) -> the batch's mean loss; leaves its gradient in .grad.

    Micro-batches of t.micro_batch sequences run one at a time; each micro-batch's mean is
    weighted by its share of the batch so the accumulated gradient is that of the batch mean."""
    model.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for micro in tokens.split(t.micro_batch):
        share = micro.shape[0] / tokens.shape[0]
        # The loss's logits are stored too (dtrain's fused classifier keeps them in bf16).
        loss = mean_cross_entropy(tm.stored(model(micro[:, :-1])), micro[:, 1:]) * share
        loss.backward()
        loss_sum += loss.item()
    return loss_sum


def clip_and_update(model, optimizer, step, t):
    """Clips .grad on the global norm, takes the AdamW step; returns the norm before clipping."""
    if t.grad_clip > 0:
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip).item()
    else:
        grad_norm = torch.stack([p.grad.norm() for p in model.parameters()]).norm().item()
    for group in optimizer.param_groups:
        group["lr"] = lr_at(step, t)
    optimizer.step()
    return grad_norm


@contextlib.contextmanager
def rounded_parameters(model, bf16_params):
    """With bf16_params, the model's parameters (the masters) are rounded to bfloat16, to
    nearest even, inside the block and restored after it; the gradients taken inside stay, for
    the optimizer to apply to the masters (PyTorch FSDP's param_dtype, dtrain's run.precision)."""
    if not bf16_params:
        yield
        return
    masters = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    try:
        yield
    finally:
        with torch.no_grad():
            for p, master in zip(model.parameters(), masters):
                p.copy_(master)


def run_training(model, batches, t, bf16_params=False):
    """What parity_probe reports, from the torch side. batches: int64 (steps, batch, T+1).

    Returns float64 tensors: "logits" of step 0 before any update, "loss" and "grad_norm" per
    step, "grad.<name>" the step-0 gradients before clipping, "final.<name>" after all steps
    (the masters at bf16_params)."""
    with torch.no_grad(), rounded_parameters(model, bf16_params), tm.bf16_activations(bf16_params):
        result = {"logits": model(batches[0][:, :-1]).double()}
    optimizer = make_adamw(model, t)
    losses, grad_norms = [], []
    for step in range(t.steps):
        with rounded_parameters(model, bf16_params), tm.bf16_activations(bf16_params):
            losses.append(forward_backward(model, batches[step], t))
        if step == 0:  # before clip_grad_norm_ scales them in place
            result.update({f"grad.{n}": p.grad.double().clone()
                           for n, p in model.named_parameters()})
        grad_norms.append(clip_and_update(model, optimizer, step, t))
    result["loss"] = torch.tensor(losses, dtype=torch.float64)
    result["grad_norm"] = torch.tensor(grad_norms, dtype=torch.float64)
    result.update({f"final.{n}": p.detach().double().clone() for n, p in model.named_parameters()})
    return result
