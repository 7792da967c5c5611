"""Key templates: the keys ``dynamo_lock`` and Celery's ``QueueOnce`` fill from a call's arguments.

A key is a template when it has a placeholder (``"order:{order_id}"``,
``"invoice:{self.pk}"``): ``str.format`` syntax over the call's bound arguments, each
field a parameter or a public attribute of one. :func:`check_templates` checks the
templates against the function's signature once, when a decorator is applied, so a typo
fails at import time; :func:`resolve_keys` fills them at each call. A key without a
placeholder is used exactly as written; a callable key returns a key or a list of keys.
See docs/decorator.md.
"""

from __future__ import annotations

import inspect
import re
import string
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .engine.keys import MAX_LIMIT
from .exceptions import InvalidArgument, InvalidKey

__all__ = ["KeySpec", "check_templates", "is_template", "placeholders", "resolve_keys"]

#: What a decorator takes as a key: a template (or plain key), or a callable that gets
#: the call's arguments and returns a key or a list of keys.
KeySpec = str | Callable[..., str | Sequence[str]]

_formatter = string.Formatter()


def is_template(key: str) -> bool:
    """Whether ``key`` has a placeholder (``{order_id}``, also a bad one like ``{}``).

    A key without one is used exactly as written, by the decorator and by a ``with``
    block alike: ``"export:{"`` and ``"a{{b"`` are literal keys, and the same string
    always names the same lock. Only in a template do ``{{``/``}}`` stand for braces.
    """
    try:
        return any(field is not None for _, field, _, _ in _formatter.parse(key))
    except ValueError:  # a lone or unbalanced brace: no placeholder
        return False


_NAMED = re.compile(r"\{[A-Za-z_]")


def _is_broken_template(key: str) -> bool:
    """A key that does not parse and has a brace before a name (``"order:{order_id"``):
    a template with a typo, which a decorator refuses rather than lock as written."""
    try:
        list(_formatter.parse(key))
    except ValueError:
        return bool(_NAMED.search(key))
    return False


def placeholders(template: str) -> list[str]:
    """The root names a template refers to: ``"{self.pk}:{kind}"`` -> ``["self", "kind"]``.

    A field may name a parameter and its public attributes, nothing else: indexing
    (``{data[0]}``) reads into arbitrary objects, and a private or dunder attribute
    (``{self.__class__}``, ``{user._state}``) is no part of a key.
    """
    names = []
    for _, field, _, _ in _formatter.parse(template):
        if field is None:
            continue
        root = field.split(".", 1)[0].split("[", 1)[0]
        if not root or root.isdigit():
            raise InvalidArgument(
                f"lock key template {template!r}: use named placeholders like {{order_id}}, not {{{field}}}"
            )
        if "[" in field:
            raise InvalidArgument(
                f"lock key template {template!r}: {{{field}}} indexes into a value; name a parameter "
                "or an attribute of one ({order.pk}), or pass a callable key"
            )
        if any(part.startswith("_") for part in field.split(".")[1:]):
            raise InvalidArgument(
                f"lock key template {template!r}: {{{field}}} reaches a private attribute; use a "
                "public one ({self.pk})"
            )
        names.append(root)
    return names


# The text Python gives an object with no __str__ of its own, a function or a method:
# it names the object's address, so every call would lock a key of its own.
_IDENTITY = re.compile(r" at 0x[0-9a-fA-F]+>")


class _KeyFormatter(string.Formatter):
    """Fills one template from the call's arguments.

    Refuses a value that is not a str and is written as an object's address: such a
    key gives no mutual exclusion (a str value is never refused: a URL may hold any
    text). With ``quote``, each filled value is percent-encoded (``42:refund`` ->
    ``42%3Arefund``), so that no value can write the template's separators.
    """

    def __init__(self, template: str, quote: bool):
        self.template, self.quote = template, quote
        self.field, self.value = "", None

    def get_field(self, field_name: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
        found = super().get_field(field_name, args, kwargs)
        self.field, self.value = field_name, found[0]
        return found

    def format_field(self, value: Any, format_spec: str) -> str:
        text = super().format_field(value, format_spec)
        if not isinstance(self.value, str) and _IDENTITY.search(text):
            kind = type(self.value).__qualname__
            raise InvalidArgument(
                f"lock key template {self.template!r}: {{{self.field}}} is a {kind} written as {text!r}, "
                "which names the object's address, so no two calls would share the lock; use an attribute "
                f"({{{self.field}.pk}}) or give {kind} a __str__"
            )
        return urllib.parse.quote(text, safe="") if self.quote else text


def check_templates(keys: Sequence[KeySpec], func: Callable[..., Any]) -> inspect.Signature | None:
    """Check the templates among ``keys`` against ``func``'s signature, and return it.

    Raises :class:`~django_dynlock.exceptions.InvalidArgument` for a placeholder that names
    no parameter of ``func`` (unless it takes ``**kwargs``), a field that indexes or
    reaches a private attribute, a positional placeholder (``{}``), and a template with
    an unclosed placeholder (``"order:{order_id"``). Callables and plain keys pass as
    they are. The signature is what :func:`resolve_keys` binds a call's arguments with;
    None when ``func`` has none Python can read (some builtins), and then only keyword
    arguments fill a template.
    """
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError):  # some builtins and C callables
        return None
    params = signature.parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for key in keys:
        if not isinstance(key, str):
            continue
        if not is_template(key):
            if _is_broken_template(key):
                raise InvalidArgument(
                    f"lock key template {key!r} has a placeholder without its closing brace; write "
                    f"{{name}}, or pass a callable key if the brace belongs to the key"
                )
            continue
        for name in placeholders(key):
            if name not in params and not takes_any:
                raise InvalidArgument(
                    f"lock key template {key!r} refers to {{{name}}}, but {func.__qualname__}() has no "
                    f"parameter {name!r} (parameters: {', '.join(params) or 'none'})"
                )
    return signature


def _namespace(signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The names a template is filled from: the bound arguments, ``**kwargs`` merged in."""
    if signature is None:
        return dict(kwargs)
    bound = signature.bind_partial(*args, **kwargs)
    bound.apply_defaults()
    names: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        kind = signature.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            names.update(value)  # URL kwargs arrive here on CBV dispatch(request, *args, **kwargs)
        elif kind is not inspect.Parameter.VAR_POSITIONAL:
            names[name] = value
    return names


def resolve_keys(
    keys: Sequence[KeySpec],
    signature: inspect.Signature | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    quote: bool = False,
) -> list[str]:
    """The keys of one call: each template filled from ``args`` and ``kwargs``, each
    callable called with them, each plain key as written, in order.

    ``signature`` is what :func:`check_templates` returned for the function; the call's
    arguments are bound to it (defaults applied, ``**kwargs`` merged in). With ``quote``,
    each value filled into a template is percent-encoded, so that no value can write the
    template's separators. Raises InvalidArgument for a template the arguments cannot
    fill or a value that would be written as an object's address, and
    :class:`~django_dynlock.exceptions.InvalidKey` for a callable that returns neither a
    key (str) nor a list or tuple of keys.
    """
    namespace: dict[str, Any] | None = None
    resolved: list[str] = []
    for key in keys:
        if callable(key):
            value = key(*args, **kwargs)
            if isinstance(value, str):
                resolved.append(value)
            elif isinstance(value, (list, tuple)):
                resolved.extend(value)  # each is checked like any key (a str, not empty)
            else:
                name = getattr(key, "__qualname__", repr(key))
                raise InvalidKey(
                    f"the lock key function {name} returned {type(value).__name__}; "
                    "it must return a key (str) or a list of keys"
                )
            continue
        if not is_template(key):
            resolved.append(key)
            continue
        if namespace is None:
            namespace = _namespace(signature, args, kwargs)
        try:
            resolved.append(_KeyFormatter(key, quote).vformat(key, (), namespace))
        except (KeyError, AttributeError, IndexError) as exc:
            raise InvalidArgument(
                f"lock key template {key!r} could not be filled from the call's arguments: {exc!r}"
            ) from exc
    return resolved


#: (where, limit) of each function decorated with a limit out of 1-99, for the system
#: check dynlock.E017 (checks.py), as a model field's bad option is reported.
declared_limits: list[tuple[str, int]] = []


def check_limit(limit: object) -> int:
    """A semaphore's limit (``dynamo_lock(limit=...)``), or InvalidArgument."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument(f"limit must be an int from 1 to {MAX_LIMIT}, got {limit!r}")
    return limit


def check_arguments(given: Callable[..., Any], func: Callable[..., Any], what: str) -> None:
    """At decoration time: every parameter ``given`` needs is one of ``func``'s (or
    ``func`` takes ``**kwargs``, as a class-based view's dispatch does), as for a template."""
    try:
        wanted = inspect.signature(given).parameters.values()
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return  # a builtin or C function: checked at the call
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for param in wanted:
        needed = param.default is inspect.Parameter.empty and param.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        )
        if needed and param.name not in params:
            raise InvalidArgument(
                f"the {what} callable needs {param.name!r}, which {func.__qualname__}() does not take; "
                f"its parameters: {', '.join(params) or 'none'}"
            )


def call_with_arguments(
    given: Callable[..., Any], signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """Call ``given`` with the call's arguments it names (all of them, if it takes ``**kwargs``)."""
    namespace = _namespace(signature, args, kwargs)
    try:
        params = inspect.signature(given).parameters
    except (TypeError, ValueError):
        return given(**namespace)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return given(**namespace)
    return given(**{name: value for name, value in namespace.items() if name in params})
