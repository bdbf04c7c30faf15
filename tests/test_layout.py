"""The package layout stays as the architecture reads (docs/layout.md): no import cycle among
harness's modules, counting imports at any depth (a function-level import still ties two
modules together; a module's own enclosing packages are not edges, Python imports them first
anyway), and no library module imports a command module (harness.commands, cli)."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMANDS = ("harness.commands", "harness.cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The harness modules `path` imports, anywhere in its body."""
    me = module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" for a in node.names]  # a submodule, or a name of `base`
        else:
            continue
        for n in names:
            while n and n not in modules:  # `from harness.x import f`: the module is harness.x
                n = n.rpartition(".")[0]
            # a module's own packages are imported before it whatever it says: not an edge
            if n and not (me + ".").startswith(n + "."):
                out.add(n)
    return out


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in (ROOT / "harness").rglob("*.py")}
    return {m: imports(p, set(files)) for m, p in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_in_harness():
    graph = import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the walk saw the package
    assert cycles(graph) == []


def test_no_library_module_imports_a_command_module():
    bad = sorted(f"{m} -> {d}" for m, deps in import_graph().items() if not m.startswith(COMMANDS)
                 for d in deps if d.startswith(COMMANDS))
    assert bad == []
