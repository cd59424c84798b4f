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
        "findings": [asdict(f) for f in findings],
    }
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
