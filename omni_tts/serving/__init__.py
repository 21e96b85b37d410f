"""Serving the engine over HTTP without the Gradio page: the app's routes, the headless server, Ray Serve."""
