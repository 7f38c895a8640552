"""When a changed event needs a new `schema_version`: one rule over two JSON Schemas.

An event keeps its version while every consumer of that version still reads it:
a consumer built for the old schema finds every field it knew, of the same type, and
one built for the new schema reads every event written under the old one (a replay).
So, between the published schema of a version and the current one:

- removing or renaming a field, changing its type, making an optional field
  required, adding a required field, narrowing an enum or a constraint: incompatible;
- adding an optional field, widening an enum, loosening a constraint, making a required
  field optional (producers still write every field), changing a description:
  compatible.

Nested models follow the same rule as events. Pure: no files, no pydantic.
"""

from __future__ import annotations

from typing import Any

Schema = dict[str, Any]

_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_SHAPE = ("type", "const", "format", "pattern")
_IGNORED = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "$defs",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
    }
)


def incompatibilities(old: Schema, new: Schema) -> list[str]:
    """Why an event valid under `old` (a published version) cannot keep that version
    as `new`; empty when the change is compatible."""
    return _compare("", old, new, old, new)


def _compare(
    path: str,
    old: Schema,
    new: Schema,
    old_root: Schema,
    new_root: Schema,
) -> list[str]:
    old, new = _resolved(old, old_root), _resolved(new, new_root)
    where = path or "the event"
    problems: list[str] = []
    for keyword in _SHAPE:
        if old.get(keyword) != new.get(keyword):
            problems.append(
                f"{where}: {keyword} changed from {old.get(keyword)!r} to {new.get(keyword)!r}"
            )
    problems += _enum(where, old, new)
    problems += _bounds(where, old, new)
    problems += _alternatives(path, old, new, old_root, new_root)
    if "properties" in old or "properties" in new:
        problems += _fields(path, old, new, old_root, new_root)
    for keyword in ("items", "additionalProperties", "propertyNames"):
        problems += _nested(
            f"{path}[{keyword}]", old.get(keyword), new.get(keyword), old_root, new_root
        )
    old_items, new_items = old.get("prefixItems", []), new.get("prefixItems", [])
    if len(old_items) != len(new_items):
        problems.append(f"{where}: tuple length changed from {len(old_items)} to {len(new_items)}")
    for index, (before, after) in enumerate(zip(old_items, new_items, strict=False)):
        problems += _compare(f"{path}[{index}]", before, after, old_root, new_root)
    unknown = (set(old) | set(new)) - _IGNORED - _KNOWN
    problems += [
        f"{where}: {keyword} changed"
        for keyword in sorted(unknown)
        if old.get(keyword) != new.get(keyword)
    ]
    return problems


_KNOWN = frozenset(
    {
        *_SHAPE,
        *_LOWER_BOUNDS,
        *_UPPER_BOUNDS,
        "enum",
        "anyOf",
        "oneOf",
        "allOf",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "propertyNames",
        "prefixItems",
        "$ref",
        "discriminator",
    }
)


def _fields(
    path: str,
    old: Schema,
    new: Schema,
    old_root: Schema,
    new_root: Schema,
) -> list[str]:
    old_fields, new_fields = old.get("properties", {}), new.get("properties", {})
    old_required, new_required = set(old.get("required", ())), set(new.get("required", ()))
    problems: list[str] = []
    for name, schema in old_fields.items():
        field = f"{path}.{name}" if path else name
        if name not in new_fields:
            problems.append(f"{field}: removed (or renamed)")
            continue
        if name in new_required and name not in old_required:
            problems.append(f"{field}: optional field made required")
        problems += _compare(field, schema, new_fields[name], old_root, new_root)
    for name in new_fields.keys() - old_fields.keys():
        if name in new_required:
            problems.append(f"{path + '.' if path else ''}{name}: new field is required")
    return problems


def _alternatives(
    path: str,
    old: Schema,
    new: Schema,
    old_root: Schema,
    new_root: Schema,
) -> list[str]:
    """`anyOf`/`oneOf` (unions, optional fields): the same alternatives, in order."""
    problems: list[str] = []
    for keyword in ("anyOf", "oneOf", "allOf"):
        before, after = old.get(keyword, []), new.get(keyword, [])
        if len(before) != len(after):
            problems.append(
                f"{path or 'the event'}: type changed ({keyword} of {len(before)} "
                f"became {len(after)})"
            )
            continue
        for index, (a, b) in enumerate(zip(before, after, strict=True)):
            problems += _compare(f"{path}<{index}>", a, b, old_root, new_root)
    return problems


def _enum(where: str, old: Schema, new: Schema) -> list[str]:
    if "enum" not in old and "enum" not in new:
        return []
    if "enum" not in new:
        return []  # any value now: widened
    if "enum" not in old:
        return [f"{where}: restricted to {new['enum']!r}"]
    dropped = [value for value in old["enum"] if value not in new["enum"]]
    return [f"{where}: enum narrowed, {dropped!r} no longer allowed"] if dropped else []


def _bounds(where: str, old: Schema, new: Schema) -> list[str]:
    problems = []
    for keyword in (*_LOWER_BOUNDS, *_UPPER_BOUNDS):
        before, after = old.get(keyword), new.get(keyword)
        if after is None or before == after:
            continue
        tighter = before is None or (after > before if keyword in _LOWER_BOUNDS else after < before)
        if tighter:
            problems.append(f"{where}: {keyword} narrowed from {before!r} to {after!r}")
    return problems


def _nested(path: str, old: Any, new: Any, old_root: Schema, new_root: Schema) -> list[str]:
    if old == new or (old is None and new is None):
        return []
    if isinstance(old, dict) and isinstance(new, dict):
        return _compare(path, old, new, old_root, new_root)
    if old is None:
        return [f"{path}: now restricted"] if new is not True else []
    return [f"{path}: changed from {old!r} to {new!r}"] if new is not True else []


def _resolved(schema: Schema, root: Schema) -> Schema:
    """`schema` with a local `$ref` (`#/$defs/Name`) replaced by what it names."""
    seen = 0
    while "$ref" in schema and seen < 32:
        ref = schema["$ref"]
        if not ref.startswith("#/"):
            raise ValueError(f"only local references are compared, not {ref!r}")
        node: Any = root
        for part in ref[2:].split("/"):
            node = node[part]
        schema = {**node, **{k: v for k, v in schema.items() if k != "$ref"}}
        seen += 1
    return schema
