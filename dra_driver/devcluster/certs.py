"""Per-run TLS material for the test control plane.

Every cluster gets a fresh CA, a serving certificate for the loopback address
(shared by kube-apiserver, kube-scheduler and kube-controller-manager), an
admin client certificate in ``system:masters`` and a ServiceAccount signing
key pair. Nothing is reused between runs, so no test can depend on stale
credentials. Private keys are written with mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_VALIDITY = datetime.timedelta(days=7)
_CLOCK_SKEW = datetime.timedelta(minutes=5)


@dataclass(frozen=True)
class ClusterCerts:
    """Paths of the PEM files a cluster run uses."""

    ca_cert: Path
    ca_key: Path
    serving_cert: Path
    serving_key: Path
    admin_cert: Path
    admin_key: Path
    sa_public_key: Path
    sa_private_key: Path


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey
) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + _VALIDITY)
    )


def generate_certs(directory: Path) -> ClusterCerts:
    """Create all certificates and keys for one run under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("dra-driver-test-ca")
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
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
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)
        .sign(ca_key, hashes.SHA256())
    )

    def leaf(
        subject: x509.Name, usage: x509.ObjectIdentifier, san: x509.SubjectAlternativeName | None
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        builder = (
            _builder(subject, ca_name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
            )
        )
        if san is not None:
            builder = builder.add_extension(san, critical=False)
        return builder.sign(ca_key, hashes.SHA256()), key

    serving_san = x509.SubjectAlternativeName(
        [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
            # The in-cluster "kubernetes" Service IP (first of 10.0.0.0/24).
            x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
            x509.DNSName("kubernetes.default.svc"),
        ]
    )
    serving_cert, serving_key = leaf(
        _name("kube-apiserver"), ExtendedKeyUsageOID.SERVER_AUTH, serving_san
    )
    admin_cert, admin_key = leaf(
        _name("dra-driver-admin", "system:masters"), ExtendedKeyUsageOID.CLIENT_AUTH, None
    )
    # RSA: the ServiceAccount issuer publishes RS256 by default and every
    # client library verifies it.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    certs = ClusterCerts(
        ca_cert=directory / "ca.crt",
        ca_key=directory / "ca.key",
        serving_cert=directory / "serving.crt",
        serving_key=directory / "serving.key",
        admin_cert=directory / "admin.crt",
        admin_key=directory / "admin.key",
        sa_public_key=directory / "sa.pub",
        sa_private_key=directory / "sa.key",
    )
    pem = serialization.Encoding.PEM
    certs.ca_cert.write_bytes(ca_cert.public_bytes(pem))
    _write_private(certs.ca_key, _key_pem(ca_key))
    certs.serving_cert.write_bytes(serving_cert.public_bytes(pem))
    _write_private(certs.serving_key, _key_pem(serving_key))
    certs.admin_cert.write_bytes(admin_cert.public_bytes(pem))
    _write_private(certs.admin_key, _key_pem(admin_key))
    certs.sa_public_key.write_bytes(
        sa_key.public_key().public_bytes(pem, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    _write_private(certs.sa_private_key, _key_pem(sa_key))
    return certs


def issue_client_cert(
    certs: ClusterCerts, directory: Path, common_name: str, organization: str | None = None
) -> tuple[Path, Path]:
    """A client certificate signed by the run's CA, e.g. ``system:node:<name>`` in
    ``system:nodes`` for a kubelet (the Node authorizer keys on exactly that).
    Returns ``(cert, key)`` paths; the key is written 0600."""
    return _issue(certs, directory, _name(common_name, organization),
                  ExtendedKeyUsageOID.CLIENT_AUTH, None)  # fmt: skip


def issue_serving_cert(certs: ClusterCerts, directory: Path, common_name: str) -> tuple[Path, Path]:
    """A serving certificate for 127.0.0.1 signed by the run's CA: for a component the
    API server calls back (an admission webhook at ``https://127.0.0.1:<port>``), which
    it verifies against that CA. Returns ``(cert, key)`` paths; the key is written 0600."""
    san = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    return _issue(certs, directory, _name(common_name), ExtendedKeyUsageOID.SERVER_AUTH, san)


def _issue(
    certs: ClusterCerts,
    directory: Path,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    san: x509.SubjectAlternativeName | None,
) -> tuple[Path, Path]:
    ca_cert = x509.load_pem_x509_certificate(certs.ca_cert.read_bytes())
    ca_key = serialization.load_pem_private_key(certs.ca_key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{certs.ca_key}: expected an EC CA key")
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        _builder(subject, ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    if san is not None:
        builder = builder.add_extension(san, critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    directory.mkdir(parents=True, exist_ok=True)
    common_name = subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value
    stem = str(common_name).replace(":", "-")
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_private(key_path, _key_pem(key))
    return cert_path, key_path
