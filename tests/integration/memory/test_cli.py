"""`autopilot memory ...` as a user runs it (in process, with the settings in the environment)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from app.cli.main import cli
from app.db import Stores
from app.settings import Settings
from tests.integration.memory.conftest import SAMPLE


def run(settings: Settings, *args: str):  # type: ignore[no-untyped-def]
    env = {
        "AUTOPILOT_STATE_DIR": str(settings.state_dir),
        "AUTOPILOT_MEMORY_URL": settings.memory_database_url,
        "AUTOPILOT_OPS_URL": settings.ops_database_url,
    }
    return CliRunner().invoke(cli, ["memory", *args], env=env)


def test_import_json_report_then_nothing_new(settings: Settings, stores: Stores) -> None:
    first = run(settings, "import", str(SAMPLE), "--json")
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout) == {
        "format": "property-export",
        "imported": 10,
        "duplicates": 0,
        "by_project": {"attention-kernel-lab": 3, "null": 4, "quant-serving": 3},
        "truncated": 1,
    }
    again = json.loads(run(settings, "import", str(SAMPLE), "--json").stdout)
    assert (again["imported"], again["duplicates"], again["by_project"]) == (0, 10, {})
    text = run(settings, "import", str(SAMPLE), "--format", "property-export")
    assert "imported 0" in text.stdout and "10 already present" in text.stdout


def test_search_show_export(settings: Settings, stores: Stores, tmp_path: Path) -> None:
    run(settings, "import", str(SAMPLE))
    found = run(settings, "search", "클럭", "--json")
    assert found.exit_code == 0, found.output
    items = json.loads(found.stdout)["items"]
    assert [i["language"] for i in items] == ["ko"]
    scoped = json.loads(
        run(
            settings, "search", "device", "--project", "quant-serving", "--kind", "lesson", "--json"
        ).stdout
    )["items"]
    assert {i["project"] for i in scoped} == {"quant-serving"} and len(scoped) == 2

    shown = run(settings, "show", items[0]["id"])
    assert (
        shown.exit_code == 0 and "GPU 클럭을 고정" in shown.stdout and "-> proposed" in shown.stdout
    )
    out = tmp_path / "memory.md"
    exported = run(settings, "export", "--format", "markdown", "--out", str(out))
    assert exported.exit_code == 0, exported.output
    assert out.read_text(encoding="utf-8").startswith("# Research memory")
    jsonl = run(settings, "export")
    assert len(jsonl.stdout.splitlines()) == 10


def test_bad_input_exits_2_with_the_line(
    settings: Settings, stores: Stores, tmp_path: Path
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"kind": "lesson", "statement": "ok"}\n{"kind": "lesson", "statement": ""}\n')
    result = run(settings, "import", str(bad))
    assert result.exit_code == 2
    assert "line 2: statement" in result.output
    assert run(settings, "show", "missing").exit_code == 2
    assert run(settings, "import", str(tmp_path / "absent.txt")).exit_code == 2
    assert json.loads(run(settings, "search", "ok", "--json").stdout)["items"] == []
