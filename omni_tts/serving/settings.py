"""ServeSettings: what the HTTP routes and the server need beyond the engine: whether the bind is public,
the admin token, the cap on `max_new_tokens` for anonymous callers of a public bind, body and stream
bounds, and uvicorn's connection limits. Knows nothing about the engine or FastAPI.
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping
from dataclasses import dataclass

from omni_tts.errors import InputError
from omni_tts.ui.support import ADMIN_ENV, AdminPolicy

PUBLIC_MAX_NEW_TOKENS_ENV = "OMNI_TTS_PUBLIC_MAX_NEW_TOKENS"
SHUTDOWN_GRACE_ENV = "OMNI_TTS_SHUTDOWN_GRACE_S"
LOG_REQUESTS_ENV = "OMNI_TTS_LOG_REQUESTS"


@dataclass
class ServeSettings:
    """Defaults suit one engine on one machine; `from_env` fills the bind-dependent ones."""

    public: bool = False  # a public bind (not loopback, a share link or a Space)
    admin_token: str = ""  # `Authorization: Bearer <token>` lifts the anonymous caps
    # the most max_new_tokens an anonymous caller of a public bind may ask for, and what they get when they
    # name none (1024 frames: about 80 s of audio); None: the engine's own limit
    public_max_new_tokens: int | None = 1024
    max_body_bytes: int = 32 << 20  # a base64 reference clip of a few minutes fits; more is refused with 413
    body_timeout_s: float = 30.0  # a request body must arrive within this
    stream_buffer_bytes: int = 8 << 20  # audio made but not yet taken by a slow reader; beyond it the request ends
    ws_idle_timeout_s: float = 300.0  # a WebSocket session's longest wait for more text (its config: body_timeout_s)
    retry_after_s: int = 1  # the Retry-After of a 503 (the engine busy)
    log_requests: bool = True  # a log line per request the engine ends (serving.request_log)
    # uvicorn: open connections and tasks at once (beyond: 503), idle keep-alive, a request's headers (a
    # connection that never completes them is closed), the largest incomplete HTTP event (headers); and how
    # long a shutdown lets accepted requests finish before it cuts them (Server.close)
    limit_concurrency: int = 512
    timeout_keep_alive_s: int = 5
    header_timeout_s: float = 10.0
    max_header_bytes: int = 64 << 10
    graceful_shutdown_s: int = 10

    @classmethod
    def from_env(cls, host: str, share: bool = False, env: Mapping[str, str] = os.environ) -> ServeSettings:
        """Public or not from the bind (as the page's admin policy), the token from OMNI_TTS_ADMIN_TOKEN, the
        anonymous cap from OMNI_TTS_PUBLIC_MAX_NEW_TOKENS (0: none), the shutdown's grace in seconds from
        OMNI_TTS_SHUTDOWN_GRACE_S, the request log off with OMNI_TTS_LOG_REQUESTS=0."""
        policy = AdminPolicy.from_env(host, share, env)
        out = cls(public=policy.public, admin_token=policy.token)
        cap = _whole(env, PUBLIC_MAX_NEW_TOKENS_ENV)
        if cap is not None:
            out.public_max_new_tokens = cap or None
        grace = _whole(env, SHUTDOWN_GRACE_ENV)
        if grace is not None:
            out.graceful_shutdown_s = grace
        out.log_requests = _whole(env, LOG_REQUESTS_ENV) != 0
        return out

    def is_admin(self, authorization: str | None) -> bool:
        """Whether an Authorization header carries the admin token."""
        scheme, _, given = (authorization or "").partition(" ")
        return bool(self.admin_token) and scheme.lower() == "bearer" and \
            hmac.compare_digest(given.strip().encode(), self.admin_token.encode())

    def token_cap(self, authorization: str | None) -> int | None:
        """The max_new_tokens cap for this caller (None: the engine's own limit)."""
        if not self.public or self.is_admin(authorization):
            return None
        return self.public_max_new_tokens


def _whole(env: Mapping[str, str], name: str) -> int | None:
    """A whole number >= 0 from the environment (None: unset); anything else is one clear InputError."""
    raw = env.get(name, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise InputError(f"{name} must be a whole number >= 0 (got {raw!r})")
    return int(raw)


__all__ = ["ADMIN_ENV", "LOG_REQUESTS_ENV", "PUBLIC_MAX_NEW_TOKENS_ENV", "SHUTDOWN_GRACE_ENV", "ServeSettings"]
