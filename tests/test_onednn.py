"""The package turns TensorFlow's oneDNN kernels on for x86-64 CPUs where TensorFlow leaves them off."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from bgem3_embeddings.backends.tensorflow.onednn import ONEDNN_ENV, prefer_onednn


def test_sets_the_default_only_when_it_can_matter() -> None:
    env: dict[str, str] = {}
    assert prefer_onednn(env, machine="x86_64", tensorflow_imported=False)
    assert env == {ONEDNN_ENV: "1"}
    user_choice = {ONEDNN_ENV: "0"}
    assert not prefer_onednn(user_choice, machine="x86_64", tensorflow_imported=False)
    assert user_choice == {ONEDNN_ENV: "0"}, "the user's setting must win"
    for machine, imported in (("arm64", False), ("aarch64", False), ("x86_64", True)):
        env = {}
        assert not prefer_onednn(env, machine=machine, tensorflow_imported=imported)
        assert env == {}, (machine, imported)


def _onednn_in_fresh_process(code: str, env_value: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != ONEDNN_ENV}
    if env_value is not None:
        env[ONEDNN_ENV] = env_value
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True
    )
    return done.stdout.strip().splitlines()[-1]


ASK = "from bgem3_embeddings.backends.tensorflow.onednn import onednn_enabled; print(onednn_enabled())"


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86-64 only")
def test_importing_the_package_before_tensorflow_turns_onednn_on() -> None:
    assert _onednn_in_fresh_process("import bgem3_embeddings, tensorflow; " + ASK, None) == "True"
    assert _onednn_in_fresh_process("import bgem3_embeddings, tensorflow; " + ASK, "0") == "False"
    # TensorFlow first: too late to change, and the variable is left alone (the doctor reports the state).
    code = "import tensorflow, os, bgem3_embeddings; print(os.environ.get('TF_ENABLE_ONEDNN_OPTS'))"
    assert _onednn_in_fresh_process(code, None) == "None"
