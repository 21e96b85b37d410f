"""The Gradio app's package: page layout, handlers, the named /synthesize API and the OpenAI-compatible
/v1 speech routes, over the Engine's public API (app.py at the repository root launches them)."""
