"""An engine's source read without importing it (ast): a module's file under the package root, its
parsed tree (each module parsed once per check), and a class or function in it by qualname. The
contract checks of both agents find their patch points with it (harness.agents.vllm.points.
check_source for vLLM's releases, harness.agents.sglang.contract for SGLang's wheel)."""
from __future__ import annotations

import ast
from pathlib import Path


def module_file(root: Path, module: str) -> Path | None:
    p = root.joinpath(*module.split("."))
    for cand in (p.with_suffix(".py"), p / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def parse_module(root: Path, module: str, cache: dict) -> ast.Module | None:
    if module not in cache:
        f = module_file(root, module)
        cache[module] = ast.parse(f.read_text(encoding="utf-8"), str(f)) if f else None
    return cache[module]


def find_def(tree: ast.AST, qualname: str):
    node = tree
    for part in qualname.split("."):
        body = getattr(node, "body", [])
        node = next((n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                     and n.name == part), None)
        if node is None:
            return None
    return node
