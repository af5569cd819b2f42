"""Fixtures for the plugin-layer tests: a running KubeletPlugin on real unix sockets."""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import pytest

from dra_driver.plugin.app import KubeletPlugin, PluginSettings
from tests.plugin.fakes import DRIVER, FakeApiServer, FakeBackend


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths must stay under 108 bytes; pytest's tmp_path can be longer."""
    path = Path(tempfile.mkdtemp(prefix="dra-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        server.add_node("node-a")
        yield server


@dataclass
class RunningPlugin:
    plugin: KubeletPlugin
    backend: FakeBackend
    api: FakeApiServer
    settings: PluginSettings

    def channel(self, path: Path | None = None) -> grpc.Channel:
        return grpc.insecure_channel(f"unix:{path or self.plugin.paths.dra}")


StartPlugin = Callable[..., RunningPlugin]


@pytest.fixture
def start_plugin(short_dir: Path, api: FakeApiServer) -> Iterator[StartPlugin]:
    started: list[KubeletPlugin] = []

    def start(backend: FakeBackend | None = None, **overrides: Any) -> RunningPlugin:
        settings = PluginSettings(
            driver_name=DRIVER,
            node_name="node-a",
            registry_dir=short_dir / "registry",
            plugins_dir=short_dir / "plugins",
            health_interval_s=0.3,
            cleanup_interval_s=3600,
        )
        settings = replace(settings, **overrides)
        backend = backend or FakeBackend()
        plugin = KubeletPlugin(
            settings=settings,
            backend=backend,
            logger=logging.getLogger("test.plugin"),
            client=api.client(timeout_s=settings.api_timeout_s),
        )
        plugin.start()
        started.append(plugin)
        return RunningPlugin(plugin, backend, api, settings)

    yield start
    for plugin in started:
        plugin.stop(grace_s=0)
