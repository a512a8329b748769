"""User-facing errors: one line naming the file, the field and the fix; never a traceback."""


class UserError(Exception):
    """A mistake in the user's input. The CLI prints `str(err)` and exits with code 2."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        where = ": ".join(p for p in (source, field) if p)
        super().__init__(f"{where}: {message}" if where else message)
