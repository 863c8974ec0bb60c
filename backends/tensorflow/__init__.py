"""The tensorflow backend: its adapter and the helpers only it needs."""
