"""Every example in examples/ runs to completion (as a user would run it) and prints something."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted(p for p in (Path(__file__).parent.parent / "examples").glob("*.py"))


def test_examples_exist():
    assert len(EXAMPLES) >= 1


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_runs(path, tmp_path):
    env = dict(os.environ, MXQ_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore")
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip(), "an example should show its result"
