"""bench/fixed_cost.py's host benchmark, on the CPU: its case list builds and runs (the checked
reference path), covers every kind of eager call the host-cost target names, and the timed run
refuses cleanly without CUDA."""

import torch

from .test_codegen import _bench_tool


def test_host_cases_cover_every_kind_of_call_and_run_on_the_cpu():
    tool = _bench_tool("fixed_cost")
    cases = tool.host_cases("cpu")
    names = " | ".join(c[0] for c in cases)
    for kind in ("quantize(x)", "row [N]", "column [M,1]", "full operand + float", "float only", "strided view",
                 "keywords", "out=", "noop", "group_offsets", "swiglu", "prepare"):
        assert kind in names, kind
    for name, fn, op, ref, target in cases:
        assert target == (1.0 if "prepare" in name else 1.5), name
        if fn is None:  # (op.prepare() needs CUDA)
            continue
        got, want = fn(), ref()
        for field in ("rowwise_data", "colwise_data", "rowwise_scale", "colwise_scale"):
            g, w = getattr(got, field), getattr(want, field)
            assert (g is None) == (w is None) and (g is None or torch.equal(g.view(torch.uint8), w.view(torch.uint8))), (
                name, field)


def test_host_parts_need_the_native_route():
    """The breakdown times the native allocating route's pieces: on the CPU there is none, so no
    piece (and nothing fails building them)."""
    assert _bench_tool("fixed_cost").host_parts("cpu") == []


def test_host_run_refuses_without_cuda(monkeypatch, tmp_path, capsys):
    tool = _bench_tool("fixed_cost")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "host.json"
    assert tool.host_main([str(path)]) == 2
    assert "needs a CUDA device" in capsys.readouterr().err and not path.exists()


def test_out_pairs_name_cases_and_ratio_their_times():
    """Each out= case is timed against its allocating counterpart (out= no slower: ratio <= 1.0)."""
    tool = _bench_tool("fixed_cost")
    names = [c[0] for c in tool.host_cases("cpu")]
    assert tool.OUT_PAIRS and all(o in names and a in names and "out=" in o and "out=" not in a
                                  for o, a in tool.OUT_PAIRS)
    rows = [{"case": o, "us": 3.0} for o, _ in tool.OUT_PAIRS] + [{"case": a, "us": 2.0} for _, a in tool.OUT_PAIRS]
    rows[0]["us"] = 1.0
    got = tool.out_vs_alloc(rows)
    assert [(p["ratio"], p["meets"]) for p in got] == [(0.5, True)] + [(1.5, False)] * (len(tool.OUT_PAIRS) - 1)


def test_host_pair_times_the_case_beside_its_floor():
    """host_pair: each repeat times the floor's calls, then the case's, each between two
    synchronizations, keeping each one's best; host_us is the case alone (a CPU counterpart: a
    counting clock stands in for the CUDA synchronization)."""
    tool = _bench_tool("fixed_cost")
    order = []
    us, floor = tool.host_pair(lambda: order.append("f"), lambda: order.append("c"), calls=3, repeats=2,
                               sync=lambda: order.append("|"))
    warm = ["c"] * 50 + ["f"] * 50 + ["|"]
    assert order == warm + (["c"] * 3 + ["|"] + ["f"] * 3 + ["|"]) * 2
    assert us > 0 and floor > 0
    order.clear()
    us, floor = tool.host_pair(lambda: order.append("f"), None, calls=2, repeats=1, sync=lambda: order.append("|"))
    assert order == ["f"] * 50 + ["|"] + ["f"] * 2 + ["|"] and floor != floor  # (NaN: no floor)
    assert tool.host_us(lambda: None, calls=2, repeats=1, sync=lambda: None) >= 0
