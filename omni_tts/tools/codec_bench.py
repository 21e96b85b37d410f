"""`omni-tts codec-bench`: code-to-wave alone, set up as the engine sets it up (the checkpoint, device and
`codec_precision` from the engine flags; the fused activations of `audio_stage.fuse_codec`): ms per
carried chunk (`--chunk-frames` new frames of streams `--history` frames in) and per first chunk
(`--first-frames` frames, empty state) at each --rows; on CUDA also the carried chunk through the engine's
carried-chunk CUDA graph (`codec_graphs.CarriedChunkGraphs`: states gathered, replayed, copied back), and
the host's share of each (ms from the call to its return: the launches), and the carried chunk's kernels
at each --profile-rows grouped by name (calls, ms), largest first. With `--new-shapes N`: N carried chunks
of (rows, frames) shapes this process has not decoded yet, as the engine's chunks come (rows up to the
largest --rows, frames the chunk lengths of the preset's requests), each timed at its first call and again
after all N: what a shape's first use costs (cuDNN picks and may build kernels per shape).

Owns: the codec's set-up from a checkpoint alone (no talker is loaded), the timings and the grouping.
Figures go to docs/benchmarks.md; nothing here changes what the engine runs.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from omni_tts.engine.codec_graphs import CARRIED_MAX_ROWS, CarriedChunkGraphs, codec_buckets
from omni_tts.errors import OmniTTSError
from omni_tts.models.codec.streaming import chunk_lengths as stream_chunk_lengths
from omni_tts.tools.args import add_engine_flags, engine_config, run_to_json
from omni_tts.tools.provenance import provenance
from omni_tts.tools.timing import carried_chunk, graphed_chunk, time_ms

TOP_KERNELS = 25


def build_codec(config: Any) -> tuple[Any, str]:
    """(the codec decoder of the config's checkpoint on its device, in its codec precision, as the engine
    runs it; why its fused activations are off, or '')."""
    from omni_tts.engine.audio_stage import fuse_codec
    from omni_tts.models.codec.decoder import CodecDecoder
    from omni_tts.models.loading import resolve_device
    from omni_tts.models.selection import open_checkpoint

    device = resolve_device(config.device)
    codec = CodecDecoder.from_checkpoint(open_checkpoint(config.model)).to(device).eval()
    codec.set_precision(config.resolved_codec_precision(device.type == "cuda"))
    return codec, fuse_codec(codec)


def first_chunk(codec: Any, rows: int, frames: int) -> Callable[[], Any]:
    """A call decoding the first `frames` frames of `rows` streams (an empty state each call)."""
    device = codec.quantizer["rvq_first"].tables.device
    codes = torch.randint(0, 2048, (rows, frames, codec.num_quantizers), device=device)

    def run() -> Any:
        with torch.inference_mode():
            return codec.decode_carried(codes, {})
    return run


def host_ms(fn: Callable[[], Any], iters: int) -> float:
    """Median ms from calling fn to its return, the device idle at each call: the host's launch work."""
    times = []
    for _ in range(iters):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(1000 * (time.perf_counter() - t0))
    torch.cuda.synchronize()
    return statistics.median(times)


def kernels(call: Callable[[], Any]) -> list[dict[str, Any]]:
    """The CUDA kernels (and copies) of one call of a warm `call`, grouped by name: calls and ms."""
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    groups: dict[str, list[float]] = {}
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            g = groups.setdefault(ev.name, [0, 0.0])
            g[0] += 1
            g[1] += ev.device_time_total / 1000
    top = sorted(groups.items(), key=lambda kv: -kv[1][1])
    return [{"kernel": name, "calls": int(n), "ms": round(ms, 3)} for name, (n, ms) in top]


def chunk_lengths(config: Any) -> list[int]:
    """The lengths of a request's chunks under the engine config (`streaming.chunk_lengths`)."""
    return stream_chunk_lengths(config.initial_chunk_frames, config.chunk_frames, config.chunk_growth)


def shape_pool(rows: list[int], lengths: list[int], chunk_frames: int, first_frames: int, history: int
               ) -> list[tuple[int, int]]:
    """(rows, frames) shapes of carried chunks a run has not decoded before its new shapes: rows up to the
    largest --rows and the chunk `lengths` of the engine's requests, less the --rows runs' own chunks and the
    history length (each timed chunk decodes its history first)."""
    seen = {(b, f) for b in rows for f in (chunk_frames, first_frames)}
    return [(b, f) for b in range(1, max(rows) + 1) for f in lengths if f != history and (b, f) not in seen]


def new_shapes(codec: Any, n: int, pool: list[tuple[int, int]], history: int) -> dict[str, Any]:
    """n carried chunks of shapes drawn from `pool` (seeded), each timed once at its first call, then each
    once again: {'first_ms', 'again_ms' (totals), 'calls': per shape}."""
    calls = [{"rows": b, "frames": f, "first_ms": time_ms(carried_chunk(codec, b, history, f), 1, warmup=0)}
             for b, f in random.Random(0).sample(pool, n)]
    for c in calls:
        c["again_ms"] = time_ms(carried_chunk(codec, c["rows"], history, c["frames"]), 1, warmup=0)
    return {"first_ms": sum(c["first_ms"] for c in calls), "again_ms": sum(c["again_ms"] for c in calls),
            "calls": calls}


def run(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    """The run with cuDNN's autotuning on for it if asked (a process-wide switch: restored after)."""
    saved = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = args.cudnn_benchmark or saved
    try:
        return {**timed(args, say), "cudnn_benchmark": torch.backends.cudnn.benchmark}
    finally:
        torch.backends.cudnn.benchmark = saved


def timed(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    if min([*args.rows, *args.profile_rows, args.iters, args.chunk_frames, args.first_frames, args.history]) < 1:
        raise OmniTTSError("--rows, --profile-rows, --iters and the frame counts take positive integers")
    config = engine_config(args)
    lengths = chunk_lengths(config)
    pool = shape_pool(args.rows, lengths, args.chunk_frames, args.first_frames, args.history)
    if not 0 <= args.new_shapes <= len(pool):
        raise OmniTTSError(f"--new-shapes takes 0 to {len(pool)} here (rows 1..{max(args.rows)} x the preset's "
                           f"chunks of {', '.join(map(str, lengths))} frames, less the shapes the run decodes anyway)")
    codec, why = build_codec(config)
    device = codec.quantizer["rvq_first"].tables.device
    res: dict[str, Any] = {**provenance(), "device": str(device), "precision": codec.precision,
                           "fused": codec.fused, "fused_off_because": why,
                           "chunk_frames": args.chunk_frames, "history": args.history,
                           "first_frames": args.first_frames, "rows": []}
    cuda = device.type == "cuda"
    graphs = CarriedChunkGraphs.captured(codec, [args.chunk_frames], codec_buckets(max(args.rows))) if cuda else None
    for b in args.rows:
        eager = carried_chunk(codec, b, args.history, args.chunk_frames)
        row = {"rows": b, "carried_chunk_ms": time_ms(eager, args.iters),
               "first_chunk_ms": time_ms(first_chunk(codec, b, args.first_frames), args.iters)}
        if graphs is not None and b <= graphs.buckets[-1]:  # above: the engine decodes such chunks eagerly
            graphed = graphed_chunk(graphs, codec, b, args.history, args.chunk_frames)
            row.update(carried_graph_ms=time_ms(graphed, args.iters), carried_host_ms=host_ms(eager, args.iters),
                       carried_graph_host_ms=host_ms(graphed, args.iters))
        res["rows"].append(row)
        say(f"rows {b}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items() if k != "rows"))
    if args.new_shapes:
        res["new_shapes"] = new_shapes(codec, args.new_shapes, pool, args.history)
        say(f"{args.new_shapes} new shapes: {res['new_shapes']['first_ms']:.1f} ms at their first calls, "
            f"{res['new_shapes']['again_ms']:.1f} ms again")
    res["profiles"] = {}
    if args.profile_rows and device.type != "cuda":
        res["profiles_skipped"] = "needs CUDA"
    elif args.profile_rows:
        for b in args.profile_rows:
            res["profiles"][b] = kernels(carried_chunk(codec, b, args.history, args.chunk_frames))
    return res


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_engine_flags(ap, "bench")  # the codec's precision: --set codec_precision=...
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64], help="streams per call")
    ap.add_argument("--chunk-frames", type=int, default=25, help="new frames per carried chunk")
    ap.add_argument("--history", type=int, default=100, help="frames each stream decoded before the chunk")
    ap.add_argument("--first-frames", type=int, default=1, help="frames of a first chunk")
    ap.add_argument("--profile-rows", type=int, nargs="*", default=[], help="CUDA: kernel profile at these rows")
    ap.add_argument("--iters", type=int, default=10, help="timed calls per figure (the median is kept)")
    ap.add_argument("--new-shapes", type=int, default=0, metavar="N",
                    help="also time N carried chunks of new (rows, frames) shapes at their first call and again")
    ap.add_argument("--cudnn-benchmark", action="store_true",
                    help="let cuDNN time its algorithms for each new conv shape (the engine does not)")
    ap.add_argument("--json", default=None)


def main(args: argparse.Namespace) -> int:
    res = run_to_json(args, run)
    print("| rows | carried chunk (ms) | first chunk (ms) | carried, graphed (ms) | host: eager / graphed (ms) |\n"
          "|---|---|---|---|---|")
    for r in res["rows"]:
        graphed = (f"{r['carried_graph_ms']:.3f} | {r['carried_host_ms']:.3f} / {r['carried_graph_host_ms']:.3f}"
                   if "carried_graph_ms" in r else "needs CUDA | needs CUDA" if not res["device"].startswith("cuda")
                   else f"not graphed (eager above {CARRIED_MAX_ROWS} rows) | -")
        print(f"| {r['rows']} | {r['carried_chunk_ms']:.3f} | {r['first_chunk_ms']:.3f} | {graphed} |")
    for b, top in res["profiles"].items():
        print(f"\nkernels of one carried chunk at {b} rows ({sum(k['ms'] for k in top):.2f} ms):")
        for k in top[:TOP_KERNELS]:
            print(f"  {k['ms']:9.3f} ms  {k['calls']:4d}x  {k['kernel'][:100]}")
    if "new_shapes" in res:
        ns = res["new_shapes"]
        print(f"\n{len(ns['calls'])} new shapes: {ns['first_ms']:.1f} ms at their first calls, "
              f"{ns['again_ms']:.1f} ms again")
    if res.get("profiles_skipped"):
        print(f"kernel profiles skipped: {res['profiles_skipped']}")
    return 0
