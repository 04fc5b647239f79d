"""`runtime.sim.plots.write_figure`: the HTML always, the PNG when kaleido can draw it, else why not."""

from __future__ import annotations

import plotly.graph_objects as go

from runtime.sim.plots import write_figure


def test_a_png_that_cannot_be_drawn_says_why_even_when_kaleido_gives_no_reason(tmp_path, monkeypatch):
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 2]))

    def no_chromium(*_args, **_kwargs):
        raise RuntimeError()  # an exception with no text at all

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


def test_kaleidos_missing_chrome_message_is_its_first_line_of_text_and_says_where_chromium_comes_from(
        tmp_path, monkeypatch):
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 2]))

    def no_chrome(*_args, **_kwargs):
        # kaleido 1.x's message on a machine without Chrome (seen 2026-12-01): blank lines first.
        raise RuntimeError("\n\nKaleido requires Google Chrome to be installed.\n\nEither download ...\n")

    monkeypatch.setattr(fig, "write_image", no_chrome)
    error = write_figure(fig, tmp_path, "plot")["png_error"]
    assert error.startswith("RuntimeError: Kaleido requires Google Chrome to be installed. (")
    assert "make test" in error and "BROWSER_PATH" in error
