"""The Helm chart (deploy/helm/laneway) renders, validates and agrees with the code it deploys.

No helm binary and no cluster run here. The chart is rendered by Helm's own Go SDK (v4.2, the
`helm-python-sdk` wheel: `helm template` without the binary), with the defaults and with
ci/all-on-values.yaml, which turns every optional part on. Then:
- every object validates against the Kubernetes schemas of two pinned versions
  (`kubernetes-validate`, strict: unknown fields fail); KEDA's ScaledObject, a CRD those schemas
  lack, against the openAPIV3Schema of KEDA's own CRD (tests/deploy/data, KEDA v2.20.2);
- every metric a ScaledObject or an alert/recording rule names is exported by Laneway;
- every Laneway container runs a real `laneway` subcommand whose command line parses, stream
  replicas match the NATS cluster, pods reference only Secrets/ConfigMaps/PVCs the chart makes,
  probes hit the endpoints the process serves, workers get a grace period past their drain;
- the NATS accounts are laneway/nats_config.py's (the LANEWAY account and one per tenant of the
  settings, equal to `accounts()` for the rendered passwords), and the rendered NATS config, run
  as a real 3-node nats-server cluster with the files and environment Kubernetes would give it,
  accepts each role's Secret, refuses a wrong password, stores streams at 3 replicas, encrypts
  them at rest, and keeps a tenant's user inside its own account;
- the NATS routes are authenticated: their user and password (generated, kept, or set in values)
  live in the auth Secret only, never in a ConfigMap, in a file the cluster block includes, with
  route URLs naming the pods the NATS chart names; live, a 4th nats-server routing to the cluster
  without the password (or with a wrong one) is refused and the cluster gains no route.
"""

from __future__ import annotations

import asyncio
import functools
import json
import posixpath
import re
import ssl
import tomllib
import urllib.request
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import msgspec
import nats
import nats.errors
import pytest
import yaml

from laneway.scrape_config import JOB_PREFIX, KINDS
from schemas.subjects import service_inbox
from tests.deploy.nats_checks import check_tenant_is_fenced, parse_accounts
from tests.unit.test_deploy_stack import exported_metrics, promql_metrics
from tests.wait import eventually

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "laneway"
ALL_ON = CHART / "ci" / "all-on-values.yaml"
KEDA_CRD = Path(__file__).parent / "data" / "keda.sh_scaledobjects.yaml"
K8S_VERSIONS = ("1.29.0", "1.33.0")  # the chart's kubeVersion floor, and a current release
RELEASE, NAMESPACE = "demo", "laneway"
VARIANTS = ("default", "all-on")
LANEWAY_ROLES = {"broker", "bridge", "worker", "ops"}


# -- rendering --------------------------------------------------------------------------------
def values(variant: str) -> dict:
    return yaml.safe_load(ALL_ON.read_text()) if variant == "all-on" else {}


@functools.cache
def render(variant: str) -> tuple[tuple[str, dict], ...]:
    """(template, object) for every object the chart renders, hooks and subchart included."""
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values(variant), name=RELEASE, namespace=NAMESPACE)
    out = []
    for source, text in sorted(manifests.items()):
        if source.endswith(".txt"):
            continue
        out += [(source, doc) for doc in yaml.safe_load_all(text) if doc]
    assert out, f"{variant}: nothing rendered"
    return tuple(out)


def render_values(overrides: dict, name: str = RELEASE) -> list[dict]:
    """Every object the chart renders with these values (not cached: for one-off variations)."""
    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(overrides, name=name, namespace=NAMESPACE)
    return [d for text in manifests.values() for d in yaml.safe_load_all(text) if d]


def values_merged(variant: str) -> dict:
    with helm.Chart.load(str(CHART)) as chart:
        return chart.merge_values(values(variant))


def objects(variant: str, kind: str | None = None) -> list[dict]:
    return [o for _, o in render(variant) if kind is None or o["kind"] == kind]


def named(variant: str, kind: str, name: str) -> dict:
    found = [o for o in objects(variant, kind) if o["metadata"]["name"] == name]
    assert len(found) == 1, f"{variant}: {kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_specs(variant: str) -> list[tuple[str, dict, dict]]:
    """(kind/name, pod template metadata, pod spec) of every workload."""
    out = []
    for o in objects(variant):
        if o["kind"] in ("Deployment", "StatefulSet", "Job"):
            template = o["spec"]["template"]
            out.append((f"{o['kind']}/{o['metadata']['name']}", template.get("metadata") or {}, template["spec"]))
    return out


def laneway_containers(variant: str) -> list[tuple[str, dict, dict, dict]]:
    """(workload, pod metadata, pod spec, container) for containers running the laneway image."""
    return [
        (w, meta, spec, c)
        for w, meta, spec in pod_specs(variant)
        for c in spec["containers"]
        if c["image"].split(":")[0].endswith("laneway")
    ]


def flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env", [])}


# -- schemas ----------------------------------------------------------------------------------
@functools.cache
def keda_schema() -> dict:
    crd = yaml.safe_load(KEDA_CRD.read_text())
    return {v["name"]: v["schema"]["openAPIV3Schema"] for v in crd["spec"]["versions"]}


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_object_validates_against_its_schema(variant: str) -> None:
    errors, kinds = [], set()
    for source, obj in render(variant):
        where = f"{source}: {obj['kind']}/{obj['metadata'].get('name')}"
        kinds.add(obj["kind"])
        group, _, version = obj["apiVersion"].rpartition("/")
        if group == "keda.sh":
            try:
                jsonschema.validate(obj, keda_schema()[version])
            except jsonschema.ValidationError as exc:
                errors.append(f"{where}: {exc.message} at {list(exc.absolute_path)}")
            continue
        for k8s in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(obj, k8s, strict=True)
            except kubernetes_validate.ValidationError as exc:
                errors.append(f"{where} (Kubernetes {k8s}): {exc.message} at {list(exc.path)}")
    assert not errors, "\n".join(errors)
    assert {
        "Deployment",
        "StatefulSet",
        "PodDisruptionBudget",
        "Secret",
        "ConfigMap",
        "Job",
        "HorizontalPodAutoscaler",
    } <= kinds
    if variant == "all-on":
        assert "ScaledObject" in kinds, "the KEDA branch above must run"


def test_the_schema_checks_catch_wrong_objects() -> None:
    """Both checks are real: an unknown field, a wrong type and a missing required field fail."""
    deployment = json.loads(json.dumps(objects("default", "Deployment")[0]))
    deployment["spec"]["template"]["spec"]["containers"][0]["livenessProbes"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)

    scaled = next(o for o in objects("all-on", "ScaledObject"))
    schema = keda_schema()["v1alpha1"]
    jsonschema.validate(scaled, schema)
    bad_type = json.loads(json.dumps(scaled))
    bad_type["spec"]["minReplicaCount"] = "one"
    missing = json.loads(json.dumps(scaled))
    del missing["spec"]["scaleTargetRef"]["name"]
    for bad in (bad_type, missing):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_all_on_values_turn_every_switch_on() -> None:
    """Every `enabled` in values.yaml (ours and the NATS parts we set) is true in ci/all-on."""
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    on = yaml.safe_load(ALL_ON.read_text())

    def switches(node, path=()):
        if isinstance(node, dict):
            for key, value in node.items():
                if key == "enabled" and isinstance(value, bool):
                    yield path
                else:
                    yield from switches(value, (*path, key))

    def lookup(node, path):
        for key in path:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    off = [
        ".".join(p)
        for p in switches(defaults)
        if not (
            lookup(on, (*p, "enabled"))
            if lookup(on, (*p, "enabled")) is not None
            else lookup(defaults, (*p, "enabled"))
        )
    ]
    assert not off, f"ci/all-on-values.yaml leaves off: {off}"
    assert on["otel"]["endpoint"], "the OTLP endpoint too"


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint_strict_finds_no_warning(variant: str) -> None:
    findings = helm.lint(str(CHART), values(variant), strict=True, namespace=NAMESPACE)
    assert findings["total_charts_linted"] == 1 and not findings["errors"], findings
    # Helm's severities: 1 info, 2 warning, 3 error. ("icon is recommended" is the info left.)
    assert all(m["severity"] < 2 for m in findings["messages"]), findings["messages"]


# -- metrics ----------------------------------------------------------------------------------
def rules_file(variant: str) -> dict:
    cm = named(variant, "ConfigMap", f"{RELEASE}-laneway-prometheus")
    return yaml.safe_load(cm["data"]["alerts.yml"])


def test_scaled_objects_and_rules_name_exported_metrics() -> None:
    exported, classes = exported_metrics()
    assert classes
    rules = [r for g in rules_file("all-on")["groups"] for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    uses = [(f"rule {r.get('alert') or r.get('record')}", str(r["expr"])) for r in rules]
    scaled = objects("all-on", "ScaledObject")
    uses += [
        (f"ScaledObject {o['metadata']['name']} trigger {t.get('name')}", t["metadata"]["query"])
        for o in scaled
        for t in o["spec"]["triggers"]
    ]
    pools = [name for name, p in values_merged("all-on")["workerPools"].items() if p["enabled"]]
    assert len(scaled) == len(pools), "a ScaledObject per enabled worker pool"
    missing = {}
    for where, expr in uses:
        names = promql_metrics(expr)
        assert names, f"{where}: no metric in {expr!r}"
        for name in names:
            if not (name in recorded if ":" in name else name in exported):
                missing.setdefault(name, []).append(where)
    assert not missing, f"metrics Laneway does not export (searched {classes}): {missing}"


# -- processes --------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", VARIANTS)
def test_containers_run_real_laneway_commands(variant: str) -> None:
    from laneway.cli import build_parser

    parser = build_parser()
    seen = set()
    for workload, _, _, c in laneway_containers(variant):
        args = [str(a) for a in c["args"]]
        seen.add(args[0])
        assert args[0] in LANEWAY_ROLES, f"{workload}: `laneway {args[0]}`"
        try:
            _parsed, rest = parser.parse_known_args(args)
        except SystemExit:
            pytest.fail(f"{workload}: `laneway {' '.join(args)}` does not parse")
        assert not rest, f"{workload}: unknown arguments {rest}"
        assert "command" not in c, f"{workload}: the image's entrypoint is `laneway`; set args only"
    assert seen == LANEWAY_ROLES, seen
    jobs = [(w, c) for w, _, _, c in laneway_containers(variant) if w.startswith("Job/")]
    assert [c["args"][:2] for _, c in jobs] == [["ops", "provision"]], jobs
    assert flag(jobs[0][1]["args"], "--settings") == "/etc/laneway/settings.toml"


@pytest.mark.parametrize("variant", VARIANTS)
def test_streams_replicate_across_the_nats_cluster(variant: str) -> None:
    sts = named(variant, "StatefulSet", f"{RELEASE}-nats")
    conf = named(variant, "ConfigMap", f"{RELEASE}-nats-config")["data"]["nats.conf"]
    assert sts["spec"]["replicas"] == 3
    assert len(cluster_auth(named(variant, "Secret", f"{RELEASE}-nats-auth")["stringData"])[1]) == 3
    assert re.search(r'"cipher":\s*"chachapoly"', conf) and re.search(r'"key":\s*\$LANEWAY_NATS_JS_KEY\b', conf)
    for workload, _, _, c in laneway_containers(variant):
        if c["args"][0] in ("broker", "ops"):  # the bridge creates no stream
            assert flag(c["args"], "--replicas") == "3", f"{workload}: streams need 3 replicas"
        assert env_of(c)["LANEWAY_NATS_URL"]["value"] == f"tls://{RELEASE}-nats:4222", workload
    assert named(variant, "Service", f"{RELEASE}-nats")["spec"]["ports"][0]["port"] == 4222


@pytest.mark.parametrize("variant", VARIANTS)
def test_pods_reference_only_what_the_chart_makes(variant: str) -> None:
    made = {(o["kind"], o["metadata"]["name"]) for o in objects(variant)}
    claims = {
        ("PersistentVolumeClaim", t["metadata"]["name"])
        for o in objects(variant, "StatefulSet")
        for t in o["spec"].get("volumeClaimTemplates", [])
    }
    problems = []
    for workload, _, spec in pod_specs(variant):
        for v in spec.get("volumes", []):
            ref = (
                ("ConfigMap", v["configMap"]["name"])
                if "configMap" in v
                else ("Secret", v["secret"]["secretName"])
                if "secret" in v
                else ("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"])
                if "persistentVolumeClaim" in v
                else None
            )
            if ref and ref not in made:
                problems.append(f"{workload}: volume {v['name']} → missing {ref}")
        for c in spec["containers"] + spec.get("initContainers", []):
            mounts = {m["name"] for m in c.get("volumeMounts", [])}
            volumes = {v["name"] for v in spec.get("volumes", [])} | {n for _, n in claims}
            problems += [f"{workload}/{c['name']}: mount of no volume {m}" for m in mounts - volumes]
            defined: set[str] = set()
            for e in c.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef") or e.get("valueFrom", {}).get("configMapKeyRef")
                kind = "Secret" if "secretKeyRef" in e.get("valueFrom", {}) else "ConfigMap"
                if ref and (kind, ref["name"]) not in made:
                    problems.append(f"{workload}/{c['name']}: env {e['name']} → missing {kind}/{ref['name']}")
                # Kubernetes expands $(VAR) only for a variable listed earlier; else it stays literal.
                for var in re.findall(r"\$\((\w+)\)", e.get("value", "")):
                    if var not in defined:
                        problems.append(f"{workload}/{c['name']}: env {e['name']} uses $({var}) before it is set")
                defined.add(e["name"])
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_bridge_replica_gets_the_same_idempotency_secret(variant: str) -> None:
    """`laneway bridge` does not start without LANEWAY_IDEMPOTENCY_SECRET; every replica reads it
    from one Secret the chart makes (kept across upgrades by lookup; values may set it)."""
    (bridge,) = [c for w, _, _, c in laneway_containers(variant) if c["args"][0] == "bridge"]
    ref = env_of(bridge)["LANEWAY_IDEMPOTENCY_SECRET"]["valueFrom"]["secretKeyRef"]
    secret = named(variant, "Secret", ref["name"])
    assert len(secret["stringData"][ref["key"]]) >= 32
    rendered = render_values(
        values(variant) | {"bridge": {**values(variant).get("bridge", {}), "idempotencySecret": "x" * 40}}
    )
    (mine,) = [d for d in rendered if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"]]
    assert mine["stringData"][ref["key"]] == "x" * 40


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_deployment_has_a_disruption_budget_and_scalers_target_real_ones(variant: str) -> None:
    deployments = {
        o["metadata"]["name"]: o
        for o in objects(variant, "Deployment")
        if o["metadata"]["labels"].get("app.kubernetes.io/part-of") == "laneway"
    }
    pdbs = objects(variant, "PodDisruptionBudget")
    for name, d in deployments.items():
        labels = d["spec"]["template"]["metadata"]["labels"]
        covering = [p for p in pdbs if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
        assert len(covering) == 1, f"Deployment {name}: {len(covering)} PodDisruptionBudgets"
        assert d["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
    scalers = objects(variant, "HorizontalPodAutoscaler") + objects(variant, "ScaledObject")
    for s in scalers:
        target = s["spec"]["scaleTargetRef"]["name"]
        assert target in deployments, f"{s['kind']} {s['metadata']['name']} scales no Deployment {target}"
        assert "replicas" not in deployments[target]["spec"], f"{target}: replicas fight the autoscaler"
    bridge = f"{RELEASE}-laneway-bridge"
    hpa = [s for s in objects(variant, "HorizontalPodAutoscaler") if s["spec"]["scaleTargetRef"]["name"] == bridge]
    assert hpa and hpa[0]["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    assert hpa[0]["spec"]["minReplicas"] >= 2
    assert named(variant, "Deployment", f"{RELEASE}-laneway-broker")["spec"]["replicas"] >= 2


@pytest.mark.parametrize("variant", VARIANTS)
def test_probes_hit_what_each_process_serves_and_drains_fit(variant: str) -> None:
    for workload, _, spec, c in laneway_containers(variant):
        role, args = c["args"][0], c["args"]
        ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        if role == "bridge":
            # bridge/app.py serves /readyz and /healthz on its HTTP port (--port).
            assert str(ports["http"]) == flag(args, "--port")
            assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
            assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
            sleep = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
            assert spec["terminationGracePeriodSeconds"] > sleep
        elif role in ("broker", "worker"):
            # They serve only Prometheus metrics (--metrics-port): the probes check that listener.
            assert str(ports["metrics"]) == flag(args, "--metrics-port")
            for probe in ("readinessProbe", "livenessProbe"):
                assert c[probe]["tcpSocket"] == {"port": "metrics"}, f"{workload}: {probe}"
        if role == "worker":
            assert spec["terminationGracePeriodSeconds"] > float(flag(args, "--drain-timeout")), workload


@pytest.mark.parametrize("variant", VARIANTS)
def test_worker_pools_get_gpus_models_and_keys(variant: str) -> None:
    engines = set()
    for workload, meta, spec, c in laneway_containers(variant):
        args = c["args"]
        if args[0] != "worker":
            continue
        engine = flag(args, "--engine")
        engines.add(engine)
        assert meta["labels"]["laneway.dev/pool"] == flag(args, "--pool")
        resources = c["resources"]
        if engine == "vllm":
            tp = int(flag(args, "--tensor-parallel-size"))
            assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == tp, workload
            mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
            model_root = str(Path(flag(args, "--model")).parent)
            assert mounts[model_root]["readOnly"], f"{workload}: model volume not at {model_root}"
            volume = next(v for v in spec["volumes"] if v["name"] == mounts[model_root]["name"])
            assert "persistentVolumeClaim" in volume, workload
            assert (
                mounts["/dev/shm"] and "sizeLimit" in next(v for v in spec["volumes"] if v["name"] == "shm")["emptyDir"]
            )
        else:
            assert "nvidia.com/gpu" not in json.dumps(resources), workload
        if engine == "openai":
            key_env = flag(args, "--upstream-key-env")
            assert "secretKeyRef" in env_of(c)[key_env]["valueFrom"], f"{workload}: the key must come from a Secret"
            assert key_env not in " ".join(args[args.index("--upstream-key-env") + 2 :])
    assert {"vllm", "openai"} <= engines
    if variant == "all-on":
        assert "sim" in engines


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_pool_the_settings_name_has_workers(variant: str, tmp_path: Path) -> None:
    from core.settings import load_settings

    path = tmp_path / "settings.toml"
    path.write_text(named(variant, "ConfigMap", f"{RELEASE}-laneway-settings")["data"]["settings.toml"])
    settings = load_settings(path)
    served = {flag(c["args"], "--pool") for _, _, _, c in laneway_containers(variant) if c["args"][0] == "worker"}
    wanted = {m.pool for m in settings.models.values()}
    assert wanted and wanted <= served, f"pools without workers: {wanted - served}"
    if variant == "default":  # the defaults ship deploy/settings.toml itself
        assert tomllib.loads(path.read_text()) == tomllib.loads((ROOT / "deploy" / "settings.toml").read_text())


@pytest.mark.parametrize("variant", VARIANTS)
def test_otlp_endpoint_only_when_configured(variant: str) -> None:
    endpoint = values(variant).get("otel", {}).get("endpoint")
    for workload, _, _, c in laneway_containers(variant):
        env = env_of(c)
        if endpoint:
            assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == endpoint, workload
        else:
            assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in env, workload


# -- monitoring -------------------------------------------------------------------------------
def test_monitoring_configmaps_reuse_the_deploy_files() -> None:
    deploy = ROOT / "deploy"
    prom = named("all-on", "ConfigMap", f"{RELEASE}-laneway-prometheus")["data"]
    assert prom["alerts.yml"].strip() == (deploy / "prometheus" / "alerts.yml").read_text().strip()
    config = yaml.safe_load(prom["prometheus.yml"])
    assert config["rule_files"] == ["alerts.yml"]
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert {f"{JOB_PREFIX}{kind}" for kind in KINDS} | {"nats"} <= set(jobs)  # as `laneway up` names them
    # Each Laneway pod is annotated with the port its process serves metrics on, and one job keeps it.
    keeps = {
        name: re.compile(rule["regex"])
        for name, job in jobs.items()
        for rule in job["relabel_configs"]
        if rule.get("action") == "keep" and "app_kubernetes_io_component" in " ".join(rule["source_labels"])
    }
    for workload, meta, _, c in laneway_containers("all-on"):
        if c["args"][0] in ("broker", "worker", "bridge"):
            port = meta["annotations"]["prometheus.io/port"]
            assert port == (flag(c["args"], "--metrics-port") or flag(c["args"], "--port")), workload
            key = f"{RELEASE};{meta['labels']['app.kubernetes.io/component']}"
            assert [n for n, rx in keeps.items() if rx.fullmatch(key)] == [f"laneway-{c['args'][0]}"], workload
    dashboard = named("all-on", "ConfigMap", f"{RELEASE}-laneway-dashboard")
    assert json.loads(dashboard["data"]["laneway.json"]) == json.loads(
        (deploy / "grafana" / "dashboards" / "laneway.json").read_text()
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    source = yaml.safe_load(
        named("all-on", "ConfigMap", f"{RELEASE}-laneway-datasource")["data"]["laneway-prometheus.yml"]
    )
    original = yaml.safe_load((deploy / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text())
    assert source["datasources"][0]["url"] == values("all-on")["monitoring"]["grafanaDatasource"]["prometheusUrl"]
    assert source["datasources"][0]["uid"] == original["datasources"][0]["uid"]
    for name in ("prometheus", "grafana", "settings.toml"):  # links, so nothing is copied
        assert (CHART / "files" / name).is_symlink(), name


# -- NATS routes ------------------------------------------------------------------------------
ROUTE_USER = "route"


def cluster_auth(auth_secret: dict[str, str]) -> tuple[dict, list[str]]:
    """The auth Secret's cluster-auth.conf (`authorization: {...}` and `routes: [...]`, JSON
    values): the routes' authorization and the route URLs."""
    lines = dict(line.split(": ", 1) for line in auth_secret["cluster-auth.conf"].splitlines() if line)
    assert set(lines) == {"authorization", "routes"}, lines
    return json.loads(lines["authorization"]), json.loads(lines["routes"])


def nats_conf(rendered: list[dict]) -> str:
    (conf,) = [
        o["data"]["nats.conf"] for o in rendered if o["kind"] == "ConfigMap" and "nats.conf" in o.get("data", {})
    ]
    return conf


def cluster_block(conf: str) -> str:
    """The `"cluster": {...}` block of the NATS chart's rendered (pretty-printed JSON) config."""
    found = re.search(r'^  "cluster": \{\n(.*?)^  \},?$', conf, re.M | re.S)
    assert found, conf
    return found.group(1)


def mounted_files(rendered: list[dict], spec: dict, container: dict) -> dict[str, tuple[str, str, str]]:
    """Path in the container → (kind, name, key) of each Secret or ConfigMap key it mounts."""
    sources = {
        (o["kind"], o["metadata"]["name"]): {**o.get("data", {}), **o.get("stringData", {})}
        for o in rendered
        if o["kind"] in ("Secret", "ConfigMap")
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    files = {}
    for m in container.get("volumeMounts", []):
        v = volumes.get(m["name"], {})
        kind, name = (
            ("Secret", v["secret"]["secretName"])
            if "secret" in v
            else ("ConfigMap", v["configMap"]["name"])
            if "configMap" in v
            else (None, None)
        )
        if kind:
            assert "subPath" not in m and "items" not in v.get("secret", v.get("configMap")), m
            files |= {posixpath.join(m["mountPath"], key): (kind, name, key) for key in sources[(kind, name)]}
    return files


@pytest.mark.parametrize("variant", VARIANTS)
def test_nats_routes_are_authenticated_from_a_secret_only(variant: str) -> None:
    """The routes' user and password are in the auth Secret, in a file the cluster block of the
    NATS config includes from that Secret's mount, with the route URLs (nats-server authenticates
    a route it dials only by its URL's credentials) naming each pod of the StatefulSet by its
    headless Service; no ConfigMap holds the password, the NATS config no route of its own."""
    rendered = [o for _, o in render(variant)]
    secret = named(variant, "Secret", f"{RELEASE}-nats-auth")["stringData"]
    password = secret["route-password"]
    authorization, routes = cluster_auth(secret)
    assert authorization == {"user": ROUTE_USER, "password": password}
    assert len(password) >= 32, "generated"
    sts = named(variant, "StatefulSet", f"{RELEASE}-nats")
    headless = named(variant, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    (port,) = [p["port"] for p in headless["spec"]["ports"] if p["name"] == "cluster"]
    pods = [
        f"{sts['metadata']['name']}-{i}.{headless['metadata']['name']}:{port}" for i in range(sts["spec"]["replicas"])
    ]
    assert routes == [f"nats://{ROUTE_USER}:{password}@{pod}" for pod in pods]

    spec = sts["spec"]["template"]["spec"]
    nats_container = next(c for c in spec["containers"] if c["name"] == "nats")
    config_dir = posixpath.dirname(flag(nats_container["args"], "--config"))
    block = cluster_block(nats_conf(rendered))
    assert '"routes"' not in block and "authorization" not in block, block
    files = mounted_files(rendered, spec, nats_container)
    included = [
        files.get(posixpath.normpath(posixpath.join(config_dir, path)))
        for path in re.findall(r"^\s*include (\S+);$", block, re.M)
    ]
    assert included == [
        ("Secret", f"{RELEASE}-nats-auth", "cluster-auth.conf"),
        ("Secret", f"{RELEASE}-nats-auth", "cluster-tls.conf"),
    ], included
    leaks = [o["metadata"]["name"] for o in objects(variant, "ConfigMap") if password in json.dumps(o)]
    assert not leaks, f"the route password is in ConfigMaps {leaks}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_nats_speaks_tls_to_clients_and_routes_and_laneway_trusts_its_ca(variant: str) -> None:
    """The NATS config includes the auth Secret's tls.conf (top) and cluster-tls.conf (routes,
    verified against the CA); the certificate names the client Service and every pod; each
    Laneway container dials tls:// and trusts the CA from the <release>-nats-ca ConfigMap, which
    holds no key. `natsTls.enabled: false` turns all of it off."""
    from cryptography import x509

    secret = named(variant, "Secret", f"{RELEASE}-nats-auth")["stringData"]
    assert "cert_file" in secret["tls.conf"] and "ca_file" in secret["cluster-tls.conf"]
    assert re.search(r"^\s*include \.\./nats-laneway/tls\.conf;$", nats_conf([o for _, o in render(variant)]), re.M)
    cert = x509.load_pem_x509_certificate(secret["tls.crt"].encode())
    ca = named(variant, "ConfigMap", f"{RELEASE}-nats-ca")["data"]
    assert set(ca) == {"ca.crt"} and ca["ca.crt"] == secret["ca.crt"] and "PRIVATE KEY" not in ca["ca.crt"]
    assert cert.issuer == x509.load_pem_x509_certificate(ca["ca.crt"].encode()).subject
    names = set(
        cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    )
    assert {f"{RELEASE}-nats", f"*.{RELEASE}-nats-headless", f"{RELEASE}-nats.{NAMESPACE}.svc.cluster.local"} <= names
    for workload, _, spec, container in laneway_containers(variant):
        env = env_of(container)
        assert env["LANEWAY_NATS_URL"]["value"] == f"tls://{RELEASE}-nats:4222", workload
        path = env["LANEWAY_NATS_TLS_CA"]["value"]
        (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        (volume,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
        assert volume["configMap"]["name"] == f"{RELEASE}-nats-ca", workload

    plain = render_values({**values(variant), "natsTls": {"enabled": False}})
    assert not [o for o in plain if o["metadata"]["name"] == f"{RELEASE}-nats-ca"]
    (auth,) = [
        o["stringData"] for o in plain if o["kind"] == "Secret" and o["metadata"]["name"] == f"{RELEASE}-nats-auth"
    ]
    assert "tls.crt" not in auth and "cert_file" not in auth["tls.conf"]
    urls = {
        e["value"]
        for o in plain
        if o["kind"] in ("Deployment", "Job")
        for c in o["spec"]["template"]["spec"]["containers"]
        for e in c.get("env", [])
        if e["name"] == "LANEWAY_NATS_URL"
    }
    assert urls == {f"nats://{RELEASE}-nats:4222"}


def test_the_route_password_is_set_in_values_never_in_the_nats_charts() -> None:
    chosen = "a-route-password-chosen-0451"
    rendered = render_values({"natsAuth": {"routePassword": chosen}})
    (secret,) = [
        o["stringData"] for o in rendered if o["kind"] == "Secret" and o["metadata"]["name"] == f"{RELEASE}-nats-auth"
    ]
    authorization, routes = cluster_auth(secret)
    assert secret["route-password"] == authorization["password"] == chosen
    assert all(url.startswith(f"nats://{ROUTE_USER}:{chosen}@") for url in routes)
    # The NATS chart's own route credentials would be written into its ConfigMap; a password that
    # a URL would need escaped would break the routes.
    for overrides in (
        {"nats": {"config": {"cluster": {"routeURLs": {"user": "route", "password": chosen}}}}},
        {"natsAuth": {"routePassword": "with space/and@sign#0451"}},
        {"natsAuth": {"routePassword": "short"}},
    ):
        with pytest.raises(helm.HelmError, match=r"natsAuth\.routePassword"):
            render_values(overrides)


def merged(base: dict, extra: dict) -> dict:
    out = dict(base)
    for key, value in extra.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


@pytest.mark.parametrize(
    "name, overrides",
    [
        (RELEASE, {}),
        ("nats", {}),  # the NATS chart's names drop its suffix
        (
            RELEASE,
            {
                "nats": {
                    "fullnameOverride": "mq",
                    "config": {
                        "cluster": {
                            "routeURLs": {"useFQDN": True},
                            "tls": {"enabled": True, "secretName": "route-certs"},
                        }
                    },
                }
            },
        ),
        (
            RELEASE,
            {
                "nats": {
                    "nameOverride": "bus",
                    "statefulSet": {"name": "ss"},
                    "headlessService": {"name": "hs"},
                    "config": {"cluster": {"port": 7222, "replicas": 5}},
                }
            },
        ),
    ],
    ids=["default", "release-nats", "fullname-fqdn-tls", "names-port-replicas"],
)
def test_route_urls_name_the_pods_the_nats_chart_names(name: str, overrides: dict) -> None:
    """Ours (with credentials, in the Secret) against the NATS chart's own route list, rendered
    by leaving its route list in place (no patch) under the same values."""
    rendered = render_values(overrides, name=name)
    (secret,) = [
        o["stringData"] for o in rendered if o["kind"] == "Secret" and o["metadata"]["name"] == f"{name}-nats-auth"
    ]
    ours = [re.sub(r"//[^@/]*@", "//", url) for url in cluster_auth(secret)[1]]
    theirs = re.search(
        r'"routes": (\[.*?\])',
        nats_conf(render_values(merged(overrides, {"nats": {"config": {"cluster": {"patch": []}}}}), name=name)),
        re.S,
    )
    assert theirs and ours == json.loads(theirs.group(1))


# -- NATS accounts and the rendered NATS config, live ------------------------------------------
def test_nats_accounts_file_matches_the_code() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("gen", ROOT / "deploy" / "helm" / "generate_nats_permissions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (CHART / "files" / "nats-accounts.json").read_text() == module.generate(), (
        "laneway/nats_config.py or nats_permissions.py changed: run .venv/bin/python deploy/helm/generate_nats_permissions.py"
    )


def rendered_accounts(variant: str) -> dict:
    return parse_accounts(named(variant, "Secret", f"{RELEASE}-nats-auth")["stringData"]["auth.conf"])


def rendered_tenants(variant: str) -> list[str]:
    return sorted(rendered_tenant_docs(variant))


def rendered_tenant_docs(variant: str) -> dict:
    """tenant → its document, as the settings the chart rendered give it (its classes included)."""
    from core.policy.tenants import Tenant

    settings = named(variant, "ConfigMap", f"{RELEASE}-laneway-settings")["data"]["settings.toml"]
    tenants = tomllib.loads(settings).get("tenants", {})
    return {name: msgspec.convert({"name": name, **doc}, Tenant) for name, doc in tenants.items()}


def canonical(accounts: dict) -> dict:
    """Order-free: users by name, exports by content (the chart ranges over sorted keys)."""

    def sort(items: list) -> list:
        return sorted(items, key=lambda i: json.dumps(i, sort_keys=True))

    return {
        name: {**a, "users": sort(a["users"]), **({"exports": sort(a["exports"])} if "exports" in a else {})}
        for name, a in accounts.items()
    }


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_accounts_are_the_codes_for_the_settings_tenants(variant: str) -> None:
    from laneway.nats_config import accounts
    from laneway.nats_permissions import ROLES, tenant_user, user_name
    from schemas.subjects import Subjects

    tenants = rendered_tenants(variant)
    assert tenants, f"{variant}: the settings name no tenant"
    secrets = {o["metadata"]["name"]: o["stringData"] for o in objects(variant, "Secret")}
    passwords = secrets[f"{RELEASE}-nats-tenants"]
    assert set(passwords) == {tenant_user(t) for t in tenants}
    for role in ROLES:
        secret = secrets[f"{RELEASE}-nats-{role}"]
        assert secret["user"] == user_name(role)
        passwords[secret["user"]] = secret["password"]
    assert len(set(passwords.values())) == len(passwords), "every user its own password"
    docs = rendered_tenant_docs(variant).values()  # each user publishes in its tenant's classes alone
    assert canonical(rendered_accounts(variant)) == canonical(accounts(Subjects("lw"), docs, passwords))
    if variant == "all-on":
        globex = rendered_accounts(variant)["TENANT_globex"]["users"][0]["permissions"]["publish"]["allow"]
        assert globex == ["lw.req.batch.globex", "lw.cancel.globex.*"]
    if variant == "all-on":  # a password chosen in values is the one in both Secrets
        assert passwords["ops"] == values(variant)["natsAuth"]["passwords"]["ops"]


def kubernetes_env(container: dict, secrets: dict[str, dict[str, str]]) -> dict[str, str]:
    """The environment the kubelet would give the container: Secret values, then $(VAR) expanded
    from variables listed earlier (a later or unknown one stays as written, as in Kubernetes)."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), e["value"])
        elif "secretKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["secretKeyRef"]
            env[e["name"]] = secrets[ref["name"]][ref["key"]]
    return env


async def check_routes_refuse_a_server_without_the_password(
    tmp_path: Path, conf: str, servers: list, route_ports: list[int], http_ports: list[int]
) -> None:
    """Each node routes to the two others (its /routez names them); a 4th nats-server of the same
    cluster name, routing to node 0 without credentials and to node 1 as the route user with a
    wrong password, is refused by both (their logs say so) and no node gains a route to it."""
    from core.natsd import NatsServer
    from core.ports import free_port

    names = [f"{RELEASE}-nats-{i}" for i in range(len(servers))]

    def routed(i: int) -> set[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_ports[i]}/routez", timeout=5) as answer:
            return {r.get("remote_name") for r in json.load(answer)["routes"]}

    assert await eventually(lambda: all(routed(i) == set(names) - {n} for i, n in enumerate(names)), timeout=30), [
        routed(i) for i in range(len(servers))
    ]
    # nats-server logs a route it refused as `rid:N - authentication error` (+ ` - User "<user>"`
    # if it named one; a client's refusal says cid:N).
    no_user = re.compile(r"rid:\d+ - authentication error$", re.M)
    wrong_password = re.compile(rf'rid:\d+ - authentication error - User "{ROUTE_USER}"$', re.M)
    assert not [s.url for s in servers if re.search(r"rid:\d+ - authentication error", s.log_file.read_text())], (
        "routes refused before any intruder"
    )
    cluster_name = re.search(r'"name": "([^"]+)"', cluster_block(conf)).group(1)
    routes = [
        f"nats://localhost:{route_ports[0]}",
        f"nats://{ROUTE_USER}:not-the-route-password@localhost:{route_ports[1]}",
    ]
    # The routes are mutual TLS: the intruder shows the nodes' own certificate (as if stolen), so
    # what keeps it out here is the route password alone.
    tls = (tmp_path / "nats-laneway" / "cluster-tls.conf").read_text().strip()
    intruder_conf = tmp_path / "intruder.conf"
    intruder_conf.write_text(
        f'server_name: "intruder"\ncluster {{ name: {json.dumps(cluster_name)}, '
        f"port: {free_port()}, routes: {json.dumps(routes)}, {tls} }}\n"
    )
    intruder = NatsServer(tmp_path / "intruder", config_file=intruder_conf)
    await intruder.start()
    try:

        def joined() -> bool:
            return any("intruder" in routed(i) for i in range(len(servers)))

        def refused() -> bool:
            return bool(
                no_user.search(servers[0].log_file.read_text())
                and wrong_password.search(servers[1].log_file.read_text())
            )

        assert await eventually(lambda: joined() or refused(), timeout=30), intruder.log_file.read_text()[-2000:]
        assert not joined(), "the cluster took a route from a server without the route password"
        assert refused()
        assert [routed(i) for i in range(len(servers))] == [set(names) - {n} for n in names]
    finally:
        await intruder.stop()


async def plain_text_refused(port: int, user: str, password: str) -> bool:
    """TLS only: a client that logs in without it, with a good password, gets an error, no PONG."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        info = json.loads((await reader.readline()).split(b" ", 1)[1])
        assert info.get("tls_required") is True, info
        writer.write(
            b"CONNECT " + json.dumps({"user": user, "pass": password, "verbose": False}).encode() + b"\r\nPING\r\n"
        )
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), 10)
        return b"PONG" not in answer and (not answer or b"-ERR" in answer)
    finally:
        writer.close()


async def test_rendered_nats_config_runs_as_a_3_node_cluster(tmp_path: Path, monkeypatch) -> None:
    from core.connect import NatsSettings
    from core.natsd import NatsServer
    from core.ports import free_port
    from core.provision import not_ready_yet, provision_at
    from core.settings import load_settings
    from core.topology import StreamLimits
    from schemas.subjects import Subjects

    secrets = {o["metadata"]["name"]: o["stringData"] for o in objects("default", "Secret")}
    conf = named("default", "ConfigMap", f"{RELEASE}-nats-config")["data"]["nats.conf"]
    sts = named("default", "StatefulSet", f"{RELEASE}-nats")
    nats_container = next(c for c in sts["spec"]["template"]["spec"]["containers"] if c["name"] == "nats")
    for name, value in kubernetes_env(nats_container, secrets).items():
        monkeypatch.setenv(name, value)  # nats-server inherits this process's environment

    # The pod's file layout (/etc/nats-config, /etc/nats-laneway: the auth Secret's volume, a
    # file per key) under tmp_path, loopback ports: the route URLs' pod names → 127.0.0.1.
    route_ports, http_ports = [free_port() for _ in range(3)], [free_port() for _ in range(3)]

    # Routes dial `localhost`, a name the chart's certificate carries, as a pod's name would be.
    def on_loopback(text: str) -> str:
        for j in range(3):
            text = text.replace(f"{RELEASE}-nats-{j}.{RELEASE}-nats-headless:6222", f"localhost:{route_ports[j]}")
        return text.replace("/etc/nats-laneway/", f"{tmp_path}/nats-laneway/")

    (tmp_path / "nats-laneway").mkdir()
    for key, text in secrets[f"{RELEASE}-nats-auth"].items():
        (tmp_path / "nats-laneway" / key).write_text(on_loopback(text))
    # What Laneway's pods trust: the CA in the <release>-nats-ca ConfigMap alone.
    ca = tmp_path / "nats-ca.crt"
    ca.write_text(named("default", "ConfigMap", f"{RELEASE}-nats-ca")["data"]["ca.crt"])
    tls = ssl.create_default_context(cafile=str(ca))
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))  # nats-py's default context, in nats_checks
    servers = []
    for i in range(3):
        text = conf.replace("$SERVER_NAME", f'"{RELEASE}-nats-{i}"')
        text = text.replace('"port": 6222', f'"port": {route_ports[i]}')
        text = text.replace('"http_port": 8222,', f'"http_port": {http_ports[i]},')  # on -a 127.0.0.1
        text = re.sub(r',\s*"store_dir": "/data"', "", text)  # NatsServer passes -sd (a duplicate fails)
        text = text.replace('"/var/run/nats/nats.pid"', json.dumps(str(tmp_path / f"n{i}.pid")))
        node_dir = tmp_path / f"nats-config-{i}"
        node_dir.mkdir()
        (node_dir / "nats.conf").write_text(on_loopback(text))
        servers.append(NatsServer(tmp_path / f"n{i}", config_file=node_dir / "nats.conf"))
    await asyncio.gather(*(s.start() for s in servers))
    try:
        urls = [re.sub(r"^\w+://127\.0\.0\.1:", "tls://localhost:", s.url) for s in servers]

        def role(r: str) -> tuple[str, str]:
            secret = secrets[f"{RELEASE}-nats-{r}"]
            return secret["user"], secret["password"]

        assert await plain_text_refused(servers[0].port, *role("ops"))
        # What the provisioning Job runs (`laneway ops provision`), as the ops user, with the
        # rendered settings; retried, as the command does, while the new cluster forms.
        settings_file = tmp_path / "settings.toml"
        settings_file.write_text(named("default", "ConfigMap", f"{RELEASE}-laneway-settings")["data"]["settings.toml"])
        user, password = role("ops")
        ops = NatsSettings(url=",".join(urls), user=user, password=password, tls_ca=str(ca))

        async def provisioned() -> bool:
            try:
                await provision_at(ops, StreamLimits(replicas=3), load_settings(settings_file))
            except Exception as exc:
                if not not_ready_yet(exc):
                    raise
                return False
            return True

        assert await eventually(provisioned, timeout=60, interval=0.5)
        user, password = role("bridge")
        nc = await nats.connect(urls, user=user, password=password, inbox_prefix=service_inbox(user), tls=tls)
        try:
            js = nc.jetstream()
            s = Subjects("lw")
            ack = await js.publish(s.req("interactive", "demo"), b"SEALED-BY-THE-CHART-0451")
            assert ack.stream == s.req_stream
        finally:
            await nc.close()
        # No role may read stream info; each node's store shows the replicas: all 3 hold LW_REQ.
        for server in servers:
            assert [p for p in (server.store_dir / "jetstream").rglob(s.req_stream) if p.is_dir()], server.url
        for r in ("broker", "worker", "ops"):
            user, password = role(r)
            other = await nats.connect(urls, user=user, password=password, tls=tls)
            await other.close()
        await check_tenant_is_fenced(urls, "demo", secrets[f"{RELEASE}-nats-tenants"]["tenant-demo"], role("ops"))
        with pytest.raises(nats.errors.Error, match="Authorization Violation"):
            await nats.connect(
                urls[0],
                user=role("bridge")[0],
                password="wrong",
                tls=tls,
                allow_reconnect=False,
                max_reconnect_attempts=0,
                connect_timeout=2,
            )
        await check_routes_refuse_a_server_without_the_password(tmp_path, conf, servers, route_ports, http_ports)
    finally:
        await asyncio.gather(*(s.stop() for s in servers))
    stored = [p for s in servers for p in (s.store_dir / "jetstream").rglob("*") if p.is_file()]
    assert stored, "JetStream stored nothing"
    assert not [p for p in stored if b"SEALED-BY-THE-CHART-0451" in p.read_bytes()], "stored in plaintext"
