"""The CA a Laneway process trusts for NATS over TLS: LANEWAY_NATS_TLS_CA or --nats-tls-ca, and the
context `connect()` and `connect_once()` hand to nats-py (that CA alone; the system's without it)."""

from __future__ import annotations

import argparse
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from core.connect import NatsSettings
from laneway.flags import add_nats_flags, nats_from_args, nats_from_env


def parsed(*argv: str) -> NatsSettings:
    parser = argparse.ArgumentParser()
    add_nats_flags(parser)
    return nats_from_args(parser.parse_args(list(argv)))


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test CA")])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = tmp_path / "ca.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def test_the_ca_comes_from_the_environment_or_the_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LANEWAY_NATS_TLS_CA", raising=False)
    assert nats_from_env().tls_ca is None and parsed().tls_ca is None
    monkeypatch.setenv("LANEWAY_NATS_TLS_CA", "")
    assert nats_from_env().tls_ca is None, "an empty variable sets no CA"
    monkeypatch.setenv("LANEWAY_NATS_TLS_CA", "/run/laneway/nats/ca.pem")
    assert nats_from_env().tls_ca == "/run/laneway/nats/ca.pem"
    assert parsed().tls_ca == "/run/laneway/nats/ca.pem"
    assert parsed("--nats-tls-ca", "/elsewhere/ca.pem").tls_ca == "/elsewhere/ca.pem", "the flag wins"


def test_the_context_trusts_that_ca_alone_and_checks_the_name(ca: Path) -> None:
    context = NatsSettings(url="tls://nats-1:4222", tls_ca=str(ca)).tls_context()
    assert isinstance(context, ssl.SSLContext)
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert [c["subject"] for c in context.get_ca_certs()] == [((("commonName", "test CA"),),)]


def test_without_a_ca_nats_py_keeps_the_systems_trust() -> None:
    assert NatsSettings(url="tls://nats-1:4222").tls_context() is None


def test_a_missing_ca_file_fails_at_connect_not_silently(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        NatsSettings(tls_ca=str(tmp_path / "absent.pem")).tls_context()
