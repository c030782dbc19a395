"""mxq/_version.py: the one definition of the version, read without importing mxq."""

import ast
import re
from pathlib import Path

import mxq

ROOT = Path(__file__).resolve().parent.parent


def test_version_is_read_from_its_own_file_without_importing_mxq():
    tree = ast.parse((ROOT / "mxq" / "_version.py").read_text())
    assert not any(isinstance(n, (ast.Import, ast.ImportFrom)) for n in ast.walk(tree))
    (assign,) = [n for n in tree.body if isinstance(n, ast.Assign)]
    assert assign.targets[0].id == "__version__" and mxq.__version__ == assign.value.value
    assert re.fullmatch(r"\d+\.\d+\.\d+", mxq.__version__)


def test_pyproject_takes_the_version_from_it():
    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'^dynamic = \["version"\]$', text, re.M)
    assert re.search(r'^version = \{ attr = "mxq\._version\.__version__" \}$', text, re.M)
    assert not re.search(r'^version = "', text, re.M)


def test_no_module_climbs_back_to_the_package_for_it():
    """Modules below mxq/__init__.py read the version from mxq/_version.py (importing mxq's
    __init__ from inside the package would be an import climbing back up)."""
    for path in (ROOT / "mxq").rglob("*.py"):
        if path.name == "__init__.py" and path.parent.name == "mxq":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any(a.name == "__version__" for a in node.names):
                assert node.module is not None and node.module.endswith("_version"), path
