"""The agent's HTTP API: tree levels, leaf contents, key states, metrics.

Everything but `GET /agent/v1/health` needs a bearer token of the service's
(`[[api_tokens]]` or `settings.api_token`) with the route's scope (`agent.auth`:
read, check or repair); every write is audit-logged with the token's name, the
client and the coordinator's run. Handlers are coroutines on the event loop the
trees are updated on, so a response is never computed from a tree half-way
through a batch of updates.

* `GET /agent/v1/health`: region, version, each tree's state;
* `GET /agent/v1/replicas`: each tree's state, keys, root, bytes per key, events, rebuilds;
* `POST /agent/v1/replicas/{name}/nodes` {level, nodes, down, auto, fresh, wait_s}:
  per node of `level`, its 2**down descendants (uint64 little-endian); with
  `auto`, `down` is the most and the agent goes as deep as its tree's key count
  calls for (`walk.first_down`), saying how deep in `X-Replag-Nodes-Down`;
* `POST /agent/v1/replicas/{name}/leaves` {leaves}: the keys of those leaves
  (hash, entry hash, name: `ScanIndex` bytes);
* `GET /agent/v1/replicas/{name}/role`: the replica's role, replication ID, link and
  primary, and whether it is a Cluster node (`roles.MemberRole`), read here;
* `POST /agent/v1/replicas/{name}/keys/observe` {keys (base64), settle_s, once}:
  each key's state read twice, settle_s apart (once: read once);
* `POST /agent/v1/replicas/{name}/keys/read-for-copy` {key, expected, tolerance_ms}:
  the repair's step 1 on a winner here (`guarded_write.read_for_copy`): DUMP and PTTL if
  the key still holds the expected state;
* `POST /agent/v1/replicas/{name}/keys/write` {key, expected, write, age_ms,
  tolerance_ms}: the repair's compare-and-set write here (`guarded_write.compare_and_write`),
  the TTL computed when written; answers the pre-image for an undo;
* `GET /metrics`: Prometheus text (see `agent.metrics`).

With `fresh`, the tree first catches up with every write the replica applied
before the request (see `LiveTree.fresh`), waiting up to `wait_s` for a tree
that is being built.
"""

from __future__ import annotations

import base64
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, model_validator

from replag import __version__
from replag.agent.auth import NO_TOKEN_CONFIGURED, Caller, checker, reader, repairer
from replag.agent.livetree import LiveTree
from replag.agent.metrics import AgentMetrics
from replag.agent.region import RegionAgent
from replag.errors import AgentError, EndpointError, KeyRefused, ReplagError
from replag.repair.decisions.roles import read_role
from replag.repair.keyspace.observe import KeyState
from replag.repair.keyspace.write import Write
from replag.repair.trees import remote as wire
from replag.repair.trees.walk import first_down
from replag.repair.writes.guarded_write import compare_and_write, read_for_copy
from replag.request_bodies import BodyLimits, BoundedBodies, Refusal, bearer
from replag.tokens import ApiToken

OCTETS = "application/octet-stream"
# Swagger UI as the fastapi-offline wheel ships it: /docs loads nothing from the network.
DOCS_ASSETS = resources.files("fastapi_offline") / "static"
DOCS_ASSET_TYPES = {
    "swagger-ui-bundle.js": "application/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
}
MAX_NODES = 1 << 24


# A node's or leaf's number in a tree of at most 24 levels (`descendants` and
# `leaf_keys` check it against the tree's own depth): anything larger is a 422 here,
# not an overflow in numpy.
NodeNumber = Annotated[int, Field(ge=0, lt=MAX_NODES)]
# Milliseconds: a TTL, an age, a tolerance; bounded so that no arithmetic on them can
# leave a 64-bit integer (Redis's own limit for PEXPIRE).
Millis = Annotated[int, Field(ge=0, le=1 << 50)]


class NodesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    level: int = Field(ge=0, le=24)
    nodes: list[NodeNumber] = Field(max_length=MAX_NODES)
    down: int = Field(ge=0, le=24)
    auto: bool = False  # `down` is the most: go as deep as the tree's key count calls for
    fresh: bool = False
    wait_s: float = Field(default=0.0, ge=0, le=3600)


class LeavesRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    leaves: list[NodeNumber] = Field(max_length=MAX_NODES)


class ObserveRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    keys: list[str] = Field(max_length=100_000)
    settle_s: float = Field(default=0.0, ge=0, le=60)
    once: bool = False
    keep: bool = False  # send string values too (a newest:FIELD policy reads them)
    fields: list[str] = Field(default_factory=list, max_length=16)  # hash fields (base64)


class WriteSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    op: Literal["delete", "restore", "expire", "undo", "purge"]
    payload: str | None = None  # base64
    # PTTL's answer when the value was read: -1 no expiry, -2 no key (an undo's pre-image
    # of a key that did not exist), else milliseconds left.
    pttl: int = Field(default=-1, ge=-2, le=1 << 50)

    @model_validator(mode="after")
    def _restore_has_a_payload(self) -> WriteSpec:
        if self.op == "restore" and not self.payload:
            raise ValueError("a restore needs its payload (the winner's DUMP, base64)")
        return self


class KeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str  # base64
    expected: list[Any] | None  # a key state (null: absent)
    tolerance_ms: Millis


class WriteRequest(KeyRequest):
    write: WriteSpec
    age_ms: Millis  # time since the source was read, when the request left


def _agent(request: Request) -> RegionAgent:
    agent: RegionAgent = request.app.state.agent
    return agent


Agent = Annotated[RegionAgent, Depends(_agent)]


Repairer = Annotated[Caller, Depends(repairer)]


def _tree(agent: RegionAgent, name: str) -> LiveTree:
    if name not in agent.trees:
        raise HTTPException(404, f"no replica {name!r} here (keeping: {', '.join(agent.trees)})")
    return agent.trees[name]


def _tree_headers(tree: LiveTree) -> dict[str, str]:
    return {
        wire.DEPTH_HEADER: str(tree.depth),
        wire.BUCKET_HEADER: str(tree.options.ttl_bucket_ms),
        wire.KEYS_HEADER: str(len(tree.table) if tree.table is not None else 0),
    }


health_router = APIRouter(prefix=wire.PREFIX)
router = APIRouter(prefix=wire.PREFIX)


@health_router.get("/health")
async def health(agent: Agent) -> dict[str, Any]:
    """Liveness, and each tree's state (no token needed)."""
    return {
        "version": __version__,
        "region": agent.region,
        "replicas": {name: tree.state for name, tree in agent.trees.items()},
    }


@router.get("/replicas", dependencies=[Depends(reader)])
async def replicas(agent: Agent) -> dict[str, Any]:
    """Every tree this agent keeps, with its state and counters."""
    return {"region": agent.region, "replicas": [t.to_dict() for t in agent.trees.values()]}


@router.post("/replicas/{name}/nodes", dependencies=[Depends(checker)])
async def nodes(agent: Agent, name: str, body: NodesRequest) -> Response:
    """Per requested node of `level`, its 2**down descendants (uint64 little-endian)."""
    tree = _tree(agent, name)
    if body.fresh:
        await tree.fresh(body.wait_s)
    down = body.down
    if body.auto:
        keys = len(tree.table) if tree.table is not None else 0
        down = min(down, first_down(keys, tree.depth))
    values = tree.descendants(body.level, body.nodes, down)
    headers = {**_tree_headers(tree), wire.DOWN_HEADER: str(down)}
    return Response(wire.u64_bytes(values), media_type=OCTETS, headers=headers)


@router.post("/replicas/{name}/leaves", dependencies=[Depends(checker)])
async def leaves(agent: Agent, name: str, body: LeavesRequest) -> Response:
    """Key hash, entry hash and name of every key in the given leaves."""
    tree = _tree(agent, name)
    index = tree.leaf_keys(body.leaves)
    return Response(index.to_bytes(), media_type=OCTETS, headers=_tree_headers(tree))


@router.get("/replicas/{name}/role", dependencies=[Depends(checker)])
async def role(agent: Agent, name: str) -> dict[str, Any]:
    """The replica's role (INFO replication, INFO cluster) read here: a repair of a
    replication group behind agents writes only to the member that is its primary now."""
    _tree(agent, name)
    found = await read_role(agent.lane(name).endpoint, agent.settings.connect_timeout)
    return found.to_dict()


@router.post("/replicas/{name}/keys/observe", dependencies=[Depends(checker)])
async def observe(agent: Agent, name: str, body: ObserveRequest) -> dict[str, Any]:
    """Each key's state read twice, `settle_s` apart, on the replica (verification)."""
    tree = _tree(agent, name)
    try:
        keys = wire.keys_from_wire(body.keys)
        fields = wire.keys_from_wire(body.fields)
    except ValueError:
        raise HTTPException(400, "keys and fields: expected base64 strings") from None
    if body.once:
        once = await tree.observe(keys, keep=body.keep, fields=fields)
        return {"first": [wire.state_to_wire(once[k]) for k in keys]}
    first, second = await tree.observe_twice(keys, body.settle_s, keep=body.keep, fields=fields)
    return {
        "first": [wire.state_to_wire(first[k]) for k in keys],
        "second": [wire.state_to_wire(second[k]) for k in keys],
    }


def _key_and_state(name: str, body: KeyRequest) -> tuple[bytes, KeyState]:
    try:
        (key,) = wire.keys_from_wire([body.key])
        return key, wire.state_from_wire(body.expected, where=name)
    except (ValueError, AgentError) as exc:
        raise HTTPException(400, f"key or expected state: {exc}") from None


@router.post("/replicas/{name}/keys/read-for-copy", dependencies=[Depends(repairer)])
async def read_winner(agent: Agent, name: str, body: KeyRequest) -> dict[str, Any]:
    """The repair's read of a winner, here: DUMP and PTTL if it still holds `expected`."""
    _tree(agent, name)
    key, expected = _key_and_state(name, body)
    try:
        async with agent.lane(name).connection() as conn:
            read = await read_for_copy(
                conn, key, expected, tolerance_ms=body.tolerance_ms, chunk=agent.chunk
            )
    except KeyRefused as exc:  # the key's error, not the agent's
        return {"refused": exc.message}
    if read is None:
        return {"changed": True}
    return {"payload": base64.b64encode(read[0]).decode("ascii"), "pttl": read[1]}


@router.post("/replicas/{name}/keys/write")
async def write_key(
    agent: Agent, caller: Repairer, name: str, body: WriteRequest
) -> dict[str, Any]:
    """The repair's compare-and-set write of one key, here (WATCH, compare, MULTI/EXEC);
    audit-logged with the caller and kept in the agent's audit file."""
    received = time.monotonic()
    _tree(agent, name)
    key, expected = _key_and_state(name, body)
    try:
        payload = (
            base64.b64decode(body.write.payload, validate=True) if body.write.payload else None
        )
    except ValueError:
        raise HTTPException(400, "write.payload: expected base64") from None
    write = Write(body.write.op, payload, body.write.pttl)

    def commands() -> list[bytes] | None:
        return write.commands(key, body.age_ms + int((time.monotonic() - received) * 1000))

    try:
        async with agent.lane(name).connection(write=True) as conn:
            done = await compare_and_write(
                conn, key, expected, commands, tolerance_ms=body.tolerance_ms, chunk=agent.chunk
            )
    except KeyRefused as exc:  # READONLY, NOPERM, OOM: the key's error, not the agent's
        agent.audit.write(caller, replica=name, key=key, op=write.op, outcome="refused")
        return {"refused": exc.message}
    except BaseException:
        agent.audit.write(caller, replica=name, key=key, op=write.op, outcome="failed")
        raise
    if done is None:
        agent.audit.write(caller, replica=name, key=key, op=write.op, outcome="changed meanwhile")
        return {"written": False}
    agent.audit.write(caller, replica=name, key=key, op=write.op, outcome="written")
    pre_image, pre_pttl, count = done
    return {
        "written": True,
        "pre_image": base64.b64encode(pre_image).decode("ascii") if pre_image else None,
        "pre_pttl": pre_pttl,
        "count": count,
    }


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
ASGIApp = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]


class _CountBytes:
    """ASGI middleware: bytes of every response body, by route, into the agent's metrics."""

    def __init__(self, app: ASGIApp, metrics: AgentMetrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = AgentMetrics.route_label(scope.get("path", ""))

        async def counting(message: Message) -> None:
            if message["type"] == "http.response.body":
                self.metrics.sent(route, len(message.get("body", b"")))
            await send(message)

        await self.app(scope, receive, counting)


def create_agent_app(agent: RegionAgent, *, run: bool = True) -> FastAPI:
    """The agent's app; the lifespan starts and stops the trees unless `run` is False."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if run:
            await agent.start()
        try:
            yield
        finally:
            if run:
                await agent.stop()

    app = FastAPI(
        title="replag agent",
        version=__version__,
        lifespan=lifespan,
        description="Tictac trees of one region's replicas, kept current from keyspace "
        "notifications; leaf contents and key states for `repair check` and `run`.",
        # Nothing but health without a token (docs/agents.md): the OpenAPI document and
        # the Swagger UI page (its files installed with fastapi-offline, no CDN) are
        # served below behind the read scope.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.agent = agent
    metrics = AgentMetrics(agent)
    app.include_router(health_router)
    app.include_router(router)
    for part in agent.parts:
        if part.router is not None:
            # Parts serve probe keys and clocks: read (a route may ask for more itself).
            app.include_router(part.router, dependencies=[Depends(reader)])

    @app.get("/openapi.json", include_in_schema=False, dependencies=[Depends(reader)])
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False, dependencies=[Depends(reader)])
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="replag agent API",
            swagger_js_url="/static/docs/swagger-ui-bundle.js",
            swagger_css_url="/static/docs/swagger-ui.css",
            swagger_favicon_url="/static/docs/favicon.png",
        )

    @app.get("/static/docs/{name}", include_in_schema=False, dependencies=[Depends(reader)])
    async def docs_asset(name: str) -> Response:
        if name not in DOCS_ASSET_TYPES:
            raise HTTPException(404, f"no {name!r} here")
        body = (DOCS_ASSETS / name).read_bytes()
        return Response(body, media_type=DOCS_ASSET_TYPES[name])

    @app.get("/metrics", include_in_schema=False, dependencies=[Depends(reader)])
    async def metrics_page() -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(ReplagError)
    async def replag_error(request: Request, exc: ReplagError) -> JSONResponse:
        status = 400
        if isinstance(exc, AgentError):
            status = 503  # the tree is not current (building, stale, replica down)
        elif isinstance(exc, EndpointError):
            status = 502
        return JSONResponse({"detail": str(exc)}, status_code=status)

    def body_limits(scope: Scope, token: ApiToken) -> BodyLimits:
        # A repair's write carries a value's DUMP: as large as a coordinator may read
        # (max_reply_bytes), for a token that may write. Every other body is small.
        s = agent.settings
        writes = scope.get("path", "").endswith("/keys/write") and token.allows("repair")
        return BodyLimits(
            max_bytes=s.agent_max_write_body if writes else s.agent_max_body,
            max_json_keys=s.max_json_keys,
            bytes_setting="agent_max_write_body" if writes else "agent_max_body",
        )

    def authorize(scope: Scope) -> ApiToken | Refusal:
        return bearer(agent.config.api_tokens, scope, none_configured=NO_TOKEN_CONFIGURED)

    app.add_middleware(_CountBytes, metrics=metrics)
    # Outermost: a body is bounded, and its token checked, before anything reads it.
    app.add_middleware(BoundedBodies, limits=body_limits, authorize=authorize)
    return app
