"""omni_tts.tools.kernel_sweep's pure parts on the CPU: the candidate configs, the choice, the JSON it writes
being what omni_tts.kernels.configs loads from the preset key kernel_configs, and its refusal without CUDA."""

from __future__ import annotations

import json

import pytest
import torch

from omni_tts.kernels import configs as kernel_configs
from omni_tts.models.compiled import kernel_choice
from omni_tts.tools import kernel_sweep
from omni_tts.tools.cli import main


def test_candidates_offer_multiply_and_sum_tiles_only_up_to_8_rows() -> None:
    few, many = kernel_sweep.candidates(8), kernel_sweep.candidates(16)
    assert any(c[4] for c in few) and not any(c[4] for c in many)
    assert all(c[0] >= 16 for c in many)  # tensor-core tiles need 16 weight rows
    assert len(set(few)) == len(few) and set(many) < set(few)


def test_from_32_rows_tensor_core_tiles_are_also_offered_on_fewer_rows_a_program() -> None:
    """The sixth field (rows a program) only on 4-stage tensor-core tiles from 32 rows, below the rows a program
    would take (at most MAX_BM); the table keeps it through the JSON and config() answers it."""
    for rows, caps in ((16, set()), (32, {16}), (64, {16, 32}), (128, {16, 32})):
        capped = [c for c in kernel_sweep.candidates(rows, quick=True, K=1024) if len(c) == 6]
        assert {c[5] for c in capped} == caps and all(not c[4] and c[2] == 4 for c in capped)
    entry = {(64, 1024, 2048): (16, 128, 4, 4, False, 16)}
    assert kernel_sweep.configs_json(entry) == {"64,1024,2048": [16, 128, 4, 4, False, 16]}


def test_a_written_config_with_rows_a_program_loads_as_it_was(tmp_path, monkeypatch) -> None:
    f = tmp_path / "configs.json"
    best = {(64, 1024, 2048): (16, 128, 4, 4, False, 16), (32, 4096, 1024): (32, 256, 4, 4, False)}
    kernel_sweep.write(best, str(f))
    monkeypatch.setattr(kernel_configs, "TUNED", {})
    monkeypatch.setattr(kernel_configs, "_INTERPRET", False)  # config() answers from the table, as on a GPU
    kernel_configs.load_configs(str(f))
    assert kernel_configs.TUNED == best and kernel_configs.config(40, 1024, 2048) == (16, 128, 4, 4, False, 16)


def test_tiles_above_32_rows_are_wider_and_shorter() -> None:
    wide, narrow = kernel_sweep.candidates(64, quick=True), kernel_sweep.candidates(32, quick=True)
    assert {c[0] for c in wide} == {16, 32, 64} and {c[1] for c in wide} == {64, 128, 256}
    assert {c[0] for c in narrow} == {16, 32} and not any(c[4] for c in wide)


def test_whole_row_tiles_are_offered_up_to_8_rows_given_the_input_width() -> None:
    one, eight = kernel_sweep.candidates(1, quick=True, K=3072), kernel_sweep.candidates(8, quick=True, K=3072)
    for cands in (one, eight):
        whole = [c for c in cands if c[1] >= 3072]
        assert whole and all(c[1] == 4096 and c[4] for c in whole)  # BK: the power of two covering K
    assert set(kernel_sweep.candidates(1, quick=True)) < set(one)
    assert {c[0] for c in eight if c[1] >= 3072} == {2, 4, 8}  # no one-weight-row tiles past one row
    assert not any(c[1] >= 3072 for c in kernel_sweep.candidates(16, K=3072))


def test_one_row_also_gets_one_weight_row_tiles_and_pipelined_pieces_narrower_than_its_input() -> None:
    one, two = kernel_sweep.candidates(1, quick=True, K=6144), kernel_sweep.candidates(2, quick=True, K=6144)
    pieces = {c for c in one if c[4] and c[1] in (1024, 2048)}
    assert {c[0] for c in pieces} == {1, 2, 4} and {c[2] for c in pieces} == {2, 3}
    assert (1, 8192, 1, 4, True) in one and not pieces & set(two)
    assert not any(c[1] == 2048 and c[2] > 1 for c in kernel_sweep.candidates(1, quick=True, K=2048))


def test_one_row_whole_row_tiles_also_come_on_one_and_two_warps() -> None:
    """One warp's sums stay inside the warp (no barrier): offered for one row's whole-row tiles only."""
    def warps(rows: int) -> set[int]:
        return {c[3] for c in kernel_sweep.candidates(rows, quick=True, K=1024) if c[1] >= 1024 and c[4]}
    assert warps(1) == {1, 2, 4, 8} and warps(2) == {4, 8}


def test_tensor_core_whole_row_tiles_are_offered_for_2_to_16_rows_of_narrow_inputs() -> None:
    """Whole-row tensor-core tiles load a program's weights before the PDL wait, as one row's tiles do; only
    where K fits (WHOLE_ROW_TC_K) and for the row counts that pad to one 16-row tile."""
    K = kernel_sweep.WHOLE_ROW_TC_K
    for rows in (2, 8, 16):
        whole = [c for c in kernel_sweep.candidates(rows, quick=True, K=K) if c[1] >= K and not c[4]]
        assert whole and all(c[0] >= 16 and c[2] == 1 for c in whole)
    assert not any(c[1] >= K for c in kernel_sweep.candidates(32, quick=True, K=K))
    assert not any(c[1] >= 2 * K and not c[4] for c in kernel_sweep.candidates(8, quick=True, K=2 * K))


def test_fastest_picks_the_least_time() -> None:
    a, b, c = (16, 128, 3, 4, False), (32, 256, 4, 4, False), (8, 512, 3, 4, True)
    assert kernel_sweep.fastest({a: 5.0, b: 3.5, c: 4.0}) == b


def test_written_configs_are_what_the_kernels_load(tmp_path, monkeypatch) -> None:
    best = {(8, 4096, 1024): (32, 256, 4, 4, False), (1, 1024, 3072): (4, 512, 4, 8, True)}
    f = tmp_path / "configs.json"
    kernel_sweep.write(best, str(f))
    monkeypatch.setattr(kernel_configs, "TUNED", {})
    monkeypatch.setattr(kernel_configs, "_INTERPRET", False)  # config() answers from the table, as on a GPU
    kernel_configs.load_configs(str(f))
    assert kernel_configs.TUNED == best
    f.write_text(json.dumps({"choose_warps": 16, "choose_sort_free": False}))
    monkeypatch.setattr(kernel_configs, "CHOOSE_WARPS", 8)
    monkeypatch.setattr(kernel_configs, "CHOOSE_SORT_FREE", True)
    kernel_configs.load_configs(str(f))
    assert kernel_configs.CHOOSE_WARPS == 16 and not kernel_configs.CHOOSE_SORT_FREE and kernel_configs.TUNED == best
    monkeypatch.setattr(kernel_configs, "TALKER_PDL_ROWS", 1)
    monkeypatch.setattr(kernel_configs, "TALKER_KERNEL_ROWS", 8)
    kernel_sweep.write(best, str(f), {"talker_pdl_rows": 4})  # a sweep run with --talker-pdl-rows 4
    limits = kernel_choice.limits()
    kernel_configs.load_configs(str(f))
    assert kernel_configs.TALKER_PDL_ROWS == 4 and kernel_configs.TUNED == best
    assert kernel_choice.limits() != limits  # a probe kept under the other PDL rows does not hold
    kernel_sweep.write(best, str(f), {"talker_kernel_rows": 32})  # --talker-kernel-rows 32
    limits = kernel_choice.limits()
    kernel_configs.load_configs(str(f))
    assert kernel_configs.TALKER_KERNEL_ROWS == 32 and kernel_configs.TALKER_PDL_ROWS == 4
    assert kernel_choice.limits() != limits
    assert kernel_configs.config(5, 4096, 1024) == (32, 256, 4, 4, False)  # 5 rows use the 8-row entry
    assert kernel_configs.config(12, 4096, 1024) == (32, 256, 4, 4, False)  # so do 9..16 (same 16-row tile)
    assert kernel_configs.config(1, 1024, 3072) == (4, 512, 4, 8, True)
    assert kernel_configs.config(1, 64, 32) == (8, 512, 3, 4, True)  # untuned shapes take the default
    assert kernel_configs.config(20, 4096, 1024) == (16, 256, 3, 4, False)  # no 32-row entry: the default
    kernel_configs.TUNED[(64, 4096, 1024)] = (64, 128, 3, 4, False)
    assert kernel_configs.config(128, 4096, 1024) == (64, 128, 3, 4, False)  # 65..128 rows: the 64-row entry
    assert kernel_configs.config(40, 4096, 1024) == (64, 128, 3, 4, False)


def test_a_key_that_is_neither_option_nor_entry_is_refused_by_name_and_nothing_loads(tmp_path, monkeypatch) -> None:
    """An option the kernels no longer read (or a typo) is one clear error naming it; the file's other keys,
    read before it, are not applied."""
    monkeypatch.setattr(kernel_configs, "TUNED", {})
    monkeypatch.setattr(kernel_configs, "CHOOSE_WARPS", 8)
    f = tmp_path / "configs.json"
    f.write_text(json.dumps({"choose_warps": 16, "8,4096,1024": [32, 256, 4, 4, False], "choose_bits": 2}))
    with pytest.raises(ValueError, match="'choose_bits' is neither an option .*choose_warps.* nor a 'rows,n,K' entry"):
        kernel_configs.load_configs(str(f))
    assert kernel_configs.CHOOSE_WARPS == 8 and kernel_configs.TUNED == {}


def test_a_sweeps_fold_rows_is_where_the_loaded_table_folds(tmp_path, monkeypatch, capsys) -> None:
    """--fold-rows N is written as the JSON's fold_rows; loaded, it is the engine's FOLD_ROWS and part of what a
    kept probe outcome depends on; a bound past 1..MAX_ROWS + 1 is refused in one line before anything runs."""
    monkeypatch.setattr(kernel_configs, "FOLD_ROWS", 33)
    f = tmp_path / "configs.json"
    kernel_sweep.write({}, str(f), {"fold_rows": 17})
    limits = kernel_choice.limits()
    kernel_configs.load_configs(str(f))
    assert kernel_configs.FOLD_ROWS == 17 and kernel_choice.limits() != limits
    for bad in ("0", "130"):
        assert main(["kernel-sweep", "--fold-rows", bad, "--out", str(tmp_path / "unused.json")]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: --fold-rows must be within 1..129") and err.count("\n") == 1
    assert not (tmp_path / "unused.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_sweep_refuses_without_cuda(capsys) -> None:
    assert main(["kernel-sweep", "--out", "unused.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "needs CUDA" in err and err.count("\n") == 1


@pytest.mark.parametrize("part,rows", [("predictor", 8), ("talker", 8), ("predictor", 40), ("talker", 40)])
def test_the_in_layer_sweep_times_candidates_where_they_run_and_keeps_the_fastest(monkeypatch, part: str,
                                                                                  rows: int) -> None:
    """The layer-step sweep on the CPU (Triton's interpreter; a stand-in for the CUDA-graph timer that runs a
    layer step and scores the table as the step would read it): while a candidate is timed the table answers
    it for its shape and the picks so far for the shapes before; each pick is the best-scored candidate, and
    the table is itself again afterwards."""
    monkeypatch.setattr(kernel_configs, "_INTERPRET", False)  # config() answers from the table, as on a GPU
    before = dict(kernel_configs.TUNED)
    cpu = torch.device("cpu")  # 40 rows: the norms as kernels of their own
    layer = kernel_sweep._layer("tiny", part, cpu, torch.float32)
    w_qkv, _, w_gu = kernel_sweep.fuse_layer(layer)
    D = layer.input_layernorm.weight.shape[0]
    shapes = list(kernel_sweep.projection_shapes(layer, w_qkv, w_gu).values())

    def cost(cfg: tuple) -> float:
        return cfg[0] * 1000 + cfg[1] + cfg[2] / 10 + cfg[3] / 100 + cfg[4] / 2

    ran: list[torch.Tensor] = []

    def timer(steps, launches: int) -> float:
        if not ran:  # one real layer step under the candidate's config
            ran.append(steps[0]())
        return sum(cost(kernel_configs.config(rows, n, K)) for n, K in shapes)

    seen: list[int] = []
    best: dict = {}
    kernel_sweep._sweep_in_layer("tiny", part, [rows], lambda line: None, False, True, best,
                                 lambda picks: seen.append(len(picks)), dev=cpu, dt=torch.float32, timer=timer)
    assert ran[0].shape == (rows, 1, D) and torch.isfinite(ran[0]).all()
    assert seen == list(range(1, len(set(shapes)) + 1))  # tiny projections may share a shape: one entry, timed once
    for n, K in shapes:
        offered = [kernel_configs.config(rows, n, K), *kernel_sweep.candidates(rows, True, K)]
        assert best[(kernel_configs.next_pow2(rows), n, K)] == min(offered, key=cost)
    assert kernel_configs.TUNED == before


def test_a_table_override_holds_inside_its_block_only(monkeypatch) -> None:
    monkeypatch.setattr(kernel_configs, "_INTERPRET", False)
    before = dict(kernel_configs.TUNED)
    new, fresh = (4, 128, 2, 8, True), (3, 4096, 1024)
    assert fresh not in before
    with kernel_configs.override({(8, 4096, 1024): new, fresh: new}):
        assert kernel_configs.config(8, 4096, 1024) == new and kernel_configs.config(3, 4096, 1024) != new
        assert kernel_configs.TUNED[fresh] == new
    assert kernel_configs.TUNED == before


@pytest.mark.parametrize("argv,refusal", [
    (["--talker-pdl-rows", "9"], "--talker-pdl-rows must be within 0..8 (the talker's Triton rows)"),
    (["--talker-kernel-rows", "4", "--talker-pdl-rows", "6"], "--talker-pdl-rows must be within 0..4"),
    (["--talker-kernel-rows", "200"], "--talker-kernel-rows must be within 0..128"),
    (["--talker-kernel-rows", "16", "--talker-pdl-rows", "9"], None)])  # valid: refused later for want of CUDA
def test_talker_rows_past_their_bounds_are_refused(capsys, monkeypatch, argv: list, refusal: str | None) -> None:
    if refusal is None and torch.cuda.is_available():
        pytest.skip("valid rows would run the sweep")
    monkeypatch.setattr(kernel_configs, "TALKER_KERNEL_ROWS", 8)
    assert main(["kernel-sweep", *argv, "--out", "unused.json"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and (refusal or "needs CUDA") in err
