"""bench/gpu_tests.py (the sharded GPU-test runner of a device call), on the CPU: its log parsing
on a hand-written pytest log, and a whole run over a small test file of its own with a passing,
a failing and a too-slow test."""

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from .test_codegen import _bench_tool

LOG = textwrap.dedent("""\
    ============================= test session starts ==============================
    tests/test_a.py::test_one[bf16-256] PASSED                               [ 25%]
    tests/test_a.py::test_one[fp32-256] FAILED                               [ 50%]
    tests/test_a.py::test_two SKIPPED (no CUDA)                              [ 75%]
    tests/test_b.py::test_three ERROR                                        [100%]
    =================================== FAILURES ===================================
    ____________________________ test_one[fp32-256] ____________________________
        def test_one(dtype, n):
    >       assert got == want
    E       assert 3 == 4
    tests/test_a.py:10: AssertionError
    =========================== short test summary info ============================
    FAILED tests/test_a.py::test_one[fp32-256] - assert 3 == 4
    ERROR tests/test_b.py::test_three - RuntimeError: boom
    ============== 1 failed, 1 passed, 1 skipped, 1 error in 1.00s ===============
    """)


def test_parse_reads_outcomes_messages_and_tracebacks():
    tool = _bench_tool("gpu_tests")
    outcomes, messages, sections = tool.parse(LOG)
    assert outcomes == {"tests/test_a.py::test_one[bf16-256]": "PASSED", "tests/test_a.py::test_one[fp32-256]": "FAILED",
                        "tests/test_a.py::test_two": "SKIPPED", "tests/test_b.py::test_three": "ERROR"}
    assert messages == {"tests/test_a.py::test_one[fp32-256]": "assert 3 == 4",
                        "tests/test_b.py::test_three": "RuntimeError: boom"}
    assert "E       assert 3 == 4" in sections["test_one[fp32-256]"]
    # a log cut by the timeout still gives what finished
    cut = "\n".join(LOG.splitlines()[:3])
    assert tool.parse(cut)[0] == {"tests/test_a.py::test_one[bf16-256]": "PASSED", "tests/test_a.py::test_one[fp32-256]": "FAILED"}


def test_shards_deal_round_robin_and_report_counts_every_test():
    tool = _bench_tool("gpu_tests")
    ids = [f"t.py::t{i}" for i in range(10)]
    shards = tool.shard(ids, 3)
    assert shards == [ids[0::3], ids[1::3], ids[2::3]] and sorted(sum(shards, [])) == sorted(ids)
    ids = list(tool.parse(LOG)[0]) + ["tests/test_c.py::test_never"]
    text, status = tool.report(tool.shard(ids, 2), [LOG, ""], 12.0)
    assert text.startswith("5 tests in 2 shards, 12 s: 1 passed, 1 failed, 1 error, 1 skipped, 1 did not finish")
    assert "FAILED tests/test_a.py::test_one[fp32-256] - assert 3 == 4" in text and "E       assert 3 == 4" in text
    assert "did not finish (timeout):\n  tests/test_c.py::test_never" in text
    assert status == 1
    assert tool.report([["tests/test_a.py::test_one[bf16-256]"]], [LOG], 1.0)[1] == 0


def test_whole_run_on_a_small_test_file(tmp_path, monkeypatch):
    """Three shards over a file of its own: the report counts the pass, names the failure with its
    assertion and lists the test the timeout stopped; the exit status says a test failed. Each
    shard sees one of the visible GPUs (CUDA_VISIBLE_DEVICES)."""
    tool = _bench_tool("gpu_tests")
    f = tmp_path / "test_sample.py"
    f.write_text(textwrap.dedent("""\
        import os
        import time

        def test_ok():
            assert os.environ["CUDA_VISIBLE_DEVICES"] in ("7", "9")

        def test_bad():
            assert 1 + 1 == 3

        def test_slow():
            time.sleep(60)
        """))
    out = tmp_path / "report.txt"
    monkeypatch.chdir(tmp_path)  # (node ids are relative to where pytest runs)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,9")
    status = tool.main([f.name, "--shards", "3", "--timeout", "10", "--marker", "not gpu", "--out", str(out)])
    text = out.read_text()
    assert status == 1
    assert text.startswith("3 tests in 3 shards") and "1 passed, 1 failed, 1 did not finish" in text.splitlines()[0]
    assert "FAILED " in text and "test_sample.py::test_bad" in text and "assert (1 + 1) == 3" in text
    assert "test_sample.py::test_slow" in text.split("did not finish (timeout):")[1]


def test_a_failure_in_a_shard_the_timeout_kills_keeps_its_traceback(tmp_path, monkeypatch):
    """The failure's traceback is printed when it happens (the module as the shards' pytest plugin),
    so a report whose shard was killed after it still shows the assertion."""
    tool = _bench_tool("gpu_tests")
    f = tmp_path / "test_killed.py"
    f.write_text(textwrap.dedent("""\
        import time

        def test_bad():
            assert 2 + 2 == 5

        def test_slow():
            time.sleep(60)
        """))
    out = tmp_path / "report.txt"
    monkeypatch.chdir(tmp_path)
    status = tool.main([f.name, "--shards", "1", "--timeout", "10", "--marker", "not gpu", "--out", str(out)])
    text = out.read_text()
    assert status == 1 and "1 failed, 1 did not finish" in text.splitlines()[0]
    assert "FAILED test_killed.py::test_bad" in text and "assert (2 + 2) == 5" in text
    per_file = text.split("time in the tests' calls, per file")[1].split("\n\n")[0].splitlines()[1:]
    assert len(per_file) == 1 and per_file[0].split()[2:] == ["1", "tests", "test_killed.py"]
    slowest = text.split("the 1 slowest tests:\n")[1].splitlines()
    assert len(slowest) == 1 and slowest[0].split()[1:] == ["s", "test_killed.py::test_bad"]
    assert tool.rerun_ids(text) == ["test_killed.py::test_bad", "test_killed.py::test_slow"]


def test_a_run_killed_from_outside_leaves_a_report_a_rerun_can_take(tmp_path):
    """A device call's limit kills the whole run, not only its shards: the report rewritten while
    the shards run already counts the finished test and lists the running one as unfinished."""
    f = tmp_path / "test_cut.py"
    f.write_text("import time\n\ndef test_ok():\n    pass\n\ndef test_slow():\n    time.sleep(120)\n")
    out = tmp_path / "report.txt"
    tool = Path(__file__).resolve().parent.parent / "bench" / "gpu_tests.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tool.parent.parent), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.Popen([sys.executable, str(tool), f.name, "--shards", "1", "--timeout", "300", "--every", "1",
                            "--marker", "not gpu", "--out", str(out)], cwd=tmp_path, env=env,
                           start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        end = time.time() + 60
        while time.time() < end and not (out.exists() and "1 passed" in out.read_text()):
            time.sleep(0.5)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    text = out.read_text()
    assert text.startswith("2 tests in 1 shards") and "1 passed, 1 did not finish" in text.splitlines()[0]
    assert text.splitlines()[1].startswith("kernel layer ")
    assert "test_cut.py::test_slow" in text.split("did not finish (timeout):")[1]


def test_a_module_that_fails_to_collect_stops_the_run(tmp_path, monkeypatch):
    """A test module that cannot be imported drops its tests from pytest's listing, and a suite of
    the rest passes: collect refuses it, naming the module, and no report (or record) is written,
    nor a run detached."""
    import pytest

    tool = _bench_tool("gpu_tests")
    (tmp_path / "test_fine.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "test_broken.py").write_text("import no_such_module_here\n\ndef test_b():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o.txt"
    with pytest.raises(SystemExit, match="test_broken.py"):
        tool.main([".", "--marker", "not gpu", "--out", str(out)])
    with pytest.raises(SystemExit, match="test_broken.py"):  # (--detach collects before it detaches)
        tool.main([".", "--detach", "--marker", "not gpu", "--out", str(out)])
    assert not out.exists() and not (tmp_path / "o.txt.pid").exists()
    assert tool.collect(["test_fine.py"], "not gpu", None) == ["test_fine.py::test_a"]


def test_record_is_written_only_for_a_whole_passing_suite(tmp_path):
    """--record: a suite cut by -k cannot write the record; the record holds the hash the CPU test
    (tests/test_gpu_record.py) compares."""
    import json

    import pytest

    from mxq.frontend.codegen import kernels_hash

    tool = _bench_tool("gpu_tests")
    with pytest.raises(SystemExit):
        tool.main(["-k", "one", "--record", str(tmp_path / "r.json"), "--out", str(tmp_path / "o.txt")])
    rec = tool.write_record(tmp_path / "r.json", "3 tests in 1 shards, 1 s: 3 passed\n")
    assert rec["kernels_hash"] == kernels_hash() and rec["summary"].endswith("3 passed")
    assert json.loads((tmp_path / "r.json").read_text()) == rec


def test_rerun_takes_the_failed_and_unfinished_tests_and_its_record_counts_both_runs(tmp_path):
    """--rerun REPORT: the ids a whole run's report lists as failed, erroring or unfinished; a
    report of another kernel layer is refused; the record's summary holds the whole run's passes
    and the rerun's, and no failure count (what tests/test_gpu_record.py reads)."""
    import re

    import pytest

    from mxq.frontend.codegen import kernels_hash

    tool = _bench_tool("gpu_tests")
    report = ("10 tests in 2 shards, 5 s: 7 passed, 2 failed\nkernel layer 0123\n\n"
              "FAILED tests/test_a.py::test_x[1] - AssertionError\n    tb\n\nERROR tests/test_b.py::test_y\n\n"
              "did not finish (timeout):\n  tests/test_c.py::test_z\n")
    assert tool.rerun_ids(report) == ["tests/test_a.py::test_x[1]", "tests/test_b.py::test_y", "tests/test_c.py::test_z"]
    spaced = "tests/test_a.py::test_x[block=(128, 128)-dtype0]"  # (a parameter id with a space: still rerun)
    assert tool.rerun_ids(report.replace("test_x[1] - AssertionError", f"{spaced[17:]} - AssertionError: a - b")
                          ) == [spaced, "tests/test_b.py::test_y", "tests/test_c.py::test_z"]
    assert tool.rerun_ids(f"FAILED {spaced}\n") == [spaced]
    path = tmp_path / "before.txt"
    path.write_text(report)
    with pytest.raises(SystemExit):  # (kernel layer 0123 is not this tree's)
        tool.main(["--rerun", str(path), "--out", str(tmp_path / "o.txt")])
    assert kernels_hash() != "0123"
    summary = tool.rerun_summary(report.splitlines()[0], "3 tests in 1 shards, 2 s: 3 passed", 3)
    assert summary == ("10 tests: 7 passed in a whole run (10 tests in 2 shards, 5 s), the other 3 (failed or "
                       "unfinished there) in a rerun on the same kernel layer (3 passed)")
    assert tool.rerun_summary("9 tests in 2 shards, 5 s: 7 passed, 2 did not finish", "2 tests in 1 shards, 1 s: 2 passed",
                              2).endswith("the other 2 (unfinished there) in a rerun on the same kernel layer (2 passed)")
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|error|did not finish)", summary))
    assert "failed" not in counts and counts["passed"] > 0
    chain = tool.rerun_summary("2775 tests in 16 shards, 560 s: 1868 passed, 907 did not finish",
                               "1 tests in 1 shards, 60 s: 1 passed", 1,
                               ["907 tests in 16 shards, 553 s: 757 passed, 3 failed, 147 did not finish",
                                "150 tests in 16 shards, 223 s: 149 passed, 1 failed"])
    assert chain == ("2775 tests: 1868 passed in a whole run (2775 tests in 16 shards, 560 s), 757 of the other 907 "
                     "(unfinished there) in a rerun (907 tests in 16 shards, 553 s), 149 of the remaining 150 (failed "
                     "or unfinished there) in a second rerun (150 tests in 16 shards, 223 s), the last 1 (failed or "
                     "unfinished there) in a third rerun on the same kernel layer (1 passed)")
    counts = dict((k, int(v)) for v, k in re.findall(r"(\d+) (passed|failed|error|did not finish)", chain))
    assert "failed" not in counts and "did not finish" not in chain and re.findall(r"(\d+) passed", chain)[0] == "1868"


def test_a_rerun_of_reruns_takes_the_last_reports_tests_and_checks_every_report(tmp_path, monkeypatch):
    """--rerun WHOLE,RERUN: the tests the last report left; every report must name this kernel layer."""
    import pytest

    from mxq.frontend.codegen import kernels_hash

    tool = _bench_tool("gpu_tests")
    layer = f"kernel layer {kernels_hash()}"
    whole, first = tmp_path / "whole.txt", tmp_path / "first.txt"
    whole.write_text(f"3 tests in 1 shards, 5 s: 1 passed, 2 did not finish\n{layer}\n\ndid not finish (timeout):\n"
                     "  test_r.py::test_a\n  test_r.py::test_b\n")
    first.write_text(f"2 tests in 1 shards, 5 s: 1 passed, 1 did not finish\n{layer}\n\ndid not finish (timeout):\n"
                     "  test_r.py::test_b\n")
    (tmp_path / "test_r.py").write_text("def test_a():\n    pass\n\ndef test_b():\n    pass\n")
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o.txt"
    status = tool.main(["--rerun", f"{whole},{first}", "--marker", "not gpu", "--out", str(out)])
    assert status == 0 and out.read_text().startswith("1 tests in 1 shards") and "1 passed" in out.read_text()
    first.write_text("2 tests in 1 shards, 5 s: 1 passed\nkernel layer 0123\n")
    with pytest.raises(SystemExit):
        tool.main(["--rerun", f"{whole},{first}", "--marker", "not gpu", "--out", str(out)])


def test_shards_share_the_visible_gpus_round_robin(monkeypatch):
    """Shard n runs on GPU n % (visible GPUs): CUDA_VISIBLE_DEVICES's entries where it is set,
    else nvidia-smi's count, else one."""
    tool = _bench_tool("gpu_tests")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    gpus = tool.visible_gpus()
    assert gpus == ["3", "5"]
    assert [tool.shard_env(n, gpus)["CUDA_VISIBLE_DEVICES"] for n in range(5)] == ["3", "5", "3", "5", "3"]
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setenv("PATH", "/nonexistent")  # (no nvidia-smi)
    assert tool.visible_gpus() == ["0"]


def test_report_lists_the_slowest_tests_and_a_rerun_takes_only_the_unfinished():
    """The slowest tests' section names tests too: the rerun's list ends where the unfinished list
    does."""
    tool = _bench_tool("gpu_tests")
    log = "\n".join([f"gpu_tests: {t} s t.py::t{i}\nt.py::t{i} PASSED" for i, t in enumerate((3.0, 9.5, 1.25))])
    text, status = tool.report([["t.py::t0", "t.py::t1", "t.py::t2", "t.py::t3"]], [log], 20.0, slowest=2)
    assert status == 2 and "3 passed, 1 did not finish" in text.splitlines()[0]
    assert text.split("the 2 slowest tests:\n")[1].splitlines() == ["       9.5 s  t.py::t1", "       3.0 s  t.py::t0"]
    assert tool.rerun_ids(text) == ["t.py::t3"]
    log += "\ngpu_tests: 2.5 s t.py::tp[a]\nt.py::tp[a] PASSED\ngpu_tests: 4.5 s t.py::tp[b]\nt.py::tp[b] PASSED"
    text, _ = tool.report([["t.py::t0", "t.py::t1", "t.py::t2", "t.py::tp[a]", "t.py::tp[b]"]], [log], 20.0, slowest=2)
    funcs = text.split("the 2 test functions of most time (all their parameters):\n")[1].split("\n\n")[0]
    assert [ln.split() for ln in funcs.splitlines()] == [["10", "s", "1", "tests", "t.py::t1"],
                                                         ["7", "s", "2", "tests", "t.py::tp"]]


def test_shards_hold_their_cpu_threads_to_their_share(monkeypatch):
    """Each shard's torch and inductor threads: the cores over the shards (at least one), unless
    the caller set them."""
    tool = _bench_tool("gpu_tests")
    for v in tool.THREAD_VARS:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setattr(tool.os, "sched_getaffinity", lambda pid: set(range(16)))  # (the cores this process may use)
    env = tool.shard_env(3, ["0"], 4)
    assert [env[v] for v in tool.THREAD_VARS] == ["4", "4", "4"]
    assert tool.shard_env(0, ["0"], 32)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    assert tool.shard_env(0, ["0"], 4)["OMP_NUM_THREADS"] == "7"


def test_a_detached_run_outlives_its_caller_and_wait_follows_it(tmp_path):
    """--detach returns at once with the run going on in a session of its own; --wait says it
    still runs (exit 3) until it ends, then gives the run's status and the report's first line."""
    f = tmp_path / "test_detached.py"
    gate = tmp_path / "go"
    f.write_text(f"import os, time\n\ndef test_ok():\n    pass\n\ndef test_gated():\n"
                 f"    while not os.path.exists({str(gate)!r}):\n        time.sleep(0.2)\n")
    out = tmp_path / "gpu" / "whole.txt"
    tool = Path(__file__).resolve().parent.parent / "bench" / "gpu_tests.py"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tool.parent.parent), os.environ.get("PYTHONPATH", "")]))

    def run(*args):
        return subprocess.run([sys.executable, str(tool), *args, "--out", str(out)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120)

    out.parent.mkdir()
    out.write_text("9 tests in 1 shards, 1 s: 9 passed\n")  # (an earlier run's: removed, never read as this one's)
    t0 = time.time()
    started = run(f.name, "--detach", "--shards", "2", "--timeout", "100", "--every", "1", "--marker", "not gpu")
    pid = int((tmp_path / "gpu" / "whole.txt.pid").read_text().split()[0])
    try:
        assert started.returncode == 0 and f"pid {pid}" in started.stdout and time.time() - t0 < 30
        assert os.getsid(pid) == pid  # (a session of its own: a device call's end does not kill it)
        # (collected by the caller, before it returned; the run takes these)
        assert (tmp_path / "gpu" / "whole.txt.ids").read_text().splitlines() == [f"{f.name}::test_ok",
                                                                                 f"{f.name}::test_gated"]
        waited = run("--wait", "1")
        assert waited.returncode == 3 and waited.stdout.startswith("still running: ")
        assert "9 tests" not in waited.stdout
        gate.write_text("")
        waited = run("--wait", "90")
        assert waited.returncode == 0, waited.stdout
        assert waited.stdout.strip() == out.read_text().splitlines()[0]
        assert waited.stdout.startswith("2 tests in 2 shards") and "2 passed" in waited.stdout
        assert (tmp_path / "gpu" / "whole.txt.rc").read_text() == "0\n"
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_wait_names_a_missing_run_and_abbreviations_do_not_detach(tmp_path, capsys):
    """--wait with no detached run says so (exit 2, no traceback); "--det" is not --detach (an
    abbreviation would be stripped by no one and detach again in the child, forever)."""
    import pytest

    tool = _bench_tool("gpu_tests")
    assert tool.main(["--wait", "1", "--out", str(tmp_path / "none.txt")]) == 2
    assert "no detached run" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        tool.main(["--det", "--out", str(tmp_path / "x.txt")])


def test_a_process_is_known_by_pid_and_start_time_and_its_descendants_found():
    """running(pid, start): this process with its start time, not with another one (a pid reused
    by a later process); descendants: a child's child."""
    tool = _bench_tool("gpu_tests")
    me = os.getpid()
    assert tool.running(me, tool._start_time(me)) and not tool.running(me, "1")
    outer = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"])
    try:
        end = time.time() + 30
        while time.time() < end and not tool.descendants(outer.pid):
            time.sleep(0.2)
        (inner,) = tool.descendants(outer.pid)
        assert tool.running(inner)
    finally:
        for pid in [*tool.descendants(outer.pid), outer.pid]:
            os.kill(pid, signal.SIGKILL)
        outer.wait()
