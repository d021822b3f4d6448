"""Language models for rollyard: tiny local causal LMs built from a config, in-process generation
with token ids and sampler log-probabilities, and a small OpenAI-compatible server over them."""
