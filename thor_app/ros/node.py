"""The `thor ros` node: planning as a ROS 2 action, one-shot plans as a service, plans run on the
robot's own action servers, diagnostics, and a JSON-in-strings interface that needs no build.

Names (relative to the node, ``thor`` unless remapped; docs/ros.md):

- ``~/plan`` (thor_interfaces/action/Plan): a task planned, and with ``execute`` run; feedback
  says the phase and the tokens so far, and while running each step's progress;
- ``~/run_plan`` (thor_interfaces/action/RunPlan): a given plan gated against the world and run;
- ``~/plan_once`` (thor_interfaces/srv/Plan): one plan, no feedback;
- ``~/json/goal``, ``~/json/cancel`` in, ``~/json/feedback``, ``~/json/result`` out
  (std_msgs/String carrying JSON): the same goals without the interface package;
- the world topic (parameter ``world_topic``, std_msgs/String): the latest world a goal that
  gives none plans in;
- ``/diagnostics`` (diagnostic_msgs/DiagnosticArray): readiness, the self-test, the work.

The typed interfaces are served when the ``thor_interfaces`` package (deploy/ros/) is built and
sourced; the JSON topics are served either way (parameter ``json_topics``).

Threads: a multi-threaded executor runs every callback; a goal's planning and its steps run in
the executor thread that took it (a plan at a time: thor_app/ros/planning.py), while the other
threads keep serving diagnostics, cancels and the robot's answers.
"""

from __future__ import annotations

import json
import pkgutil
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

import rclpy
from action_msgs.msg import GoalStatus
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.executors import MultiThreadedExecutor
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from std_msgs.msg import String

from thor_app.ros.action_client import ActionClient
from thor_app.ros.inputs import check_task, read_inputs, read_plan
from thor_app.ros.params import declare
from thor_app.ros.planning import Cancelled, Planning, Progress
from thor_app.ros.robot import (
    CANCELED,
    FAILED,
    SUCCEEDED,
    TIMED_OUT,
    RunRecord,
    StepOutcome,
    action_map,
    check_runnable,
    fill_message,
    message_dict,
    run_steps,
)
from thor_runtime.errors import ThorError

NODE_NAME = "thor"
HEARTBEAT_S = 0.25  # feedback repeated at least this often while a goal is active
CANCEL_WAIT_S = 2.0  # how long a step's cancel waits for the robot's answer
POLL_S = 0.005


def typed_interfaces():
    """(Plan action, RunPlan action, Plan service) from the built thor_interfaces package, or
    None."""
    try:
        from thor_interfaces.action import Plan, RunPlan
        from thor_interfaces.srv import Plan as PlanService
    except ImportError:
        return None
    return Plan, RunPlan, PlanService


@dataclass(eq=False)
class Job:
    """One goal, whichever interface brought it: its cancel flag and where its feedback goes."""

    cancelled: Callable[[], bool]
    send: Callable[[dict], None]  # feedback as a dict of the Feedback fields
    cancel: threading.Event | None = None  # the JSON interface's cancel flag
    last: dict = field(default_factory=dict)
    sent_at: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def feedback(self, **fields) -> None:
        with self._lock:
            self.last = {
                "phase": "",
                "tokens": 0,
                "step_id": "",
                "skill": "",
                "status": "",
                "detail": "",
                **fields,
            }
            self.sent_at = time.monotonic()
            self.send(dict(self.last))

    def heartbeat(self) -> None:
        with self._lock:
            if self.last and time.monotonic() - self.sent_at >= HEARTBEAT_S:
                self.sent_at = time.monotonic()
                self.send(dict(self.last))


class ThorNode:
    """The node, its interfaces and its planner. ``build``/``selftest``: see Planning."""

    def __init__(
        self, context, base_config, cli_args=None, build=None, selftest=None, name: str = NODE_NAME
    ):
        self.node = Node(name, context=context, cli_args=cli_args)
        self.log = self.node.get_logger()
        try:
            self.config, self.settings = declare(self.node, base_config)
        except ThorError:
            self.node.destroy_node()
            raise
        self.planning = Planning(
            self.config,
            build,
            selftest,
            self.settings.self_test,
            self.settings.queue_size,
            self.settings.skills,
            log=self.log.info,
        )
        self.group = ReentrantCallbackGroup()
        self.latest_world: str | None = None
        self.jobs: set[Job] = set()
        self.json_jobs: dict[str, Job] = {}
        self.stopping = False
        self._clients: dict[tuple[str, str], ActionClient] = {}
        self._lock = threading.Lock()
        n, g = self.node, self.group
        self.typed = typed_interfaces()
        if self.typed is not None:
            plan, run, once = self.typed
            self.plan_server = ActionServer(
                n,
                plan,
                "~/plan",
                self._execute_plan,
                callback_group=g,
                goal_callback=lambda goal: GoalResponse.ACCEPT,
                cancel_callback=lambda handle: CancelResponse.ACCEPT,
            )
            self.run_server = ActionServer(
                n,
                run,
                "~/run_plan",
                self._execute_run,
                callback_group=g,
                goal_callback=lambda goal: GoalResponse.ACCEPT,
                cancel_callback=lambda handle: CancelResponse.ACCEPT,
            )
            self.service = n.create_service(once, "~/plan_once", self._plan_once, callback_group=g)
        else:
            self.log.warning(
                "thor_interfaces is not built and sourced: ~/plan, ~/run_plan and ~/plan_once are "
                "not served; the JSON topics ~/json/* are (docs/ros.md)"
            )
        if self.settings.json_topics:
            results = QoSProfile(
                depth=16,
                reliability=ReliabilityPolicy.RELIABLE,
                durability=DurabilityPolicy.TRANSIENT_LOCAL,
            )
            self.json_feedback = n.create_publisher(String, "~/json/feedback", 50)
            self.json_result = n.create_publisher(String, "~/json/result", results)
            n.create_subscription(String, "~/json/goal", self._json_goal, 16, callback_group=g)
            n.create_subscription(String, "~/json/cancel", self._json_cancel, 16, callback_group=g)
        if self.settings.world_topic:
            durability = (
                DurabilityPolicy.TRANSIENT_LOCAL
                if self.settings.world_durability == "transient_local"
                else DurabilityPolicy.VOLATILE
            )
            qos = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=durability)
            n.create_subscription(
                String, self.settings.world_topic, self._world, qos, callback_group=g
            )
        self.diagnostics = n.create_publisher(DiagnosticArray, "/diagnostics", 10)
        n.create_timer(
            self.settings.diagnostics_period_s, self.publish_diagnostics, callback_group=g
        )
        n.create_timer(HEARTBEAT_S / 2, self._heartbeat, callback_group=g)
        self.publish_diagnostics()

    # ---- start-up and shutdown ----------------------------------------------------------------
    def start(self) -> threading.Thread:
        """Load the model and self-test in a thread; diagnostics say how it goes meanwhile."""

        def go():
            self.planning.start()
            self.publish_diagnostics()

        t = threading.Thread(target=go, name="thor-ros-start", daemon=True)
        t.start()
        return t

    def stop(self) -> None:
        """Cancel what runs (a running step's robot goal is cancelled too) and keep what the
        session learned for the next process."""
        self.stopping = True
        deadline = time.monotonic() + 5.0
        while self.jobs and time.monotonic() < deadline:
            time.sleep(0.02)
        self.planning.save()

    def destroy(self) -> None:
        for c in self._clients.values():
            c.destroy()
        self.node.destroy_node()

    # ---- inputs -------------------------------------------------------------------------------
    def _world(self, msg) -> None:
        self.latest_world = msg.data

    def _inputs(self, world_json="", world_file="", skills_json="", skills_file=""):
        return read_inputs(
            world_json,
            world_file,
            skills_json,
            skills_file,
            self.latest_world,
            self.settings.skills,
        )

    # ---- the work, whichever interface asked ----------------------------------------------------
    def _track(self, job: Job):
        with self._lock:
            self.jobs.add(job)

    def _untrack(self, job: Job):
        with self._lock:
            self.jobs.discard(job)

    def plan_goal(
        self,
        job: Job,
        task,
        world_json="",
        world_file="",
        skills_json="",
        skills_file="",
        execute=False,
    ) -> dict:
        """Plan (and with ``execute`` run) one goal -> its outcome: {"status": succeeded, aborted or
        canceled, "valid", "plan", "report", "document", "run", "error"}."""
        out = {
            "status": "aborted",
            "valid": False,
            "plan": None,
            "report": [],
            "document": None,
            "run": None,
            "error": "",
        }
        self._track(job)
        try:
            check_task(task)
            inputs = self._inputs(world_json, world_file, skills_json, skills_file)
            actions = action_map(inputs.skills_doc, "skills") if execute else {}

            def progress(p: Progress):
                job.feedback(phase=p.phase, tokens=p.tokens, detail=p.detail)

            res = self.planning.plan(task, inputs, job.cancelled, progress)
            doc = res.document()
            out.update(valid=res.valid, plan=res.plan, report=res.report, document=doc)
            if not res.valid:
                first = res.report[0]["message"] if res.report else "no plan"
                out["error"] = f"no valid plan after {res.attempts} attempt(s): {first}"
                return out
            if not execute:
                out["status"] = "succeeded"
                return out
            run = self.run_plan(job, res.plan, actions, res.stats.get("generated_tokens", 0))
            doc["run"] = out["run"] = run.document()
            out["status"] = (
                "succeeded" if run.success else "canceled" if run.canceled else "aborted"
            )
            out["error"] = run.error
            return out
        except Cancelled:
            out.update(status="canceled", error="canceled while planning")
            return out
        except ThorError as e:
            out["error"] = str(e)
            return out
        finally:
            self._untrack(job)

    def run_goal(
        self, job: Job, plan_json, world_json="", world_file="", skills_json="", skills_file=""
    ) -> dict:
        """A given plan, gated against the world as a planned one is, then run -> its outcome."""
        from agent.files.loader import base_plan_schema
        from agent.symbolic.gate import check_plan

        out = {
            "status": "aborted",
            "valid": False,
            "plan": None,
            "report": [],
            "run": None,
            "error": "",
        }
        self._track(job)
        try:
            plan = read_plan(plan_json)
            inputs = self._inputs(world_json, world_file, skills_json, skills_file)
            actions = action_map(inputs.skills_doc, "skills")
            gate = check_plan(plan, base_plan_schema(), inputs.world, inputs.skills)
            out.update(plan=plan, report=gate.report(), valid=gate.valid)
            if not gate.valid:
                first = gate.report()[0]
                out["error"] = f"the plan did not pass the gate: {first['message']}"
                return out
            run = self.run_plan(job, plan, actions)
            out["run"] = run.document()
            out["status"] = (
                "succeeded" if run.success else "canceled" if run.canceled else "aborted"
            )
            out["error"] = run.error
            return out
        except ThorError as e:
            out["error"] = str(e)
            return out
        finally:
            self._untrack(job)

    # ---- the robot ----------------------------------------------------------------------------
    def _action_type(self, name: str):
        pkg, _, cls = name.split("/")
        try:
            # the robot's own action type, named in the skills file: loaded by name, as ROS's own
            # tools load a type given on the command line
            return pkgutil.resolve_name(f"{pkg}.action:{cls}")
        except (ImportError, AttributeError, ValueError):
            raise ThorError(
                f"action type {name} cannot be loaded: is its package built and sourced?"
            ) from None

    def _client(self, action: str, kind: str) -> ActionClient:
        key = (action, kind)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = ActionClient(
                    self.node, self._action_type(kind), action, callback_group=self.group
                )
            return self._clients[key]

    def run_plan(self, job: Job, plan: dict, actions: dict, tokens: int = 0) -> RunRecord:
        """Every step's goal is built before the first moves: a plan the robot cannot run whole
        (an unmapped skill, a field the action lacks, a type not installed) does not start."""
        values = check_runnable(plan, actions)
        goals = []
        for step, v in zip(plan["steps"], values):
            m = actions[step["skill"]]
            goals.append(
                fill_message(
                    self._action_type(m.type).Goal(), v, f"step {step['id']} ({m.type} goal)"
                )
            )
            self._client(m.action, m.type)
        built = {id(s): g for s, g in zip(plan["steps"], goals)}

        def report(e: dict):
            job.feedback(
                phase="running",
                tokens=tokens,
                **{k: e[k] for k in ("step_id", "skill", "status")},
                detail=e["detail"],
                step_index=e["step_index"],
                step_count=e["step_count"],
            )

        index = {id(s): i for i, s in enumerate(plan["steps"])}

        def step(s, mapping, _values, timeout_s):
            where = {"step_index": index[id(s)], "step_count": len(plan["steps"])}
            return self._run_step(job, s, mapping, built[id(s)], timeout_s, tokens, where)

        job.feedback(phase="running", tokens=tokens, detail=f"{len(plan['steps'])} steps")
        run = run_steps(
            plan, step, actions, self.settings.max_retries, lambda: job.cancelled(), report
        )
        job.feedback(phase="done", tokens=tokens, detail="succeeded" if run.success else run.error)
        return run

    def _run_step(
        self, job: Job, step: dict, mapping, goal, timeout_s: float, tokens: int, where: dict
    ) -> StepOutcome:
        deadline = time.monotonic() + timeout_s
        client = self._client(mapping.action, mapping.type)
        while not client.server_is_ready():
            if job.cancelled():
                return StepOutcome(CANCELED, "canceled before the robot's action server answered")
            if time.monotonic() >= deadline:
                return StepOutcome(TIMED_OUT, f"action server {mapping.action} is not available")
            time.sleep(0.02)

        def robot_feedback(msg):
            job.feedback(
                phase="running",
                tokens=tokens,
                step_id=step["id"],
                skill=step["skill"],
                status="feedback",
                detail=json.dumps(message_dict(msg.feedback)),
                **where,
            )

        sent = client.send_goal_async(goal, feedback_callback=robot_feedback)
        why = self._wait(sent, deadline, job)
        if why is not None:
            # a goal accepted after we stopped waiting is cancelled as soon as it is known
            sent.add_done_callback(
                lambda f: f.result() and f.result().accepted and f.result().cancel_goal_async()
            )
            return StepOutcome(
                why,
                (
                    "the robot did not accept the goal in time"
                    if why == TIMED_OUT
                    else "canceled before the robot accepted the goal"
                ),
            )
        handle = sent.result()
        if not handle.accepted:
            return StepOutcome(FAILED, f"{mapping.action} rejected the goal")
        result = handle.get_result_async()
        why = self._wait(result, deadline, job)
        if why is not None:
            handle.cancel_goal_async()
            self._wait(result, time.monotonic() + CANCEL_WAIT_S, None)
            stopped = (
                "the robot's goal was cancelled"
                if result.done()
                else "the robot did not confirm the cancel"
            )
            if why == TIMED_OUT:
                return StepOutcome(TIMED_OUT, f"past its timeout_s {timeout_s:g}; {stopped}")
            return StepOutcome(CANCELED, stopped)
        answer = result.result()
        data = message_dict(answer.result)
        if answer.status != GoalStatus.STATUS_SUCCEEDED:
            word = {
                GoalStatus.STATUS_ABORTED: "aborted",
                GoalStatus.STATUS_CANCELED: "canceled",
            }.get(answer.status, "ended")
            return StepOutcome(FAILED, f"{mapping.action} {word} the goal", data)
        if mapping.success_field:
            ok = answer.result
            for part in mapping.success_field.split("."):
                ok = getattr(ok, part, None)
            if ok is not True:
                return StepOutcome(
                    FAILED,
                    f"{mapping.action} succeeded but its {mapping.success_field} is {ok!r}",
                    data,
                )
        return StepOutcome(SUCCEEDED, "", data)

    @staticmethod
    def _wait(future, deadline: float, job: Job | None) -> str | None:
        """None once ``future`` is done; TIMED_OUT past ``deadline``; CANCELED when the job is."""
        while not future.done():
            if job is not None and job.cancelled():
                return CANCELED
            if time.monotonic() >= deadline:
                return TIMED_OUT
            time.sleep(POLL_S)
        return None

    # ---- typed interfaces ---------------------------------------------------------------------
    def _typed_job(self, handle, feedback_type) -> Job:
        def send(d: dict):
            msg = feedback_type()
            for k, v in d.items():
                if hasattr(msg, k):
                    setattr(msg, k, v)
            handle.publish_feedback(msg)

        return Job(lambda: handle.is_cancel_requested or self.stopping, send)

    def _finish(self, handle, out: dict) -> None:
        if out["status"] == "succeeded":
            handle.succeed()
        elif out["status"] == "canceled" and handle.is_cancel_requested:
            handle.canceled()
        else:
            handle.abort()

    def _execute_plan(self, handle):
        plan_type = self.typed[0]
        g = handle.request
        out = self.plan_goal(
            self._typed_job(handle, plan_type.Feedback),
            g.task,
            g.world_json,
            g.world_file,
            g.skills_json,
            g.skills_file,
            g.execute,
        )
        self._finish(handle, out)
        return plan_type.Result(
            valid=out["valid"],
            plan_json=_dump(out["plan"]),
            report_json=json.dumps(out["report"]),
            document_json=_dump(out["document"]),
            run_json=_dump(out["run"]),
            error=out["error"],
        )

    def _execute_run(self, handle):
        run_type = self.typed[1]
        g = handle.request
        out = self.run_goal(
            self._typed_job(handle, run_type.Feedback),
            g.plan_json,
            g.world_json,
            g.world_file,
            g.skills_json,
            g.skills_file,
        )
        self._finish(handle, out)
        return run_type.Result(
            success=out["status"] == "succeeded",
            report_json=json.dumps(out["report"]),
            run_json=_dump(out["run"]),
            error=out["error"],
        )

    def _plan_once(self, request, response):
        job = Job(lambda: self.stopping, lambda d: None)
        out = self.plan_goal(
            job,
            request.task,
            request.world_json,
            request.world_file,
            request.skills_json,
            request.skills_file,
        )
        response.valid, response.plan_json = out["valid"], _dump(out["plan"])
        response.report_json, response.document_json = (
            json.dumps(out["report"]),
            _dump(out["document"]),
        )
        response.error = out["error"]
        return response

    # ---- the JSON-in-strings interface -----------------------------------------------------------
    def _json_publish(self, pub, doc: dict) -> None:
        pub.publish(String(data=json.dumps(doc)))

    def _json_goal(self, msg) -> None:
        try:
            doc = json.loads(msg.data)
        except ValueError:
            doc = None
        gid = doc.get("id") if isinstance(doc, dict) else None
        if not isinstance(gid, str) or not gid:
            self._json_publish(
                self.json_result,
                {
                    "id": gid if isinstance(gid, str) else None,
                    "status": "rejected",
                    "error": 'a goal is a JSON object with a non-empty string "id"',
                },
            )
            return
        with self._lock:
            if gid in self.json_jobs:
                busy = True
            else:
                busy = False
                cancel = threading.Event()

                def send(d: dict):
                    self._json_publish(self.json_feedback, {"id": gid, **d})

                job = self.json_jobs[gid] = Job(
                    lambda: cancel.is_set() or self.stopping, send, cancel
                )
        if busy:
            self._json_publish(
                self.json_result,
                {"id": gid, "status": "rejected", "error": f"a goal with id {gid!r} is running"},
            )
            return
        threading.Thread(
            target=self._json_work, args=(gid, job, doc), name=f"thor-json-{gid}", daemon=True
        ).start()

    def _json_work(self, gid: str, job: Job, doc: dict) -> None:
        try:
            fields = {k: _json_field(doc, k) for k in ("world", "skills")}
            files = {k: doc.get(k, "") or "" for k in ("world_file", "skills_file")}
            if not all(isinstance(v, str) for v in files.values()):
                raise ThorError("world_file and skills_file must be paths (strings)")
            if "plan" in doc:
                out = self.run_goal(
                    job,
                    _json_field(doc, "plan"),
                    fields["world"],
                    files["world_file"],
                    fields["skills"],
                    files["skills_file"],
                )
            else:
                execute = doc.get("execute", False)
                if not isinstance(execute, bool):
                    raise ThorError("execute must be true or false")
                out = self.plan_goal(
                    job,
                    doc.get("task"),
                    fields["world"],
                    files["world_file"],
                    fields["skills"],
                    files["skills_file"],
                    execute,
                )
        except ThorError as e:
            out = {"status": "aborted", "error": str(e)}
        finally:
            with self._lock:
                self.json_jobs.pop(gid, None)
        self._json_publish(self.json_result, {"id": gid, **out})

    def _json_cancel(self, msg) -> None:
        try:
            gid = json.loads(msg.data).get("id")
        except (ValueError, AttributeError):
            return
        with self._lock:
            job = self.json_jobs.get(gid) if isinstance(gid, str) else None
        if job is not None:
            job.cancel.set()

    # ---- feedback heartbeat and diagnostics ----------------------------------------------------
    def _heartbeat(self) -> None:
        with self._lock:
            jobs = list(self.jobs)
        for job in jobs:
            job.heartbeat()

    def publish_diagnostics(self) -> None:
        p = self.planning
        level = {"ready": DiagnosticStatus.OK, "failed": DiagnosticStatus.ERROR}.get(
            p.status, DiagnosticStatus.WARN
        )
        values = {
            **p.describe(),
            "interfaces": (
                "typed and json"
                if self.typed and self.settings.json_topics
                else "typed"
                if self.typed
                else "json"
            ),
            "world_topic": self.settings.world_topic or "(none)",
            "world_received": "yes" if self.latest_world is not None else "no",
        }
        status = DiagnosticStatus(
            level=level,
            name=f"{self.node.get_name()}: planner",
            message=p.reason,
            hardware_id=self.config.model.name,
            values=[KeyValue(key=k, value=str(v)) for k, v in values.items()],
        )
        arr = DiagnosticArray(status=[status])
        arr.header.stamp = self.node.get_clock().now().to_msg()
        self.diagnostics.publish(arr)


def _dump(v) -> str:
    return "" if v is None else json.dumps(v)


def _json_field(doc: dict, key: str) -> str:
    """A JSON goal's world, skills or plan: an object (sent on as JSON text) or absent."""
    v = doc.get(key)
    if v is None:
        return ""
    if not isinstance(v, dict):
        raise ThorError(
            f"{key} must be a JSON object (use {key}_file for a path)"
            if key != "plan"
            else "plan must be a JSON object"
        )
    return json.dumps(v)


def spin(node: ThorNode, stop: threading.Event, threads: int = 8) -> None:
    """Serve until ``stop`` is set: the executor in a thread, the caller waiting."""
    ex = MultiThreadedExecutor(num_threads=threads, context=node.node.context)
    ex.add_node(node.node)
    t = threading.Thread(target=ex.spin, name="thor-ros-executor", daemon=True)
    t.start()
    try:
        stop.wait()
    finally:
        node.stop()
        ex.shutdown(timeout_sec=5.0)
        t.join(5.0)
        node.destroy()


__all__ = ["ThorNode", "spin", "typed_interfaces", "rclpy"]
