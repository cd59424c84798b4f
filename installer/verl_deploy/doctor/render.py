"""Findings as a rich table grouped by area, or as the JSON document of docs/doctor.md."""

from __future__ import annotations

import json
from dataclasses import asdict

from verl_deploy import __version__
from verl_deploy.doctor.core import STATUSES, Finding

SCHEMA_VERSION = 1
STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}


def to_json(findings: list[Finding], recommended_variant: str) -> str:
    counts = {status: sum(f.status == status for f in findings) for status in STATUSES}
    document = {
        "schema_version": SCHEMA_VERSION,
        "verl_deploy_version": __version__,
        "ok": counts["fail"] == 0,
        "summary": counts,
        "recommended_variant": recommended_variant,
        "findings": [{key: value for key, value in asdict(f).items() if key != "node"} for f in findings],
    }  # one host: no node to name (the multi-node pre-flight's document has one: cluster_json)
    return json.dumps(document, indent=2)


def to_table(findings: list[Finding], recommended_variant: str):
    from rich.table import Table
    from rich.text import Text

    table = Table(title="verl-deploy doctor", title_justify="left", show_lines=False)
    table.add_column("area", style="bold")
    table.add_column("check")
    table.add_column("status")
    table.add_column("details", overflow="fold")
    previous = None
    for finding in findings:
        details = Text(finding.message)
        if finding.remedy and finding.status != "ok":
            details.append(f"\n→ {finding.remedy}", style="cyan")
        area = finding.area if finding.area != previous else ""
        if area and previous is not None:
            table.add_section()
        table.add_row(area, finding.name, Text(finding.status, style=STYLES[finding.status]), details)
        previous = finding.area
    counts = ", ".join(f"{sum(f.status == s for f in findings)} {s}" for s in STATUSES)
    verdict = "ready" if not any(f.status == "fail" for f in findings) else "not ready: fix the fail lines"
    table.caption = f"{counts} — {verdict}; image variant for this host: {recommended_variant}"
    table.caption_justify = "left"
    return table


def cluster_lines(report) -> str:
    """The multi-node pre-flight (multinode.ClusterReport) as one line per finding, worst first, and the verdict.
    The master prints every finding; another node only those about itself (N copies in one job log help no one)."""
    order = {"fail": 0, "warn": 1, "skip": 2, "ok": 3}
    own = f"rank {report.rank} " if report.rank is not None else "rank auto "
    shown = [f for f in report.findings if report.rank == 0 or (f.node or "").startswith(own) or
             (f.node or "") == own.strip()]
    lines = []
    for f in sorted(shown, key=lambda f: order[f.status]):
        where = f"{f.node}: " if f.node else ""
        fix = f" -> {f.remedy}" if f.remedy and f.status in ("fail", "warn") else ""
        lines.append(f"{f.status.upper():4} {f.name}: {where}{f.message}{fix}")
    fails = sum(f.status == "fail" for f in report.findings)
    verdict = "ready" if not fails else f"not ready: {fails} fail line(s)"
    who = "" if report.rank == 0 else f" (the master's verdict, seen from {own.strip()})"
    lines.append(f"verl-deploy doctor --nodes {report.nodes}: the cluster is {verdict}{who}")
    return "\n".join(lines)


def cluster_json(report) -> str:
    counts = {status: sum(f.status == status for f in report.findings) for status in STATUSES}
    document = {
        "schema_version": SCHEMA_VERSION,
        "verl_deploy_version": __version__,
        "ok": counts["fail"] == 0,
        "nodes": report.nodes,
        "joined": report.joined,
        "interface": report.interface,
        "summary": counts,
        "findings": [asdict(f) for f in report.findings],
    }
    return json.dumps(document, indent=2)
