"""Time from starting the launcher to every rank past rendezvous, for 8 local workers:
`dtrain launch --nproc-per-node 8` against `torchrun --standalone --nproc-per-node 8` (Debian's
python3-torch) starting 8 trivial workers that join a gloo process group and pass a barrier.
Both are measured the same way, from outside: the wall time from the launcher's start until the
line that says every rank is past rendezvous appears on its output. Runs alternate, medians are
compared. A benchmark, not a test: it prints, never fails on speed.

Usage: /usr/bin/python3 scripts/bench/launch_vs_torchrun.py DTRAIN [--runs N] [--workers N]
"""

import argparse
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TRIVIAL_WORKER = """
import os
import torch.distributed as dist
dist.init_process_group("gloo")
dist.barrier()
if dist.get_rank() == 0:
    print("all ranks past rendezvous", flush=True)
dist.barrier()
"""


def time_until(command, marker, timeout_s=120):
    """Seconds from starting `command` until a line containing `marker` appears; then the
    command's process group is ended."""
    start = time.monotonic()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, start_new_session=True)
    elapsed = None
    try:
        for line in process.stdout:
            if marker in line:
                elapsed = time.monotonic() - start
                break
            if time.monotonic() - start > timeout_s:
                break
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    if elapsed is None:
        raise SystemExit(f"'{marker}' never appeared from: {' '.join(command)}")
    return elapsed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("dtrain")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="dtrain_launch_bench_"))
    worker = work / "trivial_worker.py"
    worker.write_text(TRIVIAL_WORKER)
    text = work / "text.txt"
    text.write_text("The quick brown fox jumps over the lazy dog.\n" * 200)
    n = args.workers
    dtrain = [args.dtrain, "launch", f"--nproc-per-node={n}", "--set", f"data.train=[{text}]",
              "--set", f"run.out_dir={work / 'runs'}", "--set", f"train.batch_size={n}",
              "--set", "train.micro_batch=1", "--set", "train.warmup_steps=1"]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc_per_node={n}",
                # Debian's torch 1.13 under Python >= 3.11 cannot parse the default "no
                # redirect" (0); tee stdout (1) to the console instead, as the marker needs.
                "--redirects=1", "--tee=1", str(worker)]
    ours, theirs = [], []
    for _ in range(args.runs):
        ours.append(time_until(dtrain, " past rendezvous "))
        theirs.append(time_until(torchrun, "all ranks past rendezvous"))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"{'launcher':<10} {'workers':>7} {'median s':>9} {'min s':>7} {'max s':>7}")
    print(f"{'dtrain':<10} {n:>7} {a:>9.3f} {min(ours):>7.3f} {max(ours):>7.3f}")
    print(f"{'torchrun':<10} {n:>7} {b:>9.3f} {min(theirs):>7.3f} {max(theirs):>7.3f}")
    print(f"dtrain reaches rendezvous {b / a:.2f}x as fast as torchrun ({args.runs} runs each)")


if __name__ == "__main__":
    main()
