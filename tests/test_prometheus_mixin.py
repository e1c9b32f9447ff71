"""The Prometheus mixin (deploy/prometheus/): generated from `replag.prometheus_mixin`,
checked and unit-tested by a real promtool, reading only metrics replag exports, every
alert tested firing and resolving, with a runbook section and a dashboard panel.

promtool comes from `REPLAG_PROMTOOL` (`.ci/run` builds it once per machine) or PATH;
the promtool tests skip, saying so, without it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from replag.prometheus_mixin import (
    ALERTING_FILE,
    DOCS_SITE,
    RECORDING_FILE,
    MixinParams,
    generate,
)
from tests.helpers.metric_names import exported_metrics, panels

ROOT = Path(__file__).resolve().parent.parent
MIXIN = ROOT / "deploy" / "prometheus"
RULE_FILES = [MIXIN / RECORDING_FILE, MIXIN / ALERTING_FILE]
TESTS = sorted((MIXIN / "tests").glob("*.yml"))
DASHBOARD = ROOT / "grafana" / "replag-dashboard.json"
RUNBOOK = ROOT / "docs" / "runbooks" / "prometheus-alerts.md"
# A raw metric in PromQL: not a recording rule's name (level:metric:operations).
METRIC = re.compile(r"(?<![:\w])((?:replag_[a-z0-9_]+)|up|ALERTS)(?![:\w])")


def promtool() -> str:
    path = os.environ.get("REPLAG_PROMTOOL") or shutil.which("promtool")
    if not path or not os.access(path, os.X_OK):
        pytest.skip(
            "promtool not found: set REPLAG_PROMTOOL (.ci/run builds it with "
            "go install github.com/prometheus/prometheus/cmd/promtool@v0.316.0)"
        )
    return path


def rules() -> list[dict[str, str]]:
    out = []
    for path in RULE_FILES:
        for group in yaml.safe_load(path.read_text())["groups"]:
            out += group["rules"]
    return out


def alerts() -> list[dict[str, str]]:
    return [r for r in rules() if "alert" in r]


def raw_metrics(expr: str, recorded: dict[str, str]) -> set[str]:
    """The raw series an expression reads, through the recording rules it uses."""
    found = set(METRIC.findall(expr))
    for name, body in recorded.items():
        if re.search(rf"(?<![:\w]){re.escape(name)}(?![:\w])", expr):
            found |= raw_metrics(body, recorded)
    return found


def panel_exprs() -> list[tuple[str, list[str]]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [(p["title"], [t["expr"] for t in p.get("targets", [])]) for p in panels(dashboard)]


def test_rule_files_are_what_the_generator_writes() -> None:
    for name, text in generate().items():
        assert (MIXIN / name).read_text() == text, (
            f"{name} is stale: run python -m replag.prometheus_mixin"
        )


def test_parameters_refuse_an_slo_threshold_that_is_no_bucket() -> None:
    with pytest.raises(ValueError, match="not a bound of replag_lag_seconds"):
        MixinParams(slo_lag_s=0.3)
    text = generate(MixinParams(slo_lag_s=0.1, lag_p99_limit_s=0.2))[ALERTING_FILE]
    assert "pair:replag_lag_seconds:p99_rate5m > 0.2" in text


def test_every_metric_a_rule_or_panel_reads_is_exported() -> None:
    exported = exported_metrics() | {"up", "ALERTS"}
    for rule in rules():
        used = set(METRIC.findall(rule["expr"]))
        assert used <= exported, (rule.get("alert") or rule.get("record"), used - exported)
    for title, exprs in panel_exprs():
        used = {m for e in exprs for m in METRIC.findall(e)}
        assert used <= exported, (title, used - exported)


def test_every_alert_has_a_panel_showing_what_it_reads() -> None:
    recorded = {r["record"]: r["expr"] for r in rules() if "record" in r}
    panels = [(t, {m for e in exprs for m in METRIC.findall(e)}) for t, exprs in panel_exprs()]
    for alert in alerts():
        reads = raw_metrics(alert["expr"], recorded)
        assert reads, alert["alert"]
        assert any(reads <= used for _, used in panels), (
            f"{alert['alert']}: no dashboard panel reads all of {sorted(reads)}"
        )


def test_every_alert_has_a_runbook_section() -> None:
    page = RUNBOOK.read_text()
    headings = {h.strip().lower() for h in re.findall(r"^## (.+)$", page, re.M)}
    for alert in alerts():
        url = alert["annotations"]["runbook_url"]
        assert url.endswith(f"/runbooks/prometheus-alerts/#{alert['alert'].lower()}"), url
        assert alert["alert"].lower() in headings, alert["alert"]
        assert alert["labels"]["severity"] in ("critical", "warning", "info")


def test_every_alert_is_tested_firing_and_resolved() -> None:
    firing: set[str] = set()
    resolved: set[str] = set()
    for path in TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else resolved).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names - firing == set(), "never tested firing"
    assert names - resolved == set(), "never tested resolved"


def test_promtool_checks_the_rules() -> None:
    result = subprocess.run(
        [promtool(), "check", "rules", *map(str, RULE_FILES)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass() -> None:
    result = subprocess.run(
        [promtool(), "test", "rules", *map(str, TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_runbook_links_resolve_to_a_page_and_heading_of_the_docs() -> None:
    """Every runbook_url is the docs site (mkdocs.yml's site_url, the mixin's default
    runbook_base) plus a page of docs/ and the id mkdocs gives one of its headings."""
    site = re.search(r"^site_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert site and site.group(1) == DOCS_SITE == MixinParams().runbook_base
    checked = 0
    for alert in alerts():
        url = alert["annotations"]["runbook_url"]
        assert url.startswith(DOCS_SITE), url
        page, _, anchor = url.removeprefix(DOCS_SITE).partition("#")
        source = ROOT / "docs" / (page.rstrip("/") + ".md")
        assert source.is_file(), f"{alert['alert']}: {url} names no page of docs/"
        ids = {_heading_id(h) for h in re.findall(r"^#+ (.+?)\s*$", source.read_text(), re.M)}
        assert anchor in ids, f"{alert['alert']}: {url}: no heading #{anchor} in {source}"
        checked += 1
    assert checked == len(alerts()) > 20


def _heading_id(heading: str) -> str:
    """The id mkdocs (Python-Markdown's toc) gives a heading: lower case, words joined by -."""
    text = re.sub(r"[^\w\s-]", "", heading).strip().lower()
    return re.sub(r"[-\s]+", "-", text)
