"""The protocol between the frontend and a worker process: its frames, what a worker
starts with, and its log lines."""
