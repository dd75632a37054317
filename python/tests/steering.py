"""Who may steer a worker, checked the same way on every worker (RQ, Celery, asyncio and the bare
metrics port): every way of asking without the pool's credential gets the same 401.

It only sends requests and asserts on the answers (the worker's metrics among them); what "nothing
changed" means for a worker's jobs is each test's own.
"""

from __future__ import annotations

import base64
import secrets

from processes import Answer, WorkerCredential, exchange, http, samples, value

REALM = 'Bearer realm="lanepool"'
# A drain and a stand-in the worker would follow, and two it would refuse with a 400 and a 404
# if it read them: unauthenticated, all four get the same 401.
STEERING = (
    "/drain?seconds=60",
    "/stand-in?lanes=batch&seconds=60",
    "/drain?seconds=-1",
    "/elsewhere",
)


def wrong_authorizations(credential: WorkerCredential) -> dict[str, str | None]:
    """What each Authorization field a worker must refuse stands for."""
    token = credential.token
    basic = base64.b64encode(f"lanepool:{token}".encode()).decode()
    return {
        "no header": None,
        "an empty header": "",
        "another token": f"Bearer {secrets.token_hex(32)}",
        "the token cut short": f"Bearer {token[:-1]}",
        "the token and more": f"Bearer {token}0",
        "the token without a scheme": token,
        "another scheme": f"Basic {basic}",
        "the token glued to the scheme": f"Bearer{token}",
        "the scheme alone": "Bearer",
        "a token longer than any credential": f"Bearer {'a' * 5000}",
    }


def assert_refused(addr: tuple[str, int], credential: WorkerCredential, path: str) -> None:
    """Every wrong Authorization gets the 401 with its realm and one line saying nothing."""
    for what, authorization in wrong_authorizations(credential).items():
        answer = exchange(addr, "POST", path, authorization=authorization)
        assert_unauthorized(answer, f"POST {path} with {what}")
        assert credential.token not in answer.body


def assert_unauthorized(answer: Answer, what: str) -> None:
    """The one 401 (the Rust example worker's): the realm, one line, nothing about the request."""
    assert answer.status == 401, f"{what}: {answer}"
    assert answer.headers.get("www-authenticate") == REALM, f"{what}: {answer.headers}"
    assert answer.body.endswith("\n") and answer.body.count("\n") == 1, f"{what}: {answer.body}"
    assert answer.body == "this worker takes POST requests only with its pool's credential\n"


def assert_refused_every_request(addr: tuple[str, int], credential: WorkerCredential) -> None:
    for path in STEERING:
        assert_refused(addr, credential, path)


def assert_open_metrics_without_the_token(text: str, credential: WorkerCredential) -> None:
    """GET /metrics needs nothing, says the worker checks the credential, and never shows it."""
    required = {k: v for k, v in samples(text).items() if k[0].startswith("lanepool_worker_cred")}
    assert required == {("lanepool_worker_credential_required", ()): 1}, required
    assert credential.token not in text
    assert str(credential.path) not in text


def assert_refused_and_unchanged(addr: tuple[str, int], credential: WorkerCredential) -> None:
    """Every way of asking without the pool's credential gets the 401 and leaves the worker neither
    draining nor standing in; GET /metrics still needs nothing and never shows the credential."""
    assert_refused_every_request(addr, credential)
    text = _metrics(addr)
    assert value(text, "lanepool_worker_draining") == 0
    assert value(text, "lanepool_worker_standing_in") == 0
    assert_open_metrics_without_the_token(text, credential)


def assert_refused_unmounted(addr: tuple[str, int], credential: WorkerCredential) -> None:
    """A worker started with no credential mounted: every way of asking gets the 401, the pool's
    own token too (it has none to compare it with); it does not drain, and GET /metrics says it
    requires a credential."""
    assert_refused_every_request(addr, credential)
    for path in STEERING[:2]:  # the drain and the stand-in it would follow with a credential
        answer = exchange(addr, "POST", path, authorization=credential.authorization)
        assert_unauthorized(answer, path)
    text = _metrics(addr)
    assert value(text, "lanepool_worker_draining") == 0
    assert value(text, "lanepool_worker_credential_required") == 1


def _metrics(addr: tuple[str, int]) -> str:
    status, text = http(addr, "GET", "/metrics")
    assert status == 200, text
    return text
