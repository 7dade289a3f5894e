"""Fingerprints, content hashes, language guesses and the provenance rules of a new finding."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal

import pytest
from pydantic import ValidationError

from app.errors import InvalidInput
from app.memory.schemas import FindingCreate
from app.memory.service import content_hash, detect_language, fingerprint

PARAMS = {"batch": 32, "tile": [64, 128], "dtype": "bf16", "lr": 0.001, "opts": {"b": 1, "a": 2}}


def test_parameter_order_does_not_change_the_fingerprint() -> None:
    reordered = {
        "opts": {"a": 2, "b": 1},
        "lr": 0.001,
        "dtype": "bf16",
        "tile": [64, 128],
        "batch": 32,
    }
    assert fingerprint("p-x", "gemm", PARAMS, "h100") == fingerprint(
        "p-x", "gemm", reordered, "h100"
    )


def test_number_spelling_does_not_change_the_fingerprint() -> None:
    spelled = {**PARAMS, "batch": 32.0, "lr": Decimal("0.0010"), "tile": (64.0, 128)}
    assert fingerprint("p-x", "gemm", PARAMS, "h100") == fingerprint("p-x", "gemm", spelled, "h100")


@pytest.mark.parametrize(
    ("project", "experiment", "params", "device"),
    [
        ("p-x", "gemm", PARAMS, "a100"),
        ("p-y", "gemm", PARAMS, "h100"),
        ("p-x", "gemv", PARAMS, "h100"),
        ("p-x", "gemm", {**PARAMS, "batch": 64}, "h100"),
        ("p-x", "gemm", {**PARAMS, "tile": [128, 64]}, "h100"),  # list order matters
        ("p-x", "gemm", {**PARAMS, "batch": "32"}, "h100"),  # a string is not a number
        ("p-x", "gemm", {**PARAMS, "flag": True}, "h100"),
    ],
)
def test_any_real_change_is_another_fingerprint(
    project: str, experiment: str, params: dict[str, object], device: str
) -> None:
    base = fingerprint("p-x", "gemm", PARAMS, "h100")
    assert fingerprint(project, experiment, params, device) != base


def test_fingerprint_is_hex_sha256_and_refuses_non_json() -> None:
    value = fingerprint(None, "gemm", {}, "cpu")
    assert len(value) == 64 and int(value, 16) >= 0
    with pytest.raises(InvalidInput, match=r"parameters\.lr"):
        fingerprint("p-x", "gemm", {"lr": float("nan")}, "h100")
    with pytest.raises(InvalidInput, match=r"parameters\.when"):
        fingerprint("p-x", "gemm", {"when": object()}, "h100")
    with pytest.raises(InvalidInput, match="device_kind"):
        fingerprint("p-x", "gemm", {}, " ")


def test_a_code_change_is_part_of_the_fingerprint_and_no_change_keeps_the_old_one() -> None:
    # Fingerprints stored before changes entered them must still match a point without one:
    # the canonical JSON of project, experiment, parameters and device kind, as it always was.
    canonical = json.dumps(
        {"device_kind": "h100", "experiment": "gemm", "parameters": {"batch": 32}, "project": "p"},
        separators=(",", ":"),
    )
    plain = fingerprint("p", "gemm", {"batch": 32}, "h100")
    assert plain == hashlib.sha256(canonical.encode()).hexdigest()
    assert fingerprint("p", "gemm", {"batch": 32}, "h100", None) == plain
    one = fingerprint("p", "gemm", {"batch": 32}, "h100", "a" * 40 + ".." + "b" * 40)
    other = fingerprint("p", "gemm", {"batch": 32}, "h100", "a" * 40 + ".." + "c" * 40)
    assert len({plain, one, other}) == 3


def test_content_hash_normalises_whitespace_only() -> None:
    assert content_hash(None, "lesson", "a  b\n c ") == content_hash(None, "lesson", "a b c")
    assert content_hash(None, "lesson", "a b") != content_hash("p-x", "lesson", "a b")
    assert content_hash(None, "lesson", "a b") != content_hash(None, "policy", "a b")
    assert content_hash(None, "lesson", "A b") != content_hash(None, "lesson", "a b")


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("Pin the clocks.", "en"),
        ("GPU 클럭을 고정한다", "ko"),
        ("12345 +", "und"),
        ("Ünïcødé", "und"),
    ],
)
def test_language_guess(text: str, language: str) -> None:
    assert detect_language(text) == language


def test_unverified_source_means_unverified_publication() -> None:
    finding = FindingCreate(kind="lesson", statement="x")
    assert (finding.source_status, finding.publication_status) == ("unverified", "unverified")
    verified = FindingCreate(kind="lesson", statement="x", source_status="verified", source="doi:1")
    assert verified.publication_status == "not_applicable"
    with pytest.raises(ValidationError, match="publication_status"):
        FindingCreate(kind="lesson", statement="x", publication_status="verified")
    with pytest.raises(ValidationError, match="truncated finding stays"):
        FindingCreate(kind="lesson", statement="x…", truncated=True, source_status="verified")


def test_statement_is_kept_as_given_but_not_blank() -> None:
    assert FindingCreate(kind="lesson", statement="  spaced \r\n").statement == "  spaced \r\n"
    with pytest.raises(ValidationError, match="blank"):
        FindingCreate(kind="lesson", statement=" \n ")
    with pytest.raises(ValidationError, match="project"):
        FindingCreate(kind="lesson", statement="x", project="Not A Slug")
