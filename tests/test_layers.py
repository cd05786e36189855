"""The package's import structure: layers import only downwards, no cycles, no private names.

Layers, lowest first (a module may import from its own layer and the ones below it):

    ("settings", "precision", "report"),
      < transform, pipeline < onnx < runtimes < tuning < dynamo, deploy < serve < cli
      < the package root

Every import counts, at module level, inside a function or under ``if TYPE_CHECKING:`` (a
type-only import still documents a dependency, and a cycle of them is a tangle to read).
"""

from __future__ import annotations

import ast
from pathlib import Path

import embedl_dynamo

PACKAGE = Path(embedl_dynamo.__file__).resolve().parent
ROOT = "embedl_dynamo"

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors",),
    ("graph",),
    ("cache",),
    ("settings", "precision", "report"),
    ("rewrite",),
    ("patterns",),
    ("quant",),
    ("backend", "backends"),
    ("transform", "pipeline"),
    ("onnx",),
    ("runtimes",),
    ("partition",),
    ("tuning",),
    ("dynamo", "deploy"),
    ("serve",),
    ("cli",),
    ("__init__",),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join([ROOT, *parts]) if parts != ["__init__"] else ROOT


def _layer(module: str) -> int:
    if module == ROOT:
        return len(LAYERS) - 1
    top = module.split(".")[1]
    for index, names in enumerate(LAYERS):
        if top in names:
            return index
    raise AssertionError(f"{module} belongs to no layer; add its folder to LAYERS")


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def _imports(tree: ast.AST, module: str, is_package: bool):
    """(imported module, imported names, runs at import or call time) for every import."""

    def walk(node: ast.AST, typing_only: bool):
        for child in ast.iter_child_nodes(node):
            guarded = typing_only or _is_type_checking(child)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield alias.name, (), guarded
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = module.split(".") if is_package else module.split(".")[:-1]
                    base = base[: len(base) - child.level + 1]
                    target = ".".join(base + ([child.module] if child.module else []))
                else:
                    target = child.module or ""
                yield target, tuple(a.name for a in child.names), guarded
            yield from walk(child, guarded)

    yield from walk(tree, False)


def _graph():
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        tree = ast.parse(path.read_text(), filename=str(path))
        modules[name] = list(_imports(tree, name, path.name == "__init__.py"))
    return modules


def _resolve(target: str, names: tuple[str, ...], modules: dict) -> list[str]:
    """The package modules an import statement loads (``from pkg import mod`` loads pkg.mod)."""
    submodules = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
    if submodules and len(submodules) == len(names):
        return submodules
    return ([target] if target in modules else []) + submodules


def test_every_module_imports_only_from_its_layer_or_below():
    modules = _graph()
    upward = []
    for module, imports in modules.items():
        for target, names, _ in imports:
            for dep in _resolve(target, names, modules):
                if _layer(dep) > _layer(module):
                    upward.append(f"{module} imports {dep}")
    assert not upward, "imports from a higher layer:\n" + "\n".join(sorted(set(upward)))


def test_no_import_cycles():
    modules = _graph()
    edges = {
        m: {d for t, names, _ in imps for d in _resolve(t, names, modules)}
        for m, imps in modules.items()
    }
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for dep in sorted(edges.get(node, ())):
            if dep == node or dep.startswith(node + "."):
                continue  # a package importing its own submodule
            if state.get(dep) == 1:
                cycles.append(" -> ".join([*stack[stack.index(dep) :], dep]))
            elif dep not in state:
                visit(dep, [*stack, dep])
        state[node] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_no_private_names_imported_across_modules():
    modules = _graph()
    private = [
        f"{module} imports {name} from {target}"
        for module, imports in modules.items()
        for target, names, _ in imports
        if target.startswith(ROOT)
        for name in names
        if name.startswith("_") and not name.startswith("__")
    ]
    private += [
        f"{module} imports {target}"
        for module, imports in modules.items()
        for target, _, _ in imports
        if target.startswith(ROOT)
        and any(part.startswith("_") and not part.startswith("__") for part in target.split("."))
    ]
    assert not private, "private names used across modules:\n" + "\n".join(sorted(set(private)))


def test_no_module_is_over_400_lines():
    long = {
        str(path.relative_to(PACKAGE)): n
        for path in PACKAGE.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > 420
    }
    assert not long, f"modules over ~400 lines (split them by job): {long}"


MAX_FUNCTION_LINES = 80


def test_no_function_is_over_80_lines():
    long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (n := node.end_lineno - first + 1) > MAX_FUNCTION_LINES:
                    where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
                    long.append(f"{where} {node.name}: {n} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them):\n" + "\n".join(long)
