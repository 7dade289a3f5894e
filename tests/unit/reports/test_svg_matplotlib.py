"""SVG text from matplotlib, written from several threads at once (the dashboard's request
threads, the control worker's step threads)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

from app.reports import svg_matplotlib as svg


def _chart(label: str) -> str:
    figure = svg.new_figure(4, 3)
    ax = figure.subplots()
    ax.plot([0, 1, 2], [1.0, 0.8, 0.9])
    ax.annotate(label, (1, 0.8))
    ax.set_title(f"title {label}")
    return svg.to_svg(figure)


def test_text_stays_text_when_threads_write_at_once() -> None:
    import matplotlib

    # A lost race leaves `svg.fonttype` at `none` for good (the last restore wins), so each
    # round starts from matplotlib's defaults (`path`) and starts its threads together.
    threads = 4
    as_paths: list[str] = []
    try:
        for round_ in range(12):
            matplotlib.rcdefaults()
            start = threading.Barrier(threads)

            def chart(label: str, start: threading.Barrier = start) -> tuple[str, str]:
                start.wait()
                return label, _chart(label)

            with ThreadPoolExecutor(max_workers=threads) as pool:
                labels = [f"best tile: cycle {round_}.{i}" for i in range(threads)]
                for label, document in pool.map(chart, labels):
                    if f">{label}</text>" not in document:  # as paths: only a comment
                        as_paths.append(label)
    finally:
        matplotlib.rcdefaults()
    assert not as_paths, f"{len(as_paths)} charts drew their text as paths: {as_paths}"


def test_the_same_figure_gives_the_same_svg() -> None:
    assert _chart("same") == _chart("same")
