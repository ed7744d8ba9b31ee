"""The bridge's OpenAPI document, generated from the same msgspec types that parse requests."""

from __future__ import annotations

from functools import lru_cache

import msgspec

from schemas.openai import ChatCompletion, ChatCompletionRequest, ErrorResponse, ModelList


def _spec(model_names: tuple[str, ...]) -> dict:
    (request, completion, models, error), components = msgspec.json.schema_components(
        [ChatCompletionRequest, ChatCompletion, ModelList, ErrorResponse],
        ref_template="#/components/schemas/{name}",
    )
    if model_names:  # the live logical models, so generated requests can name a real one
        components["ChatCompletionRequest"]["properties"]["model"]["enum"] = list(model_names)
    errors = {str(status): {"description": text, "content": {"application/json": {"schema": error}}}
              for status, text in [(400, "invalid request"), (401, "missing or wrong API key"),
                                   (403, "class not allowed"), (404, "unknown model"),
                                   (413, "request too large"), (429, "backlog full"),
                                   (503, "no worker or overloaded"), (504, "deadline exceeded")]}
    security = [{"bearer": []}]
    return {
        "openapi": "3.1.0",
        "info": {"title": "Laneway", "version": "0.1.0",
                 "description": "OpenAI-compatible chat completions served through Laneway."},
        "paths": {
            "/v1/chat/completions": {"post": {
                "operationId": "createChatCompletion", "security": security,
                "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
                "responses": {"200": {"description": "a completion, or an SSE stream when stream=true",
                                      "content": {"application/json": {"schema": completion},
                                                  "text/event-stream": {"schema": {"type": "string"}}}},
                              **errors},
            }},
            "/v1/models": {"get": {
                "operationId": "listModels", "security": security,
                "responses": {"200": {"description": "logical models",
                                      "content": {"application/json": {"schema": models}}},
                              "401": errors["401"]},
            }},
            "/healthz": {"get": {"operationId": "health", "responses": {"200": {"description": "alive"}}}},
        },
        "components": {"schemas": components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


@lru_cache(maxsize=8)
def spec(models: tuple[str, ...]) -> bytes:
    return msgspec.json.encode(_spec(models))
