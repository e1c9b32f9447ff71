"""Alert rules, their persisted states, and the hooks that notify people.

`replag.alerts.evaluate.evaluate_and_notify` is the one entry point: the
service calls it after each probe round and check, `replag probe --alerts`
once per cron run. `config` is the `[alerts]` table's shape, `rules` the
conditions, `state` what fired when, `delivery` and `payloads` the sinks.
"""
