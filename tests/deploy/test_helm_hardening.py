"""The chart's pods are locked down and its NetworkPolicies let through only what each party needs.

Rendered as in test_helm_chart.py (defaults and ci/all-on-values.yaml). Pods: no service-account
token, the runtime's seccomp profile, non-root, a read-only root filesystem with emptyDirs where
processes write, no privilege escalation, no capability. NetworkPolicies: evaluated here with
Kubernetes' ingress semantics (a pod no policy selects is open; a selected pod takes only what
some rule allows) for the parties that matter: the internet, a pod of the monitoring namespace, a
stray pod in the release's own namespace, Laneway's pods, NATS's nodes, a tenant's namespace.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from tests.deploy.test_helm_chart import NAMESPACE, RELEASE, VARIANTS, laneway_containers, objects, pod_specs, values

NATS_BOX = f"Deployment/{RELEASE}-nats-box"  # the operators' CLI pod: its image writes under /root


def security(spec: dict, container: dict, key: str):
    """A container's setting, else its pod's (as the kubelet resolves it)."""
    return container.get("securityContext", {}).get(key, spec.get("securityContext", {}).get(key))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pod_is_locked_down(variant: str) -> None:
    problems, seen = [], set()
    for workload, _, spec in pod_specs(variant):
        seen.add(workload.split("/")[0])
        if spec.get("automountServiceAccountToken") is not False:
            problems.append(f"{workload}: mounts a service-account token")
        for c in spec["containers"] + spec.get("initContainers", []):
            where = f"{workload}/{c['name']}"
            if (security(spec, c, "seccompProfile") or {}).get("type") != "RuntimeDefault":
                problems.append(f"{where}: no RuntimeDefault seccomp profile")
            if security(spec, c, "allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: may escalate privileges")
            if (c.get("securityContext", {}).get("capabilities") or {}).get("drop") != ["ALL"]:
                problems.append(f"{where}: keeps capabilities")
            if security(spec, c, "privileged"):
                problems.append(f"{where}: privileged")
            if workload == NATS_BOX:
                continue
            if security(spec, c, "runAsNonRoot") is not True:
                problems.append(f"{where}: may run as root")
            if security(spec, c, "readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: writable root filesystem")
    assert not problems, "\n".join(problems)
    assert {"Deployment", "StatefulSet", "Job"} <= seen


@pytest.mark.parametrize("variant", VARIANTS)
def test_laneway_pods_write_only_to_size_limited_emptydirs(variant: str) -> None:
    for workload, _, spec, c in laneway_containers(variant):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        mounts = {m["mountPath"]: volumes[m["name"]] for m in c.get("volumeMounts", [])}
        for path in ("/tmp", "/home/laneway"):  # /home/laneway: HOME, the caches
            assert path in mounts and "sizeLimit" in mounts[path].get("emptyDir", {}), f"{workload}: {path}"


# -- NetworkPolicy, evaluated -----------------------------------------------------------------
@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict = field(default_factory=dict)
    namespace_labels: dict = field(default_factory=dict)
    ports: dict = field(default_factory=dict)  # container port name → number


def selects(selector: dict, labels: dict) -> bool:
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "In": present and value in e.get("values", []),
            "NotIn": value not in e.get("values", []),
            "Exists": present,
            "DoesNotExist": not present,
        }[e["operator"]]
        if not ok:
            return False
    return True


def peer_matches(peer: dict, policy_namespace: str, src: Pod) -> bool:
    assert "ipBlock" not in peer, "ipBlock peers are not evaluated here"
    pods, namespaces = peer.get("podSelector"), peer.get("namespaceSelector")
    if namespaces is None:
        return src.namespace == policy_namespace and selects(pods or {}, src.labels)
    return selects(namespaces, src.namespace_labels) and selects(pods or {}, src.labels)


def port_matches(rule_port: dict, dst: Pod, port: str) -> bool:
    wanted = rule_port.get("port")
    return rule_port.get("protocol", "TCP") == "TCP" and (
        wanted is None or wanted == port or wanted == dst.ports.get(port)
    )


def allowed(variant: str, src: Pod, dst: Pod, port: str) -> bool:
    assert port in dst.ports, f"{port} is not a port of the destination"
    policies = [
        p
        for p in objects(variant, "NetworkPolicy")
        if "Ingress" in p["spec"].get("policyTypes", ["Ingress"])
        and NAMESPACE == dst.namespace
        and selects(p["spec"]["podSelector"], dst.labels)
    ]
    if not policies:
        return True
    return any(
        (not rule.get("ports") or any(port_matches(rp, dst, port) for rp in rule["ports"]))
        and (not rule.get("from") or any(peer_matches(peer, NAMESPACE, src) for peer in rule["from"]))
        for p in policies
        for rule in p["spec"].get("ingress", [])
    )


def pods(variant: str) -> dict[str, Pod]:
    """Each workload's pods, by the component label (worker pools by pool)."""
    out = {}
    for workload, meta, spec in pod_specs(variant):
        labels = meta.get("labels", {})
        ports = {p["name"]: p["containerPort"] for c in spec["containers"] for p in c.get("ports", []) if "name" in p}
        key = labels.get("laneway.dev/pool") or labels.get("app.kubernetes.io/component") or workload
        out[key] = Pod(NAMESPACE, labels, {"kubernetes.io/metadata.name": NAMESPACE}, ports)
    return out


def outsiders() -> dict[str, Pod]:
    monitoring = "monitoring"  # values.yaml's networkPolicy.metricsFrom
    return {
        "the internet": Pod("somewhere", {}, {"kubernetes.io/metadata.name": "somewhere"}),
        "a stray pod beside the release": Pod(NAMESPACE, {"app": "debug"}, {"kubernetes.io/metadata.name": NAMESPACE}),
        "the monitoring namespace": Pod(monitoring, {"app": "prometheus"}, {"kubernetes.io/metadata.name": monitoring}),
        "acme's namespace": Pod("acme", {"app": "publisher"}, {"kubernetes.io/metadata.name": "acme"}),
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_only_the_bridge_takes_traffic_from_outside(variant: str) -> None:
    p, o = pods(variant), outsiders()
    bridge_from = values(variant).get("networkPolicy", {}).get("bridgeFrom")
    if bridge_from:  # all-on: only the ingress controller's namespace
        ingress = Pod("ingress-nginx", {}, {"kubernetes.io/metadata.name": "ingress-nginx"})
        assert allowed(variant, ingress, p["bridge"], "http")
        assert not allowed(variant, o["the internet"], p["bridge"], "http")
    else:
        assert allowed(variant, o["the internet"], p["bridge"], "http")
    targets = [(name, port) for name, pod in p.items() if name != "bridge" for port in pod.ports]
    assert ("nats", "nats") in targets and ("nats", "monitor") in targets and ("broker", "metrics") in targets
    for who in ("the internet", "a stray pod beside the release"):
        opened = [f"{name}:{port}" for name, port in targets if allowed(variant, o[who], p[name], port)]
        assert not opened, f"{who} reaches {opened}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_nats_takes_clients_from_laneway_pods_and_routes_from_its_nodes(variant: str) -> None:
    p, o = pods(variant), outsiders()
    nats_pod = p["nats"]
    for name in ("broker", "bridge", "provision", "small", "hosted"):
        assert allowed(variant, p[name], nats_pod, "nats"), f"{name} cannot reach NATS"
        assert not allowed(variant, p[name], nats_pod, "cluster"), f"{name} may open a route"
        assert not allowed(variant, p[name], nats_pod, "monitor"), f"{name} reads the NATS monitor"
    assert allowed(variant, nats_pod, nats_pod, "cluster")
    assert not allowed(variant, o["the monitoring namespace"], nats_pod, "nats")
    assert not allowed(variant, o["the monitoring namespace"], nats_pod, "monitor")
    tenant_clients = values(variant).get("networkPolicy", {}).get("natsClientsFrom")
    assert allowed(variant, o["acme's namespace"], nats_pod, "nats") == bool(tenant_clients)
    assert not allowed(variant, o["acme's namespace"], nats_pod, "cluster")


@pytest.mark.parametrize("variant", VARIANTS)
def test_metrics_answer_only_the_monitoring_namespace(variant: str) -> None:
    p, o = pods(variant), outsiders()
    scraped = [(name, port) for name, pod in p.items() for port in pod.ports if port in ("metrics", "prom-metrics")]
    assert ("broker", "metrics") in scraped and ("small", "metrics") in scraped
    if values(variant).get("nats", {}).get("promExporter", {}).get("enabled"):
        assert ("nats", "prom-metrics") in scraped
    for name, port in scraped:
        assert allowed(variant, o["the monitoring namespace"], p[name], port), f"{name}:{port}"
        for who in ("the internet", "a stray pod beside the release", "acme's namespace"):
            assert not allowed(variant, o[who], p[name], port), f"{who} scrapes {name}:{port}"
        assert not allowed(variant, p["bridge"], p[name], port), f"the bridge scrapes {name}:{port}"


def test_the_evaluator_follows_kubernetes_semantics() -> None:
    """No policy: open. A policy with no rules: closed. Rules add up; a peer with both selectors
    needs both; a podSelector alone means the policy's namespace."""
    assert selects({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {"a": "1"})
    assert not selects({"matchLabels": {"a": "1"}}, {"a": "2"})
    src = Pod("x", {"role": "c"}, {"kubernetes.io/metadata.name": "x"})
    assert peer_matches({"namespaceSelector": {}, "podSelector": {"matchLabels": {"role": "c"}}}, NAMESPACE, src)
    assert not peer_matches({"podSelector": {"matchLabels": {"role": "c"}}}, NAMESPACE, src)
    assert not peer_matches(
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "y"}}, "podSelector": {}}, NAMESPACE, src
    )
    unselected = Pod(NAMESPACE, {"app": "other"}, {}, {"web": 80})
    assert allowed("default", src, unselected, "web")
