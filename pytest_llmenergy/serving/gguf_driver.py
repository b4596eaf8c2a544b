"""Runs llama.cpp's ``convert_hf_to_gguf.py`` on one model (a script, run by path by
``serving.gguf`` with an interpreter that has torch and transformers; stdlib only).

Two adaptations, both for tokenizers the converter does not know, neither changing a
model it does know:

* a model without ``tokenizer.model`` is not a SentencePiece model, whether or not the
  ``sentencepiece`` package is installed (the converter imports it before looking);
* ``--bpe-pre NAME`` names the BPE pre-tokenizer when the converter's table of known
  tokenizers (hashes of released models' tokenizers) has no entry for this one: the
  built-in tiny models' byte-level BPE splits text with GPT-2's rules ("gpt-2").

Usage: ``python gguf_driver.py CONVERTER MODEL_DIR OUTFILE OUTTYPE [--bpe-pre NAME]``
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any


def _patch(classes: list[Any], bpe_pre: str | None) -> None:
    for cls in classes:
        original_pre = cls.__dict__.get("get_vocab_base_pre")
        if original_pre is not None and bpe_pre:

            def get_vocab_base_pre(self: Any, tokenizer: Any, _orig: Any = original_pre) -> str:
                try:
                    return _orig(self, tokenizer)
                except NotImplementedError:
                    return bpe_pre

            cls.get_vocab_base_pre = get_vocab_base_pre
        original_sp = cls.__dict__.get("_set_vocab_sentencepiece")
        if original_sp is not None:

            def _set_vocab_sentencepiece(self: Any, *args: Any, _orig: Any = original_sp) -> Any:
                if not (Path(self.dir_model) / "tokenizer.model").is_file():
                    raise FileNotFoundError(f"no tokenizer.model in {self.dir_model}")
                return _orig(self, *args)

            cls._set_vocab_sentencepiece = _set_vocab_sentencepiece


def main(argv: list[str]) -> int:
    converter, model_dir, outfile = (Path(a) for a in argv[:3])
    outtype = argv[3]
    bpe_pre = argv[argv.index("--bpe-pre") + 1] if "--bpe-pre" in argv else None
    sys.path.insert(0, str(converter.parent))  # its `conversion` package, if any
    spec = importlib.util.spec_from_file_location("convert_hf_to_gguf", converter)
    if spec is None or spec.loader is None:
        print(f"cannot load {converter}", file=sys.stderr)
        return 2
    module = importlib.util.module_from_spec(spec)
    sys.modules["convert_hf_to_gguf"] = module
    spec.loader.exec_module(module)
    classes = [getattr(module, n) for n in ("TextModel", "Model") if hasattr(module, n)]
    base = sys.modules.get("conversion.base")
    if base is not None:
        classes += [getattr(base, n) for n in ("TextModel", "ModelBase") if hasattr(base, n)]
    _patch(classes, bpe_pre)
    sys.argv = [str(converter), str(model_dir), "--outfile", str(outfile), "--outtype", outtype]
    module.main()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
