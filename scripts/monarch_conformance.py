"""Run Monarch's own public-API tests and CPU examples through danaus's runner.

    scripts/monarch_conformance.sh MONARCH_SRC [--rev REV] [--tests FILE ...] [--examples EX ...]

MONARCH_SRC is a checkout of https://github.com/meta-pytorch/monarch (a work tree, or a
bare git directory read at REV, default HEAD). Nothing of it is kept in this repository:
the chosen test files and examples are extracted into a temporary folder, run there, and
the folder is removed.

What runs, and how it is counted:
  * Each test file is read with ``ast``. An import of a name from Monarch's internals
    (``monarch._src...``, ``monarch._rust_bindings...``) is rewritten to Monarch's own
    public home of that object, found by reading Monarch's public ``__init__`` modules in
    the same checkout (``monarch.actor`` re-exports ``context`` from
    ``monarch._src.actor.actor_mesh``: the test then imports ``monarch.actor.context``).
    One internal name with a public meaning is mapped by hand: ``SupervisionError``, which
    Monarch's tests catch and danaus exports.
  * A test (or helper) that uses an internal name with no public home tests Monarch's
    internals, not its API: it is left out and counted as ``internal``, with the names.
  * What is left runs under pytest, one file at a time, with the ``monarch`` modules served
    by danaus (``danaus.monarch.install`` in every interpreter, through a sitecustomize
    on PYTHONPATH, so the subprocesses Monarch's tests start get it too), Monarch's own
    pytest options (asyncio auto mode) and its own skips (``oss_skip``,
    ``disabled_tests.txt``).
  * A test that uses a public Monarch module danaus does not serve fails, as it would for
    a user; the report names the module.
  * Each example runs as ``python -m danaus.monarch EXAMPLE`` with a deadline; it passes
    when it exits 0.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

#: Monarch's supervision and public-API actor, mesh and RDMA tests.
DEFAULT_TESTS = [
    "test_actor_error.py",
    "test_python_actors.py",
    "test_proc_mesh.py",
    "test_host_mesh.py",
    "test_actor_shape.py",
    "test_supervision_hierarchy.py",
    "test_rdma.py",
    "test_rdma_cpu_no_torch.py",
    "test_port_forward.py",
    "test_config.py",
    "test_grad_generator.py",
]
#: Monarch's documentation examples that can run on CPU.
DEFAULT_EXAMPLES = [
    "ping_pong.py",
    "crawler.py",
    "getting_started.py",
    "distributed_tensors.py",
    "grpo_yield.py",
    "ddp/spmd_ddp.py",
    "grpo_actor.py",
    "grpo_sim.py",
    "ddp/spmd_job.py",
]
# Not run: debugging.py stops at breakpoint() in every actor and waits for a person at the
# debugger (`danaus debug`); the Kubernetes and OpenTelemetry-collector examples need
# services that cannot run here.
#: Monarch's public modules, in the order a name's public home is chosen.
PUBLIC_INITS = {
    "monarch.actor": "python/monarch/actor/__init__.py",
    "monarch.actor.concurrent": "python/monarch/actor/concurrent.py",
    "monarch.rdma": "python/monarch/rdma/__init__.py",
    "monarch.config": "python/monarch/config/__init__.py",
    "monarch.spmd": "python/monarch/spmd/__init__.py",
    "monarch.job": "python/monarch/job/__init__.py",
    "monarch": "python/monarch/__init__.py",
}
#: Internal names with a public meaning that Monarch exports nowhere public.
BY_HAND = {
    ("monarch._rust_bindings.monarch_hyperactor.supervision", "SupervisionError"): (
        "danaus",
        "SupervisionError",
    ),
}
WANTED = ["python/tests", "docs/source/examples", "disabled_tests.txt", *PUBLIC_INITS.values()]


def is_internal(module: str) -> bool:
    return module.startswith("monarch.") and any(
        part.startswith("_") for part in module.split(".")[1:]
    )


# -- extracting ------------------------------------------------------------------------


def extract(src: Path, rev: str, into: Path) -> str:
    """Copy what is wanted from a Monarch checkout into ``into``; return its commit."""
    if (src / "python" / "tests").is_dir():
        for rel in WANTED:
            path = src / rel
            if path.is_dir():
                shutil.copytree(path, into / rel)
            elif path.is_file():
                (into / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, into / rel)
        git = ["git", "-C", str(src)]
    else:
        git = ["git", "--git-dir", str(src)]
        archive = into / "monarch.tar"
        present = subprocess.run(
            [*git, "ls-tree", "--name-only", rev, "--", *WANTED],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        subprocess.run([*git, "archive", "-o", str(archive), rev, "--", *present], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(into, filter="data")
        archive.unlink()
    done = subprocess.run([*git, "rev-parse", rev], capture_output=True, text=True)
    return done.stdout.strip() or "(not a git checkout)"


def public_homes(root: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(internal module, name) -> (public module, public name), read from Monarch's own
    public modules: where Monarch re-exports an internal object, tests may use it."""
    homes: dict[tuple[str, str], tuple[str, str]] = {}
    for public, rel in PUBLIC_INITS.items():
        path = root / rel
        if not path.is_file():
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for alias in node.names:
                    key = (node.module, alias.name)
                    homes.setdefault(key, (public, alias.asname or alias.name))
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "_public_api"
            ):
                for name, (module, attr) in ast.literal_eval(node.value).items():
                    homes.setdefault((module, attr), (public, name))
    homes.update(BY_HAND)
    return homes


# -- keeping the public-API part of a test module ---------------------------------------


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


#: Private attributes of Monarch's public objects that its tests reach into (the root
#: client instance's list of child meshes, Future's constructor from a coroutine, the Rust
#: meshes behind the Python ones, the logging manager, ...): a test using one tests
#: Monarch's internals. (``_labels``, which Monarch's documentation examples read, is
#: served.)
INTERNAL_ATTRIBUTES = {
    "_as_rust",
    "_children",
    "_flush_from_tokio",
    "_from_coro",
    "_host_mesh",
    "_hy_host_mesh",
    "_inner_host_mesh",
    "_logging_manager",
    "_logging_mesh_client",
    "_ndslice",
    "_new_flush_task",
    "_new_with_shape",
    "_pending_actor_spawns",
    "_proc_mesh",
    "_stopped",
}


def _uses(node: ast.AST, dropped: set[str]) -> set[str]:
    """The dropped names ``node`` uses, any ``monarch._x`` attribute path, any import of
    Monarch internals left in a function body (:class:`_MapNestedImports` maps those it
    can), and any of Monarch's private attributes its tests reach into."""
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id in dropped:
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            path = _dotted(sub)
            if path and path.startswith("monarch.") and is_internal(path):
                found.add(path)
            elif sub.attr in INTERNAL_ATTRIBUTES and not (
                isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls")
            ):  # (a test actor's own attribute of that name is its own)
                found.add(f"monarch._private_attribute.{sub.attr}")
        elif isinstance(sub, ast.ImportFrom) and sub.module and is_internal(sub.module):
            found |= {f"{sub.module}.{a.name}" for a in sub.names}
        elif isinstance(sub, ast.Import):
            found |= {a.name for a in sub.names if is_internal(a.name)}
    return found


class _MapNestedImports(ast.NodeTransformer):
    """An import of Monarch internals inside a function, every name of which has a public
    home the runner serves, becomes an import from those homes."""

    def __init__(self, homes: dict[tuple[str, str], tuple[str, str]]) -> None:
        self.homes = homes

    def visit_ImportFrom(self, node: ast.ImportFrom) -> ast.AST | list[ast.AST]:
        if not (node.module and is_internal(node.module)):
            return node
        mapped = []
        for alias in node.names:
            home = self.homes.get((node.module, alias.name))
            if home is None or not served(*home):
                return node  # left as it is: _uses flags it
            mapped.append(
                ast.ImportFrom(
                    module=home[0],
                    names=[ast.alias(home[1], alias.asname or alias.name)],
                    level=0,
                )
            )
        return mapped


def _defines(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    names = set()
    targets: Iterable[ast.AST] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AnnAssign | ast.AugAssign):
        targets = [node.target]
    for target in targets:
        for sub in ast.walk(target):
            if isinstance(sub, ast.Name):
                names.add(sub.id)
    return names


def _is_test(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test")
    ) or (isinstance(node, ast.ClassDef) and node.name.startswith("Test"))


def served(module: str, name: str) -> bool:
    """Does danaus's runner serve ``module.name``?"""
    import importlib

    import danaus.monarch

    danaus.monarch.install()
    try:
        mod = importlib.import_module(module)
        getattr(mod, name)
    except (ImportError, AttributeError):
        try:
            importlib.import_module(f"{module}.{name}")  # a submodule
        except ImportError:
            return False
    return True


def _map_imports(
    tree: ast.Module,
    homes: dict[tuple[str, str], tuple[str, str]],
    helpers: dict[str, dict[str, set[str]]],
) -> tuple[list[ast.stmt], dict[str, set[str]]]:
    """The module's statements with its imports of Monarch mapped (see
    :func:`public_part`), and the names they could not give, with why."""
    for i, node in enumerate(tree.body):  # imports in function and class bodies
        if not isinstance(node, ast.Import | ast.ImportFrom):
            tree.body[i] = _MapNestedImports(homes).visit(node)
    why: dict[str, set[str]] = {}  # left-out name -> the Monarch names it needed
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            monarch = node.module == "monarch" or node.module.startswith("monarch.")
            kept = []
            for alias in node.names:
                local = alias.asname or alias.name
                qualified = f"{node.module}.{alias.name}"
                if node.module in helpers and alias.name in helpers[node.module]:
                    why[local] = helpers[node.module][alias.name]
                elif monarch and is_internal(node.module):
                    home = homes.get((node.module, alias.name))
                    if home is None:
                        why[local] = {qualified}
                    elif not served(*home):
                        why[local] = {f"{home[0]}.{home[1]}"}
                    else:
                        body.append(
                            ast.ImportFrom(
                                module=home[0], names=[ast.alias(home[1], local)], level=0
                            )
                        )
                elif monarch and not served(node.module, alias.name):
                    why[local] = {qualified}
                else:
                    kept.append(alias)
            if kept:
                node.names = kept
                body.append(node)
            continue
        if isinstance(node, ast.Import) and any(is_internal(a.name) for a in node.names):
            kept_names = [a for a in node.names if not is_internal(a.name)]
            if not kept_names:
                continue
            node.names = kept_names
        body.append(node)
    return body, why


def public_part(
    source: str,
    homes: dict[tuple[str, str], tuple[str, str]],
    helpers: dict[str, dict[str, set[str]]],
) -> tuple[str, dict[str, set[str]]]:
    """The module with internal imports mapped to public homes, and every top-level
    statement left out that needs an internal name with no public home, a public Monarch
    name the runner does not serve, or a name a helper module of the tests left out
    (``helpers``: module -> left-out name -> why). Returns the text and, per name left
    out (tests included), why: the qualified Monarch names it needed."""
    tree = ast.parse(source)
    body, why = _map_imports(tree, homes, helpers)

    def roots(uses: set[str]) -> set[str]:
        return set().union(*(why.get(u, {u}) for u in uses))

    changed = True
    while changed:  # what uses a left-out name is left out too
        changed = False
        kept_body = []
        for node in body:
            if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                methods = []
                for item in node.body:
                    uses = _uses(item, set(why))
                    if uses and _is_test(item):
                        why[f"{node.name}::{item.name}"] = roots(uses)
                        changed = True
                    else:
                        methods.append(item)
                if not any(_is_test(m) for m in methods) and any(_is_test(m) for m in node.body):
                    why[node.name] = set().union(
                        *(v for k, v in why.items() if k.startswith(f"{node.name}::"))
                    )
                    changed = True
                    continue
                node.body = methods or [ast.Pass()]
            uses = _uses(node, set(why))
            if uses and not isinstance(node, ast.ImportFrom | ast.Import):
                for name in _defines(node) or {f"<line {node.lineno}>"}:
                    why[name] = roots(uses)
                changed = True
                continue
            kept_body.append(node)
        body = kept_body
    tree.body = body
    return ast.unparse(ast.fix_missing_locations(tree)) + "\n", why


def is_test_name(name: str) -> bool:
    last = name.rpartition("::")[2]
    return last.startswith("test")


def classify(why: dict[str, set[str]]) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """The tests left out, split: (for Monarch internals, for public names the runner
    does not serve; a test needing both counts as the latter: it fails for a user)."""
    internal, unserved = {}, {}
    for name, roots in why.items():
        if not is_test_name(name) or (name.startswith("Test") and "::" not in name):
            continue
        public = {r for r in roots if not (is_internal(r) or is_internal(r.rpartition(".")[0]))}
        if public:
            unserved[name] = public
        else:
            internal[name] = roots
    return internal, unserved


# -- running -----------------------------------------------------------------------------

CONFTEST = """\
import os
import sys
from pathlib import Path

import pytest

os.environ["PYTHONPATH"] = os.pathsep.join(sys.path)
_DISABLED = Path(__file__).parent / "disabled_tests.txt"
_DISABLED_IDS = {
    line.strip() for line in (_DISABLED.read_text().splitlines() if _DISABLED.exists() else [])
    if line.strip()
}


def pytest_configure(config):
    config.addinivalue_line("markers", "oss_skip: skipped in Monarch's own OSS CI")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("oss_skip"):
            item.add_marker(pytest.mark.skip(reason="oss_skip: Monarch skips it in OSS"))
        elif "python/tests/" + item.nodeid in _DISABLED_IDS:
            item.add_marker(pytest.mark.skip(reason="in Monarch's disabled_tests.txt"))
"""

SITECUSTOMIZE = """\
import danaus.monarch

danaus.monarch.install()
"""


def run_tests(work: Path, files: list[str], timeout: int, python: str) -> list[dict]:
    tests = work / "python" / "tests"
    homes = public_homes(work)
    run_dir = work / "run"
    run_dir.mkdir()
    site = work / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    disabled = work / "disabled_tests.txt"
    (run_dir / "disabled_tests.txt").write_text(disabled.read_text() if disabled.exists() else "")
    (run_dir / "conftest.py").write_text(CONFTEST)
    (run_dir / "pytest.ini").write_text(
        f"[pytest]\nasyncio_mode = auto\ntimeout = {timeout}\n"
        "asyncio_default_fixture_loop_scope = function\n"
    )
    left_out_by_file: dict[str, dict[str, set[str]]] = {}
    unserved_by_file: dict[str, dict[str, set[str]]] = {}
    helpers: dict[str, dict[str, set[str]]] = {}
    paths = [
        p
        for p in tests.glob("*.py")
        if p.name != "conftest.py" and not p.name.endswith("_plugin.py")
    ]
    # the helper modules first: a test importing what one of them left out is left out
    for path in sorted(paths, key=lambda p: p.name.startswith("test_")):
        text, why = public_part(path.read_text(), homes, helpers)
        (run_dir / path.name).write_text(text)
        helpers[path.stem] = why
        left_out_by_file[path.name], unserved_by_file[path.name] = classify(why)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(run_dir), env.get("PYTHONPATH", "")])
    results = []
    for name in files:
        if not (run_dir / name).exists():
            results.append({"file": name, "missing": True})
            continue
        report = work / f"{name}.xml"
        started = time.monotonic()
        done = _run_in_own_group(
            [
                python,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "--junitxml",
                str(report),
                name,
            ],
            run_dir,
            env,
        )
        cases = _cases(report)
        if not cases and done.returncode not in (0, 5):  # 5: nothing collected
            cases = [
                {
                    "name": "(collection)",
                    "outcome": "failed",
                    "message": (done.stdout + done.stderr)[-600:],
                }
            ]
        for test, names in sorted(unserved_by_file.get(name, {}).items()):
            cases.append(
                {
                    "name": test,
                    "outcome": "failed",
                    "message": f"not run: needs {', '.join(sorted(names))}, which "
                    "the runner does not serve",
                }
            )
        results.append(
            {
                "file": name,
                "cases": cases,
                "internal": left_out_by_file.get(name, {}),
                "seconds": time.monotonic() - started,
            }
        )
    return results


def _cases(report: Path) -> list[dict]:
    if not report.exists():
        return []
    cases = []
    for case in ET.parse(report).iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome, message = "failed", child.get("message") or ""
                break
            if child.tag == "skipped":
                outcome, message = "skipped", child.get("message") or ""
        cases.append({"name": case.get("name"), "outcome": outcome, "message": message})
    return cases


def _run_in_own_group(
    argv: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a process group of its own, and end whatever of that group is left
    when it returns: a test that pytest-timeout stops leaves its subprocesses behind."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate()
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _end_leftovers(cwd)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _end_leftovers(run_dir: Path) -> None:
    """Kill what a test left running in a session of its own (``isolate_in_subprocess``
    children do that): every process whose command line names ``run_dir``, and all their
    descendants (the procs and fork servers they started)."""
    parents: dict[int, int] = {}
    marked: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        try:
            with open(f"/proc/{pid}/stat") as f:
                parents[pid] = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if str(run_dir).encode() in f.read():
                    marked.add(pid)
        except (OSError, ValueError, IndexError):
            continue
    marked.discard(os.getpid())
    doomed = set(marked)
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in doomed and pid not in doomed and pid != os.getpid():
                doomed.add(pid)
                grew = True
    for pid in doomed:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_examples(work: Path, examples: list[str], timeout: int, python: str) -> list[dict]:
    folder = work / "docs" / "source" / "examples"
    results = []
    for name in examples:
        path = folder / name
        if not path.exists():
            results.append({"example": name, "outcome": "missing", "tail": ""})
            continue
        started = time.monotonic()
        try:
            done = subprocess.run(
                [python, "-m", "danaus.monarch", path.name],
                cwd=path.parent,
                capture_output=True,
                text=True,
                timeout=timeout,
                env={**os.environ, "PYTHONPATH": str(folder)},
            )
            outcome = "passed" if done.returncode == 0 else f"exit {done.returncode}"
            tail = (done.stdout + done.stderr)[-800:]
        except subprocess.TimeoutExpired as e:
            outcome = f"timeout {timeout}s"
            tail = str(e.stdout or "")[-400:] + str(e.stderr or "")[-400:]
        results.append(
            {
                "example": name,
                "outcome": outcome,
                "tail": tail,
                "seconds": time.monotonic() - started,
            }
        )
    return results


# -- reporting ---------------------------------------------------------------------------


def report(commit: str, tests: list[dict], examples: list[dict], verbose: bool) -> int:
    print(f"Monarch at {commit}, run through python -m danaus.monarch\n")
    totals = {"passed": 0, "failed": 0, "skipped": 0, "internal": 0}
    print(f"{'test file':34} {'passed':>6} {'failed':>6} {'skipped':>7} {'internal':>8}  secs")
    for result in tests:
        if result.get("missing"):
            print(f"{result['file']:34} not in this checkout")
            continue
        counts = {k: 0 for k in totals}
        for case in result["cases"]:
            counts[case["outcome"]] += 1
        counts["internal"] = len(result["internal"])
        for key in totals:
            totals[key] += counts[key]
        print(
            f"{result['file']:34} {counts['passed']:6} {counts['failed']:6} "
            f"{counts['skipped']:7} {counts['internal']:8}  {result['seconds']:.0f}"
        )
    print(
        f"{'total':34} {totals['passed']:6} {totals['failed']:6} {totals['skipped']:7} "
        f"{totals['internal']:8}"
    )
    print("(internal: test functions left out for using Monarch internals with no public home)")
    failed = [
        (r["file"], c)
        for r in tests
        if not r.get("missing")
        for c in r["cases"]
        if c["outcome"] == "failed"
    ]
    if failed:
        print("\nfailed:")
        for file, case in failed:
            message = " ".join(case["message"].split())[:160]
            print(f"  {file}::{case['name']}: {message}")
    if verbose:
        print("\nleft out (internal names used):")
        for result in tests:
            for name, uses in sorted(result.get("internal", {}).items()):
                print(f"  {result['file']}::{name}: {', '.join(sorted(uses))}")
    ok = 0
    if examples:
        print(f"\n{'example':28} outcome")
        for ex in examples:
            ok += ex["outcome"] == "passed"
            secs = f"  ({ex['seconds']:.0f} s)" if "seconds" in ex else ""
            print(f"{ex['example']:28} {ex['outcome']}{secs}")
        print(f"{'examples run to their end':28} {ok} of {len(examples)}")
        for ex in examples:
            if ex["outcome"] != "passed" and ex["tail"]:
                last = [line for line in ex["tail"].splitlines() if line.strip()][-3:]
                print(f"\n  {ex['example']}:\n    " + "\n    ".join(last))
    return 0 if not failed and ok == len(examples) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("monarch_src", type=Path)
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--tests", nargs="*", default=DEFAULT_TESTS)
    parser.add_argument("--examples", nargs="*", default=DEFAULT_EXAMPLES)
    parser.add_argument("--timeout", type=int, default=120, help="per test, seconds")
    parser.add_argument("--example-timeout", type=int, default=300)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="monarch-conformance-"))
    try:
        commit = extract(args.monarch_src.resolve(), args.rev, work)
        tests = run_tests(work, args.tests, args.timeout, sys.executable)
        examples = run_examples(work, args.examples, args.example_timeout, sys.executable)
        return report(commit, tests, examples, args.verbose)
    finally:
        if args.keep:
            print(f"\nkept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
