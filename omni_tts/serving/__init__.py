"""The HTTP service over one engine: the OpenAI-compatible /v1 speech routes, health, readiness and
Prometheus metrics in one FastAPI app (`serving.app.build_app`), and the uvicorn server that runs it with
its connection limits (`serving.server`). Uses only the Engine's public API; knows nothing about Gradio
(app.py mounts the page on this app)."""
