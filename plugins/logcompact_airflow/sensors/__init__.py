"""logcompact's Airflow sensors, as the providers keep them: `threshold` holds `LogcompactThresholdSensor`, done when a
level holds enough files to compact. A sensor imports the hooks and the shared policy, never an operator."""
