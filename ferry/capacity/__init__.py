"""Capacity planning, pure and stateless: how many workers and torch threads a model
version runs and the worker processes the models take together (``sizing.py``), which
GPUs its workers use (``placement.py``), and the memory budgets of models loaded on
demand: what fits and what to evict (``budgets.py``). Below ``ferry.scheduling``, whose
runners and residency apply the plan, and read by ``ferry.service``'s lifecycle."""
