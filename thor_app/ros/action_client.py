"""An rclpy action client that may be made while an executor spins in another thread.

rclpy (9.1) adds a new ActionClient to its node's waitables before it sets the lock that an
executor's ``get_num_entities`` takes, so a client made while another thread spins can fail
that thread with an AttributeError. The node makes a client for each robot action on first
use, mid-spin: this one has its lock before it is added.
"""

from __future__ import annotations

import threading

from rclpy.action import ActionClient as _RclpyActionClient


class ActionClient(_RclpyActionClient):
    def __init__(self, *args, **kwargs):
        self._lock = threading.Lock()  # read by a spinning executor as soon as it is added
        super().__init__(*args, **kwargs)
