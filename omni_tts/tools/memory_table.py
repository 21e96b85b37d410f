"""Peak memory per preset under GPU memory caps, each (preset, cap) in a fresh process of its own.

    omni-tts memory --model DIR [--presets default bench] [--caps-gib 16 24] [--waves 2] [--frames 75]
        [--set KEY=VALUE] [--timeout 3600] [--jobs 1] [--json OUT]

Each process caps its allocator (the config's `gpu_memory_limit_gb`: set_per_process_memory_fraction(cap /
total) before the model loads), starts the engine as the app does (`Engine.from_config(wait=True)`), waits
until every resident mode is ready or failed, runs `--waves` x max_num_seqs requests per ready mode at
max_num_seqs concurrency (tools.load.run_load), and reports peak allocated / reserved GiB, the graph pools'
GiB, which modes became ready and each failed mode's error (an out-of-memory warm-up says so there). A
process that dies is a row with its exit status and last lines; one stopped at `--timeout` says the stage
it reached, with its peak memory until then. On a CPU the cap cannot apply: the row
has the host's peak RSS and says the GPU figures need CUDA. `--jobs N` runs N such processes at once
(each under its own cap, so each row's peaks are its own; their compiles share the host's cores).
Owns the orchestration and the table; knows only the Engine's public API.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from omni_tts.tools.args import add_model_flag
from omni_tts.tools.provenance import ROOT, provenance

GIB = float(1 << 30)


def _load(engine: Any, mode: str, waves: int, frames: int) -> dict[str, Any]:
    """waves x max_num_seqs requests of `mode` at max_num_seqs concurrency -> served count or the error."""
    from omni_tts.errors import one_line
    from omni_tts.tools.load import make_params, run_load

    voice = engine.plain_voice() or {"task": "custom_voice", "speaker": None, "instruct": None}
    c = engine.config.max_num_seqs
    make = lambda i: make_params(i, voice["speaker"], frames, task=voice["task"],  # noqa: E731
                                 instruct=voice["instruct"], mode=mode)
    try:
        records, wall = run_load(engine, c, waves * c, make)
        return {"requests": waves * c, "served": len(records), "wall_s": wall}
    except Exception as e:
        return {"requests": waves * c, "served": 0, "error": one_line(e)}


def _memory(engine: Any) -> dict[str, Any]:
    import torch

    if engine.device.type != "cuda":
        return {"host_peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB,
                "gpu": "needs CUDA"}
    mem = engine.snapshot().memory
    return {"peak_allocated_gib": torch.cuda.max_memory_allocated(engine.device) / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved(engine.device) / GIB,
            "graph_pool_gib": mem["graph_pool_gib"], "tree_pool_gib": mem["tree_pool_gib"],
            "codec_graph_pool_gib": mem.get("codec_graph_pool_gib", 0.0),
            "total_gib": torch.cuda.get_device_properties(engine.device).total_memory / GIB}


def _write(out: Path, row: dict[str, Any]) -> None:
    """The row so far, replaced whole (a reader never sees half a file)."""
    tmp = out.with_suffix(".part")
    tmp.write_text(json.dumps(row))
    tmp.replace(out)


def child(spec: dict[str, Any], out: Path) -> dict[str, Any]:
    """One (preset, cap) in this process: the engine, every resident mode warmed and loaded, the figures.
    The row is written to `out` at each stage ("stage": where it stands), so a run stopped at its timeout
    still says how far it got and the peak memory until then."""
    import torch

    from omni_tts import Engine
    from omni_tts.config import load_preset, parse_sets
    from omni_tts.errors import one_line

    cuda = torch.cuda.is_available()
    row: dict[str, Any] = {"preset": spec["preset"], "cap_gib": spec["cap_gib"], "cap_applied": cuda,
                           "stage": "loading the engine"}
    _write(out, row)
    try:
        config = load_preset(spec["preset"], **{**parse_sets(spec["sets"]), "model": spec["model"],
                                                "gpu_memory_limit_gb": spec["cap_gib"] if cuda else None})
        engine = Engine.from_config(config, wait=True)
    except Exception as e:  # out of memory while loading, a bad preset: the whole row's error
        return {**row, "error": one_line(e)}
    try:
        row["ready"], row["load"] = [], {}
        for mode in engine.schedulers:
            _write(out, {**row, **_memory(engine), "stage": f"warming {mode}"})
            engine.wait_ready(mode, spec["warm_timeout"])
            if engine.modes()[mode].state == "ready":
                row["ready"].append(mode)
        states = engine.modes()
        row["failed"] = {m: v.reason or v.state for m, v in states.items() if v.state not in ("ready", "unavailable")}
        row["max_num_seqs"] = engine.config.max_num_seqs
        for mode in row["ready"]:
            _write(out, {**row, **_memory(engine), "stage": f"loading {mode}"})
            row["load"][mode] = _load(engine, mode, spec["waves"], spec["frames"])
        row.update(_memory(engine), stage="done")
    finally:
        engine.shutdown()
    return row


def run_one(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """`child(spec)` in a fresh interpreter; a process that dies or runs out of time is a row saying so (one
    stopped at its timeout with where it stood and its figures until then, when it wrote any)."""
    row = {"preset": spec.get("preset"), "cap_gib": spec.get("cap_gib")}
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "row.json"
        cmd = [sys.executable, "-m", "omni_tts.tools.memory_table", json.dumps(spec), str(out)]
        try:
            p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            return timed_out(row, out, e.stderr, timeout)
        if p.returncode == 0 and out.is_file():
            return json.loads(out.read_text())
        return {**row, "error": f"exit status {p.returncode}", "log_tail": p.stderr.splitlines()[-20:]}


def timed_out(row: dict[str, Any], out: Path, stderr: str | bytes | None, timeout: float) -> dict[str, Any]:
    """The row of a process stopped at its timeout: its last written stage and figures, its log's tail."""
    so_far = json.loads(out.read_text()) if out.is_file() else {"stage": "starting"}
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    return {**so_far, **row, "error": f"no result in {timeout:.0f} s ({so_far['stage']})",
            "log_tail": (stderr or "").splitlines()[-20:]}


def table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| preset | cap GiB | peak allocated GiB | peak reserved GiB | graph pools GiB | ready | failed |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r and "peak_allocated_gib" not in r:  # no figures: the error alone
            lines.append(f"| {r['preset']} | {r['cap_gib']} | {r['error']} | | | | |")
            continue
        stopped = "error" in r  # stopped at its timeout: its figures until then, and why in the last column
        if "gpu" in r:  # a CPU: no GPU figures
            figures = f"{r['gpu']} (host peak RSS {r['host_peak_rss_gib']:.2f}) | - | -"
        else:
            pools = r["graph_pool_gib"] + r["tree_pool_gib"] + r.get("codec_graph_pool_gib", 0.0)
            figures = (f"{r['peak_allocated_gib']:.2f}{' until stopped' if stopped else ''} | "
                       f"{r['peak_reserved_gib']:.2f} | {pools:.2f}")
        last = r["error"] if stopped else "; ".join(f"{m}: {why}" for m, why in r["failed"].items()) or "-"
        ready = ", ".join(r.get("ready", [])) or "-"
        lines.append(f"| {r['preset']} | {r['cap_gib']} | {figures} | {ready} | {last} |")
    return "\n".join(lines)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_model_flag(ap)
    ap.add_argument("--presets", nargs="+", default=["default"], help="engine presets (names or YAML files)")
    ap.add_argument("--caps-gib", type=float, nargs="+", default=[16.0, 24.0], help="GPU memory caps, GiB")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a preset key")
    ap.add_argument("--waves", type=int, default=2, help="requests per mode: this many x max_num_seqs")
    ap.add_argument("--frames", type=int, default=75, help="frames per request")
    ap.add_argument("--warm-timeout", type=float, default=1800.0, help="seconds to wait for each mode's warm-up")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per (preset, cap) process")
    ap.add_argument("--jobs", type=int, default=1,
                    help="(preset, cap) processes at once on the one GPU (each capped; compiles share the host)")
    ap.add_argument("--json", default=None)


def main(args: argparse.Namespace) -> int:
    from omni_tts.errors import OmniTTSError

    if min(args.caps_gib) <= 0 or min(args.waves, args.frames, args.jobs) < 1:
        raise OmniTTSError("--caps-gib takes positive GiB, --waves, --frames and --jobs positive integers")
    specs = [{"model": args.model, "preset": preset, "cap_gib": cap, "sets": args.set, "waves": args.waves,
              "frames": args.frames, "warm_timeout": args.warm_timeout}
             for preset in args.presets for cap in args.caps_gib]

    def one(spec: dict[str, Any]) -> dict[str, Any]:
        row = run_one(spec, args.timeout)
        print(f"{spec['preset']} under {spec['cap_gib']} GiB: {json.dumps(row)}", file=sys.stderr, flush=True)
        return row

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each row its own process and cap
        rows = list(pool.map(one, specs))
    if args.json:
        Path(args.json).write_text(json.dumps({**provenance(), "rows": rows}, indent=1))
    print(table(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":  # one (preset, cap) row: SPEC_JSON OUT_JSON (run_one starts this)
    _write(Path(sys.argv[2]), child(json.loads(sys.argv[1]), Path(sys.argv[2])))
