"""The slow path: evolutionary search over candidates, with every evaluation stored in SQLite."""
