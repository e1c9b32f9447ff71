"""`replag agent`: keep Tictac trees of one region's replicas current and serve them."""

from __future__ import annotations

import logging
import os
import ssl
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click
import uvicorn

from replag.commands.options import config_option, load
from replag.commands.repeated_logs import uvicorn_log_config
from replag.commands.serve import CleanExitServer, _is_loopback, listen
from replag.config import Config
from replag.durations import parse_duration_ns
from replag.errors import ConfigError, UsageError
from replag.http_guard import server_options
from replag.logfields import bind_log_fields
from replag.wire.tls import TlsFilesError, server_context

log = logging.getLogger("replag.agent")
DEFAULT_PORT = 8701


def _listen_address(listen_opt: str | None, agent_url: str | None) -> tuple[str, int]:
    if listen_opt is None:
        port = urlsplit(agent_url).port if agent_url else None
        return "127.0.0.1", port or DEFAULT_PORT
    host, sep, port_text = listen_opt.rpartition(":")
    if not sep or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise UsageError(f"--listen: expected HOST:PORT, got {listen_opt!r}")
    return host.strip("[]") or "127.0.0.1", int(port_text)


def _offset_ns(text: str) -> int:
    body = text.strip()
    sign = -1 if body.startswith("-") else 1
    try:
        return sign * parse_duration_ns(body.lstrip("+-"), default_unit="ms")
    except ValueError as exc:
        raise UsageError(f"--clock-offset: {exc}") from None


@click.command(name="agent")
@config_option
@click.option("--region", "-r", required=True, help="The region whose replicas this agent keeps.")
@click.option(
    "--listen",
    "listen_opt",
    metavar="HOST:PORT",
    help="Address to bind (default: 127.0.0.1 and the port of the region's `agent` URL, "
    f"else {DEFAULT_PORT}). Anything but loopback exposes it to the network.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where trees are saved between runs [default: settings.agent_state_dir/REGION].",
)
@click.option(
    "--clock-offset",
    default="0ms",
    show_default=True,
    metavar="DURATION",
    help="Lab and tests only: run this agent's wall clock this far ahead (e.g. 3ms, or -3ms "
    "behind), to show that lag error bars hold when clocks differ.",
)
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def command(
    config_path: Path,
    region: str,
    listen_opt: str | None,
    state_dir: Path | None,
    clock_offset: str,
    log_level: str,
) -> None:
    """Keep Tictac trees of one region's replicas current and serve them.

    One tree per replica-group member of REGION, built by a full scan and kept current
    from keyspace notifications; `repair check`/`run` and `serve` walk them, so only
    trees and divergent keys cross the WAN.

    Every call but /agent/v1/health needs `Authorization: Bearer <token>`, a token of
    [[api_tokens]] (or settings.api_token) with the call's scope; writes are audit-logged.
    HTTPS with settings.agent_tls_cert/key; client certificates required with
    settings.agent_tls_client_ca.

    Stops cleanly on SIGTERM or Ctrl-C (trees are saved), exiting 0.
    """
    from replag.agent.app import create_agent_app
    from replag.agent.lag import LagPart
    from replag.agent.memory import fix_mmap_threshold
    from replag.agent.region import RegionAgent
    from replag.clockbound import WallClock

    fix_mmap_threshold()  # before any large block: see replag.agent.memory
    config = load(config_path)
    logging.getLogger("replag").setLevel(log_level.upper())
    settings = config.settings
    if not config.api_tokens:
        raise UsageError(
            "replag agent needs a token: settings.api_token (or REPLAG_API_TOKEN) or "
            "[[api_tokens]]; it serves key names and values, so every call but health must "
            "carry one"
        )
    context = server_tls(config)
    host, port = _listen_address(listen_opt, config.topology.region(region).agent)
    offset_ns = _offset_ns(clock_offset)
    if offset_ns:
        log.warning(
            "agent of %s: clock shifted by %+.3f ms (--clock-offset)", region, offset_ns / 1e6
        )
    lag = LagPart(clock=WallClock(offset_ns=offset_ns))
    agent = RegionAgent(config, region, state_dir=state_dir, parts=[lag])
    if not _is_loopback(host):
        how = "over plain HTTP (tokens cross it in clear: set agent_tls_cert)"
        if context is not None:
            how = "over HTTPS" + (
                ", client certificates required" if settings.agent_tls_client_ca else ""
            )
        log.warning("agent of %s listening on %s: reachable from the network %s",
                    region, host, how)  # fmt: skip
    sock = listen(host, port)
    with sock:
        server = CleanExitServer(
            _ServerConfig(
                create_agent_app(agent),
                context,
                host=host,
                port=port,
                log_level=log_level,
                log_config=uvicorn_log_config(),
                access_log=False,
                lifespan="on",
                **server_options(settings),
            )
        )
        with bind_log_fields(region=region):  # every line of this agent names its region
            server.run(sockets=[sock])


class _ServerConfig(uvicorn.Config):
    """uvicorn's configuration, serving HTTPS with a context made by `replag.wire.tls` (a client
    CA may be a directory; the files are checked before the port is bound)."""

    def __init__(self, app: Any, context: ssl.SSLContext | None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._context = context

    def load(self) -> None:
        super().load()
        if self._context is not None:
            self.ssl = self._context


def server_tls(config: Config) -> ssl.SSLContext | None:
    """The agent's HTTPS context (None: plain HTTP); ConfigError naming the setting and
    file that cannot be used."""
    s = config.settings
    where = f"{config.path or 'config'}: settings"
    if s.agent_tls_key is not None and s.agent_tls_cert is None:
        raise ConfigError("agent_tls_key is set without agent_tls_cert", where=where)
    if s.agent_tls_client_ca is not None and s.agent_tls_cert is None:
        raise ConfigError(
            "agent_tls_client_ca is set without agent_tls_cert (client certificates need HTTPS)",
            where=where,
        )
    if s.agent_tls_cert is None:
        return None
    try:
        return server_context(
            os.path.expanduser(s.agent_tls_cert),
            os.path.expanduser(s.agent_tls_key) if s.agent_tls_key else None,
            client_ca=os.path.expanduser(s.agent_tls_client_ca) if s.agent_tls_client_ca else None,
        )
    except TlsFilesError as exc:
        raise ConfigError(str(exc), where=where) from None
