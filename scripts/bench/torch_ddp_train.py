"""PyTorch DDP (gloo) peer of dtrain's data-parallel training, for scripts/bench/ddp_overlap.sh.

Run one process per rank with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; each rank
trains on batch_size / WORLD_SIZE sequences of the same model and AdamW as torch_train.py, run
as its --mode says.
Rank 0 prints "step_ms=X" (median over the steps after --discard).
"""
import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_train  # noqa: E402

tm, tt = torch_train.tm, torch_train.tt


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    torch_train.add_common_arguments(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    s = torch_train.parse_settings(args.set)
    model = tm.build_model(torch_train.model_shape(s))
    tm.load_weights(model, tm.random_weights(model, seed=1337))
    ddp, adamw_options = torch_train.apply_mode(torch.nn.parallel.DistributedDataParallel(model),
                                                args.mode)
    per_rank = s["train.batch_size"] // world
    train = tt.TrainSettings(steps=args.steps, batch_size=per_rank, micro_batch=per_rank,
                             seq_len=s["train.seq_len"])
    optimizer = tt.make_adamw(model, train, **adamw_options)
    with open(args.data, "rb") as f:
        text = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    generator = torch.Generator().manual_seed(1337 + rank)

    step_s = []
    for step in range(args.steps):
        tokens = torch_train.random_windows(text, per_rank, train.seq_len, generator)
        start = time.perf_counter()
        tt.forward_backward(ddp, tokens, train)
        tt.clip_and_update(model, optimizer, step, train)
        step_s.append(time.perf_counter() - start)
    if rank == 0:
        print(f"step_ms={1e3 * statistics.median(step_s[args.discard:]):.1f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
