"""The Kubernetes manifests in scripts/kubernetes: valid for the API server, and true to the daemons.

Each pod's container is started on paper: its volumes are laid out in a folder (the ConfigMap from
zbatch.toml, the Secrets as the Kubernetes page's commands make them, empty folders for the rest), its
env is expanded as the kubelet does, and its daemon's ``load_config`` reads its args and env. What
the daemons load is then held against the probes, Services, grace periods and autoscalers.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import inspect
import io
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from broker.config import BrokerConfig
from broker.config import load_config as load_broker_config
from broker.core import BrokerCore
from broker.metrics import broker_families
from gateway.app import ROUTES
from gateway.config import GatewayConfig
from gateway.config import load_config as load_gateway_config
from gateway.metrics import GatewayMetrics
from worker.config import WorkerConfig
from worker.config import load_config as load_worker_config
from zbatch.client import AsyncClient
from zbatch.hub import is_hub_id, public_name
from zbatch.runtime.curve import key_name, load_public_key
from zbatch.runtime.settings import CONFIG_ENV, env_name, split_endpoints

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "scripts" / "kubernetes"
PAGE = (ROOT / "docs" / "deployment" / "kubernetes.md").read_text()  # the page with its commands
# The release whose schemas the manifests are held to; they need 1.30 or later, where the gateway's
# preStop sleep action is on by default.
KUBERNETES_VERSION = "1.31.0"
APPLIED_BY_HAND = ("model-loader.yaml",)  # Kubernetes objects outside the kustomization
NOT_OBJECTS = ("kustomization.yaml", "prometheus-adapter.yaml")
NAMESPACE = "zbatch"

Doc = dict[str, Any]
Loader = Callable[[Sequence[str], Mapping[str, str]], Any]
LOADERS: dict[str, Loader] = {"zbatch-broker": load_broker_config, "zbatch-worker": load_worker_config,
                              "zbatch-gateway": load_gateway_config}


def documents(name: str) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all((MANIFESTS / name).read_text()) if doc]


KUSTOMIZATION: Doc = yaml.safe_load((MANIFESTS / "kustomization.yaml").read_text())
APPLIED = [doc for name in KUSTOMIZATION["resources"] for doc in documents(name)]
LOADER_POD = documents("model-loader.yaml")[0]


def find(kind: str, name: str) -> Doc:
    found = [doc for doc in APPLIED if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind} named {name} in the kustomization"
    return found[0]


def of_kind(kind: str) -> list[Doc]:
    return [doc for doc in APPLIED if doc["kind"] == kind]


BROKER = find("StatefulSet", "zbatch-broker")
WORKER = find("StatefulSet", "zbatch-worker")
GATEWAY = find("Deployment", "zbatch-gateway")
WORKLOADS = (BROKER, WORKER, GATEWAY)


def autoscaler_of(workload: Doc) -> Doc | None:
    found = [hpa for hpa in of_kind("HorizontalPodAutoscaler")
             if (hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"])
             == (workload["kind"], workload["metadata"]["name"])]
    assert len(found) <= 1
    return found[0] if found else None


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"] if workload["kind"] != "Pod" else workload["spec"]
    return spec


def container_of(workload: Doc) -> Doc:
    containers = pod_spec(workload)["containers"]
    assert len(containers) == 1, "one daemon a pod"
    container: Doc = containers[0]
    return container


def daemon_of(container: Doc) -> str:
    """The daemon a container runs: its console script, with nothing in front."""
    command = container["command"]
    assert len(command) == 1 and command[0] in LOADERS, command
    return str(command[0])


@dataclass(frozen=True)
class Pod:
    name: str
    workload: Doc

    @property
    def container(self) -> Doc:
        return container_of(self.workload)


def pods_of(workload: Doc) -> list[Pod]:
    """A Deployment's pod under a made-up name; every pod a StatefulSet may have, up to its autoscaler's maximum."""
    name = workload["metadata"]["name"]
    if workload["kind"] == "Deployment":
        return [Pod(f"{name}-5d8f7c9b4-x2x7q", workload)]
    hpa = autoscaler_of(workload)
    most = hpa["spec"]["maxReplicas"] if hpa else workload["spec"]["replicas"]
    return [Pod(f"{name}-{ordinal}", workload) for ordinal in range(most)]


PODS = {pod.name: pod for workload in WORKLOADS for pod in pods_of(workload)}


# --------------------------------------------------------------------------- the pods, started on paper

KUBECTL = """
import pathlib, shutil, sys
args = sys.argv[1:]
if args[:2] == ["-n", "zbatch"]:
    args = args[2:]
if args[:3] != ["create", "secret", "generic"]:
    sys.exit(0)  # kubectl apply: nothing to record
secret = pathlib.Path(sys.argv[0]).parent.parent / "secrets" / args[3]
secret.mkdir(parents=True)
for arg in args[4:]:
    assert arg.startswith("--from-file="), arg
    source = pathlib.Path(arg.removeprefix("--from-file="))
    for path in sorted(source.iterdir()) if source.is_dir() else [source]:
        if path.is_file():
            shutil.copy(path, secret / path.name)
"""


def readme_block(marker: str) -> str:
    blocks = [block for block in re.findall(r"```sh\n(.*?)```", PAGE, re.DOTALL) if marker in block]
    assert len(blocks) == 1, f"one sh block of the Kubernetes page with {marker!r}"
    return str(blocks[0])


@pytest.fixture(scope="module")
def secrets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The Kubernetes page's key commands, run with kubectl recording each Secret as a folder of its files."""
    work = tmp_path_factory.mktemp("keys")
    bin_dir = work / "bin"
    bin_dir.mkdir()
    for name, text in (("kubectl", KUBECTL),
                       ("zbatch-keys", f"import sys\nsys.path.insert(0, {str(ROOT)!r})\n"
                                       "from zbatch.tools.keys import main\nmain()\n")):
        (bin_dir / name).write_text(f"#!{sys.executable}\n{text}")
        (bin_dir / name).chmod(0o755)
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", readme_block("create secret generic")],
                            cwd=work, env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(work)},
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return {path.name: path for path in (work / "secrets").iterdir()}


def localizer(root: Path, mount_paths: Sequence[str]) -> Callable[[str], str]:
    """Where a path of the container is in the folder that stands in for its file system."""
    def local(value: str) -> str:
        for path in sorted(mount_paths, key=len, reverse=True):
            if value == path or value.startswith(path + "/"):
                return f"{root}{value}"
        return value
    return local


def lay_out_volumes(pod: Pod, secrets: Mapping[str, Path], root: Path) -> Callable[[str], str]:
    volumes = {volume["name"]: volume for volume in pod_spec(pod.workload)["volumes"]}
    mounts = pod.container["volumeMounts"]
    local = localizer(root, [mount["mountPath"] for mount in mounts])
    for mount in mounts:
        volume = volumes[mount["name"]]
        target = root / mount["mountPath"].lstrip("/")
        target.mkdir(parents=True)
        if "secret" in volume:
            made = secrets[volume["secret"]["secretName"]]
            items = volume["secret"].get("items") or [{"key": path.name, "path": path.name} for path in made.iterdir()]
            for item in items:
                shutil.copy(made / item["key"], target / item["path"])
        elif "configMap" in volume:
            [generator] = KUSTOMIZATION["configMapGenerator"]
            assert volume["configMap"]["name"] == generator["name"]
            for name in generator["files"]:
                text = (MANIFESTS / name).read_text()
                (target / name).write_text(re.sub(r'"(/[^"]*)"', lambda m: f'"{local(m.group(1))}"', text))
        else:
            assert "persistentVolumeClaim" in volume or "emptyDir" in volume, volume
    return local


def environment(container: Doc, pod_name: str) -> dict[str, str]:
    """The container's env as the kubelet makes it: the pod's name by fieldRef, $(NAME) of earlier variables."""
    env: dict[str, str] = {}
    for variable in container.get("env", []):
        if "valueFrom" in variable:
            assert variable["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}, variable
            env[variable["name"]] = pod_name
        else:
            env[variable["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], variable["value"])
    return env


def start_on_paper(pod: Pod, secrets: Mapping[str, Path], root: Path) -> Any:
    shutil.rmtree(root, ignore_errors=True)  # left by an earlier test that found this pod would not start
    local = lay_out_volumes(pod, secrets, root)
    env = {name: local(value) for name, value in environment(pod.container, pod.name).items()}
    args = [local(arg) for arg in pod.container.get("args", [])]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            return LOADERS[daemon_of(pod.container)](args, env)
    except SystemExit:
        pass
    pytest.fail(f"{pod.name} would not start: {errors.getvalue().strip()}")


@pytest.fixture(scope="module")
def configs(secrets: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Any]:
    """Each pod's settings, as its daemon loads them."""
    root = tmp_path_factory.mktemp("pods")
    loaded: dict[str, Any] = {}

    def config(pod_name: str) -> Any:
        if pod_name not in loaded:
            loaded[pod_name] = start_on_paper(PODS[pod_name], secrets, root / pod_name)
        return loaded[pod_name]
    return config


def broker_config(configs: Callable[[str], Any], ordinal: int = 0) -> BrokerConfig:
    config = configs(f"zbatch-broker-{ordinal}")
    assert isinstance(config, BrokerConfig)
    return config


def worker_configs(configs: Callable[[str], Any]) -> list[WorkerConfig]:
    found = [configs(pod.name) for pod in pods_of(WORKER)]
    assert found and all(isinstance(config, WorkerConfig) for config in found)
    return found


def gateway_config(configs: Callable[[str], Any]) -> GatewayConfig:
    config = configs(pods_of(GATEWAY)[0].name)
    assert isinstance(config, GatewayConfig)
    return config


def port_of(endpoint: str) -> int:
    return int(endpoint.rsplit(":", 1)[1])


def container_ports(workload: Doc) -> dict[str, int]:
    return {port["name"]: port["containerPort"] for port in container_of(workload)["ports"]}


# --------------------------------------------------------------------------- valid for the API server

@pytest.mark.parametrize("name", [*KUSTOMIZATION["resources"], *APPLIED_BY_HAND])
def test_manifests_are_valid_for_the_pinned_kubernetes(name: str) -> None:
    problems = []
    for doc in documents(name):
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            where = "/".join(map(str, exc.path))
            problems.append(f"{doc['kind']} {doc['metadata']['name']}: {where}: {exc.message}")
    assert not problems, f"{name}: " + "; ".join(problems)


def test_strict_validation_refuses_an_unknown_field() -> None:
    deployment = copy.deepcopy(GATEWAY)
    container_of(deployment)["livenessProbes"] = container_of(deployment)["livenessProbe"]
    with pytest.raises(kubernetes_validate.ValidationError, match="livenessProbes"):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_applies_every_manifest_in_one_namespace() -> None:
    names = {path.name for path in MANIFESTS.glob("*.yaml")}
    assert names == {*KUSTOMIZATION["resources"], *APPLIED_BY_HAND, *NOT_OBJECTS}
    [generator] = KUSTOMIZATION["configMapGenerator"]
    assert generator["files"] == ["zbatch.toml"] and generator["namespace"] == NAMESPACE
    for doc in [*APPLIED, LOADER_POD]:
        if doc["kind"] == "Namespace":
            assert doc["metadata"]["name"] == NAMESPACE
        else:
            assert doc["metadata"]["namespace"] == NAMESPACE, doc["metadata"]["name"]


# --------------------------------------------------------------------------- true to the daemons

@pytest.mark.parametrize("pod_name", PODS)
def test_every_setting_a_pod_gives_is_an_option_of_its_daemon(pod_name: str, configs: Callable[[str], Any]) -> None:
    pod = PODS[pod_name]
    config = configs(pod_name)  # fails, with the daemon's own message, on a bad flag, value or TOML key
    options = {env_name(field) for field in type(config).__dataclass_fields__} | {CONFIG_ENV}
    given = {variable["name"] for variable in pod.container.get("env", [])}
    unknown = {name for name in given if name.startswith("ZBATCH_")} - options
    assert not unknown, f"{pod_name}: not settings of {daemon_of(pod.container)}: {sorted(unknown)}"
    assert daemon_of(pod.container) == pod.workload["metadata"]["name"]


def test_workers_are_named_as_their_keys(configs: Callable[[str], Any], secrets: dict[str, Path]) -> None:
    """With CURVE a worker is its key's name, one connection a name: a StatefulSet's pod names, a pair each."""
    assert WORKER["kind"] == "StatefulSet"
    allowed = secrets[pod_spec_secret(BROKER, "/etc/zbatch/keys/workers")]
    for pod, config in zip(pods_of(WORKER), worker_configs(configs), strict=True):
        assert config.curve_server_key_file and config.identity == pod.name
        assert key_name(config.curve_secret_key_file) == pod.name
        assert load_public_key(str(allowed / f"{pod.name}.key")) == load_public_key(config.curve_secret_key_file)
    assert sorted(path.name for path in allowed.iterdir()) == sorted(f"{pod.name}.key" for pod in pods_of(WORKER))


def pod_spec_secret(workload: Doc, mount_path: str) -> str:
    """The Secret mounted at ``mount_path`` in the workload's container."""
    [mount] = [m for m in container_of(workload)["volumeMounts"] if m["mountPath"] == mount_path]
    [volume] = [v for v in pod_spec(workload)["volumes"] if v["name"] == mount["name"]]
    return str(volume["secret"]["secretName"])


def test_brokers_allow_the_keys_of_the_gateways_and_the_workers(configs: Callable[[str], Any]) -> None:
    broker = broker_config(configs)
    clients = Path(broker.curve_clients_dir)
    gateway = gateway_config(configs)
    assert load_public_key(gateway.curve_secret_key_file) in {load_public_key(str(p)) for p in clients.glob("*.key")}
    # The one broker key every peer holds is the brokers' own.
    peers: list[GatewayConfig | WorkerConfig] = [gateway, *worker_configs(configs)]
    for peer in peers:
        assert load_public_key(peer.curve_server_key_file) == load_public_key(broker.curve_secret_key_file)


def test_workers_and_gateways_list_exactly_the_brokers_pods(configs: Callable[[str], Any]) -> None:
    service = find("Service", BROKER["spec"]["serviceName"])
    assert service["spec"]["clusterIP"] == "None", "a headless Service names each pod"
    assert service["spec"]["publishNotReadyAddresses"] is True, "clients judge the brokers themselves"
    hosts = [f"{pod.name}.{service['metadata']['name']}" for pod in pods_of(BROKER)]
    assert len(hosts) == BROKER["spec"]["replicas"] == 2
    broker = broker_config(configs)
    backends = sorted(f"tcp://{host}:{port_of(broker.backend)}" for host in hosts)
    frontends = sorted(f"tcp://{host}:{port_of(broker.frontend)}" for host in hosts)
    for worker in worker_configs(configs):
        assert sorted(split_endpoints(worker.backend)) == backends
    assert sorted(split_endpoints(gateway_config(configs).frontend)) == frontends


def test_services_lead_to_the_daemons_ports(configs: Callable[[str], Any]) -> None:
    broker, worker, gateway = broker_config(configs), worker_configs(configs)[0], gateway_config(configs)
    expected = {
        BROKER["metadata"]["name"]: {"frontend": port_of(broker.frontend), "backend": port_of(broker.backend),
                                     "metrics": broker.metrics_port},
        WORKER["metadata"]["name"]: {"metrics": worker.metrics_port},
        GATEWAY["metadata"]["name"]: {"http": gateway.port},
    }
    assert broker.frontend.startswith("tcp://0.0.0.0:") and broker.backend.startswith("tcp://0.0.0.0:")
    assert gateway.host == "0.0.0.0"
    for workload in WORKLOADS:
        name = workload["metadata"]["name"]
        assert container_ports(workload) == expected[name], name
        [service] = [s for s in of_kind("Service") if s["spec"]["selector"] == workload["spec"]["selector"]
                     ["matchLabels"]]
        assert workload["spec"]["selector"]["matchLabels"].items() <= workload["spec"]["template"]["metadata"][
            "labels"].items()
        for port in service["spec"]["ports"]:
            assert container_ports(workload)[port["targetPort"]] == expected[name][port["name"]]
            if service["spec"].get("clusterIP") == "None":  # pods are dialled directly: same numbers
                assert port["port"] == expected[name][port["name"]]
        if workload["kind"] == "StatefulSet":
            assert workload["spec"]["serviceName"] == service["metadata"]["name"]
            assert service["spec"]["clusterIP"] == "None"


def probes(container: Doc) -> dict[str, Doc]:
    return {kind: container[kind]["httpGet"] for kind in ("startupProbe", "readinessProbe", "livenessProbe")
            if kind in container}


def test_gateway_probes_ask_its_routes_on_its_port(configs: Callable[[str], Any]) -> None:
    gateway = gateway_config(configs)
    routes = {route.path for route in ROUTES if route.method == "GET"}
    container = container_of(GATEWAY)
    found = probes(container)
    assert found["livenessProbe"]["path"] == "/healthz" and found["readinessProbe"]["path"] == "/readyz"
    for probe in found.values():
        assert probe["path"] in routes
        assert container_ports(GATEWAY)[probe["port"]] == gateway.port
    annotations = GATEWAY["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in routes and annotations["prometheus.io/port"] == str(gateway.port)


def test_brokers_and_workers_are_probed_and_scraped_on_their_metrics_pages(configs: Callable[[str], Any]) -> None:
    for workload, config in ((BROKER, broker_config(configs)), (WORKER, worker_configs(configs)[0])):
        name = workload["metadata"]["name"]
        assert config.metrics_port and config.metrics_host == "0.0.0.0", f"{name}: the kubelet probes the pod's IP"
        found = probes(container_of(workload))
        assert {"readinessProbe", "livenessProbe"} <= found.keys(), name
        for probe in found.values():
            assert probe["path"] == "/metrics"
            assert container_ports(workload)[probe["port"]] == config.metrics_port
        # A hung event loop fails the scrape after 5 s: give the probe the time to see that, not to time out first.
        assert container_of(workload)["livenessProbe"]["timeoutSeconds"] > 5
        annotations = workload["spec"]["template"]["metadata"]["annotations"]
        assert annotations == {"prometheus.io/scrape": "true", "prometheus.io/port": str(config.metrics_port),
                               "prometheus.io/path": "/metrics"}
    assert container_of(WORKER)["startupProbe"]["periodSeconds"] * container_of(WORKER)["startupProbe"][
        "failureThreshold"] >= 300, "loading a large model can take minutes"


def test_grace_periods_outlast_the_drains(configs: Callable[[str], Any]) -> None:
    def grace(workload: Doc) -> int:
        return int(pod_spec(workload)["terminationGracePeriodSeconds"])

    assert grace(BROKER) >= broker_config(configs).drain_timeout_ms / 1000 + 10
    assert all(grace(WORKER) >= worker.drain_timeout_ms / 1000 + 10 for worker in worker_configs(configs))
    pre_stop = container_of(GATEWAY)["lifecycle"]["preStop"]["sleep"]["seconds"]
    reply_grace_ms = inspect.signature(AsyncClient).parameters["reply_grace_ms"].default
    assert grace(GATEWAY) >= pre_stop + (gateway_config(configs).timeout_ms + reply_grace_ms) / 1000 + 10


def test_heartbeats_match_on_brokers_and_workers(configs: Callable[[str], Any]) -> None:
    brokers = [broker_config(configs, ordinal) for ordinal in range(BROKER["spec"]["replicas"])]
    for broker in brokers:
        for worker in worker_configs(configs):
            assert (worker.heartbeat_ms, worker.heartbeat_liveness) == (broker.heartbeat_ms, broker.heartbeat_liveness)


def test_the_gpu_worker_has_its_gpu_its_threads_and_an_offline_model(configs: Callable[[str], Any]) -> None:
    container = container_of(WORKER)
    resources = container["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == 1 and resources["requests"].get("nvidia.com/gpu", 1) == 1
    env = environment(container, "zbatch-worker-0")
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    volumes = {volume["name"]: volume for volume in pod_spec(WORKER)["volumes"]}
    [claim] = of_kind("PersistentVolumeClaim")
    assert set(claim["spec"]["accessModes"]) & {"ReadOnlyMany", "ReadWriteMany"}, "every GPU node mounts it"
    for worker in worker_configs(configs):
        assert worker.device == "cuda:0", "the pod's one GPU; no quiet fall back to the CPU"
        assert worker.torch_threads == int(resources["requests"]["cpu"]), "Python sees the node's cores"
        assert worker.model and not worker.model_path, "named once, by the setting that takes a Hub id"
        # A Hub id is read from the Hugging Face cache on the models volume, where the loader pod's hf puts it.
        assert is_hub_id(worker.model)
        [mount] = [m for m in container["volumeMounts"] if env["HF_HUB_CACHE"].startswith(m["mountPath"] + "/")]
        assert mount["readOnly"] is True
        assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        loader = container_of(LOADER_POD)
        [loader_mount] = [m for m in loader["volumeMounts"] if m["mountPath"] == mount["mountPath"]]
        [loader_volume] = [v for v in pod_spec(LOADER_POD)["volumes"] if v["name"] == loader_mount["name"]]
        assert loader_volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert environment(loader, LOADER_POD["metadata"]["name"])["HF_HOME"] + "/hub" == env["HF_HUB_CACHE"]
        assert f"zbatch-model-loader -- hf download {worker.model} " in PAGE, "the page downloads it there"


def test_the_model_is_named_once_and_the_gateway_and_the_autoscaler_follow_it(configs: Callable[[str], Any]) -> None:
    """Changing the workers' model changes what the whole cluster serves: nothing else names it."""
    gateway = gateway_config(configs)
    assert (gateway.named_default_model, gateway.required_models) == ("", ()), "the gateways follow the brokers"
    assert all(not broker_config(configs, ordinal).models for ordinal in range(BROKER["spec"]["replicas"]))
    for hpa in of_kind("HorizontalPodAutoscaler"):
        for metric in hpa["spec"]["metrics"]:
            source = metric.get("external") or metric.get("pods") or {}
            assert "model" not in source.get("metric", {}).get("selector", {}).get("matchLabels", {}), hpa
    served = {public_name(worker.model) for worker in worker_configs(configs)}
    assert served == {"sentence-transformers/all-MiniLM-L6-v2"}


def test_pods_run_unprivileged_on_a_read_only_root() -> None:
    [namespace] = of_kind("Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    for workload in (*WORKLOADS, LOADER_POD):
        name = workload["metadata"]["name"]
        spec = pod_spec(workload)
        assert spec["automountServiceAccountToken"] is False, name
        assert not {"hostNetwork", "hostPID", "hostIPC"} & spec.keys(), name
        pod_security = spec["securityContext"]
        assert pod_security["runAsNonRoot"] is True and pod_security["runAsUser"] > 0, name
        assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}, name
        container = container_of(workload)
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                "capabilities": {"drop": ["ALL"]}}, name
        assert {"cpu", "memory"} <= container["resources"]["requests"].keys(), name
        assert "memory" in container["resources"]["limits"], name
        volumes = {volume["name"]: volume for volume in spec["volumes"]}
        for mount in container["volumeMounts"]:
            writable = "emptyDir" in volumes[mount["name"]] or workload is LOADER_POD
            assert mount.get("readOnly", False) is not writable, f"{name}: {mount['mountPath']}"
            assert "hostPath" not in volumes[mount["name"]]
        assert "/tmp" in {mount["mountPath"] for mount in container["volumeMounts"]} or workload is LOADER_POD


def test_each_workload_has_a_disruption_budget() -> None:
    budgets = of_kind("PodDisruptionBudget")
    for workload in WORKLOADS:
        [budget] = [b for b in budgets if b["spec"]["selector"] == workload["spec"]["selector"]]
        assert budget["spec"]["maxUnavailable"] == 1, workload["metadata"]["name"]
    assert len(budgets) == len(WORKLOADS)


def exported_series(configs: Callable[[str], Any]) -> dict[str, list[dict[str, str]]]:
    """The series a gateway and a broker configured as in the manifests export: name -> labels of each sample."""
    gateway = gateway_config(configs)
    # The brokers as they are once the workers registered: they know the model the workers serve.
    served = tuple(sorted({public_name(worker.model) for worker in worker_configs(configs)}))
    settings = dataclasses.replace(broker_config(configs).core_settings(), models=served)
    families = [*GatewayMetrics(set(gateway.required_models)).registry.collect(),
                *broker_families(BrokerCore(settings, time.monotonic))]
    series: dict[str, list[dict[str, str]]] = {}
    for family in families:
        for sample in family.samples:
            series.setdefault(sample.name, []).append(dict(sample.labels))
    return series


def test_autoscalers_follow_series_the_daemons_export(configs: Callable[[str], Any]) -> None:
    series = exported_series(configs)
    adapter = yaml.safe_load((MANIFESTS / "prometheus-adapter.yaml").read_text())["rules"]
    served = {"Pods": {rule["name"]["as"] for rule in adapter["custom"]},
              "External": {rule["name"]["as"] for rule in adapter["external"]}}
    for rules in (adapter["custom"], adapter["external"]):
        for rule in rules:
            assert rule["seriesQuery"].startswith(rule["name"]["as"] + "{")
    autoscaled = []
    for hpa in of_kind("HorizontalPodAutoscaler"):
        target = find(hpa["spec"]["scaleTargetRef"]["kind"], hpa["spec"]["scaleTargetRef"]["name"])
        autoscaled.append(target["metadata"]["name"])
        assert "replicas" not in target["spec"], "applying the manifests again would undo the autoscaler's choice"
        assert 2 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"], "two, so one can drain"
        queue_metrics = [m for m in hpa["spec"]["metrics"] if m["type"] in ("Pods", "External")]
        assert queue_metrics, f"{hpa['metadata']['name']} scales on a queue"
        for metric in queue_metrics:
            source = metric["pods"] if metric["type"] == "Pods" else metric["external"]
            name = source["metric"]["name"]
            assert name in served[metric["type"]], f"prometheus-adapter.yaml does not serve {name}"
            wanted = source["metric"].get("selector", {}).get("matchLabels", {})
            assert any(wanted.items() <= labels.items() for labels in series.get(name, [])), f"no {name} {wanted}"
    assert sorted(autoscaled) == ["zbatch-gateway", "zbatch-worker"]
    in_flight = next(m["pods"] for m in find("HorizontalPodAutoscaler", "zbatch-gateway")["spec"]["metrics"]
                     if m["type"] == "Pods")
    assert int(in_flight["target"]["averageValue"]) < gateway_config(configs).max_connections, \
        "scale out before a gateway refuses"


def test_the_readme_makes_exactly_the_secrets_the_pods_mount(secrets: dict[str, Path]) -> None:
    mounted = {volume["secret"]["secretName"] for workload in WORKLOADS for volume in pod_spec(workload)["volumes"]
               if "secret" in volume}
    assert set(secrets) == mounted
    # A broker's secret half goes to the brokers only.
    for workload in (WORKER, GATEWAY):
        for volume in pod_spec(workload)["volumes"]:
            if volume.get("secret", {}).get("secretName") == pod_spec_secret(BROKER, "/etc/zbatch/keys/broker"):
                assert [item["key"] for item in volume["secret"]["items"]] == ["broker.key"]
