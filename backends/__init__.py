"""One adapter per framework, each with the same method names.

Shipped as ``unimem.backends``. No module here imports its framework at the top:
the framework is imported inside methods, so the registry and the matrix work on
a bare install.
"""
