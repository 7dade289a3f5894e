"""The keep rule of a research line (docs/design.md, "Research lines";
docs/experiments.md, "Keeping a step of a research line: error control over a campaign").

A campaign's step is a cycle started at the line's tip. Its candidate is **kept** (the line
fast-forwards to it) only when

(a) the step's judged comparison is a win the judge trusts: the quality gate passed, the
    verdict is one of the judge's `WINS`, its numbers came from a source the candidate cannot
    write (`trusted`), and its figures agree with the verdict: the whole confidence interval
    lies on the improving side of 1 and the ratio clears the A/A noise floor; and
(b) a confirmation of the same comparison (fresh blocks, a new seed, the same stopping rule)
    is such a win too.

Anything else is discarded with one of `REASONS` and a sentence a reviewer can read. Among
parallel steps from one tip that are all confirmed, `best_of` takes the one whose confirmation
measured the largest improvement and supersedes the others. These are pure functions
of the judge's output (`judge`), with no database: the campaign stores what they return.

**Error control** (`ErrorBudget`). Under no effect the arms of a block are exchangeable (their
order is drawn from the seed), so the stopping rule (`autopilot_harness.sequential`) claims an
effect with chance <= alpha however often it looks, and by symmetry an improvement with chance
<= alpha / 2. A keep needs that twice, on independent blocks, so a step with no real effect is
kept with chance at most

    alpha_step = (alpha / 2) ** 2 = 0.000625 at the rule's default alpha = 0.05,

whatever happened earlier in the campaign (each test holds given the past, since its blocks
and seed are fresh). So the false keeps of a campaign of n null steps are stochastically no
more than Binomial(n, alpha_step): their expectation is <= n * alpha_step, and for n = 40,
E <= 0.025 and P(more than 2) <= 2.4e-6 (Markov alone, with no independence, gives <= 0.0083).
A rule that keeps on one win has alpha_step = 0.025: E <= 1 and P(more than 2) <= 0.078. The
rule's default level already meets "at most 2 false keeps in a 40-step campaign"; a longer
campaign or a tighter goal sets `ErrorBudget.for_campaign`'s alpha in the rule it writes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

from autopilot_harness import sequential, stats

from app.cycles.judge.command import WINS
from app.cycles.judge.figures import FIGURES

#: Why a step is discarded.
Reason = Literal[
    "loss", "null", "gate_failed", "self_reported", "confirmation_failed", "superseded"
]
REASONS: tuple[Reason, ...] = get_args(Reason)
#: Which way the metric improves (the spec's `direction`).
Direction = Literal["lower", "higher"]

#: The judge's verdicts that are neither a win nor a loss (`autopilot_harness.stats.Verdict`;
#: a test checks that they are its words). Any other verdict but `WINS` is a loss.
_REJECTED, _INCONCLUSIVE = "rejected_accuracy", "inconclusive"
#: The level of a fixed design's test: its bootstrap interval's.
FIXED_ALPHA = 1.0 - stats.DEFAULT_CONFIDENCE


class KeepError(ValueError):
    """The keep rule was asked a question it must not answer: a win with no confirmation, a
    confirmation that reused the step's seed, or a comparison judged above the budget's level."""


# -- the error budget -------------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorBudget:
    """The false keeps a campaign risks, from `alpha`: the two-sided level of each of a step's
    two tests (the stopping rule's `alpha`; a fixed design's is `FIXED_ALPHA`)."""

    alpha: float = sequential.DEFAULT_ALPHA

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 0.5:
            raise KeepError(f"a test's level alpha must lie in (0, 0.5), got {self.alpha}")

    @property
    def one_sided(self) -> float:
        """The chance that one test of a null step claims an improvement."""
        return self.alpha / 2

    @property
    def per_step(self) -> float:
        """The chance that a null step is kept: two independent one-sided wins."""
        return self.one_sided**2

    def expected_false_keeps(self, steps: int) -> float:
        """The bound on the expected false keeps of a campaign of `steps` null steps."""
        return steps * self.per_step

    def chance_of_more_than(self, false_keeps: int, steps: int) -> float:
        """The bound on P(more than `false_keeps` false keeps in `steps` null steps): the upper
        tail of Binomial(steps, per_step)."""
        return binomial_tail(steps, self.per_step, false_keeps + 1)

    @classmethod
    def for_campaign(cls, steps: int, more_than: int, chance: float) -> ErrorBudget:
        """The largest level (to 4 significant figures, at most the rule's default) at which a
        campaign of `steps` null steps has more than `more_than` false keeps with chance at most
        `chance`: the alpha to write in its rule."""
        if steps < 1 or more_than < 0 or not 0.0 < chance < 1.0:
            raise KeepError(
                f"a campaign needs steps >= 1, more_than >= 0 and chance in (0, 1); got "
                f"{steps}, {more_than}, {chance}"
            )
        best = cls()
        if best.chance_of_more_than(more_than, steps) <= chance:
            return best
        low, high = 0.0, best.alpha
        for _ in range(60):  # the tail grows with alpha: bisect
            mid = (low + high) / 2
            if cls(mid).chance_of_more_than(more_than, steps) <= chance:
                low = mid
            else:
                high = mid
        if low <= 0.0:
            raise KeepError(f"no level keeps P(more than {more_than}) <= {chance} over {steps}")
        digits = 3 - math.floor(math.log10(low))  # 4 significant figures, rounded down
        return cls(math.floor(low * 10**digits) / 10**digits)


def binomial_tail(n: int, p: float, k: int) -> float:
    """P(X >= k) for X ~ Binomial(n, p), summed in log space (no overflow at large n)."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    total = 0.0
    for j in range(k, n + 1):
        log_term = (
            math.lgamma(n + 1)
            - math.lgamma(j + 1)
            - math.lgamma(n - j + 1)
            + j * log_p
            + (n - j) * log_q
        )
        total += math.exp(log_term)
    return min(1.0, total)


DEFAULT_BUDGET = ErrorBudget()


# -- what the rule reads of a judged comparison -----------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """What the keep rule reads of one judged comparison, candidate against the line's tip
    (`from_judged` reads it off the judge's output)."""

    verdict: str  # the judge's word: faster, better, slower, worse, inconclusive, ...
    ratio: float  # candidate / baseline
    ci_low: float
    ci_high: float
    floor: float  # the A/A noise floor, relative
    direction: Direction = "lower"
    gate_passed: bool = True  # the quality gate (none: passed)
    trusted: bool = True  # every number from a source the candidate cannot write
    self_reported: bool = False  # the metric was read from the changed code's output
    metric_source: str = "harness"
    seed: int | None = None
    blocks: int | None = None
    decision: str | None = None  # where the stopping rule stopped: effect, equivalent, max
    alpha: float = sequential.DEFAULT_ALPHA  # the level the comparison was tested at

    @classmethod
    def from_judged(cls, judged: Mapping[str, Any]) -> Comparison:
        """The comparison of a judged result (`judge`, command or harness kind): its headline,
        which carries the verdict, the figures, the floor and where the numbers came from."""
        head = _table(judged.get("headline")) or judged
        verdict = head.get("verdict", judged.get("verdict"))
        if not isinstance(verdict, str):
            raise KeepError(f"the judged result has verdict {verdict!r}: it was never judged")
        figures = [_number(head.get(k, judged.get(k)), k) for k in FIGURES]
        floor = head.get("noise_floor")
        if not isinstance(floor, int | float):
            floor = _table(judged.get("noise_floor")).get("floor")
        judgement = _table(judged.get("judgement"))
        direction: Direction = "lower"  # a harness result times: lower
        if judgement.get("direction") == "higher":
            direction = "higher"
        elif judgement.get("direction") not in (None, "lower"):
            raise KeepError(f"the judged result has direction {judgement['direction']!r}")
        stopped = _table(judged.get("stopped")) or _table(
            _table(judged.get("head_vs_base")).get("stopped")
        )
        rule = _table(stopped.get("rule"))
        blocks = stopped.get("blocks", judged.get("n"))
        seed = judgement.get("seed")
        return cls(
            verdict=verdict,
            ratio=figures[0],
            ci_low=figures[1],
            ci_high=figures[2],
            floor=_number(floor, "noise_floor"),
            direction=direction,
            gate_passed=head.get("accuracy_pass") is not False and verdict != _REJECTED,
            trusted=head.get("trusted", judged.get("trusted")) is not False,
            self_reported=head.get("self_reported", judged.get("self_reported")) is True,
            metric_source=str(
                head.get("metric_source") or judged.get("metric_source") or "harness"
            ),
            seed=seed if isinstance(seed, int) else None,
            blocks=blocks if isinstance(blocks, int) else None,
            decision=str(stopped["decision"]) if "decision" in stopped else None,
            alpha=float(rule["alpha"]) if "alpha" in rule else FIXED_ALPHA,
        )

    @property
    def improves(self) -> bool:
        """The ratio points the improving way."""
        return self.ratio < 1.0 if self.direction == "lower" else self.ratio > 1.0

    @property
    def clears(self) -> bool:
        """The figures of a win: the whole interval on the improving side of 1, and the ratio
        beyond the A/A floor (what the judge's verdict rests on, checked again here)."""
        beyond_one = self.ci_high < 1.0 if self.direction == "lower" else self.ci_low > 1.0
        return self.improves and beyond_one and abs(self.ratio - 1.0) > self.floor

    @property
    def assured_gain(self) -> float:
        """The improvement the interval's bound nearest no change assures (relative; < 0 when
        the interval does not clear 1)."""
        return 1.0 - self.ci_high if self.direction == "lower" else self.ci_low - 1.0

    def describe(self) -> str:
        where = []
        if self.blocks is not None:
            where.append(f"{self.blocks} blocks")
        if self.seed is not None:
            where.append(f"seed {self.seed}")
        at = f" ({', '.join(where)})" if where else ""
        return f"{self.verdict}, ratio {self.ratio:.4f} [{self.ci_low:.4f}, {self.ci_high:.4f}]{at}"


def _table(raw: Any) -> Mapping[str, Any]:
    return raw if isinstance(raw, Mapping) else {}


def _number(raw: Any, key: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        raise KeepError(f"the judged result's {key} is {raw!r}, not a number: it cannot be kept")
    return float(raw)


# -- the rule ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Keep:
    """The line fast-forwards to the step's candidate."""

    sentence: str

    @property
    def kept(self) -> bool:
        return True


@dataclass(frozen=True)
class Discard:
    """The step's candidate is not kept, for `reason`."""

    reason: Reason
    sentence: str

    @property
    def kept(self) -> bool:
        return False


Outcome = Keep | Discard


def miss(comparison: Comparison) -> tuple[Reason, str] | None:
    """Why one comparison is not a win a keep may rest on (None: it is one). The quality gate
    comes first, then the verdict, then where the numbers came from: a self-reported loss is a
    loss, and `self_reported` names a win that only its own word makes."""
    c = comparison
    if not c.gate_passed:
        return "gate_failed", (
            f"the quality gate failed ({c.describe()}): a faster or better candidate that "
            "computes worse is no improvement"
        )
    if c.verdict not in WINS:
        if c.verdict == _INCONCLUSIVE:
            why = {
                "equivalent": "the change is within the equivalence margin",
                "max": "the rule reached its maximum of blocks undecided",
            }.get(c.decision or "", "no change beyond the noise was shown")
            return "null", (
                f"{why} ({c.describe()}, A/A floor {c.floor:.2%}): there is nothing to keep"
            )
        return "loss", f"the candidate is worse ({c.describe()})"
    if not c.trusted:
        what = (
            f"its metric was read from the output of the code it changed "
            f"(metric_source = {c.metric_source!r})"
            if c.self_reported
            else "its quality gate's value was read from the output of the code it changed"
        )
        return "self_reported", (
            f"a win by its own word ({c.describe()}): {what}, and a number the candidate can "
            "print is never kept (declare metric_source = 'wall' or 'evaluator')"
        )
    if not c.clears:
        return "null", (
            f"the verdict says {c.verdict}, but its figures ({c.describe()}) do not clear 1 "
            f"and the A/A floor of {c.floor:.2%}"
        )
    return None


def needs_confirmation(step: Comparison) -> bool:
    """Whether a step earns a confirmation run: only a win a keep may rest on does."""
    return miss(step) is None


def decide(
    step: Comparison,
    confirmation: Comparison | None = None,
    *,
    budget: ErrorBudget = DEFAULT_BUDGET,
) -> Outcome:
    """Keep the step's candidate, or discard it with its reason. A step that fails on its own
    is discarded without a confirmation (`confirmation` may be None); a step that wins needs
    one, judged on fresh blocks with a new seed. Raises `KeepError` for a winning step with no
    confirmation, a confirmation with the step's seed or another direction, or a comparison
    tested above `budget.alpha`."""
    _within(step, budget, "step")
    found = miss(step)
    if found is not None:
        reason, why = found
        return Discard(reason, f"Discarded ({reason.replace('_', ' ')}): {why}.")
    if confirmation is None:
        raise KeepError(
            "the step is a trusted win, kept only once a confirmation (fresh blocks, a new "
            "seed, the same rule) wins too: run it and decide again"
        )
    _within(confirmation, budget, "confirmation")
    if step.seed is not None and confirmation.seed == step.seed:
        raise KeepError(
            f"the confirmation ran with the step's own seed {step.seed}: its blocks are not "
            "fresh, so it confirms nothing"
        )
    if confirmation.direction != step.direction:
        raise KeepError("the confirmation judged another direction than the step: not the same")
    found = miss(confirmation)
    if found is not None:
        return Discard(
            "confirmation_failed",
            f"Discarded (confirmation failed): the step won ({step.describe()}), but its "
            f"confirmation did not: {found[1]}.",
        )
    return Keep(
        f"Kept: the step won ({step.describe()}, A/A floor {step.floor:.2%}) and its "
        f"confirmation on fresh blocks won too ({confirmation.describe()}, A/A floor "
        f"{confirmation.floor:.2%}), measured by {step.metric_source}, the quality gate "
        "passed both times."
    )


def _within(comparison: Comparison, budget: ErrorBudget, label: str) -> None:
    if comparison.alpha > budget.alpha * (1 + 1e-9):
        raise KeepError(
            f"the {label} was tested at alpha = {comparison.alpha:g}, above the campaign's "
            f"budget of {budget.alpha:g}: write the budget's alpha in the stopping rule"
        )


# -- parallel steps from one tip --------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a campaign: its name (a cycle's id, say), its comparison against the tip
    and, when it earned one, its confirmation."""

    name: str
    comparison: Comparison
    confirmation: Comparison | None = None


@dataclass(frozen=True)
class Choice:
    """The confirmed step that advances the line, why, and the others, superseded."""

    chosen: str
    sentence: str
    superseded: Mapping[str, Discard]


def best_of(confirmed: Sequence[Step], *, budget: ErrorBudget = DEFAULT_BUDGET) -> Choice:
    """Of parallel steps from one tip, each kept by `decide`, the one that advances the line:
    the largest improvement its confirmation measured (its ratio; the confirmation's, since the
    step's own estimate is the one that was selected for winning), then the largest its
    confirmation's interval assures (the bound nearest no change), then the name. Not the bound
    first: a sequential confirmation stops at the first look where its interval clears 1, so
    every confirmed bound sits just past 1 and ranking by it is ranking by noise. The others
    are superseded: each may be proposed again at the new tip. No head-to-head run compares
    them: the choice is by their estimates against the same tip. Raises `KeepError` for a step
    that is not kept."""
    if not confirmed:
        raise KeepError("best_of needs at least one confirmed step")
    for s in confirmed:
        if not isinstance(decide(s.comparison, s.confirmation, budget=budget), Keep):
            raise KeepError(f"step {s.name!r} is not a confirmed keep: it cannot advance the line")
    if len({s.comparison.direction for s in confirmed}) > 1:
        raise KeepError("parallel steps from one tip judge one metric: their directions differ")

    def gain(s: Step) -> float:
        assert s.confirmation is not None  # decide kept it
        return s.confirmation.assured_gain

    def measured(s: Step) -> float:
        """The improvement the confirmation measured, relative (its ratio's distance from 1)."""
        assert s.confirmation is not None
        return abs(math.log(s.confirmation.ratio))

    def rank(s: Step) -> tuple[float, float, str]:
        return (-measured(s), -gain(s), s.name)

    def shown(s: Step) -> str:
        assert s.confirmation is not None
        return f"ratio {s.confirmation.ratio:.4f}, at least {gain(s):.2%}"

    ordered = sorted(confirmed, key=rank)
    best = ordered[0]
    others = "; ".join(f"{s.name} {shown(s)}" for s in ordered[1:])
    sentence = (
        f"{best.name} advances the line: its confirmation measured the largest improvement of "
        f"the {len(confirmed)} confirmed step(s) from this tip ({shown(best)} by its interval's "
        "bound nearest no change)" + (f" (the others: {others})." if others else ".")
    )
    superseded = {
        s.name: Discard(
            "superseded",
            f"Discarded (superseded): confirmed, but {best.name} from the same tip measured more "
            f"({shown(best)}, against {shown(s)}); the line takes one candidate per tip, and this "
            "one may be proposed again at the new tip.",
        )
        for s in ordered[1:]
    }
    return Choice(best.name, sentence, superseded)


def settle(steps: Sequence[Step], *, budget: ErrorBudget = DEFAULT_BUDGET) -> dict[str, Outcome]:
    """Each of a round's parallel steps from one tip: its outcome by `decide`, and among the
    keeps, all but `best_of`'s choice superseded."""
    if len({s.name for s in steps}) != len(steps):
        raise KeepError("parallel steps need distinct names")
    outcomes: dict[str, Outcome] = {
        s.name: decide(s.comparison, s.confirmation, budget=budget) for s in steps
    }
    kept = [s for s in steps if isinstance(outcomes[s.name], Keep)]
    if len(kept) > 1:
        choice = best_of(kept, budget=budget)
        outcomes.update(choice.superseded)
        chosen = outcomes[choice.chosen]
        outcomes[choice.chosen] = Keep(f"{chosen.sentence} {choice.sentence}")
    return outcomes
