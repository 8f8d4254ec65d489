"""cluster/kuberay/: the RayCluster, RayJob and RayService manifests carry the fields KubeRay
requires, their GPU groups ask for `nvidia.com/gpu`, secrets come from Kubernetes Secrets, and
what they embed validates against the schemas that will read it: the RayJob's job config as
raydec's JobConfig and its runtime env as Ray's RuntimeEnv, the RayService's serveConfigV2 as
Ray Serve's ServeDeploySchema with `args` as raydec's ServeConfig."""

from __future__ import annotations

import posixpath
import re
import shlex
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERAY = ROOT / "cluster" / "kuberay"
SUBMISSION_MODES = {"K8sJobMode", "HTTPMode", "InteractiveMode", "SidecarMode"}
GPU = "nvidia.com/gpu"
CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "RAYDEC_API_KEYS")


def documents(name: str) -> dict[str, dict]:
    """The file's YAML documents by kind (each kind once)."""
    docs = [d for d in yaml.safe_load_all((KUBERAY / name).read_text()) if d is not None]
    kinds = [d["kind"] for d in docs]
    assert len(set(kinds)) == len(kinds), f"{name}: one document per kind, got {kinds}"
    return {d["kind"]: d for d in docs}


def dockerfile() -> str:
    return (KUBERAY / "Dockerfile").read_text()


def pod_specs(cluster: dict) -> list[dict]:
    return [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]


def containers(cluster: dict) -> list[dict]:
    return [c for spec in pod_specs(cluster) for c in spec["containers"]]


def gpus(pod: dict) -> int:
    """GPUs a pod's containers ask for; requests, where set, equal limits (Kubernetes requires it)."""
    total = 0
    for container in pod["containers"]:
        resources = container.get("resources", {})
        limit = resources.get("limits", {}).get(GPU)
        if "requests" in resources and GPU in resources["requests"]:
            assert resources["requests"][GPU] == limit, f"{container['name']}: {GPU} requests must equal limits"
        total += int(limit or 0)
    return total


def image_cache_folder() -> str:
    """The folder the image's HF_HOME and RAYDEC_CACHE_DIR lie under (cluster/kuberay/Dockerfile)."""
    (line,) = [line for line in (ROOT / "cluster/kuberay/Dockerfile").read_text().splitlines() if line.startswith("ENV HF_HOME=")]
    settings = dict(part.split("=", 1) for part in line.removeprefix("ENV ").split())
    roots = {str(Path(settings[name]).parent) for name in ("HF_HOME", "RAYDEC_CACHE_DIR")}
    (root,) = roots
    return root


def assert_loadable(model: str, mounts: set[str]) -> None:
    """A model a pod can load: a hub id or s3:// (fetched into the image's cache folder, which the pod
    mounts), or a folder on a volume the pod mounts."""
    from raydec.models.sources import parse_model_name

    if parse_model_name(model).remote:
        assert image_cache_folder() in mounts, f"{model} is fetched into {image_cache_folder()}, which the pod does not mount"
    else:
        assert any(model.startswith(m.rstrip("/") + "/") for m in mounts), f"{model} is on no mounted volume"


def mount_paths(pod: dict) -> set[str]:
    return {m["mountPath"] for c in pod["containers"] for m in c.get("volumeMounts", [])}


def check_cluster_spec(cluster: dict) -> list[dict]:
    """The fields KubeRay requires of a RayClusterSpec, in every file the same way; returns the GPU groups."""
    import ray

    assert cluster["rayVersion"] == ray.__version__, "pods run the Ray the client and the image have"
    head = cluster["headGroupSpec"]
    params = head["rayStartParams"]
    assert isinstance(params, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in params.items()), (
        "rayStartParams is map[string]string: quote every value"
    )
    assert head["template"]["spec"]["containers"][0]["image"]
    assert gpus(head["template"]["spec"]) == 0, "the head holds no model"

    groups = cluster["workerGroupSpecs"]
    assert groups and len({g["groupName"] for g in groups}) == len(groups)
    for group in groups:
        assert isinstance(group["groupName"], str) and group["groupName"]
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]
        assert isinstance(group["rayStartParams"], dict)
        assert all(isinstance(v, str) for v in group["rayStartParams"].values())
        assert group["template"]["spec"]["containers"][0]["image"]

    images = {c["image"] for c in containers(cluster)}
    assert len(images) == 1, f"every pod runs the same image: {images}"
    (base,) = re.findall(r"^FROM\s+(\S+)", dockerfile(), re.MULTILINE)
    assert base.startswith(f"rayproject/ray:{ray.__version__}-") and base.endswith("-gpu"), base
    assert f"ray{ray.__version__}" in images.pop(), "the image tag names the Ray it was built on"

    for spec in pod_specs(cluster):
        volumes = {v["name"] for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{container['name']} mounts an undeclared volume {mount['name']!r}"
            for env in container.get("env", []):
                if env["name"] in CREDENTIALS:
                    assert "value" not in env and env["valueFrom"]["secretKeyRef"]["name"], (
                        f"{env['name']} comes from a Secret, never inline"
                    )

    gpu_groups = [g for g in groups if gpus(g["template"]["spec"]) >= 1]
    assert gpu_groups, f"no worker group asks for {GPU}"
    return gpu_groups


def secret_env(cluster: dict, name: str) -> list[dict]:
    """The secretKeyRef of `name` in every container (each container must have it)."""
    refs = []
    for container in containers(cluster):
        (env,) = [e for e in container.get("env", []) if e["name"] == name]
        refs.append(env["valueFrom"]["secretKeyRef"])
    return refs


def test_dockerfile_installs_a_cuda_torch_then_raydec_and_its_jobs():
    text = dockerfile()
    torch_at = re.search(r"pip install .*\btorch\b.*--index-url https://download\.pytorch\.org/whl/cu\d+", text)
    raydec_at = re.search(r"pip install [^\n]*(-e )?\.\s*$", text, re.MULTILINE)
    assert torch_at and raydec_at and torch_at.start() < raydec_at.start()
    assert re.search(r"^COPY .*\bjobs\b", text, re.MULTILINE) and re.search(r"^COPY .*\braydec\b", text, re.MULTILINE)


def test_raycluster_has_a_head_and_a_gpu_worker_group():
    docs = documents("raycluster.yaml")
    cluster = docs["RayCluster"]
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["metadata"]["name"]
    (group,) = check_cluster_spec(cluster["spec"])
    assert gpus(group["template"]["spec"]) == 1, "one GPU per pod: one model per GPU actor"
    assert group["maxReplicas"] >= 1


def test_rayjob_runs_the_t2i_batch_from_s3_to_s3_with_its_config_mounted():
    from ray.runtime_env import RuntimeEnv

    from raydec.runtime.config import JobConfig

    docs = documents("rayjob.yaml")
    job, config_map = docs["RayJob"], docs["ConfigMap"]
    assert job["apiVersion"] == "ray.io/v1" and config_map["apiVersion"] == "v1"
    spec = job["spec"]
    assert spec["submissionMode"] == "K8sJobMode" and spec["submissionMode"] in SUBMISSION_MODES
    assert spec["shutdownAfterJobFinishes"] is True
    assert isinstance(spec["ttlSecondsAfterFinished"], int) and spec["ttlSecondsAfterFinished"] > 0
    assert spec["backoffLimit"] == 2
    gpu_groups = check_cluster_spec(spec["rayClusterSpec"])

    # The entrypoint: a job script the image carries, its --config the mounted ConfigMap key.
    python, script, flag, config_path = shlex.split(spec["entrypoint"])
    assert (python, script, flag) == ("python", "jobs/t2i_batch.py", "--config")
    assert (ROOT / script).is_file()
    head = spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    volumes = {v["name"]: v for v in head["volumes"]}
    mounted = {
        posixpath.join(m["mountPath"], key): volumes[m["name"]]["configMap"]["name"]
        for m in head["containers"][0]["volumeMounts"] if "configMap" in volumes[m["name"]]
        for key in config_map["data"]
    }
    assert mounted.get(config_path) == config_map["metadata"]["name"], f"{config_path} is not the mounted ConfigMap"

    # The job config: raydec's own model, on AWS S3 (no endpoint), one model per GPU actor.
    (text,) = config_map["data"].values()
    config = JobConfig.model_validate(yaml.safe_load(text))
    assert config.task == "t2i" and config.decode.method == "sjd_pac" and config.dtype == "bfloat16"
    assert config.input.path.startswith("s3://") and config.output.path.startswith("s3://")
    assert config.input.s3.endpoint_url is None and config.output.s3.endpoint_url is None
    assert config.pool.gpus_per_worker == 1
    assert config.pool.workers <= sum(g["maxReplicas"] * gpus(g["template"]["spec"]) for g in gpu_groups)
    for group in gpu_groups:
        assert_loadable(config.model, mount_paths(group["template"]["spec"]))

    # The runtime env: a valid Ray runtime env whose working_dir is the image's copy of the repo
    # (checked here with the repo itself), the region in env_vars, no credentials.
    runtime_env = yaml.safe_load(spec["runtimeEnvYAML"])
    (workdir,) = re.findall(r"^WORKDIR\s+(\S+)", dockerfile(), re.MULTILINE)
    assert runtime_env["working_dir"] == workdir
    RuntimeEnv(**{**runtime_env, "working_dir": str(ROOT)})
    assert runtime_env["env_vars"]["AWS_REGION"] == "us-west-2"
    assert not any(name in spec["runtimeEnvYAML"] for name in CREDENTIALS)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert {ref["name"] for ref in secret_env(spec["rayClusterSpec"], name)} == {"raydec-aws"}


def validate_serve_deploy(raw: dict):
    from ray.serve.schema import ServeDeploySchema

    if hasattr(ServeDeploySchema, "model_validate"):
        return ServeDeploySchema.model_validate(raw)
    return ServeDeploySchema.parse_obj(raw)  # pydantic 1


def test_rayservice_serves_raydecs_app_with_two_7b_models_on_gpus():
    from raydec.serve import ServeConfig, app_builder

    service = documents("rayservice.yaml")["RayService"]
    assert service["apiVersion"] == "ray.io/v1"
    spec = service["spec"]
    assert isinstance(spec["serveConfigV2"], str), "serveConfigV2 is a YAML string, not a mapping"
    gpu_groups = check_cluster_spec(spec["rayClusterConfig"])
    (group,) = gpu_groups
    pod = group["template"]["spec"]
    mounts = mount_paths(pod)

    deploy = validate_serve_deploy(yaml.safe_load(spec["serveConfigV2"]))
    (app,) = deploy.applications
    assert app.import_path == "raydec.serve:app_builder" and app.route_prefix == "/"
    config = ServeConfig.model_validate(app.args)
    assert type(app_builder(app.args)).__name__ == "Application"  # builds; no model loads here

    by_task = {m.task: m for m in config.models}
    assert set(by_task) == {"t2i", "caption"}
    assert by_task["t2i"].decode.method == "sjd_pac" and by_task["caption"].decode.method == "vispec"
    for served in config.models:
        paths = [served.model] + ([served.decode.draft_model] if served.decode.draft_model else [])
        for path in paths:
            assert_loadable(path, mounts)
        assert served.gpus_per_worker == 1 and served.dtype == "bfloat16"
    assert by_task["caption"].decode.draft_model, "a 7B VLM has no shipped draft: name its checkpoint"

    # Enough GPU pods for every model's minimum replicas, and room for their maximum.
    per_pod = gpus(pod)

    def replicas(served, key):
        return (served.autoscaling_config or {}).get(key, served.num_replicas)

    assert sum(replicas(m, "min_replicas") * m.gpus_per_worker for m in config.models) <= group["minReplicas"] * per_pod
    assert sum(replicas(m, "max_replicas") * m.gpus_per_worker for m in config.models) <= group["maxReplicas"] * per_pod

    # API keys: only from the environment the Secret fills, in every pod the ingress may run on.
    assert not config.api_keys and config.api_keys_env == "RAYDEC_API_KEYS"
    refs = secret_env(spec["rayClusterConfig"], "RAYDEC_API_KEYS")
    assert len({(r["name"], r["key"]) for r in refs}) == 1


@pytest.mark.parametrize("name", ["raycluster.yaml", "rayjob.yaml", "rayservice.yaml"])
def test_manifests_name_their_resources(name):
    for doc in documents(name).values():
        assert doc["metadata"]["name"] and re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
