import json
import time

import lark_oapi as lark
import pytest
from multidict import CIMultiDict

from bot.feishu.verifier import WebhookVerifier
from hub.errors import Forbidden, InvalidArgument, Unauthenticated
from tests.fakes.feishu_events import FeishuSigner, signature

signer = FeishuSigner(encrypt_key="ek_1", verification_token="vt_1")
verifier = WebhookVerifier(encrypt_key="ek_1", verification_token="vt_1")


def test_signed_encrypted_event_opens_to_its_plaintext() -> None:
    payload = signer.message("hi", event_id="ev1")
    body, headers = signer.sign(payload)
    assert verifier.open(CIMultiDict(headers), body, time.time()) == payload


def test_forged_signature_is_unauthenticated() -> None:
    body, headers = signer.sign(signer.message("hi"))
    headers["X-Lark-Signature"] = "0" * 64
    with pytest.raises(Unauthenticated):
        verifier.open(CIMultiDict(headers), body, time.time())


def test_tampered_body_is_unauthenticated() -> None:
    body, headers = signer.sign(signer.message("hi"))
    other, _ = signer.sign(signer.message("evil"))
    with pytest.raises(Unauthenticated):
        verifier.open(CIMultiDict(headers), other, time.time())


@pytest.mark.parametrize("offset", [-301, 301])
def test_timestamps_outside_five_minutes_are_unauthenticated(offset: int) -> None:
    now = time.time()
    body, headers = signer.sign(signer.message("hi"), timestamp=int(now) + offset)
    with pytest.raises(Unauthenticated):
        verifier.open(CIMultiDict(headers), body, now)


BAD_TIMESTAMPS = ["nan", "NaN", "inf", "-inf", "1e3", "", " 1", "1.5", "-1", "+1", "9" * 40]


def signed_at(timestamp: str, payload: dict[str, object]) -> tuple[bytes, dict[str, str]]:
    """A request correctly signed over a timestamp header Feishu would never send."""
    body, headers = signer.sign(payload)
    nonce = headers["X-Lark-Request-Nonce"]
    headers["X-Lark-Request-Timestamp"] = timestamp
    headers["X-Lark-Signature"] = signature(timestamp, nonce, signer.encrypt_key, body)
    return body, headers


@pytest.mark.parametrize("timestamp", BAD_TIMESTAMPS)
def test_a_signed_timestamp_that_is_not_a_plain_integer_is_unauthenticated(
    timestamp: str,
) -> None:
    body, headers = signed_at(timestamp, signer.message("hi"))
    with pytest.raises(Unauthenticated, match="timestamp"):
        verifier.open(CIMultiDict(headers), body, time.time())


def test_the_current_integer_timestamp_is_accepted() -> None:
    now = time.time()
    body, headers = signed_at(str(int(now)), signer.message("hi"))
    assert verifier.open(CIMultiDict(headers), body, now)["event"]


def test_wrong_verification_token_is_forbidden() -> None:
    body, headers = signer.sign(signer.message("hi", token="stolen"))
    with pytest.raises(Forbidden):
        verifier.open(CIMultiDict(headers), body, time.time())


def test_unsigned_event_is_unauthenticated_but_url_verification_is_not() -> None:
    body, _ = signer.sign(signer.message("hi"))
    with pytest.raises(Unauthenticated):
        verifier.open(CIMultiDict(), body, time.time())
    body, _ = signer.sign(signer.url_verification("c1"))
    assert verifier.open(CIMultiDict(), body, time.time())["challenge"] == "c1"


def test_garbage_is_invalid() -> None:
    with pytest.raises(InvalidArgument):
        WebhookVerifier("", "vt_1").open(CIMultiDict(), b"not json", time.time())
    bad = json.dumps({"encrypt": "AAAA"}).encode()
    with pytest.raises(InvalidArgument):
        WebhookVerifier("", "vt_1").open(CIMultiDict(), bad, time.time())


def test_token_only_mode_accepts_plain_json_with_the_token() -> None:
    token_only = WebhookVerifier(encrypt_key="", verification_token="vt_1")
    body, headers = signer.sign(signer.message("hi"), encrypted=False)
    assert token_only.open(CIMultiDict(headers), body, time.time())["event"]


def test_a_webhook_without_any_secret_is_refused_at_construction() -> None:
    with pytest.raises(InvalidArgument):
        WebhookVerifier("", "")


def test_the_sdk_dispatcher_accepts_what_the_fake_signs() -> None:
    """Cross-check: the fake's scheme is the one lark-oapi itself verifies."""
    seen: list[object] = []
    handler = (
        lark.EventDispatcherHandler.builder("ek_1", "vt_1")
        .register_p2_im_message_receive_v1(seen.append)
        .build()
    )
    body, headers = signer.sign(signer.message("hi"))
    request = lark.RawRequest()
    request.uri = "/feishu/events"
    request.body = body
    request.headers = CIMultiDict(headers)
    response = handler.do(request)
    assert response.status_code == 200
    assert len(seen) == 1
