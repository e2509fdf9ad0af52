"""A GPU run's metrics against the CPU's run of the same recipe and layout: every step's loss and
gradient norm within a relative tolerance, else exit naming the step.

Usage: compare_metrics.py NAME STEPS TOLERANCE CPU_METRICS_JSONL GPU_METRICS_JSONL
"""
import json
import sys

name, steps, tolerance = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
cpu, gpu = ([json.loads(line) for line in open(path)] for path in sys.argv[4:6])
if not len(cpu) == len(gpu) == steps:
    sys.exit(f"{name}: {len(cpu)} steps on the CPU and {len(gpu)} on the GPU, not {steps}")
worst = 0.0
for step, (c, g) in enumerate(zip(cpu, gpu), 1):
    for key in ("loss", "grad_norm"):
        worst = max(worst, abs(g[key] - c[key]) / abs(c[key]))
        if abs(g[key] - c[key]) > tolerance * abs(c[key]):
            sys.exit(f"{name} step {step}: {key} {g[key]} on the GPU, {c[key]} on the CPU")
print(f"{name} on the GPU: {steps} steps' losses and norms the CPU's within {worst:.1e} "
      f"relative (loss {cpu[0]['loss']:.4f} -> {cpu[-1]['loss']:.4f})")
