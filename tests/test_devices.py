"""Device and precision choice, with the device list injected (runs on any CPU-only machine)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bgem3_embeddings.backends.tensorflow.metal import library_owner, record_sha256
from bgem3_embeddings.devices import (
    AUTO_CPU_BF16_ENV,
    DeviceChoice,
    DeviceError,
    DeviceInventory,
    auto_cpu_bf16,
    choose_compute_dtype,
    choose_device,
    choose_precision,
    cpu_has_int8_dot,
    cpu_has_native_bf16,
    tf_device_kind,
)
from bgem3_embeddings.doctor import known_problems, report_lines
from tests.install_forms import clone_pip_install

CPU_ONLY = DeviceInventory(gpus=(), platform="Linux-x86_64")
LINUX_GPU = DeviceInventory(
    gpus=("/physical_device:GPU:0", "/physical_device:GPU:1"), platform="Linux-x86_64"
)
MAC_GPU = DeviceInventory(gpus=("/physical_device:GPU:0",), platform="Darwin-arm64")
MAC_NO_GPU = DeviceInventory(gpus=(), platform="Darwin-arm64")
SPR = frozenset({"avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})
CASCADE_LAKE = frozenset({"avx512f", "avx512_vnni"})


@pytest.mark.parametrize(
    ("request_", "inventory", "expected"),
    [
        ("auto", CPU_ONLY, DeviceChoice("cpu", "/CPU:0")),
        ("auto", LINUX_GPU, DeviceChoice("cuda", "/GPU:0")),
        ("auto", MAC_GPU, DeviceChoice("metal", "/GPU:0")),
        ("auto", MAC_NO_GPU, DeviceChoice("cpu", "/CPU:0")),
        ("cpu", LINUX_GPU, DeviceChoice("cpu", "/CPU:0")),
        ("/CPU:0", MAC_GPU, DeviceChoice("cpu", "/CPU:0")),
        ("gpu", LINUX_GPU, DeviceChoice("cuda", "/GPU:0")),
        ("cuda", LINUX_GPU, DeviceChoice("cuda", "/GPU:0")),
        ("metal", MAC_GPU, DeviceChoice("metal", "/GPU:0")),
        ("/GPU:1", LINUX_GPU, DeviceChoice("cuda", "/GPU:1")),
        ("cuda:1", LINUX_GPU, DeviceChoice("cuda", "/GPU:1")),
        (" GPU ", MAC_GPU, DeviceChoice("metal", "/GPU:0")),
    ],
)
def test_device_choice(request_: str, inventory: DeviceInventory, expected: DeviceChoice) -> None:
    assert choose_device(request_, inventory) == expected


@pytest.mark.parametrize(
    ("request_", "inventory", "message"),
    [
        ("gpu", CPU_ONLY, "sees no GPU"),
        ("metal", MAC_NO_GPU, "metal' extra"),
        ("metal", LINUX_GPU, "cuda device"),
        ("cuda", MAC_GPU, "metal device"),
        ("/GPU:2", LINUX_GPU, "2 GPU"),
        ("/GPU:x", LINUX_GPU, "GPU index"),
        ("tpu", CPU_ONLY, "unknown device"),
    ],
)
def test_device_errors_say_why(request_: str, inventory: DeviceInventory, message: str) -> None:
    with pytest.raises(DeviceError, match=message):
        choose_device(request_, inventory)


def test_device_must_be_a_string() -> None:
    with pytest.raises(DeviceError):
        choose_device(0, CPU_ONLY)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kind", "cpu_bf16_ok", "expected"),
    [
        ("cuda", False, "float16"),
        ("metal", False, "float32"),
        ("cpu", False, "float32"),
        ("cpu", True, "bfloat16"),
        ("metal", True, "float32"),
    ],
)
def test_auto_precision(kind: str, cpu_bf16_ok: bool, expected: str) -> None:
    device = DeviceChoice(kind, "/CPU:0" if kind == "cpu" else "/GPU:0")
    assert choose_precision("auto", device, cpu_bf16_ok=cpu_bf16_ok) == expected


@pytest.mark.parametrize("precision", ["float32", "bfloat16", "float16"])
def test_explicit_precision_is_kept(precision: str) -> None:
    assert choose_precision(precision, DeviceChoice("cuda", "/GPU:0")) == precision


def test_unknown_precision_is_an_error() -> None:
    with pytest.raises(DeviceError, match="unknown precision"):
        choose_precision("int4", DeviceChoice("cpu", "/CPU:0"))


def test_int8_is_cpu_only() -> None:
    assert choose_precision("int8", DeviceChoice("cpu", "/CPU:0")) == "int8"
    with pytest.raises(DeviceError, match="CPU only"):
        choose_precision("int8", DeviceChoice("cuda", "/GPU:0"))


def test_native_bf16_detection() -> None:
    assert cpu_has_native_bf16(SPR)
    assert cpu_has_native_bf16(frozenset({"avx512_bf16"}))
    assert not cpu_has_native_bf16(CASCADE_LAKE)
    assert not cpu_has_native_bf16(frozenset())


CPU = DeviceChoice("cpu", "/CPU:0")
CUDA = DeviceChoice("cuda", "/GPU:0")
METAL = DeviceChoice("metal", "/GPU:0")
SPR_FP16 = SPR | {"avx512_fp16", "amx_fp16"}


@pytest.mark.parametrize(
    ("precision", "device", "flags", "expected"),
    [
        ("float32", CPU, SPR, "float32"),
        ("bfloat16", CPU, SPR, "bfloat16"),  # AMX: native bf16 GEMMs
        ("bfloat16", CPU, CASCADE_LAKE, "float32"),  # emulated bf16: widen the weights instead
        ("bfloat16", CPU, frozenset(), "float32"),  # unknown CPU (no /proc/cpuinfo): the safe choice
        ("float16", CPU, SPR, "float32"),  # AMX-BF16 alone has no fp16 GEMMs
        ("float16", CPU, SPR_FP16, "float16"),
        ("float16", CUDA, frozenset(), "float16"),
        ("bfloat16", CUDA, frozenset(), "bfloat16"),
        ("float16", METAL, frozenset(), "float16"),
    ],
)
def test_auto_compute_dtype(
    precision: str, device: DeviceChoice, flags: frozenset[str], expected: str
) -> None:
    assert choose_compute_dtype(precision, device, flags) == expected


@pytest.mark.parametrize(
    ("precision", "requested", "expected"),
    [
        ("bfloat16", "bfloat16", "bfloat16"),
        ("bfloat16", "float32", "float32"),
        ("float16", "float32", "float32"),
    ],
)
def test_explicit_compute_dtype_is_kept(precision: str, requested: str, expected: str) -> None:
    assert choose_compute_dtype(precision, CPU, CASCADE_LAKE, requested) == expected


@pytest.mark.parametrize(
    ("precision", "requested", "message"),
    [
        ("float32", "bfloat16", "not possible with float32 weights"),
        ("bfloat16", "float16", "not possible with bfloat16 weights"),
        ("bfloat16", "int8", "unknown compute_dtype"),
    ],
)
def test_impossible_compute_dtype_is_an_error(precision: str, requested: str, message: str) -> None:
    with pytest.raises(DeviceError, match=message):
        choose_compute_dtype(precision, CPU, SPR, requested)


def test_auto_cpu_bf16_needs_native_bf16_and_the_opt_in() -> None:
    spr = DeviceInventory(platform="Linux-x86_64", cpu_flags=SPR)
    old = DeviceInventory(platform="Linux-x86_64", cpu_flags=CASCADE_LAKE)
    assert not auto_cpu_bf16(spr, {})
    assert auto_cpu_bf16(spr, {AUTO_CPU_BF16_ENV: "1"})
    assert not auto_cpu_bf16(old, {AUTO_CPU_BF16_ENV: "1"})
    # JAX's CPU backend runs bf16 matmuls slower than float32 (no bf16 instructions): never picked there
    jax_spr = DeviceInventory(platform="Linux-x86_64", cpu_flags=SPR, backend="jax")
    assert not auto_cpu_bf16(jax_spr, {AUTO_CPU_BF16_ENV: "1"})
    assert auto_cpu_bf16(DeviceInventory(cpu_flags=SPR, backend="torch"), {AUTO_CPU_BF16_ENV: "1"})


def test_encoder_uses_the_injected_inventory(tiny_checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bgem3_embeddings import BGEM3Encoder

    monkeypatch.setenv(AUTO_CPU_BF16_ENV, "1")
    spr = DeviceInventory(platform="Linux-x86_64", cpu_flags=SPR)
    encoder = BGEM3Encoder(tiny_checkpoint, device_inventory=spr)
    assert (encoder.device.kind, encoder.precision, encoder.compute_dtype) == ("cpu", "bfloat16", "bfloat16")
    old = DeviceInventory(platform="Linux-x86_64", cpu_flags=CASCADE_LAKE)
    assert BGEM3Encoder(tiny_checkpoint, device_inventory=old).precision == "float32"
    # bf16 asked for on a CPU without native bf16: bf16 weights, float32 matmuls.
    widened = BGEM3Encoder(tiny_checkpoint, precision="bfloat16", device_inventory=old)
    assert (widened.precision, widened.compute_dtype) == ("bfloat16", "float32")
    assert widened.model.encoder_layers[0].query.kernel.dtype == "bfloat16"
    with pytest.raises(ValueError, match="compute_dtype"):
        BGEM3Encoder(tiny_checkpoint, precision="float32", compute_dtype="bfloat16", device_inventory=old)


# ---------------------------------------------------------------------------------------------- doctor
def _messages(**kwargs: object) -> str:
    defaults: dict = {
        "versions": {"tensorflow": "2.21.0", "keras": "3.15.1"},
        "platform_name": "Linux-x86_64",
        "python": (3, 11),
    }
    defaults.update(kwargs)
    return " | ".join(f"{p.severity}: {p.message}" for p in known_problems(**defaults))


def test_doctor_flags_metal_on_python_313() -> None:
    text = _messages(
        versions={"tensorflow": "2.18.0", "tensorflow-metal": "1.2.0", "keras": "3.8"},
        platform_name="Darwin-arm64",
        python=(3, 13),
        gpus=(),
    )
    assert "error: tensorflow-metal has no wheels for Python 3.13" in text


def test_doctor_flags_metal_with_a_tensorflow_newer_than_documented() -> None:
    text = _messages(
        versions={"tensorflow": "2.21.0", "tensorflow-metal": "1.2.0", "keras": "3.15"},
        platform_name="Darwin-arm64",
        python=(3, 12),
        gpus=("/physical_device:GPU:0",),
    )
    assert "warning: TensorFlow 2.21.0 with tensorflow-metal 1.2.0" in text
    assert "error" not in text


def test_doctor_flags_metal_11_with_tf_218() -> None:
    text = _messages(
        versions={"tensorflow": "2.18.0", "tensorflow-metal": "1.1.0", "keras": "3.8"},
        platform_name="Darwin-arm64",
        python=(3, 12),
        gpus=("/physical_device:GPU:0",),
    )
    assert "Symbol not found" in text


def test_doctor_is_quiet_for_a_verified_metal_setup() -> None:
    assert (
        _messages(
            versions={"tensorflow": "2.18.0", "tensorflow-metal": "1.2.0", "keras": "3.8"},
            platform_name="Darwin-arm64",
            python=(3, 12),
            gpus=("/physical_device:GPU:0",),
        )
        == ""
    )


def test_doctor_other_rules() -> None:
    assert "CPU only" in _messages(platform_name="Darwin-arm64", gpus=())
    assert "tensorflow is not installed" in _messages(versions={"keras": "3.15"})
    assert "Keras 3 is required" in _messages(versions={"tensorflow": "2.15.0", "keras": "2.15.0"})
    assert "plain 'tensorflow'" in _messages(
        versions={"tensorflow": "2.15.0", "tensorflow-macos": "2.15.0", "keras": "3.0"}
    )
    assert "oneDNN kernels are off" in _messages(environ={"TF_ENABLE_ONEDNN_OPTS": "0"})
    assert "import bgem3_embeddings first" in _messages(onednn=False)
    assert "oneDNN" not in _messages(onednn=True)
    assert "oneDNN" not in _messages(onednn=False, platform_name="Darwin-arm64", gpus=("/GPU:0",))
    assert "emulated" in _messages(cpu_flags=CASCADE_LAKE)
    assert _messages(cpu_flags=SPR) == ""
    assert "int8" not in _messages(cpu_flags=CASCADE_LAKE)  # avx512_vnni: XNNPACK's fast int8 kernels
    epyc = frozenset({"avx", "avx2", "fma"})
    assert "no int8 dot-product instructions" in _messages(cpu_flags=epyc)
    assert "int8" not in _messages(cpu_flags=epyc, platform_name="Linux-aarch64")  # an x86 finding only
    assert cpu_has_int8_dot(frozenset({"avx_vnni"})) and not cpu_has_int8_dot(epyc)


def test_doctor_report_names_the_auto_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BGEM3_AUTO_CPU_BF16", raising=False)  # the opt-in would change the choice
    inventory = DeviceInventory(gpus=(), platform="Linux-x86_64", cpu_flags=SPR)
    text = "\n".join(report_lines(inventory, {"tensorflow": "2.21.0", "keras": "3.15.1"}))
    assert "amx_bf16 yes" in text and "native bf16 matmul: yes" in text
    assert "auto choice: device cpu (/CPU:0); precision per command:" in text
    # The library keeps float32 without the opt-in; serve picks bf16 on AMX-BF16 (devices.py's two rules).
    assert "LlamaIndex: float32 weights, float32 matmuls; BGEM3_AUTO_CPU_BF16=1 picks bfloat16" in text
    assert "  bgem3 serve: bfloat16 weights, bfloat16 matmuls (CPU with amx_bf16" in text
    assert "runs matmuls in: bfloat16 -> bfloat16, float16 -> float32" in text  # AMX-BF16, no AMX-FP16
    old = DeviceInventory(gpus=(), platform="Linux-x86_64", cpu_flags=CASCADE_LAKE)
    text = "\n".join(report_lines(old, {"tensorflow": "2.21.0", "keras": "3.15.1"}))
    assert "runs matmuls in: bfloat16 -> float32, float16 -> float32" in text
    assert "  bgem3 serve: float32 weights, float32 matmuls (CPU without bf16 matmuls" in text
    text = "\n".join(report_lines(LINUX_GPU, {"tensorflow": "2.21.0", "keras": "3.15.1"}))
    assert "auto choice: device cuda (/GPU:0); precision per command:" in text
    assert "LlamaIndex: float16 weights, float16 matmuls\n" in text + "\n"
    assert "  bgem3 serve: float16 weights, float16 matmuls (cuda GPU" in text
    assert "runs matmuls in: bfloat16 -> bfloat16, float16 -> float16" in text


@pytest.mark.parametrize(
    ("tensorflow", "plugin", "severity"),
    [
        ("2.18.0", "1.1.0", "error"),  # Apple: "Symbol not found" at import
        ("2.21.0", "1.1.0", "error"),
        ("2.21.0", "1.2.0", "warning"),  # unverified: what pip picked before the extra pinned 2.18
        ("2.19.1", "1.2.0", "warning"),
    ],
)
def test_doctor_names_a_mismatched_metal_pair_and_fix(tensorflow: str, plugin: str, severity: str) -> None:
    text = _messages(
        versions={"tensorflow": tensorflow, "tensorflow-metal": plugin, "keras": "3.15"},
        platform_name="Darwin-arm64",
        python=(3, 12),
        gpus=("/physical_device:GPU:0",),
    )
    assert f"{severity}: TensorFlow {tensorflow} with tensorflow-metal {plugin}" in text
    assert 'fix: pip install "tensorflow==2.18.*" "tensorflow-metal>=1.2"' in text


def test_doctor_on_python_313_says_metal_needs_312() -> None:
    text = _messages(platform_name="Darwin-arm64", python=(3, 13), gpus=())
    assert "CPU only" in text and "Metal needs Python <= 3.12" in text and "this is Python 3.13" in text
    assert clone_pip_install(".", "metal") in text


@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        (DeviceInventory(gpus=(), platform="Darwin-arm64", python=(3, 13)), "Metal needs Python <= 3.12"),
        (DeviceInventory(gpus=(), platform="Darwin-arm64", python=(3, 12)), clone_pip_install(".", "metal")),
        (DeviceInventory(gpus=(), platform="Linux-x86_64", python=(3, 12)), "needs macOS on Apple silicon"),
    ],
)
def test_asking_for_metal_without_it_says_why(inventory: DeviceInventory, message: str) -> None:
    with pytest.raises(DeviceError, match="sees no GPU") as info:
        choose_device("metal", inventory)
    assert message in str(info.value)


# ------------------------------------------------------------------- the community tensorflow-metal-plugin
PLUGIN_OK = {"tensorflow": "2.21.0", "tensorflow-metal-plugin": "0.4.1", "keras": "3.15"}
MAC_PLUGIN = {"platform_name": "Darwin-arm64", "python": (3, 13), "gpus": ("/physical_device:GPU:0",)}


def test_doctor_is_quiet_for_the_plugin_on_its_tensorflow() -> None:
    assert _messages(versions=PLUGIN_OK, macos=(15, 1), **MAC_PLUGIN) == ""


@pytest.mark.parametrize(
    ("tensorflow", "environ", "expected"),
    [
        ("2.20.0", {}, "error: tensorflow-metal-plugin is built for TensorFlow 2.21 and declines to load"),
        ("2.22.0", {"TF_METAL_SKIP_VERSION_CHECK": "1"}, "warning: tensorflow-metal-plugin is built for"),
        ("2.21.3", {"TF_METAL_SKIP_VERSION_CHECK": "1"}, None),  # a patch release is the same TensorFlow
        (
            "2.20.0",
            {"TF_METAL_SKIP_VERSION_CHECK": "0"},
            "declines to load",
        ),  # "0" is off, as the plugin reads it
    ],
)
def test_doctor_names_the_plugin_pin_and_fix(tensorflow: str, environ: dict, expected: str | None) -> None:
    versions = {**PLUGIN_OK, "tensorflow": tensorflow}
    text = _messages(versions=versions, macos=(15, 1), environ=environ, **MAC_PLUGIN)
    if expected is None:
        assert text == ""
        return
    assert expected in text
    assert (
        'pip install "tensorflow==2.21.*"' in text and "--no-build-isolation tensorflow-metal-plugin" in text
    )


def test_doctor_plugin_needs_macos_15() -> None:
    text = _messages(versions=PLUGIN_OK, macos=(14, 6), **MAC_PLUGIN)
    assert "error: tensorflow-metal-plugin needs macOS 15.0 or later (this is macOS 14.6)" in text
    assert _messages(versions=PLUGIN_OK, macos=(), **MAC_PLUGIN) == ""  # unknown macOS: nothing claimed


def test_doctor_disabled_plugin_and_missing_gpu() -> None:
    disabled = _messages(versions=PLUGIN_OK, macos=(15, 0), environ={"TF_DISABLE_METAL": "1"}, **MAC_PLUGIN)
    assert "warning: TF_DISABLE_METAL=1: tensorflow-metal-plugin offers no GPU" in disabled
    assert _messages(versions=PLUGIN_OK, macos=(15, 0), environ={"TF_DISABLE_METAL": "0"}, **MAC_PLUGIN) == ""
    no_gpu = _messages(versions=PLUGIN_OK, macos=(15, 0), platform_name="Darwin-arm64", gpus=())
    assert "tensorflow-metal-plugin is installed but TensorFlow sees no GPU" in no_gpu
    assert "only works on macOS arm64" in _messages(versions=PLUGIN_OK)  # on Linux


def test_doctor_both_metal_backends_is_an_error() -> None:
    versions = {**PLUGIN_OK, "tensorflow-metal": "1.2.0"}
    text = _messages(versions=versions, macos=(15, 1), platform_name="Darwin-arm64", python=(3, 12), gpus=())
    assert "error: tensorflow-metal and tensorflow-metal-plugin are both installed" in text
    assert "pip uninstall -y tensorflow-metal tensorflow-metal-plugin" in text


def test_apples_metal_on_tf_221_points_to_the_plugin() -> None:
    text = _messages(
        versions={"tensorflow": "2.21.0", "tensorflow-metal": "1.2.0", "keras": "3.15"},
        platform_name="Darwin-arm64",
        python=(3, 12),
        gpus=("/physical_device:GPU:0",),
    )
    assert "warning: TensorFlow 2.21.0 with tensorflow-metal 1.2.0" in text
    assert "keep TensorFlow 2.21.0 with the community tensorflow-metal-plugin" in text


def test_python_313_on_a_mac_is_offered_the_plugin_route() -> None:
    text = _messages(platform_name="Darwin-arm64", python=(3, 13), gpus=())
    assert "CPU only" in text and "tensorflow-metal-plugin" in text
    assert f'pip install "tensorflow==2.21.*", then {clone_pip_install(".", "metal-plugin")}' in text


@pytest.mark.parametrize(
    ("inventory", "message"),
    [
        (
            DeviceInventory(
                platform="Darwin-arm64",
                metal_backends=(("tensorflow-metal-plugin", "0.4.1"),),
                tensorflow="2.20.0",
                macos=(15, 1),
            ),
            "declines to load into TensorFlow 2.20.0",
        ),
        (
            DeviceInventory(
                platform="Darwin-arm64",
                metal_backends=(("tensorflow-metal-plugin", "0.4.1"),),
                tensorflow="2.21.0",
                macos=(15, 1),
                metal_env=(("TF_DISABLE_METAL", "1"),),
            ),
            "TF_DISABLE_METAL=1",
        ),
        (
            DeviceInventory(
                platform="Darwin-arm64",
                macos=(14, 2),
                tensorflow="2.21.0",
                metal_backends=(("tensorflow-metal-plugin", "0.4.1"),),
            ),
            "needs macOS 15.0 or later",
        ),
        (DeviceInventory(platform="Darwin-arm64", python=(3, 13)), clone_pip_install(".", "metal-plugin")),
    ],
)
def test_asking_for_metal_says_why_the_plugin_offers_no_gpu(inventory: DeviceInventory, message: str) -> None:
    with pytest.raises(DeviceError, match="sees no GPU") as info:
        choose_device("metal", inventory)
    assert message in str(info.value)


def test_auto_choice_is_the_same_with_either_backend() -> None:
    for backend in ("tensorflow-metal", "tensorflow-metal-plugin"):
        inventory = DeviceInventory(
            gpus=("/physical_device:GPU:0",), platform="Darwin-arm64", metal_backends=((backend, "1"),)
        )
        device = choose_device("auto", inventory)
        assert device == DeviceChoice("metal", "/GPU:0")
        assert choose_precision("auto", device) == "float32"


def test_tf_device_kind() -> None:
    assert tf_device_kind("/GPU:0", "Darwin-arm64") == "metal"
    assert tf_device_kind("/GPU:1", "Linux-x86_64") == "cuda"
    assert tf_device_kind("/CPU:0", "Darwin-arm64") == "cpu"


def test_which_backend_is_active_is_read_from_the_library_on_disk() -> None:
    plugin_file, apple_file = b"community build", b"apple wheel"
    recorded = {
        "tensorflow-metal": record_sha256(apple_file),
        "tensorflow-metal-plugin": record_sha256(plugin_file),
    }
    assert record_sha256(b"abc") == "ungWv48Bz-pBQUDeXa4iI7ADYaOWF3qctBD_YfIAFa0"  # RECORD's sha256 form
    assert library_owner(recorded, record_sha256(plugin_file)) == "tensorflow-metal-plugin"
    assert library_owner(recorded, record_sha256(apple_file)) == "tensorflow-metal"
    assert library_owner(recorded, None) is None
    assert library_owner(recorded, record_sha256(b"something else")) is None
    versions = {
        "tensorflow": "2.21.0",
        "keras": "3.15.1",
        "tensorflow-metal": "1.2.0",
        "tensorflow-metal-plugin": "0.4.1",
    }
    lines = "\n".join(report_lines(MAC_GPU, versions, (recorded, record_sha256(plugin_file))))
    assert "tensorflow-metal-plugin 0.4.1 (community" in lines and "tensorflow-metal 1.2.0 (Apple's" in lines
    assert "active: tensorflow-metal-plugin (TensorFlow loads its libmetal_plugin.dylib)" in lines
    assert "GPU offered: /physical_device:GPU:0" in lines
    assert "both installed" in lines  # and the known problem says to keep one
    missing = "\n".join(report_lines(MAC_NO_GPU, versions, (recorded, None)))
    assert "active: none: tensorflow-plugins/libmetal_plugin.dylib is missing" in missing
    none = "\n".join(report_lines(MAC_NO_GPU, {"tensorflow": "2.21.0", "keras": "3.15.1"}, ({}, None)))
    assert "metal backend: none installed" in none


def test_read_library_records_from_an_installed_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader on a real (fake) install: METADATA, RECORD and the library file in a site folder."""
    from bgem3_embeddings.backends.tensorflow.metal import read_library_records

    site = tmp_path / "site"
    info = site / "tensorflow_metal_plugin-0.4.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow-metal-plugin\nVersion: 0.4.1\n")
    library = site / "tensorflow-plugins" / "libmetal_plugin.dylib"
    library.parent.mkdir()
    library.write_bytes(b"built here")
    digest = record_sha256(b"built here")
    (info / "RECORD").write_text(
        f"tensorflow-plugins/libmetal_plugin.dylib,sha256={digest},10\n"
        "tensorflow_metal_plugin-0.4.1.dist-info/RECORD,,\n"
    )
    monkeypatch.syspath_prepend(str(site))
    recorded, on_disk = read_library_records()
    assert recorded == {"tensorflow-metal-plugin": digest} and on_disk == digest
    assert library_owner(recorded, on_disk) == "tensorflow-metal-plugin"
    library.write_bytes(b"replaced by another install")
    assert library_owner(*read_library_records()) is None
