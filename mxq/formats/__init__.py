"""Formats and numerics: the block-scaled formats, their exact arithmetic, the torch reference, scale layouts."""
