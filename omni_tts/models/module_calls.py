"""Module calls that another thread's FX tracing cannot capture.

Owns `keep_module_calls`. torch.fx's tracer, which AOTAutograd runs inside every torch.compile, swaps
torch.nn.Module.__call__ process-wide while it traces; a module called from another thread meanwhile (an eager
request, the audio stage or a prompt's preparation while a mode compiles) then goes through that tracer and fails
("module is not installed as a submodule"). A module class that carries nn.Module's own call function as its
attribute finds it before nn.Module's swapped one, so its calls stay plain calls in every thread; it is the
function torch.compile expects of a module without a custom __call__, so compiles trace it as before.
"""

from __future__ import annotations

from torch import nn

# nn.Module.__call__ is this function; a tracer replaces the attribute, never the function
_CALL = nn.Module._wrapped_call_impl


def keep_module_calls(*roots: nn.Module) -> None:
    """Give the class of every module under `roots` that inherits nn.Module's __call__ that call as its own
    attribute (a class with a __call__ of its own keeps it)."""
    for cls in {type(m) for root in roots for m in root.modules()}:
        if next(c for c in cls.__mro__ if "__call__" in vars(c)) is nn.Module:
            cls.__call__ = _CALL
