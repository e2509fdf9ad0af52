"""The PyTorch peer of dtrain's training loop for scripts/bench/train_vs_torch.sh.

Trains the reference model (tests/reference) on random windows of a text file's bytes with the
same step as dtrain (forward, backward, global-norm clip, AdamW) and prints one line:
    tokens_per_s=<median over the timed steps> flops_per_token=<6N + 6LTC>
The shape is given with dtrain's recipe keys, e.g. --set model.n_layer=12 --set train.seq_len=256.

--mode picks how PyTorch runs it: eager (the reference model as written: explicit masked softmax,
PyTorch 1.13's best), fast (PyTorch 2's best eager settings: fused scaled_dot_product_attention
and fused AdamW) or compile (fast under torch.compile: Inductor's generated C++ on CPU; the
compilation happens in the untimed warm-up steps).
--device cuda runs it on the GPU (scripts/gpu/bench.sh): at --set run.precision=fp32 in float32,
its matmuls at --set run.matmul_precision (torch.set_float32_matmul_precision: highest, TF32 off;
high, TF32), as dtrain's CUDA backend computes them. Not medium: dtrain then multiplies bf16
inputs, but PyTorch has no bf16 GEMM for float32 tensors on CUDA and runs medium as TF32, so the
row would compare two precisions. At run.precision=bf16 it runs under torch.autocast(bfloat16),
PyTorch's mixed precision (float32 parameters and optimizer, bf16 matmuls and most activations),
the peer of dtrain's bf16 storage. The model is made on the GPU with PyTorch's own initial
values: they do not change the speed, and drawing a 1B model's in float64 on one host thread
takes seconds that a short GPU run cannot spare. The step time includes waiting for the GPU.
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests", "reference"))
import torch_model as tm  # noqa: E402
import torch_training as tt  # noqa: E402

# dtrain's defaults for the keys this peer understands (recipe.h); --set overrides them.
DEFAULTS = {"model.family": "gpt2", "model.n_layer": 4, "model.n_head": 4, "model.n_kv_head": 0,
            "model.d_model": 128, "model.d_ff": 0, "model.vocab_size": 256,
            "model.max_seq_len": 256, "train.seq_len": 128, "train.batch_size": 16,
            "train.micro_batch": 16, "run.matmul_precision": "highest",
            "run.precision": "fp32"}


def parse_settings(assignments):
    settings = dict(DEFAULTS)
    for assignment in assignments:
        key, _, value = assignment.partition("=")
        if key not in settings:
            sys.exit(f"torch_train.py: --set {assignment}: unknown key; known: {sorted(settings)}")
        settings[key] = type(settings[key])(value)
    return settings


def model_shape(s):
    d_model, family = s["model.d_model"], s["model.family"]
    if s["model.d_ff"] == 0 and family != "gpt2":
        sys.exit("torch_train.py: give model.d_ff explicitly for llama")
    d_ff = s["model.d_ff"] or 4 * d_model
    n_kv_head = s["model.n_kv_head"] or s["model.n_head"]
    return tm.ModelShape(family, s["model.n_layer"], s["model.n_head"], n_kv_head, d_model, d_ff,
                         s["model.vocab_size"], s["model.max_seq_len"])


def flops_per_token(model, shape, seq_len):
    """6 per parameter (forward 2, backward 4) excluding position embeddings, plus attention's
    6 * L * T * C, the same estimate dtrain logs MFU with."""
    n = sum(p.numel() for name, p in model.named_parameters() if name != "wpe.weight")
    return 6 * n + 6 * shape.n_layer * seq_len * shape.d_model


def apply_mode(model, mode):
    """Switches the reference to `mode` (see the module's doc); returns (the module to call,
    options for AdamW)."""
    if mode == "eager":
        return model, {}
    if not hasattr(F, "scaled_dot_product_attention"):
        sys.exit(f"--mode {mode} needs PyTorch 2 (this is {torch.__version__})")
    tm.causal_attention = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return (torch.compile(model) if mode == "compile" else model), {"fused": True}


def add_common_arguments(parser):
    parser.add_argument("--data", required=True, help="text file; its bytes are the tokens")
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--discard", type=int, default=2, help="untimed warm-up steps")
    parser.add_argument("--mode", choices=("eager", "fast", "compile"), default="eager")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")


def random_windows(text, batch, seq_len, generator):
    """(batch, seq_len + 1) byte tokens starting at random offsets."""
    starts = torch.randint(0, len(text) - seq_len - 1, (batch,), generator=generator)
    return torch.stack([text[s:s + seq_len + 1] for s in starts.tolist()])


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_common_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1337)

    s = parse_settings(args.set)
    shape = model_shape(s)
    device = torch.device(args.device)
    if args.device == "cuda":
        if s["run.precision"] == "fp32" and s["run.matmul_precision"] == "medium":
            sys.exit("torch_train.py: PyTorch runs float32 GEMMs at medium as TF32 on CUDA, not "
                     "on bf16 inputs as dtrain does: use run.matmul_precision=high (TF32 on both "
                     "sides) or run.precision=bf16")
        torch.set_float32_matmul_precision(s["run.matmul_precision"])
        torch.backends.cudnn.allow_tf32 = False
        with device:
            model = tm.build_model(shape)
    else:
        model = tm.build_model(shape)
        tm.load_weights(model, tm.random_weights(model, seed=1337))
    train = tt.TrainSettings(steps=args.steps, batch_size=s["train.batch_size"],
                             micro_batch=s["train.micro_batch"], seq_len=s["train.seq_len"])
    runner, adamw_options = apply_mode(model, args.mode)
    optimizer = tt.make_adamw(model, train, **adamw_options)
    with open(args.data, "rb") as f:
        text = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    generator = torch.Generator().manual_seed(1337)

    step_s = []
    for step in range(args.steps):
        tokens = random_windows(text, train.batch_size, train.seq_len, generator).to(device)
        start = time.perf_counter()
        with torch.autocast(args.device, torch.bfloat16, enabled=s["run.precision"] == "bf16"):
            tt.forward_backward(runner, tokens, train)
        tt.clip_and_update(model, optimizer, step, train)
        if args.device == "cuda":
            torch.cuda.synchronize()
        step_s.append(time.perf_counter() - start)
    tokens_per_step = train.batch_size * train.seq_len
    tokens_per_s = statistics.median(tokens_per_step / t for t in step_s[args.discard:])
    print(f"tokens_per_s={tokens_per_s:.1f} "
          f"flops_per_token={flops_per_token(model, shape, train.seq_len)}"
          + (f" peak_mib={torch.cuda.max_memory_allocated() / 2**20:.0f}"
             if args.device == "cuda" else ""))


if __name__ == "__main__":
    main()
