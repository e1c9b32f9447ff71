"""Monitoring of the stores themselves, beside replag's own probes: Dynomite's /info figures."""
