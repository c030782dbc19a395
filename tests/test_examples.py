"""Every example in examples/ runs to completion (as a user would run it) and prints something."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).parent.parent / "examples"
EXAMPLES = sorted(_ROOT.glob("*.py")) + sorted(_ROOT.glob("*/run.py"))


def test_examples_exist():
    names = {str(p.relative_to(_ROOT)) for p in EXAMPLES}
    assert {"demo.py", "cpp_caller/run.py", "aot_export/run.py"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: str(p.relative_to(_ROOT)))
def test_example_runs(path, tmp_path):
    # (PYTHONPATH: the checkout under test, whatever mxq the interpreter has installed)
    path_before = os.environ.get("PYTHONPATH")
    env = dict(os.environ, MXQ_CACHE_DIR=str(tmp_path / "cache"), PYTHONWARNINGS="ignore",
               MXQ_CPP_BUILD=str(tmp_path / "cpp"), MXQ_AOT_BUILD=str(tmp_path / "aot"),
               PYTHONPATH=os.pathsep.join([str(_ROOT.parent), *([path_before] if path_before else [])]))
    r = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=600,
                       env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip(), "an example should show its result"
