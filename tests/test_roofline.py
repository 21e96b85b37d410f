"""The roofline tool on the tiny checkpoint, on CPU: its byte model against the modules' own parameter
sizes, its FLOP model against torch's FLOP counter on the eager reference, and one whole run (a real
engine) giving a row per (part, rows) and the JSON it promises."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from _fixtures import fixture_dir
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from omni_tts.config import load_preset
from omni_tts.errors import OmniTTSError
from omni_tts.models import sampling
from omni_tts.models.loading import load_model
from omni_tts.tools import roofline
from omni_tts.tools.timing import carried_chunk


def _size(*modules: torch.nn.Module) -> int:
    return sum(p.numel() * p.element_size() for m in modules for p in m.parameters())


@pytest.fixture(scope="module")
def model():
    return load_model(load_preset("bench", model=str(fixture_dir("custom_voice")), mode="eager", modes=["eager"]))


def test_talker_and_predictor_bytes_are_the_parameters_they_read(model):
    t, cp = model.talker, model.code_predictor
    weights, kv = roofline.talker_bytes(model, 8, 128)
    assert weights == _size(*t.layers, t.norm, t.codec_head)
    assert kv == 8 * 128 * t.num_layers * 2 * t.num_kv_heads * t.head_dim * t.codec_head.weight.element_size()
    weights, emb = roofline.predictor_bytes(model, 8)
    assert weights == 15 * _size(*cp.layers, cp.norm) + _size(cp.small_to_mtp_projection, *cp.lm_head)
    elt = cp.codec_embedding[0].weight.element_size()
    assert emb == 8 * (16 * cp.codec_embedding[0].weight.shape[1] + 14 * cp.hidden_size) * elt
    assert roofline.talker_bytes(model, 16, 128)[0] == roofline.talker_bytes(model, 1, 64)[0]  # rows share a read


def _counted(fn) -> int:
    """FLOPs torch counts for fn() with attention on its math path (matmuls the counter sees)."""
    with torch.inference_mode(), sdpa_kernel([SDPBackend.MATH]), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("rows", [1, 3])
def test_flop_model_is_what_the_eager_reference_computes(model, rows):
    t, cp = model.talker, model.code_predictor
    cache = t.new_cache(rows, 128)
    x, pos = torch.randn(rows, 1, t.hidden_size), torch.full((rows, 1), 10)
    assert _counted(lambda: t.logits(t(x, pos, cache, None, 64))) == roofline.talker_flops(model, rows, 64)
    sp = sampling.SlotParams(greedy=torch.ones(rows, dtype=torch.bool), temperature=torch.ones(rows),
                             top_k=torch.full((rows,), 50), top_p=torch.ones(rows), penalty=torch.ones(rows))
    zeros = torch.zeros(rows, dtype=torch.long)
    frame = lambda: cp.predict_frame(torch.randn(rows, t.hidden_size), zeros, sp, zeros, zeros)  # noqa: E731
    assert _counted(frame) == roofline.predictor_flops(model, rows)
    assert roofline.talker_flops(model, 2 * rows, 64) == 2 * roofline.talker_flops(model, rows, 64)


def test_code_to_wave_reads_every_decoder_parameter_once_per_call(model):
    codec = model.codec
    weights, act = roofline.codec_bytes(codec, carried_chunk(codec, 2, 100, 25))
    assert weights == _size(codec)
    _, act_one = roofline.codec_bytes(codec, carried_chunk(codec, 1, 100, 25))
    assert act == 2 * act_one > 0  # activations scale with the batch


def test_a_run_gives_a_row_per_part_and_rows_and_the_json(tmp_path, capsys):
    ap = argparse.ArgumentParser()
    roofline.add_arguments(ap)
    out = tmp_path / "roofline.json"
    args = ap.parse_args(["--model", str(fixture_dir("custom_voice")), "--rows", "1", "2", "--iters", "1",
                          "--busy", "2", "--json", str(out)])
    assert roofline.main(args) == 0
    res = json.loads(out.read_text())
    assert {"command", "commit", "torch", "device", "rows", "peak_gbs"} <= set(res)
    assert res["torch"] == torch.__version__ and res["peak_gbs"] == 4800.0
    assert sorted((r["part"], r["rows"]) for r in res["rows"]) == sorted(
        (p, b) for p in roofline.PARTS for b in (1, 2))
    for r in res["rows"]:
        assert r["ms_per_call"] > 0 and r["weight_bytes"] > 0
        assert r["gb_per_s"] == pytest.approx((r["weight_bytes"] + r["other_bytes"]) / r["ms_per_call"] / 1e6)
        assert r["peak_share"] == pytest.approx(r["gb_per_s"] / 4800.0)
        assert r["flops"] > 0 and r["tflop_per_s"] == pytest.approx(r["flops"] / r["ms_per_call"] / 1e9)
        peak = 989.0 * roofline.PEAK_SHARE_OF_BF16[r["precision"]]
        assert r["compute_share"] == pytest.approx(r["tflop_per_s"] / peak)
    codec = [r for r in res["rows"] if r["part"] == "code-to-wave"]
    assert codec[1]["flops"] == 2 * codec[0]["flops"]  # rows 1 and 2: the same decode per row
    printed = capsys.readouterr().out
    assert printed.count("| talker step |") == 2 and "% of 4800 GB/s" in printed and "TFLOP/s" in printed
    if not torch.cuda.is_available():
        assert res["busy"] == [] and "needs CUDA" in res["busy_skipped"] and "skipped" in printed


def test_the_default_peak_bandwidth_follows_the_gpu_s_name():
    assert roofline.default_peak_gbs("NVIDIA H100 80GB HBM3") == roofline.PEAK_GBS["H100"]
    assert roofline.default_peak_gbs("NVIDIA H200") == roofline.PEAK_GBS["H200"]
    assert roofline.default_peak_gbs("") == roofline.PEAK_GBS["H200"]
    assert roofline.PEAK_GBS["H100"] < roofline.PEAK_GBS["H200"]


def test_rows_that_are_not_positive_are_refused_naming_the_flag():
    ap = argparse.ArgumentParser()
    roofline.add_arguments(ap)
    with pytest.raises(OmniTTSError, match="--rows"):
        roofline.main(ap.parse_args(["--rows", "0", "8"]))
    with pytest.raises(OmniTTSError, match="--peak-tflops"):
        roofline.main(ap.parse_args(["--peak-tflops", "0"]))
