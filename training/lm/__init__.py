"""Language models for rollyard: `spec` (policy specs), `conversation` (the chat agent loop),
`openai_policy` / `hf_policy` (served and in-process policies), `generate` (in-process generation
with token ids and sampler logprobs), `server` (a small OpenAI-compatible server, LoRA adapters
at runtime), `tokens` (a trainer's input from stored turns), `trainer` (token-level GRPO: its settings in `grpo_config`, the loss side in `token_loss`,
model loading and weight directories in `weights`),
`sft` (the supervised warm start from reference solutions) and `tiny` (tiny models built here)."""
