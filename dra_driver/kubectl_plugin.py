"""``kubectl dra ...``: kubectl runs ``kubectl-dra`` from PATH with the words after ``dra``.

``kubectl dra explain CLAIM`` and ``kubectl dra simulate -f ...`` are the same
as the ``dra-driver`` commands; the kubeconfig comes from $KUBECONFIG or
``--kubeconfig``, as for kubectl itself.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from dra_driver.cli import main as dra_driver_main

SUBCOMMANDS = ("explain", "simulate")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in SUBCOMMANDS:
        print(
            "usage: kubectl dra {explain CLAIM | simulate -f FILE} [options]\n"
            "  explain   why a ResourceClaim got its devices, or why it stays pending\n"
            "  simulate  allocate claims offline exactly as the kube-scheduler would",
            file=sys.stderr,
        )
        return 0 if args[:1] in (["-h"], ["--help"]) else 2
    return dra_driver_main(args)


if __name__ == "__main__":
    sys.exit(main())
