"""The cupy backend: its adapter and the helpers only it needs."""
