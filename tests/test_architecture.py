"""The package's shape: no import cycles (counting `TYPE_CHECKING` imports), dependencies
that run one way between the pipeline's packages, short functions, few positional
parameters, few private modules at the root, public names that resolve. No cap on module
length: a module is as long as its one concept needs (split where a concept ends).

These tests read the source (ast), so they fail as soon as a change adds a
cycle or an oversized function, before any behaviour changes.
"""

import ast
import importlib
from pathlib import Path

import jaxpace

PKG = Path(jaxpace.__file__).parent
MAX_FUNCTION_LINES = 80
MAX_POSITIONAL_PARAMETERS = 8  # not counting `self` / `cls`; more: a small dataclass or `*`

# Functions that are data tables or generated text, not logic: the length
# limit does not apply to them. Each entry says why.
LONG_BY_DESIGN: dict[str, str] = {}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The jaxpace module that `name` refers to (a module, or the module defining it)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(mod: str, path: Path) -> set[str]:
    """Every jaxpace module `mod` imports, at module level or inside functions."""
    tree = ast.parse(path.read_text())
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = mod if is_pkg else mod.rpartition(".")[0]
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                src = f"{base}.{node.module}" if node.module else base
            else:
                src = node.module or ""
            # `from pkg import sub` imports the submodule `pkg.sub`; `from mod
            # import name` imports `mod`.
            names = [f"{src}.{a.name}" if f"{src}.{a.name}" in MODULES else src for a in node.names]
        else:
            continue
        for n in names:
            if n.startswith("jaxpace"):
                r = _resolve(n)
                if r is not None and r != mod:
                    out.add(r)
    return out


def _graph() -> dict[str, set[str]]:
    g = {m: _imports(m, p) for m, p in MODULES.items()}
    # A package's own __init__ re-exporting its submodules is not a cycle with
    # them; the root package re-exports everything, so leave its edges out.
    g["jaxpace"] = set()
    return g


def _cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
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

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    g = _graph()
    assert len(g) > 20  # the walk found the package
    assert "jaxpace.collectives.exchange" in g["jaxpace.runtime.hooks"]
    cycles = _cycles(g)
    assert not cycles, f"import cycles: {cycles}"


def test_collectives_do_not_import_the_runtime():
    g = _graph()
    for mod, deps in g.items():
        # The module-level drop-ins are the one face of collectives/ above the runtime: they
        # call the default Pacer. Everything else there is trace-time code the runtime calls.
        if mod.startswith("jaxpace.collectives") and mod != "jaxpace.collectives.dropins":
            bad = [d for d in deps if d.startswith("jaxpace.runtime")]
            assert not bad, f"{mod} imports {bad}"


def _below(prefixes: tuple[str, ...], forbidden: tuple[str, ...]) -> list[str]:
    g = _graph()
    return [
        f"{mod} imports {d}"
        for mod, deps in sorted(g.items())
        if mod.startswith(prefixes)
        for d in sorted(deps)
        if d.startswith(forbidden)
    ]


def test_diagnosis_and_records_import_nothing_above_them():
    """The diagnosis core and the on-disk formats are shared by the report, the runtime, the
    sinks and the simulator: they import none of those (nor the trace-time collectives)."""
    bad = _below(
        ("jaxpace.diagnosis", "jaxpace.records"),
        ("jaxpace.report", "jaxpace.runtime", "jaxpace.collectives", "jaxpace.sinks"),
    )
    assert not bad, bad


def test_the_runtime_never_imports_the_report():
    bad = _below(("jaxpace.runtime", "jaxpace.collectives", "jaxpace.native"), ("jaxpace.report",))
    assert not bad, bad


def test_few_private_modules_at_the_root():
    """The pipeline's stages are packages; at most a handful of private leaf modules
    (errors aside: compat, validation, text) stay at the package root."""
    private = sorted(m for m in MODULES if m.count(".") == 1 and m.split(".")[1].startswith("_"))
    private = [m for m in private if not m.endswith(("__main__", "__init__"))]
    assert len(private) <= 6, private


def test_type_checking_imports_count_as_edges():
    """A cycle closed by an import under `if TYPE_CHECKING:` is still a cycle."""
    g = _graph()
    # jaxpace.runtime.interface imports the runtime's leaf modules under TYPE_CHECKING only.
    assert "jaxpace.runtime.sites" in g["jaxpace.runtime.interface"]


def test_policy_and_sim_do_not_import_the_probe_package():
    """The number kernels live in `jaxpace.native.kernels`, apart from the probes (`jaxpace.native.probes`)."""
    g = _graph()
    for mod, deps in g.items():
        if mod.startswith(("jaxpace.policy", "jaxpace.sim", "jaxpace.native.kernels")):
            bad = [d for d in deps if d.startswith("jaxpace.native.probes")]
            assert not bad, f"{mod} imports {bad}"
    assert "jaxpace.native.kernels" in g["jaxpace.policy._window_order"]


def test_report_and_sim_sit_below_the_runtime():
    g = _graph()
    for mod, deps in g.items():
        if mod.startswith(("jaxpace.report", "jaxpace.sim", "jaxpace.topology")):
            bad = [
                d for d in deps if d.startswith(("jaxpace.runtime", "jaxpace.collectives.measure"))
            ]
            assert not bad, f"{mod} imports {bad}"


def _exit_hooks(source: str) -> list[str]:
    """What `source` installs of process-wide shutdown hooks: `signal.signal(SIGTERM, ...)`
    calls and `atexit.register` uses (called or as a decorator), one entry per line."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "register":
            if isinstance(node.value, ast.Name) and node.value.id == "atexit":
                found.append((node.lineno, "atexit.register"))
        if not (isinstance(node, ast.Call) and node.args):
            continue
        f = node.func
        if (
            isinstance(f, ast.Attribute)
            and f.attr == "signal"
            and ast.unparse(f) == "signal.signal"
        ):
            if ast.unparse(node.args[0]) in ("signal.SIGTERM", "SIGTERM", "signal.Signals.SIGTERM"):
                found.append((node.lineno, "signal.signal(SIGTERM)"))
    return [f"{what}:{line}" for line, what in sorted(found)]


def test_exit_hook_finder_finds_each_form():
    src = (
        "import atexit, signal\n"
        "from signal import SIGTERM\n"
        "@atexit.register\n"
        "def a(): pass\n"
        "atexit.register(a)\n"
        "signal.signal(signal.SIGTERM, a)\n"
        "signal.signal(SIGTERM, a)\n"
        "signal.signal(signal.SIGINT, a)\n"  # not SIGTERM: not counted
        "signal.getsignal(signal.SIGTERM)\n"
    )
    assert _exit_hooks(src) == [
        "atexit.register:3",
        "atexit.register:5",
        "signal.signal(SIGTERM):6",
        "signal.signal(SIGTERM):7",
    ]


def test_one_module_owns_sigterm_and_atexit():
    """Issue 45: two modules each installed a SIGTERM handler and took the other's for the
    program's own; a pacing pacer traced first then left the sinks unclosed. The launcher
    (`jaxpace.launch`, a separate parent process) keeps its own."""
    owners = {}
    for mod, path in MODULES.items():
        if mod == "jaxpace.launch" or mod.startswith("jaxpace.launch."):
            continue
        hooks = _exit_hooks(path.read_text())
        if hooks:
            owners[mod] = hooks
    assert set(owners) == {"jaxpace.runtime.signals"}, owners


def _code_lines(node: ast.AST) -> int:
    """Lines of a function, without its docstring."""
    n = node.end_lineno - node.lineno + 1
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            n -= body[0].end_lineno - body[0].lineno + 1
    return n


def _long_functions() -> list[str]:
    out = []
    for mod, path in MODULES.items():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _code_lines(node)
                name = f"{mod}.{node.name}"
                if n > MAX_FUNCTION_LINES and name not in LONG_BY_DESIGN:
                    out.append(f"{name} ({n} lines)")
    return out


def test_no_function_over_80_lines_of_code():
    long = _long_functions()
    assert not long, "functions over 80 lines (split them into named stages): " + ", ".join(long)


def _positional(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    names = [a.arg for a in node.args.posonlyargs + node.args.args]
    return len([n for n in names if n not in ("self", "cls")])


def test_positional_count_skips_self_and_keyword_only():
    tree = ast.parse("def f(self, a, b, *, c, d): pass\ndef g(a, /, b, *args, c=1): pass")
    assert [_positional(n) for n in tree.body] == [2, 2]


def test_no_function_over_8_positional_parameters():
    many = []
    for mod, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = _positional(node)
                if n > MAX_POSITIONAL_PARAMETERS:
                    many.append(f"{mod}.{node.name} ({n})")
    assert not many, (
        "functions with over 8 positional parameters (pass a small dataclass, or make the "
        "options keyword-only): " + ", ".join(many)
    )


def test_every_submodule_all_resolves():
    seen = 0
    for name in sorted(MODULES):
        if name.endswith("__main__"):
            continue
        m = importlib.import_module(name)
        names = getattr(m, "__all__", None)
        if names is None:
            continue
        seen += 1
        for attr in names:
            assert hasattr(m, attr), f"{name}.__all__ names {attr!r}, which does not exist"
    assert seen > 20
    for pkg in ("jaxpace.report", "jaxpace.topology", "jaxpace.sim"):
        assert importlib.import_module(pkg).__all__, pkg
