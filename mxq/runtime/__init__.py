"""The runtime: compile and cache kernels, validate a call, launch it, the native dispatchers, AOT export."""
