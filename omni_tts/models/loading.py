"""Loading a model as an EngineConfig asks: device, dtype, memory cap, CPU threads, the checkpoint."""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from omni_tts.config import EngineConfig
from omni_tts.errors import OmniTTSError
from omni_tts.models.qwen3_tts import TTSModel


def load_model(config: EngineConfig, progress: Callable[[str], None] | None = None) -> TTSModel:
    """The checkpoint `config.model` names (or the one model selection picks) on the configured device."""
    from omni_tts.models.selection import open_checkpoint

    config.validate()
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    if config.gpu_memory_limit_gb and device.type == "cuda":  # before anything is allocated
        index = device.index if device.index is not None else torch.cuda.current_device()  # torch wants one
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, config.gpu_memory_limit_gb * (1 << 30) / total), index)
    if device.type == "cuda":  # cuDNN's attention compiles a kernel at run time for every new shape (prompt
        # length, KV length, batch), seconds on a request's path; the engine turns it on inside captures only
        torch.backends.cuda.enable_cudnn_sdp(False)
    if device.type == "cpu":  # leave cores to the audio stage and the host (torch's default takes them all)
        torch.set_num_threads(max(1, min(torch.get_num_threads(), (os.cpu_count() or 2) // 2)))
    model = TTSModel.from_checkpoint(open_checkpoint(config.model, progress=progress), device=device, dtype=dtype)
    _ = model.codec  # build the codec decoder now: a broken one is a CheckpointError here, not per request
    return model


def resolve_device(name: str) -> torch.device:
    """auto | cpu | cuda | cuda:N -> a device that exists here (OmniTTSError with one line if not)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name != "cpu" and not name.startswith("cuda"):
        raise OmniTTSError(f"device must be auto, cpu or cuda (got '{name}')")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise OmniTTSError("device cuda requested but CUDA is not available here; use --device cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise OmniTTSError(f"device must be auto, cpu, cuda or cuda:N (got '{name}')") from None


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
