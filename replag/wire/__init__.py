"""The wire: every connection replag opens to a Redis-protocol server.

RESP connections for timing and scans (`resp`, `resp_blocking`, `stamped_socket`),
redis-py clients for admin (`connections`), their TLS (`tls`), the limits a reply is
checked against before it is parsed (`reply_limits`) and the ACL checks (`permissions`).
"""
