"""One corpus, three evaluators: Kubernetes' own CEL code, cel-expr-python and cel-python.

The Go oracle proves each ``k8s`` expectation is what the scheduler really
does; each engine must match it except for the divergences the corpus lists,
and a listed divergence that no longer diverges fails as well.
"""

from __future__ import annotations

from typing import Any

import pytest

from dra_driver.cel import CelCompileError, CelRuntimeError, SelectorEvaluator, load_engine
from dra_driver.cel.device import cel_device
from tests.cel.conftest import CASES, DEVICES, Case, api_device, oracle_outcome

ENGINES = ("cel-expr-python", "cel-python")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_expectation_is_what_kubernetes_does(
    case: Case, oracle_answers: dict[str, dict[str, Any]]
) -> None:
    answer = oracle_answers[case.id]
    assert oracle_outcome(answer) == case.k8s, answer


@pytest.fixture(scope="module", params=ENGINES)
def evaluator(request: pytest.FixtureRequest) -> SelectorEvaluator:
    # Both engines are test dependencies: a missing one fails here, never skips.
    return SelectorEvaluator(load_engine(request.param))


def engine_outcome(evaluator: SelectorEvaluator, case: Case) -> str:
    device = cel_device(DEVICES[case.device]["driver"], api_device(case.device))
    try:
        return str(evaluator.matches(case.expr, case.device, lambda: device)).lower()
    except CelCompileError:
        return "compile"
    except CelRuntimeError:
        return "runtime"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_engine_matches_kubernetes_or_documented_divergence(
    evaluator: SelectorEvaluator, case: Case
) -> None:
    got = engine_outcome(evaluator, case)
    divergence = case.divergences.get(evaluator.engine_name)
    if divergence is None:
        assert got == case.k8s, f"{evaluator.engine_name} diverges from Kubernetes"
    else:
        assert str(divergence["got"]).lower() != case.k8s, "a divergence must differ"
        assert got == str(divergence["got"]).lower(), (
            f"documented divergence ({divergence['why']}) is not what happens"
        )


def test_corpus_covers_every_engine_divergence_class() -> None:
    # Sanity on the corpus itself: enough cases, each outcome kind present.
    kinds = {c.k8s for c in CASES}
    assert kinds == {"true", "false", "compile", "runtime"}
    assert len(CASES) >= 100
