"""The headless server: the /v1 speech routes, health and metrics under uvicorn, without the Gradio page;
with `--ray`, the same app as Ray Serve replicas (omni_tts.serving.ray_serve).

Owns the serve-specific flags (bind address, Ray and replica options), building the engine from the
engine flags and running the app until interrupted. Knows nothing about the routes themselves
(omni_tts.serving.app) nor about Ray beyond handing the flags over; ray is imported only with `--ray`.
"""

from __future__ import annotations

import argparse
import logging
import signal
from collections.abc import Callable
from typing import Any

from omni_tts.config import EngineConfig
from omni_tts.errors import OmniTTSError
from omni_tts.tools.args import add_engine_flags, engine_config, error_line, port_arg, progress

DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
EXIT_USER_ERROR = 2


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The engine flags (the shared ones, omni_tts.tools.args) and the serve-specific flags."""
    add_engine_flags(parser, "default", mode=True)
    g = parser.add_argument_group("serving")
    g.add_argument("--host", default=DEFAULT_HOST, help=f"bind address (default {DEFAULT_HOST})")
    g.add_argument("--port", type=port_arg, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    r = parser.add_argument_group("scale-out on Ray Serve (needs requirements-serve.txt)")
    r.add_argument("--ray", action="store_true", help="serve through Ray Serve replicas, one engine each")
    r.add_argument("--replicas", type=int, default=1, help="replicas with --ray (fixed count; default 1)")
    r.add_argument("--gpus-per-replica", type=float, default=None, metavar="F",
                   help="GPUs each replica reserves, fractions allowed (default: 1 on a CUDA device, else 0)")
    r.add_argument("--min-replicas", type=int, default=None, metavar="A",
                   help="autoscale on ongoing requests between A and --max-replicas (instead of --replicas)")
    r.add_argument("--max-replicas", type=int, default=None, metavar="B")
    r.add_argument("--target-ongoing-requests", type=float, default=None, metavar="N",
                   help="autoscaling target per replica (default: the preset's slots per mode)")
    r.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="connect to this Ray cluster (e.g. auto, ray://head:10001); default: start a local one")
    r.add_argument("--ingress", choices=("haproxy", "proxy"), default=None,
                   help="the local cluster's HTTP ingress: haproxy (default; forwards straight to each replica's "
                        "HTTP server) or proxy (Ray's Python proxy actor); a joined cluster keeps its own")
    return parser


def build_app(engine: Any, host: str = DEFAULT_HOST, settings: Any = None) -> Any:
    """The service's FastAPI app over `engine` (every HTTP route, no page), with `settings` (default: read
    for `host` from the environment)."""
    from omni_tts.serving.app import build_app as service_app
    from omni_tts.serving.settings import ServeSettings

    return service_app(engine, settings or ServeSettings.from_env(host))


def start_engine(config: EngineConfig, say: Callable[[str], None] | None = None) -> Any:
    """Load the model and start serving; the modes warm in the background (/ready says when)."""
    from omni_tts.engine.engine import Engine

    engine = Engine.from_config(config, progress=say, wait=False, warm=False)
    engine.prime()
    engine.start_warming()
    return engine


def serve_local(config: EngineConfig, host: str, port: int, say: Callable[[str], None]) -> int:
    """One engine in this process behind uvicorn (the service's limits), until SIGINT or SIGTERM."""
    from omni_tts.serving.server import Server
    from omni_tts.serving.settings import ServeSettings

    settings = ServeSettings.from_env(host)  # one reading for the routes and uvicorn's limits
    engine = start_engine(config, say)
    server = Server(build_app(engine, host, settings), host, port, settings)
    signal.signal(signal.SIGTERM, _exit_on_kill)
    try:
        url = server.start()
        say(f"serving {url}/v1 (health: /health, readiness: /ready, metrics: /metrics)")
        server.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.close(engine, say)
    return 0


def _exit_on_kill(*_: Any) -> None:
    """SIGTERM runs the same clean-up as Ctrl-C; a second one meanwhile must not cut it short."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    """Serve until interrupted; a bad flag, preset or checkpoint is one `error: ...` line and status 2."""
    logging.basicConfig(level=logging.INFO, format="[omni-tts] %(message)s")
    say = progress("omni-tts", width=5)
    try:
        if args.ray:
            from omni_tts.serving import ray_serve

            return ray_serve.serve_from_args(args, say)
        _check_local_flags(args)
        return serve_local(engine_config(args), args.host, args.port, say)
    except OmniTTSError as e:
        error_line(str(e))
        return EXIT_USER_ERROR


def _check_local_flags(args: argparse.Namespace) -> None:
    named = [f for f, v in (("--replicas", args.replicas != 1), ("--gpus-per-replica", args.gpus_per_replica),
                            ("--min-replicas", args.min_replicas), ("--max-replicas", args.max_replicas),
                            ("--ray-address", args.ray_address), ("--ingress", args.ingress)) if v]
    if named:
        raise OmniTTSError(f"{', '.join(named)} need --ray")
