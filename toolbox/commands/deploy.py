"""``toolbox deploy render experiment=NAME|sweep=NAME [a.b.c=value ...] [--image IMG]``: a KubeRay RayJob for it.

The RayJob is sized from the experiment: every actor the run places (for a sweep: every bundle of
``max_concurrent_trials`` trials) is one bundle of Ray resources; bundles are packed into worker pods
(first fit, largest first) per kind of bundle (CPU only, with GPUs, with custom resources from
``ray.placement.<role>.resources``), so the worker groups offer at least what the placement groups ask
for. The head runs the driver and no actors (``num-cpus: 0``). Token auth is on, run directories go to
the ``toolbox-runs`` PVC (deploy/kuberay/pvc.yaml) mounted at ``/runs`` on every pod, the entrypoint
repeats the overrides given here, and the job tears its cluster down when it ends.

The manifest is built as Python dicts and written with ``yaml.safe_dump``: its shape is fixed and only
names and numbers vary, which needs no templating engine (Helm, Jinja) and no second language.
Not covered: autoscaling (replicas are fixed), node selectors and tolerations beyond the GPU taint.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml

from toolbox import __version__

RUN_MOUNT = "/runs"
RUN_CLAIM = "toolbox-runs"
AUTH_SECRET = "toolbox-ray-auth"
MEMORY_GI_PER_CPU = 4


@dataclass
class Bundle:
    """One actor's Ray resources (a placement-group bundle) and the role it belongs to."""

    role: str
    resources: dict[str, float]
    spread: bool = False  # STRICT_SPREAD: no two bundles of this role on one pod


@dataclass
class PodGroup:
    """A KubeRay worker group: ``replicas`` identical pods, each offering ``cpus``/``gpus``/``custom``."""

    name: str
    cpus: int
    gpus: int = 0
    custom: dict[str, float] = field(default_factory=dict)
    pods: list[list[Bundle]] = field(default_factory=list)

    def free(self, pod: list[Bundle], key: str) -> float:
        cap = {"CPU": self.cpus, "GPU": self.gpus}.get(key, math.inf)
        return cap - sum(b.resources.get(key, 0.0) for b in pod)

    def fits(self, pod: list[Bundle], bundle: Bundle) -> bool:
        if bundle.spread and any(b.role == bundle.role for b in pod):
            return False
        return all(self.free(pod, k) >= v - 1e-9 for k, v in bundle.resources.items())

    def offers(self) -> dict[str, float]:
        """What every pod of the group gives Ray."""
        return {"CPU": self.cpus, **({"GPU": self.gpus} if self.gpus else {}), **self.custom}


def experiment_bundles(cfg: Any) -> list[Bundle]:
    """Every actor of one run of ``cfg`` as a bundle, in the role order its placement groups use."""
    from toolbox.driver.placement import role_bundles

    spread = {role for role, where in cfg.ray.placement.items() if where.strategy == "STRICT_SPREAD"}
    return [Bundle(role, dict(resources), role in spread) for role, resources in role_bundles(cfg)]


def total_cpus(bundles: list[Bundle]) -> float:
    return sum(b.resources.get("CPU", 0.0) for b in bundles)


def pack(bundles: list[Bundle], cpus_per_pod: int, gpus_per_pod: int) -> list[PodGroup]:
    """Worker groups whose pods hold every bundle: one group per kind of bundle, first fit decreasing by CPU."""
    groups: dict[tuple[bool, tuple[str, ...]], PodGroup] = {}
    for bundle in sorted(bundles, key=lambda b: -b.resources.get("CPU", 0.0)):
        custom = tuple(sorted(k for k in bundle.resources if k not in {"CPU", "GPU"}))
        gpu = bundle.resources.get("GPU", 0.0) > 0
        key = (gpu, custom)
        if key not in groups:
            name = "-".join(["gpu" if gpu else "cpu", *(re.sub(r"[^a-z0-9]+", "-", c.lower()) for c in custom)])
            groups[key] = PodGroup(name, cpus_per_pod, gpus_per_pod if gpu else 0)
        group = groups[key]
        if not group.fits([], bundle):
            raise ValueError(f"role {bundle.role}: one actor needs {bundle.resources}, more than one pod of "
                             f"{group.offers()} (raise --cpus-per-pod / --gpus-per-pod)")
        pod = next((p for p in group.pods if group.fits(p, bundle)), None)
        if pod is None:
            group.pods.append(pod := [])
        pod.append(bundle)
    for group in groups.values():
        for name in {k for pod in group.pods for b in pod for k in b.resources} - {"CPU", "GPU"}:
            group.custom[name] = math.ceil(max(sum(b.resources.get(name, 0.0) for b in pod) for pod in group.pods))
    return list(groups.values())


def _volumes(shm_gi: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    mounts = [{"name": "runs", "mountPath": RUN_MOUNT}, {"name": "dshm", "mountPath": "/dev/shm"}]
    volumes = [{"name": "runs", "persistentVolumeClaim": {"claimName": RUN_CLAIM}},
               {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm_gi}Gi"}}]
    return mounts, volumes


def pod_template(container: str, image: str, cpus: int, gpus: int, ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A Ray pod: one container of ``cpus``/``gpus`` (requests = limits), the run volume and a RAM /dev/shm."""
    memory = max(1, cpus) * MEMORY_GI_PER_CPU
    amounts = {"cpu": str(cpus), "memory": f"{memory}Gi", **({"nvidia.com/gpu": gpus} if gpus else {})}
    mounts, volumes = _volumes(max(1, memory // 4))
    spec: dict[str, Any] = {
        "securityContext": {"fsGroup": 100},  # the image's `ray` user is in group `users` (100): it may write /runs
        "containers": [{"name": container, "image": image, "imagePullPolicy": "IfNotPresent",
                        **({"ports": ports} if ports else {}),
                        "resources": {"requests": dict(amounts), "limits": dict(amounts)}, "volumeMounts": mounts}],
        "volumes": volumes,
    }
    if gpus:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    return {"spec": spec}


def worker_group_spec(group: PodGroup, image: str) -> dict[str, Any]:
    replicas = len(group.pods)
    params = {"resources": json.dumps(json.dumps(group.custom))} if group.custom else {}  # ray start --resources='{...}'
    return {"groupName": group.name, "replicas": replicas, "minReplicas": replicas, "maxReplicas": replicas,
            "rayStartParams": params, "template": pod_template("ray-worker", image, group.cpus, group.gpus)}


def rayjob(name: str, entrypoint: list[str], groups: list[PodGroup], image: str, labels: dict[str, str],
           deadline_s: int) -> dict[str, Any]:
    """The RayJob manifest: a token-auth cluster of a CPU head and ``groups``, torn down after the job."""
    head_ports = [{"containerPort": 6379, "name": "gcs-server"}, {"containerPort": 8265, "name": "dashboard"},
                  {"containerPort": 10001, "name": "client"}]
    import ray

    return {
        "apiVersion": "ray.io/v1", "kind": "RayJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "toolbox", **labels}},
        "spec": {
            "entrypoint": shlex.join(entrypoint),
            "submissionMode": "K8sJobMode",
            "shutdownAfterJobFinishes": True,
            "ttlSecondsAfterFinished": 600,
            "activeDeadlineSeconds": deadline_s,
            "backoffLimit": 0,  # a failed experiment is not retried on a fresh cluster
            "rayClusterSpec": {
                "rayVersion": ray.__version__,
                "authOptions": {"mode": "token", "secretName": AUTH_SECRET},
                "headGroupSpec": {"rayStartParams": {"num-cpus": "0"},  # the driver runs here; actors on workers
                                  "template": pod_template("ray-head", image, 2, 0, head_ports)},
                "workerGroupSpecs": [worker_group_spec(g, image) for g in groups],
            },
        },
    }


def dns_name(text: str) -> str:
    """A Kubernetes object name (DNS label) from ``text``."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:63].rstrip("-")


def render(args: list[str], image: str = "", cpus_per_pod: int = 4, gpus_per_pod: int = 1, name: str = "") -> dict[str, Any]:
    """The RayJob of ``experiment=NAME [overrides]`` or ``sweep=NAME [overrides]``; ConfigError on a bad config."""
    from toolbox.config.loader import load_config, parse_overrides
    from toolbox.core.errors import ConfigError

    run_root = str(parse_overrides(args).get("trainer", {}).get("run_root", RUN_MOUNT))
    if not (run_root == RUN_MOUNT or run_root.startswith(RUN_MOUNT + "/")):
        raise ConfigError(f"trainer.run_root={run_root}: on Kubernetes run directories go to the PVC mounted at "
                          f"{RUN_MOUNT} (drop the override, or give a directory under {RUN_MOUNT})")
    fixed = [a for a in args if not a.startswith("trainer.run_root=")] + [f"trainer.run_root={run_root}",
                                                                           "trainer.shared_fs=true"]
    if any(a.startswith("sweep=") for a in args):
        from toolbox.commands.sweeps.config import load_sweep, sweep_configs

        sweep_name, sweep, extra = load_sweep(fixed)
        # The largest trial over the listed values of the space, max_concurrent_trials times.
        largest = max((experiment_bundles(cfg) for cfg in sweep_configs(sweep, extra)), key=total_cpus)
        bundles = [Bundle("driver", {"CPU": 0.01}), *largest] * sweep.max_concurrent_trials
        module, what, deadline = "toolbox.commands.tune", {"toolbox/sweep": sweep_name}, 86400
        default_name = f"toolbox-sweep-{sweep_name}"
    else:
        cfg = load_config(fixed)
        bundles = experiment_bundles(cfg)
        module, what, deadline = "toolbox.run", {"toolbox/experiment": cfg.experiment}, 21600
        default_name = f"toolbox-{cfg.experiment}"
    try:
        groups = pack(bundles, cpus_per_pod, gpus_per_pod)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    gpu = any(g.gpus for g in groups)
    image = image or f"toolbox:{__version__}{'-gpu' if gpu else ''}"
    labels = {k: dns_name(v) for k, v in what.items()}
    return rayjob(dns_name(name or default_name), ["python", "-m", module, *fixed], groups, image, labels, deadline)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 the manifest on stdout, 2 a bad config or arguments."""
    from toolbox.core.errors import ConfigError

    parser = argparse.ArgumentParser(prog="toolbox deploy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["render"], help="render: print a RayJob manifest (YAML) on stdout")
    parser.add_argument("args", nargs="*", help="experiment=NAME|PATH or sweep=NAME|PATH, then a.b.c=value overrides")
    parser.add_argument("--image", default="", help="container image (default toolbox:VERSION, -gpu with GPUs)")
    parser.add_argument("--name", default="", help="metadata.name (default toolbox-EXPERIMENT / toolbox-sweep-NAME)")
    parser.add_argument("--cpus-per-pod", type=int, default=4, help="CPUs of each worker pod (default 4)")
    parser.add_argument("--gpus-per-pod", type=int, default=1, help="GPUs of each GPU worker pod (default 1)")
    ns = parser.parse_intermixed_args(sys.argv[1:] if argv is None else argv)
    try:
        manifest = render(ns.args, ns.image, ns.cpus_per_pod, ns.gpus_per_pod, ns.name)
    except ConfigError as err:
        print(f"config error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(yaml.safe_dump(manifest, sort_keys=False, width=1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
