"""Verification harnesses: torchrun workers and runners that check the product against references
(HF transformers, verls own functions, the planners predictions) and measure it. Used by the tests,
`make demo`, `mcore-convert verify` and `mcore-dapo sync-bench`; nothing in the product imports them
otherwise."""
