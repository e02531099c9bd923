"""Plots as inline SVG for jobkit's HTML pages (analyze, compare, dashboard): matplotlib, no JavaScript.

Why matplotlib to SVG: the pages must open on a login node without network access, so every plot is inside the
HTML; SVG keeps them sharp and small, and the browser tests can find each plot's lines in the DOM. The Agg
backend is forced before pyplot is imported, so nothing ever asks for a display.

A plot is a `Panel`: a title, a y label, and `Series` of (x, y) points; `markers` are vertical lines (stage
boundaries, a hang, a failure) and `spans` shaded x ranges (the steady window). `svg(panel)` returns the
<svg> element as text, with `data-series` on the root naming its series so tests and readers can tell
which plot is which; an empty panel renders as a short note instead.
"""

import html
import io
import math
import re
from dataclasses import dataclass, field

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

matplotlib.rcParams.update(
    {
        "svg.fonttype": "none",  # text stays text: searchable, and smaller than glyph paths
        "svg.hashsalt": "jobkit",  # stable ids, so the same data gives the same file
        "font.size": 8,
        "axes.grid": True,
        "grid.alpha": 0.3,
    }
)


_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)


@dataclass
class Series:
    label: str
    points: list[tuple[float, float]]
    style: str = "-"


@dataclass
class Marker:
    x: float
    label: str
    color: str = "tab:red"


@dataclass
class Panel:
    title: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    xlabel: str = "step"
    markers: list[Marker] = field(default_factory=list)
    spans: list[tuple[float, float, str]] = field(default_factory=list)  # (x0, x1, label)
    time_axis: bool = False  # x values are Unix seconds: shown as minutes from the panel's first x
    x0: float | None = None  # with time_axis: the origin (share it to align panels)

    def has_data(self) -> bool:
        return any(_finite_points(s.points) for s in self.series)


def _finite_points(points):
    return [(x, y) for x, y in points if x is not None and y is not None and math.isfinite(x) and math.isfinite(y)]


def svg(panel: Panel, width: float = 7.0, height: float = 2.2) -> str:
    """The panel as an <svg> element (text), or a <p class="no-data"> when it has no finite point."""
    names = html.escape(",".join(s.label for s in panel.series), quote=True)
    if not panel.has_data():
        return f'<p class="no-data" data-series="{names}">{html.escape(panel.title)}: no data</p>'
    fig, ax = plt.subplots(figsize=(width, height), layout="constrained")
    try:
        origin = 0.0
        if panel.time_axis:
            xs = [x for s in panel.series for x, _ in _finite_points(s.points)]
            origin = panel.x0 if panel.x0 is not None else min(xs)

        def scale(x):
            return (x - origin) / 60.0 if panel.time_axis else x

        for s in panel.series:
            pts = _finite_points(s.points)
            if not pts:
                continue
            ax.plot([scale(x) for x, _ in pts], [y for _, y in pts], s.style, label=s.label, linewidth=1, markersize=3)
        for x0, x1, label in panel.spans:
            ax.axvspan(scale(x0), scale(x1), color="tab:green", alpha=0.12, label=label)
        for m in panel.markers:
            ax.axvline(scale(m.x), color=m.color, linestyle="--", linewidth=0.8)
            ax.annotate(
                m.label,
                (scale(m.x), 1.0),
                xycoords=("data", "axes fraction"),
                rotation=90,
                va="top",
                ha="right",
                fontsize=6,
                color=m.color,
            )
        ax.set_title(panel.title, fontsize=9, loc="left")
        ax.set_ylabel(panel.ylabel)
        ax.set_xlabel("minutes since start" if panel.time_axis else panel.xlabel)
        if len(panel.series) > 1 or panel.spans:
            ax.legend(fontsize=6, loc="best")
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
    finally:
        plt.close(fig)
    text = buf.getvalue()
    body = _METADATA.sub("", text[text.index("<svg") :])  # matplotlib's RDF block: bytes no reader needs
    return body.replace("<svg", f'<svg class="plot" data-series="{names}"', 1)
