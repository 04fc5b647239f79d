"""The local provider: nodes as process groups on this host (`provider`), each serving a fake cloud
metadata endpoint (`metadata`) and running the agent (`node`), the demo's preemption plans
(`preemption`) and the rendezvous store's host process (`store_host`)."""
