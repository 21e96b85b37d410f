"""The plain single-request path: one request, start to end, through a one-slot eager model runner.

Owns `generate_codes` and `synthesize`, the reference loop behind the CLI's plain path and the
exactness tests. It runs the same `Runner` frames as the engine (so a frame is defined once), with
a KV cache sized to the request, and decodes the codes in one call at the end.
"""

from __future__ import annotations

import numpy as np
import torch

from omni_tts.config import CompileMode, EngineConfig, SynthesisParams
from omni_tts.engine.model_runner import Runner
from omni_tts.models import voice_clone
from omni_tts.models.qwen3_tts import Prepared, TTSModel


@torch.no_grad()
def generate_codes(model: TTSModel, params: SynthesisParams | Prepared) -> torch.Tensor:
    """One request's codes [frames, 16] int64 (CPU), as the official generate loop yields them."""
    prep = params if isinstance(params, Prepared) else model.prepare(params, max_seq_len=1 << 30)
    reference = CompileMode.reference()
    config = EngineConfig(max_num_seqs=1, max_seq_len=prep.prompt_len + prep.max_frames + 1, mode=reference.value,
                          device=model.device.type)
    runner = Runner(model, config, reference)
    runner.reference_talker = True  # the reference modules throughout: nothing compiled or captured
    runner.prefill(0, prep)
    frames: list[np.ndarray] = []
    stop = not prep.fixed and int(runner.code0[0]) == model.eos_id  # EOS before the first frame: no audio
    while not stop and len(frames) < prep.max_frames:
        codes, eos = runner.step(1)  # codes: [1, 16] of this frame; eos: [1] the next frame's code 0 is EOS
        frames.append(codes[0])
        stop = bool(eos[0]) and not prep.fixed
    if not frames:
        return torch.zeros(0, model.num_groups, dtype=torch.long)
    return torch.from_numpy(np.stack(frames))


def synthesize(model: TTSModel, params: SynthesisParams) -> tuple[np.ndarray, torch.Tensor]:
    """-> (waveform float32 at `model.sample_rate`, generated codes [frames, 16]).

    An ICL voice clone decodes [reference codes; generated codes] and cuts the reference part off the
    audio as the official wrapper does (voice_clone.reference_cut)."""
    prep = model.prepare(params, max_seq_len=1 << 30)
    codes = generate_codes(model, prep)
    ref = prep.decoder_prefix  # [R, 16] or None
    if ref is None:
        return model.decode(codes), codes
    full = torch.cat([ref, codes], dim=0)  # [R + frames, 16]
    return voice_clone.cut_reference(model.decode(full), ref.shape[0], full.shape[0]), codes
