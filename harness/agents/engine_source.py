"""An engine's source read without importing it (ast): a module's file under the package root, its
parsed tree (each module parsed once per check), and a class or function in it by qualname. The
contract checks of both agents find their patch points with it (harness.agents.vllm.points.
check_source for vLLM's releases, harness.agents.sglang.contract for SGLang's wheel)."""
from __future__ import annotations

import ast
from collections import OrderedDict
from pathlib import Path


def module_file(root: Path, module: str) -> Path | None:
    p = root.joinpath(*module.split("."))
    for cand in (p.with_suffix(".py"), p / "__init__.py"):
        if cand.is_file():
            return cand
    return None


# parsed trees by source text, newest last: a module whose text another check parsed already (the
# same file of the next release, a copied tree with one module rewritten) is not parsed again; the
# SGLang contract's tests parsed the same 18 modules in each of their 11 checks (5.5 s of 7 s)
_TREES: OrderedDict[str, ast.Module] = OrderedDict()
_KEEP = 64


def parse_module(root: Path, module: str, cache: dict) -> ast.Module | None:
    """The module's tree (read only: it may be shared with another check of the same text)."""
    if module not in cache:
        f = module_file(root, module)
        cache[module] = _parsed(f.read_text(encoding="utf-8"), str(f)) if f else None
    return cache[module]


def _parsed(text: str, filename: str) -> ast.Module:
    tree = _TREES.get(text)
    if tree is None:
        tree = ast.parse(text, filename)
        _TREES[text] = tree
        if len(_TREES) > _KEEP:
            _TREES.popitem(last=False)
    else:
        _TREES.move_to_end(text)
    return tree


def find_def(tree: ast.AST, qualname: str):
    node = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return None
    return node
