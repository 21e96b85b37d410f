"""Validation at the door: every request field bounded in one place (SynthesisParams.validate, via
limits.LIMITS), one InputError naming the field whatever it holds, and the engine refusing such a
request at submit while it keeps serving good ones (real engine on the tiny fixture checkpoint, CPU);
checkpoint configs bounded (sizes, ids, parameter estimate) before any tensor is read."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import typing
from pathlib import Path

import numpy as np
import pytest
import torch
from _fixtures import fixture_dir
from safetensors.torch import load_file, save_file

from omni_tts.config import EngineConfig, SynthesisParams
from omni_tts.engine.engine import Engine
from omni_tts.errors import CheckpointError, InputError, OmniTTSError
from omni_tts.limits import LIMITS, MAX_NEW_TOKENS, MAX_TOP_K
from omni_tts.models.checkpoint import load_checkpoint
from omni_tts.models.checkpoint_limits import check_configs, estimate_parameters
from omni_tts.models.checkpoint_maker import make_configs, module_shapes
from omni_tts.models.selection import load_embedded
from omni_tts.models.text import TextTokenizer

TIMEOUT = 120.0
NAN, INF = float("nan"), float("inf")


def params(**kw) -> SynthesisParams:
    args = dict(text="hello there", speaker="ryan", language="English", max_new_tokens=4)
    args.update(kw)
    return SynthesisParams(**args)


BAD = [  # (field, value, fragment of the message); the field's name must lead the message
    ("seed", 2**63, "seed must be >= 0 and <= 9223372036854775807 (got 9223372036854775808)"),
    ("seed", 1e300, "seed must be a whole number (got 1e+300)"),
    ("seed", True, "seed must be a whole number (got True)"),
    ("seed", -1, "seed must be >= 0"),
    ("seed", 10**5000, "seed must be >= 0 and <= 9223372036854775807 (got an integer of 16610 bits)"),
    ("top_k", -1, "top_k must be >= 0 and <= 4096"),
    ("top_k", 10**9, "top_k must be >= 0 and <= 4096 (got 1000000000"),
    ("top_k", "50", "top_k must be a whole number"),
    ("subtalker_top_k", 2.5, "subtalker_top_k must be a whole number"),
    ("temperature", NAN, "temperature must be a finite number (got nan)"),
    ("temperature", INF, "temperature must be >= 0.0 and <= 10.0 (got inf"),
    ("subtalker_temperature", -0.5, "subtalker_temperature must be >= 0.0"),
    ("top_p", NAN, "top_p must be a finite number"),
    ("top_p", 0.0, "top_p must be in (0, 1]"),
    ("subtalker_top_p", 1.01, "subtalker_top_p must be in (0, 1]"),
    ("repetition_penalty", NAN, "repetition_penalty must be a finite number"),
    ("repetition_penalty", INF, "repetition_penalty must be in (0, 10]"),
    ("repetition_penalty", 0.0, "repetition_penalty must be in (0, 10]"),
    ("max_new_tokens", 1, "max_new_tokens must be >= 2 and <= 8192 (got 1"),
    ("max_new_tokens", 10**12, "max_new_tokens must be >= 2 and <= 8192"),
    ("max_new_tokens", 2**70, "max_new_tokens must be >= 2 and <= 8192 (got an integer of 71 bits"),
    ("max_new_tokens", 1e12, "max_new_tokens must be a whole number"),
    ("fixed_frames", 0, "fixed_frames must be >= 1 and <= 8191"),
    ("fixed_frames", 10**9, "fixed_frames must be >= 1 and <= 8191"),
    ("text", "a\ud800b", "text has a character that is not valid Unicode at position 1"),
    ("text", 42, "text must be a string (got int)"),
    ("text", "x" * 5001, "text is too long (5001 characters; at most 5000)"),
    ("instruct", "calm \udfff", "instruct has a character that is not valid Unicode at position 5"),
    ("instruct", "x" * 2001, "instruct is too long"),
    ("speaker", "r" * 65, "speaker is too long (65 characters; at most 64)"),
    ("speaker", "\ud83d", "speaker has a character that is not valid Unicode"),
    ("language", 7, "language must be a string (got int)"),
    ("greedy", "false", "greedy must be true or false (got 'false')"),
    ("do_sample", 1, "do_sample must be true or false"),
    ("non_streaming_mode", "yes", "non_streaming_mode must be true or false"),
    ("voice", object(), "a voice prompt is for task voice_clone, not custom_voice"),
]


@pytest.mark.parametrize("field,value,fragment", BAD, ids=[f"{f}-{i}" for i, (f, _, _) in enumerate(BAD)])
def test_every_bad_field_is_one_input_error_naming_it(field, value, fragment):
    with pytest.raises(InputError) as e:
        params(**{field: value}).validate()
    msg = str(e.value)
    assert fragment in msg and "\n" not in msg and len(msg) < 300, msg
    assert msg.split()[0] in (field, "a"), msg


GOOD = [("seed", 0), ("seed", 2**63 - 1), ("seed", np.int64(7)), ("top_k", 0), ("top_k", MAX_TOP_K),
        ("temperature", 0), ("temperature", 10.0), ("temperature", np.float32(0.7)), ("top_p", 1e-9),
        ("top_p", 1), ("repetition_penalty", 10), ("max_new_tokens", 2), ("max_new_tokens", MAX_NEW_TOKENS),
        ("fixed_frames", MAX_NEW_TOKENS - 1), ("text", "x" * 2000), ("speaker", "r" * 64), ("language", None),
        ("do_sample", None), ("greedy", True)]


@pytest.mark.parametrize("field,value", GOOD, ids=[f"{f}={str(v)[:12]}" for f, v in GOOD])
def test_values_at_the_bounds_are_accepted(field, value):
    params(**{field: value}).validate()


def test_limits_cover_every_numeric_request_field():
    """A numeric field added to SynthesisParams without a bound would be unchecked at the door."""
    hints = typing.get_type_hints(SynthesisParams)
    numeric = {f.name for f in dataclasses.fields(SynthesisParams)
               if {int, float} & set(typing.get_args(hints[f.name]) or (hints[f.name],))}
    assert numeric == set(LIMITS)
    for name, limit in LIMITS.items():
        assert limit.low < limit.high, name
        assert limit.integer == (int in typing.get_args(hints[name])), name


def test_the_tokenizer_refuses_unencodable_text_with_an_input_error():
    """A voice clone's ref_text reaches the tokenizer without passing SynthesisParams."""
    tok = TextTokenizer(fixture_dir("custom_voice"))
    with pytest.raises(InputError, match="not valid Unicode at position 2"):
        tok.encode("ok\udc80")
    assert tok.encode("ok") == tok.encode("ok")


# ------------------------------------------------------------------------------------------ engine
@pytest.fixture(scope="module")
def engine(_one_thread):
    eng = Engine.from_config(EngineConfig(model=str(fixture_dir("custom_voice")), mode="eager", device="cpu",
                                          max_num_seqs=4, max_seq_len=128, initial_chunk_frames=1, chunk_frames=4))
    yield eng
    eng.shutdown()


@pytest.mark.parametrize("kw", [dict(seed=2**63), dict(seed=1e300), dict(text="hi \ud800"), dict(top_k=-3),
                                dict(temperature=INF), dict(temperature=NAN), dict(repetition_penalty=NAN),
                                dict(max_new_tokens=2**70)],
                         ids=["seed-2^63", "seed-1e300", "surrogate", "top_k-neg", "temp-inf", "temp-nan",
                              "penalty-nan", "max_new-2^70"])
def test_engine_refuses_the_bad_request_at_submit_and_serves_the_others(engine, kw):
    good = [params(text=t, seed=s, do_sample=True, max_new_tokens=None, fixed_frames=3)
            for t, s in (("first one", 0), ("second", 2**63 - 1))]
    handles = [engine.submit(good[0])]
    with pytest.raises(InputError) as e:
        engine.submit(params(do_sample=True, **kw))
    assert next(iter(kw)) in str(e.value) or "text" in str(e.value)
    handles.append(engine.submit(good[1]))
    results = [h.result(TIMEOUT) for h in handles]
    for r in results:  # the largest seed runs: the bound is what the device's int64 seed holds
        assert r.codes.shape == (3, 16) and 0 <= int(r.codes.min()) and int(r.codes.max()) < 2048


@pytest.mark.parametrize("kw, words", [
    (dict(speaker="nobody"), "unknown speaker 'nobody'"),
    (dict(language="Klingon"), "unknown language 'Klingon'"),
    (dict(task="voice_clone", speaker=None), "cannot do task 'voice_clone'"),
    (dict(fixed_frames=500), "does not fit this engine"),
    (dict(mode="reduce-overhead"), "mode reduce-overhead is not available"),
])
def test_check_refuses_what_submit_refuses_and_queues_nothing(engine, kw, words):
    before = dict(engine.stats.outcomes)
    for call in (engine.check, engine.submit):
        with pytest.raises(InputError, match=words):
            call(params(**kw))
    assert engine.check(params(text="Fine. " * 400)) is None  # a long text is spoken in segments
    snap = engine.snapshot()
    assert dict(engine.stats.outcomes) == before and snap.active == 0 and snap.waiting == 0


@pytest.mark.parametrize("bad", [None, "Hello.", {"text": "Hello."}])
def test_a_request_that_is_not_synthesis_params_is_one_input_error(engine, bad):
    for call in (engine.check, engine.submit):
        with pytest.raises(InputError, match=f"a request is a SynthesisParams.*got {type(bad).__name__}"):
            call(bad)
    with pytest.raises(OmniTTSError, match="takes an EngineConfig"):
        Engine.from_config(bad)


# ------------------------------------------------------------------------------------------ checkpoints
def _checkpoint_copy(tmp_path: Path, name: str = "custom_voice") -> Path:
    d = tmp_path / name
    shutil.copytree(fixture_dir(name), d, ignore=shutil.ignore_patterns("golden"))
    return d


def _edit_json(file: Path, path: str, value) -> None:
    data = json.loads(file.read_text())
    *parents, key = path.split(".")
    node = data
    for p in parents:
        node = node[p]
    node[key] = value
    file.write_text(json.dumps(data))


HUGE_BUT_EACH_IN_BOUNDS = {"num_hidden_layers": 256, "hidden_size": 16384, "intermediate_size": 131072,
                           "num_attention_heads": 128, "num_key_value_heads": 128, "head_dim": 128}
BAD_CONFIGS = [  # (file, dotted key, value, fragment)
    ("config.json", "talker_config.num_hidden_layers", 1e6, "talker_config.num_hidden_layers must be a whole number"),
    ("config.json", "talker_config.num_hidden_layers", 10**6, "num_hidden_layers must be from 1 to 256 (got 1000000)"),
    ("config.json", "talker_config.hidden_size", 10**9, "talker_config.hidden_size must be from 1 to 32768"),
    ("config.json", "talker_config.vocab_size", 10**10, "talker_config.vocab_size must be from 1 to 1048576"),
    ("config.json", "talker_config.num_attention_heads", -4, "num_attention_heads must be from 1 to 256 (got -4)"),
    ("config.json", "talker_config.intermediate_size", "big", "intermediate_size must be a whole number"),
    ("config.json", "talker_config.code_predictor_config.num_hidden_layers", 0,
     "code_predictor_config.num_hidden_layers must be from 1 to 256"),
    ("config.json", "talker_config.code_predictor_config", HUGE_BUT_EACH_IN_BOUNDS, "billion parameters, more than"),
    ("config.json", "tts_bos_token_id", 10**6, "tts_bos_token_id must be from 0 to 276"),
    ("config.json", "talker_config.spk_id.ryan", 5000, "talker_config.spk_id.ryan must be from 0 to 3071"),
    ("config.json", "talker_config.codec_eos_token_id", -1, "codec_eos_token_id must be from 0 to 3071"),
    ("speech_tokenizer/config.json", "decoder_config.upsample_rates", [8, -5, 4, 3],
     "decoder_config.upsample_rates[1] must be from 1 to 64"),
    ("speech_tokenizer/config.json", "decoder_config.num_hidden_layers", 10**6, "decoder_config.num_hidden_layers"),
    ("generation_config.json", "max_new_tokens", 10**12, "generation_config.json: max_new_tokens must be >= 2"),
    ("generation_config.json", "temperature", NAN, "generation_config.json: temperature must be a finite number"),
]


@pytest.mark.parametrize("file,key,value,fragment", BAD_CONFIGS, ids=[f"{k}-{i}" for i, (_, k, _, _) in
                                                                      enumerate(BAD_CONFIGS)])
def test_absurd_checkpoint_configs_are_one_line_before_any_tensor(tmp_path, file, key, value, fragment):
    d = _checkpoint_copy(tmp_path)
    _edit_json(d / file, key, value)
    (d / "model.safetensors").write_bytes(b"")  # were the weights read, the error would name this file instead
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    assert fragment in str(e.value) and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("size", ["tiny", "0.6B", "1.7B"])
def test_parameter_estimate_is_close_to_the_modules_and_released_sizes_pass(size):
    config, generation, codec = make_configs(size)
    check_configs(config, codec, generation, size)
    model, speech = module_shapes(config, codec)
    exact = sum(math.prod(s) for s in model.values()) + sum(math.prod(s) for s in speech.values())
    assert 0.9 < estimate_parameters(config, codec) / exact < 1.1


def _truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


def _drop_a_tensor(file: Path) -> None:
    tensors = load_file(str(file))
    tensors.pop(sorted(tensors)[0])
    save_file(tensors, str(file))


DAMAGE = {  # what an interrupted or tampered cache can leave behind
    "no config.json": lambda d: (d / "config.json").unlink(),
    "truncated weights": lambda d: _truncate(d / "model.safetensors"),
    "truncated codec weights": lambda d: _truncate(d / "speech_tokenizer" / "model.safetensors"),
    "a tensor missing": lambda d: _drop_a_tensor(d / "model.safetensors"),
    "no tokenizer": lambda d: (d / "vocab.json").unlink(),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_broken_embedded_checkpoint_is_rebuilt_with_a_message(tmp_path, damage):
    said: list[str] = []
    first = load_embedded(tmp_path, said.append)
    assert said == [] and first.is_embedded_demo
    good = {k: v.clone() for k, v in first.weights.items()}
    DAMAGE[damage](first.path)
    again = load_embedded(tmp_path, said.append)
    assert len(said) == 1 and "is broken" in said[0] and "rebuilding it" in said[0] and str(first.path) in said[0]
    assert again.path == first.path and again.weights.keys() == good.keys()
    assert all(torch.equal(again.weights[k], v) for k, v in good.items())  # the same deterministic demo
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.path.name]  # nothing left aside


def test_an_embedded_checkpoint_that_cannot_be_rebuilt_says_to_delete_it(tmp_path):
    path = load_embedded(tmp_path).path
    (path / "config.json").unlink()
    (path / "config.json").mkdir()  # neither readable as a file nor removable by the maker's rename
    (tmp_path / f".{path.name}.broken{os.getpid()}").mkdir()
    (tmp_path / f".{path.name}.broken{os.getpid()}" / "keep").write_text("x")  # blocks moving it aside
    with pytest.raises(CheckpointError, match=f"delete {path} and run again"):
        load_embedded(tmp_path)


def test_a_kv_cache_larger_than_the_machine_is_one_line_before_any_allocation():
    from omni_tts.models.layers import KVCache

    with pytest.raises(OmniTTSError, match=r"the talker's KV cache for 1024 slots x 65536 positions needs [0-9.]+ GiB, "
                                           r"more than the [0-9.]+ GiB of this machine's memory: lower max_num_seqs"):
        KVCache(1024, 1024, 64, 65536, 128, "cpu", torch.float32)
