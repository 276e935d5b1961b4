"""logcompact's Airflow operators, one module per task family as the providers keep them, each named after what
its tasks run: `compaction` (plan, dry run, commit, uncleanable partitions), `gc` (`logcompact gc`),
`status` (`logcompact status` as the cluster's gauges). Every one runs under the clock and error policy of
`logcompact_airflow.policy`. Import an operator from its module: this package imports none of them."""
