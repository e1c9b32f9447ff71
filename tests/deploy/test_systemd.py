"""deploy/systemd: every unit passes `systemd-analyze verify`, sandboxed as the docs say.

verify needs each ExecStart binary to exist: the copies verified here name where
`replag` is installed on this machine instead of /opt/replag/bin/replag (nothing
else changes). Skips where systemd-analyze is missing (not a systemd distribution).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
INSTALLED_AT = "/opt/replag/bin/replag"
SANDBOX = (
    "User=replag",
    "NoNewPrivileges=yes",
    "ProtectSystem=strict",
    "CapabilityBoundingSet=\n",
    "ProtectHome=yes",
    "PrivateTmp=yes",
)


def replag_executable() -> str:
    found = shutil.which("replag") or str(Path(sys.executable).parent / "replag")
    if not Path(found).is_file():
        pytest.skip("no `replag` executable installed here")
    return found


@pytest.fixture(scope="module")
def verifiable(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (apt-get install systemd)")
    out = tmp_path_factory.mktemp("units")
    replag = replag_executable()
    for unit in UNITS.glob("replag*.*"):
        if unit.suffix in (".service", ".timer"):
            name = unit.name.replace("@.", "@eu-west.")  # a template is verified as an instance
            (out / name).write_text(unit.read_text().replace(INSTALLED_AT, replag))
    return out


def test_the_units_are_there() -> None:
    names = {p.name for p in UNITS.iterdir()}
    wanted = {"replag-serve.service", "replag-agent@.service", "replag-probe.service"}
    assert wanted | {"replag-probe.timer", "replag.sysusers"} <= names


def test_every_unit_passes_systemd_analyze_verify(verifiable: Path) -> None:
    units = sorted(p.name for p in verifiable.iterdir())
    assert len(units) == 4
    result = subprocess.run(
        ["systemd-analyze", "verify", *units],
        cwd=verifiable,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


@pytest.mark.parametrize(
    "name", ["replag-serve.service", "replag-agent@.service", "replag-probe.service"]
)
def test_each_service_is_sandboxed_and_logs_json(name: str) -> None:
    text = (UNITS / name).read_text()
    for directive in SANDBOX:
        assert f"\n{directive}" in text, f"{name} lacks {directive.strip()}"
    assert "\nStateDirectory=" in text and "REPLAG_LOG_FORMAT=json" in text
    assert f"ExecStart={INSTALLED_AT} " in text


def test_the_probe_timer_starts_the_probe_service() -> None:
    timer = (UNITS / "replag-probe.timer").read_text()
    assert "OnUnitActiveSec=" in timer  # same name: the timer starts replag-probe.service
    assert "Type=oneshot" in (UNITS / "replag-probe.service").read_text()
