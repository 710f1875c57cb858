"""Analyst queries over the archive, one named SQL per question.

Every query runs unchanged on ClickHouse 18.16, chDB and current servers (no CTEs,
no window functions), reads with FINAL so replays never double-count, orders its rows
completely (the same archive always answers in the same order) and by one clock: the
archive's event time (``ts``, to the second, with ``ts_ms`` breaking a tie within it;
never an id's spelling before the time), counts what its column says (a count over
a join says which rows it counts), and takes
``{db}`` plus a few query parameters (``{job:String}``, ``{limit:UInt32}``) whose values
travel beside the SQL and never become its text (:meth:`ArchiveBackend.query`).
``stepguard query NAME --job J`` prints one; docs/archive.md
shows each with what it answers.

Unsigned commands and alerts are kept in the archive but no query here reads them
(``commands.signed = 1``, ``alerts.signed != 0``; migration 008): whoever can write a
topic could invent them. Alerts archived before that migration read ``signed = -1``
(not known) and still count. A result of an unsigned command is left out with it.
Action records and approvals follow the alerts' rule (``signed != 0``; migration 010:
the actuator's and the operators' keys).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipeline.services.archive.backend import ArchiveBackend

__all__ = ["QUERIES", "AnalystQuery", "run_query"]


@dataclass(frozen=True, slots=True)
class AnalystQuery:
    name: str
    answers: str
    sql: str

    def render(self, db: str) -> str:
        """The SQL for database ``db`` (a checked identifier), its parameters unbound."""
        return self.sql.replace("{db}", db)


QUERIES: dict[str, AnalystQuery] = {
    q.name: q
    for q in (
        AnalystQuery(
            "rank_slowdown",
            "Per rank and step: compute time against the median of its pipeline-stage "
            "peers in the same step (slowdown 0.2 = 20 % slower than its peers), slowest "
            "first.",
            """
SELECT s.step AS step, s.node AS node, s.rank AS rank, round(s.compute_s, 4) AS compute_s,
       round(p.peer_median, 4) AS peer_median_s,
       round(s.compute_s / p.peer_median - 1, 4) AS slowdown
FROM (SELECT step, node, rank, pp_stage, compute_s FROM {db}.steps FINAL
      WHERE job_id = {job:String} AND phase = 'train') AS s
ANY LEFT JOIN (SELECT step, pp_stage, quantileExact(0.5)(compute_s) AS peer_median
               FROM {db}.steps FINAL WHERE job_id = {job:String} AND phase = 'train'
               GROUP BY step, pp_stage) AS p USING (step, pp_stage)
ORDER BY slowdown DESC, step, node, rank
LIMIT {limit:UInt32}
""",
        ),
        AnalystQuery(
            "incident_timeline",
            "Everything that happened to a job, in event-time order: alert updates, the "
            "actuator's actions (observed, held, approved, rejected, refused, cancelled or "
            "expired), human approvals and rejections, commands, every executor's results "
            "and lifecycle events (start, phases, end); at the same instant a cause comes "
            "before its effect (alert, action, approval, command, result, then the job's "
            "own event: a relaunch after the command that caused it).",
            """
SELECT ts, what, subject, detail FROM (
    SELECT ts, ts_ms, toUInt8(1) AS ord,
           concat('alert ', kind, ' ', toString(grade), ' ', toString(state)) AS what,
           concat(node, if(rank >= 0, concat(' rank ', toString(rank)), '')) AS subject,
           concat('step ', toString(step), ': ', summary) AS detail
    FROM {db}.alerts FINAL WHERE job_id = {job:String} AND signed != 0
    UNION ALL
    SELECT ts, ts_ms, toUInt8(2) AS ord,
           concat('action ', if(state = 'cancelled' AND startsWith(d, 'expired'),
                                'expired', state)) AS what,
           concat(arrayStringConcat(kinds, '+'), if(length(targets) > 0,
                  concat(' ', arrayStringConcat(targets, ',')), '')) AS subject,
           concat(action_id, if(by != '', concat(' by ', by), ''),
                  if(d != '', concat(': ', d), '')) AS detail
    FROM (SELECT ts, ts_ms, state, kinds, targets, action_id, by, detail AS d
          FROM {db}.actions FINAL WHERE job_id = {job:String} AND signed != 0)
    UNION ALL
    SELECT ts, ts_ms, toUInt8(3) AS ord, concat('approval ', decision) AS what,
           by AS subject, concat(command_id, if(reason != '', concat(': ', reason), '')) AS detail
    FROM {db}.approvals FINAL
    WHERE signed != 0 AND command_id IN
          (SELECT action_id FROM {db}.actions FINAL WHERE job_id = {job:String} AND signed != 0)
    UNION ALL
    SELECT ts, ts_ms, toUInt8(4) AS ord, concat('command ', kind, ' (', mode, ')') AS what,
           arrayStringConcat(targets, ',') AS subject, concat(command_id, ': ', summary) AS detail
    FROM {db}.commands FINAL WHERE job_id = {job:String} AND signed = 1
    UNION ALL
    SELECT ts, ts_ms, toUInt8(5) AS ord, concat('result ', status) AS what,
           executor AS subject, concat(command_id, if(d != '', concat(': ', d), '')) AS detail
    FROM (SELECT ts, ts_ms, status, executor, command_id, detail AS d
          FROM {db}.command_results FINAL
          WHERE job_id = {job:String} AND signed != 0 AND command_id NOT IN
                (SELECT command_id FROM {db}.commands FINAL
                 WHERE job_id = {job:String} AND signed = 0))
    UNION ALL
    SELECT ts, ts_ms, toUInt8(6) AS ord,
           concat('job ', kind, if(phase != '', concat(' ', phase), ''),
                  if(reason != '', concat(' ', reason), '')) AS what,
           source AS subject,
           concat(if(step >= 0, concat('step ', toString(step)), ''), if(run != '',
                  concat(' run ', run), ''), if(d != '', concat(': ', d), '')) AS detail
    FROM (SELECT ts, ts_ms, kind, phase, reason, source, step, run, detail AS d
          FROM {db}.job_events FINAL WHERE job_id = {job:String})
)
ORDER BY ts, ts_ms, ord, what, subject, detail
""",
        ),
        AnalystQuery(
            "detection_delay",
            "Per injected fault (simulator truth): how many alert episodes (distinct "
            "fingerprints) fired on its node (or job-wide, for job-wide faults) from its "
            "onset, the first one's step and the delay in steps.",
            """
SELECT fault_id, kind, node, onset_step,
       uniqExactIf(a.fingerprint,
                   a.step >= toInt64(onset_step) AND (node = '' OR a.node = node)) AS matching,
       if(matching > 0,
          minIf(a.step, a.step >= toInt64(onset_step) AND (node = '' OR a.node = node)),
          -1) AS first_alert_step,
       if(matching > 0, first_alert_step - toInt64(onset_step), -1) AS delay_steps
FROM (SELECT job_id, fault_id, kind, node, onset_step FROM {db}.fault_truth FINAL
      WHERE job_id = {job:String} AND is_trap = 0) AS t
ALL LEFT JOIN (SELECT job_id, fingerprint, node, step FROM {db}.alerts FINAL
               WHERE job_id = {job:String} AND state = 'firing' AND signed != 0) AS a
USING (job_id)
GROUP BY fault_id, kind, node, onset_step
ORDER BY onset_step, fault_id
""",
        ),
        AnalystQuery(
            "lost_gpu_hours",
            "Per incident: GPU-hours lost while the fault was active: the step time above "
            "the job's median step time before the onset, times the ranks, summed from "
            "onset to the fault's end (or the last archived step).",
            """
SELECT fault_id, any(kind) AS kind, any(node) AS node,
       round(sumIf(greatest(step_time - baseline_s, 0) * ranks,
                   step >= onset_step AND (end_step < 0 OR step <= toUInt64(end_step)))
             / 3600, 3) AS lost_gpu_hours
FROM (SELECT fault_id, kind, node, onset_step, end_step, step, step_time, ranks
      FROM (SELECT * FROM {db}.fault_truth FINAL WHERE job_id = {job:String} AND is_trap = 0) AS t
      ALL INNER JOIN (SELECT job_id, step, max(step_time_s) AS step_time, count() AS ranks
                      FROM {db}.steps FINAL WHERE job_id = {job:String} AND phase = 'train'
                      GROUP BY job_id, step) AS st USING (job_id)) AS w
ANY LEFT JOIN (
    SELECT fault_id,
           if(countIf(step < onset_step) > 0, quantileExactIf(0.5)(step_time, step < onset_step),
              quantileExact(0.1)(step_time)) AS baseline_s
    FROM (SELECT fault_id, onset_step, step, step_time
          FROM (SELECT * FROM {db}.fault_truth FINAL
                WHERE job_id = {job:String} AND is_trap = 0) AS t
          ALL INNER JOIN (SELECT job_id, step, max(step_time_s) AS step_time
                          FROM {db}.steps FINAL WHERE job_id = {job:String} AND phase = 'train'
                          GROUP BY job_id, step) AS st USING (job_id)) AS pre
    GROUP BY fault_id) AS b USING (fault_id)
GROUP BY fault_id
ORDER BY lost_gpu_hours DESC, fault_id
""",
        ),
        AnalystQuery(
            "top_nodes",
            "Nodes with the most alert episodes over the last 7 and 30 days (all jobs; the "
            "actuator's own guardrail notices, such as held actions, do not count).",
            """
SELECT node, uniqExactIf(fingerprint, ts >= now() - 7 * 86400) AS episodes_7d,
       uniqExact(fingerprint) AS episodes_30d,
       arraySort(groupUniqArray(kind)) AS kinds
FROM {db}.alerts FINAL
WHERE node != '' AND state = 'firing' AND kind != 'guardrail' AND signed != 0
      AND ts >= now() - 30 * 86400
GROUP BY node
ORDER BY episodes_30d DESC, node
LIMIT {limit:UInt32}
""",
        ),
        AnalystQuery(
            "incidents",
            "A job's incidents: every episode of one culprit (node, or the job) and one "
            "cause (a straggler and a degradation are one slow node) while any was open, "
            "with the ranks inside, its steps, worst grade and whether every episode "
            "resolved (alerts archived before incidents existed count one episode each).",
            """
SELECT grp AS incident, arrayStringConcat(arraySort(groupUniqArray(kind)), '+') AS kind,
       any(node) AS culprit,
       arraySort(groupUniqArrayIf(rank, rank >= 0)) AS ranks, count() AS episodes,
       min(first_step) AS first_step, max(last_step) AS last_step,
       max(worst) AS worst_grade, min(resolved) AS resolved,
       arraySort(groupArray(fingerprint)) AS fingerprints
FROM (SELECT if(incident != '', incident, fingerprint) AS grp, fingerprint, any(kind) AS kind,
             any(node) AS node, any(rank) AS rank, min(step) AS first_step,
             max(step) AS last_step, max(toUInt8(grade)) AS worst,
             argMax(toUInt8(state), seq) AS resolved
      FROM {db}.alerts FINAL WHERE job_id = {job:String} AND signed != 0
      GROUP BY grp, fingerprint)
GROUP BY grp
ORDER BY first_step, incident
""",
        ),
        AnalystQuery(
            "job_runs",
            "A job's runs (by run id): when each started, how many long phases it "
            "announced, when and why it ended (empty reason: no end was announced) and the "
            "last step it reported then.",
            """
SELECT run, minIf(ts, kind = 'start') AS started, countIf(kind = 'phase') AS phases,
       maxIf(ts, kind = 'end') AS ended, argMaxIf(reason, ts_ms, kind = 'end') AS end_reason,
       maxIf(step, kind = 'end') AS last_step
FROM {db}.job_events FINAL WHERE job_id = {job:String}
GROUP BY run
ORDER BY started, minIf(ts_ms, kind = 'start'), run
""",
        ),
        AnalystQuery(
            "command_outcomes",
            "Every signed command with its mode and targets, in the order issued, one row "
            "per executor that answered (rows are command x executor: count distinct "
            "command ids for commands) with that executor's latest result (a final "
            "status wins over 'accepted' at the same instant); a command no executor "
            "answered has an empty executor.",
            """
SELECT c.ts AS issued, c.command_id AS command_id, c.kind AS kind, c.mode AS mode,
       arrayStringConcat(c.targets, ',') AS targets,
       r.executor AS executor, r.last_status AS status, r.last_detail AS detail
FROM (SELECT * FROM {db}.commands FINAL WHERE job_id = {job:String} AND signed = 1) AS c
ALL LEFT JOIN (SELECT command_id, executor,
                      argMax(status, at_ms * 2 + (status != 'accepted')) AS last_status,
                      argMax(detail, at_ms * 2 + (status != 'accepted')) AS last_detail
               FROM {db}.command_results FINAL WHERE job_id = {job:String} AND signed != 0
               GROUP BY command_id, executor) AS r USING (command_id)
ORDER BY issued, c.ts_ms, command_id, executor
""",
        ),
    )
}


def run_query(
    backend: ArchiveBackend, name: str, **params: Any
) -> tuple[list[str], list[tuple[Any, ...]]]:
    if name not in QUERIES:
        raise KeyError(f"unknown query {name!r}; known: {sorted(QUERIES)}")
    params.setdefault("limit", 50)
    return backend.query(QUERIES[name].render(backend.database), params)
