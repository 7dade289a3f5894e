"""What can go wrong while an agent proposes."""

from __future__ import annotations

from app.errors import InvalidInput


class NothingToPropose(InvalidInput):
    slug = "nothing-to-propose"
    title = "Nothing left to propose"


class AgentFailed(InvalidInput):
    slug = "agent-failed"
    title = "The agent produced no usable proposal"
