"""`replag serve`: the API, dashboard, metrics and schedulers under uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import uvicorn

from replag.commands.options import config_option, load
from replag.commands.repeated_logs import uvicorn_log_config
from replag.errors import UsageError
from replag.heap import freeze_long_lived, tune_for_service
from replag.http_guard import server_options
from replag.store.configs import open_config_store

log = logging.getLogger("replag.serve")
uvicorn_log = logging.getLogger("uvicorn.error")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class CleanExitServer(uvicorn.Server):
    """uvicorn's server, except that a stop signal ends the process with exit code 0.

    uvicorn shuts down on SIGTERM/SIGINT and then raises the signal again, so the
    process dies of it (exit −15). A systemd unit or supervisor asking replag to
    stop expects a clean stop to exit 0; a failed startup still exits non-zero.
    """

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        # uvicorn only says where it listens when it binds the socket itself.
        if sockets and self.started:
            host, port = sockets[0].getsockname()[:2]
            uvicorn_log.info(
                "Uvicorn running on %s://%s:%d (Press CTRL+C to quit)",
                "https" if self.config.ssl else "http",
                f"[{host}]" if ":" in host else host,
                port,
            )

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        # Signals can only be handled in the main thread (tests run servers in others).
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in STOP_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@click.command(name="serve")
@config_option
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to bind; anything but loopback exposes the API to the network.",
)
@click.option("--port", default=8700, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--log-level",
    default="info",
    show_default=True,
    type=click.Choice(["debug", "info", "warning", "error"]),
)
def command(config_path: Path, host: str, port: int, log_level: str) -> None:
    """Probe on a schedule, check replica groups, alert, and serve the dashboard and API.

    Stops cleanly on SIGTERM or Ctrl-C, exiting 0: schedulers are cancelled, the
    alert sender and the store are closed.
    """
    from replag.api.app import create_app
    from replag.repair.scan.process import fork_scans_from_server

    config = load(config_path)
    logging.getLogger("replag").setLevel(log_level.upper())
    if not _is_loopback(host) and not config.api_tokens:
        log.warning(
            "binding %s without an API token (api_token or [[api_tokens]]): data-changing "
            "API calls stay refused",
            host,
        )
    # Bind before the app exists: uvicorn would start the schedulers (probing, writing
    # to the store) and only then find the port taken.
    sock = listen(host, port)
    with sock:
        # Refuse a store another config's serve or CLI run used (unless store_shared).
        open_config_store(config).close()
        # Checks fork a scan process per replica: from a small server, not from this
        # process (its heap and the API's thread; see replag.repair.scan.process).
        fork_scans_from_server()
        bound = f"http://{host}:{sock.getsockname()[1]}"
        app = create_app(config, external_url=config.settings.public_url or bound, freeze_heap=True)
        # The modules and the app live as long as the process: out of the collector's
        # passes from here on (the service freezes again once its index is warm).
        freeze_long_lived("start-up")
        tune_for_service()
        server = CleanExitServer(
            uvicorn.Config(
                app,
                host=host,
                port=port,
                log_level=log_level,
                log_config=uvicorn_log_config(),
                access_log=False,
                lifespan="on",
                # uvloop and httptools (dependencies): idle closed-loop capacity 3,377
                # req/s against 682 with asyncio's loop and h11 (benchmarks/api_load.py).
                loop="auto",
                # httptools, closing a connection that drips its headers (`http_guard`).
                **server_options(config.settings),
            )
        )
        server.run(sockets=[sock])


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port; UsageError (one line, exit 2) when that fails."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:  # socket.gaierror: an unknown host name
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
