"""The re-cut's rules, checked on the source: where SQL may live, how long a function may grow, and
that the modules of app/ and workers/ import each other without a cycle (imports inside functions
count). The layering itself is checked by import-linter (pyproject.toml, `make lint`)."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("app", "workers")
MAX_FUNCTION_LINES = 100
# Statement builders and raw SELECTs: only a repository module writes these.
SQL = re.compile(r"\b(select|insert|update|delete)\(|\btext\(\s*[\"'](SELECT|INSERT|UPDATE|DELETE)")


def modules() -> Iterator[tuple[str, Path]]:
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            yield name, path


def is_repository(path: Path) -> bool:
    return path.stem == "repository" or path.stem.endswith("_repository")


def sql_calls(path: Path) -> list[str]:
    """SQL statement calls in code (not in strings or comments): `select(...)` and friends."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else None
            if name in ("select", "insert", "update", "delete"):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}(")
            literal = node.args[0] if node.args else None
            if (
                name == "text"
                and isinstance(literal, ast.Constant)
                and SQL.search(f"text({literal.value!r}")
            ):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: text(SQL)")
    return found


def test_sql_lives_only_in_repositories() -> None:
    offenders = [hit for _, path in modules() if not is_repository(path) for hit in sql_calls(path)]
    assert offenders == []


def functions(root: Path) -> Iterator[tuple[str, int]]:
    """Each function under `root` with its length in lines (decorators not counted)."""
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                where = f"{path.relative_to(root)}:{node.lineno} {node.name}"
                yield where, (node.end_lineno or node.lineno) - node.lineno + 1


def test_no_function_is_over_the_limit() -> None:
    """Modules are split by concept, whatever their length; functions stay short."""
    roots = [ROOT / p for p in PACKAGES] + [ROOT / "experiments" / "harness"]
    long = {where: n for root in roots for where, n in functions(root) if n > MAX_FUNCTION_LINES}
    assert long == {}


def test_the_function_finder_measures_a_long_function(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n", encoding="utf-8")
    assert list(functions(tmp_path)) == [("m.py:1 f", MAX_FUNCTION_LINES + 1)]


def import_graph() -> dict[str, set[str]]:
    known = dict(modules())
    graph: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name if path.stem == "__init__" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                # `from app.jobs import service` imports the module app.jobs.service
                targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
            for target in targets:
                while target and target not in known:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
    return graph


def cycles_in(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles_in({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_among_app_and_workers() -> None:
    assert cycles_in(import_graph()) == []


def test_app_never_imports_workers() -> None:
    graph = import_graph()
    assert {
        (name, target)
        for name, targets in graph.items()
        if name.startswith("app")
        for target in targets
        if target.startswith("workers")
    } == set()
