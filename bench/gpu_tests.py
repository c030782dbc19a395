"""Run the GPU tests in parallel shards and write one report (for device calls).

    python bench/gpu_tests.py [--shards 7] [--timeout 300] [--out FILE] [-k EXPR] [PATHS...]
    python bench/gpu_tests.py --rerun REPORT[,REPORT...] [--record FILE]
    python bench/gpu_tests.py --detach --out /tmp/gpu/whole.txt [...]; ... --wait 570 --out /tmp/gpu/whole.txt

Run from the repository root (node ids are relative to it). Collects the tests marked ``gpu``
(``--marker``) under PATHS (default ``tests/``), deals them
round-robin to ``--shards`` pytest processes (they compile their kernels in parallel; the GPU
runs them one after another; on a machine of several GPUs shard n runs on GPU n % ``--gpus``,
all visible ones by default), stops them all ``--timeout`` seconds after the start, and writes
one text file:
counts, every failed or erroring test with pytest's summary line and the head of its traceback
(printed by each shard when it happens: this module is the shards' pytest plugin, so a shard
killed at the time limit keeps its tracebacks), the tests that did not finish, and the seconds
the calls took (compiles included) per test file, per test function (the costliest) and of the
slowest tests. Each shard's CPU threads (torch's references, inductor's compiles) are held to its
share of the cores. One file, because a device call returns a limited number of files and may lose
some of several shard logs. Exits 1 if a test failed or
errored, 2 if none failed but some did not finish. While the shards run, the report is rewritten
every ``--every`` seconds (with the tests not finished yet as unfinished), so a run killed from
outside (a device call's own limit) still leaves one that ``--rerun`` can take.

``--rerun REPORT`` runs again only the tests a whole run's report lists as failed, erroring or
unfinished (after fixes to those tests: the kernel layer must be the one the report names on its
second line), and with ``--record`` writes the record when they all pass: every GPU test has then
passed on this kernel layer, most in the whole run and these in the rerun, which the record's
summary says. A rerun that leaves some unfinished is rerun in turn: ``--rerun WHOLE,RERUN1,...``
takes the last report's tests, and the record counts each run.

The whole suite takes longer than one device call. ``--detach`` collects the tests (a collection
error stops it there), starts the run of them in a process session of its own, which outlives the
call on a machine kept warm, and returns (an earlier run's report, record and status removed
first); each following call runs ``--wait SECONDS`` (the same ``--out``), which returns when the
run ends (its status in OUT.rc) or the seconds pass and prints the report's first line (exit 3
while it runs), then copies the report to ``$OUT``. No test is cut and restarted at a call's end;
if the machine goes back mid-run, the last copy is a report ``--rerun`` takes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
_RESULT = re.compile(r"^(?P<id>\S.*?) (?P<out>" + "|".join(OUTCOMES) + r")\b")
# (a node id may hold spaces, "test_x[block=(128, 128)]": it ends at the first " - " or the line's end)
_SUMMARY = re.compile(r"^(?P<out>FAILED|ERROR) (?P<id>\S.*?)(?: - (?P<msg>.*))?$")
_SECTION = re.compile(r"^_{3,} (?P<name>.+?) _{3,}$")
_DURATION = re.compile(r"^gpu_tests: (?P<s>[\d.]+) s (?P<id>\S.*)$", re.M)


def collect(paths, marker: str, kexpr: str | None) -> list[str]:
    """Node ids of the tests pytest would run with ``-m marker`` (and ``-k kexpr``)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", marker, "--co", *paths]
    if kexpr:
        cmd += ["-k", kexpr]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode not in (0, 5):  # (5: nothing collected)
        # a module that fails to import drops its tests from the listing, and a suite run on the
        # rest passes: refuse, so that no partial suite is reported or recorded as the whole one
        errors = [line for line in done.stdout.splitlines() if line.startswith("ERROR ")]
        raise SystemExit(f"gpu_tests: collecting the tests failed (pytest exit {done.returncode}):\n"
                         + "\n".join(errors or done.stdout.splitlines()[-20:] + done.stderr.splitlines()[-20:]))
    return [line.strip() for line in done.stdout.splitlines() if "::" in line and not line.startswith(" ")]


def shard(ids: list[str], k: int) -> list[list[str]]:
    """Deal ``ids`` round-robin to ``k`` shards (neighbouring, similar tests spread out)."""
    return [ids[i::k] for i in range(k)]


def visible_gpus() -> list[str]:
    """The GPUs the shards may use: CUDA_VISIBLE_DEVICES's entries where it is set, else one
    index per GPU ``nvidia-smi -L`` lists (["0"] where it lists none or is missing)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip()] or ["0"]
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    n = sum(line.startswith("GPU ") for line in out.splitlines())
    return [str(i) for i in range(max(n, 1))]


THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")


def shard_env(n: int, gpus: list[str], shards: int = 1) -> dict:
    """The environment of shard ``n`` of ``shards``: this one with CUDA_VISIBLE_DEVICES the shard's
    one GPU, this directory on PYTHONPATH (the shards load this module as a pytest plugin: ``-p
    gpu_tests``), and the CPU threads of each shard's torch (its references on the CPU) and
    inductor (torch.compile tests) held to its share of the cores, where the caller set none:
    shards that each start one thread per core oversubscribe the machine."""
    path = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")) if p)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    share = str(max(1, cores // max(1, shards)))
    return {**{v: share for v in THREAD_VARS}, **os.environ,
            "CUDA_VISIBLE_DEVICES": gpus[n % len(gpus)], "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """(In a shard, as a pytest plugin, after pytest's own line.) A failure's traceback printed when
    it happens, as a section ``parse`` reads, so a shard killed at the time limit still shows why
    its failures failed (pytest prints its own sections only at the end of a run); and each test's
    call time, which ``report`` sums per file (compiles included: where the suite's time goes)."""
    if report.when == "call":
        print(f"\ngpu_tests: {report.duration:.1f} s {report.nodeid}", flush=True)
    if report.failed:
        print(f"\n{'_' * 8} {report.nodeid.split('::')[-1]} {'_' * 8}\n{report.longreprtext}\n"
              f"{'=' * 8} end of {report.nodeid} in this shard {'=' * 8}", flush=True)


def durations(text: str) -> dict[str, float]:
    """Seconds per node id from a shard's log (the plugin's lines)."""
    return {m["id"]: float(m["s"]) for m in _DURATION.finditer(text)}


def parse(text: str) -> tuple[dict[str, str], dict[str, str], dict[str, str]]:
    """From one pytest ``-v -rfE`` log: (outcome per node id, summary message per failed id,
    traceback text per failure section title). A log cut short by a timeout still gives the
    outcomes of the tests that finished."""
    outcomes, messages, sections = {}, {}, {}
    current, lines = None, []
    for line in text.splitlines():
        m = _SUMMARY.match(line)
        if m:
            messages[m["id"]] = m["msg"] or ""
            outcomes.setdefault(m["id"], m["out"])
            continue
        m = _RESULT.match(line)
        if m and "::" in m["id"]:
            outcomes[m["id"]] = m["out"]
            continue
        m = _SECTION.match(line)
        if m:
            if current:
                sections[current] = "\n".join(lines)
            current, lines = m["name"], []
        elif current is not None:
            if line.startswith("=") and ("short test summary" in line or " in " in line):
                sections[current] = "\n".join(lines)
                current = None
            else:
                lines.append(line)
    if current:
        sections[current] = "\n".join(lines)
    return outcomes, messages, sections


def report(shards: list[list[str]], logs: list[str], elapsed: float, max_traceback: int = 40,
           slowest: int = 20) -> tuple[str, int]:
    """The combined report and the exit status (0 all passed, 1 a failure, 2 unfinished only)."""
    outcomes, messages, sections = {}, {}, {}
    for text in logs:
        o, m, s = parse(text)
        outcomes.update(o)
        messages.update(m)
        sections.update(s)
    ids = [i for s in shards for i in s]
    counts = {k: 0 for k in OUTCOMES}
    for i in ids:
        if i in outcomes:
            counts[outcomes[i]] += 1
    bad = [i for i in ids if outcomes.get(i) in ("FAILED", "ERROR")]
    unfinished = [i for i in ids if i not in outcomes]
    parts = [f"{v} {k.lower()}" for k, v in counts.items() if v]
    parts += [f"{len(unfinished)} did not finish"] if unfinished else []
    lines = [f"{len(ids)} tests in {len(shards)} shards, {elapsed:.0f} s: " + (", ".join(parts) or "none run")]
    for i in bad:
        lines.append(f"\n{outcomes[i]} {i}" + (f" - {messages[i]}" if messages.get(i) else ""))
        title = i.split("::")[-1]
        tb = next((t for name, t in sections.items() if name.endswith(title)), None)
        if tb:
            tb_lines = tb.splitlines()
            lines += ["    " + ln for ln in tb_lines[-max_traceback:]]
    if unfinished:
        lines.append("\ndid not finish (timeout):")
        lines += [f"  {i}" for i in unfinished]
    took = {}
    for text in logs:
        took.update(durations(text))
    if took:
        files = {}
        for i, t in took.items():
            f = files.setdefault(i.split("::")[0], [0.0, 0])
            f[0], f[1] = f[0] + t, f[1] + 1
        lines.append(f"\ntime in the tests' calls, per file ({sum(took.values()):.0f} s in all, compiles included):")
        lines += [f"  {t:8.0f} s {n:5d} tests  {f}" for f, (t, n) in sorted(files.items(), key=lambda kv: -kv[1][0])]
        funcs = {}
        for i, t in took.items():
            f = funcs.setdefault(i.split("[")[0], [0.0, 0])
            f[0], f[1] = f[0] + t, f[1] + 1
        top = sorted(funcs.items(), key=lambda kv: -kv[1][0])[:slowest]
        lines.append(f"\nthe {len(top)} test functions of most time (all their parameters):")
        lines += [f"  {t:8.0f} s {n:5d} tests  {f}" for f, (t, n) in top]
        lines.append(f"\nthe {min(slowest, len(took))} slowest tests:")
        lines += [f"  {t:8.1f} s  {i}" for i, t in sorted(took.items(), key=lambda kv: -kv[1])[:slowest]]
    return "\n".join(lines) + "\n", 1 if bad else 2 if unfinished else 0


RECORD = Path(__file__).resolve().parent / "results" / "gpu-suite.json"


def rerun_ids(text: str) -> list[str]:
    """The node ids a report lists as failed, erroring or unfinished."""
    ids, unfinished = [], False
    for line in text.splitlines():
        m = _SUMMARY.match(line)
        if m:
            ids.append(m["id"])
        elif line.startswith("did not finish"):
            unfinished = True
        elif unfinished and line.startswith("  ") and "::" in line:
            ids.append(line.strip())
        elif unfinished:  # (the list ends at its first other line: the time sections name tests too)
            unfinished = False
    return ids


def rerun_summary(whole: str, rerun: str, k: int, between: tuple[str, ...] | list[str] = ()) -> str:
    """The record's summary of a whole run's report (its first line ``whole``) completed by reruns
    on the same kernel layer: ``between``, the first lines of earlier reruns' reports in order
    (each ran what the report before it left failed or unfinished), and the last rerun, of ``k``
    tests, whose report's first line is ``rerun``."""
    def passed(line: str) -> str:
        m = re.search(r"(\d+) passed", line)
        return m[1] if m else "0"

    def why(line: str) -> str:
        return "failed or unfinished there" if re.search(r"(\d+) failed", line) else "unfinished there"

    def nth(i: int) -> str:
        return ("", "second ", "third ", "fourth ")[i] if i < 4 else f"{i + 1}th "

    parts = [f"{int(whole.split(' tests', 1)[0])} tests: {passed(whole)} passed in a whole run ({whole.split(': ', 1)[0]})"]
    prev = whole
    for i, line in enumerate(between):
        parts.append(f"{passed(line)} of the {'remaining' if i else 'other'} {int(line.split(' tests', 1)[0])} "
                     f"({why(prev)}) in a {nth(i)}rerun ({line.split(': ', 1)[0]})")
        prev = line
    parts.append(f"the {'last' if between else 'other'} {k} ({why(prev)}) in a {nth(len(between))}rerun on the same "
                 f"kernel layer ({rerun.split(': ', 1)[1]})")
    return ", ".join(parts)


def write_record(path: Path, text: str) -> dict:
    """The committed record of a whole GPU suite that passed (tests/test_gpu_record.py holds the
    kernel layer to it): the kernel layer's hash (the one every generated module carries), the
    counts line of the report, the device, torch and the date."""
    import torch

    from mxq.frontend.codegen import kernels_hash

    rec = {"kernels_hash": kernels_hash(), "summary": text.splitlines()[0],
           "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "none",
           "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rec, indent=1) + "\n")
    return rec


DETACHED = "MXQ_GPU_TESTS_DETACHED"  # set in a detached run: it writes OUT.rc when it ends, and never detaches
IDS = "MXQ_GPU_TESTS_IDS"  # set in a detached run: the file of the tests its caller collected


def _stat(pid) -> list[str] | None:
    """Process ``pid``'s /proc/PID/stat fields after its name (state, ppid, ...; the start time is
    [19]), None where it cannot be read."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """The pids of ``pid``'s children, theirs, and so on (from /proc; [] where it cannot be read)."""
    children: dict = {}
    for d in Path("/proc").glob("[0-9]*"):
        fields = _stat(d.name)
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(d.name))
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def _side(out: Path, suffix: str) -> Path:
    return out.with_name(out.name + suffix)


def detach(argv: list[str], out: Path, record: str | None, ids: list[str] | None = None) -> int:
    """Run this tool with ``argv`` in a process session of its own (a device call's end kills only
    its own session's processes): its output in OUT.log, its pid and start time in OUT.pid, its
    exit status in OUT.rc when it ends; ``ids``: the tests the caller collected (OUT.ids), which
    it runs instead of collecting. An earlier run's report, record and status are removed first,
    so none of them passes for this run's."""
    out.parent.mkdir(parents=True, exist_ok=True)
    for old in (out, _side(out, ".part"), _side(out, ".rc"), _side(out, ".ids"), *([Path(record)] if record else [])):
        old.unlink(missing_ok=True)
    env = {**os.environ, DETACHED: "1"}
    if ids is not None:
        _side(out, ".ids").write_text("".join(f"{i}\n" for i in ids))
        env[IDS] = str(_side(out, ".ids"))
    with open(_side(out, ".log"), "w") as log:
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                env=env)
    _side(out, ".pid").write_text(f"{proc.pid} {_start_time(proc.pid)}\n")
    print(f"detached: pid {proc.pid}, report {out}", flush=True)
    return 0


def _start_time(pid: int) -> str:
    """Process ``pid``'s start time (/proc/PID/stat field 22), "" where it cannot be read: with
    the pid it names one process, not a later one given the same pid."""
    fields = _stat(pid)
    return fields[19] if fields is not None else ""


def running(pid: int, start: str = "") -> bool:
    """Whether process ``pid`` (started at ``start``, where given) is alive; a zombie nobody reaped
    yet has ended, and a process started at another time is another process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    fields = _stat(pid)
    if fields is None:
        return True
    return fields[0] != "Z" and (not start or fields[19] == start)


def wait(out: Path, seconds: float) -> int:
    """Wait up to ``seconds`` for the detached run writing ``out`` to end; print the first line of
    its report (as it stands, while it runs). Exit status as the run's (OUT.rc), 3 while it still
    runs; a run that ended without one (killed) is read from its report: 1 a failure, else 2."""
    pidfile, rcfile = _side(out, ".pid"), _side(out, ".rc")
    if not pidfile.exists():
        print(f"no detached run writes {out} (no {pidfile.name}: start one with --detach)", flush=True)
        return 2
    pid, _, start = pidfile.read_text().strip().partition(" ")
    end = time.time() + seconds
    while not rcfile.exists() and running(int(pid), start) and time.time() < end:
        time.sleep(max(0.0, min(2.0, end - time.time())))
    done = rcfile.exists()
    alive = not done and running(int(pid), start)
    first = out.read_text().split("\n", 1)[0] if out.exists() else f"no report yet (see {_side(out, '.log')})"
    print(("still running: " if alive else "") + first, flush=True)
    if alive:
        return 3
    if done:
        return int(rcfile.read_text().strip() or 2)
    return 1 if re.search(r"\d+ (failed|error)\b", first) else 2


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    ap.add_argument("paths", nargs="*", default=["tests/"])
    ap.add_argument("--shards", type=int, default=7)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per shard")
    ap.add_argument("--every", type=float, default=20.0, help="seconds between the reports written while running")
    ap.add_argument("--gpus", type=int, default=0, help="GPUs the shards share (0: every visible one)")
    ap.add_argument("--marker", default="gpu", help="pytest -m expression (default: gpu)")
    ap.add_argument("-k", dest="kexpr", default=None)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu-tests.txt"))
    ap.add_argument("--rerun", metavar="REPORT[,REPORT...]", help="run only the failed or unfinished tests of a whole "
                    "run's report (or of the last of a whole run's report and its reruns', in order)")
    ap.add_argument("--detach", action="store_true", help="collect the tests, start their run in a process "
                    "session of its own and return (the run outlives a device call; --out outside $OUT, which each "
                    "call empties)")
    ap.add_argument("--wait", type=float, metavar="SECONDS", help="wait up to SECONDS for the detached run "
                    "writing --out to end, print its report's first line; exit 3 while it still runs")
    ap.add_argument("--record", metavar="FILE", help="after a whole suite (default paths, marker and no -k) that "
                    f"passed, write its record there (commit it as {RECORD.relative_to(RECORD.parents[2])})")
    args = ap.parse_args(argv)
    if args.wait is not None:
        return wait(Path(args.out), args.wait)
    whole = args.paths == ["tests/"] and args.marker == "gpu" and args.kexpr is None
    if args.record and not whole:
        ap.error("--record needs the whole GPU suite: no paths, -k or --marker")
    if args.detach and not os.environ.get(DETACHED):
        # (collected here, in the call: a run detached while collecting came back with a third of
        # the suite collected and no error; the detached run takes these ids, OUT.ids)
        ids = None if args.rerun else collect(args.paths, args.marker, args.kexpr)
        return detach([a for a in (sys.argv[1:] if argv is None else argv) if a != "--detach"], Path(args.out),
                      args.record, ids)
    status = 2
    try:
        status = run(args, ap, whole)
    finally:
        if os.environ.get(DETACHED):  # (what --wait reads: the run has ended, with this status)
            _side(Path(args.out), ".rc").write_text(f"{status}\n")
    return status


def run(args, ap, whole: bool) -> int:
    """The run ``main`` parsed: collect (or take a report's tests), shard, write the report."""
    from mxq.frontend.codegen import kernels_hash

    layer = f"kernel layer {kernels_hash()}"
    t0 = time.time()
    if args.rerun:
        paths = args.rerun.split(",")
        reports = [Path(p).read_text() for p in paths]
        for path, text in zip(paths, reports):
            named = text.splitlines()[1:2]
            if named != [layer]:
                ap.error(f"--rerun: {path} names {named[0] if named else 'no kernel layer'}; this tree has {layer}")
        ids = rerun_ids(reports[-1])
    elif os.environ.get(IDS):
        ids = Path(os.environ[IDS]).read_text().splitlines()
    else:
        ids = collect(args.paths, args.marker, args.kexpr)
    shards = [s for s in shard(ids, max(1, args.shards)) if s]
    gpus = visible_gpus()
    gpus = gpus[:args.gpus] if args.gpus > 0 else gpus
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for n, ids_n in enumerate(shards):
            log = open(Path(tmp) / f"shard{n}.txt", "w")
            cmd = [sys.executable, "-m", "pytest", "-v", "-rfE", "-p", "no:cacheprovider", "-p", "gpu_tests",
                   "-m", args.marker, *ids_n]
            procs.append((subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                           env=shard_env(n, gpus, len(shards))), log))
        def write() -> tuple[str, str, int]:
            logs = [(Path(tmp) / f"shard{n}.txt").read_text(errors="replace") for n in range(len(procs))]
            text, status = report(shards, logs, time.time() - t0)
            first, rest = text.split("\n", 1)
            text = f"{first}\n{layer}\n{rest}"
            out = Path(args.out)
            out.parent.mkdir(parents=True, exist_ok=True)
            part = out.with_name(out.name + ".part")
            part.write_text(text)
            os.replace(part, out)  # (a reader, or a kill, never sees half a report)
            return text, first, status

        deadline, written = t0 + args.timeout, time.time()
        while any(p.poll() is None for p, _ in procs) and time.time() < deadline:
            time.sleep(min(0.5, max(0.0, deadline - time.time())))
            if time.time() - written >= args.every:
                write()
                written = time.time()
        for p, log in procs:
            if p.poll() is None:  # (its own children too: inductor's compile workers would outlive it)
                for pid in [*descendants(p.pid), p.pid]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            p.wait()
            log.close()
        text, first, status = write()
    print(first, flush=True)
    if args.record and status == 0 and ids:
        write_record(Path(args.record), rerun_summary(reports[0].splitlines()[0], first, len(ids),
                                                      [r.splitlines()[0] for r in reports[1:]])
                     if args.rerun else text)
        print("recorded", args.record, flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
