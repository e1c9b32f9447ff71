"""What a repair reads of a keyspace and how: keys and values, canonical digests, values
read in pages, the state of a key as observed, a repair write as data, slots, progress.

The floor of the repair room: it uses no other sub-room of `replag.repair`.
"""
