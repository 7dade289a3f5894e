"""What a sandbox refuses: it cannot be made on this host, or its run ran past its time."""

from __future__ import annotations

from app.errors import AutopilotError


class SandboxUnavailable(AutopilotError):
    status = 503
    slug = "sandbox-unavailable"
    title = "Sandbox unavailable"

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what}. AUTOPILOT_SANDBOX=off runs untrusted code unconfined (only on a host "
            "whose every user you trust)"
        )


class SandboxTimeout(AutopilotError):
    status = 504
    slug = "sandbox-timeout"
    title = "Sandboxed run timed out"
