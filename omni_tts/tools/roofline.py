"""Each part of a frame against the GPU's memory bandwidth and its arithmetic peak, and how busy the GPU
is under load.

    omni-tts roofline --model DIR [--preset bench] [--mode M] [--rows 1 8 32 64] [--peak-gbs G]
        [--peak-tflops 989] [--kv-len L] [--busy 32 64] [--frames 75] [--json OUT]

Per part and row count: time per call (CUDA events; perf_counter on a CPU), bytes read per call, achieved
GB/s and the share of `--peak-gbs` (the GPU's datasheet bandwidth: by default the H100's or H200's, from
the device's name, else the H200's); FLOPs per call,
achieved TFLOP/s and the share of the arithmetic peak in the precision the part's matmuls run in
(`--peak-tflops` is the dense bfloat16 tensor-core peak, H200: 989; TF32 and float32 scale from it).
Whichever share is higher says which roof a part is under. The byte model, from the model's actual
tensors (their element sizes as loaded):

- talker step: every parameter of the talker's decoder layers, final norm and codec head, once per call
  (a GEMV reads each weight once whatever the rows); other: each row's key/value cache over the
  attention length the step runs (`Runner.kv_len`: the fast path's bucket, or --kv-len), all layers.
- predictor frame (15 steps): the decoder layers and final norm fifteen times, the input projection once
  (the first step's; later steps take their input as a row of a fed table: `heads.fed_table`), each of the
  15 heads once; other: the code embeddings and fed rows are gathers, so 16 embedding rows and 14 fed
  rows per row. Its 16-position KV cache is left out (tiny).
- code-to-wave per call: a chunk of `chunk_frames` new frames well into a request, decoded from its
  carried state (`CodecDecoder.decode_carried`; timed on CUDA as the audio stage runs it, a replay of the
  engine's own chunk graph with the states gathered and copied back), batch = rows; every decoder
  parameter once per call (a decode runs every layer); other: every leaf module's input and output
  tensors once (the unfused module graph, counted with forward hooks on a one-row call and times the rows:
  each row's tensors are its own; the carried state is among the inputs), i.e. activations as eager ops
  would move them. Per frame = per call divided by the chunk's frames.

The FLOP model counts 2 per multiply-add of the matmuls and the attention (norms, activations, rope and
sampling are left out): the talker's and predictor's linear layers per token they run on (the predictor
runs its layers on 16 tokens a frame: two in its first step, one in each later step; one head a step)
and their attention as the eager reference computes it; the codec's convolutions, matmuls and attention
as `models.codec.costs.chunk_costs` counts them on the meta device.

GPU busy share (`--busy c...`, CUDA only): the engine's closed loop at concurrency c under torch.profiler
(tools.gpu_busy: the busy share, the idle gaps by length, the kernels around the longer ones and what the
engine's host threads did during them). Owns the byte model and the table; the timing is tools.timing's,
the slot filling tools.microbench's.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn

from omni_tts.engine.codec_graphs import CarriedChunkGraphs
from omni_tts.models.codec.costs import chunk_costs
from omni_tts.tools.args import add_engine_flags, engine_config, run_to_json
from omni_tts.tools.gpu_busy import busy_share, report
from omni_tts.tools.microbench import fill_slots, step_callables
from omni_tts.tools.provenance import provenance
from omni_tts.tools.timing import carried_chunk, graphed_chunk, time_ms

PARTS = ("talker step", "predictor frame", "code-to-wave")


STEADY_HISTORY_FRAMES = 100  # a chunk this far into a request: the codec's attention window is full

# datasheet HBM bandwidth (GB/s) of the SXM parts, by a word of the device's name
PEAK_GBS = {"H200": 4800.0, "H100": 3350.0}
# Dense arithmetic peaks relative to bfloat16's (Hopper datasheet): what a part's matmuls run in.
PEAK_SHARE_OF_BF16 = {"bfloat16": 1.0, "float16": 1.0, "tf32": 0.5, "float32": 67 / 989}


def nbytes(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def talker_bytes(model: Any, rows: int, kv_len: int) -> tuple[int, int]:
    """(weight bytes, KV bytes) one talker decode step reads for `rows` rows over kv_len positions."""
    t = model.talker
    weights = nbytes(p for m in (t.layers, t.norm, t.codec_head) for p in m.parameters())
    elt = t.codec_head.weight.element_size()
    kv = rows * kv_len * t.num_layers * 2 * t.num_kv_heads * t.head_dim * elt
    return weights, kv


def predictor_bytes(model: Any, rows: int) -> tuple[int, int]:
    """(weight bytes, embedding- and fed-row bytes) one 15-step predictor frame reads for `rows` rows."""
    cp = model.code_predictor
    steps = cp.num_groups - 1
    per_step = nbytes(p for m in (cp.layers, cp.norm) for p in m.parameters())
    weights = steps * per_step + nbytes(p for m in (cp.small_to_mtp_projection, cp.lm_head) for p in m.parameters())
    emb = cp.codec_embedding[0].weight
    fed = (steps - 1) * cp.hidden_size * emb.element_size()
    return weights, rows * ((steps + 1) * emb.shape[1] * emb.element_size() + fed)


def linear_flops(tokens: int, *modules: nn.Module) -> int:
    """2 per multiply-add of every nn.Linear inside `modules`, each applied to `tokens` tokens."""
    return 2 * tokens * sum(m.weight.numel() for mod in modules for m in mod.modules() if isinstance(m, nn.Linear))


def attention_flops(rows: int, stack: Any, query_key_pairs: int) -> int:
    """q.k and p.v of every layer of a decoder stack over `query_key_pairs` (query, key) pairs a row."""
    heads = stack.layers[0].self_attn.heads
    return 4 * rows * stack.num_layers * heads * stack.head_dim * query_key_pairs


def talker_flops(model: Any, rows: int, kv_len: int) -> int:
    """One talker decode step of `rows` rows attending over kv_len positions, with its codec head."""
    t = model.talker
    return linear_flops(rows, t.layers, t.codec_head) + attention_flops(rows, t, kv_len)


def predictor_flops(model: Any, rows: int) -> int:
    """One 15-step predictor frame of `rows` rows: 16 tokens through the layers and the input projection
    (the first step's two attend over both, each later one over all before it), one head a step."""
    cp = model.code_predictor
    tokens = cp.num_groups
    pairs = 2 * 2 + sum(range(3, tokens + 1))
    layers = linear_flops(rows * tokens, cp.layers, cp.small_to_mtp_projection)
    return layers + linear_flops(rows, cp.lm_head) + attention_flops(rows, cp, pairs)  # each head on one token


def precision_of(model: Any) -> str:
    """The precision the talker's and predictor's matmuls run in (their weights' dtype)."""
    dtype = model.talker.codec_head.weight.dtype
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(dtype, "float32")


def codec_bytes(codec: Any, call: Callable[[], Any]) -> tuple[int, int]:
    """(weight bytes, activation bytes) of one `call()` of the codec: every parameter once, and the leaf
    modules' inputs and outputs counted by forward hooks on the unfused module graph (the fused flag is
    restored after)."""
    counts = [nbytes(codec.parameters()), 0]

    def hook(module: torch.nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        if not any(True for _ in module.children()):  # leaf: its inputs and outputs move through memory
            moved = [*args, *kwargs.values(), *(out if isinstance(out, (tuple, list)) else (out,))]
            counts[1] += nbytes(x for x in moved if isinstance(x, torch.Tensor))

    fused = codec.fused
    handles = [m.register_forward_hook(hook, with_kwargs=True) for m in codec.modules()]
    try:
        codec.set_fused(False)
        call()
    finally:
        for h in handles:
            h.remove()
        codec.set_fused(fused)
    return counts[0], counts[1]


def _row(part: str, rows: int, frames: int, ms: float, moved: tuple[int, int], flops: int, peaks: tuple[float, float],
         precision: str, **extra: Any) -> dict[str, Any]:
    """A table row; moved: (weight bytes, other bytes); peaks: (GB/s, bfloat16 TFLOP/s)."""
    weights, other = moved
    seconds = ms / 1000
    gbs = (weights + other) / seconds / 1e9 if ms > 0 else 0.0
    tflops = flops / seconds / 1e12 if ms > 0 else 0.0
    peak_tflops = peaks[1] * PEAK_SHARE_OF_BF16[precision]
    return {"part": part, "rows": rows, "frames_per_call": frames, "ms_per_call": ms, "ms_per_frame": ms / frames,
            "weight_bytes": weights, "other_bytes": other, "gb_per_s": gbs, "peak_share": gbs / peaks[0],
            "flops": flops, "tflop_per_s": tflops, "precision": precision, "peak_tflop_per_s": peak_tflops,
            "compute_share": tflops / peak_tflops, **extra}


def measure_parts(runner: Any, config: Any, rows: Sequence[int], peaks: tuple[float, float],
                  say: Callable[[str], None], iters: int = 20, kv_len: int | None = None,
                  graphs: CarriedChunkGraphs | None = None) -> list[dict[str, Any]]:
    """A row per (part, rows) on a warm runner (slots filled with real prefilled requests); the talker
    attends over kv_len positions (default: what the rows' prompts need); peaks: (GB/s, bfloat16 TFLOP/s);
    graphs: the engine's continuing-chunk graphs, which code-to-wave replays as the audio stage does (None:
    it decodes eagerly, as an engine without them does)."""
    model = runner.model
    fill_slots(runner, max(rows), (model.speakers() or [None])[0])
    precision = precision_of(model)
    frames = config.chunk_frames
    # a chunk's activations are its rows' own: counted on one row, an eager decode of every row count
    # would need many times the memory the graphs do
    weights, per_row = codec_bytes(model.codec, carried_chunk(model.codec, 1, STEADY_HISTORY_FRAMES, frames))
    out = []
    for b in rows:
        cp, talker = step_callables(runner, b, kv_len)
        kv = kv_len or runner.kv_len(b)
        out.append(_row("talker step", b, 1, time_ms(talker, iters), talker_bytes(model, b, kv),
                        talker_flops(model, b, kv), peaks, precision, kv_len=kv))
        out.append(_row("predictor frame", b, 1, time_ms(cp, iters), predictor_bytes(model, b),
                        predictor_flops(model, b), peaks, precision))
        flops = chunk_costs(model.ckpt.codec_config, b, frames).flops
        graphed = graphs is not None and frames in graphs.lengths and b <= graphs.buckets[-1]  # as the engine
        chunk = (graphed_chunk(graphs, model.codec, b, STEADY_HISTORY_FRAMES, frames) if graphed
                 else carried_chunk(model.codec, b, STEADY_HISTORY_FRAMES, frames))
        ms = time_ms(chunk, max(1, iters // 2))
        out.append(_row("code-to-wave", b, frames, ms, (weights, b * per_row), flops, peaks, model.codec.precision,
                        graphed=graphed))
        say(" | ".join(f"{r['part']} {r['ms_per_call']:.3f} ms" for r in out[-3:]) + f" (rows {b})")
    return out


def table(rows: Sequence[dict[str, Any]], peak_gbs: float) -> str:
    """The markdown roofline table: bytes against `peak_gbs`, FLOPs against each row's arithmetic peak."""
    head = ["part", "rows", "frames/call", "ms/call", "ms/frame", "weights MB", "other MB", "GB/s",
            f"% of {peak_gbs:.0f} GB/s", "GFLOP/call", "TFLOP/s", "% of compute peak (precision)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append(f"| {r['part']} | {r['rows']} | {r['frames_per_call']} | {r['ms_per_call']:.3f} | "
                     f"{r['ms_per_frame']:.3f} | {r['weight_bytes'] / 1e6:.1f} | {r['other_bytes'] / 1e6:.1f} | "
                     f"{r['gb_per_s']:.1f} | {100 * r['peak_share']:.1f} | {r['flops'] / 1e9:.2f} | "
                     f"{r['tflop_per_s']:.1f} | {100 * r['compute_share']:.1f} ({r['precision']}) |")
    return "\n".join(lines)


def measured_config(args: argparse.Namespace, slots: int) -> Any:
    """The engine flags' config with --mode as the only resident mode, and `slots` slots."""
    cuda = torch.cuda.is_available()
    mode = args.mode or ("default+cudagraph" if cuda else "eager")
    return engine_config(args, mode=mode, modes=[mode], max_num_seqs=slots)


def default_peak_gbs(device_name: str) -> float:
    """The datasheet bandwidth of the GPU named `device_name` (PEAK_GBS), the H200's for any other."""
    return next((v for k, v in PEAK_GBS.items() if k in device_name.upper()), PEAK_GBS["H200"])


def run(args: argparse.Namespace, say: Callable[[str], None]) -> dict[str, Any]:
    from omni_tts import Engine
    from omni_tts.errors import OmniTTSError
    from omni_tts.tools.load import make_params

    if min([*args.rows, *args.busy, args.iters]) < 1:
        raise OmniTTSError("--rows, --busy and --iters take positive integers")
    if args.peak_gbs is None:
        args.peak_gbs = default_peak_gbs(torch.cuda.get_device_name() if torch.cuda.is_available() else "")
    if min(args.peak_gbs, args.peak_tflops) <= 0:
        raise OmniTTSError("--peak-gbs and --peak-tflops take positive numbers")
    busy = list(args.busy or [])
    if busy and not torch.cuda.is_available():
        say("--busy skipped: the GPU busy share needs CUDA (torch.profiler's kernel trace)")
        busy = []
    config = measured_config(args, max([*args.rows, *busy]))
    engine = Engine.from_config(config, progress=say, wait=True)
    try:
        sched = engine.schedulers[engine.default_mode]
        if sched.state != "ready":
            raise OmniTTSError(f"mode {engine.default_mode.value} did not warm: {sched.error}")
        speaker = (engine.speakers() or [None])[0]
        make = lambda i: make_params(i, speaker, args.frames)  # noqa: E731
        res: dict[str, Any] = {**provenance(), "mode": engine.default_mode.value, "peak_gbs": args.peak_gbs,
                               "peak_tflops_bf16": args.peak_tflops,
                               "busy": [busy_share(engine, c, args.busy_requests or 4 * c, make) for c in busy]}
        if args.busy and not busy:
            res["busy_skipped"] = "needs CUDA"
        res["rows"] = measure_parts(sched.runner, config, args.rows, (args.peak_gbs, args.peak_tflops), say,
                                    args.iters, args.kv_len, sched.audio.carried)
        return res
    finally:
        engine.shutdown()


def add_arguments(ap: argparse.ArgumentParser) -> None:
    add_engine_flags(ap, "bench")
    ap.add_argument("--mode", default=None, help="compile mode measured (default: default+cudagraph, eager on CPU)")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64], help="rows per call")
    ap.add_argument("--peak-gbs", type=float, default=None,
                    help="the GPU's peak memory bandwidth, GB/s (default: the H100's or H200's by the device's name)")
    ap.add_argument("--peak-tflops", type=float, default=989.0,
                    help="the GPU's dense bfloat16 tensor-core peak, TFLOP/s (TF32: half; float32 scaled)")
    ap.add_argument("--busy", type=int, nargs="*", default=[], metavar="C",
                    help="also the GPU busy share under the closed loop at these concurrencies (CUDA)")
    ap.add_argument("--busy-requests", type=int, default=0, help="requests per busy run (default 4 x C)")
    ap.add_argument("--frames", type=int, default=75, help="frames per request in the busy runs")
    ap.add_argument("--kv-len", type=int, default=None,
                    help="talker attention length (one of the runner's KV buckets; default: what the prompts need)")
    ap.add_argument("--iters", type=int, default=20, help="timed calls per figure (the median is kept)")
    ap.add_argument("--json", default=None)


def main(args: argparse.Namespace) -> int:
    res = run_to_json(args, run)
    print(table(res["rows"], args.peak_gbs))
    for b in res["busy"]:
        print(report(b))
    if res.get("busy_skipped"):
        print(f"GPU busy share skipped: {res['busy_skipped']}")
    return 0
