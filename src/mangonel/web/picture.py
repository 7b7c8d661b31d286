"""Pictures of a stage graph: SVG drawn here, PNG through Graphviz.

The web UI's job page and ``mangonel explain --picture FILE.svg`` draw the same
SVG: stages as boxes in columns by depth (scans on the left, the final stage on
the right), exchanges as arrows labelled with how they move rows, and, for a
job that runs or ran, each stage's tasks as a bar (done, running, pending),
with failed attempts, re-runs and recomputes called out. The layout needs no
external program, so the UI works where Graphviz is not installed;
``to_png`` needs Graphviz's ``dot``.

>>> from mangonel.web.models import StageModel
>>> s = StageModel(id=1, label="scan t", num_tasks=2, done=1, running=1, pending=0, failed=0,
...     lost=0, attempts=2, tasks_rerun=0, outputs_recomputed=0, rows=10, bytes=100, elapsed_s=0.1,
...     output="single partition", inputs=[], scan_table="t", sql="SELECT 1", final=True)
>>> svg([s]).startswith("<svg")
True
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from xml.sax.saxutils import escape

from mangonel.errors import MangonelError
from mangonel.web.models import StageModel

BOX_W = 250
BOX_H = 104
GAP_X = 90
GAP_Y = 28
MARGIN = 20

COLORS = {
    "done": "#2e9d57",
    "running": "#2f6fd6",
    "pending": "#c9ced6",
    "failed": "#d64545",
    "rerun": "#e08a1e",
    "border": "#8a94a3",
    "text": "#1d2430",
    "muted": "#5b6574",
}


class PictureError(MangonelError):
    """A picture of a plan could not be made (unknown format, Graphviz missing or failing)."""


def human_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def human_count(n: int) -> str:
    """``12345`` -> ``12.3k``."""
    if n < 1000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}k"
    return f"{n / 1_000_000:.1f}M"


def _depths(stages: Sequence[StageModel]) -> dict[int, int]:
    """Column of each stage: the longest path from a scan, with each scan moved
    right to just before its first reader (so a left-deep join chain draws as a
    row of joins, each with the scan it reads beside it, not all scans in one
    tall column with long edges across the picture)."""
    depth: dict[int, int] = {}
    for stage in stages:  # topological order: inputs come first
        depth[stage.id] = 1 + max((depth.get(i.stage, 0) for i in stage.inputs), default=-1)
    for stage in stages:
        if not stage.inputs:
            readers = [depth[s.id] for s in stages if any(i.stage == stage.id for i in s.inputs)]
            if readers:
                depth[stage.id] = min(readers) - 1
    return depth


def _layout(stages: Sequence[StageModel]) -> tuple[dict[int, tuple[float, float]], float, float]:
    depth = _depths(stages)
    columns: dict[int, list[StageModel]] = {}
    for stage in stages:
        columns.setdefault(depth[stage.id], []).append(stage)
    tallest = max(len(c) for c in columns.values())
    height = MARGIN * 2 + tallest * BOX_H + (tallest - 1) * GAP_Y
    count = max(columns) + 1
    width = MARGIN * 2 + count * BOX_W + (count - 1) * GAP_X
    where: dict[int, tuple[float, float]] = {}
    for col, members in columns.items():
        # Stages that read other stages first, scans under them: the main line
        # of the plan runs along the top row.
        members.sort(key=lambda s: (not s.inputs, s.id))
        for row, stage in enumerate(members):
            where[stage.id] = (MARGIN + col * (BOX_W + GAP_X), MARGIN + row * (BOX_H + GAP_Y))
    return where, width, height


def _state(stage: StageModel, live: bool) -> str:
    if not live:
        return "plan"
    if stage.done >= stage.num_tasks:
        return "done"
    if stage.running or stage.done:
        return "running"
    return "pending"


def _exchange(stage: StageModel, mode: str, upstream: StageModel) -> str:
    if mode == "partition":
        return "hash exchange"
    return "broadcast" if stage.num_tasks > 1 else "gather"


def svg(stages: Sequence[StageModel], live: bool = True) -> str:
    """The stage graph as an SVG document.

    Args:
        stages: In topological order (as plans list them).
        live: Draw task progress (a running or finished job); ``False`` draws
            the plan only (task counts, no bars).
    """
    if not stages:
        return '<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"></svg>'
    where, width, height = _layout(stages)
    by_id = {s.id: s for s in stages}
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" height="{height:.0f}" '
        f'viewBox="0 0 {width:.0f} {height:.0f}" font-family="system-ui, sans-serif" '
        f'font-size="12" role="img" aria-label="stage graph">',
        "<defs><marker id='arrow' viewBox='0 0 10 10' refX='9' refY='5' markerWidth='7' "
        f"markerHeight='7' orient='auto-start-reverse'><path d='M0,0 L10,5 L0,10 z' "
        f"fill='{COLORS['border']}'/></marker></defs>",
    ]
    for stage in stages:
        x2, y2 = where[stage.id]
        for i, inp in enumerate(stage.inputs):
            if inp.stage not in where:
                continue
            x1, y1 = where[inp.stage]
            sx, sy = x1 + BOX_W, y1 + BOX_H / 2
            share = (i + 1) / (len(stage.inputs) + 1)
            ex, ey = x2, y2 + BOX_H * share
            mid = (sx + ex) / 2
            out.append(
                f'<path class="edge" d="M{sx:.1f},{sy:.1f} C{mid:.1f},{sy:.1f} {mid:.1f},{ey:.1f} '
                f'{ex - 2:.1f},{ey:.1f}" fill="none" stroke="{COLORS["border"]}" '
                f'stroke-width="1.5" marker-end="url(#arrow)"/>'
            )
            label = _exchange(stage, inp.mode, by_id[inp.stage])
            out.append(
                f'<text x="{mid:.1f}" y="{(sy + ey) / 2 - 5:.1f}" text-anchor="middle" '
                f'font-size="10" fill="{COLORS["muted"]}">{escape(label)}</text>'
            )
    for stage in stages:
        out.extend(_box(stage, *where[stage.id], live))
    out.append("</svg>")
    return "\n".join(out)


def _box(stage: StageModel, x: float, y: float, live: bool) -> list[str]:
    state = _state(stage, live)
    border = {"done": COLORS["done"], "running": COLORS["running"]}.get(state, COLORS["border"])
    title = f"Stage {stage.id}" + (" (result)" if stage.final else "")
    label = stage.label if len(stage.label) <= 34 else stage.label[:33] + "…"
    parts = [
        f'<g class="stage stage-{state}" data-stage="{stage.id}">',
        f"<title>{escape(title)}: {escape(stage.label)}</title>",
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{BOX_W}" height="{BOX_H}" rx="8" fill="#ffffff" '
        f'stroke="{border}" stroke-width="{2.5 if state == "running" else 1.5}"/>',
        f'<text x="{x + 10:.1f}" y="{y + 18:.1f}" font-weight="600" fill="{COLORS["text"]}">'
        f"{escape(title)}</text>",
        f'<text x="{x + 10:.1f}" y="{y + 34:.1f}" fill="{COLORS["text"]}">{escape(label)}</text>',
    ]
    bar_y, bar_w = y + 44, BOX_W - 20
    if live and stage.num_tasks:
        done = min(stage.done, stage.num_tasks)
        running = min(stage.running, stage.num_tasks - done)
        offset = x + 10
        for count, color in ((done, COLORS["done"]), (running, COLORS["running"])):
            w = bar_w * count / stage.num_tasks
            if w > 0:
                parts.append(
                    f'<rect x="{offset:.1f}" y="{bar_y:.1f}" width="{w:.1f}" height="10" '
                    f'fill="{color}"/>'
                )
            offset += w
        parts.append(
            f'<rect x="{x + 10:.1f}" y="{bar_y:.1f}" width="{bar_w}" height="10" fill="none" '
            f'stroke="{COLORS["pending"]}"/>'
        )
        tasks = f"{done}/{stage.num_tasks} tasks done"
        if running:
            tasks += f", {running} running"
        if stage.planned_tasks is not None:
            tasks += f" (planned {stage.planned_tasks})"
        stats = f"{human_count(stage.rows)} rows · {human_bytes(stage.bytes)}"
    else:
        tasks = f"{stage.num_tasks} task{'s' if stage.num_tasks != 1 else ''}"
        tables = [stage.scan_table] if stage.scan_table else []
        tables += [*stage.side_tables, *stage.ranged_tables]
        stats = f"reads {', '.join(tables)}" if tables else ""
    parts.append(
        f'<text x="{x + 10:.1f}" y="{bar_y + 24:.1f}" fill="{COLORS["text"]}">'
        f"{escape(tasks)}</text>"
    )
    parts.append(
        f'<text x="{x + 10:.1f}" y="{bar_y + 39:.1f}" fill="{COLORS["muted"]}">'
        f"{escape(stats)}</text>"
    )
    badges = []
    if stage.failed:
        badges.append((f"{stage.failed} failed", COLORS["failed"]))
    if stage.lost:
        badges.append((f"{stage.lost} lost", COLORS["failed"]))
    if stage.tasks_rerun:
        badges.append((f"{stage.tasks_rerun} re-run", COLORS["rerun"]))
    if stage.outputs_recomputed:
        badges.append((f"{stage.outputs_recomputed} recomputed", COLORS["rerun"]))
    bx = x + BOX_W - 8
    for text, color in reversed(badges):
        w = 7 * len(text) + 10
        bx -= w
        parts.append(
            f'<rect class="badge" x="{bx:.1f}" y="{y + 6:.1f}" width="{w}" height="16" rx="8" '
            f'fill="{color}"/><text x="{bx + w / 2:.1f}" y="{y + 18:.1f}" text-anchor="middle" '
            f'font-size="10" fill="#fff">{escape(text)}</text>'
        )
        bx -= 4
    parts.append("</g>")
    return parts


def dot(stages: Sequence[StageModel]) -> str:
    """The stage graph in Graphviz's language (for PNG and other raster formats)."""

    def q(text: str) -> str:
        escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'

    lines = [
        "digraph plan {",
        "  rankdir=LR;",
        '  node [shape=box, style="rounded", fontname="sans-serif", fontsize=11];',
        '  edge [fontname="sans-serif", fontsize=9, color="#8a94a3"];',
    ]
    by_id = {s.id: s for s in stages}
    for s in stages:
        planned = f" (planned {s.planned_tasks})" if s.planned_tasks is not None else ""
        text = f"Stage {s.id}{' (result)' if s.final else ''}\n{s.label}\n{s.num_tasks} task(s)"
        text += planned
        lines.append(f"  s{s.id} [label={q(text)}];")
    for s in stages:
        for inp in s.inputs:
            if inp.stage in by_id:
                label = _exchange(s, inp.mode, by_id[inp.stage])
                lines.append(f"  s{inp.stage} -> s{s.id} [label={q(label)}];")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_png(stages: Sequence[StageModel]) -> bytes:
    """Render with Graphviz's ``dot``.

    Raises:
        PictureError: ``dot`` is not installed or failed.
    """
    exe = shutil.which("dot")
    if exe is None:
        raise PictureError(
            "a PNG needs Graphviz's `dot` (apt-get install graphviz); or write an .svg"
        )
    done = subprocess.run([exe, "-Tpng"], input=dot(stages).encode(), capture_output=True)
    if done.returncode != 0:
        raise PictureError(f"dot failed: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout


def render(stages: Sequence[StageModel], path: str) -> None:
    """Write the plan's picture to ``path``: ``.svg`` (drawn here) or ``.png`` (Graphviz).

    Raises:
        PictureError: another extension, or Graphviz missing for a PNG.
    """
    lower = path.lower()
    if lower.endswith(".svg"):
        data = svg(stages, live=False).encode()
    elif lower.endswith(".png"):
        data = to_png(stages)
    else:
        raise PictureError(f"cannot tell the picture format of {path!r}: name it .svg or .png")
    with open(path, "wb") as f:
        f.write(data)
