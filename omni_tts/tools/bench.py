"""`omni-tts bench`: latency and throughput per CodePredictor mode and concurrency, in one engine.

    omni-tts bench --model DIR [--preset bench] [--modes eager,default,...] [--concurrency 1 8 32]
        [--num-prompts N] [--per-client K] [--runs R] [--fixed-frames N] [--json OUT] [--http URL]

Owns: the modes checked against the device before anything loads, warm-up exclusion, the frames'
fill between two snapshots, and the table/JSON output. The load itself is tools/load.py's closed loop
(tools/http_load.py's through a server with --http). All figures come from the engine's own per-request
metrics (omni_tts.engine.metrics). Knows nothing about model internals.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from omni_tts import EngineSnapshot, RequestMetrics
from omni_tts.config import CompileMode, EngineConfig, SynthesisParams
from omni_tts.engine.testing import summarize
from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import add_engine_flags, engine_config, progress
from omni_tts.tools.load import request_maker, run_load
from omni_tts.tools.provenance import provenance

ROWS = [("Med TTFP (ms)", "med_ttfp_ms", "{:.1f}"), ("p90 TTFP (ms)", "p90_ttfp_ms", "{:.1f}"),
        ("Med queued (ms)", "med_queue_ms", "{:.1f}"), ("Med to first codes (ms)", "med_first_codes_ms", "{:.1f}"),
        ("Med to first chunk (ms)", "med_first_chunk_ms", "{:.1f}"),
        ("Med E2E (ms)", "med_e2e_ms", "{:.1f}"), ("Mean RTF", "mean_rtf", "{:.3f}"),
        ("Req/s", "req_per_s", "{:.2f}"), ("Audio tput (s/s)", "audio_s_per_s", "{:.1f}"),
        ("Mean batch per frame", "batch_per_frame", "{:.2f}"), ("Code-to-wave calls", "decode_calls", "{:.0f}")]


def format_table(results: dict[str, dict[int, dict[str, float]]], concurrency: Sequence[int],
                 extra: dict[str, dict[str, Any]] | None = None) -> str:
    """Markdown table: rows are (metric, concurrency), one column per mode."""
    modes = list(results)
    lines = ["| Metric | Conc | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
    for label, key, fmt in ROWS:
        for c in concurrency:
            cells = []
            for m in modes:
                v = results[m].get(c, {}).get(key)
                cells.append(results[m][c]["error"] if c in results[m] and "error" in results[m][c]
                             else ("-" if v is None or v != v else fmt.format(v)))
            lines.append(f"| {label} | {c} | " + " | ".join(cells) + " |")
    if extra:
        for key in sorted({k for e in extra.values() for k in e}):
            lines.append(f"| {key} | all | " + " | ".join(str(extra.get(m, {}).get(key, "-")) for m in modes) + " |")
    return "\n".join(lines)


def bench_mode(engine: Any, mode: str, concurrency: Sequence[int], num_prompts: int,
               make: Callable[[int, str], SynthesisParams], warmup: int, say: Callable[[str], None],
               per_client: int = 0, runs: int = 1, on_row: Callable[[int, dict[str, Any]], None] | None = None
               ) -> tuple[dict[int, dict[str, float]], dict[str, Any]]:
    """One mode's rows; the other resident modes idle meanwhile (they were warmed at start-up). Each
    concurrency c runs max(num_prompts, per_client * c, c) requests, `runs` times: its row holds each
    figure's median over the runs (and the runs themselves when there are several). on_row(c, row) as
    each row is done."""
    engine.wait_ready(mode)
    report = engine.modes()[mode]
    make_m = lambda i: make(i, mode)  # noqa: E731
    results: dict[int, dict[str, float]] = {}
    if engine.device.type == "cuda":
        import torch

        torch.cuda.reset_peak_memory_stats()
    for c in concurrency:
        try:
            run_load(engine, c, max(warmup, c), make_m)  # warm-up, excluded
            n = max(num_prompts, per_client * c, c)
            each = [_one_run(engine, mode, c, n, make_m, f" run {r + 1}/{runs}" if runs > 1 else "", say)
                    for r in range(runs)]
            results[c] = each[0] if len(each) == 1 else median_run(each)
        except OmniTTSError as e:
            results[c] = {"error": f"failed: {str(e)[:80]}"}
        except Exception as e:  # a CUDA error in one mode is a result, not a crash of the benchmark
            results[c] = {"error": f"{type(e).__name__}: {str(e)[:80]}"}
        if on_row:
            on_row(c, results[c])
    snap = engine.snapshot()
    cap = snap.capture.get(mode, {})
    pool, trees = cap.get("pool_bytes", 0), cap.get("tree_pool_bytes", 0)
    mem = snap.memory
    extra = {"state": report.state, "capture/compile s": f"{report.seconds or 0:.1f}",
             "peak GPU mem (GiB)": f"{mem['peak_gib']:.2f}" if mem else "-",
             "graph pool of this mode's runner (GiB)": f"{pool / 2**30:.2f}" if mem else "-",
             "Inductor graph-tree pool (GiB)": f"{trees / 2**30:.2f}" if mem else "-",
             "CodePredictor kernels": report.kernels}
    if report.reason:
        extra["notice"] = report.reason
    extra["Inductor CUDA-graph counters (process so far)"] = _cudagraph_counters()
    return results, extra


def _one_run(engine: Any, mode: str, c: int, n: int, make: Callable[[int], SynthesisParams], label: str,
             say: Callable[[str], None]) -> dict[str, float]:
    """c clients share n requests; -> the summary of their metrics and of the frames they filled."""
    done = [0]

    def tick(_m: RequestMetrics) -> None:
        done[0] += 1
        say(f"  [{mode}] concurrency {c}{label}: {done[0]}/{n} requests")

    before = engine.snapshot()
    records, wall = run_load(engine, c, n, make, on_done=tick)
    return summarize(records, wall) | _frames_since(before, engine.snapshot())


def median_run(runs: list[dict[str, float]]) -> dict[str, Any]:
    """Each figure's median over `runs` (each run's own figures kept under 'runs')."""
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]} | {"runs": runs}


def _frames_since(before: EngineSnapshot, after: EngineSnapshot) -> dict[str, float]:
    """How full the frames were (mean requests per batched frame step: below the concurrency when slots
    wait between requests) and how many batched code-to-wave calls decoded the chunks, between two snapshots."""
    steps = after.steps - before.steps
    busy = after.busy_slots_sum - before.busy_slots_sum
    return {"batch_per_frame": busy / steps if steps else float("nan"),
            "decode_calls": float(after.decode_calls - before.decode_calls)}


def _cudagraph_counters() -> str:
    """Inductor's CUDA-graph counters (skips, recorded inputs), '-' before anything compiled: a mode whose
    graph trees stop replaying shows it here."""
    if "torch._dynamo" not in sys.modules:
        return "-"
    from torch._dynamo.utils import counters

    found = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
    return ", ".join(f"{k}={v}" for k, v in sorted(found.items())) or "none"


def _count(least: int) -> Callable[[str], int]:
    def parse(s: str) -> int:
        n = int(s) if s.strip().isdigit() else -1
        if n < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got '{s}'")
        return n
    return parse


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_engine_flags(ap, preset="bench")
    ap.add_argument("--modes", default=None, help="comma-separated modes (default: every mode this device runs; "
                    "with --http: the server's default)")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="slots per mode (default: the largest concurrency)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--num-prompts", type=int, default=None, help="requests per concurrency, at least one per client "
                    "(default 2x the largest concurrency, >= 12)")
    ap.add_argument("--per-client", type=_count(0), default=0, metavar="K",
                    help="at least K requests per client at each concurrency (K x c in all)")
    ap.add_argument("--runs", type=_count(1), default=1,
                    help="measure each concurrency R times; the table shows medians")
    ap.add_argument("--fixed-frames", type=int, default=None, help="every request makes exactly N frames")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--speaker", default=None)
    ap.add_argument("--json", default=None, help="write results as JSON here")
    ap.add_argument("--http", default=None, metavar="URL",
                    help="measure a running server through POST URL/v1/audio/speech (streamed pcm) instead of an "
                         "in-process engine; --modes are sent as each request's mode, --fixed-frames as max_new_tokens")


def device_modes(cfg: EngineConfig, names: str | None) -> list[str]:
    """The modes to measure: `names` (comma-separated), each one this config can run on this machine, else
    every mode it can; checked before anything loads (OmniTTSError naming the first that cannot run)."""
    import torch

    cuda = cfg.device != "cpu" and torch.cuda.is_available()

    def why_not(m: CompileMode) -> str:
        if m.needs_cuda and not cuda:
            return "it needs CUDA, and this run is on a CPU"
        return "the preset sets enforce_eager" if m.compiled and cfg.enforce_eager else ""

    runs = [m.value for m in CompileMode if not why_not(m)]
    if names is None:
        return runs
    modes = [CompileMode.parse(m) for m in names.split(",") if m.strip()]
    for m in modes:
        if why_not(m):
            raise OmniTTSError(f"mode {m.value} cannot run here: {why_not(m)} (modes here: {', '.join(runs)})")
    return [m.value for m in modes]


def main(args: argparse.Namespace) -> int:
    if args.http:
        return _bench_over_http(args)
    say = progress()
    slots = args.max_num_seqs or max(args.concurrency)
    modes = device_modes(engine_config(args, max_num_seqs=slots), args.modes)  # a bad preset or key fails here
    config = engine_config(args, max_num_seqs=slots, mode=modes[0], modes=modes)
    results: dict[str, dict[int, dict[str, float]]] = {}
    extra: dict[str, dict[str, Any]] = {}
    head = provenance()

    def save(snapshot: EngineSnapshot | None = None) -> None:
        """The JSON as it stands: rewritten after every row, so a run stopped part-way keeps its rows
        ("complete": false until the end)."""
        if args.json:
            info = {"model": snapshot.model, "device": snapshot.device, "dtype": snapshot.dtype} if snapshot else {}
            with open(args.json, "w") as f:
                json.dump({**head, **info, "complete": snapshot is not None, "fixed_frames": args.fixed_frames,
                           "concurrency": args.concurrency,
                           "results": {m: {str(c): v for c, v in r.items()} for m, r in results.items()},
                           "extra": extra}, f, indent=1)

    snapshot = _bench_group(config, args, results, extra, say, save)
    print(f"model: {snapshot.model}\ndevice: {snapshot.device}  dtype: {snapshot.dtype}  "
          f"fixed_frames: {args.fixed_frames}")
    print(format_table(results, args.concurrency, extra))
    save(snapshot)
    return 0


def _bench_over_http(args: Any) -> int:
    """The same table through a server's OpenAI-compatible speech route (tools/http_load.py)."""
    from omni_tts.tools.http_load import bench_http

    modes = [m.strip() for m in args.modes.split(",") if m.strip()] if args.modes else [""]
    frames = args.fixed_frames or 75
    n = args.num_prompts or max(12, 2 * max(args.concurrency))
    results = {(m or "server default"): bench_http(args.http, args.concurrency, n, frames, args.speaker, m or None,
                                                   args.warmup) for m in modes}
    print(f"server: {args.http}  max_new_tokens: {frames + 1} (streamed pcm; TTFP = first non-empty chunk)")
    print(format_table(results, args.concurrency))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**provenance(), "http": args.http, "frames": frames, "concurrency": args.concurrency,
                       "results": {m: {str(c): v for c, v in r.items()} for m, r in results.items()}}, f, indent=1)
    return 0


def _bench_group(config: EngineConfig, args: Any, results: dict, extra: dict, say: Callable[[str], None],
                 save: Callable[[], None] = lambda: None) -> EngineSnapshot:
    """Every mode of `config.modes` resident in one engine, benchmarked one after another."""
    from omni_tts import Engine

    modes = list(config.modes or [])
    engine = Engine.from_config(config, progress=say)
    make = request_maker(engine, args.fixed_frames, args.speaker)
    for mode in modes:  # measure only once every mode is warm: a warming mode competes for the GPU
        engine.wait_ready(mode)
    try:
        for mode in modes:
            say(f"mode {mode}")

            def row_done(c: int, row: dict[str, Any], mode: str = mode) -> None:
                results.setdefault(mode, {})[c] = row
                save()

            results[mode], extra[mode] = bench_mode(engine, mode, args.concurrency,
                                                    args.num_prompts or max(12, 2 * max(args.concurrency)),
                                                    make, args.warmup, say, args.per_client, args.runs, row_done)
            # printed as it comes, so a run stopped in a later mode keeps this one
            say(format_table({mode: results[mode]}, args.concurrency, {mode: extra[mode]}))
    finally:
        snapshot = engine.snapshot()
        engine.shutdown()
    return snapshot
