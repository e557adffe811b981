"""Launching SGLang with the capture hooks: the launch plan and the server process."""
