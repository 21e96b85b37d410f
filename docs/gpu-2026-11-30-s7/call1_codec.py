"""Device check (seventh session, call 1): the codec's vocoder with the bias and residual adds inside the
Triton snake kernels (CodecDecoder._vocode_pending, the new CUDA path) against the module path it
replaces (every SnakeBeta still the Triton kernel): window wall time at 1 / 8 / 32 rows, the largest
difference of their audio, and a kernel profile of the 32-row window. argv: out.json checkpoint."""
import json, sys, time, types
import torch
import omni_tts.codec as codec_mod
from omni_tts.checkpoint import open_checkpoint
from omni_tts.code2wav import fuse_codec
from omni_tts.codec import CodecDecoder

dev = torch.device("cuda")
res = {}
codec = CodecDecoder.from_checkpoint(open_checkpoint(sys.argv[2])).to(dev).eval().set_precision("tf32")
print("codec fuse:", fuse_codec(codec) or "on", flush=True)
real = codec_mod.codec_kernels
off = types.SimpleNamespace(available=lambda: False)  # _vocode's check only: the snakes stay Triton


def window_ms(codes, ctx, iters=5):
    codec.decode_window(codes, ctx); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        out = codec.decode_window(codes, ctx)
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / iters, out


for b in (1, 8, 32):
    codes = torch.randint(0, 2048, (b, 51, 16), device=dev)
    for name, mod in (("modules", off), ("pending", real), ("modules_again", off), ("pending_again", real)):
        codec_mod.codec_kernels = mod
        ms, out = window_ms(codes, 26)
        res[f"b{b}_{name}_ms"] = ms
        res.setdefault(f"b{b}_out", {})[name] = out
    o = res.pop(f"b{b}_out")
    res[f"b{b}_maxdiff"] = float((o["pending"] - o["modules"]).abs().max())
    res[f"b{b}_absmax"] = float(o["modules"].abs().max())
    print(f"codec b{b} ctx26 n25: modules {res[f'b{b}_modules_ms']:.1f} / {res[f'b{b}_modules_again_ms']:.1f} ms, "
          f"pending {res[f'b{b}_pending_ms']:.1f} / {res[f'b{b}_pending_again_ms']:.1f} ms, max diff "
          f"{res[f'b{b}_maxdiff']:.2e} (audio max {res[f'b{b}_absmax']:.3f})", flush=True)
codec_mod.codec_kernels = real
for b in (32,):
    codes = torch.randint(0, 2048, (b, 51, 16), device=dev)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        codec.decode_window(codes, 26); torch.cuda.synchronize()
    table_txt = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14)
    print(table_txt, flush=True)
    res[f"profile_b{b}_pending"] = table_txt
json.dump(res, open(sys.argv[1], "w"), indent=1)
