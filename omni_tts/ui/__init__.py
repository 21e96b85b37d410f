"""The Gradio app's package: page layout, handlers and the named /synthesize API, over the Engine's public
API (app.py at the repository root mounts the page on the HTTP service of omni_tts.serving)."""
