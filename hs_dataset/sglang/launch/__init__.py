"""Launching SGLang with the capture hooks: the launch plan and the server process."""

from hs_dataset.sglang.launch.errors import ServeError
from hs_dataset.sglang.launch.plan import ServerPlan, plan_server
from hs_dataset.sglang.launch.process import ServerProcess, launch

__all__ = ["ServeError", "ServerPlan", "ServerProcess", "plan_server", "launch"]
