"""The deployment files in deploy/: schema-valid, consistent with each other and with Settings.

There is no Docker engine or Kubernetes cluster here, so nothing is built or applied: the
Kubernetes manifests are validated offline against the API schemas that kubernetes-validate
ships (strict: unknown fields are errors), compose.yaml against the Compose Specification's
JSON schema that check-jsonschema vendors, and the Dockerfile by reading its instructions.
"""

from __future__ import annotations

import copy
import json
import re
import shlex
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from timewheel.settings import Settings
from timewheel.store.redis_settings import MEMORY_SETTINGS, costly_settings

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
REPO = DEPLOY.parent
K8S = DEPLOY / "k8s"
# A Kubernetes release the installed kubernetes-validate ships schemas for (it keeps a dozen).
K8S_VERSION = "1.33.0"
DEADLINE_DEFAULT = float(Settings.model_fields["batch_deadline_seconds"].default)
SETTING_NAMES = {f"TIMEWHEEL_{name.upper()}" for name in Settings.model_fields}


# --- helpers -----------------------------------------------------------------------------------

def k8s_documents() -> dict[str, dict[str, Any]]:
    """Every manifest of deploy/k8s (but the kustomization), by kind."""
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            assert doc["kind"] not in docs, f"two {doc['kind']} manifests"
            docs[doc["kind"]] = doc
    return docs


def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    return data


def seconds(duration: str) -> float:
    """A Compose duration ("45s", "1m30s", "1h") in seconds."""
    parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s)?", duration)
    assert parts and duration, f"not a duration: {duration!r}"
    hours, minutes, secs = (float(p) if p else 0.0 for p in parts.groups())
    return hours * 3600 + minutes * 60 + secs


def dockerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = (DEPLOY / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    result = []
    for line in joined.splitlines():
        if line.strip():
            instruction, _, args = line.strip().partition(" ")
            result.append((instruction.upper(), " ".join(args.split())))
    return result


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = k8s_documents()["Deployment"]["spec"]["template"]["spec"]
    return spec


def configured_deadline(env: dict[str, Any]) -> float:
    return float(env.get("TIMEWHEEL_BATCH_DEADLINE_SECONDS", DEADLINE_DEFAULT))


# --- Kubernetes --------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["ConfigMap", "Secret", "Deployment", "Service",
                                  "PodDisruptionBudget"])
def test_manifest_is_valid_for_kubernetes(kind: str) -> None:
    doc = k8s_documents()[kind]
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_validator_rejects_a_broken_deployment() -> None:
    """The validation above can fail: a misspelt field and a wrong type are caught."""
    deployment = k8s_documents()["Deployment"]
    typo = copy.deepcopy(deployment)
    container = typo["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, K8S_VERSION, strict=True)
    wrong_type = copy.deepcopy(deployment)
    wrong_type["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong_type, K8S_VERSION, strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    on_disk = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == on_disk
    images = {image["name"] for image in kustomization["images"]}
    assert {c["image"] for c in pod_spec()["containers"]} <= images


def test_deployment_runs_replicas_with_probes_and_resources() -> None:
    deployment = k8s_documents()["Deployment"]
    assert deployment["spec"]["replicas"] >= 2
    spec = pod_spec()
    assert spec["securityContext"]["runAsNonRoot"] is True
    # The Service is named timewheel: its links would set TIMEWHEEL_PORT=tcp://... in the pods.
    assert spec["enableServiceLinks"] is False
    (container,) = spec["containers"]
    # Ready needs Redis; alive does not: a Redis outage must not restart every pod.
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/livez"
    # Started is not ready: /healthz is 503 while Redis is down, and a startup probe on it would
    # restart every pod that starts during an outage.
    assert "httpGet" not in container["startupProbe"]
    assert container["startupProbe"]["tcpSocket"]["port"] in {p["name"] for p in container["ports"]}
    assert set(container["resources"]["requests"]) >= {"cpu", "memory"}
    assert "memory" in container["resources"]["limits"]
    assert container["args"][:3] == ["serve", "--host", "0.0.0.0"]
    port_names = {port["name"] for port in container["ports"]}
    assert container["readinessProbe"]["httpGet"]["port"] in port_names


def test_deployment_reads_the_secret_and_the_configmap() -> None:
    docs = k8s_documents()
    (container,) = pod_spec()["containers"]
    sources = container["envFrom"]
    assert {"secretRef": {"name": docs["Secret"]["metadata"]["name"]}} in sources
    assert {"configMapRef": {"name": docs["ConfigMap"]["metadata"]["name"]}} in sources
    secret_keys = set(docs["Secret"]["stringData"])
    assert {"TIMEWHEEL_API_TOKENS", "TIMEWHEEL_SIGNING_SECRET"} <= secret_keys
    # Every variable is a real setting: a misspelt one would be silently ignored.
    assert secret_keys | set(docs["ConfigMap"]["data"]) <= SETTING_NAMES
    # Secrets stay out of the ConfigMap.
    assert not {"TIMEWHEEL_API_TOKENS", "TIMEWHEEL_SIGNING_SECRET"} & set(docs["ConfigMap"]["data"])


def env_file() -> dict[str, str]:
    """deploy/timewheel.env's settings (the systemd unit's EnvironmentFile)."""
    return dict(line.split("=", 1) for line in (DEPLOY / "timewheel.env").read_text().splitlines()
                if line.strip() and not line.startswith("#"))


@pytest.mark.parametrize("source", ["timewheel.env", "k8s/secret.yaml"])
def test_a_forgotten_placeholder_secret_stops_the_start(source: str) -> None:
    """The tokens and signing secrets printed in deploy/ are refused by the settings: a deploy
    that forgets to replace one does not start (an accepted placeholder token would be an admin
    token anyone can read here, on a service that listens on 0.0.0.0)."""
    values = env_file() if source == "timewheel.env" else k8s_documents()["Secret"]["stringData"]
    for name in ("TIMEWHEEL_API_TOKENS", "TIMEWHEEL_SIGNING_SECRET"):
        setting = name.removeprefix("TIMEWHEEL_").lower()
        with pytest.raises(ValidationError, match=setting):
            Settings(**{setting: values[name]})


def test_service_and_pdb_select_the_pods() -> None:
    docs = k8s_documents()
    labels = docs["Deployment"]["spec"]["template"]["metadata"]["labels"]
    assert docs["Deployment"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert docs["Service"]["spec"]["selector"].items() <= labels.items()
    assert docs["PodDisruptionBudget"]["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (container,) = pod_spec()["containers"]
    assert docs["Service"]["spec"]["ports"][0]["targetPort"] in {p["name"] for p in
                                                                 container["ports"]}
    # At least one pod stays up through voluntary disruptions, and a drain is still possible.
    assert 1 <= docs["PodDisruptionBudget"]["spec"]["minAvailable"] < docs["Deployment"][
        "spec"]["replicas"]


def test_kubernetes_grace_period_outlasts_the_batch_deadline() -> None:
    spec = pod_spec()
    (container,) = spec["containers"]
    deadline = configured_deadline(k8s_documents()["ConfigMap"]["data"])
    assert deadline >= DEADLINE_DEFAULT
    pause = float(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    # The preStop pause counts against the grace period; then the deadline; then some room.
    assert spec["terminationGracePeriodSeconds"] >= pause + deadline + 10


# --- Compose -----------------------------------------------------------------------------------

def compose_schema() -> dict[str, Any]:
    vendored = files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema: dict[str, Any] = json.loads(vendored.read_text())
    return schema


def test_compose_file_is_valid_for_the_compose_specification() -> None:
    schema = compose_schema()
    validator = jsonschema.Draft202012Validator(schema)
    errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(compose())]
    assert errors == []
    # ...and the schema does reject a malformed service.
    broken = compose()
    broken["services"]["redis"]["stop_grace_periods"] = "45s"
    assert list(validator.iter_errors(broken))


def timewheel_services() -> dict[str, dict[str, Any]]:
    return {name: service for name, service in compose()["services"].items()
            if name.startswith("timewheel")}


def test_compose_redis_never_evicts_and_keeps_an_append_only_file() -> None:
    redis = compose()["services"]["redis"]
    image, _, tag = redis["image"].partition(":")
    assert image == "redis" and tag.split(".")[0] == "7"
    flags = dict(zip(redis["command"][1::2], redis["command"][2::2], strict=True))
    assert flags["--appendonly"] == "yes"
    assert flags["--maxmemory-policy"] == "noeviction"
    assert flags["--appendfsync"] in {"always", "everysec"}
    assert "redis-cli" in redis["healthcheck"]["test"]
    assert any(volume.endswith(":/data") for volume in redis["volumes"])
    # The same settings as deploy/redis.conf, the file for operators' own Redis.
    conf = dict(line.split(None, 1) for line in (DEPLOY / "redis.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    for name, value in conf.items():
        assert flags[f"--{name}"] == value.strip()


@pytest.mark.parametrize("conf", ["redis.conf", "cluster/redis-cluster.conf"])
def test_the_documented_redis_settings_keep_a_dense_wheel_compact(conf: str) -> None:
    """Every memory setting the service checks at start (store/redis_settings.py) is in the
    configs operators copy, at a value it does not warn about; the compose files run them (the
    tests above compare their commands with these files)."""
    values = dict(line.split(None, 1) for line in (DEPLOY / conf).read_text().splitlines()
                  if line.strip() and not line.startswith("#"))
    values = {name: value.strip() for name, value in values.items()}
    assert {setting.name for setting in MEMORY_SETTINGS} <= set(values)
    assert costly_settings(values) == []
    # The control: the same check finds Redis's defaults costly.
    assert len(costly_settings(dict.fromkeys(values, "128"))) == len(MEMORY_SETTINGS)


def test_compose_runs_two_replicas_on_the_shared_redis() -> None:
    services = timewheel_services()
    assert len(services) >= 2
    images = {service["image"] for service in services.values()}
    assert len(images) == 1
    published = []
    for service in services.values():
        assert service["depends_on"]["redis"]["condition"] == "service_healthy"
        env = service["environment"]
        assert env["TIMEWHEEL_REDIS_URL"].startswith("redis://redis:")
        assert set(env) <= SETTING_NAMES
        assert "/healthz" in " ".join(service["healthcheck"]["test"])
        assert service["build"]["dockerfile"] == "deploy/Dockerfile"
        assert (DEPLOY / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
        published += [port for port in service["ports"] if port.endswith(":8080")]
    assert len(published) == len(services)  # every replica (API, dashboard) reachable


def test_compose_grace_period_outlasts_the_batch_deadline() -> None:
    for name, service in timewheel_services().items():
        deadline = configured_deadline(service["environment"])
        assert seconds(service["stop_grace_period"]) > deadline, name
        assert service.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_no_image_is_latest() -> None:
    images = [service["image"] for service in compose()["services"].values()]
    images += [c["image"] for c in pod_spec()["containers"]]
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    images += [f"{i['newName']}:{i['newTag']}" for i in kustomization["images"]]
    for image in images:
        if image == "timewheel":  # the kustomization's images: entry gives its tag
            continue
        assert ":" in image and not image.endswith(":latest"), image


# --- Dockerfile and the systemd unit -----------------------------------------------------------

def test_dockerfile_base_image_is_pinned_slim_python_311() -> None:
    instructions = dockerfile()
    args = dict(a.split("=", 1) for i, a in instructions if i == "ARG" and "=" in a)
    bases = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], a.split()[0])
             for i, a in instructions if i == "FROM"]
    assert bases
    for base in bases:
        image, _, tag = base.partition(":")
        assert image == "python" and tag and tag != "latest", base
        assert tag.startswith("3.11") and "slim" in tag, base


def test_dockerfile_runs_as_non_root_with_a_healthcheck() -> None:
    instructions = dockerfile()
    users = [a for i, a in instructions if i == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    last_from = max(n for n, (i, _) in enumerate(instructions) if i == "FROM")
    assert any(i == "USER" for i, _ in instructions[last_from:])
    (healthcheck,) = [a for i, a in instructions if i == "HEALTHCHECK"]
    assert "/healthz" in healthcheck
    last = dict(instructions)
    command = [*json.loads(last["ENTRYPOINT"]), *json.loads(last["CMD"])]
    assert command[:4] == ["timewheel", "serve", "--host", "0.0.0.0"]


def test_dockerfile_copies_what_exists_and_the_context_filter_lets_it_in() -> None:
    copied = []
    for instruction, args in dockerfile():
        if instruction == "COPY" and not args.startswith("--from"):
            copied += shlex.split(args)[:-1]
    assert {"pyproject.toml", "README.md", "lua", "timewheel"} <= set(copied)
    ignore = (DEPLOY / "Dockerfile.dockerignore").read_text().splitlines()
    for source in copied:
        assert (REPO / source).exists(), source
        assert f"!{source}" in ignore or f"!{source}/" in ignore, source


def test_systemd_unit_stop_timeout_outlasts_the_batch_deadline() -> None:
    unit = (DEPLOY / "timewheel.service").read_text()
    (timeout,) = re.findall(r"^TimeoutStopSec=(\d+)$", unit, re.MULTILINE)
    assert float(timeout) > DEADLINE_DEFAULT
    assert set(env_file()) <= SETTING_NAMES


def test_systemd_unit_keeps_the_embedded_redis_socket_where_keys_rotate_finds_it() -> None:
    """PrivateTmp=true gives the service a /tmp no shell sees, and the embedded Redis's socket
    is under TMPDIR (timewheel/store/embedded.py, socket_dir): the unit sets TMPDIR to its
    runtime directory, and the keys rotate line of its header runs with the same TMPDIR and
    environment file."""
    unit = (DEPLOY / "timewheel.service").read_text()
    (runtime,) = re.findall(r"^RuntimeDirectory=(\S+)$", unit, re.MULTILINE)
    (tmpdir,) = re.findall(r"^Environment=TMPDIR=(\S+)$", unit, re.MULTILINE)
    assert tmpdir == f"/run/{runtime}"
    (env_path,) = re.findall(r"^EnvironmentFile=(\S+)$", unit, re.MULTILINE)
    joined = re.sub(r"\\\n#\s*", " ", unit)
    (rotate,) = [line for line in joined.splitlines() if "systemd-run" in line]
    assert rotate.rstrip().endswith("timewheel keys rotate")
    assert f"--setenv=TMPDIR={tmpdir}" in rotate.split()
    assert f"EnvironmentFile={env_path}" in rotate.split()


# --- deploy/cluster: a Redis Cluster in production shape (issue #12) ----------------------------

def test_cluster_compose_is_valid_and_its_nodes_run_the_documented_settings() -> None:
    """deploy/cluster/compose.yaml is valid Compose; six nodes with the settings of
    deploy/cluster/redis-cluster.conf; processes that acknowledge with WAIT on a cluster."""
    cluster = yaml.safe_load((DEPLOY / "cluster" / "compose.yaml").read_text())
    validator = jsonschema.Draft202012Validator(compose_schema())
    assert [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(cluster)] == []
    conf = dict(line.split(None, 1) for line in
                (DEPLOY / "cluster" / "redis-cluster.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    nodes = {name: s for name, s in cluster["services"].items() if re.fullmatch(r"redis-\d", name)}
    assert len(nodes) == 6
    for node in nodes.values():
        flags = dict(zip(node["command"][1::2], node["command"][2::2], strict=True))
        assert {name: flags.get(f"--{name}") for name in conf} == {
            name: value.strip() for name, value in conf.items()}
    services = {n: s for n, s in cluster["services"].items() if n.startswith("timewheel")}
    assert len(services) == 2
    for service in services.values():
        env = service["environment"]
        assert set(env) <= SETTING_NAMES
        assert env["TIMEWHEEL_REDIS_CLUSTER"] == "true"
        assert int(env["TIMEWHEEL_REDIS_WAIT_REPLICAS"]) == 1
        assert (DEPLOY / "cluster" / service["build"]["context"] /
                service["build"]["dockerfile"]).is_file()
        assert seconds(service["stop_grace_period"]) > configured_deadline(env)
