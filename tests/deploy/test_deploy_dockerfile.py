"""The Dockerfile through hadolint, and the properties the chart relies on. The image is
built and run by test_deploy_image.py (buildah; no Docker engine runs here)."""

from __future__ import annotations

import json
import re
import shlex

import pytest

from deploytools import CHART, DOCKERFILE, ROOT, hadolint, pod_specs, run, scenario_documents, scenario_names

pytestmark = pytest.mark.deploy


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage (ARGs before the first FROM left out)."""
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions():
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _global_args() -> dict[str, str]:
    """The ARGs before the first FROM, with their defaults."""
    out = {}
    for word, rest in _instructions():
        if word == "FROM":
            break
        if word == "ARG":
            name, _, default = rest.partition("=")
            out[name] = default
    return out


def test_hadolint_warning_threshold():
    result = run([hadolint(), "--no-color", "--failure-threshold", "warning", str(DOCKERFILE)], cwd=ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_reports_nothing_at_all():
    result = run([hadolint(), "--no-fail", "--format", "json", str(DOCKERFILE)], cwd=ROOT)
    assert json.loads(result.stdout or "[]") == []


def test_multi_stage_on_one_base_defaulting_to_the_pinned_slim_image():
    """Both stages on BASE_IMAGE, whose default is the official image users pull (CI
    passes a debootstrapped Debian bookworm instead: test_deploy_image.py)."""
    stages = _stages()
    assert len(stages) == 2
    for stage in stages:
        assert stage[0][1].split()[0] == "${BASE_IMAGE}"
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm", _global_args()["BASE_IMAGE"])
    assert stages[0][0][1].endswith("AS builder")


def test_venv_built_in_builder_and_copied():
    builder, final = _stages()
    # python3: the official image has it beside `python`, Debian's python3 has only it
    assert any(w == "RUN" and "python3 -m venv /opt/venv" in a for w, a in builder)
    # wheels only: no dependency is ever compiled (there is no compiler to do it)
    assert any(w == "RUN" and re.search(r'pip install .*--only-binary=:all: "\./\[otlp,web\]"', a)
               for w, a in builder)
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in final
    assert not any(w == "RUN" and "pip install" in a for w, a in final)


def _env(stage: list[tuple[str, str]]) -> dict[str, str]:
    return dict(item.split("=", 1) for w, a in stage if w == "ENV" for item in shlex.split(a))


def test_runtime_user_entrypoint_and_environment():
    _, final = _stages()
    user = [a for w, a in final if w == "USER"]
    assert user and re.fullmatch(r"\d+(:\d+)?", user[-1]) and not user[-1].startswith("0")
    entrypoint = [a for w, a in final if w == "ENTRYPOINT"]
    assert entrypoint and json.loads(entrypoint[-1]) == ["tini", "--", "pgworker"]
    cmd = [a for w, a in final if w == "CMD"]
    assert cmd and json.loads(cmd[-1]) == ["run"]
    assert any(w == "RUN" and re.search(r"apt-get install .*tini=\S+", a) for w, a in final)
    assert _env(final)["PROMETHEUS_MULTIPROC_DIR"] == "/tmp/pgworker-metrics"
    from pgworker.config import METRICS_PORT

    assert ("EXPOSE", f"{METRICS_PORT} 8080") in final  # /metrics; the console (`pgworker web`)


def test_image_matches_the_chart():
    import yaml

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    _, final = _stages()
    uid = [a for w, a in final if w == "USER"][-1].split(":")[0]
    assert values["podSecurityContext"]["runAsUser"] == int(uid) == values["securityContext"]["runAsUser"]
    assert values["worker"]["multiprocDir"] == _env(final)["PROMETHEUS_MULTIPROC_DIR"]


def test_dockerignore_keeps_the_context_small():
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "**" in ignore and "!pgworker/" in ignore and "!pyproject.toml" in ignore


@pytest.mark.parametrize("scenario", scenario_names())
def test_chart_runs_the_image_entrypoint(scenario):
    """The chart gives every container only `args` (a pgworker command): what runs is the
    image's ENTRYPOINT, tini then pgworker, the same that test_deploy_image.py runs."""
    import argparse

    from pgworker.cli.parser import build_parser

    commands = {name for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction)
                for name in action.choices}
    for doc in scenario_documents(scenario):
        for spec in pod_specs(doc):
            for container in spec.get("initContainers", []) + spec["containers"]:
                where = f"{doc['kind']}/{doc['metadata']['name']} container {container['name']}"
                assert "command" not in container, where
                assert container["args"][0] in commands, where
