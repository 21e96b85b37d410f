import sys, traceback, torch
from omni_tts.checkpoint import open_checkpoint
from omni_tts.model import TTSModel
from omni_tts import head_kernels, kernels
m = TTSModel.from_checkpoint(open_checkpoint('/tmp/ck17'), device='cuda', dtype=torch.bfloat16)
cp = m.code_predictor
print("proj", type(cp.small_to_mtp_projection), cp.codec_embedding[0].weight.dtype, cp.codec_embedding[0].weight.shape,
      cp.lm_head[0].weight.shape, cp.norm.weight.dtype, flush=True)
for pdl in (True, False):
    for b in (1, 2, 4, 8, 16, 32):
        print(pdl, b, repr(head_kernels.probe(cp, [b], 32, 64, pdl))[:600], flush=True)
from omni_tts.sampling import SlotParams
b = 2
sp = SlotParams.zeros(b, 'cuda').rows(b, topk_cap=64)
x = torch.zeros(b, 1, cp.hidden_size, device='cuda', dtype=torch.bfloat16)
esum = torch.zeros(b, 2048, device='cuda'); idx = torch.zeros(b, dtype=torch.long, device='cuda')
try:
    code = head_kernels.head_choose(cp.norm, cp.lm_head[0], x, sp, idx, idx, 1, cp.codec_embedding[0].weight, esum, True)
    print("choose ok", code)
    print(head_kernels.feed(cp.codec_embedding[0].weight, cp.small_to_mtp_projection, code, True).shape)
except Exception:
    traceback.print_exc()
