"""`runtime.sim.plots.write_figure`: the HTML always, the PNG when kaleido can draw it, else why not."""

from __future__ import annotations

import plotly.graph_objects as go

from runtime.sim.plots import write_figure


def test_a_png_that_cannot_be_drawn_says_why_even_when_kaleido_gives_no_reason(tmp_path, monkeypatch):
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 2]))

    def no_chromium(*_args, **_kwargs):
        raise RuntimeError()  # what kaleido raised on a machine without Chromium

    monkeypatch.setattr(fig, "write_image", no_chromium)
    out = write_figure(fig, tmp_path, "plot")
    assert (tmp_path / "plot.html").exists() and out["html"] == str(tmp_path / "plot.html")
    assert "png" not in out and out["png_error"].startswith("RuntimeError: no reason given")
    assert "chromium" in out["png_error"].lower()


def test_kaleidos_own_reason_is_its_first_line(tmp_path, monkeypatch):
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 2]))

    def broken(*_args, **_kwargs):
        raise ValueError("kaleido is too old\nmore detail")

    monkeypatch.setattr(fig, "write_image", broken)
    assert write_figure(fig, tmp_path, "plot")["png_error"] == "ValueError: kaleido is too old"
