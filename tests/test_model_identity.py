"""A model's identity does not depend on where it lies (issue 12, item 6): the same model
in two folders or on two machines lines up; another config under the same name does not."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

from pytest_llmenergy.compare import OTHER_MODEL, CompareOptions, compare_cases, parse_gates
from pytest_llmenergy.llm.grid import make_grid, split_model
from pytest_llmenergy.llm.loader import check_model, config_hash
from pytest_llmenergy.llm.tiny import ensure_tiny_model
from tests.casefactory import make_case


def copy_of_tiny_llama(cache: Path, dest: Path, **config: object) -> Path:
    shutil.copytree(ensure_tiny_model("tiny-llama", cache), dest)
    path = dest / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **config}))
    return dest


def test_names_do_not_depend_on_the_folder(tmp_path: Path) -> None:
    assert split_model("tiny-llama") == ("tiny-llama", "tiny-llama")
    assert split_model("meta-llama/Llama-2-7b-hf") == ("meta-llama/Llama-2-7b-hf",) * 2
    assert split_model("llama7b=/models/x") == ("llama7b", "/models/x")
    saved = tmp_path / "a" / "weights"
    saved.mkdir(parents=True)
    (saved / "config.json").write_text(json.dumps({"_name_or_path": "meta-llama/Llama-2-7b-hf"}))
    assert split_model(str(saved)) == ("meta-llama/Llama-2-7b-hf", str(saved))
    plain = tmp_path / "b" / "Mistral-7B"
    plain.mkdir(parents=True)
    (plain / "config.json").write_text(json.dumps({"_name_or_path": "/home/x/Mistral-7B"}))
    assert split_model(str(plain))[0] == "Mistral-7B"  # a path is no name: the folder's


def test_the_same_model_in_two_folders_makes_the_same_cases(tmp_path: Path) -> None:
    a, b = tmp_path / "m1" / "Llama-2-7b-hf", tmp_path / "m2" / "llama"
    for folder in (a, b):
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(
            json.dumps({"_name_or_path": "meta-llama/Llama-2-7b-hf"})
        )
    one = make_grid("quick", models=[str(a)]).cases("input")
    two = make_grid("quick", models=[str(b)]).cases("input")
    assert [c.id for c in one] == [c.id for c in two] == [
        "Llama-2-7b-hf-in8-out32", "Llama-2-7b-hf-in64-out32", "Llama-2-7b-hf-in512-out32"
    ]  # fmt: skip
    assert one[0].labels()["model"] == two[0].labels()["model"] == "meta-llama/Llama-2-7b-hf"
    assert one[0].labels()["model_source"] == str(a) and one[0].model == str(a)


def test_the_config_hash_sees_the_model_not_its_folder(tiny_cache: Path, tmp_path: Path) -> None:
    a = check_model(str(copy_of_tiny_llama(tiny_cache, tmp_path / "a")), device="cpu")
    b = check_model(str(copy_of_tiny_llama(tiny_cache, tmp_path / "b")), device="cpu")
    wider = check_model(
        str(copy_of_tiny_llama(tiny_cache, tmp_path / "c", intermediate_size=256)), device="cpu"
    )
    assert a.config_sha256 and a.config_sha256 == b.config_sha256
    assert wider.config_sha256 != a.config_sha256
    assert config_hash({"x": 1, "_name_or_path": "/a"}) == config_hash(
        {"x": 1, "_name_or_path": "/b"}
    )


def test_another_config_under_the_same_name_is_not_gated() -> None:
    base = make_case([1.0, 1.01, 0.99])
    worse = make_case([1.5, 1.51, 1.49])
    base = replace(base, labels={**base.labels, "model_config": "aaa"})
    other = replace(worse, labels={**worse.labels, "model_config": "bbb"})
    c = compare_cases([base], [other], CompareOptions(gates=parse_gates("j_per_token:5%")))
    assert not c.failed and c.deltas[0].verdict == OTHER_MODEL
    same = replace(worse, labels={**worse.labels, "model_config": "aaa"})
    assert compare_cases(
        [base], [same], CompareOptions(gates=parse_gates("j_per_token:5%"), session_noise=0.02)
    ).failed
