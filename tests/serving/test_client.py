import asyncio

import pytest

from cupid.serving.cache import Cache
from cupid.serving.client import Client, MockTransport, RequestFailed, Response, classify
from cupid.serving.endpoint import Endpoint

HELLO = [{"role": "user", "content": "hello"}]


def endpoint(url: str, **kw) -> Endpoint:
    return Endpoint(base_url=url, model="instant", **kw)


async def test_retries_after_503_then_caches(flaky_url, tmp_path):
    cache = Cache(tmp_path / "c.sqlite")
    async with Client({"e": endpoint(flaky_url, max_retries=2)}, cache) as client:
        answer = await client.chat("e", HELLO)
        assert answer.content == "OK" and not answer.cached
        again = await client.chat("e", HELLO)
        assert again.cached and again.content == "OK"
        assert (client.stats.sent, client.stats.cached, client.stats.failed) == (1, 1, 0)


async def test_gives_up_with_the_reason_when_retries_are_spent(flaky_url):
    async with Client({"e": endpoint(flaky_url, max_retries=0)}) as client:
        with pytest.raises(RequestFailed) as e:
            await client.chat("e", HELLO)
    assert e.value.reason == "http_503"
    assert client.stats.failed == 1


async def test_identical_requests_in_flight_are_sent_once(instant_url):
    async with Client({"e": endpoint(instant_url)}) as client:
        answers = await asyncio.gather(*[client.chat("e", HELLO) for _ in range(20)])
        assert {a.content for a in answers} == {"OK"}
        assert client.stats.sent == 1


async def test_refresh_sends_again(instant_url, tmp_path):
    cache = Cache(tmp_path / "c.sqlite")
    async with Client({"e": endpoint(instant_url)}, cache) as client:
        await client.chat("e", HELLO)
    async with Client({"e": endpoint(instant_url)}, cache, refresh=True) as client:
        assert not (await client.chat("e", HELLO)).cached
        assert client.stats.sent == 1


async def test_connection_refused_is_a_connection_failure():
    async with Client({"e": endpoint("http://127.0.0.1:9/v1", max_retries=0)}) as client:
        with pytest.raises(RequestFailed) as e:
            await client.chat("e", HELLO)
    assert e.value.reason == "connection"


async def test_missing_key_fails_before_sending(monkeypatch, instant_url):
    monkeypatch.delenv("CUPID_TEST_KEY", raising=False)
    async with Client({"e": endpoint(instant_url, api_key_env="CUPID_TEST_KEY")}) as client:
        with pytest.raises(RequestFailed) as e:
            await client.chat("e", HELLO)
    assert e.value.reason == "missing_api_key" and "CUPID_TEST_KEY" in e.value.detail


def test_request_carries_endpoint_defaults_and_overrides(instant_url):
    client = Client({"e": endpoint(instant_url, max_tokens=32, extra_body={"seed": 7})})
    request = client.request("e", HELLO, response_format={"type": "json_object"}, temperature=None)
    assert request.body() == {
        "model": "instant",
        "messages": HELLO,
        "temperature": 0.0,
        "max_tokens": 32,
        "seed": 7,
        "response_format": {"type": "json_object"},
    }


@pytest.mark.parametrize(
    "status, text, reason, retryable",
    [
        (429, "slow down", "rate_limited", True),
        (502, "bad gateway", "http_502", True),
        (400, "This model's maximum context length is 8192 tokens", "context_length_exceeded", False),
        (400, "bad request", "http_400", False),
    ],
)
def test_error_classification(status, text, reason, retryable):
    failure = classify(status, text)
    assert (failure.reason, failure.retryable) == (reason, retryable)


# A transport in place of HTTP (`MockTransport`): what the client sends, and the answer chosen for it, with no server
# and no patched method; the client's own work (cache, one send, bounds, reading answers) is the same over it.


def _endpoints(**kw) -> dict[str, Endpoint]:
    return {"e": Endpoint(base_url="http://nowhere.invalid/v1", model="m", **kw)}


async def test_a_transport_answers_in_place_of_http(tmp_path):
    seen = []

    def handler(name, request):
        seen.append((name, request.body()["messages"], request.body()["max_tokens"]))
        return Response.completion("hi", usage={"completion_tokens": 1})

    cache = Cache(tmp_path / "c.sqlite")
    async with Client(_endpoints(max_tokens=5), cache, transport=MockTransport(handler)) as client:
        answers = await asyncio.gather(*[client.chat("e", HELLO) for _ in range(3)])
        again = await client.chat("e", HELLO)
    assert [a.content for a in answers] == ["hi"] * 3 and answers[0].usage == {"completion_tokens": 1}
    assert seen == [("e", HELLO, 5)]  # one send for identical requests in flight, the endpoint's cap on it
    assert again.cached and client.stats.sent == 1
    cache.close()


@pytest.mark.parametrize(
    "response, reason",
    [(Response(429, "slow down"), "rate_limited"), (Response(400, "prompt is too long"), "context_length_exceeded"),
     (Response(200, "{not json"), "bad_response"), (Response(200, '{"choices": []}'), "bad_response")],
)  # fmt: skip
async def test_what_a_transport_returns_is_read_as_http_would_be(response, reason):
    async def handler(name, request):
        return response

    async with Client(_endpoints(max_retries=0), transport=MockTransport(handler)) as client:
        with pytest.raises(RequestFailed) as e:
            await client.chat("e", HELLO)
    assert e.value.reason == reason and client.stats.failed == 1


async def test_a_transport_runs_within_the_endpoint_bound():
    """The endpoint's concurrency bounds the transport's calls as it bounds HTTP's."""
    running, most = 0, 0

    async def handler(name, request):
        nonlocal running, most
        running += 1
        most = max(most, running)
        await asyncio.sleep(0.01)
        running -= 1
        return Response.completion(request.messages[0]["content"])

    async with Client(_endpoints(max_concurrency=3), transport=MockTransport(handler)) as client:
        asks = [client.chat("e", [{"role": "user", "content": str(i)}]) for i in range(12)]
        answers = await asyncio.gather(*asks)
    assert [a.content for a in answers] == [str(i) for i in range(12)] and most == 3
