"""A tenant's media URL must not make a vLLM worker fetch from inside the operator's network.

vLLM's OpenAI layer fetches every http(s) `image_url` / `audio_url` / `video_url` a chat message
names (`MediaConnector`, any host unless `allowed_media_domains` is set): before this, a tenant
could point one at the NATS monitoring port, cloud metadata (169.254.169.254) or any internal
service, and the worker fetched it. Now the engine adapter refuses every remote media URL by
default, before vLLM sees the request, with a 400 `invalid_request` naming the field and the host
(`workers/engines/vllm/media_urls.py`); `--allowed-media-domains` names the hosts it may fetch from. vLLM's own
allow-list is set too, so that vLLM itself fetches nothing by default either.

The target is a real HTTP server per test (port 0) that records every hit. The adapter is driven
without a model (the refusal comes before the model is needed); the last test sends the request
through `laneway up --engine vllm` with a real model and the official openai client (slow).
"""

from __future__ import annotations

import os

import openai
import pytest
import pytest_asyncio
from aiohttp import web

from loadtest.processes import LanewayUp
from schemas.openai import ChatBody, Message
from tests.slow.conftest import vllm_model_dir
from workers.engine import EngineRequest, UnsupportedRequest

pytestmark = pytest.mark.timeout(300)


@pytest_asyncio.fixture
async def target():
    """An internal service that records every request it gets: (its base URL, the hits)."""
    hits: list[str] = []

    async def record(request: web.Request) -> web.Response:
        hits.append(f"{request.method} {request.path_qs}")
        return web.Response(body=b"\x89PNG\r\n\x1a\n", content_type="image/png")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", hits
    await runner.cleanup()


def engine(*flags: str):
    """A vLLM engine as `laneway worker --engine vllm` builds it from these flags; not started:
    what is refused here is refused before the model is needed."""
    import argparse

    pytest.importorskip("vllm")
    from workers.engines.vllm.config import VllmConfig
    from workers.engines.vllm.engine import VllmEngine

    parser = argparse.ArgumentParser()
    VllmConfig.configure(parser)
    return VllmEngine(VllmConfig.from_args(parser.parse_args(["--model", "smollm2", *flags])))


def ask(part: dict) -> EngineRequest:
    return EngineRequest(
        "ssrf",
        ChatBody(
            model="smollm2",
            max_tokens=4,
            messages=[Message(role="user", content=[{"type": "text", "text": "What is in this picture?"}, part])],
        ),
    )


PARTS = {
    "image_url": lambda url: {"type": "image_url", "image_url": {"url": url}},
    "input_image": lambda url: {"type": "input_image", "image_url": url},
    "untyped image_url": lambda url: {"image_url": url},
    "audio_url": lambda url: {"type": "audio_url", "audio_url": {"url": url}},
    "video_url": lambda url: {"type": "video_url", "video_url": {"url": url}},
}


@pytest.mark.parametrize("shape", sorted(PARTS))
async def test_a_media_url_to_an_internal_host_is_refused_unfetched(target, shape) -> None:
    base, hits = target
    part = PARTS[shape](f"{base}/varz")
    with pytest.raises(UnsupportedRequest) as refused:  # the worker's invalid_request (400)
        [o async for o in engine().generate(ask(part))]
    field = next(k for k in part if k.endswith("_url"))
    assert refused.value.param == f"messages[0].content[1].{field}"
    assert refused.value.message == f"{field} host 127.0.0.1 is not in this worker's --allowed-media-domains"
    assert hits == []


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://example.com@127.0.0.1:{port}/x.png", "has a user name or password before its host"),
        ("http://localhost:{port}/x.png", "port {port} is not fetched"),
        ("HTTP://LOCALHOST:{port}/x.png", "port {port} is not fetched"),
    ],
)
async def test_an_allowed_host_name_does_not_open_other_hosts_or_ports(target, url, why) -> None:
    base, hits = target
    port = base.rsplit(":", 1)[1]
    eng = engine("--allowed-media-domains", "example.com,localhost")
    with pytest.raises(UnsupportedRequest) as refused:
        [o async for o in eng.generate(ask(PARTS["image_url"](url.format(port=port))))]
    assert refused.value.param == "messages[0].content[1].image_url"
    assert refused.value.message.startswith(f"image_url {why.format(port=port)}")
    assert hits == []


async def test_vllms_own_fetcher_as_the_worker_configures_it_fetches_nothing(target) -> None:
    """Defence in depth, below the adapter: vLLM's `MediaConnector` with the engine arguments a
    worker starts vLLM with refuses the URL too; with vLLM's defaults it fetches it (the control:
    the target would have seen a fetch)."""
    pytest.importorskip("vllm")
    from vllm.multimodal.media.connector import MediaConnector
    from vllm.multimodal.media.image import ImageMediaIO

    from workers.engines.vllm.config import VllmConfig

    base, hits = target
    args = VllmConfig(model=str(vllm_model_dir())).engine_args()
    ours = MediaConnector(allowed_media_domains=args.allowed_media_domains)
    with pytest.raises(ValueError, match="allowed domains"):
        await ours.load_from_url_async(f"{base}/meta-data", ImageMediaIO())
    assert hits == []
    with pytest.raises(ValueError, match="Failed to load image"):  # fetched, then not decodable
        await MediaConnector().load_from_url_async(f"{base}/meta-data", ImageMediaIO())
    assert hits == ["GET /meta-data"]


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.timeout(900)
async def test_through_laneway_up_the_client_gets_a_400_and_nothing_is_fetched(target, tmp_path) -> None:
    """The whole path: the official openai client, the edge, the broker, a vLLM worker with a real
    model. PII analysis is off: it would refuse the image part itself, and the worker is the
    boundary under attack here."""
    base, hits = target
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    key = "sk-media-urls"
    flags = [
        "--engine",
        "vllm",
        "--model",
        str(vllm_model_dir()),
        "--kv-cache-bytes",
        "256MiB",
        "--max-model-len",
        "2048",
        "--pii",
        "off",
    ]
    async with LanewayUp(tmp_path / "lw", key, flags) as up:
        client = openai.AsyncOpenAI(base_url=f"{up.url}/v1", api_key=key, max_retries=0, timeout=300)
        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(
                model="smollm2",
                max_tokens=4,
                messages=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is in this picture?"},
                            {"type": "image_url", "image_url": {"url": f"{base}/varz"}},
                        ],
                    }
                ],
            )
        await client.close()
    error = refused.value.body
    assert refused.value.status_code == 400
    assert error["param"] == "messages[0].content[1].image_url"
    assert error["message"] == "image_url host 127.0.0.1 is not in this worker's --allowed-media-domains"
    assert hits == []
