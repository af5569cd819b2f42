"""Which strings the API server accepts as names: the one place the driver checks a
DNS label (a namespace, a UID, a pod UID), a DNS subdomain (an object or node name, a
driver name) and a label value before they go into API paths, object names, labels
or file names. Each caller words its own error: the field is the caller's to name."""

from __future__ import annotations

import re

_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_LABEL = re.compile(rf"^{_LABEL}$")
_DNS_SUBDOMAIN = re.compile(rf"^{_LABEL}(\.{_LABEL})*$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def is_dns_label(value: str, max_len: int = 63) -> bool:
    """Lower-case letters, digits and '-', starting and ending alphanumeric."""
    return len(value) <= max_len and bool(_DNS_LABEL.match(value))


def is_dns_subdomain(value: str, max_len: int = 253) -> bool:
    """DNS labels joined by '.' (the API server's check of most object names)."""
    return len(value) <= max_len and bool(_DNS_SUBDOMAIN.match(value))


def is_label_value(value: str) -> bool:
    """Empty, or up to 63 of letters, digits, '-', '_' and '.', alphanumeric at both ends."""
    return len(value) <= 63 and bool(_LABEL_VALUE.match(value))
