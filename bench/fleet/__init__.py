"""Fleet-scale bench of the driver on a real control plane: ``python -m bench.fleet``."""
