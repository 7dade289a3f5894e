"""A venv build's progress summarised from the installer's output, a few lines per build."""

from __future__ import annotations

from workers.launcher.venv_progress import BuildStatus, BuildSummary


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_uv_output_is_summarised_on_step_changes_and_every_few_seconds() -> None:
    clock, seen = Clock(), []
    summary = BuildSummary(lambda s: seen.append(s.line()), every_s=2.0, clock=clock)
    summary("create", "uv venv ...")
    summary("create", "Creating virtual environment at: /v")
    clock.now += 1.0
    summary("install", "uv pip install ...")
    summary("install", "Resolved 37 packages in 1.2s")  # < 2 s since the last line shown
    clock.now += 3.0
    summary("install", "Downloading numpy (16.1MiB)")  # 2 s passed and the count moved
    clock.now += 8.0
    summary("install", "Installed 37 packages in 50ms")  # moved? no: still 37
    summary("freeze", "uv pip freeze ...")
    summary("done", "built /v")
    assert seen == [
        "building venv: 0 packages, 0 s",
        "building venv: 0 packages, 1 s",
        "building venv: 37 packages, 4 s",
        "building venv: 37 packages, 12 s",
        "built venv: 37 packages, 12 s",
    ]


def test_pip_output_counts_what_it_collects_then_what_it_installed() -> None:
    clock, seen = Clock(), []
    summary = BuildSummary(seen.append, every_s=0.0, clock=clock)
    summary("install", "python -m pip install -r req.txt")
    for name in ("numpy>=1.26", "six", "rich"):
        clock.now += 1.0
        summary("install", f"Collecting {name}")
    summary("install", "Successfully installed numpy-2.1 six-1.17 rich-13 pygments-2 mdurl-0.1")
    assert [s.packages for s in seen] == [0, 1, 2, 3, 5]
    assert seen[-1] == BuildStatus("install", 5, 3.0)
    assert seen[-1].as_dict() == {
        "state": "building",
        "step": "install",
        "packages": 5,
        "elapsed_s": 3.0,
    }


def test_a_reused_venv_reports_no_build() -> None:
    seen: list[BuildStatus] = []
    summary = BuildSummary(seen.append)
    summary("lock", "waiting for another build of p-123")
    summary("done", "reusing /v")
    assert seen == []
