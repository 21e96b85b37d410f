"""What the app's panels say: per-request figures, the visitor's history and plots, engine-wide figures.

Owns: the rounding of every figure shown (no 13-digit floats), a request's history record, the live
table (this visitor's running and last request), the modes' plot colours, the engine-wide panel text
(labelled as covering all visitors), the per-mode readiness list and the load-test summary row.
Pure Python: knows nothing about Gradio or device math.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from omni_tts.engine.snapshot import EngineSnapshot

MODES = ("eager", "default", "reduce-overhead", "default+cudagraph")
MODE_COLORS = {"eager": "#f97316", "default": "#2563eb", "reduce-overhead": "#9333ea", "default+cudagraph": "#16a34a"}
HISTORY_LEN = 50  # requests kept per visitor
# short headers: a table cell never breaks a word or a number (layout.CSS keeps them on one line)
LOAD_COLUMNS = ("mode", "requests", "TTFP ms (median)", "E2E ms (median)", "RTF (mean)", "req/s", "audio s/s")
ROW_COLUMNS = ("#", "mode", "status", "TTFP ms", "E2E ms", "RTF", "audio s", "queued ms")


def fmt(x: float | None, unit: str = "", digits: int = 0) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.{digits}f}{unit}"


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(float(x), digits)


def record(m: Any, streaming: bool = True, note: str = "", number: int | None = None) -> dict[str, Any]:
    """A finished (or stopped) request as the visitor's history keeps it, figures rounded. `request` is
    the visitor's own count from 1 (`number`; the engine's id when not given), `id` the engine's."""
    playable = m.ttfp_ms if streaming else m.e2e_ms
    return {"request": int(m.request_id if number is None else number), "id": int(m.request_id),
            "mode": m.mode, "status": m.status, "ttfp_ms": _round(m.ttfp_ms, 1),
            "queue_ms": _round(m.queue_ms, 1),
            "e2e_ms": _round(m.e2e_ms, 1), "rtf": _round(m.rtf, 3), "audio_s": round(float(m.audio_s), 2),
            "playable_ms": _round(playable, 1), "streaming": bool(streaming), "note": note}


def next_number(history: list | None) -> int:
    """The visitor's number for their next request: one more than their last, from 1."""
    return int(history[-1]["request"]) + 1 if history else 1


def row(m: Any, number: int | None = None) -> dict[str, Any]:
    """One request as a table row (ROW_COLUMNS), figures rounded; `number` in place of the engine's id."""
    n = int(m.request_id if number is None else number)
    return dict(zip(ROW_COLUMNS, (n, m.mode, m.status, _round(m.ttfp_ms, 1), _round(m.e2e_ms, 1),
                                  _round(m.rtf, 3), round(float(m.audio_s), 2), _round(m.queue_ms, 1))))


def _line(label: str, r: Mapping[str, Any] | None) -> str:
    if r is None:
        return f"| {label} | – | – | – | – | – | – |"
    status = "" if r["status"] in ("running", "done") else f", {r['status']}"
    return (f"| {label} #{r['request']} ({r['mode']}{status}) | {fmt(r['queue_ms'], ' ms')} | "
            f"{fmt(r['ttfp_ms'], ' ms')} | "
            f"{fmt(r['playable_ms'], ' ms')} | {fmt(r['e2e_ms'], ' ms')} | {fmt(r['rtf'], '', 3)} | "
            f"{fmt(r['audio_s'], ' s', 2)} |")


def live_markdown(running: Mapping[str, Any] | None, last: Mapping[str, Any] | None) -> str:
    """This visitor's running and last request."""
    head = ("| your requests | queued | TTFP | playable | E2E | RTF | audio |\n"
            "|---|--:|--:|--:|--:|--:|--:|")
    return "\n".join([head, _line("running", running), _line("last", last)])


def engine_markdown(snap: EngineSnapshot) -> str:
    """Engine-wide figures (every visitor's requests together)."""
    mem = snap.memory
    if mem:
        memory = (f"{mem['allocated_gib']:.2f} GiB in use · {mem['reserved_gib']:.2f} GiB reserved · "
                  f"peak {mem['peak_gib']:.2f} GiB · CUDA-graph pool {mem['graph_pool_gib']:.2f} GiB · "
                  f"Inductor graph-tree pool {mem.get('tree_pool_gib', 0.0):.2f} GiB · "
                  f"codec chunk graphs {mem.get('codec_graph_pool_gib', 0.0):.2f} GiB")
    else:
        memory = f"none (runs on {snap.device})"
    calls = snap.decode_calls
    return (f"**Engine, all visitors** · default mode `{snap.mode}` on {snap.device} ({snap.dtype})\n\n"
            f"- requests: {snap.active} generating, {snap.waiting} waiting, "
            f"{snap.max_num_seqs} at once at most per mode\n"
            f"- speed: {snap.steps_per_s:.1f} frames/s across requests, made "
            f"{snap.mean_occupancy:.2f} requests at a time on average\n"
            f"- audio decoding: {snap.codec_precision}, {snap.chunk_decodes} chunks in "
            f"{calls} batches, {1000 * snap.decode_seconds / max(calls, 1):.1f} ms per batch\n"
            f"- layers run as: {snap.layer_kernels}\n- GPU memory: {memory}")


def readiness_markdown(readiness: Mapping[str, str], notes: Mapping[str, str] | None = None) -> str:
    """One line per mode: ready / not warmed / unavailable and why."""
    notes = notes or {}
    lines = []
    for mode in MODES:
        if mode in readiness:
            about = notes.get(mode, "")
            lines.append(f"- `{mode}`: **{readiness[mode]}**" + (f" — {about.split(':')[0]}" if about else ""))
    if any(v.startswith(("warming", "queued")) for v in readiness.values()):
        lines.append("\n_Warm-up steps wait for a pause in the requests being served (or run after a spell of "
                     "steady traffic, or at once while requests wait for the warming mode), so they slow a "
                     "request only by the step in progress._")
    return "**Modes**\n\n" + "\n".join(lines)


def load_row(mode: str, n: int, s: Mapping[str, float]) -> dict[str, Any]:
    """The load test's summary row (LOAD_COLUMNS) from omni_tts.engine.metrics.summarize."""
    figures = (mode, n, round(s["med_ttfp_ms"], 1), round(s["med_e2e_ms"], 1), round(s["mean_rtf"], 3),
               round(s["req_per_s"], 2), round(s["audio_s_per_s"], 2))
    return dict(zip(LOAD_COLUMNS, figures))


def capped_notice(frames: int, cap: int | None, max_len_asked: int | None, frame_rate: float = 12.5) -> str:
    """'' unless the clip stopped at its frame cap, else one line saying which limit cut it."""
    if cap is None or frames < cap:
        return ""
    seconds = frames / frame_rate
    if max_len_asked is not None and cap >= max_len_asked - 1:
        return (f"The clip stopped at Max length ({frames} frames, {seconds:.1f} s) before the text ended: "
                f"raise Max length in Sampling for longer clips.")
    return (f"The clip stopped at the engine's length limit ({frames} frames, {seconds:.1f} s) before the "
            f"text ended: split the text into shorter parts.")
