"""The keys of a request body that vLLM's server would ignore, at every level.

vLLM's request models take a field they do not declare and ignore it (a debug line in its
log). Inside them, a message, a content part or a message's tool call is a ``TypedDict``
(openai's params and vLLM's own, ``vllm/renderers/chat_utils.py``) that vLLM reads key by key
when it builds the conversation for the chat template: a key no such type declares is kept by
pydantic and read by nobody. (A tool's or a response format's undeclared keys stay in the
model's extras; a tool's reach the chat template in the dumped tool, as raw JSON, with no
meaning vLLM applies.) :func:`unknown_keys` walks a body along the types vLLM reads it with
and names each key that no type there declares, as a dotted path (``messages.2.nmae``).

What a type declares is read from the type itself, never from a list kept here, so a key a
vLLM upgrade adds is known without a change:

- a pydantic model: the keys its fields are validated by (the alias where there is one; the
  name too where the model validates by name); a model that forbids extra keys is left to
  pydantic (vLLM's own error answers them), its fields still walked;
- a ``TypedDict`` (required and optional keys), a dataclass (pydantic's or not);
- a union: a key is known if *any* member declares it (a message's keys are those of every
  message param vLLM accepts), its value walked with every member's type for it;
- a list, tuple or iterable: each item; a mapping (``dict[str, X]``): any key, each value
  walked as ``X``;
- ``Any``, a mapping to ``Any`` (a JSON schema, a tool's ``parameters``, ``logit_bias``,
  ``chat_template_kwargs``, ``vllm_xargs``...) and any type not understood here: free-form,
  not walked.

One kind of undeclared key is vLLM's to read: a content part's (``cache_control``, say),
which vLLM passes to a chat template that iterates over content parts (the "openai" content
format) and drops for one that renders content as a string. :func:`is_content_part_key`
names them; the route takes them when the request's template reads them
(:func:`autospec.serve.vllm_http.parse`).

A shape is computed once per class and per path of types the bodies reach (cached), so a
request costs a walk over its own keys.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from functools import cache
from typing import Any

from pydantic import AliasChoices, AliasPath, BaseModel, RootModel

#: most unknown keys a walk collects (the refusal names them)
MAX_REPORTED = 10

_SCALARS = (str, bytes, int, float, bool, type(None))
_WRAPPERS = {"Required", "NotRequired", "ReadOnly", "ClassVar", "Final"}


class Shape:
    """What a JSON value may be where vLLM reads it with ``hints`` (annotations): an object
    with declared keys, a mapping with any key, a list, or free-form (not checked)."""

    def __init__(self, hints: Iterable[Any]) -> None:
        self.free = False
        self.fields: dict[str, list[Any]] = {}  # key → the annotations of its value
        self.objects = False  # some object type here would ignore an unknown key
        self.values: list[Any] = []  # a mapping's value annotations (any key)
        self.items: list[Any] = []  # a list's item annotations
        self._children: dict[str, Shape] = {}
        self._item: Shape | None = None
        for hint in hints:
            self._add(hint)

    def _add(self, hint: Any) -> None:
        hint = _unwrap(hint)
        origin = typing.get_origin(hint)
        if origin is typing.Union or origin is types.UnionType:
            for arg in typing.get_args(hint):
                self._add(arg)
        elif origin is typing.Literal or hint in _SCALARS or \
                (isinstance(hint, type) and issubclass(hint, enum.Enum)):
            pass  # a scalar: nothing below it
        elif hint is Any or hint is object:
            self.free = True
        elif isinstance(origin, type) and origin is not type:
            self._add_generic(origin, typing.get_args(hint))
        elif isinstance(hint, type) and issubclass(hint, RootModel):
            self._add(hint.model_fields["root"].annotation)  # the body holds the root itself
        elif isinstance(hint, type) and (declared := _declared(hint)) is not None:
            keys, refuses = declared
            self.objects = self.objects or refuses
            for key, annotations in keys.items():
                self.fields.setdefault(key, []).extend(annotations)
        elif isinstance(hint, type) and issubclass(hint, (Mapping, list, tuple, set)):
            self._add_generic(hint, ())
        else:
            self.free = True  # a type not understood here (an unresolved name...): unchecked

    def _add_generic(self, origin: type, args: tuple[Any, ...]) -> None:
        if issubclass(origin, Mapping):
            self.values.append(args[1] if len(args) == 2 else Any)
        elif issubclass(origin, Iterable) and not issubclass(origin, (str, bytes)):
            self.items.extend([a for a in args if a is not Ellipsis] or [Any])
        else:
            self.free = True

    def child(self, key: str) -> Shape:
        """The shape of the value under ``key`` (every member's type for it)."""
        if key not in self._children:
            self._children[key] = Shape([*self.fields.get(key, ()), *self.values])
        return self._children[key]

    def item(self) -> Shape:
        if self._item is None:
            self._item = Shape(self.items)
        return self._item


def _unwrap(hint: Any) -> Any:
    """The type under ``Annotated``, ``Required``..., a ``type X = ...`` alias, a NewType."""
    while True:
        origin = typing.get_origin(hint)
        if origin is typing.Annotated or getattr(origin, "_name", None) in _WRAPPERS:
            hint = typing.get_args(hint)[0]
        elif type(hint).__name__ == "TypeAliasType":
            hint = hint.__value__
        elif hasattr(hint, "__supertype__"):
            hint = hint.__supertype__
        else:
            return hint


@cache
def _declared(cls: type) -> tuple[dict[str, list[Any]], bool] | None:
    """The keys an object type declares (each with its value's annotation), and whether an
    unknown key would be ignored (pydantic refuses it itself where the type forbids extras);
    None where ``cls`` is no object type."""
    if issubclass(cls, BaseModel):
        return _pydantic_keys(cls.model_fields, cls.model_config), \
            cls.model_config.get("extra") != "forbid"
    if issubclass(cls, dict) and hasattr(cls, "__required_keys__"):  # a TypedDict
        hints = _hints(cls)
        keys = cls.__required_keys__ | cls.__optional_keys__
        refuses = (getattr(cls, "__pydantic_config__", None) or {}).get("extra") != "forbid"
        return {key: [hints.get(key, Any)] for key in keys}, refuses
    if hasattr(cls, "__pydantic_fields__"):  # a pydantic dataclass
        config = getattr(cls, "__pydantic_config__", None) or {}
        return _pydantic_keys(cls.__pydantic_fields__, config), config.get("extra") != "forbid"
    if dataclasses.is_dataclass(cls):
        hints = _hints(cls)
        return {f.name: [hints.get(f.name, Any)] for f in dataclasses.fields(cls) if f.init}, True
    return None


def _pydantic_keys(fields: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, list[Any]]:
    """The input keys of pydantic fields: each field's alias(es) where it has them (its
    name too where the model validates by name), else its name."""
    by_name = config.get("validate_by_name") or config.get("populate_by_name")
    keys: dict[str, list[Any]] = {}
    for name, info in fields.items():
        if getattr(info, "init", None) is False:
            continue  # set by the type itself, never from the body
        aliases = _aliases(info.validation_alias) or _aliases(info.alias)
        if config.get("validate_by_alias") is False:
            aliases = []
        for key in ([name] if by_name or not aliases else []) + aliases:
            keys.setdefault(key, []).append(info.annotation)
    return keys


def _aliases(alias: Any) -> list[str]:
    if isinstance(alias, str):
        return [alias]
    if isinstance(alias, AliasPath):
        return [str(alias.path[0])]
    if isinstance(alias, AliasChoices):
        return [key for choice in alias.choices for key in _aliases(choice)]
    return []


def _hints(cls: type) -> dict[str, Any]:
    """``cls``'s annotations, names resolved where they can be (one left a string is
    free-form)."""
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:  # an unresolvable name: the raw annotations
        return dict(getattr(cls, "__annotations__", {}))


@cache
def request_shape(model: type[BaseModel]) -> Shape:
    """The shape of a body vLLM reads as ``model`` (computed once)."""
    return Shape([model])


def unknown_keys(data: Any, model: type[BaseModel],
                 taken: Callable[[str], bool] | None = None) -> list[str]:
    """The dotted paths of ``data``'s keys that vLLM's ``model`` (and the types inside it)
    do not declare, in the body's order, but those ``taken`` says are read anyway; at most
    :data:`MAX_REPORTED`."""
    found: list[str] = []
    _walk(data, request_shape(model), "", found, taken or (lambda path: False))
    return found


def _walk(value: Any, shape: Shape, path: str, found: list[str],
          taken: Callable[[str], bool]) -> None:
    if shape.free or len(found) >= MAX_REPORTED:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}{key}"
            if shape.objects and key not in shape.fields and not shape.values:
                if not taken(where):
                    found.append(where)
                if len(found) >= MAX_REPORTED:
                    return
            elif key in shape.fields or shape.values:
                _walk(item, shape.child(key), f"{where}.", found, taken)
    elif isinstance(value, list) and shape.items:
        item_shape = shape.item()
        for index, item in enumerate(value):
            _walk(item, item_shape, f"{path}{index}.", found, taken)


def is_content_part_key(path: str) -> bool:
    """Whether ``path`` is a key of a message's content part (``messages.2.content.1.x``):
    vLLM hands such a key to a chat template of the "openai" content format (its
    ``_collect_extra_fields``) and drops it for one that renders content as a string."""
    parts = path.split(".")
    return (len(parts) == 5 and parts[0] == "messages" and parts[2] == "content"
            and parts[1].isdigit() and parts[3].isdigit())
