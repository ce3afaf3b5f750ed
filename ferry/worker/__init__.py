"""What runs inside a worker process: its entry point (``main``), the frames it reads
(``inbox``), a batch through the handler (``runner``, ``pipeline``), and the process's
own set-up. The frontend's side is ``ferry.worker_handles``; what both speak, ``ferry.wire``."""
