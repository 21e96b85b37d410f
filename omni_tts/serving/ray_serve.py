"""Scale-out on Ray Serve: one engine per replica, Ray's HTTP proxy in front, the same routes as the headless
server (omni_tts.serving.app.build_app), streaming included.

Owns the deployment (a replica builds its engine, then the app; each response names its replica in
`x-omni-tts-replica`, the replica's Ray actor name), its readiness (`check_health` fails while the engine
cannot serve, so Serve replaces the replica), the replica options (fixed count or autoscaling on ongoing
requests, fractional GPUs), `app_builder` for `serve run` / `serve deploy` (deploy/ray-serve.yaml) and
`serve --ray` (start or join a Ray cluster and run the app until interrupted), and the ingress a cluster it
starts is given (INGRESS). Only this module imports ray.
"""

from __future__ import annotations

import argparse
import os
import signal
import threading
from collections.abc import Callable, Mapping
from typing import Any

from ray import serve

from omni_tts.errors import OmniTTSError

REPLICA_HEADER = "x-omni-tts-replica"
APP_NAME = "omni-tts"
ENGINE_KEYS = ("model", "preset", "set", "device", "dtype", "mode")  # the engine flags a replica builds its engine from
HEALTH_PERIOD_S, HEALTH_TIMEOUT_S = 5.0, 30.0
GRACE_POLL_S = 0.5  # how often a stopping replica looks whether its open requests have ended
WARM_TIMEOUT_S = 1800.0  # a replica's first compile on a new machine takes minutes
PUBLIC_HOST = "0.0.0.0"  # Ray's proxies listen on every node: the service's public-bind settings by default
# The environment a Ray cluster is started with, per ingress. Ray reads it in the controller and proxies at
# their start, so it belongs to the cluster (`ray start`), not to the application.
INGRESS: dict[str, dict[str, str]] = {
    # HAProxy forwards each request to a replica's own HTTP server: no Python proxy hop, no actor calls
    "haproxy": {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"},
    # Ray's Python HTTP proxy actor, which relays every request and streamed message over actor calls
    "proxy": {},
}
DEFAULT_INGRESS = "haproxy"


class ReplicaHeader:
    """ASGI middleware: every HTTP response carries the replica's name (pure ASGI, so streams stay streams)."""

    def __init__(self, app: Any, value: str) -> None:
        self.app, self.header = app, (REPLICA_HEADER.encode(), value.encode())

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def named(message: dict) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, named)


@serve.ingress()
class TTSReplica:
    """One engine and its app (the app is built once the engine is, by Serve's late-bound ingress)."""

    def __init__(self, engine_flags: Mapping[str, Any], host: str = PUBLIC_HOST) -> None:
        from omni_tts.serving.headless import engine_config, start_engine

        self.name, self.host = serve.get_replica_context().replica_id.to_full_id_str(), host
        self.engine = start_engine(engine_config(argparse.Namespace(**_flags(engine_flags))))
        # Serve routes to a replica once its constructor returns: not before its default mode is warm
        self.engine.wait_ready(timeout=WARM_TIMEOUT_S)

    def __serve_build_asgi_app__(self) -> Any:
        from omni_tts.serving.headless import build_app

        app = build_app(self.engine, self.host)
        app.add_middleware(ReplicaHeader, value=self.name)
        return app

    def check_health(self) -> None:
        """Raise while this replica's engine cannot serve: Serve then stops routing to it and replaces it."""
        problem = serving_problem(self.engine)
        if problem:
            raise RuntimeError(f"{self.name}: {problem}")

    def __del__(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.shutdown()


def serving_problem(engine: Any) -> str | None:
    """Why `engine` serves no request now (None: it serves; the same test as the /ready route)."""
    if getattr(engine, "_closed", False):
        return "the engine is shut down"
    modes = engine.modes()
    if any(v.serving for v in modes.values()):
        return None
    return "no mode serves: " + "; ".join(f"{m}: {v.state} {v.reason}".strip() for m, v in modes.items())


def deployment_options(max_num_seqs: int, replicas: int = 1, gpus_per_replica: float = 0.0,
                       min_replicas: int | None = None, max_replicas: int | None = None,
                       target_ongoing_requests: float | None = None, grace_s: float = 10.0) -> dict[str, Any]:
    """Serve's options for the replicas: a fixed count, or autoscaling on ongoing requests between
    min_replicas and max_replicas; each replica takes `max_num_seqs` slots' worth plus as many waiting.
    A stopping replica lets its open requests run for `grace_s` (the headless server's shutdown grace), then
    Serve ends it (behind HAProxy Ray keeps it at least for its direct-ingress draining period: README)."""
    if replicas < 1:
        raise OmniTTSError(f"--replicas must be >= 1 (got {replicas})")
    if gpus_per_replica < 0:
        raise OmniTTSError(f"--gpus-per-replica must be >= 0 (got {gpus_per_replica:g})")
    opts: dict[str, Any] = {"max_ongoing_requests": 2 * max_num_seqs, "health_check_period_s": HEALTH_PERIOD_S,
                            "health_check_timeout_s": HEALTH_TIMEOUT_S, "graceful_shutdown_timeout_s": grace_s,
                            "graceful_shutdown_wait_loop_s": GRACE_POLL_S,
                            "ray_actor_options": {"num_gpus": gpus_per_replica, "num_cpus": 1}}
    if min_replicas is None and max_replicas is None:
        return {**opts, "num_replicas": replicas}
    low, high = min_replicas if min_replicas is not None else 1, max_replicas or max(replicas, min_replicas or 1)
    if not 0 <= low <= high or high < 1:
        raise OmniTTSError(f"--min-replicas {low} / --max-replicas {high}: need 0 <= min <= max and max >= 1")
    target = target_ongoing_requests or max_num_seqs
    return {**opts, "autoscaling_config": {"min_replicas": low, "max_replicas": high,
                                           "initial_replicas": max(low, 1), "target_ongoing_requests": target}}


def app_builder(args: Mapping[str, Any]) -> Any:
    """The Serve application from string-ish args (`serve run omni_tts.serving.ray_serve:app_builder
    model=DIR` or deploy/ray-serve.yaml's `args`): the engine flags plus the replica options."""
    from omni_tts.serving.headless import engine_config
    from omni_tts.serving.settings import ServeSettings

    flags = _flags(args)
    config = engine_config(argparse.Namespace(**flags))  # a bad preset or key fails here, not in every replica
    num = lambda k, kind: None if args.get(k) in (None, "") else kind(args[k])  # noqa: E731
    gpus = num("gpus_per_replica", float)
    replicas = num("replicas", int)
    opts = deployment_options(config.max_num_seqs, 1 if replicas is None else replicas,
                              _default_gpus(config.device) if gpus is None else gpus,
                              num("min_replicas", int), num("max_replicas", int), num("target_ongoing_requests", float),
                              ServeSettings.from_env(PUBLIC_HOST).graceful_shutdown_s)
    return serve.deployment(TTSReplica).options(**opts).bind(flags, str(args.get("host") or PUBLIC_HOST))


def serve_from_args(args: argparse.Namespace, say: Callable[[str], None]) -> int:
    """`serve --ray`: join `--ray-address` (its cluster's ingress stands) or start a local Ray with `--ingress`,
    run the app on `--host:--port`, and block until SIGINT or SIGTERM; then the app is deleted (and the
    local Serve instance shut down, its HAProxy with it)."""
    import ray

    flags = {k: getattr(args, k, None) for k in ENGINE_KEYS}
    builder_args = {**flags, "host": args.host, "replicas": args.replicas, "gpus_per_replica": args.gpus_per_replica,
                    "min_replicas": args.min_replicas, "max_replicas": args.max_replicas,
                    "target_ongoing_requests": getattr(args, "target_ongoing_requests", None)}
    application = app_builder(builder_args)
    chosen = getattr(args, "ingress", None)
    ingress = chosen or DEFAULT_INGRESS
    if args.ray_address and chosen:
        raise OmniTTSError("--ingress sets up a local cluster; a joined one keeps the ingress it was started "
                           "with (README: the environment of `ray start`)")
    if args.ray_address:
        ray.init(address=args.ray_address, include_dashboard=False)
    else:  # the local cluster's processes inherit this environment
        os.environ.update(INGRESS[ingress])
        ray.init()
    signal.signal(signal.SIGTERM, _interrupt)
    try:  # a SIGTERM while Serve still starts (a replica not yet placed) ends here too, cleaned up
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(application, name=APP_NAME, route_prefix="/")
        how = "the cluster's ingress" if args.ray_address else f"ingress: {ingress}"
        say(f"serving http://{args.host}:{args.port}/v1 through Ray Serve ({how}; replica name: {REPLICA_HEADER})")
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up short
        try:  # a local Serve goes whole (its HAProxy with it); on a joined cluster only our app
            serve.delete(APP_NAME) if args.ray_address else serve.shutdown()
        finally:
            ray.shutdown()
    return 0


def _interrupt(*_: Any) -> None:
    """SIGTERM runs the same clean-up as Ctrl-C."""
    raise KeyboardInterrupt


def _flags(args: Mapping[str, Any]) -> dict[str, Any]:
    """The engine flags of a mapping; `set` as KEY=VALUE strings (a list, or a mapping from YAML)."""
    out = {k: args.get(k) for k in ENGINE_KEYS}
    sets = out["set"] or []
    if isinstance(sets, Mapping):
        sets = [f"{k}={v}" for k, v in sets.items()]
    elif isinstance(sets, str):
        sets = [sets]
    out["set"] = list(sets)
    out["preset"] = out["preset"] or "default"
    return out


def _default_gpus(device: str) -> float:
    """One GPU per replica where the engine runs on CUDA, none on a CPU."""
    if device == "cpu":
        return 0.0
    import torch

    return 1.0 if device.startswith("cuda") or torch.cuda.is_available() else 0.0
