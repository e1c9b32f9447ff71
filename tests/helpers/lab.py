"""The lab fixture's type: `lab_factory(regions=(…), delays_ms={…}, …)` → the lab's state."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

LabFactory = Callable[..., dict[str, Any]]
