"""Device check (scratch, not committed): Triton layers with/without PDL, vs Inductor-path ops, and timings."""
import json
import sys

import torch

from omni_tts import kernels
from omni_tts.fastpath import predictor_layer, talker_attn_in, talker_attn_out, fuse_layer
from omni_tts.kernel_sweep import _layer
from omni_tts.talker import gqa_attention

dev = torch.device("cuda")
res = {"pdl_available": kernels.pdl_available(dev)}


def graph_ms(fn, reps=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fn()
    g.replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / reps, out, g


def pred_chain(layers, ws, x0, cos, sin, kcs, vcs, pdl, ref=False):
    x = x0
    for j in range(15):
        T = x.shape[1]
        pos0 = 0 if j == 0 else j + 1
        for i, (l, w) in enumerate(zip(layers, ws)):
            if ref:
                pos = torch.arange(pos0, pos0 + T, device=dev)
                mask = (torch.arange(16, device=dev)[None, :] <= pos[:, None])[None, None]
                x = predictor_layer(l, *w, x, cos[:, pos0:pos0 + T], sin[:, pos0:pos0 + T], mask, kcs[i], vcs[i], pos)
            else:
                x = kernels.predictor_layer(l, *w, x, cos, sin, kcs[i], vcs[i], pos0, pdl)
        x = x[:, -1:] * 0.5
    return x


def talker_chain(layers, ws, x0, cos, sin, kcs, vcs, pos, L, pdl, ref=False):
    h = x0
    B = h.shape[0]
    key = torch.arange(L, device=dev)
    mask = (key[None, :] <= pos[:, None])[:, None, None]
    rows = torch.arange(B, device=dev)
    for i, (l, w) in enumerate(zip(layers, ws)):
        if ref:
            q = talker_attn_in(l, w[0], w[1], h, cos, sin, kcs[i], vcs[i], rows, pos)
        else:
            q = kernels.talker_attn_in(l, w[0], w[1], h, cos, sin, kcs[i], vcs[i], pos, pdl)
        a = gqa_attention(q, kcs[i][:, :, :L], vcs[i][:, :, :L], mask)
        h = talker_attn_out(l, w[2], h, a) if ref else kernels.talker_attn_out(l, w[2], h, a, pdl)
    return h


def rel(a, b):
    return ((a.float() - b.float()).abs().max() / b.float().abs().max()).item()


torch.manual_seed(0)
for dt in (torch.bfloat16, torch.float32):
    name = str(dt).split(".")[-1]
    layers = [_layer("1.7B", "predictor", dev, dt) for _ in range(5)]
    ws = [fuse_layer(l) for l in layers]
    hd = layers[0].self_attn.head_dim
    cos, sin = torch.rand(1, 16, hd, device=dev).to(dt), torch.rand(1, 16, hd, device=dev).to(dt)
    for B in (1, 8, 32) if dt == torch.bfloat16 else (1, 8):
        x0 = torch.randn(B, 2, 1024, device=dev, dtype=dt)
        caches = {k: ([torch.zeros(B, 8, 16, hd, device=dev, dtype=dt) for _ in layers],
                      [torch.zeros(B, 8, 16, hd, device=dev, dtype=dt) for _ in layers]) for k in ("a", "b", "r")}
        t_pdl, o_pdl, g1 = graph_ms(lambda: pred_chain(layers, ws, x0, cos, sin, *caches["a"], True))
        t_no, o_no, g2 = graph_ms(lambda: pred_chain(layers, ws, x0, cos, sin, *caches["b"], False))
        o_ref = pred_chain(layers, ws, x0, cos, sin, *caches["r"], False, ref=True)
        res[f"pred_{name}_b{B}"] = {"pdl_ms": t_pdl, "nopdl_ms": t_no, "pdl_equal_nopdl": bool(torch.equal(o_pdl, o_no)),
                                    "rel_vs_ref": rel(o_pdl, o_ref), "kc_rel": rel(caches["a"][0][2], caches["r"][0][2])}
        print(name, B, res[f"pred_{name}_b{B}"], flush=True)
        del g1, g2
    tl = [_layer("1.7B", "talker", dev, dt) for _ in range(28 if dt == torch.bfloat16 else 4)]
    tw = [fuse_layer(l) for l in tl]
    for B in (1, 8, 32) if dt == torch.bfloat16 else (3,):
        L = 256
        pos = torch.randint(10, 200, (B,), device=dev)
        cos, sin = torch.rand(B, 1, 128, device=dev).to(dt), torch.rand(B, 1, 128, device=dev).to(dt)
        x0 = torch.randn(B, 1, 2048, device=dev, dtype=dt)
        base = [torch.randn(B, 8, L, 128, device=dev, dtype=dt) for _ in tl]
        caches = {k: ([c.clone() for c in base], [c.clone() for c in base]) for k in ("a", "b", "r")}
        t_pdl, o_pdl, g1 = graph_ms(lambda: talker_chain(tl, tw, x0, cos, sin, *caches["a"], pos, L, True))
        t_no, o_no, g2 = graph_ms(lambda: talker_chain(tl, tw, x0, cos, sin, *caches["b"], pos, L, False))
        t_ref, o_ref, g3 = graph_ms(lambda: talker_chain(tl, tw, x0, cos, sin, *caches["r"], pos, L, False, ref=True))
        res[f"talker_{name}_b{B}"] = {"pdl_ms": t_pdl, "nopdl_ms": t_no, "eager_ops_graphed_ms": t_ref,
                                      "pdl_equal_nopdl": bool(torch.equal(o_pdl, o_no)), "rel_vs_ref": rel(o_pdl, o_ref),
                                      "kc_rel": rel(caches["a"][0][-1], caches["r"][0][-1])}
        print(name, "talker", B, res[f"talker_{name}_b{B}"], flush=True)
        del g1, g2, g3
    del tl, tw
    torch.cuda.empty_cache()

from omni_tts import head_kernels, sampling
from omni_tts.talker import rms_norm
import torch.nn.functional as F
torch.manual_seed(1)
V, d, D = 2048, 1024, 2048
W = (torch.randn(V, d, device=dev) * 0.05).to(torch.bfloat16)
head = torch.nn.Linear(d, V, bias=False, device=dev, dtype=torch.bfloat16)
head.weight.data.copy_(W)
normw = torch.nn.Parameter(torch.ones(d, device=dev, dtype=torch.bfloat16))
norm = type("N", (), {"weight": normw, "eps": 1e-6})()
table = torch.randn(V, D, device=dev, dtype=torch.bfloat16)
rows = [sampling.RowSettings(greedy=True), sampling.RowSettings(greedy=False, temperature=0.9, top_k=50),
        sampling.RowSettings(greedy=False, temperature=0.7, top_k=5, top_p=0.8),
        sampling.RowSettings(greedy=False, temperature=1.0, top_k=64, top_p=0.5)]
for B in (1, 8, 32):
    sp = sampling.SlotParams.from_settings([rows[i % 4] for i in range(B)], dev).rows(B, topk_cap=64)
    mism = logit_mism = total = 0
    for f in range(40):
        x = torch.randn(B, 1, d, device=dev, dtype=torch.bfloat16) * 2
        seed, frame = torch.arange(B, device=dev) * 31 + 7, torch.full((B,), f, device=dev)
        esum = torch.zeros(B, D, device=dev)
        got = head_kernels.head_choose(norm, head, x, sp, seed, frame, 3, table, esum, res["pdl_available"])
        logits = F.linear(rms_norm(x[:, -1], normw, 1e-6), W)
        want = sampling.choose(logits.float(), sp, seed, frame, 3)
        mism += int((got != want).sum())
        total += B
    res[f"head_b{B}"] = {"mismatch": mism, "of": total}
    print("head", B, mism, total, flush=True)
json.dump(res, open(sys.argv[1], "w"), indent=1)
