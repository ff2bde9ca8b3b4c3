"""A long, timestamped service log whose one failure block answers the agent's task (agent family, "log" variant).

Algorithm:
1. Draw a tenant, a job id and an exception for the failure the task asks about, and 3–5 distractor failures of
   other tenants' jobs (other exceptions), each a contiguous block: ERROR line, traceback, exception line,
   scheduler line.
2. Routine events (HTTP access, pool checkouts, syncs, cache pressure, queued jobs, token refreshes; some of them
   for the asked tenant, so the tenant's name alone does not find the answer) are added until the tool output
   reaches the target length, with the blocks at seeded depths.
3. Timestamps are assigned in order after placement (fixed width, so sizing before and after agree); the gold
   is the asked block exactly as rendered, the answer its exception class.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Callable

from pflash_proxy.bench.cases.base import Ctx, messages_text, place
from pflash_proxy.jsontypes import ChatMessage

EXCEPTIONS = [
    ("KeyError", "'billing_address'"),
    ("ValueError", "invalid literal for int() with base 10: 'N/A'"),
    ("ZeroDivisionError", "division by zero"),
    ("PermissionError", "[Errno 13] Permission denied: '/mnt/exports/tmp.csv'"),
    ("UnicodeDecodeError", "'utf-8' codec can't decode byte 0xe9 in position 41: invalid continuation byte"),
    ("TimeoutError", "upstream warehouse did not answer within 30s"),
    ("OverflowError", "date value out of range"),
]
TS = "{ts}"  # placeholder replaced line by line; rendered width is constant
_TS_FMT = "%Y-%m-%dT%H:%M:%S.%f"


@dataclass(frozen=True)
class AgentLog:
    task: str
    path: str
    text: str
    gold: str
    answer: str


def _tenant(ctx: Ctx) -> str:
    return f"{ctx.rng.choice(['acme', 'globex', 'initech', 'umbrella', 'hooli', 'vandelay', 'wonka'])}-" \
           f"{ctx.rng.randint(100, 999)}"


def _failure(ctx: Ctx, tenant: str, exc: tuple[str, str]) -> list[str]:
    job = f"exp-{ctx.rng.randint(10000, 99999)}"
    l1, l2, l3 = (ctx.rng.randint(40, 400) for _ in range(3))
    return [
        f"{TS} ERROR [worker.export] job={job} tenant={tenant} failed after {ctx.rng.randint(1, 5)} retries",
        "Traceback (most recent call last):",
        f'  File "/srv/app/export/runner.py", line {l1}, in run_job',
        "    rows = self.fetch_rows(job)",
        f'  File "/srv/app/export/runner.py", line {l2}, in fetch_rows',
        "    return [self.serialize(r) for r in cursor]",
        f'  File "/srv/app/export/serialize.py", line {l3}, in serialize',
        "    return encode_row(row, schema=self.schema)",
        f"{exc[0]}: {exc[1]}",
        f"{TS} INFO  [scheduler] job={job} tenant={tenant} marked failed; next attempt in 6h",
    ]


def _routine(ctx: Ctx, tenants: list[str]) -> str:
    r = ctx.rng
    t = r.choice(tenants)
    kind = r.randrange(7)
    if kind == 0:
        return (f"{TS} INFO  [http.access] {r.choice(['GET', 'POST', 'PUT'])} /api/v2/"
                f"{r.choice(['orders', 'invoices', 'users', 'reports'])}/{r.randint(1, 99999)} "
                f"{r.choice([200, 200, 200, 201, 204, 304, 404])} {r.randint(2, 900)}ms tenant={t}")
    if kind == 1:
        return f"{TS} DEBUG [db.pool] checkout conn={r.randint(1, 64)} in_use={r.randint(1, 32)}/32"
    if kind == 2:
        return f"{TS} INFO  [worker.sync] tenant={t} synced {r.randint(10, 90000)} rows in {r.uniform(0.1, 40):.2f}s"
    if kind == 3:
        return (f"{TS} WARN  [cache] eviction pressure: {r.randint(100, 20000)} keys dropped from shard "
                f"{r.randrange(16)}")
    if kind == 4:
        return (f"{TS} INFO  [scheduler] queued job=exp-{r.randint(10000, 99999)} kind="
                f"{r.choice(['export', 'sync', 'reindex'])} tenant={t}")
    if kind == 5:
        return f"{TS} INFO  [auth] token refreshed for service={r.choice(['billing', 'search', 'mailer', 'cdn'])}"
    return (f"{TS} INFO  [worker.export] job=exp-{r.randint(10000, 99999)} tenant={t} wrote "
            f"{r.randint(1, 500)} MiB to s3://exports/{t}/")


def agent_log(ctx: Ctx, wrap: Callable[[str, str, str], list[ChatMessage]]) -> AgentLog:
    """`wrap(task, path, tool_output)` builds the messages; it is used to size the log to the target."""
    exc_pool = list(EXCEPTIONS)
    ctx.rng.shuffle(exc_pool)
    tenant = _tenant(ctx)
    others = [t for t in dict.fromkeys(_tenant(ctx) for _ in range(8)) if t != tenant][:5]
    blocks = [_failure(ctx, tenant, exc_pool[0])]
    n_distractors = ctx.rng.randint(3, 5)
    blocks += [_failure(ctx, t, exc_pool[1 + i % (len(exc_pool) - 1)]) for i, t in enumerate(others[:n_distractors])]
    ctx.rng.shuffle(order := list(range(len(blocks))))
    depths = ctx.depths(len(blocks), 0.1, 0.95)
    day = datetime(2026, 3, 14) - timedelta(days=ctx.rng.randrange(300))
    path = f"/var/log/app/worker-{day:%Y-%m-%d}.log"
    task = (f"The nightly export for tenant {tenant} failed. Read the worker log and tell me which exception made "
            "the job fail.")
    width = len(day.strftime(_TS_FMT)[:-3] + "Z")
    routine_tenants = others + [tenant]

    def render(routine: list[str]) -> tuple[str, str]:
        units = place(routine, ["\n".join(blocks[i]) for i in order], depths)
        lines = "\n".join(units).split("\n")
        t, out, gold_at = day, [], None
        for line in lines:
            if TS in line:
                t += timedelta(milliseconds=ctx_ms.pop() if ctx_ms else 250)
                line = line.replace(TS, t.strftime(_TS_FMT)[:-3] + "Z")
            out.append(line)
        text = "\n".join(out)
        first = blocks[0][0].split("] ", 1)[1]
        for k, line in enumerate(out):
            if line.endswith(first):
                gold_at = k
        assert gold_at is not None
        return text, "\n".join(out[gold_at:gold_at + len(blocks[0])])

    ctx_ms: list[int] = []
    dummy = "X" * width
    fixed = ctx.count(messages_text(wrap(task, path, "\n".join(line.replace(TS, dummy) for b in blocks for line in b))))
    routine, used = [], 0
    while used < ctx.target - fixed:
        line = _routine(ctx, routine_tenants)
        cost = ctx.count(line.replace(TS, dummy) + "\n")
        if used + cost > ctx.target - fixed:
            break
        routine.append(line)
        used += cost
    ctx_ms = [ctx.rng.randint(1, 2500) for _ in range(len(routine) + 12 * len(blocks))]
    text, gold = render(routine)
    return AgentLog(task, path, text, gold, exc_pool[0][0])
