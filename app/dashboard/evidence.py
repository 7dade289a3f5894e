"""What a reviewer sees of a cycle's evidence: its report files, the diff, the job log.

The report files are read from the commit the cycle made (in the project's mirror on the
control host), never from a directory the agent or the experiment could write (docs/design.md,
"The code under test never judges itself").
Markdown is rendered with raw HTML off, so a report (or a hypothesis quoted in it) can never
inject markup into the page.
"""

from __future__ import annotations

import json
import re
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token
from markdown_it.utils import EnvType, OptionsDict
from markupsafe import Markup, escape

from app.cycles.models import Cycle
from app.db import Stores
from app.errors import AutopilotError
from app.forge.base import ProjectRef
from app.forge.local import LocalForge
from app.git.exceptions import GitFailed
from app.git.work import GitWork
from app.jobs import logs
from app.jobs.models import Job
from app.reports import cycle as report
from app.settings import Settings

MAX_FILE_BYTES = 2 * 1024 * 1024
MAX_DIFF_CHARS = 200_000
SHOWN_LOG_BYTES = 32 * 1024  # of a job's log on the page
REPORT_FILES = ("REPORT.md", "plot.svg", "result.json")
_FILE_DIFF = re.compile(r"(?m)^(?=diff --git )")
_DIFF_HEADER = re.compile(r"diff --git a/\S+ b/(\S+)")


def _image(
    self: RendererHTML, tokens: list[Token], idx: int, options: OptionsDict, env: EnvType
) -> str:
    # Only the report's own plot is shown (from our route): REPORT.md's `plot.svg`, or the
    # dashboard link a pull request body gives it. Any other image becomes its alt text.
    token = tokens[idx]
    alt = self.renderInlineAsText(token.children or [], options, env)
    src = token.attrGet("src")
    if src and src in ("plot.svg", env.get("plot_link")) and isinstance(env.get("plot_url"), str):
        return f'<img src="{escape(env["plot_url"])}" alt="{escape(alt)}" class="plot">'
    return str(escape(alt))


_markdown = MarkdownIt("commonmark", {"html": False, "linkify": False}).enable("table")
_markdown.add_render_rule("image", _image)


def render_markdown(
    text: str, *, plot_url: str | None = None, plot_link: str | None = None
) -> Markup:
    """Markdown to HTML with raw HTML escaped and unsafe link schemes refused. The image
    `plot.svg` (or `plot_link`, the same plot as a pull request body links it) shows from
    `plot_url`."""
    html = _markdown.render(text, {"plot_url": plot_url, "plot_link": plot_link})
    return Markup(html)  # noqa: S704 - markdown-it escapes all text; raw HTML is off


def render_inline(text: str) -> Markup:
    """One line of Markdown (a report's gate or stop line) as inline HTML, as safe as
    `render_markdown`."""
    return Markup(_markdown.renderInline(text, {}))  # noqa: S704 - as render_markdown


def report_file(
    settings: Settings, stores: Stores, cycle: Cycle, project: ProjectRef, name: str
) -> str | None:
    """One of REPORT.md, plot.svg, result.json of the cycle's commit, or None when it has none."""
    if name not in REPORT_FILES or cycle.commit_sha is None:
        return None
    relative = f"{report.results_dir(str(cycle.id))}/{name}"
    try:
        text = GitWork(settings).show(project.name, cycle.commit_sha, relative)
    except (GitFailed, AutopilotError):
        return None
    if text is None or len(text) > MAX_FILE_BYTES:
        return None
    return text


def result_json(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def environment(result: dict[str, Any]) -> list[tuple[str, str]]:
    env = result.get("environment")
    if not isinstance(env, dict):
        return []
    shown = []
    for key in sorted(env):
        value = env[key]
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
        shown.append((str(key), text[:500]))
    return shown


def diff(settings: Settings, stores: Stores, project: ProjectRef, cycle: Cycle) -> str | None:
    """The local forge's diff of the cycle's PR without its report files (truncated), or None
    for GitHub or without a PR."""
    if settings.forge != "local" or cycle.pr_number is None:
        return None
    try:
        text = LocalForge(settings, stores).diff(project, cycle.pr_number)
    except (GitFailed, AutopilotError) as exc:
        return f"(the diff is unavailable: {exc})"
    text = without_report(text, report.results_dir(str(cycle.id)))
    if len(text) > MAX_DIFF_CHARS:
        return text[:MAX_DIFF_CHARS] + "\n… (truncated; fetch the branch to see all of it)"
    return text


def without_report(text: str, directory: str) -> str:
    """A unified diff without the files under the cycle's results `directory`: the review page
    shows the report once, beside the diff, and the diff is left with the code. A last line
    names the files left out."""
    kept, left = [], []
    for part in _FILE_DIFF.split(text):
        header = _DIFF_HEADER.match(part)
        if header is not None and header.group(1).startswith(directory + "/"):
            left.append(header.group(1))
        else:
            kept.append(part)
    if not left:
        return text
    note = f"… {', '.join(left)}: the cycle's report, shown on this page, left out of the diff\n"
    return "".join(kept) + note


def comments(
    settings: Settings, stores: Stores, project: ProjectRef, number: int | None
) -> list[str]:
    if settings.forge != "local" or number is None:
        return []
    try:
        return LocalForge(settings, stores).comments(project, number)
    except AutopilotError:
        return []


def log_tail(settings: Settings, job: Job | None, max_bytes: int = SHOWN_LOG_BYTES) -> str | None:
    """The end of the job's log (whole lines): from the log its GPU host uploaded, else from the
    tail the DB keeps while it runs; None when there is neither."""
    if job is None:
        return None
    path = logs.stored_log(settings, job)
    if path is not None:
        return logs.tail_text(path, max_bytes)
    return None if job.log_tail is None else logs.trim_tail(job.log_tail, max_bytes)
