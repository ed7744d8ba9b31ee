"""Which media URLs a vLLM worker lets vLLM fetch (`workers/engines/vllm/media_urls.py`): none but data: URLs
by default, and with `--allowed-media-domains` only the hosts named, exactly. Pure: no vLLM."""

from __future__ import annotations

import argparse

import pytest

from workers.engines.vllm.config import VllmConfig
from workers.engines.vllm.media_urls import (
    MediaFetchPolicy,
    first_refused_media_url,
    media_url_refusal,
    parse_media_domains,
)

NONE = MediaFetchPolicy()
EXAMPLE = MediaFetchPolicy(frozenset({"example.com"}))
PNG = "data:image/png;base64,iVBORw0KGgo="


@pytest.mark.parametrize("url", [PNG, "DATA:image/png;base64,AAAA", "data:audio/wav;base64,AAAA"])
def test_data_urls_carry_their_bytes_and_pass_any_policy(url: str) -> None:
    assert media_url_refusal("image_url", url, NONE) is None


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/a.png",
        "https://example.com/a.png",
        "http://169.254.169.254/latest/meta-data/",
        "http://127.0.0.1:8222/varz",
        "http://localhost/x",
        "https://cdn.example.org/a.png",
    ],
)
def test_by_default_no_remote_url_is_fetched(url: str) -> None:
    refusal = media_url_refusal("image_url", url, NONE)
    assert refusal is not None and refusal.startswith("image_url ")


def test_the_refusal_names_the_field_the_host_and_the_flag() -> None:
    assert (
        media_url_refusal("image_url", "http://127.0.0.1/x.png", NONE)
        == "image_url host 127.0.0.1 is not in this worker's --allowed-media-domains"
    )
    assert (
        media_url_refusal("audio_url", "https://internal.corp/a.wav", EXAMPLE)
        == "audio_url host internal.corp is not in this worker's --allowed-media-domains"
    )


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/a.png",
        "https://example.com/a.png?x=1#f",
        "HTTPS://EXAMPLE.COM/A.PNG",
        "https://Example.Com:443/a.png",
        "http://example.com:80/a.png",
    ],
)
def test_an_allowed_host_passes_whatever_its_case_on_its_own_port(url: str) -> None:
    assert media_url_refusal("image_url", url, EXAMPLE) is None


@pytest.mark.parametrize(
    "url",
    [
        "https://cdn.example.com/a.png",
        "https://evilexample.com/a.png",
        "https://example.com.evil.org/a.png",
        "https://example.com./a.png",
        "https://com/a.png",
    ],
)
def test_hosts_match_exactly_no_subdomain_no_suffix(url: str) -> None:
    assert "is not in this worker's --allowed-media-domains" in media_url_refusal("image_url", url, EXAMPLE)


@pytest.mark.parametrize(
    "url", ["https://example.com:8443/a.png", "http://example.com:8222/varz", "http://example.com:443/a.png"]
)
def test_an_allowed_host_on_another_port_is_refused(url: str) -> None:
    assert "port" in media_url_refusal("image_url", url, EXAMPLE)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/",
        "http://2130706433/",
        "http://0x7f000001/",
        "http://0177.0.0.1/",
        "http://10.0.0.1:4222/",
    ],
)
def test_ip_literals_are_never_fetched(url: str) -> None:
    assert "host" in media_url_refusal("image_url", url, EXAMPLE)


@pytest.mark.parametrize(
    "entry",
    [
        "127.0.0.1",
        "169.254.169.254",
        "2130706433",
        "0x7f000001",
        "::1",
        "[::1]",
        "*.example.com",
        "example.com:8443",
        "http://example.com",
        "example.com/images",
        "exa_mple.com",
        "-example.com",
    ],
)
def test_the_allow_list_takes_host_names_only(entry: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_media_domains(f"example.com,{entry}")


def test_the_allow_list_is_read_comma_separated_in_lower_case() -> None:
    assert parse_media_domains(" Example.COM, cdn.example.org ,,localhost") == {
        "example.com",
        "cdn.example.org",
        "localhost",
    }
    assert parse_media_domains("") == frozenset()


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com@127.0.0.1/",
        "http://user:pw@example.com/",
        "http://example.com:80@169.254.169.254/",
        "http://@example.com/",
    ],
)
def test_userinfo_is_refused_even_before_an_allowed_host(url: str) -> None:
    assert "user name or password" in media_url_refusal("image_url", url, EXAMPLE)


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com\\@127.0.0.1/",
        "http:\\\\127.0.0.1\\x",
        "http://exam\tple.com/",
        "http://example.com\n.evil.org/",
        " http://example.com/",
        "http://example.com/a b",
        "http://example.com:99999/",
        "http://[::1/",
    ],
)
def test_what_parsers_could_read_two_ways_is_refused(url: str) -> None:
    assert "not a well-formed URL" in media_url_refusal("image_url", url, EXAMPLE)


@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/a.png",
        "gopher://example.com/",
        "httpx://example.com/",
        "//example.com/a.png",
        "example.com/a.png",
        "blob:https://example.com/x",
    ],
)
def test_other_schemes_are_refused(url: str) -> None:
    assert "is not fetched" in media_url_refusal("image_url", url, EXAMPLE)


def test_no_host_is_refused() -> None:
    assert media_url_refusal("image_url", "http:///a.png", EXAMPLE) == "image_url names no host"


@pytest.mark.parametrize("url", ["file:///etc/passwd", "FILE:///etc/passwd", "file://localhost/etc/passwd"])
def test_file_urls_only_where_vllm_reads_a_local_media_path(url: str) -> None:
    assert "local file" in media_url_refusal("image_url", url, EXAMPLE)
    assert media_url_refusal("image_url", url, MediaFetchPolicy(local_files=True)) is None


def test_the_config_maps_the_flag_and_vllms_local_path_onto_the_policy() -> None:
    parser = argparse.ArgumentParser()
    VllmConfig.configure(parser)
    plain = VllmConfig.from_args(parser.parse_args(["--model", "m"]))
    assert plain.media_fetch() == NONE
    allowed = VllmConfig.from_args(
        parser.parse_args(["--model", "m", "--allowed-media-domains", "example.com,CDN.example.org"])
    )
    assert allowed.media_fetch().domains == {"example.com", "cdn.example.org"}
    local = VllmConfig(model="m", extra={"allowed_local_media_path": "/srv/media"})
    assert local.media_fetch().local_files
    with pytest.raises(SystemExit):
        parser.parse_args(["--model", "m", "--allowed-media-domains", "169.254.169.254"])


# -- where URLs sit in a chat request --------------------------------------------------------------
EVIL = "http://169.254.169.254/latest/meta-data/"


@pytest.mark.parametrize(
    ("part", "field"),
    [
        ({"type": "image_url", "image_url": {"url": EVIL}}, "image_url"),  # OpenAI's chat shape
        ({"type": "input_image", "image_url": EVIL}, "image_url"),  # the Responses shape
        ({"image_url": EVIL}, "image_url"),  # vLLM's untyped shape
        ({"image_url": {"url": EVIL}, "uuid": "u1"}, "image_url"),  # with a uuid: by key
        ({"type": "text", "text": "hi", "image_url": {"url": EVIL}}, "image_url"),  # whatever the type
        ({"type": "audio_url", "audio_url": {"url": EVIL}}, "audio_url"),
        ({"audio_url": EVIL}, "audio_url"),
        ({"type": "video_url", "video_url": {"url": EVIL}}, "video_url"),
        ({"video_url": EVIL}, "video_url"),
        ({"type": "input_file", "file_url": EVIL}, "file_url"),  # any *_url key
    ],
)
def test_every_url_in_a_content_part_is_read(part: dict, field: str) -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "what is this?"}, part]},
    ]
    refused = first_refused_media_url(messages, EXAMPLE)
    assert refused is not None
    assert (refused.param, refused.field) == (f"messages[1].content[1].{field}", field)
    assert refused.message == f"{field} host 169.254.169.254 is not in this worker's --allowed-media-domains"


def test_every_role_is_read() -> None:
    for role in ("system", "developer", "assistant", "tool"):
        messages = [{"role": role, "content": [{"type": "image_url", "image_url": {"url": EVIL}}]}]
        assert first_refused_media_url(messages, EXAMPLE).param == "messages[0].content[0].image_url"


def test_inline_media_and_text_pass() -> None:
    messages = [
        {"role": "user", "content": "plain text http://127.0.0.1/ is only text"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "see http://127.0.0.1/"},
                {"type": "image_url", "image_url": {"url": PNG, "detail": "auto"}},
                {"type": "input_image", "image_url": PNG},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                {"type": "file", "file": {"file_data": "AAAA", "filename": "a.pdf"}},
                {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}},
                {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            ],
        },
        {"role": "assistant", "content": None},
    ]
    assert first_refused_media_url(messages, EXAMPLE) is None


def test_the_first_refused_url_is_named() -> None:
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": PNG}},
                {"type": "image_url", "image_url": {"url": "ftp://x/a"}},
                {"type": "image_url", "image_url": {"url": EVIL}},
            ],
        }
    ]
    refused = first_refused_media_url(messages, NONE)
    assert refused.param == "messages[0].content[1].image_url" and "'ftp'" in refused.message
