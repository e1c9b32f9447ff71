"""`replag serve`: the API, dashboard, metrics and schedulers under uvicorn."""

from __future__ import annotations

import ipaddress
import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import click
import uvicorn

from replag.commands.options import config_option, load

log = logging.getLogger("replag.serve")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class CleanExitServer(uvicorn.Server):
    """uvicorn's server, except that a stop signal ends the process with exit code 0.

    uvicorn shuts down on SIGTERM/SIGINT and then raises the signal again, so the
    process dies of it (exit −15). A systemd unit or supervisor asking replag to
    stop expects a clean stop to exit 0; a failed startup still exits non-zero.
    """

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

    config = load(config_path)
    logging.getLogger("replag").setLevel(log_level.upper())
    if not _is_loopback(host) and not config.settings.api_token:
        log.warning("binding %s without api_token: data-changing API calls stay refused", host)
    app = create_app(config, external_url=f"http://{host}:{port}")
    server = CleanExitServer(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            lifespan="on",
        )
    )
    server.run()


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"
