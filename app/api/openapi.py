"""The OpenAPI document says what the API really answers: errors are `application/problem+json`.

FastAPI documents only the success code and a 422 as `application/json` with its own
`HTTPValidationError` body, while every error here is an RFC 9457 problem (app/api/problems.py)
and authentication, lookups, conflicts, limits and an unreachable store add their codes. A
client generated from the document, or a schema-driven fuzzer, would otherwise reject real
answers. This adds a `Problem` schema, the error responses and the bearer scheme.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from app.api.problems import PROBLEM_JSON

API_PREFIX = "/api/"

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "An RFC 9457 problem detail.",
    "type": "object",
    "required": ["type", "title", "status"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "instance": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
        "checks": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

ERRORS = {
    "400": "Malformed request",
    "401": "Missing, unknown or revoked bearer token",
    "403": "The token lacks the scope this action needs",
    "404": "No such resource",
    "409": "Conflicts with the resource's current state",
    "413": "Request body too large",
    "422": "Invalid input",
    "429": "Too many live cycles for the project",
    "503": "A store is unreachable; retry after the Retry-After delay",
}
# Which errors each kind of operation can answer, besides its success.
ALWAYS = ("401", "403", "404", "422", "503")
WITH_BODY = ("400", "409", "413", "429")


def operation_id(route: APIRoute) -> str:
    """`listCycles`, not `list_cycles_api_v1_cycles_get`: what a generated client calls it (the
    route functions' names are unique)."""
    first, *rest = route.name.split("_")
    return first + "".join(word.capitalize() for word in rest)


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}},
    }


def add_problems(spec: dict[str, Any]) -> dict[str, Any]:
    """Document the error responses, the `Problem` schema and the bearer scheme in `spec`."""
    components = spec.setdefault("components", {})
    components.setdefault("schemas", {})["Problem"] = PROBLEM_SCHEMA
    components.setdefault("securitySchemes", {})["bearer"] = {"type": "http", "scheme": "bearer"}
    for path, item in spec.get("paths", {}).items():
        for method, operation in item.items():
            responses = operation.setdefault("responses", {})
            if path == "/readyz":
                responses["503"] = _problem("Not ready: a store or the broker is unreachable")
            if not path.startswith(API_PREFIX):
                continue
            operation["security"] = [{"bearer": []}]
            codes = ALWAYS + (WITH_BODY if method in ("post", "put", "patch", "delete") else ())
            for code in codes:
                responses[code] = _problem(ERRORS[code])  # replaces FastAPI's own 422
    schemas = components["schemas"]
    for unused in ("HTTPValidationError", "ValidationError"):
        if not _referenced(spec, unused):
            schemas.pop(unused, None)
    return spec


def _referenced(spec: dict[str, Any], name: str) -> bool:
    return f'"#/components/schemas/{name}"' in json.dumps(spec)


def install(app: FastAPI) -> None:
    generate = app.openapi  # FastAPI's own: builds the document once and caches it

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        return add_problems(generate())

    app.openapi = openapi  # type: ignore[method-assign]
