"""The FLOP/s of one large float32 matrix product in PyTorch: the machine's practical peak on
these threads, printed by scripts/bench/train_vs_torch.sh next to the models' FLOP/s.

Prints one line: gflops=<best of the timed repetitions>
"""
import argparse
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--size", type=int, default=2048, help="n of the n x n x n product")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    n = args.size
    a, b = torch.randn(n, n), torch.randn(n, n)
    torch.mm(a, b)  # warm-up: thread pool start, first-touch of the output
    best_s = float("inf")
    for _ in range(args.repeats):
        start = time.perf_counter()
        torch.mm(a, b)
        best_s = min(best_s, time.perf_counter() - start)
    print(f"gflops={2 * n**3 / best_s / 1e9:.1f}")


if __name__ == "__main__":
    main()
