"""`omni-tts peers`: the systems a user would otherwise pick, beside our engine, on the same checkpoint and
prompts with the same number of frames, measured the same way in one run.

    omni-tts peers --model DIR [--peers vllm-omni,faster-qwen3-tts,qwen-tts] [--ref-audio WAV (a Base checkpoint;
        for faster-qwen3-tts-batch)]
        [--path vllm-omni=/opt/vo --path qwen-tts=/opt/peers ...] [--concurrency 1 8 32]
        [--num-prompts 32] [--frames 75] [--json OUT] [--log-dir DIR]

Owns the orchestration: each system runs in a process of its own (omni_tts/tools/peer_run.py) with its
own import path (`--path NAME=DIR` goes first on that process's PYTHONPATH; nothing of a peer is
installed into ours), one after the other on an idle GPU; the GPU memory of every system is read alike
from outside, as the device's memory in use (nvidia-smi, every 200 ms) minus what was in use before it
started: once when it reports ready, and at its peak. One table, every system.
A system that is not installed or fails is a row saying so; the run goes on.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from omni_tts.errors import OmniTTSError
from omni_tts.tools.peer_run import add_run_flags, run_argv
from omni_tts.tools.provenance import ROOT, provenance

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
COLS = [("med TTFP ms", "med_ttfp_ms", "{:.1f}"), ("p90 TTFP ms", "p90_ttfp_ms", "{:.1f}"),
        ("med E2E ms", "med_e2e_ms", "{:.0f}"), ("mean RTF", "mean_rtf", "{:.3f}"), ("req/s", "req_per_s", "{:.2f}"),
        ("audio s/s", "audio_s_per_s", "{:.1f}"), ("frames", "frames_med", "{:.0f}")]


class GpuMemory:
    """The device's memory in use (MiB), as nvidia-smi reports it every 200 ms; inert without nvidia-smi."""

    def __init__(self, enabled: bool = True, index: int = 0) -> None:
        self.latest: float | None = None
        self.peak = 0.0
        self._proc = None
        exe = shutil.which("nvidia-smi") if enabled else None
        if exe:
            self._proc = subprocess.Popen([exe, "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                           "-i", str(index), "-lms", "200"], stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()
            for _ in range(50):
                if self.latest is not None:
                    break
                time.sleep(0.1)

    def _read(self) -> None:
        for line in self._proc.stdout:  # type: ignore[union-attr]
            try:
                self.latest = float(line.strip())
            except ValueError:
                continue
            self.peak = max(self.peak, self.latest)

    def settle(self, baseline: float | None, timeout: float = 90.0) -> None:
        """Wait until a finished system's processes have given their memory back."""
        t0 = time.monotonic()
        while baseline is not None and self.latest is not None and self.latest > baseline + 512 \
                and time.monotonic() - t0 < timeout:
            time.sleep(0.5)
        self.peak = self.latest or 0.0

    def close(self) -> None:
        if self._proc:
            self._proc.terminate()


def run_system(name: str, a: argparse.Namespace, paths: dict[str, str], mem: GpuMemory, log: Path) -> dict[str, Any]:
    """One system in its own process -> its result record (rows per concurrency, start-up, memory)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (paths.get(name), str(ROOT), env.get("PYTHONPATH")) if p)
    if name == "vllm-omni":
        env.update(OFFLINE_ENV)
    cmd = run_argv(name, a)
    baseline = mem.latest
    mem.peak = baseline or 0.0
    result: dict[str, Any] = {"system": name, "error": "no result (see its log)"}
    with open(log, "w") as err:
        # its own process group: a stopped system's workers (vLLM-Omni spawns one per stage) are killed with it
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True, cwd=str(ROOT),
                                start_new_session=True)
        stopped = threading.Event()
        killer = threading.Timer(a.timeout, lambda: (stopped.set(), _kill_group(proc.pid)))
        killer.start()
        for line in proc.stdout:  # type: ignore[union-attr]
            if line.startswith("READY") and baseline is not None and mem.latest is not None:
                result["mem_ready_gib"] = (mem.latest - baseline) / 1024
            elif line.startswith("RESULT "):
                result = {**json.loads(line[7:]), **{k: v for k, v in result.items() if k.startswith("mem_")}}
        rc = proc.wait()
        killer.cancel()
        _kill_group(proc.pid)  # anything it left running
    if baseline is not None:
        result["mem_peak_gib"] = (mem.peak - baseline) / 1024
    levels = len(result.get("rows") or {})
    if stopped.is_set():
        result["error"] = f"stopped at the {a.timeout:g} s limit after {levels} concurrency levels"
    elif rc != 0 and "error" not in result:
        result["error"] = f"exited with {rc} after {levels} concurrency levels"
    result["log"] = str(log)
    mem.settle(baseline)
    return result


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def table(results: list[dict[str, Any]]) -> str:
    head = ["system", "conc", *(c[0] for c in COLS), "start-up s", "GPU mem GiB ready / peak"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in results:
        mem = (f"{r['mem_ready_gib']:.1f} / {r['mem_peak_gib']:.1f}" if "mem_ready_gib" in r and "mem_peak_gib" in r
               else "-")
        start = f"{r['startup_s']:.0f}" if "startup_s" in r else "-"
        rows = r.get("rows") or {}
        if not rows:
            out.append(f"| {r['system']} | - | {r.get('error', 'no result')} |" + " - |" * (len(head) - 3))
        for c, row in rows.items():
            cells = [fmt.format(row[k]) if row.get(k) == row.get(k) and k in row else "-" for _, k, fmt in COLS]
            out.append(f"| {r['system']} | {c} | " + " | ".join(cells) + f" | {start} | {mem} |")
        if rows and r.get("error"):
            out.append(f"| {r['system']} | - | stopped: {r['error']} |" + " - |" * (len(head) - 3))
    return "\n".join(out)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_run_flags(ap)
    ap.add_argument("--peers", default="vllm-omni,faster-qwen3-tts,qwen-tts",
                    help="comma-separated, run in this order; omni-tts runs last unless listed")
    ap.add_argument("--path", action="append", default=[], metavar="NAME=DIR",
                    help="put DIR first on NAME's import path (a --target install of that peer)")
    ap.add_argument("--timeout", type=float, default=1500, help="seconds per system")
    ap.add_argument("--json", default=None)
    ap.add_argument("--log-dir", default=None, help="each system's stderr as DIR/peer-NAME.log (default: a temp dir)")


def main(a: argparse.Namespace) -> int:
    import torch

    if not a.model:
        raise OmniTTSError("peers needs --model DIR: a checkpoint in the released layout, the same for every system")
    a.device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if a.ref_audio:  # each system runs in its own process from the package's root
        a.ref_audio = str(Path(a.ref_audio).resolve())
    names = [p.strip() for p in a.peers.split(",") if p.strip()]
    names += [] if "omni-tts" in names else ["omni-tts"]
    paths = dict(p.split("=", 1) for p in a.path)
    logs = Path(a.log_dir or tempfile.mkdtemp(prefix="omni-tts-peers-"))
    logs.mkdir(parents=True, exist_ok=True)
    mem = GpuMemory(enabled=a.device.startswith("cuda"))
    results: list[dict[str, Any]] = []
    run = provenance()  # once: the run's start, whichever system's results are written last
    try:
        for name in names:
            print(f"running {name} ...", file=sys.stderr, flush=True)
            results.append(run_system(name, a, paths, mem, logs / f"peer-{name}.log"))
            print(table(results[-1:]), file=sys.stderr, flush=True)
            if a.json:  # after every system, so a stopped run keeps what it measured
                Path(a.json).write_text(json.dumps({**run, "model": a.model, "frames": a.frames,
                                                    "device": a.device, "concurrency": a.concurrency,
                                                    "num_prompts": a.num_prompts, "results": results}, indent=1))
    finally:
        mem.close()
    print(table(results))
    return 0
