"""Text tokenizer ids vs the official processor, chat templates, language/speaker rules, Prompt fields.

Expected ids were produced by the official qwen-tts 0.1.1 processor (transformers 4.57.3) on the
tiny fixture's tokenizer files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _fixtures import fixture_dir

from omni_tts.errors import CheckpointError, InputError
from omni_tts.models.text import PromptBuilder, TextTokenizer, assistant_template


def builder(name: str = "custom_voice") -> PromptBuilder:
    d = fixture_dir(name)
    return PromptBuilder(json.loads((d / "config.json").read_text()), TextTokenizer(d))


OFFICIAL_IDS = {
    "hello there, this is a test of the system.":
        [71, 68, 75, 75, 78, 220, 256, 257, 68, 11, 220, 256, 72, 82, 220, 72, 82, 260, 259, 68, 82, 83, 220, 78, 69,
         220, 256, 68, 220, 82, 88, 82, 83, 68, 76, 13],
    "Numbers 12345 and 3.14! ¿Qué tal? naïve café":
        [45, 84, 76, 65, 257, 82, 220, 16, 17, 18, 19, 20, 260, 77, 67, 220, 18, 13, 16, 19, 0, 220, 126, 123, 48, 84,
         127, 102, 259, 64, 75, 30, 220, 77, 64, 127, 107, 85, 68, 220, 66, 64, 69, 127, 102],
    "你好，世界。今天天气很好！":
        [160, 121, 254, 161, 98, 121, 171, 120, 234, 160, 116, 244, 163, 243, 234, 159, 222, 224, 160, 119, 232, 161,
         97, 102, 161, 97, 102, 162, 108, 242, 161, 122, 230, 161, 98, 121, 171, 120, 223],
    "  leading  spaces\tand\ttabs\n\nnewlines  ":
        [220, 220, 75, 68, 64, 67, 258, 70, 220, 220, 82, 79, 64, 66, 68, 82, 197, 64, 77, 67, 197, 83, 64, 65, 82,
         198, 198, 77, 68, 86, 75, 258, 68, 82, 220, 220],
    "The assistant said: 'I'm here', user's turn...":
        [51, 71, 68, 220, 264, 220, 82, 64, 72, 67, 25, 220, 6, 40, 6, 76, 220, 71, 257, 68, 6, 11, 220, 265, 6, 82,
         259, 84, 81, 77, 13, 13, 13],
    "emoji 😀 and e\u0301 combining":  # NFC folds e + U+0301 into é
        [68, 76, 78, 73, 72, 220, 172, 253, 246, 222, 260, 77, 67, 220, 127, 102, 220, 66, 78, 76, 65, 258, 258, 70],
    "<|im_start|>inject<|im_end|>": [262, 258, 73, 68, 66, 83, 263],
    "a\r\nb": [64, 201, 198, 65],
    "Ich heiße Jürgen; Привет мир":
        [40, 66, 71, 220, 71, 68, 72, 127, 253, 68, 220, 41, 127, 120, 81, 70, 68, 77, 26, 220, 140, 253, 141, 222,
         140, 116, 140, 110, 140, 113, 141, 224, 220, 140, 120, 140, 116, 141, 222],
    "12:30pm -- $5.00 (approx) #tag @name":
        [16, 17, 25, 18, 15, 79, 76, 220, 12, 12, 220, 3, 20, 13, 15, 15, 220, 7, 64, 79, 79, 81, 78, 87, 8, 220, 2,
         83, 64, 70, 220, 31, 77, 64, 76, 68],
}


@pytest.mark.parametrize("text", list(OFFICIAL_IDS))
def test_tokenizer_matches_official_processor(text: str) -> None:
    tok = TextTokenizer(fixture_dir("custom_voice"))
    assert tok.encode(text) == OFFICIAL_IDS[text]
    # inside the assistant template, the text ids are exactly the slice the official generate takes
    ids = tok.encode(assistant_template(text))
    assert ids[:3] == [262, 264, 198] and ids[-5:] == [263, 198, 262, 264, 198]
    assert ids[3:-5] == OFFICIAL_IDS[text]


def test_prompt_fields_custom_voice() -> None:
    b = builder()
    p = b.build("custom_voice", "hello there, this is a test of the system.", "Vivian", "English")
    assert p.role_ids == [262, 264, 198]
    assert p.text_ids == OFFICIAL_IDS["hello there, this is a test of the system."]
    assert p.codec_prefix_ids == [2154, 2156, 2050, 2157]  # think, think_bos, english, think_eos
    assert p.speaker_id == 3065 and p.instruct_ids is None
    assert (p.codec_pad_id, p.codec_bos_id) == (2148, 2149)
    assert (p.tts_bos_id, p.tts_eos_id, p.tts_pad_id) == (267, 268, 266)
    assert p.non_streaming_mode is True  # official default for custom_voice


def test_auto_language_has_no_language_id() -> None:
    p = builder().build("custom_voice", "hi", "ryan", "Auto")
    assert p.codec_prefix_ids == [2155, 2156, 2157] and p.language_id is None  # nothink, think_bos, think_eos


@pytest.mark.parametrize("speaker,language,expected", [
    ("dylan", "Chinese", 2074), ("Dylan", "auto", 2074), ("ERIC", "chinese", 2062),
    ("dylan", "English", 2050), ("ryan", "Chinese", 2055), ("vivian", "Auto", None)])
def test_dialect_override(speaker: str, language: str, expected: int | None) -> None:
    assert builder().build("custom_voice", "hi", speaker, language).language_id == expected


def test_speakers_case_insensitive_and_default() -> None:
    b = builder()
    assert b.build("custom_voice", "hi", "VIVIAN").speaker_id == 3065
    assert b.build("custom_voice", "hi", None).speaker_id == b.speaker_ids[b.speakers()[0]]


def test_unknown_speaker_lists_valid() -> None:
    with pytest.raises(InputError, match=r"unknown speaker 'bob'; valid: dylan, eric, ryan, vivian"):
        builder().build("custom_voice", "hi", "bob")


def test_unknown_language_lists_valid_without_dialects() -> None:
    with pytest.raises(InputError) as e:
        builder().build("custom_voice", "hi", "ryan", "Klingon")
    msg = str(e.value)
    assert "unknown language 'Klingon'" in msg and "auto" in msg and "english" in msg and "dialect" not in msg
    assert "\n" not in msg


def test_bad_requests() -> None:
    b = builder()
    with pytest.raises(InputError, match="text is empty"):
        b.build("custom_voice", "   ", "ryan")
    vd = builder("voice_design")
    with pytest.raises(InputError, match="instruct"):
        vd.build("voice_design", "hello", None, "English", None)
    with pytest.raises(InputError, match="instruct"):
        vd.build("voice_design", "hello", None, "English", "  ")


def test_instruct_and_streaming_modes() -> None:
    vd = builder("voice_design")
    p = vd.build("voice_design", "hello", None, "English", "a calm voice")
    assert p.instruct_ids[:3] == [262, 265, 198] and p.instruct_ids[-2:] == [263, 198]
    assert p.speaker_id is None and p.non_streaming_mode is True
    assert vd.build("voice_design", "hello", None, "English", "x", non_streaming_mode=False).non_streaming_mode is False
    base = builder("base")
    assert base.build("voice_clone", "hello", None, "English").non_streaming_mode is False
    ref = base.build("voice_clone", "hello", None, "English", ref_text="the ref").ref_text_ids
    assert ref == base.tokenizer.encode("the ref")


def test_instruct_dropped_for_0b6_custom_voice(tmp_path: Path) -> None:
    d = fixture_dir("custom_voice")
    cfg = json.loads((d / "config.json").read_text())
    assert PromptBuilder(cfg, TextTokenizer(d)).build("custom_voice", "hi", "ryan", instruct="slow").instruct_ids
    cfg["tts_model_size"] = "0b6"
    prompt = PromptBuilder(cfg, TextTokenizer(d)).build("custom_voice", "hi", "ryan", instruct="slow")
    assert prompt.instruct_ids is None


def test_broken_tokenizer_files(tmp_path: Path) -> None:
    d = fixture_dir("custom_voice")
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(d / name, tmp_path / name)
    (tmp_path / "vocab.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="vocab.json: malformed JSON"):
        TextTokenizer(tmp_path)
    (tmp_path / "vocab.json").unlink()
    with pytest.raises(CheckpointError, match="vocab.json: file not found"):
        TextTokenizer(tmp_path)
