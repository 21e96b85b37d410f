"""Compile caches and portable artifacts (omni_tts.engine.compile_cache, `omni-tts warm-cache`).

Fast tests: where the caches live (a Space's /data or ~/.cache), the manifest and every refusal of
artifacts made for another machine, the kernel-probe outcome cache, the tool's error lines. The slow
test exports the real engine's `default` mode on the tiny fixture (CPU Inductor gives torch artifacts; a
warm Inductor cache, the suite's, exports the same ones) and imports them into a fresh process with empty
caches, which then compiles from them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _fixtures import FIXTURES, REPO
from torch._inductor.runtime.cache_dir_utils import cache_dir

from omni_tts.engine import compile_cache
from omni_tts.tools import warm_cache

FIXTURE = FIXTURES / "custom_voice"


def _args(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    warm_cache.add_arguments(p)
    return p.parse_args(list(argv))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache root of this test's own."""
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_cache_root_is_the_spaces_persistent_storage_when_it_has_one(tmp_path):
    assert compile_cache.cache_root({"HOME": "/h"}) == Path("/h/.cache/omni_tts")
    space = {"HOME": "/h", "SPACE_ID": "u/x"}
    assert compile_cache.cache_root(space, tmp_path) == tmp_path / "omni_tts"  # persistent storage attached
    assert compile_cache.cache_root(space, tmp_path / "absent") == Path("/h/.cache/omni_tts")  # none attached
    assert compile_cache.cache_root({"HOME": "/h"}, tmp_path) == Path("/h/.cache/omni_tts")  # not a Space
    assert compile_cache.cache_root({"HOME": "/h", compile_cache.CACHE_ENV: str(tmp_path)}) == tmp_path
    env = {"HOME": "/h", "TRITON_CACHE_DIR": "/mine"}
    root = compile_cache.use_cache_dirs(env)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(root / "inductor") and env["TRITON_CACHE_DIR"] == "/mine"


def test_export_then_import_round_trip_and_refusals(cache, tmp_path):
    key = compile_cache.probe_key(batches=[1, 8], dtype=torch.bfloat16)
    compile_cache.save_probe(key, {"kernel_rows": 32, "notice": ""})
    manifest = compile_cache.export_artifacts(tmp_path / "art")
    assert {k: manifest[k] for k in compile_cache.MATCH_KEYS} == compile_cache.machine()
    assert manifest["kernel_probes"] == 1 and json.loads((tmp_path / "art/manifest.json").read_text()) == manifest

    (cache / compile_cache.PROBES).unlink()  # a fresh container: the import brings the probe outcomes back
    assert compile_cache.load_probe(key) is None
    assert warm_cache.main(_args("--import", str(tmp_path / "art"))) == 0
    assert compile_cache.load_probe(key) == {"kernel_rows": 32, "notice": ""}

    other = dict(manifest, gpu="NVIDIA H200", torch="2.11.0+cu128")
    (tmp_path / "art/manifest.json").write_text(json.dumps(other))
    with pytest.raises(compile_cache.ArtifactMismatch, match=r"gpu: made for NVIDIA H200, here .*torch: made for"):
        compile_cache.import_artifacts(tmp_path / "art")
    with pytest.raises(compile_cache.ArtifactMismatch, match="no manifest.json"):
        compile_cache.import_artifacts(tmp_path / "nothing")


def test_our_triton_kernels_travel_in_the_artifacts(cache, tmp_path, monkeypatch):
    import tarfile

    built = tmp_path / "triton_here"  # Triton's cache after a warm-up: one folder per kernel hash
    (built / "abc123").mkdir(parents=True)
    (built / "abc123/kernel.cubin").write_bytes(b"\x7fELF kernel")
    (built / "abc123/kernel.json").write_text('{"name": "kernel"}')
    monkeypatch.setenv("TRITON_CACHE_DIR", str(built))
    manifest = compile_cache.export_artifacts(tmp_path / "art")
    assert manifest["triton_cache_files"] == 2

    fresh = tmp_path / "triton_fresh"  # a new container's empty cache, one file of its own already there
    (fresh / "abc123").mkdir(parents=True)
    (fresh / "abc123/kernel.json").write_text("mine")
    monkeypatch.setenv("TRITON_CACHE_DIR", str(fresh))
    compile_cache.import_artifacts(tmp_path / "art")
    assert (fresh / "abc123/kernel.cubin").read_bytes() == b"\x7fELF kernel"
    assert (fresh / "abc123/kernel.json").read_text() == "mine"  # what was there is kept

    evil = tmp_path / "evil.tar.gz"  # an archive whose member would land outside the cache folder
    (tmp_path / "payload").write_text("x")
    with tarfile.open(evil, "w:gz") as tar:
        tar.add(tmp_path / "payload", arcname="../escaped")
    evil.replace(tmp_path / "art" / compile_cache.TRITON_ARCHIVE)
    with pytest.raises(compile_cache.ArtifactMismatch, match="not a readable Triton cache archive"):
        compile_cache.import_artifacts(tmp_path / "art")
    assert not (tmp_path / "escaped").exists()


def test_the_tool_says_what_is_wrong_in_one_line(cache, tmp_path, capsys):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad/manifest.json").write_text(json.dumps({**compile_cache.machine(), "triton": "0.0"}))
    assert warm_cache.main(_args("--import", str(tmp_path / "bad"))) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "triton: made for 0.0" in err and "\n" not in err
    with pytest.raises(SystemExit):
        _args("--import", "a", "--export", "b")  # one or the other
    assert warm_cache.main(_args("--export", str(tmp_path / "x"), "--preset", "nope")) == 2
    assert "preset 'nope' not found" in capsys.readouterr().err


def test_a_mismatched_artifacts_folder_does_not_stop_the_start(cache, tmp_path, monkeypatch):
    (tmp_path / "art").mkdir()
    (tmp_path / "art/manifest.json").write_text(json.dumps({**compile_cache.machine(), "gpu": "other"}))
    monkeypatch.setenv(compile_cache.ARTIFACTS_ENV, str(tmp_path / "art"))
    monkeypatch.setattr(compile_cache, "_prepared", {})  # as in a fresh process
    said = []
    report = compile_cache.prepare(said.append)
    assert report.startswith("compile artifacts not used:") and "gpu: made for other" in report and said == [report]


IMPORT_AND_COMPILE = """
import sys, torch._dynamo.utils as u
from omni_tts.config import EngineConfig
from omni_tts.engine.engine import Engine
e = Engine.from_config(EngineConfig(model=sys.argv[1], device="cpu", mode="default", modes=["default"],
                                    max_num_seqs=1, max_seq_len=128))
print("report:", __import__("omni_tts.engine.compile_cache", fromlist=["x"])._prepared.get("report"))
print("hits:", u.counters["inductor"]["fxgraph_cache_hit"], "misses:", u.counters["inductor"]["fxgraph_cache_miss"])
e.shutdown()
"""


@pytest.mark.slow
def test_exported_default_mode_compiles_from_artifacts_in_a_fresh_process(tmp_path):
    # the export may read the suite's Inductor cache (a warm cache exports the same artifacts, and other
    # tests compile this mode too); the importing process starts with empty caches
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), OMNI_TTS_CACHE_DIR=str(tmp_path / "made"),
               TORCHINDUCTOR_CACHE_DIR=cache_dir())
    sets = ["--set", "modes=[eager,default]", "--set", "device=cpu", "--set", "max_num_seqs=1",
            "--set", "max_seq_len=128"]
    made = subprocess.run([sys.executable, "-c", "import sys, argparse; from omni_tts.tools import warm_cache as w; "
                           "p = argparse.ArgumentParser(); w.add_arguments(p); sys.exit(w.main(p.parse_args()))",
                           "--export", str(tmp_path / "art"), "--model", str(FIXTURE), *sets],
                          env=env, capture_output=True, text=True, timeout=1800)
    assert made.returncode == 0, made.stderr[-2000:]
    manifest = json.loads((tmp_path / "art/manifest.json").read_text())
    if not manifest["torch_artifacts"]:
        pytest.skip("this torch build gives no compile artifacts on a CPU (manifest and refusals tested above)")
    fresh = dict(env, OMNI_TTS_CACHE_DIR=str(tmp_path / "fresh"), OMNI_TTS_ARTIFACTS=str(tmp_path / "art"))
    for key in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        fresh.pop(key, None)
    run = subprocess.run([sys.executable, "-c", IMPORT_AND_COMPILE, str(FIXTURE)], env=fresh, capture_output=True,
                         text=True, timeout=1800)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "report: compile artifacts imported from" in run.stdout
    hits = int(run.stdout.split("hits:")[1].split()[0])
    misses = int(run.stdout.split("misses:")[1].split()[0])
    assert hits > 0 and misses == 0, run.stdout  # every Inductor graph came from the imported artifacts
