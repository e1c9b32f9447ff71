"""Anti-entropy for replica groups: Tictac Merkle trees over every replica, safe repair.

report = await check(config, group="main", store=store)
report = await repair(config, policy="quorum", store=store)
list_runs(store, limit=10, offset=0); count_runs(store); get_run(store, report.run_id)
"""

from replag.repair.decisions.report import RepairReport
from replag.repair.engine import ProgressCallback, RepairProgress, check, repair
from replag.repair.runs import count_runs, get_run, list_runs
from replag.repair.trees.tictac import TictacTree

__all__ = [
    "ProgressCallback",
    "RepairProgress",
    "RepairReport",
    "TictacTree",
    "check",
    "count_runs",
    "get_run",
    "list_runs",
    "repair",
]
