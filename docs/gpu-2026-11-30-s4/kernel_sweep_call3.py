"""Device-side tuning sweep for omni_tts.kernels (not part of the package): per projection shape and row
count, time configs in a CUDA graph of 50 launches; then whole-layer timings with the best configs."""
import itertools, json, os, sys, time, torch, triton
from omni_tts import kernels, fastpath
from omni_tts.talker import DecoderLayer, Rope
print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
D, I = 1024, 3072
torch.manual_seed(0)
layer = DecoderLayer(dict(hidden_size=D, num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=I,
                          hidden_act="silu", rms_norm_eps=1e-6), "x").cuda()
for p in layer.parameters():
    torch.nn.init.normal_(p, std=0.03)
    if p.dim() == 1: p.data += 1
layer = layer.to(torch.bfloat16); w_qkv, b_qkv, w_gu = fastpath.fuse_layer(layer)
def graph_ms(fn, n=50):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n): fn()
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(5): g.replay()
    b.record(); b.synchronize()
    return a.elapsed_time(b) / 5 / n * 1000  # us per launch
shapes = {"qkv": (4096, D, dict(norm=layer.input_layernorm), w_qkv), "o": (D, 2048, dict(res=True), layer.self_attn.o_proj.weight),
          "gate_up": (I, D, dict(norm=layer.post_attention_layernorm, glu=True), w_gu), "down": (D, I, dict(res=True), layer.mlp.down_proj.weight)}
best, table = {}, []
for M in (2, 8, 16, 32):
    for name, (n, K, kw, w) in shapes.items():
        x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        kw = dict(kw)
        if kw.get("res"): kw["res"] = torch.randn(M, n, device="cuda", dtype=torch.bfloat16)
        ref = kernels._proj(x, w, n=n, cfg=(16, 256, 3, 4, False), **kw)
        grid = [(BN, BK, st, 4, False) for BN, BK, st in itertools.product((16, 32), (128, 256), (3, 4))]
        if M <= 8:
            grid += [(BN, BK, 3, wp, True) for BN, BK, wp in itertools.product((2, 4, 8), (128, 256), (4, 8))]
        res = []
        for cfg in grid:
            try:
                y = kernels._proj(x, w, n=n, cfg=cfg, **kw)
                err = (y.float() - ref.float()).abs().max().item()
                us = graph_ms(lambda: kernels._proj(x, w, n=n, cfg=cfg, **kw))
            except Exception as e:
                print("fail", cfg, str(e)[:100]); continue
            res.append((us, cfg, err))
        res.sort()
        print(M, name, "default", kernels.config(M, n, K), "best", res[:3], flush=True)
        best[f"{M},{n},{K}"] = res[0][1]
        table.append([M, name, res[0][0], res[0][1]])
json.dump(best, open(os.path.join(os.environ.get("OUT", "/tmp"), "kernel_configs.json"), "w"), indent=1)
kernels.TUNED.update({tuple(int(v) for v in k.split(",")): tuple(v) for k, v in best.items()})
P = 16; cos, sin = Rope(128, 1e6).cuda()(torch.arange(P, device="cuda")[None], torch.bfloat16)
for B, T, pos0 in [(1, 2, 0), (1, 1, 7), (8, 1, 15), (16, 2, 0), (32, 1, 3)]:
    x = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16)
    kc = torch.randn(B, 8, P, 128, device="cuda", dtype=torch.bfloat16); vc = torch.randn_like(kc)
    us = graph_ms(lambda: kernels.predictor_layer(layer, w_qkv, b_qkv, w_gu, x, cos, sin, kc, vc, pos0), n=75)
    att = {nw: graph_ms(lambda: kernels._attn_kernel[(B, 8)](torch.empty(B * T, 4096, device="cuda", dtype=torch.bfloat16), layer.self_attn.q_norm.weight,
           layer.self_attn.k_norm.weight, cos.reshape(-1, 128), sin.reshape(-1, 128), kc, vc, torch.empty(B * T, 2048, device="cuda", dtype=torch.bfloat16),
           pos0, 1e-6, 128 ** -0.5, T=T, H=16, HKV=8, HD=128, P=P, BD=128, BP=16, num_warps=nw)) for nw in (1, 2, 4, 8)}
    print(f"layer B={B} T={T}: {us:.1f} us per layer, x75 = {us * 75 / 1000:.3f} ms; attention by warps {att}", flush=True)
