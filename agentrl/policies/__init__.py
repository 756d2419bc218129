"""Inference backends behind the :class:`~agentrl.policy.Policy` protocol: ``hf`` (here), ``vllm`` and
``openai``. Each backend module imports its engine only when used."""
