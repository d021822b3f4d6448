"""The README stays true: its CLI reference is what the parser says, its Python examples import
what exists, the notebooks and deployments it names exist, and infra/prefect.yaml deploys flows
that accept its parameters."""

from __future__ import annotations

import ast
import importlib
import re

import pytest

from flows.cli_reference import README, render, replace_block

ROOT = README.parent
TEXT = README.read_text(encoding="utf-8")


def test_cli_reference_is_current() -> None:
    assert replace_block(TEXT, render()) == TEXT, (
        "README.md's CLI reference is stale: run `python -m flows.cli_reference --write`"
    )


def test_every_command_is_documented() -> None:
    import argparse

    from flows.cli import build_parser

    parser = build_parser()
    [commands] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for name in commands.choices:
        assert f"`rollyard {name}" in TEXT, f"rollyard {name} is missing from README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", TEXT, flags=re.DOTALL)


def test_python_examples_import_what_exists() -> None:
    blocks = _python_blocks()
    assert blocks
    for block in blocks:
        tree = ast.parse(block)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module:
                module = importlib.import_module(node.module)
                for alias in node.names:
                    assert hasattr(module, alias.name), f"{node.module}.{alias.name}"


def test_named_notebooks_and_links_exist() -> None:
    for stem in re.findall(r"`(\w+)` \(", TEXT[TEXT.index("## Notebooks") :][:1500]):
        assert (ROOT / "notebooks" / f"{stem}.ipynb").is_file(), stem
    for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", TEXT):
        if target == "docs/DESIGN.md":
            continue  # the README announces it "once present"
        assert (ROOT / target).exists(), f"README links to missing {target}"


def test_documented_deployments_are_the_served_ones() -> None:
    from flows.deployments import ServeSettings, build_deployments

    deployments = build_deployments(
        ServeSettings(store="s", tasks_dir="t", eval_tasks_dir="h", paused=True)
    )
    for deployment in deployments:
        assert f"`{deployment.flow_name}/{deployment.name}`" in TEXT


def test_prefect_yaml_deploys_flows_that_accept_its_parameters() -> None:
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load((ROOT / "infra" / "prefect.yaml").read_text())
    names = set()
    for deployment in spec["deployments"]:
        path, function = deployment["entrypoint"].split(":")
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        flow = getattr(module, function)
        flow.validate_parameters(deployment["parameters"])  # raises on a wrong parameter
        # Every deployment runs on a schedule but the policy evaluation, run on demand.
        assert deployment.get("schedules") or deployment["name"] == "evaluate-policy"
        names.add(deployment["name"])
    assert names == {"nightly-curation", "training", "evaluate-checkpoints", "evaluate-policy"}
