"""omni-tts app entry point: parse the arguments, build the engine, build the page, serve it mounted on
the HTTP service's app (OpenAI-compatible speech routes, health, readiness, metrics).

Owns only start-up: choosing the model (--model, OMNI_TTS_MODEL, the HF cache, the Hub, the embedded
demo: the runner decides), the engine preset, the bind address (0.0.0.0:$PORT on a Hugging Face
Space), the queue sized to max_num_seqs, the private temp folder for served files, and who may run
engine-wide actions (env OMNI_TTS_ADMIN_TOKEN; see omni_tts.ui.support.AdminPolicy). The page lives
in omni_tts.ui.layout, the named /synthesize API in omni_tts.ui.api, the HTTP service in omni_tts.serving.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from typing import Any

from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import Parser, engine_config, engine_parent, error_line, port_arg, progress
from omni_tts.ui import files
from omni_tts.ui import support as ui

PRIME_WAIT_S = 10.0  # the page waits for the eager path's priming at most this long


def build_demo(engine: Any, **kw: Any) -> Any:
    """The page over an engine, testable without launching. Gradio is imported here, not at the top, so
    the engine's priming (`main`) runs before its import instead of sharing the interpreter with it."""
    from omni_tts.ui import layout

    return layout.build_demo(engine, **kw)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = Parser(prog="app.py", description="omni-tts Gradio app (Qwen3-TTS 12 Hz) with an OpenAI-compatible "
               "/v1/audio/speech endpoint", parents=[engine_parent(mode=True)],
               epilog=f"Engine-wide actions (default-mode switch, listening and load tests) are open on a loopback "
               f"address; on a public one they need env {ui.ADMIN_ENV}=<token>, entered in the page's Admin token box.")
    p.add_argument("--host", default=None, help="default 127.0.0.1 (0.0.0.0 on a Space)")
    p.add_argument("--port", type=port_arg, default=None, help="default 7860 (env PORT/GRADIO_SERVER_PORT on a Space)")
    p.add_argument("--share", action="store_true", help="create a public gradio.live link")
    return p.parse_args(argv)


def serve(engine: Any, demo: Any, host: str, port: int, share: bool = False, block: bool = True,
          settings: Any = None) -> tuple[Any, str]:
    """Serve the HTTP service's app (/v1 routes, health, readiness, metrics) with the page mounted at "/",
    by uvicorn with the service's limits; returns (serving.server.Server, local URL)."""
    import gradio as gr

    from omni_tts.serving.app import build_app
    from omni_tts.serving.server import Server
    from omni_tts.serving.settings import ServeSettings
    from omni_tts.ui import layout

    settings = settings or ServeSettings.from_env(host, share)
    n = engine.config.max_num_seqs
    demo.queue(default_concurrency_limit=n, max_size=max(64, 8 * n))
    demo.max_threads = demo._queue.max_thread_count = max(40, 4 * n + 16)  # what launch(max_threads=) sets
    app = gr.mount_gradio_app(build_app(engine, settings), demo, "/", server_name=host, server_port=port,
                              css=layout.CSS, footer_links=["api"])
    # Gradio refuses a file a client names but did not upload only once the page counts as launched, and
    # mounting never sets that: without it any server path would be read as an "uploaded" clip
    demo.has_launched = True
    server = Server(app, host, port, settings)
    url = server.start()
    if share:
        print(f"[omni-tts] public URL: {_share_link(host, port)}", file=sys.stderr, flush=True)
    if block:
        server.wait()
    return server, url


def _share_link(host: str, port: int) -> str:
    """A gradio.live tunnel to the server, as Blocks.launch(share=True) makes one."""
    import secrets

    from gradio import networking

    try:
        return networking.setup_tunnel(host, port, secrets.token_urlsafe(32), None, None)
    except Exception as e:  # no link is no reason to stop serving locally
        return f"none ({type(e).__name__}: {e})"


def _exit_on_kill(*_: Any) -> None:
    """A plain kill still runs the exit clean-up; a second kill meanwhile must not cut it short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sys.exit(0)


def main(argv: list[str] | None = None) -> int:
    """Build the engine and serve the page and the APIs until interrupted."""
    from omni_tts.engine.engine import Engine
    from omni_tts.serving.settings import ServeSettings

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[omni-tts] %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # gradio's own start-up probes
    say = progress("omni-tts", width=5)
    zero = ui.zero_gpu()
    try:
        host, port = ui.bind_address(args.host, args.port)
        settings = ServeSettings.from_env(host, args.share)  # one reading for the routes and uvicorn's limits
        config = engine_config(args)
        if zero and config.mode not in ui.ZERO_GPU_MODES:
            config.mode = ui.ZERO_GPU_MODES[0]
        # the page never waits for a compile, and the warm-up starts once the page is up
        engine = Engine.from_config(config, progress=say, wait=False, warm=False)
    except OmniTTSError as e:
        error_line(str(e))
        return 2
    # first-use kernel loads on the eager path, before Gradio's import: beside it the priming takes several
    # times as long and ends after the page is up, so a visitor's first request would wait for it
    engine.prime()
    if not engine.wait_primed(PRIME_WAIT_S):
        say(f"the eager path is still priming after {PRIME_WAIT_S:.0f} s; serving the page meanwhile")
    policy = ui.AdminPolicy.from_env(host, args.share)
    files.use_private_gradio_cache()
    signal.signal(signal.SIGTERM, _exit_on_kill)
    say(f"files: {files.out_dir().path} (removed at exit); saved voices: {files.data_dir() / 'voices'}")
    demo = build_demo(engine, zero=zero, policy=policy)
    try:
        server, url = serve(engine, demo, host, port, args.share, block=False, settings=settings)
    except OmniTTSError as e:  # the address is taken or cannot be bound
        engine.shutdown()
        error_line(str(e))
        return 2
    say(f"page served at {url}")
    engine.start_warming()
    try:
        server.wait()
    finally:
        server.close(engine, say)
    return 0


if __name__ == "__main__":
    sys.exit(main())
