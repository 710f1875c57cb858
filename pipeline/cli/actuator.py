"""Subcommands of ``stepguard`` owned by the actuator and its executors.

:mod:`pipeline.cli.app` adds :data:`commands` to the ``stepguard`` command line.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from pipeline.cli.util import console, err, stop_event
from pipeline.io.settings import Role, Settings, load_settings
from pipeline.io.trust import PublicKeys
from pipeline.policy import PolicyParams
from schemas import (
    Acknowledgement,
    ActionRecord,
    ActionState,
    ActuatorMode,
    Approval,
    ApprovalDecision,
    ControlMessage,
    RecommendedAction,
)

__all__ = [
    "actuator",
    "approve",
    "commands",
    "control",
    "executor",
    "keys",
    "pending",
    "reject",
    "resume_node",
]

commands = typer.Typer()


def _nodes(text: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in text.split(",") if n.strip())


def _action_modes(pairs: list[str] | None) -> dict[str, str] | None:
    """``KIND=MODE`` options as a control message's ``action_modes`` (``None``: none)."""
    if not pairs:
        return None
    # rebalance is advice for the job owner: the actuator never acts on it
    kinds = [k.value for k in RecommendedAction if k is not RecommendedAction.REBALANCE]
    modes = [m.value for m in ActuatorMode] + ["default"]
    out: dict[str, str] = {}
    for pair in pairs:
        kind, sep, mode = pair.partition("=")
        kind, mode = kind.strip(), mode.strip()
        if not sep or kind not in kinds or mode not in modes:
            raise typer.BadParameter(
                f"--mode-for {pair!r}: expected KIND=MODE, KIND one of {', '.join(kinds)}, "
                f"MODE one of {', '.join(modes)}"
            )
        out[kind] = mode
    return out


def fold_control(
    params: PolicyParams, messages: Iterable[ControlMessage], keys: PublicKeys
) -> tuple[PolicyParams, int]:
    """``params`` after every control change signed by one of ``keys``, newer than the
    last one applied and not applied before (the actuator's own rules); also the number
    of changes ignored."""
    from pipeline.io.trust import signature_problem

    last: datetime | None = None
    seen: set[str] = set()
    ignored = 0
    for msg in messages:
        fresh = last is None or msg.ts > last
        if signature_problem(msg, keys) is not None or msg.change_id in seen or not fresh:
            ignored += 1
            continue
        params, last = params.with_control(msg), msg.ts
        seen.add(msg.change_id)
    return params, ignored


def running_params(settings: Settings) -> tuple[PolicyParams, int]:
    """The actuator's mode and overrides as it has them: the settings folded with the
    control topic (:func:`fold_control`)."""
    from pipeline.io.kafka import create_topics, read_back
    from pipeline.io.trust import public_keys

    create_topics(settings, ["control"])
    messages = (rec.message for rec in read_back(settings, "control"))
    return fold_control(
        PolicyParams.from_settings(settings),
        (m for m in messages if isinstance(m, ControlMessage)),
        public_keys(settings, "operator"),
    )


def modes_line(params: PolicyParams) -> str:
    """``mode approve; overrides: replace_at_checkpoint=auto`` (pending's header)."""
    over = ", ".join(f"{k.value}={m.value}" for k, m in params.action_modes)
    text = f"actuator mode {params.mode.value}; per-kind overrides: {over or 'none'}"
    if params.mode is ActuatorMode.OBSERVE and over:
        text += " (observe stops every kind)"
    return text


#: Exit codes of ``approve``, ``reject`` and ``control``: 0 the actuator applied it;
#: 1 refused (by the actuator, or before anything was sent: not held, a key the services
#: do not trust); 2 bad arguments or settings; 3 sent, but no answer within --timeout
#: (it may still take effect: see ``stepguard pending --all``).
EXIT_REFUSED, EXIT_NO_ANSWER = 1, 3

_EXIT_CODES = (
    "Exit codes: 0 applied; 1 refused (by the actuator, or before anything was sent); "
    "2 bad arguments or settings; 3 no answer within --timeout (it may still take effect)."
)


def _person() -> str:
    """The login name of whoever runs the command (``--by`` defaults to it)."""
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER
        return "unknown"


def _untrusted(settings: Settings, command: str) -> str | None:
    """Why the operator key would be refused by the running services, or ``None``.

    The services trust the operator public keys of their STEPGUARD_OPERATOR_PUBLIC_KEYS,
    which ``stepguard up`` hands to the operator's shell too (``up.env``): the key this
    shell signs with must be listed there, under its id, with its own public key. Where
    this shell lists none, nothing can be checked here and the actuator's answer says.
    """
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from pipeline.io.trust import signing_key

    key = signing_key(settings, "operator", f"`stepguard {command}`")
    listed = dict(settings.public_keys("operator"))
    if not listed:
        return None
    known = ", ".join(listed)
    raw = listed.get(key.key_id)
    if raw is None:
        return (
            f"your operator key {key.key_id!r} (STEPGUARD_OPERATOR_PRIVATE_KEY) is not one "
            f"the services trust (STEPGUARD_OPERATOR_PUBLIC_KEYS lists {known}); add its "
            "public key there for the actuator and restart it"
        )
    if raw != key.public.public_bytes(Encoding.Raw, PublicFormat.Raw):
        return (
            f"your operator key {key.key_id!r} does not match the public key the services "
            f"list under that id (STEPGUARD_OPERATOR_PUBLIC_KEYS)"
        )
    return None


def _refuse_untrusted(settings: Settings, command: str, what: str) -> None:
    """Exit 1 (nothing sent) when the operator key is not one the services trust; a
    missing key is a ConfigError naming the variable and the command (exit 2)."""
    problem = _untrusted(settings, command)
    if problem is not None:
        err.print(f"{what} refused before sending: {problem}; nothing was sent")
        raise typer.Exit(EXIT_REFUSED)


def _send_and_wait(
    settings: Settings, logical: str, msg: Approval | ControlMessage, what: str, timeout_s: float
) -> Acknowledgement:
    """Check the key, sign with it (STEPGUARD_OPERATOR_PRIVATE_KEY), publish, and wait up
    to ``timeout_s`` for the actuator's answer (:class:`~schemas.Acknowledgement`).

    Exits 1 before sending when the key is one the services do not trust, 3 when no
    answer came in time.
    """
    from pipeline.io.kafka import control_producer, create_topics, publish, registry_of
    from pipeline.io.trust import sign, signing_key
    from pipeline.services.actuator.records import AnswerWaiter

    command = "control" if logical == "control" else str(getattr(msg, "decision", "approve"))
    _refuse_untrusted(settings, command, what)
    signed = sign(msg, signing_key(settings, "operator", f"`stepguard {command}`"))
    create_topics(settings, [logical])
    waiter = AnswerWaiter(settings)
    try:
        producer = control_producer(settings)
        try:
            meta = publish(producer, registry_of(settings), logical, signed).get(timeout=30)
        finally:
            producer.close()
        unverified = "" if waiter.keys else " (no STEPGUARD_ACTUATOR_PUBLIC_KEYS here to verify it)"
        err.print(f"{what}: sent, waiting up to {timeout_s:.0f}s for the actuator's answer"
                  f"{unverified} ...")  # fmt: skip
        ack = waiter.wait((meta.topic, meta.partition, meta.offset), timeout_s)
    finally:
        waiter.close()
    if ack is None:
        err.print(
            f"{what}: sent, but no answer from the actuator within {timeout_s:.0f}s (is it "
            "running? `stepguard status`); it may still take effect: `stepguard pending --all`"
        )
        raise typer.Exit(EXIT_NO_ANSWER)
    return ack


_TIMEOUT = typer.Option(
    "--timeout", min=0.1, help="Seconds to wait for the actuator's answer.", show_default=True
)
_BY_HELP = "Who decides: recorded, signed, with the decision (default: your login name)."


@commands.command()
def actuator(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every action.")] = False,
    crash_after_publish: Annotated[bool, typer.Option(hidden=True)] = False,
) -> None:
    """Run the actuator: decisions in, signed commands out.

    The mode comes from STEPGUARD_ACTUATOR_MODE and changes at runtime with
    `stepguard control --mode ...`.
    """
    from pipeline.io.metrics import ActuatorMetrics, serve_metrics
    from pipeline.services.actuator.service import Actuator

    if verbose:
        logging.getLogger("pipeline.services.actuator").setLevel(logging.INFO)
    settings = load_settings()
    metrics = ActuatorMetrics()
    serve_metrics(metrics.registry, settings, "actuator_metrics_port", metrics.readiness)
    act = Actuator(settings, crash_after_publish=crash_after_publish, metrics=metrics)
    err.print(
        f"actuator: mode {act.policy.params.mode.value}, {len(act.policy.issued)} commands "
        f"already issued, {len(act.policy.held)} held; consuming {settings.kafka_bootstrap}"
    )
    stop = stop_event()
    try:
        stats = act.run(stop.is_set)
    finally:
        act.close()
    err.print(
        f"actuator stopped: {stats.consumed} inputs, {stats.commands} commands, "
        f"{stats.records} action records, {stats.alerts} guardrail alerts"
    )


def _expired(rec: ActionRecord, settings: Settings, now: datetime) -> bool:
    """Expired, or held past the hold TTL (the actuator expires it when it next runs)."""
    from pipeline.policy import EXPIRED

    if rec.state is ActionState.HELD:
        return (now - rec.ts).total_seconds() >= settings.hold_ttl_s
    return rec.state is ActionState.CANCELLED and rec.detail.startswith(EXPIRED)


def _still_held(
    settings: Settings, action_id: str, now: datetime
) -> tuple[str | None, ActionRecord | None]:
    """Why ``action_id`` cannot be decided now (read back from the actions topic), and
    its latest record."""
    from pipeline.services.actuator.records import latest_actions

    rec = latest_actions(settings).get(action_id)
    return _why_not_held(rec, action_id, settings, now), rec


def _why_not_held(
    rec: ActionRecord | None, action_id: str, settings: Settings, now: datetime
) -> str | None:
    if rec is None:
        return f"no action {action_id} (see `stepguard pending`)"
    since = rec.ts.isoformat(timespec="seconds")
    if _expired(rec, settings, now):
        return (
            f"action {action_id} expired: held since {since} and not decided within "
            f"{settings.hold_ttl_s:.0f}s"
        )
    if rec.state is not ActionState.HELD:
        who = f" by {rec.by}" if rec.by else ""
        what = f": {rec.detail}" if rec.detail else ""
        return f"action {action_id} is already {rec.state.value}{who} at {since}{what}"
    return None


def _decide(
    action_id: str, decision: ApprovalDecision, by: str | None, reason: str, timeout_s: float
) -> None:
    """Send one decision on a held action, wait for the actuator's answer and print it;
    exit non-zero unless it took effect (:data:`EXIT_REFUSED`, :data:`EXIT_NO_ANSWER`)."""
    settings = load_settings()
    now = datetime.now(UTC)
    what = f"{decision.value} {action_id}"
    _refuse_untrusted(settings, decision.value, what)  # before the broker is asked
    problem, rec = _still_held(settings, action_id, now)
    if problem is not None or rec is None:
        err.print(f"{decision.value} refused: {problem}; nothing was sent")
        raise typer.Exit(EXIT_REFUSED)
    # bound to this hold: the approval decides nothing else, replayed or not
    msg = Approval(action_id=action_id, decision=decision, by=by or _person(), reason=reason,
                   ts=now, held_at=rec.ts)  # fmt: skip
    ack = _send_and_wait(settings, "approvals", msg, what, timeout_s)
    if not ack.took_effect:
        err.print(f"[red]{decision.value} of {action_id} refused by the actuator:[/] "
                  f"{escape(ack.detail)}")  # fmt: skip
        raise typer.Exit(EXIT_REFUSED)
    if decision is ApprovalDecision.REJECT:
        console.print(f"rejected {action_id} by {ack.by}: nothing issued")
        return
    issued = ", ".join(ack.commands) or "no new commands (already issued)"
    console.print(f"approved {action_id} by {ack.by}: issued {issued}")


@commands.command(epilog=_EXIT_CODES)
def approve(
    action_id: Annotated[str, typer.Argument(help="Held action id (see `stepguard pending`).")],
    by: Annotated[str | None, typer.Option(help=_BY_HELP, show_default=False)] = None,
    reason: Annotated[str, typer.Option(help="Why.")] = "",
    timeout: Annotated[float, _TIMEOUT] = 30.0,
) -> None:
    """Approve a held action and wait for the actuator to issue its commands
    (guardrails re-checked); prints the command ids, or why it was refused.

    Nothing is sent when the action is unknown, expired or already decided, or when
    the operator key is not one the services trust (STEPGUARD_OPERATOR_PUBLIC_KEYS).
    """
    _decide(action_id, ApprovalDecision.APPROVE, by, reason, timeout)


@commands.command(epilog=_EXIT_CODES)
def reject(
    action_id: Annotated[str, typer.Argument(help="Held action id (see `stepguard pending`).")],
    reason: Annotated[str, typer.Option(help="Why (kept as a calibration label).")],
    by: Annotated[str | None, typer.Option(help=_BY_HELP, show_default=False)] = None,
    timeout: Annotated[float, _TIMEOUT] = 30.0,
) -> None:
    """Reject a held action and wait for the actuator to record it; nothing is issued
    and the decision is archived.

    Nothing is sent when the action is unknown, expired or already decided, or when
    the operator key is not one the services trust (STEPGUARD_OPERATOR_PUBLIC_KEYS).
    """
    _decide(action_id, ApprovalDecision.REJECT, by, reason, timeout)


@commands.command()
def pending(
    all_states: Annotated[bool, typer.Option("--all", help="Every action, not only held.")] = False,
) -> None:
    """List held actions (rebuilt from the actions topic)."""
    from pipeline.services.actuator.records import latest_actions, running_status

    settings = load_settings()
    now = datetime.now(UTC)
    status = running_status(settings)
    if status is not None:  # what the running actuator said, not this shell's settings
        since = status.ts.isoformat(timespec="seconds")
        err.print(f"{_ack_modes(status)} (reported by the actuator at {since})")
    else:
        params, ignored = running_params(settings)
        note = f"; {ignored} unsigned or stale control changes ignored" if ignored else ""
        err.print(f"{modes_line(params)} (no actuator has reported its mode: from this "
                  f"shell's settings and the control topic{note})")  # fmt: skip
    records = latest_actions(settings)
    table = Table("state", "job", "commands", "summary", "since")
    table.add_column("action id", no_wrap=True, min_width=28)  # to copy into `approve`
    shown = 0
    for rec in records.values():
        state = "expired" if _expired(rec, settings, now) else rec.state.value
        if not all_states and state != "held":
            continue
        shown += 1
        kinds = " ".join(f"{c.kind.value}{list(c.targets) or ''}" for c in rec.commands)
        table.add_row(state, rec.job_id, kinds, rec.summary,
                      rec.ts.isoformat(timespec="seconds"), rec.action_id)  # fmt: skip
    console.print(table)
    err.print(f"{shown} action(s)")


def _ack_modes(ack: Acknowledgement) -> str:
    over = ", ".join(f"{k.value}={m.value}" for k, m in ack.action_modes.items())
    return f"actuator mode {ack.mode.value}; per-kind overrides: {over or 'none'}"


@commands.command(epilog=_EXIT_CODES)
def control(
    mode: Annotated[ActuatorMode | None, typer.Option(help="observe | approve | auto")] = None,
    warning_confirm_steps: Annotated[int | None, typer.Option(min=1)] = None,
    warning_confirm_s: Annotated[float | None, typer.Option(min=0.001)] = None,
    stale_alert_s: Annotated[float | None, typer.Option(min=0.001)] = None,
    max_isolations: Annotated[int | None, typer.Option(min=0)] = None,
    max_isolation_pct: Annotated[float | None, typer.Option(min=0, max=100)] = None,
    window_s: Annotated[float | None, typer.Option(min=0.001)] = None,
    cooldown_s: Annotated[float | None, typer.Option(min=0)] = None,
    no_spare_policy: Annotated[str | None, typer.Option(help="checkpoint | alert")] = None,
    spares: Annotated[str | None, typer.Option(help="Comma-separated; replaces the pool.")] = None,
    job_id: Annotated[str | None, typer.Option("--job", help="Job whose size follows.")] = None,
    job_nodes: Annotated[int | None, typer.Option(min=1, help="Node count of --job.")] = None,
    reset_breaker: Annotated[bool, typer.Option(help="Close open circuit breakers.")] = False,
    mode_for: Annotated[
        list[str] | None,
        typer.Option(
            help="KIND=MODE: a mode for one action kind (e.g. replace_at_checkpoint=auto, "
            "restart=approve; MODE default removes it). Repeatable."
        ),
    ] = None,
    by: Annotated[str | None, typer.Option(help=_BY_HELP, show_default=False)] = None,
    reason: Annotated[str, typer.Option(help="Why (archived with the change).")] = "",
    timeout: Annotated[float, _TIMEOUT] = 30.0,
) -> None:
    """Change the running actuator's mode (globally or per action kind) and thresholds
    (signed, archived, no restart); waits for the actuator to apply it and prints the
    mode it runs in after."""
    msg = ControlMessage(
        change_id=uuid.uuid4().hex, mode=mode, warning_confirm_steps=warning_confirm_steps,
        warning_confirm_s=warning_confirm_s, stale_alert_s=stale_alert_s,
        guard_max_isolations=max_isolations, guard_max_isolation_pct=max_isolation_pct,
        guard_window_s=window_s, guard_node_cooldown_s=cooldown_s,
        no_spare_policy=no_spare_policy,  # type: ignore[arg-type]
        spare_nodes=None if spares is None else _nodes(spares),
        job_id=job_id, job_nodes=job_nodes, reset_breaker=reset_breaker,
        action_modes=_action_modes(mode_for),  # type: ignore[arg-type]
        by=by or _person(), reason=reason, ts=datetime.now(UTC),
    )  # fmt: skip
    what = f"control change {msg.change_id}"
    ack = _send_and_wait(load_settings(), "control", msg, what, timeout)
    if not ack.took_effect:
        err.print(f"[red]{what} refused by the actuator:[/] {escape(ack.detail)}")
        raise typer.Exit(EXIT_REFUSED)
    console.print(f"{what} applied by the actuator: {_ack_modes(ack)}")


class KeysAction(StrEnum):
    GENERATE = "generate"
    TELEMETRY = "telemetry"
    NODE = "node"


@commands.command("keys")
def keys(
    action: Annotated[
        KeysAction,
        typer.Argument(
            help="generate: a new key pair; telemetry: a new cluster telemetry "
            "secret; node: node keys derived from STEPGUARD_TELEMETRY_SECRET"
        ),
    ],
    role: Annotated[
        Role, typer.Option(help="actuator | worker | operator | executor | job_controller")
    ] = "actuator",
    key_id: Annotated[str | None, typer.Option(help="Default: <role>-<date>.")] = None,
    job: Annotated[
        str | None,
        typer.Option(help="job_controller: the job the key signs for (its key id binds it)."),
    ] = None,
    node: Annotated[
        list[str] | None,
        typer.Option(help="node: the node(s) whose telemetry key to derive (repeatable)."),
    ] = None,
) -> None:
    """Print a new Ed25519 key pair as two environment lines.

    The PRIVATE_KEY line goes to the one service (or person) that signs; the
    PUBLIC_KEYS line to every service that verifies (append it to the old key while
    rotating: the first key listed does not matter, every one verifies). A job
    controller's key signs for one job (``--job``): its key id is derived from it.

    ``telemetry`` prints a new cluster telemetry secret (the workers'); ``node --node N``
    derives node N's telemetry key from the STEPGUARD_TELEMETRY_SECRET in the
    environment (what N's agent and training processes hold; a rack aggregator gets
    the keys of all its nodes and its own name in one line).
    """
    from pipeline.io.trust import SigningKey, job_controller_key_id

    if action is not KeysAction.GENERATE:
        _telemetry_keys(action, node or [])
        return

    kid = key_id or f"{role}-{datetime.now(UTC):%Y%m%d}"
    if role == "job_controller":
        if not job:
            err.print("[red]error:[/] --role job_controller needs --job (the key signs for it)")
            raise typer.Exit(2)
        kid = job_controller_key_id(job, key_id or f"{datetime.now(UTC):%Y%m%d}")
    try:
        key = SigningKey.generate(kid)
    except ValueError as exc:
        err.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    prefix = f"STEPGUARD_{role.upper()}"
    print(f"{prefix}_PRIVATE_KEY={key.private_text()}")
    print(f"{prefix}_PUBLIC_KEYS={key.public_text()}")


def _executor_kinds() -> str:
    from pipeline.services.actuator.executors import EXECUTORS

    return " | ".join(EXECUTORS)


def _telemetry_keys(action: KeysAction, nodes: list[str]) -> None:
    import base64
    import os

    from pipeline.io.telemetry_auth import derive_node_key

    if action is KeysAction.TELEMETRY:
        print(f"STEPGUARD_TELEMETRY_SECRET={base64.b64encode(os.urandom(32)).decode()}")
        return
    names = [n.strip() for part in nodes for n in part.split(",") if n.strip()]
    if not names or any(("=" in n or ":" in n) for n in names):
        err.print("[red]error:[/] node needs --node NAME (names without '=' or ':')")
        raise typer.Exit(2)
    secret = load_settings().telemetry_secret
    if secret is None:
        err.print("[red]error:[/] STEPGUARD_TELEMETRY_SECRET is not set (the cluster secret "
                  "the node keys derive from: `stepguard keys telemetry`)")  # fmt: skip
        raise typer.Exit(2)
    raw = base64.b64decode(secret.get_secret_value())
    keys = ",".join(f"{n}={base64.b64encode(derive_node_key(raw, n)).decode()}" for n in names)
    print(f"STEPGUARD_TELEMETRY_NODE_KEYS={keys}")


@commands.command()
def executor(
    kind: Annotated[str, typer.Argument(help="dry-run | slurm | webhook | kubernetes")] = "dry-run",
) -> None:
    """Run one executor on the commands topic (results go to the results topic).

    ``kubernetes`` checks its permissions first (SelfSubjectAccessReview) and refuses to
    start naming what is missing (docs/kubernetes.md).
    """
    from pipeline.io.metrics import ExecutorMetrics, serve_metrics
    from pipeline.services.actuator.executors import EXECUTORS, ExecutorRunner, make_executor

    if kind not in EXECUTORS:
        raise typer.BadParameter(f"{kind!r}: expected {_executor_kinds()}", param_hint="KIND")
    settings = load_settings()
    # one INFO line per command it answers (id, kind, job, targets, result)
    logging.getLogger("pipeline.services.actuator.executors").setLevel(logging.INFO)
    executor = make_executor(kind, settings)
    metrics = ExecutorMetrics()
    serve_metrics(metrics.registry, settings, "executor_metrics_port", metrics.readiness)
    runner = ExecutorRunner(settings, executor, metrics=metrics)
    err.print(f"executor {kind}: {len(runner.done)} commands already done")
    stop = stop_event()
    try:
        runner.run(stop.is_set)
    finally:
        runner.close()


class ResumeOn(StrEnum):
    SLURM = "slurm"
    KUBERNETES = "kubernetes"


@commands.command("resume-node")
def resume_node(
    node: Annotated[str, typer.Argument(help="Node to put back.")],
    force: Annotated[
        bool, typer.Option("--force", help="Resume it even if someone else isolated it (logged).")
    ] = False,
    on: Annotated[
        ResumeOn, typer.Option("--executor", help="Where the node is: slurm | kubernetes.")
    ] = ResumeOn.SLURM,
) -> None:
    """Put a node stepguard isolated back into service.

    Slurm: ``scontrol update ... State=RESUME`` of a node whose drain reason begins with
    ``stepguard:``. Kubernetes (``--executor kubernetes``): removes stepguard's taint,
    annotations, condition and its own cordon. A node someone else isolated is left
    alone (exit 1) unless ``--force``; on Kubernetes ``--force`` lifts their cordon but
    never removes a taint of theirs.
    """
    from pipeline.services.actuator.executors import ExecutionError

    try:
        if on is ResumeOn.KUBERNETES:
            from pipeline.services.actuator.kubernetes import KubernetesExecutor, load_api_client

            logging.getLogger("pipeline.services.actuator.kubernetes").setLevel(logging.INFO)
            settings = load_settings()
            kube = KubernetesExecutor(
                load_api_client(settings.kube_config, settings.kube_context),
                node_condition=settings.kube_node_condition, timeout_s=settings.kube_timeout_s,
                # no access check: the API server answers 403 itself, naming the verb
                device_taints=settings.kube_device_taints, check_access=False,
            )  # fmt: skip
            text = kube.resume(node, force=force).describe()
        else:
            from pipeline.services.actuator.slurm import SlurmExecutor

            logging.getLogger("pipeline.services.actuator.slurm").setLevel(logging.INFO)
            text = (
                SlurmExecutor(load_settings().slurm_scontrol).resume(node, force=force).describe()
            )
    except ExecutionError as exc:
        err.print(f"[red]{exc}[/red]", soft_wrap=True)
        raise typer.Exit(1) from exc
    console.print(text, soft_wrap=True)
