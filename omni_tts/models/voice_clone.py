"""Voice cloning on a Base checkpoint: prompt checks, the ICL prompt body, the reference cut, the encoders.

Everything TTSModel does only for task voice_clone. Owns: checking a `VoicePrompt` against a
checkpoint; the ICL prompt body (reference transcript + target text laid over [codec_bos, reference
frames], as the official generate_icl_prompt does); which codes the decoder gets before the
generated ones (ICL: the reference codes) and the official cut of the reference part of the audio; and
`VoiceEncoders`, one model's speaker + codec encoders, built lazily once, in float32 on the model's
device.
Does not own the encoders' maths (speaker.py, codec/encoder.py) nor audio intake (audio.py).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from omni_tts.errors import InputError
from omni_tts.models.module_calls import keep_module_calls
from omni_tts.models.precision import exact

if TYPE_CHECKING:  # imported lazily at run time: speaker.py pulls in soundfile and the encoders
    from omni_tts.models.audio import AudioSource
    from omni_tts.models.speaker import VoicePrompt
    from omni_tts.models.text import Prompt

NEEDS_VOICE = "voice_clone needs a voice prompt (reference audio, or a saved voice prompt)"


def check_voice(voice: Any, hidden_size: int, num_groups: int, codebook_size: int) -> str | None:
    """Validate a request's voice prompt for this checkpoint; -> the ICL reference text, or None (x-vector only)."""
    if voice is None or not hasattr(voice, "x_vector"):
        raise InputError(NEEDS_VOICE)
    if voice.x_vector.numel() != hidden_size:
        raise InputError(f"voice prompt x-vector has {voice.x_vector.numel()} values; this checkpoint needs "
                         f"{hidden_size} (made with another model?)")
    if getattr(voice, "x_vector_only", False):
        return None
    codes = voice.ref_codes  # [R, Q]
    if codes is None or codes.dim() != 2 or codes.shape[1] != num_groups:
        raise InputError(f"voice prompt reference codes have shape {None if codes is None else tuple(codes.shape)};"
                         f" this checkpoint needs [frames, {num_groups}] (made with another model?)")
    if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= codebook_size):
        raise InputError(f"voice prompt reference codes lie outside the codebook (0..{codebook_size - 1})")
    return voice.ref_text


def icl_body(model: Any, prompt: Prompt, ref_codes: torch.Tensor, eos: torch.Tensor, pad: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Voice-clone ICL body -> (prefill rows [L, D], trailing text rows [N, D]).

    Text side: reference transcript + target text + tts_eos ([Lt, D]); codec side: codec_bos + the
    reference frames' summed code embeddings ([Lc, D], Lc = R + 1). Non-streaming: all text over
    codec_pad, then the codec rows over tts_pad. Streaming: the two summed row by row; text beyond Lc
    trails one row per generated frame, or tts_pad fills the text side when the text is shorter."""
    text = torch.cat([model.text_rows(prompt.ref_text_ids + prompt.text_ids), eos[None]], dim=0)  # [Lt, D]
    frames = model.frame_embedding(ref_codes.to(model.device))  # [R, D]
    codec = torch.cat([model.codec_rows([prompt.codec_bos_id]), frames], dim=0)  # [Lc, D]
    Lt, Lc = text.shape[0], codec.shape[0]
    if prompt.non_streaming_mode:
        body = torch.cat([text + model.codec_pad_rows(prompt, Lt), codec + pad[None]], dim=0)
        return body, pad[None]
    if Lt > Lc:
        return text[:Lc] + codec, text[Lc:]
    return torch.cat([text, pad[None].expand(Lc - Lt, -1)], dim=0) + codec, pad[None]


def decoder_prefix(params: Any) -> torch.Tensor | None:
    """Codes the decoder gets before the generated ones: a voice_clone ICL request's reference codes
    LongTensor[R, Q] (CPU); None for every other request (x-vector-only clone included)."""
    voice = getattr(params, "voice", None)
    if getattr(params, "task", None) != "voice_clone" or voice is None or getattr(voice, "x_vector_only", False):
        return None
    codes = getattr(voice, "ref_codes", None)
    return None if codes is None else codes.detach().to("cpu", torch.long)


def too_long(T: int, max_len: int, ref_codes: torch.Tensor | None) -> str:
    """The one-line error for a prompt that leaves no room for 2 frames; names the reference audio for an ICL clone."""
    if ref_codes is None:
        return (f"text is too long for this engine (prompt {T} tokens, max_seq_len {max_len}); "
                f"shorten it or raise max_seq_len")
    return (f"text + reference audio is too long for this engine (prompt {T} tokens incl. {ref_codes.shape[0]} "
            f"reference frames, max_seq_len {max_len}); shorten the text or the reference clip, or raise max_seq_len")


def reference_cut(ref_frames: int, total_frames: int, samples: int) -> int:
    """Samples cut off the front of the decoded [reference; generated] audio, computed as the official
    wrapper does: int(ref_frames / max(total_frames, 1) * samples) in double precision.

    That is ref_frames * samples_per_frame, except for ~4% of (ref, total) length pairs where the
    division rounds down and one sample fewer is cut (e.g. 25 reference + 72 generated frames at
    1920 samples per frame: 47999, not 48000)."""
    return int(ref_frames / max(total_frames, 1) * samples)


class VoiceEncoders:
    """One model's speaker encoder + codec encoder: built on first use (thread-safe), then cached.

    Both run in float32 on `device` with TF32 off, so prompts equal the official float32 ones. Calls are
    serialised by a lock (encoding a clip takes milliseconds to a second; the engine keeps generating)."""

    def __init__(self, model: Any) -> None:  # a TTSModel (its module imports this one)
        self.model = model
        self._lock = threading.Lock()
        self._speaker: Any = None
        self._codec: Any = None

    def _build(self) -> None:
        from omni_tts.models.codec.encoder import CodecEncoder
        from omni_tts.models.speaker import SpeakerEncoder

        m = self.model
        if m.model_type != "base":
            raise InputError(f"this checkpoint ({m.model_type}) cannot clone voices: voice prompts need a Base "
                             f"checkpoint (it has the speaker and codec encoders)")
        if self._speaker is None:
            self._speaker = SpeakerEncoder.from_checkpoint(m.ckpt).to(m.device, torch.float32)
            self._codec = CodecEncoder.from_checkpoint(m.ckpt).to(m.device, torch.float32)
            keep_module_calls(self._speaker, self._codec)

    def prompt(self, audio: AudioSource | torch.Tensor, ref_text: str | None = None, x_vector_only: bool = False,
               limits: Any = None) -> VoicePrompt:
        """Reference clip (path, (array, sample_rate), or FloatTensor[N] at 24 kHz) -> VoicePrompt.

        ICL (default) needs `ref_text`, the clip's transcript; x-vector-only mode needs none."""
        from omni_tts.models.audio import AudioLimits
        from omni_tts.models.speaker import create_voice_prompt

        with self._lock:
            self._build()
            with exact(self.model.device):
                return create_voice_prompt((self._speaker, self._codec), audio, ref_text=ref_text,
                                           x_vector_only=x_vector_only, limits=limits or AudioLimits())


def cut_reference(wav: np.ndarray, ref_frames: int, total_frames: int) -> np.ndarray:
    """Decoded [reference; generated] audio -> the generated part, cut as the official wrapper cuts."""
    return wav[reference_cut(ref_frames, total_frames, wav.shape[0]):]
