"""The package's shape: every module in a subpackage named in its __init__, imports only go down the layers,
no import cycles, and listing the commands imports none of them."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from jobkit.cli import COMMANDS
from jobkit.core.lazy_group import load
from jobkit.sweep.cli import DRIVERS

PKG = Path(__file__).resolve().parents[2] / "py" / "jobkit"
# Lowest first; a module may import its own subpackage and any subpackage before it (jobkit/__init__.py).
LAYERS = ("core", "launch", "observe", "sweep", "ops", "bridge", "analysis", "image", "cli")
TOP_LEVEL_FILES = {"__init__.py", "__main__.py", "cli.py"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines under `if TYPE_CHECKING:` (annotations only: never run, so never a real edge)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(name: str) -> set[str]:
    """The jobkit modules NAME imports, at module level or inside a function (lazy imports are edges too)."""
    tree = ast.parse(MODULES[name].read_text())
    skip = _type_checking_lines(tree)
    found = set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("jobkit"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("jobkit"):
            for alias in node.names:  # `from jobkit.core import tgs` imports the module jobkit.core.tgs
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in MODULES else node.module)
    return found - {name}


def layer(name: str) -> int:
    parts = name.split(".")
    if len(parts) == 1 or parts[1] in ("__main__", "cli"):
        return LAYERS.index("cli")
    return LAYERS.index(parts[1])


def test_no_module_outside_a_subpackage():
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name not in TOP_LEVEL_FILES)
    assert loose == []
    assert {p.name for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").is_file()} == set(LAYERS) - {"cli"}


@pytest.mark.parametrize("package", [p for p in LAYERS if p != "cli"])
def test_every_module_is_named_in_its_package_docstring(package):
    doc = ast.get_docstring(ast.parse((PKG / package / "__init__.py").read_text()))
    assert doc and "May import:" in doc, f"jobkit/{package}/__init__.py must say what it may import"
    modules = sorted(p.stem for p in (PKG / package).glob("*.py") if not p.stem.startswith("__"))
    missing = [m for m in modules if m not in doc.replace(",", " ").split()]
    assert missing == [], f"jobkit/{package}/__init__.py does not name {missing}"


def test_imports_only_go_down():
    upward = [
        f"{name} ({LAYERS[layer(name)]}) imports {dep} ({LAYERS[layer(dep)]})"
        for name in MODULES
        for dep in imports_of(name)
        if dep in MODULES and layer(dep) > layer(name)
    ]
    assert upward == []


def test_no_import_cycle():
    graph = {
        name: {d for d in imports_of(name) if d in MODULES and not MODULES[d].name == "__init__.py"} for name in MODULES
    }
    cycles, state = [], {}

    def visit(node, stack):
        state[node] = "open"
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == "open":
                cycles.append(" -> ".join(stack[stack.index(dep) :] + [dep]))
            elif dep not in state:
                visit(dep, stack)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert cycles == []


def test_the_checker_sees_an_upward_import_and_a_cycle(tmp_path, monkeypatch):
    """The two checks above are only worth something if they fail on a bad tree: make one and look."""
    fake = tmp_path / "jobkit"
    for package in ("core", "ops"):
        (fake / package).mkdir(parents=True)
        (fake / package / "__init__.py").write_text("")
    (fake / "core" / "a.py").write_text("from jobkit.ops import b\n")
    (fake / "ops" / "b.py").write_text("from jobkit.core import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PKG", fake)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {_module_name(p): p for p in fake.rglob("*.py")})
    with pytest.raises(AssertionError, match=r"jobkit.core.a \(core\) imports jobkit.ops.b \(ops\)"):
        test_imports_only_go_down()
    with pytest.raises(AssertionError, match=r"jobkit.core.a -> jobkit.ops.b -> jobkit.core.a"):
        test_no_import_cycle()


@pytest.mark.parametrize(("table", "name"), [*((COMMANDS, n) for n in COMMANDS), *((DRIVERS, n) for n in DRIVERS)])
def test_a_table_summary_is_its_commands_own_help(table, name):
    target, summary = table[name]
    assert load(target).get_short_help_str(limit=300) == summary


def test_listing_the_commands_imports_none_of_them():
    """`jobkit --help` and `jobkit sweep --help` read the tables' summaries; no command module is imported."""
    probe = (
        "import sys\n"
        "from click.testing import CliRunner\n"
        "from jobkit.cli import main\n"
        "for args in (['--help'], ['sweep', '--help']):\n"
        "    result = CliRunner().invoke(main, args)\n"
        "    assert result.exit_code == 0, result.output\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('jobkit') or m in ('matplotlib', 'numpy'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    # the group, the sweep group (its own module is the command `sweep`), and what those two stand on
    assert set(out) <= {
        "jobkit",
        "jobkit.cli",
        "jobkit.core",
        "jobkit.core.lazy_group",
        "jobkit.core.errors",
        "jobkit.sweep",
        "jobkit.sweep.cli",
        "jobkit.sweep.state",
        "jobkit.sweep.jobs",
        "jobkit.core.paths",
        "jobkit.core.procfs",
        "jobkit.core.files",  # sweep.state reads and writes its plan through it (standard library only)
    }, out
    assert "matplotlib" not in out and "numpy" not in out


def test_every_module_imports_without_ray_jax_or_maxtext():
    """The tools-only install (a login node, a container host) has none of the training stack: every module
    must still import, each heavy dependency being imported inside the function that needs it."""
    probe = (
        "import importlib, importlib.abc, sys\n"
        "BLOCKED = ('ray', 'jax', 'jaxlib', 'maxtext', 'MaxText')\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in BLOCKED:\n"
        "            raise ImportError(f'{name} is blocked in this test')\n"
        "sys.meta_path.insert(0, Block())\n"
        f"for name in {sorted(n for n in MODULES if not n.endswith('__main__'))!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in BLOCKED))\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"
