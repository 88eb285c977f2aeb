"""The verification package, beside the product (``mcore_dapo``) in the same distribution: torchrun workers and
runners that check the product against references (HF transformers, verl's own functions, the planner's
predictions) and measure it. Used by the tests, tools/ and its ``mcore-dapo`` commands (``demo``, ``selfcheck``,
``sync-bench``, ``tiny-dapo``: :mod:`mcore_dapo_checks.cli`, through the ``mcore_dapo.commands`` entry point). It
imports the product; the product never imports it (tests/test_architecture_doc.py)."""
