"""The codec-bench tool on the tiny checkpoint, on CPU: a whole run through the command line gives a row per
--rows with both timings and the JSON it promises, the codec set up as the engine sets it up; the first-chunk
call decodes the frames it names; new shapes are new and timed twice; bad flags get one error line."""

from __future__ import annotations

import json

import torch
from _fixtures import fixture_dir

from omni_tts.config import load_preset
from omni_tts.tools import codec_bench
from omni_tts.tools.cli import main as cli


def test_a_run_gives_a_row_per_rows_and_the_json(tmp_path, capsys) -> None:
    out = tmp_path / "codec.json"
    rc = cli(["codec-bench", "--model", str(fixture_dir("custom_voice")), "--device", "cpu", "--rows", "1", "2",
              "--chunk-frames", "3", "--history", "4", "--first-frames", "2", "--iters", "1", "--profile-rows", "2",
              "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert [r["rows"] for r in res["rows"]] == [1, 2]
    assert all(r["carried_chunk_ms"] > 0 and r["first_chunk_ms"] > 0 for r in res["rows"])
    assert res["precision"] == "float32" and res["device"] == "cpu" and res["fused"] == (res["fused_off_because"] == "")
    assert res["profiles"] == {} and res["profiles_skipped"] == "needs CUDA"
    assert res["source_digest"] and res["cudnn_benchmark"] is False
    printed = capsys.readouterr().out
    assert "| 2 |" in printed and "kernel profiles skipped: needs CUDA" in printed


def test_cudnn_autotuning_is_on_for_the_run_only(tmp_path) -> None:
    out = tmp_path / "codec.json"
    assert torch.backends.cudnn.benchmark is False
    rc = cli(["codec-bench", "--model", str(fixture_dir("custom_voice")), "--device", "cpu", "--rows", "1",
              "--chunk-frames", "2", "--history", "2", "--iters", "1", "--cudnn-benchmark", "--json", str(out)])
    assert rc == 0 and json.loads(out.read_text())["cudnn_benchmark"] is True
    assert torch.backends.cudnn.benchmark is False  # a process-wide switch, restored


def test_the_first_chunk_call_decodes_its_frames_from_an_empty_state() -> None:
    codec, _ = codec_bench.build_codec(load_preset("bench", model=str(fixture_dir("custom_voice")), device="cpu"))
    wav = codec_bench.first_chunk(codec, 3, 2)()
    assert wav.shape == (3, 2 * codec.decode_upsample_rate) and float(wav.abs().max()) > 0


def test_rows_that_are_not_positive_get_one_error_line(capsys) -> None:
    rc = cli(["codec-bench", "--model", str(fixture_dir("custom_voice")), "--rows", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["error: --rows, --profile-rows, --iters and the frame counts take positive integers"]


def test_new_shapes_are_ones_the_run_has_not_decoded_and_each_is_timed_twice(tmp_path, capsys) -> None:
    out = tmp_path / "codec.json"
    rc = cli(["codec-bench", "--model", str(fixture_dir("custom_voice")), "--device", "cpu", "--rows", "2",
              "--chunk-frames", "4", "--history", "2", "--iters", "1", "--new-shapes", "5", "--json", str(out),
              "--set", "chunk_growth=true", "--set", "chunk_frames=16"])
    assert rc == 0
    ns = json.loads(out.read_text())["new_shapes"]
    shapes = [(c["rows"], c["frames"]) for c in ns["calls"]]
    # (2, 4) and (2, 1): the --rows run's carried and first chunks; 2 frames: the history each chunk decodes
    assert len(set(shapes)) == 5 and not {(2, 4), (2, 1)} & set(shapes)
    # the preset's growth 1, 2, 4, 8, 16 less the history's 2 frames
    assert all(1 <= b <= 2 and f in (1, 4, 8, 16) for b, f in shapes)
    assert all(c["first_ms"] > 0 and c["again_ms"] > 0 for c in ns["calls"])
    assert ns["first_ms"] == sum(c["first_ms"] for c in ns["calls"])
    assert "5 new shapes:" in capsys.readouterr().out


def test_more_new_shapes_than_there_are_get_one_error_line(capsys) -> None:
    rc = cli(["codec-bench", "--model", str(fixture_dir("custom_voice")), "--rows", "1", "2", "--chunk-frames", "25",
              "--new-shapes", "9"])
    err = capsys.readouterr().err.strip().splitlines()
    # the bench preset's chunks: one frame, then 25 (no growth): every (rows, frames) is the run's own
    assert rc == 2 and err == ["error: --new-shapes takes 0 to 0 here (rows 1..2 x the preset's chunks of 1, 25 "
                               "frames, less the shapes the run decodes anyway)"]


def test_the_new_shapes_follow_the_presets_chunk_schedule() -> None:
    """The pool's chunk lengths are those a streaming decoder plans under the same config keys."""
    from omni_tts.config import EngineConfig
    from omni_tts.models.codec.decoder import CodecDecoder
    from omni_tts.models.codec.streaming import StreamingDecoder
    from omni_tts.models.selection import open_checkpoint

    codec = CodecDecoder.from_checkpoint(open_checkpoint(str(fixture_dir("custom_voice"))))
    for initial, chunk, grow in ((1, 25, True), (2, 12, True), (1, 25, False), (3, 3, True)):
        dec = StreamingDecoder(codec, initial, chunk, grow=grow)
        planned = [p.end - p.start for _ in range(120)
                   if (p := dec.plan_push(torch.zeros(1, codec.num_quantizers, dtype=torch.long))) is not None]
        config = EngineConfig(initial_chunk_frames=initial, chunk_frames=chunk, chunk_growth=grow)
        assert codec_bench.chunk_lengths(config) == sorted(set(planned))
