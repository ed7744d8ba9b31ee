"""TLS for docker-compose.yml's NATS cluster: a private CA and the one certificate its nodes share.

deploy/nats/compose_auth.py keeps them in the `nats-auth` volume: the nodes serve clients and
routes with CERT_FILE and KEY_FILE and trust CA_FILE for routes (deploy/nats/nats-N.conf); each
role's login volume gets CA_FILE alone, the only CA its services trust (LANEWAY_NATS_TLS_CA).

The CA's key is never written: it signs the certificate and is dropped, so nothing else can ever
be issued under that CA. The certificate is kept across runs while it is valid for 30 more days,
for the same names, with its key and CA; otherwise a new CA issues a new one (the services trust
the new CA once restarted). Routes are mutual TLS (nats-server verifies a route's certificate
against the cluster's CA), so the one certificate serves both ends: server and client auth.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from laneway.nats_config import write_private

CA_FILE, CERT_FILE, KEY_FILE = "ca.pem", "nats-tls.crt", "nats-tls.key"
LIFETIME = timedelta(days=3650)
RENEW_BEFORE = timedelta(days=30)


def _name(common_name: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Laneway compose"),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePrivateKey, now: datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + LIFETIME)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def issue(names: list[str], now: datetime) -> tuple[bytes, bytes, bytes]:
    """(CA certificate, certificate for `names`, its key), PEM."""
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("Laneway compose NATS CA")
    ca = (
        _builder(ca_name, ca_name, ca_key, now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert = (
        _builder(_name(names[0]), ca_name, key, now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ca.public_bytes(serialization.Encoding.PEM), cert.public_bytes(serialization.Encoding.PEM), key_pem


def _spki(public_key: PublicKeyTypes) -> bytes:
    return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def still_good(ca_pem: bytes, cert_pem: bytes, key_pem: bytes, names: list[str], now: datetime) -> bool:
    """The kept certificate: issued by that CA, for those names, with that key, not about to expire."""
    try:
        ca, cert = x509.load_pem_x509_certificate(ca_pem), x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, password=None)
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, InvalidSignature, x509.ExtensionNotFound):
        return False
    return (
        _spki(key.public_key()) == _spki(cert.public_key())
        and sorted(sans.get_values_for_type(x509.DNSName)) == sorted(names)
        and cert.not_valid_after_utc - RENEW_BEFORE > now
        and ca.not_valid_after_utc - RENEW_BEFORE > now
    )


def ensure(out: Path, names: list[str], now: datetime | None = None) -> bytes:
    """The CA (PEM) of the certificate for `names` kept in `out`, issued there first if need be."""
    now = now or datetime.now(UTC)
    paths = [out / f for f in (CA_FILE, CERT_FILE, KEY_FILE)]
    if all(p.exists() for p in paths) and still_good(*(p.read_bytes() for p in paths), names, now):
        return paths[0].read_bytes()
    ca_pem, cert_pem, key_pem = issue(names, now)
    write_private(paths[2], key_pem.decode())
    for path, pem in zip(paths[:2], (ca_pem, cert_pem), strict=True):
        path.write_bytes(pem)
    return ca_pem
