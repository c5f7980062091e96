"""The launcher a worker's settings choose: this host's, or a Kubernetes pod per Agent."""

from __future__ import annotations

import os
from pathlib import Path

from runtime_bridge.bounds import bounds_from_settings
from runtime_bridge.config import RuntimeSettings
from runtime_bridge.providers.errors import SandboxUnavailable
from runtime_bridge.providers.process import LOCAL, Launcher

# Where a pod's service account finds its namespace.
POD_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def configured_launcher(settings: RuntimeSettings) -> Launcher:
    """``LOCAL``, or the agent-sandbox launcher with the cluster's own configuration (the pod's
    service account in a cluster, else the kubeconfig).

    Raises:
        SandboxUnavailable: agent-sandbox is chosen but the kubernetes client is not installed,
            or no cluster configuration is found.
    """
    if not settings.in_pods():
        return LOCAL
    try:
        from kubernetes import client, config
    except ImportError:
        raise SandboxUnavailable(
            "AMUX_RUNTIME_LAUNCHER=agent-sandbox needs the kubernetes client: "
            "pip install 'amux[kubernetes]'",
            reason="NoClient",
        ) from None
    from runtime_bridge.kube_launcher import KubernetesLauncher

    configuration = client.Configuration()
    namespace = settings.sandbox_namespace
    try:
        config.load_incluster_config(client_configuration=configuration)
        if namespace is None and POD_NAMESPACE_FILE.is_file():
            namespace = POD_NAMESPACE_FILE.read_text(encoding="utf-8").strip()
    except config.ConfigException:
        # Read now, not when the client was imported: KUBECONFIG may name several files.
        kubeconfig = os.environ.get("KUBECONFIG") or None
        try:
            config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        except (config.ConfigException, OSError) as error:
            raise SandboxUnavailable(
                "AMUX_RUNTIME_LAUNCHER=agent-sandbox found no cluster: the worker runs in no pod "
                f"with a service account, and has no usable kubeconfig ({error})",
                reason="NoCluster",
            ) from None
        if namespace is None:
            _, context = config.list_kube_config_contexts(config_file=kubeconfig)
            namespace = (context or {}).get("context", {}).get("namespace")
    owner = None
    if settings.pod_name and settings.pod_uid:
        owner = (settings.pod_name, settings.pod_uid)
    return KubernetesLauncher(
        configuration,
        namespace or "default",
        settings.sandbox_warm_pool,
        settings.pod_name or settings.name,
        owner,
        settings.sandbox_ready_seconds,
        bounds_from_settings(settings).workspace_bytes,
    )
