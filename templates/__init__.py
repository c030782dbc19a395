"""Jinja templates of the generated CuTeDSL modules (installed as the ``mxq.templates`` package)."""
