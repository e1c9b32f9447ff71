"""`alert_outbox.claimed_until_ns`: until when (database clock) a row is its sender's.

The instance sending a notification claims its row under the `alerts` lease right
before each request; another owner adopts the row only once that claim ran out
(`replag.alerts.state.AlertBook.adopt_outbox`), so a lease handed over while the
old owner is still sending does not make the new one send it too.
"""

from __future__ import annotations

from replag.store.schema import AddColumn, Step

STEPS: tuple[Step, ...] = (AddColumn("alert_outbox", "claimed_until_ns", "INTEGER"),)
