"""Scale-out measurement on one machine: the same checkpoint served by one process (the headless server) and
by Ray Serve (one replica; two replicas sharing the GPU, or one GPU each), each measured through HTTP with
the closed loop (omni_tts.tools.http_load: TTFP, audio s/s per concurrency) and the open-loop sweep
(omni_tts.tools.openloop: the highest rate with p95 TTFP within the target and no underrun).

Owns the list of set-ups, starting and stopping each server (a subprocess, ready once /ready answers 200)
and the summary table and JSON. Knows nothing about the engine or Ray beyond the server's flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import httpx

from omni_tts.errors import OmniTTSError
from omni_tts.tools import openloop
from omni_tts.tools.args import add_model_flag
from omni_tts.tools.http_load import bench_http
from omni_tts.tools.provenance import provenance

# name -> (server flags, closed-loop concurrencies)
SETUPS: dict[str, tuple[list[str], list[int]]] = {
    "single": ([], [1, 32, 64]),
    "ray-1": (["--ray", "--replicas", "1", "--gpus-per-replica", "1"], [1, 32]),
    "ray-1-proxy": (["--ray", "--ingress", "proxy", "--replicas", "1", "--gpus-per-replica", "1"], [1, 32]),
    "ray-2-shared": (["--ray", "--replicas", "2", "--gpus-per-replica", "0.5"], [32, 64]),
    "ray-2-gpus": (["--ray", "--replicas", "2", "--gpus-per-replica", "1"], [64]),
}


def start(model: str, port: int, flags: list[str], engine_sets: list[str], ready_s: float) -> subprocess.Popen:
    """The server on `port`, returned once GET /ready answers 200 (RuntimeError when it exits or times out)."""
    sets = [x for s in engine_sets for x in ("--set", s)]
    cmd = [sys.executable, "-m", "omni_tts", "serve", "--model", model, "--preset", "bench", *sets,
           "--host", "127.0.0.1", "--port", str(port), *flags]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.Popen(cmd, start_new_session=True)
    try:
        wait_ready(proc, f"http://127.0.0.1:{port}/ready", ready_s)
    except BaseException:  # Ctrl-C included: never leave a server (and its Ray cluster) behind
        stop(proc)
        raise
    return proc


def wait_ready(proc: subprocess.Popen, url: str, ready_s: float) -> None:
    deadline = time.monotonic() + ready_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"the server was not ready within {ready_s:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the server alone (a Ray server shuts Serve and its local cluster down in order; signalling
    the whole group would kill Ray's own processes under it first), then a kill of the group."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
    except ProcessLookupError:
        pass
    proc.wait(30)


def measure(url: str, conc: list[int], args: argparse.Namespace) -> dict[str, Any]:
    """Closed loop per concurrency, then the open-loop sweep."""
    closed = bench_http(url, conc, args.num_prompts, args.frames, None, None, args.warmup)
    body = {"response_format": "pcm", "stream": True, "max_new_tokens": args.frames + 1}

    def at(rate: float) -> dict[str, Any]:
        records, wall = asyncio.run(openloop.run(url, rate, args.duration, body, seed=0))
        result = openloop.report(records, wall, rate, args.duration)
        print(openloop.format_row(result), file=sys.stderr, flush=True)
        return result

    best, sweep = openloop.sweep(at, args.min_rate, args.max_rate, args.steps, args.ttfp_slo_ms)
    return {"closed": {str(c): v for c, v in closed.items()}, "best_rate": best, "sweep": sweep}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_model_flag(p)
    p.add_argument("--setups", default="single,ray-1,ray-2-shared", help=f"comma-separated of {', '.join(SETUPS)}")
    p.add_argument("--set", action="append", default=["max_num_seqs=64"], metavar="KEY=VALUE",
                   help="engine preset overrides for every server (default max_num_seqs=64)")
    p.add_argument("--port", type=int, default=8011)
    p.add_argument("--frames", type=int, default=75, help="frames per request")
    p.add_argument("--num-prompts", type=int, default=128, help="closed-loop requests per concurrency")
    p.add_argument("--warmup", type=int, default=8)
    p.add_argument("--duration", type=float, default=30.0, help="open-loop seconds per rate")
    p.add_argument("--min-rate", type=float, default=1.0)
    p.add_argument("--max-rate", type=float, default=40.0)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--ttfp-slo-ms", type=float, default=50.0)
    p.add_argument("--ready-s", type=float, default=1800.0, help="how long a server may take to warm up")
    p.add_argument("--json", default="scaleout.json")


def main(args: argparse.Namespace) -> int:
    if not args.model:
        raise OmniTTSError("--model is required: a checkpoint directory (e.g. make-checkpoint --size 1.7B)")
    out: dict[str, Any] = {**provenance(), "model": args.model,
                           "frames": args.frames, "sets": args.set, "results": {}}
    for name in [s.strip() for s in args.setups.split(",") if s.strip()]:
        flags, conc = SETUPS[name]
        proc = start(args.model, args.port, flags, args.set, args.ready_s)
        try:
            out["results"][name] = measure(f"http://127.0.0.1:{args.port}", conc, args)
        finally:
            stop(proc)
        with open(args.json, "w") as f:  # after every set-up, so a later failure keeps the earlier ones
            json.dump(out, f, indent=1)
    print(table(out["results"]))
    return 0


def table(results: dict[str, Any]) -> str:
    rows = [f"{'set-up':<14} {'c':>3} {'TTFP med ms':>11} {'audio s/s':>9}   best open-loop rate"]
    for name, r in results.items():
        for c, v in r["closed"].items():
            rows.append(f"{name:<14} {c:>3} {v.get('med_ttfp_ms', float('nan')):>11.1f} "
                        f"{v.get('audio_s_per_s', float('nan')):>9.1f}   {r['best_rate']}")
    return "\n".join(rows)
