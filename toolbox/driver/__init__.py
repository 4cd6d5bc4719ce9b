"""What the driver process does between a loaded config and a running algorithm: the builder that turns a config
into groups and a trainer (`experiment`), the local Ray instance and its watchdog, the start-up clock, the cold start,
and the dry run's plan and memory estimate. The commands call it; the algorithms' wiring receives its builder."""
