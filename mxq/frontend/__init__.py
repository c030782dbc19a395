"""The front end: an epilogue function -> its IR -> the op spec -> the rendered CuTeDSL module."""
