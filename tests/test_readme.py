"""The README's quickstart runs exactly as written, on CPU.

The block is the first ```python fence under the "## Quickstart" heading. It is written to a
file and executed from there in a fresh namespace: ``@mxq.fused_quant`` reads the epilogue's
source with ``inspect``, which needs a real file, as a user's script would have.
"""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def quickstart_block(text: str) -> str:
    """The first ```python block between "## Quickstart" and the next level-2 heading."""
    m = re.search(r"^## Quickstart[ \t]*\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert m, "README.md has no '## Quickstart' section"
    block = re.search(r"^```python[ \t]*\n(.*?)^```[ \t]*$", m.group(1), re.M | re.S)
    assert block, "the README's Quickstart section has no ```python block"
    return block.group(1)


def test_quickstart_block_is_found():
    code = quickstart_block(README.read_text())
    assert "import mxq" in code and "mxq.quantize(" in code and "@mxq.fused_quant" in code


def test_quickstart_runs_on_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MXQ_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "readme_quickstart.py"
    path.write_text(quickstart_block(README.read_text()))
    namespace = {"__name__": "readme_quickstart", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), namespace)
    out = capsys.readouterr().out
    assert "float8_e4m3fn" in out and "round-trip error" in out
    # the names the block defines are what it says they are
    import mxq

    assert isinstance(namespace["t"], mxq.MXFP8Tensor)
    assert namespace["t"].dbias is not None and namespace["t"].colwise_data is not None
    assert tuple(namespace["t3"].rowwise_data.shape) == (4, 64, 1024)
    assert not namespace["x"].is_cuda


DEMO = "bash .ci/setup.sh && .venv/bin/python examples/demo.py"
TESTS = "bash .ci/setup.sh && .venv/bin/python -m pytest -q -n 2"


def test_the_two_commands_are_written_as_ci_runs_them():
    """The README's demo and test commands, verbatim; .ci/run runs the second."""
    lines = README.read_text().splitlines()
    assert DEMO in lines and TESTS in lines
    assert TESTS in (README.parent / ".ci" / "run").read_text().splitlines()


def test_command_lines_name_the_checkout_python():
    """After the set-up command the venv is not active: the README's `python -m mxq` lines call
    .venv/bin/python (a bare `python -m mxq` would not find mxq)."""
    text = README.read_text()
    assert re.findall(r"\.venv/bin/python -m mxq", text)
    assert not re.findall(r"(?<![/\w])python -m mxq", text)


def test_relative_links_of_the_docs_point_at_files():
    """Every relative Markdown link in README.md, docs/ and bench/README.md names a file or
    folder of the tree (results files are renamed and deleted; the links follow)."""
    root = README.parent
    docs = [README, root / "bench" / "README.md", *sorted((root / "docs").glob("*.md"))]
    missing = []
    for doc in docs:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if "://" not in target and not (doc.parent / target).exists():
                missing.append(f"{doc.relative_to(root)}: {target}")
    assert missing == []
