"""Allow ``python -m dra_driver``."""

from dra_driver.cli import entry

entry()
