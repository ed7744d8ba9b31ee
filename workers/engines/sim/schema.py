"""SIMULATED structured output: a small deterministic generator of JSON instances that validate
against a JSON schema (tool `parameters`, `response_format.json_schema.schema`).

It stands in for a real engine's guided decoding, so clients exercising tools and structured
outputs against the sim get arguments their validators accept. It covers the schema subset
function-calling schemas use in practice: object (properties / required / additionalProperties /
min/maxProperties), array (items / prefixItems / min/maxItems / uniqueItems), string (enum, const,
format, min/maxLength, pattern), integer / number (bounds, multipleOf), boolean, null, type
lists, anyOf / oneOf (first branch), allOf (merged) and $ref into $defs / definitions. What it
cannot satisfy raises `SchemaUnsupported`, never an invalid instance.
"""

from __future__ import annotations

import math
import random
import re

# The regex parser, where 3.11 (our floor) moved it; typeshed has no stubs for these private modules.
import re._constants as _src  # type: ignore[import-not-found]
import re._parser as _sre  # type: ignore[import-not-found]
import uuid
from typing import Any

MAX_DEPTH = 16  # recursive $refs stop adding optional parts well before this
# A client's schema is expanded on the event loop: bound the work one request can ask for.
MAX_SIZE = 4096  # minLength, minItems, minProperties, a pattern's repeat
MAX_NODES = 20_000  # values generated for one instance

_WORDS = ("simulated", "value", "laneway", "sample", "alpha", "beta", "order", "ticket", "item", "note")
_FORMATS = {
    "date-time": "2024-05-17T09:30:00Z",
    "date": "2024-05-17",
    "time": "09:30:00Z",
    "email": "sim@example.com",
    "idn-email": "sim@example.com",
    "hostname": "sim.example.com",
    "idn-hostname": "sim.example.com",
    "ipv4": "192.0.2.7",
    "ipv6": "2001:db8::7",
    "uri": "https://example.com/sim",
    "iri": "https://example.com/sim",
    "url": "https://example.com/sim",
    "uri-reference": "/sim",
    "iri-reference": "/sim",
    "duration": "PT15M",
    "json-pointer": "/sim",
    "relative-json-pointer": "0",
    "regex": "^sim$",
    "uri-template": "https://example.com/{id}",
}


class SchemaUnsupported(Exception):
    """The generator cannot produce an instance of this schema."""


def instance(schema: Any, rng: random.Random) -> Any:
    """A JSON value that validates against `schema` (a JSON schema document)."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaUnsupported("a JSON schema must be an object or a boolean")
    try:
        return _Gen(schema, rng).value(schema, 0)
    except SchemaUnsupported:
        raise
    except (
        ArithmeticError,
        AttributeError,
        KeyError,
        TypeError,
        ValueError,
        IndexError,
        StopIteration,
        RecursionError,
        re.error,
    ) as exc:
        # A malformed schema (a number where an object belongs, an unparsable pattern...).
        raise SchemaUnsupported(f"the schema is malformed ({type(exc).__name__})") from None


class _Gen:
    def __init__(self, root: dict[str, Any] | bool, rng: random.Random) -> None:
        self.root, self.rng = root, rng
        self.nodes = 0

    def resolve(self, ref: str) -> Any:
        if not ref.startswith("#"):
            raise SchemaUnsupported(f"only local $refs are supported, not {ref!r}")
        node: Any = self.root
        for part in filter(None, ref[1:].split("/")):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise SchemaUnsupported(f"$ref {ref!r} does not resolve")
            node = node[part]
        return node

    def flatten(self, schema: Any, depth: int) -> dict[str, Any]:
        """Inline $ref, merge allOf, and pick the first anyOf/oneOf branch: one plain schema."""
        if schema is True:
            return {}
        if schema is False:
            raise SchemaUnsupported("the schema `false` has no instances")
        if depth > MAX_DEPTH:
            raise SchemaUnsupported("schema nesting too deep")
        out = {k: v for k, v in schema.items() if k not in ("$ref", "allOf", "anyOf", "oneOf")}
        parts = [self.resolve(schema["$ref"])] if "$ref" in schema else []
        parts += schema.get("allOf", [])
        for key in ("anyOf", "oneOf"):
            if schema.get(key):
                parts.append(self.branch(schema[key], depth))
        for part in parts:
            out = _merge(out, self.flatten(part, depth + 1))
        return out

    def branch(self, branches: list[Any], depth: int) -> Any:
        # The first branch; below the top levels a terminating one (null), so recursion ends.
        if depth > 3:
            for b in branches:
                if isinstance(b, dict) and b.get("type") == "null":
                    return b
        return branches[0]

    def value(self, schema: Any, depth: int) -> Any:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise SchemaUnsupported(f"the instance would need over {MAX_NODES} values")
        s = self.flatten(schema, depth)
        if "const" in s:
            return s["const"]
        if "enum" in s:
            if not s["enum"]:
                raise SchemaUnsupported("an empty enum has no instances")
            return self.rng.choice(s["enum"])
        kind = _kind(s)
        if kind == "object":
            return self.obj(s, depth)
        if kind == "array":
            return self.array(s, depth)
        if kind in ("integer", "number"):
            return self.number(s, kind == "integer")
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "null":
            return None
        return self.string(s)

    def obj(self, s: dict[str, Any], depth: int) -> dict[str, Any]:
        props: dict[str, Any] = s.get("properties", {})
        required: list[str] = list(dict.fromkeys(s.get("required", [])))
        extra = s.get("additionalProperties", True)
        # Optional properties too while shallow (realistic arguments), only required ones deeper.
        optional = [k for k in props if k not in required] if depth < 4 else []
        room = s.get("maxProperties", len(required) + len(optional)) - len(required)
        keys = required + optional[: max(0, room)]
        out: dict[str, Any] = {}
        for key in keys:
            sub = props.get(key, extra if isinstance(extra, dict) else True)
            if key not in props and extra is False:
                raise SchemaUnsupported(f"required property {key!r} is not allowed by additionalProperties")
            out[key] = self.value(sub, depth + 1)
        while len(out) < _bounded(s.get("minProperties", 0)):
            if extra is False:
                raise SchemaUnsupported("minProperties needs properties the schema does not allow")
            out[f"extra_{len(out)}"] = self.value(extra if isinstance(extra, dict) else {"type": "string"}, depth + 1)
        return out

    def array(self, s: dict[str, Any], depth: int) -> list[Any]:
        prefix = s.get("prefixItems") or (s["items"] if isinstance(s.get("items"), list) else [])
        items = s.get("items") if isinstance(s.get("items"), (dict, bool)) else s.get("additionalItems", True)
        low, high = _bounded(s.get("minItems", 0)), s.get("maxItems", math.inf)
        # Deep in a recursive schema, as few items as allowed, so the recursion ends.
        count = max(low, min(high, len(prefix) or (0 if depth > 4 else self.rng.randint(1, 2))))
        if items is False and count > len(prefix):
            raise SchemaUnsupported("minItems needs items the schema does not allow")
        out: list[Any] = []
        seen: set[str] = set()
        for i in range(count):
            sub = prefix[i] if i < len(prefix) else (s["contains"] if i == 0 and "contains" in s else items)
            for _ in range(32):  # uniqueItems: draw again on a duplicate
                v = self.value(sub, depth + 1)
                if not s.get("uniqueItems") or repr(v) not in seen:
                    break
            else:
                raise SchemaUnsupported("uniqueItems: not enough distinct values")
            seen.add(repr(v))
            out.append(v)
        return out

    def number(self, s: dict[str, Any], integer: bool) -> int | float:
        low, high = s.get("minimum", -math.inf), s.get("maximum", math.inf)
        xlow, xhigh = s.get("exclusiveMinimum"), s.get("exclusiveMaximum")
        xlow = low if xlow is True else xlow  # draft 4: a boolean modifier of minimum/maximum
        xhigh = high if xhigh is True else xhigh
        step = s.get("multipleOf") or (1 if integer else 0)
        eps = step or 0.01
        if isinstance(xlow, (int, float)) and not isinstance(xlow, bool):
            low = max(low, xlow + eps)
        if isinstance(xhigh, (int, float)) and not isinstance(xhigh, bool):
            high = min(high, xhigh - eps)
        if low == -math.inf:
            low = min(high - 100, 1)
        if high == math.inf:
            high = low + 100
        if not step:  # a number off any grid: two decimals
            v = round(self.rng.uniform(low, high), 2)
            return v if low <= v <= high else low
        first, last = math.ceil(low / step), math.floor(high / step)
        for _ in range(8):  # a multiple whose float division stays exact
            if first > last:
                break
            v = self.rng.randint(first, min(last, first + 100)) * step
            if float(v).is_integer() or (v / step).is_integer():
                return int(v) if float(v).is_integer() and (integer or isinstance(step, int)) else v
        raise SchemaUnsupported("no number satisfies the schema's bounds and multipleOf")

    def string(self, s: dict[str, Any]) -> str:
        low, high = _bounded(s.get("minLength", 0)), s.get("maxLength", 10**9)
        if "pattern" in s:
            text = _matching(s["pattern"], self.rng, low, high)
        elif s.get("format") == "uuid":
            text = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        elif s.get("format") in _FORMATS:
            text = _FORMATS[s["format"]]
        else:
            text = "sim " + " ".join(self.rng.choice(_WORDS) for _ in range(self.rng.randint(1, 3)))
            text = (text + " sim" * low)[: max(low, min(high, len(text)))]
        if not low <= len(text) <= high:
            raise SchemaUnsupported("no string satisfies the schema's format and length")
        return text


def _bounded(size: Any) -> int:
    if not isinstance(size, int) or size > MAX_SIZE:
        raise SchemaUnsupported(
            f"sizes over {MAX_SIZE} (minLength, minItems, minProperties, pattern repeats) are not simulated"
        )
    return size


def _kind(s: dict[str, Any]) -> str:
    t = s.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), t[0] if t else None)
    if t:
        return t
    if {"properties", "required", "additionalProperties", "minProperties"} & s.keys():
        return "object"
    if {"items", "prefixItems", "minItems", "maxItems"} & s.keys():
        return "array"
    if {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"} & s.keys():
        return "number"
    return "string"


def _merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """allOf, shallowly: properties joined, required united, type lists intersected, bounds tightened."""
    out = dict(a)
    for key, value in b.items():
        if key not in out:
            out[key] = value
        elif key == "properties":
            out[key] = {
                **out[key],
                **{k: v if k not in out[key] else {"allOf": [out[key][k], v]} for k, v in value.items()},
            }
        elif key == "required":
            out[key] = list(dict.fromkeys([*out[key], *value]))
        elif key == "type":
            left = out[key] if isinstance(out[key], list) else [out[key]]
            right = value if isinstance(value, list) else [value]
            both = [t for t in left if t in right or (t == "integer" and "number" in right)]
            both += [t for t in right if t == "integer" and "number" in left and t not in both]
            if not both:
                raise SchemaUnsupported("allOf branches require different types")
            out[key] = both
        elif key in ("minimum", "minLength", "minItems", "minProperties", "exclusiveMinimum"):
            out[key] = max(out[key], value)
        elif key in ("maximum", "maxLength", "maxItems", "maxProperties", "exclusiveMaximum"):
            out[key] = min(out[key], value)
    return out


# -- strings for a `pattern`: walk the regex's parse tree ----------------------------------------
_CATEGORY = {
    "CATEGORY_DIGIT": "7",
    "CATEGORY_WORD": "s",
    "CATEGORY_SPACE": " ",
    "CATEGORY_NOT_DIGIT": "s",
    "CATEGORY_NOT_WORD": "-",
    "CATEGORY_NOT_SPACE": "s",
}


def _matching(pattern: str, rng: random.Random, low: int, high: int) -> str:
    try:
        regex, tree = re.compile(pattern), _sre.parse(pattern)
    except re.error as e:
        raise SchemaUnsupported(f"pattern {pattern!r}: {e}") from None
    for _ in range(8):
        text = _emit(tree, rng)
        if regex.search(text) and low <= len(text) <= high:
            return text
    raise SchemaUnsupported(f"no string found for pattern {pattern!r}")


def _emit(tree: Any, rng: random.Random) -> str:
    out = []
    for op, arg in tree:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(arg))
        elif name == "ANY":
            out.append("s")
        elif name == "IN":
            out.append(_in(arg, rng))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            low, high, sub = arg
            low = _bounded(low)
            high = low + 3 if high == _src.MAXREPEAT else high
            count = min(high, low + rng.randint(0, 2))
            out.extend(_emit(sub, rng) for _ in range(count))
        elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
            out.append(_emit(arg[-1] if name == "SUBPATTERN" else arg, rng))
        elif name == "BRANCH":
            out.append(_emit(rng.choice(arg[1]), rng))
        elif name in ("AT", "ASSERT", "ASSERT_NOT"):
            continue
        elif name == "NOT_LITERAL":
            out.append("s" if chr(arg) != "s" else "t")
        else:
            raise SchemaUnsupported(f"pattern feature {name} is not supported")
    return "".join(out)


def _in(items: list[Any], rng: random.Random) -> str:
    if items and str(items[0][0]) == "NEGATE":
        banned = {chr(a) for op, a in items[1:] if str(op) == "LITERAL"}
        allowed = next((c for c in "sx7-_qZ" if c not in banned), None)
        if allowed is None:
            raise SchemaUnsupported("pattern: a negated class the generator cannot satisfy")
        return allowed
    op, arg = items[0]
    name = str(op)
    if name == "LITERAL":
        return chr(arg)
    if name == "RANGE":
        return chr(rng.randint(arg[0], arg[1]))
    if name == "CATEGORY":
        return _CATEGORY.get(str(arg), "s")
    raise SchemaUnsupported(f"pattern class {name} is not supported")
