"""The control plane's judgement of an experiment's result: the code under test never judges
itself (docs/design.md, "The code under test never judges itself").

`judge` is the one entry: a harness experiment's result is judged by `harness.judge_harness`
(paired samples per variant, the accuracy gate, the A/A floor), a command experiment's by
`command.judge_command` (candidate arm against baseline arm, from every run's value); what both
share is `figures`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from app.cycles.judge.command import judge_command
from app.cycles.judge.harness import judge_harness

#: Judgements already made, by the digest of what they judged (see `judge`), newest last.
_MADE: OrderedDict[str, dict[str, Any]] = OrderedDict()
_MADE_MAX = 64
_made_lock = threading.Lock()


def judge(result: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The judgement of `result` under `spec` (`_judgement`), made once per result. It is a
    pure computation (seeded bootstraps), so the steps that ask again (analyze, commit and
    publish each read the job afresh) get a copy of the one already made, not three runs of
    the bootstraps (16 ms each at 200 samples)."""
    try:
        text = json.dumps([result, spec], sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):  # not what a job's JSON column holds: judge it as it is
        return _judgement(result, spec)
    key = hashlib.sha256(text.encode()).hexdigest()
    with _made_lock:
        made = _MADE.get(key)
        if made is not None:
            _MADE.move_to_end(key)
    if made is None:
        made = _judgement(result, spec)  # raises Unjudgeable, which is not kept
        with _made_lock:
            _MADE[key] = made
            while len(_MADE) > _MADE_MAX:
                _MADE.popitem(last=False)
    return copy.deepcopy(made)


def _judgement(result: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The judged copy of `result` under the job's `spec`, by the judge of its kind (the spec's,
    written by the control plane at submission, never the result's)."""
    if spec.get("kind") == "command":
        return judge_command(result, spec)
    return judge_harness(result, spec)
