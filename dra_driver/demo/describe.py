"""What the walkthrough prints about a prepared claim: the GPU tool commands our plugin
ran for it (the emulated tools record each) and a CDI spec in a few lines."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dra_driver.demo.realgpu import RealGpuNode


def gpu_commands(
    node: RealGpuNode, claim: dict[str, Any], attrs: dict[str, dict[str, Any]]
) -> list[str]:
    """GPU tool invocations for this claim's devices (emulated tools record them)."""
    record = node.host_root / "emulation" / "tools.jsonl"
    if not record.exists():
        return []
    uuids = {attrs.get(d["device"], {}).get("uuid", {}).get("string") for d in claim["devices"]}
    uuids.discard(None)
    commands = []
    for line in record.read_text().splitlines():
        call = json.loads(line)
        if call.get("tool") == "mps-daemon" or "argv" not in call:
            continue
        words = [call["tool"], *call["argv"]]
        env = call.get("env", {})
        mine = any(u in words or u == env.get("CUDA_VISIBLE_DEVICES") for u in uuids)
        if mine or claim["uid"] in env.get("CUDA_MPS_PIPE_DIRECTORY", ""):
            stdin = call.get("stdin", "").strip().replace("\n", "; ")
            commands.append(" ".join(words) + (f" <<< {stdin!r}" if stdin else ""))
    return commands


def spec_summary(spec: dict[str, Any]) -> list[str]:
    """A CDI spec in a few indented lines: per device, then what every container gets."""
    lines = [f"      cdiVersion {spec['cdiVersion']}, kind {spec['kind']}"]
    for dev in spec["devices"]:
        edits = dev["containerEdits"]
        parts = [f"{n['path']} (c {n.get('major')}:{n.get('minor')})"
                 for n in edits.get("deviceNodes", [])]  # fmt: skip
        parts += edits.get("env", [])
        parts += [f"mount {m['containerPath']}" for m in edits.get("mounts", [])]
        lines.append(f"      device {dev['name']}: {'; '.join(parts)}")
    common = spec.get("containerEdits", {})
    nodes = ", ".join(n["path"] for n in common.get("deviceNodes", []))
    mounts = common.get("mounts", [])
    libs = [Path(m["containerPath"]).name for m in mounts]
    lines.append(
        f"      every container using it also gets: env {', '.join(common.get('env', []))}; "
        f"device nodes {nodes}; {len(mounts)} read-only driver files "
        f"({', '.join(libs[:3])}{', ...' if len(libs) > 3 else ''})"
    )
    return lines
