"""Build script: pure-Python package; native kernels are added by apexlite/_build.py when possible."""
from setuptools import setup

setup()
