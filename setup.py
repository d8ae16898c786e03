"""Builds millpond._core, the Go state core, as a CPython extension.

The extension is a cgo c-shared library (see pybindings/); setuptools only
decides where the file goes, `go build` does the compiling.

Building needs Go (at least the version of go.mod's `go` line) on PATH and a
C compiler for cgo. cgo uses `CC` from the environment when it is set (the
manylinux wheel is built that way, with tools/zigcc) and the system's `cc`
otherwise.
"""

import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import ExecError, PlatformError

ROOT = Path(__file__).resolve().parent
GO_DOWNLOAD = "https://go.dev/dl/"


def go_mod_minimum() -> tuple[int, int, int]:
    """The Go version go.mod's `go` line asks for, as (1, minor, patch)."""
    try:
        text = (ROOT / "go.mod").read_text()
    except OSError:
        raise PlatformError(
            f"go.mod is missing from {ROOT}: this source tree cannot build millpond's Go core"
        ) from None
    m = re.search(r"^go\s+(\d+)\.(\d+)(?:\.(\d+))?\s*$", text, re.MULTILINE)
    if m is None:
        raise PlatformError(f"{ROOT / 'go.mod'} has no `go 1.NN` line")
    return int(m[1]), int(m[2]), int(m[3] or 0)


def parse_go_version(text: str) -> "tuple[int, int, int] | None":
    """(1, minor, patch) of a `go env GOVERSION` answer such as go1.26.8.

    A pre-release (go1.27rc1) counts as below its .0 release, the way Go
    orders them; a development build (devel ...) is taken as new enough.
    """
    text = text.strip()
    if text.startswith("devel"):
        return (1, 1 << 30, 0)
    m = re.match(r"go(\d+)\.(\d+)(?:\.(\d+)|(rc|beta)\d+)?", text)
    if m is None:
        return None
    if m[4]:
        return int(m[1]), int(m[2]) - 1, 1 << 30
    return int(m[1]), int(m[2]), int(m[3] or 0)


def show(version: tuple[int, int, int]) -> str:
    return f"{version[0]}.{version[1]}" + (f".{version[2]}" if version[2] else "")


def find_go() -> str:
    """The path of a new enough `go`, or a one-line error saying what is needed."""
    need = go_mod_minimum()

    def advice(found: str = "") -> str:
        return (
            f"building millpond's Go core needs Go >= {show(need)} on PATH{found} ({GO_DOWNLOAD});"
            " or install a prebuilt wheel"
        )

    go = shutil.which("go")
    if go is None:
        raise PlatformError(advice())
    # GOTOOLCHAIN=local: ask the installed go for its own version, never for
    # one it would download to satisfy go.mod.
    env = dict(os.environ, GOTOOLCHAIN="local")
    try:
        found = subprocess.run(
            [go, "env", "GOVERSION"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        raise PlatformError(advice(f", but {go} does not run ({e})")) from None
    have = parse_go_version(found)
    if have is None:
        raise PlatformError(advice(f", but {go} gives no version (go env GOVERSION: {found!r})"))
    # A user who set GOTOOLCHAIN (auto, go1.NN, ...) chose to let go fetch
    # the toolchain go.mod asks for; leave that to go.
    if have < need and os.environ.get("GOTOOLCHAIN", "local") == "local":
        raise PlatformError(advice(f", found {found} at {go}"))
    return go


class GoExtension(Extension):
    """An extension whose sources are a Go package built with cgo."""

    def __init__(self, name: str, package: str) -> None:
        super().__init__(name, sources=[])
        self.go_package = package


class BuildGoExtension(build_ext):
    """Runs `go build -buildmode=c-shared` for every GoExtension."""

    def build_extension(self, ext: Extension) -> None:
        if not isinstance(ext, GoExtension):
            super().build_extension(ext)
            return
        go = find_go()
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        include = sysconfig.get_paths()["include"]
        env["CGO_ENABLED"] = "1"
        # The building interpreter's headers first; flags the user set
        # (CGO_CFLAGS) after them, so they can override -O2.
        env["CGO_CFLAGS"] = f"-I{include} -O2 {os.environ.get('CGO_CFLAGS', '')}".strip()
        cmd = [
            go, "build", "-buildmode=c-shared", "-trimpath",
            "-ldflags=-s -w", "-o", str(out), ext.go_package,
        ]
        # cgo compiles and links with $CC when it is set, else with cc.
        print(f"building {ext.name} with {go}, CC={env.get('CC') or '(go default)'}", flush=True)
        try:
            subprocess.check_call(cmd, cwd=ROOT, env=env)
        except subprocess.CalledProcessError as e:
            raise ExecError(f"go build of {ext.go_package} failed with exit status {e.returncode} (messages above)") from None
        # c-shared also writes a C header next to the library; it is not part
        # of the installed package.
        header = out.with_suffix(".h")
        if header.exists():
            header.unlink()


setup(
    ext_modules=[GoExtension("millpond._core", "./pybindings")],
    cmdclass={"build_ext": BuildGoExtension},
)
