"""Launch-config sweep of omni_tts.kernels.projection's kernel on this GPU, written as a JSON that
the preset key kernel_configs loads (and that kernel_configs.TUNED is updated from).

    omni-tts kernel-sweep [--size 1.7B] [--parts predictor talker] [--rows 1 2 8 16 32 64 128]
        [--no-pdl] [--quick] [--in-layer] [--talker-kernel-rows N] [--talker-pdl-rows N] [--fold-rows N]
        [--out kernel_configs.json]

Owns: the candidate configs per row count, timing each of a decoder layer's four projections (q|k|v
after the input norm, o + residual, gate|up after the post norm with SiLU, down + residual; a norm
folded into the weight from kernel_configs.FOLD_ROWS rows, as a layer step runs it; the code
predictor's and / or the talker's shapes) per candidate, launched as the engine launches them (with
programmatic dependent launch where the GPU has it: the predictor's always, the talker's up to
kernel_configs.TALKER_PDL_ROWS), in a CUDA graph of back-to-back launches whose weights rotate through
enough copies to overflow the L2 cache (inside a frame 150 MB of predictor weights stream from HBM; a
sweep that keeps one copy hot in a 50 MB L2 picks configs for the wrong regime),
and the choice of the fastest per (rows, shape); with --in-layer, each candidate timed inside whole layer steps
instead (under PDL a kernel overlaps the ones before it, which differ in a frame).
Weights are random at the size's shapes (values don't change speed).
Knows nothing about the engine, requests or graphs pools.
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from omni_tts.engine.cuda_graphs import BucketedGraph, GraphPool
from omni_tts.errors import OmniTTSError
from omni_tts.kernels import configs as kernel_configs
from omni_tts.kernels import layers as kernels
from omni_tts.kernels import projection as proj_kernels
from omni_tts.kernels import talker as talker_kernels
from omni_tts.models.compiled.packed_weights import fuse_layer
from omni_tts.tools.args import progress

Config = kernel_configs.Config
Picks = dict[tuple[int, int, int], Config]  # (rows, n, K) -> the fastest config
MAS_ROWS = 8  # multiply-and-sum tiles (no tensor cores) are offered up to this many rows
WHOLE_ROW_TC_K = 1024  # sm_90: a 16-row bfloat16 tensor-core tile of 2,048 columns spills registers


def candidates(rows: int, quick: bool = False, K: int | None = None) -> list[Config]:
    """(BN, BK, stages, warps, multiply-and-sum) to try for `rows` rows: tensor-core tiles always (wider and
    shorter ones above 32 rows), narrow multiply-and-sum tiles up to MAS_ROWS rows (`quick`: 4 warps only and
    multiply-and-sum up to 2 rows, where the full sweep's picks fall). With the input width K, up to MAS_ROWS
    rows also whole-row tiles (BK >= K: a program's weights are one tile, all of it loaded
    before a PDL launch waits for the previous kernel; from 2 rows each input row in turn against it), and
    2..16 rows tensor-core tiles of whole rows where K <= WHOLE_ROW_TC_K (wider rows spill registers); one row
    also one-weight-row tiles, whole-row tiles on one or two warps and pipelined loops over pieces of 1,024 or
    2,048 columns. From 32 rows, 4-stage tensor-core tiles also with fewer rows a program (16 or 32: the rows
    split over more programs, more SMs streaming the same weights)."""
    warps = (4,) if quick else (4, 8)
    wide = rows > 32  # 64-row tiles: wider weight tiles, shorter steps (shared memory)
    bns, bks = ((16, 32, 64), (64, 128, 256)) if wide else ((16, 32), (128, 256))
    out = [(bn, bk, st, wp, False) for bn, bk, st, wp in itertools.product(bns, bks, (3, 4), warps)]
    if rows <= (2 if quick else MAS_ROWS):
        out += [(bn, bk, st, wp, True) for bn, bk, st, wp in itertools.product((2, 4, 8), (256, 512), (3, 4), warps)]
    if K is not None and rows <= MAS_ROWS:  # whole rows a program; one row also one weight row
        row_bns = (1, 2, 4, 8) if rows == 1 else (2, 4, 8)
        row_warps = (1, 2, 4, 8) if rows == 1 else (4, 8)  # one warp: its sums need no barrier across warps
        out += [(bn, kernel_configs.next_pow2(K), 1, wp, True) for bn, wp in itertools.product(row_bns, row_warps)]
    if K is not None and rows == 1:  # rows of 1-2K-column pieces in a pipelined loop
        out += [(bn, bk, st, wp, True) for bn, bk, st, wp in itertools.product((1, 2, 4), (1024, 2048), (2, 3), (4, 8))
                if bk < K]
    if K is not None and 2 <= rows <= 16 and K <= WHOLE_ROW_TC_K:
        out += [(bn, kernel_configs.next_pow2(K), 1, wp, False) for bn, wp in itertools.product((16, 32), warps)]
    caps = [bm for bm in (16, 32) if bm < min(proj_kernels.MAX_BM, kernel_configs.next_pow2(rows))]
    out += [(bn, bk, 4, wp, False, bm) for bn, bk, wp, bm in itertools.product((16, 32), bks, warps, caps)]
    return out


def fastest(timings: dict[Config, float]) -> Config:
    """The config with the least time (ties: the first listed)."""
    return min(timings, key=lambda c: timings[c])


def configs_json(best: Picks) -> dict[str, list]:
    """{(rows, n, K): config} -> the kernel_configs format ({"rows,n,K": [BN, BK, stages, warps, vec[, BM]]})."""
    return {f"{m},{n},{k}": list(cfg) for (m, n, k), cfg in sorted(best.items())}


def projection_shapes(layer: Any, w_qkv: torch.Tensor, w_gu: torch.Tensor) -> dict[str, tuple[int, int]]:
    """(output width n, input width K) of a decoder layer's four projections (w_*: fuse_layer(layer)'s)."""
    D, I = layer.mlp.down_proj.out_features, layer.mlp.down_proj.in_features  # noqa: E741 (the paper's names)
    return {"qkv": (w_qkv.shape[0], D), "o": (D, layer.self_attn.o_proj.in_features),
            "gate_up": (w_gu.shape[0] // 2, D), "down": (D, I)}


def _layer(size: str, part: str, device: torch.device, dtype: torch.dtype) -> Any:
    from omni_tts.models.checkpoint_maker import make_configs
    from omni_tts.models.layers import DecoderLayer

    cfg = make_configs(size)[0]["talker_config"]
    cfg, where = (cfg, "talker_config") if part == "talker" else (cfg["code_predictor_config"], "code_predictor_config")
    layer = DecoderLayer(cfg, where).to(device=device, dtype=dtype)
    for p in layer.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return layer


def _graph_us(fns: list[Callable[[], Any]], launches: int = 60, replays: int = 5) -> float:
    """Microseconds per launch: a CUDA graph of `launches` calls cycling through fns, replayed."""
    def frame() -> tuple[torch.Tensor, ...]:
        for i in range(launches):  # each output dropped at once, so the captures reuse one block
            out = fns[i % len(fns)]()
        return (out,)

    graph = BucketedGraph("kernel-sweep", lambda _rows: frame, [1], GraphPool(use_vllm=False))
    graph.capture()
    graph.run(1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.run(1)
    end.record()
    end.synchronize()
    graph.release()
    return start.elapsed_time(end) * 1000 / (replays * launches)


def _launch(x: torch.Tensor, w: torch.Tensor, n: int, cfg: Config, pdl: bool, args: dict[str, Any],
            fold: bool) -> torch.Tensor:
    """One projection as a layer step launches it (with `fold`, the predictor's, a normed one folded from
    kernel_configs.FOLD_ROWS rows: w stands in for its folded copy, the same shape)."""
    if "norm" in args and fold:
        rest = {k: v for k, v in args.items() if k != "norm"}
        return proj_kernels.normed_projection(x, w, args["norm"], n=n, cfg=cfg, pdl=pdl, w_folded=w, **rest)
    return proj_kernels.projection(x, w, n=n, cfg=cfg, pdl=pdl, **args)


def sweep(size: str, rows: Sequence[int], say: Callable[[str], None], parts: Sequence[str] = ("predictor",),
          pdl: bool = True, quick: bool = False, picked: Callable[[Picks], None] = lambda best: None,
          in_layer: bool = False) -> Picks:
    """The fastest config per (rows, shape); launches with PDL as the engine's: the predictor's at every row
    count, the talker's up to kernel_configs.TALKER_PDL_ROWS rows. `picked` gets the picks so far after each shape.
    `in_layer`: the picks by the whole layer step's time (`_sweep_in_layer`; the talker's up to
    kernel_configs.TALKER_KERNEL_ROWS rows, where its Triton layers run)."""
    best: Picks = {}
    pdl = pdl and proj_kernels.pdl_available(torch.device("cuda"))
    for part in parts:
        if in_layer:
            part_rows = [m for m in rows if part == "predictor" or m <= kernel_configs.TALKER_KERNEL_ROWS]
            _sweep_in_layer(size, part, part_rows, say, pdl, quick, best, picked)
            continue
        pdl_rows = (kernels.MAX_ROWS if part == "predictor" else kernel_configs.TALKER_PDL_ROWS) if pdl else 0
        _sweep_part(size, part, rows, say, pdl_rows, quick, best, picked)
    return best


def _sweep_in_layer(size: str, part: str, rows: Sequence[int], say: Callable[[str], None], pdl: bool, quick: bool,
                    best: Picks, picked: Callable[[Picks], None], dev: torch.device | None = None,
                    dt: torch.dtype = torch.bfloat16, timer: Callable[..., float] = _graph_us) -> None:
    """Each candidate of one projection timed inside a CUDA graph of whole layer steps (one position a row, the
    other projections at their entries or this sweep's picks so far), as a frame runs them: a kernel's cost
    there depends on the kernels before it (under PDL a whole-row tile loads its weights while they run),
    which launches after copies of itself do not show. `pdl`: the predictor's at every row count, the
    talker's up to kernel_configs.TALKER_PDL_ROWS rows, as the engine launches them."""
    dev = dev or torch.device("cuda")
    first = _layer(size, part, dev, dt)
    copies = _cold_copies(sum(p.numel() * p.element_size() for p in first.parameters()), dev)
    layers = [first] + [copy.deepcopy(first) for _ in range(copies - 1)]  # cold L2, as inside a frame
    packed = [fuse_layer(layer) for layer in layers]
    shapes: dict[tuple[int, int], str] = {}  # projections of one shape share its entry: timed together
    for name, shape in projection_shapes(first, packed[0][0], packed[0][2]).items():
        shapes[shape] = f"{shapes[shape]}, {name}" if shape in shapes else name
    for m in rows:
        on = pdl and (part == "predictor" or m <= kernel_configs.TALKER_PDL_ROWS)
        steps = _layer_steps(part, layers, packed, m, on)
        for (n, K), name in shapes.items():
            key = (kernel_configs.next_pow2(m), n, K)
            current = kernel_configs.config(m, n, K)
            timings: dict[Config, float] = {}
            for cfg in dict.fromkeys([current, *candidates(m, quick, K)]):
                try:
                    with kernel_configs.override({**best, key: cfg}):
                        timings[cfg] = timer(steps, launches=2 * copies)
                except Exception as e:  # a config the compiler rejects (e.g. out of shared memory)
                    say(f"  {name} rows={m} {cfg}: {type(e).__name__}")
            best[key] = fastest(timings)
            say(f"{part} rows={m} {name} [{n}x{K}] in the layer step ({copies} layer copies): "
                f"{timings[best[key]]:.2f} us with {best[key]}; current {current}: "
                f"{timings.get(current, float('nan')):.2f} us")
            picked(best)


def _cold_copies(nbytes: int, dev: torch.device) -> int:
    """How many copies of `nbytes` of weights a timed graph rotates through so that they overflow the L2 cache
    three times over (at least two)."""
    l2 = torch.cuda.get_device_properties(dev).L2_cache_size if dev.type == "cuda" else 0
    return max(2, math.ceil(3 * l2 / nbytes))


def _layer_steps(part: str, layers: list[Any], packed: list[tuple], m: int, pdl: bool) -> list[Callable[[], Any]]:
    """One layer step of m rows per layer copy, at one position a row, as the engine's Triton path launches it:
    the predictor's over its 16 cache positions, the talker's over a 128-position kv bucket."""
    first = layers[0]
    a, D, w = first.self_attn, first.input_layernorm.weight.shape[0], first.input_layernorm.weight
    P = 16 if part == "predictor" else 128
    x = torch.randn(m, 1, D, device=w.device, dtype=w.dtype)
    kc = torch.zeros(m, a.kv_heads, P, a.head_dim, device=w.device, dtype=w.dtype)
    vc = torch.zeros_like(kc)
    if part == "predictor":
        cos = torch.ones(1, P, a.head_dim, device=w.device, dtype=w.dtype)  # rope values do not change the speed
        return [functools.partial(kernels.predictor_layer, layer, *ws, x, cos, torch.zeros_like(cos), kc, vc,
                                  P // 2, pdl, (ws[0], ws[2])) for layer, ws in zip(layers, packed)]  # as folded
    cos = torch.ones(m, 1, a.head_dim, device=w.device, dtype=w.dtype)
    sin, pos = torch.zeros_like(cos), torch.full((m,), P // 2, dtype=torch.long, device=w.device)

    def step(layer: Any, ws: tuple) -> torch.Tensor:  # no allocation of its own beside the kernels' outputs
        att = talker_kernels.talker_attend(layer, ws[0], ws[1], x, cos, sin, kc, vc, pos, P, pdl)
        return talker_kernels.talker_attn_out(layer, ws[2], x, att, pdl)

    return [functools.partial(step, layer, ws) for layer, ws in zip(layers, packed)]


def _sweep_part(size: str, part: str, rows: Sequence[int], say: Callable[[str], None], pdl_rows: int, quick: bool,
                best: Picks, picked: Callable[[Picks], None]) -> None:
    dev, dt = torch.device("cuda"), torch.bfloat16
    layer = _layer(size, part, dev, dt)
    w_qkv, _, w_gu = fuse_layer(layer)
    dims = projection_shapes(layer, w_qkv, w_gu)
    shapes = {"qkv": (*dims["qkv"], w_qkv, dict(norm=layer.input_layernorm)),
              "o": (*dims["o"], layer.self_attn.o_proj.weight, dict(res=True)),
              "gate_up": (*dims["gate_up"], w_gu, dict(norm=layer.post_attention_layernorm, glu=True)),
              "down": (*dims["down"], layer.mlp.down_proj.weight, dict(res=True))}
    fold = part == "predictor"  # the talker's norms stay in the prologue
    for m in rows:
        for name, (n, K, w, kw) in shapes.items():
            copies = _cold_copies(w.numel() * w.element_size(), dev)
            ws = [w] + [w.clone() for _ in range(copies - 1)]  # cold L2, as inside a frame
            x = torch.randn(m, K, device=dev, dtype=dt)
            args = dict(kw, res=torch.randn(m, n, device=dev, dtype=dt)) if kw.get("res") else dict(kw)
            timings: dict[Config, float] = {}
            for cfg in candidates(m, quick, K):
                try:
                    timings[cfg] = _graph_us([lambda w=w_: _launch(x, w, n, cfg, m <= pdl_rows, args, fold)
                                              for w_ in ws])
                except Exception as e:  # a config the compiler rejects (e.g. out of shared memory)
                    say(f"  {name} rows={m} {cfg}: {type(e).__name__}")
            pick = fastest(timings)
            best[(kernel_configs.next_pow2(m), n, K)] = pick
            default = kernel_configs.config(m, n, K)
            say(f"{part} rows={m} {name} [{n}x{K}, {copies} weight copies]: {timings[pick]:.2f} us with {pick}; "
                f"current {default}: {timings.get(default, float('nan')):.2f} us")
            del ws
            picked(best)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--size", default="1.7B", help="layer shapes of this size (0.6B and 1.7B share the predictor's)")
    ap.add_argument("--parts", nargs="+", choices=("predictor", "talker"), default=["predictor", "talker"])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 8, 16, 32, 64, 128])
    ap.add_argument("--no-pdl", action="store_true", help="time launches without programmatic dependent launch")
    ap.add_argument("--quick", action="store_true", help="fewer candidates (4 warps only)")
    ap.add_argument("--in-layer", action="store_true",
                    help="time each candidate inside whole layer steps, as a frame runs them (the talker's up to "
                         "the rows its Triton layers serve)")
    ap.add_argument("--talker-kernel-rows", type=int, metavar="N",
                    help="run the talker's steps of up to N rows on the Triton layers (Inductor's above), in the "
                         "sweep and in the engine (written to the JSON; default: the table's)")
    ap.add_argument("--talker-pdl-rows", type=int, metavar="N",
                    help="time the talker's steps of up to N rows with programmatic dependent launch, as the engine "
                         "then launches them (written to the JSON; default: the table's)")
    ap.add_argument("--fold-rows", type=int, metavar="N",
                    help="the predictor's normed projections of N rows or more take the norm folded into their "
                         "weights (the prologue below), in the sweep and in the engine (written to the JSON; "
                         "default: the table's)")
    ap.add_argument("--out", default="kernel_configs.json")


def main(args: argparse.Namespace) -> int:
    say = progress()
    if args.talker_kernel_rows is not None and not 0 <= args.talker_kernel_rows <= kernels.MAX_ROWS:
        raise OmniTTSError(f"--talker-kernel-rows must be within 0..{kernels.MAX_ROWS}")
    talker_rows = kernel_configs.TALKER_KERNEL_ROWS if args.talker_kernel_rows is None else args.talker_kernel_rows
    if args.talker_pdl_rows is not None and not 0 <= args.talker_pdl_rows <= talker_rows:
        raise OmniTTSError(f"--talker-pdl-rows must be within 0..{talker_rows} (the talker's Triton rows)")
    if args.fold_rows is not None and not 1 <= args.fold_rows <= kernels.MAX_ROWS + 1:
        raise OmniTTSError(f"--fold-rows must be within 1..{kernels.MAX_ROWS + 1} ({kernels.MAX_ROWS + 1}: never)")
    if not torch.cuda.is_available() or not kernels.available():
        raise OmniTTSError("the kernel sweep needs CUDA and triton (it times the kernels on this GPU)")
    if any(not 1 <= m <= kernels.MAX_ROWS for m in args.rows):
        raise OmniTTSError(f"--rows must be within 1..{kernels.MAX_ROWS}")
    extra = {key: value for key, value in (("talker_kernel_rows", args.talker_kernel_rows),
                                           ("talker_pdl_rows", args.talker_pdl_rows),
                                           ("fold_rows", args.fold_rows)) if value is not None}
    kernel_configs.set_options(extra)  # as the engine will run with the JSON
    sweep(args.size, args.rows, say, args.parts, not args.no_pdl, args.quick,
          lambda best: write(best, args.out, extra), args.in_layer)
    say(f"wrote {args.out}: run with --set kernel_configs={args.out}")
    return 0


def write(best: Picks, path: str, extra: dict[str, Any] | None = None) -> None:
    """The picks so far, and `extra` keys (e.g. talker_pdl_rows), as `path` (rewritten after every shape: a
    sweep cut short keeps what it found)."""
    with open(path, "w") as f:
        json.dump({**configs_json(best), **(extra or {})}, f, indent=1)
