"""The broker makes every check the bridge makes: a direct publisher never met the bridge.

Before issue 20 the cross-field rules OpenAI's API enforces, the model's context length and the
bound on a request's deadline were checked only at the HTTP edge: a tenant publishing with its
own NATS user got past them (a year-long deadline holds its quota grant, its lane slot and its
dedup entry for a year). Each is refused now, on the publisher's own inbox, with the error the
bridge would have given and the field it names.
"""

from __future__ import annotations

import time

import msgspec
import pytest

from core.settings import DEFAULT_CONTEXT_TOKENS
from schemas.frames import Finished, StreamError
from schemas.openai import Message, NamedFunction, NamedToolChoice
from tests.requests import chat
from tests.security.publisher import Publisher

pytestmark = pytest.mark.timeout(600)


async def refused(publisher: Publisher, **fields) -> StreamError:
    request = publisher.request()
    request = msgspec.structs.replace(request, **fields)
    await publisher.publish(request)
    end = await publisher.first(request.request_id)
    assert isinstance(end, StreamError), f"served past the bridge's rule: {end}"
    return end


async def test_the_openai_cross_field_rules(acme):
    no_tools = chat("hi", max_tokens=4, tool_choice=NamedToolChoice(function=NamedFunction(name="refund")))
    end = await refused(acme, chat=no_tools)
    assert (end.code, end.param) == ("invalid_request", "tool_choice"), end
    orphan = chat(Message("tool", "42"), max_tokens=4)
    end = await refused(acme, chat=orphan)
    assert (end.code, end.param) == ("invalid_request", "messages[0].tool_call_id"), end


async def test_a_prompt_longer_than_the_context(acme):
    long = chat("word " * (DEFAULT_CONTEXT_TOKENS + 100), max_tokens=4)
    end = await refused(acme, chat=long)
    assert (end.code, end.param) == ("context_length_exceeded", "messages"), end


async def test_a_deadline_past_the_longest_a_client_may_ask_for(acme):
    end = await refused(acme, deadline=time.time() + 365 * 86400)
    assert (end.code, end.param) == ("invalid_request", "deadline"), end
    # The same request with a deadline a client may set is served: the check is the bound.
    request = acme.request()
    await acme.publish(request)
    assert isinstance(await acme.first(request.request_id), Finished)
