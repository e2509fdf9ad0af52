"""dtrain against the independent PyTorch reference, case by case.

    /usr/bin/python3 tests/reference/test_torch_parity.py --dtrain build/dtrain
    /usr/bin/python3 tests/reference/test_torch_parity.py --reference-only

For each case it writes a recipe, random float32 weights (Hugging Face names) and a token
batch into a temporary folder, runs `parity_probe` (built next to dtrain), runs the same
training in PyTorch float32 and compares: step-0 logits, loss and every parameter gradient,
the loss and gradient norm of every step, and every parameter after the last step.

A case with tp > 1 runs `dtrain train` instead, as tp local processes (torchrun's variables) on
the same weights (train.init_from): the loss and gradient norm of every step from metrics.jsonl,
every parameter after the last step from train.export_to (step 0's logits and gradients are not
visible from outside). Its token file holds exactly batch_size windows, so that every step
trains on all of them whatever order the loader's shuffle picks; the reference takes them in
file order, and the mean loss and summed gradients differ only by the rounding of that order.

Metric: for each tensor, max |dtrain - torch| / max |torch| (relative to the tensor's largest
magnitude, so near-zero entries do not dominate); every value must be <= TOLERANCE (at
run.precision bf16, the measured BF16_BOUNDS).

--reference-only needs no binary: it runs the reference's own checks (reference_checks.py) and
compares the reference in float32 against itself in float64 under the same metric, which shows
the tolerance is attainable in float32 for these cases.
"""
import argparse
import array
import dataclasses
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_checks  # noqa: E402
import safetensors_io  # noqa: E402
import torch_model as tm  # noqa: E402
import torch_training as tt  # noqa: E402

TOLERANCE = 1e-4
PROBE_TIMEOUT_S = 300


@dataclasses.dataclass
class Case:
    name: str
    shape: tm.ModelShape
    train: tt.TrainSettings
    activation_checkpointing: bool = False
    seed: int = 0
    tp: int = 1  # > 1: `dtrain train` over tp processes instead of parity_probe
    # run.precision: bf16 computes with bf16 copies of the float32 masters and stores every
    # activation and activation gradient in bf16 (torch_model.bf16_activations).
    precision: str = "fp32"
    # Bounds in place of TOLERANCE for some of the compared keys (BF16_BOUNDS).
    bounds: dict = dataclasses.field(default_factory=dict)


# The bounds at bf16. A value within float32 rounding of a tie between two bf16 values rounds
# either way on the two sides, which moves it by 2^-8 of itself and whatever reads it with it;
# AdamW's normalised updates carry such a flip of a gradient near zero into a whole step of its
# weight. So two bf16 runs part as far as their float32 arithmetic lets them round differently:
# the reference in float32 against itself in float64 (both rounding to bf16 alike) parts as far
# as dtrain from it. Measured, worst over GPT-2, Llama, GPT-2 at tp 2 (whose all-reduces round
# each rank's partial output to bf16 before summing) and both BLAS kernels: 2.0e-3 in step 0's
# logits (one flipped value of the final norm), 4.7e-3 in its gradients, 1.2e-4 in the losses,
# 1.2e-3 in the norms, 4.1e-2 in the final parameters (the embedding's rows of rare tokens), 6.6e-2
# in a tensor's mean update (GPT-2's attention bias, whose key part barely moves); the bounds
# leave 3x. The logits' mean error keeps TOLERANCE: at most 3.0e-5 from dtrain, while a reference
# that kept its activations in float32 is 6.3e-4 and 6.9e-4 off. A tensor's update lost or cut by
# a fifth fails update_mean (a final-parameter bound relative to the weights would pass it).
BF16_BOUNDS = {"logits": 6e-3, "grads": 1.5e-2, "losses": 4e-4, "grad_norms": 4e-3,
               "final": 1.2e-1, "update_mean": 2e-1}


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
    Case("gpt2_bf16", gpt2(), steps(batch_size=6, micro_batch=2), precision="bf16",
         bounds=BF16_BOUNDS),
    Case("llama_gqa_bf16", llama(n_kv_head=2), steps(), precision="bf16", bounds=BF16_BOUNDS),
    # Tensor parallelism: heads and MLP width split over 2 ranks, the reference single-process.
    Case("gpt2_tp2", gpt2(), steps(), tp=2),
    Case("llama_gqa_tp2_checkpointing", llama(n_kv_head=2), steps(micro_batch=2, grad_clip=0.05),
         activation_checkpointing=True, tp=2),
    # bf16 activations all-reduced in bf16 between the ranks (each rank's partial output rounded
    # before the sum, the sum rounded after), against the reference's one rounding a tensor.
    Case("gpt2_tp2_bf16", gpt2(), steps(), tp=2, precision="bf16", bounds=BF16_BOUNDS),
]


# ---------------------------------------------------------------------------------------------
# Inputs


def recipe_yaml(case, data_file, extra=None):
    """The dtrain recipe of a case, with `extra`'s keys added to its sections. Strings and lists
    are written as JSON, which YAML reads."""
    s, t = case.shape, case.train
    sections = {
        "run": {"precision": case.precision},
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
    for section, keys in (extra or {}).items():
        sections[section] = {**sections.get(section, {}), **keys}
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


def windows(case):
    """A `dtrain train` case's token file, int64 (batch_size * seq_len + 1) random tokens, and
    its batch_size windows (batch_size, seq_len + 1), neighbours sharing their boundary token as
    the loader cuts them."""
    t = case.train
    generator = torch.Generator().manual_seed(case.seed + 1)
    tokens = torch.randint(0, case.shape.vocab_size, (t.batch_size * t.seq_len + 1,),
                           generator=generator)
    return tokens, tokens.unfold(0, t.seq_len + 1, t.seq_len)


def reference_run(case, weights, batches, dtype):
    model = tm.build_model(case.shape, dtype)
    tm.load_weights(model, weights)
    return tt.run_training(model, batches, case.train, bf16_params=case.precision == "bf16")


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


def write_llmc(path, tokens):
    """An llm.c token shard: a 256 x int32 header (magic, version, count), then uint16 tokens."""
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)))
        f.write(array.array("H", tokens.tolist()).tobytes())


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_train(dtrain, case, weights, tokens, folder):
    """`dtrain train` over case.tp local processes from `weights` on `tokens`; returns what it
    reports in the probe's names: loss, grad_norm and final.<name>."""
    names = {"recipe": "recipe.yaml", "weights": "weights.safetensors", "data": "tokens.bin"}
    paths = {key: os.path.join(folder, name) for key, name in names.items()}
    write_llmc(paths["data"], tokens)
    safetensors_io.save(paths["weights"], weights)
    extra = {
        "run": {"name": "parity", "out_dir": folder, "seed": case.seed, "threads": 1},
        "train": {"init_from": paths["weights"], "export_to": "final.safetensors",
                  "eval_every": 0},
        "parallel": {"tp": case.tp},
        "data": {"val": [paths["data"]]},
        "checkpoint": {"resume": "never"},
        "logging": {"sample_tokens": 0},
    }
    with open(paths["recipe"], "w") as f:
        f.write(recipe_yaml(case, paths["data"], extra))
    port = free_port()
    ranks = []
    for rank in range(case.tp):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(case.tp),
                   LOCAL_WORLD_SIZE=str(case.tp), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        log = open(os.path.join(folder, f"rank-{rank}.log"), "w+")
        ranks.append((subprocess.Popen([dtrain, "train", paths["recipe"]], env=env, stdout=log,
                                       stderr=subprocess.STDOUT), log))
    failures = []
    for rank, (process, log) in enumerate(ranks):
        try:
            code = process.wait(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other, _ in ranks:
                other.kill()
            code = process.wait()
        log.seek(0)
        if code != 0:
            failures.append(f"rank {rank} exited {code}:\n{log.read()[-3000:]}")
        log.close()
    if failures:
        raise RuntimeError(f"dtrain train at tp {case.tp}: " + "\n".join(failures))
    run_dir = os.path.join(folder, "parity")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        metrics = [json.loads(line) for line in f]
    got = {"loss": torch.tensor([m["loss"] for m in metrics], dtype=torch.float64),
           "grad_norm": torch.tensor([m["grad_norm"] for m in metrics], dtype=torch.float64)}
    final = safetensors_io.load(os.path.join(run_dir, "final.safetensors"))
    got.update({f"final.{name}": tensor.double() for name, tensor in final.items()})
    return got


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


def compare(got, want, initial):
    """{quantity: (worst relative error, the tensor it was in)}; step 0's logits and gradients
    only where `got` has them. `initial`: the weights both sides started from, by name."""
    def worst(prefix):
        return max((relative_error(got[n], want[n]), n) for n in want if n.startswith(prefix))

    def update_error(name):
        """The mean error of a tensor's training update against the update's mean size: a lost
        or partial update is of the order of 1, where the bounds on the final weights, relative
        to the weights themselves, pass it at bf16; a few values rounded apart hardly move it."""
        start = initial[name[len("final."):]].double()
        moved = (want[name] - start).abs().mean().item()
        return (got[name] - want[name]).abs().mean().item() / moved if moved > 0 else 0.0

    errors = {}
    if "logits" in got:
        errors["logits"] = (relative_error(got["logits"], want["logits"]), "logits")
        # The typical error, which a few values rounded apart at bf16 do not move.
        mean = ((got["logits"] - want["logits"]).abs().mean() / want["logits"].abs().max()).item()
        errors["logits_mean"] = (mean, "logits")
    errors["loss0"] = (relative_error(got["loss"][:1], want["loss"][:1]), "loss[0]")
    if "logits" in got:
        errors["grads"] = worst("grad.")
    errors.update({
        "losses": (relative_error(got["loss"], want["loss"]), "loss"),
        "grad_norms": (relative_error(got["grad_norm"], want["grad_norm"]), "grad_norm"),
        "final": worst("final."),
        "update_mean": max((update_error(n), n) for n in want if n.startswith("final."))})
    return errors


def train_outputs(want):
    """The part of the reference's outputs that `dtrain train` reports."""
    return {n: v for n, v in want.items() if n in ("loss", "grad_norm") or n.startswith("final.")}


def run_case(case, dtrain, probe):
    """Returns (ok, line). Compares the probe (or, for tp > 1, `dtrain train`) against torch
    float32, or without a probe torch float32 against torch float64."""
    model = tm.build_model(case.shape)
    weights = tm.random_weights(model, case.seed)
    if case.tp > 1:
        tokens, rows = windows(case)
        batches = rows.expand(case.train.steps, -1, -1)
    else:
        batches = random_batches(case)
    want = reference_run(case, weights, batches, torch.float32)
    if not probe:
        got, want = want, reference_run(case, weights, batches, torch.float64)
    elif case.tp > 1:
        want = train_outputs(want)
        with tempfile.TemporaryDirectory(prefix=f"parity_{case.name}_") as folder:
            got = run_train(dtrain, case, weights, tokens, folder)
    else:
        with tempfile.TemporaryDirectory(prefix=f"parity_{case.name}_") as folder:
            got = run_probe(probe, case, weights, batches, folder)
    check_outputs(got, want)
    errors = compare(got, want, weights)
    ok = all(err <= case.bounds.get(key, TOLERANCE) for key, (err, _) in errors.items())
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
    print(f"cases: {what}, max|a-b|/max|b| per tensor, tolerance {TOLERANCE:g} "
          "(bf16: BF16_BOUNDS)")
    for case in CASES:
        if args.case and case.name not in args.case:
            continue
        try:
            ok, line = run_case(case, args.dtrain, probe)
        except (RuntimeError, subprocess.TimeoutExpired) as error:
            ok, line = False, f"{case.name:28s} {error}"
        results.append(ok)
        print(f"{'PASS' if ok else 'FAIL'} {line}", flush=True)

    failed = results.count(False)
    print(f"{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
