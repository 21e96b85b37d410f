"""Token choice for the talker (codebook 0) and the code predictor (codebooks 1..15), per batch row.

Owns: per-row settings as device tensors (`SlotParams`: greedy, temperature, top-k, top-p, repetition
penalty; written by `transfer.put`, a copy the host never waits for), the logits processing of the
official generate in its order (repetition penalty over the request's previously generated code-0 ids ->
EOS masked before `min_frames` -> control tokens suppressed -> temperature -> top-k -> top-p), greedy
rows by exact argmax, and sampled rows by the Gumbel-max trick with noise from a counter-based integer
hash of (request seed, frame, codebook, vocab id). So a row's draw depends only on its own logits and
counters: it is reproducible per request whatever else shares the batch, and nothing here syncs with the
host, draws from a generator, or branches on tensor values (CUDA-graph and torch.compile friendly).
Knows nothing about models, prompts or requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni_tts.models import transfer

NEG_INF = float("-inf")
_M32 = 0xFFFFFFFF
# Rows whose top-k is 1..TOPK_CAP (or off with top-p 1) can be warped from one top-TOPK_CAP selection
# instead of a sort of the whole vocabulary (`warp_topk`); the engine picks that path per step when every
# row allows it (`fits_topk`). 64 covers the checkpoints' default top-k (50).
TOPK_CAP = 64


@dataclass
class RowSettings:
    """One request's settings for one stage (talker or code predictor)."""

    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # talker only

    @property
    def is_greedy(self) -> bool:
        """Greedy, or a temperature that rounds to greedy (<= 0)."""
        return bool(self.greedy) or self.temperature <= 0


@dataclass
class SamplingConstants:
    """Per-model constants of talker sampling: suppressed ids [V] (bool), the EOS id and its one-hot."""

    suppress: torch.Tensor  # [V] bool
    eos_onehot: torch.Tensor  # [V] bool
    eos_id: int
    min_frames: int = 2

    @classmethod
    def for_talker(cls, vocab_size: int, eos_id: int, device: torch.device | str,
                   num_control: int = 1024, min_frames: int = 2) -> SamplingConstants:
        """The official rule: ids [vocab - 1024, vocab) are control tokens, suppressed except EOS."""
        ids = torch.arange(vocab_size, device=device)
        eos = ids == eos_id
        return cls(suppress=(ids >= vocab_size - num_control) & ~eos, eos_onehot=eos, eos_id=eos_id,
                   min_frames=min_frames)


class SlotParams:
    """Per-row sampling settings as device tensors; `span(start, n)` and `rows(b)` are views (no copies).

    `all_greedy` is a host-side hint (never read from the tensors): True only when every row is known
    to be greedy, which lets `choose` skip the sampling branch. `set_rows` clears it. `topk_cap`, also a host
    hint: 0 warps with a full sort (any settings); K > 0 promises every row `fits_topk(row, K)`, so `choose`
    warps from a top-K selection (`warp_topk`)."""

    def __init__(self, greedy: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor, penalty: torch.Tensor, all_greedy: bool = False, topk_cap: int = 0) -> None:
        self.greedy, self.temperature, self.top_k, self.top_p, self.penalty = greedy, temperature, top_k, top_p, penalty
        self.all_greedy = all_greedy
        self.topk_cap = topk_cap

    @classmethod
    def zeros(cls, n: int, device: torch.device | str = "cpu") -> SlotParams:
        return cls(torch.ones(n, dtype=torch.bool, device=device), torch.ones(n, device=device),
                   torch.zeros(n, dtype=torch.long, device=device), torch.ones(n, device=device),
                   torch.ones(n, device=device))

    @classmethod
    def from_settings(cls, rows: list[RowSettings], device: torch.device | str = "cpu") -> SlotParams:
        sp = cls.zeros(len(rows), device)
        sp.set_rows(0, rows)
        sp.all_greedy = all(r.is_greedy for r in rows)
        return sp

    def _fields(self) -> tuple[torch.Tensor, ...]:
        return self.greedy, self.temperature, self.top_k, self.top_p, self.penalty

    def span(self, start: int, n: int, topk_cap: int = 0) -> SlotParams:
        """Rows [start, start + n) as views (with that `topk_cap` hint)."""
        return SlotParams(*(t[start:start + n] for t in self._fields()), all_greedy=self.all_greedy,
                          topk_cap=topk_cap)

    def rows(self, b: int, topk_cap: int = 0) -> SlotParams:
        return self.span(0, b, topk_cap)

    def set_rows(self, start: int, rows: list[RowSettings]) -> None:
        """Rows [start, start + len(rows)) from their settings: one host-to-device copy per field, not
        waited for (the copies are ordered before the kernels that read them)."""
        self.all_greedy = False
        for t, v in zip(self._fields(), self.columns(rows)):
            transfer.put(t[start:start + len(rows)], v)

    @staticmethod
    def columns(rows: list[RowSettings]) -> tuple[tuple, ...]:
        """The settings of `rows` as host columns in field order: greedy, temperature, top_k, top_p, penalty."""
        return tuple(zip(*((r.is_greedy, float(r.temperature) if r.temperature > 0 else 1.0, int(r.top_k or 0),
                            float(r.top_p if r.top_p is not None else 1.0), float(r.repetition_penalty or 1.0))
                           for r in rows)))

    def assign(self, start: int, other: SlotParams) -> None:
        """Rows [start, start + n) from the n rows of `other` (device copies, no host values)."""
        self.all_greedy = False
        for t, v in zip(self._fields(), other._fields()):
            t[start:start + v.shape[0]] = v

    def move(self, src: int, dst: int) -> None:
        for t in self._fields():
            t[dst] = t[src]
        self.all_greedy = False


# ---------------------------------------------------------------------------------------- noise
def _mul32(a: torch.Tensor, c: int) -> torch.Tensor:
    """(a * c) mod 2**32 for 0 <= a < 2**32 held in int64, with no int64 overflow (16-bit halves)."""
    lo, hi = c & 0xFFFF, (c >> 16) & 0xFFFF
    return (a * lo + (((a * hi) & 0xFFFF) << 16)) & _M32


def _fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3's 32-bit finaliser on non-negative int64 values < 2**32 (shifts are logical)."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def uniform_noise(seed: torch.Tensor, frame: torch.Tensor, codebook: int | torch.Tensor, vocab: int
                  ) -> torch.Tensor:
    """U(0,1) float32 [B, vocab], a pure function of (seed[b], frame[b], codebook, vocab id)."""
    seed = seed.long()
    h = _fmix32((seed & _M32) ^ 0x9E3779B9)  # [B]
    h = _fmix32(h ^ ((seed >> 32) & _M32))
    h = _fmix32(h ^ (frame.long() & _M32))
    cb = torch.zeros_like(h) + (codebook + 1)  # codebook: int, or a 0-dim tensor (one compiled graph for all)
    h = _fmix32(h ^ _mul32(cb, 0x27D4EB2F))
    ids = _fmix32(torch.arange(vocab, device=seed.device) + 0x165667B1)  # [V]
    x = _fmix32(h[:, None] ^ ids[None, :])  # [B, V]
    return ((x >> 9).float() + 0.5) * (1.0 / (1 << 23))  # 23 random bits, strictly inside (0, 1)


# ---------------------------------------------------------------------------------------- processing
def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: torch.Tensor) -> torch.Tensor:
    """HF rule on previously generated ids: negative logits multiplied, positive divided by the penalty."""
    p = penalty[:, None].to(logits.dtype)  # [B, 1]
    return torch.where(seen, torch.where(logits < 0, logits * p, logits / p), logits)  # [B, V]


def warp(logits: torch.Tensor, sp: SlotParams) -> torch.Tensor:
    """Temperature, top-k, top-p (HF semantics, per row) with one sort. logits: [B, V] float32 -> [B, V].

    One stable ascending sort serves both cuts. top-k keeps every value >= the k-th largest (ties with it
    included); masking the values below it to -inf leaves the sorted row sorted, so it is the sorted
    top-k-masked row. top-p then is HF's rule on it: drop sorted positions whose cumulative probability
    <= 1 - top_p, never the last (most likely). Same values, same order, same sums as sorting twice
    did (tests/test_sampling.py keeps that version); tied values at the top-p edge drop lower ids first."""
    V = logits.shape[-1]
    x = logits / sp.temperature[:, None]  # [B, V]
    k = torch.where(sp.top_k > 0, sp.top_k.clamp(max=V), torch.full_like(sp.top_k, V))  # [B]
    asc, order = torch.sort(x, dim=-1, stable=True)  # [B, V] ascending; x[b, order[b, i]] = asc[b, i]
    kth = asc.gather(1, (V - k)[:, None])  # [B, 1] k-th largest
    below = asc < kth  # [B, V] top-k cut (a prefix of the sorted row)
    cum = asc.masked_fill(below, NEG_INF).softmax(-1).cumsum(-1)  # [B, V]
    drop = below | ((cum <= (1 - sp.top_p)[:, None]) & (sp.top_p < 1)[:, None])
    drop[:, -1] = False  # keep at least the most likely token
    return x.masked_fill(drop.scatter(1, order, drop), NEG_INF)


def fits_topk(r: RowSettings, cap: int = TOPK_CAP) -> bool:
    """True when `warp_topk` with this cap warps a row of these settings exactly as `warp` does."""
    k, p = int(r.top_k or 0), 1.0 if r.top_p is None else float(r.top_p)
    return r.is_greedy or 1 <= k <= cap or (k == 0 and p >= 1.0)


def warp_topk(logits: torch.Tensor, sp: SlotParams, cap: int) -> torch.Tensor:
    """`warp` without the sort, for rows that `fits_topk(row, cap)`: the top-k threshold and the top-p cut
    come from the `cap` largest values (descending), since nothing outside them survives the top-k cut.
    logits: [B, V] float32 -> [B, V].

    top-p in descending order: HF drops a value when the probability of all values up to it in
    ascending order is <= 1 - top_p, i.e. when the probability strictly above it is >= top_p; the kept
    values are a prefix, cut below its last value. Same sets as `warp` (the sums run in another order,
    so a value exactly on the edge could differ in the last bit; a tie at the top-p edge keeps all its
    values, where `warp` drops the lower ids)."""
    x = logits / sp.temperature[:, None]  # [B, V]
    K = min(cap, x.shape[-1])
    top = torch.topk(x, K, dim=-1).values  # [B, K] descending
    kth = top.gather(1, (sp.top_k.clamp(min=1, max=K) - 1)[:, None])  # [B, 1] k-th largest
    kth = kth.masked_fill((sp.top_k <= 0)[:, None], NEG_INF)  # top-k off: no cut
    prob = top.masked_fill(top < kth, NEG_INF).softmax(-1)  # [B, K] over the top-k set
    above = prob.cumsum(-1) - prob  # [B, K] probability strictly above each value
    keep = (above < sp.top_p[:, None]).sum(-1, keepdim=True).clamp(min=1)  # [B, 1] kept prefix length
    edge = top.gather(1, keep - 1).masked_fill((sp.top_p >= 1)[:, None], NEG_INF)  # [B, 1]
    return x.masked_fill(x < torch.maximum(kth, edge), NEG_INF)


def choose(logits: torch.Tensor, sp: SlotParams, seed: torch.Tensor, frame: torch.Tensor, codebook: int
           ) -> torch.Tensor:
    """Greedy rows: argmax of `logits`; sampled rows: Gumbel-max over the warped logits. -> [B] int64."""
    greedy_pick = torch.argmax(logits, dim=-1)  # [B]
    if sp.all_greedy:
        return greedy_pick
    g = -torch.log(-torch.log(uniform_noise(seed, frame, codebook, logits.shape[-1])))  # [B, V] Gumbel(0,1)
    warped = warp_topk(logits, sp, sp.topk_cap) if sp.topk_cap > 0 else warp(logits, sp)  # [B, V]
    sampled_pick = torch.argmax(warped + g, dim=-1)  # [B]
    return torch.where(sp.greedy, greedy_pick, sampled_pick)


def sample_talker(logits: torch.Tensor, sp: SlotParams, seen: torch.Tensor, frame: torch.Tensor,
                  allow_eos: torch.Tensor, seed: torch.Tensor, consts: SamplingConstants) -> torch.Tensor:
    """Code 0 of frame `frame` for each row. logits: [B, V]; seen: [B, V] bool (ids generated so far);
    frame, seed: [B] int64; allow_eos: [B] bool (False: fixed-length rows never stop). -> [B] int64."""
    x = apply_repetition_penalty(logits.float(), seen, sp.penalty)  # [B, V]
    block_eos = (~allow_eos) | (frame < consts.min_frames)  # [B]
    x = x.masked_fill((block_eos[:, None] & consts.eos_onehot[None, :]) | consts.suppress[None, :], NEG_INF)
    return choose(x, sp, seed, frame, 0)


def sample_codebook(logits: torch.Tensor, sp: SlotParams, seed: torch.Tensor, frame: torch.Tensor,
                    codebook: int) -> torch.Tensor:
    """Code `codebook` (1..15) of frame `frame` from the code predictor's logits [B, V] -> [B] int64."""
    return choose(logits.float(), sp, seed, frame, codebook)


def mark_seen(seen: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """seen[b, tokens[b]] = True in place; returns seen."""
    return seen.scatter_(1, tokens[:, None], True)
