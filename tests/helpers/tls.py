"""A test CA and certificates (made with `cryptography`), and redis-servers that speak TLS only.

`make_pki(dir)` writes a CA, a second CA nobody trusts, a server certificate for
localhost/127.0.0.1 (and an expired one), a client certificate, and one signed by
the other CA, as PEM files (region agents serve with the same server certificates).
`TlsRedisServer` starts `redis-server --port 0 --tls-port … --tls-auth-clients yes`:
no plain port at all, and every client must present a certificate of the CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from replag.lab.server import RedisServer

_NOW = datetime.datetime.now(datetime.UTC)


@dataclass(frozen=True)
class Pki:
    """Paths of the PEM files a test uses."""

    ca: Path
    other_ca: Path
    server_cert: Path
    server_key: Path
    expired_cert: Path
    expired_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path  # a client certificate of the other CA
    stranger_key: Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey | None) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if key is not None:
        key_path = path.with_suffix(".key")
        key_path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


_CA_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def _ca(common: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(_name(common))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(_NOW - datetime.timedelta(days=1))
        .not_valid_after(_NOW + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(_CA_USAGE, critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _leaf(
    common: str,
    ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
    *,
    server: bool,
    expired: bool = False,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    start, end = (
        (_NOW - datetime.timedelta(days=10), _NOW - datetime.timedelta(days=5))
        if expired
        else (_NOW - datetime.timedelta(days=1), _NOW + datetime.timedelta(days=30))
    )
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common))
        .issuer_name(ca[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.ExtendedKeyUsageOID.SERVER_AUTH, x509.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
    )
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(ca[1], hashes.SHA256()), key


def make_pki(directory: Path) -> Pki:
    directory.mkdir(parents=True, exist_ok=True)
    ca = _ca("replag test CA")
    other = _ca("some other CA")
    _write(directory / "ca.pem", ca[0], None)
    _write(directory / "other-ca.pem", other[0], None)
    _write(directory / "server.pem", *_leaf("localhost", ca, server=True))
    _write(directory / "expired.pem", *_leaf("localhost", ca, server=True, expired=True))
    _write(directory / "client.pem", *_leaf("replag client", ca, server=False))
    _write(directory / "stranger.pem", *_leaf("a stranger", other, server=False))
    return Pki(
        ca=directory / "ca.pem",
        other_ca=directory / "other-ca.pem",
        server_cert=directory / "server.pem",
        server_key=directory / "server.key",
        expired_cert=directory / "expired.pem",
        expired_key=directory / "expired.key",
        client_cert=directory / "client.pem",
        client_key=directory / "client.key",
        stranger_cert=directory / "stranger.pem",
        stranger_key=directory / "stranger.key",
    )


def tls_args(pki: Pki, *, expired: bool = False) -> tuple[str, ...]:
    """redis-server arguments: TLS only (port 0), client certificates required; a replica
    started with them replicates over TLS too."""
    cert, key = (pki.server_cert, pki.server_key)
    if expired:
        cert, key = (pki.expired_cert, pki.expired_key)
    return (
        "--tls-cert-file", str(cert), "--tls-key-file", str(key),
        "--tls-ca-cert-file", str(pki.ca), "--tls-auth-clients", "yes",
        "--tls-replication", "yes",
    )  # fmt: skip


class TlsRedisServer(RedisServer):
    """A redis-server listening on a TLS port only (`port` is the TLS port)."""

    pki: Pki

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"rediss://{auth}127.0.0.1:{self.port}"

    def start(self, *, wait_s: float = 10.0) -> TlsRedisServer:
        # RedisServer.start passes --port; ours come after it and win: TLS port only.
        self.extra_args = ("--tls-port", str(self.port), "--port", "0", *self.extra_args)
        super().start(wait_s=wait_s)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            password=self.password,
            socket_timeout=5,
            ssl=True,
            ssl_ca_certs=str(self.pki.ca),
            ssl_certfile=str(self.pki.client_cert),
            ssl_keyfile=str(self.pki.client_key),
            ssl_cert_reqs=ssl.CERT_NONE,  # the expired-certificate server must answer too
            ssl_check_hostname=False,
        )
