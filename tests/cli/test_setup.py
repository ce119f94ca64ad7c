"""scripts/pip_missing.py, setup.sh's check of the PyPI packages: a fresh machine must get every one."""
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def missing(*specs):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "pip_missing.py"), *specs], check=True,
                         capture_output=True, text=True).stdout
    return out.split()


def test_lists_what_is_not_installed_or_not_the_pinned_version():
    # pytest is installed (it runs this); the unpinned package that is not installed must be listed too,
    # which an earlier check skipped (it looked a package up only where a version was pinned).
    assert missing("pytest", "xpert-no-such-package-4711", "pytest==0.0.1") == [
        "xpert-no-such-package-4711", "pytest==0.0.1"]


def test_an_installed_package_at_its_pinned_version_is_not_listed():
    from importlib.metadata import version
    assert missing(f"pytest=={version('pytest')}") == []
