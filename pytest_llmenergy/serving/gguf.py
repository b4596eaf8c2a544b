"""A Hugging Face model folder as the GGUF file llama.cpp's server loads, converted once.

The converter is llama.cpp's own ``convert_hf_to_gguf.py``: it ships in llama.cpp's
source tree (and in llama-cpp-python's sdist, under ``vendor/llama.cpp``), not in any
wheel, so it is found where the user says (``--llm-gguf-converter`` or
``$LLMENERGY_GGUF_CONVERTER``) or next to the engine's interpreter.  It runs with this
interpreter (it needs torch and transformers, which the engine's venv need not have).

Files are cached under ``<cache>/gguf/`` (beside the built-in models), keyed by the
folder and its files' sizes and times, written to a temporary file and renamed into
place: concurrent sessions never read a half-written file.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ..errors import ConfigError

CONVERTER_NAME = "convert_hf_to_gguf.py"
CONVERTER_ENV = "LLMENERGY_GGUF_CONVERTER"
OUTTYPE = "f32"  # the tiny models are float32; f32 keeps the served weights the same
CONVERT_TIMEOUT_S = 1800.0
CONVERTER_HINT = (
    "pip download --no-binary :all: --no-deps llama-cpp-python==0.3.36, unpack it, and "
    "pass --llm-gguf-converter=.../vendor/llama.cpp/convert_hf_to_gguf.py (or set "
    f"${CONVERTER_ENV}; a llama.cpp checkout's copy works too)"
)


def find_converter(given: str | None, engine_python: str) -> Path:
    """The converter the user gave, else one beside the engine's venv; one clear error
    saying how to get it when there is none."""
    given = given or os.environ.get(CONVERTER_ENV)
    if given:
        path = Path(given).expanduser()
        if path.is_dir():
            path = path / CONVERTER_NAME
        if not path.is_file():
            raise ConfigError(f"no llama.cpp GGUF converter at {given}: {CONVERTER_HINT}")
        return path.resolve()
    venv = Path(engine_python).expanduser().absolute().parent.parent
    for candidate in (venv / "bin" / CONVERTER_NAME, venv / CONVERTER_NAME):
        if candidate.is_file():
            return candidate.resolve()
    raise ConfigError(
        f"llama.cpp serves GGUF files and its converter ({CONVERTER_NAME}) is in no wheel: "
        + CONVERTER_HINT
    )


def gguf_path(model_dir: str, outtype: str = OUTTYPE, cache_dir: Path | None = None) -> Path:
    """Where the GGUF of ``model_dir`` is cached: a new name when its files change."""
    from ..llm.tiny import default_cache_dir

    folder = Path(model_dir).resolve()
    digest = hashlib.sha256(str(folder).encode())
    for f in sorted(folder.iterdir()):
        if f.is_file():
            st = f.stat()
            digest.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    return root / "gguf" / f"{folder.name}-{digest.hexdigest()[:10]}-{outtype}.gguf"


def ensure_gguf(
    model_dir: str,
    converter: Path,
    *,
    python: str | None = None,
    outtype: str = OUTTYPE,
    bpe_pre: str | None = None,
    cache_dir: Path | None = None,
) -> Path:
    """The cached GGUF of ``model_dir``, converted first if absent; a failed conversion
    raises ``ConfigError`` with the converter's last lines."""
    target = gguf_path(model_dir, outtype, cache_dir)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(
        prefix=f".{target.stem}.tmp-", suffix=".gguf", dir=target.parent
    )
    os.close(fd)
    tmp = Path(tmp_name)
    driver = Path(__file__).with_name("gguf_driver.py")
    argv = [python or sys.executable, str(driver), str(converter), model_dir, str(tmp), outtype]
    if bpe_pre:
        argv += ["--bpe-pre", bpe_pre]
    try:
        try:
            done = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=CONVERT_TIMEOUT_S,
                check=False,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ConfigError(f"the GGUF conversion of {model_dir} failed: {exc}") from None
        if done.returncode != 0 or tmp.stat().st_size == 0:
            tail = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()][-3:]
            raise ConfigError(
                f"{converter} could not convert {model_dir} to GGUF (exit {done.returncode}): "
                + " | ".join(tail)
            )
        os.replace(tmp, target)  # the same bytes if another session won the race
    finally:
        tmp.unlink(missing_ok=True)
    return target
