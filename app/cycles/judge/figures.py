"""What the harness and the command judges share: who judged, the figures a verdict rests on,
and the bound on what an untrusted report may make the judge compute."""

from __future__ import annotations

JUDGE = "control-plane"
#: The figures of a verdict, in a result, a comparison and a headline alike.
FIGURES = ("ratio", "ci_low", "ci_high")
# The bootstrap holds n_boot x n resampled values: the untrusted report must not choose how
# much of the control host's memory a judgement takes (10k pairs: ~320 MB at most).
MAX_PAIRS = 10_000
