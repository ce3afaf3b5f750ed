"""Worker processes: their entry point, the IPC messages and the frontend's handle on them."""
