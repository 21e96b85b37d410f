"""The model's compiled decode path: torch.compile units and the Triton kernels they call, built over
the reference modules in `omni_tts.models` and sharing their weights."""
