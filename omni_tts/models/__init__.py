"""The Qwen3-TTS reference model, one implementation of each part (talker, CodePredictor, speaker
encoder, codec), with checkpoint loading and making; tensors in, tensors out. The compiled decode path
over these modules lives in `compiled/`."""
