"""The KubeRay manifests (ops/kuberay/*.yaml) are valid and serve: every core-kind document
against Kubernetes' own schemas (kubernetes-validate, offline), the RayService against
KubeRay's ray.io/v1 CRD (a trimmed copy under tests/ops/data/), its serve config against
autospec's ServeConfig, the controller's policy against autospec's parser; and the pieces fit
together (the target and the shared volume mounted where they are used, GPU pods tolerating
the GPU taint, nothing serving or training before the migration). Also the cluster
launcher's controller environment, which must name what autospec reads."""

from __future__ import annotations

import copy
import json
import re
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from autospec.controller.policy import parse_policy
from autospec.serve.config import ServeConfig
from autospec.settings import Settings
from tests.ops.helpers import (
    KUBERAY,
    OPS,
    containers,
    dockerfile,
    documents,
    pod_specs,
)

#: the Kubernetes version the core kinds are checked against (kubernetes-validate ships it)
KUBERNETES = "1.33.0"
CRD = Path(__file__).parent / "data" / "rayservice-crd-v1.7.0.yaml"
ALL = [(path.name, i, doc) for path in KUBERAY for i, doc in enumerate(documents(path))]
CORE = [(name, i, doc) for name, i, doc in ALL if "." not in doc["apiVersion"].split("/")[0]
        or doc["apiVersion"].split("/")[0].endswith(".k8s.io")]
BY_KIND: dict[str, list[dict[str, Any]]] = {}
for _name, _i, _doc in ALL:
    BY_KIND.setdefault(_doc["kind"], []).append(_doc)
(RAYSERVICE,) = BY_KIND["RayService"]


def test_every_document_is_known() -> None:
    kinds = {doc["kind"] for _, _, doc in ALL}
    assert kinds == {"Secret", "PersistentVolumeClaim", "ConfigMap", "Deployment", "Job",
                     "RayService"}
    assert {doc["apiVersion"] for _, _, doc in ALL} - {doc["apiVersion"] for _, _, doc in CORE} \
        == {"ray.io/v1"}


@pytest.mark.parametrize(("name", "index", "doc"), CORE,
                         ids=[f"{n}#{i}-{d['kind']}" for n, i, d in CORE])
def test_core_documents_validate(name: str, index: int, doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


@pytest.mark.parametrize("group", ["head", "gpu"])
def test_rayservice_pod_templates_validate(group: str) -> None:
    """KubeRay embeds core PodTemplateSpecs: checked as a PodTemplate of that version."""
    cluster = RAYSERVICE["spec"]["rayClusterConfig"]
    spec = (cluster["headGroupSpec"] if group == "head" else
            next(g for g in cluster["workerGroupSpecs"] if g["groupName"] == group))
    doc = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"x-{group}"},
           "template": spec["template"]}
    kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def closed(schema: Any) -> Any:
    """The CRD schema with unknown fields refused (the API server drops them silently, and
    kubectl's strict field validation refuses them): additionalProperties false on every
    object with properties that does not preserve unknown fields."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        if out.get("nullable"):
            out = {"anyOf": [out, {"type": "null"}]}
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


def rayservice_errors(doc: dict[str, Any]) -> list[str]:
    schema = closed(yaml.safe_load(CRD.read_text()))
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
            for e in validator.iter_errors(doc)]


def test_rayservice_fields_are_kuberay_v1s() -> None:
    assert RAYSERVICE["apiVersion"] == "ray.io/v1"
    assert rayservice_errors(RAYSERVICE) == []


def test_the_crd_check_catches_a_misplaced_field() -> None:
    bad = copy.deepcopy(RAYSERVICE)
    bad["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["minReplica"] = 2
    bad["spec"]["serveConfig"] = "x"
    errors = rayservice_errors(bad)
    assert any("minReplica" in e for e in errors) and any("serveConfig" in e for e in errors)


def serve_applications(text: str) -> list[dict[str, Any]]:
    return yaml.safe_load(text)["applications"]


@pytest.mark.parametrize("where", ["rayservice", "serve_config"])
def test_serve_config_args_are_autospecs(where: str) -> None:
    text = (RAYSERVICE["spec"]["serveConfigV2"] if where == "rayservice"
            else (OPS / "serve_config.yaml").read_text())
    (application,) = serve_applications(text)
    assert application["import_path"] == "autospec.serve.app:build_app"
    ServeConfig.model_validate(application["args"])


def test_controller_policy_parses() -> None:
    (config_map,) = [d for d in BY_KIND["ConfigMap"] if d["metadata"]["name"] == "autospec-policy"]
    policy = parse_policy(config_map["data"]["policy.yaml"], source="controller.yaml")
    assert policy.training.workers == 2 and policy.training.use_gpu  # GPU workers


# -- the pieces fit together -------------------------------------------------------------------

def pods() -> Iterator[tuple[str, dict[str, Any]]]:
    for _, _, doc in ALL:
        if doc["kind"] in ("Deployment", "Job", "RayService"):
            yield from pod_specs(doc)


def env_of(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def mounts_of(pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """mount path -> claim name."""
    claims = {v["name"]: v["persistentVolumeClaim"]["claimName"]
              for v in pod.get("volumes", []) if "persistentVolumeClaim" in v}
    return {m["mountPath"]: claims.get(m["name"], m["name"])
            for m in container.get("volumeMounts", [])}


RUNS_AUTOSPEC = ("autospec/head", "autospec/gpu", "autospec-controller")


def test_claims_exist() -> None:
    claims = {d["metadata"]["name"] for d in BY_KIND["PersistentVolumeClaim"]}
    used = {m for _, pod in pods() for c in containers(pod) for m in mounts_of(pod, c).values()
            if m.startswith("autospec-")}
    assert used == claims == {"autospec-shared", "autospec-model"}
    for doc in BY_KIND["PersistentVolumeClaim"]:
        assert doc["spec"]["accessModes"] == ["ReadWriteMany"]


def test_serving_and_training_pods_share_storage_and_see_the_target() -> None:
    """Head, GPU workers and controller: the shared volume at /shared with the artifact and
    data directories (Ray Train storage) in it, and the target's volume where serveConfigV2
    and the model Job say."""
    (application,) = serve_applications(RAYSERVICE["spec"]["serveConfigV2"])
    target = application["args"]["target"]
    (fetch,) = [d for d in BY_KIND["Job"] if d["metadata"]["name"] == "autospec-model-fetch"]
    (fetcher,) = fetch["spec"]["template"]["spec"]["containers"]
    assert env_of(fetcher)["AUTOSPEC_MODEL_DIR"] == target
    assert fetcher["args"] == ["fetch-model"]
    seen = set()
    for name, pod in pods():
        if name not in RUNS_AUTOSPEC:
            continue
        seen.add(name)
        main = pod["containers"][0]
        env, mounts = env_of(main), mounts_of(pod, main)
        assert mounts.get("/shared") == "autospec-shared", name
        assert env["AUTOSPEC_ARTIFACT_DIR"].startswith("/shared/"), name
        assert env["AUTOSPEC_DATA_DIR"].startswith("/shared/"), name
        model_mount = [p for p, claim in mounts.items() if claim == "autospec-model"]
        assert model_mount and target.startswith(model_mount[0] + "/"), name
        ro = [m for m in main["volumeMounts"] if m["mountPath"] == model_mount[0]]
        assert ro[0].get("readOnly"), name
    assert seen == set(RUNS_AUTOSPEC)
    envs = {name: env_of(pod["containers"][0]) for name, pod in pods() if name in RUNS_AUTOSPEC}
    for key in ("AUTOSPEC_ARTIFACT_DIR", "AUTOSPEC_DATA_DIR"):
        assert len({env[key] for env in envs.values()}) == 1, key


def gpus(container: dict[str, Any]) -> int:
    resources = container.get("resources", {})
    return max(int(resources.get(k, {}).get("nvidia.com/gpu", 0)) for k in ("limits", "requests"))


def test_gpu_pods_tolerate_the_gpu_taint_and_request_what_they_limit() -> None:
    for name, pod in pods():
        wants = sum(gpus(c) for c in containers(pod))
        tolerated = any(t.get("key") == "nvidia.com/gpu" and t.get("effect") == "NoSchedule"
                        for t in pod.get("tolerations", []))
        assert tolerated == (wants > 0), name
        for c in containers(pod):
            limits = c.get("resources", {}).get("limits", {})
            requests = c.get("resources", {}).get("requests", {})
            if "nvidia.com/gpu" in limits:
                assert requests.get("nvidia.com/gpu") == limits["nvidia.com/gpu"], name


def test_gpu_workers_fit_replicas_and_training() -> None:
    """Each replica and each Ray Train worker (the policy's training.workers) takes a GPU."""
    (application,) = serve_applications(RAYSERVICE["spec"]["serveConfigV2"])
    args = application["args"]
    per_replica = args["ray_actor_options"]["num_gpus"]
    (config_map,) = [d for d in BY_KIND["ConfigMap"] if d["metadata"]["name"] == "autospec-policy"]
    workers = parse_policy(config_map["data"]["policy.yaml"]).training.workers
    cluster = RAYSERVICE["spec"]["rayClusterConfig"]
    (group,) = cluster["workerGroupSpecs"]
    per_node = gpus(group["template"]["spec"]["containers"][0])
    assert group["minReplicas"] * per_node >= args["replicas"] * per_replica
    assert group["maxReplicas"] * per_node >= args["replicas"] * per_replica + workers
    assert cluster["enableInTreeAutoscaling"] or group["minReplicas"] == group["maxReplicas"]


def test_nothing_serves_or_trains_before_the_migration() -> None:
    """The head (every replica is placed through it) and the controller wait in an init
    container until `autospec db current` exits 0, which it does only when their code can
    run against the schema (autospec/store/cli.py: current or ahead-compatible)."""
    for name, pod in pods():
        if name not in ("autospec/head", "autospec-controller"):
            continue
        scripts = [" ".join(c.get("command", []) + c.get("args", []))
                   for c in pod.get("initContainers", [])]
        assert any(re.search(r"until autospec db current; do .*done", s) for s in scripts), name
        waiting = next(c for c in pod["initContainers"] if "db current" in " ".join(c["command"]))
        assert waiting["envFrom"] == [{"secretRef": {"name": "autospec-db"}}], name


def test_one_image_and_rays_version() -> None:
    images = {c["image"] for _, pod in pods() for c in containers(pod)}
    assert len(images) == 1 and images.pop().endswith("-gpu")
    (base,) = [i.args for i in dockerfile() if i.name == "ARG" and i.args.startswith("RAY_IMAGE=")]
    version = re.search(r":(\d+\.\d+\.\d+)", base).group(1)  # type: ignore[union-attr]
    assert RAYSERVICE["spec"]["rayClusterConfig"]["rayVersion"] == version


# -- the cluster launcher's controller ---------------------------------------------------------

def cluster_config() -> dict[str, Any]:
    return yaml.safe_load((OPS / "cluster.yaml").read_text())


def unit_exec(key: str) -> list[str]:
    text = (OPS / "systemd" / "autospec-controller.service").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.startswith(key + "=")]
    return shlex.split(line.split("=", 1)[1].replace("$$", "$"))


def written_env_keys(command: str) -> set[str]:
    return set(re.findall(r"echo \"?([A-Z_]+)=", command))


def test_controller_unit_gets_the_env_file_the_head_setup_writes() -> None:
    start = unit_exec("ExecStart")
    assert start[:2] == ["/usr/bin/docker", "exec"]
    env_file = start[start.index("--env-file") + 1]
    assert start[start.index("--env-file") + 2] == cluster_config()["docker"]["container_name"]
    (writer,) = [c for c in cluster_config()["head_setup_commands"] if f"> {env_file}" in c]
    keys = written_env_keys(writer)
    settings = {f"AUTOSPEC_{name.upper()}" for name in Settings.model_fields}
    assert keys - {"RAY_ADDRESS"} <= settings
    # no API key: the controller sends no request (keys are for replicas: a key file)
    assert {"AUTOSPEC_DATABASE_URL", "AUTOSPEC_ARTIFACT_DIR",
            "AUTOSPEC_DATA_DIR", "RAY_ADDRESS"} == keys
    assert Path(env_file).parent.as_posix() + ":" + Path(env_file).parent.as_posix() in " ".join(
        cluster_config()["docker"]["run_options"]), "the env file's directory is shared"
    assert unit_exec("ExecStartPre")[-1] == env_file


def test_controller_unit_policy_is_created_from_the_shipped_default() -> None:
    start = " ".join(unit_exec("ExecStart"))
    policy = re.search(r"--policy (\S+)", start).group(1)  # type: ignore[union-attr]
    (creator,) = [c for c in cluster_config()["head_setup_commands"] if policy in c]
    assert creator.startswith(f"test -e {policy} ||")
    assert "shipped_dir('policies').joinpath('default.yaml')" in creator
    from autospec.shipped import shipped_dir

    parse_policy(shipped_dir("policies").joinpath("default.yaml").read_text())


def test_controller_unit_file_is_copied_where_the_host_enables_it() -> None:
    config = cluster_config()
    (copier,) = [c for c in config["head_setup_commands"] if "autospec-controller.service" in c]
    source, dest = copier.split()[1:3]
    mount, local = next(iter(config["file_mounts"].items()))
    assert local == "./ops" and source.startswith(mount + "/")
    assert (OPS / source[len(mount) + 1:]).is_file()
    enable = [ln for ln in (OPS / "cluster.yaml").read_text().splitlines()
              if "systemctl enable --now" in ln]
    assert enable and f"{dest}autospec-controller.service" in enable[0]
    assert "--run-env host" in enable[0]


def test_cluster_config_is_the_launchers() -> None:
    """ops/cluster.yaml against the cluster launcher's own schema (shipped with Ray)."""
    import ray.autoscaler

    schema = json.loads((Path(ray.autoscaler.__file__).parent / "ray-schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(
        cluster_config())]
    assert errors == []


def test_serving_pods_read_the_api_keys_secret_as_a_file() -> None:
    """Head and GPU workers (where replicas run): AUTOSPEC_API_KEY_FILE names a file of the
    mounted ``autospec-api-keys`` Secret, so replicas re-read rotated keys (issue 31)."""
    secrets = {d["metadata"]["name"]: d for d in BY_KIND["Secret"]}
    keys_secret = secrets["autospec-api-keys"]
    for name, pod in pods():
        if name not in ("autospec/head", "autospec/gpu"):
            continue
        main = pod["containers"][0]
        path = Path(env_of(main)["AUTOSPEC_API_KEY_FILE"])
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in main["volumeMounts"] if m["mountPath"] == str(path.parent)]
        assert mount.get("readOnly"), name
        assert volumes[mount["name"]]["secret"]["secretName"] == "autospec-api-keys", name
        assert path.name in keys_secret["stringData"], name
    assert "AUTOSPEC_API_KEY" not in secrets["autospec-db"]["stringData"]


def test_controller_unit_stopped_by_sigterm_is_not_failed() -> None:
    """ExecStop sends `controller run` SIGTERM, on which it exits 143 (docs/cli.md), and
    docker exec exits with its status: systemd must count 143 a success, or every
    `systemctl stop` (and a host's shutdown) leaves the unit failed."""
    from autospec.stopping import exit_on_sigterm  # what `controller run` stops with

    assert exit_on_sigterm.__doc__ and "143" in exit_on_sigterm.__doc__
    assert "kill -TERM" in " ".join(unit_exec("ExecStop"))
    assert "143" in unit_exec("SuccessExitStatus")


def test_cluster_launchers_controller_runs_on_the_replicas_kind_of_gpu() -> None:
    """The systemd unit runs the controller in the head's container; its features, replay,
    in-process training and the gate's measured speedup run on its device, which must be the
    replicas' (docs/gpu.md; the KubeRay controller has a GPU of its own). Ray gets no GPU
    there, so no replica or Ray Train worker is placed on the head."""
    config = cluster_config()
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    (worker,) = [t for name, t in types.items() if name != config["head_node_type"]]
    assert head["node_config"]["InstanceType"] == worker["node_config"]["InstanceType"]
    assert head["resources"].get("GPU") == 0


def test_gpu_deployments_restart_without_a_second_gpu() -> None:
    """A Deployment whose pod takes a GPU (the controller) is replaced old pod first: a
    rolling update starts the new pod before the old one ends, which needs a free GPU, so a
    restart for a policy change hangs Pending on a cluster without a spare one."""
    checked = 0
    for doc in BY_KIND["Deployment"]:
        pod = doc["spec"]["template"]["spec"]
        if any(gpus(c) for c in containers(pod)):
            assert doc["spec"].get("strategy", {}).get("type") == "Recreate", \
                doc["metadata"]["name"]
            checked += 1
    assert checked == 1


def unknown_keys(data: dict[str, Any], model: Any, where: str) -> list[str]:
    """Keys a Ray Serve schema model does not have (Ray ignores them without a word)."""
    return [f"{where}.{key}" for key in data if key not in model.model_fields]


@pytest.mark.parametrize("where", ["rayservice", "serve_config"])
def test_serve_config_is_ray_serves(where: str) -> None:
    """The whole file against Ray Serve's own ServeDeploySchema (what `serve deploy` and
    KubeRay submit), with the keys it would silently drop (a misspelt `proxy_location`,
    an `http_options` or application field) refused; `deployments` overrides name a
    deployment the application builds."""
    from ray.serve.schema import HTTPOptionsSchema, ServeApplicationSchema, ServeDeploySchema

    text = (RAYSERVICE["spec"]["serveConfigV2"] if where == "rayservice"
            else (OPS / "serve_config.yaml").read_text())
    data = yaml.safe_load(text)
    ServeDeploySchema.model_validate(data)
    problems = unknown_keys(data, ServeDeploySchema, "")
    problems += unknown_keys(data.get("http_options", {}), HTTPOptionsSchema, "http_options")
    for app in data["applications"]:
        problems += unknown_keys(app, ServeApplicationSchema, app["name"])
        assert {d["name"] for d in app.get("deployments", [])} <= {
            "AutospecServer", "AutospecMetrics"}
    assert problems == []
    assert unknown_keys({"proxy_locaton": "EveryNode"}, ServeDeploySchema, "") != []


def test_the_controller_evaluates_at_the_replicas_k() -> None:
    """docs/gpu.md: the policy's evaluation.k must equal the serving speculator_k (the gate
    measures τ and speed at that k; nothing checks it at run time). KubeRay: the ConfigMap's
    policy and the RayService; cluster launcher: the shipped default (its policy file) and
    serve_config.yaml, or `autospec serve`'s default k."""
    from autospec.shipped import shipped_dir

    (config_map,) = [d for d in BY_KIND["ConfigMap"] if d["metadata"]["name"] == "autospec-policy"]
    (application,) = serve_applications(RAYSERVICE["spec"]["serveConfigV2"])
    assert parse_policy(config_map["data"]["policy.yaml"]).evaluation.k == \
        application["args"]["speculator_k"]
    default = parse_policy(shipped_dir("policies").joinpath("default.yaml").read_text())
    (application,) = serve_applications((OPS / "serve_config.yaml").read_text())
    assert default.evaluation.k == application["args"]["speculator_k"] == \
        ServeConfig().speculator_k
    assert "--speculator-k" not in (OPS / "cluster.yaml").read_text()
