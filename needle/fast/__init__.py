"""needle's opt-in speed wing: ``import needle.fast``.

Nothing in the course's files (``autograd``, ``ops``, ``nn``, ``optim``, ``init``, ``data``)
imports this package.
"""
