"""deploy/'s Grafana dashboard and Prometheus alert rules name only metrics that a
live ``groupcoord serve`` exports (a renamed metric breaks a panel silently)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families
from server_harness import StartServer

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
#: a metric name in PromQL: ours all start with groupcoord_.
_NAME = re.compile(r"\bgroupcoord_[a-z_]+\b")
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"),
             "summary": ("_count", "_sum"), "gauge": ("",)}


def dashboard_exprs() -> list[str]:
    doc = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return exprs


def alert_exprs() -> list[str]:
    doc = yaml.safe_load((DEPLOY / "groupcoord-alerts.yml").read_text())
    return [rule["expr"] for group in doc["groups"] for rule in group["rules"]]


def exported(text: str) -> set[str]:
    """Every sample name the exposition can have, from its families (a labelled
    counter with no sample yet still declares its family)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names |= {family.name + s for s in _SUFFIXES.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


def test_every_metric_the_dashboard_and_alerts_name_is_exported(
        start_server: StartServer) -> None:
    server = start_server(group_metrics=10)
    with urllib.request.urlopen(f"{server.admin_url}/metrics", timeout=10) as answer:
        names = exported(answer.read().decode())
    dashboard, alerts = dashboard_exprs(), alert_exprs()
    assert len(dashboard) >= 10 and len(alerts) >= 5
    used = {name for expr in dashboard + alerts for name in _NAME.findall(expr)}
    assert used, "no groupcoord_ metric named"
    missing = sorted(used - names)
    assert not missing, f"named by deploy/ but not exported: {missing}"
    # The panels the issue asks for are there.
    titles = " | ".join(p["title"] for p in json.loads(
        (DEPLOY / "grafana-dashboard.json").read_text())["panels"])
    for needed in ("Groups by state", "Members", "Rebalances started by reason",
                   "Rebalance duration", "Heartbeat", "Storage commit latency", "Refused"):
        assert needed in titles, needed


def test_the_name_check_would_catch_a_renamed_metric() -> None:
    names = exported("# HELP groupcoord_ready x\n# TYPE groupcoord_ready gauge\n"
                     "groupcoord_ready 1.0\n")
    assert "groupcoord_ready" in names
    assert not {"groupcoord_readyness"} <= names
