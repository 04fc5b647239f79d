"""The job's data: sources named `FORMAT:LOCATION`, tokenizers, the node's cache and the sampler.

`uri` is torch- and numpy-free (the control plane validates a job's source with it); the modules
that read data import numpy (and torch) and are imported only where data is read.
"""
