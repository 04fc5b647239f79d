"""The models: the built-in GPT and MLP, a Hugging Face GPT-2 as a starting point, a user's own model,
each layer's reproducible forward (random state, precision) and sampling text from a trained GPT."""
