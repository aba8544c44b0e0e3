"""The `metal` extra resolves to Apple's documented pair on an Apple-silicon Mac and to nothing elsewhere.

The markers are evaluated with `packaging` (what pip uses) against injected environments, reading the
requirements from pyproject.toml, so the test runs on any machine.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from bgem3_embeddings.backends.tensorflow.metal import (
    METAL_DOCUMENTED_TF,
    METAL_MIN_PLUGIN,
    PLUGIN_INSTALL,
    PLUGIN_TF,
)

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
TF_RELEASES = ("2.18.0", "2.18.1", "2.19.0", "2.20.0", "2.21.0")


def environment(system: str, machine: str, python: str, implementation: str = "CPython") -> dict[str, str]:
    """A PEP 508 marker environment for another platform, with the extra being installed."""
    env = dict(default_environment())
    env.update(
        sys_platform={"Darwin": "darwin", "Linux": "linux", "Windows": "win32"}[system],
        platform_system=system,
        os_name="nt" if system == "Windows" else "posix",
        platform_machine=machine,
        python_version=python,
        python_full_version=f"{python}.0",
        platform_python_implementation=implementation,
        implementation_name=implementation.lower(),
        extra="metal",
    )
    return env


def resolved(env: dict[str, str], *extras: str) -> dict[str, SpecifierSet]:
    """What `pip install "bgem3-embeddings[metal]"` (or the extras named) asks for in `env`: per package,
    the base dependency's specifier combined with every extra requirement whose marker holds. Packages the
    extras add nothing to are left out."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    base = {Requirement(r).name: Requirement(r).specifier for r in project["dependencies"]}
    result: dict[str, SpecifierSet] = {}
    texts = [t for extra in extras or ("metal",) for t in project["optional-dependencies"][extra]]
    for text in texts:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate(env):
            name = requirement.name
            result[name] = result.get(name, base.get(name, SpecifierSet())) & requirement.specifier
    return result


def allowed(spec: SpecifierSet, versions: tuple[str, ...]) -> list[str]:
    return [v for v in versions if spec.contains(v, prereleases=False)]


@pytest.mark.parametrize("python", ["3.11", "3.12"])
def test_apple_silicon_gets_the_documented_pair(python: str) -> None:
    specs = resolved(environment("Darwin", "arm64", python))
    assert set(specs) == {"tensorflow", "tensorflow-metal"}
    assert allowed(specs["tensorflow"], TF_RELEASES) == ["2.18.0", "2.18.1"]
    documented = f"{METAL_DOCUMENTED_TF[0]}.{METAL_DOCUMENTED_TF[1]}.0"
    assert specs["tensorflow"].contains(documented)  # in step with the doctor's table
    plugin = f"{METAL_MIN_PLUGIN[0]}.{METAL_MIN_PLUGIN[1]}.0"
    assert allowed(specs["tensorflow-metal"], ("1.0.1", "1.1.0", plugin, "1.3.0")) == [plugin, "1.3.0"]


@pytest.mark.parametrize(
    "env",
    [
        environment("Linux", "x86_64", "3.11"),
        environment("Linux", "aarch64", "3.12"),
        environment("Windows", "AMD64", "3.12"),
        environment("Darwin", "x86_64", "3.12"),  # Intel Mac: no tensorflow-metal wheels
        environment("Darwin", "arm64", "3.13"),  # no cp313 wheels; doctor and device="metal" explain
        environment("Darwin", "arm64", "3.11", implementation="PyPy"),
    ],
    ids=["linux", "linux-arm", "windows", "intel-mac", "mac-py313", "mac-pypy"],
)
def test_elsewhere_the_extra_installs_nothing(env: dict[str, str]) -> None:
    assert resolved(env) == {}


def test_the_base_dependency_still_allows_every_supported_tensorflow() -> None:
    """Without the extra (or off the Mac) nothing narrows the base range."""
    project = tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]
    (tf,) = [Requirement(r) for r in project["dependencies"] if Requirement(r).name == "tensorflow"]
    assert allowed(tf.specifier, TF_RELEASES) == list(TF_RELEASES)


# ------------------------------------------------------------- the metal-plugin extra (community backend)
KERNELS = Path(__file__).resolve().parent / "data" / "metal_plugin_kernels.json"


@pytest.mark.parametrize("python", ["3.11", "3.12", "3.13"])
def test_apple_silicon_gets_the_plugin_and_its_tensorflow(python: str) -> None:
    specs = resolved(environment("Darwin", "arm64", python), "metal-plugin")
    assert set(specs) == {"tensorflow", "tensorflow-metal-plugin"}
    assert allowed(specs["tensorflow"], TF_RELEASES) == ["2.21.0"]
    assert specs["tensorflow"].contains(f"{PLUGIN_TF[0]}.{PLUGIN_TF[1]}.0")  # in step with the doctor
    # The plugin version the op check read (tests/test_metal_ops.py) is one the extra installs; the next
    # minor, which may move to another TensorFlow, is not.
    checked = json.loads(KERNELS.read_text(encoding="utf-8"))["plugin"]["version"]
    assert allowed(specs["tensorflow-metal-plugin"], ("0.3.0", checked, "0.4.9", "0.5.0")) == [
        checked,
        "0.4.9",
    ]


@pytest.mark.parametrize(
    "env",
    [environment("Linux", "x86_64", "3.11"), environment("Darwin", "x86_64", "3.12")],
    ids=["linux", "intel-mac"],
)
def test_the_plugin_extra_installs_nothing_elsewhere(env: dict[str, str]) -> None:
    assert resolved(env, "metal-plugin") == {}


def test_the_two_metal_extras_cannot_be_combined() -> None:
    """Both backends install the same library file: pip refuses the pair (no TensorFlow satisfies both)."""
    specs = resolved(environment("Darwin", "arm64", "3.12"), "metal", "metal-plugin")
    assert allowed(specs["tensorflow"], TF_RELEASES) == []


def test_the_plugin_route_is_two_commands_tensorflow_first() -> None:
    first, second = PLUGIN_INSTALL
    assert first == 'pip install "tensorflow==2.21.*"' and "[metal-plugin]" in second
