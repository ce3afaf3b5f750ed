"""The frontend's side of worker processes: start one, send it batches, notice when it dies."""
