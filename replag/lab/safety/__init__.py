"""A Jepsen-style safety harness for `repair run`: hostile writers, a history, a checker.

`harness.run_once(SafetySpec(...), workdir)` starts three replicas, injects
divergence, runs versioned writers in another process while `repair run`
works, and counts per run the keys clobbered by an older value, resurrected
after a delete, with lost writes, and left divergent though reported fixed.
"""
