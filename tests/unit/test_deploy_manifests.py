"""Static checks of the KubeRay manifests in deploy/kuberay (no cluster, no Ray, no network).

Every ray.io object is validated against the openAPIV3Schema of the served ``v1`` version of
its CustomResourceDefinition. The CRDs are vendored in deploy/kuberay/crds (preferred, so the
test always runs); the shared copy beside the repository is the fallback and, when present,
the reference the vendored copy must match.

The validation is stricter than a plain JSON-schema check in one way, on purpose: objects
that declare ``properties`` reject unknown keys, as ``kubectl apply`` does with its default
strict field validation. A misspelt field (``authOption``) fails here instead of being pruned
silently by the API server. Kubernetes-only keywords (``x-kubernetes-*``, ``nullable``) and
formats (``int32``, ``int-or-string``) are ignored: Draft 7, no format checker.
"""

from __future__ import annotations

import copy
import functools
import re
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERAY_DIR = REPO / "deploy" / "kuberay"
DOCKERFILE = REPO / "deploy" / "docker" / "Dockerfile"
VENDORED_CRDS = KUBERAY_DIR / "crds"
SHARED_CRDS = Path(__file__).resolve().parents[3] / "shared" / "kuberay-crds"
CRD_FILES = ("ray.io_rayclusters.yaml", "ray.io_rayjobs.yaml", "ray.io_rayservices.yaml")
CRD_VERSION = "v1"
# Core Kubernetes kinds the directory may hold; they are parsed and sanity-checked only.
CORE_KINDS = {("v1", "PersistentVolumeClaim"), ("v1", "Secret")}
RUN_MOUNT = "/runs"

MANIFESTS = sorted(KUBERAY_DIR.glob("*.yaml"))
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


# ---------------------------------------------------------------- loading


def _crd_dir() -> Path:
    for candidate in (VENDORED_CRDS, SHARED_CRDS):
        if all((candidate / name).is_file() for name in CRD_FILES):
            return candidate
    pytest.skip(f"KubeRay CRDs not found in {VENDORED_CRDS} or {SHARED_CRDS}")


@functools.cache
def _load_docs(path: Path) -> tuple[dict[str, Any], ...]:
    docs = [d for d in yaml.load_all(path.read_text(), Loader=_LOADER) if d is not None]
    for doc in docs:
        assert isinstance(doc, dict), f"{path.name}: every YAML document must be a mapping"
    return tuple(docs)


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """Copy of ``schema`` where objects with declared properties reject unknown keys."""
    out = dict(schema)
    if "properties" in out:
        out["properties"] = {k: _strict(v) for k, v in out["properties"].items()}
        if "additionalProperties" not in out and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _strict(out["additionalProperties"])
    if isinstance(out.get("items"), dict):
        out["items"] = _strict(out["items"])
    for key in ("anyOf", "allOf", "oneOf"):
        if key in out:
            out[key] = [_strict(s) for s in out[key]]
    if isinstance(out.get("not"), dict):
        out["not"] = _strict(out["not"])
    return out


@functools.cache
def _crd_schemas(crd_dir: Path) -> dict[tuple[str, str], dict[str, Any]]:
    """``(apiVersion, kind) -> strict openAPIV3Schema`` for the served v1 of each CRD."""
    schemas: dict[tuple[str, str], dict[str, Any]] = {}
    for name in CRD_FILES:
        crd = yaml.load((crd_dir / name).read_text(), Loader=_LOADER)
        spec = crd["spec"]
        served = [v for v in spec["versions"] if v["name"] == CRD_VERSION and v.get("served")]
        assert served, f"{name}: no served {CRD_VERSION} version"
        schema = served[0]["schema"]["openAPIV3Schema"]
        schemas[(f"{spec['group']}/{CRD_VERSION}", spec["names"]["kind"])] = _strict(schema)
    return schemas


def _validator(api_version: str, kind: str) -> jsonschema.Draft7Validator:
    schemas = _crd_schemas(_crd_dir())
    assert (api_version, kind) in schemas, f"no CRD schema for {api_version} {kind}: {sorted(schemas)}"
    return jsonschema.Draft7Validator(schemas[(api_version, kind)])


def _schema_errors(doc: dict[str, Any]) -> list[str]:
    validator = _validator(doc.get("apiVersion", ""), doc.get("kind", ""))
    return [
        f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message[:300]}"
        for e in sorted(validator.iter_errors(doc), key=lambda e: list(map(str, e.absolute_path)))
    ]


# ---------------------------------------------------------------- walking manifests


def _all_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in MANIFESTS for doc in _load_docs(path)]


def _docs_of(kind: str) -> list[tuple[str, dict[str, Any]]]:
    return [(name, doc) for name, doc in _all_docs() if doc.get("kind") == kind]


def _cluster_specs() -> list[tuple[str, dict[str, Any]]]:
    """Every Ray cluster spec: RayCluster ``spec`` and RayJob ``spec.rayClusterSpec``."""
    specs = [(f"{n}:{d['metadata']['name']}", d["spec"]) for n, d in _docs_of("RayCluster")]
    specs += [(f"{n}:{d['metadata']['name']}", d["spec"]["rayClusterSpec"]) for n, d in _docs_of("RayJob")]
    assert specs, "no RayCluster or RayJob with a rayClusterSpec under deploy/kuberay"
    return specs


def _pod_templates(cluster_spec: dict[str, Any]) -> list[dict[str, Any]]:
    groups = [cluster_spec["headGroupSpec"], *cluster_spec.get("workerGroupSpecs", [])]
    return [group["template"]["spec"] for group in groups]


def _run_claim_name() -> str:
    pvcs = _docs_of("PersistentVolumeClaim")
    assert len(pvcs) == 1, f"expected one PersistentVolumeClaim (pvc.yaml), found {len(pvcs)}"
    return pvcs[0][1]["metadata"]["name"]


def _pinned(requirement_prefix: str) -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    pattern = re.compile(rf"^{re.escape(requirement_prefix)}(\[[^\]]*\])?==([^;\s]+)")
    found = [m.group(2) for d in deps if (m := pattern.match(d.replace(" ", "")))]
    assert found, f"pyproject.toml pins no {requirement_prefix}==X"
    return found[0]


def _dockerfile_arg(name: str) -> str:
    match = re.search(rf"^ARG {name}=\"?([^\"\s]+)\"?\s*$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, f"{DOCKERFILE.name}: no `ARG {name}=...` default"
    return match.group(1)


# ---------------------------------------------------------------- tests


def test_expected_manifests_present() -> None:
    names = {p.name for p in MANIFESTS}
    assert {"raycluster.yaml", "rayjob.yaml", "rayjob-sweep.yaml", "pvc.yaml"} <= names
    assert _docs_of("RayCluster") and len(_docs_of("RayJob")) >= 2


def test_vendored_crds_complete() -> None:
    for name in (*CRD_FILES, "SOURCE"):
        assert (VENDORED_CRDS / name).is_file(), f"missing vendored {name}"
    assert (VENDORED_CRDS / "SOURCE").read_text().strip(), "crds/SOURCE must record where the CRDs came from"


def test_vendored_crds_match_shared_copy() -> None:
    if not SHARED_CRDS.is_dir():
        pytest.skip(f"no shared CRD copy at {SHARED_CRDS} to compare the vendored one with")
    for name in (*CRD_FILES, "SOURCE"):
        assert (VENDORED_CRDS / name).read_bytes() == (SHARED_CRDS / name).read_bytes(), (
            f"deploy/kuberay/crds/{name} differs from {SHARED_CRDS / name}; re-vendor the CRDs"
        )


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_documents_are_well_formed(path: Path) -> None:
    docs = _load_docs(path)
    assert docs, f"{path.name} holds no YAML document"
    for doc in docs:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), f"{path.name}: {sorted(doc)}"
        name = doc["metadata"].get("name", "")
        assert _DNS_LABEL.match(name) and len(name) <= 63, f"{path.name}: bad metadata.name {name!r}"


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_matches_crd_schema(path: Path) -> None:
    for doc in _load_docs(path):
        key = (doc["apiVersion"], doc["kind"])
        if key in CORE_KINDS:
            continue  # core Kubernetes (the PVC): no CRD to check against
        assert doc["apiVersion"].startswith("ray.io/"), f"{path.name}: unexpected {key}"
        errors = _schema_errors(doc)
        assert not errors, f"{path.name} ({doc['kind']}) violates the CRD schema:\n" + "\n".join(errors)


def test_pvc_manifest() -> None:
    (name, pvc), *_ = _docs_of("PersistentVolumeClaim")
    assert name == "pvc.yaml"
    assert pvc["spec"]["accessModes"] and pvc["spec"]["resources"]["requests"]["storage"]


def test_token_auth_enabled_on_every_cluster() -> None:
    # The field is native in the CRD, so the operator injects RAY_AUTH_MODE / RAY_AUTH_TOKEN.
    raycluster = _crd_schemas(_crd_dir())[("ray.io/v1", "RayCluster")]
    auth_schema = raycluster["properties"]["spec"]["properties"]["authOptions"]
    assert "token" in auth_schema["properties"]["mode"]["enum"]
    secrets = set()
    for where, spec in _cluster_specs():
        auth = spec.get("authOptions", {})
        assert auth.get("mode") == "token", f"{where}: authOptions.mode must be 'token', got {auth}"
        secrets.add(auth.get("secretName"))
    assert len(secrets) == 1, f"all clusters should share one token Secret, got {secrets}"


def test_rayjob_entrypoints_and_lifecycle() -> None:
    entrypoints = {}
    for name, job in _docs_of("RayJob"):
        spec = job["spec"]
        entrypoints[name] = spec["entrypoint"]
        assert re.match(r"^python -m toolbox\.(run|commands\.tune)\s", spec["entrypoint"]), spec["entrypoint"]
        assert f"trainer.run_root={RUN_MOUNT}" in spec["entrypoint"].split(), (
            f"{name}: results must go to the PVC"
        )
        assert spec["submissionMode"] == "K8sJobMode", name
        assert spec["shutdownAfterJobFinishes"] is True, name
        assert spec["ttlSecondsAfterFinished"] > 0, name
    run = entrypoints["rayjob.yaml"].split()
    assert run[:3] == ["python", "-m", "toolbox.run"]
    assert {"experiment=grpo_tiny", "rollout.num_workers=2"} <= set(run)
    sweep = entrypoints["rayjob-sweep.yaml"].split()
    assert sweep[:3] == ["python", "-m", "toolbox.commands.tune"] and "sweep=grpo_lr" in sweep


def test_every_ray_pod_mounts_the_run_volume() -> None:
    claim = _run_claim_name()
    for where, spec in _cluster_specs():
        for pod in _pod_templates(spec):
            volumes = {v["name"]: v for v in pod.get("volumes", [])}
            for container in pod["containers"]:
                mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
                assert RUN_MOUNT in mounts, f"{where}/{container['name']}: {RUN_MOUNT} not mounted"
                volume = volumes[mounts[RUN_MOUNT]]
                assert volume["persistentVolumeClaim"]["claimName"] == claim, where


def test_versions_agree_across_image_manifests_and_pyproject() -> None:
    ray_version = _pinned("ray")
    assert _dockerfile_arg("RAY_VERSION") == ray_version
    assert _dockerfile_arg("TORCH_VERSION") == _pinned("torch")
    assert re.search(r"^FROM rayproject/ray:\$\{RAY_VERSION\}", DOCKERFILE.read_text(), re.MULTILINE)
    for where, spec in _cluster_specs():
        assert spec["rayVersion"] == ray_version, where
        images = {c["image"] for pod in _pod_templates(spec) for c in pod["containers"]}
        assert len(images) == 1, f"{where}: head and workers must run one image, got {images}"


_DELETE = object()  # sentinel for _set: remove the key instead of setting it


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node: Any = doc
    for key in parents:
        node = node[int(key)] if isinstance(node, list) else node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("spec.rayClusterSpec.authOptions.mode", "tokens", "is not one of"),
        ("spec.rayClusterSpec.authOption", {"mode": "token"}, "'authOption' was unexpected"),
        ("spec.shutdownAfterJobFinish", True, "'shutdownAfterJobFinish' was unexpected"),
        ("spec.rayClusterSpec.headGroupSpec.template", _DELETE, "'template' is a required property"),
        ("spec.rayClusterSpec.workerGroupSpecs.0.replicas", "2", "is not of type 'integer'"),
        ("spec.rayClusterSpec.workerGroupSpecs.0.groupName", _DELETE, "'groupName' is a required property"),
    ],
    ids=["bad-enum", "misspelt-auth", "misspelt-field", "missing-template", "string-int", "missing-group"],
)
def test_validator_rejects_broken_rayjob(path: str, value: Any, expected: str) -> None:
    (_, job), *_ = [(n, d) for n, d in _docs_of("RayJob") if n == "rayjob.yaml"]
    broken = copy.deepcopy(job)
    _set(broken, path, value)
    errors = _schema_errors(broken)
    assert any(expected in e for e in errors), errors


# ---------------------------------------------------------------- rendered manifests (toolbox deploy render)

RENDERED = {
    "grpo_tiny": ["experiment=grpo_tiny", "rollout.num_workers=2"],
    "grpo_gpu_custom": ["experiment=grpo_tiny_fsdp2", "learner.gpus_per_worker=1", "rollout.num_workers=3",
                        "ray.placement.rollout.resources.node_b=1", "ray.placement.learner.strategy=STRICT_SPREAD"],
    "ppo_cartpole": ["experiment=ppo_cartpole"],
    "sft_tiny": ["experiment=sft_tiny", "learner.num_workers=4", "learner.cpus_per_worker=1.5"],
    "sweep_grpo_lr": ["sweep=grpo_lr"],
}


@functools.cache
def _rendered(label: str) -> dict[str, Any]:
    from toolbox.commands.deploy import render

    return render(RENDERED[label])


def _demand(args: list[str]) -> list[dict[str, float]]:
    """Every placement-group bundle the rendered job will ask Ray for (all concurrent trials of a sweep)."""
    from toolbox.commands.sweeps.config import load_sweep, sweep_configs
    from toolbox.config import load_config
    from toolbox.driver.placement import trial_bundles

    fixed = [*args, "trainer.run_root=/runs"]
    if args[0].startswith("sweep="):
        _, sweep, extra = load_sweep(fixed)
        largest = max((trial_bundles(cfg) for cfg in sweep_configs(sweep, extra)),
                      key=lambda bundles: sum(b.get("CPU", 0.0) for b in bundles))
        return largest * sweep.max_concurrent_trials
    return trial_bundles(load_config(fixed))[1:]  # [0] is a Tune trial's driver; a job's driver runs on the head


def _offered(spec: dict[str, Any]) -> list[tuple[dict[str, float], int]]:
    """(Ray resources of one pod, replicas) for every worker group of a rendered cluster spec."""
    import json

    out = []
    for group in spec["workerGroupSpecs"]:
        limits = group["template"]["spec"]["containers"][0]["resources"]["limits"]
        pod = {"CPU": float(limits["cpu"]), "GPU": float(limits.get("nvidia.com/gpu", 0))}
        custom = group["rayStartParams"].get("resources")
        pod.update(json.loads(json.loads(custom)) if custom else {})
        assert group["minReplicas"] == group["replicas"] == group["maxReplicas"] >= 1
        out.append((pod, group["replicas"]))
    return out


@pytest.mark.parametrize("label", RENDERED)
def test_rendered_rayjob_matches_crd_schema(label: str) -> None:
    job = _rendered(label)
    errors = _schema_errors(job)
    assert not errors, f"rendered {label} violates the RayJob CRD schema:\n" + "\n".join(errors)
    assert _DNS_LABEL.match(job["metadata"]["name"]), job["metadata"]["name"]


@pytest.mark.parametrize("label", RENDERED)
def test_rendered_rayjob_runs_the_same_command_on_a_shared_run_root(label: str) -> None:
    spec = _rendered(label)["spec"]
    args = spec["entrypoint"].split()
    module = "toolbox.commands.tune" if label.startswith("sweep") else "toolbox.run"
    assert args[:3] == ["python", "-m", module]
    assert args[3:] == [*RENDERED[label], f"trainer.run_root={RUN_MOUNT}", "trainer.shared_fs=true"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["backoffLimit"] == 0
    assert spec["rayClusterSpec"]["authOptions"] == {"mode": "token", "secretName": "toolbox-ray-auth"}
    claim = _run_claim_name()
    for pod in _pod_templates(spec["rayClusterSpec"]):
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in pod["containers"][0]["volumeMounts"]}
        assert volumes[mounts[RUN_MOUNT]]["persistentVolumeClaim"]["claimName"] == claim


@pytest.mark.parametrize("label", RENDERED)
def test_rendered_worker_groups_cover_the_placement_groups(label: str) -> None:
    """What the job's placement groups ask for, per resource, fits in what the worker groups offer, and every
    bundle fits in one pod that has all of its resources (a bundle cannot span pods)."""
    spec = _rendered(label)["spec"]["rayClusterSpec"]
    assert spec["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    offered, demand = _offered(spec), _demand(RENDERED[label])
    for key in {k for b in demand for k in b}:
        need = sum(b.get(key, 0.0) for b in demand)
        have = sum(pod.get(key, 0.0) * n for pod, n in offered)
        assert need <= have + 1e-9, f"{label}: bundles need {need} {key}, worker groups offer {have}"
    for bundle in demand:
        assert any(all(pod.get(k, 0.0) >= v for k, v in bundle.items()) for pod, _ in offered), (label, bundle)
    images = {c["image"] for pod in _pod_templates(spec) for c in pod["containers"]}
    gpu = any(b.get("GPU") for b in demand)
    assert len(images) == 1 and next(iter(images)).endswith("-gpu") == gpu, images


def test_strict_spread_roles_get_a_pod_each() -> None:
    spec = _rendered("grpo_gpu_custom")["spec"]["rayClusterSpec"]
    groups = {g["groupName"]: g for g in spec["workerGroupSpecs"]}
    assert groups["gpu"]["replicas"] == 2  # two learner ranks, STRICT_SPREAD, one GPU each
    assert json_resources(groups["cpu-node-b"]) == {"node_b": 3}  # three rollout workers, node_b: 1 each


def json_resources(group: dict[str, Any]) -> dict[str, float]:
    import json

    return json.loads(json.loads(group["rayStartParams"]["resources"]))


def test_deploy_render_cli_prints_yaml_and_rejects_a_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    from toolbox.commands.cli import main

    assert main(["deploy", "render", "experiment=grpo_tiny", "--image", "reg.example/toolbox:1", "--name", "x"]) == 0
    job = yaml.safe_load(capsys.readouterr().out)
    assert job["metadata"]["name"] == "x" and not _schema_errors(job)
    assert {c["image"] for pod in _pod_templates(job["spec"]["rayClusterSpec"]) for c in pod["containers"]} == {
        "reg.example/toolbox:1"}
    assert main(["deploy", "render", "experiment=grpo_tiny", "learner.cpus_per_worker=8"]) == 2
    assert "role learner: one actor needs {'CPU': 8.0}" in capsys.readouterr().err
    assert main(["deploy", "render", "experiment=grpo_tiny", "trainer.run_root=/elsewhere"]) == 2
    assert "trainer.run_root=/elsewhere" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.vllm", "Dockerfile.sglang"])
def test_every_image_sets_the_ray_settings_of_a_local_run(name: str) -> None:
    """A cluster of the toolbox image behaves as a run's own local instance does (`RAY_ENV`)."""
    from toolbox.driver.local_ray import RAY_ENV

    text = (DOCKERFILE.parent / name).read_text()
    for key, value in RAY_ENV.items():
        assert re.search(rf"^\s*{key}={value}\b", text, re.MULTILINE), f"deploy/docker/{name} does not set {key}={value}"
