"""`replag agent`: one process per region that keeps Merkle trees where the data lives.

A central `repair check` pulls every value of every remote replica across the
WAN before it can build a tree. An agent runs in the replica's region, talks
only to its own region's replicas on their addresses inside the region
(`local`, else `url`), and keeps one Tictac tree per replica-group member there:

* built by a full scan with the repair's own scanner and digests, so the tree
  equals a direct scan's tree of the same data (`livetree`);
* kept current from keyspace notifications: every write, delete, expiry and
  eviction names a key; the agent re-reads it and XORs its old entry hash out
  of its leaf and the new one in, remembering per key only its hash and entry
  hash (`keytable`, 14 bytes in memory), its name in an unlinked file read
  only for the leaves a check asks for (`namefile`);
* marked stale and rebuilt whenever a change could have gone unseen (lost
  subscription, flush or full resync, notifications turned off, restart),
  never served stale;
* saved to disk with the replica's identity, so a restart against unchanged
  data does not rescan (`snapshot`).

The coordinator (`repair check`/`run`, `serve`) walks the trees from the root
across agents, fetching only nodes under differing ones, then the keys of
the differing leaves, then two reads of only the candidate keys, done by each
agent in its region (`replag.repair.trees.walk`, `replag.repair.trees.remote`). Trees,
not values, cross the WAN.

The HTTP API (`app`) needs the service's bearer token on everything but
health. Other work an agent does next to the data (e.g. observing probe keys
for lag) plugs in as an `AgentPart` (`region`), sharing each replica's
notification subscription through `LiveTree.listeners`.
"""

from replag.agent.region import AgentPart, RegionAgent

__all__ = ["AgentPart", "RegionAgent"]
