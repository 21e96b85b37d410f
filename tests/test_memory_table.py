"""The memory table's orchestration on CPU: one real process per (preset, cap) over the tiny checkpoint, the
JSON and table shape, and rows that say why a process gave no figures."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from _fixtures import fixture_dir

from omni_tts.errors import OmniTTSError
from omni_tts.tools import memory_table


def test_a_row_per_preset_and_cap_each_from_its_own_engine(tmp_path, capsys):  # two processes at once
    ap = argparse.ArgumentParser()
    memory_table.add_arguments(ap)
    out = tmp_path / "memory.json"
    args = ap.parse_args(["--model", str(fixture_dir("custom_voice")), "--presets", "default", "--caps-gib", "16",
                          "24", "--set", "max_num_seqs=2", "--waves", "1", "--frames", "4", "--jobs", "2",
                          "--json", str(out)])
    assert memory_table.main(args) == 0
    res = json.loads(out.read_text())
    assert {"command", "commit", "torch", "device"} <= set(res)
    assert [(r["preset"], r["cap_gib"]) for r in res["rows"]] == [("default", 16.0), ("default", 24.0)]
    for r in res["rows"]:
        assert "error" not in r, r
        assert r["ready"] == list(r["load"]) and r["failed"] == {}
        assert all(v["served"] == v["requests"] == 2 for v in r["load"].values())  # max_num_seqs x 1 wave
        if not torch.cuda.is_available():
            assert r["cap_applied"] is False and r["gpu"] == "needs CUDA" and r["host_peak_rss_gib"] > 0
            assert r["ready"] == ["eager"]  # the one mode a CPU keeps
        else:
            assert 0 < r["peak_allocated_gib"] <= r["peak_reserved_gib"] <= r["cap_gib"]
    table = capsys.readouterr().out
    assert table.count("| default |") == 2


def test_a_process_without_figures_is_a_row_saying_why(tmp_path):
    spec = {"model": str(tmp_path / "missing"), "preset": "default", "cap_gib": 16.0, "sets": [], "waves": 1,
            "frames": 4, "warm_timeout": 60.0}
    row = memory_table.run_one(spec, timeout=300)
    assert row["preset"] == "default" and "missing" in row["error"]  # the engine refused: its own message
    row = memory_table.run_one({"cap_gib": 16.0}, timeout=300)  # a malformed spec: the child dies
    assert row["error"] == "exit status 1" and any("KeyError" in line for line in row["log_tail"])
    assert row["cap_gib"] == 16.0 and "exit status 1" in memory_table.table([row])


def test_a_process_stopped_at_its_timeout_says_where_it_stood_and_its_peak_so_far(tmp_path):
    out = tmp_path / "row.json"
    row = {"preset": "default", "cap_gib": 22.5}
    stopped = memory_table.timed_out(row, out, b"compiling\nstill compiling\n", 330)
    assert stopped["error"] == "no result in 330 s (starting)"
    assert stopped["log_tail"] == ["compiling", "still compiling"]
    memory_table._write(out, {**row, "cap_applied": True, "stage": "warming reduce-overhead",
                              "ready": ["eager", "default+cudagraph"], "peak_allocated_gib": 9.5,
                              "peak_reserved_gib": 10.25, "graph_pool_gib": 1.0, "tree_pool_gib": 0.5})
    stopped = memory_table.timed_out(row, out, None, 330)
    assert stopped["error"] == "no result in 330 s (warming reduce-overhead)" and stopped["log_tail"] == []
    line = memory_table.table([stopped]).splitlines()[-1]
    assert line == ("| default | 22.5 | 9.50 until stopped | 10.25 | 1.50 | eager, default+cudagraph | "
                    "no result in 330 s (warming reduce-overhead) |")


def test_a_cap_that_is_not_positive_is_refused_naming_the_flag():
    ap = argparse.ArgumentParser()
    memory_table.add_arguments(ap)
    with pytest.raises(OmniTTSError, match="--caps-gib"):
        memory_table.main(ap.parse_args(["--caps-gib", "16", "0"]))
    with pytest.raises(OmniTTSError, match="--jobs"):
        memory_table.main(ap.parse_args(["--jobs", "0"]))
