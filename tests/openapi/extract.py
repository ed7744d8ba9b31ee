"""Regenerate `openai-subset.json` from a checkout of github.com/openai/openai-openapi:

    python tests/openapi/extract.py <path/to/openapi.json> <commit>

Keeps the ROOTS and every schema they reach through `$ref`, minus prose (descriptions,
examples, OpenAI's doc annotations), so a diff of the file shows only contract changes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOTS = [
    "CreateChatCompletionRequest",
    "CreateChatCompletionResponse",
    "CreateChatCompletionStreamResponse",
    "CreateCompletionRequest",
    "CreateCompletionResponse",
    "Model",
    "ListModelsResponse",
    "Error",
    "ErrorResponse",
    # work that outlives a connection: files, batches, stored responses, conversations
    "OpenAIFile",
    "ListFilesResponse",
    "DeleteFileResponse",
    "CreateBatchRequest",
    "Batch",
    "ListBatchesResponse",
    "CreateResponse",
    "Response",
    "ResponseItemList",
    "ResponseStreamEvent",
    "ConversationResource",
    "ConversationItemList",
    "DeletedConversationResource",
]
PROSE = {
    "description",
    "example",
    "examples",
    "title",
    "x-oaiMeta",
    "x-oaiExpandable",
    "x-oaiTypeLabel",
    "x-stainless-const",
    "group",
    "beta",
    "legacy",
}
PREFIX = "#/components/schemas/"
OUT = Path(__file__).with_name("openai-subset.json")


def strip(node: Any) -> Any:
    if isinstance(node, list):
        return [strip(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for key, value in node.items():
        if key in PROSE:
            continue
        if key == "properties":  # its keys are property names, not keywords
            out[key] = {name: strip(schema) for name, schema in value.items()}
        else:
            out[key] = strip(value)
    return out


def refs(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*map(refs, node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = set().union(*map(refs, node.values())) if node else set()
    ref = node.get("$ref")
    if isinstance(ref, str):
        if not ref.startswith(PREFIX):
            raise ValueError(f"unexpected $ref {ref}")
        found.add(ref[len(PREFIX) :])
    return found


def main(source: str, commit: str) -> None:
    doc = json.loads(Path(source).read_text())
    schemas = doc["components"]["schemas"]
    keep, todo = {}, list(ROOTS)
    while todo:
        name = todo.pop()
        if name not in keep:
            keep[name] = strip(schemas[name])
            todo.extend(refs(keep[name]))
    OUT.write_text(
        json.dumps(
            {
                "source": "https://github.com/openai/openai-openapi (openapi.json), MIT licence: see LICENSE",
                "commit": commit,
                "openapi": doc["openapi"],
                "roots": ROOTS,
                "components": {"schemas": dict(sorted(keep.items()))},
            },
            indent=1,
            sort_keys=False,
        )
        + "\n"
    )
    print(f"{len(keep)} schemas → {OUT}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
