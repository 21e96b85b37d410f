"""Scale-out on Ray Serve over a real local two-node Ray cluster (two raylets on this machine, one CPU each)
with two replicas of the tiny checkpoint, behind each ingress a local cluster can be started with (HAProxy,
the default, and Ray's Python proxy): requests reach both replicas (named in a response header), the openai
client streams through the ingress, and (HAProxy) a replica killed mid-load fails only its own in-flight
streams (aborted, never a clean short body, never a hang) while requests sent right after its death are all
served by the other (the openai client sending again one that reached the dead replica), and Serve brings
the killed one back. Deselect with `-m "not ray"`."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import yaml
from _fixtures import FIXTURES, REPO, free_port

pytestmark = pytest.mark.ray
ENGINE = {"model": str(FIXTURES / "custom_voice"), "preset": "default",
          "set": ["max_num_seqs=2", "max_seq_len=200", "mode=eager", "chunk_frames=4"]}
SHORT = {"model": "omni-tts", "voice": "ryan", "input": "Hi", "extra_body": {"max_new_tokens": 6, "seed": 3}}
LONG = {"input": "A longer clip, streamed.", "voice": "ryan", "max_new_tokens": 80, "seed": 3,
        "response_format": "pcm", "stream": True}
TIMEOUT = httpx.Timeout(60)  # every request is bounded: a hang fails the test instead of stalling it
RECOVERY_S = 180.0
# a request sent right after a replica's death can still reach it (README): the openai client sends it again
AFTER_A_DEATH_RETRIES = 3
# the workers import omni_tts from this checkout; the proxy waits longer for a replica's queue length on
# a busy CPU, so it routes by load instead of falling back to a blind pick
ENV = {"PYTHONPATH": "", "RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S": "1.0"}


@pytest.fixture(scope="module", params=["haproxy", "proxy"])
def cluster(request):
    """(base URL, serve module, ingress): two raylets started with the ingress's environment, the ingress on a
    free port, two replicas; torn down after."""
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from omni_tts.serving import ray_serve

    # HAProxy's own stats and metrics listeners on free ports: fixed ones collide with any other Serve here
    env = {**ENV, **ray_serve.INGRESS[request.param], "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port()),
           "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port())}
    old_env = {k: os.environ.get(k) for k in [*env, *ray_serve.INGRESS["haproxy"]]}
    for k in ray_serve.INGRESS["haproxy"]:
        os.environ.pop(k, None)
    os.environ.update(env)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), old_env["PYTHONPATH"]) if p)
    nodes = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20,
                                                          "include_dashboard": False})
    try:
        nodes.add_node(num_cpus=1, object_store_memory=80 << 20)
        ray.init(address=nodes.address, log_to_driver=False, logging_level="warning")
        port = free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        application = ray_serve.app_builder({**ENGINE, "replicas": 2, "host": "127.0.0.1"})
        serve.run(application, name=ray_serve.APP_NAME, route_prefix="/")
        yield f"http://127.0.0.1:{port}", serve, request.param
    finally:
        try:
            serve.shutdown()
            ray.shutdown()
        finally:
            nodes.shutdown()
            for k, v in old_env.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def _replicas_of(url: str, n: int, retries: int = 0) -> list[str]:
    """The replica names of `n` concurrent short requests through the openai client, each of which must
    succeed; `retries`: the client's own retries of a 5xx or a connection closed before any response."""
    from openai import OpenAI

    client = OpenAI(base_url=url + "/v1", api_key="x", max_retries=retries, timeout=TIMEOUT.read)

    def one(_: int) -> str:
        r = client.audio.speech.with_raw_response.create(**SHORT)
        assert r.status_code == 200, (r.status_code, r.headers)
        return r.headers["x-omni-tts-replica"]

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(one, range(n)))


def _running(serve, name: str) -> dict[str, int]:
    return dict(serve.status().applications[name].deployments["TTSReplica"].replica_states)


def test_requests_reach_both_replicas_and_the_openai_client_streams_through_the_ingress(cluster):
    from openai import OpenAI

    url, _, _ = cluster
    seen: set[str] = set()
    for _ in range(5):  # Serve routes each request to the less loaded of two replicas it samples
        seen.update(_replicas_of(url, 4))
        if len(seen) == 2:
            break
    assert len(seen) == 2 and all(s.startswith("SERVE_REPLICA::omni-tts#TTSReplica#") for s in seen)
    client = OpenAI(base_url=url + "/v1", api_key="x")
    sizes = []
    with client.audio.speech.with_streaming_response.create(
            model="omni-tts", voice="ryan", input="Streamed through Ray.", response_format="pcm",
            extra_body={"max_new_tokens": 40, "seed": 3}) as response:
        assert response.headers["x-omni-tts-replica"] in seen
        sizes = [len(piece) for piece in response.iter_bytes()]
    assert len(sizes) > 2 and sum(sizes) % (1920 * 2) == 0  # several pieces, of whole 80 ms frames
    assert httpx.get(url + "/health", timeout=TIMEOUT).status_code == 200
    ready = httpx.get(url + "/ready", timeout=TIMEOUT)
    assert ready.status_code == 200 and ready.json()["ready"] is True


@pytest.mark.parametrize("cluster", ["haproxy"], indirect=True)  # a replica's death is Serve's, whatever the ingress
def test_a_killed_replica_fails_only_its_streams_and_comes_back(cluster):
    import ray

    from omni_tts.serving.ray_serve import APP_NAME

    url, serve, _ = cluster
    outcome: dict[int, tuple[str, str, int]] = {}
    named: dict[int, str] = {}
    both = threading.Condition()

    def stream(i: int) -> None:
        size = 0
        try:
            with httpx.stream("POST", url + "/v1/audio/speech", json=LONG, timeout=TIMEOUT) as r:
                with both:  # a response without the header comes from the proxy, not a replica
                    named[i] = r.headers.get("x-omni-tts-replica", f"proxy: HTTP {r.status_code}")
                    both.notify_all()
                for piece in r.iter_raw():
                    size += len(piece)
            outcome[i] = ("done", named[i], size)
        except httpx.TransportError as e:
            outcome[i] = (type(e).__name__, named.get(i, ""), size)

    threads: list[threading.Thread] = []
    with both:  # streams one after another until both replicas serve one (at most 4 fit on one: max_ongoing)
        while len({n for n in named.values() if "#" in n}) < 2 and len(threads) < 6:
            threads.append(threading.Thread(target=stream, args=(len(threads),), daemon=True))
            threads[-1].start()
            assert both.wait_for(lambda: len(named) == len(threads), timeout=60), "no response started"
        victim = named[len(threads) - 1]
        assert "#" in victim and len(set(named.values())) == 2, named
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    # at once, before HAProxy or Serve has seen the death: each is served by the replica that is left (or
    # its replacement), some after the client's retry
    survivors = _replicas_of(url, 3, retries=AFTER_A_DEATH_RETRIES)
    for t in threads:
        t.join(timeout=90)
    assert not any(t.is_alive() for t in threads), "a stream hung after its replica was killed"
    assert set(survivors) and victim not in survivors
    for status, replica, size in outcome.values():
        if replica == victim:  # aborted mid-body: the client sees an error, not a short clip that looks whole
            assert status in ("RemoteProtocolError", "ReadError"), (status, size)
        elif replica:
            assert status == "done" and size > 0 and size % (1920 * 2) == 0, (status, size)
    deadline = time.monotonic() + RECOVERY_S
    while _running(serve, APP_NAME).get("RUNNING") != 2 and time.monotonic() < deadline:
        time.sleep(0.5)  # polling Serve's own status; the deadline, not the interval, bounds the test
    assert _running(serve, APP_NAME) == {"RUNNING": 2}
    kept = set(named.values()) - {victim}  # the replica that was not killed
    names = set(survivors)
    deadline = time.monotonic() + RECOVERY_S
    while not names - kept and time.monotonic() < deadline:  # HAProxy adds it a moment after Serve does
        names.update(_replicas_of(url, 4, retries=AFTER_A_DEATH_RETRIES))
    assert victim not in names and names - kept, "the replacement replica serves no request"


def test_deployment_options_and_the_config_file():
    from ray.serve.schema import ServeDeploySchema

    from omni_tts.errors import OmniTTSError
    from omni_tts.serving.ray_serve import app_builder, deployment_options

    fixed = deployment_options(8, replicas=3, gpus_per_replica=0.5, grace_s=4)
    assert fixed["num_replicas"] == 3 and fixed["ray_actor_options"]["num_gpus"] == 0.5
    assert fixed["graceful_shutdown_timeout_s"] == 4  # a stopping replica's open requests get the server's grace
    assert fixed["max_ongoing_requests"] == 16 and "autoscaling_config" not in fixed
    auto = deployment_options(8, min_replicas=1, max_replicas=4)["autoscaling_config"]
    assert auto == {"min_replicas": 1, "max_replicas": 4, "initial_replicas": 1, "target_ongoing_requests": 8}
    with pytest.raises(OmniTTSError, match="--min-replicas 5 / --max-replicas 2"):
        deployment_options(8, min_replicas=5, max_replicas=2)
    with pytest.raises(OmniTTSError, match="unknown"):
        app_builder({**ENGINE, "set": ["no_such_key=1"]})
    spec = ServeDeploySchema.model_validate(yaml.safe_load((REPO / "deploy" / "ray-serve.yaml").read_text()))
    app = spec.applications[0]
    assert app.import_path == "omni_tts.serving.ray_serve:app_builder" and "model" in app.args
    built = app_builder({**app.args, "model": ENGINE["model"], "device": "cpu"})
    assert built is not None
    with pytest.MonkeyPatch.context() as env:
        env.setenv("OMNI_TTS_SHUTDOWN_GRACE_S", "7")
        graced = app_builder({**ENGINE, "device": "cpu"})
    assert graced._bound_deployment._deployment_config.graceful_shutdown_timeout_s == 7
