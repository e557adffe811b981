"""Bounded chat-template rendering: output, values built and time per row, all set by the card.

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
* **Memory during the render**: operations that can build far more than they are given
  (``~``, ``join``, ``replace``, ``tojson``, ``indent``, ``%``, a value written out) are
  sized from their arguments first (:mod:`.template_sizes`) and refused over the bound,
  and every string or list the template builds (slices too) is charged to the render
  by its largest size in memory (4 bytes a character, 8 an item), which may build at
  most :data:`BUILT_FACTOR` bytes per character of ``template_chars`` in all: what a
  template can hold in its variables is bounded, not only what it outputs.
* **Output a sample can use**: the caller may set a lower output bound than
  ``template_chars`` (what ``max_length`` tokens can need), so a row whose render is
  longer is refused before it is tokenized.
* **Time**: one watchdog thread raises :class:`_Timeout` in a render that is past
  its deadline (``PyThreadState_SetAsyncExc``: it lands at the next bytecode, so a pure
  Python loop stops; a single C operation is bounded by the size guard instead). A
  :class:`RowBudget` carries one row's ``template_seconds`` across all its renders (its
  turns, when regenerating), so a row never takes more than that in all.

Any bound crossed is a :class:`TemplateBoundError`, an ``oversized`` row.
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
from dataclasses import dataclass
from typing import Any, TypeVar

from hs_dataset.config import LimitsSection
from hs_dataset.sources.report import OversizedRowError
from hs_dataset.sources.template_sizes import MATERIALIZING_FILTERS, call_size, filter_size, rendered_size

__all__ = ["BUILT_FACTOR", "RowBudget", "TemplateBoundError", "bounded_render", "harden_template"]

T = TypeVar("T")
_POLL_S = 0.05  # the watchdog's tick: a render stops at most this long after its deadline
_WIDTH = re.compile(r"[%:{][^%:{}]*?(\d{8,})")  # a format width of 8+ digits ("%99999999s", "{:>99999999}")
BUILT_FACTOR = 8  # a render may build this many bytes per template_chars in all (128 MiB at the default)
_CHAR_BYTES, _ITEM_BYTES = 4, 8  # what a value costs at most: a character of a str, an item (a reference) of a list


@dataclass
class _Render:
    """The bounds of the render running in this context, and what it has built so far."""

    limits: LimitsSection
    output_chars: int  # characters the render may output (at most template_chars)
    built: int = 0  # bytes of the strings and lists the render built (at most: _CHAR_BYTES a character, _ITEM_BYTES an item)


_ACTIVE: ContextVar[_Render | None] = ContextVar("hs_dataset_template_limits", default=None)


class TemplateBoundError(OversizedRowError):
    """A chat template went over ``limits.template_chars`` or ``limits.template_seconds`` for one row."""


class _Timeout(BaseException):
    """Raised by the watchdog inside a render past its deadline (a BaseException, so templates cannot catch it)."""


def _too_big(size: int, what: str) -> None:
    render = _ACTIVE.get()
    if render is not None and size > render.limits.template_chars:
        raise TemplateBoundError(
            f"the chat template builds {what} of {size} items, over the {render.limits.template_chars}-character template_chars bound "
            "(raise limits.template_chars in the card, or fix the template)"
        )


def _limit() -> int:
    render = _ACTIVE.get()
    return render.limits.template_chars if render is not None else 0


def _weight(value: Any) -> int:
    """At most how many bytes ``value`` holds beyond what it references (a str's characters, a container's references)."""
    if isinstance(value, str):
        return _CHAR_BYTES * len(value)
    if isinstance(value, (list, tuple, dict, set)):
        return _ITEM_BYTES * len(value)
    return 0


def _charge(value: Any, ahead: int = 0) -> Any:
    """Count a value the template built toward the render's total (``ahead``: bytes of one it is about to build,
    counted only to refuse it before it exists); refuse the render past :data:`BUILT_FACTOR` x ``template_chars`` bytes."""
    render = _ACTIVE.get()
    if render is None:
        return value
    size = _weight(value)
    allowed = BUILT_FACTOR * render.limits.template_chars
    if render.built + size + ahead > allowed:
        raise TemplateBoundError(
            f"the chat template built more than {allowed >> 20} MiB of strings and lists in all for this row "
            f"({BUILT_FACTOR} bytes per character of the {render.limits.template_chars}-character template_chars bound; "
            "raise limits.template_chars in the card, or fix the template)"
        )
    render.built += size
    return value


def _sized(size: int | None, what: str, per: int = _CHAR_BYTES) -> None:
    """An operation about to build ``size`` characters (``per`` 4) or items (``per`` 8): refused over the
    one-operation bound or the render's total."""
    if size is not None:
        _too_big(size, what)
        _charge(None, max(0, size) * per)


def _check_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, int) and not isinstance(value, bool):
            _too_big(abs(value), "a width or count")


def _per(value: Any) -> int:
    return _CHAR_BYTES if isinstance(value, str) else _ITEM_BYTES


def _check_binop(operator: str, left: Any, right: Any) -> None:
    sized = (str, list, tuple)
    if operator == "%" and isinstance(left, str) and not isinstance(right, str):  # "%s" % a_list writes the list out
        _too_big(len(left) + rendered_size(right, _limit()), "a formatted string")
    if operator == "*":
        if isinstance(left, sized) and isinstance(right, int):
            _sized(len(left) * right, "a repeated value", _per(left))
        elif isinstance(right, sized) and isinstance(left, int):
            _sized(len(right) * left, "a repeated value", _per(right))
    elif operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        _sized(len(left) + len(right), "a joined value", _per(left))
    elif operator == "%" and isinstance(left, str) and _WIDTH.search(left):
        _too_big(int(_WIDTH.search(left).group(1)), "a formatted string")
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        _too_big(right * abs(left).bit_length() // 8, "a power")


def _bounded_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    first = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0  # the context, then the filtered value

    @functools.wraps(fn)  # keeps jinja's pass_context/pass_eval_context marks
    def bounded(*args: Any, **kwargs: Any) -> Any:
        _check_args(args[first + 1 :], kwargs)
        if _ACTIVE.get() is not None:
            per = _ITEM_BYTES if name in MATERIALIZING_FILTERS or name == "sum" else _CHAR_BYTES
            _sized(filter_size(name, args[first:], kwargs, _limit()), f"the result of the {name} filter", per)
        return _charge(fn(*args, **kwargs))

    return bounded


def _concat(parts: tuple[Any, ...], eval_ctx: Any) -> str:
    """``a ~ b ~ ...``: sized before the parts are written out and joined (jinja's own join functions after)."""
    from jinja2.runtime import markup_join, str_join

    if _ACTIVE.get() is not None:
        limit = _limit()
        _sized(sum(len(p) if isinstance(p, str) else rendered_size(p, limit) for p in parts), "a joined value (~)")
    join = markup_join if (eval_ctx.autoescape or eval_ctx.volatile) else str_join
    return _charge(join(parts))


def _finalize(value: Any) -> Any:
    """A value written out (``{{ x }}``): one that is not a string is sized before ``str`` writes it."""
    render = _ACTIVE.get()
    if render is not None and not isinstance(value, str):
        size = rendered_size(value, render.output_chars)
        if size > render.output_chars:
            _too_big_output(size, render)
    return value


def _too_big_output(size: int, render: _Render) -> None:
    if render.output_chars < render.limits.template_chars:
        raise TemplateBoundError(
            f"the chat template builds an output of over {render.output_chars} items for this row, over its output bound (the lower "
            "of template_chars and 4 x the row character cap, what max_length tokens can use); refused before it is tokenized "
            "(raise max_length, or fix the template or the row)"
        )
    _too_big(size, "an output")


@functools.cache
def _bounded_code_generator(base: type) -> type:
    """jinja's code generator, with ``~`` and slices routed through the size guard (both bypass the environment)."""

    class BoundedCodeGenerator(base):  # type: ignore[misc, valid-type]
        def visit_Concat(self, node: Any, frame: Any) -> None:
            self.write("environment.hs_concat((")
            for arg in node.nodes:
                self.visit(arg, frame)
                self.write(", ")
            self.write("), context.eval_ctx)")

        def visit_Getitem(self, node: Any, frame: Any) -> None:
            from jinja2 import nodes

            if not isinstance(node.arg, nodes.Slice):
                return super().visit_Getitem(node, frame)
            self.write("environment.hs_charge(")
            super().visit_Getitem(node, frame)
            self.write(")")

    return BoundedCodeGenerator


@functools.cache
def _bounded_env_class(base: type) -> type:
    """``base`` (transformers' sandbox class) with size checks on operators and calls."""

    class BoundedEnvironment(base):  # type: ignore[misc, valid-type]
        intercepted_binops = frozenset({"*", "+", "%", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return _charge(super().call_binop(context, operator, left, right))

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - jinja's signature
            _check_args(args, kwargs)
            if _ACTIVE.get() is not None:
                _sized(call_size(__obj, args, kwargs, _limit()), f"the result of {getattr(__obj, '__name__', 'a call')}()")
            return _charge(super().call(__context, __obj, *args, **kwargs))

        @staticmethod
        def hs_concat(parts: tuple[Any, ...], eval_ctx: Any) -> str:
            return _concat(parts, eval_ctx)

        @staticmethod
        def hs_charge(value: Any) -> Any:
            return _charge(value)

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
            active = _ACTIVE.get()
            if active is not None and total > active.output_chars:
                _too_big_output(total, active)
            yield chunk

    return root


_HARDENED: set[str] = set()  # template sources whose cached template is the bounded one
_HARDEN_LOCK = threading.Lock()


@contextmanager
def _bounds(limits: LimitsSection, output_chars: int | None = None) -> Iterator[None]:
    token = _ACTIVE.set(_Render(limits, min(limits.template_chars, output_chars or limits.template_chars)))
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
        env.code_generator_class = _bounded_code_generator(base.code_generator_class)
        env.finalize = _finalize if base.finalize is None else (lambda value: _finalize(base.finalize(value)))
        env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
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


class RowBudget:
    """One row's ``template_seconds``, spent across all of its renders.

    A row is rendered once or twice to be tokenized, and once or twice per turn when its
    assistant turns are regenerated: the bound is the row's, so a conversation of many
    turns stops at ``template_seconds`` in all, not at that much per render.
    """

    def __init__(self, limits: LimitsSection) -> None:
        self.seconds = limits.template_seconds
        self.spent = 0.0
        self.renders = 0

    @property
    def left(self) -> float:
        return max(0.0, self.seconds - self.spent)


def _timed_out(budget: RowBudget) -> TemplateBoundError:
    over = f" over its {budget.renders} renders" if budget.renders > 1 else ""
    return TemplateBoundError(
        f"the chat template took more than {budget.seconds:g} s for this row{over}, over the template_seconds bound "
        "(raise limits.template_seconds in the card, or fix the template)"
    )


def bounded_render(
    limits: LimitsSection, render: Callable[[], T], *, budget: RowBudget | None = None, output_chars: int | None = None
) -> T:
    """``render()`` (a call that renders a hardened template) within ``limits``' size and time bounds.

    ``budget``: the row's time, shared by its renders (default: this render alone).
    ``output_chars``: a lower output bound than ``template_chars`` (what the sample can use).
    """
    budget = budget if budget is not None else RowBudget(limits)
    if budget.left <= 0:
        raise _timed_out(budget)
    landed = False
    started = time.monotonic()
    tid = _WATCHDOG.start(budget.left)
    try:
        try:
            with _bounds(limits, output_chars):
                return render()
        except _Timeout:
            landed = True
            raise
        finally:
            budget.spent += time.monotonic() - started
            budget.renders += 1
            if _WATCHDOG.stop(tid, landed):
                raise _Timeout
    except _Timeout:
        raise _timed_out(budget) from None
