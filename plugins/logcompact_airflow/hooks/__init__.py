"""logcompact's Airflow hooks, as the providers keep them: `logcompact` holds `LogcompactHook`, a connection turned
into a cluster's object store and catalog."""
