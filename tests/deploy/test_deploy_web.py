"""The chart's optional web console (helm/pgworker/templates/web-*.yaml): off by default,
and when on a Deployment running `pgworker web` with its credentials from a Secret,
probes that need neither credentials nor the database, a Service and an Ingress."""

from __future__ import annotations

import pytest

from deploytools import by_kind, documents, merge, render, scenario_documents, scenario_values

pytestmark = pytest.mark.deploy


def _web(docs, kind):
    found = [d for d in by_kind(docs, kind) if d["metadata"]["name"].endswith("-web")]
    assert len(found) == 1, [d["metadata"]["name"] for d in by_kind(docs, kind)]
    return found[0]


def test_the_console_is_off_by_default():
    for scenario in ("default", "all", "cronjob"):
        names = [d["metadata"]["name"] for d in scenario_documents(scenario)]
        assert not [n for n in names if n.endswith("-web")], scenario


def test_the_console_deployment_runs_pgworker_web_with_secrets_and_safe_probes():
    docs = scenario_documents("web")
    deployment = _web(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["metadata"]["labels"]["app.kubernetes.io/component"] == "web"
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert container["args"] == ["web", "--host", "0.0.0.0", "--port", "8080", "--root-path", "/pgworker",
                                 "--trace-url", "https://tempo.example.com/trace/{trace_id}"]
    from pgworker.cli import build_parser

    args = build_parser().parse_args(container["args"])
    assert (args.command, args.host, args.port, args.root_path) == ("web", "0.0.0.0", 8080, "/pgworker")
    env = {e["name"]: e for e in container["env"]}
    for name, key in (("PGWORKER_WEB_USERS", "users"), ("PGWORKER_WEB_TOKENS", "tokens"),
                      ("PGWORKER_WEB_SECRET", "csrf-secret")):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "pgworker-web"
        assert env[name]["valueFrom"]["secretKeyRef"]["key"] == key
    assert env["PGWORKER_APP"]["value"] == "acme.jobs:app"
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/pgworker/static/console.css", "port": "web"}
    # the worker's selector must not pick the console's pods (nor the other way round)
    worker = next(d for d in by_kind(docs, "Deployment") if not d["metadata"]["name"].endswith("-web"))
    assert worker["spec"]["selector"]["matchLabels"] != deployment["spec"]["selector"]["matchLabels"]
    service = _web(docs, "Service")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "web"
    ingress = _web(docs, "Ingress")
    rule = ingress["spec"]["rules"][0]
    assert rule["host"] == "jobs.example.com" and ingress["spec"]["ingressClassName"] == "nginx"
    assert rule["http"]["paths"][0]["path"] == "/pgworker"
    assert rule["http"]["paths"][0]["backend"]["service"]["name"] == service["metadata"]["name"]


def test_read_only_and_without_an_ingress():
    docs = documents(render(merge(scenario_values("web"), {"web": {"readOnly": True, "ingress": {"enabled": False},
                                                                   "auth": {"tokensKey": ""}}})))
    container = _web(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "--read-only" in container["args"]
    assert "PGWORKER_WEB_TOKENS" not in {e["name"] for e in container["env"]}
    assert not [d for d in by_kind(docs, "Ingress")]


def test_the_console_without_credentials_fails_the_install():
    from deploytools import helm

    with pytest.raises(helm().HelmError, match="web.auth.existingSecret"):
        render(merge(scenario_values("default"), {"web": {"enabled": True}}))
    with pytest.raises(helm().HelmError, match="web.ingress.host"):
        render(merge(scenario_values("web"), {"web": {"ingress": {"host": ""}}}))
