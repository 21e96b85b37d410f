"""The 12 Hz speech tokenizer: its encoder (waveform -> codes, for voice clones) and its decoder
(codes -> 24 kHz waveform), whole or streamed chunk by chunk from carried state."""
