"""`thor ros [FLAGS] [--ros-args ...]` — the planner as a ROS 2 node (docs/ros.md).

The runtime's flags are `thor plan`'s (the RuntimeConfig table); every one of them is also a ROS
parameter (``model.name``, ``planner.max_tokens`` ...), and a parameter given after
``--ros-args`` (``-p NAME:=VALUE``, ``--params-file FILE``) wins over the flag. The node answers
diagnostics at once and serves goals once the model is loaded and self-tested. SIGINT or SIGTERM
cancels what runs (a running robot step too) and exits 0.

Exit 2, in one line, when ROS 2's Python client is not installed (the ``ros`` extra on x86_64,
``source /opt/ros/jazzy/setup.bash`` on a Jetson) or a setting is wrong.
"""

from __future__ import annotations

import argparse
import sys

from thor_app.flags import add_config_args, config_from_args


def register(sub) -> None:
    p = sub.add_parser(
        "ros", help="serve planning and plan runs as a ROS 2 node (needs the ros extra)"
    )
    add_config_args(p, ("planner", "model", "engine", "speculation"))
    p.add_argument(
        "--ros-args",
        dest="ros_args",
        nargs=argparse.REMAINDER,
        default=None,
        help="the rest goes to ROS: -p NAME:=VALUE, --params-file FILE, -r FROM:=TO ...",
    )
    p.set_defaults(func=run)


def run(args) -> int:
    from thor_app.ros import require_rclpy

    config = config_from_args(args)  # bad flags fail before ROS starts
    rclpy = require_rclpy()
    import signal
    import threading

    from rclpy.signals import SignalHandlerOptions

    from thor_app.ros.node import ThorNode, spin

    ros_args = ["--ros-args", *args.ros_args] if args.ros_args is not None else []
    context = rclpy.Context()
    rclpy.init(
        args=["thor", *ros_args], context=context, signal_handler_options=SignalHandlerOptions.NO
    )
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        node = ThorNode(context, config, cli_args=ros_args or None)
        node.start()
        print(
            f"thor ros: node {node.node.get_fully_qualified_name()} up; "
            f"loading {node.config.model.name}",
            file=sys.stderr,
            flush=True,
        )
        spin(node, stop)
    finally:
        if context.ok():
            rclpy.shutdown(context=context)
    return 0
