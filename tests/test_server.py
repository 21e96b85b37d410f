"""The headless server (`python -m omni_tts serve`) in a subprocess on a real socket over the tiny
checkpoint: the official `openai` client gets a wav and a pcm stream, the model and health routes answer,
SIGTERM ends it cleanly; the plain app never imports ray."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest
import soundfile as sf
from _fixtures import FIXTURES, REPO, free_port

MODEL = str(FIXTURES / "custom_voice")
ENGINE_FLAGS = ["--model", MODEL, "--set", "max_num_seqs=2", "--set", "max_seq_len=96", "--set", "mode=eager"]
SHORT = {"max_new_tokens": 24, "seed": 3}


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}


def start_headless(*flags: str) -> tuple[str, subprocess.Popen]:
    """(base URL, process): the headless server on a free port, up once /health answers (bounded wait)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "omni_tts", "serve", *ENGINE_FLAGS, *flags,
                             "--port", str(port)], cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    try:
        while True:
            assert proc.poll() is None, f"the server exited: {proc.stdout.read()}"
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    return url, proc
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not answer /health in 120 s"
            time.sleep(0.1)  # polling a starting process; the deadline bounds it
    except BaseException:
        stop(proc)
        raise


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait(30)


@pytest.fixture(scope="module")
def server():
    url, proc = start_headless()
    yield url, proc
    stop(proc)


def test_openai_client_gets_a_wav_and_a_pcm_stream(server):
    from openai import OpenAI

    url, _ = server
    client = OpenAI(base_url=url + "/v1", api_key="x")
    audio = client.audio.speech.create(model="omni-tts", voice="ryan", input="Hello", extra_body=SHORT)
    wav, sr = sf.read(io.BytesIO(audio.content))
    assert sr == 24000 and wav.size == 23 * 1920
    with client.audio.speech.with_streaming_response.create(
            model="omni-tts", voice="vivian", input="Streamed.", response_format="pcm", extra_body=SHORT) as r:
        pieces = [len(p) for p in r.iter_bytes()]
    assert len(pieces) > 1 and sum(pieces) % (1920 * 2) == 0 and 0 < sum(pieces) <= 23 * 1920 * 2
    names = [m.id for m in client.models.list().data]
    assert names == ["custom_voice"]
    assert "ryan" in httpx.get(url + "/v1/audio/voices", timeout=10).json()["voices"]


def test_sigterm_ends_the_server_cleanly(server):
    """Exit status 0, after uvicorn's own graceful stop (it closes the listening socket first, so a late
    client is refused rather than reset mid-request)."""
    _, proc = server
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == 0
    log = proc.stdout.read()
    assert "Shutting down" in log and "Finished server process" in log, log[-2000:]


def test_bad_flags_are_one_error_line():
    done = subprocess.run([sys.executable, "-m", "omni_tts", "serve", "--model", MODEL, "--replicas", "2"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().endswith("error: --replicas need --ray")


@pytest.mark.parametrize("flags, said", [
    (["--port", "99999"], "error: argument --port: a port is from 1 to 65535, got 99999"),
    (["--port", "TAKEN"], "Address already in use"),  # one line, before any request, not a traceback
])
def test_a_port_that_cannot_be_listened_on_is_one_error_line(flags, said):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        flags = [str(taken.getsockname()[1]) if f == "TAKEN" else f for f in flags]
        done = subprocess.run([sys.executable, "-m", "omni_tts", "serve", *ENGINE_FLAGS, *flags], cwd=REPO,
                              env=_env(), capture_output=True, text=True, timeout=120)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2 and last.startswith("error: ") and said in last, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_the_plain_app_never_imports_ray():
    code = ("import sys\nfrom omni_tts.engine.engine import Engine\nfrom omni_tts.serving import headless\n"
            "from omni_tts.tools.args import Parser\n"
            f"args = headless.add_arguments(Parser()).parse_args(['--model', {MODEL!r}, '--set', 'mode=eager'])\n"
            "engine = Engine.from_config(headless.engine_config(args), wait=False, warm=False)\n"
            "app = headless.build_app(engine)\nengine.shutdown()\n"
            "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
