"""Airflow parts of logcompact, in the providers' shape: `hooks` (the connection to store and catalog), `sensors` (the
threshold sensor), `operators` (the compaction chain, gc, status), and beside them what they share: `policy` (the
clock and the error policy; the sensor never imports an operator), `gauges` (the cleaner's figures as Airflow metrics),
`schedule` (a DAG's next run, for the max-lag planner) and `pipeline` (the chain the compaction DAGs wire). The sensor
and the plan operator (through `prepare_plans`) share one check, `logcompact.jobs.prepare.check_thresholds`; all logic
lives in the `logcompact` library, these classes only adapt it to Airflow."""
