"""``python -m bench.rolling``: real plugin processes on many nodes, restarted in turn as a
DaemonSet rolling update restarts them; what each start and each idle hour costs the
API server. See docs/scale.md ("Rolling update")."""
