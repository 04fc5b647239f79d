"""The job's data: the formats' readers, tokenizers, the node's cache and the sampler.

The grammar of a source, `FORMAT:LOCATION`, is the job contract's (`runtime.config.parse_source`,
torch- and numpy-free: the control plane validates a job's source with it); the modules here
import numpy (and torch) and are imported only where data is read.
"""
