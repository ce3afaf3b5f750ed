"""When a batch goes: the batch policies (``policies.py``, pure logic, clock passed in) and
the table of those a model may name (``registry.py``). Below ``ferry.config``, which
validates model-config.yaml's ``batchPolicy`` and the policies' options against the table,
and ``ferry.scheduling``, whose queues run them."""
