"""`build_app(engine, settings)`: the one FastAPI app of the HTTP service: the /v1 speech routes, the
models list, health, readiness and Prometheus metrics. app.py mounts the Gradio page on it; the server
(serving.server) runs it.

Owns the routes that describe the service (`/health`: the process answers; `/ready`: a mode serves, with
each mode's state; `/v1/models[/{id}]`; `/metrics`), one JSON error for anything unexpected and for a /v1
path or method it has not, and the request log (serving.request_log) unless the settings turn it off.
Knows nothing about Gradio.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.routing import Match, Mount

from omni_tts.serving import request_log, speech, stream_ws, voices
from omni_tts.serving.errors import ApiError
from omni_tts.serving.metrics import EngineMetrics
from omni_tts.serving.settings import ServeSettings
from omni_tts.serving.streams import StreamAborted

log = logging.getLogger("omni_tts.serving")
ROUTES = ("POST /v1/audio/speech, WebSocket /v1/audio/speech/stream, GET and POST /v1/audio/voices, "
          "DELETE /v1/audio/voices/{name}, GET /v1/models")


def build_app(engine: Any, settings: ServeSettings | None = None) -> FastAPI:
    """Every HTTP route over `engine` in one app (no docs pages: the API is OpenAI's)."""
    settings = settings or ServeSettings()
    service = speech.SpeechService(engine, settings)
    metrics = EngineMetrics(engine)
    if settings.log_requests:
        request_log.attach(engine)
    app = FastAPI(title="omni-tts", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.settings, app.state.metrics = engine, settings, metrics
    app.include_router(speech.router(service))
    app.include_router(voices.router(engine, settings))
    app.include_router(stream_ws.router(engine, settings))

    @app.exception_handler(Exception)
    async def unexpected(_: Request, e: Exception) -> Response:
        if not isinstance(e, StreamAborted):  # an aborted stream logged its reason already
            log.error("unexpected error: %s: %s", type(e).__name__, e, exc_info=e)
        return ApiError(500, f"internal error: {type(e).__name__}", kind="server_error").response()

    probe = ["GET", "HEAD"]  # load balancers' health checks send either

    @app.api_route("/health", methods=probe)
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.api_route("/ready", methods=probe)
    def ready() -> Response:
        modes = {m: {"state": v.state, "serving": v.serving, "progress": list(v.progress),
                     "default": v.is_default} for m, v in engine.modes().items() if v.state != "unavailable"}
        up = any(v["serving"] for v in modes.values()) and not engine.draining  # draining: shutting down
        return JSONResponse({"ready": up, "draining": engine.draining, "modes": modes}, status_code=200 if up else 503)

    def card() -> dict[str, Any]:
        return {"id": service.name, "object": "model", "owned_by": "omni-tts"}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{model_id:path}")
    def model(model_id: str) -> Response:
        if model_id != service.name:
            return ApiError(404, f"no model '{model_id[:100]}' here; this server has '{service.name}'", "model",
                            "not_found_error").response()
        return JSONResponse(card())

    @app.get("/metrics")
    def scrape() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    _answer_unknown_routes(app)
    return app


def _answer_unknown_routes(app: FastAPI) -> None:
    """A /v1 path or method the API has not is answered in the API's error shape, here rather than by
    the page mounted at "/" (registered last, so every real route matches first)."""

    methods = ["DELETE", "GET", "HEAD", "PATCH", "POST", "PUT"]

    @app.api_route("/v1/{rest:path}", methods=methods, include_in_schema=False)
    def no_route(request: Request, rest: str) -> Response:
        path = request.url.path[:100]
        routes = [r for r in app.router.routes  # the page's mount at "/" takes any path
                  if getattr(r, "endpoint", None) is not no_route and not isinstance(r, Mount)]
        allow = [m for m in methods if any(r.matches({**request.scope, "method": m})[0] is Match.FULL for r in routes)]
        if allow:
            r = ApiError(405, f"{request.method} is not a method of {path} (it takes: {', '.join(allow)})").response()
            r.headers["Allow"] = ", ".join(allow)
            return r
        if any(r.matches({**request.scope, "type": "websocket"})[0] is Match.FULL for r in routes):
            return ApiError(426, f"{path} is a WebSocket route: open it with a WebSocket client").response()
        return ApiError(404, f"no route {path}; the API: {ROUTES}", None, "not_found_error").response()
