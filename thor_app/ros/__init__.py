"""`thor ros`: the planner as a ROS 2 node, and plans run on the robot's own action servers.

ROS 2's Python client is imported here only, and only when the node starts: on x86_64 it comes
with the ``ros`` extra (``pip install 'thor-runtime[ros]'``, ROS 2 Kilted wheels), on a Jetson
from apt (ROS 2 Jazzy, ``source /opt/ros/jazzy/setup.bash``). Nothing else in the project needs
it, and ``thor --help`` never loads it.

- ``params``: the node's parameters, one per field of the RuntimeConfig table, and its own;
- ``inputs``: a goal's task, world and skills read and checked (no ROS);
- ``planning``: the runtime, its plan session, readiness and the self-test (no ROS);
- ``robot``: a plan run step by step on the robot's action servers, as the skills file maps
  them (no ROS: the node hands it one function that runs a step);
- ``node``: the node itself: actions, service, JSON topics, world topic, diagnostics.
"""

from __future__ import annotations

from thor_runtime.errors import ThorError

INSTALL_HINT = (
    "thor ros needs ROS 2's Python client (rclpy): on x86_64 pip install "
    "'thor-runtime[ros]'; on a Jetson source /opt/ros/jazzy/setup.bash first"
)


def require_rclpy():
    """rclpy, or a ThorError (exit 2) that says in one line how to install it."""
    try:
        import rclpy
    except ImportError:
        raise ThorError(INSTALL_HINT) from None
    return rclpy
