"""/api/v1/health and /metrics (Prometheus) for the operator: not operations of the table (whoami, doctor,
cluster, audit, fsck and gc are: http/derived.py makes their routes)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from ..errors import Forbidden
from .gate import current_engine
from ..tenancy import TenantView
from .plumbing import Plumbing


def admin_router(p: Plumbing) -> APIRouter:
    router, engine, ops, call = APIRouter(), p.engine, p.ops, p.call

    @router.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus text format: runs, queue depth, run latency, store size. The counters are the
        whole server's (every tenant's runs): for the operator, or a token with the admin scope."""
        if isinstance(current_engine(), TenantView):
            raise Forbidden("metrics count every tenant's runs: they need a token with the admin scope",
                            scope="admin")
        images = await call(engine.images)
        with ops.lock:
            counts = dict(ops.counts)
            buckets, hist, total = list(ops.latency_buckets), list(ops.latency), ops.latency_sum
        lines = ["# TYPE sandtree_runs_started_total counter",
                 f"sandtree_runs_started_total {counts.get('submitted', 0)}",
                 "# TYPE sandtree_runs_finished_total counter"]
        for status in ("done", "failed", "cancelled"):
            lines.append(f'sandtree_runs_finished_total{{status="{status}"}} {counts.get(status, 0)}')
        lines += ["# TYPE sandtree_queue_depth gauge", f"sandtree_queue_depth {ops.queue_depth()}",
                  "# TYPE sandtree_run_seconds histogram"]
        acc = 0
        for b, n in zip(buckets + ["+Inf"], hist, strict=True):
            acc += n
            lines.append(f'sandtree_run_seconds_bucket{{le="{b}"}} {acc}')
        lines += [f"sandtree_run_seconds_sum {total:.6f}", f"sandtree_run_seconds_count {acc}",
                  "# TYPE sandtree_images gauge", f"sandtree_images {len(images)}",
                  "# TYPE sandtree_images_bytes gauge", f"sandtree_images_bytes {sum(i['size'] for i in images)}"]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    @router.get("/api/v1/health")
    async def health() -> dict:
        return {"ok": True, "tiers": [t["tier"] for t in engine.doctor() if t["available"]]}

    return router
