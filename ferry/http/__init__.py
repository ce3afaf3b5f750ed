"""HTTP adapters over ``ferry.service``: they only translate requests, responses and errors."""
