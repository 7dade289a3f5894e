"""The hold-out evaluator of tiny-train: the loss of a trained model on points no run has seen.

    python holdout/evaluate.py --model out/model.json      # prints `holdout loss 0.0437`

It reads only the weights (`w1`, `b1`, `w2`, `b2`, as `train.py --out` writes them) and
computes the loss itself on `holdout/data.json`: whatever else the model file claims is ignored.
The autopilot runs it from the base commit after each run; `holdout/` is a hidden path, absent
from every run's tree and from the agent's view, and changed by no candidate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data.json"
MAX_WIDTH = 4096


def weights(model: object, name: str, width: int | None) -> list[float]:
    values = model.get(name) if isinstance(model, dict) else None
    if not isinstance(values, list) or not values or len(values) > MAX_WIDTH:
        raise ValueError(f"the model has no list of weights {name!r}")
    if width is not None and len(values) != width:
        raise ValueError(f"{name!r} has {len(values)} weights, the others {width}")
    out = []
    for value in values:
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or not math.isfinite(value):
            raise ValueError(f"{name!r} holds {value!r}, not a finite number")
        out.append(float(value))
    return out


def holdout_loss(model: object, points: list[list[float]]) -> float:
    w1 = weights(model, "w1", None)
    b1 = weights(model, "b1", len(w1))
    w2 = weights(model, "w2", len(w1))
    b2 = model.get("b2") if isinstance(model, dict) else None
    if isinstance(b2, bool) or not isinstance(b2, int | float) or not math.isfinite(b2):
        raise ValueError("the model has no finite bias 'b2'")
    total = 0.0
    for x, y in points:
        hidden = (math.tanh(w * x + b) for w, b in zip(w1, b1, strict=True))
        predicted = b2 + sum(w * h for w, h in zip(w2, hidden, strict=True))
        total += (predicted - y) ** 2
    return total / len(points)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="the weights train.py wrote")
    args = parser.parse_args()
    points = json.loads(DATA.read_text())["points"]
    try:
        loss = holdout_loss(json.loads(args.model.read_text()), points)
    except (OSError, ValueError) as exc:
        print(f"cannot evaluate {args.model}: {exc}", file=sys.stderr)
        return 1
    print(f"holdout loss {loss:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
