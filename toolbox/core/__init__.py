"""Cross-cutting pieces: registries, events, errors, seeding. No Ray here."""
