"""dtrain on a real Slurm cluster: munged, slurmctld and two slurmd nodes (n1, n2) on this
machine, brought up by scripts/slurm/cluster.sh. Jobs are submitted with sbatch, as a user would:

- scripts/slurm/train.sbatch (`srun -N2 -n4 dtrain train`, every task a rank, with the job's
  rendezvous token it generates) and `dtrain launch` from the batch shell (one agent per node,
  two workers each) both follow the single-process loss trajectory with the same global batch
  (1e-5 relative); `srun dtrain train` over two nodes without a token stops at once, saying so;
- a worker SIGKILLed mid-run under `dtrain launch --max-restarts 1`: the group restarts and the
  job completes;
- `scancel --signal=TERM`, and a SIGTERM to the batch shell alone (`scancel --batch`, as
  sbatch --signal=B:TERM sends it): the workers write a checkpoint and the job exits cleanly (and
  with --requeue comes back); a plain `scancel` of a --requeue job ends it;
- an agent SIGKILLed under `dtrain launch` (with a restart left): Slurm tears the step down
  (SIGTERM), and the other agent names the lost agent as the root cause and ends by itself,
  before KillWait, instead of treating the teardown as a preemption or waiting for the node.
- `srun dtrain doctor` over both nodes: node 0 prints one summary in which each node reached the
  master, sees node 0's file in the checkpoint folder and took part in the all-reduce.

Usage: slurm_test.py --dtrain BUILD/dtrain (as root; ctest runs it with RESOURCE_LOCK slurm).
"""

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]
CLUSTER = SOURCE_DIR / "scripts" / "slurm" / "cluster.sh"
TRAIN_SBATCH = SOURCE_DIR / "scripts" / "slurm" / "train.sbatch"
DTRAIN = None  # set in main
WORK = None  # a temporary folder for the cluster, recipes and runs
JOB_TIMEOUT_S = 240


def recipe(name, steps, extra=""):
    """A small model that 4 ranks train quickly on 2 cores; batch 8 splits over 1, 2 and 4."""
    data = WORK / "text.txt"
    if not data.exists():
        data.write_text("".join(f"Pack my box with {i % 7} jugs.\n" for i in range(300)))
    path = WORK / f"{name}.yaml"
    path.write_text(f"""
run: {{name: slurm, seed: 5, threads: 1, out_dir: {WORK / name}}}
model: {{n_layer: 2, n_head: 2, d_model: 32, max_seq_len: 32}}
data: {{train: [{data}]}}
train: {{steps: {steps}, batch_size: 8, micro_batch: 2, seq_len: 16, warmup_steps: 1,
        eval_every: 0, export_to: ""}}
parallel: {{bucket_mb: 0.01, timeout_s: 30}}
logging: {{sample_tokens: 0}}
{extra}
""")
    return path


def losses(name):
    with open(WORK / name / "slurm" / "metrics.jsonl") as f:
        return [json.loads(line)["loss"] for line in f]


def sbatch(name, script, nodes=2, tasks_per_node=1, wait=True):
    """Submits `script` (bash lines) as a batch job; returns (exit code, output) with wait, else
    the Popen of `sbatch --wait` and the output path."""
    path = WORK / f"{name}.sh"
    path.write_text("#!/bin/bash\nset -euo pipefail\n" + script + "\n")
    output = WORK / f"{name}.out"
    # tasks_per_node None: no --ntasks-per-node, as an salloc shell or a plain sbatch has none.
    per_node = [] if tasks_per_node is None else [f"--ntasks-per-node={tasks_per_node}"]
    command = ["sbatch", "--wait", f"--nodes={nodes}", *per_node, f"--output={output}",
               f"--job-name={name}", f"--chdir={WORK}", str(path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    if not wait:
        return process, output
    printed, _ = process.communicate(timeout=JOB_TIMEOUT_S)
    return process.returncode, output.read_text() if output.exists() else printed


def wait_for(predicate, timeout_s, what):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def steps_logged(name):
    path = WORK / name / "slurm" / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def find_pid(matches):
    """The pid of a process whose command line and environment (lists of bytes) `matches`."""
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if matches(cmdline, environ):
            return int(entry.name)
    return None


def worker_pid(rank, marker):
    """The pid of the `dtrain train` process with DTRAIN_RANK (or SLURM_PROCID) = rank whose
    command line mentions `marker`."""
    return find_pid(lambda cmdline, environ: (
        b"train" in cmdline and any(marker.encode() in arg for arg in cmdline)
        and f"DTRAIN_RANK={rank}".encode() in environ))


def agent_pid(node, marker):
    """The pid of the `dtrain launch` agent of node `node` (SLURM_NODEID) whose command line
    mentions `marker` (not srun, whose command line names it too)."""
    return find_pid(lambda cmdline, environ: (
        len(cmdline) > 2 and cmdline[0].endswith(b"dtrain") and cmdline[1] == b"launch"
        and any(marker.encode() in arg for arg in cmdline)
        and b"SLURM_STEP_ID=0" in environ and f"SLURM_NODEID={node}".encode() in environ))


def queued_job_id(name):
    return subprocess.run(["squeue", "-h", "-n", name, "-o", "%i"], capture_output=True,
                          text=True, check=True).stdout.strip()


class SlurmTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        subprocess.run([str(CLUSTER), "up", str(WORK / "cluster")], check=True)
        env = subprocess.run([str(CLUSTER), "env", str(WORK / "cluster")], check=True,
                             capture_output=True, text=True).stdout
        for line in env.splitlines():
            name, _, value = line.removeprefix("export ").partition("=")
            os.environ[name] = value.strip("'\"")
        single = subprocess.run([DTRAIN, "train", str(recipe("single", 6))],
                                capture_output=True, text=True)
        if single.returncode != 0:
            raise AssertionError(single.stderr)
        cls.reference = losses("single")

    @classmethod
    def tearDownClass(cls):
        subprocess.run([str(CLUSTER), "down", str(WORK / "cluster")], check=False)

    def assert_follows_reference(self, name):
        got = losses(name)
        self.assertEqual(len(got), len(self.reference))
        for step, (a, b) in enumerate(zip(got, self.reference), start=1):
            self.assertLess(abs(a - b), 1e-5 * abs(b), f"step {step}: {a} vs {b}")

    def test_srun_tasks_are_ranks(self):
        # The shipped batch script, run in the job this test submits (its #SBATCH lines are the
        # submission's business).
        code, output = sbatch("srun4", f"DTRAIN={DTRAIN} bash {TRAIN_SBATCH} {recipe('srun4', 6)}",
                              tasks_per_node=2)
        self.assertEqual(code, 0, output)
        self.assertIn("4 ranks", output)
        self.assert_follows_reference("srun4")

    def test_srun_over_two_nodes_without_a_token_stops_at_once(self):
        code, output = sbatch("notoken", f"srun -N2 -n2 {DTRAIN} train {recipe('notoken', 6)}")
        self.assertNotEqual(code, 0, output)
        self.assertIn("this world spans 2 nodes", output)
        self.assertIn("export DTRAIN_RDZV_TOKEN", output)

    def test_doctor_summarises_both_nodes(self):
        # Without DTRAIN_RDZV_TOKEN it stops at once, as training does: n2's checks would wait
        # out the timeout on a real cluster (here n2 shares the master's loopback).
        code, output = sbatch("doctor_notoken", f"srun -N2 --ntasks=2 --ntasks-per-node=1 "
                                                f"{DTRAIN} doctor {recipe('doctor', 1)}")
        self.assertNotEqual(code, 0, output)
        self.assertIn("this world spans 2 nodes", output)
        code, output = sbatch("doctor", f"export DTRAIN_RDZV_TOKEN=doctor-test\n"
                                        f"srun -N2 --ntasks=2 --ntasks-per-node=1 {DTRAIN} doctor "
                                        f"{recipe('doctor', 1)} --timeout-s 30")
        # One summary, from node 0 (n1): n2's report is in it, and n2 printed nothing of its own.
        self.assertEqual(output.count("== verdict per node"), 1, output)
        for node, rank in (("n1", 0), ("n2", 1)):
            self.assertEqual(output.count(f"== {node} (rank {rank})"), 1, output)
        self.assertRegex(output, r"== n2 \(rank 1\)\n(.*\n)*ok +cluster\.reach +reached the master n1:")
        self.assertRegex(output, r"ok +cluster\.checkpoint_shared +\S+ is node 0's folder here too")
        self.assertRegex(output, r"ok +cluster\.clock +n2 \(rank 1\)'s clock")
        self.assertIn("all-reduce of 64 MiB over 2 nodes (Gloo): bus bandwidth", output)
        self.assertNotRegex(output, r"fail +cluster\.", output)

    def test_launch_runs_an_agent_per_node(self):
        code, output = sbatch("launch4",
                              f"{DTRAIN} launch {recipe('launch4', 6)} --nproc-per-node 2")
        self.assertEqual(code, 0, output)
        self.assertIn("starting one agent on each of its 2 nodes", output)
        self.assertIn("node 1 of 2 (slurm)", output)
        self.assertIn("all 4 workers past rendezvous", output)
        self.assert_follows_reference("launch4")

    def test_launch_says_that_tasks_per_node_are_not_its_workers(self):
        # sbatch --ntasks-per-node=2 without --nproc-per-node: one worker a node, said, since the
        # user asked Slurm for two.
        code, output = sbatch("tasks2", f"{DTRAIN} launch {recipe('tasks2', 2)}", tasks_per_node=2)
        self.assertEqual(code, 0, output)
        self.assertIn("the job asks for 2 tasks per node (sbatch --ntasks-per-node), but", output)
        self.assertIn("add --nproc-per-node 2 for 2 workers a node", output)
        self.assertIn("all 2 workers past rendezvous", output)

    def test_launch_from_a_job_without_tasks_per_node(self):
        # SLURM_NTASKS_PER_NODE is absent: srun must not be given it empty (it refuses that).
        code, output = sbatch("pernode", f"{DTRAIN} launch {recipe('pernode', 2)}",
                              tasks_per_node=None)
        self.assertEqual(code, 0, output)
        self.assertIn("all 2 workers past rendezvous", output)

    def test_launch_on_fewer_nodes_than_the_job_holds(self):
        code, output = sbatch("launch1",
                              f"! {DTRAIN} launch {recipe('launch1', 6)} --nnodes 3\n"
                              f"{DTRAIN} launch {recipe('launch1', 6)} --nnodes 1 "
                              "--nproc-per-node 2")
        self.assertEqual(code, 0, output)
        self.assertRegex(output, r"--nnodes 3 is more than the 2 nodes of Slurm job \d+; submit "
                                 r"it with sbatch --nodes=3, or lower --nnodes")
        self.assertIn("starting one agent on each of 1 of its 2 nodes (--nnodes)", output)
        self.assertIn("all 2 workers past rendezvous", output)
        self.assertNotIn("node 1 of", output)

    def test_killed_worker_restarts_the_group(self):
        name = "restart"
        job, output = sbatch(name, f"{DTRAIN} launch {recipe(name, 60)} --nproc-per-node 2 "
                                   "--max-restarts 1", wait=False)
        wait_for(lambda: steps_logged(name) >= 3, JOB_TIMEOUT_S, "3 steps")
        pid = worker_pid(3, f"{name}.yaml")
        self.assertIsNotNone(pid, "rank 3's process")
        os.kill(pid, 9)
        job.communicate(timeout=JOB_TIMEOUT_S)
        text = output.read_text()
        self.assertEqual(job.returncode, 0, text)
        self.assertIn("rank 3 failed: signal 9 (SIGKILL)", text)
        self.assertIn("restarting the workers (restart 1 of 1)", text)
        self.assertIn("step 60/60", text)

    def kill_agent(self, name, node, flags=""):
        """Runs a long `dtrain launch` job, SIGKILLs node `node`'s agent after 3 steps and
        returns the job's output once it ended."""
        job, output = sbatch(name, f"{DTRAIN} launch {recipe(name, 100000)} --nproc-per-node 2 "
                                   f"{flags}", wait=False)
        wait_for(lambda: steps_logged(name) >= 3, JOB_TIMEOUT_S, "3 steps")
        pid = agent_pid(node, f"{name}.yaml")
        self.assertIsNotNone(pid, f"node {node}'s agent")
        os.kill(pid, 9)
        job.communicate(timeout=JOB_TIMEOUT_S)
        text = output.read_text()
        self.assertNotEqual(job.returncode, 0, text)
        # srun's teardown SIGTERM is not a preemption; and the survivor exits by itself, so Slurm
        # reports an exit code for it rather than killing it after KillWait.
        self.assertNotIn("asking the workers to checkpoint", text)
        survivor = 1 - node
        self.assertIn(f"task {survivor}: Exited with exit code 1", text)
        return text

    def test_killed_agent_is_named_as_the_root_cause(self):
        # A restart left changes nothing: srun tears the step down, the node cannot come back.
        text = self.kill_agent("lost_agent", 1, "--max-restarts 1")
        self.assertIn("Root cause: node 1 (host ", text)
        self.assertIn("agent lost (its connection to the rendezvous store closed", text)

    def test_killed_store_agent_stops_the_other_node(self):
        text = self.kill_agent("lost_store", 0)
        self.assertIn("node 0's agent was lost", text)

    def stopped_by_term(self, name, scancel_flags, command_prefix=""):
        """Runs a 2-node launch until 3 steps, then `scancel <flags> JOB`: it must exit 143
        after a checkpoint. Returns the job's output."""
        checkpoints = WORK / name / "ckpt"
        job, output = sbatch(name, f"{command_prefix}{DTRAIN} launch {recipe(name, 100000, extra=f'checkpoint: {{dir: {checkpoints}}}')} "
                                   "--nproc-per-node 2", wait=False)
        wait_for(lambda: steps_logged(name) >= 3, JOB_TIMEOUT_S, "3 steps")
        job_id = queued_job_id(name)
        subprocess.run(["scancel", *scancel_flags, job_id], check=True)
        job.communicate(timeout=JOB_TIMEOUT_S)
        text = output.read_text()
        self.assertEqual(job.returncode, 143, text)  # stopped, not finished
        self.assertIn("stopped by SIGTERM", text)
        self.assertTrue((checkpoints / "latest").exists(), text)
        latest = (checkpoints / "latest").read_text().strip()
        self.assertTrue((checkpoints / latest / "manifest.json").exists(), text)
        return text

    def test_scancel_term_checkpoints_and_exits_cleanly(self):
        self.stopped_by_term("term", ["--signal=TERM"])

    def test_a_batch_shell_term_reaches_the_agents(self):
        # sbatch --signal=B:TERM (here scancel --batch) signals the batch shell alone: `dtrain
        # launch` there, exec'ed as scripts/slurm/launch.sbatch does, passes it to the agents,
        # which checkpoint as above (srun, signalled itself, would have killed the step at once).
        text = self.stopped_by_term("bterm", ["--batch", "--signal=TERM"], command_prefix="exec ")
        self.assertIn("SIGTERM to the batch shell", text)

    def stopped_with_requeue(self, name, stop, check):
        """Runs a 2-node `launch --requeue` until 2 steps, then `<stop> JOB`; `check(text, shown)`
        asserts what follows (text: the job's output so far, shown: `scontrol show job`). A
        requeued job left in the queue would start again: it is cancelled whatever happens."""
        job, output = sbatch(name, f"{DTRAIN} launch {recipe(name, 100000)} --nproc-per-node 2 "
                                   "--requeue", wait=False)
        wait_for(lambda: steps_logged(name) >= 2, JOB_TIMEOUT_S, "2 steps")
        job_id = queued_job_id(name)
        subprocess.run([*stop, job_id], check=True)

        def shown():
            return subprocess.run(["scontrol", "show", "job", job_id],
                                  capture_output=True, text=True).stdout
        try:
            check(output.read_text, shown)
        except AssertionError as error:
            raise AssertionError(f"{error}\n{output.read_text()}\n{shown()}") from None
        finally:
            subprocess.run(["scancel", job_id])
            job.communicate(timeout=JOB_TIMEOUT_S)

    def test_term_with_requeue_puts_the_job_back_in_the_queue(self):
        # Slurm counts the requeue in Restarts, then holds the job PENDING a while (BeginTime).
        # The checkpoint, the agents' exit and Slurm's cleanup can take most of a minute on a
        # loaded 2-core machine: the wait is the jobs' own bound.
        def check(text, shown):
            wait_for(lambda: re.search(r"\bRestarts=[1-9]", shown()), JOB_TIMEOUT_S,
                     "the job to be requeued")
            self.assertIn("requeued the job", text())
        self.stopped_with_requeue("requeue", ["scancel", "--signal=TERM"], check)

    def test_a_job_slurm_requeues_itself_is_not_requeued_again(self):
        # `scontrol requeue JOB` (or a preemption that requeues) ends the job's processes with
        # SIGTERM while Slurm requeues the job: the agents checkpoint, and node 0 says that Slurm
        # brings the job back, where it had said "not requeued" of a job seen COMPLETING.
        def check(text, shown):
            wait_for(lambda: "Slurm is requeueing the job itself" in text(), JOB_TIMEOUT_S,
                     "node 0 to see Slurm requeue the job")
            self.assertIn("Restarts=1", text())
            self.assertNotIn("not requeued", text())
            self.assertNotIn("requeued the job:", text())
            self.assertIn("stopped by SIGTERM", text())
        self.stopped_with_requeue("slurm_requeue", ["scontrol", "requeue"], check)

    def test_a_cancelled_job_is_not_requeued(self):
        # `scancel JOB` is the user ending the job: --requeue brings back only a job stopped while
        # it still runs (its time limit's signal, a preemption, `scancel --signal=TERM` above).
        name = "cancel"
        job, output = sbatch(name, f"{DTRAIN} launch {recipe(name, 100000)} --nproc-per-node 2 "
                                   "--requeue", wait=False)
        wait_for(lambda: steps_logged(name) >= 2, JOB_TIMEOUT_S, "2 steps")
        job_id = queued_job_id(name)
        subprocess.run(["scancel", job_id], check=True)
        job.communicate(timeout=JOB_TIMEOUT_S)

        def shown():
            return subprocess.run(["scontrol", "show", "job", job_id], capture_output=True,
                                  text=True).stdout
        # sbatch --wait may return while Slurm still cleans up (JobState=COMPLETING).
        wait_for(lambda: "JobState=COMPLETING" not in shown(), JOB_TIMEOUT_S,
                 "the job to finish completing")
        shown = shown()
        self.assertRegex(shown, r"\bJobState=CANCELLED\b", shown)
        self.assertRegex(shown, r"\bRestarts=0\b", shown)
        self.assertNotIn("requeued the job", output.read_text())


def main():
    global DTRAIN, WORK
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtrain", required=True)
    args, rest = parser.parse_known_args()
    DTRAIN = str(pathlib.Path(args.dtrain).resolve())
    if os.geteuid() != 0:
        print("the Slurm test cluster needs root (munged, slurmd); skipping", file=sys.stderr)
        return 77
    WORK = pathlib.Path(tempfile.mkdtemp(prefix="dtrain_slurm_"))
    try:
        result = unittest.main(argv=[sys.argv[0]] + rest, exit=False, verbosity=2).result
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
