"""Compile omni_tts.kernels' Triton kernels for an sm_90 GPU (the H200's) on a machine without one, with
the ptxas that Triton's wheel ships: the CPU interpreter runs what the GPU compiler may refuse (an
omitted constexpr default between jit functions, say). Run as a script without TRITON_INTERPRET; prints
one JSON object {variant: "ok" or the error}. Shapes are the 1.7B checkpoint's."""

from __future__ import annotations

import json
import os
import sys

assert os.environ.get("TRITON_INTERPRET") != "1", "the interpreter replaces the compiler"

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from omni_tts.kernels import configs, heads, layers, snake, talker  # noqa: E402
from omni_tts.kernels import projection as projection_kernels  # noqa: E402

PTR = {torch.bfloat16: "*bf16", torch.float32: "*fp32", torch.int32: "*i32", torch.int64: "*i64"}
BF, F32, I64 = torch.bfloat16, torch.float32, torch.int64
D, H, HKV, HD, P, V = 1024, 16, 8, 128, 16, 2048  # the predictor's sizes


def signature(fn, args: dict, constexprs: dict) -> dict[str, str]:
    """Triton's type of every argument: pointers by dtype, Python ints as i32, floats as fp32."""
    sig = {}
    for name in fn.arg_names:
        v = constexprs.get(name, args.get(name))
        sig[name] = ("constexpr" if name in constexprs else PTR[v] if isinstance(v, torch.dtype)
                     else "fp32" if isinstance(v, float) else "i32")
    return sig


def build(fn, args: dict, constexprs: dict, warps: int = 4, stages: int = 1, pdl: bool = False) -> str:
    try:
        opts = {"num_warps": warps, "num_stages": stages, **({"launch_pdl": True} if pdl else {})}
        triton.compile(ASTSource(fn, signature(fn, args, constexprs), constexprs), target=GPUTarget("cuda", 90, 32),
                       options=opts)
        return "ok"
    except Exception as e:  # the compiler's message, first lines
        return f"{type(e).__name__}: {str(e)[-600:]}"


def projection(M: int, n: int, k: int, flags: dict) -> str:
    """The projection kernel built as projection.projection launches it for M rows of an [n, k] weight under the
    table's config (its BM and whole-row ROWS rule)."""
    cfg = configs.config(M, n, k)
    BN, BK, stages, warps, vec = cfg[:5]
    BM = projection_kernels.rows_a_program(M, cfg)
    cx = dict(M=M, N=n, K=k, NORM=False, RSTD=False, BIAS=False, RES=False, GLU=False, IEEE=False, VEC=vec,
              PDL=True, BM=BM, BN=BN, BK=BK, ROWS=vec and BM > 1 and BK >= k)
    args = dict(x_ptr=BF, nw_ptr=BF, w_ptr=BF, b_ptr=BF, res_ptr=BF, out_ptr=BF, eps=1e-6, sx=k)
    return build(projection_kernels._proj_kernel, args, {**cx, **flags}, warps, stages, pdl=True)


def projections() -> dict[str, str]:
    out = {}
    for name, M, n, k, flags in (("qkv 1 row", 1, 4096, D, dict(NORM=True)),
                                 ("qkv 8 rows", 8, 4096, D, dict(NORM=True)),  # tensor cores on whole rows
                                 ("qkv 16 rows", 16, 4096, D, dict(NORM=True)),
                                 ("gate|up 8 rows", 8, 3072, D, dict(NORM=True, GLU=True)),
                                 ("down 64 rows", 64, D, 3072, dict(RES=True)),
                                 ("head 4 rows", 4, V, D, dict(NORM=True, BIAS=True)),
                                 # from FOLD_ROWS rows the norms are folded into the weights
                                 ("qkv 40 rows folded", 40, 4096, D, dict(RSTD=True)),
                                 ("qkv 64 rows folded", 64, 4096, D, dict(RSTD=True)),
                                 ("gate|up 64 rows folded", 64, 3072, D, dict(RSTD=True, GLU=True)),
                                 ("head 64 rows folded", 64, V, D, dict(RSTD=True)),
                                 # a 64-row frame's first step: two positions a row
                                 ("qkv 128 rows folded", 128, 4096, D, dict(RSTD=True)),
                                 ("o 128 rows", 128, D, 2048, dict(RES=True)),
                                 ("gate|up 128 rows folded", 128, 3072, D, dict(RSTD=True, GLU=True)),
                                 ("down 128 rows", 128, D, 3072, dict(RES=True))):
        out[f"projection {name}"] = projection(M, n, k, flags)
    for n, k, flags in ((4096, D, dict(NORM=True)), (D, 2048, dict(RES=True)), (3072, D, dict(NORM=True, GLU=True)),
                        (D, 3072, dict(RES=True))):  # the predictor's shapes at two rows: rows in turn, whole rows
        out[f"projection 2 rows {n}x{k}"] = projection(2, n, k, flags)
    for n, k, flags in ((4096, D, dict(RSTD=True)), (D, 2048, dict(RES=True))):  # 64 rows, 16 a program (a sweep's)
        with configs.override({(64, n, k): (16, 128, 4, 4, False, 16)}):
            out[f"projection 64 rows {n}x{k}, 16 a program"] = projection(64, n, k, flags)
    for n, k, flags in ((4096, D, dict(NORM=True)), (D, 3072, dict(RES=True))):  # one row on one warp (a sweep's)
        with configs.override({(1, n, k): (2, configs.next_pow2(k), 1, 1, True)}):
            out[f"projection 1 row {n}x{k} on one warp"] = projection(1, n, k, flags)
    for M in (1, 2):  # the 1.7B talker's at one and two rows
        for n, k, flags in ((4096, 2048, dict(NORM=True)), (2048, 2048, dict(RES=True)),
                            (6144, 2048, dict(NORM=True, GLU=True)), (2048, 6144, dict(RES=True))):
            out[f"talker projection {M} rows {n}x{k}"] = projection(M, n, k, flags)
    return out


def attention() -> dict[str, str]:
    args = dict(y_ptr=BF, qn_ptr=BF, kn_ptr=BF, cos_ptr=BF, sin_ptr=BF, kc_ptr=BF, vc_ptr=BF, out_ptr=BF, pos0=0,
                eps=1e-6, scale=0.1)
    return {f"predictor attention T={T}": build(layers._attn_kernel, args, dict(T=T, H=H, HKV=HKV, HD=HD, P=P, BD=HD,
                                                BP=P, PDL=True), 1, pdl=True) for T in (1, 2)}


def choice() -> dict[str, str]:
    args = dict(logits_ptr=BF, greedy_ptr=torch.int32, temp_ptr=F32, topk_ptr=I64, topp_ptr=F32, seed_ptr=I64,
                frame_ptr=I64, codebook=3, table_ptr=BF, esum_ptr=F32, code_ptr=I64, fed_ptr=BF, next_ptr=BF)
    return {f"choice sample={s} fed={f}": build(heads._choose_kernel, args, dict(
                V=V, D=2048, BV=V, CAP=64, BD=2048, DN=D, BDN=D, FED=f, SAMPLE=s, SORT_BELOW=1.0,
                KEY_BITS=16, PDL=True), configs.CHOOSE_WARPS, pdl=True)
            for s in (True, False) for f in (True, False)}


def talker_attention() -> dict[str, str]:
    common = dict(y_ptr=BF, qn_ptr=BF, kn_ptr=BF, cos_ptr=BF, sin_ptr=BF, pos_ptr=I64, kc_ptr=BF, vc_ptr=BF, eps=1e-6,
                  kc_row=1 << 20, kc_head=1 << 16)
    cx = dict(H=H, HKV=HKV, HD=HD, BD=HD)
    block = talker.ATTEND_BLOCK
    # the whole bucket in one program, and split in five (one-row steps over 1025 positions)
    splits = [(S, BF if S == 1 else F32, dict(BL=block, CH=ch, S=S, TO_POS=True))
              for S, ch in ((1, 9 * block), (5, 2 * block))]
    return {
        "talker rope + cache": build(talker._rope_cache_kernel, {**common, "q_ptr": BF}, {**cx, "PDL": True}, 1,
                                     pdl=True),
        **{f"talker rope + attend S={S} early={e}": build(talker._rope_attend_kernel, {**common, "a_ptr": a,
                                                          "pm_ptr": F32, "pl_ptr": F32, "scale": 0.1},
                                                          {**cx, **split, "PDL": True, "EARLY": e},
                                                          talker.ATTEND_WARPS, pdl=True)
           for S, a, split in splits for e in (True, False)},
        **{f"talker attend S={S}": build(talker._attend_kernel, dict(q_ptr=BF, pos_ptr=I64, kc_ptr=BF, vc_ptr=BF,
                                         a_ptr=a, pm_ptr=F32, pl_ptr=F32, scale=0.1, q_row=4096, q_head=128,
                                         kc_row=1 << 20, kc_head=1 << 16), {**cx, **split}, talker.ATTEND_WARPS)
           for S, a, split in splits},
        "talker split join": build(talker._combine_kernel, dict(po_ptr=F32, pm_ptr=F32, pl_ptr=F32, a_ptr=BF),
                                   dict(H=H, HD=HD, BD=HD, S=5, BS=8, PDL=True), talker.COMBINE_WARPS, pdl=True),
    }


def codec() -> dict[str, str]:
    args = dict(x_ptr=F32, bias_ptr=F32, res_ptr=F32, h_ptr=F32, alpha_ptr=F32, beta_ptr=F32, out_ptr=F32, C=1536,
                T=25, pad=6, sxb=1536 * 31, sxc=31, sxt=1, sxr=0, sob=1536 * 31, soc=1, sot=1536, sor=0, eps=1e-9)
    cx = dict(BIAS=True, RES=True, KEEP=True, BLOCK_C=snake.BLOCK_C, BLOCK_T=snake.BLOCK_T, PADB=16, FAST=True,
              I32=True)
    return {"snake": build(snake._snake_kernel, args, {**cx, "DX": 1, "DO": 1}, snake.WARPS),
            "snake in phases": build(snake._snake_kernel, args, {**cx, "PADB": 64, "DX": 3, "DO": 9}, snake.WARPS),
            "snake, 64-bit offsets": build(snake._snake_kernel, args, {**cx, "DX": 1, "DO": 1, "I32": False},
                                           snake.WARPS)}


if __name__ == "__main__":
    result = {**projections(), **attention(), **choice(), **talker_attention(), **codec()}
    json.dump(result, sys.stdout)
