"""A program run to completion confined: under bubblewrap (unless asked not to), in a cgroup of
its own, with a time limit; and `check`, whether this host can confine at all."""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
from collections.abc import Sequence
from pathlib import Path

from app.sandbox.bwrap import BWRAP, Policy, command, env_args
from app.sandbox.cgroups import Cgroup
from app.sandbox.exceptions import SandboxTimeout, SandboxUnavailable

_READ_PLAIN = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC


@functools.cache
def check() -> str | None:
    """None when sandboxes work here; else one line saying what is missing."""
    if not os.access(BWRAP, os.X_OK):
        return (
            f"bubblewrap is not installed ({BWRAP}): `make install` or `apt-get install bubblewrap`"
        )
    probe = command(["/usr/bin/true"], Policy(cwd=Path("/"), env={}))
    try:
        done = subprocess.run(probe, env={}, capture_output=True, text=True, timeout=30)  # noqa: S603
    except subprocess.TimeoutExpired:
        return "bwrap did not finish /usr/bin/true within 30 s"
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return f"bwrap cannot create its namespaces (user namespaces refused?): {why}"
    try:
        Cgroup.create(f"check-{os.getpid()}").remove()
    except SandboxUnavailable as exc:
        return str(exc).partition(". AUTOPILOT_SANDBOX")[0]
    return None


def run(
    argv: Sequence[str],
    policy: Policy,
    *,
    name: str,
    timeout_s: float,
    log_path: Path,
    sandbox: bool = True,
    stdin: Path | None = None,
) -> int:
    """Run `argv` to completion in its own cgroup, confined by `policy` unless `sandbox` is
    False; output to `log_path`, its stdin the file `stdin` (else /dev/null). Nothing it
    started outlives the call."""
    if sandbox and (reason := check()):
        raise SandboxUnavailable(reason)
    cgroup: Cgroup | None = None
    try:
        cgroup = Cgroup.create(name)
    except SandboxUnavailable:
        if sandbox:
            raise
    env_fd: int | None = None
    if sandbox:
        # bwrap gets an empty environment: --clearenv hides it from the child but not from
        # /proc/1/environ inside the sandbox, which shows bwrap's own initial environment.
        env_fd = env_args(policy)
        args, env, cwd = command(argv, policy, env_fd=env_fd), {}, None
    else:
        args, env, cwd = list(argv), policy.environment(), policy.cwd
    try:
        # Never through a link a sandboxed run could have planted where its log goes.
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        with contextlib.ExitStack() as files:
            log = files.enter_context(os.fdopen(os.open(log_path, flags, 0o600), "ab"))
            feed = (
                files.enter_context(os.fdopen(os.open(stdin, _READ_PLAIN), "rb"))
                if stdin is not None
                else subprocess.DEVNULL
            )
            proc = subprocess.Popen(  # noqa: S603
                args,
                env=env,
                cwd=cwd,
                stdin=feed,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=() if env_fd is None else (env_fd,),
                preexec_fn=cgroup.preexec() if cgroup else None,  # noqa: PLW1509
            )
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise SandboxTimeout(
                f"{argv[0]} ran past its time limit of {timeout_s:g} s and was killed; "
                f"its output is in {log_path}"
            ) from None
        finally:
            if cgroup is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            else:
                cgroup.kill()
            proc.wait()
    finally:
        if env_fd is not None:
            os.close(env_fd)
        if cgroup is not None:
            cgroup.remove()
