"""Airflow parts of logcompact, in the providers' shape: a hook (connection to store and catalog), a threshold sensor,
the operators (`operators`: the compaction chain, gc, metrics), and the clock and error policy both use (`policy`;
the sensor never imports an operator). The sensor and the plan operator (through `prepare_plans`) share one check,
`logcompact.jobs.prepare.check_thresholds`; all logic lives in the `logcompact` library, these classes only adapt it
to Airflow."""
