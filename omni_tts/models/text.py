"""Text side of a request: tokenizer, chat templates, language/speaker resolution, the `Prompt`.

Owns: the byte-level BPE text tokenizer rebuilt from a checkpoint's `vocab.json`, `merges.txt` and
`tokenizer_config.json` (added tokens), giving the same ids as the official Qwen2 tokenizer; the
three chat templates (assistant text, user instruct, reference text); mapping language and speaker
names (case-insensitive) to codec ids, including the dialect override for dialect speakers; and the
model-free `Prompt` record (plain token ids) that `omni_tts.models.qwen3_tts` turns into embeddings.
Knows nothing about tensors, weights or devices.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni_tts.errors import CheckpointError, InputError
from omni_tts.models.checkpoint import read_json

_NEEDED = "the text tokenizer needs it"  # why a missing tokenizer file is an error

# The pre-tokenizer split of the Qwen2 family (contractions, letters, single digits, punctuation runs,
# newlines, whitespace), followed by a byte-level mapping without regex or prefix space.
_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")

# Official default of `non_streaming_mode` per task.
NON_STREAMING_DEFAULT = {"custom_voice": True, "voice_design": True, "voice_clone": False}
# How many template tokens surround the text in the assistant template: `<|im_start|>assistant\n`
# before, `<|im_end|>\n<|im_start|>assistant\n` after.
ROLE_LEN = 3
TAIL_LEN = 5


def assistant_template(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def instruct_template(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def ref_template(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n"


class TextTokenizer:
    """Qwen2-style byte-level BPE built with the `tokenizers` library from the checkpoint files."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        directory = Path(directory)
        vocab = read_json(directory / "vocab.json", _NEEDED)
        merges = _read_merges(directory / "merges.txt")
        tok_cfg = read_json(directory / "tokenizer_config.json", _NEEDED)
        added = tok_cfg.get("added_tokens_decoder", {})
        if not isinstance(added, dict):
            raise CheckpointError(f"{directory / 'tokenizer_config.json'}: 'added_tokens_decoder' must be a mapping")
        spec = {
            "version": "1.0",
            "added_tokens": [_added_token(int(i), t) for i, t in sorted(added.items(), key=lambda kv: int(kv[0]))],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": _SPLIT_PATTERN}, "behavior": "Isolated", "invert": False},
                {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
            ]},
            "post_processor": None,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                      "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": merges},
        }
        try:
            self._tok = Tokenizer.from_str(json.dumps(spec))
        except Exception as e:  # tokenizers raises plain Exception subclasses
            raise CheckpointError(f"{directory}: cannot build the text tokenizer ({str(e).splitlines()[0]})") from None
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; InputError for text UTF-8 cannot encode (the tokenizer's own error is a
        TypeError that names no field)."""
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise InputError(f"text has a character that is not valid Unicode at position {e.start} "
                             f"(a lone surrogate {text[e.start]!a})") from None
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=False)


def _added_token(idx: int, t: dict[str, Any]) -> dict[str, Any]:
    return {"id": idx, "content": t["content"], "single_word": bool(t.get("single_word", False)),
            "lstrip": bool(t.get("lstrip", False)), "rstrip": bool(t.get("rstrip", False)),
            "normalized": bool(t.get("normalized", False)), "special": bool(t.get("special", False))}


def _read_merges(file: Path) -> list[str]:
    if not file.is_file():
        raise CheckpointError(f"{file}: file not found ({_NEEDED})")
    lines = file.read_text(encoding="utf-8").splitlines()
    merges = [ln for ln in lines if ln and not ln.startswith("#version")]
    bad = [ln for ln in merges if len(ln.split(" ")) != 2]
    if bad:
        raise CheckpointError(f"{file}: malformed merge line '{bad[0][:40]}'")
    return merges


@dataclass
class Prompt:
    """Token ids describing one request's talker prefill, before any embedding.

    Text-side ids index the talker's text embedding; codec-side ids index its codec embedding.
    The prefill is: [instruct_ids] + role_ids + codec prefix rows (tts_pad/tts_bos over
    codec_prefix_ids + speaker + codec_pad) + the text part (first text token, or in non-streaming
    mode the whole text + tts_eos over codec_pad, then tts_pad over codec_bos).
    """

    task: str
    role_ids: list[int]  # `<|im_start|>assistant\n`
    text_ids: list[int]  # the words to speak (template stripped)
    instruct_ids: list[int] | None  # full `<|im_start|>user\n...<|im_end|>\n`, or None
    codec_prefix_ids: list[int]  # [nothink, think_bos, think_eos] or [think, think_bos, lang, think_eos]
    speaker_id: int | None  # codec id of a built-in speaker, or None
    language_id: int | None  # after the dialect override; None for Auto
    non_streaming_mode: bool
    codec_pad_id: int
    codec_bos_id: int
    tts_bos_id: int
    tts_eos_id: int
    tts_pad_id: int
    ref_text_ids: list[int] | None = None  # voice clone (ICL): the reference transcript ids

    @property
    def trailing_text_ids(self) -> list[int]:
        """Text ids fed one per frame after the prefill (then tts_eos, then tts_pad for ever).
        Empty in non-streaming mode (the whole text is in the prefill). Not used for voice-clone ICL."""
        return [] if self.non_streaming_mode else self.text_ids[1:]


class PromptBuilder:
    """Turns (task, text, speaker, language, instruct) into a `Prompt` for one checkpoint."""

    def __init__(self, config: dict[str, Any], tokenizer: TextTokenizer) -> None:
        talker = config["talker_config"]
        self.tokenizer = tokenizer
        self.model_type = str(config.get("tts_model_type", ""))
        self.model_size = str(config.get("tts_model_size", ""))
        self.tts_ids = (int(config["tts_bos_token_id"]), int(config["tts_eos_token_id"]),
                        int(config["tts_pad_token_id"]))
        self.codec = {k: int(talker[k]) for k in ("codec_pad_id", "codec_bos_id", "codec_think_id",
                                                    "codec_nothink_id", "codec_think_bos_id", "codec_think_eos_id")}
        self.language_ids = {str(k).lower(): int(v) for k, v in (talker.get("codec_language_id") or {}).items()}
        self.speaker_ids = {str(k).lower(): int(v) for k, v in (talker.get("spk_id") or {}).items()}
        self.dialects = {str(k).lower(): v for k, v in (talker.get("spk_is_dialect") or {}).items()}

    def speakers(self) -> list[str]:
        """Built-in speaker names in checkpoint order (lower case)."""
        return list(self.speaker_ids)

    def languages(self) -> list[str]:
        """Valid language names: 'auto' plus every non-dialect language of the checkpoint."""
        return ["auto"] + [k for k in self.language_ids if "dialect" not in k]

    def language_id(self, language: str | None, speaker: str | None) -> int | None:
        lang = (language or "auto").strip().lower()
        if lang not in self.languages():
            raise InputError(f"unknown language '{language}'; valid: {', '.join(self.languages())}")
        lang_id = None if lang == "auto" else self.language_ids[lang]
        dialect = self.dialects.get(speaker.lower(), False) if speaker else False
        if lang in ("chinese", "auto") and dialect:
            if str(dialect).lower() not in self.language_ids:
                raise CheckpointError(f"config.json: speaker '{speaker}' has dialect '{dialect}' "
                                      f"missing from codec_language_id")
            lang_id = self.language_ids[str(dialect).lower()]
        return lang_id

    def speaker_id(self, speaker: str) -> int:
        key = speaker.strip().lower()
        if key not in self.speaker_ids:
            valid = ", ".join(self.speakers()) or "(none: this checkpoint has no built-in speakers)"
            raise InputError(f"unknown speaker '{speaker}'; valid: {valid}")
        return self.speaker_ids[key]

    def build(self, task: str, text: str, speaker: str | None = None, language: str | None = "Auto",
              instruct: str | None = None, non_streaming_mode: bool | None = None,
              ref_text: str | None = None) -> Prompt:
        """Validate and tokenize one request. Raises InputError with one line on bad input."""
        if not isinstance(text, str) or not text.strip():
            raise InputError("text is empty: give some words to speak")
        if task == "voice_design" and not (instruct and instruct.strip()):
            raise InputError("voice_design needs an instruct text describing the voice (--instruct)")
        if task == "custom_voice":
            speaker = speaker if speaker and speaker.strip() else self.speakers()[0] if self.speakers() else None
            if speaker is None:
                raise InputError("this checkpoint has no built-in speakers; custom_voice needs one")
            speaker_id: int | None = self.speaker_id(speaker)
            if self.model_size == "0b6":  # the official code drops instruct for the 0.6B custom-voice model
                instruct = None
        else:
            speaker, speaker_id = None, None
        lang_id = self.language_id(language, speaker)
        ids = self.tokenizer.encode(assistant_template(text))
        if len(ids) < ROLE_LEN + TAIL_LEN + 1:
            raise InputError("text is empty after tokenization: give some words to speak")
        instruct_ids = self.tokenizer.encode(instruct_template(instruct)) if instruct else None
        c = self.codec
        prefix = ([c["codec_nothink_id"], c["codec_think_bos_id"], c["codec_think_eos_id"]] if lang_id is None else
                  [c["codec_think_id"], c["codec_think_bos_id"], lang_id, c["codec_think_eos_id"]])
        if non_streaming_mode is None:
            non_streaming_mode = NON_STREAMING_DEFAULT.get(task, True)
        ref_ids = self.tokenizer.encode(ref_template(ref_text))[ROLE_LEN:-2] if ref_text else None
        return Prompt(task=task, role_ids=ids[:ROLE_LEN], text_ids=ids[ROLE_LEN:-TAIL_LEN], instruct_ids=instruct_ids,
                      codec_prefix_ids=prefix, speaker_id=speaker_id, language_id=lang_id,
                      non_streaming_mode=bool(non_streaming_mode), codec_pad_id=c["codec_pad_id"],
                      codec_bos_id=c["codec_bos_id"], tts_bos_id=self.tts_ids[0], tts_eos_id=self.tts_ids[1],
                      tts_pad_id=self.tts_ids[2], ref_text_ids=ref_ids)
