"""OpenAI's own OpenAPI schemas (a subset, see README.md) as jsonschema validators.

    from tests.openapi import validator, properties
    validator("CreateChatCompletionResponse").validate(body)
    properties("CreateChatCompletionRequest")      # every property, allOf included

The document is OpenAPI 3.1 in name but still writes OpenAPI 3.0's `nullable: true` in many
places; `nullable` is turned into an `anyOf` with `{"type": "null"}` before validation. `$ref`s
to `#/components/schemas/...` resolve through a `referencing` registry holding the document."""

from __future__ import annotations

import copy
import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

SPEC_PATH = Path(__file__).with_name("openai-subset.json")
URI = "urn:laneway:openai-openapi"
# OpenAPI annotations a JSON Schema validator should not see.
_OPENAPI_ONLY = {"nullable", "discriminator", "deprecated", "x-oaiTypeLabel"}


def _schema(node: Any) -> Any:
    """OpenAPI 3.0 leftovers → JSON Schema 2020-12."""
    if isinstance(node, list):
        return [_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in _OPENAPI_ONLY:
            continue
        if key == "properties":
            out[key] = {name: _schema(s) for name, s in value.items()}
        else:
            out[key] = _schema(value)
    if node.get("nullable") is True:
        if "enum" in out and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        out = {"anyOf": [out, {"type": "null"}]}
    return out


@cache
def spec() -> dict[str, Any]:
    return json.loads(SPEC_PATH.read_text())


def _local() -> dict[str, Any]:
    """Schemas the document lacks, derived from its own. OpenAI documents a streamed text
    completion as a series of CreateCompletionResponse objects, but (like its API, and the
    `openai` client's reading of it) every chunk before a choice's last has `finish_reason: null`,
    which CreateCompletionResponse does not allow."""
    chunk = copy.deepcopy(spec()["components"]["schemas"]["CreateCompletionResponse"])
    chunk["properties"]["choices"]["items"]["properties"]["finish_reason"]["nullable"] = True
    return {"CreateCompletionStreamResponse": chunk}


@cache
def _registry() -> Registry:
    doc = {"components": {"schemas": _schema({**spec()["components"]["schemas"], **_local()})}}
    return Registry().with_resource(URI, Resource.from_contents(doc, default_specification=DRAFT202012))


@cache
def validator(name: str) -> jsonschema.Draft202012Validator:
    if name not in spec()["components"]["schemas"] and name not in _local():
        raise KeyError(f"{name} is not in the extract; add it to ROOTS in extract.py")
    return jsonschema.Draft202012Validator({"$ref": f"{URI}#/components/schemas/{name}"}, registry=_registry())


def validate(name: str, instance: Any) -> None:
    """Raise the most relevant `ValidationError` when `instance` is not a valid `name`."""
    error = jsonschema.exceptions.best_match(validator(name).iter_errors(instance))
    if error is not None:
        raise AssertionError(
            f"not a valid {name} at {error.json_path}: {error.message}\n{json.dumps(instance)[:2000]}"
        ) from error


def properties(name: str) -> dict[str, Any]:
    """A schema's properties, with those of every `allOf` part and every `$ref` it extends."""
    schemas = spec()["components"]["schemas"]

    def collect(node: dict[str, Any]) -> dict[str, Any]:
        if "$ref" in node:
            node = schemas[node["$ref"].rsplit("/", 1)[-1]]
        found: dict[str, Any] = {}
        for part in node.get("allOf", ()):
            found.update(collect(part))
        found.update(node.get("properties", {}))
        return found

    return collect(schemas[name])


def deprecated(schema: dict[str, Any]) -> bool:
    return bool(schema.get("deprecated"))
