"""Make the harness importable from the checkout whether or not it is pip-installed."""

import sys
from pathlib import Path

HARNESS = Path(__file__).resolve().parents[3] / "experiments" / "harness"
if str(HARNESS) not in sys.path:
    sys.path.insert(0, str(HARNESS))
