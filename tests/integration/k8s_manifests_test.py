"""The Kubernetes manifests in scripts/k8s against dtrain itself, without a cluster: every pod of
a job gets its manifest's environment plus what its controller injects (the contract each
manifest's header states, written out below), runs its command's flags through `dtrain env`, and
the pods must resolve to distinct node ranks of one world with one master: the pod that is node
0, reachable on a port the pod exposes. The recipe a pod reads must be the ConfigMap's and must
pass `dtrain recipe check`.

Usage: k8s_manifests_test.py --dtrain BUILD/dtrain
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import unittest

import yaml

SOURCE_DIR = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = SOURCE_DIR / "scripts" / "k8s"
DTRAIN = None  # set in main
TOKEN = "test-token-from-the-secret"


def load(name):
    with open(MANIFESTS / name) as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def container(pod_spec):
    containers = pod_spec["containers"]
    assert len(containers) == 1, "one container per pod"
    return containers[0]


def manifest_env(spec, annotations):
    """The container's env as the kubelet fills it: values, annotation fieldRefs, the secret."""
    env = {}
    for var in spec.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            path = source["fieldRef"]["fieldPath"]
            prefix = "metadata.annotations['"
            assert path.startswith(prefix), f"{var['name']}: unexpected fieldPath {path}"
            env[var["name"]] = annotations[path[len(prefix):-2]]
        elif "secretKeyRef" in source:
            env[var["name"]] = TOKEN
        else:
            raise AssertionError(f"{var['name']}: unexpected valueFrom {source}")
    return env


def resolve(spec, env):
    """`dtrain env --json` with the world's flags of the pod's `dtrain launch RECIPE FLAGS...`
    (not --max-restarts, the agent's own)."""
    command = spec["command"]
    assert command[:2] == ["dtrain", "launch"], f"pods run dtrain launch, not {command}"
    flags = list(command[3:])
    if "--max-restarts" in flags:
        at = flags.index("--max-restarts")
        del flags[at:at + 2]
    result = subprocess.run([DTRAIN, "env", "--json", *flags], env=env,
                            capture_output=True, text=True, timeout=30, check=False)
    assert result.returncode == 0, f"dtrain env failed for {env}: {result.stderr}"
    return json.loads(result.stdout)


def recipe_path(spec, pod_spec):
    """(ConfigMap name, key) that the pod's recipe path reads, through its volume mounts."""
    path = spec["command"][2]
    for mount in spec["volumeMounts"]:
        prefix = mount["mountPath"].rstrip("/") + "/"
        if path.startswith(prefix):
            volumes = {volume["name"]: volume for volume in pod_spec["volumes"]}
            return volumes[mount["name"]]["configMap"]["name"], path[len(prefix):]
    raise AssertionError(f"the recipe {path} is on no mounted volume")


class ManifestTest(unittest.TestCase):
    def assert_one_world(self, worlds, master_pod_host, exposed_ports, nproc):
        """worlds: each pod's resolved world, in any order."""
        nodes = len(worlds)
        self.assertEqual(sorted(w["node_rank"] for w in worlds), list(range(nodes)))
        for world in worlds:
            self.assertEqual(world["num_nodes"], nodes)
            self.assertEqual(world["local_world_size"], nproc)
            self.assertEqual(world["world_size"], nodes * nproc)
            self.assertEqual(world["master_addr"], master_pod_host)
            self.assertIn(world["master_port"], exposed_ports)
            self.assertEqual(world["rdzv_token"], "(set)")

    def assert_recipe_checks(self, configmaps, reference):
        name, key = reference
        self.assertIn(name, configmaps, f"no ConfigMap {name} in the manifests")
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(configmaps[name][key])
            f.flush()
            result = subprocess.run([DTRAIN, "recipe", "check", f.name], capture_output=True,
                                    text=True, timeout=30, check=False)
        self.assertEqual(result.returncode, 0, result.stderr)

    def test_pytorchjob_pods_form_one_world(self):
        docs = load("pytorchjob.yaml")
        configmaps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
        (job,) = [d for d in docs if d["kind"] == "PyTorchJob"]
        name = job["metadata"]["name"]
        replicas = job["spec"]["pytorchReplicaSpecs"]
        nproc = int(job["spec"]["nprocPerNode"])
        pods = [("Master", 0)] + [("Worker", i) for i in range(replicas["Worker"]["replicas"])]
        master_spec = container(replicas["Master"]["template"]["spec"])
        (port,) = [p["containerPort"] for p in master_spec["ports"]
                   if p.get("name") == "pytorchjob-port"]
        worlds = []
        for replica_type, index in pods:
            pod_spec = replicas[replica_type]["template"]["spec"]
            spec = container(pod_spec)
            self.assertEqual(spec["name"], "pytorch", "the operator fills in only 'pytorch'")
            # Kubeflow training operator v1: master rank 0, worker i rank i + 1.
            rank = index if replica_type == "Master" else index + 1
            env = manifest_env(spec, {})
            env.update({
                "MASTER_ADDR": f"{name}-master-0",
                "MASTER_PORT": str(port),
                "RANK": str(rank),
                "WORLD_SIZE": str(len(pods) * nproc),
                "PET_NNODES": str(len(pods)),
                "PET_NODE_RANK": str(rank),
                "PET_NPROC_PER_NODE": str(nproc),
            })
            world = resolve(spec, env)
            self.assertEqual(world["source"], "pytorchjob")
            self.assertEqual(world["node_rank"], rank)
            worlds.append(world)
            self.assertEqual(int(spec["resources"]["limits"]["nvidia.com/gpu"]), nproc)
            self.assert_recipe_checks(configmaps, recipe_path(spec, pod_spec))
        self.assert_one_world(worlds, f"{name}-master-0", [port], nproc)

    def test_jobset_pods_form_one_world(self):
        (jobset,) = load("jobset.yaml")
        name = jobset["metadata"]["name"]
        subdomain = jobset["spec"]["network"]["subdomain"]
        worlds, hosts = [], {}
        global_index = 0
        for replicated in jobset["spec"]["replicatedJobs"]:
            job_spec = replicated["template"]["spec"]
            pod_spec = job_spec["template"]["spec"]
            spec = container(pod_spec)
            nproc = int(spec["command"][spec["command"].index("--nproc-per-node") + 1])
            ports = [p["containerPort"] for p in spec["ports"]]
            self.assertEqual(int(spec["resources"]["limits"]["nvidia.com/gpu"]), nproc)
            for job_index in range(replicated["replicas"]):
                for pod_index in range(job_spec["parallelism"]):
                    # JobSet v1alpha2: the global Job index and Indexed Jobs' completion index.
                    annotations = {
                        "jobset.sigs.k8s.io/job-global-index": str(global_index),
                        "jobset.sigs.k8s.io/restart-attempt": "0",
                        "batch.kubernetes.io/job-completion-index": str(pod_index),
                    }
                    world = resolve(spec, manifest_env(spec, annotations))
                    self.assertEqual(world["source"], "jobset")
                    host = f"{name}-{replicated['name']}-{job_index}-{pod_index}.{subdomain}"
                    hosts[world["node_rank"]] = host
                    worlds.append(world)
                global_index += 1
        self.assert_one_world(worlds, hosts[0], ports, nproc)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtrain", required=True)
    args, rest = parser.parse_known_args()
    global DTRAIN
    DTRAIN = args.dtrain
    unittest.main(argv=[sys.argv[0], *rest], verbosity=2)


if __name__ == "__main__":
    main()
