"""The bridge's OpenAPI document, generated from the same msgspec types that parse requests."""

from __future__ import annotations

from functools import lru_cache

import msgspec

from schemas.batches import Batch, BatchList, CreateBatch, Deleted, FileList, FileObject
from schemas.openai import ChatBody, CompletionBody, EmbeddingBody
from schemas.openai_out import ChatCompletion, ErrorResponse, Model, ModelList, TextCompletion
from schemas.responses import ResponsesBody


def _post(operation: str, request: dict, answer: dict, errors: dict, security: list) -> dict:
    return {
        "post": {
            "operationId": operation,
            "security": security,
            "requestBody": {"required": True, "content": {"application/json": {"schema": request}}},
            "responses": {
                "200": {
                    "description": "an answer, or an SSE stream when stream=true",
                    "content": {
                        "application/json": {"schema": answer},
                        "text/event-stream": {"schema": {"type": "string"}},
                    },
                },
                **errors,
            },
        }
    }


def _get(operation: str, answer: dict, errors: dict, security: list, path_param: str | None = None) -> dict:
    """An operation with no body (GET, DELETE, a cancel): the answer, an id in the path if any."""
    params = [{"name": path_param, "in": "path", "required": True, "schema": {"type": "string"}}] if path_param else []
    return {
        "operationId": operation,
        "security": security,
        "parameters": params,
        "responses": {
            "200": {"description": "the object", "content": {"application/json": {"schema": answer}}},
            "401": errors["401"],
            "404": errors["404"],
        },
    }


def _stored(answer: dict, errors: dict, security: list) -> dict:
    """The stored responses' and conversations' routes (bridge/responses/stored/): the caller's own only."""

    def op(
        operation: str,
        what: str,
        *query: tuple[str, dict],
        path: tuple[str, ...] = ("response_id",),
        body: bool = False,
    ) -> dict:
        parameters = [
            *({"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in path),
            *({"name": name, "in": "query", "required": False, "schema": schema} for name, schema in query),
        ]
        out = {
            "operationId": operation,
            "security": security,
            "parameters": parameters,
            "responses": {
                "200": {"description": what, "content": {"application/json": {"schema": answer}}},
                **{k: errors[k] for k in ("400", "401", "404")},
            },
        }
        if body:
            out["requestBody"] = {"content": {"application/json": {"schema": {"type": "object"}}}}
        return out

    page = (
        ("after", {"type": "string"}),
        ("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
        ("order", {"enum": ["asc", "desc"]}),
    )
    conv, item = ("conversation_id",), ("conversation_id", "item_id")
    return {
        "/v1/conversations": {"post": op("createConversation", "a new conversation", path=(), body=True)},
        "/v1/conversations/{conversation_id}": {
            "get": op("getConversation", "the conversation", path=conv),
            "post": op("updateConversation", "its metadata, set", path=conv, body=True),
            "delete": op("deleteConversation", "deleted", path=conv),
        },
        "/v1/conversations/{conversation_id}/items": {
            "get": op("listConversationItems", "its items", *page, path=conv),
            "post": op(
                "createConversationItems",
                "items added (only where the PII policy redacts nothing)",
                path=conv,
                body=True,
            ),
        },
        "/v1/conversations/{conversation_id}/items/{item_id}": {
            "get": op("getConversationItem", "one item", path=item),
            "delete": op("deleteConversationItem", "the conversation, without the item", path=item),
        },
        "/v1/responses/{response_id}": {
            "get": op(
                "getResponse",
                "the stored response, or (stream=true) its events after starting_after",
                ("stream", {"type": "boolean"}),
                ("starting_after", {"type": "integer", "minimum": -1}),
            ),
            "delete": op("deleteResponse", "deleted: no revision of it remains"),
        },
        "/v1/responses/{response_id}/input_items": {
            "get": op("listInputItems", "its input items (redacted as the engine got them)", *page)
        },
        "/v1/responses/{response_id}/cancel": {"post": op("cancelResponse", "a background response, cancelled")},
    }


def _spec(model_names: tuple[str, ...]) -> dict:
    (
        (
            chat,
            completion,
            text,
            text_completion,
            embed,
            responses,
            models,
            model,
            error,
            create_batch,
            batch,
            batches,
            file,
            files,
            deleted,
        ),
        components,
    ) = msgspec.json.schema_components(
        [
            ChatBody,
            ChatCompletion,
            CompletionBody,
            TextCompletion,
            EmbeddingBody,
            ResponsesBody,
            ModelList,
            Model,
            ErrorResponse,
            CreateBatch,
            Batch,
            BatchList,
            FileObject,
            FileList,
            Deleted,
        ],
        ref_template="#/components/schemas/{name}",
    )
    # Answers Laneway writes from byte templates; their shape is OpenAI's (docs/openai-api.md).
    answer = {"type": "object"}
    if model_names:  # the live logical models, so generated requests can name a real one
        for body in ("ChatBody", "CompletionBody", "EmbeddingBody", "ResponsesBody"):
            components[body]["properties"]["model"]["enum"] = list(model_names)
    errors = {
        str(status): {"description": text, "content": {"application/json": {"schema": error}}}
        for status, text in [
            (400, "invalid request"),
            (401, "missing or wrong API key"),
            (403, "class not allowed"),
            (404, "unknown model"),
            (413, "request too large"),
            (429, "backlog full"),
            (503, "no worker or overloaded"),
            (504, "deadline exceeded"),
        ]
    }
    security: list[dict[str, list[str]]] = [{"bearer": []}]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Laneway",
            "version": "0.1.0",
            "description": "OpenAI-compatible chat and text completions, embeddings, responses "
            "(stored, background), conversations, files and batches served through Laneway.",
        },
        "paths": {
            "/v1/chat/completions": _post("createChatCompletion", chat, completion, errors, security),
            "/v1/completions": _post("createCompletion", text, text_completion, errors, security),
            "/v1/embeddings": _post("createEmbedding", embed, answer, errors, security),
            "/v1/responses": _post("createResponse", responses, answer, errors, security),
            "/v1/models": {
                "get": {
                    "operationId": "listModels",
                    "security": security,
                    "responses": {
                        "200": {"description": "logical models", "content": {"application/json": {"schema": models}}},
                        "401": errors["401"],
                    },
                }
            },
            "/v1/models/{model}": {
                "get": {
                    "operationId": "retrieveModel",
                    "security": security,
                    "parameters": [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}],
                    "responses": {
                        "200": {"description": "a logical model", "content": {"application/json": {"schema": model}}},
                        "401": errors["401"],
                        "404": errors["404"],
                    },
                }
            },
            "/v1/batches": {
                **_post("createBatch", create_batch, batch, errors, security),
                "get": _get("listBatches", batches, errors, security),
            },
            "/v1/batches/{batch_id}": {"get": _get("retrieveBatch", batch, errors, security, "batch_id")},
            "/v1/batches/{batch_id}/cancel": {"post": _get("cancelBatch", batch, errors, security, "batch_id")},
            "/v1/files": {
                "get": _get("listFiles", files, errors, security),
                "post": {
                    "operationId": "createFile",
                    "security": security,
                    "requestBody": {
                        "required": True,
                        "content": {
                            "multipart/form-data": {
                                "schema": {
                                    "type": "object",
                                    "required": ["file", "purpose"],
                                    "properties": {
                                        "file": {"type": "string", "format": "binary"},
                                        "purpose": {"type": "string", "enum": ["batch", "user_data"]},
                                    },
                                }
                            }
                        },
                    },
                    "responses": {
                        "200": {"description": "the file", "content": {"application/json": {"schema": file}}},
                        **errors,
                    },
                },
            },
            "/v1/files/{file_id}": {
                "get": _get("retrieveFile", file, errors, security, "file_id"),
                "delete": _get("deleteFile", deleted, errors, security, "file_id"),
            },
            "/v1/files/{file_id}/content": {
                "get": _get("downloadFile", {"type": "string"}, errors, security, "file_id")
            },
            **_stored(answer, errors, security),
            "/healthz": {"get": {"operationId": "health", "responses": {"200": {"description": "alive"}}}},
        },
        "components": {"schemas": components, "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    }


@lru_cache(maxsize=8)
def spec(models: tuple[str, ...]) -> bytes:
    return msgspec.json.encode(_spec(models))
