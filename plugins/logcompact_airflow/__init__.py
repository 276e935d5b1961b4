"""Airflow parts of logcompact: a hook (connection to store and catalog), a threshold sensor, and the plan, commit and gc
operators. The sensor and the plan operator (through `prepare_plans`) share one check, `logcompact.jobs.prepare.check_thresholds`;
all logic lives in the `logcompact` library, these classes only adapt it to Airflow."""
