"""The webhook's signature check: HMAC-SHA256 of the raw body with the secret, GitHub's form."""

from __future__ import annotations

import hashlib
import hmac

import pytest
from pydantic import SecretStr

from app.forge.decisions import verify_signature
from app.forge.exceptions import WebhookNotConfigured, WebhookSignatureInvalid
from app.settings import Settings

SECRET = "It's a Secret to Everybody"
BODY = b"Hello, World!"
# The example of GitHub's "Validating webhook deliveries" page: this secret and payload.
GITHUB_EXAMPLE = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"


def settings(secret: str | None) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        github_webhook_secret=SecretStr(secret) if secret is not None else None,
    )


def test_githubs_documented_example_verifies() -> None:
    digest = hmac.new(SECRET.encode(), BODY, hashlib.sha256).hexdigest()
    assert f"sha256={digest}" == GITHUB_EXAMPLE
    verify_signature(settings(SECRET), BODY, GITHUB_EXAMPLE)


@pytest.mark.parametrize(
    "signature",
    [
        None,
        "",
        GITHUB_EXAMPLE.removeprefix("sha256="),
        "sha1=" + GITHUB_EXAMPLE.removeprefix("sha256="),
        GITHUB_EXAMPLE[:-1] + "f",
        GITHUB_EXAMPLE.upper(),
        "sha256=é",
    ],
)
def test_anything_else_is_refused(signature: str | None) -> None:
    with pytest.raises(WebhookSignatureInvalid) as caught:
        verify_signature(settings(SECRET), BODY, signature)
    assert caught.value.status == 401 and SECRET not in caught.value.detail


def test_another_body_is_refused() -> None:
    with pytest.raises(WebhookSignatureInvalid):
        verify_signature(settings(SECRET), BODY + b" ", GITHUB_EXAMPLE)


@pytest.mark.parametrize("secret", [None, ""])
def test_no_secret_refuses_every_delivery(secret: str | None) -> None:
    with pytest.raises(WebhookNotConfigured) as caught:
        verify_signature(settings(secret), BODY, GITHUB_EXAMPLE)
    assert caught.value.status == 503
