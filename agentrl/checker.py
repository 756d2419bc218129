"""Placeholder replaced below."""
class EnvCheckError(AssertionError):
    pass
def check_env(env, **kw):
    raise NotImplementedError
