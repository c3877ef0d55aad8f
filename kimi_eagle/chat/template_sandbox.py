"""Chat templates from a model folder, rendered in jinja2's immutable sandbox with bounds on work, time and size.

A chat template comes from a model folder, i.e. from anyone. jinja2's sandbox already stops attribute escapes
(``__globals__``, ``__subclasses__``) and input mutation, but not work: two nested ``range(100000)`` loops are
10**10 iterations, ``'a' * 50000000`` is 50 MB in one step, ``10 ** 10 ** 10`` never returns. Here every
loop iteration, call, attribute or item lookup and intercepted operator spends one step of a per-render budget;
the render stops with :class:`TemplateLimitError` (a ``jinja2.TemplateError``) when it runs out of steps or time,
when its output grows past a size, or *before* an operator, filter or method would build a value past that size.
"""
from __future__ import annotations

import functools
import json
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from jinja2 import nodes
from jinja2.environment import Template
from jinja2.exceptions import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds of one render. Real chat templates (Qwen3, Llama 3, Kimi) need well under 10**4 steps per turn."""

    steps: int = 2_000_000  # loop iterations + calls + lookups + operators
    seconds: float = 5.0
    chars: int = 8_000_000  # the rendered text, and any single string or list built on the way


DEFAULT_LIMITS = TemplateLimits()
BOUNDED_ITER = "kimi_bounded_iter"  # the environment attribute every `{% for %}` iterates through
BOUNDED_CONCAT = "kimi_bounded_concat"  # and the one every `~` joins through
_WIDTH = re.compile(r"\d{7,}")  # a format width or precision of a million or more


class TemplateLimitError(TemplateError):
    """A chat template exceeded its steps, time or size bound."""


class _Budget(threading.local):
    limits: TemplateLimits | None = None
    steps_left: int = 0
    deadline: float = 0.0


class BoundedTemplate(Template):
    """A template whose ``render`` runs under its environment's :class:`TemplateLimits`."""

    def render(self, *args: Any, **kwargs: Any) -> str:
        return render_bounded(self, *args, **kwargs)


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """The immutable sandbox with every loop, call, lookup, operator and filter charged to a per-render budget."""

    template_class = BoundedTemplate
    intercepted_binops = frozenset({"*", "**", "+", "%", "//", "/"})
    intercepted_unops = frozenset({"-"})

    def __init__(self, limits: TemplateLimits = DEFAULT_LIMITS, **options: Any) -> None:
        super().__init__(finalize=self._finalize, **options)
        self.limits = limits
        self.budget = _Budget()
        setattr(self, BOUNDED_ITER, self.bounded_iter)
        setattr(self, BOUNDED_CONCAT, self.bounded_concat)
        self.filters = {name: self.bounded_filter(f) for name, f in self.filters.items()}

    # every loop of the template iterates through this (see ``_parse``)
    def bounded_iter(self, iterable: Any) -> Any:
        for item in iterable:
            self.spend()
            yield item

    def _finalize(self, value: Any) -> Any:
        """Every ``{{ value }}`` before it is printed: a structure too large to print is refused unprinted."""
        if isinstance(value, (list, tuple, dict)) and weight(value, self.limits.chars) > self.limits.chars:
            raise TemplateLimitError(f"chat template: a value of more than {self.limits.chars} characters")
        return value

    def bounded_concat(self, *parts: Any) -> str:
        self.spend()
        _check_args(self.limits.chars, parts)
        texts = [str(p) for p in parts]
        if sum(map(len, texts)) > self.limits.chars:
            raise TemplateLimitError(f"chat template: a ~ concatenation past {self.limits.chars} characters")
        return "".join(texts)

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        return _ChargeLoopsAndConcats().visit(super()._parse(source, name, filename))

    def spend(self, steps: int = 1) -> None:
        budget = self.budget
        if budget.limits is None:
            raise TemplateLimitError("a bounded template renders only through render() / render_bounded()")
        budget.steps_left -= steps
        if budget.steps_left < 0:
            raise TemplateLimitError(f"chat template exceeded {budget.limits.steps} steps (loops, calls, lookups)")
        if time.monotonic() > budget.deadline:
            raise TemplateLimitError(f"chat template exceeded {budget.limits.seconds:g} s")

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja's signature)
        __self.spend()
        _check_call(__self.limits.chars, __obj, args, kwargs)
        return _checked(__self.limits.chars, super().call(__context, __obj, *args, **kwargs))

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.spend()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.spend()
        return super().getitem(obj, argument)

    def call_binop(self, context: Any, operator_: str, left: Any, right: Any) -> Any:
        self.spend()
        _check_binop(self.limits.chars, operator_, left, right)
        return _checked(self.limits.chars, super().call_binop(context, operator_, left, right))

    def call_unop(self, context: Any, operator_: str, arg: Any) -> Any:
        self.spend()
        return super().call_unop(context, operator_, arg)

    def bounded_filter(self, f: Callable) -> Callable:
        """``f`` charged one step, refused for a size argument past the bound, its result measured."""
        @functools.wraps(f)  # keeps jinja's pass_context/pass_environment marks
        def bounded(*args: Any, **kwargs: Any) -> Any:
            self.spend()
            values = [a for a in args if not hasattr(a, "environment")]  # without the context / eval context
            if values:  # the filtered value may be any number; a width or count after it may not be huge
                subject = (_Subject(values[0]),) if f.__name__ in PRINTING_FILTERS else ()
                _check_args(self.limits.chars, (*subject, *values[1:], *kwargs.values()))
            if f.__name__ == "do_replace" and len(values) >= 3:
                _check_replace(self.limits.chars, *values[:3])
            elif f.__name__ == "do_format" and values:
                _check_binop(self.limits.chars, "%", values[0], None)
            elif f.__name__ == "do_join" and values:
                _check_join(self.limits.chars, values[1] if len(values) > 1 else "", values[0])
            return _checked(self.limits.chars, f(*args, **kwargs))
        return bounded


# filters whose output grows with the whole structure they are given (the others copy or pick from it)
PRINTING_FILTERS = frozenset({"tojson", "do_tojson", "do_pprint", "soft_str", "do_string", "do_join", "do_format", "do_urlencode", "do_xmlattr",
                              "do_center", "do_indent", "do_wordwrap", "do_truncate", "do_replace", "do_mark_safe",
                              "do_forceescape", "escape", "do_title", "do_upper", "do_lower", "do_capitalize"})


class _Subject:
    """The value a filter is applied to, checked for its size but not as a number."""

    def __init__(self, value: Any) -> None:
        self.value = value


class _ChargeLoopsAndConcats(NodeTransformer):
    """Every ``{% for %}`` iterates through ``environment.kimi_bounded_iter`` and every ``~`` joins through
    ``environment.kimi_bounded_concat`` (environment attributes: a template cannot shadow them)."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Call(nodes.EnvironmentAttribute(BOUNDED_ITER, lineno=node.lineno), [node.iter], [],
                               None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return nodes.Call(nodes.EnvironmentAttribute(BOUNDED_CONCAT, lineno=node.lineno), list(node.nodes), [],
                          None, None, lineno=node.lineno)


def _size(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple, dict)) else 0


MAX_NODES = 250_000  # items in one structure a template may print or pass on (a chat's messages hold far fewer)


def weight(value: Any, limit: int) -> int:
    """About how many characters ``value`` prints as: string lengths plus one per item, through nested lists,
    tuples and dicts, counting a shared part each time it appears (``[x, x]`` weighs twice ``x``: it prints
    twice). Past ``limit`` characters or :data:`MAX_NODES` items it stops (and answers ``limit + 1``), so a
    structure doubled 60 times costs at most that many steps."""
    if isinstance(value, (str, bytes)):
        return len(value) + 1
    total, stack, nodes = 0, [value], 0
    while stack and total <= limit:
        nodes += 1
        if nodes > MAX_NODES:
            return limit + 1
        v = stack.pop()
        if isinstance(v, (str, bytes)):
            total += len(v) + 1
        elif isinstance(v, (list, tuple)):
            total += 1
            stack.extend(v)
        elif isinstance(v, dict):
            total += 1
            stack.extend(v.keys())
            stack.extend(v.values())
        else:
            total += 1
    return total


def _checked(limit: int, value: Any) -> Any:
    if _size(value) > limit:
        raise TemplateLimitError(f"chat template built a value of {_size(value)} items; at most {limit}")
    return value


def _check_args(limit: int, args: tuple) -> None:
    for arg in args:  # a width, count or repeat of a size no output may reach; a structure too large to print
        if isinstance(arg, _Subject):
            arg = arg.value
        elif isinstance(arg, (int, float)) and not isinstance(arg, bool) and abs(arg) > limit:
            raise TemplateLimitError(f"chat template: the argument {arg!r} is past the size bound {limit}"[:200])
        if isinstance(arg, (list, tuple, dict)) and weight(arg, limit) > limit:
            raise TemplateLimitError(f"chat template: a value of more than {limit} characters")


def _check_binop(limit: int, op: str, left: Any, right: Any) -> None:
    if op == "*":
        for seq, times in ((left, right), (right, left)):
            if _size(seq) and isinstance(times, int) and weight(seq, limit) * max(times, 0) > limit:
                raise TemplateLimitError(f"chat template: {_size(seq)} items * {times} is past {limit} items"[:200])
    elif op == "+" and _size(left) + _size(right) and weight(left, limit) + weight(right, limit) > limit:
        raise TemplateLimitError(f"chat template: a concatenation past {limit} items")
    elif op == "%" and isinstance(left, str):
        if _WIDTH.search(left):
            raise TemplateLimitError(f"chat template: a format width past {limit} characters")
        _check_args(limit, right if isinstance(right, tuple) else (right,))
    elif op == "**" and isinstance(left, (int, float)) and isinstance(right, (int, float)):
        if abs(right) > 1024 and abs(left) > 1:
            raise TemplateLimitError(f"chat template: {left!r} ** {right!r} is too large a power"[:200])


def _check_call(limit: int, fn: Any, args: tuple, kwargs: dict) -> None:
    """Before a method builds a string: widths (``center``, ``ljust``, ``zfill``) and the results of ``replace``
    and ``join``, whose size follows from their arguments."""
    _check_args(limit, (*args, *kwargs.values()))
    owner = getattr(getattr(fn, "__wrapped__", fn), "__self__", None)  # the sandbox wraps str.format
    if not isinstance(owner, str):
        return
    name = getattr(fn, "__name__", "")
    if name in ("format", "format_map"):
        _check_binop(limit, "%", owner, None)
    elif name == "replace" and len(args) >= 2:
        _check_replace(limit, owner, args[0], args[1])
    elif name == "join" and args:
        _check_join(limit, owner, args[0])
    elif name == "expandtabs":
        _check_expandtabs(limit, owner, args[0] if args else kwargs.get("tabsize", 8))


def _check_replace(limit: int, text: Any, old: Any, new: Any) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        hits = text.count(old) if old else len(text) + 1
        if len(text) + hits * (len(new) - len(old)) > limit:
            raise TemplateLimitError(f"chat template: a replace() past {limit} characters")


def _check_expandtabs(limit: int, text: str, tabsize: Any) -> None:
    """Each tab becomes at most ``tabsize`` spaces."""
    if isinstance(tabsize, int) and len(text) + text.count("\t") * max(tabsize, 0) > limit:
        raise TemplateLimitError(f"chat template: an expandtabs() past {limit} characters")


def _check_join(limit: int, sep: Any, items: Any) -> None:
    if isinstance(sep, str) and isinstance(items, (list, tuple)):
        if len(sep) * max(len(items) - 1, 0) + sum(_size(x) for x in items) > limit:
            raise TemplateLimitError(f"chat template: a join() past {limit} characters")


def render_bounded(template: Template, *args: Any, **kwargs: Any) -> str:
    """Render ``template`` (of a :class:`BoundedSandbox`) within its limits, streaming so that the output is
    measured as it grows. Raises :class:`TemplateLimitError` past a bound."""
    env = template.environment
    limits: TemplateLimits = getattr(env, "limits", DEFAULT_LIMITS)
    budget: _Budget = env.budget
    outer = (budget.limits, budget.steps_left, budget.deadline)  # a render inside a render keeps the outer budget
    if budget.limits is None:
        budget.limits, budget.steps_left, budget.deadline = limits, limits.steps, time.monotonic() + limits.seconds
    try:
        parts: list[str] = []
        size = 0
        for chunk in Template.generate(template, *args, **kwargs):
            size += len(chunk)
            if size > limits.chars:
                raise TemplateLimitError(f"chat template output exceeded {limits.chars} characters")
            parts.append(chunk)
        return "".join(parts)
    except RecursionError:  # a macro or recursive loop that calls itself without end
        raise TemplateLimitError("chat template recursed too deeply") from None
    finally:
        budget.limits, budget.steps_left, budget.deadline = outer


def bounded_template(source: str, raise_exception: Callable[[str], Any],
                     limits: TemplateLimits = DEFAULT_LIMITS) -> Template:
    """``source`` compiled in a :class:`BoundedSandbox` with the options transformers renders chat templates with
    (``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``raise_exception``, ``tojson``)."""
    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = BoundedSandbox(limits, trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = env.bounded_filter(tojson)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(source)

