"""Pure-Python helpers for the Gradio app (app.py): formatting, files, comparisons, environment.

Owns: what the app's panels say (metric and memory text, mode availability notes), the plot's
DataFrame, the load-test table row, which task shows the instruct box, wav/CSV/zip writing for
downloads, the code-matrix verdict of the listening test, the A/B/X tally, the bind address (local vs a Hugging Face Space) and ZeroGPU / ffmpeg detection, and
a uniform view of the loaded model (`model_info`). Knows nothing about Gradio or device math.
"""

from __future__ import annotations

import csv
import io
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import soundfile as sf

from omni_tts.config import SynthesisParams
from omni_tts.errors import InputError

MODES = ("eager", "default", "reduce-overhead", "default+cudagraph")
ZERO_GPU_MODES = ("eager",)  # ZeroGPU runs the plain reference path inside each GPU call
TASK_LABELS = {"custom_voice": "CustomVoice", "voice_design": "VoiceDesign", "voice_clone": "Base (voice clone)"}
TASK_IDS = {label: task for task, label in TASK_LABELS.items()}
OUT_DIR = Path(tempfile.gettempdir()) / "omni-tts-app"
LOAD_COLUMNS = ("mode", "N", "med TTFP ms", "med E2E ms", "mean RTF", "req/s", "audio s/s")  # the seed-PR table


# ------------------------------------------------------------------ environment
def bind_address(host: str | None, port: int | None, env: Mapping[str, str] = os.environ) -> tuple[str, int]:
    """Explicit --host/--port win; on a Space (SPACE_ID / PORT / GRADIO_SERVER_PORT) 0.0.0.0 and its
    port; else 127.0.0.1:7860."""
    env_port = env.get("PORT") or env.get("GRADIO_SERVER_PORT")
    on_space = bool(env.get("SPACE_ID") or env_port)
    h = host or env.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if on_space else "127.0.0.1")
    p = port if port is not None else int(env_port) if env_port else 7860
    return h, p


def zero_gpu() -> bool:
    """True on Hugging Face ZeroGPU hardware (the `spaces` package importable and ZeroGPU on)."""
    try:
        import spaces  # type: ignore[import-not-found]
    except Exception:
        return False
    cfg = getattr(getattr(spaces, "config", None), "Config", None)
    flag = getattr(cfg, "zero_gpu", None)
    if flag is None:
        flag = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")
    return bool(flag)


def streaming_playback_supported() -> bool:
    """Gradio encodes streamed audio with ffmpeg; without it the clip plays when finished."""
    return shutil.which("ffmpeg") is not None


# ------------------------------------------------------------------ model view
def model_info(engine: Any) -> dict[str, Any]:
    """Speakers, languages, tasks, instruct support, banner and sampling defaults of the loaded model."""
    m, ckpt = engine.model, engine.model.checkpoint
    describe = f"embedded tiny random demo checkpoint (`{ckpt.path}`)" if ckpt.is_embedded_demo else ckpt.describe()
    return {"speakers": list(m.speakers()), "languages": list(m.languages()), "tasks": list(m.tasks()),
            "instruct": bool(m.supports_instruct()), "describe": describe, "embedded": ckpt.is_embedded_demo,
            "generation": dict(ckpt.generation_config or {}), "reason": (ckpt.notes or [""])[-1],
            "sample_rate": int(m.sample_rate)}


def instruct_visible(info: Mapping[str, Any], task_label: str) -> bool:
    """Whether the instruct box applies to a task (label or id): voice_design, or custom_voice if supported."""
    task = TASK_IDS.get(task_label, task_label)
    return task == "voice_design" or (task == "custom_voice" and info["instruct"])


def banner_markdown(info: Mapping[str, Any], reason: str = "") -> str:
    lines = [f"## omni-tts · Qwen3-TTS 12 Hz\n**Model:** {info['describe']}"]
    if reason:
        lines.append(f"*Why this model:* {reason}")
    if info["embedded"]:
        lines.append("> **Note:** this is the embedded tiny **random** demo checkpoint: it produces "
                     "**noise, not speech**. Load a real one with "
                     "`python app.py --model Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice` "
                     "(or `--model /path/to/checkpoint_dir`, or env `OMNI_TTS_MODEL`).")
    return "\n\n".join(lines)


def mode_notes(available: Mapping[str, str | None], zero: bool = False, streaming: bool = True,
               device: str = "") -> str:
    """Which compile modes work here and, for the others, why not."""
    out = []
    for mode in MODES:
        why = available.get(mode, "not offered by this engine")
        if zero and mode not in ZERO_GPU_MODES:
            why = ("ZeroGPU: the GPU exists only inside each call, so each synthesis runs whole on the plain "
                   "reference path there (graphs and the scheduler thread cannot use it)")
        line = f"- `{mode}`: " + ("available" if why is None else f"**unavailable** — {why}")
        if why is None and mode == "default" and device.startswith("cpu"):
            line += " (on CPU its first compile can take minutes)"
        out.append(line)
    if not streaming:
        out.append("- playback: ffmpeg not found, so audio plays when the clip is finished (install ffmpeg "
                   "for streaming playback)")
    return "\n".join(out)


# ------------------------------------------------------------------ requests
def voice_prompt(engine: Any, ref_audio: Any, ref_text: str, xvec_only: bool, voice_file: str | None) -> Any:
    """The VoicePrompt for a voice-clone request: a saved voice file, or one made from reference audio
    with the engine's own encoders (built once per model, float32)."""
    from omni_tts.models import speaker

    if voice_file:
        return speaker.VoicePrompt.load(voice_file)
    if ref_audio is None:
        raise InputError("voice clone needs reference audio (upload or record), or a saved voice file")
    return engine.voice_prompt(ref_audio, (ref_text or "").strip() or None, bool(xvec_only))


def make_params(engine: Any, text: str, seed: float | None, task: str, speaker: str | None, language: str | None,
                instruct: str | None, temperature: float | None, top_k: float | None, top_p: float | None,
                repetition_penalty: float | None, max_len: float | None, ref_audio: Any = None,
                ref_text: str = "", xvec_only: bool = False, voice_file: str | None = None) -> SynthesisParams:
    """The request the UI's fields describe (seed < 0 or empty: random)."""
    task_id = TASK_IDS.get(task, task)
    voice = voice_prompt(engine, ref_audio, ref_text, xvec_only, voice_file) if task_id == "voice_clone" else None
    return SynthesisParams(
        text=text or "", task=task_id, speaker=speaker if task_id == "custom_voice" else None,
        language=language or "Auto", instruct=(instruct or "").strip() or None,
        temperature=None if temperature is None else float(temperature), top_k=None if top_k is None else int(top_k),
        top_p=None if top_p is None else float(top_p),
        repetition_penalty=None if repetition_penalty is None else float(repetition_penalty),
        max_new_tokens=None if not max_len else int(max_len),
        seed=None if seed is None or seed == "" or int(seed) < 0 else int(seed), voice=voice)


# ------------------------------------------------------------------ figures
def fmt(x: float | None, unit: str = "", digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and np.isnan(x)):
        return "–"
    return f"{x:.{digits}f}{unit}"


def metrics_row(m: Any) -> dict[str, Any]:
    return {"request": m.request_id, "mode": m.mode, "status": m.status, "ttfp_ms": m.ttfp_ms,
            "e2e_ms": m.e2e_ms, "rtf": m.rtf, "audio_s": m.audio_s}


def metrics_line(label: str, m: Any | None) -> str:
    if m is None:
        return f"| {label} | – | – | – | – |"
    who = f"{label} #{m.request_id} ({m.mode}{'' if m.status in ('running', 'done') else ', ' + m.status})"
    return (f"| {who} | {fmt(m.ttfp_ms, ' ms')} | {fmt(m.e2e_ms, ' ms')} | {fmt(m.rtf, '', 3)} | "
            f"{fmt(m.audio_s, ' s', 2)} |")


def live_markdown(running: Any | None, last: Any | None) -> str:
    head = "| request | TTFP | E2E | RTF | audio |\n|---|---|---|---|---|"
    return "\n".join([head, metrics_line("running", running), metrics_line("last", last)])


def engine_markdown(snap: Mapping[str, Any]) -> str:
    mem = snap.get("memory") or {}
    if mem:
        memory = (f"allocated {mem['allocated_gib']:.2f} GiB · reserved {mem['reserved_gib']:.2f} GiB · "
                  f"peak {mem['peak_gib']:.2f} GiB · graph pool {mem['graph_pool_gib']:.2f} GiB "
                  f"({100 * mem['graph_pool_share']:.0f}% of reserved)")
    else:
        memory = f"n/a (no GPU: {snap.get('device', '?')})"
    costs = ", ".join(f"`{m}` {c.get('seconds', 0.0):.1f} s / {c.get('pool_bytes', 0) / float(1 << 20):.0f} MiB"
                      for m, c in (snap.get("capture") or {}).items())
    return (f"**mode** `{snap['mode']}` on {snap['device']} ({snap['dtype']}) · **batch** {snap['active']} active / "
            f"{snap['max_num_seqs']} slots, {snap['waiting']} waiting · mean occupancy "
            f"{snap['mean_occupancy']:.2f} · {snap['steps_per_s']:.1f} steps/s · layer kernels: "
            f"{snap.get('layer_kernels', '?')}\n\n**GPU memory:** {memory}"
            + (f"\n\n**compile/capture cost:** {costs}" if costs else "") + "\n\n" + _codec_line(snap))


def _codec_line(snap: Mapping[str, Any]) -> str:
    """What the code-to-wave stage runs and what it has cost so far."""
    calls = snap.get("decode_calls", 0)
    return (f"**code-to-wave:** `{snap.get('codec_precision', '?')}` · fused activations "
            f"{snap.get('codec_fused', '?')} · first-chunk graphs {snap.get('first_chunk_graphs', '?')} · "
            f"{snap.get('chunk_decodes', 0)} chunks in {calls} batched calls, "
            f"{1000 * snap.get('decode_seconds', 0.0) / max(calls, 1):.1f} ms per call")


def load_row(mode: str, n: int, s: Mapping[str, float]) -> dict[str, Any]:
    """The seed-PR table's row (LOAD_COLUMNS) for a load-test run summarised by omni_tts.engine.metrics.summarize."""
    figures = (mode, n, round(s["med_ttfp_ms"], 1), round(s["med_e2e_ms"], 1), round(s["mean_rtf"], 3),
               round(s["req_per_s"], 2), round(s["audio_s_per_s"], 2))
    return dict(zip(LOAD_COLUMNS, figures))


def capture_markdown(result: Mapping[str, Any]) -> str:
    mib = result.get("pool_bytes", 0) / float(1 << 20)
    text = (f"**Done:** now `{result['mode']}`: compile/capture took {result.get('seconds', 0.0):.1f} s, "
            f"graph pool {mib:.1f} MiB")
    if result.get("pool"):
        text += f" ({result['pool']})"
    if result.get("notice"):
        text += f"\n\n**Note:** {result['notice']}"
    return text


def history_frame(records: Iterable[Any]) -> pd.DataFrame:
    rows = [(r.request_id, r.ttfp_ms, r.rtf, r.mode) for r in records if r.ttfp_ms is not None and r.rtf is not None]
    return pd.DataFrame({"request": pd.Series([r[0] for r in rows], dtype="int64"),
                         "ttfp_ms": pd.Series([r[1] for r in rows], dtype="float64"),
                         "rtf": pd.Series([r[2] for r in rows], dtype="float64"),
                         "mode": pd.Series([r[3] for r in rows], dtype="object")})


# ------------------------------------------------------------------ files
def out_path(stem: str, suffix: str) -> str:
    """A fresh file name under OUT_DIR (served to the browser by the app)."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    return str(OUT_DIR / f"{stem}-{time.strftime('%H%M%S')}-{os.getpid()}-{time.perf_counter_ns() % 10**9}{suffix}")


def copy_out(src: str, stem: str) -> str:
    dst = out_path(stem, Path(src).suffix)
    shutil.copyfile(src, dst)
    return dst


def pcm16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(np.asarray(samples, np.float32), -1.0, 1.0) * 32767.0).astype(np.int16)


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """A 16-bit PCM wav of `samples` in memory (what a streamed gr.Audio chunk is)."""
    buf = io.BytesIO()
    sf.write(buf, pcm16(samples), sample_rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def write_wav(samples: np.ndarray, sample_rate: int, stem: str = "omni-tts") -> str:
    path = out_path(stem, ".wav")
    sf.write(path, np.asarray(samples, np.float32), sample_rate, subtype="PCM_16")
    return path


def write_csv(rows: list[dict[str, Any]], stem: str) -> str:
    path = out_path(stem, ".csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]) if rows else ["empty"])
        w.writeheader()
        w.writerows(rows)
    return path


# ------------------------------------------------------------------ listening test
def compare_codes(a: np.ndarray, b: np.ndarray) -> tuple[bool, int | None]:
    """(identical, first differing frame). Different lengths differ at the shorter length."""
    a, b = np.asarray(a), np.asarray(b)
    n = min(len(a), len(b))
    rows = np.nonzero((a[:n] != b[:n]).reshape(n, -1).any(axis=1))[0] if n else np.zeros(0, int)
    if rows.size:
        return False, int(rows[0])
    if len(a) != len(b):
        return False, n
    return True, None


def verdict_text(mode_a: str, mode_b: str, a: np.ndarray, b: np.ndarray) -> str:
    same, frame = compare_codes(a, b)
    if same:
        return f"`{mode_a}` vs `{mode_b}`: code matrices **identical** ({len(a)} frames)"
    return (f"`{mode_a}` vs `{mode_b}`: code matrices **differ** (first differing frame {frame}; "
            f"{len(a)} vs {len(b)} frames)")


def abx_record(tally: dict[str, Any], guess: str) -> tuple[dict[str, Any], str]:
    """Score a guess ('A' or 'B') against tally['x_is']; returns the new tally and a line for the user."""
    if tally.get("x_is") not in ("A", "B"):
        return tally, "run the listening test first (A/B/X needs two clips)"
    right = guess == tally["x_is"]
    new = dict(tally, trials=tally.get("trials", 0) + 1, correct=tally.get("correct", 0) + int(right))
    line = (f"{'Right' if right else 'Wrong'}: X was {tally['x_is']}. Session tally: "
            f"{new['correct']} / {new['trials']} correct")
    return new, line
