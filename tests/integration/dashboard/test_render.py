"""Report Markdown renders safely: raw HTML escaped, foreign images and unsafe links dropped;
the diff a reviewer reads holds the code, not the report again."""

from __future__ import annotations

from app.dashboard.evidence import render_inline, render_markdown, without_report


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


def test_inline_markdown_is_as_safe_and_keeps_no_block() -> None:
    html = str(render_inline("Gate `val_loss`: **pass** <img src=x onerror=alert(1)>"))
    assert html == (
        "Gate <code>val_loss</code>: <strong>pass</strong> &lt;img src=x onerror=alert(1)&gt;"
    )


DIFF = """diff --git a/kernel.py b/kernel.py
index 1111111..2222222 100644
--- a/kernel.py
+++ b/kernel.py
@@ -1 +1 @@
-slow()
+fast()
diff --git a/results/7/REPORT.md b/results/7/REPORT.md
new file mode 100644
--- /dev/null
+++ b/results/7/REPORT.md
@@ -0,0 +1 @@
+# Fusing halves the time
diff --git a/results/70/notes.md b/results/70/notes.md
new file mode 100644
--- /dev/null
+++ b/results/70/notes.md
@@ -0,0 +1 @@
+another cycle's file stays
"""


def test_the_diff_leaves_out_the_cycles_own_report_files_and_says_so() -> None:
    shown = without_report(DIFF, "results/7")
    assert "+fast()" in shown and "another cycle's file stays" in shown
    assert "Fusing halves the time" not in shown
    assert shown.endswith(
        "… results/7/REPORT.md: the cycle's report, shown on this page, left out of the diff\n"
    )
    assert without_report(DIFF, "results/8") == DIFF
