"""What the app calls things: speaker and language display names, metric definitions, examples, and
error messages in the UI's words.

Owns: the one-line speaker descriptions of the released CustomVoice speakers, language capitalisation,
the TTFP / E2E / RTF definitions shown beside the figures, the examples table per task, and the
rewriting of the engine's field names (`max_new_tokens`, `ref_text`, a server path) into the labels a
visitor sees. Pure Python: knows nothing about Gradio or the engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# The released CustomVoice checkpoints' speakers: (display name, one line on the voice and its native language).
SPEAKERS: dict[str, tuple[str, str]] = {
    "vivian": ("Vivian", "bright young female voice with a slight edge · Chinese"),
    "serena": ("Serena", "warm, gentle young female voice · Chinese"),
    "uncle_fu": ("Uncle Fu", "seasoned male voice, low and mellow · Chinese"),
    "dylan": ("Dylan", "youthful Beijing male voice, clear and natural · Beijing dialect"),
    "eric": ("Eric", "lively Chengdu male voice, slightly husky · Sichuan dialect"),
    "ryan": ("Ryan", "dynamic male voice with a strong rhythm · English"),
    "aiden": ("Aiden", "sunny American male voice, clear midrange · English"),
    "ono_anna": ("Ono Anna", "playful Japanese female voice, light and nimble · Japanese"),
    "sohee": ("Sohee", "warm Korean female voice, rich in emotion · Korean"),
}

DEFINITIONS = {
    "TTFP": "time to first packet: request accepted -> first audio chunk ready",
    "E2E": "end to end: request accepted -> last audio chunk ready",
    "RTF": "real-time factor: E2E / seconds of audio (below 1 is faster than real time)",
    "playable": "when the browser can start playing: TTFP while streaming, E2E when the clip plays once finished",
}
METRICS_INFO = " · ".join(f"{k}: {v}" for k, v in DEFINITIONS.items())

# Example texts per language (display name -> text) and per task (task id -> extra fields).
EXAMPLE_TEXTS = {
    "English": "Hello! This is omni-tts, reading your words aloud as they are made.",
    "Chinese": "你好！这是一个流式语音合成的演示。",
    "Japanese": "こんにちは。これはストリーミング音声合成のデモです。",
    "Korean": "안녕하세요. 스트리밍 음성 합성 데모입니다.",
    "German": "Guten Tag! Dies ist eine Demo der Sprachsynthese in Echtzeit.",
    "French": "Bonjour ! Voici une démonstration de synthèse vocale en continu.",
    "Spanish": "¡Hola! Esta es una demostración de síntesis de voz en tiempo real.",
}
EXAMPLE_INSTRUCT = {
    "custom_voice": "Speak cheerfully, a little faster than usual.",
    "voice_design": "A calm middle-aged male narrator with a deep, warm voice.",
}

# Engine field names -> the label of the field in the form.
UI_FIELDS = {
    "max_new_tokens": "Max length", "fixed_frames": "Max length", "top_k": "Top-k", "top_p": "Top-p",
    "subtalker_top_k": "Top-k", "subtalker_top_p": "Top-p", "subtalker_temperature": "Temperature",
    "repetition_penalty": "Repetition penalty", "temperature": "Temperature", "seed": "Seed",
    "ref_text": "Reference text", "ref_codes": "Reference audio", "x_vector_only": "Voice from the clip only",
    "x-vector-only mode": "'Voice from the clip only'", "x-vector-only": "Voice from the clip only",
    "x_vector": "voice", "(--instruct)": "(Instruct box)",
    "voice_design": "VoiceDesign", "custom_voice": "CustomVoice", "voice_clone": "voice clone",
    "max_seq_len": "the engine's length limit", "ICL cloning": "cloning with a transcript",
    "ICL mode": "cloning with a transcript", "ICL": "cloning with a transcript", "voice prompt": "saved voice",
}
# The named /synthesize API's errors keep its own parameter names (the CLI's task names, max_new_tokens ...).
API_FIELDS = {"(--instruct)": "(instruct)", "ICL cloning": "cloning with a transcript",
              "ICL mode": "cloning with a transcript", "ICL": "cloning with a transcript"}
# The same for the OpenAI-compatible endpoint's JSON fields.
OPENAI_FIELDS = {
    "(--instruct)": "(instructions)", "instruct text": "instructions text", "speaker": "voice",
    "max_new_tokens": "max_new_tokens", "voice prompt": "voice",
}
# a server path, with the quotes around it if any (they are put back once, around the file's name)
_PATH = re.compile(r"""(['"]?)((?:[A-Za-z]:)?(?:/[^/\s:'"()]+){2,})\1""")
_SIZES = {"0b6": "0.6B", "1b7": "1.7B"}  # the checkpoints' own size tags


def model_description(describe: str) -> str:
    """The engine's one-line model description with its size tags in plain words ('1b7' -> '1.7B')."""
    return re.sub(r"\b(0b6|1b7)\b", lambda m: _SIZES[m.group(1)], describe)


def speaker_label(speaker_id: str) -> str:
    """'Ryan — dynamic male voice ...' for a released speaker, else the id title-cased."""
    name, about = SPEAKERS.get(speaker_id.lower(), (speaker_id.replace("_", " ").title(), ""))
    return f"{name} — {about}" if about else name


def speaker_choices(ids: list[str]) -> list[tuple[str, str]]:
    """(label, id) pairs for a dropdown."""
    return [(speaker_label(s), s) for s in ids]


def language_label(language: str) -> str:
    """'english' -> 'English', 'auto' -> 'Auto (detect)'."""
    if language.lower() == "auto":
        return "Auto (detect)"
    return " ".join(w.capitalize() for w in language.replace("_", " ").split())


def language_choices(ids: list[str]) -> list[tuple[str, str]]:
    return [(language_label(x), x) for x in ids]


def in_ui_words(message: str, fields: Mapping[str, str] = UI_FIELDS) -> str:
    """An engine message with field names replaced by the labels a visitor sees and server paths cut to
    the file's name (one line)."""
    text = _PATH.sub(lambda m: f"'{m.group(2).rsplit('/', 1)[-1]}'", " ".join(str(message).split()))
    if fields is OPENAI_FIELDS and text.startswith("text "):
        text = "input " + text[5:]
    elif fields is not API_FIELDS and text.startswith("text "):
        text = "Text " + text[5:]
    keys = sorted(fields, key=len, reverse=True)
    pattern = re.compile("|".join(rf"(?<![\w-]){re.escape(k)}(?![\w-])" for k in keys))
    return pattern.sub(lambda m: fields[m.group(0)], text)


def examples(tasks: list[str], languages: list[str], speakers: list[str]) -> list[list[str]]:
    """Rows [text, language, task, speaker, instruct] of the examples table for this checkpoint."""
    have = {x.lower() for x in languages}
    rows = []
    for task in tasks:
        if task == "voice_clone":
            continue  # a clone needs the visitor's own reference clip
        for lang, text in EXAMPLE_TEXTS.items():
            if lang.lower() not in have:
                continue
            speaker = _speaker_for(lang, speakers) if task == "custom_voice" else ""
            rows.append([text, lang.lower(), task, speaker, EXAMPLE_INSTRUCT.get(task, "") if
                         task == "voice_design" or lang == "English" else ""])
    return rows


def default_speaker(speakers: list[str]) -> str | None:
    """The form's first speaker: one whose native language is English (the default text is English)."""
    return _speaker_for("English", speakers) or None


def _speaker_for(language: str, speakers: list[str]) -> str:
    """A speaker whose native language is `language`, else an English one, else the first one."""
    for lang in (language, "English"):
        for s in speakers:
            if SPEAKERS.get(s.lower(), ("", ""))[1].endswith(f"· {lang}"):
                return s
    return speakers[0] if speakers else ""
