"""Seconds from `python app.py` to its page, to each mode ready, and to a fast request's first audio.

    omni-tts start-ready [--app-args "--model DIR"] [--env KEY=VALUE ...] [--fresh-caches]
        [--request-mode default+cudagraph] [--frames 25] [--modes M ...] [--limit 900] [--port 7860] [--json OUT]

Starts the app in a fresh process (tools.start_timing's process handling) with our environment plus each
--env pair (e.g. OMNI_TTS_ARTIFACTS=DIR for imported compile artifacts); --fresh-caches points
TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR and OMNI_TTS_CACHE_DIR (kernel probes) at new empty folders, as
in a new container (removed at the end). Readiness comes from
`GET /ready` (each resident mode's state, and whether it serves: a compiled mode serves requests once its
top-k graphs exist, before the rest of its warm-up) where the server has that route, else from the app
log's "MODE serves after" / "MODE ready in" / "MODE failed to warm" lines (then the awaited modes are
--modes, default the request's). Once --request-mode serves, one request of it is streamed (start_timing's
request) and its first audio timed. Ends when every awaited mode is ready or failed and the request is
done, the app exits, or --limit seconds pass; the app is stopped then. Times are seconds from the process start.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omni_tts.tools.start_timing import speech_request, start_app, stop_app, wait_for_page

POLL_S = 0.25
# a new container's caches: Inductor's, Triton's and ours (the kernel probes' outcomes, imported artifacts)
FRESH = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "OMNI_TTS_CACHE_DIR")
FINAL = ("ready", "failed")


def ready_states(client: Any, url: str) -> dict[str, dict[str, Any]] | None:
    """mode -> {state, serving} from `GET /ready`; None when the server has no such route; {} when it did not
    answer."""
    try:
        r = client.get(url + "/ready", timeout=2)
    except Exception:
        return {}
    if r.status_code == 404:
        return None
    try:  # 503 (nothing serves yet) carries the states too
        return {m: {"state": v["state"], "serving": bool(v["serving"])} for m, v in r.json()["modes"].items()}
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def log_states(text: str, modes: Sequence[str]) -> dict[str, dict[str, Any]]:
    """mode -> {state: ready | failed | waiting, serving}, from the app's progress lines."""
    out = {}
    for m in modes:
        state = "ready" if f"{m} ready in" in text else "failed" if f"{m} failed to warm" in text else "waiting"
        out[m] = {"state": state, "serving": state == "ready" or f"{m} serves after" in text}
    return out


def _request(url: str, mode: str, frames: int, limit: float, t0: float, out: dict[str, Any]) -> None:
    import httpx

    sent = time.perf_counter() - t0
    with httpx.Client() as client:
        r = speech_request(client, url, f"The first {mode} request after start-up.", frames, limit, mode)
    out.update(mode=mode, sent_s=sent, **r)
    if "first_audio_s" in r:
        out["first_audio_at_s"] = sent + r["first_audio_s"]


def follow(client: Any, url: str, log: Path, t0: float, app: Any, opts: argparse.Namespace) -> dict[str, Any]:
    """Poll readiness until every awaited mode is final and the request is done (or the app exits, or the
    limit passes) -> {modes: {mode: {state, s, serves_s}}, source, request}."""
    seen: dict[str, dict[str, Any]] = {}
    serves: dict[str, float] = {}  # mode -> when it first served requests
    request: dict[str, Any] = {}
    sender: threading.Thread | None = None
    source = "/ready"
    while time.perf_counter() - t0 < opts.limit and app.poll() is None:
        states = ready_states(client, url) if source == "/ready" else None
        if states is None:
            source = "log"
            states = log_states(log.read_text(errors="replace"), opts.modes or [opts.request_mode])
        now = time.perf_counter() - t0
        for m, v in states.items():
            if v["serving"] and m not in serves:
                serves[m] = now
            if v["state"] in FINAL and m not in seen:
                seen[m] = {"state": v["state"], "s": now}
        if sender is None and opts.request_mode in serves:
            sender = threading.Thread(target=_request, daemon=True, args=(
                url, opts.request_mode, opts.frames, opts.limit, t0, request))
            sender.start()
        awaited = opts.modes or list(states)
        request_over = sender is not None and not sender.is_alive() or \
            seen.get(opts.request_mode, {}).get("state") == "failed"
        if awaited and all(m in seen for m in awaited) and (request_over or opts.request_mode not in awaited):
            break
        time.sleep(POLL_S)
    if sender is None:
        request = {"mode": opts.request_mode, "error": f"{opts.request_mode} was not ready: not sent"}
    for m, v in seen.items():
        v["serves_s"] = serves.get(m)
    return {"modes": seen, "source": source, "awaited": list(opts.modes or states), "request": request}


def measure(app_args: Sequence[str], opts: argparse.Namespace) -> dict[str, Any]:
    """Start the app with the options' environment, follow its readiness, stop it."""
    import httpx

    env = {**os.environ, **dict(opts.env)}
    url = f"http://127.0.0.1:{opts.port}"
    res: dict[str, Any] = {"app_args": list(app_args), "env": dict(opts.env)}
    with tempfile.TemporaryDirectory(prefix="omni-tts-caches-") as caches:
        if opts.fresh_caches:
            res["fresh_caches"] = {k: str(Path(caches) / k.lower()) for k in FRESH}
            env.update(res["fresh_caches"])
        app, log, t0 = start_app(app_args, opts.port, env)
        try:
            with httpx.Client() as client:
                res["page_s"] = wait_for_page(client, url, t0, opts.limit, app)
                if res["page_s"] is not None:
                    res.update(follow(client, url, log, t0, app, opts))
        finally:
            res.update(stop_app(app, log))
    return res


def summary(res: dict[str, Any]) -> str:
    page = res.get("page_s")
    lines = [f"page: {page:.1f} s" if page is not None else "page: not served"]
    for m, v in sorted(res.get("modes", {}).items(), key=lambda kv: kv[1]["s"]):
        serves = f"serves {v['serves_s']:.1f} s, " if v.get("serves_s") is not None else ""
        lines.append(f"{m}: {serves}{v['state']} {v['s']:.1f} s")
    req = res.get("request", {})
    if "first_audio_at_s" in req:
        lines.append(f"first audio of a {req['mode']} request (sent at {req['sent_s']:.1f} s): "
                     f"{req['first_audio_at_s']:.1f} s")
    elif req:
        lines.append(f"{req['mode']} request: {req.get('error', 'no audio')}")
    return "\n".join(lines)


def _env_pair(s: str) -> tuple[str, str]:
    key, sep, value = s.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--env wants KEY=VALUE (got '{s}')")
    return key.strip(), value


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--app-args", default="", help='arguments for app.py, e.g. "--model DIR"')
    ap.add_argument("--env", type=_env_pair, action="append", default=[], metavar="KEY=VALUE",
                    help="an environment variable for the app (repeatable)")
    ap.add_argument("--fresh-caches", action="store_true", help="start with empty Inductor, Triton and omni-tts caches")
    ap.add_argument("--request-mode", default="default+cudagraph", help="the mode of the one timed request")
    ap.add_argument("--frames", type=int, default=25, help="frames of the timed request")
    ap.add_argument("--modes", nargs="*", default=[], help="modes to wait for (default: every resident one)")
    ap.add_argument("--limit", type=float, default=900.0, help="seconds from process start before giving up")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--json", default=None)


def main(args: argparse.Namespace) -> int:
    import shlex

    from omni_tts.tools.provenance import provenance

    res = measure(shlex.split(args.app_args), args)
    res.update(provenance())  # after the app stopped: nothing of ours touches the GPU while it starts
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(summary(res))
    ok = res.get("awaited") and all(res["modes"].get(m, {}).get("state") == "ready" for m in res["awaited"])
    return 0 if ok and "first_audio_at_s" in res.get("request", {}) else 1
