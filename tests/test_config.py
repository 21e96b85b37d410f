"""Presets and config records: every shipped preset loads and says what its name says, unknown or bad
keys are refused with one line naming them, CompileMode parsing, EngineConfig / SynthesisParams checks."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from omni_tts.config import (
    PRESET_DIR,
    CompileMode,
    EngineConfig,
    ExperimentalConfig,
    SynthesisParams,
    load_preset,
    parse_sets,
    preset_names,
    read_preset,
)
from omni_tts.errors import InputError, OmniTTSError

PRESETS = sorted(PRESET_DIR.glob("*.yaml"))


def test_the_preset_folder_ships_the_app_default_the_benchmark_and_the_all_eager_baseline():
    assert preset_names() == sorted(p.stem for p in PRESETS) == ["all-eager", "bench", "default"]
    default, bench, eager = load_preset("default"), load_preset("bench"), load_preset("all-eager")
    assert default.mode == "auto" and default.modes is None and default.buckets is None
    assert default.chunk_growth and not default.enforce_eager
    assert bench.mode == "default+cudagraph" and bench.max_num_seqs == 32 and not bench.chunk_growth
    assert eager.enforce_eager and eager.mode == "eager" and eager.modes == ["eager"]
    for cuda in (True, False):  # all-eager keeps only eager; the others follow the device
        assert eager.resident_modes(cuda) == [CompileMode.EAGER] and eager.default_mode(cuda) is CompileMode.EAGER
    # CUDA: every mode; CPU: only the default
    assert default.resident_modes(True) == list(CompileMode)
    assert default.resident_modes(False) == [CompileMode.EAGER]
    assert default.default_mode(True) is CompileMode.DEFAULT_CUDAGRAPH


def test_the_record_defaults_are_the_app_default_preset_and_it_names_every_key():
    """One source of every default: presets/default.yaml sets every field, to the record's own default."""
    _, data = read_preset("default")
    fields = {f.name for f in dataclasses.fields(EngineConfig)} - {"name", "experimental"}
    assert set(data) == fields | {"experimental"}
    assert set(data["experimental"]) == {f.name for f in dataclasses.fields(ExperimentalConfig)}
    record = EngineConfig(name="default", description=data["description"])
    for f in dataclasses.fields(EngineConfig):
        assert getattr(load_preset("default"), f.name) == getattr(record, f.name), f.name
    assert EngineConfig().experimental == ExperimentalConfig(**data["experimental"])


def test_presets_ship_inside_the_package():
    import tomllib

    import omni_tts

    assert PRESET_DIR == Path(omni_tts.__file__).parent / "presets"
    with open(Path(__file__).resolve().parents[1] / "pyproject.toml", "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["omni_tts"]
    # package data: `pip install .` elsewhere has every shipped preset
    assert sorted(p for pattern in data for p in PRESET_DIR.parent.glob(pattern)) == PRESETS


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_every_preset_loads_and_matches_its_name(path: Path):
    cfg = load_preset(path.stem)
    assert cfg == load_preset(path)  # by name or by path: the same record
    assert cfg.name == path.stem and cfg.description
    cfg.validate()
    assert cfg.mode == "auto" or CompileMode.parse(cfg.mode)
    assert cfg.max_seq_len > 0 and cfg.initial_chunk_frames >= 1 and cfg.chunk_frames >= 1
    assert cfg.resolved_buckets()[-1] == cfg.max_num_seqs


def test_overrides_replace_preset_values_and_none_keeps_them():
    cfg = load_preset("all-eager", model="/some/dir", device="cpu", max_num_seqs=None, dtype=None)
    assert (cfg.model, cfg.device, cfg.max_num_seqs, cfg.dtype) == ("/some/dir", "cpu", 8, "auto")
    assert load_preset("all-eager", max_num_seqs=3).resolved_buckets() == [1, 2, 3]


def test_unknown_keys_are_refused_with_a_message_naming_them(tmp_path: Path):
    f = tmp_path / "typo.yaml"
    f.write_text("mode: eager\nmax_num_seq: 4\ncolour: red\n")
    with pytest.raises(OmniTTSError) as e:
        load_preset(f)
    msg = str(e.value)
    assert "\n" not in msg and str(f) in msg
    assert "unknown preset key(s): colour, max_num_seq;" in msg
    assert "valid:" in msg and "max_num_seqs" in msg and "initial_chunk_frames" in msg
    (tmp_path / "extra.yaml").write_text("extra: {a: 1}\n")  # the record's catch-all is not a preset key
    with pytest.raises(OmniTTSError, match="unknown preset key\\(s\\): extra;"):
        load_preset(tmp_path / "extra.yaml")


@pytest.mark.parametrize("text,match", [
    ("mode: [eager\n", "malformed YAML"),
    ("- eager\n- default\n", "a preset is a mapping"),
    ("mode: turbo\n", "unknown compile mode 'turbo'"),
    ("device: tpu\n", "device must be auto, cpu or cuda"),
    ("dtype: int8\n", "dtype must be"),
    ("max_num_seqs: 0\n", "max_num_seqs must be 1..1024"),
    ("chunk_frames: 0\n", "chunk_frames must be >= 1"),
])
def test_bad_preset_values_are_one_line_errors(tmp_path: Path, text: str, match: str):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(OmniTTSError, match=match) as e:
        load_preset(f)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("line,key", [('max_num_seqs: "eight"', "max_num_seqs"), ("buckets: 3", "buckets"),
                                      ("use_vllm_pool: 1", "experimental.use_vllm_pool"),
                                      ("max_seq_len: true", "max_seq_len"),
                                      ("mode: 7", "mode"), ("gpu_memory_limit_gb: big", "gpu_memory_limit_gb"),
                                      ("codec_precision: 16", "codec_precision"),
                                      ('kernels: "sometimes"', "experimental.kernels"),
                                      ("experimental: {kernels: 1}", "experimental.kernels"), ("modes: eager", "modes"),
                                      ("modes: [eager, 3]", "modes"), ("enforce_eager: yes please", "enforce_eager")])
def test_a_preset_value_of_the_wrong_type_is_an_omnitts_error(tmp_path: Path, line: str, key: str):
    f = tmp_path / "typed.yaml"
    f.write_text(line + "\n")
    with pytest.raises(OmniTTSError, match=f"preset key '{key}' must be") as e:
        load_preset(f)
    assert "\n" not in str(e.value)


def test_a_missing_preset_lists_the_available_ones():
    with pytest.raises(OmniTTSError) as e:
        load_preset("no-such-preset")
    assert "preset 'no-such-preset' not found; available:" in str(e.value)
    for name in preset_names():
        assert name in str(e.value)


def test_an_empty_preset_file_is_the_defaults(tmp_path: Path):
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    cfg = load_preset(tmp_path / "empty.yaml")
    assert cfg == EngineConfig(name="empty")


# ------------------------------------------------------------------------------------------ CompileMode
@pytest.mark.parametrize("text,mode", [("eager", CompileMode.EAGER), (" Default ", CompileMode.DEFAULT),
                                       ("REDUCE-OVERHEAD", CompileMode.REDUCE_OVERHEAD),
                                       ("default+cudagraph", CompileMode.DEFAULT_CUDAGRAPH),
                                       (CompileMode.EAGER, CompileMode.EAGER)])
def test_compile_mode_parse(text, mode):
    assert CompileMode.parse(text) is mode


@pytest.mark.parametrize("bad", ["", "auto", "cudagraph", "reduce_overhead", "default+graph", None])
def test_compile_mode_parse_errors_name_the_value_and_list_the_valid_ones(bad):
    with pytest.raises(InputError) as e:
        CompileMode.parse(bad)
    assert str(e.value) == (f"unknown compile mode '{bad}'; valid: eager, default, reduce-overhead, "
                            f"default+cudagraph")


def test_compile_mode_properties():
    assert [m for m in CompileMode if m.compiled] == [CompileMode.DEFAULT, CompileMode.REDUCE_OVERHEAD,
                                                     CompileMode.DEFAULT_CUDAGRAPH]
    assert [m for m in CompileMode if m.needs_cuda] == [CompileMode.REDUCE_OVERHEAD, CompileMode.DEFAULT_CUDAGRAPH]


# ------------------------------------------------------------------------------------------ records
def test_engine_config_validate():
    EngineConfig().validate()
    EngineConfig(device="cuda:1", dtype="float16", mode="default+cudagraph").validate()
    for kw, match in [(dict(mode="fast"), "unknown compile mode"), (dict(device="gpu"), "device must be"),
                      (dict(dtype="fp8"), "dtype must be"), (dict(max_num_seqs=0), "max_num_seqs"),
                      (dict(initial_chunk_frames=0), "initial_chunk_frames"),
                      (dict(max_num_seqs="2"), "max_num_seqs must be an integer \\(got '2'\\)"),  # built in code
                      (dict(max_num_seqs=100_000), "max_num_seqs must be 1..1024"),
                      (dict(max_seq_len=10**8), "max_seq_len must be 16..65536"),
                      (dict(gpu_memory_limit_gb=math.nan), "gpu_memory_limit_gb must be > 0"),
                      (dict(request_timeout_s=math.inf), "request_timeout_s must be >= 0 seconds")]:
        with pytest.raises(OmniTTSError, match=match):
            EngineConfig(**kw).validate()
    with pytest.raises(OmniTTSError, match="a preset is a name .* \\(got int\\)"):
        load_preset(5)


def test_synthesis_params_validate():
    SynthesisParams(text="hi").validate()
    SynthesisParams(text="x" * 5000, task="voice_design", instruct="calm", temperature=0.0, top_p=1.0).validate()
    for kw, match in [(dict(text="x" * 5001), "too long \\(5001 characters; at most 5000\\)"),
                      (dict(text=""), "text is empty"), (dict(text=None), "text is empty"),
                      (dict(text="hi", task="voice_design"), "needs an instruct"),
                      (dict(text="hi", max_new_tokens=0), "max_new_tokens must be >= 2 and <= 8192"),
                      (dict(text="hi", subtalker_temperature=-0.1), "subtalker_temperature must be >= 0"),
                      (dict(text="hi", subtalker_top_p=1.5), "subtalker_top_p must be in \\(0, 1\\]"),
                      (dict(text="hi", repetition_penalty=0), "repetition_penalty must be in \\(0, 10\\]"),
                      (dict(text="hi", task="clone"), "unknown task 'clone'; valid: custom_voice, voice_design, "
                                                      "voice_clone")]:
        with pytest.raises(InputError, match=match):
            SynthesisParams(**kw).validate()


@pytest.mark.parametrize("line,fragment", [("max_seq_len: 0", "max_seq_len must be 16..65536"),
                                           ("gpu_memory_limit_gb: -1", "gpu_memory_limit_gb must be > 0"),
                                           ("codec_precision: fp8", "codec_precision must be auto, float32"),
                                           ("kernel_configs: /no/such.json", "kernel_configs: no such file"),
                                           ("admit_hold_ms: -1", "admit_hold_ms must be 0..1000"),
                                           ("admit_hold_ms: 0.5", "must be an integer"),
                                           ("max_preparing: -2", "experimental.max_preparing must be >= 0"),
                                           ("max_seq_len: 0.5", "must be an integer"),
                                           ("use_vllm_pool: 1", "'experimental.use_vllm_pool' must be true or false")])
def test_out_of_range_preset_values_are_one_line_errors(tmp_path: Path, line: str, fragment: str):
    f = tmp_path / "range.yaml"
    f.write_text(line + "\n")
    with pytest.raises(OmniTTSError, match=fragment):
        load_preset(f)


def test_switches_load_from_a_preset_and_from_set_pairs(tmp_path: Path):
    f = tmp_path / "switches.yaml"
    f.write_text("kernels: false\nexperimental:\n  use_vllm_pool: false\n")
    cfg = load_preset(f)  # experimental keys bare or under `experimental:` land in the same place
    assert cfg.experimental == ExperimentalConfig(kernels=False, use_vllm_pool=False)
    assert EngineConfig().experimental == ExperimentalConfig(kernels=True, use_vllm_pool=True)
    sets = parse_sets(["kernels=false", "max_num_seqs=16", "buckets=[1, 4, 16]", "mode=default",
                       "experimental.use_vllm_pool=false", "modes=[eager, default]", "admit_hold_ms=0"])
    assert sets == {"experimental.kernels": False, "max_num_seqs": 16, "buckets": [1, 4, 16], "mode": "default",
                    "experimental.use_vllm_pool": False, "modes": ["eager", "default"], "admit_hold_ms": 0}
    cfg = load_preset("bench", **sets)
    assert (cfg.max_num_seqs, cfg.buckets, cfg.mode, cfg.admit_hold_ms) == (16, [1, 4, 16], "default", 0)
    assert not cfg.experimental.kernels and cfg.resident_modes(False) == [CompileMode.EAGER, CompileMode.DEFAULT]


def test_decided_switches_are_gone():
    """The A/B switches that measurement decided are no keys any more: a preset naming one is refused."""
    for key in ("lookahead", "kernel_pdl", "talker_pdl_rows", "predictor_kernel_rows", "talker_kernel_rows",
                "priority_streams", "codec_fused", "first_chunk_graphs", "compile_regions", "default_whole_frame"):
        with pytest.raises(OmniTTSError, match=f"unknown preset key\\(s\\): {key};"):
            parse_sets([f"{key}=true"])


def test_an_experimental_section_that_is_not_a_mapping_or_has_unknown_keys_is_refused(tmp_path: Path):
    for text, match in (("experimental: 3\n", "'experimental' is a mapping"),
                        ("experimental: {turbo: true}\n", "experimental.turbo")):
        f = tmp_path / "experimental.yaml"
        f.write_text(text)
        with pytest.raises(OmniTTSError, match=match) as e:
            load_preset(f)
        assert "\n" not in str(e.value)


def test_the_codec_precision_auto_is_tf32_on_cuda_and_exact_on_a_cpu():
    """What the engine sets and what microbench measures first chunks in: one resolution for both."""
    assert EngineConfig().resolved_codec_precision(True) == "tf32"
    assert EngineConfig().resolved_codec_precision(False) == "float32"
    for p in ("float32", "tf32", "bfloat16"):
        assert EngineConfig(codec_precision=p).resolved_codec_precision(True) == p
        assert EngineConfig(codec_precision=p).resolved_codec_precision(False) == p
