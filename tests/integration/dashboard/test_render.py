"""Report Markdown renders safely: raw HTML escaped, foreign images and unsafe links dropped."""

from __future__ import annotations

from app.dashboard.evidence import render_markdown


def test_markdown_escapes_html_and_keeps_only_the_reports_own_plot() -> None:
    html = str(
        render_markdown(
            "# T <script>x()</script>\n\n| a | b |\n| --- | --- |\n| 1 | <b>2</b> |\n\n"
            "![plot](plot.svg) ![track](https://evil.example/p.png)\n\n[x](javascript:alert(1))\n",
            plot_url="/dashboard/cycles/7/plot.svg",
        )
    )
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "<table>" in html and "&lt;b&gt;2&lt;/b&gt;" in html
    assert '<img src="/dashboard/cycles/7/plot.svg" alt="plot" class="plot">' in html
    assert "evil.example" not in html and "track" in html
    assert 'href="javascript' not in html
    without = str(render_markdown("![plot](plot.svg)"))
    assert "<img" not in without
