"""`rollyard demo`: the README's main job on embedded defaults."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    demo = subparsers.add_parser("demo", help="run the main job on embedded defaults")
    demo.set_defaults(handler=demo_command)


def demo_command(args: argparse.Namespace) -> int:
    from sandboxes import Limits, open_sandbox

    with tempfile.TemporaryDirectory() as scratch:
        workspace = Path(scratch) / "workspace"
        workspace.mkdir()
        (workspace / "calc.py").write_text("def add(a, b):\n    return a - b\n")
        (workspace / "test_calc.py").write_text(
            "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
        )
        with open_sandbox(workspace, limits=Limits(memory_mb=512)) as sandbox:
            print(f"sandbox over snapshot {sandbox.snapshot_digest[:19]}...")
            before = sandbox.execute("python -m pytest -q -p no:cacheprovider")
            print(f"tests before the fix: exit {before.exit_code} ({before.duration_s * 1000:.0f} ms)")
            sandbox.write_file("calc.py", "def add(a, b):\n    return a + b\n")
            after = sandbox.execute("python -m pytest -q -p no:cacheprovider")
            print(f"tests after the fix:  exit {after.exit_code} ({after.duration_s * 1000:.0f} ms)")
            escape = sandbox.execute("cat /etc/shadow; python -c \"import socket; "
                                     "socket.create_connection(('1.1.1.1', 53), timeout=2)\"")
            print(f"escape attempts: exit {escape.exit_code}; {escape.stderr.strip().splitlines()[-1]}")
            print("diff:", json.dumps(sandbox.diff().changed_paths))
            sandbox.reset()
            print("after reset, diff:", json.dumps(sandbox.diff().changed_paths))
    return 0 if after.exit_code == 0 and before.exit_code != 0 else 1
