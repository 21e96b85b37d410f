"""Device check (scratch): talker decode attention vs SDPA; sampling-kernel warps -> kc.json."""
import json, sys
import torch
from omni_tts import head_kernels, kernel_configs, sampling, talker_kernels
from omni_tts.talker import gqa_attention, rms_norm

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

torch.manual_seed(0)
for B in (1, 8, 32):
    for L in (128, 1025):
        q = torch.randn(B, 16, 1, 128, device=dev, dtype=torch.bfloat16)
        kc = torch.randn(B, 8, 1025, 128, device=dev, dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        pos = torch.randint(0, L, (B,), device=dev)
        mask = (torch.arange(L, device=dev)[None, :] <= pos[:, None])[:, None, None]
        t_k, got = graph_ms(lambda: [talker_kernels.decode_attention(q, kc, vc, pos, L) for _ in range(28)][-1])
        t_s, ref = graph_ms(lambda: [gqa_attention(q, kc[:, :, :L], vc[:, :, :L], mask) for _ in range(28)][-1])
        err = ((got.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
        res[f"attn_b{B}_L{L}"] = {"triton_28x_ms": t_k, "sdpa_28x_ms": t_s, "rel_err": err}
        print("attn", B, L, res[f"attn_b{B}_L{L}"], flush=True)

V, d, D = 2048, 1024, 2048
W = (torch.randn(V, d, device=dev) * 0.05).to(torch.bfloat16)
head = torch.nn.Linear(d, V, bias=False, device=dev, dtype=torch.bfloat16); head.weight.data.copy_(W)
normw = torch.nn.Parameter(torch.ones(d, device=dev, dtype=torch.bfloat16))
norm = type("N", (), {"weight": normw, "eps": 1e-6})()
table = torch.randn(V, D, device=dev, dtype=torch.bfloat16)
rows = [sampling.RowSettings(greedy=False, temperature=0.9, top_k=50)]
best, codes = {}, {}
for w in (4, 8, 16):
    kernel_configs.CHOOSE_WARPS = w
    tot = 0.0
    for B in (1, 32):
        sp = sampling.SlotParams.from_settings(rows * B, dev).rows(B, topk_cap=64)
        x = torch.randn(B, 1, d, device=dev, dtype=torch.bfloat16)
        seed, frame = torch.arange(B, device=dev) + 11, torch.full((B,), 2, device=dev)
        esum = torch.zeros(B, D, device=dev)
        t, c = graph_ms(lambda: [head_kernels.head_choose(norm, head, x, sp, seed, frame, j + 1, table, esum, True)
                                 for j in range(15)][-1])
        codes.setdefault(B, c.clone())
        res[f"choose_w{w}_b{B}_15x_ms"] = t
        res[f"choose_w{w}_b{B}_same"] = bool(torch.equal(codes[B], c))
        tot += t if torch.equal(codes[B], c) else 1e9
    best[w] = tot
    print("choose warps", w, {k: v for k, v in res.items() if k.startswith(f"choose_w{w}")}, flush=True)
pick = min(best, key=best.get)
res["choose_warps_pick"] = pick
json.dump({"choose_warps": pick}, open(sys.argv[2], "w"))
json.dump(res, open(sys.argv[1], "w"), indent=1)
print("pick", pick)
