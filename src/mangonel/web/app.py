"""The scheduler's web app: the UI's pages, the REST API under ``/api``, ``/metrics``.

::

    GET  /                          cluster page: executors (alive, draining, lost), jobs
    GET  /jobs/{id}                 job page: stage graph, stages, task attempts, cancel
    GET  /api/openapi.json          the OpenAPI description of everything under /api
    GET  /api/cluster               counts: executors and jobs by state, slots, tasks
    GET  /api/executors             every executor, lost ones included (bounded history)
    GET  /api/jobs                  every job, newest first
    GET  /api/jobs/{id}             one job: stages (graph, SQL, progress) and attempts
    GET  /api/jobs/{id}/graph.svg   the job's stage graph with its progress
    POST /api/jobs/{id}/cancel      cancel a running job
    POST /api/explain               a query's plan: text and stages (not run)
    GET  /metrics                   Prometheus text format

The pages are static HTML and JavaScript that read only the REST API, polling
it while a job runs.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import FileResponse, Response
from fastapi.staticfiles import StaticFiles

from mangonel.errors import MangonelError
from mangonel.ids import JobId
from mangonel.plan.explain import render
from mangonel.scheduler.core import JobNotFoundError, SchedulerCore
from mangonel.scheduler.jobs import JobRecord
from mangonel.web import picture, views
from mangonel.web.metrics import CONTENT_TYPE, exposition, make_registry
from mangonel.web.models import (
    CancelModel,
    ClusterModel,
    ErrorModel,
    ExecutorModel,
    ExplainModel,
    ExplainRequest,
    JobDetail,
    JobSummary,
)

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorModel, "description": "no such job"}
}
BAD_QUERY: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorModel, "description": "the query cannot be planned"}
}
SVG: dict[int | str, dict[str, Any]] = {200: {"content": {"image/svg+xml": {}}}}


def static_dir() -> str:
    return str(resources.files("mangonel.web") / "static")


def create_app(core: SchedulerCore, scheduler_address: str = "") -> FastAPI:
    """The ASGI app over one scheduler core."""
    app = FastAPI(
        title="mangonel scheduler",
        description="Executors, jobs, stages and task attempts of one mangonel scheduler.",
        version="1",
        openapi_url="/api/openapi.json",
        docs_url=None,  # Swagger UI would load its scripts from a CDN
        redoc_url=None,
    )
    registry = make_registry(core)
    static = static_dir()
    app.mount("/static", StaticFiles(directory=static), name="static")

    def record(job_id: str) -> JobRecord:
        try:
            return core.job(JobId(job_id))
        except JobNotFoundError as exc:
            raise HTTPException(status_code=404, detail=str(exc)) from None

    @app.get("/", include_in_schema=False)
    def cluster_page() -> FileResponse:
        return FileResponse(f"{static}/cluster.html")

    @app.get("/jobs/{job_id}", include_in_schema=False)
    def job_page(job_id: str) -> FileResponse:
        return FileResponse(f"{static}/job.html")

    @app.get("/api/cluster", tags=["cluster"])
    def get_cluster() -> ClusterModel:
        """Executors and jobs by state, slots and running tasks."""
        return views.cluster(core, scheduler_address)

    @app.get("/api/executors", tags=["cluster"])
    def get_executors() -> list[ExecutorModel]:
        """Every executor: alive and draining first, then lost ones (newest first)."""
        return views.executors(core)

    @app.get("/api/jobs", tags=["jobs"])
    def get_jobs() -> list[JobSummary]:
        """Every job the scheduler still lists, newest first."""
        return views.jobs(core)

    @app.get("/api/jobs/{job_id}", tags=["jobs"], responses=NOT_FOUND)
    def get_job(job_id: str) -> JobDetail:
        """One job: its stage graph with progress, each stage's SQL, its task attempts."""
        return views.job_detail(core, record(job_id))

    @app.get(
        "/api/jobs/{job_id}/graph.svg",
        tags=["jobs"],
        responses={**NOT_FOUND, **SVG},
        response_class=Response,
    )
    def get_job_graph(job_id: str) -> Response:
        """The job's stage graph as SVG, with each stage's task progress."""
        detail = views.job_detail(core, record(job_id))
        return Response(picture.svg(detail.stages), media_type="image/svg+xml")

    @app.post("/api/jobs/{job_id}/cancel", tags=["jobs"], responses=NOT_FOUND)
    def cancel_job(job_id: str) -> CancelModel:
        """Cancel a running job; ``cancelled`` is false when it had finished already."""
        record(job_id)
        return CancelModel(cancelled=core.cancel(JobId(job_id), "cancelled from the web UI"))

    @app.post(
        "/api/explain",
        tags=["queries"],
        responses=BAD_QUERY,
    )
    def explain(request: ExplainRequest) -> ExplainModel:
        """Plan a query without running it: the EXPLAIN text and the stages."""
        try:
            # Through the scheduler's plan cache, as `mangonel explain` and a
            # submission go: each reuses the plan the others made of the same SQL.
            plan = core.plan(request.sql, request.dialect)
        except MangonelError as exc:
            raise HTTPException(status_code=400, detail=str(exc)) from None
        return ExplainModel(text=render(plan), stages=views.stage_models(plan))

    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(exposition(registry), media_type=CONTENT_TYPE)

    return app
