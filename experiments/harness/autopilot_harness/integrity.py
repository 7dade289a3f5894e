"""Whether the harness's own code was changed in memory while it ran.

The code under test runs in the harness's process, so it can reach the harness's modules and
replace a function, a method or a function's code (`CpuTimer.time_ns`, `timing.run_pair`,
`accuracy.check`). `Snapshot` records, once the harness is loaded and before any variant
runs, every function, class and constant of the harness's modules (and each class's methods,
with their code and defaults); `changed()` lists what differs afterwards. A run with a change is
refused. This raises the cost of tampering; it cannot prove its absence: code in the same
process could change the snapshot too (docs/experiments.md, "What the harness defends
against").
"""

from __future__ import annotations

import sys
import types
from typing import Any

_PACKAGE = "autopilot_harness"


def _entries(obj: Any) -> dict[str, Any]:
    if isinstance(obj, types.FunctionType):
        return {"": obj, "__code__": obj.__code__, "__defaults__": obj.__defaults__}
    return {"": obj}


def _state() -> dict[str, Any]:
    state: dict[str, Any] = {}
    for name, module in list(sys.modules.items()):
        if module is None or not (name == _PACKAGE or name.startswith(_PACKAGE + ".")):
            continue
        state[f"{name} (module)"] = module
        for attr, value in list(vars(module).items()):
            where = f"{name}.{attr}"
            if attr.isupper():  # a constant (SPOT_CHECKS, WATCHED...): the same object after
                state[where] = value
                continue
            if getattr(value, "__module__", None) != name:
                continue
            if isinstance(value, types.FunctionType):
                for key, item in _entries(value).items():
                    state[f"{where}{'.' + key if key else ''}"] = item
            elif isinstance(value, type):
                state[where] = value
                for member, item in list(vars(value).items()):
                    if isinstance(item, types.FunctionType | staticmethod | classmethod):
                        fn = item.__func__ if not isinstance(item, types.FunctionType) else item
                        for key, part in _entries(fn).items():
                            state[f"{where}.{member}{'.' + key if key else ''}"] = part
                    elif not member.startswith("__"):  # a class's setting (overhead_ns...)
                        state[f"{where}.{member}"] = item
    return state


class Snapshot:
    """The harness's functions and classes as they are now."""

    def __init__(self) -> None:
        self._state = _state()

    def changed(self) -> list[str]:
        """What of the snapshot was replaced or removed since."""
        now = _state()
        changed = {k for k, v in self._state.items() if now.get(k) is not v}
        # a replaced function has another code too: name the function only
        return sorted(k for k in changed if k.rsplit(".", 1)[0] not in changed)
