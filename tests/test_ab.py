"""`omni-tts ab` on the tiny fixture (CPU): each revision's package runs in its own bench (or codec-bench,
microbench or roofline) processes, in alternating order, and the summary holds each process's figures; a bad
revision or argument is one line before anything runs."""

from __future__ import annotations

import json
import signal
import statistics
import subprocess
import sys

import pytest
from _fixtures import REPO, cli_env, fixture_dir, run_cli_process

from omni_tts.errors import OmniTTSError
from omni_tts.tools.ab import order, roofline_summary, unpack, variants
from omni_tts.tools.provenance import rev_digest, tree_digest

BENCH = ["--model", str(fixture_dir("custom_voice")), "--preset", "all-eager", "--modes", "eager",
         "--concurrency", "1", "--num-prompts", "2", "--fixed-frames", "3"]


def test_rounds_alternate_the_order_of_the_revisions():
    assert order(["a", "b"], 3) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]


def test_each_revision_runs_its_own_package_in_interleaved_processes(tmp_path):
    out = tmp_path / "ab.json"
    p = run_cli_process("ab", "--revs", ".", "HEAD", "--rounds", "2", "--json", str(out), "--", *BENCH)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["complete"] is True
    assert [(r["round"], r["rev"]) for r in res["runs"]] == [(0, "."), (0, "HEAD"), (1, "HEAD"), (1, ".")]
    digests = {".": tree_digest(), "HEAD": rev_digest("HEAD")}
    for r in res["runs"]:  # the code each process ran is its revision's, whatever the checkout holds
        assert r["bench"]["source_digest"] == digests[r["rev"]] and r["bench"]["complete"]
        assert r["bench"]["results"]["eager"]["1"]["requests"] == 2
    assert [(s["rev"], s["concurrency"]) for s in res["summary"]] == [(".", 1), ("HEAD", 1)]
    for s in res["summary"]:
        mine = [r["bench"]["results"]["eager"]["1"]["audio_s_per_s"] for r in res["runs"] if r["rev"] == s["rev"]]
        assert sorted(s["audio_s_per_s"]) == sorted(mine) and s["median_audio_s_per_s"] == statistics.median(mine)
    rows = [line for line in p.stdout.splitlines() if line.startswith("| eager |")]
    assert len(rows) == 2 and rows[0].split("|")[3].strip() == "." and rows[1].split("|")[3].strip() == "HEAD"


def _tool_run(tmp_path, tool: str, tool_args: list[str]) -> tuple[subprocess.CompletedProcess, dict]:
    """`ab --tool TOOL --revs . HEAD --rounds 1`: the process and its JSON, each process on its revision's code."""
    out = tmp_path / "ab.json"
    p = run_cli_process("ab", "--tool", tool, "--revs", ".", "HEAD", "--rounds", "1", "--json", str(out), "--",
                        *tool_args)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert res["tool"] == tool and res["complete"] is True
    digests = {".": tree_digest(), "HEAD": rev_digest("HEAD")}
    assert [(r["rev"], r["bench"]["source_digest"]) for r in res["runs"]] == [(r, digests[r]) for r in (".", "HEAD")]
    return p, res


def test_codec_bench_runs_as_the_tool_and_its_chunk_times_make_the_table(tmp_path):
    codec = ["--model", str(fixture_dir("custom_voice")), "--rows", "1", "2", "--iters", "1", "--chunk-frames", "1",
             "--history", "1", "--first-frames", "1"]
    p, res = _tool_run(tmp_path, "codec-bench", codec)
    assert all([x["rows"] for x in r["bench"]["rows"]] == [1, 2] for r in res["runs"])
    assert [(s["rows"], s["rev"]) for s in res["summary"]] == [(1, "."), (1, "HEAD"), (2, "."), (2, "HEAD")]
    for s in res["summary"]:  # on a CPU, no graphs: the eager chunk's time
        (run,) = [r for r in res["runs"] if r["rev"] == s["rev"]]
        (row,) = [x for x in run["bench"]["rows"] if x["rows"] == s["rows"]]
        assert "carried_graph_ms" not in row and s["chunk_ms"] == [row["carried_chunk_ms"]]
    lines = [line for line in p.stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert [line.split("|")[2].strip() for line in lines] == [".", "HEAD", ".", "HEAD"]


def test_microbench_runs_as_the_tool_and_its_step_times_make_the_table(tmp_path):
    micro = ["--model", str(fixture_dir("custom_voice")), "--preset", "all-eager", "--modes", "eager", "--buckets", "1",
             "2", "--frames", "2", "--skip-codec"]
    p, res = _tool_run(tmp_path, "microbench", micro)
    assert [(s["rows"], s["rev"]) for s in res["summary"]] == [(1, "."), (1, "HEAD"), (2, "."), (2, "HEAD")]
    for s in res["summary"]:
        (run,) = [r for r in res["runs"] if r["rev"] == s["rev"]]
        step = run["bench"]["modes"]["eager"]["per_bucket"][str(s["rows"])]
        assert s["cp_ms"] == [step["cp_ms"]] and s["talker_ms"] == [step["talker_ms"]] and s["mode"] == "eager"
    lines = [line for line in p.stdout.splitlines() if line.startswith("| eager |")]
    assert [line.split("|")[2:4] for line in lines] == [[" 1 ", " . "], [" 1 ", " HEAD "], [" 2 ", " . "],
                                                        [" 2 ", " HEAD "]]


def test_a_folder_holding_a_package_runs_that_package(tmp_path):
    tree = unpack("HEAD", tmp_path)  # as a folder exported for a machine without the repository
    with (tree / "omni_tts" / "config.py").open("a") as f:  # a change the checkout does not have
        f.write("\n# exported for ab\n")
    out = tmp_path / "ab.json"
    p = run_cli_process("ab", "--revs", str(tree), "--rounds", "1", "--json", str(out), "--", *BENCH)
    assert p.returncode == 0, p.stderr[-2000:]
    (run,) = json.loads(out.read_text())["runs"]
    assert run["bench"]["source_digest"] == tree_digest(tree / "omni_tts") != tree_digest()


def test_an_unknown_revision_is_one_line_before_any_bench_runs():
    p = run_cli_process("ab", "--revs", ".", "no-such-revision-here", "--", *BENCH)
    assert p.returncode == 2 and "no-such-revision-here" in p.stderr
    assert p.stderr.strip().count("\n") == 0 and "round" not in p.stderr and p.stdout == ""


def test_sets_run_each_tree_once_per_override_given_to_the_tool(tmp_path):
    """--sets: the tree runs once per item in alternating rounds, the tool given --set for the item's pairs
    ('-': none), each labelled in the runs and the table; an override the tool refuses fails its runs alone."""
    out, missing = tmp_path / "ab.json", tmp_path / "no-such-configs.json"
    item = f"kernel_configs={missing}"
    p = run_cli_process("ab", "--revs", ".", "--sets", "-", item, "--rounds", "2", "--json", str(out), "--", *BENCH)
    assert p.returncode == 1
    res = json.loads(out.read_text())
    label = f". [{item}]"
    assert [(r["round"], r["rev"], r["tree"], r["set"]) for r in res["runs"]] == [
        (0, ".", ".", []), (0, label, ".", [item]), (1, label, ".", [item]), (1, ".", ".", [])]
    for r in res["runs"]:
        if r["set"]:  # the override reached the tool, which refused it in its own words
            assert "kernel_configs: no such file" in r["bench"]["error"] and "results" not in r["bench"]
        else:
            assert "error" not in r["bench"] and r["bench"]["results"]["eager"]["1"]["requests"] == 2
    assert [s["rev"] for s in res["summary"]] == ["."]
    assert [line.split("|")[3].strip() for line in p.stdout.splitlines() if line.startswith("| eager |")] == ["."]


def test_a_sets_list_value_stays_whole_where_its_pairs_split_at_commas():
    item = "buckets=[1,2,64],kernel_configs=a.json"
    assert variants(["."], ["-", item]) == {
        ".": (".", []), f". [{item}]": (".", ["--set", "buckets=[1,2,64]", "--set", "kernel_configs=a.json"])}
    with pytest.raises(OmniTTSError, match="is not KEY=VALUE"):  # a comma outside brackets still splits
        variants(["."], ["kernel_configs=a,b.json"])


def test_a_sets_item_that_is_not_key_value_is_one_line_before_any_bench_runs():
    for bad in (["--sets", "kernel_configs"], ["--sets", "-", "-"], ["--sets", "=x"]):
        p = run_cli_process("ab", "--revs", ".", *bad, "--", *BENCH)
        assert p.returncode == 2 and p.stderr.startswith("error: ab: ") and p.stderr.strip().count("\n") == 0
        assert "round" not in p.stderr and p.stdout == ""


def test_bench_json_belongs_to_ab():
    p = run_cli_process("ab", "--revs", ".", "--", *BENCH, "--json", "x.json")
    assert p.returncode == 2 and "give --json to ab" in p.stderr and p.stdout == ""


def test_a_bench_process_that_fails_is_an_error_in_its_run_and_the_exit_status(tmp_path):
    out = tmp_path / "ab.json"
    p = run_cli_process("ab", "--revs", ".", "--rounds", "1", "--json", str(out), "--",
                        "--model", str(tmp_path / "no-such-checkpoint"), "--modes", "eager")
    assert p.returncode == 1
    (run,) = json.loads(out.read_text())["runs"]
    assert "no-such-checkpoint" in run["bench"]["error"] and "results" not in run["bench"]


def test_the_first_process_runs_under_its_own_limit_and_a_process_past_its_limit_is_an_error(tmp_path):
    """--first-timeout gives the first process (a fresh machine's cold compile) its own limit; the others run
    under --timeout, here too short for any process to start, so theirs is the timed-out error."""
    out = tmp_path / "ab.json"
    p = run_cli_process("ab", "--revs", ".", "HEAD", "--rounds", "1", "--timeout", "0.01", "--first-timeout",
                        "600", "--json", str(out), "--", *BENCH)
    assert p.returncode == 1
    first, second = json.loads(out.read_text())["runs"]
    assert first["rev"] == "." and "error" not in first["bench"] and first["bench"]["complete"]
    assert second["rev"] == "HEAD" and second["bench"] == {"error": "timed out"}


def test_a_comparison_stopped_midway_keeps_the_processes_it_finished(tmp_path):
    out = tmp_path / "ab.json"
    p = subprocess.Popen([sys.executable, "-m", "omni_tts", "ab", "--revs", ".", "HEAD", "--rounds", "2", "--json",
                          str(out), "--", *BENCH], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env=cli_env(), cwd=REPO)
    try:
        for line in p.stderr:  # a process's line comes once its run is in the JSON
            if "audio s/s" in line:
                break
        p.send_signal(signal.SIGINT)  # as an operator's Ctrl-C: the running bench process is stopped too
    finally:
        p.communicate()
    res = json.loads(out.read_text())
    assert res["complete"] is False and "summary" not in res and 1 <= len(res["runs"]) < 4
    assert res["runs"][0]["rev"] == "." and res["runs"][0]["bench"]["results"]["eager"]["1"]["requests"] == 2


def test_roofline_runs_as_the_tool_and_its_part_times_make_the_table(tmp_path):
    roof = ["--model", str(fixture_dir("custom_voice")), "--preset", "all-eager", "--rows", "1", "2", "--iters", "1"]
    p, res = _tool_run(tmp_path, "roofline", roof)
    parts = [(x["part"], x["rows"]) for x in res["runs"][0]["bench"]["rows"]]
    assert len(parts) == 6 and {n for _, n in parts} == {1, 2}
    assert [(s["figure"], s["rev"]) for s in res["summary"]] == [
        (f"{part} ms, {n} rows", rev) for part, n in parts for rev in (".", "HEAD")]
    for s in res["summary"]:
        (run,) = [r for r in res["runs"] if r["rev"] == s["rev"]]
        (row,) = [x for x in run["bench"]["rows"] if f"{x['part']} ms, {x['rows']} rows" == s["figure"]]
        assert s["values"] == [row["ms_per_call"]] == [s["median"]]
    assert sum(line.startswith("| talker step ms, 1 rows |") for line in p.stdout.splitlines()) == 2


def test_roofline_busy_profiles_give_each_process_s_busy_share_and_idle_pairs():
    """The busy figures of GPU roofline processes (an H100's, kept in docs/results): per concurrency each
    process's busy share, and each listed pair of kernels around the gaps with its idle seconds."""
    kept = json.loads((REPO / "docs" / "results" / "2026-12-07-h100-codes-staged.json").read_text())
    runs = [{"rev": "ab"[i % 2], "bench": kept[f"roofline_main_{i + 1}"]} for i in range(4)]
    rows = {(s["figure"], s["rev"]): s for s in roofline_summary(runs, ["a", "b"])}
    for rev, mine in (("a", runs[0::2]), ("b", runs[1::2])):
        for c in (32, 64):
            profiles = [b for r in mine for b in r["bench"]["busy"] if b["concurrency"] == c]
            busy = rows[(f"GPU busy %, c = {c}", rev)]
            assert busy["values"] == [100 * b["gpu_busy_share"] for b in profiles]
            assert busy["median"] == statistics.median(busy["values"])
            for pair in profiles[0]["gap_borders"]:
                got = rows[(f"idle s, c = {c}: {pair['before']} -> {pair['after']}", rev)]["values"]
                assert pair["s"] in got and len(got) <= len(profiles)
