"""Rendered objects against Kubernetes' own schemas: built-in kinds with
kubernetes-validate (strict, Kubernetes 1.31.0), custom resources with JSON Schemas made
from the CRDs in PGWORKER_CRD_DIR (strict: unknown fields are errors)."""

from __future__ import annotations

import copy
import os
import subprocess

import pytest
import yaml

from deploytools import (CUSTOM_KINDS, KUBERNETES_VERSION, ROOT, crd_dir, crd_validators, documents, render_scenario,
                         run, scenario_documents, scenario_names, strict_schema, tool,
                         validate_custom_resource)

pytestmark = pytest.mark.deploy

SCENARIOS = scenario_names()


def _kubernetes_validate():
    try:
        import kubernetes_validate
    except ImportError as exc:  # pragma: no cover - part of the test extra
        pytest.fail(f"kubernetes-validate is not installed (the test extra): {exc}")
    return kubernetes_validate


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_builtin_objects_validate_strictly(scenario):
    kv = _kubernetes_validate()
    builtin = [d for d in scenario_documents(scenario) if d["kind"] not in CUSTOM_KINDS]
    assert builtin
    errors = []
    for doc in builtin:
        try:
            kv.validate(doc, KUBERNETES_VERSION, strict=True)
        except kv.ValidationError as e:
            path = ".".join(map(str, e.path))
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {path}: {e.message}")
        except kv.SchemaNotFoundError as e:
            errors.append(f"{doc['kind']}/{doc['metadata']['name']}: {e.message}")
    assert not errors, "\n".join(errors)


def test_kubernetes_validate_cli(tmp_path):
    """The command line the docs give, on the scenario with every optional object."""
    manifest = tmp_path / "all.yaml"
    docs = [d for d in scenario_documents("all") if d["kind"] not in CUSTOM_KINDS]
    manifest.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    cli = tool("kubernetes-validate", "pip install kubernetes-validate (the test extra)")
    result = run([cli, "--strict", "--quiet", "-k", KUBERNETES_VERSION, str(manifest)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_kubernetes_validate_is_strict():
    """A typo in a Deployment is an error, not ignored (the check itself works)."""
    kv = _kubernetes_validate()
    deployment = copy.deepcopy(next(d for d in scenario_documents("default") if d["kind"] == "Deployment"))
    deployment["spec"]["template"]["spec"]["terminationGracePeriod"] = 45
    with pytest.raises(kv.ValidationError):
        kv.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_crd_directory_has_every_custom_kind():
    have = set(crd_validators())
    missing = {(v, k) for k, v in CUSTOM_KINDS.items()} - have
    assert not missing, f"{crd_dir()} lacks CRDs for {sorted(missing)}"


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_custom_resources_validate_against_their_crds(scenario):
    custom = [d for d in scenario_documents(scenario) if d["kind"] in CUSTOM_KINDS]
    errors = []
    for doc in custom:
        assert doc["apiVersion"] == CUSTOM_KINDS[doc["kind"]]
        errors += [f"{doc['kind']}/{doc['metadata']['name']}: {e}" for e in validate_custom_resource(doc)]
    assert not errors, "\n".join(errors)


def test_every_custom_kind_is_rendered_by_some_scenario():
    rendered = {d["kind"] for s in SCENARIOS for d in scenario_documents(s)}
    assert set(CUSTOM_KINDS) <= rendered


@pytest.mark.parametrize("kind, mutate", [
    ("ScaledObject", lambda d: d["spec"].update(minReplicas=0)),
    ("ScaledObject", lambda d: d["spec"]["triggers"][0]["metadata"].update(targetQueryValue=100)),
    ("TriggerAuthentication", lambda d: d["spec"]["secretTargetRef"][0].pop("key")),
    ("ServiceMonitor", lambda d: d["spec"]["endpoints"][0].update(scrapeInterval="30s")),
    ("PrometheusRule", lambda d: d["spec"]["groups"][0]["rules"][0].update(expression="up")),
])
def test_crd_schemas_are_strict(kind, mutate):
    """Unknown fields, wrong types and missing required fields are caught."""
    doc = copy.deepcopy(next(d for d in documents(render_scenario("all")) if d["kind"] == kind))
    assert not validate_custom_resource(doc)
    mutate(doc)
    assert validate_custom_resource(doc)


def test_strict_schema_transform():
    schema = strict_schema({
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string", "nullable": True}}},
            "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True, "properties": {"c": {}}},
            "port": {"x-kubernetes-int-or-string": True},
        },
    })
    assert schema["additionalProperties"] is False
    assert schema["properties"]["a"]["additionalProperties"] is False
    assert schema["properties"]["a"]["properties"]["b"]["type"] == ["string", "null"]
    assert "additionalProperties" not in schema["properties"]["free"]
    assert schema["properties"]["port"]["anyOf"] == [{"type": "integer"}, {"type": "string"}]


def test_missing_crds_skip_naming_the_variable_unless_strict(monkeypatch, tmp_path):
    """A user's clone has no CRD folder: the README's test command must pass there, so the
    tests that need the CRDs skip with a reason naming PGWORKER_CRD_DIR; CI (strict) fails."""
    monkeypatch.delenv("PGWORKER_STRICT", raising=False)
    for configured in (None, str(tmp_path)):  # unset, or a folder without CRD files
        if configured is None:
            monkeypatch.delenv("PGWORKER_CRD_DIR", raising=False)
        else:
            monkeypatch.setenv("PGWORKER_CRD_DIR", configured)
        with pytest.raises(pytest.skip.Exception, match="PGWORKER_CRD_DIR"):
            crd_dir()
    monkeypatch.setenv("PGWORKER_STRICT", "1")
    with pytest.raises(pytest.fail.Exception, match="PGWORKER_CRD_DIR"):
        crd_dir()


def test_ci_points_the_crd_folder_at_the_shared_data_beside_the_repository():
    """.ci/run exports PGWORKER_CRD_DIR as ../shared/k8s-crds (absolute), so CI validates the
    custom resources strictly whatever folder it runs in."""
    script = (ROOT / ".ci" / "run").read_text()
    [line] = [ln for ln in script.splitlines() if ln.startswith("export PGWORKER_CRD_DIR=")]
    value = subprocess.run(["bash", "-c", f"{line} && echo \"$PGWORKER_CRD_DIR\""], cwd=ROOT,
                           env={k: v for k, v in os.environ.items() if k != "PGWORKER_CRD_DIR"},
                           capture_output=True, text=True, check=True).stdout.strip()
    assert value == str(ROOT.parent / "shared" / "k8s-crds")
    assert script.index(line) < script.index('eval "${test_command}"')
