"""Train a tiny MLP to fit a noisy sine wave, with plain minibatch SGD.

The model is one hidden layer of `--width` tanh units, `y = w2 . tanh(w1 * x + b1) + b2`,
fitted to `y = sin(3x) + noise` on x in [-1, 1]. Everything is written out by hand in the
standard library, so the script runs anywhere Python does; the cost of a step grows linearly
with the width and the batch.

    python train.py                       # width 16, 200 steps
    python train.py --width 64 --steps 400 --lr 0.05 --seed 3

Every `--log-every` steps (and after the last) it prints the mean training loss and the mean
wall time of a step over that stretch, then the loss on a validation set; with `--out` it writes
the trained weights as JSON (what an evaluator reads):

    step 50 loss 0.1234 time 0.321ms
    ...
    val loss 0.0456

The same `--seed` gives the same losses, line for line.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path

TRAIN_SIZE = 512
VAL_SIZE = 256
NOISE = 0.1
FREQUENCY = 3.0
DIVERGED = 1e6  # a loss this large never comes back down: stop instead of printing nan


def target(x: float) -> float:
    return math.sin(FREQUENCY * x)


def make_dataset(size: int, rng: random.Random) -> list[tuple[float, float]]:
    """`size` points (x, sin(3x) + gaussian noise) with x uniform on [-1, 1]."""
    points = []
    for _ in range(size):
        x = rng.uniform(-1.0, 1.0)
        points.append((x, target(x) + rng.gauss(0.0, NOISE)))
    return points


class MLP:
    """One input, `width` tanh hidden units, one output."""

    def __init__(self, width: int, rng: random.Random) -> None:
        self.w1 = [rng.gauss(0.0, 1.5) for _ in range(width)]
        self.b1 = [rng.uniform(-1.0, 1.0) for _ in range(width)]
        self.w2 = [rng.gauss(0.0, 1.0 / math.sqrt(width)) for _ in range(width)]
        self.b2 = 0.0

    def hidden(self, x: float) -> list[float]:
        return [math.tanh(w * x + b) for w, b in zip(self.w1, self.b1, strict=True)]

    def as_dict(self) -> dict[str, object]:
        """The weights, as `--out` writes them."""
        return {"w1": self.w1, "b1": self.b1, "w2": self.w2, "b2": self.b2}

    def predict(self, x: float) -> float:
        return self.b2 + sum(w * h for w, h in zip(self.w2, self.hidden(x), strict=True))

    def loss(self, batch: Sequence[tuple[float, float]]) -> float:
        """Mean squared error over `batch`."""
        return sum((self.predict(x) - y) ** 2 for x, y in batch) / len(batch)

    def sgd_step(self, batch: Sequence[tuple[float, float]], lr: float) -> float:
        """One step of gradient descent on the batch's mean squared error; the loss before it."""
        width = len(self.w1)
        g_w1 = [0.0] * width
        g_b1 = [0.0] * width
        g_w2 = [0.0] * width
        g_b2 = 0.0
        total = 0.0
        scale = 2.0 / len(batch)
        for x, y in batch:
            h = self.hidden(x)
            error = self.b2 + sum(w * a for w, a in zip(self.w2, h, strict=True)) - y
            total += error * error
            d_out = scale * error
            g_b2 += d_out
            for j in range(width):
                g_w2[j] += d_out * h[j]
                d_pre = d_out * self.w2[j] * (1.0 - h[j] * h[j])
                g_w1[j] += d_pre * x
                g_b1[j] += d_pre
        for j in range(width):
            self.w1[j] -= lr * g_w1[j]
            self.b1[j] -= lr * g_b1[j]
            self.w2[j] -= lr * g_w2[j]
        self.b2 -= lr * g_b2
        return total / len(batch)


def generator(seed: int, stream: int) -> random.Random:
    """One of the run's random streams: data, init and batch order each draw from their own,
    so that changing the width leaves the data and the batches as they were."""
    return random.Random(f"{seed}/{stream}")  # noqa: S311 -- training noise, not a secret


def device_arg(text: str) -> str:
    if not re.fullmatch(r"cpu|cuda(:[0-9]+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a device: write cpu, cuda or cuda:N")
    return text


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} must be at least 1")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=positive_int, default=16, help="hidden units")
    parser.add_argument("--steps", type=positive_int, default=200, help="SGD steps")
    parser.add_argument("--batch", type=positive_int, default=16, help="examples per step")
    parser.add_argument("--lr", type=float, default=0.05, help="learning rate")
    parser.add_argument("--seed", type=int, default=0, help="seeds the data and the init")
    parser.add_argument("--device", type=device_arg, default="cpu", help="cpu or cuda:N")
    parser.add_argument(
        "--log-every", type=positive_int, default=50, help="steps between progress lines"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the weights here (JSON)")
    args = parser.parse_args(argv)
    if args.batch > TRAIN_SIZE:
        parser.error(f"--batch {args.batch} is larger than the training set ({TRAIN_SIZE})")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.device != "cpu":
        print(f"note: {args.device} asked for; this script trains on the CPU", file=sys.stderr)

    data_rng = generator(args.seed, 0)
    train = make_dataset(TRAIN_SIZE, data_rng)
    val = make_dataset(VAL_SIZE, data_rng)
    model = MLP(args.width, generator(args.seed, 1))
    batch_rng = generator(args.seed, 2)

    window_loss = 0.0
    window_time = 0.0
    window_steps = 0
    for step in range(1, args.steps + 1):
        batch = batch_rng.sample(train, args.batch)
        start = time.perf_counter()
        loss = model.sgd_step(batch, args.lr)
        window_time += time.perf_counter() - start
        if not math.isfinite(loss) or loss > DIVERGED:
            print(f"loss diverged at step {step} ({loss:.3g}): lower --lr", file=sys.stderr)
            return 1
        window_loss += loss
        window_steps += 1
        if step % args.log_every == 0 or step == args.steps:
            print(
                f"step {step} loss {window_loss / window_steps:.4f} "
                f"time {1000.0 * window_time / window_steps:.3f}ms",
                flush=True,
            )
            window_loss = window_time = 0.0
            window_steps = 0

    print(f"val loss {model.loss(val):.4f}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"width": args.width, **model.as_dict()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
