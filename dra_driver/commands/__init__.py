"""One module per ``dra-driver`` subcommand (see :data:`dra_driver.cli.COMMANDS`)."""
