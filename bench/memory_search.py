"""Search latency over 100,000 findings: our service layer against the raw FTS5 query.

Builds a SQLite memory store (migrated, FTS5 trigram index kept by the triggers) holding
synthetic findings, 30% in Korean, and times `app.memory.service.search` against the same
MATCH query issued directly to the index, interleaved in one run. Goal: p95 <= 2x the raw
query and <= 50 ms.

    python bench/memory_search.py [--quick] [--json]
"""

from __future__ import annotations

import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from _common import bench_parser, emit, machine, percentile, today
from alembic import command
from sqlalchemy import insert
from sqlalchemy.orm import Session

from app import migrate
from app.db import make_engine
from app.memory import service
from app.memory.models import Finding
from app.memory.search_repository import fts_phrase, query_terms

GOAL_RATIO = 2.0
GOAL_P95_MS = 50.0
PAGE = 20

# Word lists read better as text than as 150 quoted literals.
ENGLISH = (  # noqa: SIM905
    "kernel tile warp shared memory register spill occupancy latency throughput bandwidth "
    "tensor core fused attention softmax matmul gemm pipeline stage prefetch cache allocator "
    "fragmentation batch sequence head dimension quantization calibration scale int8 fp8 bf16 "
    "accuracy perplexity gradient checkpoint optimizer learning rate warmup schedule clock "
    "power thermal throttle variance noise median interleaved paired schedule baseline "
    "regression speedup profile trace launch overhead graph capture stream event barrier "
    "reduction scan sort topk gather scatter layout stride coalesced vectorized autotune "
    "compile cudnn triton driver firmware device host transfer pinned async copy overlap"
).split()
KOREAN = (  # noqa: SIM905
    "커널 타일 워프 공유 메모리 레지스터 점유율 지연 처리량 대역폭 텐서 코어 융합 어텐션 "
    "소프트맥스 행렬곱 파이프라인 단계 캐시 할당자 단편화 배치 시퀀스 양자화 보정 스케일 "
    "정확도 기울기 체크포인트 학습률 워밍업 클럭 전력 발열 분산 잡음 중앙값 기준선 회귀 "
    "속도향상 프로파일 실행 오버헤드 그래프 스트림 이벤트 장벽 축소 정렬 수집 배치도 "
    "컴파일 드라이버 장치 호스트 전송 비동기 복사 중첩 측정값 결과를 비교하지 고정하지"
).split()
PROJECTS = ("attention-kernel-lab", "quant-serving", "spectral-operator-compiler", None)
KINDS = ("lesson", "verdict", "bound", "policy")
STATUSES = ("proposed", "validated", "refuted", "superseded")
DEVICES = ("h100", "a100", "l4", None)


def zipf_words(rng: random.Random, vocabulary: list[str], n: int) -> list[str]:
    # A skewed choice: a few words are common, most are rare, as in real notes.
    weights = [1.0 / (rank + 1) for rank in range(len(vocabulary))]
    return rng.choices(vocabulary, weights=weights, k=n)


def synthetic_rows(count: int, seed: int = 5) -> list[dict[str, object]]:
    rng = random.Random(seed)
    start = datetime(2026, 1, 1, tzinfo=UTC)
    rows = []
    for i in range(count):
        korean = rng.random() < 0.3
        words = zipf_words(rng, KOREAN if korean else ENGLISH, rng.randint(10, 28))
        statement = " ".join(words) + f" (#{i})."
        project = rng.choice(PROJECTS)
        kind = rng.choice(KINDS)
        rows.append(
            {
                "id": uuid.uuid4().hex,
                "project": project,
                "kind": kind,
                "statement": statement,
                "language": "ko" if korean else "en",
                "content_hash": service.content_hash(project, kind, statement),
                "scope": {},
                "metrics": {},
                "status": rng.choice(STATUSES),
                "source_status": "unverified",
                "publication_status": "unverified",
                "truncated": False,
                "tags": [],
                "device_kind": rng.choice(DEVICES),
                "created_at": start + timedelta(seconds=i),
            }
        )
    return rows


def queries(rng: random.Random, n: int) -> list[str]:
    """Single words (common and rare), two-word queries, English and Korean (3+ characters)."""
    english = [w for w in ENGLISH if len(w) >= 3]
    korean = [w for w in KOREAN if len(w) >= 3]
    picked = []
    for i in range(n):
        pool = korean if i % 3 == 0 else english
        if i % 4 == 3:
            picked.append(" ".join(rng.sample(pool, 2)))
        else:
            picked.append(rng.choice(pool))
    return picked


def run(count: int, n_queries: int, repeats: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-memory-"))
    url = f"sqlite:///{workdir / 'memory.db'}"
    command.upgrade(migrate.alembic_config("memory", url), "head")
    engine = make_engine(url)
    started = time.perf_counter()
    rows = synthetic_rows(count)
    with Session(engine) as session, session.begin():
        for chunk in range(0, len(rows), 5000):
            session.execute(insert(Finding), rows[chunk : chunk + 5000])
    load_s = time.perf_counter() - started

    rng = random.Random(7)
    workload = queries(rng, n_queries)
    ours: list[float] = []
    raw: list[float] = []
    hits: list[int] = []
    raw_sql = "SELECT finding_id FROM finding_fts WHERE finding_fts MATCH ? ORDER BY rank LIMIT ?"
    with Session(engine) as session:
        connection = session.connection()
        for query in workload:  # warm the page cache once per query
            service.search(session, query, limit=PAGE)
        for _ in range(repeats):
            for query in workload:
                match = " ".join(fts_phrase(t) for t in query_terms(query))
                order = [0, 1] if rng.random() < 0.5 else [1, 0]  # interleaved, random order
                for which in order:
                    t0 = time.perf_counter()
                    if which == 0:
                        page = service.search(session, query, limit=PAGE)
                        ours.append(time.perf_counter() - t0)
                        hits.append(len(page.items))
                    else:
                        connection.exec_driver_sql(raw_sql, (match, PAGE)).all()
                        raw.append(time.perf_counter() - t0)
        # How much of the store each query matches: the raw query's cost grows with it.
        shares = [
            connection.exec_driver_sql(
                "SELECT count(*) FROM finding_fts WHERE finding_fts MATCH ?",
                (" ".join(fts_phrase(t) for t in query_terms(query)),),
            ).scalar_one()
            / count
            for query in workload
        ]
        # With a filter the service must join every match; reported, not part of the goal.
        filtered = []
        for query in workload:
            t0 = time.perf_counter()
            service.search(session, query, project="quant-serving", limit=PAGE)
            filtered.append(time.perf_counter() - t0)
    engine.dispose()

    p50, p95 = percentile(ours, 0.5) * 1000, percentile(ours, 0.95) * 1000
    raw50, raw95 = percentile(raw, 0.5) * 1000, percentile(raw, 0.95) * 1000
    ratio = p95 / raw95 if raw95 else float("inf")
    return {
        "benchmark": "memory_search",
        "findings": count,
        "queries": len(ours),
        "korean_share": 0.3,
        "mean_hits_per_page": round(statistics.mean(hits), 1),
        "match_share": {
            "median": round(statistics.median(shares), 3),
            "max": round(max(shares), 3),
        },
        "load_s": round(load_s, 2),
        "p50_ms": round(p50, 3),
        "p95_ms": round(p95, 3),
        "baseline": {
            "what": "raw FTS5 MATCH ... ORDER BY rank LIMIT 20",
            "p50_ms": round(raw50, 3),
            "p95_ms": round(raw95, 3),
        },
        "ratio": round(ratio, 3),
        "filtered_project": {
            "p50_ms": round(percentile(filtered, 0.5) * 1000, 3),
            "p95_ms": round(percentile(filtered, 0.95) * 1000, 3),
        },
        "goal": {
            "ratio_max": GOAL_RATIO,
            "p95_ms_max": GOAL_P95_MS,
            "met": ratio <= GOAL_RATIO and p95 <= GOAL_P95_MS,
        },
        "machine": machine("cpu", "python", sqlite=sqlite3.sqlite_version),
        "date": today(),
    }


def print_text(result: dict[str, Any]) -> None:
    base = result["baseline"]
    print(
        f"{result['findings']} findings, {result['queries']} searches: service p50 "
        f"{result['p50_ms']} ms, p95 {result['p95_ms']} ms; raw FTS p50 {base['p50_ms']} ms, "
        f"p95 {base['p95_ms']} ms; ratio {result['ratio']} (goal <= {GOAL_RATIO} and p95 <= "
        f"{GOAL_P95_MS} ms: {'met' if result['goal']['met'] else 'NOT met'})"
    )


def main() -> None:
    args = bench_parser(__doc__, quick="10,000 findings, fewer queries").parse_args()
    result = run(10_000, 30, 3) if args.quick else run(100_000, 60, 10)
    emit(result, args.json, indent=2, text=print_text)


if __name__ == "__main__":
    main()
