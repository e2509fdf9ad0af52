"""dtrain against the independent PyTorch reference, case by case.

    /usr/bin/python3 tests/reference/test_torch_parity.py --dtrain build/dtrain
    /usr/bin/python3 tests/reference/test_torch_parity.py --reference-only

For each case it writes a recipe, random float32 weights (Hugging Face names) and a token
batch into a temporary folder, runs `parity_probe` (built next to dtrain), runs the same
training in PyTorch float32 and compares: step-0 logits, loss and every parameter gradient,
the loss and gradient norm of every step, and every parameter after the last step.

Metric: for each tensor, max |dtrain - torch| / max |torch| (relative to the tensor's largest
magnitude, so near-zero entries do not dominate); every value must be <= TOLERANCE.

--reference-only needs no binary: it runs the reference's own checks (reference_checks.py) and
compares the reference in float32 against itself in float64 under the same metric, which shows
the tolerance is attainable in float32 for these cases.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_checks  # noqa: E402
import safetensors_io  # noqa: E402
import torch_model as tm  # noqa: E402
import torch_training as tt  # noqa: E402

TOLERANCE = 1e-4
PROBE_TIMEOUT_S = 300


@dataclass
class Case:
    name: str
    shape: tm.ModelShape
    train: tt.TrainSettings
    activation_checkpointing: bool = False
    seed: int = 0


def gpt2(**overrides):
    shape = dict(family="gpt2", n_layer=2, n_head=4, n_kv_head=4, d_model=64, d_ff=256,
                 vocab_size=256, max_seq_len=32, norm_eps=1e-5)
    return tm.ModelShape(**{**shape, **overrides})


def llama(**overrides):
    shape = dict(family="llama", n_layer=2, n_head=4, n_kv_head=4, d_model=64, d_ff=96,
                 vocab_size=256, max_seq_len=32, norm_eps=1e-6, rope_theta=10000.0)
    return tm.ModelShape(**{**shape, **overrides})


def steps(batch_size=4, seq_len=16, **overrides):
    """10 AdamW steps; the cases vary schedule and clipping so each path is exercised.

    AdamW eps is 1e-6, not 1e-8: GPT-2's key bias has an exactly zero gradient (softmax ignores
    a score shift shared by all keys), so both sides see only rounding noise (~1e-11) there,
    and with eps 1e-8 AdamW would turn that noise into updates that differ by ~1e-4."""
    settings = dict(steps=10, batch_size=batch_size, micro_batch=batch_size, seq_len=seq_len,
                    lr=1e-3, min_lr=1e-4, warmup_steps=3, schedule="cosine", weight_decay=0.1,
                    beta1=0.9, beta2=0.95, eps=1e-6, grad_clip=1.0)
    return tt.TrainSettings(**{**settings, **overrides})


CASES = [
    Case("gpt2_small", gpt2(), steps()),
    Case("gpt2_checkpointing", gpt2(), steps(schedule="linear"), activation_checkpointing=True),
    Case("gpt2_odd_sizes", gpt2(vocab_size=97, d_model=48, n_head=3, n_kv_head=3, d_ff=192),
         steps(batch_size=3, seq_len=13, schedule="constant", grad_clip=0.0)),
    # A small clip threshold so clipping is certainly active together with accumulation.
    Case("gpt2_accumulation", gpt2(), steps(batch_size=6, micro_batch=2, grad_clip=0.05)),
    Case("llama_mha", llama(), steps()),
    Case("llama_gqa", llama(n_kv_head=2), steps(micro_batch=2, schedule="linear")),
    Case("llama_checkpointing_odd_t", llama(n_kv_head=2), steps(seq_len=11, grad_clip=0.05),
         activation_checkpointing=True),
]


# ---------------------------------------------------------------------------------------------
# Inputs


def recipe_yaml(case, data_file):
    """The dtrain recipe of a case. Strings and lists are written as JSON, which YAML reads."""
    s, t = case.shape, case.train
    sections = {
        "model": {"family": s.family, "n_layer": s.n_layer, "n_head": s.n_head,
                  "n_kv_head": s.n_kv_head, "d_model": s.d_model, "d_ff": s.d_ff,
                  "vocab_size": s.vocab_size, "max_seq_len": s.max_seq_len,
                  "norm_eps": s.norm_eps, "rope_theta": s.rope_theta},
        "train": {**t.__dict__, "no_decay": ["*.bias", "*norm*"]},
        "parallel": {"recompute": "full" if case.activation_checkpointing else "none"},
        # Required by recipe validation; the probe reads its batch from the batch file. Token
        # shards (llmc) rather than byte text, so that vocabularies under 256 are valid.
        "data": {"format": "llmc", "train": [data_file]},
    }
    lines = []
    for section, keys in sections.items():
        lines.append(f"{section}:")
        lines += [f"  {key}: {json.dumps(value)}" for key, value in keys.items()]
    return "\n".join(lines) + "\n"


def random_batches(case):
    """int64 (steps, batch, seq_len + 1) of uniformly random tokens."""
    t = case.train
    generator = torch.Generator().manual_seed(case.seed + 1)
    return torch.randint(0, case.shape.vocab_size, (t.steps, t.batch_size, t.seq_len + 1),
                         generator=generator)


def reference_run(case, weights, batches, dtype):
    model = tm.build_model(case.shape, dtype)
    tm.load_weights(model, weights)
    return tt.run_training(model, batches, case.train)


# ---------------------------------------------------------------------------------------------
# The probe


def run_probe(probe, case, weights, batches, folder):
    paths = {key: os.path.join(folder, f"{key}.{ext}") for key, ext in
             (("recipe", "yaml"), ("weights", "safetensors"), ("batch", "safetensors"),
              ("out", "safetensors"))}
    with open(paths["recipe"], "w") as f:
        f.write(recipe_yaml(case, paths["recipe"]))
    safetensors_io.save(paths["weights"], weights)
    safetensors_io.save(paths["batch"], {"tokens": batches.to(torch.int32)})
    command = [probe] + [arg for key, path in paths.items() for arg in (f"--{key}", path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return {name: tensor.double() for name, tensor in safetensors_io.load(paths["out"]).items()}


# ---------------------------------------------------------------------------------------------
# Comparison


def relative_error(got, want):
    """max |got - want| / max |want|; absolute when want is all zeros."""
    scale = want.abs().max().item()
    return (got - want).abs().max().item() / (scale if scale > 0 else 1.0)


def check_outputs(got, want):
    """Raises naming the first tensor the probe did not write, or wrote in the wrong shape."""
    for name in want:
        if name not in got:
            raise RuntimeError(f"probe output has no tensor '{name}'")
        if got[name].shape != want[name].shape:
            raise RuntimeError(f"probe output '{name}' has shape {tuple(got[name].shape)}, "
                               f"expected {tuple(want[name].shape)}")


def compare(got, want):
    """{quantity: (worst relative error, the tensor it was in)}."""
    def worst(prefix):
        return max((relative_error(got[n], want[n]), n) for n in want if n.startswith(prefix))

    return {"logits": (relative_error(got["logits"], want["logits"]), "logits"),
            "loss0": (relative_error(got["loss"][:1], want["loss"][:1]), "loss[0]"),
            "grads": worst("grad."),
            "losses": (relative_error(got["loss"], want["loss"]), "loss"),
            "grad_norms": (relative_error(got["grad_norm"], want["grad_norm"]), "grad_norm"),
            "final": worst("final.")}


def run_case(case, probe):
    """Returns (ok, line). Compares the probe against torch float32, or without a probe torch
    float32 against torch float64."""
    model = tm.build_model(case.shape)
    weights = tm.random_weights(model, case.seed)
    batches = random_batches(case)
    want = reference_run(case, weights, batches, torch.float32)
    if probe:
        with tempfile.TemporaryDirectory(prefix=f"parity_{case.name}_") as folder:
            got = run_probe(probe, case, weights, batches, folder)
    else:
        got, want = want, reference_run(case, weights, batches, torch.float64)
    check_outputs(got, want)
    errors = compare(got, want)
    ok = all(err <= TOLERANCE for err, _ in errors.values())
    detail = "  ".join(f"{key} {err:.1e}" for key, (err, _) in errors.items())
    _, worst_name = max(errors.values())
    return ok, f"{case.name:28s} {detail}  (worst: {worst_name})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtrain", help="the dtrain binary; parity_probe must be beside it")
    parser.add_argument("--reference-only", action="store_true",
                        help="check the reference alone: self-checks and float32 vs float64")
    parser.add_argument("--case", action="append", help="run only these cases (repeatable)")
    args = parser.parse_args()

    probe = None
    if not args.reference_only:
        if not args.dtrain:
            parser.error("--dtrain PATH is required (or --reference-only)")
        probe = os.path.join(os.path.dirname(os.path.abspath(args.dtrain)), "parity_probe")
        if not os.access(probe, os.X_OK):
            print(f"FAIL: no executable {probe}; build the parity_probe target next to dtrain")
            return 1

    results = []
    for name, ok, detail in reference_checks.run_all():
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'} reference.{name:18s} {detail}")
    what = "dtrain vs torch f32" if probe else "torch f32 vs torch f64"
    print(f"cases: {what}, max|a-b|/max|b| per tensor, tolerance {TOLERANCE:g}")
    for case in CASES:
        if args.case and case.name not in args.case:
            continue
        try:
            ok, line = run_case(case, probe)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            ok, line = False, f"{case.name:28s} {error}"
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'} {line}", flush=True)

    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
