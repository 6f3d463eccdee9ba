"""Stand-in for IPython, which the H200 image lacks (with ~15 dependencies).

SGLang 0.5.23 imports `from IPython.display import HTML, display` at module
level in `sglang/utils.py`, for notebook helpers a server never calls. The kit
puts this directory on PYTHONPATH only when `import IPython` fails.
"""
