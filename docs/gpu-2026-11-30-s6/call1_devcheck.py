"""Device check (sixth session, calls 1-2): the choice kernel's sort-free top-k path against
omni_tts.sampling.choose (bf16 logits: many ties) and its cost; the codec's 32-row window with cuDNN's
heuristics vs cudnn.benchmark, and where its time goes. argv: out.json checkpoint [choose|codec|all]."""
import json, sys, time
import torch
from omni_tts import head_kernels, sampling

dev = torch.device("cuda")
res = {}


def graph_ms(fn, reps=20):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record(); b.synchronize()
    return a.elapsed_time(b) / reps, out


PARTS = sys.argv[3] if len(sys.argv) > 3 else "all"


def choice_kernel():
    V, D = 2048, 2048
    table = torch.randn(V, D, device=dev, dtype=torch.bfloat16)
    kinds = {"k50_t0.9": sampling.RowSettings(greedy=False, temperature=0.9, top_k=50),
             "k50_p0.8": sampling.RowSettings(greedy=False, temperature=0.9, top_k=50, top_p=0.8),
             "k1": sampling.RowSettings(greedy=False, temperature=1.0, top_k=1),
             "k64": sampling.RowSettings(greedy=False, temperature=1.3, top_k=64),
             "k7_t0.5": sampling.RowSettings(greedy=False, temperature=0.5, top_k=7),
             "greedy": sampling.RowSettings(greedy=True)}
    torch.manual_seed(0)
    same = total = 0
    for B in (1, 8, 32):
        rows = [list(kinds.values())[i % len(kinds)] for i in range(B)]
        sp = sampling.SlotParams.from_settings(rows, dev).rows(B, topk_cap=64)
        for f in range(60):
            logits = (torch.randn(B, V, device=dev) * (1 + f % 4)).to(torch.bfloat16)  # bf16: ties
            seed, frame = torch.arange(B, device=dev) * 7 + f, torch.full((B,), f, device=dev)
            got = head_kernels.choose(logits, sp, seed, frame, 1 + f % 15, table, torch.zeros(B, D, device=dev), True)
            want = sampling.choose(logits.float(), sp, seed, frame, 1 + f % 15)
            same += int((got == want).sum()); total += B
    res["choose_same_rows"], res["choose_rows"] = same, total
    print("choice kernel vs sampling.choose:", same, "/", total, flush=True)
    from omni_tts import kernel_configs
    for name, row, free in (("topk_only", kinds["k50_t0.9"], True), ("topk_sorted", kinds["k50_t0.9"], False),
                            ("topp_sort", kinds["k50_p0.8"], True)):
        kernel_configs.CHOOSE_SORT_FREE = free
        for B in (1, 8, 32):
            sp = sampling.SlotParams.from_settings([row] * B, dev).rows(B, topk_cap=64)
            logits = (torch.randn(B, V, device=dev) * 2).to(torch.bfloat16)
            seed, frame = torch.arange(B, device=dev), torch.zeros(B, dtype=torch.long, device=dev)
            esum = torch.zeros(B, D, device=dev)
            t, _ = graph_ms(lambda: [head_kernels.choose(logits, sp, seed, frame, j + 1, table, esum, False)
                                     for j in range(15)][-1])
            res[f"choose_{name}_b{B}_15x_ms"] = t
            print(f"choose {name} b{B}: {t:.4f} ms for 15", flush=True)

    kernel_configs.CHOOSE_SORT_FREE = True



if PARTS in ("choose", "all"):
    choice_kernel()
if PARTS == "choose":
    json.dump(res, open(sys.argv[1], "w"), indent=1)
    raise SystemExit(0)

# --- 2. codec windows: cuDNN heuristics vs benchmark, and a profile
from omni_tts.checkpoint import open_checkpoint
from omni_tts.code2wav import fuse_codec
from omni_tts.codec import CodecDecoder

codec = CodecDecoder.from_checkpoint(open_checkpoint(sys.argv[2])).to(dev).eval().set_precision("tf32")
print("codec fuse:", fuse_codec(codec) or "on", flush=True)


def window_ms(b, ctx, n, iters=5):
    codes = torch.randint(0, 2048, (b, ctx + n, 16), device=dev)
    codec.decode_window(codes, ctx); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        codec.decode_window(codes, ctx)
    torch.cuda.synchronize()
    return 1000 * (time.perf_counter() - t0) / iters


for bench_on in (False, True):
    torch.backends.cudnn.benchmark = bench_on
    for b, ctx in ((1, 26), (8, 26), (32, 26), (32, 51)):
        res[f"codec_b{b}_c{ctx}_n25_bench{int(bench_on)}_ms"] = window_ms(b, ctx, 25)
        print(f"codec b{b} ctx{ctx} n25 benchmark={bench_on}: {res[f'codec_b{b}_c{ctx}_n25_bench{int(bench_on)}_ms']:.1f} ms", flush=True)
torch.backends.cudnn.benchmark = False
for b in (32, 1):
    codes = torch.randint(0, 2048, (b, 51, 16), device=dev)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        codec.decode_window(codes, 26); torch.cuda.synchronize()
    table_txt = prof.key_averages().table(sort_by="cuda_time_total", row_limit=12)
    print(table_txt, flush=True)
    res[f"codec_profile_b{b}"] = table_txt
json.dump(res, open(sys.argv[1], "w"), indent=1)
