"""The errors anybind raises about an op's code, and where host errors wait for their caller.

=======================  ==========================================================
name                     what it is
=======================  ==========================================================
``MissingRuleError``     a transformation needs a rule the op does not have
``HostError``            host or compiled code failed, or returned the wrong thing
``remember_host_error``  keeps a failed call's HostError for its eager caller
``describe``             an exception as "Type: message", whatever its ``__str__`` does
``pop_host_error``       the HostError behind a runtime error of an op's program
``find_host_error``      likewise for any recent op (``ab.debug`` re-raises it)
=======================  ==========================================================
"""
from __future__ import annotations

import os
import re
import threading
import traceback
from typing import NoReturn


class MissingRuleError(NotImplementedError):
    """A transformation needs a rule the op does not have.

    >>> import anybind as ab, numpy as np, jax
    >>> s = ab.bind(np.sin, shape=ab.like(0), name="sin")
    >>> try:
    ...     jax.grad(s)(1.0)
    ... except ab.MissingRuleError as e:
    ...     print(e)
    anybind op 'sin' has no derivative rules; add op.def_jvp(rule) for forward mode ...
    """


MissingRuleError.__module__ = "anybind"  # as users name it: anybind.MissingRuleError


class HostError(RuntimeError):
    """An error raised by, or about, host code while a compiled program ran.

    An eager call raises it itself, with the user's exception as its cause.
    Inside ``jit`` XLA turns it into ``jax.errors.JaxRuntimeError``, whose
    message ends with ``HostError: anybind op '…': …`` (see the docs' Debugging
    and errors guide);
    ``with ab.debug():`` re-raises the HostError itself there too.

    >>> import anybind as ab, numpy as np
    >>> def positive(x):
    ...     if (x <= 0).any():
    ...         raise ValueError("needs positive input")
    ...     return np.log(x)
    >>> log = ab.bind(positive, shape=ab.like(0), name="log")
    >>> try:
    ...     log(np.zeros(2))
    ... except ab.HostError as e:
    ...     print(e)
    anybind op 'log': the function raised ValueError: needs positive input (in positive, ...)
    """


HostError.__module__ = "anybind"  # as users name it: anybind.HostError
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # anybind/
_RECENT: dict = {}  # the last few HostErrors, by message
_RECENT_LOCK = threading.Lock()


def remember_host_error(op, err: HostError) -> None:
    """Keep a failed call's HostError, keyed by its message, for an eager caller to re-raise.

    The runtime error that reaches the caller carries the message, so each
    caller finds its own error, whichever thread ran the callback.
    """
    with op._lock:
        errors = op._host_errors
        errors[str(err)] = err
        while len(errors) > 64:  # errors of jitted calls are never collected by a caller
            errors.pop(next(iter(errors)))
    remember_recent_host_error(err)


def remember_recent_host_error(err: HostError) -> None:
    """Keep a HostError among the recent ones, which eager callers and ``ab.debug()`` re-raise."""
    with _RECENT_LOCK:
        _RECENT.pop(str(err), None)
        _RECENT[str(err)] = err
        while len(_RECENT) > 8:
            _RECENT.pop(next(iter(_RECENT)))


def describe(e: BaseException) -> str:
    """``"Type: message"`` of an exception, as text that any UTF-8 consumer can carry.

    A ``__str__`` that raises gives a placeholder naming what it raised; lone
    surrogates and other characters UTF-8 cannot hold are escaped.
    """
    text = message_of(e)
    if text is None:
        try:
            text = str(e)
        except Exception as inner:  # noqa: BLE001  (any failure of user code)
            text = f"<str() of the exception raised {type(inner).__name__}>"
        if not isinstance(text, str):
            text = "<its message is not text>"
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def message_of(e: BaseException) -> str | None:
    """``str(e)`` where it is text that UTF-8 can hold, else None."""
    try:
        text = str(e)
        text.encode("utf-8")
    except Exception:  # noqa: BLE001  (a __str__ of user code, or a lone surrogate)
        return None
    return text


def where(e: BaseException) -> str:
    """Where the user's code raised: the outermost frame below anybind's own."""
    frames = traceback.extract_tb(e.__traceback__)
    inside = [i for i, f in enumerate(frames) if f.filename.startswith(_PACKAGE)]
    if not inside or inside[-1] + 1 >= len(frames):
        return ""
    f = frames[inside[-1] + 1]
    return f" (in {f.name}, {f.filename}:{f.lineno})"


def to_raise(err: HostError) -> BaseException:
    """What an eager call raises for ``err``: the HostError, or the user's ``BaseException``
    that is no ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) itself, noted."""
    cause = err.__cause__
    if isinstance(cause, BaseException) and not isinstance(cause, Exception):
        cause.add_note(str(err))
        return cause
    return err


def raise_for(err: HostError) -> NoReturn:
    """Raise what an eager call raises for ``err`` (``to_raise``), from inside an ``except``.

    The user's ``BaseException`` is raised as itself, never as its own cause: a
    cycle in the chain of causes hangs whatever walks it (JAX's traceback
    filtering does, on every error raised through a transformation).
    """
    e = to_raise(err)
    if e is err:
        raise err from err.__cause__
    raise e


def find_host_error(runtime_error: BaseException) -> HostError | None:
    """The HostError whose message a runtime error of a compiled program carries, if recent;
    for an error of compiled code (``_shim.c``), a HostError with its message."""
    text = str(runtime_error)
    with _RECENT_LOCK:
        for msg in reversed(_RECENT):
            if msg in text:
                return _RECENT[msg]
    m = _COMPILED.search(text)
    return None if m is None else HostError(_without_jax_note(text[m.start():]))


_COMPILED = re.compile(r"anybind op '[^'\n]*': the compiled ")


def _without_jax_note(text: str) -> str:
    """The message without the note JAX appends about the frames it hid."""
    return text.split("\n--------------------\n")[0]


def pop_host_error(op, runtime_error: BaseException) -> HostError | None:
    text = str(runtime_error)
    with op._lock:
        for msg in op._host_errors:
            if msg in text:
                return op._host_errors.pop(msg)
    mark = f"anybind op '{op.name}': the compiled "  # an error of compiled code (_shim.c)
    if mark in text:
        return HostError(_without_jax_note(text[text.index(mark):]))
    return None
