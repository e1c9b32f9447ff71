"""The FastAPI application: JSON API, dashboard, `/metrics`, and the service's lifespan.

`create_app(config)` builds one app around one `ReplagService`; the lifespan
starts the service's schedulers and stops them on shutdown (uvicorn turns
SIGTERM/SIGINT into that shutdown). Errors become JSON with a message and a
4xx status (502 when an endpoint failed, 503 with Retry-After when the answer can only
come from the store and it is away): a bad
query never produces a 500.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources

from fastapi import Depends, FastAPI, Request
from fastapi.exception_handlers import (
    http_exception_handler,
    request_validation_exception_handler,
)
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from replag import __version__
from replag.api import auth, dynomite, lag, matrix, replication, routes
from replag.config import Config
from replag.errors import EndpointError, JobConflict, NotFound, ReplagError, StoreError
from replag.request_bodies import BodyLimits, BoundedBodies, Refusal, Scope, bearer
from replag.service import ReplagService
from replag.service.reload import ConfigReloader
from replag.store import Store
from replag.tokens import ApiToken

log = logging.getLogger(__name__)
STATIC = resources.files("replag.api") / "static"
# Swagger UI and ReDoc, as the fastapi-offline wheel ships them.
DOCS_ASSETS = resources.files("fastapi_offline") / "static"
REDOC_CDN_LOGO = b"https://cdn.redoc.ly/redoc/logo-mini.svg"
# Retry-After of a 503 answered while the store is away (it is tried again every second).
STORE_RETRY_AFTER_S = 5


def create_app(
    config: Config,
    *,
    store: Store | None = None,
    run_schedulers: bool = True,
    service: ReplagService | None = None,
    external_url: str = "",
    freeze_heap: bool = False,
) -> FastAPI:
    """The app; with `run_schedulers=False` it only serves what the store already holds."""
    svc = service or ReplagService(
        config, store=store, external_url=external_url, freeze_heap=freeze_heap
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        reloader = None
        if run_schedulers:
            await svc.start()
            if svc.config.path is not None:  # SIGHUP or a change of the file reloads it
                reloader = ConfigReloader(svc, svc.config.path)
                reloader.start()
        app.state.ready = True
        try:
            yield
        finally:
            app.state.ready = False  # stopping: a load balancer sends nothing more here
            if reloader is not None:
                await reloader.stop()
            await svc.stop()

    app = FastAPI(
        title="replag",
        version=__version__,
        lifespan=lifespan,
        description="Replication lag, divergence checks and alerts for Redis across regions.",
        # Served below, as reads (open unless settings.api_reads is token), the pages
        # from files installed with the package: no CDN, works offline.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.service = svc
    app.state.ready = False
    # Reads are open unless settings.api_reads says token (the dashboard then needs one).
    readers = [Depends(auth.reader)]
    app.include_router(routes.router, dependencies=readers)
    app.include_router(lag.router, dependencies=readers)
    app.include_router(matrix.router, dependencies=readers)
    app.include_router(dynomite.router, dependencies=readers)
    app.include_router(replication.router, dependencies=readers)

    @app.get("/static/docs/redoc.standalone.js", include_in_schema=False)
    def redoc_js() -> Response:
        # Ahead of the mount below, which would serve the file as shipped.
        return Response(offline_redoc_js(), media_type="application/javascript")

    app.mount("/static/docs", StaticFiles(directory=str(DOCS_ASSETS)), name="docs-assets")
    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")

    @app.get("/openapi.json", include_in_schema=False, dependencies=readers)
    def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=readers)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="replag API",
            swagger_js_url="/static/docs/swagger-ui-bundle.js",
            swagger_css_url="/static/docs/swagger-ui.css",
            swagger_favicon_url="/static/docs/favicon.png",
        )

    @app.get("/redoc", include_in_schema=False, dependencies=readers)
    def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url="/openapi.json",
            title="replag API",
            redoc_js_url="/static/docs/redoc.standalone.js",
            redoc_favicon_url="/static/docs/favicon.png",
            with_google_fonts=False,
        )

    @app.get("/", include_in_schema=False)
    def dashboard() -> HTMLResponse:
        return HTMLResponse((STATIC / "index.html").read_text(encoding="utf-8"))

    # Probes for a platform (Kubernetes, Docker's HEALTHCHECK, a load balancer): open
    # even when reads need a token, and they say nothing about the fleet.
    @app.get("/-/healthy", include_in_schema=False)
    def healthy() -> JSONResponse:
        """Liveness: the process answers HTTP."""
        return JSONResponse({"status": "ok"})

    @app.get("/-/ready", include_in_schema=False)
    def ready() -> JSONResponse:
        """Readiness: started (schedulers running, store open) and not stopping."""
        if app.state.ready:
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "not ready"}, status_code=503)

    @app.get("/metrics", include_in_schema=False, dependencies=readers)
    def metrics() -> Response:
        return Response(svc.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        # Starlette's 405 lists the methods of the first route matching the path only, but
        # GET and POST /api/v1/repairs are two routes: say every method the path takes.
        if exc.status_code == 405:
            exc.headers = {**(exc.headers or {}), "Allow": ", ".join(allowed_methods(app, request))}
        return await http_exception_handler(request, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> Response:
        # A body that is not JSON is refused before FastAPI looks at the token: answer as
        # documented, 401/403 first on a call that changes data, else 400 (not 422).
        if not any(e.get("type") == "json_invalid" for e in exc.errors()):
            return await request_validation_exception_handler(request, exc)
        if request.method not in ("GET", "HEAD"):
            refusal = await auth.refusal(request, svc, "check")
            if refusal is not None:
                return JSONResponse(
                    {"detail": refusal.detail},
                    status_code=refusal.status_code,
                    headers=refusal.headers,
                )
        return JSONResponse({"detail": "the request body is not JSON"}, status_code=400)

    @app.exception_handler(ReplagError)
    async def replag_error(request: Request, exc: ReplagError) -> JSONResponse:
        status = status_of(exc)
        # The store away (or failing): what only it holds cannot be answered now; ask again.
        headers = {"Retry-After": str(STORE_RETRY_AFTER_S)} if status == 503 else None
        return JSONResponse({"detail": str(exc)}, status_code=status, headers=headers)

    def body_limits(scope: Scope, token: ApiToken) -> BodyLimits:
        s = svc.settings
        return BodyLimits(
            max_bytes=s.api_max_body, max_json_keys=s.max_json_keys, bytes_setting="api_max_body"
        )

    def authorize(scope: Scope) -> ApiToken | Refusal:
        return bearer(svc.config.api_tokens, scope, none_configured=auth.NO_TOKEN_CONFIGURED)

    # Outside every route: a body is bounded, and its token checked, before it is read.
    app.add_middleware(BoundedBodies, limits=body_limits, authorize=authorize)
    return app


@functools.cache
def offline_redoc_js() -> bytes:
    """ReDoc as the wheel ships it, but for the one image it fetches from a CDN (its logo
    in the menu's footer): ours instead, so /redoc loads nothing from the network."""
    script = (DOCS_ASSETS / "redoc.standalone.js").read_bytes()
    return script.replace(REDOC_CDN_LOGO, b"/static/docs/favicon.png")


def allowed_methods(app: FastAPI, request: Request) -> list[str]:
    """The methods the OpenAPI document declares for the request's path."""
    methods: set[str] = set()
    for template, operations in app.openapi()["paths"].items():
        if compile_path(template)[0].match(request.url.path):
            methods |= {method.upper() for method in operations}
    return sorted(methods)


def status_of(exc: ReplagError) -> int:
    """The HTTP status of an error raised under a route (see `replag.api.errors`)."""
    if isinstance(exc, NotFound):
        return 404
    if isinstance(exc, JobConflict):
        return 409
    if isinstance(exc, EndpointError):
        return 502
    if isinstance(exc, StoreError):
        return 503
    return 400
