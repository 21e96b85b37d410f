"""Hand-written Triton kernels for the hot path (projections, the CodePredictor's layer steps and
heads, the talker's attention, the codec's snake activation), each tested against the reference
function in omni_tts.models that it replaces, in Triton's interpreter on a CPU."""
