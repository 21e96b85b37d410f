"""The app's start-up as a visitor meets it: process start -> page answers -> eager requests through
`POST /v1/audio/speech`, sent one after another from the moment the page answers (each as the last one
ends), then a wait for a line in the app's log (e.g. "eager ready").

    omni-tts start-timing [--app-args "--model DIR --preset bench"] [--requests 2]
        [--frames 25] [--wait-for "eager ready"] [--limit 300] [--port 7860] [--json OUT]

Each request is streamed as server-sent events, so besides this client's clock (first audio, whole
request) it reports the engine's own: how long the request was queued before its scheduler took it (a warm
step, a set-up chore) and its TTFP. Starts `app.py` itself and stops it at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omni_tts.tools.provenance import ROOT


def wait_for_page(client: Any, url: str, t0: float, limit: float, app: subprocess.Popen) -> float | None:
    """Seconds from process start until the page answers 200 (None: the app exited or the limit passed)."""
    while time.perf_counter() - t0 < limit and app.poll() is None:
        try:
            if client.get(url + "/", timeout=2).status_code == 200:
                return time.perf_counter() - t0
        except Exception:
            pass
        time.sleep(0.1)
    return None


def speech_request(client: Any, url: str, text: str, frames: int, limit: float, mode: str = "eager") -> dict[str, Any]:
    """One request of `mode` as SSE: client-side first-audio and total seconds, the engine's usage figures."""
    body = {"input": text, "response_format": "pcm", "stream_format": "sse", "mode": mode,
            "max_new_tokens": frames, "seed": 1}
    out: dict[str, Any] = {}
    t = time.perf_counter()
    try:
        with client.stream("POST", url + "/v1/audio/speech", json=body, timeout=limit) as r:
            out["status"] = r.status_code
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event.get("type") == "speech.audio.delta" and "first_audio_s" not in out:
                    out["first_audio_s"] = time.perf_counter() - t
                elif event.get("type") == "speech.audio.done":
                    out.update(event["usage"])
                elif event.get("type") == "error":
                    out["error"] = event["error"]["message"]
            if r.status_code != 200:
                out["error"] = r.read().decode(errors="replace")[:200]
    except Exception as e:
        out["error"] = f"{type(e).__name__}: {str(e)[:200]}"
    out["total_s"] = time.perf_counter() - t
    return out


def _wait_for(log: Path, line: str, t0: float, limit: float, app: subprocess.Popen) -> float | None:
    """Seconds from process start until `line` is in the app's log (None: the app exited or the limit passed)."""
    while time.perf_counter() - t0 < limit:
        if line in log.read_text(errors="replace"):
            return time.perf_counter() - t0
        if app.poll() is not None:
            return None
        time.sleep(0.25)
    return None


def _signal_group(app: subprocess.Popen, sig: int) -> None:
    """Signal the app's process group; nothing to do once all of it has exited."""
    try:
        os.killpg(app.pid, sig)
    except ProcessLookupError:
        pass


def start_app(app_args: Sequence[str], port: int, env: dict[str, str] | None = None
              ) -> tuple[subprocess.Popen, Path, float]:
    """`app.py app_args --port port` in a process group of its own (environment `env`, default ours), its
    output to a temp log -> (process, log path, perf_counter at its start)."""
    log = Path(tempfile.mkstemp(prefix="omni-tts-start-", suffix=".log")[1])
    t0 = time.perf_counter()
    with open(log, "w") as f:
        app = subprocess.Popen([sys.executable, str(ROOT / "app.py"), *app_args, "--port", str(port)], cwd=ROOT,
                               stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return app, log, t0


def stop_app(app: subprocess.Popen, log: Path) -> dict[str, Any]:
    """Stop the app's group (SIGTERM; SIGKILL after 30 s) and remove its log -> exit_code, its progress lines
    (`log`) and, after an unclean exit, its last lines (`log_tail`)."""
    _signal_group(app, signal.SIGTERM)
    try:
        app.wait(30)
    except subprocess.TimeoutExpired:
        _signal_group(app, signal.SIGKILL)
        app.wait(30)
    lines = log.read_text(errors="replace").splitlines()
    res: dict[str, Any] = {"exit_code": app.returncode,
                           "log": [s for s in lines if s.startswith("[omni-tts") and "capturing" not in s]}
    if app.returncode not in (0, None):  # what the app printed last says why it did not exit cleanly
        res["log_tail"] = lines[-40:]
    log.unlink()
    return res


def measure(app_args: Sequence[str], requests: int = 2, frames: int = 25, wait_for: str = "eager ready",
            limit: float = 300.0, port: int = 7860) -> dict[str, Any]:
    """Start the app, time its page and `requests` eager requests, wait for `wait_for`, stop it."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    app, log, t0 = start_app(app_args, port)
    res: dict[str, Any] = {"app_args": list(app_args)}
    try:
        with httpx.Client() as client:
            res["page_s"] = wait_for_page(client, url, t0, limit, app)
            res["requests"] = []
            for i in range(requests if res["page_s"] is not None else 0):
                sent = time.perf_counter() - t0
                r = speech_request(client, url, f"Request {i + 1} of the start-up timing.", frames, limit)
                res["requests"].append({"sent_s": sent, **r})
        res["wait_for"], res["wait_for_seen_s"] = wait_for, _wait_for(log, wait_for, t0, limit, app)
    finally:
        res.update(stop_app(app, log))
    return res


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--app-args", default="", help='arguments for app.py, e.g. "--model DIR --preset bench"')
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("--frames", type=int, default=25)
    ap.add_argument("--wait-for", default="eager ready", help="a line of the app's log to wait for at the end")
    ap.add_argument("--limit", type=float, default=300.0, help="seconds from process start before giving up")
    ap.add_argument("--port", type=int, default=7860)
    ap.add_argument("--json", default=None)


def main(args: argparse.Namespace) -> int:
    res = measure(shlex.split(args.app_args), args.requests, args.frames, args.wait_for, args.limit, args.port)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "log"}, indent=1))
    print("\n".join(res["log"]))
    return 0 if res["page_s"] is not None and all("error" not in r for r in res["requests"]) else 1
