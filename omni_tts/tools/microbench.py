"""Per-bucket cost of a frame's two steps in each CompileMode, and greedy agreement between modes.

    omni-tts microbench --model DIR [--preset bench] [--modes eager,default,...] [--buckets 1 8 16 32 64]
        [--frames 40] [--json OUT]

Owns: filling the runner's slots with real prefilled requests, timing the code-predictor step and
the talker decode step per batch bucket with CUDA events (graph replay in default+cudagraph, the
compiled or eager callables otherwise), the capture/compile time and memory of each mode, and a
greedy run per mode whose codes are compared with eager's (first differing frame).
Knows nothing about the engine's scheduler or the UI.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from omni_tts.config import CompileMode, EngineConfig, SynthesisParams
from omni_tts.engine import testing
from omni_tts.engine.testing import gpu_memory
from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import add_engine_flags, engine_config, progress
from omni_tts.tools.bench import device_modes
from omni_tts.tools.load import PROMPTS
from omni_tts.tools.provenance import provenance
from omni_tts.tools.timing import carried_chunk, time_ms


def fill_slots(runner: Any, n: int, speaker: str | None) -> None:
    for i in range(n):
        runner.prefill(i, SynthesisParams(text=PROMPTS[i % len(PROMPTS)], speaker=speaker, greedy=True,
                                          language="English", fixed_frames=300))


def step_callables(runner: Any, b: int, kv_len: int | None = None) -> tuple[Callable[[], Any], Callable[[], Any]]:
    """(code predictor step, talker step) for rows [:b] as the runner would run them; the talker's attention
    over kv_len cache positions (default: what the rows' positions need)."""
    return testing.step_fns(runner, b, kv_len)


def codec_costs(model: Any, served: str = "tf32") -> dict[str, float]:
    """ms per decode_window call: the first chunk (no context, 1 frame), the second of a 75-frame
    benchmark request (1 context + 25 new) and a steady chunk (full receptive field + 25 new), and per
    carried-state chunk as the engine streams (25 new frames of streams 100 frames in), batch 1, 8 and
    32, in the tf32 and bfloat16 precisions with eager and fused (compiled) activations; plus each
    variant's max abs difference from float32 eager on one steady window, and the carried chunk's FLOPs
    and bytes moved per frame (`codec.costs.chunk_costs`, bfloat16) for the roofline; on CUDA the
    first-chunk graphs in the `served` precision with fused activations, as the engine replays them."""
    import copy

    from omni_tts.engine.testing import fuse_codec
    from omni_tts.models.codec.costs import chunk_costs

    out: dict[str, float] = {}
    for b in (1, 8, 32, 64):
        per_frame = chunk_costs(model.ckpt.codec_config, b, 25).per_frame()
        out.update({f"carried_b{b}_{k}_per_frame": v for k, v in per_frame.items()})
    shapes = {"first": (0, 1), "second": (1, 25), "steady": (model.codec.receptive_field_frames, 25)}
    probe = torch.randint(0, 2048, (1, sum(shapes["steady"]), 16), device=model.device)
    ref = copy.deepcopy(model.codec).set_precision("float32").set_fused(False).decode_window(probe, shapes["steady"][0])
    for precision in ("tf32", "bfloat16"):
        for fused in (False, True):
            codec = copy.deepcopy(model.codec).set_precision(precision).set_fused(False)
            name = precision + ("_fused" if fused else "")
            err = fuse_codec(codec) if fused else ""
            if err:
                out[f"{name}_error"] = err
                continue
            wav = codec.decode_window(probe, shapes["steady"][0])
            out[f"{name}_max_abs_diff_vs_float32"] = float((wav - ref).abs().max())
            for b in (1, 8, 32):
                for shape, (c, n) in shapes.items():
                    codes = torch.randint(0, 2048, (b, c + n, 16), device=model.device)
                    out[f"{name}_b{b}_{shape}_ms"] = time_ms(lambda: codec.decode_window(codes, c), iters=5)
                out[f"{name}_b{b}_carried_ms"] = time_ms(carried_chunk(codec, b, 100, 25), iters=5)
    if not torch.cuda.is_available():
        return out
    from omni_tts.engine.testing import FirstChunkGraphs

    codec = copy.deepcopy(model.codec).set_precision(served)  # as the engine serves it: `served`, fused
    fused = "_fused" if not fuse_codec(codec) else ""
    first = FirstChunkGraphs(codec, 1, [1, 8, 32])  # the engine's first-chunk graphs
    for b in (1, 8, 32):
        codes = torch.randint(0, 2048, (b, 1, 16))  # host codes, as the engine hands them over
        out[f"graph_{served}{fused}_b{b}_first_ms"] = time_ms(lambda: first(codec, codes), iters=10)
        eager = codec.decode_window(codes, 0)
        out[f"graph_b{b}_first_max_abs_diff_vs_eager"] = float((first(codec, codes)[0] - eager).abs().max())
    return out


def profile_steps(runner: Any, buckets: Sequence[int], out_dir: str) -> dict[str, Any]:
    """Kernels of one code-predictor step and one talker step per bucket, graph replay and the same
    compiled callables launched one by one: count, summed kernel time and span (first start -> last end)
    from the profiler's trace; chrome traces and top-kernel tables are written to out_dir."""
    import os

    from torch.profiler import ProfilerActivity, profile

    out: dict[str, Any] = {}
    for b in buckets:
        graph_cp, graph_talker = step_callables(runner, b)
        launched_cp, launched_talker = testing.launched_step_fns(runner, b)
        codes = torch.randint(0, 2048, (b, 26, 16), device=runner.device)
        params = SynthesisParams(text=PROMPTS[0], speaker=(runner.model.speakers() or [None])[0], greedy=True,
                                 language="English", fixed_frames=8)
        variants = {"cp_graph": graph_cp, "talker_graph": graph_talker,
                    "prefill": lambda: runner.prefill(runner.S - 1, params),
                    "cp_launched": launched_cp, "talker_launched": launched_talker,
                    "codec_second_chunk": lambda: runner.model.codec.decode_window(codes, 1)}
        for name, fn in variants.items():
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            path = os.path.join(out_dir, f"trace_{name}_b{b}.json")
            prof.export_chrome_trace(path)
            with open(path) as f:
                events = json.load(f)["traceEvents"]
            kern = [e for e in events if e.get("cat") == "kernel"]
            stat: dict[str, Any] = {"kernels": len(kern)}
            if kern:
                stat["kernel_ms"] = sum(e["dur"] for e in kern) / 1000
                stat["span_ms"] = (max(e["ts"] + e["dur"] for e in kern) - min(e["ts"] for e in kern)) / 1000
                by: dict[str, list[float]] = {}
                for e in kern:
                    by.setdefault(e["name"][:90], []).append(e["dur"])
                top = sorted(by.items(), key=lambda kv: -sum(kv[1]))[:25]
                stat["top"] = [[k, len(v), round(sum(v) / 1000, 4)] for k, v in top]
            if not name.endswith("graph") or not runner.graphs:
                os.remove(path)  # keep the graph replays' traces only (files back from the device are limited)
            out[f"{name}_b{b}"] = stat
    return out


def prefill_costs(runner: Any, speaker: str | None) -> dict[str, float]:
    """ms to prefill one prompt of ~T tokens into a slot (graph replay in default+cudagraph): with its
    preparation (tokens and embeddings), and admitted already prepared as the scheduler does (`_admit`);
    and 8 prompts admitted together (one batched prefill)."""
    out = {}
    for words in (3, 12, 40):
        params = SynthesisParams(text=" ".join(["word"] * words), speaker=speaker, greedy=True, language="English",
                                 fixed_frames=8)
        prep = runner.model.prepare(params, runner.max_len)
        t = prep.prefill.embeds.shape[0]
        out[f"T{t}_ms"] = time_ms(lambda: runner.prefill(0, params), iters=10)
        out[f"T{t}_admit_ms"] = time_ms(lambda: runner.prefill_batch(0, [prep]), iters=10)
    if runner.S >= 8:
        ps = [SynthesisParams(text=PROMPTS[i], speaker=speaker, language="English", fixed_frames=8) for i in range(8)]
        out["x8_prompts_ms"] = time_ms(lambda: runner.prefill_batch(0, [runner.model.prepare(p, runner.max_len)
                                                                         for p in ps]), iters=10)
    return out | prepare_costs(runner.model, runner.max_len, speaker)


def prepare_costs(model: Any, max_len: int, speaker: str | None, burst: int = 64) -> dict[str, float]:
    """Host ms of preparing prompts (`TTSModel.prepare`, as a submitting thread runs it): one prompt (median),
    and `burst` threads released together, one prompt each, until the last is done: what a wave of
    closed-loop clients costs the host before their requests can be admitted."""
    ps = [SynthesisParams(text=PROMPTS[i % len(PROMPTS)], speaker=speaker, language="English", fixed_frames=8)
          for i in range(burst)]
    lengths = [model.prepare(p, max_len).prompt_len for p in ps]
    times = []
    for p in ps:
        t0 = time.perf_counter()
        model.prepare(p, max_len)
        times.append(1000 * (time.perf_counter() - t0))
    start, got = threading.Barrier(burst + 1, timeout=60), [None] * burst

    def one(i: int) -> None:
        start.wait()
        try:
            got[i] = model.prepare(ps[i], max_len).prompt_len
        except Exception as e:  # re-raised below, not lost in the thread
            got[i] = e

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(burst)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = 1000 * (time.perf_counter() - t0)
    if got != lengths:
        err = next((g for g in got if isinstance(g, Exception)), None)
        raise OmniTTSError(f"a burst's prompts were not all prepared as one at a time: {err or got}")
    return {"prepare_ms": sorted(times)[burst // 2], f"prepare_{burst}_threads_ms": wall}


def greedy_codes(runner: Any, n: int, frames: int, speaker: str | None) -> list[torch.Tensor]:
    """n greedy requests side by side for `frames` frames -> per-request codes [frames, 16]."""
    fill_slots(runner, n, speaker)
    out = np.stack([runner.step(n)[0] for _ in range(frames)])  # [frames, n, 16]
    return [torch.from_numpy(out[:, i]) for i in range(n)]


def first_diff(a: torch.Tensor, b: torch.Tensor) -> int | None:
    neq = (a != b).any(dim=1).nonzero()
    return int(neq[0]) if len(neq) else None


def load_test(model: Any, cfg: EngineConfig, mode: str, concurrency: Sequence[int], fixed_frames: int,
              num_prompts: int, say: Callable[[str], None], slots: Sequence[int] | None = None) -> dict[str, Any]:
    """bench's closed-loop figures for one mode through a real Engine over `model` with only that mode
    resident (admits up to max(concurrency), or each of `slots`)."""
    import dataclasses

    from omni_tts import Engine
    from omni_tts.engine.testing import summarize
    from omni_tts.tools.load import make_params, run_load

    out: dict[str, Any] = {}
    speaker = (model.speakers() or [None])[0]
    make = lambda i: make_params(i, speaker, fixed_frames)  # noqa: E731
    for i, c in enumerate(concurrency):
        s = min(slots[i] if slots else c, cfg.max_num_seqs)
        engine = Engine(model, dataclasses.replace(cfg, max_num_seqs=s, mode=mode, modes=[mode]))
        try:
            engine.wait_ready(mode)
            run_load(engine, c, c, make)  # warm-up, excluded
            records, wall = run_load(engine, c, max(num_prompts, c), make)
            key = str(c) if not slots else f"{c}@{s}slots"
            out[key] = summarize(records, wall)
            snap = engine.snapshot()
            out[key].update({k: getattr(snap, k) for k in ("steps", "chunk_decodes", "decode_calls", "decode_seconds")})
            say(f"{mode} concurrency {key}: {out[key]}")
        except Exception as e:
            out[str(c)] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            say(f"{mode} concurrency {c} FAILED: {out[str(c)]['error']}")
        finally:
            engine.shutdown()
    return out


def talker_at_kv_end(runner: Any, b: int) -> dict[int, float]:
    """ms per talker step of rows [:b] moved to the last position of each kv bucket (below the scratch one)."""
    out = {}
    for L in runner.kv_buckets:
        with testing.rows_at(runner, b, min(L, runner.scratch_pos) - 1):
            out[L] = time_ms(runner.step_fns(b, L)[1])
    return out


def measure_mode(runner: Any, buckets: Sequence[int], speaker: str | None, report: dict[str, Any],
                 say: Callable[[str], None]) -> dict[str, Any]:
    """Step costs per bucket (both sampling variants; per attention length where graphed) and prefill costs."""
    mode = runner.mode.value
    fill_slots(runner, max(buckets), speaker)
    row: dict[str, Any] = {"setup_s": report["seconds"], "actual_mode": report["mode"], "per_bucket": {},
                           "layer_kernels": testing.layer_kernels(runner), "notice": report.get("notice", "")}
    for b in buckets:
        cp, talker = runner.step_fns(b)
        row["per_bucket"][b] = {"cp_ms": time_ms(cp), "talker_ms": time_ms(talker), "kv_len": runner.kv_len(b),
                                "variant": "full sort" if runner.variant(b) else "top-k selection"}
        cp_s, talker_s = testing.step_fns(runner, b, sort=True)  # the full-sort variant (top-p without top-k)
        row["per_bucket"][b].update(cp_ms_full_sort=time_ms(cp_s), talker_ms_full_sort=time_ms(talker_s))
        if runner.graphs:  # the talker step's cost against the attention length: each bucket's graph
            row["per_bucket"][b]["talker_ms_by_kv_len"] = {  # with the rows at their prompts' positions
                L: time_ms(runner.step_fns(b, L)[1]) for L in runner.kv_buckets}
            row["per_bucket"][b]["talker_ms_at_kv_end"] = talker_at_kv_end(runner, b)  # rows that long
        say(f"{mode} b={b}: {row['per_bucket'][b]}")
    row["prefill"] = prefill_costs(runner, speaker)
    return row


def run(cfg: EngineConfig, modes: Sequence[str], frames: int, say: Callable[[str], None],
        load: dict[str, Any] | None = None, out_json: str | None = None, profile_dir: str | None = None,
        profile_buckets: Sequence[int] = (1,), skip_codec: bool = False) -> dict[str, Any]:
    """Every mode's runner in turn over one loaded model with `cfg`'s slots and buckets."""
    from omni_tts.engine.testing import load_model

    buckets = cfg.resolved_buckets()
    t0 = time.perf_counter()
    tts = load_model(cfg, progress=say)
    say(f"loaded in {time.perf_counter() - t0:.1f} s")
    impls = testing.StepImpls(tts, cfg)  # one set of compiled units for every mode's runner, as the engine shares them
    impls.configure_kernels(cfg.resolved_buckets(), tts.dtype)
    speaker = (tts.speakers() or [None])[0]
    result: dict[str, Any] = {**provenance(), "buckets": list(buckets), "modes": {},
                              "codec": {} if skip_codec else codec_costs(tts, cfg.resolved_codec_precision(True))}
    say(f"codec decode_window costs (ms): {result['codec']}")
    ref: list[torch.Tensor] | None = None
    agree_n = min(4, max(buckets))
    for mode in modes:
        runner = None
        try:
            if torch.cuda.is_available():
                torch.cuda.reset_peak_memory_stats()
            runner = testing.mode_runner(tts, cfg, CompileMode.parse(mode), impls)
            row = measure_mode(runner, buckets, speaker, runner.warm(say), say)
            result["modes"][mode] = row
            _save(result, out_json)  # what is measured so far survives a run cut short
            codes = greedy_codes(runner, agree_n, frames, speaker)
            if ref is None:
                ref = codes
            diffs = [first_diff(a, r) for a, r in zip(codes, ref)]
            row["agree_with_first_mode"] = {"identical": sum(d is None for d in diffs), "of": len(diffs),
                                            "first_diff_frames": diffs}
            row["memory"] = gpu_memory(runner.device, runner.pool_bytes())
            if profile_dir and runner.graphs:
                try:
                    row["profile"] = profile_steps(runner, profile_buckets, profile_dir)
                except Exception as e:
                    row["profile"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            runner = None  # its slots and graphs are freed before an engine of the same mode is built
            if load and load["concurrency"] and mode in load.get("modes", [mode]):
                row["load"] = load_test(tts, cfg, mode, load["concurrency"], load["fixed_frames"],
                                        load["num_prompts"], say)
                _save(result, out_json)
            if load and load.get("stress_slots") and mode in load.get("stress_modes", [mode]):
                n = len(load["stress_slots"])
                row["stress"] = load_test(tts, cfg, mode, [load["stress_clients"]] * n, load["fixed_frames"],
                                          load["stress_clients"], say, slots=load["stress_slots"])
        except Exception as e:  # a mode that fails is a result
            row = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            say(f"{mode} FAILED: {row['error']}")
        result["modes"][mode] = row
        _save(result, out_json)
    return result


def _save(result: dict[str, Any], out_json: str | None) -> None:
    if out_json:
        with open(out_json, "w") as f:
            json.dump(result, f, indent=1)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_engine_flags(ap, preset="bench")
    ap.add_argument("--modes", default=None, help="comma-separated (default: every mode this device runs)")
    ap.add_argument("--buckets", type=int, nargs="+", default=[1, 8, 16, 32, 64])
    ap.add_argument("--frames", type=int, default=40)
    ap.add_argument("--json", default=None)
    ap.add_argument("--load-concurrency", type=int, nargs="*", default=[],
                    help="also run bench's closed loop at these concurrencies in each mode (same process)")
    ap.add_argument("--fixed-frames", type=int, default=75)
    ap.add_argument("--num-prompts", type=int, default=12)
    ap.add_argument("--stress-slots", type=int, nargs="*", default=[],
                    help="then --stress-clients concurrent requests with max_num_seqs = each of these")
    ap.add_argument("--stress-clients", type=int, default=64)
    ap.add_argument("--load-modes", default=None, help="modes that get the load/stress runs (default: all)")
    ap.add_argument("--skip-codec", action="store_true", help="do not time the codec's decode windows")
    ap.add_argument("--stress-modes", default=None, help="modes that get the stress runs (default: all)")
    ap.add_argument("--profile-dir", default=None, help="CUDA only: profile one step per --profile-buckets here")
    ap.add_argument("--profile-buckets", type=int, nargs="*", default=[1, 32])


def main(args: argparse.Namespace) -> int:
    # the runners' slots: the largest bucket, with exactly these buckets
    cfg = engine_config(args, mode="eager", max_num_seqs=max(args.buckets), buckets=list(args.buckets))
    modes = device_modes(cfg, args.modes)
    load = {"concurrency": args.load_concurrency, "fixed_frames": args.fixed_frames,
            "num_prompts": args.num_prompts, "stress_slots": args.stress_slots,
            "stress_clients": args.stress_clients}
    if args.load_modes:
        load["modes"] = args.load_modes.split(",")
    if args.stress_modes:
        load["stress_modes"] = args.stress_modes.split(",")
    res = run(cfg, modes, args.frames, progress(), load, args.json, args.profile_dir, args.profile_buckets,
              args.skip_codec)
    print(json.dumps(res, indent=1))
    return 0
