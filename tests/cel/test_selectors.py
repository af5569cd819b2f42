"""The selector layer: caches, checks both engines share, per-device errors."""

from __future__ import annotations

import pytest

from dra_driver.cel import (
    CelCompileError,
    CelRuntimeError,
    EngineUnavailable,
    SelectorEvaluator,
    available_engines,
    cel_device,
    load_engine,
)
from dra_driver.cel.selectors import MAX_EXPRESSION_LENGTH

ENGINES = ("cel-expr-python", "cel-python")
GPU = {
    "name": "g",
    "attributes": {"type": {"string": "gpu"}},
    "capacity": {"memory": {"value": "1Gi"}},
}


@pytest.fixture(params=ENGINES)
def evaluator(request: pytest.FixtureRequest) -> SelectorEvaluator:
    return SelectorEvaluator(load_engine(request.param))


def test_both_engines_installed_and_cpp_preferred() -> None:
    assert available_engines() == list(ENGINES)
    assert load_engine().name == "cel-expr-python"
    with pytest.raises(EngineUnavailable, match="unknown CEL engine"):
        load_engine("cel-rust")


def test_programs_and_devices_are_converted_once(evaluator: SelectorEvaluator) -> None:
    built = []

    def device():
        built.append(1)
        return cel_device("gpu.nvidia.com", GPU)

    expr = 'device.attributes["gpu.nvidia.com"].type == "gpu"'
    for _ in range(5):
        assert evaluator.matches(expr, "g", device)
        assert not evaluator.matches('device.driver == "x"', "g", device)
    assert (evaluator.compiles, evaluator.conversions, len(built)) == (2, 1, 1)


def test_compile_errors_are_cached_and_raised_every_time(evaluator: SelectorEvaluator) -> None:
    for _ in range(2):
        with pytest.raises(CelCompileError, match="undefined field 'nope'"):
            evaluator.compile("device.nope == 1")
    assert evaluator.compiles == 1


def test_too_long_expression_is_rejected(evaluator: SelectorEvaluator) -> None:
    expr = "true" + " && true" * (MAX_EXPRESSION_LENGTH // 8)
    with pytest.raises(CelCompileError, match="characters long"):
        evaluator.compile(expr)


def test_field_names_inside_strings_are_not_fields(evaluator: SelectorEvaluator) -> None:
    dev = cel_device("gpu.nvidia.com", GPU)
    assert not evaluator.matches('device.driver == "device.nope"', "g", lambda: dev)


def test_bad_version_attribute_is_a_runtime_error_on_that_device(
    evaluator: SelectorEvaluator,
) -> None:
    bad = {"name": "b", "attributes": {"v": {"version": "1.0"}}}
    with pytest.raises(CelRuntimeError, match="semantic version"):
        evaluator.matches("true", "b", lambda: cel_device("d", bad))


def test_list_type_attributes_are_lists(evaluator: SelectorEvaluator) -> None:
    # DRAListTypeAttributes (alpha): `ints`, `versions`, ... attributes are CEL lists.
    raw = {"name": "l", "attributes": {"numa": {"ints": [0, 1]}, "vs": {"versions": ["1.2.0"]}}}
    dev = cel_device("gpu.nvidia.com", raw)
    attrs = 'device.attributes["gpu.nvidia.com"]'
    assert evaluator.matches(f"1 in {attrs}.numa && {attrs}.vs[0].minor() == 2", "l", lambda: dev)
    assert not evaluator.matches(f"2 in {attrs}.numa", "l", lambda: dev)
