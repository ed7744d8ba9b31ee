"""vLLM's own OpenAI serving objects on our engine client, built as `vllm serve` builds them
(`init_app_state`, `init_generate_state`, `init_pooling_state`), with its defaults for what we
do not set. vllm is imported lazily: importing this module needs no vllm.

`request_logger=None` everywhere: prompts and inputs may hold PII, never log them.
"""

from __future__ import annotations

from typing import Any

from workers.engines.vllm.config import VllmConfig


def _models(config: VllmConfig, llm: Any) -> Any:
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels

    return OpenAIServingModels(
        engine_client=llm, base_model_paths=[BaseModelPath(name=config.name, model_path=config.model)]
    )


def embedding_serving(config: VllmConfig, llm: Any) -> Any:
    """vLLM's `ServingEmbedding` (an embedding worker)."""
    from vllm.entrypoints.pooling.embed.serving import ServingEmbedding
    from vllm.renderers.chat_utils import ChatTemplateConfig, load_chat_template

    template = ChatTemplateConfig(chat_template=load_chat_template(config.chat_template))
    return ServingEmbedding(llm, _models(config, llm), request_logger=None, chat_template_config=template)


def generation_serving(config: VllmConfig, llm: Any) -> tuple[Any, Any, Any]:
    """vLLM's `OpenAIServingChat` and `OpenAIServingCompletion`, sharing one renderer (chat
    template, tool and reasoning parsers; it prefills continuations: `workers.engines.vllm.continuing`),
    and their `OpenAIServingModels` (the served names, LoRA adapters among them:
    `workers.engines.vllm.lora`)."""
    from vllm.entrypoints.openai.chat_completion.serving import OpenAIServingChat
    from vllm.entrypoints.openai.completion.serving import OpenAIServingCompletion
    from vllm.renderers.chat_utils import load_chat_template

    from workers.engines.vllm.continuing import ContinuingRenderer

    template = load_chat_template(config.chat_template)
    parsers = dict(
        enable_auto_tools=config.enable_auto_tool_choice,
        tool_parser=config.tool_call_parser,
        tool_strict_level=config.tool_strict_level,
        reasoning_parser=config.reasoning_parser or "",
    )
    models = _models(config, llm)
    renderer = ContinuingRenderer(
        model_config=llm.model_config,
        renderer=llm.renderer,
        request_logger=None,
        chat_template=template,
        chat_template_content_format="auto",
        **parsers,
    )
    renderer.warmup()
    # Prompt-token details on: usage then carries `cached_tokens`, the request's prefix-cache hits
    # (metered and priced apart). vLLM leaves them off by default (--enable-prompt-tokens-details).
    chat = OpenAIServingChat(
        llm,
        models,
        "assistant",
        online_renderer=renderer,
        request_logger=None,
        chat_template=template,
        chat_template_content_format="auto",
        enable_prompt_tokens_details=True,
        **parsers,
    )
    completion = OpenAIServingCompletion(
        llm, models, online_renderer=renderer, request_logger=None, enable_prompt_tokens_details=True
    )
    return chat, completion, models
