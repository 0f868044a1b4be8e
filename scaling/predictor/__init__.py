"""The memory predictor: will a point fit before it is launched?

`analytic` predicts peak bytes per rank by arithmetic, `trace` by running the real step on fake
tensors, `find_mbs` searches the largest micro-batch that fits, and `cli` is `scaling predict`.
"""
