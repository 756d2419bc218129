"""Methods added to every vLLM worker process (vLLM's ``worker_extension_cls``).

The engine calls them with ``collective_rpc("name", args=...)``. They run inside the worker, next
to the model, so new weights arrive as one safetensors file (in shared memory) and are loaded in
place.
"""

from __future__ import annotations

from typing import Any


class WeightSync:
    """Loads a trainer's ``state_dict`` into the running vLLM model."""

    model_runner: Any  # set by vLLM on the worker this class is mixed into

    def agentrl_load_file(self, path: str) -> int:
        """Load a safetensors file of the whole state dict with vLLM's in-place reload; return the tensor count.

        Every tensor must be there, the tied ``lm_head.weight`` included: vLLM's reload
        re-materialises the head from what it is given, and leaving it out silently keeps a stale
        head (log-probs then off by a nat or more).
        """
        from safetensors.torch import load_file

        state = load_file(path, device="cpu")
        self.model_runner.reload_weights(weights_iterator=iter(state.items()))
        return len(state)
