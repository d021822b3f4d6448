"""The import-linter contract "no part imports another part's private names", used by `make lint`.

A part is a root package, or, for the packages named in `split_packages`, one of its sub-packages
(the package's own top-level modules form one more part). A name is private when a segment of its
dotted path starts with a single underscore: `from tasks_lib.verify import _Run`,
`import storage._engine` and `verify._Run` after `from tasks_lib import verify` all reach a private
name. Within a part anything goes; across parts only public names, so a part's underscore names
can change without reading the rest of the project.

import-linter's own `private_modules` contract sees only underscore modules, judged by their
parent package; this one sees names too, judged by part. The import graph says which module
imports which, not which names; so the contract reads each
module's source with `ast`, found from the root package's location without importing anything.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from grimp import ImportGraph
from importlinter import Contract, ContractCheck, fields, output
from importlinter.domain.contract import InvalidContractOptions


@dataclass(frozen=True, slots=True)
class PrivateImport:
    """One import of a private name across parts."""

    importer: str
    line_number: int
    imported: str
    owner_part: str


def _is_private(segment: str) -> bool:
    return segment.startswith("_") and not (segment.startswith("__") and segment.endswith("__"))


class PrivateNamesContract(Contract):
    """Fails when a module imports a private name from a module of another part."""

    packages = fields.ListField(subfield=fields.StringField())
    split_packages = fields.ListField(subfield=fields.StringField(), required=False, default=[])

    def validate(self) -> None:
        unknown = sorted(
            set(cast(list[str], self.split_packages)) - set(cast(list[str], self.packages))
        )
        if unknown:
            raise InvalidContractOptions(
                {"split_packages": f"{unknown} are not in packages: list them there too"}
            )

    def check(self, graph: ImportGraph, verbose: bool) -> ContractCheck:
        # Contract.__init__ replaces each field on the instance with its parsed value.
        roots = cast(list[str], self.packages)
        split = set(cast(list[str], self.split_packages))
        subpackages = {
            module
            for module in graph.modules
            if module.count(".") == 1
            and module.split(".")[0] in split
            and graph.find_children(module)
        }

        def part_of(module: str) -> str:
            head = ".".join(module.split(".")[:2])
            return head if head in subpackages else module.split(".")[0]

        violations: list[PrivateImport] = []
        for root in roots:
            root_dir = _package_dir(root)
            for module in sorted(graph.find_descendants(root) | {root}):
                source_file = _source_file(root_dir, root, module)
                output.verbose_print(verbose, f"Reading {module}")
                tree = ast.parse(source_file.read_bytes(), filename=str(source_file))
                is_package = source_file.name == "__init__.py"
                for line_number, target in _imported_names(tree, module, is_package, graph.modules):
                    target_root = target.split(".")[0]
                    if target_root not in roots:
                        continue
                    owner = part_of(target)
                    if owner == part_of(module):
                        continue
                    if any(_is_private(segment) for segment in target.split(".")):
                        violations.append(PrivateImport(module, line_number, target, owner))
        return ContractCheck(
            kept=not violations,
            metadata={"violations": violations},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        violations: list[PrivateImport] = check.metadata["violations"]
        for violation in violations:
            output.print_error(
                f"{violation.importer}:{violation.line_number} imports {violation.imported}, "
                f"private to {violation.owner_part}",
                bold=False,
            )
        output.new_line()
        output.print(
            "Make the name public in its part (and document it there), or move the code that "
            "needs it into that part."
        )
        output.new_line()


def _package_dir(root: str) -> Path:
    # find_spec of a top-level name locates it without executing its __init__.
    spec = importlib.util.find_spec(root)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"package {root!r} is not importable from sys.path; run from the repo root"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def _source_file(root_dir: Path, root: str, module: str) -> Path:
    relative = Path(*module.split(".")[1:])
    package_init = root_dir / relative / "__init__.py"
    if package_init.is_file():
        return package_init
    return (root_dir / relative).with_suffix(".py")


def _imported_names(
    tree: ast.Module, module: str, is_package: bool, modules: set[str]
) -> list[tuple[int, str]]:
    """Each dotted name the module takes from others, with its line.

    `from a import b` gives `a.b`; when `b` is itself a module, `b.c` further down gives `a.b.c`.
    """
    package = module if is_package else module.rpartition(".")[0]
    names: list[tuple[int, str]] = []
    bound_modules: dict[str, str] = {}  # local name -> the module it refers to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.append((node.lineno, alias.name))
                if alias.asname:
                    bound_modules[alias.asname] = alias.name
                else:
                    head = alias.name.split(".")[0]
                    bound_modules[head] = head
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                if alias.name == "*":
                    continue
                target = f"{base}.{alias.name}"
                names.append((node.lineno, target))
                if target in modules:
                    bound_modules[alias.asname or alias.name] = target
    # Only the outermost attribute of a chain: `a.b._c.d` is read once, as `a.b._c.d`.
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain = _attribute_chain(node)
            if chain is None or chain[0] not in bound_modules:
                continue
            names.append((node.lineno, ".".join([bound_modules[chain[0]], *chain[1:]])))
    return names


def _attribute_chain(node: ast.Attribute) -> list[str] | None:
    """`a.b.c` as ["a", "b", "c"]; None when the chain does not start at a plain name."""
    attributes: list[str] = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        attributes.append(current.attr)
        current = current.value
    if not isinstance(current, ast.Name):
        return None
    return [current.id, *reversed(attributes)]
