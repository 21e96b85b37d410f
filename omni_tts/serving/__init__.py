"""The HTTP API on the app's server: OpenAI-compatible speech, saved voices, text streamed in over a WebSocket."""
