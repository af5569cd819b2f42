"""The one quantity parser (dra_driver.quantity): Kubernetes' rules, exact values, and the
limits that keep a hostile string cheap. The daemon's configs and CEL's quantity library
both read quantities through it."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

from dra_driver.quantity import (
    Quantity,
    QuantityError,
    QuantityRangeError,
    from_canonical,
    parse,
    parse_quantity,
    pod_requests,
)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1Gi", 2**30),
        ("1536Mi", Fraction(3, 2) * 2**30),
        ("1.5k", 1500),
        ("1.5", Fraction(3, 2)),
        ("5.", 5),
        (".5", Fraction(1, 2)),
        ("+2", 2),
        ("-1", -1),
        ("1e3", 1000),
        ("1E3", 1000),
        ("2E", 2 * 10**18),  # E alone is exa, not an exponent
        ("1Ei", 2**60),
        ("100m", Fraction(1, 10)),
        ("1n", Fraction(1, 10**9)),
        ("9223372036854775807", 2**63 - 1),
    ],
)
def test_values_are_exact(text: str, value: Fraction | int) -> None:
    assert parse_quantity(text).value == value
    assert parse(text) == value


def test_comparison_is_semantic_and_finer_than_1n_rounds_up_away_from_zero() -> None:
    assert parse_quantity("1Gi") == parse_quantity("1024Mi")
    assert parse_quantity("1e-3") == parse_quantity("1m")
    assert parse_quantity("0.1n") == parse_quantity("1n")
    assert parse_quantity("-0.1n").value * 10**9 == -1
    assert parse_quantity("1e-999999999").value == Fraction(1, 10**9)  # and fast
    assert parse_quantity("0e-999999999").value == 0


@pytest.mark.parametrize(
    "bad", ["", "1GiB", "Gi", "1.2.3", "1 Gi", " 1Gi", "++1", "10 GB", "1" * 41]
)
def test_not_quantities(bad: str) -> None:
    with pytest.raises(QuantityError, match="is not a quantity"):
        parse_quantity(bad)


@pytest.mark.parametrize("big", ["1e41", "1e5000", "1e999999999", "1e" + "9" * 5000])
def test_huge_exponents_are_out_of_range_at_once(big: str) -> None:
    t0 = time.perf_counter()
    with pytest.raises(QuantityRangeError, match="out of range"):
        parse_quantity(big)
    assert time.perf_counter() - t0 < 0.1
    assert parse_quantity("1e40").value == 10**40


def test_configs_give_integers_too_but_not_bools_or_floats() -> None:
    assert parse(4096) == 4096
    for bad in (True, 1.5, None):
        with pytest.raises(QuantityError):
            parse(bad)  # type: ignore[arg-type]


def test_integers_as_cel_converts_them() -> None:
    assert parse_quantity("8Gi").as_integer() == 8 * 2**30
    for bad in ("1.5", "9223372036854775808"):
        assert not parse_quantity(bad).is_integer()
        with pytest.raises(QuantityError, match="cannot convert"):
            parse_quantity(bad).as_integer()


def test_canonical_form_round_trips_and_keeps_the_spelling_for_messages() -> None:
    q = parse_quantity("1536Mi")
    assert str(q) == "1536Mi" and q.canonical == str(3 * 2**29)
    assert from_canonical(q.canonical) == q
    assert str(Quantity(Fraction(1, 3))) == "1/3"
    assert q.add(parse_quantity("512Mi")) == parse_quantity("2Gi")
    assert q.sub(1).compare(q) == -1 and q.sign() == 1


def test_a_pods_requests_sum_its_containers_rounded_up_and_missing_ones_count_zero() -> None:
    pod = {"spec": {"containers": [
        {"resources": {"requests": {"cpu": "500m", "memory": "1Gi"}}},
        {"resources": {"requests": {"cpu": "1.0001", "memory": "512Mi", "nvidia.com/x": "1"}}},
        {"resources": {"requests": {"cpu": "", "memory": None}}},
        {"name": "no-resources"},
    ]}}  # fmt: skip
    assert pod_requests(pod) == (1501, 1536)
    assert pod_requests({"spec": {"containers": [{"resources": {"requests": {"memory": "1"}}}]}}) \
        == (0, 1)  # fmt: skip
    assert pod_requests({}) == (0, 0)
