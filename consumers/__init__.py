"""The consumer side of docstream: the shared consumer runtime (consumers.runtime) and,
one folder each, the workers that run on it."""
