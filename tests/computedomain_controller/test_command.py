"""``dra-driver compute-domain-controller``: bad settings end it with one line naming the
flag and its variable, exit code 2, before any API call."""

from __future__ import annotations

import pytest

from dra_driver.cli import main


@pytest.mark.parametrize(
    ("flag", "variable"),
    [
        ("--workers=0", "DRA_WORKERS"),
        ("--resync-interval=0.5", "DRA_RESYNC_INTERVAL"),
        ("--lease-duration=2", "DRA_LEASE_DURATION"),
        ("--health-port=65536", "DRA_HEALTH_PORT"),
    ],
)
def test_bad_settings_are_refused_naming_the_flag(
    flag: str, variable: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["compute-domain-controller", "--namespace=ns", "--image=img", flag]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert flag.split("=")[0] in err and variable in err


def test_namespace_and_image_are_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["compute-domain-controller"])
    assert exit_.value.code == 2
    assert "--namespace" in capsys.readouterr().err


@pytest.mark.parametrize(("value", "want"), [("false", False), ("0", False), ("true", True)])
def test_leader_election_is_switched_by_its_variable(value: str, want: bool) -> None:
    from dra_driver.cli import build_parser

    parser = build_parser(environ={"DRA_LEADER_ELECT": value})
    args = parser.parse_args(["compute-domain-controller", "--namespace=ns", "--image=img"])
    assert args.leader_elect is want
    assert parser.parse_args(["compute-domain-controller", "--namespace=ns", "--image=img",
                              "--no-leader-elect"]).leader_elect is False  # fmt: skip
