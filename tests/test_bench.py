"""The benchmark CLI end to end on the tiny fixture (CPU): the table's shape and the JSON's numbers.
Figures are timings, so they are checked for consistency with each other, never against a clock."""

from __future__ import annotations

import json
import math
import re
import subprocess

import numpy as np
import pytest
from _fixtures import fixture_dir, run_cli_process

from omni_tts.tools import bench, load
from omni_tts.tools.cli import main
from omni_tts.tools.provenance import tree_digest

LABELS = ["Med TTFP (ms)", "p90 TTFP (ms)", "Med queued (ms)", "Med to first codes (ms)", "Med to first chunk (ms)",
          "Med E2E (ms)", "Mean RTF", "Req/s", "Audio tput (s/s)", "Mean batch per frame", "Code-to-wave calls"]
KEYS = ["requests", "med_ttfp_ms", "p90_ttfp_ms", "med_queue_ms", "med_first_codes_ms", "med_first_chunk_ms",
        "med_e2e_ms", "mean_rtf", "req_per_s", "audio_s_per_s", "audio_s", "wall_s", "batch_per_frame",
        "decode_calls"]



def run_bench(*args: str) -> subprocess.CompletedProcess:
    return run_cli_process("bench", *args)


def table_rows(stdout: str) -> list[list[str]]:
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("|")]


def test_bench_cli_runs_end_to_end_and_writes_a_table_and_json(tmp_path):
    model = fixture_dir("custom_voice")
    out = tmp_path / "bench.json"
    p = run_bench("--model", str(model), "--preset", "all-eager", "--modes", "eager", "--concurrency", "1", "2",
                  "--num-prompts", "3", "--fixed-frames", "5", "--json", str(out))
    assert p.returncode == 0, p.stderr[-3000:]
    assert f"model: {model}" in p.stdout and "device: cpu  dtype: float32  fixed_frames: 5" in p.stdout
    rows = table_rows(p.stdout)
    assert rows[0] == ["Metric", "Conc", "eager"] and set(rows[1]) == {"---"}
    body = rows[2:]
    want = [(label, c) for label in LABELS for c in ("1", "2")]
    assert [(r[0], r[1]) for r in body[:len(want)]] == want
    for r in body[:len(want)]:
        assert re.fullmatch(r"\d+(\.\d+)?", r[2]), r  # a computed number, not '-' or an error
    extra = {r[0]: r[2] for r in body[len(want):]}
    assert extra["state"] == "ready" and re.fullmatch(r"\d+\.\d", extra["capture/compile s"])
    assert extra["CodePredictor kernels"] == "reference modules"  # what ran the predictor, in the table
    assert "notice" not in extra  # a row only when the mode has a reason to report (failed, unavailable)
    assert extra["peak GPU mem (GiB)"] == "-" and extra["graph pool of this mode's runner (GiB)"] == "-"
    assert "[eager] concurrency 2: 3/3 requests" in p.stderr

    data = json.loads(out.read_text())
    assert data["complete"] and data["device"] == "cpu" and data["dtype"] == "float32" and data["fixed_frames"] == 5
    assert data["source_digest"] == tree_digest() and "gpu" in data  # the run's provenance beside the run's device
    assert data["concurrency"] == [1, 2] and list(data["results"]) == ["eager"]
    assert data["extra"]["eager"]["state"] == "ready"
    table = {(r[0], r[1]): r[2] for r in body[:len(want)]}
    for c in ("1", "2"):
        s = data["results"]["eager"][c]
        assert sorted(s) == sorted(KEYS)
        assert all(isinstance(s[k], float) and math.isfinite(s[k]) for k in KEYS)
        assert s["requests"] == 3.0  # warm-up excluded, every measured request finished
        assert s["audio_s"] == pytest.approx(3 * 5 * 0.08)  # exactly fixed_frames frames each
        assert s["wall_s"] > 0 and s["req_per_s"] == pytest.approx(3 / s["wall_s"])
        assert s["audio_s_per_s"] == pytest.approx(s["audio_s"] / s["wall_s"])
        assert 0 < s["med_ttfp_ms"] <= s["p90_ttfp_ms"] and 0 < s["med_e2e_ms"] and s["mean_rtf"] > 0
        parts = [s["med_queue_ms"], s["med_first_codes_ms"], s["med_first_chunk_ms"]]  # TTFP's three parts
        assert all(0 < x <= s["p90_ttfp_ms"] for x in parts)
        assert 0.5 <= s["batch_per_frame"] <= int(c)  # c clients keep at most c rows busy
        assert 1 <= s["decode_calls"] <= 3 * 3  # each request's chunks (first, rest, flush) at most
        for label, key, fmt in bench.ROWS:  # the table shows the JSON's numbers
            assert table[(label, c)] == fmt.format(s[key])


def test_a_bench_stopped_part_way_keeps_the_rows_it_finished(tmp_path, monkeypatch):
    """The JSON is rewritten after every row: a run stopped during its second concurrency (here by an
    interrupt in that row's load) leaves the first row on disk, marked incomplete."""
    out = tmp_path / "partial.json"
    run = bench._one_run

    def stop_at_two(engine, mode, c, *a):
        if c == 2:
            raise KeyboardInterrupt
        return run(engine, mode, c, *a)

    monkeypatch.setattr(bench, "_one_run", stop_at_two)
    with pytest.raises(KeyboardInterrupt):
        main(["bench", "--model", str(fixture_dir("custom_voice")), "--preset", "all-eager", "--modes", "eager",
              "--concurrency", "1", "2", "--num-prompts", "2", "--fixed-frames", "2", "--warmup", "1",
              "--json", str(out)])
    data = json.loads(out.read_text())
    assert data["complete"] is False and list(data["results"]["eager"]) == ["1"]
    assert data["results"]["eager"]["1"]["requests"] == 2.0 and data["source_digest"] == tree_digest()


def test_bench_serves_a_checkpoint_without_speakers_with_voice_design(tmp_path, capsys):
    model = fixture_dir("voice_design")
    out = tmp_path / "vd.json"
    rc = main(["bench", "--model", str(model), "--preset", "all-eager", "--modes", "eager", "--concurrency", "1",
               "--num-prompts", "1", "--fixed-frames", "2", "--warmup", "1", "--json", str(out)])
    assert rc == 0
    s = json.loads(out.read_text())["results"]["eager"]["1"]
    assert s["requests"] == 1.0 and s["audio_s"] == pytest.approx(2 * 0.08)
    assert "| Med TTFP (ms) | 1 |" in capsys.readouterr().out


def test_bench_reports_a_bad_preset_as_one_line_and_exit_2(capsys):
    assert main(["bench", "--preset", "no-such-preset", "--modes", "eager"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: preset 'no-such-preset' not found; available:")
    assert all(n in err for n in ("all-eager", "bench", "default")) and err.count("\n") == 1


def test_bench_set_overrides_are_checked_before_loading_anything(capsys):
    assert main(["bench", "--preset", "all-eager", "--modes", "eager", "--set", "kernels=maybe"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == "error: --set: preset key 'experimental.kernels' must be true or false (got 'maybe')\n"


def test_bench_refuses_an_unknown_mode_before_loading_anything(capsys):
    assert main(["bench", "--modes", "eager,turbo", "--model", "/nonexistent"]) == 2
    assert capsys.readouterr().err.startswith("error: unknown compile mode 'turbo'")


@pytest.mark.parametrize("args,why", [(["--device", "cpu", "--modes", "eager,reduce-overhead"], "needs CUDA"),
                                      (["--preset", "all-eager", "--modes", "default"], "enforce_eager")])
def test_bench_refuses_a_mode_this_run_cannot_serve_before_loading_anything(args, why, capsys):
    """A CUDA-only mode on a CPU, or a compiled mode under enforce_eager: one line naming the mode and
    the modes that can run, before any model is looked for (the model path does not exist)."""
    assert main(["bench", "--model", "/nonexistent", *args]) == 2
    out, err = capsys.readouterr()
    mode = args[-1].split(",")[-1]
    assert out == "" and err.startswith(f"error: mode {mode} cannot run here: ") and why in err
    assert "modes here: eager" in err and err.count("\n") == 1


def test_bench_defaults_to_the_modes_this_run_can_serve():
    from omni_tts.config import load_preset

    assert bench.device_modes(load_preset("bench", device="cpu"), None) == ["eager", "default"]
    assert bench.device_modes(load_preset("all-eager"), None) == ["eager"]


def test_format_table_shows_errors_and_missing_values():
    results = {"eager": {1: {"med_ttfp_ms": 12.345, "p90_ttfp_ms": float("nan"), "med_e2e_ms": 100.0,
                             "mean_rtf": 0.5, "req_per_s": 2.0, "audio_s_per_s": 3.0},
                         8: {"error": "failed: out of memory"}},
               "default": {1: {"med_ttfp_ms": 1.0}}}
    lines = bench.format_table(results, [1, 8], extra={"eager": {"actual mode": "eager"}}).splitlines()
    assert lines[0] == "| Metric | Conc | eager | default |" and lines[1] == "|---|---|---|---|"
    assert lines[2] == "| Med TTFP (ms) | 1 | 12.3 | 1.0 |"
    assert lines[3] == "| Med TTFP (ms) | 8 | failed: out of memory | - |"
    assert lines[4] == "| p90 TTFP (ms) | 1 | - | - |"  # NaN and absent both print '-'
    assert lines[-1] == "| actual mode | all | eager | - |"
    assert len(lines) == 2 + 2 * len(bench.ROWS) + 1


def test_make_params_cycles_prompts_and_seeds():
    a, b = load.make_params(0, "ryan", 5), load.make_params(len(load.PROMPTS), "ryan", 5)
    assert a.text == b.text and a.seed != b.seed and a.fixed_frames == 5 and a.speaker == "ryan"
    a.validate()


def test_bench_peers_runs_each_system_in_its_own_process(tmp_path, capsys):
    """`bench peers` on the tiny checkpoint (CPU): our engine runs in a process of its own and is measured
    at every concurrency with exactly the asked frames; a peer that is not importable on its import path
    is a row saying so, not a crash, and the run goes on to the next system."""
    import importlib.util

    out = tmp_path / "peers.json"
    assert main(["peers", "--model", str(fixture_dir("custom_voice")), "--device", "cpu", "--frames", "4",
                 "--num-prompts", "3", "--concurrency", "1", "2", "--peers", "vllm-omni,qwen-tts",
                 "--json", str(out), "--log-dir", str(tmp_path / "logs")]) == 0
    results = {r["system"]: r for r in json.loads(out.read_text())["results"]}
    assert list(results) == ["vllm-omni", "qwen-tts", "omni-tts"]
    ours = results["omni-tts"]
    assert set(ours["rows"]) == {"1", "2"} and ours["startup_s"] > 0 and "error" not in ours
    for row in ours["rows"].values():
        assert row["requests"] == 3 and math.isclose(row["audio_s"], 3 * 4 * 0.08)
        assert row["frames_med"] == 4 and row["dup_chunks"] == 0
        assert 0 < row["med_ttfp_ms"] <= row["med_e2e_ms"] and row["mean_rtf"] > 0
    if importlib.util.find_spec("qwen_tts") is None:
        assert results["qwen-tts"]["error"] == "not installed (qwen_tts)" and not results["qwen-tts"].get("rows")
    assert "error" in results["vllm-omni"]  # vLLM-Omni needs CUDA (and is not installed in CI)
    table = capsys.readouterr().out
    assert "| omni-tts | 2 |" in table and "| med TTFP ms |" in table and "not installed" in table


def test_bench_peers_clones_a_reference_clip_on_a_base_checkpoint(tmp_path):
    """--ref-audio: our engine clones the clip's voice (x-vector only) on the Base checkpoint at every
    concurrency; faster-qwen3-tts-batch (voice clones only) is a row saying it is not installed here, and a
    peer whose adapter cannot clone says so."""
    import importlib.util
    import wave

    ref = tmp_path / "ref.wav"
    samples = (np.sin(np.arange(24000) * 2 * np.pi * 180 / 24000) * 8000).astype("<i2")
    with wave.open(str(ref), "wb") as w:
        w.setnchannels(1), w.setsampwidth(2), w.setframerate(24000), w.writeframes(samples.tobytes())
    out = tmp_path / "peers.json"
    assert main(["peers", "--model", str(fixture_dir("base")), "--device", "cpu", "--frames", "3",
                 "--num-prompts", "2", "--concurrency", "2", "--peers", "faster-qwen3-tts-batch,qwen-tts",
                 "--ref-audio", str(ref), "--json", str(out), "--log-dir", str(tmp_path / "logs")]) == 0
    results = {r["system"]: r for r in json.loads(out.read_text())["results"]}
    ours = results["omni-tts"]
    assert "error" not in ours and ours["rows"]["2"]["requests"] == 2 and ours["rows"]["2"]["frames_med"] == 3
    if importlib.util.find_spec("faster_qwen3_tts_batch") is None:
        assert results["faster-qwen3-tts-batch"]["error"] == "not installed (faster_qwen3_tts_batch)"
    assert "not wired" in results["qwen-tts"]["error"]


def test_bench_peers_stops_a_system_at_its_time_limit_and_goes_on(tmp_path, capsys):
    """A system that outlives --timeout is stopped with its whole process group, its row says so, and
    the table is still printed."""
    out = tmp_path / "peers.json"
    assert main(["peers", "--model", str(fixture_dir("custom_voice")), "--device", "cpu", "--frames", "4",
                 "--num-prompts", "2", "--concurrency", "1", "--peers", "omni-tts", "--timeout", "0.5",
                 "--json", str(out), "--log-dir", str(tmp_path / "logs")]) == 0
    (ours,) = json.loads(out.read_text())["results"]
    assert ours["error"] == "stopped at the 0.5 s limit after 0 concurrency levels" and not ours.get("rows")
    assert "| omni-tts | - | stopped at the 0.5 s limit" in capsys.readouterr().out


def test_peer_tally_counts_a_repeated_chunk_once():
    """A chunk equal to the one before it (vLLM-Omni's duplicated last chunk) is not audio twice."""
    from omni_tts.tools.peer_run import timed

    a, b = np.ones(480, np.float32), np.arange(480, dtype=np.float32)
    m = timed(0, [np.zeros(0), a, b, b, a])
    assert m.audio_samples == 3 * 480 and m.dups == 1 and m.first_audio_at is not None


def test_mixed_load_bursts_over_the_modes_and_measures_a_mode_beside_another(tmp_path):
    """The mixed-load tool (CPU, eager only: the one mode that needs no compile here) finishes every
    request of its burst, counts them per mode, and times the fast mode alone and beside the slow one."""
    out = tmp_path / "mixed.json"
    rc = main(["mixed-load", "--model", str(fixture_dir("custom_voice")), "--modes", "eager", "--requests", "5",
               "--max-num-seqs", "2", "--fixed-frames", "3", "--device", "cpu", "--json", str(out)])
    report = json.loads(out.read_text())
    assert rc == 0 and report["burst"]["eager"]["done"] == 5 and report["burst"]["eager"]["failed"] == 0
    assert report["burst"]["eager"]["med_ttfp_ms"] > 0 and report["burst"]["eager"]["med_rtf"] > 0
    assert report["beside"]["solo_rtf"] > 0 and report["beside"]["beside_rtf"] > 0


@pytest.mark.slow  # every step timed 20 times per bucket and variant: half a minute on a 2-core CPU
def test_microbench_times_each_bucket_and_compares_greedy_codes(tmp_path, capsys):
    """The microbench on the tiny checkpoint (CPU, eager): step costs per bucket for both sampling
    variants, prefill costs (with the host's cost of preparing prompts one at a time and 64 at once), and
    the greedy codes of the side-by-side requests agree with themselves."""
    out = tmp_path / "mb.json"
    assert main(["microbench", "--model", str(fixture_dir("custom_voice")), "--device", "cpu", "--modes", "eager",
                 "--buckets", "1", "2", "--frames", "2", "--skip-codec", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data == json.loads(capsys.readouterr().out) and data["buckets"] == [1, 2]
    row = data["modes"]["eager"]
    assert set(row["per_bucket"]) == {"1", "2"}
    for b in row["per_bucket"].values():
        assert b["cp_ms"] > 0 and b["talker_ms"] > 0 and b["cp_ms_full_sort"] > 0
    assert row["prefill"] and all(v > 0 for v in row["prefill"].values())
    assert row["prefill"]["prepare_64_threads_ms"] > row["prefill"]["prepare_ms"]  # 64 prompts' host work, not one's
    assert row["agree_with_first_mode"]["identical"] == row["agree_with_first_mode"]["of"] == 2


def test_bench_runs_each_concurrency_several_times_and_shows_the_medians(tmp_path, capsys):
    out = tmp_path / "runs.json"
    rc = main(["bench", "--model", str(fixture_dir("custom_voice")), "--preset", "all-eager", "--modes", "eager",
               "--concurrency", "2", "--num-prompts", "1", "--per-client", "2", "--runs", "3", "--fixed-frames", "3",
               "--warmup", "1", "--json", str(out)])
    assert rc == 0
    s = json.loads(out.read_text())["results"]["eager"]["2"]
    assert len(s["runs"]) == 3 and all(r["requests"] == 4.0 for r in s["runs"])  # 2 per client, each run
    for key in KEYS:
        assert s[key] == pytest.approx(float(np.median([r[key] for r in s["runs"]])))
    table = {tuple(r[:2]): r[2] for r in table_rows(capsys.readouterr().out)}
    assert table[("Audio tput (s/s)", "2")] == f"{s['audio_s_per_s']:.1f}"


@pytest.mark.parametrize("flag,value,least", [("--runs", "0", 1), ("--per-client", "-1", 0), ("--runs", "two", 1)])
def test_bench_refuses_a_count_out_of_range_naming_it(flag, value, least, capsys):
    with pytest.raises(SystemExit):
        main(["bench", flag, value])
    err = capsys.readouterr().err
    assert flag in err and f"expected a whole number >= {least}, got '{value}'" in err
