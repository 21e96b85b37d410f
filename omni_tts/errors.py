"""User-facing error types.

Every error a user can cause (bad text, unknown speaker, broken checkpoint, bad audio) is raised as
an `OmniTTSError` subclass whose message is one clear line; the CLI and the app print that line
instead of a traceback. This module knows nothing about models or I/O.
"""


class OmniTTSError(Exception):
    """Base class: the message is meant for the user, as is."""


class CheckpointError(OmniTTSError):
    """A checkpoint directory or hub id that cannot be loaded (missing/malformed file or key)."""


class InputError(OmniTTSError):
    """A request the model cannot serve: empty text, unknown speaker or language, bad audio."""


class EngineError(OmniTTSError):
    """The engine refused or lost a request (shutdown, mode failure)."""


class Cancelled(EngineError):
    """The request was cancelled by its caller; `partial` holds what was made before the cancel."""

    def __init__(self, message: str = "the request was cancelled", partial: object = None) -> None:
        super().__init__(message)
        self.partial = partial


class Overloaded(EngineError):
    """Refused at submit: the request's mode already has as many requests waiting as it may hold."""


class DeadlineExceeded(EngineError):
    """The request outlived the engine's per-request deadline (`request_timeout_s`) and was ended."""

    reason = "deadline exceeded"


def one_line(e: BaseException, limit: int = 200) -> str:
    """'Type: message' on one line (whitespace runs collapsed), cut at `limit` characters of message: why an
    optional accelerator (fused codec activations, first-chunk graphs, Triton kernels) is off."""
    return f"{type(e).__name__}: {' '.join(str(e).split())[:limit]}"


def as_engine_error(e: BaseException, what: str) -> OmniTTSError:
    """`e` itself when it is already a user-facing error, else an EngineError saying what failed."""
    return e if isinstance(e, OmniTTSError) else EngineError(f"{what}: {e}" if what else str(e))
