"""`edgekit estimate` on the command line: what its options offer and what it costs every other command."""

from __future__ import annotations


def test_the_precision_choices_are_the_ones_the_estimate_can_time_and_cost_no_import():
    """`edgekit estimate --precision` offers the Precision names without importing the estimator at start-up
    (it pulls pydantic and numpy into every edgekit command); they must stay the estimator's own list."""
    import subprocess
    import sys

    from edgekit.estimate.estimate import ASSUMED_BYTE_SCALE
    from edgekit.precision import Precision

    assert sorted(p.value for p in Precision) == sorted(ASSUMED_BYTE_SCALE)
    probe = "import sys, edgekit.cli.main as m; m.build_parser(); print('edgekit.estimate.estimate' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
