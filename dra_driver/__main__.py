"""Allow ``python -m dra_driver``."""

from dra_driver.cli import main

raise SystemExit(main())
