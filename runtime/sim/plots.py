"""Plots of simulation results (plotly): HTML always, PNG when a renderer (kaleido + Chromium) works."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runtime.sim.engine import SimResult


def write_plots(results: list[SimResult], out_dir: Path, *, title: str, bins: int = 200) -> dict[str, str]:
    """Samples/s over time and cumulative samples per strategy. Returns {kind: path or error}."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    out_dir.mkdir(parents=True, exist_ok=True)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, subplot_titles=("samples/s", "cumulative samples"))
    palette = ("#636efa", "#00cc96", "#ffa15a", "#ef553b", "#ab63fa", "#19d3f3")
    for k, res in enumerate(results):
        rate = res.binned_rate(bins)
        line = {"color": palette[k % len(palette)]}
        fig.add_trace(
            go.Scatter(
                x=[t / 3600 for t, _ in rate],
                y=[r for _, r in rate],
                name=res.strategy,
                legendgroup=res.strategy,
                line=line,
                mode="lines",
            ),
            row=1,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=[t / 3600 for t, _ in res.series],
                y=[s for _, s in res.series],
                name=f"{res.strategy} (cumulative)",
                legendgroup=res.strategy,
                line=line,
                mode="lines",
                showlegend=False,
            ),
            row=2,
            col=1,
        )
    fig.update_layout(title=title, height=700, width=1000)
    fig.update_xaxes(title_text="hours", row=2, col=1)
    return write_figure(fig, out_dir, "simulation")


CHROMIUM_HINT = "`make test` installs Debian's chromium, BROWSER_PATH names another"
NO_REASON = f"no reason given; kaleido draws with a Chromium ({CHROMIUM_HINT})"


def write_figure(fig: Any, out_dir: Path, stem: str) -> dict[str, str]:
    """`stem`.html (always) and `stem`.png (when kaleido can draw it) under `out_dir`; the paths,
    or why the PNG is missing."""
    out: dict[str, str] = {}
    html = out_dir / f"{stem}.html"
    fig.write_html(html, include_plotlyjs=True)
    out["html"] = str(html)
    png = out_dir / f"{stem}.png"
    try:
        fig.write_image(png)
        out["png"] = str(png)
    except Exception as exc:  # kaleido or Chromium missing: HTML is the artefact then
        # kaleido 1.x opens its "requires Google Chrome" message with blank lines: say its first
        # line of text, and where a Chromium comes from.
        reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), NO_REASON)
        if "chrome" in reason.lower():
            reason = f"{reason} ({CHROMIUM_HINT})"
        out["png_error"] = f"{type(exc).__name__}: {reason}"
    return out
