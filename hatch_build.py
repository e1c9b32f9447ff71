"""Build replag's optional C extension (`replag._scanindex`) with the package.

The scan's per-key hashing runs in C when the module is there (about 3× faster per
key than numpy over xxhash's Python calls) and in pure Python when not, with the same
results bit for bit. So a machine without a C compiler still installs replag: this
hook warns and builds nothing. `REPLAG_NO_NATIVE=1` skips it on purpose.

An editable install compiles the module into the source tree (`replag/`, ignored by
git); a wheel carries it, and is then tagged for this interpreter and platform.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCE = Path("replag") / "_native" / "scanindex.c"


class NativeBuildHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("REPLAG_NO_NATIVE"):
            return
        root = Path(self.root)
        target = root / "replag" / ("_scanindex" + sysconfig.get_config_var("EXT_SUFFIX"))
        if not _compile(root / SOURCE, target):
            return
        if version != "editable":
            build_data["force_include"][str(target)] = f"replag/{target.name}"
            build_data["pure_python"] = False
            build_data["infer_tag"] = True


def _compile(source: Path, target: Path) -> bool:
    compiler = shlex.split(sysconfig.get_config_var("CC") or "cc")
    command = [
        *compiler,
        "-O3",
        "-shared",
        "-fPIC",
        "-I",
        sysconfig.get_paths()["include"],
        "-I",
        str(source.parent),
        str(source),
        "-o",
        str(target),
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        print(f"replag: no C compiler ({exc}); scans hash in pure Python (slower)")
        return False
    if done.returncode != 0:
        print(f"replag: the C extension did not build; scans hash in pure Python\n{done.stderr}")
        return False
    return True
