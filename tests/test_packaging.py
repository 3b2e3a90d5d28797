"""Packaging details a user notices (issue 19): the license as an SPDX expression, compiled extensions without
debug info, and wheel tags that say what the wheel holds.

The default checks read the project files and run setup.py's command classes on a fake compiler (no build);
the slow one builds a wheel and an sdist from a copy of the tree (the installed setuptools, no build isolation:
offline, a few seconds) and looks inside them.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["fpsim/_ckernel.c", "fpsim/_cfpenv.c", "fpsim/_cgemm.c", "fpsim/_carith.c"]
HEADERS = ["fpsim/_csink.h"]  # included by the sources: in the sdist too
SETUPTOOLS_FLOOR = (77, 0)  # PEP 639 (license expression) support
KERNEL_MAX_BYTES = 300_000  # ~100 KB stripped on x86-64 gcc; 633 KB when it shipped with -g


def _pyproject() -> dict:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = [int(part) for part in re.findall(r"\d+", text)[:2]]
    return tuple(parts + [0] * (2 - len(parts)))


def _setup_dist():
    """setup.py's Distribution, from its setup() arguments: nothing runs, nothing is built."""
    import setuptools
    from setuptools.dist import Distribution

    captured: dict = {}
    saved = setuptools.setup
    setuptools.setup = lambda **kwargs: captured.update(kwargs)
    try:
        code = compile((ROOT / "setup.py").read_text(encoding="utf-8"), str(ROOT / "setup.py"), "exec")
        exec(code, {"__name__": "__main__", "__file__": str(ROOT / "setup.py")})
    finally:
        setuptools.setup = saved
    return Distribution({"name": "fpsim-precision", **captured})


def test_license_is_an_spdx_expression():
    project = _pyproject()["project"]
    assert project["license"] == "BSD-3-Clause"  # the table form {text = ...} is deprecated by setuptools
    # a license expression and a "License ::" classifier together are an error for setuptools >= 77
    assert not [c for c in project.get("classifiers", []) if c.startswith("License ::")]
    for pattern in project.get("license-files", []):
        assert list(ROOT.glob(pattern)), f"license-files pattern {pattern!r} matches no file"


def test_build_requires_a_setuptools_that_knows_license_expressions():
    requires = _pyproject()["build-system"]["requires"]
    (spec,) = [r for r in requires if re.match(r"setuptools\b", r)]
    floor = re.search(r">=\s*([\d.]+)", spec)
    assert floor is not None, spec
    assert _version_tuple(floor.group(1)) >= SETUPTOOLS_FLOOR
    # setuptools >= 70.1 has bdist_wheel itself (setup.py subclasses it): no "wheel" build requirement
    assert not [r for r in requires if re.match(r"wheel\b", r)]


def test_extensions_declared_optional_and_in_the_sdist():
    dist = _setup_dist()
    declared = {ext.name: ext for ext in dist.ext_modules}
    assert set(declared) == {"fpsim._ckernel", "fpsim._cfpenv", "fpsim._cgemm", "fpsim._carith"}
    assert all(ext.optional for ext in declared.values())
    assert sorted(src for ext in declared.values() for src in ext.sources) == sorted(SOURCES)
    manifest = (ROOT / "MANIFEST.in").read_text(encoding="utf-8").split("\n")
    for src in SOURCES + HEADERS:
        assert (ROOT / src).is_file()
        assert f"include {src}" in manifest


@pytest.mark.parametrize(
    ("compiler_type", "platform", "env", "compile_extra", "link_extra"),
    [
        ("unix", "linux", {}, ["-O3", "-g0"], ["-s"]),
        ("unix", "darwin", {}, ["-O3", "-g0"], []),  # ld64 ignores -s as obsolete; -g0 is enough there
        ("unix", "linux", {"FPSIM_DEBUG_BUILD": "1"}, ["-O3"], []),
        ("msvc", "win32", {}, [], []),  # cl.exe knows neither -O3 nor -g0
    ],
)
def test_build_ext_flags_only_for_gcc_and_clang(monkeypatch, compiler_type, platform, env, compile_extra, link_extra):
    from setuptools.command.build_ext import build_ext

    dist = _setup_dist()
    cmd = dist.cmdclass["build_ext"](dist)
    assert issubclass(type(cmd), build_ext)
    built = []
    monkeypatch.setattr(build_ext, "build_extensions", lambda self: built.append(self))
    monkeypatch.delenv("FPSIM_DEBUG_BUILD", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(sys, "platform", platform)
    cmd.compiler = SimpleNamespace(compiler_type=compiler_type)
    cmd.extensions = dist.ext_modules
    before = {ext.name: (list(ext.extra_compile_args), list(ext.extra_link_args)) for ext in cmd.extensions}
    cmd.build_extensions()
    assert built == [cmd]
    for ext in cmd.extensions:
        compile_args, link_args = before[ext.name]
        # _carith's fma switches the rounding mode: gcc/clang must not fold or contract across it (never for MSVC)
        fp_flags = ["-frounding-math", "-fno-trapping-math", "-ffp-contract=off"]
        extra = compile_extra + (fp_flags if ext.name == "fpsim._carith" and compiler_type == "unix" else [])
        assert ext.extra_compile_args == compile_args + extra
        assert ext.extra_link_args == link_args + link_extra


# --- the built artefacts --------------------------------------------------------------------------------------


def _copy_tree(dest: Path) -> Path:
    """What a build reads, from the working tree (uncommitted edits included), without built files."""
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    shutil.copytree(
        ROOT / "fpsim",
        dest / "fpsim",
        ignore=shutil.ignore_patterns("*.so", "*.pyd", "*.dylib", "__pycache__", "*.pyc"),
    )
    return dest


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    return log


def _pip_wheel(src: Path, out: Path, env: dict[str, str]) -> tuple[Path, str]:
    log = _run(
        [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "-w", str(out), "."],
        src,
        env,
    )
    (wheel,) = out.glob("*.whl")
    return wheel, log


def _assert_no_license_deprecation(log: str) -> None:
    assert "`project.license` as a TOML table is deprecated" not in log
    assert "License classifiers are deprecated" not in log


def _wheel_member(zf: zipfile.ZipFile, suffix: str) -> str:
    (name,) = [n for n in zf.namelist() if n.endswith(suffix)]
    return zf.read(name).decode("utf-8")


@pytest.mark.slow
def test_built_wheel_and_sdist(tmp_path):
    import setuptools

    if _version_tuple(setuptools.__version__) < SETUPTOOLS_FLOOR:
        pytest.skip(f"installed setuptools {setuptools.__version__} predates {SETUPTOOLS_FLOOR}: offline build")
    if subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode != 0:
        pytest.skip("no pip")
    if sysconfig.get_platform().startswith("win"):
        pytest.skip("the tag and strip checks below are for ELF/Mach-O builds")
    env = {k: v for k, v in os.environ.items() if k not in ("FPSIM_DEBUG_BUILD", "CC", "LDSHARED")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"

    # with a compiler: both extensions, platform-tagged, stripped
    src = _copy_tree(tmp_path / "src")
    wheel, log = _pip_wheel(src, tmp_path / "wheel", env)
    _assert_no_license_deprecation(log)
    if not re.search(rf"-{impl}-{impl}-[a-z0-9_]+\.whl$", wheel.name) or wheel.name.endswith("-any.whl"):
        pytest.fail(f"a wheel with compiled extensions must be platform-tagged: {wheel.name}\n{log[-3000:]}")
    with zipfile.ZipFile(wheel) as zf:
        wheel_meta = _wheel_member(zf, ".dist-info/WHEEL")
        metadata = Parser().parsestr(_wheel_member(zf, ".dist-info/METADATA"))
        shared = {n: zf.read(n) for n in zf.namelist() if n.endswith((".so", ".dylib"))}
        zf.extractall(tmp_path / "site")
    assert "Root-Is-Purelib: false" in wheel_meta
    assert metadata["License-Expression"] == "BSD-3-Clause"
    assert metadata["License-File"] == "LICENSE"  # the licence text ships with the binaries, as BSD-3 requires
    assert metadata["License"] is None  # the deprecated field is gone
    assert sorted(n.split("/")[-1].split(".")[0] for n in shared) == ["_carith", "_cfpenv", "_cgemm", "_ckernel"]
    for name, data in shared.items():
        debug_sections = [section for section in (b".debug_info", b".debug_line") if section in data]
        assert not debug_sections, f"{name} carries debug info: {debug_sections}"
    (kernel,) = [data for n, data in shared.items() if "_ckernel" in n]
    assert len(kernel) < KERNEL_MAX_BYTES, len(kernel)
    # the built kernel loads and is the one fpsim uses
    probe = (
        "import fpsim, fpsim.rounding as r, fpsim._cfpenv; "
        "print(fpsim.__file__); print(r._ckernel.__file__ if r._ckernel else None)"
    )
    out = _run([sys.executable, "-c", probe], tmp_path, {**env, "PYTHONPATH": str(tmp_path / "site")})
    where, kernel_file = out.strip().splitlines()[-2:]
    if Path(where).resolve().is_relative_to((tmp_path / "site").resolve()):  # else an import hook outranks PYTHONPATH
        assert kernel_file != "None" and Path(kernel_file).resolve().is_relative_to((tmp_path / "site").resolve())

    # without a compiler: the optional extensions are skipped, and the wheel says it is pure
    false = shutil.which("false")
    if false is not None:
        nocc = _copy_tree(tmp_path / "nocc")
        wheel, log = _pip_wheel(nocc, tmp_path / "wheel-nocc", {**env, "CC": false})
        assert wheel.name.endswith("-py3-none-any.whl"), f"{wheel.name}\n{log[-3000:]}"
        with zipfile.ZipFile(wheel) as zf:
            assert "Root-Is-Purelib: true" in _wheel_member(zf, ".dist-info/WHEEL")
            assert not [n for n in zf.namelist() if n.endswith((".so", ".pyd", ".dylib"))]
            assert "fpsim/rounding.py" in zf.namelist()  # the package itself at the root, not under .data/

    # the sdist carries the C sources and the same license metadata
    script = "import sys; from setuptools import build_meta as b; print(b.build_sdist(sys.argv[1]))"
    log = _run([sys.executable, "-c", script, str(tmp_path / "sdist")], src, env)
    _assert_no_license_deprecation(log)
    (sdist,) = (tmp_path / "sdist").glob("*.tar.gz")
    with tarfile.open(sdist) as tf:
        names = tf.getnames()
        top = names[0].split("/")[0]
        pkg_info = tf.extractfile(f"{top}/PKG-INFO")
        assert pkg_info is not None
        sdist_meta = Parser().parsestr(pkg_info.read().decode("utf-8"))
    for src_file in SOURCES + HEADERS:
        assert f"{top}/{src_file}" in names
    assert sdist_meta["License-Expression"] == "BSD-3-Clause"
