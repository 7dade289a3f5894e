"""A hello-world FastAPI app: the baseline of bench/cycle_overhead.py's trigger latency.

Served the way `autopilot serve` serves ours: uvicorn, one process, `uvicorn.run(app)` with
log level info (access log on). The route takes and returns a small JSON body, and is a plain
`def` (run in the thread pool), as our trigger route is.

    python bench/_hello_app.py --port 8123
"""

from __future__ import annotations

import argparse

from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict

app = FastAPI(title="hello")


class HelloIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    project: str


@app.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@app.post("/hello", status_code=201)
def hello(body: HelloIn) -> dict[str, str]:
    return {"hello": body.project}


def main() -> None:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")


if __name__ == "__main__":
    main()
