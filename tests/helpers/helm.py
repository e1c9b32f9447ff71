"""helm for the chart's tests: v3.22.0, built once per machine from the Go module proxy
into $REPLAG_TOOLS_CACHE/bin (default /var/cache/replag-tools; `.ci/go-tools.sh`);
REPLAG_HELM names it, else `helm` on PATH. Tests skip, saying so, without it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent.parent
CHART = ROOT / "deploy" / "helm" / "replag"
CACHED = os.environ.get("REPLAG_TOOLS_CACHE", "/var/cache/replag-tools") + "/bin/helm"


def helm_binary() -> str:
    for candidate in (os.environ.get("REPLAG_HELM"), shutil.which("helm"), CACHED):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no helm: `go install helm.sh/helm/v3/cmd/helm@v3.22.0` (.ci/container-tests)")


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [helm_binary(), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check:
        assert result.returncode == 0, result.stdout + result.stderr
    return result


def render(
    release: str, values: dict[str, Any], tmp_path: Path, chart: Path = CHART
) -> list[dict[str, Any]]:
    """`helm template RELEASE CHART -f values`: the rendered documents."""
    path = tmp_path / f"{release}-values.yaml"
    path.write_text(yaml.safe_dump(values))
    out = helm("template", release, str(chart), "-f", str(path)).stdout
    return [d for d in yaml.safe_load_all(out) if d]
