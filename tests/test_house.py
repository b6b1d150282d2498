"""The house rules the code keeps: no module over 450 lines unless its docstring's first line says why ("long"), and
no import circle between cqg_ray's modules, imports inside functions counted; no package imports another package's
command-line module (stages share only what lives below them); neither the package nor the benches and scripts import
the tests."""

import ast
from pathlib import Path

PKG = Path(__file__).parents[1] / "cqg_ray"


def modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        name = ".".join(p.relative_to(PKG.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The cqg_ray modules ``name`` imports anywhere in its body (``from pkg import mod`` is an import of mod)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in node.names]
            found.update(s for s in subs if s in known)
            if any(s not in known for s in subs):
                found.add(base)
    return {m for m in found if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_cycles_finds_a_circle_and_nothing_else():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_in_cqg_ray():
    mods = modules()
    graph = {m: imports(m, p, set(mods)) for m, p in mods.items()}
    assert graph["cqg_ray.llm.stream"] >= {"cqg_ray.llm.plan_work", "cqg_ray.llm.ledger"}  # the walk sees real imports
    assert cycles(graph) == []


def test_no_package_imports_another_packages_command_line_module():
    """A helper two stages' commands share lives below both (cqg_ray.config, cqg_ray.artifacts), not in one stage's cli."""
    mods = modules()
    crossing = []
    for name, p in mods.items():
        for dep in sorted(imports(name, p, set(mods))):
            parts = dep.split(".")
            if len(parts) == 3 and parts[2] == "cli" and name.split(".")[:2] != parts[:2]:
                crossing.append(f"{name} imports {dep}")
    assert crossing == []


def test_no_module_over_450_lines_without_saying_why():
    long = []
    for name, p in modules().items():
        text = p.read_text()
        if len(text.splitlines()) <= 450:
            continue
        first = (ast.get_docstring(ast.parse(text)) or "").split("\n")[0]
        if "long" not in first.lower():
            long.append(f"{name}: {len(text.splitlines())} lines")
    assert long == []


def test_the_package_benches_and_scripts_import_nothing_from_the_tests():
    root = PKG.parent
    paths = sorted(PKG.rglob("*.py")) + sorted((root / "bench").glob("*.py")) + sorted((root / "scripts").glob("*.py"))
    assert len(paths) > 100
    found = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            found += [f"{p.relative_to(root)}: {n}" for n in names if n in ("tests", "conftest") or n.startswith("tests.")]
    assert found == []
