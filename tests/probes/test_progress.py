"""The probe's progress line counts arrivals as they are seen: an observer still learning
whether its replica publishes (auto mode) counts what its poll or its events found, not
its own empty arrivals until it decides (the line stood at 0 % until the run ended)."""

from __future__ import annotations

from typing import Any, cast

from replag.probes.observers import Arrival, LearningObserver, PollObserver, PushObserver
from replag.topology import Endpoint


def test_a_learning_observer_counts_what_its_poll_has_seen_before_deciding() -> None:
    replica = Endpoint.from_url("redis://127.0.0.1:1", name="b-1")
    push = PushObserver(replica, pattern=b"p:*", rtt_ns=1, timeout_s=1.0)
    poll = PollObserver(replica, cast(Any, None), interval_s=0.01)  # never started
    learning = LearningObserver(push, poll, [], grace_s=60.0)
    assert learning.seen() == 0
    poll.arrivals[b"p:1"] = Arrival(estimate_ns=5, lo_ns=4, hi_ns=6)
    poll.arrivals[b"p:2"] = Arrival(estimate_ns=7, lo_ns=6, hi_ns=8)
    assert not learning.decided and learning.arrivals == {}
    assert learning.seen() == 2
    push.arrivals[b"p:1"] = Arrival(estimate_ns=5, lo_ns=4, hi_ns=6)
    learning.decided, learning.mode, learning.arrivals = True, "push", push.arrivals
    assert learning.seen() == 1  # decided: its own arrivals, the events'


def test_a_key_withdrawn_while_its_round_was_asked_is_neither_found_nor_outstanding() -> None:
    """A write that failed is withdrawn from the poll; a round asked before that still
    answers for it (a DC_QUORUM write Dynomite refused yet applied on one rack). The
    answer is dropped: no KeyError ending the observer, and the key not polled again."""
    replica = Endpoint.from_url("redis://127.0.0.1:1", name="b-1")
    poll = PollObserver(replica, cast(Any, None), interval_s=0.01)  # never started
    poll.expect(b"p:1", 10)
    poll.expect(b"p:2", 10)
    poll.expect(b"p:3", 10)
    asked = [b"p:1", b"p:2", b"p:3"]
    poll.withdraw(b"p:1")
    poll.withdraw(b"p:2")
    poll._record(asked, [b"v", None, b"v"], 20, 30)
    assert list(poll.arrivals) == [b"p:3"]
    assert list(poll._outstanding) == []
