"""deploy/helm/amux: the chart renders, for its defaults and each documented combination, into
manifests that Kubernetes (every minor version the chart supports) and the KEDA,
prometheus-operator and agent-sandbox CRDs accept, and that keep the promises the chart's README
makes.

Rendering is Helm's own: helm-python-sdk binds Helm's Go library, so the templates run exactly as
`helm template` runs them, offline and without a helm binary. No cluster is contacted.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import pytest
import yaml
from aiohttp import web
from kubernetes_validate.utils import all_versions, schema_contents
from referencing import Registry, Resource

from hub.config import HubSettings
from hub.contract import QUEUED, RUNNING
from hub.server import add_hub
from runtime_bridge.config import RuntimeSettings
from tests.conftest import REPO

CHART = REPO / "deploy" / "helm" / "amux"
CRD_SCHEMAS = REPO / "deploy" / "helm" / "schemas"
NAMESPACE = "agents"
RELEASE = "amux"
# The chart's kubeVersion floor up to the newest schemas kubernetes-validate bundles.
KUBE_VERSIONS = [v for v in all_versions() if (1, 30) <= tuple(map(int, v.split(".")[:2]))]
FEISHU_KEYS = {
    "AMUX_FEISHU_APP_ID",
    "AMUX_FEISHU_APP_SECRET",
    "AMUX_FEISHU_ENCRYPT_KEY",
    "AMUX_FEISHU_VERIFICATION_TOKEN",
}
PROVIDER_KEYS = {"ANTHROPIC_API_KEY", "OPENAI_API_KEY"}
WITH_SECRETS: dict[str, Any] = {
    "hub": {"feishu": {"appId": "cli_test", "appSecret": "app-secret", "encryptKey": "ek"}},
    "worker": {"providers": {"anthropicApiKey": "sk-ant-test", "openaiApiKey": "sk-test"}},
}
# The combinations the chart's README documents, by name.
COMBINATIONS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "secrets from values": WITH_SECRETS,
    "existing secrets": {
        "hub": {"feishu": {"existingSecret": "my-feishu"}},
        "worker": {
            "providers": {"existingSecret": "my-providers"},
            "token": {"existingSecret": "my-worker-token", "key": "value"},
        },
    },
    "keda": {**WITH_SECRETS, "worker": {**WITH_SECRETS["worker"], "keda": {"enabled": True}}},
    "servicemonitor": {"metrics": {"serviceMonitor": {"enabled": True}}},
    "keda and servicemonitor, no scrape annotations": {
        "worker": {"keda": {"enabled": True, "maxReplicaCount": 12, "cooldownPeriod": 60}},
        "metrics": {"scrapeAnnotations": False, "serviceMonitor": {"enabled": True}},
    },
    "three workers, sandbox off": {"worker": {"replicas": 3, "sandbox": "off"}},
    "no network policy": {"hub": {"networkPolicy": {"enabled": False}}},
    "agent-sandbox": {
        **WITH_SECRETS,
        "worker": {**WITH_SECRETS["worker"], "sandbox": "agent-sandbox"},
    },
    "agent-sandbox, existing volume, default runtime, warm pods": {
        "worker": {
            "sandbox": "agent-sandbox",
            "agentSandbox": {
                "runtimeClassName": "",
                "warmPods": 2,
                "workDir": {"existingClaim": "my-work", "storageClassName": "cephfs"},
            },
        }
    },
}


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    chart = helm.Chart.load(CHART)
    chart.validate_schema(values)
    rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [
        doc
        for name, text in rendered.items()
        if not name.endswith("NOTES.txt")
        for doc in yaml.safe_load_all(text)
        if doc
    ]


def find(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def one(manifests: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (found,) = find(manifests, kind)
    return found


@functools.cache
def kubernetes_validator(version: str, kind: str, api_version: str) -> jsonschema.Validator:
    """kubernetes-validate's strict schema of a kind (unknown fields refused), built once."""
    # apps/v1 -> statefulset-apps-v1, networking.k8s.io/v1 -> networkpolicy-networking-v1
    group, _, version_of_group = api_version.rpartition("/")
    name = "-".join(filter(None, [kind.lower(), group.split(".")[0], version_of_group]))
    folder = f"kubernetes-json-schema/v{version}-local-strict"
    schema = schema_contents(f"{folder}/{name}.json", version)
    definitions = schema_contents(f"{folder}/_definitions.json", version)
    registry: Registry = Resource.from_contents(definitions) @ (
        Resource.from_contents(schema) @ Registry()
    )
    return jsonschema.Draft202012Validator(schema, registry=registry)


@functools.cache
def crd_validator(api_version: str, kind: str) -> jsonschema.Validator:
    for path in CRD_SCHEMAS.glob("*.json"):
        schema = json.loads(path.read_text())
        properties = schema["properties"]
        if properties["apiVersion"].get("const") == api_version and (
            properties["kind"].get("const") == kind
        ):
            return jsonschema.Draft7Validator(schema)
    raise AssertionError(f"no schema of {api_version} {kind} in {CRD_SCHEMAS}")


def validate(manifest: dict[str, Any], version: str) -> None:
    api_version, kind = manifest["apiVersion"], manifest["kind"]
    if api_version in (
        "keda.sh/v1alpha1",
        "monitoring.coreos.com/v1",
        "extensions.agents.x-k8s.io/v1beta1",
    ):
        crd_validator(api_version, kind).validate(manifest)
        return
    kubernetes_validator(version, kind, api_version).validate(manifest)
    if kind in ("Deployment", "StatefulSet"):
        # A rule of the API server's that no schema states: it refuses such a pod outright.
        unmasked = any(
            c.get("securityContext", {}).get("procMount") == "Unmasked"
            for c in containers(manifest)
        )
        if unmasked and manifest["spec"]["template"]["spec"].get("hostUsers") is not False:
            raise jsonschema.ValidationError("`hostUsers` must be false to use `Unmasked`")


def containers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    spec = manifest["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def secret_references(manifest: dict[str, Any]) -> set[str]:
    """Names of every Secret a workload's pod reads: env, envFrom and volumes."""
    names: set[str] = set()
    for container in containers(manifest):
        for source in container.get("envFrom", []):
            if "secretRef" in source:
                names.add(source["secretRef"]["name"])
        for env in container.get("env", []):
            ref = env.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                names.add(ref["name"])
    for volume in manifest["spec"]["template"]["spec"].get("volumes", []):
        if "secret" in volume:
            names.add(volume["secret"]["secretName"])
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                names.add(source["secret"]["name"])
    return names


def secret_keys(manifests: list[dict[str, Any]], name: str) -> set[str]:
    secret = next(m for m in find(manifests, "Secret") if m["metadata"]["name"] == name)
    return set(secret.get("stringData", {})) | set(secret.get("data", {}))


def hub(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return one(manifests, "StatefulSet")


def worker(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    return one(manifests, "Deployment")


def env_of(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {env["name"]: env for env in containers(manifest)[0].get("env", [])}


# -- every rendering is valid Kubernetes -----------------------------------------------------------


@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_every_manifest_is_valid_for_each_supported_kubernetes_version(combination: str) -> None:
    assert KUBE_VERSIONS[0] == "1.30.0", KUBE_VERSIONS
    manifests = render(COMBINATIONS[combination])
    assert {"StatefulSet", "Deployment", "Service"} <= {m["kind"] for m in manifests}
    for manifest in manifests:
        for version in KUBE_VERSIONS:
            try:
                validate(manifest, version)
            except jsonschema.ValidationError as error:
                pytest.fail(f"{manifest['kind']} invalid for Kubernetes {version}: {error.message}")


@pytest.mark.parametrize("version", [KUBE_VERSIONS[0], KUBE_VERSIONS[-1]])
def test_helm_lint_finds_nothing_to_warn_about(version: str) -> None:
    report = helm.lint(CHART, strict=True, kube_version=f"v{version}")
    # Severity 2 is a warning, 3 an error; 1 (information) is the missing icon.
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    assert report["errors"] == []


def test_the_validation_refuses_a_field_kubernetes_does_not_know() -> None:
    # The strict schemas are what make the test above mean something: a misspelt field fails.
    manifest = hub(render({}))
    manifest["spec"]["template"]["spec"]["containers"][0]["livenesProbe"] = {}
    with pytest.raises(jsonschema.ValidationError):
        validate(manifest, KUBE_VERSIONS[-1])
    scaled = one(render({"worker": {"keda": {"enabled": True}}}), "ScaledObject")
    scaled["spec"]["minReplicas"] = 0
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled, KUBE_VERSIONS[-1])


# -- the Hub: one replica, its own volume, probes, metrics -----------------------------------------


@pytest.mark.parametrize("combination", list(COMBINATIONS))
def test_the_hub_is_one_replica_with_a_volume_for_amux_home(combination: str) -> None:
    manifests = render(COMBINATIONS[combination])
    statefulset = hub(manifests)
    assert statefulset["spec"]["replicas"] == 1
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "10Gi"
    (container,) = containers(statefulset)
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    home = env_of(statefulset)["AMUX_HOME"]["value"]
    assert home.startswith(mounts[claim["metadata"]["name"]] + "/")
    # The Hub runs no Agent: every turn goes to the worker pods.
    assert env_of(statefulset)["AMUX_RUNTIME_IN_PROCESS"]["value"] == "false"
    assert container["args"] == ["serve"]


@pytest.mark.parametrize("replicas", [0, 2, 3])
def test_the_values_schema_refuses_any_other_number_of_hubs(replicas: int) -> None:
    with pytest.raises(helm.HelmError, match="replicas"):
        render({"hub": {"replicas": replicas}})


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"worker": {"sandbox": "gvisor"}}, "sandbox"),
        ({"worker": {"agentSandbox": {"gatewayPort": 0}}}, "gatewayPort"),
        ({"worker": {"keda": {"minReplicaCount": -1}}}, "minReplicaCount"),
        ({"worker": {"keda": {"enable": True}}}, "enable"),
        ({"hub": {"persistence": {"size": "lots"}}}, "size"),
    ],
)
def test_the_values_schema_refuses_what_the_chart_cannot_do(
    values: dict[str, Any], field: str
) -> None:
    with pytest.raises(helm.HelmError, match=field):
        render(values)


def test_the_hub_probes_are_the_endpoints_the_hub_serves(tmp_path: Path) -> None:
    # The Hub's own routing table, as `amux serve` builds it (nothing is started).
    app = web.Application()
    add_hub(app, HubSettings(home=tmp_path))
    served = {
        route.resource.canonical
        for route in app.router.routes()
        if route.method == "GET" and route.resource is not None
    }
    statefulset = hub(render({}))
    (container,) = containers(statefulset)
    port = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] in served, probe
        assert port[get["port"]] == HubSettings().port
    annotations = statefulset["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] in served
    # Liveness only asks whether the process is up; readiness runs the Hub's checks.
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_prometheus_finds_the_hub_by_annotations_or_a_service_monitor() -> None:
    manifests = render({"metrics": {"serviceMonitor": {"enabled": True}}})
    annotations = hub(manifests)["spec"]["template"]["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "8765",
        "prometheus.io/path": "/metrics",
    }
    monitor = one(manifests, "ServiceMonitor")
    service = one(manifests, "Service")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert find(render({}), "ServiceMonitor") == []
    off = render({"metrics": {"scrapeAnnotations": False}})
    assert "annotations" not in hub(off)["spec"]["template"]["metadata"]


# -- secrets: Feishu to the Hub only, provider keys to the workers only ----------------------------


@pytest.mark.parametrize("combination", ["secrets from values", "existing secrets", "keda"])
def test_feishu_secrets_reach_the_hub_only_and_provider_keys_the_workers_only(
    combination: str,
) -> None:
    manifests = render(COMBINATIONS[combination])
    existing = combination == "existing secrets"
    feishu = "my-feishu" if existing else f"{RELEASE}-feishu"
    providers = "my-providers" if existing else f"{RELEASE}-providers"
    token = "my-worker-token" if existing else f"{RELEASE}-worker-token"
    if not existing:
        assert secret_keys(manifests, feishu) <= FEISHU_KEYS
        assert secret_keys(manifests, providers) <= PROVIDER_KEYS
    else:
        assert find(manifests, "Secret") == []
    assert secret_references(hub(manifests)) == {feishu}
    assert secret_references(worker(manifests)) == {providers, token}
    # Nor by value: no worker variable names a Feishu key, no Hub variable a provider key.
    assert not FEISHU_KEYS & set(env_of(worker(manifests)))
    assert not PROVIDER_KEYS & set(env_of(hub(manifests)))


def test_the_worker_token_comes_from_a_secret() -> None:
    manifests = render(COMBINATIONS["existing secrets"])
    ref = env_of(worker(manifests))["AMUX_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "my-worker-token", "key": "value"}
    assert "value" not in env_of(worker(manifests))["AMUX_TOKEN"]


# -- the NetworkPolicy: worker pods reach the Hub's port, nothing else does ------------------------


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector.get("matchLabels", {}).items() <= labels.items() and not selector.get(
        "matchExpressions"
    )


def test_only_worker_pods_may_reach_the_hub() -> None:
    manifests = render({"worker": {"keda": {"enabled": True}}})
    (policy,) = find(manifests, "NetworkPolicy")
    hub_labels = hub(manifests)["spec"]["template"]["metadata"]["labels"]
    worker_labels = worker(manifests)["spec"]["template"]["metadata"]["labels"]
    assert matches(policy["spec"]["podSelector"], hub_labels)
    assert not matches(policy["spec"]["podSelector"], worker_labels)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert set(peer) == {"podSelector"}  # this namespace only, no namespaceSelector or ipBlock
    assert matches(peer["podSelector"], worker_labels)
    assert not matches(peer["podSelector"], hub_labels)
    # Another pod of the release (or any pod carrying only the chart's name) does not match.
    assert not matches(peer["podSelector"], {**worker_labels, "app.kubernetes.io/component": "x"})
    (port,) = rule["ports"]
    (hub_port,) = containers(hub(manifests))[0]["ports"]
    assert port["port"] == hub_port["name"]
    assert find(render({"hub": {"networkPolicy": {"enabled": False}}}), "NetworkPolicy") == []


def test_extra_peers_are_added_beside_the_workers() -> None:
    ingress = {"namespaceSelector": {"matchLabels": {"name": "ingress-nginx"}}}
    manifests = render({"hub": {"networkPolicy": {"extraIngressFrom": [ingress]}}})
    (rule,) = one(manifests, "NetworkPolicy")["spec"]["ingress"]
    assert rule["from"][1:] == [ingress]


# -- workers: drain on SIGTERM, KEDA, the sandbox --------------------------------------------------


def test_workers_run_runtime_worker_against_the_hub_service_and_drain_on_stop() -> None:
    manifests = render({"worker": {"replicas": 3}})
    deployment = worker(manifests)
    assert deployment["spec"]["replicas"] == 3
    (container,) = containers(deployment)
    assert container["args"] == ["runtime", "worker"]
    service = one(manifests, "Service")
    url = env_of(deployment)["AMUX_HUB_URL"]["value"]
    assert url == f"http://{service['metadata']['name']}.{NAMESPACE}.svc:8765"
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 600


def test_keda_scales_the_worker_deployment_from_zero_on_the_hubs_turns() -> None:
    values = {"worker": {"slots": 4, "keda": {"enabled": True, "maxReplicaCount": 9}}}
    manifests = render(values)
    scaled = one(manifests, "ScaledObject")
    deployment = worker(manifests)
    target = scaled["spec"]["scaleTargetRef"]
    assert (target["apiVersion"], target["kind"]) == ("apps/v1", "Deployment")
    assert target["name"] == deployment["metadata"]["name"]
    assert scaled["spec"]["minReplicaCount"] == 0
    assert scaled["spec"]["maxReplicaCount"] == 9
    # KEDA owns the count: a replicas field would fight it at every upgrade.
    assert "replicas" not in deployment["spec"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    # A running turn counts as well as a queued one, or a pod would be scaled away mid-turn.
    assert trigger["metadata"]["query"] == (
        f'sum(amux_executions{{state=~"{QUEUED}|{RUNNING}",namespace="{NAMESPACE}"}})'
    )
    assert trigger["metadata"]["threshold"] == "4"
    assert find(render({}), "ScaledObject") == []


def test_the_keda_query_names_a_series_the_hub_exports() -> None:
    from prometheus_client.exposition import generate_latest

    from hub.metrics import Metrics, Snapshot

    metrics = Metrics()
    metrics.set_snapshot_source(lambda: Snapshot(executions_by_state={QUEUED: 3, RUNNING: 1}))
    text = generate_latest(metrics.registry).decode()
    assert 'amux_executions{state="queued"} 3.0' in text
    assert 'amux_executions{state="running"} 1.0' in text


def test_bwrap_workers_get_what_bubblewrap_needs_and_off_workers_do_not() -> None:
    deployment = worker(render({}))
    pod = deployment["spec"]["template"]["spec"]
    (container,) = containers(deployment)
    assert env_of(deployment)["AMUX_RUNTIME_SANDBOX"]["value"] == "bwrap"
    assert pod["hostUsers"] is False
    context = container["securityContext"]
    assert context["procMount"] == "Unmasked"
    assert context["seccompProfile"] == {"type": "Unconfined"}
    assert context["appArmorProfile"] == {"type": "Unconfined"}
    # What it does not get: privileges, capabilities, root.
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in context
    assert pod["securityContext"]["runAsNonRoot"] is True

    off = worker(render({"worker": {"sandbox": "off"}}))
    assert env_of(off)["AMUX_RUNTIME_SANDBOX"]["value"] == "off"
    assert "hostUsers" not in off["spec"]["template"]["spec"]
    context = containers(off)[0]["securityContext"]
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "procMount" not in context and "appArmorProfile" not in context


def test_the_readme_documents_every_value() -> None:
    readme = (CHART / "README.md").read_text()

    def paths(values: dict[str, Any], prefix: str = "") -> Iterator[str]:
        for key, value in values.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                yield from paths(value, f"{path}.")
            else:
                yield path

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = [path for path in paths(defaults) if f"`{path}`" not in readme]
    assert missing == []


def test_the_pods_run_as_the_user_the_image_makes() -> None:
    containerfile = (REPO / "deploy" / "Containerfile").read_text()
    user = re.search(r"groupadd .*--gid (\d+).*\n.*useradd .*--uid (\d+)", containerfile)
    assert user is not None
    gid, uid = map(int, user.groups())
    manifests = render({})
    for workload in (hub(manifests), worker(manifests)):
        context = workload["spec"]["template"]["spec"]["securityContext"]
        assert (context["runAsUser"], context["runAsGroup"]) == (uid, gid)


# -- agent-sandbox: each Agent in a pod of its own ------------------------------------------------


def agent_sandbox() -> list[dict[str, Any]]:
    return render({"worker": {"sandbox": "agent-sandbox"}})


def test_agent_sandbox_workers_claim_pods_from_the_warm_pool_mounting_no_shared_volume() -> None:
    manifests = agent_sandbox()
    deployment = worker(manifests)
    env = env_of(deployment)
    assert env["AMUX_RUNTIME_LAUNCHER"]["value"] == "agent-sandbox"
    assert env["AMUX_RUNTIME_SANDBOX"]["value"] == "off"
    assert env["AMUX_RUNTIME_POD_UID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
    assert env["AMUX_RUNTIME_POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # Every setting the chart gives the worker is one the worker reads.
    fields = {f"AMUX_RUNTIME_{name.upper()}" for name in RuntimeSettings.model_fields}
    assert {name for name in env if name.startswith("AMUX_RUNTIME_")} <= fields
    pool = one(manifests, "SandboxWarmPool")
    template = one(manifests, "SandboxTemplate")
    assert env["AMUX_RUNTIME_SANDBOX_WARM_POOL"]["value"] == pool["metadata"]["name"]
    assert pool["spec"]["sandboxTemplateRef"]["name"] == template["metadata"]["name"]
    pod = template["spec"]["podTemplate"]["spec"]
    assert pod["runtimeClassName"] == "gvisor"
    assert pod["automountServiceAccountToken"] is False
    (agent,) = pod["containers"]
    assert agent["resources"]["limits"] == {"cpu": "2", "memory": "4Gi", "ephemeral-storage": "2Gi"}
    # The workers keep their volume; an Agent's pod mounts none of it, only an empty directory
    # of its own at the workers' path (the turn's files are streamed in and back over exec).
    (claim,) = find(manifests, "PersistentVolumeClaim")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["work"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    agent_volumes = {v["name"]: v for v in pod["volumes"]}
    assert all(set(v) == {"name", "emptyDir"} for v in agent_volumes.values())
    mounts = {m["name"]: m["mountPath"] for m in containers(deployment)[0]["volumeMounts"]}
    assert {m["name"]: m["mountPath"] for m in agent["volumeMounts"]}["work"] == mounts["work"]
    assert "hostUsers" not in deployment["spec"]["template"]["spec"]


def test_agent_sandbox_workers_may_claim_watch_delete_and_exec_and_nothing_more() -> None:
    manifests = agent_sandbox()
    deployment = worker(manifests)
    account = one(manifests, "ServiceAccount")["metadata"]["name"]
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == account
    binding = one(manifests, "RoleBinding")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}
    ]
    rules = {
        (group, resource): set(rule["verbs"])
        for rule in one(manifests, "Role")["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("extensions.agents.x-k8s.io", "sandboxclaims"): {
            "create",
            "get",
            "list",
            "watch",
            "delete",
        },
        ("agents.x-k8s.io", "sandboxes"): {"get"},
        ("", "pods"): {"get"},
        ("", "pods/exec"): {"create", "get"},
    }
    assert find(render({}), "Role") == [] and find(render({}), "ServiceAccount") == []


def test_sandbox_pods_reach_only_the_workers_gateway_the_hub_and_dns() -> None:
    manifests = agent_sandbox()
    policies = {p["metadata"]["name"]: p for p in find(manifests, "NetworkPolicy")}
    agent_labels = one(manifests, "SandboxTemplate")["spec"]["podTemplate"]["metadata"]["labels"]
    worker_labels = worker(manifests)["spec"]["template"]["metadata"]["labels"]
    hub_labels = hub(manifests)["spec"]["template"]["metadata"]["labels"]
    (sandbox,) = [p for p in policies.values() if matches(p["spec"]["podSelector"], agent_labels)]
    assert sandbox["spec"]["policyTypes"] == ["Ingress", "Egress"]
    assert sandbox["spec"]["ingress"] == []
    gateway, to_hub, dns = sandbox["spec"]["egress"]
    assert matches(gateway["to"][0]["podSelector"], worker_labels)
    assert gateway["ports"] == [{"port": 8790, "protocol": "TCP"}]
    assert containers(worker(manifests))[0]["ports"][0]["containerPort"] == 8790
    assert env_of(worker(manifests))["AMUX_RUNTIME_GATEWAY_PORT"]["value"] == "8790"
    assert matches(to_hub["to"][0]["podSelector"], hub_labels)
    assert {p["port"] for p in dns["ports"]} == {53}
    # The workers take connections from sandbox pods only, on the gateway's port; the Hub takes
    # them from workers and sandbox pods.
    (to_workers,) = [
        p for p in policies.values() if matches(p["spec"]["podSelector"], worker_labels)
    ]
    ((peer,),) = [rule["from"] for rule in to_workers["spec"]["ingress"]]
    assert matches(peer["podSelector"], agent_labels)
    (to_hub_policy,) = [
        p for p in policies.values() if matches(p["spec"]["podSelector"], hub_labels)
    ]
    peers = to_hub_policy["spec"]["ingress"][0]["from"]
    assert any(matches(p["podSelector"], agent_labels) for p in peers)
    assert any(matches(p["podSelector"], worker_labels) for p in peers)
