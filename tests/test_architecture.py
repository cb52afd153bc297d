"""The architecture of docs/architecture.md, checked.

* Layers: every import of every module under anychip/ (at module level, inside
  functions and under ``if TYPE_CHECKING:``) goes from a module to a layer its own
  layer may use (the table ``MAY_IMPORT``, the same as the document's).
* Cycles: no two modules import each other, directly or through others, counting
  imports inside functions (imports only for type checkers do not run, so they do
  not count here).
* Faces: each public name has one home. A package face (``anychip.<package>``'s
  ``__all__``) exports only what its package defines, no two package faces export
  the same object, ``anychip``'s own ``__all__`` takes each name from exactly one
  package face, and every name a private module (``_name.py``) lists in its
  ``__all__`` is exported by exactly one face (as trio's test_exports.py checks
  trio._core).

The checks of the import graph read the sources with ``ast`` and import nothing, so
they also check code that cannot be imported here (a backend without its library).
"""
from __future__ import annotations

import ast
import importlib
import re
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "anychip"

#: layer -> the modules that form it: each top-level module of the package by name (a package
#: with its submodules; ``anychip`` is only its ``__init__``), so that a new one must be placed here
LAYERS: dict[str, tuple[str, ...]] = {
    "base": ("anychip._version", "anychip._lib", "anychip._format"),
    "runtime": ("anychip.runtime", "anychip._data"),
    "chips": ("anychip.chips",),
    "collectives": ("anychip.collectives",),
    "tensor": ("anychip.tensor",),
    "parallel": ("anychip.parallel",),
    "frameworks": ("anychip.torch", "anychip._torch_autoload", "anychip.paddle_provider"),
    "conformance": ("anychip.conformance",),
    "face": ("anychip",),
    "commands": ("anychip.cli", "anychip.scaffold", "anychip.__main__"),
}

#: layer -> the layers its modules may import (besides its own)
MAY_IMPORT: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "runtime": frozenset({"base"}),
    "chips": frozenset({"runtime", "base"}),
    "collectives": frozenset({"runtime", "base"}),
    "tensor": frozenset({"runtime", "base"}),
    "parallel": frozenset({"tensor", "collectives", "runtime", "base"}),
    "frameworks": frozenset({"collectives", "runtime", "base"}),
    "conformance": frozenset({"face", "frameworks", "collectives", "tensor", "runtime", "base"}),
    "face": frozenset({"tensor", "runtime", "base"}),
    "commands": frozenset(LAYERS) - {"commands"},
}

#: the package faces: ``anychip.<package>`` whose ``__all__`` is that package's public API.
#: anychip.chips has none on purpose: backends are reached through the registry by name.
PACKAGE_FACES = ("anychip.runtime", "anychip.collectives", "anychip.tensor", "anychip.parallel",
                 "anychip.conformance")
#: what the user face ``anychip`` defines itself (in its own top-level modules)
OWN_NAMES = {"__version__", "get_include"}


@dataclass(frozen=True)
class Import:
    source: str          # the importing module
    target: str          # the module imported (the longest known module the statement names)
    line: int
    runs: bool           # False for an import under ``if TYPE_CHECKING:``

    def __str__(self) -> str:
        return f"{self.source} (line {self.line}) imports {self.target}"


def module_files(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                skipped.update(id(n) for n in ast.walk(stmt))
    return skipped


def _known(name: str, modules: dict[str, Path]) -> str | None:
    while name not in modules and "." in name:
        name = name.rpartition(".")[0]
    return name if name in modules else None


def _targets(module: str, node: ast.Import | ast.ImportFrom, modules: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            is_package = modules[module].name == "__init__.py"
            parts = module.split(".")[: len(module.split(".")) - (node.level - (1 if is_package else 0))]
            base = ".".join(parts + ([node.module] if node.module else []))
        # ``from pkg import mod`` imports the module pkg.mod; ``from mod import name``, mod
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    for name in names:
        target = _known(name, modules)
        if target is not None:
            yield target


def imports(modules: dict[str, Path] | None = None) -> list[Import]:
    """Every import of an anychip module by an anychip module, wherever it is written."""
    modules = module_files() if modules is None else modules
    found = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(), str(path))
        typing_only = _type_checking_nodes(tree)
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in set(_targets(module, node, modules)):
                    if target != module:
                        found.append(Import(module, target, node.lineno, id(node) not in typing_only))
    return found


def layer_of(module: str) -> str:
    """The layer of ``module``: the one that names it or the package above it ("" when none does)."""
    best, length = "", -1
    for layer, prefixes in LAYERS.items():
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "anychip"   # the face is one module
            if (module == prefix or inside) and len(prefix) > length:
                best, length = layer, len(prefix)
    return best


def layer_violations(found: list[Import]) -> list[str]:
    bad = []
    for imp in found:
        src, dst = layer_of(imp.source), layer_of(imp.target)
        if src != dst and dst not in MAY_IMPORT[src]:
            bad.append(f"{imp}: the {src} layer may not import the {dst} layer "
                       f"(it may import {', '.join(sorted(MAY_IMPORT[src])) or 'nothing of anychip'})")
    return sorted(bad)


def cycles(found: list[Import]) -> list[list[str]]:
    """The import cycles (strongly connected groups of two or more modules), by Tarjan's algorithm."""
    graph: dict[str, set[str]] = {}
    for imp in found:
        if imp.runs:
            graph.setdefault(imp.source, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


def _cycle_detail(group: list[str], found: list[Import]) -> str:
    members = set(group)
    edges = sorted(str(i) for i in found if i.runs and i.source in members and i.target in members)
    return f"{' <-> '.join(group)}:\n    " + "\n    ".join(edges)


# -- the import graph ------------------------------------------------------------------------

def test_the_graph_reader_sees_imports_inside_functions_and_for_type_checkers() -> None:
    found = {(i.source, i.target): i for i in imports()}
    # an import inside a function (collectives.init chooses the host transport)
    assert ("anychip.collectives", "anychip.collectives.transports.choose") in found
    assert found[("anychip.collectives", "anychip.collectives.transports.choose")].runs
    # one under ``if TYPE_CHECKING:`` is seen, and known not to run
    assert not found[("anychip.runtime.stream", "anychip.runtime.device")].runs
    # ``from . import _ops`` names the module anychip.tensor._ops, not the package
    assert ("anychip.tensor", "anychip.tensor._ops") in found


def test_every_module_has_a_layer() -> None:
    assert [m for m in module_files() if not layer_of(m)] == []


def test_a_module_outside_the_table_has_no_layer(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "anychip/__init__.py": "",
        "anychip/bridge.py": "from .runtime import registry\n",
        "anychip/runtime/__init__.py": "",
        "anychip/runtime/registry.py": "",
        "anychip/newpkg/__init__.py": "",
        "anychip/newpkg/part.py": "",
    })
    assert [m for m in modules if not layer_of(m)] == ["anychip.bridge", "anychip.newpkg", "anychip.newpkg.part"]
    assert layer_of("anychip") == "face" and layer_of("anychip.paddle_provider") == "frameworks"


def test_a_wrong_import_of_the_face_is_reported(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "anychip/__init__.py": "",
        "anychip/runtime/__init__.py": "",
        "anychip/runtime/device.py": "import anychip\n",
        "anychip/paddle_provider.py": "from . import tensor\n",
        "anychip/tensor/__init__.py": "",
    })
    assert layer_violations(imports(modules)) == [
        "anychip.paddle_provider (line 1) imports anychip.tensor: the frameworks layer may not import the tensor "
        "layer (it may import base, collectives, runtime)",
        "anychip.runtime.device (line 1) imports anychip: the runtime layer may not import the face layer "
        "(it may import base)",
    ]


def test_imports_follow_the_layers() -> None:
    bad = layer_violations(imports())
    assert bad == [], "imports across layers that docs/architecture.md forbids:\n" + "\n".join(bad)


def test_no_import_cycle() -> None:
    found = imports()
    groups = cycles(found)
    assert groups == [], "import cycles:\n" + "\n".join(_cycle_detail(g, found) for g in groups)


def _tree(tmp_path: Path, files: dict[str, str]) -> dict[str, Path]:
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return module_files(tmp_path / "anychip")


def test_a_wrong_import_is_reported(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "anychip/__init__.py": "",
        "anychip/runtime/__init__.py": "",
        "anychip/runtime/registry.py": "def load():\n    from ..chips.cplugin import probe\n    return probe\n",
        "anychip/chips/__init__.py": "",
        "anychip/chips/cplugin.py": "from ..runtime import registry\n",
        "anychip/collectives/__init__.py": "",
        "anychip/collectives/transports/native.py": "from anychip.chips import cplugin\n",
    })
    found = imports(modules)
    assert layer_violations(found) == [
        "anychip.collectives.transports.native (line 1) imports anychip.chips.cplugin: the collectives layer may not "
        "import the chips layer (it may import base, runtime)",
        "anychip.runtime.registry (line 2) imports anychip.chips.cplugin: the runtime layer may not import "
        "the chips layer (it may import base)",
    ]
    assert cycles(found) == [["anychip.chips.cplugin", "anychip.runtime.registry"]]


#: the functions of the vendor APIs the built-in chips' C adapters bind (ACL, XPU, HIP; HCCL,
#: BKCL, RCCL): one binding per chip, so no Python module names them
VENDOR_CALL = re.compile(r"(aclrt[A-Z]\w*|acl(Init|Finalize)\w*|Hccl[A-Z]\w*|xpu_[a-z]\w*|bkcl_[a-z]\w*"
                         r"|hip[A-Z]\w*|rccl[A-Z]\w*)")
#: their type names, which the code-name tables read from the headers name (as ``hipError_t``)
VENDOR_TYPES = {"HcclResult", "HcclRootInfo", "HcclDataType", "HcclReduceOp", "HcclComm"}


def vendor_bindings(modules: dict[str, Path]) -> list[str]:
    """Where a module calls or declares a vendor API function (an attribute, a name or a string
    that is exactly such a function's name, as a cffi or ctypes binding writes it)."""
    found = []
    for module, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            word = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                    else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
            declared = (re.findall(r"\b((?:aclrt|Hccl|hip)[A-Z]\w*|(?:xpu|bkcl)_[a-z]\w*)\s*\(", word)
                        if isinstance(node, ast.Constant) and isinstance(word, str) else [])
            if word is not None and VENDOR_CALL.fullmatch(word):
                declared = [word]
            found += [f"{module} (line {node.lineno}) binds {name}" for name in declared if name not in VENDOR_TYPES
                      and not name.endswith("_t")]
    return found


def test_one_binding_per_chip() -> None:
    """The built-in chips are reached only through their C adapters (csrc/adapters/*/plugin_*.c)."""
    assert vendor_bindings(module_files()) == []


def test_a_second_binding_is_reported(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "anychip/__init__.py": "",
        "anychip/chips/__init__.py": "",
        "anychip/chips/acl.py": 'CDEF = "int aclrtMalloc(void **p, size_t n, int policy);"\n'
                                  "def malloc(lib, p, n):\n    return lib.aclrtMalloc(p, n, 0)\n",
    })
    assert vendor_bindings(modules) == ["anychip.chips.acl (line 1) binds aclrtMalloc",
                                        "anychip.chips.acl (line 3) binds aclrtMalloc"]


def test_imports_for_type_checkers_make_no_cycle(tmp_path: Path) -> None:
    modules = _tree(tmp_path, {
        "anychip/__init__.py": "",
        "anychip/runtime/__init__.py": "",
        "anychip/runtime/stream.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .device import D\n",
        "anychip/runtime/device.py": "from .stream import S\n",
    })
    assert cycles(imports(modules)) == []


# -- the faces -------------------------------------------------------------------------------

def _all(name: str) -> tuple[types.ModuleType, list[str]]:
    mod = importlib.import_module(name)
    return mod, list(getattr(mod, "__all__", []))


def _faces_of(obj: object, name: str) -> list[str]:
    faces = []
    for face in ("anychip", *PACKAGE_FACES):
        mod, names = _all(face)
        if name in names and getattr(mod, name) is obj:
            faces.append(face)
    return faces


def _defined_in(obj: object) -> str | None:
    return getattr(obj, "__module__", None) if isinstance(obj, (type, types.FunctionType)) else None


@pytest.mark.parametrize("face", ("anychip", *PACKAGE_FACES))
def test_every_name_a_face_exports_exists(face: str) -> None:
    mod, names = _all(face)
    assert names, f"{face} has no __all__"
    assert [n for n in names if not hasattr(mod, n)] == []
    assert len(names) == len(set(names)), f"{face}.__all__ names something twice"


def test_package_faces_export_their_own_package_and_nothing_twice() -> None:
    homes: dict[int, str] = {}
    bad = []
    for face in PACKAGE_FACES:
        mod, names = _all(face)
        for name in names:
            obj = getattr(mod, name)
            where = _defined_in(obj)
            if where is not None and where != face and not where.startswith(face + "."):
                bad.append(f"{face}.{name} is defined in {where}, outside the package")
            if isinstance(obj, (type, types.FunctionType)):
                if id(obj) in homes:
                    bad.append(f"{face}.{name} is also exported by {homes[id(obj)]}")
                homes[id(obj)] = face
    assert bad == []


def test_the_user_face_takes_each_name_from_one_package_face() -> None:
    _, names = _all("anychip")
    bad = []
    for name in names:
        if name in OWN_NAMES:
            continue
        obj = getattr(importlib.import_module("anychip"), name)
        homes = [f for f in _faces_of(obj, name) if f != "anychip"]
        if len(homes) != 1:
            bad.append(f"anychip.{name} is exported by {len(homes)} package faces ({', '.join(homes) or 'none'})")
    assert bad == []


def _private_modules() -> list[str]:
    """Private modules (``_name.py``) of the packages that have a face."""
    return sorted(m for m in module_files() if m.rpartition(".")[0] in PACKAGE_FACES
                  and m.rpartition(".")[2].startswith("_") and not m.startswith("anychip._"))


def test_there_are_private_modules_to_check() -> None:
    assert "anychip.tensor._tensor" in _private_modules()
    assert "anychip.collectives._bootstrap" in _private_modules()


@pytest.mark.parametrize("module", _private_modules())
def test_what_a_private_module_lists_is_exported_by_exactly_one_face(module: str) -> None:
    mod, names = _all(module)
    bad = []
    for name in names:
        faces = _faces_of(getattr(mod, name), name)
        package = [f for f in faces if f != "anychip"]
        if len(package) != 1:
            bad.append(f"{module}.{name} is listed in its __all__ and exported by "
                       f"{', '.join(faces) or 'no face'}: export it from its package's face, or drop it from "
                       "__all__ (a name only its package uses)")
    assert bad == []


def _documented_layers() -> dict[str, tuple[tuple[str, ...], frozenset[str]]]:
    """The layer table of docs/architecture.md: layer -> (module prefixes, layers it may import)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("<!-- layers: read by tests/test_architecture.py -->")
    rows = text[start:text.index("<!-- end layers -->", start)].splitlines()[3:]
    table = {}
    for row in rows:
        layer, modules, may = (cell.strip() for cell in row.strip().strip("|").split("|"))
        prefixes = tuple(m.strip().split(" ")[0].strip("`") for m in modules.split(","))
        if may == "nothing of anychip":
            allowed: frozenset[str] = frozenset()
        elif may == "every other layer":
            allowed = frozenset(LAYERS) - {layer}
        else:
            allowed = frozenset(m.strip() for m in may.split(","))
        table[layer] = (prefixes, allowed)
    return table


def test_the_rules_checked_are_the_rules_written() -> None:
    documented = _documented_layers()
    assert {k: v[0] for k, v in documented.items()} == LAYERS
    assert {k: v[1] for k, v in documented.items()} == MAY_IMPORT


# -- the C / C++ sources ----------------------------------------------------------------------

#: an #include of a C or C++ translation unit (a source is compiled and linked, never included)
INCLUDED_UNIT = re.compile(r'^[ \t]*#[ \t]*include[ \t]*[<"]([^>"]+\.(?:c|cpp|cc|cxx))[>"]', re.M)


def misplaced_units(csrc: Path) -> list[str]:
    """C / C++ translation units under the include directory (which ``anychip info --cflags`` hands
    every C user), and the #includes of one anywhere in csrc (the plugin templates included)."""
    found = [f"{p.relative_to(csrc)} is a translation unit under include/"
             for p in sorted((csrc / "include").rglob("*")) if p.suffix in (".c", ".cc", ".cpp")]
    for p in sorted(csrc.rglob("*")):
        if p.suffix in (".c", ".h", ".cc", ".cpp", ".hpp") and p.is_file():
            found += [f"{p.relative_to(csrc)} includes {name}"
                      for name in INCLUDED_UNIT.findall(p.read_text(errors="replace"))]
    return found


def test_units_are_compiled_not_included() -> None:
    """csrc, and tests/c's programs and test plugins (those over the C template include its
    internal header, src/NAME.h, and link its sources)."""
    assert misplaced_units(ROOT / "csrc") == []
    assert misplaced_units(ROOT / "tests" / "c") == []


def test_a_misplaced_unit_is_reported(tmp_path: Path) -> None:
    (tmp_path / "include" / "anychip" / "torch").mkdir(parents=True)
    (tmp_path / "include" / "anychip" / "torch" / "device.cpp").write_text("int f() { return 0; }\n")
    (tmp_path / "include" / "anychip" / "bridge.c").write_text("int g(void) { return 0; }\n")
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "module.cpp").write_text('#include <vector>\n #include "ops.cpp"\n')
    (tmp_path / "sim").mkdir()
    (tmp_path / "sim" / "embed.c").write_text('#include "ccl/ccl.h"\n#include "ccl/ccl.c"\n')
    assert misplaced_units(tmp_path) == ["include/anychip/bridge.c is a translation unit under include/",
                                         "include/anychip/torch/device.cpp is a translation unit under include/",
                                         "sim/embed.c includes ccl/ccl.c",
                                         "torch/module.cpp includes ops.cpp"]


def test_the_torch_extensions_header_lists_its_units() -> None:
    """csrc/torch/device.h, the extension's internal header, names each of its translation units."""
    here = ROOT / "csrc" / "torch"
    listed = re.findall(r"^//   (\w+\.cpp) ", (here / "device.h").read_text(), re.M)
    assert sorted(listed) == sorted(p.name for p in here.glob("*.cpp"))
