"""Bounded chat-template rendering: at most ``limits.template_chars`` characters and ``limits.template_seconds`` per row.

A chat template is code from the model snapshot (or a card), run for every row.
transformers already renders it in an ``ImmutableSandboxedEnvironment`` (no file or
attribute escapes), but the sandbox bounds neither time nor size: a template can loop
for ever or build a 10 GB string. Two guards add those bounds without changing what
an ordinary template renders:

* **Size**: the template transformers compiled (its own cached object, found through
  ``tokenizer.get_chat_template``) is recompiled once in an overlay of transformers' own
  environment (the same filters, globals, extensions and options) whose operators and
  calls refuse to build a string or list over the bound (``*``, ``+``, ``%``, ``**``,
  integer arguments of calls and filters), and whose output is counted chunk by chunk.
  The overlay's code replaces the cached template's, so transformers renders through it.
  Outside :func:`bounded_render` (another caller of the same template) nothing is bounded.
* **Time**: one watchdog thread raises :class:`_Timeout` in a render that is past
  its deadline (``PyThreadState_SetAsyncExc``: it lands at the next bytecode, so a pure
  Python loop stops; a single C operation is bounded by the size guard instead).

Either bound crossed is a :class:`TemplateBoundError`, an ``oversized`` row.
"""

from __future__ import annotations

import ctypes
import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from hs_dataset.config import LimitsSection
from hs_dataset.sources.report import OversizedRowError

__all__ = ["TemplateBoundError", "bounded_render", "harden_template"]

T = TypeVar("T")
_POLL_S = 0.05  # the watchdog's tick: a render stops at most this long after its deadline
_WIDTH = re.compile(r"[%:{][^%:{}]*?(\d{8,})")  # a format width of 8+ digits ("%99999999s", "{:>99999999}")
_ACTIVE: ContextVar[LimitsSection | None] = ContextVar("hs_dataset_template_limits", default=None)


class TemplateBoundError(OversizedRowError):
    """A chat template went over ``limits.template_chars`` or ``limits.template_seconds`` for one row."""


class _Timeout(BaseException):
    """Raised by the watchdog inside a render past its deadline (a BaseException, so templates cannot catch it)."""


def _too_big(size: int, what: str) -> None:
    limits = _ACTIVE.get()
    if limits is not None and size > limits.template_chars:
        raise TemplateBoundError(
            f"the chat template builds {what} of {size} items, over the {limits.template_chars}-character template_chars bound "
            "(raise limits.template_chars in the card, or fix the template)"
        )


def _check_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool):
            _too_big(abs(value), "a width or count")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    sized = (str, list, tuple)
    if operator == "*":
        if isinstance(left, sized) and isinstance(right, int):
            _too_big(len(left) * right, "a repeated value")
        elif isinstance(right, sized) and isinstance(left, int):
            _too_big(len(right) * left, "a repeated value")
    elif operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        _too_big(len(left) + len(right), "a joined value")
    elif operator == "%" and isinstance(left, str) and _WIDTH.search(left):
        _too_big(int(_WIDTH.search(left).group(1)), "a formatted string")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        _too_big(right * abs(left).bit_length() // 8, "a power")


def _bounded_filter(fn: Callable[..., Any]) -> Callable[..., Any]:
    skip = 2 if getattr(fn, "jinja_pass_arg", None) is not None else 1  # the context, then the filtered value

    @functools.wraps(fn)  # keeps jinja's pass_context/pass_eval_context marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_args(args[skip:], kwargs)
        return fn(*args, **kwargs)

    return bounded


@functools.lru_cache(maxsize=None)
def _bounded_env_class(base: type) -> type:
    """``base`` (transformers' sandbox class) with size checks on operators and calls."""

    class BoundedEnvironment(base):  # type: ignore[misc, valid-type]
        intercepted_binops = frozenset({"*", "+", "%", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's signature
            _check_args(args, kwargs)
            return super().call(__context, __obj, *args, **kwargs)

        def getattr(self, obj: Any, attribute: str) -> Any:  # ``'{:>99999999}'.format``: the width is in the string
            if isinstance(obj, str) and attribute in ("format", "format_map"):
                found = _WIDTH.search(obj)
                if found:
                    _too_big(int(found.group(1)), "a formatted string")
            return super().getattr(obj, attribute)

    return BoundedEnvironment


def _counted(render: Callable[[Any], Iterator[str]]) -> Callable[[Any], Iterator[str]]:
    def root(context: Any) -> Iterator[str]:
        total = 0
        for chunk in render(context):
            total += len(chunk)
            _too_big(total, "an output")
            yield chunk

    return root


_HARDENED: set[str] = set()  # template sources whose cached template is the bounded one
_HARDEN_LOCK = threading.Lock()


@contextmanager
def _bounds(limits: LimitsSection) -> Iterator[None]:
    token = _ACTIVE.set(limits)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def _bounded_compiler(transformers_compile: Callable[[str], Any]) -> Callable[[str], Any]:
    """A compiler like transformers' whose templates carry the size guard (transformers' environment, overlaid)."""

    def compile_bounded(source: str) -> Any:
        base = transformers_compile("").environment  # transformers' filters, globals and extensions, set up by transformers
        env = base.overlay(optimized=False)  # no constant folding: nothing of the template runs while compiling
        env.__class__ = _bounded_env_class(type(base))
        env.filters = {name: _bounded_filter(fn) for name, fn in env.filters.items()}
        template = env.from_string(source)
        template.root_render_func = _counted(template.root_render_func)
        template._hs_bounded = True
        return template

    return compile_bounded


def harden_template(source: str, limits: LimitsSection) -> bool:
    """Make the template transformers renders for ``source`` the bounded one; False where its cache cannot be reached.

    transformers compiles each template once (``_compile_jinja_template``, cached by source); its compiler is swapped
    for the bounded one while that cache is filled, so the unbounded template is never built (compiling alone can
    run a template's constant expressions: jinja evaluates constant output while generating code, and falls back to
    evaluating it at render time when that raises, which the bounds under ``limits`` then do). A template cached before
    is recompiled in place.
    """
    try:
        from transformers.utils import chat_template_utils as utils

        transformers_compile = utils._cached_compile_jinja_template
        cached = utils._compile_jinja_template
    except (ImportError, AttributeError):  # a transformers whose template cache we have not checked: the time bound still holds
        return False
    with _HARDEN_LOCK:
        if source in _HARDENED:
            return True
        compile_bounded = _bounded_compiler(transformers_compile)
        utils._cached_compile_jinja_template = compile_bounded
        try:
            with _bounds(limits):
                compiled = cached(source)
                if not getattr(compiled, "_hs_bounded", False):
                    compiled.__dict__.update(compile_bounded(source).__dict__)
        finally:
            utils._cached_compile_jinja_template = transformers_compile
        _HARDENED.add(source)
    return True


class _Watchdog:
    """One daemon thread that raises :class:`_Timeout` in threads whose render is past its deadline."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._due: dict[int, float] = {}  # thread id -> monotonic deadline
        self._fired: set[int] = set()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            time.sleep(_POLL_S)
            now = time.monotonic()
            with self._lock:
                for tid in [t for t, due in self._due.items() if due <= now]:
                    del self._due[tid]
                    self._fired.add(tid)
                    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), ctypes.py_object(_Timeout))

    def start(self, seconds: float) -> int:
        tid = threading.get_ident()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hs-template-watchdog", daemon=True)
                self._thread.start()
            self._fired.discard(tid)
            self._due[tid] = time.monotonic() + seconds
        return tid

    def stop(self, tid: int, landed: bool) -> bool:
        """Forget ``tid``'s deadline; True when it fired (an exception that has not landed yet is cancelled)."""
        with self._lock:
            self._due.pop(tid, None)
            fired = tid in self._fired
            self._fired.discard(tid)
            if fired and not landed:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(tid), None)
        return fired


_WATCHDOG = _Watchdog()


def _timed_out(limits: LimitsSection) -> TemplateBoundError:
    return TemplateBoundError(
        f"the chat template took more than {limits.template_seconds:g} s for this row, over the template_seconds bound "
        "(raise limits.template_seconds in the card, or fix the template)"
    )


def bounded_render(limits: LimitsSection, render: Callable[[], T]) -> T:
    """``render()`` (a call that renders a hardened template) within ``limits``' size and time bounds."""
    landed = False
    tid = _WATCHDOG.start(limits.template_seconds)
    try:
        try:
            with _bounds(limits):
                return render()
        except _Timeout:
            landed = True
            raise
        finally:
            if _WATCHDOG.stop(tid, landed):
                raise _Timeout
    except _Timeout:
        raise _timed_out(limits) from None
