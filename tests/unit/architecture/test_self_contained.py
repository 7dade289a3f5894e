"""The repository explains itself: code and docs cite what a reader can open (a section of
docs/, an upstream URL), never a tracker number or a design file outside the repository; and
every section of docs/design.md the code cites exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = ("app", "workers", "docs", "bench", "experiments")
TEXT = (".py", ".md", ".toml", ".txt", ".sh", ".yml", ".yaml", ".html", ".j2")
OUTSIDE = re.compile(r"\b[Ii]ssue [0-9]+|\bDESIGN\.md|\b[Ll]esson [0-9]+")
CITED = re.compile(r'docs/design\.md, "([^"]+)"')


def shipped_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in SHIPPED:
        files += [p for p in sorted((ROOT / top).rglob("*")) if p.suffix in TEXT and p.is_file()]
    return [p for p in files if "node_modules" not in p.parts and ".venv" not in p.parts]


def test_no_reference_points_outside_the_repository() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}"
        for path in shipped_files()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert found == [], "cite docs/ by section, or say the reason itself:\n" + "\n".join(found)


def test_every_cited_design_section_exists() -> None:
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    headings = {line.lstrip("#").strip() for line in design.splitlines() if line.startswith("#")}
    cited: dict[str, str] = {}
    for path in shipped_files():
        # a citation may wrap: join the lines of a file before matching
        text = re.sub(r"\s*\n\s*(#\s*)?", " ", path.read_text(encoding="utf-8"))
        for title in CITED.findall(text):
            cited.setdefault(title, str(path.relative_to(ROOT)))
    missing = {title: where for title, where in cited.items() if title not in headings}
    assert cited and missing == {}, missing
