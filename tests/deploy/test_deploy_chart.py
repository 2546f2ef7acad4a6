"""The Helm chart through Helm itself: strict lint, rendering of every scenario of
helm/pgworker/ci/, the values schema, and what the rendered objects must say."""

from __future__ import annotations

import json
import re
import shlex

import pytest
import yaml

from deploytools import (ALERTS, CHART, CHART_ALERTS, CHART_DASHBOARD, DASHBOARD, KUBERNETES_VERSION,
                         ROOT, by_kind, documents, helm, merge, one, pod_specs, render,
                         render_scenario, scenario_documents, scenario_names, scenario_values)

pytestmark = pytest.mark.deploy

SCENARIOS = scenario_names()
REQUIRED = scenario_values("default")
STANDARD_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version",
                   "app.kubernetes.io/component", "app.kubernetes.io/managed-by", "app.kubernetes.io/part-of")

#: The kinds each scenario renders (a ServiceAccount and the migration hook Job unless noted).
EXPECTED_KINDS = {
    "default": {"ServiceAccount", "Service", "Deployment", "Job"},
    "cronjob": {"ServiceAccount", "CronJob", "Job", "PrometheusRule"},
    "keda-scaledobject": {"ServiceAccount", "Service", "Deployment", "Job", "ScaledObject",
                          "TriggerAuthentication"},
    "keda-scaledjob": {"ServiceAccount", "Job", "ScaledJob", "TriggerAuthentication"},
    "all": {"ServiceAccount", "Service", "Deployment", "Job", "ScaledObject", "TriggerAuthentication",
            "ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap", "CronJob"},  # the prune CronJob
    "no-migrations": {"Service", "Deployment"},
    "web": {"ServiceAccount", "Service", "Deployment", "Job", "Ingress"},
}


def test_every_scenario_has_expectations():
    assert set(SCENARIOS) == set(EXPECTED_KINDS), "add the new helm/pgworker/ci scenario to EXPECTED_KINDS"


def _render_error(values: dict) -> str:
    h = helm()
    with pytest.raises(h.HelmError) as info:
        render(values)
    return str(info.value)


# ---- helm lint --strict --------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_lint_strict(scenario):
    report = helm().lint(str(CHART), scenario_values(scenario), strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # warnings and errors
    assert not report["errors"] and not problems, json.dumps(report, indent=2)


def test_lint_fails_without_required_values():
    report = helm().lint(str(CHART), None, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    text = "\n".join(report["errors"])
    assert "/database/existingSecret" in text and "/image/repository" in text, text


# ---- values.schema.json --------------------------------------------------------------


def _schema_error(values: dict) -> str:
    h = helm()
    with h.Chart.load(str(CHART)) as chart:
        with pytest.raises(h.HelmValuesError) as info:
            chart.validate_schema(values)
    return str(info.value)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_schema_accepts_scenarios(scenario):
    import jsonschema

    with helm().Chart.load(str(CHART)) as chart:
        chart.validate_schema(scenario_values(scenario))
        merged = chart.merge_values(scenario_values(scenario))
    jsonschema.Draft7Validator(json.loads((CHART / "values.schema.json").read_text())).validate(merged)


def test_schema_is_valid_draft7():
    import jsonschema

    jsonschema.Draft7Validator.check_schema(json.loads((CHART / "values.schema.json").read_text()))


def test_schema_rejects_a_bad_mode():
    assert "/mode" in _schema_error(merge(REQUIRED, {"mode": "daemonset"}))


def test_schema_rejects_a_missing_dsn_secret():
    # null deletes a key in Helm's value coalescing: the secret name is then missing
    assert "existingSecret" in _schema_error(merge(REQUIRED, {"database": {"existingSecret": None}}))
    assert "existingSecret" in _schema_error(merge(REQUIRED, {"database": {"existingSecret": ""}}))
    assert "dsnKey" in _schema_error(merge(REQUIRED, {"database": {"dsnKey": ""}}))


@pytest.mark.parametrize("override, where", [
    ({"worker": {"shutdownGraceSeconds": -1}}, "/worker/shutdownGraceSeconds"),
    ({"worker": {"concurrency": 0}}, "/worker/concurrency"),
    ({"worker": {"concurrency": "4"}}, "/worker/concurrency"),
    ({"worker": {"queues": ["a,b"]}}, "/worker/queues"),
    ({"worker": {"queues": ["NULL"]}}, "/worker/queues"),
    ({"database": {"schema": 'we"ird'}}, "/database/schema"),
    ({"database": {"schema": "pg_jobs"}}, "/database/schema"),
    ({"database": {"dsn": "postgresql://u:p@db/app"}}, "/database"),
    ({"cronjob": {"maxDurationSeconds": 0}}, "/cronjob/maxDurationSeconds"),
    ({"keda": {"scaledObject": {"minReplicaCount": -1}}}, "/keda/scaledObject/minReplicaCount"),
    ({"keda": {"scaledObject": {"targetQueryValue": 0}}}, "/keda/scaledObject/targetQueryValue"),
    ({"otel": {"protocol": "grpc"}}, "/otel/protocol"),
    ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
    ({"replicas": 3}, "replicas"),
])
def test_schema_rejects_bad_values(override, where):
    assert where in _schema_error(merge(REQUIRED, override))


def _strings(node):
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, list):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node


def test_values_never_hold_a_dsn():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    dsn_like = [s for s in _strings(values) if re.search(r"postgres(ql)?://|host=|password=", s, flags=re.I)]
    assert not dsn_like


# ---- rendering -------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_render_kinds(scenario):
    kinds = {d["kind"] for d in scenario_documents(scenario)}
    assert kinds == EXPECTED_KINDS[scenario]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_standard_labels(scenario):
    for doc in scenario_documents(scenario):
        labels = doc["metadata"].get("labels", {})
        missing = [k for k in STANDARD_LABELS if k not in labels]
        assert not missing, f"{doc['kind']} {doc['metadata']['name']} lacks {missing}"
        assert labels["app.kubernetes.io/part-of"] == "pgworker"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"


#: The containers that act as the schema's owner: they take database.ownerDsnKey when set.
OWNER_CONTAINERS = ("migrate", "prune")


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_dsn_only_from_a_secret(scenario):
    values = helm_values(scenario)
    db = values["database"]
    for doc in scenario_documents(scenario):
        for pod in pod_specs(doc):
            for container in pod["containers"]:
                env = {e["name"]: e for e in container.get("env", [])}
                dsn = env["PGWORKER_DSN"]
                assert "value" not in dsn
                if container["name"] in OWNER_CONTAINERS:  # the owner's DSN, else the workers'
                    want = {"name": db["ownerDsnSecret"] or db["existingSecret"],
                            "key": db["ownerDsnKey"] or db["dsnKey"]}
                else:
                    want = {"name": db["existingSecret"], "key": db["dsnKey"]}
                assert dsn["valueFrom"]["secretKeyRef"] == want, (scenario, container["name"])
                if "PGWORKER_LISTEN_DSN" in env:
                    assert "secretKeyRef" in env["PGWORKER_LISTEN_DSN"]["valueFrom"]


def helm_values(scenario: str) -> dict:
    with helm().Chart.load(str(CHART)) as chart:
        return chart.merge_values(scenario_values(scenario))


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_pod_security(scenario):
    values = helm_values(scenario)
    workloads = [d for d in scenario_documents(scenario) if list(pod_specs(d))]
    assert workloads
    for doc in workloads:
        for pod in pod_specs(doc):
            psc = pod["securityContext"]
            assert psc["runAsNonRoot"] is True and isinstance(psc["runAsUser"], int) and psc["runAsUser"] > 0
            assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
            assert pod["automountServiceAccountToken"] is False
            volumes = {v["name"]: v for v in pod["volumes"]}
            for c in pod["containers"]:
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True
                assert sc["allowPrivilegeEscalation"] is False
                assert sc["capabilities"] == {"drop": ["ALL"]}
                assert sc["runAsNonRoot"] is True and isinstance(sc["runAsUser"], int)
                mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
                assert all("emptyDir" in volumes[name] for name in mounts.values())
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                if c["name"] == "worker":
                    assert env["PROMETHEUS_MULTIPROC_DIR"] == values["worker"]["multiprocDir"]
                    assert env["PROMETHEUS_MULTIPROC_DIR"] in mounts


def _grace(env: dict) -> int:
    return int(env["PGWORKER_SHUTDOWN_GRACE_SECONDS"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_termination_grace_longer_than_shutdown_grace(scenario):
    for doc in scenario_documents(scenario):
        for pod in pod_specs(doc):
            for c in pod["containers"]:
                env = {e["name"]: e.get("value") for e in c.get("env", [])}
                if "PGWORKER_SHUTDOWN_GRACE_SECONDS" in env:
                    assert pod["terminationGracePeriodSeconds"] > _grace(env)


def test_termination_grace_is_computed():
    deployment = one(scenario_documents("default"), "Deployment")
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 30 + 15


@pytest.mark.parametrize("tgps", [30, 10])
def test_termination_grace_not_longer_fails(tgps):
    message = _render_error(merge(REQUIRED, {"worker": {"shutdownGraceSeconds": 30,
                                                        "terminationGracePeriodSeconds": tgps}}))
    assert "must be longer than worker.shutdownGraceSeconds" in message


def test_deployment_probes_and_port():
    deployment = one(scenario_documents("default"), "Deployment")
    c = deployment["spec"]["template"]["spec"]["containers"][0]
    from pgworker.config import METRICS_PORT

    assert c["ports"] == [{"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"}]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert c["args"] == ["run"]
    assert c["resources"]["requests"] and c["resources"]["limits"]
    service = one(scenario_documents("default"), "Service")
    assert service["spec"]["ports"][0]["name"] == "metrics"
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert deployment["spec"]["replicas"] == 1


def test_scaled_deployment_leaves_replicas_to_keda():
    deployment = one(scenario_documents("keda-scaledobject"), "Deployment")
    assert "replicas" not in deployment["spec"]


def test_cronjob():
    values = helm_values("cronjob")
    cron = one(scenario_documents("cronjob"), "CronJob")
    spec = cron["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["schedule"] == "0 * * * *" and spec["timeZone"] == "Europe/Berlin"
    assert spec["startingDeadlineSeconds"] == 300
    assert spec["successfulJobsHistoryLimit"] == 3 and spec["failedJobsHistoryLimit"] == 3
    job = spec["jobTemplate"]["spec"]
    assert job["backoffLimit"] == 1
    grace, max_duration = values["worker"]["shutdownGraceSeconds"], values["cronjob"]["maxDurationSeconds"]
    assert job["activeDeadlineSeconds"] == max_duration + grace + values["cronjob"]["deadlineMarginSeconds"]
    assert job["activeDeadlineSeconds"] > max_duration + grace
    assert {"action": "FailJob", "onExitCodes": {"containerName": "worker", "operator": "In", "values": [75]}} \
        in job["podFailurePolicy"]["rules"]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    c = pod["containers"][0]
    assert c["args"] == ["run", "--drain", "--max-duration", f"{max_duration}s",
                         "--pushgateway-url", values["cronjob"]["pushgatewayUrl"]]
    # drain runs serve no HTTP: no probes, no ports (and nothing that could touch the database)
    assert not {"livenessProbe", "readinessProbe", "startupProbe", "ports"} & set(c)


def test_cronjob_names_fit_kubernetes_limit_with_a_long_release_name():
    """Kubernetes refuses a CronJob whose name is over 52 characters (the Jobs it creates
    append 11); the fullname is cut at 63, so both CronJobs cut their own names."""
    long_name = "a-release-name-of-exactly-sixty-three-characters-for-this-test1"
    assert len(long_name) == 63
    values = merge(scenario_values("cronjob"), {"fullnameOverride": long_name, "prune": {"enabled": True}})
    crons = by_kind(documents(render(values)), "CronJob")
    assert len(crons) == 2, [c["metadata"]["name"] for c in crons]
    for cron in crons:
        name = cron["metadata"]["name"]
        assert len(name) <= 52 and not name.endswith("-"), name


def _documented_exit_codes() -> dict[int, str]:
    """{code: meaning} of the exit-code table of docs/deploy.md (which
    tests/acceptance/test_exit_codes.py checks against the code)."""
    text = (ROOT / "docs" / "deploy.md").read_text()
    table = re.search(r"<!-- exit-codes -->\n(.*?)<!-- /exit-codes -->", text, re.S)
    assert table, "docs/deploy.md lost its <!-- exit-codes --> table"
    return {int(c): m.strip() for c, m in re.findall(r"^\|\s*(\d+)\s*\|(.*)\|\s*$", table[1], re.M)}


@pytest.mark.parametrize("scenario, kind", [("cronjob", "CronJob"), ("keda-scaledjob", "ScaledJob")])
def test_the_pod_failure_policy_acts_on_documented_exit_codes(scenario, kind):
    """The exit codes a drain Job's podFailurePolicy acts on are codes `pgworker run`
    returns, with the meaning the policy assumes: FailJob for 75 alone (the deadline with
    due work left: the next run continues); every other failure (1, 2, 130, 143 after a
    signal, 137 for a SIGKILL) is retried within backoffLimit."""
    doc = one(scenario_documents(scenario), kind)
    job = doc["spec"]["jobTemplate"]["spec"] if kind == "CronJob" else doc["spec"]["jobTargetRef"]
    rules = job["podFailurePolicy"]["rules"]
    table = _documented_exit_codes()
    acted_on = {code for r in rules if "onExitCodes" in r for code in r["onExitCodes"]["values"]}
    assert acted_on <= set(table), f"podFailurePolicy acts on {sorted(acted_on - set(table))}, not in docs/deploy.md"
    failing = [r["onExitCodes"] for r in rules if r["action"] == "FailJob" and "onExitCodes" in r]
    assert failing == [{"containerName": "worker", "operator": "In", "values": [75]}]
    assert "--max-duration" in table[75] and "due jobs left" in table[75]
    assert {128 + 15, 128 + 2} <= set(table)  # a drain run stopped by a signal: retried, as any failure


def test_cronjob_timezone_optional():
    cron = one(documents(render(merge(REQUIRED, {"mode": "cronjob"}))), "CronJob")
    assert "timeZone" not in cron["spec"]
    assert "--pushgateway-url" not in cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("deadline", [600 + 30, 100])
def test_cronjob_deadline_not_longer_fails(deadline):
    message = _render_error(merge(REQUIRED, {"mode": "cronjob", "cronjob": {
        "maxDurationSeconds": 600, "activeDeadlineSeconds": deadline}}))
    assert "must be longer than cronjob.maxDurationSeconds + worker.shutdownGraceSeconds" in message


def test_cronjob_deadline_explicit():
    cron = one(documents(render(merge(REQUIRED, {"mode": "cronjob", "cronjob": {
        "maxDurationSeconds": 600, "activeDeadlineSeconds": 631}}))), "CronJob")
    assert cron["spec"]["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 631


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_container_args_parse_with_the_pgworker_cli(scenario):
    """Every command line the chart renders is one `pgworker` accepts."""
    from pgworker.cli import build_parser

    parser = build_parser()
    for doc in scenario_documents(scenario):
        for pod in pod_specs(doc):
            for c in pod["containers"]:
                args = parser.parse_args(c["args"])
                assert args.command in ("run", "migrate", "prune", "web"), shlex.join(c["args"])


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_environment_names_are_pgworkers(scenario):
    """Every PGWORKER_* variable the chart sets is one pgworker reads."""
    source = "\n".join(p.read_text() for p in (ROOT / "pgworker").rglob("*.py"))
    known = set(re.findall(r"PGWORKER_[A-Z0-9_]+", source))
    from pgworker.config import env_var_names

    known |= set(env_var_names().values())
    for doc in scenario_documents(scenario):
        for pod in pod_specs(doc):
            for c in pod["containers"]:
                names = {e["name"] for e in c.get("env", []) if e["name"].startswith("PGWORKER_")}
                assert names <= known, f"unknown settings: {sorted(names - known)}"


def test_chart_defaults_match_pgworker_defaults():
    from pgworker import config

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["worker"]["metricsPort"] == config.METRICS_PORT
    assert values["service"]["port"] == config.METRICS_PORT
    assert values["worker"]["shutdownGraceSeconds"] == config.SHUTDOWN_GRACE_SECONDS
    assert values["database"]["schema"] == config.DEFAULT_SCHEMA


def test_migration_hook():
    job = one(scenario_documents("default"), "Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert set(annotations["helm.sh/hook-delete-policy"].split(",")) == {"before-hook-creation", "hook-succeeded"}
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"] == ["migrate"]
    assert pod["restartPolicy"] == "Never"
    # the release's ServiceAccount does not exist yet when a pre-install hook runs
    assert "serviceAccountName" not in pod
    assert job["metadata"]["labels"]["app.kubernetes.io/component"] == "migration"
    assert not by_kind(scenario_documents("no-migrations"), "Job")


def _owner_dsn(container: dict) -> dict:
    [dsn] = [e for e in container["env"] if e["name"] == "PGWORKER_DSN"]
    return dsn["valueFrom"]["secretKeyRef"]


def test_migrations_run_with_the_owners_dsn_and_fall_back_to_the_workers():
    """A least-privilege worker role cannot own the schema: the hook takes the owner's
    DSN when database.ownerDsnKey is given (its Secret defaulting to existingSecret), and
    the workers' DSN when it is not; the workers never get the owner's."""
    def migrate_and_worker(database):
        docs = documents(render(merge(REQUIRED, {"database": database})))
        [hook] = by_kind(docs, "Job")
        worker = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
        return _owner_dsn(hook["spec"]["template"]["spec"]["containers"][0]), _owner_dsn(worker)

    workers = {"name": "pgworker-database", "key": "dsn"}
    assert migrate_and_worker({}) == (workers, workers)
    assert migrate_and_worker({"ownerDsnKey": "owner-dsn"}) == (
        {"name": "pgworker-database", "key": "owner-dsn"}, workers)
    assert migrate_and_worker({"ownerDsnKey": "dsn", "ownerDsnSecret": "pgworker-owner"}) == (
        {"name": "pgworker-owner", "key": "dsn"}, workers)


def test_the_prune_cronjob_is_off_by_default_and_runs_pgworker_prune_as_the_owner():
    from pgworker.cli import build_parser

    for scenario in ("default", "cronjob", "keda-scaledjob", "no-migrations"):
        assert not [d for d in scenario_documents(scenario)
                    if d["metadata"]["labels"]["app.kubernetes.io/component"] == "prune"]
    values = helm_values("all")
    [cron] = [d for d in by_kind(scenario_documents("all"), "CronJob")
              if d["metadata"]["labels"]["app.kubernetes.io/component"] == "prune"]
    assert len(cron["metadata"]["name"]) <= 52  # Kubernetes' limit for a CronJob's name
    assert cron["spec"]["schedule"] == "30 2 * * *" and cron["spec"]["timeZone"] == "Europe/Berlin"
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    job = cron["spec"]["jobTemplate"]["spec"]
    pod = job["template"]["spec"]
    assert pod["restartPolicy"] == "Never" and job["backoffLimit"] == values["prune"]["backoffLimit"]
    [c] = pod["containers"]
    # the command line pgworker itself reads: the values' retention, in seconds, and batch
    args = build_parser().parse_args(c["args"])
    assert (args.command, args.older_than, args.batch) == ("prune", 259200.0, 5000)
    assert _owner_dsn(c) == {"name": "pgworker-database-owner", "key": "owner-dsn"}
    # the workers of that scenario do not prune
    worker = one(scenario_documents("all"), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "PGWORKER_PRUNE", "value": "false"} in worker["env"]


@pytest.mark.parametrize("override, where", [
    ({"prune": {"olderThanSeconds": 0}}, "/prune/olderThanSeconds"),
    ({"prune": {"batch": 0}}, "/prune/batch"),
    ({"prune": {"retention": 7}}, "/prune"),
    ({"database": {"ownerDsnKey": "no spaces"}}, "/database/ownerDsnKey"),
])
def test_schema_rejects_bad_prune_and_owner_values(override, where):
    assert where in _schema_error(merge(REQUIRED, override))


# ---- KEDA --------------------------------------------------------------------------------

CLAIM_INDEX = re.compile(r"CREATE INDEX jobs_claim_idx ON \{schema\}\.jobs \(queue, priority DESC, run_at, id\)"
                         r"\s+WHERE (?P<predicate>[^;]+);")


def test_keda_query_matches_the_claim_index():
    migration = (ROOT / "pgworker" / "sql" / "migrations" / "0001_initial.sql").read_text()
    predicate = CLAIM_INDEX.search(migration)
    assert predicate, "jobs_claim_idx changed: update the KEDA query in helm/pgworker/templates/_helpers.tpl"
    scaled = one(scenario_documents("keda-scaledobject"), "ScaledObject")
    query = scaled["spec"]["triggers"][0]["metadata"]["query"]
    # due jobs outside paused queues (the claim index's predicate), plus running jobs
    # (tests/deploy/test_deploy_keda_query.py runs it against PostgreSQL)
    assert query == ('SELECT (SELECT count(*) FROM "jobs".jobs WHERE queue = ANY(\'{default,emails}\'::text[]) '
                     "AND state = 'pending' AND NOT blocked AND run_at <= now() "
                     'AND queue NOT IN (SELECT name FROM "jobs".queues WHERE paused_at IS NOT NULL)) '
                     '+ (SELECT count(*) FROM "jobs".jobs WHERE queue = ANY(\'{default,emails}\'::text[]) '
                     "AND state = 'running')")
    assert predicate["predicate"].strip() in query


@pytest.mark.parametrize("scenario, kind", [("keda-scaledobject", "ScaledObject"), ("keda-scaledjob", "ScaledJob")])
def test_keda_trigger(scenario, kind):
    docs = scenario_documents(scenario)
    scaled = one(docs, kind)
    auth = one(docs, "TriggerAuthentication")
    values = helm_values(scenario)
    trigger = scaled["spec"]["triggers"][0]
    assert trigger["type"] == "postgresql"
    assert all(isinstance(v, str) for v in trigger["metadata"].values()), trigger["metadata"]
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    ref = auth["spec"]["secretTargetRef"]
    assert ref == [{"parameter": "connection", "name": values["database"]["existingSecret"],
                    "key": values["keda"]["connectionSecretKey"] or values["database"]["dsnKey"]}]
    if kind == "ScaledObject":
        assert scaled["spec"]["minReplicaCount"] == 0
        assert scaled["spec"]["scaleTargetRef"]["name"] == one(docs, "Deployment")["metadata"]["name"]
    else:
        job = scaled["spec"]["jobTargetRef"]
        args = job["template"]["spec"]["containers"][0]["args"]
        assert args[:2] == ["run", "--drain"] and "--max-duration" in args
        assert job["activeDeadlineSeconds"] > values["cronjob"]["maxDurationSeconds"] + values["worker"]["shutdownGraceSeconds"]
        assert not by_kind(docs, "CronJob")


@pytest.mark.parametrize("override, message", [
    ({"mode": "cronjob", "keda": {"scaledObject": {"enabled": True}}, "worker": {"queues": ["a"]}}, "needs mode: deployment"),
    ({"keda": {"scaledJob": {"enabled": True}}, "worker": {"queues": ["a"]}}, "needs mode: cronjob"),
    ({"keda": {"scaledObject": {"enabled": True}}}, "set worker.queues"),
    ({"mode": "cronjob", "serviceMonitor": {"enabled": True}}, "need mode: deployment"),
    ({"mode": "cronjob", "prometheusRule": {"enabled": True}}, "set cronjob.pushgatewayUrl"),
])
def test_inconsistent_values_fail(override, message):
    assert message in _render_error(merge(REQUIRED, override))


# ---- monitoring objects ------------------------------------------------------------------


def test_monitors_select_the_workers():
    docs = scenario_documents("all")
    service = one(docs, "Service")
    deployment = one(docs, "Deployment")
    sm = one(docs, "ServiceMonitor")
    pm = one(docs, "PodMonitor")
    assert sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_chart_copies_are_byte_identical():
    for source, copy in ((DASHBOARD, CHART_DASHBOARD), (ALERTS, CHART_ALERTS)):
        assert copy.read_bytes() == source.read_bytes(), (
            f"{copy.relative_to(ROOT)} differs from {source.relative_to(ROOT)}, its source: "
            f"cp {source.relative_to(ROOT)} {copy.relative_to(ROOT)}")


@pytest.mark.parametrize("labels", [{}, {"grafanaDashboard": {"labelKey": "dashboards", "labelValue": "pgworker"}}])
def test_dashboard_configmap(labels):
    values = merge(REQUIRED, merge({"grafanaDashboard": {"enabled": True}}, labels))
    cm = one(documents(render(values)), "ConfigMap")
    key = labels.get("grafanaDashboard", {}).get("labelKey", "grafana_dashboard")
    value = labels.get("grafanaDashboard", {}).get("labelValue", "1")
    assert cm["metadata"]["labels"][key] == value
    assert cm["data"]["pgworker-dashboard.json"] == DASHBOARD.read_text().rstrip("\n")
    assert json.loads(cm["data"]["pgworker-dashboard.json"]) == json.loads(DASHBOARD.read_text())


def test_crd_backed_objects_are_off_by_default():
    for scenario in ("default", "no-migrations"):
        kinds = {d["kind"] for d in scenario_documents(scenario)}
        assert not kinds & {"ScaledObject", "ScaledJob", "TriggerAuthentication", "ServiceMonitor",
                            "PodMonitor", "PrometheusRule", "ConfigMap"}


#: The groups of grafana/alerts.yaml each mode renders.
RULE_GROUPS = {
    "all": ["pgworker-queues", "pgworker-leases", "pgworker-loops"],  # KEDA ScaledObject: workers may be at zero
    "cronjob": ["pgworker-drain"],
}


@pytest.mark.parametrize("scenario", sorted(RULE_GROUPS))
def test_prometheusrule_is_alerts_yaml(scenario):
    rule = one(scenario_documents(scenario), "PrometheusRule")
    source = yaml.safe_load(ALERTS.read_text())["groups"]
    expected = [g for g in source if g["name"] in RULE_GROUPS[scenario]]
    base = helm_values(scenario)["prometheusRule"]["runbookBaseUrl"]
    if base:
        text = yaml.safe_dump(expected).replace("https://github.com/pgworker/pgworker/blob/main/docs/deploy.md", base)
        expected = yaml.safe_load(text)
    assert rule["spec"]["groups"] == expected


def test_prometheusrule_without_keda_has_the_workers_group():
    rule = one(documents(render(merge(REQUIRED, {"prometheusRule": {"enabled": True}}))), "PrometheusRule")
    source = yaml.safe_load(ALERTS.read_text())["groups"]
    assert rule["spec"]["groups"] == [g for g in source if g["name"] != "pgworker-drain"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_notes_render(scenario):
    notes = render_scenario(scenario)["pgworker/templates/NOTES.txt"]
    assert "docs/deploy.md" in notes


@pytest.mark.parametrize("image, says", [
    ({}, "Image: registry.example.com/acme/jobs-worker:{appVersion}.\n"),  # the image of that version
    ({"tag": "1.4.0"}, "Image: registry.example.com/acme/jobs-worker:1.4.0 (it holds the pgworker its build "
                       "installed: `pgworker --version` in a pod prints it).\n"),
])
def test_notes_say_the_pgworker_version_and_the_image_apart(image, says):
    """NOTES.txt once printed the image tag as pgworker's version ("pgworker 1.4.0", the
    version of the user's own image): the chart's pgworker version is its appVersion."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    notes = render(merge(REQUIRED, {"image": image}))["pgworker/templates/NOTES.txt"]
    assert notes.startswith(f"Chart pgworker-{chart['version']} (made for pgworker {chart['appVersion']}) is "
                            "installed as release jobs in namespace work.\n")
    assert says.format(**chart) in notes
    assert "pgworker 1.4.0" not in notes


def test_probes_can_be_turned_off():
    values = merge(REQUIRED, {"deployment": {"livenessProbe": None, "readinessProbe": None}})
    c = one(documents(render(values)), "Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "livenessProbe" not in c and "readinessProbe" not in c


@pytest.mark.parametrize("retention", [None, {"enabled": True, "intervalSeconds": 30, "succeededSeconds": 3600,
                                              "cancelledSeconds": None, "deadSeconds": 2592000,
                                              "queueEventsSeconds": 86400}])
def test_retention_values_reach_the_worker_as_pgworker_reads_them(retention):
    """The chart's retention values become PGWORKER_* variables that pgworker's own
    settings parser reads back as the same seconds (null: kept for good)."""
    from pgworker import Settings, config

    values = merge(REQUIRED, {"worker": {"retention": retention}}) if retention else REQUIRED
    want = retention or yaml.safe_load((CHART / "values.yaml").read_text())["worker"]["retention"]
    [deployment] = by_kind(documents(render(values)), "Deployment")
    [container] = [c for c in deployment["spec"]["template"]["spec"]["containers"]]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    settings = Settings.from_env(environ={**env, "PGWORKER_DSN": "postgresql://x@h/db"})
    assert settings.prune is want["enabled"]
    assert settings.prune_interval_seconds == want["intervalSeconds"]
    assert settings.retention_succeeded_seconds == want["succeededSeconds"]
    assert settings.retention_cancelled_seconds == want["cancelledSeconds"]
    assert settings.retention_dead_seconds == want["deadSeconds"]
    assert settings.retention_queue_events_seconds == want["queueEventsSeconds"]
    if retention is None:  # the chart's defaults are pgworker's
        assert (want["succeededSeconds"], want["cancelledSeconds"], want["deadSeconds"]) == (
            config.RETENTION_SUCCEEDED_SECONDS, config.RETENTION_CANCELLED_SECONDS, None)
