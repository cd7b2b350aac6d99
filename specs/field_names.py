"""The fields a spec accepts at a place in it, for a "did you mean" on a misspelt one (pure)."""
from __future__ import annotations

import difflib
import inspect
import types
import typing

from pydantic import BaseModel

LIMIT = 32   # nesting followed at most; specs are a few levels deep


def field_names_at(annotation, loc: tuple, depth: int = 0) -> list[str] | None:
    """The field names of the model found at `loc` below `annotation` (a model or a type holding models, walked as
    pydantic writes an error's location: list indices, dict keys, a union member's tag), or None if none is."""
    if depth > LIMIT:
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return field_names_at(args[0], loc, depth + 1)
    if origin in (typing.Union, types.UnionType):
        models = [a for a in args if inspect.isclass(a) and issubclass(a, BaseModel)]
        if loc and (tagged := [m for m in models if loc[0] in tags_of(m)]):
            return field_names_at(tagged[0], loc[1:], depth + 1)
        others = [a for a in args if a is not type(None)]
        return field_names_at(others[0], loc, depth + 1) if len(others) == 1 else None
    if origin in (list, tuple, set, frozenset) and loc and args:
        return field_names_at(args[0], loc[1:], depth + 1)
    if origin is dict and loc and len(args) == 2:
        return field_names_at(args[1], loc[1:], depth + 1)
    if inspect.isclass(annotation) and issubclass(annotation, BaseModel):
        fields = annotation.model_fields
        if not loc:
            return list(fields)
        field = fields.get(loc[0]) or next((f for f in fields.values() if f.alias == loc[0]), None)
        return None if field is None else field_names_at(field.annotation, loc[1:], depth + 1)
    return None


def tags_of(model: type[BaseModel]) -> set:
    """What pydantic may name a union member by in a location: its class name and its Literal fields' values."""
    tags: set = {model.__name__}
    for field in model.model_fields.values():
        if typing.get_origin(field.annotation) is typing.Literal:
            tags.update(typing.get_args(field.annotation))
    return tags


def did_you_mean(model: type[BaseModel], loc: tuple) -> str:
    """' (did you mean 'x'?)' for an unknown field at `loc` whose name is close to one the model takes there."""
    names = field_names_at(model, tuple(loc[:-1])) if loc else None
    close = difflib.get_close_matches(str(loc[-1]), names or [], n=1) if loc else []
    return f" (did you mean '{close[0]}'?)" if close else ""
