"""`torchrun dtrain train` with PyTorch's own launcher (Debian's python3-torch), both rendezvous:
static (--master-addr/--master-port), where torchrun's agent serves its own store on
MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True, as c10d's does since PyTorch 2.4), and c10d
(--standalone). Two ranks train three steps on loopback; each must finish with the same losses.
Exit 77 (skipped) where Debian's python3 cannot import torch.

Usage: torchrun_test.py --dtrain BUILD/dtrain
"""

import argparse
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import unittest

DTRAIN = None  # set in main
TIMEOUT_S = 120
# Debian's torch 1.13 under Python >= 3.11 cannot parse torchrun's default "no redirect" (0):
# redirect and tee stdout (1) instead.
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--redirects=1", "--tee=1"]

RECIPE = """run: {name: tr, threads: 1}
model: {n_layer: 1, n_head: 2, d_model: 32, max_seq_len: 32}
data: {train: [%s]}
train: {steps: 3, batch_size: 4, micro_batch: 2, seq_len: 16, warmup_steps: 0, eval_every: 0,
        export_to: ""}
logging: {sample_tokens: 0}
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TorchrunTest(unittest.TestCase):
    def train(self, rendezvous, should_fail=False):
        work = pathlib.Path(tempfile.mkdtemp(prefix="dtrain_torchrun_"))
        text = work / "text.txt"
        text.write_text("The quick brown fox jumps over the lazy dog.\n" * 300)
        recipe = work / "r.yaml"
        recipe.write_text(RECIPE % text)
        result = subprocess.run(
            [*TORCHRUN, *rendezvous, "--nnodes=1", "--nproc_per_node=2", "--no_python", DTRAIN,
             "train", str(recipe), "--set", f"run.out_dir={work / 'runs'}"],
            capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
        output = result.stdout + result.stderr
        if should_fail:
            self.assertNotEqual(result.returncode, 0, output)
            return output, []
        self.assertEqual(result.returncode, 0, output)
        metrics = [json.loads(line) for line in (work / "runs/tr/metrics.jsonl").read_text()
                   .splitlines() if line.strip()]
        self.assertEqual([m["step"] for m in metrics], [1, 2, 3], output)
        return output, [m["loss"] for m in metrics]

    def test_static_and_c10d_rendezvous_train_alike(self):
        port = free_port()
        static, static_losses = self.train(["--master_addr=127.0.0.1", f"--master_port={port}"])
        # dtrain's store moved off torchrun's (a handshake with torchrun's store failed before).
        self.assertNotIn("handshake with rendezvous store", static)
        self.assertIn("step 3/3", static)
        standalone, standalone_losses = self.train(["--standalone"])
        self.assertIn("step 3/3", standalone)
        self.assertEqual(static_losses, standalone_losses)

    def test_a_busy_store_port_says_it_is_master_port_plus_one(self):
        port = free_port()
        with socket.socket() as busy:
            busy.bind(("127.0.0.1", port + 1))
            busy.listen()
            output, _ = self.train(["--master_addr=127.0.0.1", f"--master_port={port}"],
                                   should_fail=True)
        self.assertIn(f"rendezvous store on port {port + 1}, derived from MASTER_PORT={port} + 1",
                      output)
        self.assertIn("address already in use", output)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtrain", required=True)
    args, rest = parser.parse_known_args()
    global DTRAIN
    DTRAIN = args.dtrain
    if subprocess.run([sys.executable, "-c", "import torch.distributed.run"],
                      capture_output=True, check=False).returncode != 0:
        print(f"skipped: {sys.executable} cannot import torch.distributed.run")
        sys.exit(77)
    # The runs' folders and torchrun's own (torchelastic_*) go in one folder, removed when every
    # test passed.
    work = tempfile.mkdtemp(prefix="dtrain_torchrun_")
    os.environ["TMPDIR"] = tempfile.tempdir = work
    result = unittest.main(argv=[sys.argv[0], *rest], exit=False, verbosity=2).result
    if not result.wasSuccessful():
        print(f"the failed tests' files are kept in {work}", file=sys.stderr)
        sys.exit(1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
