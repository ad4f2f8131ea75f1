"""Fixtures shared by the training tests: ``hostile_env``, with and without the environment variable that turns
off torch.load's weights-only default."""
import pytest

import dgl_exact  # noqa: F401  (DGL compatibility shim)


@pytest.fixture(params=[False, True], ids=["default-env", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"])
def hostile_env(request, monkeypatch):
    """Both with torch's defaults and with the variable that turns torch.load's default unsafe (torch >= 2.4)."""
    if request.param:
        monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    else:
        monkeypatch.delenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", raising=False)
    return request.param
