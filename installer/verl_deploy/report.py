"""`verl-deploy report`: the curves of one or more runs, from their metrics.jsonl, as one self-contained HTML page
(every chart a PNG inlined as a data: URL, no script or style from the network) and one PNG file per chart.

Several runs share each chart, one colour per run. matplotlib is imported inside write_report only, so the CLI
starts without it.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass
from pathlib import Path

from verl_deploy import runs
from verl_runtime import rundir
from verl_runtime.errors import UserError

PAGE = "index.html"
_LINESTYLES = ("-", "--", ":", "-.")


class ReportError(UserError):
    """A run that cannot be reported on, or a report that cannot be written."""


@dataclass(frozen=True)
class Chart:
    """One chart: the metrics named, or every metric under a prefix, one line each (verl's names)."""

    file: str  # <file>.png
    title: str
    names: tuple[str, ...] = ()
    prefix: str = ""
    markers: bool = False  # sparse series (validation): show the points

    def metrics_in(self, records: list[dict]) -> list[str]:
        if self.names:
            return [name for name in self.names if any(name in record for record in records)]
        found = {name for record in records for name in record if name.startswith(self.prefix)}
        return sorted(found)

    @property
    def wanted(self) -> str:
        return ", ".join(self.names) if self.names else f"{self.prefix}*"


# The curves an RL run is read by, in the order of the page.
CHARTS = (
    Chart("score", "Score", names=("critic/score/mean",)),
    Chart("kl", "KL", names=("actor/kl_loss", "actor/ppo_kl", "actor/reward_kl_penalty")),
    Chart("entropy", "Entropy", names=("actor/entropy",)),
    Chart("response_length", "Response length (tokens)", names=("response_length/mean",)),
    Chart("grad_norm", "Grad norm", names=("actor/grad_norm",)),
    Chart("throughput", "Throughput (tokens/s)", names=("perf/throughput",)),
    Chart("timing", "Time per phase (s)", prefix="timing_s/"),
    Chart("validation", "Validation score", prefix="val-core/", markers=True),
)


@dataclass
class Run:
    label: str
    run_dir: Path
    records: list[dict]

    def series(self, name: str) -> tuple[list[float], list[float]]:
        """(steps, values) of one metric, the last value of a step where a step was written twice."""
        by_step = {}
        for record in self.records:
            value, step = record.get(name), record.get("step", record.get("training/global_step"))
            if _number(value) and _number(step):
                by_step[step] = float(value)
        steps = sorted(by_step)
        return steps, [by_step[step] for step in steps]


@dataclass
class Written:
    page: Path
    charts: list[str]  # titles drawn
    skipped: list[str]  # titles no run has data for


def find_runs(names: list[str], runs_root: Path) -> list[Run]:
    """Each RUN (an id under runs_root, or a run directory's path) with its metrics; ReportError for one that is
    unknown or has none."""
    found, labels = [], set()
    for name in names:
        try:
            run_dir = runs.run_dir_of(name, runs_root)
        except runs.UnknownRun as exc:
            raise ReportError(str(exc)) from None
        records = runs.metrics_lines(run_dir)
        if not records:
            raise ReportError(f"run {name!r} has no metrics yet ({run_dir / rundir.METRICS_FILE} is missing or "
                              f"empty): report it once it has trained a step (`verl-deploy logs {name}` shows how "
                              "it goes)")
        label = run_dir.resolve().name
        while label in labels:  # two runs of one name, from two roots
            label += "'"
        labels.add(label)
        found.append(Run(label, run_dir, records))
    return found


def default_out(found: list[Run]) -> Path:
    """Where a report goes without --out: into the run's own directory, beside what it charts (never the current
    directory, which may be a checkout): <run>/report; for several runs the first one's report-vs-<the others>."""
    others = "-".join(run.label.replace("'", "") for run in found[1:])
    return found[0].run_dir / ("report-vs-" + others if others else "report")


def write_report(found: list[Run], out: Path) -> Written:
    """Draw every chart some run has data for into out/<chart>.png and out/index.html."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise ReportError("`report` draws with matplotlib, which is not installed here: pip install matplotlib") from None

    sections, drawn, skipped = [], [], []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for chart in CHARTS:
            lines = {run.label: chart.metrics_in(run.records) for run in found}
            if not any(lines.values()):
                skipped.append(chart.title)
                continue
            figure = Figure(figsize=(8, 3.6), dpi=100, layout="constrained")
            FigureCanvasAgg(figure)
            _draw(figure.add_subplot(), chart, found, lines)
            png = out / f"{chart.file}.png"
            figure.savefig(png, format="png")
            missing = [f"{run.label} has no {chart.wanted}" for run in found if not lines[run.label]]
            sections.append(_section(chart, png, missing))
            drawn.append(chart.title)
        page = out / PAGE
        page.write_text(_page(found, sections, [c for c in CHARTS if c.title in skipped]), encoding="utf-8")
    except OSError as exc:
        where = exc.filename or out
        raise ReportError(f"cannot write the report to {where}: {exc.strerror or exc}; choose another --out") from None
    return Written(page, drawn, skipped)


def _draw(axes, chart: Chart, found: list[Run], lines: dict[str, list[str]]) -> None:
    names = sorted({name for found_names in lines.values() for name in found_names}, key=_order(chart))
    several = len(names) > 1
    palette = [f"C{i % 10}" for i in range(max(len(found), len(names)))]
    for r, run in enumerate(found):
        for n, name in enumerate(names):
            if name not in lines[run.label]:
                continue
            steps, values = run.series(name)
            short = name.removeprefix(chart.prefix) if chart.prefix else name
            # One metric: a colour per run. Several: a colour per metric, a line style per run.
            colour = palette[n] if several else palette[r]
            style = _LINESTYLES[r % len(_LINESTYLES)] if several else "-"
            label = (f"{run.label}: {short}" if len(found) > 1 else short) if several else run.label
            sparse = chart.markers or len(steps) < len(run.records) // 2  # e.g. timing_s/testing: show the points
            axes.plot(steps, values, style, color=colour, label=label, marker="o" if sparse else None, markersize=4)
    axes.set_title(chart.title)
    axes.set_xlabel("step")
    axes.grid(alpha=0.3)
    if len(axes.get_lines()) > 4:  # a long legend goes beside the chart, not over its lines
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        axes.legend(fontsize="small", loc="best")


def _order(chart: Chart):
    return (lambda name: chart.names.index(name)) if chart.names else (lambda name: name)


def _section(chart: Chart, png: Path, missing: list[str]) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    note = f'<p class="note">{html.escape("; ".join(missing))}</p>' if missing else ""
    return (f'<section id="{chart.file}"><h2>{html.escape(chart.title)}</h2>'
            f'<img alt="{html.escape(chart.title)}" src="data:image/png;base64,{data}">{note}</section>')


def _summary_row(run: Run) -> str:
    last = run.records[-1]
    score = next((r["critic/score/mean"] for r in reversed(run.records) if _number(r.get("critic/score/mean"))), None)
    val = [r for r in run.records if any(name.startswith("val-core/") for name in r)]
    val_text = ", ".join(f"{k.removeprefix('val-core/')} {v:.3f}" for k, v in val[-1].items()
                         if k.startswith("val-core/") and _number(v)) if val else ""
    cells = [run.label, str(run.run_dir), str(last.get("step", "")), "" if score is None else f"{score:.3f}", val_text]
    return "<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>"


def _page(found: list[Run], sections: list[str], skipped: list[Chart]) -> str:
    title = "verl-deploy report: " + ", ".join(run.label for run in found)
    not_shown = "".join(f"<li>{html.escape(c.title)} ({html.escape(c.wanted)})</li>" for c in skipped)
    not_shown = f"<h2>Not in these runs</h2><ul>{not_shown}</ul>" if skipped else ""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 860px; color: #222; }}
table {{ border-collapse: collapse; font-size: 0.9em; }} td, th {{ border: 1px solid #ccc; padding: 0.2em 0.5em; }}
img {{ max-width: 100%; }} .note {{ color: #666; font-size: 0.9em; }}
</style></head>
<body data-charts="{len(sections)}">
<h1>{html.escape(title)}</h1>
<table><tr><th>run</th><th>directory</th><th>last step</th><th>score</th><th>validation (last)</th></tr>
{"".join(_summary_row(run) for run in found)}
</table>
{"".join(sections)}
{not_shown}
<script>
// Marks the page once every chart has decoded: headless checks (and people) can tell a rendered page.
window.addEventListener("load", function () {{
  var images = Array.prototype.slice.call(document.images);
  var shown = images.filter(function (img) {{ return img.complete && img.naturalWidth > 0; }}).length;
  document.body.setAttribute("data-rendered", shown + "/" + images.length);
}});
</script>
</body></html>
"""


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
