"""Worker processes: one engine each, pulling work from the broker when they have room."""
