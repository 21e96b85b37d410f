"""The benchmark CLI: CodePredictor modes x concurrency, as rows of the seed table (docs/benchmarks.md).

    python -m omni_tts.bench --model DIR --preset NAME [--modes eager,default,...]
        [--concurrency 1 8 32] [--num-prompts N] [--fixed-frames N] [--json OUT]
    python -m omni_tts.bench peers --model DIR ...   (omni_tts/peers.py: the peers beside us)

Owns: the prompt list, the closed-loop load generator (c clients, each sending its next request
when the last one finished), warm-up exclusion, and the table/JSON output. All figures come from
the engine's own per-request metrics (omni_tts.engine.metrics). Knows nothing about model internals.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from omni_tts.config import CompileMode, SynthesisParams, load_preset, parse_sets
from omni_tts.engine.metrics import RequestMetrics, summarize
from omni_tts.engine.snapshot import EngineSnapshot
from omni_tts.errors import OmniTTSError
from omni_tts.models.qwen3_tts import NEUTRAL_INSTRUCT
from omni_tts.tools.load import make_params, run_load

ROWS = [("Med TTFP (ms)", "med_ttfp_ms", "{:.1f}"), ("p90 TTFP (ms)", "p90_ttfp_ms", "{:.1f}"),
        ("Med E2E (ms)", "med_e2e_ms", "{:.1f}"), ("Mean RTF", "mean_rtf", "{:.3f}"),
        ("Req/s", "req_per_s", "{:.2f}"), ("Audio tput (s/s)", "audio_s_per_s", "{:.1f}"),
        ("Rows per frame", "rows_per_frame", "{:.2f}"), ("Code-to-wave calls", "decode_calls", "{:.0f}")]


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
               make: Callable[[int, str], SynthesisParams], warmup: int, say: Callable[[str], None]
               ) -> tuple[dict[int, dict[str, float]], dict[str, Any]]:
    """One mode's rows; the other resident modes idle meanwhile (they were warmed at start-up)."""
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
            done, n = [0], max(num_prompts, c)

            def tick(_m: RequestMetrics, c: int = c, n: int = n) -> None:
                done[0] += 1
                say(f"  [{mode}] concurrency {c}: {done[0]}/{n} requests")

            before = engine.snapshot()
            records, wall = run_load(engine, c, n, make_m, on_done=tick)
            results[c] = summarize(records, wall) | _frames_since(before, engine.snapshot())
        except OmniTTSError as e:
            results[c] = {"error": f"failed: {str(e)[:80]}"}
        except Exception as e:  # a CUDA error in one mode is a result, not a crash of the benchmark
            results[c] = {"error": f"{type(e).__name__}: {str(e)[:80]}"}
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


def _frames_since(before: EngineSnapshot, after: EngineSnapshot) -> dict[str, float]:
    """How full the frames were (mean rows per frame: below the concurrency when slots wait between
    requests) and how many batched code-to-wave calls decoded the chunks, between two snapshots."""
    steps = after.steps - before.steps
    busy = after.busy_slots_sum - before.busy_slots_sum
    return {"rows_per_frame": busy / steps if steps else float("nan"),
            "decode_calls": float(after.decode_calls - before.decode_calls)}


def _cudagraph_counters() -> str:
    """Inductor's CUDA-graph counters (skips, recorded inputs), '-' before anything compiled: a mode whose
    graph trees stop replaying shows it here."""
    if "torch._dynamo" not in sys.modules:
        return "-"
    from torch._dynamo.utils import counters

    found = {k: v for k, v in counters["inductor"].items() if "cudagraph" in k}
    return ", ".join(f"{k}={v}" for k, v in sorted(found.items())) or "none"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m omni_tts.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="checkpoint dir or hub id (default: embedded demo)")
    ap.add_argument("--preset", default="bench")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="slots per mode (default: the largest concurrency)")
    ap.add_argument("--modes", default=None, help="comma-separated modes (default: all; with --http: the server's)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--num-prompts", type=int, default=None, help="requests per concurrency, at least one per client "
                    "(default 2x the largest conc, >= 12)")
    ap.add_argument("--fixed-frames", type=int, default=None, help="every request makes exactly N frames")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--speaker", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--json", default=None, help="write results as JSON here")
    ap.add_argument("--http", default=None, metavar="URL",
                    help="measure a running server through POST URL/v1/audio/speech (streamed pcm) instead of an "
                         "in-process engine; --modes are sent as each request's mode, --fixed-frames as max_new_tokens")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a preset key (repeatable), e.g. --set kernels=false --set enforce_eager=true")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["peers"]:
        from omni_tts.tools.peers import main as peers_main

        return peers_main(argv[1:])
    args = _parser().parse_args(argv)
    t0 = time.perf_counter()
    say = lambda s: print(f"[{time.perf_counter() - t0:6.1f}s] {s}", file=sys.stderr, flush=True)  # noqa: E731
    if args.http:
        return _bench_over_http(args)
    try:
        names = args.modes or ",".join(m.value for m in CompileMode)
        modes = [CompileMode.parse(m).value for m in names.split(",") if m.strip()]
        overrides = parse_sets(args.set)
        overrides.update({k: v for k, v in (("model", args.model), ("device", args.device), ("dtype", args.dtype))
                          if v is not None})
        overrides["max_num_seqs"] = args.max_num_seqs or max(args.concurrency)
        load_preset(args.preset, **overrides)  # a bad preset or key fails here, before any load
    except OmniTTSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    results: dict[str, dict[int, dict[str, float]]] = {}
    extra: dict[str, dict[str, Any]] = {}
    try:
        snapshot = _bench_group(modes, args, overrides, results, extra, say)
    except OmniTTSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"model: {snapshot.model}\ndevice: {snapshot.device}  dtype: {snapshot.dtype}  "
          f"fixed_frames: {args.fixed_frames}")
    print(format_table(results, args.concurrency, extra))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": snapshot.model, "device": snapshot.device, "dtype": snapshot.dtype,
                       "fixed_frames": args.fixed_frames, "concurrency": args.concurrency,
                       "results": {m: {str(c): v for c, v in r.items()} for m, r in results.items()},
                       "extra": extra}, f, indent=1)
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
            json.dump({"http": args.http, "frames": frames, "concurrency": args.concurrency,
                       "results": {m: {str(c): v for c, v in r.items()} for m, r in results.items()}}, f, indent=1)
    return 0


def _bench_group(modes: list[str], args: Any, overrides: dict[str, Any], results: dict, extra: dict,
                 say: Callable[[str], None]) -> EngineSnapshot:
    """Every mode of `modes` resident in one engine, benchmarked one after another."""
    from omni_tts.engine.engine import Engine

    engine = Engine.from_config(load_preset(args.preset, **overrides, mode=modes[0], modes=modes), progress=say)
    # a Base checkpoint has no such voice: its requests are refused with the message saying so
    voice = engine.plain_voice() or {"task": "voice_design", "speaker": None, "instruct": NEUTRAL_INSTRUCT}
    speaker = args.speaker or voice["speaker"]
    make = lambda i, m: make_params(i, speaker, args.fixed_frames, task=voice["task"],  # noqa: E731
                                    instruct=voice["instruct"], mode=m)
    for mode in modes:  # measure only once every mode is warm: a warming mode competes for the GPU
        engine.wait_ready(mode)
    try:
        for mode in modes:
            say(f"mode {mode}")
            results[mode], extra[mode] = bench_mode(engine, mode, args.concurrency,
                                                    args.num_prompts or max(12, 2 * max(args.concurrency)),
                                                    make, args.warmup, say)
            # printed as it comes, so a run stopped in a later mode keeps this one
            say(format_table({mode: results[mode]}, args.concurrency, {mode: extra[mode]}))
    finally:
        snapshot = engine.snapshot()
        engine.shutdown()
    return snapshot


if __name__ == "__main__":
    raise SystemExit(main())
