"""The worked examples of `docs/examples/` run to completion (each checks its own
answers against optimistix's or lineax's and raises if they differ)."""

import os
import pathlib
import subprocess
import sys

import pytest


EXAMPLES = sorted(
    (pathlib.Path(__file__).parent.parent / "docs" / "examples").glob("*.py")
)


def test_there_are_examples():
    names = {path.name for path in EXAMPLES}
    assert {"bratu.py", "curve_fit.py", "many_rhs.py"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.stem)
def test_example_runs(path):
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip(), "the example printed nothing"
