"""omni-tts: a fast, faithful in-process inference engine for Qwen3-TTS (12 Hz).

The package owns model code (talker, code predictor, codec, speaker encoder), prompt building,
sampling, CUDA-graph capture and the streaming engine. It knows nothing about Gradio.
"""

from omni_tts.errors import OmniTTSError

__all__ = ["OmniTTSError"]
__version__ = "0.1.0"
