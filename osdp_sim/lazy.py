"""A cached property without functools.cached_property's per-class lock (taken on every first
access up to Python 3.11): the search creates millions of step records and reads each derived
field once, where the lock cost as much as the field."""


class cached_field:
    """Computed on first read and stored in the instance's __dict__ (works on frozen dataclasses,
    as functools.cached_property does); later reads find the stored value and skip the
    descriptor."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value
