"""The package layout stays as the architecture reads (docs/layout.md): no import cycle among
harness's modules, counting imports at any depth (a function-level import still ties two
modules together; a module's own enclosing packages are not edges, Python imports them first
anyway), no library module imports a command module (harness.commands, cli), and no module
imports another's private name. The map is true: every module and folder of harness/ is named in
docs/layout.md ("Every module of harness/"), and nothing it names is gone. Also the size rules:
at most 8 modules in the harness root, a module over 500 lines and a folder of more than 12
entries side by side only with its reason listed in docs/layout.md (the one place the exceptions
live)."""
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


# -- the size rules (docs/layout.md): a small root, and a reason for every long module ----------
ROOT_MODULES_MAX = 8  # modules directly in harness/ (packages hold the rest)
LONG = 500  # lines; a module longer than this is listed, with its reason, in docs/layout.md
LONG_SECTION = "## Modules over 500 lines"


def root_modules(pkg: Path) -> list[str]:
    return sorted(p.name for p in pkg.glob("*.py") if p.name != "__init__.py")


SOURCE_DIRS = ("harness", "races", "equivalence", "evals", "tests", "benchmarks", "fixtures", "ci", "scripts")


def python_files(root: Path) -> list[Path]:
    """Every .py file of the project's own folders (not a venv, a build or a run's output)."""
    return sorted(p for d in SOURCE_DIRS for p in (root / d).rglob("*.py")
                  if not any(part.startswith(".") for part in p.relative_to(root).parts))


def allowed_long(layout_md: str, section: str = LONG_SECTION) -> dict[str, str]:
    """The exceptions docs/layout.md lists: "- `path`: reason" lines under `section`."""
    import re
    body = layout_md.split(section, 1)[1] if section in layout_md else ""
    body = body.split("\n## ", 1)[0]
    return {m.group(1): m.group(2).strip() for m in re.finditer(r"^- `([^`]+)`: (.+)$", body, re.M)}


def long_problems(root: Path, allowed: dict[str, str]) -> list[str]:
    """A long module without a listed reason, and a listed one that is no longer long or gone."""
    lengths = {str(p.relative_to(root)): len(p.read_text(errors="replace").splitlines())
               for p in python_files(root)}
    out = [f"{f}: {n} lines and no reason in docs/layout.md" for f, n in sorted(lengths.items())
           if n > LONG and f not in allowed]
    out += [f"{f}: listed in docs/layout.md but {lengths[f]} lines" if f in lengths else
            f"{f}: listed in docs/layout.md but not there" for f in sorted(allowed)
            if lengths.get(f, 0) <= LONG]
    return out


def test_the_size_rules_catch_a_long_module_and_a_crowded_root(tmp_path):
    (tmp_path / "harness").mkdir()
    for i in range(ROOT_MODULES_MAX + 1):
        (tmp_path / "harness" / f"m{i}.py").write_text("x = 1\n")
    assert len(root_modules(tmp_path / "harness")) > ROOT_MODULES_MAX
    (tmp_path / "harness" / "big.py").write_text("x = 1\n" * (LONG + 1))
    for d in (".venv", "venv"):  # not ours: not counted
        (tmp_path / d).mkdir()
        (tmp_path / d / "big.py").write_text("x = 1\n" * (LONG + 1))
    assert long_problems(tmp_path, {}) == [f"harness/big.py: {LONG + 1} lines and no reason in docs/layout.md"]
    assert long_problems(tmp_path, {"harness/big.py": "why"}) == []
    assert long_problems(tmp_path, {"harness/big.py": "why", "harness/m0.py": "stale"}) == \
        ["harness/m0.py: listed in docs/layout.md but 1 lines"]
    md = f"# x\n{LONG_SECTION}\n\n- `harness/big.py`: one reason.\n\n## next\n- `a.py`: not this section\n"
    assert allowed_long(md) == {"harness/big.py": "one reason."}


def test_the_harness_root_keeps_at_most_eight_modules():
    mods = root_modules(ROOT / "harness")
    assert len(mods) <= ROOT_MODULES_MAX, mods


def test_every_module_over_500_lines_has_its_reason_in_docs_layout():
    allowed = allowed_long((ROOT / "docs" / "layout.md").read_text())
    assert allowed, f"docs/layout.md has no {LONG_SECTION!r} section"
    assert all(len(why) > 20 for why in allowed.values()), allowed  # a sentence, not a placeholder
    assert long_problems(ROOT, allowed) == []



# -- the map is true: every module and folder of harness/ named in docs/layout.md ---------------
MAP_SECTION = "## Every module of harness/"


def mapped(layout_md: str) -> set[str]:
    """What the map names: a folder line ("harness/x/   what lives there") starts a block, and each
    line indented by two spaces in it names one module or subfolder ("  name.py   its job");
    deeper lines continue a description."""
    import re
    body = layout_md.split(MAP_SECTION, 1)[1] if MAP_SECTION in layout_md else ""
    body = body.split("```")[1] if body.count("```") >= 2 else ""
    out, folder = set(), None
    for line in body.splitlines():
        if line.startswith("harness/"):
            folder = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
            out.add(folder)
        elif folder and re.match(r"  \S", line):
            out.add(folder + re.split(r"\s{2,}", line.strip(), maxsplit=1)[0])
    return out


def tree_entries(root: Path) -> set[str]:
    """Every module (a .py file, a package's __init__ aside) and every folder holding Python under
    harness/, relative to `root` (a folder ends in /)."""
    out = set()
    for p in (root / "harness").rglob("*.py"):
        if "__pycache__" in p.parts:
            continue
        rel = p.relative_to(root)
        out.update(f"{d.as_posix()}/" for d in list(rel.parents)[:-1])
        if p.name != "__init__.py":
            out.add(rel.as_posix())
    return out


def map_problems(root: Path, layout_md: str) -> list[str]:
    named, there = mapped(layout_md), tree_entries(root)
    return ([f"{x}: not named in docs/layout.md ({MAP_SECTION[3:]})" for x in sorted(there - named)]
            + [f"{x}: named in docs/layout.md but not there" for x in sorted(named - there)])


def test_the_map_check_catches_a_missing_and_a_stale_module(tmp_path):
    (tmp_path / "harness" / "pkg").mkdir(parents=True)
    for f in ("__init__.py", "a.py", "pkg/__init__.py", "pkg/b.py"):
        (tmp_path / "harness" / f).write_text("x = 1\n")
    md = (f"# x\n{MAP_SECTION}\n\n```\nharness/          the root\n  a.py            one job\n"
          "                  its description, continued\n  pkg/            a room\n\n"
          "harness/pkg/      the room\n  b.py            another job\n```\n")
    assert mapped(md) == {"harness/", "harness/a.py", "harness/pkg/", "harness/pkg/b.py"}
    assert map_problems(tmp_path, md) == []
    assert map_problems(tmp_path, md.replace("  b.py            another job\n", "")) == \
        [f"harness/pkg/b.py: not named in docs/layout.md ({MAP_SECTION[3:]})"]
    assert map_problems(tmp_path, md.replace("  a.py ", "  c.py ")) == \
        [f"harness/a.py: not named in docs/layout.md ({MAP_SECTION[3:]})",
         "harness/c.py: named in docs/layout.md but not there"]


def test_every_module_of_harness_is_named_in_docs_layout():
    md = (ROOT / "docs" / "layout.md").read_text()
    assert len(mapped(md)) > 150  # the map was read
    assert map_problems(ROOT, md) == []


# -- no folder is a street: at most WIDE entries side by side (a package counts as one) ---------
WIDE = 12
WIDE_SECTION = "## Folders over twelve entries"


def folder_entries(folder: Path) -> list[str]:
    """The modules (a package's __init__ aside) and the folders holding Python directly in `folder`."""
    return sorted([p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
                  + [f"{d.name}/" for d in folder.iterdir()
                     if d.is_dir() and d.name != "__pycache__" and any(d.rglob("*.py"))])


def wide_problems(root: Path, allowed: dict[str, str]) -> list[str]:
    """A folder over WIDE entries without a listed reason, and a listed one that is no longer wide."""
    pkg = root / "harness"
    widths = {f"{d.relative_to(root).as_posix()}/": len(folder_entries(d))
              for d in [pkg, *pkg.rglob("*")] if d.is_dir() and d.name != "__pycache__"}
    out = [f"{f}: {n} entries side by side and no reason in docs/layout.md" for f, n in sorted(widths.items())
           if n > WIDE and f not in allowed]
    out += [f"{f}: listed in docs/layout.md but {widths.get(f, 0)} entries" for f in sorted(allowed)
            if widths.get(f, 0) <= WIDE]
    return out


def test_the_width_rule_catches_a_street(tmp_path):
    street = tmp_path / "harness" / "street"
    street.mkdir(parents=True)
    for i in range(WIDE):
        (street / f"m{i}.py").write_text("x = 1\n")
    assert wide_problems(tmp_path, {}) == []
    (street / "room").mkdir()
    (street / "room" / "__init__.py").write_text("")  # a package counts as one entry
    assert wide_problems(tmp_path, {}) == [f"harness/street/: {WIDE + 1} entries side by side and no reason in "
                                           "docs/layout.md"]
    assert wide_problems(tmp_path, {"harness/street/": "why"}) == []
    assert wide_problems(tmp_path, {"harness/": "stale"}) == [
        f"harness/street/: {WIDE + 1} entries side by side and no reason in docs/layout.md",
        "harness/: listed in docs/layout.md but 1 entries"]


def test_no_folder_of_harness_holds_more_than_twelve_entries_without_its_reason():
    allowed = allowed_long((ROOT / "docs" / "layout.md").read_text(), WIDE_SECTION)
    assert all(len(why) > 20 for why in allowed.values()), allowed
    assert wide_problems(ROOT, allowed) == []


# -- no module imports another's private name (`from x import _y`) -----------------------------
# the one left, which the verdicts branch of issue 42 removes (the gate's served pairs as an object)
PRIVATE_PENDING: set[str] = set()  # none left: the gate owns its pairs (harness.targets.Pairs)


def private_imports(root: Path) -> set[str]:
    out = set()
    for p in sorted((root / "harness").rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("harness"):
                out.update(f"{p.relative_to(root).as_posix()}: {node.module}.{a.name}" for a in node.names
                           if a.name.startswith("_") and not a.name.startswith("__"))
    return out


def test_the_private_import_check_sees_one(tmp_path):
    (tmp_path / "harness").mkdir()
    (tmp_path / "harness" / "a.py").write_text("from harness.b import (\n    ok,\n    _hidden,\n)\n")
    assert private_imports(tmp_path) == {"harness/a.py: harness.b._hidden"}


def test_no_module_imports_a_private_name_of_another():
    assert private_imports(ROOT) <= PRIVATE_PENDING
