"""The Ray boundary: thin actor shells around library objects, and worker groups that fan calls out.

This is the only package (besides the entry points) that imports ``ray``.
"""
