"""The layout CONTRIBUTING promises, checked on the source: one concept per file (no file in ``torchbkb/``,
``tests/`` or ``benchmarks/`` over 400 lines), no import cycle between torchbkb's modules (imports inside functions
count), no private name imported from another module, no private attribute read on another object than
``self``/``cls``, and a core that imports neither BoTorch nor GPyTorch."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "torchbkb"
MODULES = {".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__"): p
           for p in PKG.rglob("*.py")}
TREES = {name: ast.parse(path.read_text()) for name, path in MODULES.items()}
# torch's own hooks that subclasses override and call through super()/the module: not our private names
# (+ NamedTuple's public _replace, and Tensor._version: the counter of in-place changes autograd checks too)
TORCH_HOOKS = {"_apply", "_buffers", "_stream_block", "_replace", "_version"}
# BoTorch keeps a fitted model's untransformed inputs only there (no public accessor): read by from_model
BOTORCH_STATE = {"_has_transformed_inputs", "_original_train_inputs"}


def _imports(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torchbkb"):
            yield node


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_file_over_400_lines(name):
    n = len(MODULES[name].read_text().splitlines())
    assert n <= 400, f"{MODULES[name]}: expected at most 400 lines, got {n}"


def test_no_test_or_benchmark_file_over_400_lines():
    root = PKG.parent
    long = {str(p.relative_to(root)): n for folder in ("tests", "benchmarks") for p in (root / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert not long, f"expected at most 400 lines a file, got {long}"


def test_no_import_cycle():
    graph = {name: set() for name in MODULES}
    for name, tree in TREES.items():
        for node in _imports(tree):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                graph[name].add(full if full in MODULES else node.module)
    state: dict[str, int] = {}

    def visit(u, path):
        state[u] = 1
        for v in graph[u] & MODULES.keys():
            assert state.get(v) != 1, f"import cycle: {' -> '.join(path[path.index(v):] + [v]) if v in path else v}"
            if v not in state:
                visit(v, path + [v])
        state[u] = 2

    for u in MODULES:
        if u not in state:
            visit(u, [u])


# the layers of docs/design.md, bottom up; the adapters and the other papers' packages sit on top, apart
LAYERS = {"errors": 0, "objectives": 0, "utils": 0, "legacy_paths": 0, "gp": 1, "sampling": 2, "bandits": 3,
          "experiment": 4}
TOP = 5


def _layer(module: str) -> tuple[int, str]:
    parts = module.split(".")
    if len(parts) == 1:
        return TOP + 1, ""  # the package's own __init__ re-exports everything
    return LAYERS.get(parts[1], TOP), parts[1]


def test_each_layer_imports_only_the_layers_below():
    bad = []
    for name, tree in TREES.items():
        rank, group = _layer(name)
        for node in _imports(tree):
            other, other_group = _layer(node.module)
            if other > rank or (other == rank == TOP and other_group != group):
                bad.append(f"{name} (layer {group or 'torchbkb'}) imports {node.module}")
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_private_name_crosses_a_module():
    bad = []
    for name, tree in TREES.items():
        bad += [f"{name}: from {n.module} import {a.name}" for n in _imports(tree) for a in n.names
                if a.name.startswith("_")]
        nodes = list(ast.walk(tree))
        # a private member of a class of this very module is fine: the methods and attributes the module defines
        has_class = any(isinstance(n, ast.ClassDef) for n in nodes)
        own = {n.name for n in nodes if isinstance(n, ast.FunctionDef)} | {n.attr for n in nodes
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)}
        for node in nodes:
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and node.attr not in TORCH_HOOKS | BOTORCH_STATE):
                owner = node.value
                if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                    continue
                if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Name) and owner.func.id == "super":
                    continue
                if not (has_class and node.attr in own):
                    bad.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, "private names used across modules:\n" + "\n".join(bad)


def test_core_imports_neither_botorch_nor_gpytorch():
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('botorch', 'gpytorch', 'linear_operator'): raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import torch, torchbkb, torchbkb.online, torchbkb.datasets\n"
        "arms = torch.rand(50, 2, dtype=torch.float64)\n"
        "b = torchbkb.BBKB(arms, torchbkb.GaussianKernel(0.3), noise=0.1, beta=0.5, seed=0)\n"
        "torchbkb.run(b, -arms.sum(-1), budget=10, progress=False)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
