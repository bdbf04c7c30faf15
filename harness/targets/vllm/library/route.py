"""The route a served model takes through a vLLM release's Python, read from the source (ast,
nothing imported), and the verdict on a compiled library's ops judged off it: an op the route
calls that the library lacks refuses the overlay; an op the library lacks that only code off the
route calls (DeepSeek's sparse-attention indexer, for one) is stubbed to fail loudly if ever
called, and named (harness/agents/vllm/shims/sitecustomize.py installs the stubs in the server).

The route is the modules whose code can run on the way the server serves the model: the CPU
platform, the CPU worker, the CPU attention backend, the model runner the worker builds, and the
model's own module (by its architecture, from vLLM's model registry tables:
`"LlamaForCausalLM": ("llama", "LlamaForCausalLM")`), and, transitively, every vLLM module one of
those imports at its top level (not under TYPE_CHECKING; see closure() for packages). What a route
module imports inside a function is not on it: vLLM's registries import every model and backend
that way, and which one runs is what the roots above decide. Nor is what the servers' configuration
never runs (UNCONFIGURED: no drafter).

For SmolLM2 (LlamaForCausalLM) on 0.34.0's V2 route that is 632 modules and seven `_C` ops: the
CPU attention's (`cpu_attention_with_kv_cache`, `cpu_attn_reshape_and_cache`,
`get_scheduler_metadata`, `cpu_attn_has_isa`), `rotary_embedding` (RotaryEmbedding.forward_cpu),
`compute_slot_mapping_kernel_impl` and `init_cpu_memory_env`; RMSNorm and SiluAndMul run
PyTorch on an x86 CPU (their `_C` kernels are bound for GPUs and POWER only). The ops judged are the CPU route modules' own calls
(harness.targets.vllm.library.ops.route_files) and every `forward_cpu` in a route module (vLLM's custom
ops dispatch there on a CPU: the layers the model uses, its sampler's, its attention's).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from harness.targets.vllm.library import ops as vllm_ops

REGISTRY = "vllm/model_executor/models/registry.py"
# code the servers' configuration never runs, whatever the model: the closure does not enter it
# (0.33.0's V1 runner reads the drafters, and through Eagle3's DeepSeek drafter DeepSeek's layers)
UNCONFIGURED = {"vllm/v1/spec_decode/": "speculative decoding (the servers run no drafter)"}


def model_module(site: Path, architecture: str) -> str:
    """The file of `architecture`'s module by vLLM's registry; ValueError (one line) when the
    registry does not name it."""
    try:
        tree = ast.parse((Path(site) / REGISTRY).read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError) as e:
        raise ValueError(f"cannot read vLLM's model registry {REGISTRY}: {e}") from None
    for node in ast.walk(tree):
        if not isinstance(node, ast.Dict):
            continue
        for k, v in zip(node.keys, node.values):
            if (isinstance(k, ast.Constant) and k.value == architecture and isinstance(v, ast.Tuple)
                    and v.elts and isinstance(v.elts[0], ast.Constant) and isinstance(v.elts[0].value, str)):
                rel = vllm_ops.module_file(site, f"vllm.model_executor.models.{v.elts[0].value}")
                if rel:
                    return rel
    raise ValueError(f"vLLM's model registry ({REGISTRY}) names no module for {architecture}")


def _under_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(rel: str, tree: ast.Module) -> list[tuple[str, str, str]]:
    """(local name, module, name or "") per import `rel` makes when it is imported (its top
    level and its if/try blocks, not under TYPE_CHECKING); name "" for `import module`."""
    pkg = rel[:-len("/__init__.py")] if rel.endswith("/__init__.py") else rel.rsplit("/", 1)[0]
    out: list[tuple[str, str, str]] = []

    def walk(body):
        for n in body:
            if isinstance(n, ast.Import):
                out.extend(((a.asname or a.name).split(".")[0] if not a.asname else a.asname, a.name, "")
                           for a in n.names)
            elif isinstance(n, ast.ImportFrom):
                mod = n.module or ""
                if n.level:
                    parts = pkg.split("/")
                    mod = ".".join(parts[:len(parts) - n.level + 1] + ([n.module] if n.module else []))
                out.extend((a.asname or a.name, mod, a.name) for a in n.names)
            elif isinstance(n, ast.If) and not _under_type_checking(n):
                walk(n.body)
                walk(n.orelse)
            elif isinstance(n, ast.Try):
                walk(n.body)
                walk(n.orelse)
                for h in n.handlers:
                    walk(h.body)
    walk(tree.body)
    return out


class _Source:
    def __init__(self, site: Path):
        self.site, self._trees = Path(site), {}

    def tree(self, rel: str) -> ast.Module | None:
        if rel not in self._trees:
            try:
                self._trees[rel] = ast.parse((self.site / rel).read_text(encoding="utf-8", errors="replace"))
            except (OSError, SyntaxError):
                self._trees[rel] = None
        return self._trees[rel]

    def resolve(self, mod: str, name: str, depth: int = 0) -> str | None:
        """The file that defines `name` imported from `mod` (a package's re-export followed to
        where it is defined), or the module itself for `import mod`."""
        if name:
            sub = vllm_ops.module_file(self.site, f"{mod}.{name}")
            if sub:
                return sub
        rel = vllm_ops.module_file(self.site, mod)
        if not rel or not name or depth > 8:
            return rel
        tree = self.tree(rel)
        for local, m, n in (_imports(rel, tree) if tree else ()):
            if local == name and m.startswith("vllm"):
                return self.resolve(m, n, depth + 1) or rel
        return rel


def closure(site: Path, roots: list[str]) -> list[str]:
    """The vLLM modules whose code the route can run: the roots, and transitively every module a
    route module imports at its top level (`from pkg import name`: the module that defines the
    name, a package's re-export followed). A package's __init__ that Python runs on the way to a
    submodule is not taken: it re-exports, it does not call (0.34.0's V2 runner imports one helper
    of `vllm/models/deepseek_v4/`, whose __init__ imports DeepSeek V4's CPU model code, and through
    it the sparse-attention indexer: imported, never called for another model)."""
    src = _Source(site)
    seen: set[str] = set()
    todo = [r for r in roots if (Path(site) / r).is_file()]
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        seen.add(rel)
        tree = src.tree(rel)
        if tree is None:
            continue
        for _local, mod, name in _imports(rel, tree):
            if not mod.startswith("vllm"):
                continue
            f = src.resolve(mod, name)
            if f and f not in seen and not f.startswith(tuple(UNCONFIGURED)):
                todo.append(f)
    return sorted(seen)


def roots(site: Path, runner: str, has_triton: bool, architecture: str) -> list[str]:
    return [*vllm_ops.route_roots(site, runner, has_triton), model_module(site, architecture)]


@dataclass
class Judgement:
    """One library against one runner's route for one model."""
    library: str
    route: str  # "LlamaForCausalLM on V2" (what the stubs' errors and the verdict name)
    refused: list = field(default_factory=list)  # compare()'s lines for ops on the route
    stubbed: dict = field(default_factory=dict)  # op -> the code off the route that calls it
    modules: int = 0  # modules on the route


@dataclass
class Route:
    """The ops one runner's route calls for one model, and those the package calls elsewhere."""
    name: str
    on: list  # Calls on the route
    every: list  # Calls of every forward_cpu of the package and the CPU route modules
    modules: int

    def judge(self, library: str, schemas: dict) -> Judgement:
        """The library's ops against the route; the ops off it that the library lacks, each with
        the code that calls it (the forward_cpu, else the wrapper)."""
        on_ops = {c.op for c in self.on}
        spaces = {op.split("::")[0] for op in schemas}
        stubbed: dict[str, str] = {}
        for c in self.every:
            if c.op not in on_ops and c.op not in schemas and c.op.split("::")[0] in spaces:
                stubbed.setdefault(c.op, c.via or c.where)
        return Judgement(library, self.name, vllm_ops.compare(self.on, schemas), stubbed, self.modules)


def route(site: Path, runner: str, has_triton: bool, architecture: str) -> Route:
    """`architecture`'s route on `runner` in the source under `site`; ValueError (one line) when
    vLLM's registry does not name the model."""
    site = Path(site)
    mods = closure(site, roots(site, runner, has_triton, architecture))
    return Route(f"{architecture} on {runner.upper()}",
                 vllm_ops.route_calls(site, runner, has_triton, forward_cpu_in=set(mods)),
                 vllm_ops.route_calls(site, runner, has_triton), len(mods))


def stub_line(op: str, where: str, route: str) -> str:
    """The verdict's words for one stubbed op."""
    return f"stubbed: {op} (called by {where}, not on the route of {route}; fails loudly if ever called)"
