"""Research memory over REST: record, judge, search, import and export; bad input as problems."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from app.memory.exchange import MAX_IMPORT_BYTES
from tests.support import bearer

API = "/api/v1/memory"


def upload(client: TestClient, token: str, data: bytes, **form: str):  # type: ignore[no-untyped-def]
    return client.post(
        f"{API}/import", files={"file": ("lessons.txt", data)}, data=form, headers=bearer(token)
    )


def assert_problem(response, status: int, *needles: str) -> dict:  # type: ignore[no-untyped-def, type-arg]
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    for needle in needles:
        assert needle in problem["detail"], problem
    return problem  # type: ignore[no-any-return]


def test_record_validate_refute_supersede(client: TestClient, tokens: dict[str, str]) -> None:
    body = {
        "kind": "bound",
        "project": "kernel-lab",
        "statement": "Stages ≤ 3 on h100.  ",
        "device_kind": "h100",
        "evidence": {"cycle_id": "7", "commit": "abc"},
    }
    # Provenance is the admin's (or an import's) to state (issue 20, item 7).
    claimed = client.post(f"{API}/findings", json=body, headers=bearer(tokens["trigger"]))
    assert_problem(claimed, 403, "provenance: evidence", "t-trigger")
    verified = {**body, "evidence": {}, "source_status": "verified"}
    claimed = client.post(f"{API}/findings", json=verified, headers=bearer(tokens["trigger"]))
    assert_problem(claimed, 403, "provenance: publication_status, source_status")
    plain = {k: v for k, v in body.items() if k != "evidence"}
    created = client.post(f"{API}/findings", json=plain, headers=bearer(tokens["trigger"]))
    assert created.status_code == 201, created.text
    finding = created.json()
    assert (finding["status"], finding["statement"]) == ("proposed", "Stages ≤ 3 on h100.  ")
    assert (finding["source_status"], finding["publication_status"]) == ("unverified", "unverified")
    assert finding["source"] == "api token t-trigger"
    fid = finding["id"]

    again = client.post(f"{API}/findings", json=body, headers=bearer(tokens["admin"]))
    assert assert_problem(again, 409, fid)["finding_id"] == fid

    review = bearer(tokens["review"])
    ok = client.post(
        f"{API}/findings/{fid}/validate", json={"reason": "seen twice"}, headers=review
    )
    assert (ok.status_code, ok.json()["validated_by"]) == (200, "t-review")
    refuse = client.post(f"{API}/findings/{fid}/refute", json={"reason": "no"}, headers=review)
    problem = assert_problem(refuse, 409, "validated", "superseded")
    assert problem["type"].endswith("/illegal-finding-move")
    assert (problem["from_state"], problem["to_state"]) == ("validated", "refuted")

    replaced = client.post(
        f"{API}/findings/{fid}/supersede",
        json={
            "finding": {"kind": "bound", "project": "kernel-lab", "statement": "Stages ≤ 4."},
            "reason": "new driver",
        },
        headers=review,
    )
    assert replaced.status_code == 201, replaced.text
    assert (replaced.json()["status"], replaced.json()["supersedes"]) == ("validated", fid)

    shown = client.get(f"{API}/findings/{fid}", headers=bearer(tokens["trigger"])).json()
    assert shown["status"] == "superseded"
    assert shown["superseded_by"] == [replaced.json()["id"]]
    assert [(e["to_status"], e["actor"]) for e in shown["events"]] == [
        ("proposed", "t-trigger"),
        ("validated", "t-review"),
        ("superseded", "t-review"),
    ]


def test_refute_needs_a_reason_and_unknown_ids_are_404(
    client: TestClient, tokens: dict[str, str]
) -> None:
    made = client.post(
        f"{API}/findings",
        json={"kind": "lesson", "statement": "x"},
        headers=bearer(tokens["trigger"]),
    ).json()
    review = bearer(tokens["review"])
    problem = assert_problem(
        client.post(f"{API}/findings/{made['id']}/refute", json={}, headers=review), 422
    )
    assert problem["errors"][0]["field"] == "reason"
    blank = client.post(f"{API}/findings/{made['id']}/refute", json={"reason": " "}, headers=review)
    assert_problem(blank, 422, "reason")
    missing = client.get(f"{API}/findings/nope", headers=review)
    assert assert_problem(missing, 404, "nope")["type"].endswith("/finding-not-found")
    bad = client.post(
        f"{API}/findings",
        json={"kind": "rumour", "statement": "x"},
        headers=bearer(tokens["trigger"]),
    )
    assert assert_problem(bad, 422)["errors"][0]["field"] == "kind"


def test_import_search_and_export(
    client: TestClient, tokens: dict[str, str], sample_bytes: bytes
) -> None:
    report = upload(client, tokens["admin"], sample_bytes)
    assert report.status_code == 200, report.text
    assert report.json() == {
        "format": "property-export",
        "imported": 10,
        "duplicates": 0,
        "by_project": {"attention-kernel-lab": 3, "null": 4, "quant-serving": 3},
        "truncated": 1,
    }
    assert upload(client, tokens["admin"], sample_bytes).json()["duplicates"] == 10

    reader = bearer(tokens["trigger"])
    korean = client.get(f"{API}/findings", params={"q": "클럭"}, headers=reader).json()
    assert [f["language"] for f in korean["items"]] == ["ko"]
    page = client.get(
        f"{API}/findings", params={"project": "quant-serving", "limit": 2}, headers=reader
    ).json()
    assert (len(page["items"]), page["next_offset"]) == (2, 2)
    assert client.get(f"{API}/findings", params={"limit": 0}, headers=reader).status_code == 422

    # the whole store, unreviewed findings included: a review (or admin) token's to take
    assert client.get(f"{API}/export", headers=reader).status_code == 403
    reader = bearer(tokens["review"])
    jsonl = client.get(f"{API}/export", params={"format": "jsonl"}, headers=reader)
    assert jsonl.headers["content-type"].startswith("application/x-ndjson")
    assert len([json.loads(line) for line in jsonl.text.splitlines()]) == 10
    markdown = client.get(f"{API}/export", params={"format": "markdown"}, headers=reader)
    assert markdown.text.startswith("# Research memory") and "truncated" in markdown.text
    assert client.get(f"{API}/export", params={"format": "pdf"}, headers=reader).status_code == 422
    assert upload(client, tokens["admin"], jsonl.content, format="jsonl").json()["duplicates"] == 10


@pytest.mark.parametrize(
    ("data", "form", "status", "needle"),
    [
        (b"", {}, 422, "empty"),
        (b"GIF89a\x00\x01\x02", {}, 422, "binary"),
        (b"Property:x\nabout\n\xc3\x28 value", {}, 422, "line 3: not valid UTF-8"),
        (b"<html>not ours</html>", {}, 422, "cannot tell the format"),
        (b'{"kind": "lesson", "statement": "x", "status": "approved"}', {}, 422, "line 1: status"),
        (
            b"# Research memory\n\n### lesson\n\n- **proposed** \xc2\xb7 unverified\n",
            {},
            422,
            "line 5: the finding has no",
        ),
    ],
)
def test_bad_uploads_are_named_and_store_nothing(
    client: TestClient,
    tokens: dict[str, str],
    data: bytes,
    form: dict[str, str],
    status: int,
    needle: str,
) -> None:
    assert_problem(upload(client, tokens["admin"], data, **form), status, needle)
    listed = client.get(f"{API}/findings", headers=bearer(tokens["admin"])).json()
    assert listed["items"] == []


def test_upload_over_50_mb_is_refused(client: TestClient, tokens: dict[str, str]) -> None:
    line = b'{"kind": "lesson", "statement": "' + b"x" * 1000 + b'"}\n'
    data = line * (MAX_IMPORT_BYTES // len(line) + 1)
    assert_problem(upload(client, tokens["admin"], data), 413, "50 MB")
    with_format = upload(client, tokens["admin"], b"x", format="yaml")
    assert assert_problem(with_format, 422)["errors"][0]["field"] == "format"
