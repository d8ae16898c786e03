"""Builds millpond._core, the Go state core, as a CPython extension.

The extension is a cgo c-shared library (see pybindings/); setuptools only
decides where the file goes, `go build` does the compiling.
"""

import os
import subprocess
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


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
        out = Path(self.get_ext_fullpath(ext.name)).resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        include = sysconfig.get_paths()["include"]
        env["CGO_ENABLED"] = "1"
        env["CGO_CFLAGS"] = f"-I{include} -O2"
        cmd = [
            "go", "build", "-buildmode=c-shared", "-trimpath",
            "-ldflags=-s -w", "-o", str(out), ext.go_package,
        ]
        subprocess.check_call(cmd, cwd=ROOT, env=env)
        # c-shared also writes a C header next to the library; it is not part
        # of the installed package.
        header = out.with_suffix(".h")
        if header.exists():
            header.unlink()


setup(
    ext_modules=[GoExtension("millpond._core", "./pybindings")],
    cmdclass={"build_ext": BuildGoExtension},
)
