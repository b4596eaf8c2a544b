"""Machine, GPU, package and commit info saved with runs, and the per-hardware folder key."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_llmenergy.storage import machine as machine_mod
from pytest_llmenergy.storage.machine import (
    PACKAGES,
    commit_info,
    gpu_info,
    hardware_key,
    machine_info,
    package_versions,
)
from tests.fakes.fake_pynvml import (
    NVML_DEVICE_ARCH_AMPERE,
    NVML_ERROR_DRIVER_NOT_LOADED,
    FakeGPU,
    fake_uuid,
    install_fake_pynvml,
    install_fake_pynvml_without_library,
)
from tests.fakes.trace import PowerTrace

KEY_CHARS = re.compile(r"[a-z0-9._+-]+")
GPU_KEYS = {
    "index",
    "name",
    "uuid",
    "memory_bytes",
    "power_limit_w",
    "default_power_limit_w",
    "sm_clock_mhz",
    "driver",
}


def make_gpu(n: int, name: str = "NVIDIA A100-SXM4-40GB", **kw: Any) -> FakeGPU:
    return FakeGPU(name, fake_uuid(n), NVML_DEVICE_ARCH_AMPERE, PowerTrace([(60.0, 50.0)]), **kw)


def machine(cpu: str | None, *gpu_names: str | None) -> dict[str, Any]:
    return {"cpu": {"model": cpu}, "gpus": [{"name": name} for name in gpu_names]}


# -- machine_info ----------------------------------------------------------------------


def test_machine_info_on_this_machine() -> None:
    info = machine_info()
    assert set(info) == {
        "node",
        "cpu",
        "memory_bytes",
        "gpus",
        "os",
        "python",
        "packages",
        "notes",
    }
    assert set(info["cpu"]) == {"model", "arch", "logical_cores", "physical_cores", "cache_bytes"}
    caches = info["cpu"]["cache_bytes"]  # {} where sysfs does not tell
    assert all(re.fullmatch(r"l\d", k) and v > 0 for k, v in caches.items())
    assert isinstance(info["cpu"]["model"], str) and info["cpu"]["model"]
    assert isinstance(info["cpu"]["arch"], str)
    assert isinstance(info["cpu"]["logical_cores"], int) and info["cpu"]["logical_cores"] >= 1
    physical = info["cpu"]["physical_cores"]
    assert physical is None or (isinstance(physical, int) and physical >= 1)
    assert isinstance(info["memory_bytes"], int) and info["memory_bytes"] > 0
    assert set(info["os"]) == {"system", "release", "platform"}
    assert info["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    assert isinstance(info["python"]["implementation"], str)
    assert set(info["packages"]) == set(PACKAGES)
    assert isinstance(info["notes"], list)
    assert all(isinstance(note, str) for note in info["notes"])
    assert json.loads(json.dumps(info)) == info


def test_machine_info_without_nvml_has_no_gpus_and_says_why() -> None:
    gpus, _ = gpu_info()
    if gpus:
        pytest.skip("this machine has NVIDIA GPUs")
    info = machine_info()
    assert info["gpus"] == []
    assert any(note.startswith("no NVIDIA GPU info: ") for note in info["notes"])


def test_machine_info_with_fake_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_pynvml(monkeypatch, [make_gpu(0), make_gpu(1)])
    info = machine_info()
    assert [gpu["uuid"] for gpu in info["gpus"]] == [fake_uuid(0), fake_uuid(1)]
    assert not any("GPU" in note for note in info["notes"])
    json.dumps(info)


def test_machine_info_never_raises(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("probe\nexploded")

    monkeypatch.setattr(machine_mod.psutil, "virtual_memory", boom)
    monkeypatch.setattr(machine_mod.psutil, "cpu_count", boom)
    monkeypatch.setattr(machine_mod, "cpu_brand", boom)
    monkeypatch.setattr(machine_mod, "gpu_info", boom)
    info = machine_info()
    assert info["memory_bytes"] is None
    assert info["cpu"]["model"] is None
    assert info["cpu"]["logical_cores"] is None
    assert info["cpu"]["physical_cores"] is None
    assert info["gpus"] == []
    assert "memory: probe exploded" in info["notes"]
    assert "GPUs: probe exploded" in info["notes"]
    assert hardware_key(info, "estimate") == "unknown-cpu__no-gpu__estimate"
    json.dumps(info)


# -- gpu_info --------------------------------------------------------------------------


def test_gpu_info_reads_every_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus_in = [
        make_gpu(0, power_limit_mw=250_000, default_power_limit_mw=400_000),
        make_gpu(
            1,
            "NVIDIA H100 80GB HBM3",
            memory_bytes=80 * 1024**3,
            power_limit_mw=700_000,
            default_power_limit_mw=700_000,
            max_sm_clock_mhz=1980,
        ),
    ]
    module = install_fake_pynvml(monkeypatch, gpus_in)
    shutdowns: list[int] = []
    real_shutdown = module.nvmlShutdown

    def spy_shutdown() -> None:
        shutdowns.append(module.fake.init_count)
        real_shutdown()

    monkeypatch.setattr(module, "nvmlShutdown", spy_shutdown)

    gpus, note = gpu_info()

    assert note is None
    assert [set(gpu) for gpu in gpus] == [GPU_KEYS, GPU_KEYS]
    assert [gpu["index"] for gpu in gpus] == [0, 1]
    assert [gpu["name"] for gpu in gpus] == ["NVIDIA A100-SXM4-40GB", "NVIDIA H100 80GB HBM3"]
    assert [gpu["uuid"] for gpu in gpus] == [fake_uuid(0), fake_uuid(1)]
    assert [gpu["memory_bytes"] for gpu in gpus] == [40 * 1024**3, 80 * 1024**3]
    assert [gpu["power_limit_w"] for gpu in gpus] == [250.0, 700.0]
    assert [gpu["default_power_limit_w"] for gpu in gpus] == [400.0, 700.0]
    assert [gpu["sm_clock_mhz"] for gpu in gpus] == [1410, 1980]
    assert all(isinstance(gpu["power_limit_w"], float) for gpu in gpus)
    assert [gpu["driver"] for gpu in gpus] == ["550.54.15", "550.54.15"]
    assert shutdowns == [1]  # once, while NVML was open
    assert module.fake.init_count == 0
    json.dumps(gpus)


def test_gpu_info_unsupported_fields_are_none(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = make_gpu(0, power_limit_mw=None, default_power_limit_mw=None, max_sm_clock_mhz=None)
    module = install_fake_pynvml(monkeypatch, [gpu])
    gpus, note = gpu_info()
    assert note is None
    (info,) = gpus
    assert info["power_limit_w"] is None
    assert info["default_power_limit_w"] is None
    assert info["sm_clock_mhz"] is None
    assert info["name"] == gpu.name
    assert info["uuid"] == gpu.uuid
    assert info["memory_bytes"] == gpu.memory_bytes
    assert info["driver"] == "550.54.15"
    assert module.fake.init_count == 0


def test_gpu_info_a_field_raising_not_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install_fake_pynvml(monkeypatch, [make_gpu(0)])

    def unsupported(*args: Any) -> Any:
        raise module.NVMLError_NotSupported()

    monkeypatch.setattr(module, "nvmlDeviceGetMemoryInfo", unsupported)
    monkeypatch.setattr(module, "nvmlSystemGetDriverVersion", unsupported)
    (info,), note = gpu_info()
    assert note is None
    assert info["memory_bytes"] is None
    assert info["driver"] is None
    assert info["name"] == "NVIDIA A100-SXM4-40GB"
    assert info["power_limit_w"] == 400.0


def test_gpu_info_decodes_bytes_from_old_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install_fake_pynvml(monkeypatch, [make_gpu(0)])
    module.fake.driver_version = b"470.82.01"
    monkeypatch.setattr(module, "nvmlDeviceGetName", lambda handle: b"Tesla V100-SXM2-16GB")
    monkeypatch.setattr(module, "nvmlDeviceGetUUID", lambda handle: fake_uuid(0).encode())
    (info,), _ = gpu_info()
    assert info["name"] == "Tesla V100-SXM2-16GB"
    assert info["uuid"] == fake_uuid(0)
    assert info["driver"] == "470.82.01"


def test_gpu_info_a_lost_gpu_keeps_its_place(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install_fake_pynvml(monkeypatch, [make_gpu(0), make_gpu(1, lost=True)])
    gpus, note = gpu_info()
    assert [gpu["index"] for gpu in gpus] == [0, 1]
    assert gpus[0]["name"] == "NVIDIA A100-SXM4-40GB"
    assert gpus[1]["name"] is None and gpus[1]["power_limit_w"] is None
    assert note is None
    assert module.fake.init_count == 0


def test_gpu_info_a_gpu_without_a_handle(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install_fake_pynvml(monkeypatch, [make_gpu(0), make_gpu(1)])
    real = module.nvmlDeviceGetHandleByIndex

    def handle(index: int) -> Any:
        if index == 1:
            raise module.NVMLError_GpuIsLost()
        return real(index)

    monkeypatch.setattr(module, "nvmlDeviceGetHandleByIndex", handle)
    gpus, note = gpu_info()
    assert gpus[0]["uuid"] == fake_uuid(0)
    assert gpus[1] == dict.fromkeys(GPU_KEYS, None) | {"index": 1, "driver": "550.54.15"}
    assert note == "GPU 1: GPU is lost"
    assert module.fake.init_count == 0


def test_gpu_info_init_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install_fake_pynvml_without_library(monkeypatch)
    gpus, note = gpu_info()
    assert gpus == []
    assert note == (
        "no NVIDIA GPU info: NVML Shared Library Not Found: no NVIDIA driver on this machine"
    )
    assert module.calls["nvmlShutdown"] == 0  # nothing was opened

    install_fake_pynvml(monkeypatch, [], init_error=NVML_ERROR_DRIVER_NOT_LOADED)
    assert gpu_info() == (
        [],
        "no NVIDIA GPU info: Driver Not Loaded: the NVIDIA kernel driver is not loaded "
        "(try nvidia-smi)",
    )


def test_gpu_info_without_nvidia_ml_py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` fail
    gpus, note = gpu_info()
    assert gpus == []
    assert note is not None and note.startswith("no NVIDIA GPU info: nvidia-ml-py is not")
    assert "\n" not in note


def test_gpu_info_with_no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install_fake_pynvml(monkeypatch, [])
    gpus, note = gpu_info()
    assert gpus == []
    assert note is not None and "NVML sees no GPU" in note
    assert module.fake.init_count == 0


def test_gpu_info_only_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    module = install_fake_pynvml(monkeypatch, [make_gpu(0)])
    gpu_info()
    assert not any("Set" in name for name in module.calls)
    assert module.calls["nvmlInit"] == module.calls["nvmlShutdown"] == 1


# -- package_versions ------------------------------------------------------------------


def test_package_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    real_version = importlib.metadata.version

    def spy(name: str) -> str:
        asked.append(name)
        return real_version(name)

    monkeypatch.setattr(importlib.metadata, "version", spy)
    versions = package_versions()
    assert list(versions) == list(PACKAGES)
    assert versions["pytest"] == real_version("pytest")
    assert versions["pytest-llmenergy"] == real_version("pytest-llmenergy")
    assert asked == list(PACKAGES)


def test_package_versions_missing_package_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_mod, "PACKAGES", ("pytest", "no-such-package-llmenergy-xyz"))
    assert package_versions() == {
        "pytest": importlib.metadata.version("pytest"),
        "no-such-package-llmenergy-xyz": None,
    }


def test_package_versions_does_not_import_packages() -> None:
    code = (
        "import sys\n"
        "from pytest_llmenergy.storage.machine import package_versions\n"
        "package_versions()\n"
        "print(sorted(m for m in ('torch', 'transformers', 'accelerate', 'pynvml', 'pyJoules')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


# -- commit_info -----------------------------------------------------------------------

needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "Test",
        "GIT_AUTHOR_EMAIL": "test@example.com",
        "GIT_COMMITTER_NAME": "Test",
        "GIT_COMMITTER_EMAIL": "test@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull,
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    out = subprocess.run(
        ["git", *args], cwd=repo, capture_output=True, text=True, timeout=30, check=True, env=env
    )
    return out.stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "my-project"
    path.mkdir()
    git(path, "init", "--quiet")
    git(path, "symbolic-ref", "HEAD", "refs/heads/trunk")  # whatever init.defaultBranch says
    (path / "a.txt").write_text("one\n")
    git(path, "add", "a.txt")
    git(path, "commit", "--quiet", "-m", "first")
    return path


@needs_git
def test_commit_info_clean_repo(repo: Path) -> None:
    info = commit_info(repo)
    sha = git(repo, "rev-parse", "HEAD")
    assert info["id"] == sha and len(sha) == 40
    assert info["short_id"] == sha[:12]
    assert info["branch"] == "trunk"
    assert info["dirty"] is False
    assert info["project"] == "my-project"
    assert info["time"] == git(repo, "log", "-1", "--format=%cI")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d([+-]\d\d:\d\d|Z)", info["time"])
    assert set(info) == {"id", "short_id", "branch", "time", "dirty", "project"}


@needs_git
def test_commit_info_from_a_subdirectory_and_str_path(repo: Path) -> None:
    sub = repo / "sub"
    sub.mkdir()
    info = commit_info(str(sub))
    assert info["project"] == "my-project"
    assert info["id"] == git(repo, "rev-parse", "HEAD")


@needs_git
def test_commit_info_dirty(repo: Path) -> None:
    (repo / "a.txt").write_text("two\n")
    assert commit_info(repo)["dirty"] is True
    git(repo, "checkout", "--quiet", "--", "a.txt")
    assert commit_info(repo)["dirty"] is False
    (repo / "new.txt").write_text("untracked\n")
    assert commit_info(repo)["dirty"] is True


@needs_git
def test_the_run_storage_is_no_change_to_the_code(repo: Path) -> None:
    # the first saved run must not mark every later session as uncommitted code
    (repo / ".llmenergy" / "hw").mkdir(parents=True)
    (repo / ".llmenergy" / "hw" / "0001_base.json").write_text("{}")
    assert commit_info(repo)["dirty"] is True
    assert commit_info(repo, own=[repo / ".llmenergy"])["dirty"] is False
    sub = repo / "sub"
    sub.mkdir()
    assert commit_info(sub, own=[repo / ".llmenergy"])["dirty"] is False  # from anywhere in it
    assert commit_info(repo, own=[repo.parent / "elsewhere"])["dirty"] is True
    (repo / "a.txt").write_text("changed\n")  # a change of the code still counts
    assert commit_info(repo, own=[repo / ".llmenergy"])["dirty"] is True


@needs_git
def test_commit_info_detached_head(repo: Path) -> None:
    git(repo, "checkout", "--quiet", "--detach")
    info = commit_info(repo)
    assert info["branch"] is None
    assert info["id"] == git(repo, "rev-parse", "HEAD")


@needs_git
def test_commit_info_without_commits(tmp_path: Path) -> None:
    git(tmp_path, "init", "--quiet")
    assert commit_info(tmp_path) == {}


@needs_git
def test_commit_info_outside_a_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert commit_info(tmp_path) == {}
    assert commit_info(tmp_path / "does-not-exist") == {}


@needs_git
def test_commit_info_without_git(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert commit_info(repo) == {}


def test_commit_info_when_git_hangs(repo: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def hang(*args: Any, **kwargs: Any) -> Any:
        assert kwargs["timeout"] > 0 and isinstance(args[0], list)
        raise subprocess.TimeoutExpired(args[0], kwargs["timeout"])

    monkeypatch.setattr(machine_mod.subprocess, "run", hang)
    assert commit_info(repo) == {}


# -- hardware_key ----------------------------------------------------------------------


def test_hardware_key_examples() -> None:
    assert (
        hardware_key(machine("Intel(R) Xeon(R) Processor"), "estimate")
        == "intel-xeon-processor__no-gpu__estimate"
    )
    assert (
        hardware_key(
            machine("AMD EPYC 7742 64-Core Processor", *["NVIDIA A100-SXM4-40GB"] * 4), "nvml"
        )
        == "amd-epyc-7742-64-core-processor__4x-nvidia-a100-sxm4-40gb__nvml"
    )
    assert (
        hardware_key(machine("Intel(R) Xeon(R) Gold 6230 CPU @ 2.10GHz"), "rapl")
        == "intel-xeon-gold-6230__no-gpu__rapl"
    )
    assert (
        hardware_key(machine("Intel(TM) Core(TM) i7-8650U CPU @ 1.90GHz"), "estimate")
        == "intel-core-i7-8650u__no-gpu__estimate"
    )
    assert hardware_key(machine("Apple M2 Max"), "powermetrics") == (
        "apple-m2-max__no-gpu__powermetrics"
    )


def test_hardware_key_mixed_gpus_sorted() -> None:
    key = hardware_key(
        machine(
            "AMD EPYC 7742", "Tesla V100-SXM2-16GB", "NVIDIA A100-PCIE-40GB", "Tesla V100-SXM2-16GB"
        ),
        "nvml",
    )
    assert key == "amd-epyc-7742__1x-nvidia-a100-pcie-40gb+2x-tesla-v100-sxm2-16gb__nvml"
    reordered = hardware_key(
        machine(
            "AMD EPYC 7742", "NVIDIA A100-PCIE-40GB", "Tesla V100-SXM2-16GB", "Tesla V100-SXM2-16GB"
        ),
        "nvml",
    )
    assert reordered == key


def test_hardware_key_missing_parts() -> None:
    assert hardware_key({}, "estimate") == "unknown-cpu__no-gpu__estimate"
    assert hardware_key({"cpu": None, "gpus": None}, "estimate") == "unknown-cpu__no-gpu__estimate"
    assert hardware_key(machine("(R) CPU"), "") == "unknown-cpu__no-gpu__unknown-backend"
    assert hardware_key(machine("Xeon", None, None), "nvml") == "xeon__2x-unknown-gpu__nvml"
    assert hardware_key(machine("Xeon"), "cpu") == "xeon__no-gpu__cpu"  # backends keep "cpu"


def test_hardware_key_is_deterministic() -> None:
    info = machine_info()
    assert hardware_key(info, "estimate") == hardware_key(info, "estimate")
    assert hardware_key(json.loads(json.dumps(info)), "estimate") == hardware_key(info, "estimate")
    code = (
        "from pytest_llmenergy.storage.machine import hardware_key\n"
        "print(hardware_key({'cpu': {'model': 'X' * 200}, 'gpus': [{'name': 'G' * 200}]}, 'b'))\n"
    )
    keys = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout.strip()
        for seed in ("1", "2")
    }
    assert keys == {hardware_key({"cpu": {"model": "X" * 200}, "gpus": [{"name": "G" * 200}]}, "b")}


def test_hardware_key_differs() -> None:
    base = hardware_key(machine("AMD EPYC 7742", "NVIDIA A100", "NVIDIA A100"), "nvml")
    variants = [
        hardware_key(machine("AMD EPYC 7742", "NVIDIA A100"), "nvml"),  # GPU count
        hardware_key(machine("AMD EPYC 7742", "NVIDIA H100", "NVIDIA H100"), "nvml"),  # model
        hardware_key(machine("AMD EPYC 7763", "NVIDIA A100", "NVIDIA A100"), "nvml"),  # CPU
        hardware_key(machine("AMD EPYC 7742", "NVIDIA A100", "NVIDIA A100"), "estimate"),
        hardware_key(machine("AMD EPYC 7742", "NVIDIA A100", "NVIDIA H100"), "nvml"),
        hardware_key(machine("AMD EPYC 7742"), "nvml"),
    ]
    assert len({base, *variants}) == len(variants) + 1


def test_hardware_key_characters_and_caps() -> None:
    weird = machine(
        'Ünïcode/..\\CPU  "model" <*> : | ? 9000 @ 3.5GHz ' + "very long name " * 20,
        "GPU/../name " * 30,
        "other:GPU*",
    )
    key = hardware_key(weird, "Some Backend/../x" * 10)
    assert KEY_CHARS.fullmatch(key)
    parts = key.split("__")
    assert len(parts) == 3
    assert all(0 < len(part) <= 60 for part in parts)
    assert not any(part.startswith((".", "-")) or part.endswith((".", "-")) for part in parts)


def test_hardware_key_long_names_stay_distinct() -> None:
    prefix = "Intel(R) Xeon(R) Platinum " + "extremely long model name " * 5
    a = hardware_key(machine(prefix + "A"), "estimate")
    b = hardware_key(machine(prefix + "B"), "estimate")
    assert a != b
    assert len(a.split("__")[0]) == len(b.split("__")[0]) == 60
    assert a.split("__")[0].startswith("intel-xeon-platinum-extremely-long-model-name")
