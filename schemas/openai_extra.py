"""The top-level request fields Laneway does not type (`GenerateRequest.extra`), grouped by who
may set them and what they do. Each engine builds its allow-list from these groups (`workers/`):
what is in no group an engine takes is refused by name, as OpenAI refuses an argument it does
not recognise. The PII stage analyses every string in `extra` whatever its name; these names are
the only ones it writes into an audit record or an error's `param` (any other name is the
client's text, not ours).
"""

from __future__ import annotations

# OpenAI's chat fields that describe or shape the answer: the tenant's to set.
OPENAI_TENANT = frozenset(
    {
        "audio",
        "modalities",
        "prediction",
        "reasoning_effort",
        "verbosity",
        "metadata",
        "safety_identifier",
        "prompt_cache_key",
        "functions",
        "function_call",
    }
)

# OpenAI's fields that act on the account the hosted upstream bills, stores and searches under:
# the operator's to allow per engine (`--upstream-allow-field`), never the tenant's.
ACCOUNT_FIELDS = frozenset(
    {
        "store",  # keeps the completion (and its prompt) on the operator's account
        "service_tier",  # priority/flex/scale: a different price on the operator's bill
        "web_search_options",  # a paid tool that sends the conversation's queries to the web
        "prompt_cache_retention",  # 24 h retention of the prompt's cache on the operator's account
        "prompt_cache_options",
        "moderation",  # runs the operator's moderation model
    }
)
# The value an account field takes when it is left out: sent with it, the request is the same.
ACCOUNT_DEFAULTS: dict[str, object] = {"store": False, "service_tier": "auto"}

# vLLM's sampling fields (its SamplingParams): they shape tokens and add no prompt text of their
# own (`bad_words` and `structured_outputs` hold strings: the PII stage analyses them).
VLLM_SAMPLING = frozenset(
    {
        "top_k",
        "min_p",
        "repetition_penalty",
        "repetition_detection",
        "min_tokens",
        "ignore_eos",
        "include_stop_str_in_output",
        "stop_token_ids",
        "bad_words",
        "allowed_token_ids",
        "skip_special_tokens",
        "spaces_between_special_tokens",
        "truncate_prompt_tokens",
        "truncation_side",
        "add_special_tokens",
        "structured_outputs",
        "thinking_token_budget",
        "include_reasoning",
        "reasoning_effort",
    }
)
# vLLM's chat-template inputs: rendered into the prompt, so text the model reads (analysed).
# A client's own `chat_template` (Jinja run by the engine) is not among them.
VLLM_TEMPLATE = frozenset({"add_generation_prompt", "continue_final_message", "documents", "chat_template_kwargs"})
# Older vLLM's structured-output fields, still taken by OpenAI-compatible servers built on it.
VLLM_GUIDED = frozenset(
    {
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "guided_decoding_backend",
        "guided_whitespace_pattern",
    }
)
# vLLM's completions take a response_format, which OpenAI's legacy endpoint has not.
VLLM_COMPLETION = VLLM_SAMPLING | {"response_format"}
VLLM_EMBEDDING = frozenset({"add_special_tokens", "truncate_prompt_tokens", "truncation_side", "use_activation"})
# Embedding servers other than OpenAI's (NVIDIA NIM, and those following it) ask query or passage.
EMBEDDING_INPUT_TYPE = frozenset({"input_type"})

# Every name above: what the PII stage may name.
NAMED = (
    OPENAI_TENANT
    | ACCOUNT_FIELDS
    | VLLM_SAMPLING
    | VLLM_TEMPLATE
    | VLLM_GUIDED
    | VLLM_COMPLETION
    | VLLM_EMBEDDING
    | EMBEDDING_INPUT_TYPE
)
