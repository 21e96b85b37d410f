"""Bucket choice (CPU) and CUDA graph capture into one shared pool (skipped without CUDA)."""

from __future__ import annotations

import threading

import pytest
import torch

from omni_tts.config import EngineConfig
from omni_tts.engine.cuda_graphs import BucketedGraph, GraphPool, graph_attention, pick_bucket


@pytest.mark.parametrize("n,buckets,want", [
    (1, [1, 2, 4, 8], 1), (3, [1, 2, 4, 8], 4), (4, [1, 2, 4, 8], 4), (5, [1, 2, 4, 8], 8),
    (9, [1, 2, 4, 8], None), (3, [8, 1, 4, 2], 4), (2, (6,), 6), (7, {1, 6}, None), (1, [], None),
])
def test_pick_bucket_is_the_smallest_bucket_that_fits(n, buckets, want):
    assert pick_bucket(n, buckets) == want


@pytest.mark.parametrize("max_num_seqs,buckets,want", [
    (1, None, [1]), (2, None, [1, 2]), (6, None, [1, 2, 4, 6]), (8, None, [1, 2, 4, 8]),
    (32, None, [1, 2, 4, 8, 16, 32]), (20, None, [1, 2, 4, 8, 16, 20]),
    (8, [4, 2, 4], [2, 4, 8]),  # deduplicated, sorted, max_num_seqs always present
    (8, [1, 16, 0, -2, 8], [1, 8]),  # out-of-range buckets dropped
    (3, [3], [3]), (5, [], [1, 2, 4, 5]),  # an empty list means the default
])
def test_resolved_buckets(max_num_seqs, buckets, want):
    cfg = EngineConfig(max_num_seqs=max_num_seqs, buckets=buckets)
    assert cfg.resolved_buckets() == want


def test_predictor_buckets_leave_out_32_at_64_slots_and_none_means_the_buckets():
    cfg = EngineConfig(max_num_seqs=64)
    assert cfg.resolved_predictor_buckets() == [1, 2, 4, 8, 16, 64]
    assert cfg.resolved_buckets() == [1, 2, 4, 8, 16, 32, 64]
    small = EngineConfig(max_num_seqs=32)  # the 64-row frame is past max_num_seqs: the predictor's are the buckets
    assert small.resolved_predictor_buckets() == small.resolved_buckets() == [1, 2, 4, 8, 16, 32]
    same = EngineConfig(max_num_seqs=64, buckets=[1, 4, 16], predictor_buckets=None)
    assert same.resolved_predictor_buckets() == same.resolved_buckets() == [1, 4, 16, 64]
    sparse = EngineConfig(max_num_seqs=64, buckets=[1, 4, 32])  # a subset: no predictor shape the talker lacks
    assert sparse.resolved_predictor_buckets() == [1, 4, 64]


def test_every_batch_size_up_to_max_num_seqs_has_a_bucket():
    for s in range(1, 40):
        buckets = EngineConfig(max_num_seqs=s).resolved_buckets()
        assert all(pick_bucket(n, buckets) is not None for n in range(1, s + 1))
        assert pick_bucket(s + 1, buckets) is None


def test_cudnn_attention_is_on_only_while_some_capture_runs():
    """cuDNN's attention (a kernel built at run time per shape) is on while any capture runs, in any
    thread, and off once the last one ends."""
    was = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(False)
    try:
        seen: list[bool] = []
        with graph_attention():
            seen.append(torch.backends.cuda.cudnn_sdp_enabled())

            def other_capture() -> None:
                with graph_attention():
                    seen.append(torch.backends.cuda.cudnn_sdp_enabled())

            t = threading.Thread(target=other_capture)
            t.start()
            t.join()
            seen.append(torch.backends.cuda.cudnn_sdp_enabled())  # the other one ended, this one runs
        assert seen == [True, True, True] and not torch.backends.cuda.cudnn_sdp_enabled()
        with pytest.raises(RuntimeError), graph_attention():
            raise RuntimeError("a failed capture")
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(was)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA GPU")


@cuda
def test_bucketed_graph_replays_equal_eager_and_pad_rows_do_not_leak():
    dev = torch.device("cuda")
    x = torch.randn(8, 16, device=dev)
    w = torch.randn(16, 16, device=dev)
    out = torch.zeros(8, 16, device=dev)

    def make(b):
        def fn():
            y = torch.tanh(x[:b] @ w)  # row-independent
            out[:b] = y
            return (y, y.sum(-1))
        return fn

    pool = GraphPool(use_vllm=False)
    g = BucketedGraph("t", make, [1, 2, 4, 8], pool)
    rep = g.capture()
    assert rep.buckets == [1, 2, 4, 8] and set(g.graphs) == {1, 2, 4, 8} and rep.seconds >= 0
    for n in (1, 3, 5, 8):
        x.copy_(torch.randn(8, 16, device=dev))
        y, s = g.run(n)
        assert y.shape == (n, 16) and s.shape == (n,)
        torch.testing.assert_close(y, torch.tanh(x[:n] @ w))
        torch.testing.assert_close(s, torch.tanh(x[:n] @ w).sum(-1))
    g.release()
    assert g.graphs == {}


@cuda
def test_graph_pool_renews_after_release_and_recaptures():
    dev = torch.device("cuda")
    x = torch.randn(4, 8, device=dev)
    pool = GraphPool(use_vllm=False)
    first = pool.handle
    assert pool.generation == 1 and pool.source == "engine pool #1"
    g = BucketedGraph("t", lambda b: (lambda: (x[:b] * 2,)), [2, 4], pool)
    pool.begin_capture()  # an unused pool is kept
    assert pool.generation == 1 and pool.handle == first
    g.capture()
    g.release()
    pool.begin_capture()  # it held graphs: a fresh pool
    assert pool.generation == 2 and pool.handle != first and pool.source == "engine pool #2"
    g.capture()
    (y,) = g.run(3)
    torch.testing.assert_close(y, x[:3] * 2)
    g.release()


@cuda
def test_batch_above_the_largest_bucket_runs_ungraphed_and_correct():
    dev = torch.device("cuda")
    x = torch.randn(6, 4, device=dev)
    g = BucketedGraph("t", lambda b: (lambda: (x[:b] + 1,)), [1, 2], GraphPool(use_vllm=False))
    g.capture()
    (y,) = g.run(5)
    torch.testing.assert_close(y, x[:5] + 1)
    g.release()


@cuda
def test_a_graph_survives_what_inductor_graph_trees_do_to_cublas_workspaces():
    """Inductor's graph trees (reduce-overhead) clear cuBLAS's workspace cache, and torch.cuda.graph's
    empty_cache then unmaps what that freed: a captured GEMM must not use a workspace from that cache."""
    dev = torch.device("cuda")
    # tall-K products, which cuBLAS splits over K with a workspace
    xs = [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for m, k in ((4, 16384), (8, 32768), (16, 65536))]
    ws = [torch.randn(256, x.shape[1], device=dev, dtype=torch.bfloat16) / x.shape[1] ** 0.5 for x in xs]
    g = BucketedGraph("t", lambda b: (lambda: tuple(x @ w.t() for x, w in zip(xs, ws))), [1],
                      GraphPool(use_vllm=False))
    g.capture()
    torch._C._cuda_clearCublasWorkspaces()
    torch.cuda.empty_cache()
    for y, x, w in zip(g.run(1), xs, ws):
        torch.testing.assert_close(y, (x @ w.t())[:1])
    torch.cuda.synchronize()
    g.release()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_first_chunk_graphs_equal_the_eager_decode():
    from _fixtures import fixture_dir

    from omni_tts.engine.codec_graphs import FirstChunkGraphs
    from omni_tts.models.checkpoint import load_checkpoint
    from omni_tts.models.codec.decoder import CodecDecoder

    codec = CodecDecoder.from_checkpoint(load_checkpoint(fixture_dir("custom_voice"))).cuda().set_precision("tf32")
    first = FirstChunkGraphs(codec, 1, [1, 4])
    for n in (1, 3, 4):
        codes, more = torch.randint(0, 2048, (n, 1, 16)), torch.randint(0, 2048, (n, 3, 16))
        wav, carry = first(codec, codes)
        with torch.inference_mode():
            eager = {}
            assert not wav.requires_grad and torch.equal(wav, codec.decode_carried(codec.prepare(codes), eager))
            assert list(carry) == list(eager) and all(torch.equal(carry[k], eager[k]) for k in carry)
            nxt = codec.decode_carried(codec.prepare(more), carry)  # the streams continue from the graph's state
        want = codec.decode_window(torch.cat([codes, more], dim=1), 1)
        assert float((nxt - want).abs().max()) <= 1e-3
    assert first(codec, torch.zeros(5, 1, 16, dtype=torch.long)) is None  # above the largest bucket
    assert first(codec, torch.zeros(1, 2, 16, dtype=torch.long)) is None  # another chunk length
