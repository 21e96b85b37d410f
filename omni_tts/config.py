"""Configuration records: EngineConfig (load time), SynthesisParams (per request), CompileMode and MODES.

Owns the field names, defaults and validation of presets (`omni_tts/presets/*.yaml`, unknown keys are
an error) and of requests (their bounds: omni_tts.limits), and MODES: the one table of what each compile
mode runs and how the engine treats it. Knows nothing about models or devices beyond their names.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from omni_tts.errors import InputError, OmniTTSError
from omni_tts.limits import LIMITS, MAX_INPUT_CHARS, MAX_NAME_CHARS, MAX_TEXT_CHARS, check_number, check_text

PRESET_DIR = Path(__file__).resolve().parent / "presets"  # package data (pyproject.toml)
EMPTY_TEXT = "text is empty: give some words to speak"
MAX_SLOTS = 1024  # max_num_seqs: far past what one GPU batches well
MAX_SEQ_LEN = 65536  # max_seq_len: the talker's positions (prompt + frames; about 87 minutes of audio)


class CompileMode(str, enum.Enum):
    """How the CodePredictor runs; the talker runs the same way in every mode. What each mode is: MODES."""

    EAGER = "eager"
    DEFAULT = "default"
    REDUCE_OVERHEAD = "reduce-overhead"
    DEFAULT_CUDAGRAPH = "default+cudagraph"

    @classmethod
    def parse(cls, value: str | CompileMode) -> CompileMode:
        if isinstance(value, CompileMode):
            return value
        for m in cls:
            if m.value == str(value).strip().lower():
                return m
        raise InputError(f"unknown compile mode '{value}'; valid: {', '.join(m.value for m in cls)}")

    @classmethod
    def auto(cls, cuda: bool) -> CompileMode:
        """The mode of 'auto': MODES' `auto_on_cuda` row on CUDA, else the reference mode."""
        return next(m for m, spec in MODES.items() if spec.auto_on_cuda) if cuda else cls.reference()

    @classmethod
    def reference(cls) -> CompileMode:
        """The mode that runs the reference modules (nothing compiled or captured)."""
        return next(m for m, spec in MODES.items() if spec.inductor is None)

    @property
    def spec(self) -> ModeSpec:
        return MODES[self]

    @property
    def compiled(self) -> bool:
        return self.spec.inductor is not None

    @property
    def needs_cuda(self) -> bool:
        return self.spec.needs_cuda


@dataclass(frozen=True)
class ModeSpec:
    """What a compile mode runs and how the engine treats it: the one place that decides a mode."""

    inductor: str | None  # torch.compile mode of the CodePredictor; None: the reference modules
    graph_trees: bool  # Inductor records the compiled frame as CUDA graph trees in its own private pool
    graphs: bool  # the engine captures the CodePredictor step as CUDA graphs per batch bucket
    whole_frame: bool  # the CodePredictor's 15 steps are one compiled function (else compiled unit by unit)
    needs_cuda: bool
    warm_rank: int  # warm-up order after the engine's default mode: lower first
    vllm_pool: bool  # its graphs go into vLLM's global pool when experimental.use_vllm_pool (else a pool of its own)
    serves_while_warming: bool  # requests run before its warm-up ends (reference CodePredictor and talker)
    auto_on_cuda: bool  # the mode of 'auto' on a CUDA device
    note: str  # what it runs, for the UI and CLI


_NO = dict(graph_trees=False, graphs=False, whole_frame=False, needs_cuda=False, vllm_pool=False,
           serves_while_warming=False, auto_on_cuda=False)
# after the engine's default mode (warmup.warm_order): eager (it serves meanwhile), reduce-overhead last,
# so its graph trees never record while another mode captures
MODES: dict[CompileMode, ModeSpec] = {
    CompileMode.EAGER: ModeSpec(**{**_NO, "serves_while_warming": True}, inductor=None, warm_rank=0, note=(
        "reference modules, no compile: host-bound, no warm-up")),
    CompileMode.DEFAULT: ModeSpec(**_NO, inductor="default", warm_rank=1, note=(
        "torch.compile default per layer and sampling unit, launched from Python: fused kernels, but launch and "
        "guard cost on every call")),
    CompileMode.REDUCE_OVERHEAD: ModeSpec(
        **{**_NO, "graph_trees": True, "whole_frame": True, "needs_cuda": True}, inductor="reduce-overhead",
        warm_rank=2, note=(
            "torch.compile reduce-overhead of the whole frame: Inductor records it as CUDA graph trees in its own "
            "private pool, one replay per frame (a first compile on a machine takes minutes)")),
    CompileMode.DEFAULT_CUDAGRAPH: ModeSpec(
        **{**_NO, "graphs": True, "needs_cuda": True, "vllm_pool": True, "auto_on_cuda": True},
        inductor="default", warm_rank=1, note=(
            "torch.compile default per unit + the engine's CUDA graphs per batch bucket, all in one shared pool: "
            "the fast mode on a GPU")),
}
# the talker runs as this mode's compiled units in every mode (on CUDA, captured by the engine)
TALKER_MODE = CompileMode.DEFAULT


TASKS = ("custom_voice", "voice_design", "voice_clone")

@dataclass
class SynthesisParams:
    """One request. `None` sampling fields take the checkpoint's generation_config.json values."""

    text: str
    task: str = "custom_voice"
    speaker: str | None = None
    language: str = "Auto"
    instruct: str | None = None
    non_streaming_mode: bool | None = None  # None: official default for the task
    greedy: bool = False
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    subtalker_do_sample: bool | None = None
    subtalker_temperature: float | None = None
    subtalker_top_k: int | None = None
    subtalker_top_p: float | None = None
    max_new_tokens: int | None = None
    seed: int | None = None
    fixed_frames: int | None = None  # benchmark only: ignore EOS and make exactly N frames
    voice: Any = None  # voice-clone prompt (omni_tts.models.speaker.VoicePrompt), task voice_clone only
    mode: str | None = None  # the CodePredictor's compile mode for this request; None: the engine's default

    def validate(self) -> None:
        """Refuse a request no model could serve safely: one InputError naming the field, never another
        exception type, whatever the field holds (wrong type, NaN, huge numbers, unencodable text)."""
        if not isinstance(self.task, str) or self.task not in TASKS:
            raise InputError(f"unknown task '{self.task}'; valid: {', '.join(TASKS)}")
        if self.text is None or (isinstance(self.text, str) and not self.text.strip()):
            raise InputError(EMPTY_TEXT)
        check_text("text", self.text, MAX_INPUT_CHARS)
        check_text("instruct", self.instruct, MAX_TEXT_CHARS)
        check_text("speaker", self.speaker, MAX_NAME_CHARS)
        check_text("language", self.language, MAX_NAME_CHARS)
        if self.task == "voice_design" and not (self.instruct and self.instruct.strip()):
            raise InputError("voice_design needs an instruct text describing the voice (--instruct)")
        if self.voice is not None and self.task != "voice_clone":
            raise InputError(f"a voice prompt is for task voice_clone, not {self.task}")
        for name in ("greedy", "non_streaming_mode", "do_sample", "subtalker_do_sample"):
            v = getattr(self, name)
            if not isinstance(v, bool) and not (v is None and name != "greedy"):
                raise InputError(f"{name} must be true or false (got {v!r})")
        for name, limit in LIMITS.items():
            check_number(name, getattr(self, name), limit)


def require_params(params: Any) -> None:
    """InputError unless `params` is a SynthesisParams (before any of its fields is read)."""
    if not isinstance(params, SynthesisParams):
        raise InputError(f"a request is a SynthesisParams, e.g. SynthesisParams(text='Hello.') "
                         f"(got {type(params).__name__})")


@dataclass
class ExperimentalConfig:
    """Switches whose question measurement has not closed yet (a preset's `experimental:` section)."""

    # CUDA: hand-written Triton layers, heads and sampling; false puts every compiled mode on Inductor's
    # kernels, so reduce-overhead and default+cudagraph can be compared with the same kernels
    kernels: bool = True
    use_vllm_pool: bool = True  # default+cudagraph captures into vLLM's global graph pool when vllm is importable
    # submits that prepare their prompts at once (0: no bound): while a burst arrives, fewer threads then
    # contend for the GIL with the schedulers, which take it again after every torch call
    max_preparing: int = 0


@dataclass
class EngineConfig:
    """Load-time engine settings. A preset YAML holds a subset of these keys (the undecided switches under
    `experimental:`); these defaults are presets/default.yaml's values (tests/test_config.py checks)."""

    model: str | None = None  # dir or hub id; None = choose (cache, hub, embedded)
    mode: str = "auto"  # requests' default mode: a CompileMode value, or auto (default+cudagraph on CUDA, else eager)
    modes: list[str] | None = None  # modes kept resident, warmed in the background; None: all on CUDA, the
    #   default on CPU
    enforce_eager: bool = False  # no CUDA graphs and no compile anywhere: the all-eager baseline
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto (bfloat16 on CUDA, float32 on CPU) | float32 | bfloat16
    max_num_seqs: int = 8  # concurrent requests per mode
    max_waiting: int | None = None  # requests a mode holds waiting for a slot beyond those (None: twice
    #   max_num_seqs, two more rounds; 0: unbounded); more are refused at submit (Overloaded)
    request_timeout_s: float | None = None  # a request still running this long after submit is ended
    #   (DeadlineExceeded); None or 0: no deadline
    max_seq_len: int = 2048  # talker KV cache length per slot (prompt + frames)
    initial_chunk_frames: int = 1  # frames in a request's first audio chunk
    chunk_frames: int = 25  # frames in each later chunk
    chunk_growth: bool = True  # chunks after the first double in size up to chunk_frames (gap-free playback)
    gpu_memory_limit_gb: float | None = None  # CUDA: cap this process's allocator
    buckets: list[int] | None = None  # graph batch buckets; None: powers of two up to max_num_seqs
    # the buckets the CodePredictor keeps of those (None: all; max_num_seqs always): leaving out 32 gives its
    # 17-32-row frames the 64-row graph, which the Triton predictor runs faster than the 32-row one
    predictor_buckets: list[int] | None = dataclasses.field(default_factory=lambda: [1, 2, 4, 8, 16, 64])
    # hold a burst's first arrivals this long at most while the rest still prepare their prompts, so the
    # burst shares one prefill pass and its chunks stay in step (batched code-to-wave); 0: admit at once
    admit_hold_ms: int = 30
    codec_precision: str = "auto"  # code-to-wave: auto (tf32 on CUDA, float32 on CPU) | float32 | tf32 | bfloat16
    kernel_configs: str | None = None  # a kernel sweep's JSON of Triton launch configs for this GPU
    experimental: ExperimentalConfig = dataclasses.field(default_factory=ExperimentalConfig)
    name: str = ""  # the preset's file name, and what it is for
    description: str = ""

    def waiting_bound(self) -> int | None:
        """How many requests a mode may hold waiting beyond its slots (None: unbounded)."""
        n = 2 * self.max_num_seqs if self.max_waiting is None else self.max_waiting
        return n or None

    def deadline_s(self) -> float | None:
        return self.request_timeout_s or None

    def resolved_buckets(self) -> list[int]:
        if self.buckets:
            fit = {int(b) for b in self.buckets if 0 < int(b) <= self.max_num_seqs}
            return sorted(fit | {self.max_num_seqs})
        out, b = [], 1
        while b < self.max_num_seqs:
            out.append(b)
            b *= 2
        return sorted(set(out) | {self.max_num_seqs})

    def resolved_predictor_buckets(self) -> list[int]:
        """The resolved buckets that `predictor_buckets` keeps (a subset: the predictor captures no shape the
        talker does not), max_num_seqs always; None or empty: all of them."""
        buckets = self.resolved_buckets()
        if not self.predictor_buckets:
            return buckets
        keep = {int(b) for b in self.predictor_buckets} | {self.max_num_seqs}
        return [b for b in buckets if b in keep]

    def resolved_codec_precision(self, cuda: bool) -> str:
        """The codec's precision: `codec_precision`, with auto as TF32 on CUDA and float32 (exact) on a CPU."""
        return self.codec_precision if self.codec_precision != "auto" else "tf32" if cuda else "float32"

    def default_mode(self, cuda: bool) -> CompileMode:
        if self.mode == "auto":
            return CompileMode.auto(cuda and not self.enforce_eager)
        return CompileMode.parse(self.mode)

    def resident_modes(self, cuda: bool) -> list[CompileMode]:
        """The modes this engine keeps: the listed ones plus the default mode. Unlisted, every mode on CUDA;
        on a CPU only the default (compiling there costs minutes of every core: list the others to have them)."""
        listed = [CompileMode.parse(m) for m in self.modes] if self.modes else list(CompileMode) if cuda else []
        want = set(listed) | {self.default_mode(cuda)}
        return [m for m in CompileMode if m in want]

    def validate(self) -> None:
        """One OmniTTSError naming the first field of a wrong type or out of its range."""
        for key, hint in _KEY_TYPES.items():
            value = getattr(self.experimental, key[13:]) if key.startswith("experimental.") else getattr(self, key)
            ok, want = _type_ok(value, hint)
            if not ok:
                raise OmniTTSError(f"{key} must be {want} (got {value!r})")
        if self.mode != "auto":
            CompileMode.parse(self.mode)
        for m in self.modes or []:
            CompileMode.parse(m)
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise OmniTTSError(f"device must be auto, cpu or cuda (got '{self.device}')")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise OmniTTSError(f"dtype must be auto, float32, bfloat16 or float16 (got '{self.dtype}')")
        if not 1 <= self.max_num_seqs <= MAX_SLOTS:
            raise OmniTTSError(f"max_num_seqs must be 1..{MAX_SLOTS} (got {self.max_num_seqs})")
        if not 16 <= self.max_seq_len <= MAX_SEQ_LEN:
            raise OmniTTSError(f"max_seq_len must be 16..{MAX_SEQ_LEN} (got {self.max_seq_len})")
        if self.gpu_memory_limit_gb is not None and not 0 < self.gpu_memory_limit_gb < math.inf:
            raise OmniTTSError(f"gpu_memory_limit_gb must be > 0 (got {self.gpu_memory_limit_gb})")
        if self.max_waiting is not None and self.max_waiting < 0:
            raise OmniTTSError(f"max_waiting must be >= 0 (got {self.max_waiting})")
        if self.request_timeout_s is not None and not 0 <= self.request_timeout_s < math.inf:
            raise OmniTTSError(f"request_timeout_s must be >= 0 seconds (got {self.request_timeout_s})")
        if self.initial_chunk_frames < 1 or self.chunk_frames < 1:
            raise OmniTTSError("initial_chunk_frames and chunk_frames must be >= 1")
        if self.codec_precision not in ("auto", "float32", "tf32", "bfloat16"):
            raise OmniTTSError(f"codec_precision must be auto, float32, tf32 or bfloat16 "
                               f"(got '{self.codec_precision}')")
        if self.kernel_configs and not Path(self.kernel_configs).is_file():
            raise OmniTTSError(f"kernel_configs: no such file '{self.kernel_configs}' (write one with kernel-sweep)")
        if not 0 <= self.admit_hold_ms <= 1000:
            raise OmniTTSError(f"admit_hold_ms must be 0..1000 (got {self.admit_hold_ms})")
        if self.experimental.max_preparing < 0:
            raise OmniTTSError(f"experimental.max_preparing must be >= 0 (got {self.experimental.max_preparing})")


# The preset keys and their types, read from the records' annotations ('experimental.KEY' for that section).
_EXPERIMENTAL_KEYS = {f.name: f.type for f in dataclasses.fields(ExperimentalConfig)}
_KEY_TYPES = {f.name: f.type for f in dataclasses.fields(EngineConfig) if f.name != "experimental"} | {
    f"experimental.{k}": t for k, t in _EXPERIMENTAL_KEYS.items()}


def _type_ok(v: Any, hint: str) -> tuple[bool, str]:
    """Whether a preset value fits its field's annotation (bool is not an int here); -> (ok, what it wants)."""
    base, _, none = hint.partition(" | ")
    if v is None and none == "None":
        return True, ""
    if base == "int":
        return isinstance(v, int) and not isinstance(v, bool), "an integer"
    if base == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool), "a number"
    if base == "bool":
        return isinstance(v, bool), "true or false"
    if base == "list[int]":
        ok = isinstance(v, list) and all(isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in v)
        return ok, "a list of positive integers"
    if base == "list[str]":
        return isinstance(v, list) and all(isinstance(b, str) for b in v), "a list of mode names"
    return isinstance(v, str), "a string"


def _flatten(data: dict[str, Any], path: Path | str) -> dict[str, Any]:
    """A preset mapping -> {key or 'experimental.key': value}, each value of its field's type; a bare
    experimental key is read as 'experimental.key'. Unknown keys and wrong types: one line naming the key."""
    out: dict[str, Any] = {}
    for key, v in data.items():
        if key == "experimental":
            if not isinstance(v, dict):
                raise OmniTTSError(f"{path}: 'experimental' is a mapping of experimental keys to values")
            out.update({f"experimental.{k}": x for k, x in v.items()})
        else:
            out[f"experimental.{key}" if key in _EXPERIMENTAL_KEYS else key] = v
    unknown = sorted(set(out) - set(_KEY_TYPES))
    if unknown:
        raise OmniTTSError(f"{path}: unknown preset key(s): {', '.join(unknown)}; "
                           f"valid: {', '.join(sorted(_KEY_TYPES))}")
    for key, v in out.items():
        ok, want = _type_ok(v, _KEY_TYPES[key])
        if not ok:
            raise OmniTTSError(f"{path}: preset key '{key}' must be {want} (got {v!r})")
    return out


def build_config(values: dict[str, Any], source: str = "config") -> EngineConfig:
    """{key, 'experimental.key' or a bare experimental key: value} -> a checked and validated EngineConfig."""
    flat = _flatten(values, source)
    experimental = ExperimentalConfig(**{k.removeprefix("experimental."): v for k, v in flat.items()
                                         if k.startswith("experimental.")})
    cfg = EngineConfig(**{k: v for k, v in flat.items() if not k.startswith("experimental.")},
                       experimental=experimental)
    cfg.validate()
    return cfg


def parse_sets(pairs: list[str] | None) -> dict[str, Any]:
    """KEY=VALUE strings (the command line's --set) -> preset overrides, each VALUE read as YAML (true, 16,
    [1, 8]) and checked like a preset's keys and types."""
    out: dict[str, Any] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise OmniTTSError(f"--set wants KEY=VALUE (got '{pair}')")
        try:
            out[key] = yaml.safe_load(value)
        except yaml.YAMLError:
            raise OmniTTSError(f"--set {key}: cannot read '{value}'") from None
    return _flatten(out, "--set")


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def read_preset(name_or_path: str | Path) -> tuple[Path, dict[str, Any]]:
    """A preset's file and its mapping as written (by name: omni_tts/presets/NAME.yaml; or a path)."""
    path = Path(name_or_path)
    if not path.suffix:
        path = PRESET_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise OmniTTSError(f"preset '{name_or_path}' not found; available: {', '.join(preset_names())}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise OmniTTSError(f"{path}: malformed YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise OmniTTSError(f"{path}: a preset is a mapping of keys to values")
    return path, data


def load_preset(name_or_path: str | Path, **overrides: Any) -> EngineConfig:
    """Read a preset by name or path, then `overrides` (keys as in a preset; None keeps the preset's value);
    unknown keys and wrong types are an error naming them."""
    if not isinstance(name_or_path, (str, Path)):
        raise OmniTTSError(f"a preset is a name ({', '.join(preset_names())}) or a YAML file's path "
                           f"(got {type(name_or_path).__name__})")
    path, data = read_preset(name_or_path)
    flat = _flatten(data, path)
    flat.setdefault("name", path.stem)
    flat.update({k: v for k, v in overrides.items() if v is not None})
    return build_config(flat, str(path))
