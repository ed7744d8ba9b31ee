"""What each engine forwards of the fields Laneway does not type: an allow-list per engine, and
the operator's account fields only where the operator allows them. Pure: no upstream, no vLLM."""

from __future__ import annotations

import argparse
import json

import pytest

from schemas.openai import ChatBody, EmbeddingBody, Message
from schemas.openai_extra import ACCOUNT_FIELDS, OPENAI_TENANT, VLLM_SAMPLING
from workers.engine import EngineRequest, UnsupportedRequest
from workers.engines import openai_wire as wire
from workers.engines.openai.config import OpenAIUpstreamConfig
from workers.engines.vllm.wire import _CHAT, refused_extra

CHAT = ChatBody(model="m", messages=[Message("user", "hi")])


def request(extra: dict, body=CHAT) -> EngineRequest:
    return EngineRequest("r1", body, json.dumps(extra).encode())


@pytest.mark.parametrize(
    "extra",
    [
        {"top_k": 5, "prediction": {"type": "content", "content": "x"}},
        {"metadata": {"a": "b"}, "documents": [{"text": "d"}], "guided_choice": ["a"]},
    ],
)
def test_the_hosted_engine_forwards_what_shapes_the_answer(extra: dict) -> None:
    assert json.loads(wire.forwarded_extra(request(extra))) == extra


@pytest.mark.parametrize("name", ["frobnicate", "chat_template", "kv_transfer_params", "vllm_xargs"])
def test_the_hosted_engine_refuses_any_other_field_by_name(name: str) -> None:
    with pytest.raises(UnsupportedRequest) as err:
        wire.forwarded_extra(request({"top_k": 1, name: "x"}))
    assert err.value.param == name


@pytest.mark.parametrize(
    "name, value",
    [
        ("store", True),
        ("service_tier", "priority"),
        ("web_search_options", {}),
        ("prompt_cache_retention", "24h"),
        ("store", 0),
        ("moderation", {"model": "omni-moderation-latest"}),
    ],
)
def test_account_fields_are_the_operators(name: str, value: object) -> None:
    with pytest.raises(UnsupportedRequest) as err:
        wire.forwarded_extra(request({name: value}))
    assert err.value.param == name and "operator" in err.value.message
    assert json.loads(wire.forwarded_extra(request({name: value}), frozenset({name}))) == {name: value}


def test_an_account_field_saying_what_the_upstream_does_anyway_is_left_out() -> None:
    sent = wire.forwarded_extra(request({"store": False, "service_tier": "auto", "top_k": 2}))
    assert json.loads(sent) == {"top_k": 2}


def test_laneways_own_fields_are_dropped_later_not_refused() -> None:
    extra = b'{"cache_salt":"mine","priority":-9}'
    assert wire.forwarded_extra(EngineRequest("r", CHAT, extra)) == extra
    assert json.loads(wire.encode_body(CHAT, "up", extra)) == json.loads(wire.encode_body(CHAT, "up"))


def test_untouched_extra_keeps_its_bytes() -> None:
    extra = b'{"repetition_penalty":1.10}'
    assert wire.forwarded_extra(EngineRequest("r", CHAT, extra)) is extra


def test_embeddings_take_their_own_list() -> None:
    body = EmbeddingBody(model="m", input="x")
    assert json.loads(wire.forwarded_extra(request({"input_type": "query"}, body))) == {"input_type": "query"}
    with pytest.raises(UnsupportedRequest):
        wire.forwarded_extra(request({"prediction": {}}, body))


def test_the_operator_allows_fields_by_flag_but_never_laneways_own() -> None:
    parser = argparse.ArgumentParser()
    OpenAIUpstreamConfig.configure(parser)
    args = parser.parse_args(
        [
            "--upstream-url",
            "http://u/v1",
            "--upstream-model",
            "m",
            "--upstream-allow-field",
            "store",
            "--upstream-allow-field",
            "service_tier",
        ]
    )
    assert OpenAIUpstreamConfig.from_args(args).allow_fields == {"store", "service_tier"}
    with pytest.raises(ValueError, match="cache_salt"):
        OpenAIUpstreamConfig(base_url="http://u/v1", model="m", allow_fields=frozenset({"cache_salt"}))


def test_vllm_takes_its_sampling_and_template_fields_only() -> None:
    known = _CHAT | {"chat_template", "mm_processor_kwargs", "session_id", "cache_salt"}
    assert refused_extra({"top_k": 1, "documents": [], "chat_template_kwargs": {}}, _CHAT, known) is None
    assert refused_extra({"top_k": 1, "chat_template": "{{ x }}"}, _CHAT, known) == "chat_template"
    assert refused_extra({"mm_processor_kwargs": {}}, _CHAT, known) == "mm_processor_kwargs"
    assert refused_extra({"cache_salt": "x"}, _CHAT, known) is None  # Laneway's: dropped
    assert refused_extra({"top_k": 1}, _CHAT, known - {"top_k"}) == "top_k"  # this vLLM lacks it


def test_no_account_field_is_in_any_engines_default_list() -> None:
    assert not ACCOUNT_FIELDS & (wire.FORWARDED | wire.FORWARDED_EMBEDDING | _CHAT)
    assert OPENAI_TENANT <= wire.FORWARDED and VLLM_SAMPLING <= wire.FORWARDED
