"""Launching SGLang with the capture hooks: the launch plan and the server process."""

from hs_dataset.capture.serve.errors import ServeError
from hs_dataset.capture.serve.plan import ServerPlan, plan_server
from hs_dataset.capture.serve.process import ServerProcess, launch

__all__ = ["ServeError", "ServerPlan", "ServerProcess", "launch", "plan_server"]
