"""Built-in environments; each module registers its ids (``agentrl/<Name>-v<N>``) on import."""
