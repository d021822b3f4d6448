"""The private-names contract of `make lint` catches imports of another part's private names."""

from __future__ import annotations

import textwrap
from pathlib import Path

import grimp
import pytest
from importlinter.domain.contract import InvalidContractOptions

from tools.import_contracts import PrivateImport, PrivateNamesContract


def _write(root: Path, files: dict[str, str]) -> None:
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))


def _violations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[PrivateImport]:
    monkeypatch.syspath_prepend(str(tmp_path))
    graph = grimp.build_graph("alpha", "beta", cache_dir=None)
    contract = PrivateNamesContract(
        name="no private names across parts",
        session_options={},
        contract_options={"packages": ["alpha", "beta"], "split_packages": ["alpha"]},
    )
    check = contract.check(graph, verbose=False)
    violations: list[PrivateImport] = check.metadata["violations"]
    assert check.kept == (not violations)
    return sorted(violations, key=lambda v: (v.importer, v.line_number))


# A package split into parts (alpha.one, alpha.two, alpha's own modules) and a plain one (beta).
_TREE = {
    "alpha/__init__.py": "",
    "alpha/top.py": "def _helper() -> int:\n    return 1\n",
    "alpha/one/__init__.py": "",
    "alpha/one/core.py": "def _secret() -> int:\n    return 1\n\ndef public() -> int:\n    return 2\n",
    "alpha/one/inside.py": "from .core import _secret\nfrom alpha.one import core\nx = core._secret()\n",
    "alpha/two/__init__.py": "",
    "alpha/two/clean.py": "from alpha.one.core import public\nfrom alpha.one import core\ny = core.public()\n",
    "beta/__init__.py": "",
}


def test_a_clean_tree_keeps_the_contract(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, _TREE)
    assert _violations(tmp_path, monkeypatch) == []


def test_private_names_taken_across_parts_break_the_contract(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    planted = {
        # another sub-package, absolute and relative
        "alpha/two/reach.py": "from alpha.one.core import _secret\nfrom ..one.core import _secret as s\n",
        # another top-level package, through a module attribute
        "beta/reach.py": "from alpha.one import core\n\nz = core._secret()\n",
        # the split package's own top-level modules are a part too
        "alpha/one/up.py": "import alpha.top\n\nw = alpha.top._helper()\n",
    }
    _write(tmp_path, {**_TREE, **planted})
    assert _violations(tmp_path, monkeypatch) == [
        PrivateImport("alpha.one.up", 3, "alpha.top._helper", "alpha"),
        PrivateImport("alpha.two.reach", 1, "alpha.one.core._secret", "alpha.one"),
        PrivateImport("alpha.two.reach", 2, "alpha.one.core._secret", "alpha.one"),
        PrivateImport("beta.reach", 3, "alpha.one.core._secret", "alpha.one"),
    ]


def test_a_split_package_missing_from_packages_is_refused() -> None:
    with pytest.raises(InvalidContractOptions) as refused:
        PrivateNamesContract(
            name="misconfigured",
            session_options={},
            contract_options={"packages": ["beta"], "split_packages": ["alpha"]},
        )
    assert "alpha" in refused.value.errors["split_packages"]
