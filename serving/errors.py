"""The serving layer's one error: a server that cannot be started, found or reached, with what to do about it."""


class ServeError(RuntimeError):
    pass
