"""Retries, deadlines and refusals, against scripted answers (no service needed): what
the real-service tests cannot make a service do on demand (503s, 429s, a hung socket)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from ckpt_client import CatalogError, Client, Invalid, Unavailable
from ckpt_client.transport import Transport

SECRET = "transport-test-secret-0123456789"
Handler = Callable[[httpx.Request], httpx.Response]


def scripted(*answers: httpx.Response | Exception) -> tuple[Handler, list[httpx.Request]]:
    """A handler answering with `answers` in turn (the last one forever after)."""
    seen: list[httpx.Request] = []

    def handle(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        answer = answers[min(len(seen), len(answers)) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return handle, seen


def problem(status: int, detail: str, **extra: object) -> httpx.Response:
    body = {"type": "about:blank", "title": "t", "status": status, "detail": detail, **extra}
    return httpx.Response(status, json=body, headers={"content-type": "application/problem+json"})


RUN = {"id": "run_1", "project": "p", "name": "r", "status": "active", "labels": {}}


@pytest.fixture
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """Record each pause's cap and sleep a millisecond instead."""
    caps: list[float] = []

    def uniform(low: float, high: float) -> float:
        caps.append(high)
        return 0.001

    monkeypatch.setattr("ckpt_client.transport.random.uniform", uniform)
    yield caps


def make_client(
    handler: Handler, tmp_path_factory: pytest.TempPathFactory, **options: object
) -> Client:
    return Client(
        "http://catalog.test",
        token=SECRET,
        spool_dir=tmp_path_factory.mktemp("spool"),
        transport=httpx.MockTransport(handler),
        **options,  # type: ignore[arg-type]
    )


def test_5xx_and_connection_errors_are_retried_until_an_answer(
    tmp_path_factory: pytest.TempPathFactory, fast_backoff: list[float]
) -> None:
    handle, seen = scripted(
        httpx.ConnectError("refused"),
        problem(503, "restarting"),
        httpx.ReadTimeout("slow"),
        problem(500, "oops"),
        httpx.Response(201, json=RUN),
    )
    with make_client(handle, tmp_path_factory) as client:
        run = client.run("p", "r")
    assert run.id == "run_1" and len(seen) == 5
    assert all(r.headers["authorization"] == f"Bearer {SECRET}" for r in seen)
    assert fast_backoff == [0.4, 0.8, 1.6, 3.2]  # doubling caps of full jitter


def test_the_backoff_cap_holds(
    tmp_path_factory: pytest.TempPathFactory, fast_backoff: list[float]
) -> None:
    handle, _ = scripted(*[problem(502, "bad gateway")] * 9, httpx.Response(200, json=RUN))
    with make_client(handle, tmp_path_factory) as client:
        client.run("p", "r")
    assert max(fast_backoff) == 10.0


def test_429_waits_at_least_retry_after(tmp_path_factory: pytest.TempPathFactory) -> None:
    handle, seen = scripted(
        httpx.Response(429, headers={"retry-after": "0.3"}), httpx.Response(200, json=RUN)
    )
    started = time.monotonic()
    with make_client(handle, tmp_path_factory) as client:
        client.run("p", "r")
    assert time.monotonic() - started >= 0.3 and len(seen) == 2


def test_a_refusal_is_raised_at_once_with_its_problem(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    handle, seen = scripted(problem(422, "name: must match", field="name"))
    with make_client(handle, tmp_path_factory) as client, pytest.raises(Invalid) as refused:
        client.run("p", "BAD")
    assert len(seen) == 1
    assert refused.value.status == 422 and refused.value.field == "name"
    assert refused.value.problem["detail"] == "name: must match"


def test_other_4xx_are_catalog_errors(tmp_path_factory: pytest.TempPathFactory) -> None:
    handle, _ = scripted(problem(415, "send JSON"))
    with make_client(handle, tmp_path_factory) as client, pytest.raises(CatalogError) as refused:
        client.tiers()
    assert type(refused.value) is CatalogError and refused.value.status == 415


def test_persistent_5xx_ends_at_the_deadline_as_unavailable(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    handle, seen = scripted(problem(503, "down for maintenance"))
    started = time.monotonic()
    with (
        make_client(handle, tmp_path_factory, deadline=0.5) as client,
        pytest.raises(Unavailable) as unreachable,
    ):
        client.run("p", "r")
    assert 0.45 <= time.monotonic() - started <= 0.9
    assert unreachable.value.status == 503
    assert unreachable.value.problem["detail"] == "down for maintenance"
    assert len(seen) >= 2


def test_a_hung_service_cannot_hold_a_call_past_its_deadline(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    seen: list[float] = []

    def hang(request: httpx.Request) -> httpx.Response:
        timeout = request.extensions["timeout"]["read"]
        seen.append(timeout)
        time.sleep(timeout)
        raise httpx.ReadTimeout("no answer", request=request)

    started = time.monotonic()
    with (
        make_client(hang, tmp_path_factory, deadline=0.6, timeout=30.0) as client,
        pytest.raises(Unavailable),
    ):
        client.tiers()
    assert time.monotonic() - started <= 0.9
    assert seen[0] <= 0.6  # the attempt's timeout is what is left of the deadline


def test_a_spooled_call_answers_none_and_says_so(
    tmp_path_factory: pytest.TempPathFactory, caplog: pytest.LogCaptureFixture
) -> None:
    run_answer = httpx.Response(201, json=RUN)
    handle, _ = scripted(run_answer, httpx.ConnectError("refused"))
    caplog.set_level(logging.DEBUG, logger="ckpt_client")
    with make_client(handle, tmp_path_factory, deadline=0.3) as client:
        run = client.run("p", "r")
        assert run.register(1, "file:///data/hot/p/r/step-1") is None
        [entry] = client.spool.pending()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("step 1 of p/r spooled to" in w and str(entry) in w for w in warnings), warnings
    assert all(SECRET not in r.getMessage() for r in caplog.records)
    assert SECRET not in entry.read_text()


def test_bad_configuration_is_refused_early() -> None:
    with pytest.raises(ValueError, match="http"):
        Client("ftp://catalog")
    with pytest.raises(ValueError, match="on_unavailable"):
        Client(on_unavailable="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        Client(deadline=0)


def test_a_password_in_the_url_is_not_shown() -> None:
    with Client("http://user:hunter2@catalog.test") as client:
        assert "hunter2" not in repr(client)


def test_a_spool_that_cannot_be_written_raises_unavailable(tmp_path: Path) -> None:
    handle, _ = scripted(httpx.Response(201, json=RUN), httpx.ConnectError("refused"))
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("a file where the spool should be")
    transport = httpx.MockTransport(handle)
    with Client(
        "http://catalog.test", spool_dir=blocked, deadline=0.2, transport=transport
    ) as client:
        run = client.run("p", "r")
        with pytest.raises(Unavailable, match="the spool cannot be written"):
            run.register(1, "file:///data/hot/p/r/step-1")


def scripted_transport(
    *answers: httpx.Response | Exception,
) -> tuple[Transport, list[httpx.Request]]:
    """The bare transport (no client, no spool) answered by `scripted(*answers)`."""
    handle, seen = scripted(*answers)
    transport = Transport(
        "http://catalog.test",
        token=None,
        timeout=5,
        deadline=5,
        http_transport=httpx.MockTransport(handle),
    )
    return transport, seen


def test_a_call_that_is_not_idempotent_is_sent_again_only_when_it_never_arrived(
    fast_backoff: list[float],
) -> None:
    """Creating a token twice makes two tokens, the first one's secret lost: such a call is
    retried after a refused connection or a 429, never after a failure the service may
    have met after doing the work."""
    created = httpx.Response(201, json={"id": "tok_1", "token": "secret"})
    for failure in (
        problem(500, "oops"),
        httpx.ReadTimeout("slow"),
        httpx.RemoteProtocolError("x"),
    ):
        transport, seen = scripted_transport(failure, created)
        with pytest.raises(Unavailable, match="may have been done"):
            transport.request("POST", "/v1/tokens", json={}, idempotent=False)
        assert len(seen) == 1, failure
        # the same failure on an idempotent call is retried until the answer
        transport, seen = scripted_transport(failure, created)
        assert transport.request("POST", "/v1/tokens", json={}).status == 201
        assert len(seen) == 2
    for never_arrived in (httpx.ConnectError("refused"), problem(429, "slow down")):
        transport, seen = scripted_transport(never_arrived, created)
        answer = transport.request("POST", "/v1/tokens", json={}, idempotent=False)
        assert answer.body["id"] == "tok_1" and len(seen) == 2
