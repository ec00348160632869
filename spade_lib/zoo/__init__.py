"""Embedded draft/target pairs built offline from the Python standard library (see corpus.py)."""
