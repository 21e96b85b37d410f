"""TTSModel: one loaded Qwen3-TTS checkpoint as tensors-in/tensors-out pieces.

Owns: building Talker + CodePredictor (+ the lazily built codec decoder) from a `Checkpoint` with
strict weight loading, and `prepare`, the one place a request becomes model input: checked against
the checkpoint, tokenized into a `Prompt` (omni_tts.models.text), embedded into prefill rows exactly
as the official generate assembles them (the template rows every request repeats embedded once per
model, `shared_rows`), and given its resolved settings (request value, else
generation_config.json, else the official hard default; the seed drawn once). Voice-clone specifics
(voice-prompt checks, the ICL prompt body, the reference cut, the encoders behind `voice_prompt`) live
in omni_tts.models.voice_clone. A frame is defined in omni_tts.engine.model_runner, not here.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from omni_tts.config import SynthesisParams
from omni_tts.errors import CheckpointError, InputError, OmniTTSError
from omni_tts.models import sampling, transfer
from omni_tts.models import voice_clone as clone
from omni_tts.models.checkpoint import Checkpoint
from omni_tts.models.code_predictor import CodePredictor
from omni_tts.models.layers import cast_parameters, load_strict, no_weight_init
from omni_tts.models.module_calls import keep_module_calls
from omni_tts.models.talker import Talker
from omni_tts.models.text import Prompt, PromptBuilder, TextTokenizer

# Official hard defaults, used when neither the request nor generation_config.json sets a value.
HARD_DEFAULTS: dict[str, Any] = dict(do_sample=True, top_k=50, top_p=1.0, temperature=0.9, repetition_penalty=1.05,
                                     subtalker_dosample=True, subtalker_top_k=50, subtalker_top_p=1.0,
                                     subtalker_temperature=0.9, max_new_tokens=2048)
# Which checkpoint type serves which task.
TASK_OF_MODEL = {"custom_voice": "custom_voice", "voice_design": "voice_design", "base": "voice_clone"}
NEUTRAL_INSTRUCT = "A clear, neutral voice."  # a VoiceDesign request's voice where the caller names none
SHARED_ROWS_MAX = 256  # template embeddings kept (special tokens, role, codec prefix per language and speaker)


class Prefill(NamedTuple):
    embeds: torch.Tensor  # [T, D] talker prefill input
    trailing: torch.Tensor  # [N, D] text rows added to the decode inputs of frames 0..N-1
    pad: torch.Tensor  # [D] text row added after the trailing text runs out (tts_pad)


@dataclass
class Settings:
    """A request's resolved generation settings."""

    talker: sampling.RowSettings
    subtalker: sampling.RowSettings
    seed: int
    max_frames: int  # frames to make at most (max_new_tokens - 1, as the official loop yields)
    fixed: bool  # True: ignore EOS and make exactly max_frames frames


@dataclass
class Prepared:
    """A request as model input, built once at submit."""

    prefill: Prefill
    settings: Settings
    max_frames: int  # frames to make at most, after fitting the prompt into max_seq_len
    decoder_prefix: torch.Tensor | None  # [R, 16] codes decoded before the generated ones (ICL clone), CPU

    @property
    def prompt_len(self) -> int:
        return self.prefill.embeds.shape[0]

    @property
    def fixed(self) -> bool:
        return self.settings.fixed


class TTSModel:
    def __init__(self, ckpt: Checkpoint, talker: Talker, predictor: CodePredictor, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.ckpt, self.talker, self.code_predictor = ckpt, talker, predictor
        self.device, self.dtype = device, dtype
        self.config = ckpt.config
        self.model_type = ckpt.tts_model_type
        self.prompts = PromptBuilder(ckpt.config, TextTokenizer(ckpt.path))
        tc = ckpt.talker_config
        self.hidden_size, self.vocab_size = talker.hidden_size, talker.vocab_size
        self.num_groups = predictor.num_groups
        self.eos_id = int(tc["codec_eos_token_id"])
        self.sampling_constants = sampling.SamplingConstants.for_talker(self.vocab_size, self.eos_id, device)
        self._codec: Any = None
        self.codec_precision = "float32"  # see CodecDecoder.set_precision
        self._encoders = clone.VoiceEncoders(self)  # voice-clone encoders, built on first voice_prompt
        self._shared: dict[tuple, Any] = {}  # template rows every request repeats (`shared_rows`)

    @classmethod
    def from_checkpoint(cls, ckpt: Checkpoint, device: torch.device | str = "cpu",
                        dtype: torch.dtype = torch.float32) -> TTSModel:
        tc = ckpt.talker_config
        pc = tc.get("code_predictor_config")
        if not isinstance(pc, dict):
            raise CheckpointError(f"{ckpt.path / 'config.json'}: talker_config has no 'code_predictor_config'")
        device = torch.device(device)
        with no_weight_init(), device:  # built where they run, uninitialised: the checkpoint fills every weight
            talker = Talker(tc)
            predictor = CodePredictor(pc, talker.hidden_size, talker.codec_embedding)
        for m in (talker, predictor):  # in their final dtype first, so each weight is copied once, unconverted
            cast_parameters(m, dtype).eval().requires_grad_(False)
        source = str(ckpt.path / "model.safetensors")
        stray = [k for k in ckpt.weights if not k.startswith(("talker.", "speaker_encoder."))]
        if stray:
            raise CheckpointError(f"{source}: unexpected tensor '{stray[0]}'")
        load_strict(talker, ckpt.weights, [("talker.model.", ""), ("talker.text_projection.", "text_projection."),
                                           ("talker.codec_head.", "codec_head.")], source,
                    ignore_prefixes=("talker.code_predictor.", "speaker_encoder."))
        other = [k for k in ckpt.weights if k.startswith("talker.") and not k.startswith(
            ("talker.model.", "talker.text_projection.", "talker.codec_head.", "talker.code_predictor."))]
        if other:
            raise CheckpointError(f"{source}: unexpected tensor '{other[0]}'")
        load_strict(predictor, ckpt.weights, [("talker.code_predictor.model.", ""),
                                              ("talker.code_predictor.", "")], source,
                    ignore_prefixes=("talker.model.", "talker.text_projection.", "talker.codec_head.",
                                     "speaker_encoder."))
        keep_module_calls(talker, predictor)
        return cls(ckpt, talker, predictor, device, dtype)

    # ------------------------------------------------------------------ description
    def speakers(self) -> list[str]:
        return self.prompts.speakers()

    def languages(self) -> list[str]:
        return self.prompts.languages()

    def tasks(self) -> list[str]:
        return [TASK_OF_MODEL[self.model_type]] if self.model_type in TASK_OF_MODEL else []

    def supports(self, task: str) -> bool:
        return task in self.tasks()

    def plain_voice(self) -> dict[str, Any] | None:
        """The request fields (task, speaker, instruct) of a voice this checkpoint serves without a
        reference clip: CustomVoice's first speaker, or VoiceDesign with a neutral instruct; None when
        every task it has needs one (Base)."""
        if self.supports("custom_voice") and self.speakers():
            return {"task": "custom_voice", "speaker": self.speakers()[0], "instruct": None}
        if self.supports("voice_design"):
            return {"task": "voice_design", "speaker": None, "instruct": NEUTRAL_INSTRUCT}
        return None

    def supports_instruct(self) -> bool:
        """Whether an instruct text is used: voice_design always, custom_voice except the 0.6B model."""
        if self.model_type == "voice_design":
            return True
        return self.model_type == "custom_voice" and self.prompts.model_size != "0b6"

    @property
    def checkpoint(self) -> Checkpoint:
        return self.ckpt

    def describe(self) -> str:
        return self.ckpt.describe()

    @property
    def sample_rate(self) -> int:
        return int(self.ckpt.codec_config.get("output_sample_rate", 24000))

    # ------------------------------------------------------------------ prompts
    def build_prompt(self, params: SynthesisParams) -> Prompt:
        """Validate a request against this checkpoint and tokenize it (InputError with one line)."""
        params.validate()
        if not self.supports(params.task):
            have = ", ".join(self.tasks()) or "none"
            raise InputError(f"this checkpoint ({self.model_type}) cannot do task '{params.task}'; it supports: {have}")
        ref_text = None
        if params.task == "voice_clone":
            ref_text = clone.check_voice(params.voice, self.hidden_size, self.num_groups,
                                         self.code_predictor.codec_embedding[0].num_embeddings)
        return self.prompts.build(params.task, params.text, params.speaker, params.language, params.instruct,
                                  params.non_streaming_mode, ref_text=ref_text)

    @torch.no_grad()
    def prepare(self, params: SynthesisParams, max_seq_len: int) -> Prepared:
        """Check, tokenize and embed a request once (InputError with one line when it cannot be served);
        frames beyond what fits in `max_seq_len` after the prompt are cut (a fixed-frames request errs)."""
        prompt = self.build_prompt(params)
        settings = self.resolve_settings(params)
        pre = self.build_prefill(prompt, params.voice)  # embeds: [T, D], trailing: [N, D], pad: [D]
        T, prefix = pre.embeds.shape[0], clone.decoder_prefix(params)
        max_frames = settings.max_frames
        if T + max_frames + 1 > max_seq_len:
            if settings.fixed:  # a benchmark asking for exactly N frames must not silently get fewer
                raise InputError(f"fixed_frames {max_frames} does not fit this engine (prompt {T} tokens + "
                                 f"{max_frames} frames > max_seq_len {max_seq_len}); lower it or raise max_seq_len")
            max_frames = max_seq_len - T - 1
            if max_frames < 2:
                raise InputError(clone.too_long(T, max_seq_len, prefix))
        return Prepared(pre, settings, max_frames, prefix)

    def text_rows(self, ids: list[int]) -> torch.Tensor:
        return self.talker.embed_text(self._ids(ids))  # [N, D]

    def codec_rows(self, ids: list[int]) -> torch.Tensor:
        return self.talker.embed_codec(self._ids(ids))  # [N, D]

    def _ids(self, ids: list[int]) -> torch.Tensor:
        """Token ids [N] on the model's device, the copy not waited for: preparing threads never block on
        the device, and the rows are used in stream order."""
        return transfer.to_device(torch.tensor(ids, dtype=torch.long), self.device)

    def shared_rows(self, key: tuple, make: Any) -> Any:
        """`make()` once per key for the template rows every request repeats (special tokens, the role,
        the codec prefix of a language and speaker): the same computation as per request, so bit for bit
        the same rows, without its device calls on each preparing thread."""
        rows = self._shared.get(key)
        if rows is None:
            rows = make()
            if len(self._shared) < SHARED_ROWS_MAX:
                self._shared[key] = rows
        return rows

    @torch.no_grad()
    def build_prefill(self, prompt: Prompt | SynthesisParams, voice: Any = None) -> Prefill:
        """Prompt (or request) -> (prefill embeds [T, D], trailing text rows [N, D], tts_pad row [D]).

        `voice` (voice_clone only; taken from params.voice for a request) is an omni_tts.models.speaker.VoicePrompt:
        its x_vector takes the speaker slot, and in ICL mode its ref_codes + ref text are prepended."""
        if isinstance(prompt, SynthesisParams):
            voice = prompt.voice
            prompt = self.build_prompt(prompt)
        p = prompt
        bos, eos, pad = self.shared_rows(("special", p.tts_bos_id, p.tts_eos_id, p.tts_pad_id), lambda: self.text_rows(
            [p.tts_bos_id, p.tts_eos_id, p.tts_pad_id]))  # 3 x [D]
        if p.task == "voice_clone":
            if voice is None:
                raise InputError(clone.NEEDS_VOICE)
            spk = voice.x_vector.to(self.device, self.dtype).reshape(1, -1)  # [1, D]
            codec, text_over_codec = self._codec_head(p, pad, bos, spk)
        else:
            key = ("head", tuple(p.codec_prefix_ids), p.speaker_id, p.codec_pad_id, p.codec_bos_id, p.tts_pad_id,
                   p.tts_bos_id)
            codec, text_over_codec = self.shared_rows(key, lambda: self._codec_head(p, pad, bos, None))
        parts = [self.text_rows(p.instruct_ids)] if p.instruct_ids else []
        parts += [self.shared_rows(("role", *p.role_ids), lambda: self.text_rows(p.role_ids)), text_over_codec]
        if p.ref_text_ids is not None and voice is not None and getattr(voice, "ref_codes", None) is not None:
            body, trailing = clone.icl_body(self, p, voice.ref_codes, eos, pad)
        else:
            body, trailing = self._text_body(p, eos, pad, codec[-1])
        return Prefill(torch.cat(parts + [body], dim=0), trailing, pad)

    def _codec_head(self, p: Prompt, pad: torch.Tensor, bos: torch.Tensor, spk: torch.Tensor | None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The codec side of the prompt head -> (codec rows [C, D], text-over-codec rows [C-1, D]): the
        language/think prefix, the speaker (a CustomVoice id or a clone's x-vector [1, D]), pad, bos."""
        if spk is None and p.speaker_id is not None:
            spk = self.codec_rows([p.speaker_id])  # [1, D]
        codec = torch.cat([self.codec_rows(p.codec_prefix_ids), *([] if spk is None else [spk]),
                           self.codec_rows([p.codec_pad_id, p.codec_bos_id])])  # [C, D]
        C = codec.shape[0]
        return codec, torch.cat([pad[None].expand(C - 2, -1), bos[None]], dim=0) + codec[:-1]  # [C-1, D]

    def codec_pad_rows(self, p: Prompt, n: int) -> torch.Tensor:
        """n codec_pad rows [n, D] (a gather of one id: the shared row repeated)."""
        return self.shared_rows(("codec_pad", p.codec_pad_id), lambda: self.codec_rows([p.codec_pad_id])).expand(n, -1)

    def _text_body(self, prompt: Prompt, eos: torch.Tensor, pad: torch.Tensor, codec_bos: torch.Tensor
                   ) -> tuple[torch.Tensor, torch.Tensor]:
        text = self.text_rows(prompt.text_ids)  # [n, D]
        if prompt.non_streaming_mode:
            n = text.shape[0]
            whole = torch.cat([text, eos[None]], dim=0) + self.codec_pad_rows(prompt, n + 1)  # [n+1, D]
            return torch.cat([whole, (pad + codec_bos)[None]], dim=0), pad[None]  # tts_pad over codec_bos last
        # streaming text: the first text token over codec_bos now, the rest (+ tts_eos) one per frame
        return (text[:1] + codec_bos[None]), torch.cat([text[1:], eos[None]], dim=0)

    def frame_embedding(self, codes: torch.Tensor) -> torch.Tensor:
        """codes [B, 16] -> sum of the frame's 16 code embeddings [B, D] (the next talker input, minus text)."""
        rows = [self.talker.embed_codec(codes[:, 0])]  # [B, D]
        rows += [emb(codes[:, i + 1]) for i, emb in enumerate(self.code_predictor.codec_embedding)]
        return torch.stack(rows, dim=1).sum(1)  # [B, D]

    # ------------------------------------------------------------------ settings
    def resolve_settings(self, params: SynthesisParams) -> Settings:
        """Request value, else generation_config.json, else the official hard default."""
        gen = self.ckpt.generation_config

        def pick(name: str, value: Any) -> Any:
            return value if value is not None else gen.get(name, HARD_DEFAULTS[name])

        do_sample = False if params.greedy else bool(pick("do_sample", params.do_sample))
        sub_sample = False if params.greedy else bool(pick("subtalker_dosample", params.subtalker_do_sample))
        talker = sampling.RowSettings(greedy=not do_sample, temperature=float(pick("temperature", params.temperature)),
                                      top_k=int(pick("top_k", params.top_k)), top_p=float(pick("top_p", params.top_p)),
                                      repetition_penalty=float(pick("repetition_penalty", params.repetition_penalty)))
        sub = sampling.RowSettings(greedy=not sub_sample,
                                   temperature=float(pick("subtalker_temperature", params.subtalker_temperature)),
                                   top_k=int(pick("subtalker_top_k", params.subtalker_top_k)),
                                   top_p=float(pick("subtalker_top_p", params.subtalker_top_p)))
        if params.fixed_frames is not None:
            if params.fixed_frames < 1:
                raise InputError(f"fixed_frames must be >= 1 (got {params.fixed_frames})")
            max_frames, fixed = int(params.fixed_frames), True
        else:
            max_new = int(pick("max_new_tokens", params.max_new_tokens))
            if max_new < 2:
                raise InputError(f"max_new_tokens must be >= 2 (got {max_new}): the official loop makes "
                                 f"max_new_tokens - 1 frames")
            max_frames, fixed = max_new - 1, False
        seed = int(params.seed) if params.seed is not None else secrets.randbits(63)
        return Settings(talker, sub, seed, max_frames, fixed)

    # ------------------------------------------------------------------ audio
    @property
    def codec(self) -> Any:
        if self._codec is None:
            try:
                from omni_tts.models.codec.decoder import CodecDecoder
            except ImportError as e:
                raise OmniTTSError(f"the codec decoder is not available ({e})") from None
            with no_weight_init():  # its load is strict: every entry comes from the checkpoint
                codec = CodecDecoder.from_checkpoint(self.ckpt).to(self.device).eval()
            keep_module_calls(codec)
            self._codec = codec.set_precision(self.codec_precision)
        return self._codec

    @property
    def codec_if_built(self) -> Any:
        """The codec decoder when it has been built, else None (never builds it)."""
        return self._codec

    def set_codec_precision(self, precision: str) -> None:
        """'float32' (exact), 'tf32' or 'bfloat16' for code-to-wave (CodecDecoder.set_precision)."""
        if self._codec is not None:
            self._codec.set_precision(precision)
        self.codec_precision = precision

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> np.ndarray:
        """codes [frames, 16] -> float32 waveform at `sample_rate`."""
        if codes.shape[0] == 0:
            return np.zeros(0, dtype=np.float32)
        wav = self.codec.decode(codes[None].to(self.device))  # [1, samples]
        return wav[0].float().cpu().numpy().astype(np.float32)

    def streaming_decoder(self, initial_chunk_frames: int, chunk_frames: int, prefix_codes: torch.Tensor | None = None,
                          grow: bool = False) -> Any:
        """A codec.StreamingDecoder; `prefix_codes` [R, 16] (clone.decoder_prefix) are decoded as left
        context only, so the chunks are the audio of the pushed frames alone; `grow`: chunk sizes double."""
        from omni_tts.models.codec.streaming import StreamingDecoder

        return StreamingDecoder(self.codec, initial_chunk_frames, chunk_frames, prefix_codes=prefix_codes, grow=grow)

    # ------------------------------------------------------------------ voice clone
    def voice_prompt(self, audio: Any, ref_text: str | None = None, x_vector_only: bool = False,
                     limits: Any = None) -> Any:
        """Reference clip -> omni_tts.models.speaker.VoicePrompt, with this model's encoders (built once, float32).

        `audio`: a path, an (array, sample_rate) pair, or FloatTensor[N] at 24 kHz. ICL needs `ref_text`
        (the clip's transcript). A non-Base checkpoint raises InputError."""
        return self._encoders.prompt(audio, ref_text, x_vector_only, limits)
