"""The research agent as an LLM on any OpenAI-compatible chat-completions endpoint (a hosted
API, or a local vLLM, llama.cpp or Ollama server).

It asks for the proposal as a JSON object (json_schema, else json_object, else plain text),
checks every reply as the service would (schema, declared space, no repeat, a diff that applies
and spares the protected paths) and sends each refusal back to the model for another try.
The key travels only in the client's requests: never in a log, an error, the exchange record
or a child process's environment (`git apply` gets a minimal one, like every git call).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import openai
from pydantic import SecretStr

from app.agents import prompt, reply, service
from app.agents.exceptions import AgentFailed
from app.agents.reply import Refused
from app.agents.service import Context, Proposal
from app.agents.workspace import Workspace
from app.errors import InvalidInput
from app.git import runner as gitrunner
from app.projects.config import AgentConfig
from app.redaction import redact_text
from app.sandbox import bwrap, confined
from app.sandbox.exceptions import SandboxTimeout
from app.settings import Settings

log = logging.getLogger(__name__)

#: The ways of asking for JSON, best first; a server that rejects one gets the next.
MODES = ("json_schema", "json_object", "text")
#: Sent when no key is configured: the client insists on one, local servers ignore it.
NO_KEY = "no-key"  # noqa: S105 - a placeholder, not a secret
_TRANSIENT = (openai.RateLimitError, openai.APIConnectionError, openai.InternalServerError)
_FIRST_BACKOFF_S = 1.0
_MAX_BACKOFF_S = 30.0
_GIT_TIMEOUT_S = 60.0
_MAX_LISTED_FILES = 5000


@dataclass
class _Reply:
    content: str | None
    finish_reason: str | None
    tokens: int


@dataclass
class LLMAgent:
    """Proposes through a chat model; see the module docstring. `exchange` and `tokens` hold
    this agent's last `propose` even when it failed, so a failed cycle can keep them too."""

    base_url: str
    model: str
    api_key: SecretStr | None
    timeout_s: float
    config: AgentConfig
    workspace: Workspace | None  # None: a proposal may not carry a diff
    time_limit_s: float
    run_name: str  # names the cgroups of its `git apply` runs
    sandboxed: bool = True
    max_retries: int = 2  # the client's own retries of one request (429, 5xx, timeouts)
    name: str = "llm"
    exchange: list[dict[str, Any]] = field(default_factory=list, repr=False)
    tokens: int = 0
    mode: str = MODES[0]  # how JSON is asked for; the endpoint's 400s move it down MODES
    tokens_option: str = "max_tokens"
    send_temperature: bool = True

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        agent_config: AgentConfig,
        workspace: Workspace | None,
        run_name: str,
    ) -> LLMAgent:
        if not settings.llm_base_url:
            raise AgentFailed(
                '[agent] kind = "llm" needs an OpenAI-compatible endpoint: set '
                "AUTOPILOT_LLM_BASE_URL (e.g. https://api.openai.com/v1 or a local "
                "http://127.0.0.1:8001/v1)"
            )
        model = agent_config.model or settings.llm_model
        if not model:
            raise AgentFailed(
                '[agent] kind = "llm" needs a model: set AUTOPILOT_LLM_MODEL or [agent] model '
                "in autopilot.toml"
            )
        return cls(
            base_url=settings.llm_base_url,
            model=model,
            api_key=settings.llm_api_key,
            timeout_s=settings.llm_timeout_s,
            config=agent_config,
            workspace=workspace,
            time_limit_s=agent_config.time_limit_s,
            run_name=run_name,
            sandboxed=settings.sandbox == "on",
        )

    # -- the loop ----------------------------------------------------------------------------

    def propose(self, context: Context) -> Proposal:
        self.exchange, self.tokens = [], 0
        deadline = time.monotonic() + self.time_limit_s
        client = openai.OpenAI(
            base_url=self.base_url,
            api_key=self._key() or NO_KEY,
            timeout=self.timeout_s,
            max_retries=self.max_retries,
        )
        messages: list[dict[str, str]] = prompt.messages(
            context, diff_allowed=self.workspace is not None, files=self._files()
        )
        schema = prompt.proposal_schema(context.config, diff_allowed=self.workspace is not None)
        attempts = self.config.max_attempts
        last_error = ""
        try:
            for attempt in range(1, attempts + 1):
                answer = self._ask(client, messages, schema, attempt, deadline)
                try:
                    proposal = self._accept(answer, context)
                except Refused as exc:
                    last_error = self._redact(str(exc))
                    self.exchange[-1]["error"] = last_error
                    log.info(
                        "llm agent %s: attempt %d refused: %s", self.run_name, attempt, last_error
                    )
                    messages = [
                        *messages,
                        {"role": "assistant", "content": answer.content or ""},
                        {"role": "user", "content": prompt.retry_message(last_error)},
                    ]
                    continue
                proposal.tokens, proposal.exchange = self.tokens, self.exchange
                return proposal
        finally:
            client.close()
        raise AgentFailed(f"the model gave no valid proposal in {attempts} attempts: {last_error}")

    def _ask(
        self,
        client: openai.OpenAI,
        messages: list[dict[str, str]],
        schema: dict[str, Any],
        attempt: int,
        deadline: float,
    ) -> _Reply:
        """One reply of the model, through rate limits, timeouts and a server that rejects our
        way of asking for JSON; AgentFailed when the time is up or the endpoint refuses us."""
        backoff = _FIRST_BACKOFF_S
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AgentFailed(self._out_of_time(attempt))
            record: dict[str, Any] = {
                "attempt": attempt,
                "request": {
                    "model": self.model,
                    "messages": [{**m, "content": self._redact(m["content"])} for m in messages],
                    "temperature": self.config.temperature if self.send_temperature else None,
                    "max_tokens": self.config.max_tokens,
                    "response_format": None if self.mode == "text" else self.mode,
                },
                "reply": None,
                "usage": None,
                "error": None,
            }
            self.exchange.append(record)
            try:
                completion = client.chat.completions.create(
                    model=self.model,
                    messages=messages,  # type: ignore[arg-type]
                    timeout=min(self.timeout_s, left),
                    **self._options(schema),
                )
            except _TRANSIENT as exc:
                cause = self._api_error(exc)
                record["error"] = cause
                # Some servers (older llama.cpp) answer an option they cannot honour with a 500.
                if isinstance(exc, openai.InternalServerError) and (adapted := self._adapt(cause)):
                    log.info("llm agent %s: %s", self.run_name, adapted)
                    continue
                wait = _retry_after(exc)
                wait = backoff if wait is None else wait
                backoff = min(backoff * 2, _MAX_BACKOFF_S)
                left = deadline - time.monotonic()
                if wait >= left:
                    raise AgentFailed(
                        f"the LLM endpoint {self._where()} gave no reply within the agent's "
                        f"time limit of {self.time_limit_s:g} s: {cause}"
                    ) from None
                log.warning("llm agent %s: %s; retrying in %.1f s", self.run_name, cause, wait)
                time.sleep(wait)
                continue
            except openai.APIStatusError as exc:
                cause = self._api_error(exc)
                record["error"] = cause
                adapted = self._adapt(cause) if exc.status_code in (400, 422) else None
                if adapted:
                    log.info("llm agent %s: %s", self.run_name, adapted)
                    continue
                raise AgentFailed(
                    f"the LLM endpoint {self._where()} refused the request: {cause}"
                ) from None
            except openai.OpenAIError as exc:
                cause = self._api_error(exc)
                record["error"] = cause
                raise AgentFailed(f"the LLM endpoint {self._where()} failed: {cause}") from None
            choice = completion.choices[0] if completion.choices else None
            content = choice.message.content if choice is not None else None
            usage = completion.usage
            tokens = (usage.prompt_tokens or 0) + (usage.completion_tokens or 0) if usage else 0
            self.tokens += tokens
            record["reply"] = self._redact(content) if content is not None else None
            if usage is not None:
                record["usage"] = {
                    "prompt_tokens": usage.prompt_tokens,
                    "completion_tokens": usage.completion_tokens,
                    "total_tokens": usage.total_tokens,
                }
            return _Reply(content, choice.finish_reason if choice else None, tokens)

    def _options(self, schema: dict[str, Any]) -> dict[str, Any]:
        """What this endpoint takes of our request options (see `_adapt`)."""
        options: dict[str, Any] = {self.tokens_option: self.config.max_tokens}
        if self.send_temperature:
            options["temperature"] = self.config.temperature
        if self.mode == "json_schema":
            options["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "proposal", "schema": schema, "strict": False},
            }
        elif self.mode == "json_object":
            options["response_format"] = {"type": "json_object"}
        return options

    def _adapt(self, cause: str) -> str | None:
        """After a 400 that names an option the endpoint does not take: ask without it (the
        next way of asking for JSON; `max_completion_tokens` instead of `max_tokens`; the
        model's own temperature), remembered for the later attempts. None: nothing to adapt."""
        text = cause.lower()
        if self.mode != "text" and any(w in text for w in ("response_format", self.mode)):
            self.mode = MODES[MODES.index(self.mode) + 1]
            return f"the endpoint rejects that response_format; asking with {self.mode}"
        if self.tokens_option == "max_tokens" and "max_completion_tokens" in text:
            self.tokens_option = "max_completion_tokens"
            return "the endpoint wants max_completion_tokens instead of max_tokens"
        if self.send_temperature and "temperature" in text and "support" in text:
            self.send_temperature = False
            return "the model takes no temperature; asking with its default"
        return None

    # -- checking a reply --------------------------------------------------------------------

    def _accept(self, answer: _Reply, context: Context) -> Proposal:
        if answer.content is None:
            raise Refused("the reply has no text content; send the proposal as one JSON object")
        try:
            data = reply.first_object(answer.content)
        except Refused as exc:
            if answer.finish_reason == "length":
                raise Refused(
                    f"the reply was cut off at max_tokens ({self.config.max_tokens}): {exc}; "
                    "send a shorter proposal"
                ) from None
            raise
        found = reply.candidate(data, diff_allowed=self.workspace is not None)
        proposal = found.proposal
        try:
            service.validate(proposal, context.config)
        except InvalidInput as exc:
            raise Refused(exc.detail) from None
        # A code change is part of the hypothesis: only a point without one can be a repeat
        # here (the same change at a judged point is refused by the plan step's fingerprint).
        if found.diff is None and context.is_covered(proposal.experiment, proposal.parameters):
            raise Refused(
                f"already judged or running: {proposal.experiment} with "
                f"{_shown(proposal.parameters)}; propose another point of the declared space"
            )
        if found.diff is not None:
            self._apply(found.diff, prompt.protected_paths(context.config))
        return proposal

    def _apply(self, diff: str, protected: list[str]) -> None:
        """Check the diff's paths (as git itself reads them), then `git apply --check`, then
        `git apply`, in the workspace's clone; each in the sandbox when it is on."""
        assert self.workspace is not None
        self.workspace.files.mkdir(parents=True, exist_ok=True)
        patch = self.workspace.files / "proposal.diff"
        patch.write_text(diff, encoding="utf-8")
        options = ["--recount", "--whitespace=nowarn"]
        code, out = self._git(["apply", *options, "--numstat", "-z", str(patch)], "stat")
        if code != 0:
            raise Refused(f"git apply cannot read the diff: {_git_error(out)}")
        paths = reply.numstat_paths(out) + reply.renamed_from(diff)
        if not paths:
            raise Refused("the diff changes no file; send a unified diff or null")
        reply.refuse_protected(paths, protected)
        code, out = self._git(["apply", *options, "--check", str(patch)], "check")
        if code != 0:
            raise Refused(f"the diff does not apply to the base commit: {_git_error(out)}")
        code, out = self._git(["apply", *options, str(patch)], "apply")
        if code != 0:
            raise Refused(f"the diff does not apply to the base commit: {_git_error(out)}")

    def _git(self, args: list[str], what: str) -> tuple[int, bytes]:
        assert self.workspace is not None
        env = gitrunner.minimal_env()
        env["GIT_CONFIG_COUNT"] = str(len(gitrunner.SAFE_CONFIG))
        for i, setting in enumerate(gitrunner.SAFE_CONFIG):
            env[f"GIT_CONFIG_KEY_{i}"], _, env[f"GIT_CONFIG_VALUE_{i}"] = setting.partition("=")
        log_path = self.workspace.root / f"git-{what}.log"
        log_path.unlink(missing_ok=True)
        policy = bwrap.Policy(
            cwd=self.workspace.repo,
            env=env,
            writable=[self.workspace.work],
            home=self.workspace.files,
        )
        try:
            code = confined.run(
                ["git", *args],
                policy,
                name=f"{self.run_name}-git-{what}",
                timeout_s=_GIT_TIMEOUT_S,
                log_path=log_path,
                sandbox=self.sandboxed,
            )
        except SandboxTimeout:
            raise AgentFailed(f"git {args[0]} ran past {_GIT_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise AgentFailed(f"git cannot start: {exc}") from None
        return code, log_path.read_bytes() if log_path.exists() else b""

    # -- helpers -----------------------------------------------------------------------------

    def _files(self) -> list[str]:
        """The repository's files (for the prompt), when there is a clone to change."""
        if self.workspace is None or not self.workspace.repo.is_dir():
            return []
        root, found = self.workspace.repo, []
        for folder, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d != ".git")
            for name in sorted(names):
                found.append(os.path.relpath(os.path.join(folder, name), root))
                if len(found) > _MAX_LISTED_FILES:
                    return found
        return found

    def _key(self) -> str:
        return self.api_key.get_secret_value() if self.api_key is not None else ""

    def _redact(self, text: str) -> str:
        key = self._key()
        text = redact_text(text)
        return text.replace(key, "***") if key else text

    def _api_error(self, exc: openai.OpenAIError) -> str:
        status = getattr(exc, "status_code", None)
        kind = type(exc).__name__
        body = getattr(exc, "body", None)
        message = body.get("message") if isinstance(body, dict) else None
        if not isinstance(message, str) or not message:
            message = getattr(exc, "message", None) or str(exc)
        head = f"{kind} ({status})" if status else kind
        return self._redact(f"{head}: {message}")[:2000]

    def _where(self) -> str:
        return redact_text(self.base_url)

    def _out_of_time(self, attempt: int) -> str:
        last = next((r["error"] for r in reversed(self.exchange) if r["error"]), None)
        return (
            f"the agent's time limit of {self.time_limit_s:g} s ran out at attempt {attempt} "
            f"of {self.config.max_attempts}" + (f"; last error: {last}" if last else "")
        )


def _retry_after(exc: Exception) -> float | None:
    """The server's Retry-After (seconds or an HTTP date not honoured; `retry-after-ms` too)."""
    response = getattr(exc, "response", None)
    if response is None:
        return None
    for header, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = response.headers.get(header)
        if value is None:
            continue
        try:
            seconds = float(value) * scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


def _git_error(output: bytes) -> str:
    text = output.decode(errors="replace").strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return " ".join(lines[-6:])[:1500] or "no message"


def _shown(parameters: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in sorted(parameters.items())) or "no parameters"
