"""The inference engine over one model: requests, one scheduler per compile mode, the model runner
that launches a frame, CUDA graph capture (the package's only torch.cuda.graph user), the audio stage
and the engine's metrics. It imports omni_tts.models and kernels, never serving or ui."""
