"""Who is in the job and how ranks talk: the store protocol with the supervisor, a generation's plan
(membership), its process groups and the fixed-order gradient sum they all-reduce.

Nothing is imported here: `membership` is torch-free (the control plane imports it), the rest use torch."""
