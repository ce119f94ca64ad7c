import os, pathlib, subprocess
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
XPERT = pathlib.Path(os.environ.get("XPERT_BIN", ROOT / "build" / "xpert"))
MODEL = ROOT / "models" / "gemma3-270m.gguf"


def run(*args, timeout=600):
    return subprocess.run([str(XPERT), *map(str, args)], capture_output=True, timeout=timeout)


@pytest.fixture(scope="session")
def xpert():
    if not XPERT.exists():
        pytest.fail(f"{XPERT} is missing: build first (make build)")
    return run


@pytest.fixture(scope="session")
def model():
    if not MODEL.exists():
        pytest.fail(f"{MODEL} is missing: run scripts/setup.sh")
    return MODEL
