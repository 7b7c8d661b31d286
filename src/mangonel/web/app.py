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
    POST /api/login                 user and password (or a token): a token, also as cookie
    POST /api/logout                forget the cookie
    GET  /api/session               who the caller is; whether a login is needed; TLS or not
    GET  /metrics                   Prometheus text format

The pages are static HTML and JavaScript that read only the REST API, polling
it while a job runs.

On a scheduler with users (an ``Authenticator`` that is ``required``), every
``/api`` document and ``/metrics`` wants a token: ``Authorization: Bearer
<token>`` (scripts, Prometheus' ``authorization`` setting) or the cookie
``mangonel_token`` that ``/api/login`` sets (the browser: HttpOnly, so page
scripts never see it; SameSite=Strict, so another site cannot make the browser
send it; Secure under TLS). Missing or bad: 401, and the refusal is logged.
Users see and cancel their own jobs, admins all (403 otherwise). The pages
themselves hold no data: they ask for a login when the API says 401, and show
"insecure" in their header when the scheduler serves without TLS.
"""

from __future__ import annotations

import logging
import time
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from mangonel.errors import (
    AuthenticationError,
    LoginThrottledError,
    MangonelError,
    PermissionDeniedError,
    plain_text,
)
from mangonel.ids import JobId
from mangonel.plan.explain import render
from mangonel.scheduler import doors
from mangonel.scheduler.core import JobNotFoundError, SchedulerCore
from mangonel.scheduler.jobs import JobWatch
from mangonel.security import tokens
from mangonel.security.auth import (
    ANONYMOUS,
    AUTHORIZATION,
    OPEN,
    Authenticator,
    Principal,
    bearer_token,
)
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
    LoginModel,
    LoginRequest,
    SessionModel,
)

log = logging.getLogger(__name__)

TOKEN_COOKIE = "mangonel_token"
"""The cookie the browser keeps its token in (set by ``POST /api/login``)."""

NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorModel, "description": "no such job"}
}
BAD_QUERY: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorModel, "description": "the query cannot be planned"}
}
SVG: dict[int | str, dict[str, Any]] = {200: {"content": {"image/svg+xml": {}}}}
REFUSED: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorModel, "description": "no token, or a malformed, forged or expired one"},
    403: {"model": ErrorModel, "description": "another user's job, or an admin's action"},
}


def static_dir() -> str:
    return str(resources.files("mangonel.web") / "static")


def _token_of(request: Request) -> str | None:
    """The request's token: the ``Authorization: Bearer`` header, else the cookie."""
    return bearer_token(request.headers.get(AUTHORIZATION)) or (
        request.cookies.get(TOKEN_COOKIE) or None
    )


def _refuse(request: Request, status: int, message: str) -> HTTPException:
    client = request.client.host if request.client else "?"
    log.warning("refused %s %s from %s: %s", request.method, request.url.path, client, message)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return HTTPException(status_code=status, detail=plain_text(message), headers=headers)


def caller(request: Request) -> Principal:
    """Who sends the request (a FastAPI dependency): 401 without a valid token."""
    authenticator: Authenticator = request.app.state.authenticator
    token = _token_of(request)
    if token is None:
        if not authenticator.required:
            return ANONYMOUS
        raise _refuse(
            request,
            401,
            "this scheduler lets only known users in: log in (POST /api/login) or send "
            "Authorization: Bearer <token> (`mangonel users token` makes one)",
        )
    try:
        return authenticator.verify(token)
    except AuthenticationError as exc:
        raise _refuse(request, 401, str(exc)) from None


Caller = Annotated[Principal, Depends(caller)]
"""The principal of a request, for the routes that want one."""


def create_app(
    core: SchedulerCore,
    scheduler_address: str = "",
    authenticator: Authenticator = OPEN,
    tls: bool = False,
) -> FastAPI:
    """The ASGI app over one scheduler core.

    Args:
        core: The scheduler.
        scheduler_address: Its gRPC address, shown on the pages.
        authenticator: Checks tokens (``OPEN``: no login, everyone is admin).
        tls: Whether the scheduler serves with TLS (its cookie is then Secure);
            without, the pages say "insecure".
    """
    app = FastAPI(
        title="mangonel scheduler",
        description="Executors, jobs, stages and task attempts of one mangonel scheduler.",
        version="1",
        openapi_url="/api/openapi.json",
        docs_url=None,  # Swagger UI would load its scripts from a CDN
        redoc_url=None,
    )
    app.state.authenticator = authenticator
    registry = make_registry(core)
    static = static_dir()
    app.mount("/static", StaticFiles(directory=static), name="static")

    def record(job_id: str, who: Principal, request: Request) -> JobWatch:
        try:
            return doors.job_of(core, who, job_id)
        except JobNotFoundError as exc:
            raise HTTPException(status_code=404, detail=plain_text(str(exc))) from None
        except PermissionDeniedError as exc:
            raise _refuse(request, 403, str(exc)) from None

    @app.get("/", include_in_schema=False)
    def cluster_page() -> FileResponse:
        return FileResponse(f"{static}/cluster.html")

    @app.get("/jobs/{job_id}", include_in_schema=False)
    def job_page(job_id: str) -> FileResponse:
        return FileResponse(f"{static}/job.html")

    @app.post("/api/login", tags=["session"], responses=REFUSED)
    def login(body: LoginRequest, request: Request) -> JSONResponse:
        """Log in with a user name and password (or check a token): the token, also
        set as the HttpOnly cookie ``mangonel_token`` the pages then send."""
        try:
            address = request.client.host if request.client else ""
            token = body.token.strip() or authenticator.login(body.user, body.password, address)
            who = authenticator.verify(token) if token else ANONYMOUS
        except LoginThrottledError as exc:
            raise _refuse(request, 429, str(exc)) from None
        except AuthenticationError as exc:
            raise _refuse(request, 401, str(exc)) from None
        expires = tokens.expires_at(token) if token else None
        model = LoginModel(token=token, user=who.user, admin=who.admin, expires_at=expires or 0.0)
        response = JSONResponse(model.model_dump())
        if token:
            response.set_cookie(
                TOKEN_COOKIE,
                token,
                max_age=max(1, int(expires - time.time())) if expires else None,
                httponly=True,
                samesite="strict",
                secure=tls,
                path="/",
            )
        log.info("user %r logged in to the web UI", who.user)
        return response

    @app.post("/api/logout", tags=["session"])
    def logout() -> Response:
        """Forget the browser's token cookie."""
        response = Response(status_code=204)
        response.delete_cookie(TOKEN_COOKIE, path="/", httponly=True, samesite="strict")
        return response

    @app.get("/api/session", tags=["session"])
    def session(request: Request) -> SessionModel:
        """Who the caller is (never 401: the pages ask it whether to show a login)."""
        who: Principal | None = ANONYMOUS
        problem = ""
        token = _token_of(request)
        if token is not None:
            try:
                who = authenticator.verify(token)
            except AuthenticationError as exc:
                who, problem = None, str(exc)
        elif authenticator.required:
            who = None
        return SessionModel(
            authenticated=who is not None,
            user=who.user if who is not None else "",
            admin=who.admin if who is not None else False,
            login_required=authenticator.required,
            tls=tls,
            problem=problem,
        )

    @app.get("/api/cluster", tags=["cluster"], responses=REFUSED)
    def get_cluster(who: Caller) -> ClusterModel:
        """Executors and jobs (those the caller may see) by state, slots and running tasks."""
        return views.cluster(core, scheduler_address, who)

    @app.get("/api/executors", tags=["cluster"], responses=REFUSED)
    def get_executors(who: Caller) -> list[ExecutorModel]:
        """Every executor: alive and draining first, then lost ones (newest first); an
        admin sees their hosts' particulars (host names, pids, why lost or unhealthy)."""
        return views.executors(core, who)

    @app.get("/api/jobs", tags=["jobs"], responses=REFUSED)
    def get_jobs(who: Caller) -> list[JobSummary]:
        """Every job the scheduler still lists that the caller may see, newest first."""
        return views.jobs(core, who)

    @app.get("/api/jobs/{job_id}", tags=["jobs"], responses={**NOT_FOUND, **REFUSED})
    def get_job(job_id: str, who: Caller, request: Request) -> JobDetail:
        """One job: its stage graph with progress, each stage's SQL, its task attempts."""
        return views.job_detail(core, record(job_id, who, request))

    @app.get(
        "/api/jobs/{job_id}/graph.svg",
        tags=["jobs"],
        responses={**NOT_FOUND, **SVG, **REFUSED},
        response_class=Response,
    )
    def get_job_graph(job_id: str, who: Caller, request: Request) -> Response:
        """The job's stage graph as SVG, with each stage's task progress."""
        detail = views.job_detail(core, record(job_id, who, request))
        return Response(picture.svg(detail.stages), media_type="image/svg+xml")

    @app.post("/api/jobs/{job_id}/cancel", tags=["jobs"], responses={**NOT_FOUND, **REFUSED})
    def cancel_job(job_id: str, who: Caller, request: Request) -> CancelModel:
        """Cancel a running job; ``cancelled`` is false when it had finished already."""
        record(job_id, who, request)
        reason = "cancelled from the web UI" + (
            f" by {who.user}" if who.user != ANONYMOUS.user else ""
        )
        return CancelModel(cancelled=core.cancel(JobId(job_id), reason))

    @app.post(
        "/api/explain",
        tags=["queries"],
        responses={**BAD_QUERY, **REFUSED},
    )
    def explain(request: ExplainRequest, who: Caller) -> ExplainModel:
        """Plan a query without running it: the EXPLAIN text and the stages."""
        try:
            # Through the scheduler's plan cache, as `mangonel explain` and a
            # submission go: each reuses the plan the others made of the same SQL.
            plan = core.plan(request.sql, request.dialect)
        except MangonelError as exc:
            raise HTTPException(status_code=400, detail=plain_text(str(exc))) from None
        return ExplainModel(text=render(plan), stages=views.stage_models(plan))

    @app.get("/metrics", include_in_schema=False)
    def metrics(who: Caller) -> Response:
        return Response(exposition(registry), media_type=CONTENT_TYPE)

    return app
